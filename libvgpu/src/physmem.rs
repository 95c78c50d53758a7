//! Memory the device holds beyond an allocation's call and free (issue 11): charged for as long
//! as the device holds it, to the device that holds it.
//!
//! * **VMM handles** (`cuMemCreate`): physical memory lives until it is released *and* unmapped.
//!   A handle is charged from `cuMemCreate` until its last reference (`cuMemCreate`,
//!   `cuMemRetainAllocationHandle`, an import of our own export) is released and its last
//!   mapping (`cuMemMap`) unmapped. Handles imported from another process are not charged here:
//!   the exporting process of the container is charged for them (no double charge); memory
//!   exported from outside the container is not charged.
//! * **Pools** (`cuMemAllocAsync`, `cuMemAllocFromPoolAsync`): a pool is charged its *reserved*
//!   memory (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`), which includes freed memory it keeps up to
//!   its release threshold. An allocation reserves the pool's possible growth first (its size
//!   minus the pool's idle memory, in 2 MiB steps), then the charge is settled to what the pool
//!   really reserves. Charges are settled again after frees, trims and, when a free happened
//!   since, at the next synchronize (where the driver gives memory above the threshold back).
//! * **Graph memory** (alloc nodes: `cuGraphAddMemAllocNode`, or `cuMemAllocAsync` captured into
//!   a graph): an executable graph needs its alloc nodes' memory from its first launch; it is
//!   charged from instantiation (so a launch cannot exceed the cap) while it lives, and the
//!   device's graph pool keeps it after that until `cuDeviceGraphMemTrim`. The charge of a
//!   device is max(live executables' nodes, the graph pool's reserved memory).
//! * When a cap is hit, the process first trims its own pools and graph memory (unused memory
//!   only), then the reservation is retried once.
//! * Near the cap (`policy::context::NEAR_CAP_BYTES`), a reservation first charges what NVML
//!   shows the device holds for this process beyond its charges (a context's growth the hook
//!   could not see, such as lazy module loading's at a first launch), so it cannot push the
//!   device over the cap.

use crate::driver;
use crate::ffi::*;
use crate::sys::sig;
use crate::runtime::{Handle, Phys, Pool, ProcState, Runtime};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use vgpu_core::ledger::accounted_size;
use vgpu_core::policy::context as policy;
use vgpu_core::region::{MemKind, ReserveError};
use vgpu_core::MAX_DEVICES;

const PAGE: u64 = 2 << 20;

fn pages(bytes: u64) -> u64 {
    accounted_size(bytes).div_ceil(PAGE).saturating_mul(PAGE)
}

/// A pool of ours freed memory since the last settle: the next synchronize may shrink it.
static POOLS_DIRTY: AtomicBool = AtomicBool::new(false);

/// Charge (`delta > 0`, unconditional: the device holds it already) or release on `dev`.
fn adjust(ps: &ProcState, dev: usize, from: u64, to: u64) {
    if to > from {
        match ps.region.lock_device_for(dev, ps.slot) {
            Ok(g) => g.charge(ps.slot, MemKind::Data, to - from),
            Err(e) => vgpu_core::error!("device {dev}: {} bytes held by the device could not be charged: {e}", to - from),
        }
    } else if from > to {
        unreserve(ps, dev, from - to);
    }
}

// ---------------------------------------------------------------------------------------------
// Reservations (every allocation path's, `memory` included)

/// Reserve `bytes` on `dev` or say why not (one info line): `Err(CUDA_ERROR_OUT_OF_MEMORY)`.
/// At the cap, this process's pools and graph memory give back what they keep unused first
/// (`trim_own`), then the reservation is tried once more.
pub fn reserve(ps: &ProcState, dev: usize, bytes: u64, what: &str) -> Result<(), CUresult> {
    reserve_with(ps, dev, bytes, bytes, what)
}

/// `reserve` for memory the device already holds (a pitched allocation larger than estimated):
/// NVML shows it already, so near the cap none of it is in flight.
pub fn reserve_existing(ps: &ProcState, dev: usize, bytes: u64, what: &str) -> Result<(), CUresult> {
    reserve_with(ps, dev, bytes, 0, what)
}

