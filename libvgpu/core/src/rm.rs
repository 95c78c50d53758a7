//! The NVIDIA resource manager's ioctl interface, the little of it the hook watches: the
//! `/dev/nvidiactl` calls that allocate and free channel groups (TSGs: one per context and
//! engine, the unit the GPU time-slices between processes) and the controls that read and set a
//! group's timeslice. Layouts from NVIDIA's open kernel modules (`nv_escape.h`, `nvos.h`,
//! `ctrla06c.h`).
//!
//! Why (issue 14): the GPU switches between processes only when the running group's timeslice
//! expires (libcuda sets 1-2 ms), so a latency service's request waits behind up to that much of
//! a lower-priority container's kernel. The set-timeslice control is open to any client on its
//! own groups; on an H100 a training process at 200 us or 50 us cut a service's p99 beside it from
//! 3.2x alone to 1.2-1.3x, at no cost to the training's own rate.

/// The type byte of NVIDIA's ioctls (`NV_IOCTL_MAGIC`).
pub const IOCTL_TYPE: u8 = b'F';
/// `NV_ESC_RM_FREE`, `NV_ESC_RM_CONTROL`, `NV_ESC_RM_ALLOC`.
pub const ESC_FREE: u8 = 0x29;
pub const ESC_CONTROL: u8 = 0x2A;
pub const ESC_ALLOC: u8 = 0x2B;
/// `KEPLER_CHANNEL_GROUP_A`, the channel-group class on every GPU since Kepler.
pub const CHANNEL_GROUP: u32 = 0xa06c;
/// `NVA06C_CTRL_CMD_SET_TIMESLICE` / `GET_TIMESLICE`, both `{ NvU64 timesliceUs }`.
pub const CTRL_SET_TIMESLICE: u32 = 0xa06c_0103;
pub const CTRL_GET_TIMESLICE: u32 = 0xa06c_0104;
/// `NV_OK`.
pub const STATUS_OK: u32 = 0;
/// Statuses that say the object is not there (any other failure may be passing): its client
/// is gone (`NV_ERR_INVALID_CLIENT`), or it is (`NV_ERR_INVALID_OBJECT_HANDLE`,
/// `NV_ERR_OBJECT_NOT_FOUND`), values of the open driver's `nvstatuscodes.h`.
pub const STATUS_GONE: [u32; 3] = [0x23, 0x33, 0x57];

/// `NVOS54_PARAMETERS`: a control call.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Control {
    pub client: u32,
    pub object: u32,
    pub cmd: u32,
    pub flags: u32,
    pub params: u64,
    pub params_size: u32,
    pub status: u32,
}

/// The head `NVOS21_PARAMETERS` and `NVOS64_PARAMETERS` (both allocation forms) share.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct AllocHead {
    pub root: u32,
    pub parent: u32,
    pub new: u32,
    pub class: u32,
}

/// `NVOS00_PARAMETERS`: a free. Freeing a client (`old == root`) frees everything under it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Free {
    pub root: u32,
    pub parent: u32,
    pub old: u32,
    pub status: u32,
}

/// `NVA06C_CTRL_TIMESLICE_PARAMS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Timeslice {
    pub us: u64,
}

const _: () = assert!(size_of::<Control>() == 32 && size_of::<AllocHead>() == 16 && size_of::<Free>() == 16);

/// Which resource-manager call an ioctl request number is (by its type, number and size).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    Alloc,
    Free,
    Control,
    Other,
}

pub fn decode(request: u64) -> Call {
    let (nr, ty, size) = ((request & 0xff) as u8, ((request >> 8) & 0xff) as u8, ((request >> 16) & 0x3fff) as usize);
    if ty != IOCTL_TYPE {
        return Call::Other;
    }
    match nr {
        ESC_ALLOC if size >= size_of::<AllocHead>() => Call::Alloc,
        ESC_FREE if size >= size_of::<Free>() => Call::Free,
        ESC_CONTROL if size == size_of::<Control>() => Call::Control,
        _ => Call::Other,
    }
}

/// Where an allocation's status word is, by the size its request names: `NVOS21_PARAMETERS`
/// (32 bytes) or `NVOS64_PARAMETERS` (48). The driver answers 0 and puts its error there.
pub fn alloc_status_offset(request: u64) -> Option<usize> {
    match (request >> 16) & 0x3fff {
        32 => Some(28),
        48 => Some(40),
        _ => None,
    }
}

