//! Mock CUDA driver (`libcuda.so.1`) over the shared simulated GPU of `mock_gpu`.
//!
//! Every export is declared once in `exports.rs` by `driver_exports!`, with the base name and
//! driver version under which `cuGetProcAddress` hands it out (and its per-thread-stream twin).
//! That one table generates the `#[no_mangle]` symbols and the proc-address table, so the two
//! cannot disagree. Each export runs inside `guard`: fault/delay injection, then `catch_unwind`
//! (a panic becomes CUDA_ERROR_UNKNOWN, never unwinding into C).

mod driver;
mod exports;
mod ffi;
mod graphmem;
mod visible;

use ffi::*;
use std::sync::atomic::AtomicU64;

/// One exported implementation and how cuGetProcAddress reaches it.
pub struct Export {
    pub base: &'static str,
    pub version: i32,
    pub symbol: &'static str,
    pub addr: usize,
    /// (version, symbol, address) of the per-thread-default-stream variant (`_ptsz`/`_ptds`).
    pub per_thread: Option<(i32, &'static str, usize)>,
}

fn guard(name: &'static str, calls: &AtomicU64, f: impl FnOnce() -> CUresult) -> CUresult {
    // Not a OnceLock: a child forked during its first initialization would wait on it forever.
    static INJ: std::sync::atomic::AtomicPtr<mock_gpu::Injection> = std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());
    let inj = mock_gpu::lazy_leak(&INJ, || mock_gpu::Injection::from_env("MOCK_CUDA"));
    mock_gpu::faults::guarded(inj, name, calls, CUDA_ERROR_UNKNOWN, f)
}

macro_rules! per_thread {
    () => {
        None
    };
    ($v:literal, $n:ident) => {
        Some(($v, stringify!($n), $n as *const () as usize))
    };
}

/// `"base" @ version [/ pt_version pt_symbol] => fn symbol (args) { body }`
macro_rules! driver_exports {
    ($( $base:literal @ $ver:literal $(/ $pver:literal $pname:ident)? => fn $name:ident $sig:tt $body:block )*) => {
        $(
            #[no_mangle]
            pub unsafe extern "C" fn $name $sig -> CUresult {
                static CALLS: ::std::sync::atomic::AtomicU64 = ::std::sync::atomic::AtomicU64::new(0);
                $crate::guard(stringify!($name), &CALLS, || $body)
            }
            $(
                #[no_mangle]
                pub unsafe extern "C" fn $pname $sig -> CUresult {
                    static CALLS: ::std::sync::atomic::AtomicU64 = ::std::sync::atomic::AtomicU64::new(0);
                    $crate::guard(stringify!($pname), &CALLS, || $body)
                }
            )?
        )*
        pub(crate) fn export_table() -> Vec<$crate::Export> {
            vec![$( $crate::Export {
                base: $base,
                version: $ver,
                symbol: stringify!($name),
                addr: $name as *const () as usize,
                per_thread: $crate::per_thread!($($pver, $pname)?),
            }, )*]
        }
    };
}
pub(crate) use {driver_exports, per_thread};

fn table() -> &'static [Export] {
    static T: std::sync::atomic::AtomicPtr<Vec<Export>> = std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());
    mock_gpu::lazy_leak(&T, exports::export_table).as_slice()
}

/// The driver's cuGetProcAddress rule: the newest implementation of `base` not newer than
/// `version`; its per-thread twin when asked for per-thread default stream semantics.
pub fn resolve(base: &str, version: i32, flags: u64) -> Result<usize, (CUresult, i32)> {
    let mut found = false;
    let mut best: Option<&Export> = None;
    for e in table().iter().filter(|e| e.base == base) {
        found = true;
        if e.version <= version && best.is_none_or(|b| e.version > b.version) {
            best = Some(e);
        }
    }
    let Some(e) = best else {
        let status = if found { CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT } else { CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND };
        return Err((CUDA_ERROR_NOT_FOUND, status));
    };
    let per_thread = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0 && flags & CU_GET_PROC_ADDRESS_LEGACY_STREAM == 0;
    match e.per_thread {
        Some((pv, _, addr)) if per_thread && pv <= version => Ok(addr),
        _ => Ok(e.addr),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr_of(sym: &str) -> usize {
        table()
            .iter()
            .find_map(|e| {
                if e.symbol == sym {
                    Some(e.addr)
                } else {
                    e.per_thread.filter(|p| p.1 == sym).map(|p| p.2)
                }
            })
            .unwrap_or_else(|| panic!("{sym} not exported"))
    }

    #[test]
    fn versioned_resolution() {
        assert_eq!(resolve("cuMemAlloc", 12000, 0), Ok(addr_of("cuMemAlloc_v2")));
        assert_eq!(resolve("cuMemAlloc", 3000, 0), Err((CUDA_ERROR_NOT_FOUND, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT)));
        assert_eq!(resolve("cuCtxCreate", 11000, 0), Ok(addr_of("cuCtxCreate_v2")));
        assert_eq!(resolve("cuCtxCreate", 11040, 0), Ok(addr_of("cuCtxCreate_v3")));
        assert_eq!(resolve("cuCtxCreate", 13000, 0), Ok(addr_of("cuCtxCreate_v4")));
        assert_eq!(resolve("cuLaunchKernel", 12000, 0), Ok(addr_of("cuLaunchKernel")));
        assert_eq!(resolve("cuLaunchKernel", 12000, 2), Ok(addr_of("cuLaunchKernel_ptsz")));
        assert_eq!(resolve("cuLaunchKernel", 12000, 3), Ok(addr_of("cuLaunchKernel")));
        assert_eq!(resolve("cuMemcpyHtoD", 12000, 2), Ok(addr_of("cuMemcpyHtoD_v2_ptds")));
        assert_eq!(resolve("cuGetProcAddress", 12000, 0), Ok(addr_of("cuGetProcAddress_v2")));
        assert_eq!(resolve("cuCtxSynchronize", 12080, 0), Ok(addr_of("cuCtxSynchronize")));
        assert_eq!(resolve("cuCtxSynchronize", 13000, 0), Ok(addr_of("cuCtxSynchronize_v2")));
        assert_eq!(resolve("cuGetProcAddress", 11030, 0), Ok(addr_of("cuGetProcAddress")));
        assert_eq!(resolve("cuNoSuchThing", 12000, 0), Err((CUDA_ERROR_NOT_FOUND, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND)));
        assert_eq!(resolve("cuMemAlloc_v2", 12000, 0).map_err(|e| e.1), Err(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND));
    }

    #[test]
    fn table_is_consistent() {
        let mut seen = std::collections::HashSet::new();
        for e in table() {
            assert!(seen.insert(e.symbol), "{} declared twice", e.symbol);
            if let Some((_, s, _)) = e.per_thread {
                assert!(seen.insert(s), "{s} declared twice");
                assert!(s.ends_with("_ptsz") || s.ends_with("_ptds"), "{s}");
            }
            assert!(e.symbol.starts_with(e.base), "{} is not a version of {}", e.symbol, e.base);
        }
        // No two implementations of one base name claim the same version.
        let mut keys = std::collections::HashSet::new();
        for e in table() {
            assert!(keys.insert((e.base, e.version)), "{} @ {} twice", e.base, e.version);
        }
    }
}
