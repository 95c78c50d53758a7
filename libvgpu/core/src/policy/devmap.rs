//! Which container device an NVML device is, and which processes NVML may list.
//!
//! NVML numbers devices physically (all of them, whatever `CUDA_VISIBLE_DEVICES` says); the
//! container's device index is the program's CUDA ordinal, which config and region use. A device
//! is mapped by UUID (never by NVML's index when a UUID can decide), from the first source that
//! exists:
//! 1. a process that has initialized CUDA: its own devices (ordinal i = the device whose UUID
//!    `cuDeviceGetUuid(i)` gave); a device not among them is not the container's;
//! 2. else (NVML-only processes such as nvidia-smi): the UUIDs the container's CUDA processes
//!    recorded in the region;
//! 3. else `CUDA_VISIBLE_DEVICES` (UUID prefixes, or indices compared with NVML's index), else
//!    `GPU_DEVICES_UUID`, else NVML's index; a guess the region contradicts (it records another
//!    UUID at that index) is dropped.
//!
//! A device that maps nowhere is passed through by the callers (reported unchanged, not hidden:
//! hiding would renumber NVML's indices and break host tools' handle lookups).
//!
//! Process lists: NVML reports host PIDs. An entry is kept when its PID is the container PID or
//! the recorded host PID of a live slot in the region; everything else (other tenants) is hidden.

use crate::config::VisibleDevice;

/// Where a device's container index can come from (see the module comment for the order).
pub struct Sources<'a> {
    /// A process that initialized CUDA: its devices as (container index, UUID).
    pub own: Option<&'a [(usize, &'a str)]>,
    /// The region's recorded UUIDs by container index (the first `device_num` are the devices;
    /// "" = none recorded), when a region is attached.
    pub region: Option<(&'a [String], usize)>,
    /// `CUDA_VISIBLE_DEVICES`, when set.
    pub visible: Option<&'a [VisibleDevice]>,
    /// `GPU_DEVICES_UUID`.
    pub devices_uuid: &'a [String],
}

/// Container index of the NVML device `uuid`; `nvml_index` is NVML's own index of it (asked only
/// when the environment needs it).
pub fn container_index(uuid: &str, src: &Sources, nvml_index: impl Fn() -> Option<u32>) -> Option<usize> {
    if let Some(own) = src.own {
        return own.iter().find(|(_, u)| u.eq_ignore_ascii_case(uuid)).map(|&(i, _)| i);
    }
    if let Some((recorded, n)) = src.region {
        if let Some(i) = recorded.iter().take(n).position(|u| u.eq_ignore_ascii_case(uuid)) {
            return Some(i);
        }
    }
    let guess = index_from_env(src.visible, src.devices_uuid, uuid, nvml_index)?;
    match src.region {
        // The region records another device at that index: the guess is wrong.
        Some((recorded, _)) if recorded.get(guess).is_some_and(|u| !u.is_empty()) => None,
        _ => Some(guess),
    }
}

/// Container index of the device `uuid` from the environment alone: its position in
/// `CUDA_VISIBLE_DEVICES` (a UUID prefix, or an index compared with NVML's `nvml_index`), else
/// in `GPU_DEVICES_UUID`, else NVML's index.
pub fn index_from_env(visible: Option<&[VisibleDevice]>, devices_uuid: &[String], uuid: &str,
    nvml_index: impl Fn() -> Option<u32>) -> Option<usize> {
    if let Some(vis) = visible {
        return vis.iter().position(|v| match v {
            VisibleDevice::Uuid(p) => uuid.len() >= p.len() && uuid.as_bytes()[..p.len()].eq_ignore_ascii_case(p.as_bytes()),
            VisibleDevice::Index(n) => nvml_index() == Some(*n),
        });
    }
    if !devices_uuid.is_empty() {
        return devices_uuid.iter().position(|u| u.eq_ignore_ascii_case(uuid));
    }
    nvml_index().map(|i| i as usize)
}

/// The PIDs NVML may list: container and host PIDs of the region's live slots, `(pid, hostpid)`
/// each (0 or negative = unknown).
pub fn container_pids(slots: impl IntoIterator<Item = (i32, i32)>) -> Vec<u32> {
    let mut v = Vec::new();
    for (pid, hostpid) in slots {
        for p in [pid, hostpid] {
            if p > 0 {
                v.push(p as u32);
            }
        }
    }
    v
}

