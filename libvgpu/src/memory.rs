//! Device-memory enforcement for every allocation path and its free.
//!
//! Rule (design.md "Memory accounting"): reserve in the region *before* the driver call (refuse
//! with `CUDA_ERROR_OUT_OF_MEMORY` and one info line when over the cap), roll back if the driver
//! fails, record the allocation in this process's ledger, release on free/destroy. Driver errors
//! are returned unchanged; unknown pointers pass through untouched. Frees take the ledger entry
//! out *before* the driver call (so a concurrent allocation that gets the same address after the
//! free cannot lose its own entry) and put it back if the driver refuses the free.
//!
//! Allocations are recorded with the context they were made in: destroying a context (or
//! releasing a primary context for good) releases them, as the driver frees them (`context`).
//! Memory the device holds beyond a call and its free (VMM handles, pools, graph memory) is
//! `physmem`'s.
//!
//! Oversubscription (`CUDA_OVERSUBSCRIBE`): a `cuMemAlloc_v2` that the driver refuses with OOM
//! but that fits under the (possibly larger than physical) cap is served with
//! `cuMemAllocManaged`, advised to prefer the device when it supports concurrent managed access.

use crate::driver;
use crate::ffi::*;
use crate::sys::sig;
use crate::physmem::{reserve, reserve_existing, unreserve};
use crate::runtime::{Ledgers, ProcState, Runtime};
use std::ffi::c_uint;
use vgpu_core::ledger::{accounted_size, Allocation, Ledger};
use vgpu_core::policy::array::{self, array_bytes, mipmapped_bytes, pitch_estimate, Settle};
use vgpu_core::region::MemKind;

// The size arithmetic is `vgpu_core::policy::array`'s; its flags are cuda.h's.
const _: () = assert!(CUDA_ARRAY3D_LAYERED == array::ARRAY3D_LAYERED && CUDA_ARRAY3D_CUBEMAP == array::ARRAY3D_CUBEMAP);

// ---------------------------------------------------------------------------------------------
// Accounting helpers

type Sel = fn(&mut Ledgers) -> &mut Ledger;
fn ptrs(l: &mut Ledgers) -> &mut Ledger {
    &mut l.ptrs
}
fn arrays(l: &mut Ledgers) -> &mut Ledger {
    &mut l.arrays
}

fn current_index(ps: &ProcState) -> Option<usize> {
    ps.dev_index(driver::current_device()?)
}

fn record(ps: &ProcState, sel: Sel, key: u64, dev: usize, bytes: u64) {
    let ctx = driver::current_context();
    let old = sel(&mut ps.ledgers()).insert(key, Allocation { dev, bytes_accounted: bytes, kind: MemKind::Data, ctx });
    if let Some(o) = old {
        // A free we never saw (made outside the hook): its charge goes now.
        ps.region.release(ps.slot, o.dev, o.kind, o.bytes_accounted);
    }
}

/// Reserve, run the driver call, record on success (key from `call`) or roll back.
fn charged<F: FnOnce() -> (CUresult, u64)>(ps: &ProcState, sel: Sel, dev: usize, bytes: u64, what: &str, call: F) -> CUresult {
    if let Err(e) = reserve(ps, dev, bytes, what) {
        return e;
    }
    let (r, key) = call();
    if r == CUDA_SUCCESS {
        record(ps, sel, key, dev, bytes);
    } else {
        unreserve(ps, dev, bytes);
    }
    r
}

/// Take the entry out, run the free, release on success or put the entry back.
fn freed<F: FnOnce() -> CUresult>(ps: &ProcState, sel: Sel, key: u64, call: F) -> CUresult {
    let entry = sel(&mut ps.ledgers()).remove(key);
    let r = call();
    if let Some(a) = entry {
        if r == CUDA_SUCCESS {
            ps.region.release(ps.slot, a.dev, a.kind, a.bytes_accounted);
        } else {
            sel(&mut ps.ledgers()).insert(key, a);
        }
    }
    r
}

// ---------------------------------------------------------------------------------------------
// Linear allocations

pub unsafe fn mem_alloc(rt: &'static Runtime, real: sig::cuMemAlloc_v2, dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    let Some(ps) = rt.proc() else { return real(dptr, bytesize) };
    let Some(dev) = current_index(ps) else { return real(dptr, bytesize) };
    if dptr.is_null() {
        return real(dptr, bytesize);
    }
    let bytes = accounted_size(bytesize as u64);
    charged(ps, ptrs, dev, bytes, "cuMemAlloc", || {
        let mut r = real(dptr, bytesize);
        if r == CUDA_ERROR_OUT_OF_MEMORY && rt.config.oversubscribe && bytesize > 0 {
            r = managed_fallback(ps, dev, dptr, bytesize);
        }
        (r, *dptr)
    })
}

