//! `cuGetProcAddress` / `cuGetProcAddress_v2`: the CUDA runtime (and everything built on it) gets
//! every driver entry point through these. We call the real one, then swap the *returned pointer*
//! for the hook of exactly that implementation, using a map built once from the driver's own
//! exported symbols (real `dlsym` of every hooked name on our driver handle). The ABI of what the
//! caller receives is therefore always the ABI the driver chose; we never guess version suffixes.
//! Pointers we do not hook (including whatever `cuGetExportTable` hands out) pass through as is.

use super::table::HOOKS;
use crate::sys::sig;
use crate::ffi::*;
use crate::real::Lib;
use std::ffi::{c_char, c_void};
use std::sync::OnceLock;

/// Sorted (real address, hook address) pairs of every hooked driver function the driver exports.
fn pointer_map() -> &'static [(usize, usize)] {
    static MAP: OnceLock<Vec<(usize, usize)>> = OnceLock::new();
    MAP.get_or_init(|| {
        let mut v: Vec<(usize, usize)> = HOOKS
            .iter()
            .filter(|h| h.real.lib() == Lib::Cuda)
            .filter_map(|h| h.real.get().map(|p| (p as usize, h.hook as usize)))
            .collect();
        v.sort_unstable();
        v.dedup_by_key(|e| e.0);
        v
    })
}

/// Our hook for the driver function at `real`, if we hook that implementation.
pub fn hook_for_pointer(real: *mut c_void) -> Option<*mut c_void> {
    let map = pointer_map();
    let key = real as usize;
    map.binary_search_by_key(&key, |e| e.0).ok().and_then(|i| map.get(i)).map(|e| e.1 as *mut c_void)
}

unsafe fn swap(pfn: *mut *mut c_void, symbol: *const c_char, cuda_version: i32, flags: cuuint64_t) {
    if pfn.is_null() || (*pfn).is_null() {
        return;
    }
    if let Some(h) = hook_for_pointer(*pfn) {
        *pfn = h;
    } else if vgpu_core::log::enabled(vgpu_core::log::DEBUG) && !symbol.is_null() {
        let name = std::ffi::CStr::from_ptr(symbol).to_string_lossy();
        if HOOKS.iter().any(|h| h.name.to_bytes().starts_with(name.as_bytes())) {
            vgpu_core::debug!("cuGetProcAddress({name}, {cuda_version}, {flags}): not one of the hooked exports; passed through");
        }
    }
}

pub unsafe fn get_proc_address(
    _rt: &'static crate::runtime::Runtime,
    real: sig::cuGetProcAddress,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: i32,
    flags: cuuint64_t,
) -> CUresult {
    let r = real(symbol, pfn, cuda_version, flags);
    if r == CUDA_SUCCESS {
        swap(pfn, symbol, cuda_version, flags);
    }
    r
}

pub unsafe fn get_proc_address_v2(
    _rt: &'static crate::runtime::Runtime,
    real: sig::cuGetProcAddress_v2,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: i32,
    flags: cuuint64_t,
    status: *mut CUdriverProcAddressQueryResult,
) -> CUresult {
    let r = real(symbol, pfn, cuda_version, flags, status);
    if r == CUDA_SUCCESS {
        swap(pfn, symbol, cuda_version, flags);
    }
    r
}
