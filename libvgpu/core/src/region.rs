//! The shared region: one mmapped file per container (`CUDA_DEVICE_MEMORY_SHARED_CACHE`), HAMi's v1
//! `shared_region_t` byte for byte followed by our extension (layout in [`layout`]).
//!
//! Locking (design.md): OFD byte-range locks beyond the data (kernel-released on death) plus
//! in-process mutexes. Lock order: a device lock may be followed by the table lock (reaping inside
//! `try_reserve`); nothing takes a device lock while holding the table lock. No lock is ever waited
//! on for a dead process: the kernel drops a dead holder's locks.
//!
//! Memory ordering: usage counters are changed with atomic RMWs (AcqRel) and read with Acquire.
//! The check-then-add of `try_reserve` is serialized by the device lock (Mutex + fcntl are full
//! barriers); releases are lock-free saturating subtracts that only lower the sum, so a concurrent
//! reader can only over-estimate usage. A slot's `status` is stored last (Release) when a slot is
//! taken and read first (Acquire) by readers. A memory cap is two words (`mem_capped[d]`, `limit[d]`):
//! a cap is set value-then-flag and cleared flag-then-value, read flag-then-value, so a reader sees
//! the old or the new cap, never an uncapped device that should be capped.

pub mod layout;
mod lock;

pub use layout::*;
pub use lock::{LOCK_BASE, LOCK_DEVICE, LOCK_LIVENESS, LOCK_SLOT, LOCK_TABLE};

use crate::config::Config;
use crate::limiter::SharedDeviceState;
use crate::{MAX_DEVICES, MAX_PROCS};
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::{Mutex, MutexGuard};

/// What a charge is for (HAMi's `context_size` / `module_size` / `data_size`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemKind {
    Context,
    Module,
    Data,
}

/// A registered process slot (index into `procs[]`, always < MAX_PROCS).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SlotId(u32);

impl SlotId {
    pub fn new(index: usize) -> Option<SlotId> {
        (index < MAX_PROCS).then_some(SlotId(index as u32))
    }
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

#[derive(Debug)]
pub enum RegionError {
    NotFound(PathBuf),
    PermissionDenied(PathBuf),
    /// The file is not a usable region (short, wrong magic/version, foreign extension).
    Invalid { path: PathBuf, reason: String },
    /// The file is invalid but live processes still use it, so it cannot be recreated.
    InUse { path: PathBuf, reason: String },
    Io { path: PathBuf, op: &'static str, err: io::Error },
    Lock(io::Error),
    TableFull,
    BadDevice(usize),
    NotOwner(SlotId),
}

impl fmt::Display for RegionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegionError::NotFound(p) => write!(f, "shared region {} does not exist", p.display()),
            RegionError::PermissionDenied(p) => {
                write!(f, "shared region {}: permission denied (read-write access needed)", p.display())
            }
            RegionError::Invalid { path, reason } => write!(f, "shared region {} is invalid: {reason}", path.display()),
            RegionError::InUse { path, reason } => write!(
                f,
                "shared region {} is invalid ({reason}) and still used by live processes; not recreating it",
                path.display()
            ),
            RegionError::Io { path, op, err } => write!(f, "shared region {}: {op} failed: {err}", path.display()),
            RegionError::Lock(e) => write!(f, "shared region lock failed: {e}"),
            RegionError::TableFull => write!(f, "shared region process table is full ({MAX_PROCS} slots)"),
            RegionError::BadDevice(d) => write!(f, "device index {d} out of range (0..{MAX_DEVICES})"),
            RegionError::NotOwner(s) => write!(f, "slot {} is not owned by this process", s.index()),
        }
    }
}

impl std::error::Error for RegionError {}

/// Why a reservation was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReserveError {
    OverLimit { used: u64, limit: u64, requested: u64 },
    BadDevice(usize),
    /// The device lock could not be taken (fail closed: treated as out of memory).
    Lock(String),
}

impl fmt::Display for ReserveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReserveError::OverLimit { used, limit, requested } => {
                write!(f, "over the memory limit: used {used} + requested {requested} > limit {limit} bytes")
            }
            ReserveError::BadDevice(d) => write!(f, "device index {d} out of range"),
            ReserveError::Lock(e) => write!(f, "device lock failed: {e}"),
        }
    }
}

impl std::error::Error for ReserveError {}

/// One process's usage of one device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemUsage {
    pub context: u64,
    pub module: u64,
    pub data: u64,
    pub total: u64,
}

/// What this process wants in the region (from its env + the devices it sees).
#[derive(Clone, Debug, PartialEq)]
pub struct RegionInit {
    pub device_num: u32,
    pub uuids: Vec<String>,
    /// Physical memory per device (0 = unknown).
    pub physical: [u64; MAX_DEVICES],
    pub mem_limits: [Option<u64>; MAX_DEVICES],
    pub sm_limits: [Option<u32>; MAX_DEVICES],
    pub soft_sm_limits: [Option<u32>; MAX_DEVICES],
    pub priority: i32,
}

impl Default for RegionInit {
    fn default() -> Self {
        RegionInit {
            device_num: 0,
            uuids: Vec::new(),
            physical: [0; MAX_DEVICES],
            mem_limits: [None; MAX_DEVICES],
            sm_limits: [None; MAX_DEVICES],
            soft_sm_limits: [None; MAX_DEVICES],
            priority: crate::config::DEFAULT_PRIORITY,
        }
    }
}