/// `in_flight`: how much of `bytes` the device does not hold yet.
fn reserve_with(ps: &ProcState, dev: usize, bytes: u64, in_flight: u64, what: &str) -> Result<(), CUresult> {
    let mut res = ps.region.try_reserve_used(ps.slot, dev, MemKind::Data, bytes);
    if matches!(res, Err(ReserveError::OverLimit { .. })) && trim_own(ps, dev) {
        res = ps.region.try_reserve_used(ps.slot, dev, MemKind::Data, bytes);
    }
    match res {
        Ok(None) => Ok(()),
        Ok(Some((used, limit))) if !policy::near_cap(used, limit) => Ok(()),
        Ok(Some((_, limit))) => charge_unseen_growth(ps, dev, bytes, in_flight, limit, what),
        Err(ReserveError::OverLimit { used, limit, requested }) => {
            vgpu_core::info!(
                "{what}: {requested} bytes on device {dev} refused: {used} of {limit} bytes already used"
            );
            Err(CUDA_ERROR_OUT_OF_MEMORY)
        }
        Err(e) => {
            vgpu_core::warn!("{what}: {bytes} bytes on device {dev} refused: {e}");
            Err(CUDA_ERROR_OUT_OF_MEMORY)
        }
    }
}

/// Growth charged near the cap per device, not yet handed to the monitor's `Growth` (which gives
/// it back when NVML shows the process holding less): `take_near_cap_growth`.
static NEAR_CAP_GROWTH: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
/// When NVML was last asked near the cap, per device (one query per `NEAR_CAP_QUERY_NS`).
static NEAR_CAP_ASKED_NS: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
const NEAR_CAP_QUERY_NS: u64 = 50_000_000;
/// One near-cap check at a time in this process: two threads must not both charge one growth.
static NEAR_CAP_CHECK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The growth charged near the cap on `dev` since the last call (the monitor adds it to its
/// `Growth`, so it is given back like any growth).
pub fn take_near_cap_growth(dev: usize) -> u64 {
    NEAR_CAP_GROWTH.get(dev).map_or(0, |g| g.swap(0, Ordering::AcqRel))
}

/// The device's used memory before this process's first context there, while no compute process
/// was on it (`policy::device_base`), plus one; 0: unknown. Reset in a forked child.
static DEVICE_BASE: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];

/// Before this process's first context on `dev`: remember the device's usage as the base of
/// `held_for_process` when nobody is on the device yet (`procs`: NVML's compute processes there).
pub fn note_device_base(dev: usize, procs: Option<usize>, used: Option<u64>) {
    if let (Some(slot), Some(base)) = (DEVICE_BASE.get(dev), policy::device_base(procs, used)) {
        let _ = slot.compare_exchange(0, base + 1, Ordering::AcqRel, Ordering::Relaxed);
    }
}

/// A forked child starts with none of the parent's bases or pending growth.
pub fn after_fork_child() {
    for d in 0..MAX_DEVICES {
        DEVICE_BASE[d].store(0, Ordering::Relaxed);
        NEAR_CAP_GROWTH[d].store(0, Ordering::Relaxed);
        NEAR_CAP_ASKED_NS[d].store(0, Ordering::Relaxed);
    }
}

/// What device `h` (our `dev`) holds for host process `hostpid`: NVML's figure for it, or the
/// device's growth since this process came when it is the only process there
/// (`policy::held_for_process`: a real device keeps memory per context outside the figure).
pub fn held_for_process(dev: usize, h: crate::ffi::nvmlDevice_t, hostpid: u32) -> Option<u64> {
    let procs = driver::nvml_compute_processes(h)?;
    let own = driver::nvml_process_used(&procs, hostpid);
    let base = DEVICE_BASE.get(dev).map(|b| b.load(Ordering::Relaxed)).filter(|&b| b > 0).map(|b| b - 1);
    let only = procs.len() == 1 && own.is_some();
    policy::held_for_process(own, if only && base.is_some() { driver::nvml_used(h) } else { None }, base, only)
}

