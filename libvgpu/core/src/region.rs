//! The shared region: one mmapped file per container (`CUDA_DEVICE_MEMORY_SHARED_CACHE`), HAMi's v1
//! `shared_region_t` byte for byte followed by our extension (layout in [`layout`]).
//!
//! Locking (design.md): the slot table's lock is an OFD byte-range lock beyond the data
//! (kernel-released on death) plus an in-process mutex; a device ledger's lock is an in-process
//! mutex plus one word in the region ([`ledger_lock`]: a compare-and-swap, taken over from a
//! holder whose slot or process is gone). Lock order: a
//! device lock may be followed by the table lock (reaping inside `try_reserve`); nothing takes a
//! device lock while holding the table lock. No lock is ever waited on for a dead process.
//!
//! Memory ordering: usage counters are changed with atomic RMWs (AcqRel) and read with Acquire.
//! The check-then-add of `try_reserve` is serialized by the device lock (its compare-and-swaps
//! order it); releases are lock-free saturating subtracts that only lower the sum, so a concurrent
//! reader can only over-estimate usage. A slot's `status` is stored last (Release) when a slot is
//! taken and read first (Acquire) by readers. A memory cap is two words (`mem_capped[d]`, `limit[d]`):
//! a cap is set value-then-flag and cleared flag-then-value, read flag-then-value, so a reader sees
//! the old or the new cap, never an uncapped device that should be capped.

pub mod layout;
pub mod ledger_lock;
pub(crate) mod lock;
mod teardown;

pub use layout::*;
pub use lock::{LOCK_BASE, LOCK_LIVENESS, LOCK_SLOT, LOCK_TABLE};

use crate::config::Config;
use crate::limiter::SharedDeviceState;
use crate::{MAX_DEVICES, MAX_PROCS};
use std::fmt;
use crate::regular;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use memmap2::{MmapOptions, MmapRaw};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, Ordering::*};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// What a charge is for (HAMi's `context_size` / `module_size` / `data_size`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemKind {
    Context,
    Module,
    Data,
}

/// A process slot: an index into `procs[]` (always < MAX_PROCS). An id returned by
/// [`Region::register`] names *this handle's* slot and follows it when the region is re-attached
/// (the slot may then sit at another index of the new file); other ids name the index itself.
#[derive(Clone, Copy, Debug)]
pub struct SlotId(u32);

/// Ids compare by the index they were registered at (a registered id equals the plain id of
/// the same index).
impl PartialEq for SlotId {
    fn eq(&self, o: &SlotId) -> bool {
        self.index() == o.index()
    }
}
impl Eq for SlotId {}
impl std::hash::Hash for SlotId {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.index().hash(h)
    }
}

/// Marks a [`SlotId`] handed out by `register` (translated through the handle's slot map).
const OWN: u32 = 1 << 31;

impl SlotId {
    pub fn new(index: usize) -> Option<SlotId> {
        (index < MAX_PROCS).then_some(SlotId(index as u32))
    }
    /// The index the slot was registered at (or the plain index).
    pub fn index(self) -> usize {
        (self.0 & !OWN) as usize
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
    /// Another process held the lock past the bound (stopped, frozen or stuck).
    Busy(&'static str),
    /// No space to allocate the region file (full filesystem).
    NoSpace(PathBuf),
    TableFull,
    BadDevice(usize),
    NotOwner(SlotId),
}

impl RegionError {
    /// Whether the message names the region's path already (a caller adds it where not).
    pub fn names_path(&self) -> bool {
        matches!(
            self,
            RegionError::NotFound(_)
                | RegionError::PermissionDenied(_)
                | RegionError::Invalid { .. }
                | RegionError::InUse { .. }
                | RegionError::Io { .. }
                | RegionError::NoSpace(_)
        )
    }
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
            RegionError::Busy(what) => {
                write!(f, "shared region {what} lock held by another process for over {} ms (stopped?)", LOCK_BOUND.as_millis())
            }
            RegionError::NoSpace(p) => write!(f, "shared region {}: no space left on the filesystem", p.display()),
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
    /// The env names no memory / SM cap for device d (the variable unset): this process leaves the
    /// container's as they are, where a region exists (a child started with a scrubbed env must
    /// not lift them). `mem_limits[d]` / `sm_limits[d]` are then `None`.
    pub no_intent_mem: [bool; MAX_DEVICES],
    pub no_intent_sm: [bool; MAX_DEVICES],
    /// This process never caps compute (`GPU_CORE_UTILIZATION_POLICY=disable`): it states no SM
    /// intent for the container, and no SM cap applies to it.
    pub compute_uncapped: bool,
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
            no_intent_mem: [false; MAX_DEVICES],
            no_intent_sm: [false; MAX_DEVICES],
            compute_uncapped: false,
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
            compute_uncapped: cfg.policy == crate::config::UtilPolicy::Disable,
            ..RegionInit::default()
        };
        // Only devices that exist get limits: a global cap must not mark 16 phantom devices.
        for (d, &phys) in physical.iter().enumerate().take(MAX_DEVICES) {
            init.physical[d] = phys;
            init.mem_limits[d] = cfg.mem_limit(d, phys);
            init.sm_limits[d] = cfg.sm_limit(d);
            init.soft_sm_limits[d] = cfg.soft_sm_limit(d);
            init.no_intent_mem[d] = !cfg.mem_named[d];
            init.no_intent_sm[d] = !cfg.sm_named[d] || init.compute_uncapped;
        }
        init
    }
}

/// A utilization figure nobody refreshed for this long (no window closed, no launch) reads as 0.
pub const UTIL_WINDOW_NS: u64 = 2_000_000_000;

/// How long a hooked call may wait for a region lock held by another process (or thread) before
/// it goes on without it. Correctness never depends on getting the lock in time: reservations
/// add-then-check (see [`Region::try_reserve`]), so a stopped holder delays nobody past this.
pub const LOCK_BOUND: Duration = Duration::from_millis(500);
/// After a device lock timed out, further attempts within this time wait only `STALL_WAIT` (a
/// stopped holder costs one bound, not one per allocation); the first success clears it.
const STALL_MEMORY_NS: u64 = 5_000_000_000;
const STALL_WAIT: Duration = Duration::from_millis(10);

/// A mapped region (file-backed, or private anonymous memory with the same API).
pub struct Region {
    /// The current mapping. A re-attach replaces it; earlier mappings stay mapped until drop, so
    /// references handed out before stay valid.
    base: AtomicPtr<u8>,
    /// Descriptor of the current shared file (-1: private or snapshot).
    fd: AtomicI32,
    /// Every file and mapping this handle opened, and the current file's identity.
    keep: Mutex<Keep>,
    /// Read-only descriptor of a snapshot's file, for liveness probes.
    probe: Option<File>,
    path: Option<PathBuf>,
    /// What a user handle asked for at open (re-attach opens the replacement with it).
    init: Option<RegionInit>,
    table_mu: Mutex<()>,
    /// Device ledger locks among this handle's threads (the word excludes other processes).
    dev_mu: [Mutex<()>; MAX_DEVICES],
    /// `clock::now_ns` until which device d's lock is known stuck (try once, never wait).
    dev_stall_until: [AtomicU64; MAX_DEVICES],
    /// Slots registered by this handle, by index of the current mapping.
    owned: Box<[AtomicBool]>,
    /// Slots this handle left (`leave`: the process is exiting, still alive). Its own reaper
    /// must not free them: its descriptor never conflicts with its own slot lock, so they would
    /// look dead to it, and their memory (still on the device) would stop counting.
    left: Box<[AtomicBool]>,
    /// Registered id -> index in the current mapping (identity until a re-attach).
    slot_map: Box<[AtomicU32]>,
    /// Ids registered by this handle (an id is the index it was registered at when free).
    ids: Box<[AtomicBool]>,
    /// Whether this handle holds the liveness read lock (users do, tools do not).
    live: bool,
    pid: u32,
}

