//! Memory info as the container should see it: a device whose total is the cap
//! (`vgpu_core::policy::meminfo` computes it).
//! * `cuMemGetInfo`: total = min(cap, physical total); free = min(total - container usage,
//!   physical free), saturating at 0.
//! * `cuDeviceTotalMem`: min(cap, physical).
//!
//! Uncapped devices (and devices we do not control) report the driver's values unchanged.

use crate::driver;
use crate::ffi::*;
use crate::sys::sig;
use crate::runtime::Runtime;
use std::ffi::c_uint;
use vgpu_core::policy::meminfo::{clamp_u32, virtual_info, virtual_total};

/// Virtualized (free, total) of the current device, or `None` to leave the driver's answer.
fn current_virtual(rt: &Runtime, phys_free: u64, phys_total: u64) -> Option<(u64, u64)> {
    let ps = rt.proc()?;
    let dev = ps.dev_index(driver::current_device()?)?;
    let cap = ps.limit(dev)?;
    Some(virtual_info(phys_free, phys_total, cap, ps.container_used(dev)))
}

pub unsafe fn mem_get_info(rt: &'static Runtime, real: sig::cuMemGetInfo_v2, free: *mut usize, total: *mut usize) -> CUresult {
    let r = real(free, total);
    if r != CUDA_SUCCESS || free.is_null() || total.is_null() {
        return r;
    }
    if let Some((f, t)) = current_virtual(rt, *free as u64, *total as u64) {
        *free = f as usize;
        *total = t as usize;
    }
    r
}

/// Legacy 32-bit `cuMemGetInfo`: computed from the full-width values, clamped to `u32`.
pub unsafe fn mem_get_info_v1(rt: &'static Runtime, real: sig::cuMemGetInfo, free: *mut c_uint, total: *mut c_uint) -> CUresult {
    let r = real(free, total);
    if r != CUDA_SUCCESS || free.is_null() || total.is_null() {
        return r;
    }
    let (pf, pt) = driver::mem_get_info().unwrap_or((*free as u64, *total as u64));
    if let Some((f, t)) = current_virtual(rt, pf, pt) {
        *free = clamp_u32(f);
        *total = clamp_u32(t);
    }
    r
}

fn capped_total(rt: &Runtime, dev: CUdevice, phys: u64) -> Option<u64> {
    let ps = rt.proc()?;
    let d = ps.dev_index(dev)?;
    Some(virtual_total(phys, ps.limit(d)?))
}

pub unsafe fn device_total_mem(rt: &'static Runtime, real: sig::cuDeviceTotalMem_v2, bytes: *mut usize, dev: CUdevice) -> CUresult {
    let r = real(bytes, dev);
    if r != CUDA_SUCCESS || bytes.is_null() {
        return r;
    }
    if let Some(t) = capped_total(rt, dev, *bytes as u64) {
        *bytes = t as usize;
    }
    r
}

pub unsafe fn device_total_mem_v1(rt: &'static Runtime, real: sig::cuDeviceTotalMem, bytes: *mut c_uint, dev: CUdevice) -> CUresult {
    let r = real(bytes, dev);
    if r != CUDA_SUCCESS || bytes.is_null() {
        return r;
    }
    let phys = driver::device_total_mem(dev).unwrap_or(*bytes as u64);
    if let Some(t) = capped_total(rt, dev, phys) {
        *bytes = clamp_u32(t);
    }
    r
}