/// After reserving `bytes` (`in_flight` of them not on the device yet) near the cap `limit`
/// (`dev` valid: the reservation checked it): charge what the device holds for this process
/// beyond its charges (`held_for_process`; at most one NVML query per device every 50 ms); when
/// that leaves no room for the reservation, give it back (out of memory). Only where NVML lists
/// the process (its host PID known, as for the monitor's growth charge).
fn charge_unseen_growth(ps: &ProcState, dev: usize, bytes: u64, in_flight: u64, limit: u64, what: &str) -> Result<(), CUresult> {
    let hostpid = ps.region.slot_hostpid(ps.slot);
    if hostpid <= 0 {
        return Ok(());
    }
    let Ok(_one) = NEAR_CAP_CHECK.try_lock() else { return Ok(()) }; // another thread is checking
    let now = vgpu_core::clock::now_ns();
    if now.saturating_sub(NEAR_CAP_ASKED_NS[dev].load(Ordering::Relaxed)) < NEAR_CAP_QUERY_NS {
        return Ok(());
    }
    NEAR_CAP_ASKED_NS[dev].store(now, Ordering::Relaxed);
    let Some(h) = ps.device(dev).and_then(|d| driver::nvml_handle_by_uuid(&d.uuid)) else { return Ok(()) };
    let held = held_for_process(dev, h, hostpid as u32);
    let grown = policy::unseen_growth(held, ps.region.proc_used(ps.slot, dev), in_flight);
    if grown == 0 {
        return Ok(());
    }
    ps.region.charge(ps.slot, dev, MemKind::Context, grown);
    NEAR_CAP_GROWTH[dev].fetch_add(grown, Ordering::AcqRel);
    vgpu_core::debug!("device {dev}: {grown} bytes the device holds for this process beyond its charges (NVML) charged near the cap");
    let used = ps.region.device_used(dev);
    if used > limit {
        unreserve(ps, dev, bytes);
        vgpu_core::info!("{what}: {bytes} bytes on device {dev} refused: {} of {limit} bytes already used", used - bytes);
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    Ok(())
}

pub fn unreserve(ps: &ProcState, dev: usize, bytes: u64) {
    ps.region.release(ps.slot, dev, MemKind::Data, bytes);
}

// ---------------------------------------------------------------------------------------------
// VMM

pub unsafe fn mem_create(rt: &'static Runtime, real: sig::cuMemCreate, handle: *mut CUmemGenericAllocationHandle,
    size: usize, prop: *const CUmemAllocationProp, flags: u64) -> CUresult {
    let Some(ps) = rt.proc() else { return real(handle, size, prop, flags) };
    if handle.is_null() || prop.is_null() {
        return real(handle, size, prop, flags);
    }
    let p = &*prop;
    let on_device = p.type_ == CU_MEM_ALLOCATION_TYPE_PINNED && p.location.type_ == CU_MEM_LOCATION_TYPE_DEVICE;
    let Some(dev) = on_device.then(|| ps.dev_index(p.location.id)).flatten() else {
        return real(handle, size, prop, flags);
    };
    let bytes = accounted_size(size as u64);
    if let Err(e) = reserve(ps, dev, bytes, "cuMemCreate") {
        return e;
    }
    let r = real(handle, size, prop, flags);
    if r != CUDA_SUCCESS {
        unreserve(ps, dev, bytes);
        return r;
    }
    let old = ps.ledgers().phys.handles.insert(*handle, Handle { dev, bytes, refs: 1, maps: 0 });
    if let Some(o) = old {
        // A handle value reused after a release we never saw.
        unreserve(ps, o.dev, o.bytes);
    }
    r
}

/// Forget `h` and release its charge when it has neither references nor mappings left.
fn drop_if_done(ps: &ProcState, phys: &mut Phys, h: u64) {
    if let Some(x) = phys.handles.get(&h).copied().filter(|x| x.refs == 0 && x.maps == 0) {
        phys.handles.remove(&h);
        unreserve(ps, x.dev, x.bytes);
    }
}

pub unsafe fn mem_release(rt: &'static Runtime, real: sig::cuMemRelease, handle: CUmemGenericAllocationHandle) -> CUresult {
    let r = real(handle);
    let Some(ps) = rt.proc_if_ready() else { return r };
    if r == CUDA_SUCCESS {
        let mut l = ps.ledgers();
        if let Some(x) = l.phys.handles.get_mut(&handle) {
            x.refs = x.refs.saturating_sub(1);
            drop_if_done(ps, &mut l.phys, handle);
        }
    }
    r
}

pub unsafe fn mem_map(rt: &'static Runtime, real: sig::cuMemMap, ptr: CUdeviceptr, size: usize, offset: usize,
    handle: CUmemGenericAllocationHandle, flags: u64) -> CUresult {
    let r = real(ptr, size, offset, handle, flags);
    let Some(ps) = rt.proc_if_ready() else { return r };
    if r == CUDA_SUCCESS {
        let mut l = ps.ledgers();
        if let Some(x) = l.phys.handles.get_mut(&handle) {
            x.maps += 1;
            l.phys.maps.insert(ptr, (size as u64, handle));
        }
    }
    r
}

pub unsafe fn mem_unmap(rt: &'static Runtime, real: sig::cuMemUnmap, ptr: CUdeviceptr, size: usize) -> CUresult {
    let r = real(ptr, size);
    let Some(ps) = rt.proc_if_ready() else { return r };
    if r == CUDA_SUCCESS {
        let end = ptr.saturating_add(size as u64);
        let mut l = ps.ledgers();
        let gone: Vec<u64> = l.phys.maps.range(ptr..end).map(|(&a, _)| a).collect();
        for a in gone {
            let Some((_, h)) = l.phys.maps.remove(&a) else { continue };
            if let Some(x) = l.phys.handles.get_mut(&h) {
                x.maps = x.maps.saturating_sub(1);
            }
            drop_if_done(ps, &mut l.phys, h);
        }
    }
    r
}

/// A new reference on a handle we charged (`cuMemRetainAllocationHandle`, an import of our own
/// export): one more `cuMemRelease` before it can go.
fn add_ref(rt: &Runtime, handle: u64) {
    if let Some(ps) = rt.proc_if_ready() {
        if let Some(x) = ps.ledgers().phys.handles.get_mut(&handle) {
            x.refs += 1;
        }
    }
}

pub unsafe fn retain_allocation_handle(rt: &'static Runtime, real: sig::cuMemRetainAllocationHandle,
    handle: *mut CUmemGenericAllocationHandle, addr: *mut std::ffi::c_void) -> CUresult {
    let r = real(handle, addr);
    if r == CUDA_SUCCESS && !handle.is_null() {
        add_ref(rt, *handle);
    }
    r
}

pub unsafe fn import_shareable(rt: &'static Runtime, real: sig::cuMemImportFromShareableHandle,
    handle: *mut CUmemGenericAllocationHandle, os_handle: *mut std::ffi::c_void, typ: std::ffi::c_int) -> CUresult {
    let r = real(handle, os_handle, typ);
    if r == CUDA_SUCCESS && !handle.is_null() {
        add_ref(rt, *handle);
    }
    r
}

// ---------------------------------------------------------------------------------------------
// Pools

/// Remember which device a pool belongs to.
fn know_pool(ps: &ProcState, pool: CUmemoryPool, dev: usize) {
    ps.ledgers().phys.pools.entry(pool as usize).or_insert(Pool { dev, charged: 0 });
}

/// Set `pool`'s charge to what it reserves now (`extra` = bytes reserved ahead for it, which
/// become part of the charge). Call with the ledgers locked (so settles of one pool serialize).
fn settle_pool(ps: &ProcState, phys: &mut Phys, pool: usize, extra: u64) {
    let Some(p) = phys.pools.get_mut(&pool) else {
        return;
    };
    let Some(now) = driver::pool_reserved(pool as CUmemoryPool) else {
        // The driver no longer knows the pool (gone with a device reset): nothing is held.
        let p = *p;
        phys.pools.remove(&pool);
        adjust(ps, p.dev, p.charged.saturating_add(extra), 0);
        return;
    };
    adjust(ps, p.dev, p.charged.saturating_add(extra), now);
    p.charged = now;
}

/// Growth of `pool` an allocation of `bytes` may cause (none when its idle memory covers it).
fn pool_growth(pool: CUmemoryPool, bytes: u64) -> u64 {
    let reserved = driver::pool_reserved(pool).unwrap_or(0);
    let used = driver::pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT).unwrap_or(reserved);
    let idle = reserved.saturating_sub(used);
    pages(bytes).saturating_sub(idle).div_ceil(PAGE) * PAGE
}

