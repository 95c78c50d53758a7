//! Process runtime: configuration, the shared region, this process's slot, device info and the
//! allocation ledgers. Initialized lazily and thread-safely by the first hooked call (never in a
//! constructor), in two phases:
//!
//! 1. [`ensure`] (any hooked call): parse `Config` once, set the log level, print each config
//!    problem as one line, register the `pthread_atfork` child handler. With
//!    `CUDA_DISABLE_CONTROL=true` it returns `None` forever and every shim passes through.
//! 2. [`Runtime::proc`] (first call that needs accounting, and right after a successful `cuInit`):
//!    query the visible devices from the driver (physical memory, UUID), resolve the limits, open
//!    the region (`Region::open`, else `Region::private` with one error line), register this
//!    process's slot and record device info. Returns `None` while the driver is not initialized.
//!
//! Fork: the child handler only sets a flag; the next hooked call in the child reopens the region
//! file (never touching locks or mutexes inherited mid-operation), registers a new slot and starts
//! with empty ledgers (the parent's allocations are not the child's).
//!
//! The monitor thread is not started here: `lifecycle` starts it once the process state exists.
//!
//! For the lead's `launch.rs` / `monitor.rs`: [`get`] returns the runtime without initializing or
//! blocking; `rt.proc_if_ready()` the process state (region + slot + devices) when phase 2 is done.

use crate::driver;
use crate::ffi::CUdevice;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use vgpu_core::config::Config;
use vgpu_core::ledger::Ledger;
use vgpu_core::region::{Region, RegionInit, SlotId};
use vgpu_core::MAX_DEVICES;

/// One device as this process sees it (index = the program's device ordinal = config/region index).
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    pub index: usize,
    /// The driver's `CUdevice` for this ordinal (`cuDeviceGet(index)`; equal to `index` on every
    /// known driver, but compared, never assumed).
    pub handle: CUdevice,
    /// "GPU-..." as NVML spells it.
    pub uuid: String,
    pub physical_total: u64,
    /// Memory cap from the config (the region's live value may differ: `ProcState::limit`).
    pub mem_limit: Option<u64>,
    pub sm_limit: Option<u32>,
    pub soft_sm_limit: Option<u32>,
}

/// A VMM handle this process charged.
#[derive(Clone, Copy, Debug)]
pub struct Handle {
    pub dev: usize,
    pub bytes: u64,
    /// Outstanding references (creation, retains, own imports); each needs a `cuMemRelease`.
    pub refs: u32,
    pub maps: u32,
}

/// A pool of a device we control, and what its reservation is charged.
#[derive(Clone, Copy, Debug, Default)]
pub struct Pool {
    pub dev: usize,
    pub charged: u64,
}

#[derive(Default)]
pub struct Phys {
    pub handles: HashMap<u64, Handle>,
    /// Mappings: address -> (size, handle).
    pub maps: BTreeMap<u64, (u64, u64)>,
    pub pools: HashMap<usize, Pool>,
    /// Live stream-ordered allocations -> their pool.
    pub async_ptrs: HashMap<u64, usize>,
    /// Alloc nodes recorded while a stream captures, per stream: (device, bytes).
    pub capture: HashMap<usize, Vec<(usize, u64)>>,
    /// Alloc nodes per graph and per executable graph.
    pub graphs: HashMap<usize, Vec<(usize, u64)>>,
    pub execs: HashMap<usize, Vec<(usize, u64)>>,
    /// Per device: sum of live executables' alloc nodes, and the graph memory charge.
    pub graph_live: [u64; MAX_DEVICES],
    pub graph_charged: [u64; MAX_DEVICES],
}

/// What this process charged, keyed per namespace (device pointers, arrays and mipmapped arrays
/// never share keys; `cuMemCreate` handles, pools and graph memory are in `phys`).
#[derive(Default)]
pub struct Ledgers {
    pub ptrs: Ledger,
    pub arrays: Ledger,
    /// VMM handles and mappings, pools, graph memory (`physmem`).
    pub phys: Phys,
}

pub use vgpu_core::policy::context::Contexts;

/// Per-process state (replaced in a forked child).
pub struct ProcState {
    pub region: Region,
    pub slot: SlotId,
    pub pid: u32,
    /// Visible devices in driver order (at most `MAX_DEVICES`).
    pub devices: Vec<DeviceInfo>,
    pub ledgers: Mutex<Ledgers>,
    pub contexts: Mutex<Contexts>,
}

