//! `ffi_guard`: no panic ever crosses the C boundary. A panic (possible only in builds with
//! panic=unwind; release aborts, so hook code avoids panicking paths altogether) becomes the
//! library's "unknown error" plus one error line.

use std::panic::{catch_unwind, AssertUnwindSafe};

#[inline(always)]
pub fn ffi_guard<F: FnOnce() -> i32>(name: &'static str, unknown: i32, f: F) -> i32 {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => {
            vgpu_core::error!("internal error in hook {name}; returning error {unknown}");
            unknown
        }
    }
}