/// Stream-ordered allocation from `pool` (device `dev`): reserve the possible growth, allocate,
/// settle the pool's charge. While `stream` captures, the driver adds an alloc node to the
/// capture graph instead (charged with the graph: `graph_*`).
/// `call` returns the driver's result and the address it wrote.
unsafe fn pool_alloc(ps: &ProcState, dev: usize, pool: CUmemoryPool, stream: CUstream, bytesize: usize, what: &str,
    call: impl FnOnce() -> (CUresult, CUdeviceptr)) -> CUresult {
    if driver::stream_capturing(stream) {
        return captured_alloc(ps, Some(dev), stream, bytesize, call);
    }
    know_pool(ps, pool, dev);
    let est = pool_growth(pool, bytesize as u64);
    if est > 0 {
        if let Err(e) = reserve(ps, dev, est, what) {
            return e;
        }
    }
    let (r, ptr) = call();
    let mut l = ps.ledgers();
    if r == CUDA_SUCCESS {
        l.phys.async_ptrs.insert(ptr, pool as usize);
    }
    settle_pool(ps, &mut l.phys, pool as usize, est);
    r
}

/// An allocation into a stream capture: the driver adds an alloc node to the capture's graph,
/// charged with the graph (`graph_*`) on `dev` when it is known.
fn captured_alloc(ps: &ProcState, dev: Option<usize>, stream: CUstream, bytesize: usize,
    call: impl FnOnce() -> (CUresult, CUdeviceptr)) -> CUresult {
    let (r, _) = call();
    if let (CUDA_SUCCESS, Some(dev)) = (r, dev) {
        ps.ledgers().phys.capture.entry(stream as usize).or_default().push((dev, pages(bytesize as u64)));
    }
    r
}

