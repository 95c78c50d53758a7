//! The `dlsym` override.
//!
//! Programs that `dlopen("libcuda.so.1")` + `dlsym` (the CUDA runtime, `nvidia-smi` for NVML) would
//! get the driver's own functions and bypass symbol interposition, so we export `dlsym` ourselves.
//!
//! `dlsym` is a naked function so that `dlsym(RTLD_NEXT, ..)` can *jump* into glibc's `dlsym` with
//! the caller's return address still on the stack: glibc resolves RTLD_NEXT relative to that
//! address, so the lookup stays relative to the caller (never to libvgpu). Every other handle tail-
//! jumps to `dlsym_other`, which asks glibc and swaps in our hook for hooked `cu*`/`nvml*` names.
//! Non-CUDA names cost one real `dlsym` plus a one-byte check: no lock, no allocation, no recursion
//! (glibc's `dlsym` is reached through `dlvsym`, never through our export).

use std::ffi::{c_char, c_void};

// Without a `dlsym` override, programs that reach the driver through `dlopen` + `dlsym` (the CUDA
// runtime, so PyTorch, JAX, CuPy, TensorRT) would run uncapped: refuse to build rather than ship
// a library that silently caps nothing.
#[cfg(not(target_arch = "x86_64"))]
compile_error!(
    "libvgpu: no dlsym interception for this target architecture (only x86_64 is implemented); \
     a build without it would leave programs that dlopen+dlsym libcuda (the CUDA runtime) uncapped"
);

/// Exported `dlsym`. x86-64 System V: rdi = handle, rsi = symbol.
///
/// Fast path for RTLD_NEXT (`(void*)-1`): `jmp` to glibc's dlsym. If that pointer is not resolved
/// yet, call the resolver with rdi/rsi saved and the stack 16-byte aligned, then jump.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        "cmp rdi, -1",
        "jne {other}",
        "mov rax, qword ptr [rip + {real}]",
        "test rax, rax",
        "jz 2f",
        "jmp rax",
        "2:",
        // entry rsp = 8 mod 16; two pushes + 8 -> 0 mod 16 at the call
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {resolve}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "jmp rax",
        other = sym dlsym_other,
        real = sym crate::real::REAL_DLSYM,
        resolve = sym crate::real::resolve_real_dlsym,
    )
}

/// Every handle but RTLD_NEXT: glibc's answer, replaced by our hook for hooked names the library
/// really exports (a missing real symbol stays missing).
unsafe extern "C" fn dlsym_other(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    let p = crate::real::real_dlsym()(handle, symbol);
    if p.is_null() || symbol.is_null() {
        return p;
    }
    match super::hook_for_cstr(symbol) {
        Some(hook) => hook,
        None => p,
    }
}