/// The NVIDIA driver's character devices (`/dev/nvidiactl`, `/dev/nvidiaN`): major 195.
pub const DRIVER_MAJOR: u32 = 195;

/// The request number of a control call (`_IOWR('F', NV_ESC_RM_CONTROL, NVOS54_PARAMETERS)`).
pub const fn control_request() -> u64 {
    (3 << 30) | ((size_of::<Control>() as u64) << 16) | ((IOCTL_TYPE as u64) << 8) | ESC_CONTROL as u64
}

/// One channel group of this process, as the driver allocated it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Group {
    /// The descriptor it was allocated on and that file's (device, inode): a control goes to
    /// the same file only (a closed and reused descriptor is another file).
    pub fd: i32,
    pub file: (u64, u64),
    pub client: u32,
    pub object: u32,
    /// Its parent (the device object): freeing it frees the group.
    pub parent: u32,
    /// Its timeslice before we changed it (what libcuda set), once read.
    pub original_us: Option<u64>,
    /// What we set it to (`None`: the driver's own).
    pub set_us: Option<u64>,
    /// A control on it failed: left alone from then on.
    pub refused: bool,
    /// We have set its timeslice at least once (shortened or restored).
    pub touched: bool,
}

/// What to do to one group to reach the wanted timeslice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Read its timeslice and, unless it runs `us` (`Groups::read`), set `us`. Every tick while
    /// held, so a set of libcuda's we did not see is undone within a tick.
    Shorten { us: u64 },
    /// Set it back to what it was.
    Restore { us: u64 },
    /// A refused group: read it, to forget it once the driver says it is gone (`STATUS_GONE`;
    /// its client may die unseen).
    Probe,
}

/// The channel groups of this process (the `ioctl` shim's record).
#[derive(Debug, Default)]
pub struct Groups {
    pub list: Vec<Group>,
    /// Some group was not recorded (`MAX_GROUPS`): it runs whatever libcuda set.
    pub overflowed: bool,
    /// A group could not be read at the latest tick (not gone): it may run what libcuda set
    /// unseen, until a tick reads it.
    pub unread: bool,
    /// The timeslice the latest tick wanted (`None`: libcuda's own).
    pub want: Option<u64>,
}

/// More groups than a process plausibly has (4 per context): beyond it, new ones are not tracked.
pub const MAX_GROUPS: usize = 1024;

impl Groups {
    pub fn allocated(&mut self, fd: i32, file: (u64, u64), client: u32, parent: u32, object: u32) {
        self.freed(client, object);
        if self.list.len() < MAX_GROUPS {
            self.list.push(Group { fd, file, client, object, parent, original_us: None, set_us: None, refused: false, touched: false });
        } else {
            self.overflowed = true;
        }
    }

    /// `object` of `client` was freed: the group itself, its parent, or the whole client.
    pub fn freed(&mut self, client: u32, object: u32) {
        self.list.retain(|g| !(g.client == client && (g.object == object || g.parent == object || object == client)));
    }

    /// A control on a group failed: left at whatever it runs now, never counted as ours.
    pub fn refuse(&mut self, i: usize) {
        self.list[i].refused = true;
        self.list[i].set_us = None;
    }

    /// Does every group of ours run `want` (a short timeslice we set), so that the GPU leaves
    /// all our work within it? A group the driver refused, or one made since the last set, runs
    /// libcuda's own timeslice: then not.
    pub fn holds(&self, want: Option<u64>) -> bool {
        want.is_some() && !self.overflowed && !self.unread && !self.list.is_empty() && self.list.iter().all(|g| g.set_us == want)
    }

    /// Does every group run what the latest tick wanted, a short timeslice?
    pub fn short(&self) -> bool {
        self.holds(self.want)
    }

    /// Group `i` was read to run `current` us while we want `us`: does it need setting? A value
    /// that is neither the one wanted nor the last one we set (we set two: short and shared) is
    /// libcuda's (set before we held it, or since, unseen): the one to restore.
    pub fn read(&mut self, i: usize, current: u64, us: u64) -> bool {
        let g = &mut self.list[i];
        if current == us {
            // Already so when first read: libcuda's (or the program's) own value, to restore.
            g.original_us.get_or_insert(current);
            g.set_us = Some(us);
            return false;
        }
        if g.set_us != Some(current) {
            g.original_us = Some(current);
        }
        g.set_us = None;
        true
    }

    /// Groups `i` (ascending) are gone with their descriptor: forgotten.
    pub fn forget(&mut self, gone: &[usize]) {
        for &i in gone.iter().rev() {
            self.list.remove(i);
        }
    }

