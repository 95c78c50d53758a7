//! The `ioctl` override: libcuda reaches the NVIDIA resource manager through glibc's `ioctl` on
//! `/dev/nvidiactl`; `tsg` watches the channel-group calls among them. Every other request goes
//! straight to glibc's `ioctl` with the caller's arguments and comes back with its result and
//! errno unchanged.

use std::ffi::{c_int, c_ulong, c_void};

/// Exported `ioctl(int fd, unsigned long request, ...)`: every caller passes at most one more
/// argument, a pointer or an integer, in the same register either way (x86-64 System V).
#[no_mangle]
pub unsafe extern "C" fn ioctl(fd: c_int, request: c_ulong, arg: *mut c_void) -> c_int {
    crate::tsg::ioctl(fd, request, arg)
}
