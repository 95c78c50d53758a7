//! The hook layer. `hooks!` expands the one list of `sys` (`sys::entries!`) exactly once, in
//! `table.rs`; for every hooked entry it generates
//! * the exported `#[no_mangle] extern "C" fn NAME` shim (its real function: the typed slot
//!   `sys::real::NAME`; policy functions take `sys::sig::NAME`),
//! * an entry of `HOOKS` (name, real, hook) used by the `dlsym` override and `cuGetProcAddress`.
//!
//! Modes (what the shim does around the real call):
//! * `policy => f`: lazy init (`lifecycle::ensure`); pass-through when control is disabled, else
//!   `f(rt, real, args..)`, then `lifecycle::after_call` (starts the monitor once there is a
//!   process state);
//! * `init`: lazy init, then the real call unchanged (e.g. `cuInit`);
//! * `launch(stream_expr)`: `launch::before_launch(stream)`, real call, `launch::after_launch`;
//!   `launch(kind = kind_expr; stream_expr)` also names the launch's kind (its function and grid,
//!   or its graph; worked out only when the gate is on), so the queue bound values it at what
//!   that kind took before;
//!   nothing else on that path (no init, no lock, no clock);
//! * `sync(awaited)`: `launch::sync_entered()` (a clock read only when gated), `linger::before_sync` (queues or ends a linger, its spin launched by
//!   `launch::gated_one_thread`: one atomic load when there is none), the real call (unless the
//!   linger answered a context synchronize with events), `linger::after_sync`, then
//!   `launch::after_sync(entered)` and `physmem::after_sync()`.
//!
//! Every shim runs inside `ffi_guard` and returns the library's "not found" error when the real
//! symbol does not exist in the loaded driver.

use std::ffi::{c_char, c_void, CStr};

pub mod dlsym;
pub mod ioctl;
pub mod procaddr;

