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
use std::ffi::{c_int, c_uint};
use vgpu_core::ledger::accounted_size;
use vgpu_core::region::{MemKind, ReserveError};

/// Largest context charge we believe a measurement for.
const MAX_CONTEXT_BYTES: u64 = 4 << 30;

/// `cuInit`: after a successful driver init, register in the region right away (so monitors see
/// the process and the devices are recorded before the first allocation).
pub unsafe fn init(rt: &'static Runtime, real: sig::cuInit, flags: c_uint) -> CUresult {
    let r = real(flags);
    if r == CUDA_SUCCESS {
        let _ = rt.proc();
    }
    r
}

/// Bytes to charge for a context given NVML readings around its creation.
pub fn context_charge(before: Option<u64>, after: Option<u64>, default: u64) -> u64 {
    match (before, after) {
        (Some(b), Some(a)) if a >= b && a - b <= MAX_CONTEXT_BYTES => accounted_size(a - b),
        _ => accounted_size(default),
    }
}

/// Create a context on `dev` through `create` (returns the driver result) and charge its memory.
/// `on_success` records it with the bytes charged. A context that does not fit under a cap that
/// could hold it (others filled it) is given back with `undo` and refused with
/// `CUDA_ERROR_OUT_OF_MEMORY`, as the driver answers when a full GPU has no room for one:
/// processes and contexts starting late cannot push the container over its cap.
fn with_context_charge(rt: &Runtime, ps: &ProcState, dev: usize, create: impl FnOnce() -> CUresult,
    undo: impl FnOnce(), on_success: impl FnOnce(&mut crate::runtime::Contexts, u64)) -> CUresult {
    // Measure under the device lock so no other process of the container changes the device's
    // usage meanwhile through us.
    let guard = match ps.region.lock_device(dev) {
        Ok(g) => Some(g),
        Err(e) => {
            vgpu_core::warn!("context on device {dev}: device lock failed ({e}); charging without it");
            None
        }
    };
    let info = ps.device(dev);
    let nvml = info.and_then(|d| driver::nvml_handle_by_uuid(&d.uuid));
    let before = nvml.and_then(driver::nvml_used);
    let own_before = nvml.and_then(|h| driver::nvml_process_used(h, ps.pid));
    let r = create();
    if r != CUDA_SUCCESS {
        return r;
    }
    let after = nvml.and_then(driver::nvml_used);
    let default = rt.config.context_reserve(info.map_or(0, |d| d.physical_total));
    // Best source: NVML's per-process figure for this very process (exact, immune to other
    // tenants), available when NVML lists our PID (shared PID namespace); not listed before the
    // process's first context on the device: nothing held there yet.
    let own = nvml
        .and_then(|h| driver::nvml_process_used(h, ps.pid))
        .map(|a| a.saturating_sub(own_before.unwrap_or(0)))
        .filter(|&b| b <= MAX_CONTEXT_BYTES);
    let bytes = match own {
        Some(b) => {
            ps.region.set_hostpid(ps.slot, ps.pid as i32);
            accounted_size(b)
        }
        None => context_charge(before, after, default),
    };
    match &guard {
        Some(g) => match g.try_reserve(ps.slot, MemKind::Context, bytes) {
            Ok(()) => {}
            // A cap smaller than one context (a fail-closed 0 included) can never hold it:
            // charge it anyway and let every allocation be refused, rather than fail the
            // program before it can even ask the device anything.
            Err(ReserveError::OverLimit { limit, .. }) if bytes > limit => g.charge(ps.slot, MemKind::Context, bytes),
            Err(e) => {
                drop(guard);
                undo();
                vgpu_core::info!("device {dev}: a new context ({bytes} bytes) does not fit under the cap ({e}): CUDA_ERROR_OUT_OF_MEMORY");
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
        },
        None => charge_unlocked(ps, dev, bytes),
    }
    drop(guard);
    on_success(&mut ps.contexts(), bytes);
    vgpu_core::debug!("device {dev}: context charged {bytes} bytes (NVML before {before:?}, after {after:?})");
    r
}

fn charge_unlocked(ps: &ProcState, dev: usize, bytes: u64) {
    // The memory exists already: charge it without the lock (a lock-free add).
    ps.region.charge(ps.slot, dev, MemKind::Context, bytes);
}

/// A context went: release its charge and everything allocated in it.
fn context_gone(ps: &ProcState, dev: usize, ctx: u64, bytes: u64) {
    ps.region.release(ps.slot, dev, MemKind::Context, bytes);
    drain_ctx(ps, ctx);
    vgpu_core::debug!("device {dev}: context destroyed, released {bytes} bytes of context memory and its allocations");
}

/// After a primary context reference went away: when none is left, the primary context is gone.
fn maybe_release_primary(ps: &ProcState, dev: usize) {
    let released = {
        let mut c = ps.contexts();
        if c.primary_refs[dev] > 0 || !c.active[dev] {
            None
        } else {
            c.active[dev] = false;
            Some((std::mem::take(&mut c.charged[dev]), std::mem::take(&mut c.primary_ctx[dev])))
        }
    };
    if let Some((bytes, ctx)) = released {
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
    let record = |c: &mut crate::runtime::Contexts, bytes: u64| {
        c.primary_refs[d] = c.primary_refs[d].saturating_add(1);
        c.charged[d] = c.charged[d].saturating_add(bytes);
        c.active[d] = true;
        if !pctx.is_null() {
            // SAFETY: the driver wrote the primary context on success.
            c.primary_ctx[d] = unsafe { *pctx } as usize;
        }
    };
    if ps.contexts().primary_refs[d] > 0 {
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
    let r = real(dev);
    if r != CUDA_SUCCESS {
        return r;
    }
    let Some(ps) = rt.proc_if_ready() else { return r };
    let Some(d) = ps.dev_index(dev) else { return r };
    {
        let mut c = ps.contexts();
        c.primary_refs[d] = c.primary_refs[d].saturating_sub(1);
    }
    maybe_release_primary(ps, d);
    r
}

pub unsafe fn primary_reset(rt: &'static Runtime, real: sig::cuDevicePrimaryCtxReset_v2, dev: CUdevice) -> CUresult {
    let r = real(dev);
    if r != CUDA_SUCCESS {
        return r;
    }
    let Some(ps) = rt.proc_if_ready() else { return r };
    let Some(d) = ps.dev_index(dev) else { return r };
    ps.contexts().primary_refs[d] = 0;
    maybe_release_primary(ps, d);
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
    let r = real(green);
    if r != CUDA_SUCCESS {
        return r;
    }
    let Some(ps) = rt.proc_if_ready() else { return r };
    let gone = ps.contexts().created.remove(&(green as usize));
    if let Some((d, bytes)) = gone {
        context_gone(ps, d, alloc_ctx(ctx, green), bytes);
    }
    r
}

/// The context whose allocations a green context's destruction frees (its own handle when the
/// driver could not say).
fn alloc_ctx(ctx: u64, green: CUgreenCtx) -> u64 {
    if ctx != 0 { ctx } else { green as u64 }
}

#[cfg(test)]
mod tests {
    use super::*;
    const MIB: u64 = 1 << 20;

    #[test]
    fn charge_rules() {
        assert_eq!(context_charge(Some(100 * MIB), Some(620 * MIB), 512 * MIB), 520 * MIB);
        assert_eq!(context_charge(Some(0), Some(3 * MIB), 512 * MIB), 4 * MIB); // 2 MiB pages
        assert_eq!(context_charge(Some(5), Some(5), 512 * MIB), 0); // measured nothing
        assert_eq!(context_charge(None, Some(5), 512 * MIB), 512 * MIB); // no NVML
        assert_eq!(context_charge(Some(10 * MIB), Some(MIB), 512 * MIB), 512 * MIB); // negative
        assert_eq!(context_charge(Some(0), Some(8 << 30), 512 * MIB), 512 * MIB); // implausible
    }
}