pub unsafe fn mem_alloc_async(rt: &'static Runtime, real: sig::cuMemAllocAsync, dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream) -> CUresult {
    let Some(ps) = rt.proc() else { return real(dptr, bytesize, stream) };
    if driver::stream_capturing(stream) {
        // Nothing may touch a capturing stream but the capture: asking it for its device or
        // context may invalidate the capture (an H100 failed a captured cuMemAllocAsync with
        // CUDA_ERROR_STREAM_CAPTURE_INVALIDATED even with those queries in relaxed mode; not yet
        // confirmed to be the cause). The captured allocation is on the current context's device.
        let dev = driver::with_relaxed_capture(driver::current_device).and_then(|d| ps.dev_index(d));
        return captured_alloc(ps, dev, stream, bytesize, || (real(dptr, bytesize, stream), 0));
    }
    // Our queries must not invalidate a global-mode capture another thread is running.
    let found = driver::with_relaxed_capture(|| {
        let cudev = driver::stream_device(stream, |c| known_context_device(ps, c))?;
        Some((cudev, driver::device_mem_pool(cudev)?))
    });
    let Some((cudev, pool)) = found else { return real(dptr, bytesize, stream) };
    let Some(dev) = ps.dev_index(cudev) else { return real(dptr, bytesize, stream) };
    if dptr.is_null() {
        return real(dptr, bytesize, stream);
    }
    pool_alloc(ps, dev, pool, stream, bytesize, "cuMemAllocAsync", || (real(dptr, bytesize, stream), *dptr))
}

/// The driver device of a context this process saw created (primary, created, green).
fn known_context_device(ps: &ProcState, ctx: CUcontext) -> Option<CUdevice> {
    let c = ps.contexts();
    let idx = c.created.get(&(ctx as usize)).map(|&(d, _)| d).or_else(|| c.primary_ctx.iter().position(|&p| p != 0 && p == ctx as usize))?;
    ps.device(idx).map(|d| d.handle)
}