/// Serve an allocation the device could not hold from managed memory (oversubscription).
unsafe fn managed_fallback(ps: &ProcState, dev: usize, dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    let r = driver::mem_alloc_managed(&mut *dptr, bytesize, CU_MEM_ATTACH_GLOBAL);
    if r != Some(CUDA_SUCCESS) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if let Some(cudev) = ps.device(dev).map(|d| d.handle) {
        if driver::device_attribute(CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, cudev) == Some(1) {
            let _ = driver::advise_preferred_device(*dptr, bytesize, cudev);
        }
    }
    vgpu_core::info!("cuMemAlloc: {bytesize} bytes on device {dev} served from managed memory (oversubscribed)");
    let _ = ps;
    CUDA_SUCCESS
}

pub unsafe fn mem_alloc_v1(rt: &'static Runtime, real: sig::cuMemAlloc, dptr: *mut CUdeviceptr_v1, bytesize: c_uint) -> CUresult {
    let Some(ps) = rt.proc() else { return real(dptr, bytesize) };
    let Some(dev) = current_index(ps) else { return real(dptr, bytesize) };
    if dptr.is_null() {
        return real(dptr, bytesize);
    }
    charged(ps, ptrs, dev, accounted_size(bytesize as u64), "cuMemAlloc", || {
        let r = real(dptr, bytesize);
        (r, *dptr as u64)
    })
}

pub unsafe fn mem_alloc_managed(rt: &'static Runtime, real: sig::cuMemAllocManaged, dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint) -> CUresult {
    let Some(ps) = rt.proc() else { return real(dptr, bytesize, flags) };
    let Some(dev) = current_index(ps) else { return real(dptr, bytesize, flags) };
    if dptr.is_null() {
        return real(dptr, bytesize, flags);
    }
    charged(ps, ptrs, dev, accounted_size(bytesize as u64), "cuMemAllocManaged", || {
        let r = real(dptr, bytesize, flags);
        (r, *dptr)
    })
}

/// Integer types of the two pitched-allocation ABIs.
pub trait Word: Copy {
    fn to_u64(self) -> u64;
}
impl Word for usize {
    fn to_u64(self) -> u64 {
        self as u64
    }
}
impl Word for u32 {
    fn to_u64(self) -> u64 {
        self as u64
    }
}
impl Word for u64 {
    fn to_u64(self) -> u64 {
        self
    }
}

/// Device pointers of the two allocation ABIs, and their real free.
pub trait DevPtr: Word {
    fn free_real(self);
}
impl DevPtr for CUdeviceptr {
    fn free_real(self) {
        driver::mem_free(self)
    }
}
impl DevPtr for CUdeviceptr_v1 {
    fn free_real(self) {
        driver::mem_free_v1(self)
    }
}

/// Pitched allocation (`cuMemAllocPitch_v2`, and the legacy 32-bit `cuMemAllocPitch`): reserve
/// an upper estimate (pitch rounded to 512 bytes), then settle on the driver's pitch x height.
pub unsafe fn mem_alloc_pitch<T: DevPtr, P: Word>(rt: &'static Runtime,
    real: unsafe extern "C" fn(*mut T, *mut P, P, P, c_uint) -> CUresult,
    dptr: *mut T, pitch: *mut P, width: P, height: P, elem: c_uint) -> CUresult {
    let Some(ps) = rt.proc() else { return real(dptr, pitch, width, height, elem) };
    let Some(dev) = current_index(ps) else { return real(dptr, pitch, width, height, elem) };
    if dptr.is_null() || pitch.is_null() {
        return real(dptr, pitch, width, height, elem);
    }
    let est = accounted_size(pitch_estimate(width.to_u64()).saturating_mul(height.to_u64()));
    if let Err(e) = reserve(ps, dev, est, "cuMemAllocPitch") {
        return e;
    }
    let r = real(dptr, pitch, width, height, elem);
    if r != CUDA_SUCCESS {
        unreserve(ps, dev, est);
        return r;
    }
    settle_pitch(ps, dev, est, (*pitch).to_u64().saturating_mul(height.to_u64()), (*dptr).to_u64(), || {
        (*dptr).free_real()
    })
}

/// Adjust a pitched allocation's reservation `est` to its real size; frees it (and reports OOM)
/// if the real size does not fit.
fn settle_pitch(ps: &ProcState, dev: usize, est: u64, real_bytes: u64, key: u64, free: impl FnOnce()) -> CUresult {
    let actual = accounted_size(real_bytes);
    match array::settle_pitch(est, actual) {
        Settle::Keep => {}
        Settle::ReserveMore(more) => {
            if let Err(e) = reserve_existing(ps, dev, more, "cuMemAllocPitch") {
                free();
                unreserve(ps, dev, est);
                return e;
            }
        }
        Settle::GiveBack(less) => unreserve(ps, dev, less),
    }
    record(ps, ptrs, key, dev, actual);
    CUDA_SUCCESS
}

pub unsafe fn mem_free(rt: &'static Runtime, real: sig::cuMemFree_v2, dptr: CUdeviceptr) -> CUresult {
    // A free waits for the context's work: not for a spin.
    crate::linger::end_spins();
    let Some(ps) = rt.proc_if_ready() else { return real(dptr) };
    freed(ps, ptrs, dptr, || real(dptr))
}

