//! The shared state file: layout, creation, process slots, memory charges, kernel timeline.

use crate::{config::Config, now_ns, BUCKET_NS, MAX_DEVICES, MAX_SLOTS, RING};
use memmap2::MmapRaw;
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, AtomicU8, AtomicUsize, Ordering::*};
use std::sync::{Mutex, MutexGuard};

pub const MAGIC: [u8; 8] = *b"MOCKGPU\0";
pub const VERSION: u32 = 7;

#[repr(C)]
pub struct Header {
    pub magic: [u8; 8],
    pub version: u32,
    pub device_count: u32,
    pub layout_size: u64,
    pub ctx_mem: u64,
    pub ctx_growth: u64,
    pub ctx_hidden: u64,
    pub kernel_ns: u64,
    pub nvml_tail_ns: u64,
    pub clock_khz: u32,
    pub cc_major: u32,
    pub cc_minor: u32,
    /// How much faster than the host clock the GPU's timer runs, in ppm (negative: slower):
    /// what `cuEventElapsedTime` reports is scaled by it.
    pub timer_ppm: i32,
    /// GPU time a switch between two processes' kernels costs when their work meets (the GPU
    /// time-slicing contexts); NVML counts it busy.
    pub switch_ns: u64,
    /// Host time each event call takes (`Config::event_call_ns`).
    pub event_call_ns: u64,
    /// Busy time NVML counts per timing event (`Config::nvml_event_ns`).
    pub nvml_event_ns: u64,
}

#[repr(C)]
pub struct Device {
    pub name: [u8; 96],
    pub uuid: [u8; 16],
    pub total_mem: u64,
    pub sms: u32,
    pub pci_bus: u32,
    /// End of the last kernel queued on this device (CLOCK_MONOTONIC ns).
    pub busy_until: AtomicU64,
    /// Two half-GPU lanes: when each is free, and the slot (+1) whose kernel holds it. Kernels
    /// of one process taking at most half the GPU run side by side (as two 4-blocks-per-SM
    /// grids of 256 threads do on an H100); kernels of different processes never overlap
    /// (the GPU time-slices contexts).
    pub lane_end: [AtomicU64; 2],
    pub lane_owner: [AtomicU64; 2],
}

#[repr(C)]
struct Bucket {
    idx: AtomicU64,
    busy_ns: AtomicU64,
    /// First and last busy instant within the bucket (offsets from its start): `first << 32 | last`.
    span: AtomicU64,
}

const EMPTY_SPAN: u64 = (u32::MAX as u64) << 32;

#[repr(C)]
pub struct SlotDev {
    /// Device memory charged to this process (contexts included).
    pub used: AtomicU64,
    pub contexts: AtomicU64,
    /// Device memory held for this process outside its NVML figure (`Config::ctx_hidden`).
    pub hidden: AtomicU64,
    /// End of this process's last kernel on the device.
    pub last_end: AtomicU64,
    /// End of the busy time NVML counts for it (`last_end` plus the NVML tail).
    pub nvml_end: AtomicU64,
    ring: [Bucket; RING],
}

#[repr(C)]
pub struct Slot {
    pub pid: AtomicI32,
    _pad: u32,
    pub dev: [SlotDev; MAX_DEVICES],
}

#[repr(C)]
pub struct Layout {
    pub header: Header,
    pub devices: [Device; MAX_DEVICES],
    pub slots: [Slot; MAX_SLOTS],
    /// Owner of each `VA_CHUNK` of each device's fake address range: slot + 1, or 0 when free.
    /// A process claims whole chunks (CAS) and sub-allocates inside them privately; it gives a
    /// chunk back when nothing of it is in use, and a dead process's chunks are reclaimed with
    /// its slot. So addresses are unique among live allocations and freed space is reused.
    pub va_owner: [[AtomicU8; VA_CHUNKS]; MAX_DEVICES],
}

/// Lock bytes past the data, relative to `lock_base`.
const LOCK_TABLE: i64 = 0;
const fn lock_dev(d: usize) -> i64 {
    1 + d as i64
}
const fn lock_slot(s: usize) -> i64 {
    64 + s as i64
}

const NO_SLOT: usize = usize::MAX;
/// Base of device `d`'s fake address range (1 TiB each, far from host heap and stacks).
pub const fn va_base(d: usize) -> u64 {
    0x7000_0000_0000 + ((d as u64) << 40)
}
pub const VA_RANGE: u64 = 1 << 40;
/// Granule of fake address space a process claims from the shared table.
pub const VA_CHUNK: u64 = 256 << 20;
pub const VA_CHUNKS: usize = (VA_RANGE / VA_CHUNK) as usize;
const _: () = assert!(MAX_SLOTS < u8::MAX as usize, "va_owner holds slot + 1 in a byte");

/// This process's free fake address ranges inside the chunks it owns on one device:
/// offset from `va_base` -> length, never adjacent (coalesced).
#[derive(Default)]
struct VaSpace {
    free: BTreeMap<u64, u64>,
}

