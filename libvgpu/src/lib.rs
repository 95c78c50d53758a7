//! libvgpu.so: the LD_PRELOAD hook. Thin FFI shims over `vgpu-core` policy, in layers (each uses
//! only the ones below it; `tests/layers.rs` checks, docs/design.md "Layers" draws them):
//!
//! * `ffi`: C types and constants; `guard`: the panic guard; `real`: symbol resolution, typed slots.
//! * `sys`: the one list of every driver/NVML entry hooked or called, generating typed slots.
//! * `driver`: safe wrappers over the slots; `tsg`: this process's channel groups (timeslices).
//! * `runtime`: per-process state (config, region, slot, devices, ledgers), lazily initialized.
//! * `node`: the node-level file (this process's entry per GPU, the other containers' priorities);
//!   `streams`: the streams the program made, by context (what a context synchronize waits for).
//! * `caps` → `launch` → `monitor`: the compute limiter (lead-owned); `linger`: a higher
//!   priority's context kept on the GPU after its synchronizes;
//!   `physmem` → `memory` → `context`, `meminfo`, `nvml`: the policies the hooks point at.
//! * `lifecycle`: init, the fork step, starting the monitor.
//! * `hooks`: the shims generated from the list, the `dlsym` override, `cuGetProcAddress`.

// Policy functions are `unsafe fn`s called only by the generated shims with the C caller's
// arguments: their safety contract is the CUDA/NVML API's own (valid pointers or NULL).
#![allow(clippy::missing_safety_doc)]

mod caps;
pub mod context;
pub mod driver;
pub mod ffi;
pub mod guard;
pub mod hooks;
mod launch;
pub mod linger;
pub mod lifecycle;
pub mod meminfo;
pub mod memory;
mod monitor;
mod node;
pub mod nvml;
pub mod physmem;
pub mod real;
pub mod runtime;
pub mod streams;
pub mod sys;
mod tsg;
