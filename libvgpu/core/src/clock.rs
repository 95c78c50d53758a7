//! Time base shared by every process on the host: CLOCK_MONOTONIC in nanoseconds.
//! Region timestamps written by one process are compared with `now_ns()` in another, so every
//! timestamp in shared state must come from here.

use std::sync::atomic::{AtomicU64, Ordering::*};

/// Nanoseconds on CLOCK_MONOTONIC (vDSO, ~20 ns, no syscall).
#[inline]
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid pointer to a timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// `now_ns()` for the launch path: the CPU's time-stamp counter scaled to CLOCK_MONOTONIC by a
/// calibration that `calibrate()` (the monitor thread, every tick) keeps fresh. Inside VMs
/// `clock_gettime` can fall back to a system call (hundreds of ns per launch); `rdtsc` cannot.
/// Until two calibrations exist, and off x86-64, it is `now_ns()`.
#[inline]
pub fn fast_now_ns() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        loop {
            let seq = CAL_SEQ.load(Acquire);
            if seq & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let q = CAL_NS_PER_TICK_Q32.load(Relaxed);
            let t0 = CAL_TSC.load(Relaxed);
            let m0 = CAL_MONO.load(Relaxed);
            if CAL_SEQ.load(Acquire) != seq {
                continue;
            }
            if q == 0 {
                return now_ns();
            }
            // SAFETY: rdtsc has no preconditions on x86-64.
            let t = unsafe { core::arch::x86_64::_rdtsc() };
            // A TSC read a little behind the calibration point (another CPU's counter) is the
            // calibration point itself, never a wrap to centuries ahead.
            let ticks = t.saturating_sub(t0) as u128;
            return m0.saturating_add(((ticks * q as u128) >> 32).min(u64::MAX as u128) as u64);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    now_ns()
}

#[cfg(target_arch = "x86_64")]
static CAL_SEQ: AtomicU64 = AtomicU64::new(0);
#[cfg(target_arch = "x86_64")]
static CAL_TSC: AtomicU64 = AtomicU64::new(0);
#[cfg(target_arch = "x86_64")]
static CAL_MONO: AtomicU64 = AtomicU64::new(0);
/// Nanoseconds per TSC tick in 32.32 fixed point; 0 = not calibrated.
#[cfg(target_arch = "x86_64")]
static CAL_NS_PER_TICK_Q32: AtomicU64 = AtomicU64::new(0);
/// The previous calibration point, kept by the (single) calibrating thread.
#[cfg(target_arch = "x86_64")]
static PREV: std::sync::Mutex<Option<(u64, u64)>> = std::sync::Mutex::new(None);

/// Refresh the TSC calibration (called periodically by one thread). Rebases on the current
/// point so drift against CLOCK_MONOTONIC never accumulates past one period; a TSC that goes
/// backwards or runs at an implausible rate disables the fast clock.
pub fn calibrate() {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: rdtsc has no preconditions on x86-64.
        let t = unsafe { core::arch::x86_64::_rdtsc() };
        let m = now_ns();
        let mut prev = PREV.lock().unwrap_or_else(|p| p.into_inner());
        let Some(q) = tsc_rate_q32(*prev, t, m) else { return };
        *prev = Some((t, m));
        CAL_SEQ.fetch_add(1, AcqRel);
        CAL_TSC.store(t, Relaxed);
        CAL_MONO.store(m, Relaxed);
        CAL_NS_PER_TICK_Q32.store(q, Relaxed);
        CAL_SEQ.fetch_add(1, Release);
    }
}

/// The calibration a TSC reading `t` at monotonic `m` gives after the point `prev`: ns per tick
/// in 32.32 fixed point, 0 to use `now_ns()` instead (no rate yet, an implausible one, or a
/// counter that went backwards: a resume that reset it would otherwise freeze `fast_now_ns` at
/// the old calibration point until the counter caught up), or `None`: too soon to measure.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn tsc_rate_q32(prev: Option<(u64, u64)>, t: u64, m: u64) -> Option<u64> {
    match prev {
        Some((pt, pm)) if t > pt && m > pm + 1_000_000 => {
            let q = (((m - pm) as u128) << 32) / (t - pt) as u128;
            // Plausible TSC rates: 0.2 to 10 GHz.
            Some(if ((1u128 << 32) / 10..=(5u128 << 32)).contains(&q) { q as u64 } else { 0 })
        }
        Some((pt, _)) if t <= pt => Some(0),
        Some(_) => None,
        None => Some(0),
    }
}

/// Forget the calibration (after fork the child re-calibrates from its own monitor thread).
pub fn reset_calibration() {
    #[cfg(target_arch = "x86_64")]
    {
        CAL_NS_PER_TICK_Q32.store(0, Release);
        *PREV.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

/// Seconds since the Unix epoch (HAMi's `last_kernel_time` is wall-clock seconds).
pub fn unix_seconds() -> u64 {
    unix_micros() / 1_000_000
}

/// Microseconds since the Unix epoch (NVML's sample timestamps).
pub fn unix_micros() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0)
}

/// Sleep for `ns` nanoseconds (clamped to at least 1 µs so a zero never busy-loops a caller).
pub fn sleep_ns(ns: u64) {
    std::thread::sleep(std::time::Duration::from_nanos(ns.max(1_000)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_clock_tracks_monotonic() {
        calibrate();
        sleep_ns(5_000_000);
        calibrate();
        for _ in 0..20 {
            let a = now_ns();
            let f = fast_now_ns();
            let b = now_ns();
            // Within 200 us of the system clock (the calibration is 5 ms old at most here).
            assert!(f + 200_000 >= a && f <= b + 200_000, "fast {f} vs [{a}, {b}]");
            sleep_ns(1_000_000);
        }
    }

    #[test]
    fn a_counter_that_went_backwards_turns_the_fast_clock_off_until_a_new_rate() {
        let (t, m) = (1_000_000_000_000u64, 5_000_000_000u64);
        // 3 GHz: 1/3 ns a tick.
        let q = tsc_rate_q32(Some((t, m)), t + 300_000_000, m + 100_000_000).expect("a rate");
        assert_eq!(q, (1u64 << 32) / 3);
        assert_eq!(tsc_rate_q32(Some((t, m)), t + 3_000, m + 1_000), None, "too soon");
        // Reset by a resume: the counter restarts near zero while time went on.
        assert_eq!(tsc_rate_q32(Some((t, m)), 42, m + 100_000_000), Some(0));
        assert_eq!(tsc_rate_q32(Some((t, m)), t, m + 100_000_000), Some(0));
        assert_eq!(tsc_rate_q32(None, t, m), Some(0), "one point gives no rate");
        assert_eq!(tsc_rate_q32(Some((t, m)), t + 1, m + 100_000_000), Some(0), "an implausible rate");
    }

    #[test]
    fn monotonic_and_sleeps() {
        let a = now_ns();
        sleep_ns(2_000_000);
        let b = now_ns();
        assert!(b >= a + 2_000_000, "slept {} ns", b - a);
        assert!(unix_seconds() > 1_700_000_000);
    }
}