#[derive(Default)]
struct Keep {
    files: Vec<File>,
    maps: Vec<MmapRaw>,
    /// (st_dev, st_ino) of the current file.
    ident: Option<(u64, u64)>,
    /// Identity of a replacement we failed to attach (not retried until the path changes again).
    refused: Option<Option<(u64, u64)>>,
}

// SAFETY: the mappings are only accessed through atomics (or never-written byte arrays); they
// stay valid until Drop.
unsafe impl Send for Region {}
unsafe impl Sync for Region {}

fn io_err(path: &Path, op: &'static str, err: io::Error) -> RegionError {
    match err.kind() {
        io::ErrorKind::NotFound => RegionError::NotFound(path.to_path_buf()),
        io::ErrorKind::PermissionDenied => RegionError::PermissionDenied(path.to_path_buf()),
        _ if err.raw_os_error() == Some(libc::ENOSPC) => RegionError::NoSpace(path.to_path_buf()),
        _ => RegionError::Io { path: path.to_path_buf(), op, err },
    }
}

fn invalid(path: &Path, reason: impl Into<String>) -> RegionError {
    RegionError::Invalid { path: path.to_path_buf(), reason: reason.into() }
}

/// Map TOTAL_SIZE bytes of `file` shared, or of private anonymous memory (memmap2: the one
/// mapping mechanism of the workspace). The file's blocks are allocated first (posix_fallocate),
/// so touching the mapping cannot SIGBUS.
fn map_region(file: Option<&File>) -> io::Result<MmapRaw> {
    let mut o = MmapOptions::new();
    o.len(TOTAL_SIZE);
    match file {
        Some(f) => o.map_raw(f),
        None => o.map_anon().map(MmapRaw::from),
    }
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

/// Whether the file carries our extension magic (a region of ours, maybe of another version or
/// damaged): the only non-empty files we may ever reinitialize.
fn has_our_magic(file: &File, size: u64) -> bool {
    use std::os::unix::fs::FileExt;
    let mut ext = [0u8; 8];
    size >= (EXT_OFFSET + 8) as u64 && file.read_exact_at(&mut ext, EXT_OFFSET as u64).is_ok() && ext == EXT_MAGIC
}

fn euid() -> u32 {
    // SAFETY: trivial syscall.
    unsafe { libc::geteuid() }
}

/// Open the region file for reading and writing, only if it is a regular file (never following
/// a symbolic link, never opening a FIFO or device in its place); create it (exclusively) when
/// absent and `create` is set. Returns the file and whether we created it.
fn open_file(path: &Path, create: bool) -> Result<(File, bool), RegionError> {
    open_regular(path, libc::O_RDWR, create)
}

fn open_regular(path: &Path, access: libc::c_int, create: bool) -> Result<(File, bool), RegionError> {
    use std::os::unix::ffi::OsStrExt;
    let name = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| invalid(path, "has a NUL byte in its name"))?;
    regular::open(None, &name, access, create, 0o666).map_err(|e| match e {
        regular::OpenError::Symlink => invalid(path, "is a symbolic link; not following it"),
        regular::OpenError::NotRegular => invalid(path, "not a regular file"),
        regular::OpenError::Unsteady => invalid(path, "keeps appearing and disappearing"),
        regular::OpenError::Io(e) => io_err(path, if create { "create" } else { "open" }, e),
    })
}

/// A region file must be a regular file owned by us or by root (or created by us).
fn check_owner(path: &Path, meta: &std::fs::Metadata, created: bool) -> Result<(), RegionError> {
    use std::os::unix::fs::MetadataExt;
    if !meta.file_type().is_file() {
        return Err(invalid(path, "not a regular file"));
    }
    if !created && meta.uid() != euid() && meta.uid() != 0 {
        return Err(invalid(path, format!("owned by uid {} (neither this user nor root); not using it", meta.uid())));
    }
    Ok(())
}

fn ident_of(meta: &std::fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (meta.dev(), meta.ino())
}

/// Take an in-process mutex, waiting at most until `deadline()` (asked only if the mutex is
/// busy; poison is ignored: the data it guards lives in the region and is always consistent).
fn lock_mu_until(m: &Mutex<()>, deadline: impl Fn() -> Instant) -> Option<MutexGuard<'_, ()>> {
    let mut pause = Duration::from_micros(10);
    loop {
        match m.try_lock() {
            Ok(g) => return Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => return Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => {}
        }
        let (now, deadline) = (Instant::now(), deadline());
        if now >= deadline {
            return None;
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_micros(100));
    }
}