    /// The steps that bring every group to `want` (`Some(us)`: that timeslice; `None`: its own).
    pub fn plan(&self, want: Option<u64>) -> Vec<(usize, Step)> {
        let mut steps = Vec::new();
        for (i, g) in self.list.iter().enumerate() {
            match (want, g.refused, g.set_us, g.original_us) {
                (Some(_), true, _, _) => steps.push((i, Step::Probe)),
                (Some(us), false, _, _) => steps.push((i, Step::Shorten { us })),
                (None, false, Some(_), Some(us)) => steps.push((i, Step::Restore { us })),
                (None, _, _, _) => {} // refused, never changed, or never read
            }
        }
        steps
    }

    /// libcuda set a group's timeslice itself (`asked` us, done): that is the value to restore
    /// from now on. `Some(us)`: the value the group must end at, to set again (under the same
    /// lock as the monitor's own sets, so the last write is always the record's): ours while we
    /// hold it, else libcuda's (a restore of ours may have landed after libcuda's set).
    pub fn on_set(&mut self, file: (u64, u64), client: u32, object: u32, asked: u64) -> Option<(usize, u64)> {
        let i = self.list.iter().position(|g| g.file == file && g.client == client && g.object == object && !g.refused)?;
        let g = &mut self.list[i];
        g.original_us = Some(asked);
        g.touched.then(|| (i, g.set_us.unwrap_or(asked)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moving_between_two_timeslices_of_ours_keeps_libcudas_to_restore() {
        let mut g = Groups::default();
        g.allocated(5, (1, 2), 0xc1d0_001a, 0x5c00_0001, 0x5c00_0015);
        // Short: the driver says 2048 (libcuda's); set 50.
        assert!(g.read(0, 2048, 50));
        g.list[0].set_us = Some(50);
        // Shared: the driver says 50, which is ours; set 500.
        assert!(g.read(0, 50, 500));
        g.list[0].set_us = Some(500);
        // And back to short, then restored: libcuda's 2048, not a value of ours.
        assert!(g.read(0, 500, 50));
        g.list[0].set_us = Some(50);
        assert_eq!(g.plan(None), vec![(0, Step::Restore { us: 2048 })]);
        // A value that is not the last we set is libcuda's, set unseen.
        assert!(g.read(0, 1024, 500));
        g.list[0].set_us = Some(500);
        assert_eq!(g.plan(None), vec![(0, Step::Restore { us: 1024 })]);
    }

    #[test]
    fn libcudas_value_equal_to_one_of_ours_is_still_restored() {
        // libcuda (or the program, on its own groups) gave the group 50 us before we held it.
        let mut g = Groups::default();
        g.allocated(5, (1, 2), 0xc1d0_001a, 0x5c00_0001, 0x5c00_0015);
        assert!(!g.read(0, 50, 50), "already at the short value: nothing to set");
        // Another lower process starts working: we move to the shared 500 us.
        assert!(g.read(0, 50, 500));
        g.list[0].set_us = Some(500);
        g.list[0].touched = true;
        // The higher priority leaves: its 50 comes back, not our 500.
        assert_eq!(g.plan(None), vec![(0, Step::Restore { us: 50 })]);
    }

    #[test]
    fn request_numbers_decode_as_the_driver_builds_them() {
        assert_eq!(control_request(), 0xc020_462a);
        assert_eq!(decode(0xc020_462a), Call::Control);
        assert_eq!(decode(0xc030_462b), Call::Alloc); // NVOS64
        assert_eq!(decode(0xc020_462b), Call::Alloc); // NVOS21
        assert_eq!(decode(0xc010_4629), Call::Free);
        assert_eq!(decode(0xc018_462a), Call::Other, "a control of another size is not ours to read");
        assert_eq!(decode(0x5401), Call::Other); // TCGETS
        assert_eq!(decode(0xc020_472a), Call::Other, "another driver's type byte");
    }

    fn two() -> Groups {
        let mut g = Groups::default();
        g.allocated(5, (1, 2), 0xc1d0_001a, 0x5c00_0001, 0x5c00_0015);
        g.allocated(5, (1, 2), 0xc1d0_001a, 0x5c00_0001, 0x5c00_003e);
        g
    }

    #[test]
    fn groups_are_shortened_then_restored_to_what_they_were() {
        let mut g = two();
        assert_eq!(g.plan(None), vec![], "nothing to restore before anything was changed");
        let steps = g.plan(Some(50));
        assert_eq!(steps, vec![(0, Step::Shorten { us: 50 }), (1, Step::Shorten { us: 50 })]);
        for (i, orig) in [(0, 2048), (1, 1024)] {
            assert!(g.read(i, orig, 50), "libcuda's value: set ours");
            g.list[i].set_us = Some(50);
        }
        assert!(g.holds(Some(50)));
        assert_eq!(g.plan(Some(50)), steps, "read again every tick");
        assert!(!g.read(0, 50, 50), "already there");
        assert!(g.read(1, 2048, 50) && !g.holds(Some(50)), "set unseen: libcuda's again, to set");
        g.list[1].set_us = Some(50);
        assert_eq!(g.plan(None), vec![(0, Step::Restore { us: 2048 }), (1, Step::Restore { us: 2048 })]);
    }

    #[test]
    fn a_refused_group_is_left_alone_and_not_counted_as_held() {
        let mut g = two();
        g.list[0].set_us = Some(50);
        g.refuse(0);
        assert_eq!(g.plan(Some(50)), vec![(0, Step::Probe), (1, Step::Shorten { us: 50 })]);
        assert_eq!(g.plan(None), vec![], "a refused group is not restored either");
        g.list[1].set_us = Some(50);
        assert!(!g.holds(Some(50)), "the refused group runs libcuda's timeslice: not all short");
        g.forget(&[0]);
        assert!(g.holds(Some(50)) && !g.holds(None));
        g.forget(&[0]);
        assert!(!g.holds(Some(50)), "no group: nothing the GPU preempts for us");
    }

    #[test]
    fn groups_past_the_record_s_size_are_not_all_short() {
        let mut g = Groups::default();
        for i in 0..MAX_GROUPS as u32 + 1 {
            g.allocated(5, (1, 2), 1, 2, 100 + i);
        }
        g.list.iter_mut().for_each(|x| x.set_us = Some(50));
        assert!(!g.holds(Some(50)), "an untracked group runs libcuda's timeslice");
    }

    #[test]
    fn alloc_status_is_found_for_both_forms() {
        assert_eq!(alloc_status_offset(0xc020_462b), Some(28));
        assert_eq!(alloc_status_offset(0xc030_462b), Some(40));
        assert_eq!(alloc_status_offset(0xc018_462b), None);
    }

    #[test]
    fn freeing_a_group_or_its_client_forgets_it() {
        let mut g = two();
        g.freed(0xc1d0_001a, 0x5c00_0015);
        assert_eq!(g.list.len(), 1);
        g.allocated(7, (1, 3), 0xc1d0_0020, 0x5c00_0001, 0x5c00_0015);
        g.freed(0xc1d0_001a, 0xc1d0_001a);
        assert_eq!(g.list.iter().map(|x| x.client).collect::<Vec<_>>(), vec![0xc1d0_0020]);
        g.freed(0xc1d0_0020, 0x5c00_0001); // its parent (the device object)
        assert!(g.list.is_empty());
    }

    #[test]
    fn libcuda_setting_a_group_becomes_the_value_to_restore_and_a_touched_one_is_set_again() {
        let mut g = two();
        let f = (1, 2);
        assert_eq!(g.on_set(f, 0xc1d0_001a, 0x5c00_0015, 1024), None, "never touched: nothing to redo");
        assert_eq!(g.list[0].original_us, Some(1024), "even while not held, it is what to restore later");
        g.list[0].touched = true;
        g.list[0].set_us = Some(50);
        assert_eq!(g.on_set(f, 0xc1d0_001a, 0x5c00_0015, 2048), Some((0, 50)), "held: ours again");
        assert_eq!(g.list[0].original_us, Some(2048));
        g.list[0].set_us = None;
        assert_eq!(g.on_set(f, 0xc1d0_001a, 0x5c00_0015, 1024), Some((0, 1024)), "restored by us: libcuda's, after any restore");
        assert_eq!(g.on_set(f, 0xdead, 0x5c00_0015, 2048), None, "another client's group");
        assert_eq!(g.on_set((9, 9), 0xc1d0_001a, 0x5c00_0015, 2048), None, "the same handles on another file");
    }

    #[test]
    fn the_record_is_bounded() {
        let mut g = Groups::default();
        for i in 0..(MAX_GROUPS as u32 + 10) {
            g.allocated(3, (0, 0), 1, 2, 100 + i);
        }
        assert_eq!(g.list.len(), MAX_GROUPS);
    }
}
