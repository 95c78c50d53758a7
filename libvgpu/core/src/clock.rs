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
static PREV: std::sync::Mutex<CalState> = std::sync::Mutex::new(CalState { prev: None, min_bracket_ns: u64::MAX, skipped: 0 });

/// What the calibrating thread keeps between calibrations.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
struct CalState {
    prev: Option<(u64, u64)>,
    /// The narrowest bracket seen (ns; `u64::MAX`: none yet).
    min_bracket_ns: u64,
    /// Calibrations in a row whose best reading was too wide.
    skipped: u32,
}

/// Refresh the TSC calibration (called periodically by one thread). Rebases on the current
/// point so drift against CLOCK_MONOTONIC never accumulates past one period; a TSC that goes
/// backwards or runs at an implausible rate disables the fast clock.
pub fn calibrate() {
    #[cfg(target_arch = "x86_64")]
    {
        let mut readings = [Reading::default(); READINGS];
        for r in &mut readings {
            // SAFETY: rdtsc has no preconditions on x86-64.
            let before = unsafe { core::arch::x86_64::_rdtsc() };
            let mono = now_ns();
            let after = unsafe { core::arch::x86_64::_rdtsc() };
            *r = Reading { before, mono, after };
        }
        let q_now = CAL_NS_PER_TICK_Q32.load(Relaxed);
        let mut cal = PREV.lock().unwrap_or_else(|p| p.into_inner());
        let Some((t, m)) = cal.take_point(&readings, q_now) else { return };
        let Some(q) = tsc_rate_q32(cal.prev, t, m) else { return };
        cal.prev = Some((t, m));
        CAL_SEQ.fetch_add(1, AcqRel);
        CAL_TSC.store(t, Relaxed);
        CAL_MONO.store(m, Relaxed);
        CAL_NS_PER_TICK_Q32.store(q, Relaxed);
        CAL_SEQ.fetch_add(1, Release);
    }
}

/// Readings taken per calibration.
const READINGS: usize = 5;
/// A calibration's best reading may span this much, or `BRACKET_SLACK` times the narrowest
/// seen (a machine whose clock read is a system call), before the calibration is skipped...
const MAX_BRACKET_NS: u64 = 2_000;
const BRACKET_SLACK: u64 = 4;
/// ...but never more than this many in a row: the point is rebased at least this often, so the
/// fast clock's drift stays bounded.
const MAX_SKIPPED: u32 = 10;

/// One calibration reading: the time-stamp counter just before and just after a CLOCK_MONOTONIC read.
#[derive(Clone, Copy, Debug, Default)]
struct Reading {
    before: u64,
    mono: u64,
    after: u64,
}

impl CalState {
    /// The calibration point of a set of readings, as (counter, monotonic): the reading whose
    /// counter reads lie closest together, at their middle. A thread preempted between its two
    /// reads (common on a loaded VM) pairs the counter with a clock read microseconds later:
    /// taken alone, such a reading set the rate 230 ppm off on a 2-core VM, and the fast clock
    /// drifted 22 us from CLOCK_MONOTONIC within a tick. `None` (skip this calibration) when even
    /// the best bracket is too wide at the known rate `q` (ns per tick, 32.32; 0: not known, any
    /// is taken), unless `MAX_SKIPPED` calibrations in a row were skipped.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn take_point(&mut self, readings: &[Reading], q: u64) -> Option<(u64, u64)> {
        let best = readings.iter().filter(|r| r.after >= r.before).min_by_key(|r| r.after - r.before)?;
        let ticks = best.after - best.before;
        if q != 0 {
            let ns = ((ticks as u128 * q as u128) >> 32).min(u64::MAX as u128) as u64;
            let limit = MAX_BRACKET_NS.max(self.min_bracket_ns.saturating_mul(BRACKET_SLACK));
            self.min_bracket_ns = self.min_bracket_ns.min(ns);
            if ns > limit && self.skipped < MAX_SKIPPED {
                self.skipped += 1;
                return None;
            }
        }
        self.skipped = 0;
        Some((best.before + ticks / 2, best.mono))
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
        *PREV.lock().unwrap_or_else(|p| p.into_inner()) = CalState { prev: None, min_bracket_ns: u64::MAX, skipped: 0 };
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

