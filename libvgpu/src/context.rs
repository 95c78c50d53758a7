//! Context lifetime and context memory.
//!
//! Every context costs device memory (about 0.5 GiB on an H200) that the host sees as the
//! process's usage, so each is charged against the cap as `MemKind::Context` while it lives: a
//! primary context from its first retain to its last release (or reset), every created context
//! (`cuCtxCreate*`) and green context (`cuGreenCtxCreate`) from creation to destruction. The
//! charge is measured: under the region's device lock we read NVML, create the context, read it
//! again. NVML's figure for this very process (when it lists our PID: shared PID namespace) gives
//! the exact difference even while other processes allocate; else the device's used memory
//! (rounded up to 2 MiB, at most 4 GiB); else (no NVML, implausible difference)
//! `VGPU_CONTEXT_RESERVE` (default 512 MiB). A context that does not fit under a cap that could
//! hold it is given back and refused with `CUDA_ERROR_OUT_OF_MEMORY`, as a full GPU answers.
//! Destroying a context releases its charge and every allocation recorded in it (the driver frees
//! them with the context).

use crate::driver;
use crate::ffi::*;
use crate::sys::sig;
use crate::memory::drain_ctx;
use crate::runtime::{ProcState, Runtime};
use std::ffi::{c_char, c_int, c_uint, c_void};
use vgpu_core::policy::context::{self as policy, Contexts, Refused};
use vgpu_core::region::MemKind;

/// `cuInit`: after a successful driver init, register in the region right away (so monitors see
/// the process and the devices are recorded before the first allocation).
pub unsafe fn init(rt: &'static Runtime, real: sig::cuInit, flags: c_uint) -> CUresult {
    let r = real(flags);
    if r == CUDA_SUCCESS {
        let _ = rt.proc();
    }
    r
}

/// Create a context on `dev` through `create` (returns the driver result) and charge its memory.
/// `on_success` records it with the bytes charged. A context that does not fit under a cap that
/// could hold it (others filled it) is given back with `undo` and refused with
/// `CUDA_ERROR_OUT_OF_MEMORY`, as the driver answers when a full GPU has no room for one:
/// processes and contexts starting late cannot push the container over its cap.
fn with_context_charge(rt: &Runtime, ps: &ProcState, dev: usize, create: impl FnOnce() -> CUresult,
    undo: impl FnOnce(), on_success: impl FnOnce(&mut Contexts, u64)) -> CUresult {
    // Measure under the device lock so no other process of the container changes the device's
    // usage meanwhile through us.
    let guard = match ps.region.lock_device_for(dev, ps.slot) {
        Ok(g) => Some(g),
        Err(e) => {
            vgpu_core::warn!("context on device {dev}: device lock failed ({e}); charging without it");
            None
        }
    };
    let info = ps.device(dev);
    let read = usage_reader(ps, dev);
    let (own_before, before, procs) = read();
    if own_before.is_none() {
        // This process's first context on `dev`: the base its holdings are measured from.
        crate::physmem::note_device_base(dev, procs, before);
    }
    let r = create();
    if r != CUDA_SUCCESS {
        return r;
    }
    let (own_after, after, _) = read();
    let default = rt.config.context_reserve(info.map_or(0, |d| d.physical_total));
    // Best source: NVML's per-process figure for this very process, when NVML lists our PID
    // (shared PID namespace: the host PID is ours).
    let own = policy::own_growth(own_before, own_after);
    let charge = policy::charge(own, before, after, default);
    if charge.own {
        ps.region.set_hostpid(ps.slot, ps.pid as i32);
    }
    let bytes = charge.bytes;
    match &guard {
        Some(g) => match g.try_reserve(ps.slot, MemKind::Context, bytes) {
            Ok(()) => {}
            Err(e) => match policy::on_refused(bytes, &e) {
                Refused::ChargeAnyway => g.charge(ps.slot, MemKind::Context, bytes),
                Refused::OutOfMemory => {
                    drop(guard);
                    undo();
                    vgpu_core::info!("device {dev}: a new context ({bytes} bytes) does not fit under the cap ({e}): CUDA_ERROR_OUT_OF_MEMORY");
                    return CUDA_ERROR_OUT_OF_MEMORY;
                }
            },
        },
        None => charge_unlocked(ps, dev, bytes),
    }
    drop(guard);
    on_success(&mut ps.contexts(), bytes);
    vgpu_core::debug!("device {dev}: context charged {bytes} bytes (NVML before {before:?}, after {after:?})");
    r
}