pub unsafe fn mem_free_v1(rt: &'static Runtime, real: sig::cuMemFree, dptr: CUdeviceptr_v1) -> CUresult {
    crate::linger::end_spins();
    let Some(ps) = rt.proc_if_ready() else { return real(dptr) };
    freed(ps, ptrs, dptr as u64, || real(dptr))
}

// ---------------------------------------------------------------------------------------------
// Stream-ordered frees (allocations, pools and VMM handles: `physmem`)

pub unsafe fn mem_free_async(rt: &'static Runtime, real: sig::cuMemFreeAsync, dptr: CUdeviceptr, stream: CUstream) -> CUresult {
    let Some(ps) = rt.proc_if_ready() else { return real(dptr, stream) };
    let r = real(dptr, stream);
    if r == CUDA_SUCCESS && !crate::physmem::freed_async(ps, dptr) {
        // Not a pool allocation of ours (cuMemFreeAsync also frees cuMemAlloc memory).
        if let Some(a) = ps.ledgers().ptrs.remove(dptr) {
            ps.region.release(ps.slot, a.dev, a.kind, a.bytes_accounted);
        }
    }
    r
}

// ---------------------------------------------------------------------------------------------
// Arrays

/// An array descriptor whose storage size we can compute (every descriptor ABI).
pub trait ArrayDesc {
    fn bytes(&self) -> u64;
}
impl ArrayDesc for CUDA_ARRAY_DESCRIPTOR {
    fn bytes(&self) -> u64 {
        array_bytes(self.format, self.num_channels, self.width as u64, self.height as u64, 1)
    }
}
impl ArrayDesc for CUDA_ARRAY_DESCRIPTOR_v1 {
    fn bytes(&self) -> u64 {
        array_bytes(self.format, self.num_channels, self.width as u64, self.height as u64, 1)
    }
}
impl ArrayDesc for CUDA_ARRAY3D_DESCRIPTOR {
    fn bytes(&self) -> u64 {
        array_bytes(self.format, self.num_channels, self.width as u64, self.height as u64, self.depth as u64)
    }
}
impl ArrayDesc for CUDA_ARRAY3D_DESCRIPTOR_v1 {
    fn bytes(&self) -> u64 {
        array_bytes(self.format, self.num_channels, self.width as u64, self.height as u64, self.depth as u64)
    }
}

/// `cuArrayCreate[_v2]` / `cuArray3DCreate[_v2]`: charged on the current device.
pub unsafe fn array_create<D: ArrayDesc>(rt: &'static Runtime, real: unsafe extern "C" fn(*mut CUarray, *const D) -> CUresult,
    handle: *mut CUarray, desc: *const D) -> CUresult {
    let Some(ps) = rt.proc() else { return real(handle, desc) };
    if handle.is_null() || desc.is_null() {
        return real(handle, desc);
    }
    let Some(dev) = current_index(ps) else { return real(handle, desc) };
    charged(ps, arrays, dev, accounted_size((*desc).bytes()), "cuArrayCreate", || {
        let r = real(handle, desc);
        (r, *handle as u64)
    })
}

pub unsafe fn array_destroy(rt: &'static Runtime, real: sig::cuArrayDestroy, handle: CUarray) -> CUresult {
    let Some(ps) = rt.proc_if_ready() else { return real(handle) };
    freed(ps, arrays, handle as u64, || real(handle))
}

pub unsafe fn mipmapped_array_create(rt: &'static Runtime, real: sig::cuMipmappedArrayCreate, handle: *mut CUmipmappedArray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR, levels: c_uint) -> CUresult {
    let Some(ps) = rt.proc() else { return real(handle, desc, levels) };
    if handle.is_null() || desc.is_null() {
        return real(handle, desc, levels);
    }
    let Some(dev) = current_index(ps) else { return real(handle, desc, levels) };
    let d = &*desc;
    let bytes = mipmapped_bytes(d.format, d.num_channels, d.width as u64, d.height as u64, d.depth as u64, d.flags, levels);
    charged(ps, arrays, dev, accounted_size(bytes), "cuMipmappedArrayCreate", || {
        let r = real(handle, desc, levels);
        (r, *handle as u64)
    })
}

pub unsafe fn mipmapped_array_destroy(rt: &'static Runtime, real: sig::cuMipmappedArrayDestroy, handle: CUmipmappedArray) -> CUresult {
    let Some(ps) = rt.proc_if_ready() else { return real(handle) };
    freed(ps, arrays, handle as u64, || real(handle))
}

/// Drop every ledger entry made in context `ctx` and release its charges (the context was
/// destroyed, and the driver freed everything allocated in it). VMM handles and pool memory
/// belong to the device, not to a context.
pub fn drain_ctx(ps: &ProcState, ctx: u64) {
    let drained: Vec<Allocation> = {
        let mut l = ps.ledgers();
        let mut v: Vec<Allocation> = Vec::new();
        for sel in [ptrs as Sel, arrays] {
            v.extend(sel(&mut l).drain_ctx(ctx).into_iter().map(|(_, a)| a));
        }
        v
    };
    for a in drained {
        ps.region.release(ps.slot, a.dev, a.kind, a.bytes_accounted);
    }
}