impl ProcState {
    /// Live memory cap of device `dev` (region value: shrreg-tool may have changed it).
    pub fn limit(&self, dev: usize) -> Option<u64> {
        self.region.limit(dev)
    }
    /// Memory used on `dev` by every live process of the container (dead processes' slots are
    /// reclaimed first, so a process that exited without cleaning up is not counted). For
    /// memory-info queries, not for hot paths: it takes the region's table lock.
    pub fn container_used(&self, dev: usize) -> u64 {
        container_used(&self.region, dev)
    }
    /// Program device ordinal (= config/region index) of the driver's `CUdevice` `dev`; `None`
    /// for a device this process does not control.
    pub fn dev_index(&self, dev: CUdevice) -> Option<usize> {
        // Fast path: the driver's handle is the ordinal.
        if let Some(d) = usize::try_from(dev).ok().and_then(|i| self.devices.get(i)) {
            if d.handle == dev {
                return Some(d.index);
            }
        }
        self.devices.iter().find(|d| d.handle == dev).map(|d| d.index)
    }
    pub fn device(&self, dev: usize) -> Option<&DeviceInfo> {
        self.devices.get(dev)
    }
    pub fn ledgers(&self) -> MutexGuard<'_, Ledgers> {
        self.ledgers.lock().unwrap_or_else(|e| e.into_inner())
    }
    pub fn contexts(&self) -> MutexGuard<'_, Contexts> {
        self.contexts.lock().unwrap_or_else(|e| e.into_inner())
    }
}

pub struct Runtime {
    pub config: Config,
    proc: AtomicPtr<ProcState>,
    proc_once: Once,
    /// Region opened read-only for NVML-only processes (nvidia-smi): `Region::open_existing`.
    observer: OnceLock<Option<Region>>,
}

impl Runtime {
    /// Process state; initializes phase 2 on first use. `None` while the driver cannot answer
    /// (not initialized), when the hook has no region at all (logged), or while a forked child
    /// is re-registering on another thread (never blocks on an inherited lock).
    #[inline]
    pub fn proc(&self) -> Option<&'static ProcState> {
        let p = self.proc.load(Ordering::Acquire);
        if !p.is_null() {
            // SAFETY: ProcStates are leaked; never freed.
            return Some(unsafe { &*p });
        }
        self.proc_slow(None)
    }

    /// Process state only if phase 2 already happened (never initializes).
    #[inline]
    pub fn proc_if_ready(&self) -> Option<&'static ProcState> {
        let p = self.proc.load(Ordering::Acquire);
        // SAFETY: ProcStates are leaked; never freed.
        (!p.is_null()).then(|| unsafe { &*p })
    }

    #[cold]
    fn proc_slow(&self, reuse: Option<(Region, Vec<DeviceInfo>)>) -> Option<&'static ProcState> {
        let mut reuse = reuse;
        let done = self.proc_once.run(UNINIT, || {
            let ps = build_proc(&self.config, reuse.take())?;
            self.proc.store(Box::into_raw(Box::new(ps)), Ordering::Release);
            Some(())
        });
        if !done {
            return None;
        }
        self.proc_if_ready()
    }

    /// A region to read container usage from: ours when registered, else the existing file
    /// (NVML-only processes such as nvidia-smi never create or modify it).
    pub fn region_for_read(&self) -> Option<&Region> {
        if let Some(ps) = self.proc_if_ready() {
            return Some(&ps.region);
        }
        self.observer
            .get_or_init(|| Region::open_existing(&self.config.region_path).ok())
            .as_ref()
    }

    /// Child side of fork: new slot, new ledgers, same devices (the fork step of `lifecycle`,
    /// which also resets and restarts the monitor).
    #[cold]
    pub fn after_fork(&self) {
        self.proc_once.reset_in_child();
        let old = self.proc.swap(std::ptr::null_mut(), Ordering::AcqRel);
        let reuse = if old.is_null() {
            None
        } else {
            // SAFETY: the old state is leaked and never used again in the child: the region is
            // moved out bitwise (the box is never dropped, so no double drop); its mutexes and
            // ledgers, possibly held by a parent thread at fork time, are abandoned.
            let old = unsafe { &*old };
            let mut region = unsafe { std::ptr::read(&old.region) };
            match region.after_fork_child() {
                Ok(()) => Some((region, old.devices.clone())),
                Err(e) => {
                    vgpu_core::error!("fork child: reopening the shared region failed: {e}");
                    std::mem::forget(region);
                    None
                }
            }
        };
        let _ = self.proc_slow(reuse);
    }
}

/// Usage of `dev` by the region's live processes, after reclaiming dead ones.
pub fn container_used(region: &Region, dev: usize) -> u64 {
    region.reap_dead();
    region.device_used(dev)
}