impl VaSpace {
    /// First fit of `size` bytes aligned to `align`; returns the offset.
    fn take(&mut self, size: u64, align: u64) -> Option<u64> {
        let (start, len, at) = self.free.iter().find_map(|(&start, &len)| {
            let at = start.checked_add(align - 1)? & !(align - 1);
            (at.checked_add(size)? <= start + len).then_some((start, len, at))
        })?;
        self.free.remove(&start);
        if at > start {
            self.free.insert(start, at - start);
        }
        if at + size < start + len {
            self.free.insert(at + size, start + len - at - size);
        }
        Some(at)
    }

    /// Return `[off, off+len)`; returns the coalesced free range that now contains it.
    fn give(&mut self, off: u64, len: u64) -> (u64, u64) {
        let (mut start, mut end) = (off, off + len);
        if let Some((&s, &l)) = self.free.range(..=off).next_back() {
            if s + l == off {
                self.free.remove(&s);
                start = s;
            }
        }
        if let Some(l) = self.free.remove(&end) {
            end += l;
        }
        self.free.insert(start, end - start);
        (start, end)
    }

    /// Whether `[off, off+len)` overlaps a free range (a double free or a foreign range).
    fn overlaps_free(&self, off: u64, len: u64) -> bool {
        let end = off + len;
        self.free.range(..end).next_back().is_some_and(|(&s, &l)| s + l > off)
    }
}

/// One process's view of the state file.
pub struct GpuState {
    file: File,
    map: MmapRaw,
    lock_base: i64,
    path: PathBuf,
    /// OFD locks do not exclude threads sharing our open file description: this does.
    mutex: Mutex<()>,
    /// Serializes this process's writes into its own busy rings.
    ring_mutex: Mutex<()>,
    my_slot: AtomicUsize,
    /// Per device: free ranges inside the address chunks our slot owns.
    va: Mutex<Vec<VaSpace>>,
}

static CURRENT: AtomicPtr<GpuState> = AtomicPtr::new(std::ptr::null_mut());
static FORK_GEN: AtomicU64 = AtomicU64::new(0);
static ATFORK: AtomicBool = AtomicBool::new(false);

extern "C" fn after_fork_child() {
    // The child shares the parent's open file description (and so its locks): forget that state
    // (leaked, still mapped) so the next use reopens the file and registers a slot of its own.
    CURRENT.store(std::ptr::null_mut(), SeqCst);
    FORK_GEN.fetch_add(1, SeqCst);
}

/// Bumped in a forked child: process-local driver state must be dropped when it changes.
pub fn fork_generation() -> u64 {
    FORK_GEN.load(Relaxed)
}

/// Default state file path.
pub fn default_path() -> PathBuf {
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    PathBuf::from(format!("/tmp/mock-gpu-{uid}.state"))
}

/// The process-wide state (opened, and created if needed, on first use).
///
/// Lock-free (no mutex a forked child could inherit locked): threads racing on the first use
/// each open the file and the first to publish wins; the others close theirs (no locks held).
pub fn shared() -> Result<&'static GpuState, String> {
    if !ATFORK.swap(true, AcqRel) {
        // SAFETY: registering a plain function; no prepare/parent handlers.
        unsafe { libc::pthread_atfork(None, None, Some(after_fork_child)) };
    }
    try_lazy_leak(&CURRENT, || {
        let path = std::env::var_os("MOCK_GPU_STATE").map(PathBuf::from).unwrap_or_else(default_path);
        GpuState::open(&path, &Config::from_env())
    })
}

/// A lazily built process-wide value without a lock (a forked child can never inherit one
/// half-taken): racing builders each build, the first to publish wins, the others drop theirs.
pub fn lazy_leak<T>(slot: &AtomicPtr<T>, build: impl FnOnce() -> T) -> &'static T {
    match try_lazy_leak(slot, || Ok::<T, std::convert::Infallible>(build())) {
        Ok(v) => v,
        Err(e) => match e {},
    }
}

/// `lazy_leak` with a build that may fail (nothing is published then; the next call retries).
pub fn try_lazy_leak<T, E>(slot: &AtomicPtr<T>, build: impl FnOnce() -> Result<T, E>) -> Result<&'static T, E> {
    let p = slot.load(Acquire);
    if !p.is_null() {
        // SAFETY: published values are leaked, never freed.
        return Ok(unsafe { &*p });
    }
    let v = Box::into_raw(Box::new(build()?));
    match slot.compare_exchange(std::ptr::null_mut(), v, AcqRel, Acquire) {
        // SAFETY: just leaked and published.
        Ok(_) => Ok(unsafe { &*v }),
        Err(winner) => {
            // SAFETY: `v` was never published; `winner` is leaked, never freed.
            drop(unsafe { Box::from_raw(v) });
            Ok(unsafe { &*winner })
        }
    }
}

fn flock(fd: i32, cmd: i32, typ: i32, off: i64) -> bool {
    // SAFETY: flock is plain data; zeroed is a valid initial value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = typ as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    fl.l_start = off;
    fl.l_len = 1;
    loop {
        // SAFETY: valid fd and flock struct.
        let rc = unsafe { libc::fcntl(fd, cmd, &mut fl) };
        if rc == 0 {
            return if cmd == libc::F_OFD_GETLK { fl.l_type == libc::F_UNLCK as i16 } else { true };
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return false;
        }
    }
}