impl RegionInit {
    /// Resolve a config against the devices this process sees (`physical[i]` of visible device i).
    pub fn from_config(cfg: &Config, physical: &[u64], uuids: &[String]) -> RegionInit {
        let mut init = RegionInit {
            device_num: physical.len().min(MAX_DEVICES) as u32,
            uuids: uuids.iter().take(MAX_DEVICES).cloned().collect(),
            priority: cfg.priority,
            ..RegionInit::default()
        };
        // Only devices that exist get limits: a global cap must not mark 16 phantom devices.
        for (d, &phys) in physical.iter().enumerate().take(MAX_DEVICES) {
            init.physical[d] = phys;
            init.mem_limits[d] = cfg.mem_limit(d, phys);
            init.sm_limits[d] = cfg.sm_limit(d);
            init.soft_sm_limits[d] = cfg.soft_sm_limit(d);
        }
        init
    }
}

/// A mapped region (file-backed, or private anonymous memory with the same API).
pub struct Region {
    base: NonNull<u8>,
    file: Option<File>,
    path: Option<PathBuf>,
    table_mu: Mutex<()>,
    dev_mu: [Mutex<()>; MAX_DEVICES],
    owned: Box<[AtomicBool]>,
    /// Whether this handle holds the liveness read lock (users do, tools do not).
    live: bool,
    pid: u32,
}

// SAFETY: the mapping is only accessed through atomics (or never-written byte arrays); the
// pointer stays valid until Drop.
unsafe impl Send for Region {}
unsafe impl Sync for Region {}

fn io_err(path: &Path, op: &'static str, err: io::Error) -> RegionError {
    match err.kind() {
        io::ErrorKind::NotFound => RegionError::NotFound(path.to_path_buf()),
        io::ErrorKind::PermissionDenied => RegionError::PermissionDenied(path.to_path_buf()),
        _ => RegionError::Io { path: path.to_path_buf(), op, err },
    }
}

fn map_shared(fd: Option<RawFd>) -> io::Result<NonNull<u8>> {
    let (flags, fd) = match fd {
        Some(fd) => (libc::MAP_SHARED, fd),
        None => (libc::MAP_SHARED | libc::MAP_ANONYMOUS, -1),
    };
    // SAFETY: fresh mapping of TOTAL_SIZE bytes; the file (if any) is at least that long.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), TOTAL_SIZE, libc::PROT_READ | libc::PROT_WRITE, flags, fd, 0) };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned null"))
}

fn unmap(p: NonNull<u8>) {
    // SAFETY: p came from map_shared with TOTAL_SIZE.
    unsafe { libc::munmap(p.as_ptr().cast(), TOTAL_SIZE) };
}

/// Why a file is not a valid region of ours, read without mapping (short files cannot be mapped).
fn check_file(file: &File, size: u64) -> Result<(), String> {
    use std::os::unix::fs::FileExt;
    if size < TOTAL_SIZE as u64 {
        return Err(format!("size {size} bytes, expected at least {TOTAL_SIZE}"));
    }
    let mut head = [0u8; 8];
    let mut ext = [0u8; 16];
    file.read_exact_at(&mut head, 0).map_err(|e| format!("read failed: {e}"))?;
    file.read_exact_at(&mut ext, EXT_OFFSET as u64).map_err(|e| format!("read failed: {e}"))?;
    let magic = i32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    let major = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    if magic != HAMI_MAGIC {
        return Err(format!("wrong magic {magic}, expected {HAMI_MAGIC}"));
    }
    if major != HAMI_MAJOR {
        return Err(format!("layout major version {major}, expected {HAMI_MAJOR}"));
    }
    if ext[0..8] != EXT_MAGIC {
        return Err("no libvgpu extension (foreign region)".to_string());
    }
    let ver = u32::from_le_bytes([ext[8], ext[9], ext[10], ext[11]]);
    let esz = u32::from_le_bytes([ext[12], ext[13], ext[14], ext[15]]);
    if ver != EXT_VERSION || esz as usize != EXT_SIZE {
        return Err(format!("extension version {ver} size {esz}, expected {EXT_VERSION} size {EXT_SIZE}"));
    }
    Ok(())
}

fn new_mutexes() -> [Mutex<()>; MAX_DEVICES] {
    std::array::from_fn(|_| Mutex::new(()))
}

fn lock_mu(m: &Mutex<()>) -> MutexGuard<'_, ()> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Slot table lock held (in-process mutex + OFD byte).
struct TableGuard<'a> {
    fd: Option<RawFd>,
    _g: MutexGuard<'a, ()>,
}

impl Drop for TableGuard<'_> {
    fn drop(&mut self) {
        if let Some(fd) = self.fd {
            lock::unlock(fd, LOCK_TABLE);
        }
    }
}

/// Device ledger lock held; reservations through it are serialized with every other process.
pub struct DeviceGuard<'a> {
    r: &'a Region,
    dev: usize,
    _g: MutexGuard<'a, ()>,
}

impl Drop for DeviceGuard<'_> {
    fn drop(&mut self) {
        if let Some(fd) = self.r.fd() {
            lock::unlock(fd, LOCK_DEVICE + self.dev as i64);
        }
    }
}