fn build_proc(cfg: &Config, reuse: Option<(Region, Vec<DeviceInfo>)>) -> Option<ProcState> {
    let pid = std::process::id();
    let (region, devices) = match reuse {
        Some(r) => r,
        None => {
            let devices = query_devices(cfg)?;
            let physical: Vec<u64> = devices.iter().map(|d| d.physical_total).collect();
            let uuids: Vec<String> = devices.iter().map(|d| d.uuid.clone()).collect();
            let init = RegionInit::from_config(cfg, &physical, &uuids);
            let region = match Region::open(&cfg.region_path, &init) {
                Ok(r) => r,
                Err(e) => {
                    let place = if e.names_path() { String::new() } else { format!("shared region {}: ", cfg.region_path) };
                    vgpu_core::error!("{place}{e}; using a private region (limits apply to this process only)");
                    match Region::private(&init) {
                        Ok(r) => r,
                        Err(e) => {
                            vgpu_core::error!("private region failed too: {e}; memory is not controlled");
                            return None;
                        }
                    }
                }
            };
            (region, devices)
        }
    };
    let slot = match region.register(pid as i32) {
        Ok(s) => s,
        Err(e) => {
            vgpu_core::error!("registering in the shared region failed: {e}; using a private region");
            let physical: Vec<u64> = devices.iter().map(|d| d.physical_total).collect();
            let uuids: Vec<String> = devices.iter().map(|d| d.uuid.clone()).collect();
            let init = RegionInit::from_config(cfg, &physical, &uuids);
            let private = Region::private(&init).ok()?;
            let slot = private.register(pid as i32).ok()?;
            return Some(finish(private, slot, pid, devices));
        }
    };
    Some(finish(region, slot, pid, devices))
}

fn finish(region: Region, slot: SlotId, pid: u32, devices: Vec<DeviceInfo>) -> ProcState {
    register_exit_cleanup();
    for d in &devices {
        let recorded = region.uuid(d.index);
        if !recorded.is_empty() && !d.uuid.is_empty() && !recorded.eq_ignore_ascii_case(&d.uuid) {
            // Caps are per ordinal: processes sharing a region must see the devices in one order.
            vgpu_core::warn!(
                "device {}: the shared region records {} but this process's device {} is {} \
                 (processes of the container see different CUDA_VISIBLE_DEVICES orders?); \
                 cap {} applies to {} here",
                d.index, recorded, d.index, d.uuid, d.index, d.uuid
            );
        }
        if let Err(e) = region.set_device_info(d.index, &d.uuid, d.physical_total) {
            vgpu_core::warn!("recording device {} in the region failed: {e}", d.index);
        }
    }
    for d in &devices {
        vgpu_core::debug!(
            "device {}: {} physical {} limit {:?} (live {:?}) sm {:?}",
            d.index,
            d.uuid,
            d.physical_total,
            d.mem_limit,
            region.limit(d.index),
            d.sm_limit
        );
    }
    ProcState {
        region,
        slot,
        pid,
        devices,
        ledgers: Mutex::new(Ledgers::default()),
        contexts: Mutex::new(Contexts::default()),
    }
}

fn query_devices(cfg: &Config) -> Option<Vec<DeviceInfo>> {
    let n = driver::device_count()?;
    let mut out = Vec::with_capacity(n.min(MAX_DEVICES));
    if n > MAX_DEVICES {
        vgpu_core::warn!("{n} devices visible; only the first {MAX_DEVICES} are controlled");
    }
    for i in 0..n.min(MAX_DEVICES) {
        let dev = driver::device_get(i)?;
        let physical = driver::device_total_mem(dev).unwrap_or(0);
        let uuid = driver::device_uuid(dev).map(|u| driver::uuid_string(&u)).unwrap_or_default();
        out.push(DeviceInfo {
            index: i,
            handle: dev,
            uuid,
            physical_total: physical,
            mem_limit: cfg.mem_limit(i, physical),
            sm_limit: cfg.sm_limit(i),
            soft_sm_limit: cfg.soft_sm_limit(i),
        });
    }
    Some(out)
}

// ---------------------------------------------------------------------------------------------
// Fork-safe one-time initialization. The state word holds the initializing pid, so a child forked
// while another thread was initializing takes over instead of waiting forever.

const UNINIT: u64 = 0;
const RUNNING: u64 = 1;
const READY: u64 = 2;
const DISABLED: u64 = 3;

struct Once {
    word: AtomicU64,
}