/// Reads, each time it is called, what NVML says this process and device `dev` hold: (this
/// process's figure when NVML lists our PID, the device's used memory, how many compute processes
/// NVML lists there), from one process list. Read before and after a context creation or a
/// module load to measure it.
fn usage_reader(ps: &ProcState, dev: usize) -> impl Fn() -> (Option<u64>, Option<u64>, Option<usize>) + '_ {
    let nvml = ps.device(dev).and_then(|d| driver::nvml_handle_by_uuid(&d.uuid));
    move || {
        let procs = nvml.and_then(driver::nvml_compute_processes);
        let own = procs.as_deref().and_then(|l| driver::nvml_process_used(l, ps.pid));
        (own, nvml.and_then(driver::nvml_used), procs.map(|l| l.len()))
    }
}

fn charge_unlocked(ps: &ProcState, dev: usize, bytes: u64) {
    // The memory exists already: charge it without the lock (a lock-free add).
    ps.region.charge(ps.slot, dev, MemKind::Context, bytes);
}

/// A context went: release its charge, its modules' and everything allocated in it.
fn context_gone(ps: &ProcState, dev: usize, ctx: u64, bytes: u64) {
    ps.region.release(ps.slot, dev, MemKind::Context, bytes);
    let modules = ps.contexts().drain_modules(ctx);
    for (d, b) in modules {
        ps.region.release(ps.slot, d, MemKind::Context, b);
    }
    drain_ctx(ps, ctx);
    vgpu_core::debug!("device {dev}: context destroyed, released {bytes} bytes of context memory and its allocations");
}

/// After a primary context reference went away (every one with `reset`): when none is left, the
/// primary context is gone.
fn release_primary(ps: &ProcState, dev: usize, reset: bool) {
    let released = ps.contexts().primary_released(dev, reset);
    if let Some((bytes, ctx)) = released {
        crate::linger::forget(ctx as CUcontext);
        context_gone(ps, dev, ctx as u64, bytes);
        crate::physmem::settle_device(ps, dev);
    }
}

// ---------------------------------------------------------------------------------------------
// Primary contexts

pub unsafe fn primary_retain(rt: &'static Runtime, real: sig::cuDevicePrimaryCtxRetain, pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    let Some(ps) = rt.proc() else { return real(pctx, dev) };
    let Some(d) = ps.dev_index(dev) else { return real(pctx, dev) };
    let undo = || {
        // The driver's own release for the reference `real` just took.
        driver::primary_ctx_release(dev);
        if !pctx.is_null() {
            unsafe { *pctx = std::ptr::null_mut() };
        }
    };
    let record = |c: &mut Contexts, bytes: u64| {
        // SAFETY: the driver wrote the primary context on success.
        let ctx = (!pctx.is_null()).then(|| unsafe { *pctx } as usize);
        c.primary_retained(d, bytes, ctx);
    };
    if !ps.contexts().primary_needs_charge(d) {
        // The primary context exists: a reference costs nothing.
        let r = real(pctx, dev);
        if r == CUDA_SUCCESS {
            record(&mut ps.contexts(), 0);
        }
        return r;
    }
    with_context_charge(rt, ps, d, || real(pctx, dev), undo, record)
}

pub unsafe fn primary_release(rt: &'static Runtime, real: sig::cuDevicePrimaryCtxRelease_v2, dev: CUdevice) -> CUresult {
    crate::linger::end_spins();
    let r = real(dev);
    if r != CUDA_SUCCESS {
        return r;
    }
    let Some(ps) = rt.proc_if_ready() else { return r };
    let Some(d) = ps.dev_index(dev) else { return r };
    release_primary(ps, d, false);
    r
}