impl DeviceGuard<'_> {
    pub fn dev(&self) -> usize {
        self.dev
    }

    /// Usage of the device by live slots.
    pub fn used(&self) -> u64 {
        self.r.device_used(self.dev)
    }

    /// Charge `bytes` to `slot` if the device stays within its cap; reaps dead slots before
    /// refusing.
    pub fn try_reserve(&self, slot: SlotId, kind: MemKind, bytes: u64) -> Result<(), ReserveError> {
        let d = self.dev;
        if let Some(limit) = self.r.limit(d) {
            let mut used = self.r.device_used(d);
            if used.saturating_add(bytes) > limit {
                if self.r.reap_dead() > 0 {
                    used = self.r.device_used(d);
                }
                if used.saturating_add(bytes) > limit {
                    return Err(ReserveError::OverLimit { used, limit, requested: bytes });
                }
            }
        }
        self.r.add(slot, d, kind, bytes);
        Ok(())
    }

    /// Charge unconditionally (usage that already exists, e.g. a measured context), even past
    /// the cap.
    pub fn charge(&self, slot: SlotId, kind: MemKind, bytes: u64) {
        self.r.add(slot, self.dev, kind, bytes);
    }
}

fn sat_sub(a: &AtomicU64, v: u64) {
    let _ = a.fetch_update(AcqRel, Acquire, |x| Some(x.saturating_sub(v)));
}

impl Region {
    // ---------- opening ----------

    /// Open or create the region at `path` for a process using it (takes the liveness read lock
    /// for the lifetime of the handle). Invalid files are recreated when nobody lives on them.
    pub fn open(path: impl AsRef<Path>, init: &RegionInit) -> Result<Region, RegionError> {
        Self::open_impl(path.as_ref(), init, OpenMode::User)
    }

    /// Create or reinitialize the region at `path` (shrreg-tool --create_new). Refuses while live
    /// processes use it.
    pub fn create_new(path: impl AsRef<Path>, init: &RegionInit) -> Result<Region, RegionError> {
        Self::open_impl(path.as_ref(), init, OpenMode::Recreate)
    }

    /// Open an existing valid region for tools: never creates or repairs.
    pub fn open_existing(path: impl AsRef<Path>) -> Result<Region, RegionError> {
        let path = path.as_ref();
        let file = OpenOptions::new().read(true).write(true).open(path).map_err(|e| io_err(path, "open", e))?;
        let fd = file.as_raw_fd();
        lock::lock_wait(fd, true, LOCK_TABLE).map_err(RegionError::Lock)?;
        let res = (|| {
            let size = file.metadata().map_err(|e| io_err(path, "stat", e))?.len();
            check_file(&file, size).map_err(|reason| RegionError::Invalid { path: path.to_path_buf(), reason })?;
            map_shared(Some(fd)).map_err(|e| io_err(path, "mmap", e))
        })();
        lock::unlock(fd, LOCK_TABLE);
        Ok(Self::from_parts(res?, Some(file), Some(path.to_path_buf()), false))
    }

    /// A copy of the region file in private memory (read-only access suffices); changes to the
    /// copy do not reach the file.
    pub fn snapshot(path: impl AsRef<Path>) -> Result<Region, RegionError> {
        use std::os::unix::fs::FileExt;
        let path = path.as_ref();
        let file = File::open(path).map_err(|e| io_err(path, "open", e))?;
        let size = file.metadata().map_err(|e| io_err(path, "stat", e))?.len();
        check_file(&file, size).map_err(|reason| RegionError::Invalid { path: path.to_path_buf(), reason })?;
        let base = map_shared(None).map_err(|e| io_err(path, "mmap", e))?;
        // SAFETY: fresh private mapping of TOTAL_SIZE bytes, not shared with anyone yet.
        let buf = unsafe { std::slice::from_raw_parts_mut(base.as_ptr(), TOTAL_SIZE) };
        if let Err(e) = file.read_exact_at(buf, 0) {
            unmap(base);
            return Err(io_err(path, "read", e));
        }
        Ok(Self::from_parts(base, None, Some(path.to_path_buf()), false))
    }

    /// An anonymous region with the same API: limits still apply to this process (fallback when
    /// the file cannot be used). Fails only if the kernel refuses a 4 MiB anonymous mapping.
    pub fn private(init: &RegionInit) -> Result<Region, RegionError> {
        let base = map_shared(None).map_err(|e| RegionError::Io { path: PathBuf::from("<private>"), op: "mmap", err: e })?;
        let r = Self::from_parts(base, None, None, true);
        r.init_fresh(init);
        Ok(r)
    }

    fn from_parts(base: NonNull<u8>, file: Option<File>, path: Option<PathBuf>, live: bool) -> Region {
        Region {
            base,
            file,
            path,
            table_mu: Mutex::new(()),
            dev_mu: new_mutexes(),
            owned: (0..MAX_PROCS).map(|_| AtomicBool::new(false)).collect(),
            live,
            pid: std::process::id(),
        }
    }

