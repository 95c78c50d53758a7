//! libvgpu.so: the LD_PRELOAD hook. Thin FFI shims over `vgpu-core` policy.
//!
//! * `hooks`: the one hook table (`hooks/table.rs`), the `dlsym` override, `cuGetProcAddress`.
//! * `runtime`: lazy init (config, region, slot, devices, ledgers), fork handling; `runtime::get()`
//!   is the entry point for the launch gate and the monitor.
//! * `memory`, `physmem`, `context`, `meminfo`, `nvml`: the policies the table points at.
//! * `launch`: the compute limiter glue (lead-owned).

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
pub mod meminfo;
pub mod memory;
mod monitor;
pub mod nvml;
pub mod physmem;
pub mod real;
pub mod runtime;
pub mod sys;
