//! Context lifetime and context memory.
//!
//! A context costs device memory (about 0.5 GiB on an H200) that the host sees as the process's
//! usage, so it is charged against the cap as `MemKind::Context`: when the first context of this
//! process appears on a device (primary retain or `cuCtxCreate*`), we take the region's device
//! lock, read the device's used memory from NVML, create the context, read it again and charge the
//! difference (rounded up to 2 MiB, at most 4 GiB). When NVML lists this process's own PID (shared
//! PID namespace) its per-process figure is used instead: exact even while other processes
//! allocate or free during the measurement (it also records the host PID in the region). Without NVML, or when the difference is not
//! plausible (negative: someone else freed memory meanwhile), `VGPU_CONTEXT_RESERVE` (default
//! 512 MiB) is charged instead. The charge is unconditional (the memory exists already) and is
//! released, together with every allocation still recorded on that device (the driver freed
//! them with the context), when the last context of the device goes away. Context creation is
//! never refused.

use crate::driver;
use crate::ffi::*;
use crate::hooks::table::sig;
use crate::memory::{dev_index, drain_device};
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

/// Create a context through `create` (returns the driver result), charging context memory if it
/// is the first context of this process on `dev`. `on_success` records the new reference.
/// A context that does not fit under a cap that could hold it (others filled it) is given back
/// with `undo` and refused with `CUDA_ERROR_OUT_OF_MEMORY`, as the driver answers when a full
/// GPU has no room for one: processes starting late cannot push the container over its cap.
fn with_first_context_charge(rt: &Runtime, ps: &ProcState, dev: usize, create: impl FnOnce() -> CUresult,
    undo: impl FnOnce(), on_success: impl FnOnce(&mut crate::runtime::Contexts)) -> CUresult {
    if ps.contexts().active[dev] {
        let r = create();
        if r == CUDA_SUCCESS {
            on_success(&mut ps.contexts());
        }
        return r;
    }
    // First context on this device (as far as we know): measure under the device lock so no
    // other process of the container changes the device's usage meanwhile through us.
    let guard = match ps.region.lock_device(dev) {
        Ok(g) => Some(g),
        Err(e) => {
            vgpu_core::warn!("context on device {dev}: device lock failed ({e}); charging without it");
            None
        }
    };
    if ps.contexts().active[dev] {
        // Another thread charged it while we waited for the lock.
        drop(guard);
        let r = create();
        if r == CUDA_SUCCESS {
            on_success(&mut ps.contexts());
        }
        return r;
    }
    let info = ps.device(dev);
    let nvml = info.and_then(|d| driver::nvml_handle_by_uuid(&d.uuid));
    let before = nvml.and_then(driver::nvml_used);
    let r = create();
    if r != CUDA_SUCCESS {
        return r;
    }
    let after = nvml.and_then(driver::nvml_used);
    let default = rt.config.context_reserve(info.map_or(0, |d| d.physical_total));
    // Best source: NVML's per-process figure for this very process (exact, immune to other
    // tenants), available when NVML lists our PID (shared PID namespace). The process holds
    // nothing else on this device yet, this being its first context there.
    let own = nvml.and_then(|h| driver::nvml_process_used(h, ps.pid)).filter(|&b| b <= MAX_CONTEXT_BYTES);
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
    let mut c = ps.contexts();
    c.active[dev] = true;
    c.charged[dev] = bytes;
    on_success(&mut c);
    drop(c);
    vgpu_core::debug!(
        "device {dev}: first context charged {bytes} bytes (NVML before {before:?}, after {after:?})"
    );
    r
}

fn charge_unlocked(ps: &ProcState, dev: usize, bytes: u64) {
    // The memory exists already: charge it without the lock (a lock-free add).
    ps.region.charge(ps.slot, dev, MemKind::Context, bytes);
}

/// After a context reference went away: if none is left on `dev`, release the context charge and
/// everything still recorded on the device.
fn maybe_release_device(ps: &ProcState, dev: usize) {
    let released = {
        let mut c = ps.contexts();
        if c.live_on(dev) || !c.active[dev] {
            None
        } else {
            c.active[dev] = false;
            Some(std::mem::take(&mut c.charged[dev]))
        }
    };
    if let Some(bytes) = released {
        ps.region.release(ps.slot, dev, MemKind::Context, bytes);
        drain_device(ps, dev);
        vgpu_core::debug!("device {dev}: last context gone, released {bytes} bytes of context memory");
    }
}

// ---------------------------------------------------------------------------------------------
// Primary contexts

pub unsafe fn primary_retain(rt: &'static Runtime, real: sig::cuDevicePrimaryCtxRetain, pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    let Some(ps) = rt.proc() else { return real(pctx, dev) };
    let Some(d) = dev_index(ps, dev) else { return real(pctx, dev) };
    let undo = || {
        if let Some(f) = crate::hooks::table::real::cuDevicePrimaryCtxRelease_v2.get() {
            // SAFETY: the driver's own release for the reference `real` just took.
            let f: sig::cuDevicePrimaryCtxRelease_v2 = unsafe { std::mem::transmute(f) };
            unsafe { f(dev) };
        }
        if !pctx.is_null() {
            unsafe { *pctx = std::ptr::null_mut() };
        }
    };
    with_first_context_charge(rt, ps, d, || real(pctx, dev), undo, |c| c.primary_refs[d] = c.primary_refs[d].saturating_add(1))
}

pub unsafe fn primary_release(rt: &'static Runtime, real: sig::cuDevicePrimaryCtxRelease_v2, dev: CUdevice) -> CUresult {
    let r = real(dev);
    if r != CUDA_SUCCESS {
        return r;
    }
    let Some(ps) = rt.proc_if_ready() else { return r };
    let Some(d) = dev_index(ps, dev) else { return r };
    {
        let mut c = ps.contexts();
        c.primary_refs[d] = c.primary_refs[d].saturating_sub(1);
    }
    maybe_release_device(ps, d);
    r
}

pub unsafe fn primary_reset(rt: &'static Runtime, real: sig::cuDevicePrimaryCtxReset_v2, dev: CUdevice) -> CUresult {
    let r = real(dev);
    if r != CUDA_SUCCESS {
        return r;
    }
    let Some(ps) = rt.proc_if_ready() else { return r };
    let Some(d) = dev_index(ps, dev) else { return r };
    ps.contexts().primary_refs[d] = 0;
    maybe_release_device(ps, d);
    r
}

// ---------------------------------------------------------------------------------------------
// Created contexts (every exported ABI)

unsafe fn created(rt: &'static Runtime, pctx: *mut CUcontext, dev: CUdevice, create: impl FnOnce() -> CUresult) -> CUresult {
    let Some(ps) = rt.proc() else { return create() };
    let Some(d) = dev_index(ps, dev) else { return create() };
    if pctx.is_null() {
        return create();
    }
    let undo = || {
        if let Some(f) = crate::hooks::table::real::cuCtxDestroy_v2.get() {
            // SAFETY: destroys the context the driver just created and wrote to `pctx`.
            let f: sig::cuCtxDestroy_v2 = unsafe { std::mem::transmute(f) };
            unsafe { f(*pctx) };
        }
        unsafe { *pctx = std::ptr::null_mut() };
    };
    with_first_context_charge(rt, ps, d, create, undo, |c| {
        // SAFETY: the driver wrote the new context on success.
        let ctx = unsafe { *pctx } as usize;
        c.created.insert(ctx, d);
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
    let dev = ps.contexts().created.remove(&(ctx as usize));
    if let Some(d) = dev {
        maybe_release_device(ps, d);
    }
    r
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