pub unsafe fn primary_reset(rt: &'static Runtime, real: sig::cuDevicePrimaryCtxReset_v2, dev: CUdevice) -> CUresult {
    crate::linger::end_spins();
    let r = real(dev);
    if r != CUDA_SUCCESS {
        return r;
    }
    let Some(ps) = rt.proc_if_ready() else { return r };
    let Some(d) = ps.dev_index(dev) else { return r };
    release_primary(ps, d, true);
    r
}

// ---------------------------------------------------------------------------------------------
// Created contexts (every exported ABI)

unsafe fn created(rt: &'static Runtime, pctx: *mut CUcontext, dev: CUdevice, create: impl FnOnce() -> CUresult) -> CUresult {
    let Some(ps) = rt.proc() else { return create() };
    let Some(d) = ps.dev_index(dev) else { return create() };
    if pctx.is_null() {
        return create();
    }
    let undo = || {
        // SAFETY: the driver just created the context and wrote it to `pctx`.
        driver::ctx_destroy(unsafe { *pctx });
        unsafe { *pctx = std::ptr::null_mut() };
    };
    with_context_charge(rt, ps, d, create, undo, |c, bytes| {
        // SAFETY: the driver wrote the new context on success.
        let ctx = unsafe { *pctx } as usize;
        c.created.insert(ctx, (d, bytes));
    })
}

pub unsafe fn ctx_create_v1(rt: &'static Runtime, real: sig::cuCtxCreate, pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult {
    created(rt, pctx, dev, || real(pctx, flags, dev))
}

pub unsafe fn ctx_create_v2(rt: &'static Runtime, real: sig::cuCtxCreate_v2, pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult {
    created(rt, pctx, dev, || real(pctx, flags, dev))
}

pub unsafe fn ctx_create_v3(rt: &'static Runtime, real: sig::cuCtxCreate_v3, pctx: *mut CUcontext, params: *mut CUexecAffinityParam,
    num_params: c_int, flags: c_uint, dev: CUdevice) -> CUresult {
    created(rt, pctx, dev, || real(pctx, params, num_params, flags, dev))
}

pub unsafe fn ctx_create_v4(rt: &'static Runtime, real: sig::cuCtxCreate_v4, pctx: *mut CUcontext, params: *mut CUctxCreateParams,
    flags: c_uint, dev: CUdevice) -> CUresult {
    created(rt, pctx, dev, || real(pctx, params, flags, dev))
}

pub unsafe fn ctx_destroy(rt: &'static Runtime, real: sig::cuCtxDestroy_v2, ctx: CUcontext) -> CUresult {
    // Our spins end and our objects in it are forgotten first: they go with the context.
    crate::linger::forget(ctx);
    let r = real(ctx);
    if r != CUDA_SUCCESS {
        return r;
    }
    let Some(ps) = rt.proc_if_ready() else { return r };
    let gone = ps.contexts().created.remove(&(ctx as usize));
    if let Some((d, bytes)) = gone {
        context_gone(ps, d, ctx as u64, bytes);
    }
    r
}

// ---------------------------------------------------------------------------------------------
// Green contexts (CUDA 12.4+): contexts of their own, charged like created ones

pub unsafe fn green_create(rt: &'static Runtime, real: sig::cuGreenCtxCreate, pctx: *mut CUgreenCtx, desc: CUdevResourceDesc,
    dev: CUdevice, flags: c_uint) -> CUresult {
    // A context synchronize waits for a green context's work, which `streams` does not follow.
    crate::streams::green_context_made();
    let Some(ps) = rt.proc() else { return real(pctx, desc, dev, flags) };
    let Some(d) = ps.dev_index(dev) else { return real(pctx, desc, dev, flags) };
    if pctx.is_null() {
        return real(pctx, desc, dev, flags);
    }
    let undo = || {
        // SAFETY: the driver just created the green context and wrote it to `pctx`.
        driver::green_ctx_destroy(unsafe { *pctx });
        unsafe { *pctx = std::ptr::null_mut() };
    };
    with_context_charge(rt, ps, d, || real(pctx, desc, dev, flags), undo, |c, bytes| {
        // SAFETY: the driver wrote the new green context on success.
        c.created.insert(unsafe { *pctx } as usize, (d, bytes));
    })
}