pub unsafe fn mem_alloc_from_pool_async(rt: &'static Runtime, real: sig::cuMemAllocFromPoolAsync, dptr: *mut CUdeviceptr,
    bytesize: usize, pool: CUmemoryPool, stream: CUstream) -> CUresult {
    let Some(ps) = rt.proc() else { return real(dptr, bytesize, pool, stream) };
    // The pool says where the memory is; a pool we never saw passes through.
    let known = ps.ledgers().phys.pools.get(&(pool as usize)).map(|p| p.dev);
    let Some(dev) = known else { return real(dptr, bytesize, pool, stream) };
    if dptr.is_null() {
        return real(dptr, bytesize, pool, stream);
    }
    pool_alloc(ps, dev, pool, stream, bytesize, "cuMemAllocFromPoolAsync", || (real(dptr, bytesize, pool, stream), *dptr))
}

/// `cuMemFreeAsync` of a pool allocation: the pool keeps the memory (settled now and at the next
/// synchronize). Anything else is `memory::mem_free_async`'s.
pub fn freed_async(ps: &ProcState, ptr: CUdeviceptr) -> bool {
    let mut l = ps.ledgers();
    let Some(pool) = l.phys.async_ptrs.remove(&ptr) else { return false };
    settle_pool(ps, &mut l.phys, pool, 0);
    POOLS_DIRTY.store(true, Ordering::Relaxed);
    true
}

/// After a synchronize: pools may have given memory above their threshold back.
#[inline]
pub fn after_sync() {
    if POOLS_DIRTY.load(Ordering::Relaxed) {
        settle_all_after_sync();
    }
}

#[cold]
fn settle_all_after_sync() {
    POOLS_DIRTY.store(false, Ordering::Relaxed);
    let Some(ps) = crate::runtime::get().and_then(|rt| rt.proc_if_ready()) else { return };
    let mut l = ps.ledgers();
    let pools: Vec<usize> = l.phys.pools.keys().copied().collect();
    for p in pools {
        settle_pool(ps, &mut l.phys, p, 0);
    }
}

pub unsafe fn pool_trim(rt: &'static Runtime, real: sig::cuMemPoolTrimTo, pool: CUmemoryPool, keep: usize) -> CUresult {
    let r = real(pool, keep);
    if let Some(ps) = rt.proc_if_ready() {
        let mut l = ps.ledgers();
        settle_pool(ps, &mut l.phys, pool as usize, 0);
    }
    r
}

pub unsafe fn pool_destroy(rt: &'static Runtime, real: sig::cuMemPoolDestroy, pool: CUmemoryPool) -> CUresult {
    let r = real(pool);
    if r == CUDA_SUCCESS {
        if let Some(ps) = rt.proc_if_ready() {
            let mut l = ps.ledgers();
            if let Some(p) = l.phys.pools.remove(&(pool as usize)) {
                unreserve(ps, p.dev, p.charged);
            }
            l.phys.async_ptrs.retain(|_, p| *p != pool as usize);
        }
    }
    r
}

pub unsafe fn pool_create(rt: &'static Runtime, real: sig::cuMemPoolCreate, pool: *mut CUmemoryPool, props: *const CUmemPoolPropsHead) -> CUresult {
    let r = real(pool, props);
    if r == CUDA_SUCCESS && !pool.is_null() && !props.is_null() {
        let p = &*props;
        if let Some(ps) = rt.proc() {
            if p.location.type_ == CU_MEM_LOCATION_TYPE_DEVICE {
                if let Some(dev) = ps.dev_index(p.location.id) {
                    know_pool(ps, *pool, dev);
                }
            }
        }
    }
    r
}

/// `cuDeviceGetDefaultMemPool` / `cuDeviceGetMemPool`: remember the pool's device.
pub unsafe fn device_pool(rt: &'static Runtime, real: unsafe extern "C" fn(*mut CUmemoryPool, CUdevice) -> CUresult,
    pool: *mut CUmemoryPool, dev: CUdevice) -> CUresult {
    let r = real(pool, dev);
    if r == CUDA_SUCCESS && !pool.is_null() {
        if let Some(ps) = rt.proc() {
            if let Some(d) = ps.dev_index(dev) {
                know_pool(ps, *pool, d);
            }
        }
    }
    r
}