/// Keep the entries whose pid is the container's, compacting in place; returns the new count.
pub fn filter_in_place<T: Copy>(items: &mut [T], pid_of: impl Fn(&T) -> u32, keep: &[u32]) -> usize {
    let mut n = 0;
    for i in 0..items.len() {
        if keep.contains(&pid_of(&items[i])) {
            items[n] = items[i];
            n += 1;
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use VisibleDevice::{Index, Uuid};

    const A: &str = "GPU-aaaa-1";
    const B: &str = "GPU-bbbb-2";

    fn none() -> Sources<'static> {
        Sources { own: None, region: None, visible: None, devices_uuid: &[] }
    }

    #[test]
    fn filters_and_compacts() {
        let mut v = [1u32, 7, 3, 7, 9];
        let n = filter_in_place(&mut v, |x| *x, &[7, 9]);
        assert_eq!(&v[..n], &[7, 7, 9]);
        assert_eq!(filter_in_place(&mut v[..0], |x| *x, &[7]), 0);
    }

    #[test]
    fn listed_pids_are_the_live_slots_known_pids() {
        assert_eq!(container_pids([(12, 4012), (13, 0), (0, -1)]), vec![12, 4012, 13]);
        assert!(container_pids([]).is_empty());
    }

    #[test]
    fn env_index_follows_the_visible_order() {
        // CUDA_VISIBLE_DEVICES=1,0: physical 1 is the container's device 0
        let vis = [Index(1), Index(0)];
        assert_eq!(index_from_env(Some(&vis), &[], B, || Some(1)), Some(0));
        assert_eq!(index_from_env(Some(&vis), &[], A, || Some(0)), Some(1));
        // by UUID prefix, reordered; a device not listed is not the container's
        let vis = [Uuid("GPU-bbbb".into()), Uuid("gpu-AAAA".into())];
        assert_eq!(index_from_env(Some(&vis), &[], B, || Some(1)), Some(0));
        assert_eq!(index_from_env(Some(&vis), &[], A, || Some(0)), Some(1));
        assert_eq!(index_from_env(Some(&[Index(1)]), &[], A, || Some(0)), None);
        // GPU_DEVICES_UUID, then NVML's index
        let list = [B.to_string(), A.to_string()];
        assert_eq!(index_from_env(None, &list, A, || Some(0)), Some(1));
        assert_eq!(index_from_env(None, &list, "GPU-cccc", || Some(2)), None);
        assert_eq!(index_from_env(None, &[], A, || Some(3)), Some(3));
    }

    #[test]
    fn a_cuda_process_maps_by_its_own_devices_only() {
        let own = [(0, B), (1, A)];
        let region = [A.to_string(), B.to_string()];
        let s = Sources { own: Some(&own), region: Some((&region, 2)), ..none() };
        assert_eq!(container_index("gpu-AAAA-1", &s, || Some(0)), Some(1));
        // Not one of ours: passed through, whatever the region or NVML's index say.
        assert_eq!(container_index("GPU-cccc", &s, || Some(0)), None);
    }

    #[test]
    fn an_nvml_only_process_maps_by_the_region_then_the_environment() {
        let region = [B.to_string(), String::new()];
        let vis = [Index(1), Index(0)];
        let s = Sources { region: Some((&region, 1)), visible: Some(&vis), ..none() };
        assert_eq!(container_index(B, &s, || Some(1)), Some(0));
        // Not recorded: CUDA_VISIBLE_DEVICES=1,0 puts physical 0 at index 1, which records nothing.
        assert_eq!(container_index(A, &s, || Some(0)), Some(1));
        // A guess the region contradicts is dropped: physical 1 would be index 0, recorded as B.
        assert_eq!(container_index("GPU-cccc", &s, || Some(1)), None);
        // No region: the environment alone; nothing at all: NVML's index.
        let s = Sources { visible: Some(&vis), ..none() };
        assert_eq!(container_index("GPU-cccc", &s, || Some(1)), Some(0));
        assert_eq!(container_index(A, &none(), || Some(5)), Some(5));
        assert_eq!(container_index(A, &none(), || None), None);
    }

    proptest! {
        #[test]
        fn filtering_keeps_exactly_the_container_entries_in_order(v in proptest::collection::vec(0u32..20, 0..40),
                                                                  keep in proptest::collection::vec(0u32..20, 0..6)) {
            let mut items = v.clone();
            let n = filter_in_place(&mut items, |x| *x, &keep);
            let want: Vec<u32> = v.iter().copied().filter(|p| keep.contains(p)).collect();
            prop_assert_eq!(&items[..n], &want[..]);
        }

        #[test]
        fn a_uuid_prefix_never_panics(uuid in "\\PC{0,12}", prefix in "\\PC{0,12}") {
            let _ = index_from_env(Some(&[Uuid(prefix)]), &[], &uuid, || None);
        }
    }
}