    fn open_impl(path: &Path, init: &RegionInit, mode: OpenMode) -> Result<Region, RegionError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o666)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| io_err(path, "open", e))?;
        let fd = file.as_raw_fd();
        lock::lock_wait(fd, true, LOCK_TABLE).map_err(RegionError::Lock)?;
        let (base, fresh) = match Self::open_locked(path, &file, mode) {
            Ok(v) => v,
            Err(e) => {
                lock::unlock(fd, LOCK_TABLE);
                return Err(e);
            }
        };
        let r = Self::from_parts(base, Some(file), Some(path.to_path_buf()), mode == OpenMode::User);
        // Still under the table lock: nobody validates a half-written file.
        if fresh {
            r.init_fresh(init);
        } else {
            r.apply_intent(init);
        }
        lock::unlock(fd, LOCK_TABLE);
        Ok(r)
    }

    /// Under the table lock: validate or recreate, map, take the liveness lock.
    fn open_locked(path: &Path, file: &File, mode: OpenMode) -> Result<(NonNull<u8>, bool), RegionError> {
        let fd = file.as_raw_fd();
        let size = file.metadata().map_err(|e| io_err(path, "stat", e))?.len();
        let problem = if size == 0 { Some(String::new()) } else { check_file(file, size).err() };
        let fresh = match (mode, problem) {
            (OpenMode::User, None) => false,
            (_, reason) => {
                let reason = reason.unwrap_or_else(|| "reinitialize requested".into());
                // A write lock on the liveness byte succeeds only if nobody else lives on the file.
                if !lock::try_lock(fd, true, LOCK_LIVENESS).map_err(RegionError::Lock)? {
                    return Err(RegionError::InUse { path: path.to_path_buf(), reason });
                }
                if size != 0 && mode == OpenMode::User {
                    crate::warn!("shared region {}: {reason}; recreating it", path.display());
                }
                true
            }
        };
        if fresh {
            file.set_len(0).map_err(|e| io_err(path, "truncate", e))?;
            file.set_len(TOTAL_SIZE as u64).map_err(|e| io_err(path, "ftruncate", e))?;
            // Other users of the container may run as another uid; ignore failure (not our file).
            let _ = file.set_permissions(std::fs::Permissions::from_mode(0o666));
        }
        let base = map_shared(Some(fd)).map_err(|e| io_err(path, "mmap", e))?;
        if mode == OpenMode::User {
            // Converts our probe write lock (if any) into the lifetime read lock.
            if let Err(e) = lock::lock_wait(fd, false, LOCK_LIVENESS) {
                unmap(base);
                return Err(RegionError::Lock(e));
            }
        } else {
            lock::unlock(fd, LOCK_LIVENESS);
        }
        Ok((base, fresh))
    }

    /// Write a fresh layout (the memory is zero).
    fn init_fresh(&self, init: &RegionInit) {
        let v1 = self.v1();
        let h = self.ext_header();
        v1.major_version.store(HAMI_MAJOR, Relaxed);
        v1.minor_version.store(HAMI_MINOR, Relaxed);
        v1.owner_pid.store(std::process::id() as u64, Relaxed);
        v1.device_num.store(init.device_num.min(MAX_DEVICES as u32) as u64, Relaxed);
        v1.priority.store(init.priority, Relaxed);
        h.ext_version.store(EXT_VERSION, Relaxed);
        h.ext_size.store(EXT_SIZE as u32, Relaxed);
        for d in 0..MAX_DEVICES {
            h.physical_total[d].store(init.physical[d], Relaxed);
            if let Some(u) = init.uuids.get(d) {
                self.write_uuid(d, u);
            }
            h.configured_limit[d].store(init.mem_limits[d].unwrap_or(UNCAPPED), Relaxed);
            h.configured_sm_limit[d].store(init.sm_limits[d].unwrap_or(0), Relaxed);
            self.store_limit(d, init.mem_limits[d]);
            v1.sm_limit[d].store(init.sm_limits[d].unwrap_or(0) as u64, Relaxed);
            h.soft_sm_limit[d].store(init.soft_sm_limits[d].unwrap_or(0), Relaxed);
        }
        h.magic.store(u64::from_le_bytes(EXT_MAGIC), Release);
        v1.initialized_flag.store(HAMI_MAGIC, Release);
    }

    /// Newer-intent rule: an env value that differs from the recorded one overwrites the live
    /// value; an equal one keeps the live value (so shrreg-tool changes persist).
    fn apply_intent(&self, init: &RegionInit) {
        let v1 = self.v1();
        let h = self.ext_header();
        let mut changed = false;
        for d in 0..MAX_DEVICES {
            if init.physical[d] != 0 {
                h.physical_total[d].store(init.physical[d], Relaxed);
                if h.mem_capped[d].load(Acquire) == 0 {
                    v1.limit[d].store(init.physical[d], Release);
                }
            }
            if let Some(u) = init.uuids.get(d) {
                if self.uuid(d).is_empty() {
                    self.write_uuid(d, u);
                }
            }
            let env = init.mem_limits[d].unwrap_or(UNCAPPED);
            if h.configured_limit[d].swap(env, AcqRel) != env {
                self.store_limit(d, init.mem_limits[d]);
                changed = true;
            }
            let env_sm = init.sm_limits[d].unwrap_or(0);
            if h.configured_sm_limit[d].swap(env_sm, AcqRel) != env_sm {
                v1.sm_limit[d].store(env_sm as u64, Release);
                h.soft_sm_limit[d].store(init.soft_sm_limits[d].unwrap_or(0), Release);
                changed = true;
            }
        }
        let _ = v1.device_num.fetch_max(init.device_num.min(MAX_DEVICES as u32) as u64, AcqRel);
        v1.priority.store(init.priority, Relaxed);
        if changed {
            h.limits_epoch.fetch_add(1, AcqRel);
        }
    }

    /// Child side of fork: drop the inherited descriptor (the parent's locks stay: they belong to
    /// the open file description the parent still holds), reopen, retake the liveness lock. Slots
    /// inherited from the parent are not ours; the caller registers again.
    pub fn after_fork_child(&mut self) -> Result<(), RegionError> {
        self.table_mu = Mutex::new(());
        self.dev_mu = new_mutexes();
        for o in self.owned.iter() {
            o.store(false, Relaxed);
        }
        self.pid = std::process::id();
        let Some(path) = self.path.clone() else { return Ok(()) };
        if self.file.is_none() {
            return Ok(()); // snapshot or private: nothing shared to reopen
        }
        // Keep the inherited descriptor open for the child's lifetime (never closed), as the
        // driver's device files are: a parent killed while this child lives keeps its memory on
        // the device, and its slot (locked through this descriptor) stays live and charged for
        // exactly as long. Exec closes it (O_CLOEXEC), like the driver's.
        std::mem::forget(self.file.take());
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(&path)
            .map_err(|e| io_err(&path, "reopen", e))?;
        let fd = file.as_raw_fd();
        lock::lock_wait(fd, true, LOCK_TABLE).map_err(RegionError::Lock)?;
        let res = (|| {
            let size = file.metadata().map_err(|e| io_err(&path, "stat", e))?.len();
            check_file(&file, size).map_err(|reason| RegionError::Invalid { path: path.clone(), reason })?;
            let base = map_shared(Some(fd)).map_err(|e| io_err(&path, "mmap", e))?;
            if self.live {
                lock::lock_wait(fd, false, LOCK_LIVENESS).map_err(RegionError::Lock)?;
            }
            Ok(base)
        })();
        lock::unlock(fd, LOCK_TABLE);
        let base = res?;
        unmap(self.base);
        self.base = base;
        self.file = Some(file);
        Ok(())
    }

    // ---------- raw views ----------

    pub fn v1(&self) -> &SharedRegionV1 {
        // SAFETY: the mapping is TOTAL_SIZE bytes, page aligned; all mutable fields are atomics.
        unsafe { &*(self.base.as_ptr() as *const SharedRegionV1) }
    }

    pub fn ext_header(&self) -> &ExtHeader {
        // SAFETY: EXT_OFFSET is 8-aligned and within the mapping.
        unsafe { &*(self.base.as_ptr().add(EXT_OFFSET) as *const ExtHeader) }
    }

    fn body(&self) -> &ExtBody {
        // SAFETY: EXT_BODY_OFFSET is 64-aligned and the body fits in the mapping.
        unsafe { &*(self.base.as_ptr().add(EXT_BODY_OFFSET) as *const ExtBody) }
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// True for `private()` and `snapshot()` regions (not shared through a file).
    pub fn is_private(&self) -> bool {
        self.file.is_none()
    }

    fn fd(&self) -> Option<RawFd> {
        self.file.as_ref().map(|f| f.as_raw_fd())
    }

    fn lock_table(&self) -> Result<TableGuard<'_>, RegionError> {
        let g = lock_mu(&self.table_mu);
        if let Some(fd) = self.fd() {
            lock::lock_wait(fd, true, LOCK_TABLE).map_err(RegionError::Lock)?;
        }
        Ok(TableGuard { fd: self.fd(), _g: g })
    }

    /// Take device `dev`'s ledger lock (held for microseconds by live processes only).
    pub fn lock_device(&self, dev: usize) -> Result<DeviceGuard<'_>, RegionError> {
        let m = self.dev_mu.get(dev).ok_or(RegionError::BadDevice(dev))?;
        let g = lock_mu(m);
        if let Some(fd) = self.fd() {
            lock::lock_wait(fd, true, LOCK_DEVICE + dev as i64).map_err(RegionError::Lock)?;
        }
        Ok(DeviceGuard { r: self, dev, _g: g })
    }

    // ---------- process slots ----------

    fn slot(&self, s: SlotId) -> &layout::ProcSlot {
        &self.v1().procs[s.index()]
    }

    fn proc_num_clamped(&self) -> usize {
        self.v1().proc_num.load(Acquire).clamp(0, MAX_PROCS as i32) as usize
    }

    /// Register this process (`pid` as seen in the container). Reaps dead slots first.
    pub fn register(&self, pid: i32) -> Result<SlotId, RegionError> {
        let _t = self.lock_table()?;
        self.reap_dead_locked();
        let v1 = self.v1();
        for i in 0..MAX_PROCS {
            let p = &v1.procs[i];
            if p.status.load(Acquire) != 0 {
                continue;
            }
            if let Some(fd) = self.fd() {
                // A byte still held means a live owner whose status was wiped (e.g. a tool
                // reinitialized under it); leave that slot alone.
                match lock::try_lock(fd, true, LOCK_SLOT + i as i64) {
                    Ok(true) => {}
                    Ok(false) => continue,
                    Err(e) => return Err(RegionError::Lock(e)),
                }
            }
            let s = SlotId(i as u32);
            self.clear_slot_data(s);
            p.pid.store(pid, Relaxed);
            p.hostpid.store(0, Relaxed);
            let x = self.slot_ext(s);
            x.generation.fetch_add(1, AcqRel);
            x.launches.store(0, Relaxed);
            x.busy_ns.store(0, Relaxed);
            x.last_launch_ns.store(0, Relaxed);
            x.util_centi.store(0, Relaxed);
            x.priority.store(v1.priority.load(Relaxed), Relaxed);
            x.flags.store(SLOT_FLAG_HOSTPID_UNKNOWN, Relaxed);
            x.registered_ns.store(crate::clock::now_ns(), Relaxed);
            self.owned[i].store(true, Relaxed);
            p.status.store(1, Release);
            let _ = v1.proc_num.fetch_max(i as i32 + 1, AcqRel);
            return Ok(s);
        }
        Err(RegionError::TableFull)
    }

    /// Give a slot back (its usage disappears with it).
    pub fn unregister(&self, slot: SlotId) -> Result<(), RegionError> {
        if !self.owned[slot.index()].load(Relaxed) {
            return Err(RegionError::NotOwner(slot));
        }
        let _t = self.lock_table()?;
        self.free_slot(slot);
        self.owned[slot.index()].store(false, Relaxed);
        if let Some(fd) = self.fd() {
            lock::unlock(fd, LOCK_SLOT + slot.index() as i64);
        }
        self.compact();
        Ok(())
    }

    /// Whether this handle registered `slot`.
    pub fn owns(&self, slot: SlotId) -> bool {
        self.owned[slot.index()].load(Relaxed)
    }

    fn clear_slot_data(&self, s: SlotId) {
        let p = self.slot(s);
        for d in 0..MAX_DEVICES {
            let u = &p.used[d];
            for a in [&u.context_size, &u.module_size, &u.data_size, &u.offset, &u.total] {
                a.store(0, Release);
            }
            p.monitorused[d].store(0, Relaxed);
            let du = &p.device_util[d];
            for a in [&du.dec_util, &du.enc_util, &du.sm_util] {
                a.store(0, Relaxed);
            }
        }
    }

    fn free_slot(&self, s: SlotId) {
        let p = self.slot(s);
        p.status.store(0, Release);
        self.clear_slot_data(s);
        p.pid.store(0, Relaxed);
        p.hostpid.store(0, Relaxed);
        self.slot_ext(s).generation.fetch_add(1, AcqRel);
    }

    /// Keep live slots within [0, proc_num) (HAMi's monitor scans only that prefix).
    fn compact(&self) {
        let v1 = self.v1();
        let mut n = self.proc_num_clamped();
        while n > 0 && v1.procs[n - 1].status.load(Acquire) == 0 {
            n -= 1;
        }
        v1.proc_num.store(n as i32, Release);
    }

    /// Free slots whose owner died (its slot byte can be locked). Returns how many were freed.
    pub fn reap_dead(&self) -> usize {
        if self.fd().is_none() {
            return 0;
        }
        match self.lock_table() {
            Ok(_t) => self.reap_dead_locked(),
            Err(e) => {
                crate::warn!("cannot reap dead processes: {e}");
                0
            }
        }
    }

    fn reap_dead_locked(&self) -> usize {
        let Some(fd) = self.fd() else { return 0 };
        let mut freed = 0;
        for i in 0..self.proc_num_clamped() {
            if self.v1().procs[i].status.load(Acquire) == 0 || self.owned[i].load(Relaxed) {
                continue;
            }
            let byte = LOCK_SLOT + i as i64;
            if let Ok(true) = lock::try_lock(fd, true, byte) {
                self.free_slot(SlotId(i as u32));
                lock::unlock(fd, byte);
                freed += 1;
            }
        }
        self.compact();
        freed
    }

    /// Slots with a live status, in index order.
    pub fn live_slots(&self) -> impl Iterator<Item = SlotId> + '_ {
        (0..self.proc_num_clamped())
            .filter(move |&i| self.v1().procs[i].status.load(Acquire) != 0)
            .map(|i| SlotId(i as u32))
    }

    pub fn proc_num(&self) -> usize {
        self.proc_num_clamped()
    }

    pub fn slot_pid(&self, slot: SlotId) -> i32 {
        self.slot(slot).pid.load(Relaxed)
    }

    pub fn slot_hostpid(&self, slot: SlotId) -> i32 {
        self.slot(slot).hostpid.load(Relaxed)
    }

    /// Record the host pid once known (clears the "host pid unknown" flag).
    pub fn set_hostpid(&self, slot: SlotId, hostpid: i32) {
        self.slot(slot).hostpid.store(hostpid, Relaxed);
        self.slot_ext(slot).flags.fetch_and(!SLOT_FLAG_HOSTPID_UNKNOWN, AcqRel);
    }

    pub fn slot_ext(&self, slot: SlotId) -> &SlotExt {
        &self.body().slots[slot.index()]
    }

    // ---------- memory ----------

    fn add(&self, slot: SlotId, dev: usize, kind: MemKind, bytes: u64) {
        let u = &self.slot(slot).used[dev];
        let field = match kind {
            MemKind::Context => &u.context_size,
            MemKind::Module => &u.module_size,
            MemKind::Data => &u.data_size,
        };
        let _ = field.fetch_update(AcqRel, Acquire, |x| Some(x.saturating_add(bytes)));
        let _ = u.total.fetch_update(AcqRel, Acquire, |x| Some(x.saturating_add(bytes)));
    }

    /// Reserve `bytes` on `dev` for `slot` if the device stays within its cap (takes the device
    /// lock; reaps dead processes before refusing). An uncapped device has nothing to check:
    /// the charge is a lock-free add, so the allocation path costs no system call there.
    pub fn try_reserve(&self, slot: SlotId, dev: usize, kind: MemKind, bytes: u64) -> Result<(), ReserveError> {
        if dev >= MAX_DEVICES {
            return Err(ReserveError::BadDevice(dev));
        }
        if self.limit(dev).is_none() {
            self.add(slot, dev, kind, bytes);
            return Ok(());
        }
        let g = self.lock_device(dev).map_err(|e| ReserveError::Lock(e.to_string()))?;
        g.try_reserve(slot, kind, bytes)
    }

    /// Give back a charge (lock-free; saturates at zero).
    pub fn release(&self, slot: SlotId, dev: usize, kind: MemKind, bytes: u64) {
        let Some(u) = self.slot(slot).used.get(dev) else { return };
        let field = match kind {
            MemKind::Context => &u.context_size,
            MemKind::Module => &u.module_size,
            MemKind::Data => &u.data_size,
        };
        sat_sub(field, bytes);
        sat_sub(&u.total, bytes);
    }

    /// Bytes used on `dev` by every live slot.
    pub fn device_used(&self, dev: usize) -> u64 {
        if dev >= MAX_DEVICES {
            return 0;
        }
        self.live_slots().fold(0u64, |acc, s| acc.saturating_add(self.slot(s).used[dev].total.load(Acquire)))
    }

    pub fn proc_used(&self, slot: SlotId, dev: usize) -> u64 {
        self.proc_usage(slot, dev).total
    }

    pub fn proc_usage(&self, slot: SlotId, dev: usize) -> MemUsage {
        let Some(u) = self.slot(slot).used.get(dev) else { return MemUsage::default() };
        MemUsage {
            context: u.context_size.load(Acquire),
            module: u.module_size.load(Acquire),
            data: u.data_size.load(Acquire),
            total: u.total.load(Acquire),
        }
    }

    // ---------- limits ----------

    /// Live memory cap of `dev`; `None` = uncapped.
    pub fn limit(&self, dev: usize) -> Option<u64> {
        if dev >= MAX_DEVICES {
            return None;
        }
        if self.ext_header().mem_capped[dev].load(Acquire) == 0 {
            return None;
        }
        Some(self.v1().limit[dev].load(Acquire))
    }

    fn store_limit(&self, dev: usize, limit: Option<u64>) {
        let h = self.ext_header();
        let v1 = self.v1();
        match limit {
            Some(v) => {
                v1.limit[dev].store(v, Release);
                h.mem_capped[dev].store(1, Release);
            }
            None => {
                h.mem_capped[dev].store(0, Release);
                // HAMi's monitor reads limit[i]: an uncapped device shows its physical size.
                v1.limit[dev].store(h.physical_total[dev].load(Acquire), Release);
            }
        }
    }

    /// Change the live memory cap (lowering it below current use refuses new allocations; nothing
    /// is freed).
    pub fn set_limit(&self, dev: usize, limit: Option<u64>) -> Result<(), RegionError> {
        if dev >= MAX_DEVICES {
            return Err(RegionError::BadDevice(dev));
        }
        self.store_limit(dev, limit);
        self.ext_header().limits_epoch.fetch_add(1, AcqRel);
        Ok(())
    }

    /// The env value that set the live memory cap (`None` = no cap configured).
    pub fn configured_limit(&self, dev: usize) -> Option<u64> {
        let v = self.ext_header().configured_limit.get(dev)?.load(Acquire);
        (v != UNCAPPED).then_some(v)
    }

    /// Live SM cap in percent; `None` for 0/100 (no cap).
    pub fn sm_limit(&self, dev: usize) -> Option<u32> {
        match self.v1().sm_limit.get(dev)?.load(Acquire) {
            0 | 100.. => None,
            v => Some(v as u32),
        }
    }

    pub fn set_sm_limit(&self, dev: usize, pct: Option<u32>) -> Result<(), RegionError> {
        let a = self.v1().sm_limit.get(dev).ok_or(RegionError::BadDevice(dev))?;
        a.store(pct.map_or(0, |p| p.min(100)) as u64, Release);
        self.ext_header().limits_epoch.fetch_add(1, AcqRel);
        Ok(())
    }

    pub fn configured_sm_limit(&self, dev: usize) -> Option<u32> {
        match self.ext_header().configured_sm_limit.get(dev)?.load(Acquire) {
            0 | 100.. => None,
            v => Some(v),
        }
    }

    pub fn soft_sm_limit(&self, dev: usize) -> Option<u32> {
        match self.ext_header().soft_sm_limit.get(dev)?.load(Acquire) {
            0 => None,
            v => Some(v),
        }
    }

    pub fn set_soft_sm_limit(&self, dev: usize, pct: Option<u32>) -> Result<(), RegionError> {
        let a = self.ext_header().soft_sm_limit.get(dev).ok_or(RegionError::BadDevice(dev))?;
        a.store(pct.unwrap_or(0).min(100), Release);
        self.ext_header().limits_epoch.fetch_add(1, AcqRel);
        Ok(())
    }

    pub fn suspended(&self) -> bool {
        self.ext_header().suspended.load(Acquire) != 0
    }

    pub fn set_suspended(&self, on: bool) {
        self.ext_header().suspended.store(on as u32, Release);
        self.ext_header().limits_epoch.fetch_add(1, AcqRel);
    }

    /// Bumped on every limit or suspend change: cheap "did anything change" check.
    pub fn limits_epoch(&self) -> u64 {
        self.ext_header().limits_epoch.load(Acquire)
    }

    /// Limiter state of `dev` (shared by the container's processes). Out-of-range devices get
    /// device 15's state rather than a panic; callers validate `dev` first.
    pub fn limiter(&self, dev: usize) -> &SharedDeviceState {
        &self.body().limiter[dev.min(MAX_DEVICES - 1)]
    }

    /// The container's token bucket and busy map of `dev` (same clamping as `limiter`).
    pub fn bucket(&self, dev: usize) -> crate::limiter::Bucket<'_> {
        let d = dev.min(MAX_DEVICES - 1);
        crate::limiter::Bucket::new(&self.body().limiter[d], &self.body().busy[d])
    }

    // ---------- devices ----------

    fn write_uuid(&self, dev: usize, uuid: &str) {
        let dst = &self.v1().uuids[dev];
        let bytes = uuid.as_bytes();
        for (i, b) in dst.iter().enumerate() {
            // Keep a NUL terminator (C readers).
            let v = if i < UUID_LEN - 1 { bytes.get(i).copied().unwrap_or(0) } else { 0 };
            b.store(v, Relaxed);
        }
    }

    /// Record a device's UUID and physical memory (an uncapped device's `limit[]` shows it).
    pub fn set_device_info(&self, dev: usize, uuid: &str, physical_total: u64) -> Result<(), RegionError> {
        if dev >= MAX_DEVICES {
            return Err(RegionError::BadDevice(dev));
        }
        self.write_uuid(dev, uuid);
        let h = self.ext_header();
        h.physical_total[dev].store(physical_total, Release);
        if h.mem_capped[dev].load(Acquire) == 0 {
            self.v1().limit[dev].store(physical_total, Release);
        }
        let _ = self.v1().device_num.fetch_max(dev as u64 + 1, AcqRel);
        Ok(())
    }

    pub fn device_num(&self) -> usize {
        (self.v1().device_num.load(Acquire) as usize).min(MAX_DEVICES)
    }

    pub fn uuid(&self, dev: usize) -> String {
        let Some(src) = self.v1().uuids.get(dev) else { return String::new() };
        let bytes: Vec<u8> = src.iter().map(|b| b.load(Relaxed)).take_while(|&b| b != 0).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    pub fn physical_total(&self, dev: usize) -> u64 {
        self.ext_header().physical_total.get(dev).map_or(0, |a| a.load(Acquire))
    }

    // ---------- HAMi monitor fields ----------

    /// Unix seconds of the latest launch (HAMi `last_kernel_time`).
    pub fn set_last_kernel_time(&self, unix_secs: u64) {
        self.v1().last_kernel_time.store(unix_secs, Relaxed);
    }

    pub fn last_kernel_time(&self) -> u64 {
        self.v1().last_kernel_time.load(Relaxed)
    }

    /// Publish a process's SM utilization in percent (HAMi `device_util[dev].sm_util`).
    pub fn set_proc_sm_util(&self, slot: SlotId, dev: usize, pct: u64) {
        if let Some(u) = self.slot(slot).device_util.get(dev) {
            u.sm_util.store(pct, Relaxed);
        }
    }

    pub fn proc_sm_util(&self, slot: SlotId, dev: usize) -> u64 {
        self.slot(slot).device_util.get(dev).map_or(0, |u| u.sm_util.load(Relaxed))
    }

    /// Written by HAMi's monitor: -1 asks a lower-priority container to pause launches.
    pub fn recent_kernel(&self) -> i32 {
        self.v1().recent_kernel.load(Relaxed)
    }

    pub fn set_recent_kernel(&self, v: i32) {
        self.v1().recent_kernel.store(v, Relaxed);
    }

    /// Written by HAMi's monitor: 1 = enforce the SM cap now, 0 = uncontended.
    pub fn utilization_switch(&self) -> i32 {
        self.v1().utilization_switch.load(Relaxed)
    }

    pub fn set_utilization_switch(&self, v: i32) {
        self.v1().utilization_switch.store(v, Relaxed);
    }

    pub fn priority(&self) -> i32 {
        self.v1().priority.load(Relaxed)
    }

    pub fn set_priority(&self, p: i32) {
        self.v1().priority.store(p, Relaxed);
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum OpenMode {
    User,
    Recreate,
}

impl Drop for Region {
    fn drop(&mut self) {
        // Only the process that registered slots gives them back (a fork child that never called
        // after_fork_child must not free its parent's slots).
        if self.pid == std::process::id() {
            let mine: Vec<SlotId> =
                (0..MAX_PROCS).filter(|&i| self.owned[i].load(Relaxed)).map(|i| SlotId(i as u32)).collect();
            for s in mine {
                let _ = self.unregister(s);
            }
        }
        unmap(self.base);
    }
}

#[cfg(test)]
mod tests;