    /// A 3 GHz counter and a monotonic clock that agree; each calibration's readings are taken
    /// 100 ms apart, the `preempted`-th of them with the thread descheduled for 25 us between its
    /// counter read and its clock read. Returns the fast clock's worst error over 2 s (ns).
    fn worst_fast_clock_error(preempted: usize) -> u64 {
        let tsc = |ns: u64| ns * 3;
        let (mut prev, mut cal, mut worst) = (None, None::<(u64, u64, u64)>, 0u64);
        let mut state = fresh();
        for k in 0..20u64 {
            let t0 = 1_000_000_000 + k * 100_000_000;
            if let Some((ct, cm, q)) = cal {
                // The clock just before this calibration, at its most drifted.
                let ticks = (tsc(t0) - ct) as u128;
                let fast = cm + ((ticks * q as u128) >> 32) as u64;
                worst = worst.max(fast.abs_diff(t0));
            }
            let readings: Vec<Reading> = (0..READINGS as u64)
                .map(|i| {
                    let at = t0 + i * 1_000;
                    let late = if i as usize == preempted { 25_000 } else { 0 };
                    Reading { before: tsc(at), mono: at + 20 + late, after: tsc(at + 40 + late) }
                })
                .collect();
            let q_now = cal.map_or(0, |c| c.2);
            let Some((t, m)) = state.take_point(&readings, q_now) else { continue };
            match tsc_rate_q32(prev, t, m) {
                Some(q) if q != 0 => cal = Some((t, m, q)),
                _ => {}
            }
            prev = Some((t, m));
        }
        worst
    }

    #[test]
    fn a_reading_preempted_between_its_counter_and_clock_reads_does_not_move_the_fast_clock() {
        for preempted in 0..READINGS {
            let worst = worst_fast_clock_error(preempted);
            assert!(worst <= 100, "preempted reading {preempted}: the fast clock drifted {worst} ns from monotonic");
        }
    }

    fn fresh() -> CalState {
        CalState { prev: None, min_bracket_ns: u64::MAX, skipped: 0 }
    }

    #[test]
    fn a_calibration_with_every_reading_preempted_keeps_the_old_point_for_a_while() {
        let r = Reading { before: 3_000, mono: 26_000, after: 78_000 };
        let q = (1u64 << 32) / 3; // 1/3 ns a tick
        let mut state = fresh();
        assert_eq!(state.take_point(&[r; READINGS], 0), Some((40_500, 26_000)), "with no rate yet, the best there is");
        let mut state = fresh();
        let good = Reading { before: 0, mono: 20, after: 120 };
        assert!(state.take_point(&[good; READINGS], q).is_some(), "a 40 ns bracket");
        for _ in 0..MAX_SKIPPED {
            assert_eq!(state.take_point(&[r; READINGS], q), None, "a 25 us bracket is no calibration point");
        }
        assert!(state.take_point(&[r; READINGS], q).is_some(), "but the point is rebased at least every MAX_SKIPPED calibrations");
        assert_eq!(state.take_point(&[r; READINGS], q), None, "and the count starts over");
    }

    #[test]
    fn a_clock_read_that_is_always_slow_still_calibrates() {
        // A clock source read by a system call: every bracket about 3 us, none narrower.
        let q = (1u64 << 32) / 3;
        let mut state = fresh();
        for k in 0..20u64 {
            let at = k * 300_000_000; // ticks, 100 ms apart
            let r = Reading { before: at, mono: at / 3 + 1_500, after: at + 9_000 };
            assert!(state.take_point(&[r; READINGS], q).is_some(), "calibration {k} skipped with a 3 us bracket every time");
        }
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
