//! Time base shared by every process on the host: CLOCK_MONOTONIC in nanoseconds.
//! Region timestamps written by one process are compared with `now_ns()` in another, so every
//! timestamp in shared state must come from here.

/// Nanoseconds on CLOCK_MONOTONIC (vDSO, ~20 ns, no syscall).
#[inline]
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid pointer to a timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Seconds since the Unix epoch (HAMi's `last_kernel_time` is wall-clock seconds).
pub fn unix_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Sleep for `ns` nanoseconds (clamped to at least 1 µs so a zero never busy-loops a caller).
pub fn sleep_ns(ns: u64) {
    std::thread::sleep(std::time::Duration::from_nanos(ns.max(1_000)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_and_sleeps() {
        let a = now_ns();
        sleep_ns(2_000_000);
        let b = now_ns();
        assert!(b >= a + 2_000_000, "slept {} ns", b - a);
        assert!(unix_seconds() > 1_700_000_000);
    }
}
