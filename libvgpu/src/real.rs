//! Resolution of the real driver functions: the real `dlsym` (glibc's, found with `dlvsym` so our
//! own exported `dlsym` is never re-entered), our own `dlopen` handles on `libcuda.so.1` and
//! (lazily) `libnvidia-ml.so.1`, `RealFn`, a lazily resolved, cached function address, and
//! `Slot`, the same with its C signature: the only place an address becomes a function pointer
//! (`as_fn`). The slots themselves are generated from the one list in `sys`.

use std::ffi::{c_char, c_void};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

/// Signature of `dlsym`.
pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// The real `dlsym` as an address (0 = not resolved yet). Read by the naked `dlsym` override.
pub(crate) static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

/// Sentinel stored in a pointer cell for "looked up, absent".
const MISSING: usize = 1;

/// Stand-in when glibc's `dlsym` cannot be found at all (never expected): resolves nothing.
unsafe extern "C" fn dlsym_unavailable(_h: *mut c_void, _s: *const c_char) -> *mut c_void {
    std::ptr::null_mut()
}

/// Resolve (once) and return glibc's `dlsym`. Allocation- and lock-free; safe to call from the
/// naked `dlsym` slow path and concurrently (every racer stores the same value).
pub(crate) extern "C" fn resolve_real_dlsym() -> usize {
    let cell = &REAL_DLSYM;
    let cur = cell.load(Ordering::Acquire);
    if cur != 0 {
        return cur;
    }
    let mut p: *mut c_void = std::ptr::null_mut();
    for ver in [&b"GLIBC_2.34\0"[..], &b"GLIBC_2.2.5\0"[..]] {
        // SAFETY: NUL-terminated literals; RTLD_NEXT from this object finds libc's dlsym.
        p = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), ver.as_ptr().cast()) };
        if !p.is_null() {
            break;
        }
    }
    let v = if p.is_null() { dlsym_unavailable as DlsymFn as usize } else { p as usize };
    cell.store(v, Ordering::Release);
    v
}

/// glibc's `dlsym`.
#[inline]
pub fn real_dlsym() -> DlsymFn {
    let v = resolve_real_dlsym();
    // SAFETY: `v` is the address of a function with dlsym's signature.
    unsafe { as_fn::<DlsymFn>(v as *mut c_void) }
}

/// The function at address `p` as the function-pointer type `F`.
///
/// # Safety
/// `F` is an `extern "C" fn` pointer type (the size is checked) and `p` the address of a function
/// with exactly that C signature.
#[inline(always)]
unsafe fn as_fn<F: Copy>(p: *mut c_void) -> F {
    const { assert!(std::mem::size_of::<F>() == std::mem::size_of::<*mut c_void>()) };
    std::mem::transmute_copy::<*mut c_void, F>(&p)
}

/// Which library a hooked symbol lives in.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Lib {
    Cuda,
    Nvml,
    /// glibc itself, for the few libc functions the hook exports too (`ioctl`): its own handle
    /// finds glibc's definition, never ours.
    Libc,
}

