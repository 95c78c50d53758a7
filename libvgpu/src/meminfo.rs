//! Memory info as the container should see it: a device whose total is the cap.
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

/// (free, total) the program should see, from the physical values.
pub fn virtual_info(phys_free: u64, phys_total: u64, cap: u64, used: u64) -> (u64, u64) {
    let total = cap.min(phys_total);
    let free = total.saturating_sub(used).min(phys_free);
    (free, total)
}

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
        *free = f.min(u32::MAX as u64) as c_uint;
        *total = t.min(u32::MAX as u64) as c_uint;
    }
    r
}

fn capped_total(rt: &Runtime, dev: CUdevice, phys: u64) -> Option<u64> {
    let ps = rt.proc()?;
    let d = ps.dev_index(dev)?;
    Some(ps.limit(d)?.min(phys))
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
        *bytes = t.min(u32::MAX as u64) as c_uint;
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    const GIB: u64 = 1 << 30;

    #[test]
    fn virtualization() {
        // 4 GiB cap on an 80 GiB device, 1 GiB used by the container, plenty physically free.
        assert_eq!(virtual_info(70 * GIB, 80 * GIB, 4 * GIB, GIB), (3 * GIB, 4 * GIB));
        // physically nearly full: free is the physical free
        assert_eq!(virtual_info(GIB / 2, 80 * GIB, 4 * GIB, GIB), (GIB / 2, 4 * GIB));
        // over the cap (cap lowered at run time): free saturates at 0
        assert_eq!(virtual_info(70 * GIB, 80 * GIB, 4 * GIB, 5 * GIB), (0, 4 * GIB));
        // oversubscribed cap above physical: total is physical
        assert_eq!(virtual_info(70 * GIB, 80 * GIB, 100 * GIB, 0), (70 * GIB, 80 * GIB));
    }
}
