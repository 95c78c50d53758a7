//! Launch gate: every kernel/graph launch shim calls `before_launch` then `after_launch`;
//! every synchronize shim calls `after_sync`. Owned by the lead (compute limiter glue).
//! Current body: pass-through; the limiter replaces it.
#![allow(dead_code)]

/// Opaque CUDA stream handle as the driver sees it.
pub type CUstream = *mut std::ffi::c_void;

/// What `before_launch` decided, handed back to `after_launch`.
#[derive(Clone, Copy, Default)]
pub struct LaunchTicket {
    pub(crate) gated: bool,
}

/// Called by every launch shim before the real launch. May block (bounded) when over budget.
/// Fast path when no cap/suspend is active: one relaxed atomic load.
#[inline]
pub fn before_launch(_stream: CUstream) -> LaunchTicket {
    LaunchTicket::default()
}

/// Called by every launch shim after the real launch with its result.
#[inline]
pub fn after_launch(_ticket: LaunchTicket, _stream: CUstream, _result: i32) {}

/// Called by synchronize shims (stream/context/event synchronize) after the real call returned.
#[inline]
pub fn after_sync() {}