thread_local! {
    static IN_INIT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl Once {
    const fn new() -> Once {
        Once { word: AtomicU64::new(UNINIT) }
    }
    fn state(&self) -> u64 {
        self.word.load(Ordering::Acquire) & 0xff
    }
    /// Run `f` once successfully; `f` returning `None` leaves the cell in `fail_state` (UNINIT:
    /// retried by a later call; DISABLED: never again). Returns whether the cell is initialized. Re-entry from the initializing
    /// thread returns `false` immediately.
    fn run(&self, fail_state: u64, f: impl FnOnce() -> Option<()>) -> bool {
        let me = std::process::id() as u64;
        let mut f = Some(f);
        loop {
            let w = self.word.load(Ordering::Acquire);
            match w & 0xff {
                READY => return true,
                DISABLED => return false,
                UNINIT => {
                    if self
                        .word
                        .compare_exchange(w, (me << 8) | RUNNING, Ordering::AcqRel, Ordering::Acquire)
                        .is_err()
                    {
                        continue;
                    }
                    IN_INIT.with(|c| c.set(true));
                    let ok = match f.take() {
                        Some(f) => f().is_some(),
                        None => false,
                    };
                    IN_INIT.with(|c| c.set(false));
                    self.word.store(if ok { READY } else { fail_state }, Ordering::Release);
                    return ok;
                }
                _ => {
                    if IN_INIT.with(|c| c.get()) {
                        return false;
                    }
                    if w >> 8 != me {
                        // Forked while another thread was initializing: take over.
                        let _ = self.word.compare_exchange(w, UNINIT, Ordering::AcqRel, Ordering::Acquire);
                        continue;
                    }
                    std::thread::sleep(std::time::Duration::from_micros(50));
                }
            }
        }
    }
    fn reset_in_child(&self) {
        self.word.store(UNINIT, Ordering::Release);
    }
}

// ---------------------------------------------------------------------------------------------
// Phase 1

static RT: AtomicPtr<Runtime> = AtomicPtr::new(std::ptr::null_mut());
static RT_ONCE: Once = Once::new();
static FORKED: AtomicBool = AtomicBool::new(false);

/// The runtime if initialized and control is enabled. Never initializes, never blocks: for the
/// launch gate and the monitor.
#[inline]
pub fn get() -> Option<&'static Runtime> {
    let p = RT.load(Ordering::Acquire);
    // SAFETY: the runtime is leaked; never freed.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// The runtime, initializing it on first use; `None` = control disabled (pass everything through)
/// or re-entered during initialization. The fork step is `lifecycle`'s (`take_forked`).
#[inline]
pub fn ensure() -> Option<&'static Runtime> {
    let p = RT.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: leaked, never freed.
        return Some(unsafe { &*p });
    }
    ensure_slow()
}

/// Whether this is a forked child that has not re-registered yet (true once per fork).
#[inline]
pub fn take_forked() -> bool {
    FORKED.load(Ordering::Relaxed) && FORKED.swap(false, Ordering::AcqRel)
}

#[cold]
fn ensure_slow() -> Option<&'static Runtime> {
    if RT_ONCE.state() == DISABLED {
        return None;
    }
    RT_ONCE.run(DISABLED, || {
        let config = Config::from_process_env();
        vgpu_core::log::set_level(config.log_level);
        crate::guard::init();
        for p in &config.problems {
            vgpu_core::error!("config: {p}");
        }
        if config.disable_control {
            vgpu_core::info!("CUDA_DISABLE_CONTROL is set: passing everything through");
            return None;
        }
        // SAFETY: registering a plain extern "C" handler that only stores an atomic.
        unsafe { libc::pthread_atfork(None, None, Some(atfork_child)) };
        let rt = Box::new(Runtime {
            config,
            proc: AtomicPtr::new(std::ptr::null_mut()),
            proc_once: Once::new(),
            observer: OnceLock::new(),
        });
        RT.store(Box::into_raw(rt), Ordering::Release);
        Some(())
    });
    get()
}

extern "C" fn atfork_child() {
    FORKED.store(true, Ordering::Relaxed);
}

// ---------------------------------------------------------------------------------------------
// Exit: leave our slot, so readers (our tools, HAMi's monitor) never see an exited process.

static EXIT_REGISTERED: AtomicBool = AtomicBool::new(false);

/// `atexit` (once per process image; inherited across fork, so the handler checks the pid): runs
/// on a normal exit and on `exit()` from any thread, before static destructors registered
/// earlier. The slot disappears for readers at once and keeps counting against the cap until the
/// process is gone (the driver frees its memory at teardown), then the container's other
/// processes reap it; CUDA frees made by later destructors change nothing. Lock-free. A killed
/// process is reaped as before; an exec'd image's slot likewise.
fn register_exit_cleanup() {
    if !EXIT_REGISTERED.swap(true, Ordering::AcqRel) {
        // SAFETY: registering a plain extern "C" function.
        unsafe { libc::atexit(exit_cleanup) };
    }
}

extern "C" fn exit_cleanup() {
    let _ = std::panic::catch_unwind(|| {
        let Some(ps) = get().and_then(|rt| rt.proc_if_ready()) else { return };
        if ps.pid != std::process::id() {
            return; // a forked child that never used CUDA: the slot is its parent's
        }
        for s in ps.region.own_slots() {
            ps.region.leave(s);
        }
    });
}