/// Settle every pool and the graph memory of device `dev` (its primary context went: a reset
/// may have freed them).
pub fn settle_device(ps: &ProcState, dev: usize) {
    let mut l = ps.ledgers();
    let pools: Vec<usize> = l.phys.pools.iter().filter(|(_, p)| p.dev == dev).map(|(&k, _)| k).collect();
    for p in pools {
        settle_pool(ps, &mut l.phys, p, 0);
    }
    settle_graph(ps, &mut l.phys, dev);
}

// ---------------------------------------------------------------------------------------------
// Graph memory

/// Set device `dev`'s graph memory charge to max(live executables, the graph pool's reserve).
fn settle_graph(ps: &ProcState, phys: &mut Phys, dev: usize) {
    let reserved = ps.device(dev).and_then(|d| driver::graph_mem_reserved(d.handle)).unwrap_or(0);
    let to = phys.graph_live[dev].max(reserved);
    adjust(ps, dev, phys.graph_charged[dev], to);
    phys.graph_charged[dev] = to;
}

pub unsafe fn end_capture(rt: &'static Runtime, real: sig::cuStreamEndCapture, stream: CUstream, graph: *mut CUgraph) -> CUresult {
    let r = real(stream, graph);
    if let Some(ps) = rt.proc_if_ready() {
        let mut l = ps.ledgers();
        let nodes = l.phys.capture.remove(&(stream as usize));
        if let (CUDA_SUCCESS, false, Some(nodes)) = (r, graph.is_null(), nodes) {
            l.phys.graphs.entry(*graph as usize).or_default().extend(nodes);
        }
    }
    r
}

pub unsafe fn add_mem_alloc_node(rt: &'static Runtime, real: sig::cuGraphAddMemAllocNode, node: *mut CUgraphNode, graph: CUgraph,
    deps: *const CUgraphNode, ndeps: usize, params: *mut CUDA_MEM_ALLOC_NODE_PARAMS) -> CUresult {
    let r = real(node, graph, deps, ndeps, params);
    if r == CUDA_SUCCESS && !params.is_null() {
        let p = &*params;
        if let Some(ps) = rt.proc() {
            if p.pool_props.location.type_ == CU_MEM_LOCATION_TYPE_DEVICE {
                if let Some(dev) = ps.dev_index(p.pool_props.location.id) {
                    ps.ledgers().phys.graphs.entry(graph as usize).or_default().push((dev, pages(p.bytesize as u64)));
                }
            }
        }
    }
    r
}

pub unsafe fn graph_destroy(rt: &'static Runtime, real: sig::cuGraphDestroy, graph: CUgraph) -> CUresult {
    let r = real(graph);
    if let (CUDA_SUCCESS, Some(ps)) = (r, rt.proc_if_ready()) {
        ps.ledgers().phys.graphs.remove(&(graph as usize));
    }
    r
}

/// Instantiation of a graph with alloc nodes: charge what its launches will need before the
/// driver call (`CUDA_ERROR_OUT_OF_MEMORY` when it does not fit), keep it while it lives.
unsafe fn instantiate(ps: &ProcState, exec: *mut CUgraphExec, graph: CUgraph, call: impl FnOnce() -> CUresult) -> CUresult {
    let nodes = ps.ledgers().phys.graphs.get(&(graph as usize)).cloned().unwrap_or_default();
    if nodes.is_empty() || exec.is_null() {
        return call();
    }
    let mut per_dev = [0u64; MAX_DEVICES];
    for &(d, b) in &nodes {
        per_dev[d] = per_dev[d].saturating_add(b);
    }
    // Reserve the growth of each device's charge; settle right after.
    let mut reserved: Vec<(usize, u64)> = Vec::new();
    for (d, &b) in per_dev.iter().enumerate().filter(|(_, &b)| b > 0) {
        let grow = {
            let l = ps.ledgers();
            (l.phys.graph_live[d] + b).saturating_sub(l.phys.graph_charged[d])
        };
        let res = if grow > 0 { reserve(ps, d, grow, "cuGraphInstantiate (graph memory)") } else { Ok(()) };
        if let Err(e) = res {
            for (d, g) in reserved {
                unreserve(ps, d, g);
            }
            return e;
        }
        reserved.push((d, grow));
    }
    let r = call();
    let mut l = ps.ledgers();
    for (d, g) in reserved {
        let charged = l.phys.graph_charged[d];
        if r == CUDA_SUCCESS {
            l.phys.graph_live[d] += per_dev[d];
        }
        l.phys.graph_charged[d] = charged + g;
        settle_graph(ps, &mut l.phys, d);
    }
    if r == CUDA_SUCCESS {
        l.phys.execs.insert(*exec as usize, nodes);
    }
    r
}