/// Whether `b[at..]` begins with `p` (a `const fn`: the shims decide at compile time).
const fn has_at(b: &[u8], at: usize, p: &[u8]) -> bool {
    if at + p.len() > b.len() {
        return false;
    }
    let mut i = 0;
    while i < p.len() {
        if b[at + i] != p[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// A `_ptsz` / `_ptds` entry point: its null stream is the calling thread's default stream.
pub const fn per_thread_stream(name: &str) -> bool {
    let b = name.as_bytes();
    b.len() > 5 && (has_at(b, b.len() - 5, b"_ptsz") || has_at(b, b.len() - 5, b"_ptds"))
}

/// Whether a launch entry point runs kernels (`cuLaunch*`, `cuGraphLaunch*`), not a copy or memset.
pub const fn runs_kernels(name: &str) -> bool {
    let b = name.as_bytes();
    has_at(b, 0, b"cuLaunch") || has_at(b, 0, b"cuGraphLaunch")
}

/// One hooked symbol.
pub struct Hook {
    pub name: &'static CStr,
    pub real: &'static crate::real::RealFn,
    /// Address of our exported shim.
    pub hook: *const (),
}
// SAFETY: `hook` is the address of a function (immutable code); the rest is Sync.
unsafe impl Sync for Hook {}

/// The real function of a table entry (its typed slot), or return the library's "not found".
macro_rules! real_fn {
    ($lib:ident $name:ident) => {{
        let Some(f) = $crate::sys::real::$name.get() else { return $crate::real::Lib::$lib.not_found() };
        f
    }};
}

macro_rules! shim {
    ($lib:ident policy () $name:ident [$($arg:ident),*] $policy:path) => {
        $crate::guard::ffi_guard(stringify!($name), $crate::real::Lib::$lib.unknown(), move || {
            #[allow(unused_unsafe)]
            unsafe {
                let f = real_fn!($lib $name);
                match $crate::lifecycle::ensure() {
                    Some(rt) => {
                        $crate::guard::maybe_inject(stringify!($name));
                        let r = $policy(rt, f, $($arg),*);
                        $crate::lifecycle::after_call(rt);
                        r
                    }
                    None => f($($arg),*),
                }
            }
        })
    };
    ($lib:ident init () $name:ident [$($arg:ident),*]) => {
        $crate::guard::ffi_guard(stringify!($name), $crate::real::Lib::$lib.unknown(), move || {
            #[allow(unused_unsafe)]
            unsafe {
                let f = real_fn!($lib $name);
                let _ = $crate::lifecycle::ensure();
                f($($arg),*)
            }
        })
    };
    ($lib:ident launch (kind = $kind:expr; $stream:expr) $name:ident [$($arg:ident),*]) => {
        $crate::guard::ffi_guard(stringify!($name), $crate::real::Lib::$lib.unknown(), move || {
            #[allow(unused_unsafe)]
            unsafe {
                let f = real_fn!($lib $name);
                let stream: $crate::ffi::CUstream = $stream;
                // Decided at compile time: nothing added to the launch path.
                const PER_THREAD: bool = $crate::hooks::per_thread_stream(stringify!($name));
                const KERNELS: bool = $crate::hooks::runs_kernels(stringify!($name));
                let ticket = $crate::launch::before_launch(stream, PER_THREAD, KERNELS, || $kind);
                let r = f($($arg),*);
                $crate::launch::after_launch(ticket, r);
                r
            }
        })
    };
    ($lib:ident launch ($stream:expr) $name:ident [$($arg:ident),*]) => {
        shim!($lib launch (kind = 0; $stream) $name [$($arg),*])
    };
    ($lib:ident sync ($awaited:expr) $name:ident [$($arg:ident),*]) => {
        $crate::guard::ffi_guard(stringify!($name), $crate::real::Lib::$lib.unknown(), move || {
            #[allow(unused_unsafe)]
            unsafe {
                let f = real_fn!($lib $name);
                let awaited = $awaited;
                let entered = $crate::launch::sync_entered();
                let syncing = $crate::launch::COUNTERS.linger.time(|| $crate::linger::before_sync(&awaited, $crate::launch::gated_one_thread));
                // A context synchronize the linger answered with events: the work is done.
                let r = match syncing.answered() {
                    Some(r) => r,
                    None => f($($arg),*),
                };
                $crate::linger::after_sync(syncing);
                $crate::launch::after_sync(entered);
                $crate::physmem::after_sync();
                r
            }
        })
    };
}

macro_rules! hooks {
    ( hooked { $( $lib:ident $mode:ident $( ( $($extra:tt)* ) )?
                  fn $name:ident ( $( $arg:ident : $ty:ty ),* $(,)? ) $( => $policy:path )? ; )* }
      called { $( $called:tt )* } ) => {
        $(
            #[no_mangle]
            #[allow(non_snake_case, clippy::missing_safety_doc)]
            pub unsafe extern "C" fn $name( $( $arg : $ty ),* ) -> i32 {
                shim!($lib $mode ( $( $($extra)* )? ) $name [ $( $arg ),* ] $( $policy )? )
            }
        )*

        /// Every hooked symbol, in table order.
        pub static HOOKS: &[$crate::hooks::Hook] = &[
            $( $crate::hooks::Hook {
                name: $crate::sys::real::$name.raw().name(),
                real: $crate::sys::real::$name.raw(),
                hook: $name as *const (),
            }, )*
        ];

        /// Index in `HOOKS` of the symbol named `name` (exact match), if hooked.
        pub fn index_of(name: &[u8]) -> Option<usize> {
            let mut i = 0usize;
            $(
                if name == stringify!($name).as_bytes() {
                    return Some(i);
                }
                i += 1;
            )*
            let _ = i;
            None
        }
    };
}

pub mod table;

/// Our hook for the C string `symbol` when it names a hooked function; cheap rejection first
/// (only names starting with `cu` or `nvml` are looked up). No allocation, no lock.
///
/// # Safety
/// `symbol` must be a valid NUL-terminated string.
#[inline]
pub unsafe fn hook_for_cstr(symbol: *const c_char) -> Option<*mut c_void> {
    let b0 = *symbol as u8;
    if b0 != b'c' && b0 != b'n' {
        return None;
    }
    let name = CStr::from_ptr(symbol).to_bytes();
    if !(name.starts_with(b"cu") || name.starts_with(b"nvml")) {
        return None;
    }
    table::index_of(name).and_then(|i| table::HOOKS.get(i)).map(|h| h.hook as *mut c_void)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptsz_and_ptds_entry_points_use_the_per_thread_stream() {
        for k in ["cuLaunchKernel_ptsz", "cuMemcpyAsync_ptsz", "cuMemsetD32_v2_ptds"] {
            assert!(per_thread_stream(k), "{k}");
        }
        for k in ["cuLaunchKernel", "_ptsz", "cuMemcpy_ptdz", "cuMemcpy_pts", ""] {
            assert!(!per_thread_stream(k), "{k}");
        }
    }

    #[test]
    fn kernel_and_graph_launches_run_kernels_copies_and_memsets_do_not() {
        for k in ["cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchKernelEx", "cuLaunchCooperativeKernel", "cuLaunchGridAsync", "cuGraphLaunch_ptsz"] {
            assert!(runs_kernels(k), "{k}");
        }
        for c in ["cuMemcpyDtoH_v2", "cuMemcpyAsync_ptsz", "cuMemsetD8Async", "cuMemsetD32_v2_ptds", "cuLaunc", ""] {
            assert!(!runs_kernels(c), "{c}");
        }
    }
}