pub unsafe fn green_destroy(rt: &'static Runtime, real: sig::cuGreenCtxDestroy, green: CUgreenCtx) -> CUresult {
    // Its allocations were made in its context (cuCtxFromGreenCtx), known only while it lives.
    let ctx = driver::green_ctx_context(green).map_or(0, |c| c as u64);
    if ctx != 0 {
        crate::linger::forget(ctx as CUcontext);
    }
    let r = real(green);
    if r != CUDA_SUCCESS {
        return r;
    }
    let Some(ps) = rt.proc_if_ready() else { return r };
    let gone = ps.contexts().created.remove(&(green as usize));
    if let Some((d, bytes)) = gone {
        context_gone(ps, d, policy::green_alloc_ctx(ctx, green as u64), bytes);
    }
    r
}

// ---------------------------------------------------------------------------------------------
// Modules: a load makes the device hold the module's code and globals, and a context grows at its
// first load (an H100's primary context from 518 to 537 MiB). Charged with the load as context
// memory, measured like a context (NVML before and after; no lock: a JIT compile may take
// seconds), until the module is unloaded or its context destroyed.

fn with_module_charge(rt: &Runtime, module: *mut CUmodule, load: impl FnOnce() -> CUresult) -> CUresult {
    let Some(ps) = rt.proc() else { return load() };
    let Some(dev) = driver::current_device().and_then(|d| ps.dev_index(d)) else { return load() };
    let read = usage_reader(ps, dev);
    let (own_before, before, _) = read();
    let r = load();
    if r != CUDA_SUCCESS || module.is_null() {
        return r;
    }
    let (own_after, after, _) = read();
    let bytes = policy::module_charge(own_before, own_after, before, after);
    if bytes > 0 {
        // The memory is held already: charge it (over the cap, later allocations are refused).
        ps.region.charge(ps.slot, dev, MemKind::Context, bytes);
        // SAFETY: the driver wrote the module on success.
        let m = unsafe { *module } as usize;
        ps.contexts().modules.insert(m, (dev, bytes, driver::current_context()));
        vgpu_core::debug!("device {dev}: module load charged {bytes} bytes");
    }
    r
}

pub unsafe fn module_load(rt: &'static Runtime, real: sig::cuModuleLoad, module: *mut CUmodule, fname: *const c_char) -> CUresult {
    with_module_charge(rt, module, || real(module, fname))
}

pub unsafe fn module_load_data(rt: &'static Runtime, real: sig::cuModuleLoadData, module: *mut CUmodule, image: *const c_void) -> CUresult {
    with_module_charge(rt, module, || real(module, image))
}

pub unsafe fn module_load_data_ex(rt: &'static Runtime, real: sig::cuModuleLoadDataEx, module: *mut CUmodule, image: *const c_void,
    num_options: c_uint, options: *mut c_int, values: *mut *mut c_void) -> CUresult {
    with_module_charge(rt, module, || real(module, image, num_options, options, values))
}

pub unsafe fn module_load_fat_binary(rt: &'static Runtime, real: sig::cuModuleLoadFatBinary, module: *mut CUmodule, fat_cubin: *const c_void) -> CUresult {
    with_module_charge(rt, module, || real(module, fat_cubin))
}

pub unsafe fn module_unload(rt: &'static Runtime, real: sig::cuModuleUnload, module: CUmodule) -> CUresult {
    // It waits for the context's work: not for a spin.
    crate::linger::end_spins();
    let r = real(module);
    if r != CUDA_SUCCESS {
        return r;
    }
    let Some(ps) = rt.proc_if_ready() else { return r };
    let gone = ps.contexts().modules.remove(&(module as usize));
    if let Some((dev, bytes, _)) = gone {
        ps.region.release(ps.slot, dev, MemKind::Context, bytes);
    }
    r
}