pub unsafe fn graph_instantiate_with_flags(rt: &'static Runtime, real: sig::cuGraphInstantiateWithFlags, exec: *mut CUgraphExec,
    graph: CUgraph, flags: u64) -> CUresult {
    let Some(ps) = rt.proc() else { return real(exec, graph, flags) };
    instantiate(ps, exec, graph, || real(exec, graph, flags))
}

pub unsafe fn graph_instantiate_v2(rt: &'static Runtime, real: sig::cuGraphInstantiate_v2, exec: *mut CUgraphExec, graph: CUgraph,
    err_node: *mut CUgraphNode, log: *mut std::ffi::c_char, log_size: usize) -> CUresult {
    let Some(ps) = rt.proc() else { return real(exec, graph, err_node, log, log_size) };
    instantiate(ps, exec, graph, || real(exec, graph, err_node, log, log_size))
}

pub unsafe fn graph_instantiate_with_params(rt: &'static Runtime, real: sig::cuGraphInstantiateWithParams, exec: *mut CUgraphExec,
    graph: CUgraph, params: *mut std::ffi::c_void) -> CUresult {
    let Some(ps) = rt.proc() else { return real(exec, graph, params) };
    instantiate(ps, exec, graph, || real(exec, graph, params))
}

pub unsafe fn graph_exec_destroy(rt: &'static Runtime, real: sig::cuGraphExecDestroy, exec: CUgraphExec) -> CUresult {
    let r = real(exec);
    if let (CUDA_SUCCESS, Some(ps)) = (r, rt.proc_if_ready()) {
        let mut l = ps.ledgers();
        if let Some(nodes) = l.phys.execs.remove(&(exec as usize)) {
            let mut devs = Vec::new();
            for (d, b) in nodes {
                l.phys.graph_live[d] = l.phys.graph_live[d].saturating_sub(b);
                devs.push(d);
            }
            devs.dedup();
            for d in devs {
                settle_graph(ps, &mut l.phys, d);
            }
        }
    }
    r
}

pub unsafe fn graph_mem_trim(rt: &'static Runtime, real: sig::cuDeviceGraphMemTrim, dev: CUdevice) -> CUresult {
    let r = real(dev);
    if let Some(ps) = rt.proc_if_ready() {
        if let Some(d) = ps.dev_index(dev) {
            let mut l = ps.ledgers();
            settle_graph(ps, &mut l.phys, d);
        }
    }
    r
}

// ---------------------------------------------------------------------------------------------
// At the cap

/// Trim this process's pools and graph memory on `dev`; whether anything was charged to trim.
pub fn trim_own(ps: &ProcState, dev: usize) -> bool {
    let mut l = ps.ledgers();
    let pools: Vec<usize> = l.phys.pools.iter().filter(|(_, p)| p.dev == dev && p.charged > 0).map(|(&k, _)| k).collect();
    let graph = l.phys.graph_charged[dev] > l.phys.graph_live[dev];
    for &p in &pools {
        driver::pool_trim(p as CUmemoryPool, 0);
        settle_pool(ps, &mut l.phys, p, 0);
    }
    if graph {
        if let Some(d) = ps.device(dev) {
            driver::graph_mem_trim(d.handle);
        }
        settle_graph(ps, &mut l.phys, dev);
    }
    !pools.is_empty() || graph
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn pages_round_to_2mib() {
        assert_eq!(pages(1), PAGE);
        assert_eq!(pages(PAGE), PAGE);
        assert_eq!(pages(PAGE + 1), 2 * PAGE);
    }
}