/// Mutex + OFD byte, both within `deadline`.
fn lock_both<'a>(m: &'a Mutex<()>, fd: Option<RawFd>, byte: i64, deadline: Instant, what: &'static str) -> Result<MutexGuard<'a, ()>, RegionError> {
    let g = lock_mu_until(m, || deadline).ok_or(RegionError::Busy(what))?;
    if let Some(fd) = fd {
        if !lock::lock_until(fd, true, byte, deadline).map_err(RegionError::Lock)? {
            return Err(RegionError::Busy(what));
        }
    }
    Ok(g)
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

/// Device ledger lock held; reservations through it are serialized with every other process and
/// thread.
pub struct DeviceGuard<'a> {
    r: &'a Region,
    dev: usize,
    /// The word taken and the token written there, in the mapping it was taken in (a re-attach
    /// keeps that mapping alive); none in a private region.
    word: Option<(&'a AtomicU64, u64)>,
    _mu: MutexGuard<'a, ()>,
}

impl Drop for DeviceGuard<'_> {
    fn drop(&mut self) {
        // The word before the mutex (fields drop after this).
        if let Some((word, token)) = self.word {
            ledger_lock::give(word, token);
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
        self.r.reserve_checked(slot, self.dev, kind, bytes).map(|_| ())
    }

    /// Charge unconditionally (usage that already exists, e.g. a measured context), even past
    /// the cap.
    pub fn charge(&self, slot: SlotId, kind: MemKind, bytes: u64) {
        self.r.charge(slot, self.dev, kind, bytes);
    }
}

fn sat_sub(a: &AtomicU64, v: u64) {
    let _ = a.fetch_update(AcqRel, Acquire, |x| Some(x.saturating_sub(v)));
}

/// Writer side of HAMi v1.2's per-slot seqlock: odd while a writer updates the slot. Only the
/// slot's own process writes it, so this only orders its own threads; the spin is bounded (a
/// signal handler interrupting a writer of the same thread must not deadlock).
fn seq_begin(p: &layout::ProcSlot) -> bool {
    for i in 0..100_000u32 {
        let v = p.seqlock.load(Relaxed);
        if v & 1 == 0 && p.seqlock.compare_exchange_weak(v, v + 1, Acquire, Relaxed).is_ok() {
            return true;
        }
        if i > 64 {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
    false
}

fn seq_end(p: &layout::ProcSlot, began: bool) {
    if began {
        p.seqlock.fetch_add(1, Release);
    }
}

impl Region {
    // ---------- opening ----------

    /// Open or create the region at `path` for a process using it (takes the liveness read lock
    /// for the lifetime of the handle). Safe against hostile paths: a symbolic link, a file that
    /// is not regular, or one owned by another user (not root) is refused, never followed or
    /// changed; a non-empty file is reinitialized only when it carries our extension magic, is
    /// ours and nobody lives on it. Blocks are allocated before the first touch (a full
    /// filesystem is `NoSpace`, never a SIGBUS).
    pub fn open(path: impl AsRef<Path>, init: &RegionInit) -> Result<Region, RegionError> {
        let mut r = Self::open_impl(path.as_ref(), init, OpenMode::User)?;
        r.init = Some(init.clone());
        Ok(r)
    }

    /// Create or reinitialize the region at `path` (shrreg-tool --create_new). Refuses while live
    /// processes use it, and refuses files that are not ours (see [`Region::open`]).
    pub fn create_new(path: impl AsRef<Path>, init: &RegionInit) -> Result<Region, RegionError> {
        Self::open_impl(path.as_ref(), init, OpenMode::Recreate)
    }

    /// Open an existing valid region for tools: never creates or repairs.
    pub fn open_existing(path: impl AsRef<Path>) -> Result<Region, RegionError> {
        let path = path.as_ref();
        let (file, _) = open_file(path, false)?;
        let meta = file.metadata().map_err(|e| io_err(path, "stat", e))?; // a regular file (`open_regular`)
        // A creator initializes under the table lock: wait (bounded) so we do not read it half
        // written; a holder stuck past the bound does not stop a tool from reading.
        let fd = file.as_raw_fd();
        let locked = lock::lock_until(fd, true, LOCK_TABLE, Instant::now() + LOCK_BOUND).unwrap_or(false);
        let res = file
            .metadata()
            .map_err(|e| io_err(path, "stat", e))
            .and_then(|m| check_file(&file, m.len()).map_err(|reason| invalid(path, reason)))
            // Valid files of ours were allocated by their creator; do not touch other blocks.
            .and_then(|()| map_region(Some(&file)).map_err(|e| io_err(path, "mmap", e)));
        if locked {
            lock::unlock(fd, LOCK_TABLE);
        }
        let base = res?;
        let r = Self::from_parts(base, Some(file), Some(path.to_path_buf()), false);
        r.keep_lock().ident = Some(ident_of(&meta));
        Ok(r)
    }

    /// A copy of the region file in private memory (read-only access suffices); changes to the
    /// copy do not reach the file. Liveness of slots is still probed on the file.
    pub fn snapshot(path: impl AsRef<Path>) -> Result<Region, RegionError> {
        use std::os::unix::fs::FileExt;
        let path = path.as_ref();
        let (file, _) = open_regular(path, libc::O_RDONLY, false)?;
        let meta = file.metadata().map_err(|e| io_err(path, "stat", e))?; // a regular file (`open_regular`)
        check_file(&file, meta.len()).map_err(|reason| invalid(path, reason))?;
        let mut copy = MmapOptions::new().len(TOTAL_SIZE).map_anon().map_err(|e| io_err(path, "mmap", e))?;
        file.read_exact_at(&mut copy[..], 0).map_err(|e| io_err(path, "read", e))?;
        let base = MmapRaw::from(copy);
        let mut r = Self::from_parts(base, None, Some(path.to_path_buf()), false);
        r.probe = Some(file);
        Ok(r)
    }

    /// An anonymous region with the same API: limits still apply to this process (fallback when
    /// the file cannot be used). Fails only if the kernel refuses a 2 MiB anonymous mapping.
    pub fn private(init: &RegionInit) -> Result<Region, RegionError> {
        let base = map_region(None).map_err(|e| RegionError::Io { path: PathBuf::from("<private>"), op: "mmap", err: e })?;
        let r = Self::from_parts(base, None, None, true);
        r.init_fresh(init);
        Ok(r)
    }

    fn from_parts(base: MmapRaw, file: Option<File>, path: Option<PathBuf>, live: bool) -> Region {
        let fd = file.as_ref().map_or(-1, |f| f.as_raw_fd());
        Region {
            base: AtomicPtr::new(base.as_mut_ptr()),
            fd: AtomicI32::new(fd),
            keep: Mutex::new(Keep { files: file.into_iter().collect(), maps: vec![base], ..Keep::default() }),
            probe: None,
            path,
            init: None,
            table_mu: Mutex::new(()),
            dev_mu: std::array::from_fn(|_| Mutex::new(())),
            dev_stall_until: std::array::from_fn(|_| AtomicU64::new(0)),
            owned: (0..MAX_PROCS).map(|_| AtomicBool::new(false)).collect(),
            left: (0..MAX_PROCS).map(|_| AtomicBool::new(false)).collect(),
            slot_map: (0..MAX_PROCS as u32).map(AtomicU32::new).collect(),
            ids: (0..MAX_PROCS).map(|_| AtomicBool::new(false)).collect(),
            live,
            pid: std::process::id(),
        }
    }

    fn keep_lock(&self) -> MutexGuard<'_, Keep> {
        self.keep.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn open_impl(path: &Path, init: &RegionInit, mode: OpenMode) -> Result<Region, RegionError> {
        let (file, created) = open_file(path, true)?;
        let meta = file.metadata().map_err(|e| io_err(path, "stat", e))?;
        check_owner(path, &meta, created)?;
        let fd = file.as_raw_fd();
        let deadline = Instant::now() + LOCK_BOUND;
        loop {
            if !lock::lock_until(fd, true, LOCK_TABLE, deadline).map_err(RegionError::Lock)? {
                return Err(RegionError::Busy("table"));
            }
            // An empty file of another user may be one its creator has not initialized yet (it
            // takes the table lock right after creating): give it until the deadline.
            let empty = file.metadata().map(|m| m.len() == 0).unwrap_or(false);
            if !(empty && !created && std::os::unix::fs::MetadataExt::uid(&meta) != euid()) || Instant::now() >= deadline {
                break;
            }
            lock::unlock(fd, LOCK_TABLE);
            std::thread::sleep(Duration::from_millis(5));
        }
        let (base, fresh, mut notes) = match Self::open_locked(path, &file, &meta, created, mode) {
            Ok(v) => v,
            Err(e) => {
                lock::unlock(fd, LOCK_TABLE);
                return Err(e);
            }
        };
        let r = Self::from_parts(base, Some(file), Some(path.to_path_buf()), mode == OpenMode::User);
        r.keep_lock().ident = Some(ident_of(&meta));
        // Still under the table lock: nobody validates a half-written file.
        if fresh {
            r.init_fresh(init);
        } else {
            notes.extend(r.apply_intent(init));
        }
        lock::unlock(fd, LOCK_TABLE);
        // Said after the unlock: a write to a stderr that blocks (a full pipe, a paused terminal)
        // must not keep the container's table lock, which would send every newcomer to a private
        // region.
        for n in notes {
            crate::warn!("{n}");
        }
        Ok(r)
    }

    /// Under the table lock: validate or (re)initialize, allocate, map, take the liveness lock.
    /// Also what to say once the lock is given back.
    fn open_locked(path: &Path, file: &File, meta: &std::fs::Metadata, created: bool, mode: OpenMode) -> Result<(MmapRaw, bool, Vec<String>), RegionError> {
        let mut notes = Vec::new();
        use std::os::unix::fs::MetadataExt;
        let fd = file.as_raw_fd();
        // Re-read the size under the lock (another process may have initialized it meanwhile).
        let size = file.metadata().map_err(|e| io_err(path, "stat", e))?.len();
        let problem = if size == 0 { Some(String::new()) } else { check_file(file, size).err() };
        let fresh = match (mode, problem) {
            (OpenMode::User, None) => false,
            (_, reason) => {
                let reason = reason.unwrap_or_else(|| "reinitialize requested".into());
                // A file with other hard links is someone else's too (a link planted to a file
                // elsewhere), whoever owns it.
                let ours = created || (meta.uid() == euid() && meta.nlink() == 1);
                // Only an empty file, or one of ours (extension magic), may be rewritten, and only
                // by its owner: anything else is someone else's file.
                if !ours {
                    let what = if size == 0 { "empty".to_string() } else { reason };
                    return Err(invalid(
                        path,
                        format!("{what}, owned by uid {} with {} link(s): not ours to initialize", meta.uid(), meta.nlink()),
                    ));
                }
                if size != 0 && !has_our_magic(file, size) {
                    return Err(invalid(path, format!("{reason}; not a libvgpu region, leaving it untouched")));
                }
                // A write lock on the liveness byte succeeds only if nobody else lives on the file.
                if !lock::try_lock(fd, true, LOCK_LIVENESS).map_err(RegionError::Lock)? {
                    return Err(RegionError::InUse { path: path.to_path_buf(), reason });
                }
                if size != 0 && mode == OpenMode::User {
                    notes.push(format!("shared region {}: {reason}; recreating it", path.display()));
                }
                true
            }
        };
        let res = (|| {
            if fresh {
                file.set_len(0).map_err(|e| io_err(path, "truncate", e))?;
            }
            // Real blocks: a full filesystem is an error now, not a SIGBUS at a hole's first touch.
            regular::allocate(file, TOTAL_SIZE as u64).map_err(|e| io_err(path, "posix_fallocate", e))?;
            if fresh {
                // Other users of the container may run as another uid (the file is ours).
                let _ = file.set_permissions(std::fs::Permissions::from_mode(0o666));
            }
            map_region(Some(file)).map_err(|e| io_err(path, "mmap", e))
        })();
        let base = match res {
            Ok(b) => b,
            Err(e) => {
                if fresh && created {
                    // Leave no empty husk behind that others would have to repair.
                    let _ = std::fs::remove_file(path);
                }
                lock::unlock(fd, LOCK_LIVENESS);
                return Err(e);
            }
        };
        if mode == OpenMode::User {
            // Converts our probe write lock (if any) into the lifetime read lock.
            if let Err(e) = lock::lock_until(fd, false, LOCK_LIVENESS, Instant::now() + LOCK_BOUND)
                .and_then(|ok| if ok { Ok(()) } else { Err(io::Error::from_raw_os_error(libc::EAGAIN)) })
            {
                return Err(RegionError::Lock(e));
            }
        } else {
            lock::unlock(fd, LOCK_LIVENESS);
        }
        Ok((base, fresh, notes))
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
    /// value; an equal one keeps the live value (so shrreg-tool changes persist). Only for the
    /// devices this process sees: it says nothing of the others. A change is said in one line,
    /// since it applies to every process sharing the region.
    /// Returns the lines to say (after the table lock is given back).
    fn apply_intent(&self, init: &RegionInit) -> Vec<String> {
        let v1 = self.v1();
        let h = self.ext_header();
        let mut changed = false;
        let mut notes = Vec::new();
        let seen = (init.device_num as usize).min(MAX_DEVICES);
        for d in 0..seen {
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
            if init.no_intent_mem[d] {
                if let Some(cap) = self.limit(d) {
                    notes.push(format!(
                        "device {d}: CUDA_DEVICE_MEMORY_LIMIT is not set in this process; the container's memory cap of {} applies (0 lifts it, for every process sharing the region)",
                        crate::size::format_size(cap)
                    ));
                }
            } else if h.configured_limit[d].swap(env, AcqRel) != env {
                let was = self.limit(d);
                self.store_limit(d, init.mem_limits[d]);
                changed = true;
                if was != init.mem_limits[d] {
                    let show = |l: Option<u64>| l.map_or("none".to_string(), crate::size::format_size);
                    notes.push(format!(
                        "device {d}: this process's CUDA_DEVICE_MEMORY_LIMIT changes the memory cap of every process sharing the region from {} to {}",
                        show(was),
                        show(init.mem_limits[d])
                    ));
                }
            }
            let env_sm = init.sm_limits[d].unwrap_or(0);
            if init.no_intent_sm[d] {
                if let Some(cap) = self.sm_limit(d).filter(|_| !init.compute_uncapped) {
                    notes.push(format!(
                        "device {d}: CUDA_DEVICE_SM_LIMIT is not set in this process; the container's SM cap of {cap}% applies (0 lifts it, for every process sharing the region)"
                    ));
                }
            } else if h.configured_sm_limit[d].swap(env_sm, AcqRel) != env_sm {
                let was = self.sm_limit(d);
                v1.sm_limit[d].store(env_sm as u64, Release);
                h.soft_sm_limit[d].store(init.soft_sm_limits[d].unwrap_or(0), Release);
                changed = true;
                if was != init.sm_limits[d] {
                    let show = |l: Option<u32>| l.map_or("none".to_string(), |v| format!("{v}%"));
                    notes.push(format!(
                        "device {d}: this process's CUDA_DEVICE_SM_LIMIT changes the SM cap of every process sharing the region from {} to {}",
                        show(was),
                        show(init.sm_limits[d])
                    ));
                }
            }
        }
        let _ = v1.device_num.fetch_max(init.device_num.min(MAX_DEVICES as u32) as u64, AcqRel);
        v1.priority.store(init.priority, Relaxed);
        if changed {
            h.limits_epoch.fetch_add(1, AcqRel);
        }
        notes
    }

    /// Child side of fork: drop the inherited descriptors (the parent's locks stay: they belong to
    /// the open file descriptions the parent still holds), reopen, retake the liveness lock. Slots
    /// inherited from the parent are not ours; the caller registers again.
    pub fn after_fork_child(&mut self) -> Result<(), RegionError> {
        self.table_mu = Mutex::new(());
        // Held by a parent thread at fork time, they are the parent's, as is a private region's
        // copy of its words (a private region uses the mutexes only).
        self.dev_mu = std::array::from_fn(|_| Mutex::new(()));
        let inherited = std::mem::take(&mut *self.keep_lock());
        self.keep = Mutex::new(inherited);
        for o in self.owned.iter().chain(self.left.iter()) {
            o.store(false, Relaxed);
        }
        for (i, m) in self.slot_map.iter().enumerate() {
            m.store(i as u32, Relaxed);
            self.ids[i].store(false, Relaxed);
        }
        self.pid = std::process::id();
        let Some(path) = self.path.clone() else { return Ok(()) };
        if self.fd().is_none() {
            return Ok(()); // snapshot or private: nothing shared to reopen
        }
        // Keep the inherited descriptors open for the child's lifetime (never closed), as the
        // driver's device files are: a parent killed while this child lives keeps its memory on
        // the device, and its slot (locked through these descriptors) stays live and charged for
        // exactly as long. Exec closes them (O_CLOEXEC), like the driver's. Earlier mappings stay
        // (the current one is replaced below).
        for f in self.keep_lock().files.drain(..) {
            std::mem::forget(f);
        }
        self.fd.store(-1, Release);
        let (file, _) = open_file(&path, false).map_err(|e| match e {
            RegionError::NotFound(p) => RegionError::NotFound(p),
            e => e,
        })?;
        let fd = file.as_raw_fd();
        if !lock::lock_until(fd, true, LOCK_TABLE, Instant::now() + LOCK_BOUND).map_err(RegionError::Lock)? {
            return Err(RegionError::Busy("table"));
        }
        let res = (|| {
            let meta = file.metadata().map_err(|e| io_err(&path, "stat", e))?;
            check_owner(&path, &meta, false)?;
            check_file(&file, meta.len()).map_err(|reason| invalid(&path, reason))?;
            let base = map_region(Some(&file)).map_err(|e| io_err(&path, "mmap", e))?;
            if self.live && !lock::lock_until(fd, false, LOCK_LIVENESS, Instant::now() + LOCK_BOUND).map_err(RegionError::Lock)? {
                return Err(RegionError::Busy("liveness"));
            }
            Ok((base, ident_of(&meta)))
        })();
        lock::unlock(fd, LOCK_TABLE);
        let (base, ident) = res?;
        self.base.store(base.as_mut_ptr(), Release);
        self.fd.store(fd, Release);
        let mut k = self.keep_lock();
        k.maps.push(base);
        k.files.push(file);
        k.ident = Some(ident);
        Ok(())
    }

    // ---------- replaced or unlinked file ----------

    /// Whether the path now names another file than ours (deleted, or replaced by a new one).
    /// One `lstat`; for the monitor thread.
    pub fn replaced(&self) -> bool {
        let Some(path) = &self.path else { return false };
        if self.fd().is_none() {
            return false;
        }
        let now = std::fs::symlink_metadata(path).ok().map(|m| ident_of(&m));
        let k = self.keep_lock();
        now != k.ident && k.refused != Some(now)
    }

    /// If the file at our path was deleted or replaced, attach to the file now there (creating it
    /// when missing, as a new process would) and move this handle's slots and their usage into
    /// it, so old and new processes of the container share one cap again. Earlier mappings and
    /// files are kept (references into them stay valid; in the old file our slot stays charged
    /// for processes that have not moved yet). Returns whether it re-attached.
    pub fn reattach_if_replaced(&self) -> Result<bool, RegionError> {
        if !self.live || !self.replaced() {
            return Ok(false);
        }
        let (Some(path), Some(init)) = (&self.path, &self.init) else { return Ok(false) };
        // No ledger lock of ours may straddle the switch: its guard holds the old file's word
        // while its reservation would land in the new file, where nobody waits for it (review).
        // Held by a thread of ours now, the next upkeep tick tries again.
        let deadline = Instant::now() + Duration::from_millis(10);
        let Some(quiet) = self.dev_mu.iter().map(|m| lock_mu_until(m, || deadline)).collect::<Option<Vec<_>>>() else {
            return Ok(false);
        };
        let new = match Region::open(path, init) {
            Ok(r) => r,
            Err(e) => {
                let now = std::fs::symlink_metadata(path).ok().map(|m| ident_of(&m));
                self.keep_lock().refused = Some(now);
                return Err(e);
            }
        };
        let old_base = self.base();
        // Our slots in the new file (at the same index when free there).
        let mine: Vec<(usize, usize)> = self.own_slots().iter().map(|s| (s.index(), self.phys(*s))).collect();
        let mut moved = Vec::new();
        for &(id, old_i) in &mine {
            let pid = old_base_slot(old_base, old_i).pid.load(Relaxed);
            match new.register_at(pid, Some(id)) {
                Ok(ns) => moved.push((id, old_i, new.phys(ns))),
                Err(e) => {
                    crate::error!("re-attaching to the new shared region {}: {e}", path.display());
                }
            }
        }
        // Take the new handle's file and mapping; it must not unregister anything on drop.
        let mut nk = std::mem::take(&mut *new.keep_lock());
        for o in new.owned.iter() {
            o.store(false, Relaxed);
        }
        let new_base = new.base();
        let new_fd = new.fd.load(Acquire);
        std::mem::forget(new);
        {
            let mut k = self.keep_lock();
            k.files.append(&mut nk.files);
            k.maps.append(&mut nk.maps);
            k.ident = nk.ident;
            k.refused = None;
        }
        for &(_, old_i) in &mine {
            self.owned[old_i].store(false, Relaxed);
        }
        // Indexes of slots left in the old file mean nothing in the new one.
        for l in self.left.iter() {
            l.store(false, Relaxed);
        }
        for &(id, _, new_i) in &moved {
            self.owned[new_i].store(true, Relaxed);
            self.slot_map[id].store(new_i as u32, Release);
        }
        self.base.store(new_base, Release);
        self.fd.store(new_fd, Release);
        // Copy usage after the switch: adds made meanwhile land in the new slot already;
        // releases that raced the switch leave an over-count (never an under-count).
        for &(_, old_i, new_i) in &moved {
            let (o, n) = (old_base_slot(old_base, old_i), &self.v1().procs[new_i]);
            for d in 0..MAX_DEVICES {
                let (ou, nu) = (&o.used[d], &n.used[d]);
                for (src, dst) in [(&ou.context_size, &nu.context_size), (&ou.module_size, &nu.module_size), (&ou.data_size, &nu.data_size), (&ou.total, &nu.total)] {
                    let v = src.load(Acquire);
                    let _ = dst.fetch_update(AcqRel, Acquire, |x| Some(x.saturating_add(v)));
                }
            }
            n.hostpid.store(o.hostpid.load(Relaxed), Relaxed);
        }
        // Said with no lock held: a stderr that blocks must not stall this process's allocations.
        drop(quiet);
        crate::warn!(
            "shared region {} was deleted or replaced; re-attached to the file now there ({} slot(s) moved)",
            path.display(),
            moved.len()
        );
        Ok(true)
    }

    // ---------- raw views ----------

    fn base(&self) -> *mut u8 {
        self.base.load(Acquire)
    }

    pub fn v1(&self) -> &SharedRegionV1 {
        // SAFETY: the mapping is TOTAL_SIZE bytes, page aligned, valid until drop; all mutable
        // fields are atomics.
        unsafe { &*(self.base() as *const SharedRegionV1) }
    }

    pub fn ext_header(&self) -> &ExtHeader {
        // SAFETY: EXT_OFFSET is 8-aligned and within the mapping.
        unsafe { &*(self.base().add(EXT_OFFSET) as *const ExtHeader) }
    }

    fn body(&self) -> &ExtBody {
        // SAFETY: EXT_BODY_OFFSET is 64-aligned and the body fits in the mapping.
        unsafe { &*(self.base().add(EXT_BODY_OFFSET) as *const ExtBody) }
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The (device, inode) of the shared file this handle is attached to now (a re-attach moves
    /// it); `None` for a private region or a snapshot.
    pub fn identity(&self) -> Option<(u64, u64)> {
        self.fd()?;
        self.keep_lock().ident
    }

    /// True for `private()` and `snapshot()` regions (not shared through a file).
    pub fn is_private(&self) -> bool {
        self.fd().is_none()
    }

    fn fd(&self) -> Option<RawFd> {
        let fd = self.fd.load(Acquire);
        (fd >= 0).then_some(fd)
    }

    fn lock_table_until(&self, deadline: Instant) -> Result<TableGuard<'_>, RegionError> {
        let fd = self.fd();
        let g = lock_both(&self.table_mu, fd, LOCK_TABLE, deadline, "table")?;
        Ok(TableGuard { fd, _g: g })
    }

    fn lock_table(&self) -> Result<TableGuard<'_>, RegionError> {
        self.lock_table_until(Instant::now() + LOCK_BOUND)
    }

    /// Take device `dev`'s ledger lock as a process without a slot (a tool), waiting at most
    /// [`LOCK_BOUND`] (`Busy` then; once a holder was found stuck, later attempts within a few
    /// seconds do not wait at all).
    pub fn lock_device(&self, dev: usize) -> Result<DeviceGuard<'_>, RegionError> {
        self.lock_device_as(dev, None)
    }

    /// `lock_device` as the holder of `slot` (its lifetime lock tells waiters it is alive).
    pub fn lock_device_for(&self, dev: usize, slot: SlotId) -> Result<DeviceGuard<'_>, RegionError> {
        self.lock_device_as(dev, Some(slot))
    }

    fn lock_device_as(&self, dev: usize, slot: Option<SlotId>) -> Result<DeviceGuard<'_>, RegionError> {
        let m = self.dev_mu.get(dev).ok_or(RegionError::BadDevice(dev))?;
        let stall_until = &self.dev_stall_until[dev];
        // The clocks are read only once a wait begins: uncontended, a capped allocation takes
        // the lock without them. (deadline, whether the device was known stuck)
        let wait = std::cell::OnceCell::new();
        let wait = || {
            *wait.get_or_init(|| {
                let stalled = crate::clock::now_ns() < stall_until.load(Relaxed);
                (Instant::now() + if stalled { STALL_WAIT } else { LOCK_BOUND }, stalled)
            })
        };
        let deadline = || wait().0;
        let taken = lock_mu_until(m, deadline).and_then(|mu| {
            if self.fd().is_none() {
                return Some(DeviceGuard { r: self, dev, word: None, _mu: mu });
            }
            let word = &self.limiter(dev).ledger_lock;
            let token = self.holder_token(slot).token();
            ledger_lock::take_until(word, token, deadline, |t| self.ledger_holder_alive(ledger_lock::Holder::of(t)))
                .then_some(DeviceGuard { r: self, dev, word: Some((word, token)), _mu: mu })
        });
        if let Some(g) = taken {
            if stall_until.load(Relaxed) != 0 {
                stall_until.store(0, Relaxed);
            }
            return Ok(g);
        }
        if !wait().1 {
            stall_until.store(crate::clock::now_ns() + STALL_MEMORY_NS, Relaxed);
            crate::warn!("device {dev}: region lock held past {} ms by another process (stopped?); going on without it", LOCK_BOUND.as_millis());
        }
        Err(RegionError::Busy("device"))
    }

    /// Who this handle holds a ledger lock as: `slot` (ours) at its generation, else our PID.
    fn holder_token(&self, slot: Option<SlotId>) -> ledger_lock::Holder {
        match slot.filter(|&s| self.owns(s)) {
            Some(s) => {
                let index = self.phys(s);
                ledger_lock::Holder::Slot { index, generation: self.body().slots[index].generation.load(Acquire) as u32 }
            }
            None => ledger_lock::Holder::Pid(self.pid),
        }
    }

    /// Whether `h` may still hold a ledger lock (called holding the device's in-process mutex).
    /// A slot: unless the slot was freed or retaken since (its generation moved), or nobody holds
    /// its lifetime byte (its owner died or exec'd), or it is one of this handle's slots (our
    /// threads take the mutex first: a word naming us is left from before, e.g. a re-attach).
    fn ledger_holder_alive(&self, h: ledger_lock::Holder) -> bool {
        match h {
            ledger_lock::Holder::Slot { index, generation } => {
                index < MAX_PROCS
                    && self.body().slots[index].generation.load(Acquire) as u32 == generation
                    && !self.owned[index].load(Relaxed)
                    && self.slot_lock_held_by_other(index).unwrap_or(false)
            }
            ledger_lock::Holder::Pid(pid) => pid != self.pid && ledger_lock::pid_alive(pid),
            ledger_lock::Holder::Garbage => false,
        }
    }

    /// Whether a live holder other than this handle holds device `dev`'s ledger lock (tools and
    /// tests).
    pub fn device_lock_held(&self, dev: usize) -> bool {
        dev < MAX_DEVICES && {
            let t = self.limiter(dev).ledger_lock.load(Acquire);
            t != 0 && self.ledger_holder_alive(ledger_lock::Holder::of(t))
        }
    }

    // ---------- process slots ----------

    /// Index in the current mapping of `s` (registered ids follow their slot across a re-attach).
    fn phys(&self, s: SlotId) -> usize {
        if s.0 & OWN != 0 {
            self.slot_map[s.index()].load(Acquire) as usize
        } else {
            s.index()
        }
    }

    fn slot(&self, s: SlotId) -> &layout::ProcSlot {
        &self.v1().procs[self.phys(s)]
    }

    fn proc_num_clamped(&self) -> usize {
        self.v1().proc_num.load(Acquire).clamp(0, MAX_PROCS as i32) as usize
    }

    /// Register this process (`pid` as seen in the container). Reaps dead slots first.
    pub fn register(&self, pid: i32) -> Result<SlotId, RegionError> {
        self.register_at(pid, None)
    }

    /// Register, at index `prefer` when it is free.
    fn register_at(&self, pid: i32, prefer: Option<usize>) -> Result<SlotId, RegionError> {
        let _t = self.lock_table()?;
        self.reap_dead_locked();
        let v1 = self.v1();
        let order = prefer.into_iter().chain(0..MAX_PROCS);
        for i in order {
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
            self.clear_slot_data(i);
            p.pid.store(pid, Relaxed);
            p.hostpid.store(0, Relaxed);
            let x = &self.body().slots[i];
            x.generation.fetch_add(1, AcqRel);
            x.launches.store(0, Relaxed);
            x.busy_ns.store(0, Relaxed);
            x.last_launch_ns.store(0, Relaxed);
            x.util_centi.store(0, Relaxed);
            x.priority.store(v1.priority.load(Relaxed), Relaxed);
            x.flags.store(SLOT_FLAG_HOSTPID_UNKNOWN, Relaxed);
            x.registered_ns.store(crate::clock::now_ns(), Relaxed);
            let own = pid as u32 == std::process::id();
            x.start_ticks.store(if own { teardown::own_start() } else { 0 }, Relaxed);
            // The id is the index when this handle does not use that id yet (always, unless
            // slots moved in a re-attach).
            let id = if !self.ids[i].load(Relaxed) { i } else { (0..MAX_PROCS).find(|&j| !self.ids[j].load(Relaxed)).unwrap_or(i) };
            self.ids[id].store(true, Relaxed);
            self.slot_map[id].store(i as u32, Release);
            self.owned[i].store(true, Relaxed);
            p.status.store(1, Release);
            let _ = v1.proc_num.fetch_max(i as i32 + 1, AcqRel);
            return Ok(SlotId(id as u32 | OWN));
        }
        Err(RegionError::TableFull)
    }

    /// Give a slot back (its usage disappears with it). Waits at most [`LOCK_BOUND`] for the
    /// table lock; without it the slot is still cleared (only `proc_num` is left as it was).
    pub fn unregister(&self, slot: SlotId) -> Result<(), RegionError> {
        self.unregister_until(slot, Instant::now() + LOCK_BOUND)
    }

    /// [`Region::unregister`] with its own deadline (exit handlers use a short one).
    pub fn unregister_until(&self, slot: SlotId, deadline: Instant) -> Result<(), RegionError> {
        let i = self.phys(slot);
        if !self.owned[i].load(Relaxed) {
            return Err(RegionError::NotOwner(slot));
        }
        let t = self.lock_table_until(deadline);
        self.owned[i].store(false, Relaxed);
        for (id, m) in self.slot_map.iter().enumerate() {
            if m.load(Relaxed) as usize == i && self.ids[id].swap(false, Relaxed) {
                m.store(id as u32, Relaxed);
            }
        }
        self.free_slot(i);
        if let Some(fd) = self.fd() {
            lock::unlock(fd, LOCK_SLOT + i as i64);
        }
        if t.is_ok() {
            self.compact();
        }
        t.map(drop)
    }

    /// Whether this handle registered `slot`.
    pub fn owns(&self, slot: SlotId) -> bool {
        self.owned[self.phys(slot)].load(Relaxed)
    }

    /// Slots this handle registered.
    pub fn own_slots(&self) -> Vec<SlotId> {
        (0..MAX_PROCS).filter(|&id| self.ids[id].load(Relaxed)).map(|id| SlotId(id as u32 | OWN)).collect()
    }

    fn clear_slot_data(&self, i: usize) {
        let p = &self.v1().procs[i];
        let began = seq_begin(p);
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
        seq_end(p, began);
    }

    fn free_slot(&self, i: usize) {
        let p = &self.v1().procs[i];
        p.status.store(0, Release);
        // A writer that died mid-update left the seqlock odd: make it even again.
        if p.seqlock.load(Acquire) & 1 == 1 {
            p.seqlock.fetch_add(1, AcqRel);
        }
        self.clear_slot_data(i);
        p.pid.store(0, Relaxed);
        p.hostpid.store(0, Relaxed);
        let x = &self.body().slots[i];
        x.flags.store(0, Release);
        x.generation.fetch_add(1, AcqRel);
    }

    /// Keep live slots within [0, proc_num) (HAMi's monitor scans only that prefix).
    fn compact(&self) {
        let mut n = self.proc_num_clamped();
        while n > 0 && !self.counts(n - 1) {
            n -= 1;
        }
        self.v1().proc_num.store(n as i32, Release);
    }

    /// Whether slot `i` counts against the caps: live, or exiting and not yet reaped.
    fn counts(&self, i: usize) -> bool {
        self.v1().procs[i].status.load(Acquire) != 0 || self.body().slots[i].flags.load(Acquire) & SLOT_FLAG_EXITING != 0
    }

    /// At exit: the slot disappears for readers at once (`status` 0: HAMi's monitor and our tools
    /// skip it) but keeps its usage counting against the caps until the process is really gone
    /// (the driver frees its memory, the context at least, only at teardown); reapers free it once
    /// its lifetime lock is released and the process has ended (`teardown`). Lock-free; later
    /// writes through this handle change nothing.
    pub fn leave(&self, slot: SlotId) {
        let i = self.phys(slot);
        if !self.owned[i].swap(false, Relaxed) {
            return;
        }
        self.left[i].store(true, Relaxed);
        let p = &self.v1().procs[i];
        // Flag before status (Release): a reader that sees status 0 sees the flag.
        self.body().slots[i].flags.fetch_or(SLOT_FLAG_EXITING, AcqRel);
        for u in &p.device_util {
            u.sm_util.store(0, Relaxed);
        }
        p.status.store(0, Release);
        for (id, m) in self.slot_map.iter().enumerate() {
            if m.load(Relaxed) as usize == i && self.ids[id].swap(false, Relaxed) {
                m.store(id as u32, Relaxed);
            }
        }
    }

    /// Free slots whose owner died (its slot byte can be locked). Returns how many were freed.
    /// Waits at most [`LOCK_BOUND`] for the table lock (0 freed when it cannot be had).
    pub fn reap_dead(&self) -> usize {
        self.reap_dead_until(Instant::now() + LOCK_BOUND)
    }

    /// [`Region::reap_dead`] that never waits (the allocation path and the monitor thread).
    pub fn reap_dead_nowait(&self) -> usize {
        self.reap_dead_until(Instant::now())
    }

    fn reap_dead_until(&self, deadline: Instant) -> usize {
        if self.fd().is_none() {
            return 0;
        }
        match self.lock_table_until(deadline) {
            Ok(_t) => self.reap_dead_locked(),
            Err(RegionError::Busy(_)) => 0,
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
            if !self.counts(i) || self.owned[i].load(Relaxed) || self.left[i].load(Relaxed) {
                continue;
            }
            let byte = LOCK_SLOT + i as i64;
            if let Ok(true) = lock::try_lock(fd, true, byte) {
                if self.tearing_down(i) {
                    lock::unlock(fd, byte);
                    continue;
                }
                self.free_slot(i);
                lock::unlock(fd, byte);
                freed += 1;
            }
        }
        self.compact();
        freed
    }

    /// Whether slot `i`, whose lifetime lock is free, belongs to a process that left it at exit
    /// and is still being torn down (the driver may still hold its memory).
    fn tearing_down(&self, i: usize) -> bool {
        let x = &self.body().slots[i];
        x.flags.load(Acquire) & SLOT_FLAG_EXITING != 0 && !teardown::ended(self.v1().procs[i].pid.load(Relaxed), x.start_ticks.load(Relaxed))
    }

    /// Slots with a live status, in index order.
    pub fn live_slots(&self) -> impl Iterator<Item = SlotId> + '_ {
        (0..self.proc_num_clamped())
            .filter(move |&i| self.v1().procs[i].status.load(Acquire) != 0)
            .map(|i| SlotId(i as u32))
    }

    /// Whether the owner of `slot` is alive: ours, or its lifetime lock is held by another
    /// process (probed with `F_OFD_GETLK`; a handle without a file trusts `status`). For readers:
    /// a process that died without cleaning up keeps `status` set until someone reaps it.
    pub fn slot_owner_alive(&self, slot: SlotId) -> bool {
        let i = self.phys(slot);
        if self.v1().procs[i].status.load(Acquire) == 0 {
            return false;
        }
        if self.owned[i].load(Relaxed) || self.left[i].load(Relaxed) {
            return true;
        }
        self.slot_lock_held_by_other(i).unwrap_or(true)
    }

    /// Whether another process holds slot `i`'s lifetime lock (its owner is alive); `None`
    /// without a file to ask through.
    fn slot_lock_held_by_other(&self, i: usize) -> Option<bool> {
        let fd = self.fd().or(self.probe.as_ref().map(|f| f.as_raw_fd()))?;
        Some(lock::held_by_other(fd, LOCK_SLOT + i as i64))
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
        if !self.owns(slot) {
            return;
        }
        self.slot(slot).hostpid.store(hostpid, Relaxed);
        self.slot_ext(slot).flags.fetch_and(!SLOT_FLAG_HOSTPID_UNKNOWN, AcqRel);
    }

    pub fn slot_ext(&self, slot: SlotId) -> &SlotExt {
        &self.body().slots[self.phys(slot)]
    }

    // ---------- memory ----------

    /// Add to a slot of ours (a slot given back, e.g. at exit, is never written again: its index
    /// may belong to another process by now). All or nothing: false, and nothing added, where the
    /// slot's total cannot hold `bytes` (a clipped add, rolled back in full, would take the slot's
    /// earlier usage with it).
    fn add(&self, slot: SlotId, dev: usize, kind: MemKind, bytes: u64) -> bool {
        if !self.owns(slot) {
            return true;
        }
        let p = self.slot(slot);
        let u = &p.used[dev];
        let field = match kind {
            MemKind::Context => &u.context_size,
            MemKind::Module => &u.module_size,
            MemKind::Data => &u.data_size,
        };
        let began = seq_begin(p);
        // The total holds every field, so a field cannot overflow where the total did not.
        let added = u.total.fetch_update(AcqRel, Acquire, |x| x.checked_add(bytes)).is_ok();
        if added {
            let _ = field.fetch_update(AcqRel, Acquire, |x| Some(x.saturating_add(bytes)));
        }
        seq_end(p, began);
        added
    }

    /// Reserve `bytes` on `dev` for `slot` if the device stays within its cap. An uncapped
    /// device has nothing to check: the charge is a lock-free add, so the allocation path costs
    /// no system call there. A capped one takes the device lock, waiting at most [`LOCK_BOUND`]
    /// for it; without it the reservation is still exact (add-then-check).
    pub fn try_reserve(&self, slot: SlotId, dev: usize, kind: MemKind, bytes: u64) -> Result<(), ReserveError> {
        self.try_reserve_used(slot, dev, kind, bytes).map(|_| ())
    }

    /// `try_reserve`, also telling the device's usage and cap after the reservation (`None`
    /// when the device has no cap): what the reservation's own check summed, not a second sum.
    pub fn try_reserve_used(&self, slot: SlotId, dev: usize, kind: MemKind, bytes: u64) -> Result<Option<(u64, u64)>, ReserveError> {
        if dev >= MAX_DEVICES {
            return Err(ReserveError::BadDevice(dev));
        }
        if self.limit(dev).is_none() {
            return self.add_or_refuse(slot, dev, kind, bytes, None).map(|()| None);
        }
        match self.lock_device_for(dev, slot) {
            Ok(g) => g.r.reserve_checked(slot, dev, kind, bytes),
            Err(RegionError::Busy(_)) => self.reserve_checked(slot, dev, kind, bytes),
            Err(e) => Err(ReserveError::Lock(e.to_string())),
        }
    }

    /// Add, then check the sum: of two processes racing for the last bytes at least one sees
    /// both charges (SeqCst fences), so the cap holds with or without the device lock; the lock
    /// only spares racers a needless refusal. Reaps dead slots (without waiting) before refusing.
    fn reserve_checked(&self, slot: SlotId, dev: usize, kind: MemKind, bytes: u64) -> Result<Option<(u64, u64)>, ReserveError> {
        let Some(limit) = self.limit(dev) else {
            return self.add_or_refuse(slot, dev, kind, bytes, None).map(|()| None);
        };
        let mut used = 0;
        for attempt in 0..2 {
            self.add_or_refuse(slot, dev, kind, bytes, Some(limit))?;
            std::sync::atomic::fence(SeqCst);
            let total = self.device_used(dev);
            if total <= limit || !self.owns(slot) {
                return Ok(Some((total, limit)));
            }
            self.release(slot, dev, kind, bytes);
            used = total.saturating_sub(bytes);
            if attempt == 1 || self.reap_dead_nowait() == 0 {
                break;
            }
        }
        Err(ReserveError::OverLimit { used, limit, requested: bytes })
    }

    /// `add`, or refuse a request no device holds (bytes past what the slot's counters can add;
    /// against the cap, or the device's physical size where there is none).
    fn add_or_refuse(&self, slot: SlotId, dev: usize, kind: MemKind, bytes: u64, limit: Option<u64>) -> Result<(), ReserveError> {
        if self.add(slot, dev, kind, bytes) {
            return Ok(());
        }
        let limit = limit.unwrap_or_else(|| self.v1().limit[dev].load(Relaxed));
        Err(ReserveError::OverLimit { used: self.device_used(dev), limit, requested: bytes })
    }

    /// Charge unconditionally (usage that already exists, e.g. a measured context), even past
    /// the cap; lock-free. A charge the counters cannot hold is dropped, not clipped.
    pub fn charge(&self, slot: SlotId, dev: usize, kind: MemKind, bytes: u64) {
        if dev < MAX_DEVICES {
            self.add(slot, dev, kind, bytes);
        }
    }

    /// Give back a charge (lock-free; saturates at zero).
    pub fn release(&self, slot: SlotId, dev: usize, kind: MemKind, bytes: u64) {
        if !self.owns(slot) {
            return;
        }
        let p = self.slot(slot);
        let Some(u) = p.used.get(dev) else { return };
        let field = match kind {
            MemKind::Context => &u.context_size,
            MemKind::Module => &u.module_size,
            MemKind::Data => &u.data_size,
        };
        let began = seq_begin(p);
        sat_sub(field, bytes);
        sat_sub(&u.total, bytes);
        seq_end(p, began);
    }

    /// Bytes used on `dev` by every live slot.
    pub fn device_used(&self, dev: usize) -> u64 {
        if dev >= MAX_DEVICES {
            return 0;
        }
        (0..self.proc_num_clamped())
            .filter(|&i| self.counts(i))
            .fold(0u64, |acc, i| acc.saturating_add(self.v1().procs[i].used[dev].total.load(Acquire)))
    }

    pub fn proc_used(&self, slot: SlotId, dev: usize) -> u64 {
        self.proc_usage(slot, dev).total
    }

    /// A slot's usage of `dev`, read consistently under the slot's seqlock (a few retries while
    /// a writer is mid-update; a writer that died mid-update cannot hold readers up).
    pub fn proc_usage(&self, slot: SlotId, dev: usize) -> MemUsage {
        let p = self.slot(slot);
        let Some(u) = p.used.get(dev) else { return MemUsage::default() };
        let read = || MemUsage {
            context: u.context_size.load(Acquire),
            module: u.module_size.load(Acquire),
            data: u.data_size.load(Acquire),
            total: u.total.load(Acquire),
        };
        for _ in 0..1000 {
            let s1 = p.seqlock.load(Acquire);
            if s1 & 1 == 0 {
                let v = read();
                std::sync::atomic::fence(Acquire);
                if p.seqlock.load(Relaxed) == s1 {
                    return v;
                }
            }
            std::hint::spin_loop();
        }
        read()
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
    /// is freed). The cap is two words (HAMi's `limit[]` and our flag): written under the table
    /// lock, as a process's own intent is (`apply_intent`), so two writers cannot leave one's
    /// value with the other's flag. A holder stuck past the bound does not stop the change.
    pub fn set_limit(&self, dev: usize, limit: Option<u64>) -> Result<(), RegionError> {
        if dev >= MAX_DEVICES {
            return Err(RegionError::BadDevice(dev));
        }
        let _writers = self.lock_table().ok();
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
        if !self.owns(slot) {
            return;
        }
        if let Some(u) = self.slot(slot).device_util.get(dev) {
            u.sm_util.store(pct, Relaxed);
        }
    }

    pub fn proc_sm_util(&self, slot: SlotId, dev: usize) -> u64 {
        self.slot(slot).device_util.get(dev).map_or(0, |u| u.sm_util.load(Relaxed))
    }

    /// The container's utilization of `dev` in percent x 100 as readers should show it: the
    /// stored figure while it is fresh, 0 once nothing keeps it up to date. Fresh means a live
    /// process's limiter closed a utilization window on the device within [`UTIL_WINDOW_NS`] (a
    /// gated process does every 0.5 s, launching or not: its figure falls to 0 by itself when it
    /// stops), or a live process launched within it (the ungated path writes the figure only when
    /// it launches). So the rate falls to 0 when nothing launches, and a launching process never
    /// reads 0. Readers only: the stored value is the limiter's.
    pub fn recent_util_centi(&self, dev: usize) -> u64 {
        if dev >= MAX_DEVICES {
            return 0;
        }
        let now = crate::clock::now_ns();
        let fresh = |t: u64| t != 0 && now.saturating_sub(t) < UTIL_WINDOW_NS;
        let window = fresh(self.limiter(dev).window_start_ns.load(Relaxed));
        let recent = window
            || self.live_slots().any(|s| fresh(self.slot_ext(s).last_launch_ns.load(Relaxed)) && self.slot_owner_alive(s));
        if recent {
            self.limiter(dev).util_centi_percent.load(Relaxed).min(10_000)
        } else {
            0
        }
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

/// Slot `i` of the mapping at `base` (an earlier mapping of this handle, still mapped).
fn old_base_slot<'a>(base: *mut u8, i: usize) -> &'a layout::ProcSlot {
    // SAFETY: `base` is a mapping of this handle, kept until drop; `i` < MAX_PROCS.
    unsafe { &(*(base as *const SharedRegionV1)).procs[i] }
}

impl Drop for Region {
    fn drop(&mut self) {
        // Only the process that registered slots gives them back (a fork child that never called
        // after_fork_child must not free its parent's slots).
        if self.pid == std::process::id() {
            for s in self.own_slots() {
                let _ = self.unregister(s);
            }
        }
        // Unmaps every mapping (memmap2) and closes every file.
        drop(std::mem::take(&mut *self.keep_lock()));
    }
}

#[cfg(test)]
mod tests;
