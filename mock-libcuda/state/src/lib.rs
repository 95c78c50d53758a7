//! Simulated GPU state shared by every process that loads the mock driver or the mock NVML.
//!
//! One fixed-size `repr(C)` file (`$MOCK_GPU_STATE`, default `/tmp/mock-gpu-$UID.state`) is
//! mmapped by all of them. Nothing in it is a lock: cross-process exclusion uses OFD `fcntl` locks
//! on bytes past the data (the kernel drops them when a process dies, even by SIGKILL), and every
//! counter is an atomic. See `state` for the layout, slots, memory and the kernel timeline.

pub mod config;
pub mod faults;
mod state;

pub use config::{parse_size, Config, DeviceConfig};
pub use faults::Injection;
pub use state::*;

/// Devices a state file can describe.
pub const MAX_DEVICES: usize = 8;
/// Processes that can hold a slot at once.
pub const MAX_SLOTS: usize = 128;
/// Busy-time buckets per process per device (10 ms each: 5.12 s of history and queued future).
pub const RING: usize = 512;
pub const BUCKET_NS: u64 = 10_000_000;

/// CLOCK_MONOTONIC in nanoseconds: the timeline clock, the same in every process.
pub fn now_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// CLOCK_REALTIME in microseconds: NVML sample timestamps.
pub fn realtime_us() -> u64 {
    clock_ns(libc::CLOCK_REALTIME) / 1000
}

fn clock_ns(id: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid out pointer; both clocks always exist on Linux.
    unsafe { libc::clock_gettime(id, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Convert a monotonic instant to realtime microseconds (for NVML timestamps).
pub fn mono_to_realtime_us(mono_ns: u64) -> u64 {
    let (m, r) = (now_ns(), clock_ns(libc::CLOCK_REALTIME));
    (r as i128 + mono_ns as i128 - m as i128).max(0) as u64 / 1000
}

/// Sleep until the monotonic instant `deadline_ns` (absolute, so no drift across EINTR).
pub fn sleep_until_ns(deadline_ns: u64) {
    let ts = libc::timespec {
        tv_sec: (deadline_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (deadline_ns % 1_000_000_000) as libc::c_long,
    };
    while now_ns() < deadline_ns {
        // SAFETY: valid timespec; a null remainder is allowed with TIMER_ABSTIME.
        let rc = unsafe { libc::clock_nanosleep(libc::CLOCK_MONOTONIC, libc::TIMER_ABSTIME, &ts, std::ptr::null_mut()) };
        if rc != 0 && rc != libc::EINTR {
            break;
        }
    }
}
