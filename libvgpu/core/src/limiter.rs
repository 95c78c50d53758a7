//! Compute limiter policy (pure; the FFI glue is `libvgpu/src/launch.rs`).
//! Being written by the lead; `SharedDeviceState` is fixed now because the region embeds it.

use std::sync::atomic::{AtomicI64, AtomicU64};

/// Per-device limiter state shared by every process of a container (lives in the region
/// extension, one per device). All fields are atomics: processes update it without a lock.
#[repr(C, align(64))]
#[derive(Default)]
pub struct SharedDeviceState {
    /// Token bucket balance in nanoseconds of occupancy; negative = debt.
    pub tokens_ns: AtomicI64,
    /// When the bucket was last refilled (clock::now_ns).
    pub refilled_at_ns: AtomicU64,
    /// Union-charging watermark: occupancy before this instant is already charged.
    pub charged_until_ns: AtomicU64,
    /// Occupancy charged since `window_start_ns` (utilization reporting).
    pub window_busy_ns: AtomicU64,
    pub window_start_ns: AtomicU64,
    /// Last completed window's utilization in percent x 100 (0..=10000).
    pub util_centi_percent: AtomicU64,
    /// Total occupancy charged, ns (monotonic counter for tools).
    pub total_busy_ns: AtomicU64,
    /// Latest launch on this device by any process of the container (clock::now_ns).
    pub last_launch_ns: AtomicU64,
    /// Room to grow without changing the extension layout.
    pub reserved: [AtomicU64; 8],
}

const _: () = assert!(std::mem::size_of::<SharedDeviceState>() == 128);