#[allow(non_upper_case_globals)]
impl Lib {
    /// The error a shim returns when the real symbol is absent from the library.
    pub const fn not_found(self) -> i32 {
        match self {
            Lib::Cuda => crate::ffi::CUDA_ERROR_NOT_FOUND,
            Lib::Nvml => crate::ffi::NVML_ERROR_FUNCTION_NOT_FOUND,
            Lib::Libc => -1,
        }
    }
    /// The error a shim returns when our own code panicked.
    pub const fn unknown(self) -> i32 {
        match self {
            Lib::Cuda => crate::ffi::CUDA_ERROR_UNKNOWN,
            Lib::Nvml => crate::ffi::NVML_ERROR_UNKNOWN,
            Lib::Libc => -1,
        }
    }
    fn soname(self) -> &'static std::ffi::CStr {
        match self {
            Lib::Cuda => c"libcuda.so.1",
            Lib::Nvml => c"libnvidia-ml.so.1",
            Lib::Libc => c"libc.so.6",
        }
    }
    fn cell(self) -> &'static AtomicPtr<c_void> {
        static CUDA: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
        static NVML: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
        static LIBC: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
        match self {
            Lib::Cuda => &CUDA,
            Lib::Nvml => &NVML,
            Lib::Libc => &LIBC,
        }
    }
    /// Our own `dlopen` handle on the library (opened on first use, RTLD_NOW|RTLD_GLOBAL), or
    /// `None` when it cannot be loaded (remembered).
    pub fn handle(self) -> Option<*mut c_void> {
        let cell = self.cell();
        let h = cell.load(Ordering::Acquire);
        if h as usize == MISSING {
            return None;
        }
        if !h.is_null() {
            return Some(h);
        }
        // SAFETY: valid NUL-terminated soname. Racing threads get the same handle (refcounted).
        let h = unsafe { libc::dlopen(self.soname().as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        if h.is_null() {
            cell.store(MISSING as *mut c_void, Ordering::Release);
            None
        } else {
            cell.store(h, Ordering::Release);
            Some(h)
        }
    }
    /// Look `name` (NUL-terminated) up in the library with the real `dlsym`.
    pub fn sym(self, name: &std::ffi::CStr) -> Option<*mut c_void> {
        let h = self.handle()?;
        // SAFETY: valid handle and NUL-terminated name.
        let p = unsafe { real_dlsym()(h, name.as_ptr()) };
        (!p.is_null()).then_some(p)
    }
}

/// A real driver function: resolved on first use with the real `dlsym` on our own handle of its
/// library, then one atomic load per call.
pub struct RealFn {
    ptr: AtomicPtr<c_void>,
    name: &'static std::ffi::CStr,
    lib: Lib,
}

impl RealFn {
    pub const fn new(lib: Lib, name: &'static std::ffi::CStr) -> RealFn {
        RealFn { ptr: AtomicPtr::new(std::ptr::null_mut()), name, lib }
    }
    /// The real function's address, or `None` when the library does not export it.
    #[inline]
    pub fn get(&self) -> Option<*mut c_void> {
        let p = self.ptr.load(Ordering::Acquire);
        if p as usize > MISSING {
            Some(p)
        } else if p.is_null() {
            self.resolve()
        } else {
            None
        }
    }
    #[cold]
    fn resolve(&self) -> Option<*mut c_void> {
        let p = self.lib.sym(self.name);
        self.ptr.store(p.unwrap_or(MISSING as *mut c_void), Ordering::Release);
        p
    }
    pub const fn name(&self) -> &'static std::ffi::CStr {
        self.name
    }
    pub const fn lib(&self) -> Lib {
        self.lib
    }
}

/// A real function with its C signature `F` (a `sys::sig` type): resolved like `RealFn`, handed
/// out typed, so no caller restates or transmutes a signature.
pub struct Slot<F> {
    raw: RealFn,
    sig: PhantomData<F>,
}

impl<F: Copy> Slot<F> {
    /// # Safety
    /// `F` must be the `unsafe extern "C" fn` type of the symbol `name` (`sys` generates every
    /// slot from the one list whose signatures ci/check-abi.py checks against NVIDIA's headers).
    pub const unsafe fn new(lib: Lib, name: &'static std::ffi::CStr) -> Slot<F> {
        Slot { raw: RealFn::new(lib, name), sig: PhantomData }
    }
    /// The real function, or `None` when the library does not export it.
    #[inline]
    pub fn get(&self) -> Option<F> {
        // SAFETY: `new`'s contract: `F` is this symbol's signature.
        self.raw.get().map(|p| unsafe { as_fn::<F>(p) })
    }
    pub const fn raw(&self) -> &RealFn {
        &self.raw
    }
}