struct Held<'a> {
    st: &'a GpuState,
    offs: Vec<i64>,
    _g: MutexGuard<'a, ()>,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        for o in self.offs.iter().rev() {
            flock(self.st.fd(), libc::F_OFD_SETLK, libc::F_UNLCK, self.st.lock_base + o);
        }
    }
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

impl GpuState {
    /// Open (creating or repairing when no live process uses it) the state file at `path`.
    pub fn open(path: &Path, cfg: &Config) -> Result<GpuState, String> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o666)
            .open(path)
            .map_err(|e| format!("cannot open mock GPU state {}: {e}", path.display()))?;
        // SAFETY: valid fd; failure (not our file) is harmless.
        unsafe { libc::fchmod(file.as_raw_fd(), 0o666) };
        let size = (std::mem::size_of::<Layout>() as u64).div_ceil(4096) * 4096;
        let lock_base = size as i64;
        let fd = file.as_raw_fd();
        if !flock(fd, libc::F_OFD_SETLKW, libc::F_WRLCK, lock_base + LOCK_TABLE) {
            return Err(format!("cannot lock mock GPU state {}", path.display()));
        }
        let res = Self::validate_or_create(&file, path, size, lock_base, cfg);
        flock(fd, libc::F_OFD_SETLK, libc::F_UNLCK, lock_base + LOCK_TABLE);
        res?;
        let map = MmapRaw::map_raw(&file).map_err(|e| format!("cannot map {}: {e}", path.display()))?;
        Ok(GpuState {
            file,
            map,
            lock_base,
            path: path.to_path_buf(),
            mutex: Mutex::new(()),
            ring_mutex: Mutex::new(()),
            my_slot: AtomicUsize::new(NO_SLOT),
            va: Mutex::new((0..MAX_DEVICES).map(|_| VaSpace::default()).collect()),
        })
    }

    fn validate_or_create(file: &File, path: &Path, size: u64, lock_base: i64, cfg: &Config) -> Result<(), String> {
        let len = file.metadata().map_err(|e| e.to_string())?.len();
        if len == size {
            let map = MmapRaw::map_raw(file).map_err(|e| e.to_string())?;
            // SAFETY: the file is `size` bytes, at least a Layout.
            let h = unsafe { &*(map.as_ptr() as *const Header) };
            if h.magic == MAGIC && h.version == VERSION && h.layout_size == size {
                return Ok(());
            }
        }
        let fd = file.as_raw_fd();
        if (0..MAX_SLOTS).any(|s| !flock(fd, libc::F_OFD_GETLK, libc::F_WRLCK, lock_base + lock_slot(s))) {
            return Err(format!(
                "mock GPU state {} has the wrong size or version and live processes use it; not touching it",
                path.display()
            ));
        }
        if len != 0 {
            eprintln!("[mock-gpu] warning: recreating mock GPU state {} (wrong size or version)", path.display());
        }
        file.set_len(0).and_then(|_| file.set_len(size)).map_err(|e| format!("cannot size {}: {e}", path.display()))?;
        let map = MmapRaw::map_raw(file).map_err(|e| e.to_string())?;
        // SAFETY: freshly zeroed file of Layout size; only this process (holding the table lock)
        // touches it until the magic is written.
        let l = unsafe { &mut *(map.as_mut_ptr() as *mut Layout) };
        let seed = splitmix(crate::realtime_us() ^ ((std::process::id() as u64) << 32));
        for (i, dc) in cfg.devices.iter().enumerate() {
            let d = &mut l.devices[i];
            let n = dc.name.as_bytes();
            let n = &n[..n.len().min(d.name.len() - 1)];
            d.name[..n.len()].copy_from_slice(n);
            let a = splitmix(seed ^ i as u64);
            let b = splitmix(a);
            d.uuid[..8].copy_from_slice(&a.to_le_bytes());
            d.uuid[8..].copy_from_slice(&b.to_le_bytes());
            d.total_mem = dc.total_mem;
            d.sms = dc.sms;
            d.pci_bus = 0x18 + i as u32 * 0x10;
        }
        let h = &mut l.header;
        h.version = VERSION;
        h.device_count = cfg.devices.len() as u32;
        h.layout_size = size;
        h.ctx_mem = cfg.ctx_mem;
        h.ctx_growth = cfg.ctx_growth;
        h.ctx_hidden = cfg.ctx_hidden;
        h.kernel_ns = cfg.kernel_ns;
        h.nvml_tail_ns = cfg.nvml_tail_ns;
        h.clock_khz = cfg.clock_khz;
        h.cc_major = cfg.cc_major;
        h.cc_minor = cfg.cc_minor;
        h.timer_ppm = cfg.timer_ppm;
        h.switch_ns = cfg.switch_ns;
        h.event_call_ns = cfg.event_call_ns;
        h.nvml_event_ns = cfg.nvml_event_ns;
        std::sync::atomic::fence(SeqCst);
        h.magic = MAGIC;
        map.flush().map_err(|e| e.to_string())?;
        Ok(())
    }

    fn fd(&self) -> i32 {
        self.file.as_raw_fd()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn layout(&self) -> &Layout {
        // SAFETY: the mapping is at least a Layout and lives as long as self; shared fields
        // written after creation are atomics.
        unsafe { &*(self.map.as_ptr() as *const Layout) }
    }

    pub fn header(&self) -> &Header {
        &self.layout().header
    }

    pub fn device_count(&self) -> usize {
        (self.header().device_count as usize).min(MAX_DEVICES)
    }

    pub fn device(&self, d: usize) -> &Device {
        &self.layout().devices[d]
    }

    pub fn device_name(&self, d: usize) -> String {
        let n = &self.device(d).name;
        let end = n.iter().position(|&c| c == 0).unwrap_or(n.len());
        String::from_utf8_lossy(&n[..end]).into_owned()
    }

    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, as NVML and nvidia-smi print it.
    pub fn uuid_string(&self, d: usize) -> String {
        let u = &self.device(d).uuid;
        let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
        format!("GPU-{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
    }

    fn lock(&self, offs: &[i64]) -> Held<'_> {
        let g = self.mutex.lock().unwrap_or_else(|e| e.into_inner());
        for o in offs {
            flock(self.fd(), libc::F_OFD_SETLKW, libc::F_WRLCK, self.lock_base + o);
        }
        Held { st: self, offs: offs.to_vec(), _g: g }
    }

    pub fn my_slot(&self) -> Option<usize> {
        Some(self.my_slot.load(Acquire)).filter(|&s| s != NO_SLOT)
    }

    /// Whether slot `s` belongs to a live process (ours, or one still holding its slot lock).
    pub fn slot_alive(&self, s: usize) -> bool {
        if self.my_slot() == Some(s) {
            return true;
        }
        self.layout().slots[s].pid.load(Acquire) != 0
            && !flock(self.fd(), libc::F_OFD_GETLK, libc::F_WRLCK, self.lock_base + lock_slot(s))
    }

    /// Claim a slot for this process (idempotent). Its lock byte is held until we die.
    pub fn register(&self) -> Result<usize, String> {
        if let Some(s) = self.my_slot() {
            return Ok(s);
        }
        let _h = self.lock(&[LOCK_TABLE]);
        self.reap_locked();
        for s in 0..MAX_SLOTS {
            let slot = &self.layout().slots[s];
            if slot.pid.load(Acquire) != 0 {
                continue;
            }
            if !flock(self.fd(), libc::F_OFD_SETLK, libc::F_WRLCK, self.lock_base + lock_slot(s)) {
                continue;
            }
            self.clear_slot(s);
            slot.pid.store(std::process::id() as i32, Release);
            self.my_slot.store(s, Release);
            return Ok(s);
        }
        Err(format!("all {MAX_SLOTS} mock GPU process slots are in use"))
    }

    fn clear_slot(&self, s: usize) {
        let tag = s as u8 + 1;
        for table in &self.layout().va_owner {
            for o in table.iter().filter(|o| o.load(Relaxed) == tag) {
                let _ = o.compare_exchange(tag, 0, AcqRel, Relaxed);
            }
        }
        for sd in &self.layout().slots[s].dev {
            sd.used.store(0, Relaxed);
            sd.contexts.store(0, Relaxed);
            sd.hidden.store(0, Relaxed);
            sd.last_end.store(0, Relaxed);
            sd.nvml_end.store(0, Relaxed);
            for b in &sd.ring {
                b.busy_ns.store(0, Relaxed);
                b.span.store(EMPTY_SPAN, Relaxed);
                b.idx.store(0, Relaxed);
            }
        }
    }

    /// Reclaim the slots of dead processes: their memory, contexts and queued work.
    pub fn reap(&self) {
        let _h = self.lock(&[LOCK_TABLE]);
        self.reap_locked();
    }

    fn reap_locked(&self) {
        let now = now_ns();
        for s in 0..MAX_SLOTS {
            if self.layout().slots[s].pid.load(Acquire) == 0 || self.slot_alive(s) {
                continue;
            }
            for d in 0..self.device_count() {
                // Drop its queued work: if it owns the tail of the device timeline, pull the tail
                // back to the latest work of the live processes (CAS: a racing launch wins).
                let tail = self.layout().slots[s].dev[d].last_end.load(Acquire);
                let dev = self.device(d);
                for (end, owner) in dev.lane_end.iter().zip(&dev.lane_owner) {
                    if owner.load(Acquire) == s as u64 + 1 && end.load(Acquire) > now {
                        end.store(now, Release);
                    }
                }
                if tail > now && dev.busy_until.load(Acquire) == tail {
                    let others = (0..MAX_SLOTS)
                        .filter(|&o| o != s && self.slot_alive(o))
                        .map(|o| self.layout().slots[o].dev[d].last_end.load(Acquire))
                        .max()
                        .unwrap_or(0);
                    let _ = dev.busy_until.compare_exchange(tail, others.max(now), AcqRel, Acquire);
                }
            }
            self.clear_slot(s);
            self.layout().slots[s].pid.store(0, Release);
        }
    }

    /// Live slots with their pids.
    pub fn live_slots(&self) -> Vec<(usize, i32)> {
        (0..MAX_SLOTS)
            .filter_map(|s| {
                let pid = self.layout().slots[s].pid.load(Acquire);
                (pid != 0 && self.slot_alive(s)).then_some((s, pid))
            })
            .collect()
    }

    pub fn slot_dev(&self, s: usize, d: usize) -> &SlotDev {
        &self.layout().slots[s].dev[d]
    }

    /// Device memory in use by live processes (contexts included, and what the device holds for
    /// them outside their own NVML figures).
    pub fn device_used(&self, d: usize) -> u64 {
        self.live_slots()
            .iter()
            .map(|&(s, _)| {
                let sd = self.slot_dev(s, d);
                sd.used.load(Acquire) + sd.hidden.load(Acquire)
            })
            .sum()
    }

    /// Charge `bytes` of device `d` to our slot, atomically with the device-wide capacity check.
    pub fn try_charge(&self, d: usize, bytes: u64) -> bool {
        let Some(s) = self.my_slot() else { return false };
        let _h = self.lock(&[lock_dev(d)]);
        let used = self.device_used(d);
        if used.saturating_add(bytes) > self.device(d).total_mem {
            return false;
        }
        self.slot_dev(s, d).used.fetch_add(bytes, AcqRel);
        true
    }

    /// Charge as much of `bytes` as device `d` has free (at least 0): managed memory is resident
    /// on the device only as far as it fits, the rest stays in host memory as with unified
    /// memory on a real GPU. Returns the bytes charged.
    pub fn charge_up_to(&self, d: usize, bytes: u64) -> u64 {
        let Some(s) = self.my_slot() else { return 0 };
        let _h = self.lock(&[lock_dev(d)]);
        let free = self.device(d).total_mem.saturating_sub(self.device_used(d));
        let take = bytes.min(free);
        self.slot_dev(s, d).used.fetch_add(take, AcqRel);
        take
    }

    /// What device `d` holds, read under the device's lock: a reader summing the slots while one
    /// process frees and another then allocates could count both (NVML's figure is one counter:
    /// `hook_multiproc::sixteen_processes_never_exceed_the_cap` read 16 MiB over its cap).
    pub fn device_used_now(&self, d: usize) -> u64 {
        let _h = self.lock(&[lock_dev(d)]);
        self.device_used(d)
    }

    /// Give back `bytes` of device `d` (under the device's lock: `device_used_now`).
    pub fn uncharge(&self, d: usize, bytes: u64) {
        if let Some(s) = self.my_slot() {
            let _h = self.lock(&[lock_dev(d)]);
            let u = &self.slot_dev(s, d).used;
            let _ = u.fetch_update(AcqRel, Acquire, |v| Some(v.saturating_sub(bytes)));
        }
    }

    /// A context came (`delta` 1) or went (-1): counted, with the memory the device holds for it
    /// outside the process's figure (`Config::ctx_hidden`; a few MiB, not checked against the
    /// device's capacity).
    pub fn add_context(&self, d: usize, delta: i64) {
        if let Some(s) = self.my_slot() {
            let _h = self.lock(&[lock_dev(d)]);
            let sd = self.slot_dev(s, d);
            let _ = sd.contexts.fetch_update(AcqRel, Acquire, |v| Some(v.saturating_add_signed(delta)));
            let hidden = self.header().ctx_hidden as i64 * delta;
            let _ = sd.hidden.fetch_update(AcqRel, Acquire, |v| Some(v.saturating_add_signed(hidden)));
        }
    }

    /// A fake device address range of `size` bytes aligned to `align` (a power of two), unique
    /// among the live ranges of all processes. Needs our slot (`register`); give it back with
    /// `free_va`.
    pub fn alloc_va(&self, d: usize, size: u64, align: u64) -> Option<u64> {
        let s = self.my_slot()?;
        if d >= MAX_DEVICES || size == 0 || size > VA_RANGE || !align.is_power_of_two() || align > VA_RANGE {
            return None;
        }
        let mut va = self.va.lock().unwrap_or_else(|e| e.into_inner());
        let space = &mut va[d];
        if let Some(off) = space.take(size, align) {
            return Some(va_base(d) + off);
        }
        let n = size.div_ceil(VA_CHUNK) as usize;
        let step = (align / VA_CHUNK).max(1) as usize;
        let first = self.claim_chunks(d, s, n, step)?;
        space.give(first as u64 * VA_CHUNK, n as u64 * VA_CHUNK);
        // The claimed run alone fits (chunk-aligned, `align` divides its start).
        space.take(size, align).map(|off| va_base(d) + off)
    }

    /// Give back a range from `alloc_va` (same size); chunks with nothing left in use go back to
    /// the shared table. Returns false (and changes nothing) for a range that is not ours.
    pub fn free_va(&self, d: usize, addr: u64, size: u64) -> bool {
        let Some(s) = self.my_slot() else { return false };
        if d >= MAX_DEVICES || size == 0 || addr < va_base(d) || addr - va_base(d) > VA_RANGE - size.min(VA_RANGE) {
            return false;
        }
        let off = addr - va_base(d);
        let table = &self.layout().va_owner[d];
        let (c0, c1) = ((off / VA_CHUNK) as usize, (off + size).div_ceil(VA_CHUNK) as usize);
        let mut va = self.va.lock().unwrap_or_else(|e| e.into_inner());
        let space = &mut va[d];
        if table[c0..c1].iter().any(|o| o.load(Acquire) as usize != s + 1) || space.overlaps_free(off, size) {
            return false;
        }
        let (start, end) = space.give(off, size);
        let (cs, ce) = (start.div_ceil(VA_CHUNK), end / VA_CHUNK);
        if ce > cs {
            space.free.remove(&start);
            if start < cs * VA_CHUNK {
                space.free.insert(start, cs * VA_CHUNK - start);
            }
            if ce * VA_CHUNK < end {
                space.free.insert(ce * VA_CHUNK, end - ce * VA_CHUNK);
            }
            for o in &table[cs as usize..ce as usize] {
                let _ = o.compare_exchange(s as u8 + 1, 0, AcqRel, Relaxed);
            }
        }
        true
    }

    /// Claim `n` free consecutive chunks of device `d` for slot `s`, the first at a multiple of
    /// `step`; returns the first chunk's index.
    fn claim_chunks(&self, d: usize, s: usize, n: usize, step: usize) -> Option<usize> {
        let table = &self.layout().va_owner[d];
        let tag = s as u8 + 1;
        let mut i = 0;
        while i + n <= VA_CHUNKS {
            let mut got = 0;
            while got < n
                && table[i + got].load(Relaxed) == 0
                && table[i + got].compare_exchange(0, tag, AcqRel, Relaxed).is_ok()
            {
                got += 1;
            }
            if got == n {
                return Some(i);
            }
            for o in &table[i..i + got] {
                o.store(0, Release);
            }
            // Skip past the taken chunk, to the next multiple of `step`.
            i = (i + got + 1).div_ceil(step) * step;
        }
        None
    }

    /// Queue a kernel of `dur_ns` that cannot start before `earliest` (its stream's previous
    /// work) and takes at most half the GPU (`half`) or more; returns (start, end). A half kernel
    /// runs beside another half kernel of the same process, never beside another process's.
    pub fn enqueue_kernel(&self, d: usize, dur_ns: u64, earliest: u64, half: bool) -> (u64, u64) {
        let _held = self.lock(&[lock_dev(d)]);
        let now = now_ns();
        let dev = self.device(d);
        let me = self.my_slot().map_or(0, |s| s as u64 + 1);
        let t0 = earliest.max(now).max(if half { 0 } else { dev.busy_until.load(Acquire) });
        let lane = |i: usize| dev.lane_end[i].load(Acquire);
        let (start, lanes): (u64, &[usize]) = if half {
            let i = if lane(0) <= lane(1) { 0 } else { 1 };
            let j = 1 - i;
            let mut start = t0.max(lane(i));
            if dev.lane_owner[j].load(Acquire) != me {
                start = start.max(lane(j));
            }
            (start, if i == 0 { &[0] } else { &[1] })
        } else {
            (t0.max(lane(0)).max(lane(1)), &[0, 1])
        };
        // Another process's kernel ran until just before: the GPU switches contexts first.
        let switch = self.header().switch_ns;
        let other = lanes.iter().any(|&i| {
            let o = dev.lane_owner[i].load(Acquire);
            o != 0 && o != me && lane(i) + switch > start
        });
        let (busy_from, start) = if switch > 0 && other { (start, start + switch) } else { (start, start) };
        let end = start + dur_ns;
        for &i in lanes {
            dev.lane_end[i].store(end, Release);
            dev.lane_owner[i].store(me, Release);
        }
        dev.busy_until.fetch_max(end, AcqRel);
        if let Some(s) = self.my_slot() {
            let sd = self.slot_dev(s, d);
            sd.last_end.fetch_max(end, AcqRel);
            self.record_nvml_busy(sd, busy_from, end, now);
        }
        (start, end)
    }

    /// Queue `dur_ns` of work on device `d`'s timeline for our slot; returns (start, end).
    pub fn enqueue(&self, d: usize, dur_ns: u64) -> (u64, u64) {
        let now = now_ns();
        let dev = self.device(d);
        let mut cur = dev.busy_until.load(Acquire);
        let (start, end) = loop {
            let start = cur.max(now);
            let end = start + dur_ns;
            match dev.busy_until.compare_exchange_weak(cur, end, AcqRel, Acquire) {
                Ok(_) => break (start, end),
                Err(v) => cur = v,
            }
        };
        if let Some(s) = self.my_slot() {
            let sd = self.slot_dev(s, d);
            sd.last_end.fetch_max(end, AcqRel);
            self.record_nvml_busy(sd, start, end, now);
        }
        (start, end)
    }

    /// A timing event of ours reached the GPU at `at` on device `d`: NVML counts
    /// `nvml_event_ns` of busy time for it (the union with our other work).
    pub fn event_reached(&self, d: usize, at: u64) {
        let ns = self.header().nvml_event_ns;
        if let (true, Some(s)) = (ns > 0, self.my_slot()) {
            let sd = self.slot_dev(s, d);
            let prev = sd.nvml_end.fetch_max(at + ns, AcqRel);
            if at + ns > prev {
                self.record_busy(sd, at.max(prev), at + ns, now_ns());
            }
        }
    }

    /// Record `[start, end)` plus NVML's tail as busy for NVML. Busy time is the union: work
    /// beside our own (or inside the previous tail) counts only past what is recorded.
    fn record_nvml_busy(&self, sd: &SlotDev, start: u64, end: u64, now: u64) {
        let end = end + self.header().nvml_tail_ns;
        let prev = sd.nvml_end.fetch_max(end, AcqRel);
        if end > prev {
            self.record_busy(sd, start.max(prev), end, now);
        }
    }

    fn record_busy(&self, sd: &SlotDev, start: u64, end: u64, now: u64) {
        let _g = self.ring_mutex.lock().unwrap_or_else(|e| e.into_inner());
        // Work queued further ahead than half the ring would overwrite history: not recorded.
        let horizon = now / BUCKET_NS + RING as u64 / 2;
        let mut t = start;
        while t < end {
            let b = t / BUCKET_NS;
            if b > horizon {
                break;
            }
            let seg_end = ((b + 1) * BUCKET_NS).min(end);
            let bucket = &sd.ring[(b % RING as u64) as usize];
            if bucket.idx.load(Acquire) != b {
                bucket.busy_ns.store(0, Release);
                bucket.span.store(EMPTY_SPAN, Release);
                bucket.idx.store(b, Release);
            }
            bucket.busy_ns.fetch_add(seg_end - t, AcqRel);
            let (first, last) = (t - b * BUCKET_NS, seg_end - b * BUCKET_NS);
            let _ = bucket.span.fetch_update(AcqRel, Acquire, |v| {
                Some(((v >> 32).min(first) << 32) | (v & 0xFFFF_FFFF).max(last))
            });
            t = seg_end;
        }
    }

    /// Busy nanoseconds of slot `s` on device `d` within `[t0, t1)` (clipped to now), assuming
    /// busy time spreads evenly between the first and last busy instant of each 10 ms bucket.
    pub fn busy_ns(&self, s: usize, d: usize, t0: u64, t1: u64) -> u64 {
        let t1 = t1.min(now_ns());
        if t1 <= t0 {
            return 0;
        }
        let sd = self.slot_dev(s, d);
        let (b0, b1) = (t0 / BUCKET_NS, (t1 - 1) / BUCKET_NS);
        let b0 = b0.max(b1.saturating_sub(RING as u64 - 1));
        let mut total = 0u128;
        for b in b0..=b1 {
            let bucket = &sd.ring[(b % RING as u64) as usize];
            if bucket.idx.load(Acquire) != b {
                continue;
            }
            let busy = bucket.busy_ns.load(Acquire) as u128;
            let span = bucket.span.load(Acquire);
            let (first, last) = ((span >> 32).min(BUCKET_NS), (span & 0xFFFF_FFFF).min(BUCKET_NS));
            let (bs, be) = (b * BUCKET_NS + first, b * BUCKET_NS + last.max(first));
            if be <= bs || be <= t0 || bs >= t1 {
                continue;
            }
            let overlap = (be.min(t1) - bs.max(t0)) as u128;
            total += (busy * overlap / (be - bs) as u128).min(overlap);
        }
        total as u64
    }

    /// Busy time of all live processes on device `d` within `[t0, t1)`. Kernels of different
    /// processes never overlap on the timeline, so the sum is the union.
    pub fn device_busy_ns(&self, d: usize, t0: u64, t1: u64) -> u64 {
        self.live_slots().iter().map(|&(s, _)| self.busy_ns(s, d, t0, t1)).sum::<u64>().min(t1.saturating_sub(t0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DeviceConfig;

    fn tmp_state(tag: &str) -> (PathBuf, Config) {
        let p = std::env::temp_dir().join(format!("mock-gpu-unit-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        let c = Config {
            devices: vec![
                DeviceConfig { name: "A".into(), total_mem: 1 << 30, sms: 4 },
                DeviceConfig { name: "B".into(), total_mem: 2 << 30, sms: 8 },
            ],
            ..Config::default()
        };
        (p, c)
    }

    #[test]
    fn create_register_charge() {
        let (p, c) = tmp_state("charge");
        let st = GpuState::open(&p, &c).unwrap();
        assert_eq!(st.device_count(), 2);
        assert_eq!(st.device_name(1), "B");
        assert!(st.uuid_string(0).starts_with("GPU-") && st.uuid_string(0).len() == 40);
        assert_ne!(st.uuid_string(0), st.uuid_string(1));
        assert!(!st.try_charge(0, 1), "no slot yet");
        let s = st.register().unwrap();
        assert_eq!(st.register().unwrap(), s);
        assert!(st.try_charge(0, 512 << 20));
        assert!(st.try_charge(0, 512 << 20));
        assert!(!st.try_charge(0, 1));
        assert_eq!(st.device_used(0), 1 << 30);
        st.uncharge(0, 1 << 30);
        assert_eq!(st.device_used(0), 0);
        // A second open of the same file sees the same devices and our usage.
        let st2 = GpuState::open(&p, &Config::default()).unwrap();
        assert_eq!(st2.device_count(), 2);
        assert!(st.try_charge(1, 4096));
        assert_eq!(st2.device_used(1), 4096, "a second description sees the charge");
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn corrupt_file_is_recreated_when_unused() {
        let (p, c) = tmp_state("corrupt");
        std::fs::write(&p, b"garbage").unwrap();
        let st = GpuState::open(&p, &c).unwrap();
        assert_eq!(st.device_count(), 2);
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn va_allocation_is_aligned_and_unique() {
        let (p, c) = tmp_state("va");
        let st = GpuState::open(&p, &c).unwrap();
        assert!(st.alloc_va(0, 100, 512).is_none(), "no slot yet");
        st.register().unwrap();
        let a = st.alloc_va(0, 100, 512).unwrap();
        let b = st.alloc_va(0, 3 << 20, 2 << 20).unwrap();
        let e = st.alloc_va(1, 1, 512).unwrap();
        assert_eq!(a, va_base(0));
        assert_eq!(b % (2 << 20), 0);
        assert!(b >= a + 512);
        assert_eq!(e, va_base(1));
        assert!(st.alloc_va(0, VA_RANGE + 1, 512).is_none());
        // A second process (its own open file description and slot) never gets a live range.
        let st2 = GpuState::open(&p, &c).unwrap();
        st2.register().unwrap();
        let x = st2.alloc_va(0, 100, 512).unwrap();
        assert!(x >= va_base(0) + VA_CHUNK, "another process's chunk: {x:#x}");
        assert!(!st.free_va(0, x, 100), "not ours to free");
        assert!(st2.free_va(0, x, 100));
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn freed_address_space_is_reused() {
        let (p, c) = tmp_state("va-reuse");
        let st = GpuState::open(&p, &c).unwrap();
        st.register().unwrap();
        // Far more than the 1 TiB range over the loop: each round reuses the freed range.
        for i in 0..2000u64 {
            let a = st.alloc_va(0, 1 << 30, 2 << 20).unwrap_or_else(|| panic!("round {i}"));
            assert_eq!(a, va_base(0), "round {i}");
            assert!(st.free_va(0, a, 1 << 30));
        }
        assert!(st.layout().va_owner[0].iter().all(|o| o.load(Relaxed) == 0), "chunks given back");
        // Fill the whole range, then free it all: everything is reusable, in one piece too.
        let n = VA_RANGE / (4 << 30);
        let all: Vec<u64> = (0..n).map(|_| st.alloc_va(0, 4 << 30, 2 << 20).unwrap()).collect();
        assert!(st.alloc_va(0, 512, 512).is_none(), "range exhausted");
        let mut sorted = all.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), all.len(), "unique");
        for &a in &all {
            assert!(st.free_va(0, a, 4 << 30));
        }
        assert!(!st.free_va(0, all[0], 4 << 30), "double free refused");
        assert_eq!(st.alloc_va(0, VA_RANGE, 2 << 20), Some(va_base(0)));
        assert!(st.free_va(0, va_base(0), VA_RANGE));
        // Small ranges pack into one chunk and give it back only when all are freed.
        let small: Vec<u64> = (0..100).map(|_| st.alloc_va(1, 1000, 512).unwrap()).collect();
        assert!(small.windows(2).all(|w| w[1] >= w[0] + 1000));
        assert_eq!(st.layout().va_owner[1].iter().filter(|o| o.load(Relaxed) != 0).count(), 1);
        for &a in small.iter().rev() {
            assert!(st.free_va(1, a, 1000));
        }
        assert!(st.layout().va_owner[1].iter().all(|o| o.load(Relaxed) == 0));
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn dead_process_address_space_is_reclaimed() {
        let (p, c) = tmp_state("va-dead");
        let st = GpuState::open(&p, &c).unwrap();
        st.register().unwrap();
        {
            // Another "process": its own description; dropping it closes the file, which drops
            // its slot lock exactly as the kernel does when a process dies.
            let other = GpuState::open(&p, &c).unwrap();
            other.register().unwrap();
            let n = VA_RANGE / (8 << 30);
            for _ in 0..n {
                other.alloc_va(0, 8 << 30, 2 << 20).unwrap();
            }
        }
        assert!(st.alloc_va(0, 512, 512).is_none(), "the dead process's chunks are not reaped yet");
        st.reap();
        assert!(st.layout().va_owner[0].iter().all(|o| o.load(Relaxed) == 0));
        assert_eq!(st.alloc_va(0, VA_RANGE, 2 << 20), Some(va_base(0)));
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn timeline_serializes_and_records_busy_time() {
        let (p, c) = tmp_state("timeline");
        let st = GpuState::open(&p, &c).unwrap();
        let s = st.register().unwrap();
        let t0 = now_ns();
        let (s1, e1) = st.enqueue(0, 3_000_000);
        let (s2, e2) = st.enqueue(0, 2_000_000);
        assert!(s1 >= t0 && e1 == s1 + 3_000_000);
        assert_eq!(s2, e1, "second kernel queues behind the first");
        assert_eq!(e2, s2 + 2_000_000);
        crate::sleep_until_ns(e2 + 1_000_000);
        let busy = st.busy_ns(s, 0, t0, now_ns());
        assert_eq!(busy, 5_000_000, "the window covers both kernels whole");
        // A window starting mid-way counts part of the busy span (spread evenly within a bucket).
        let part = st.busy_ns(s, 0, s2, now_ns());
        assert!(part > 1_000_000 && part < 3_500_000, "part {part}");
        assert_eq!(st.device_busy_ns(1, t0, now_ns()), 0);
        let _ = std::fs::remove_file(&p);
    }
}
