//! The decisions the preload library's policies take, as pure functions over plain values: the
//! cdylib's `memory`, `context`, `meminfo`, `nvml` and `monitor` modules read the driver, NVML and
//! the region, call these, and write back what they return.
//!
//! * [`array`]: bytes of CUDA arrays, mipmapped arrays and pitched allocations.
//! * [`caps`]: the share a device may use now, how soft caps share the spare GPU, the priority
//!   pause, whether launches are gated.
//! * [`context`]: what a context is charged, when a primary context is gone, refusing a context.
//! * [`linger`]: whether a higher-priority process keeps its context on the GPU after a
//!   synchronize, and for how long.
//! * [`meminfo`]: the virtual device `cuMemGetInfo`, `cuDeviceTotalMem` and NVML report.
//! * [`devmap`]: which container device an NVML device is, and which processes NVML may list.
//! * [`monitor`]: what the monitor thread publishes from the gate's and NVML's readings.

pub mod array;
pub mod caps;
pub mod context;
pub mod devmap;
pub mod linger;
pub mod meminfo;
pub mod monitor;
