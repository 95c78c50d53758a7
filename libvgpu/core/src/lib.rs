//! Pure policy for libvgpu, unit-tested without any FFI: configuration, size parsing, the shared
//! region (HAMi v1 layout plus our extension), the per-process memory ledger, the compute limiter and the node-level view of the
//! containers sharing a GPU (`node`).
//! The preload library (`libvgpu`) and the tools (`vgpu-tools`) are thin layers over this crate.

pub mod clock;
pub mod config;
pub mod ledger;
pub mod limiter;
pub mod log;
pub mod node;
pub mod policy;
pub mod region;
pub mod regular;
pub mod rm;
pub mod size;

/// Most devices a container can see (fixed by HAMi's v1 region layout).
pub const MAX_DEVICES: usize = 16;
/// Most processes that can register in one region (fixed by HAMi's v1 region layout).
pub const MAX_PROCS: usize = 1024;
