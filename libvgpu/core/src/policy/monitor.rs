//! What the monitor thread decides each tick, from the launch gate's counters, NVML's readings and
//! the region's figures: when it does what, the utilization it publishes per process and for the
//! container, whether a kernel ran, and the memory it charges or gives back for growth NVML sees.
//! (The limiter's own decisions, calibration and other tenants, are `limiter::{calibrate,tenants}`.)

use crate::ledger::Growth;

/// Stats are published every this many ticks (HAMi fields and per-process utilization).
pub const PUBLISH_EVERY: u32 = 2;
/// Region upkeep (re-attach a replaced file, reap dead slots) every this many ticks.
pub const UPKEEP_EVERY: u32 = 10;
/// Growth of what the device holds is followed every this many ticks.
pub const GROWTH_EVERY: u32 = PUBLISH_EVERY * 5;
/// NVML's per-process samples are asked for from this long before the previous reading.
pub const NVML_LOOKBACK_US: u64 = 2_000_000;

/// A device where nothing follows the other tenants (no cap or soft cap, no gate, no node file)
/// asks NVML for its utilization and processes only every this many ticks (1 s): on an H100 one
/// round of those calls took 5-9 ms of the driver, and five rounds per publishing period slowed
/// another process's cuMemAlloc+cuMemFree by 9% (`bench/py/nvml_poll_cost.py`, session 23).
pub const PLAIN_NVML_EVERY: u32 = 10;

/// Under a cap, NVML's utilization samples (the charge calibration's) are fetched once per this
/// many publishing ticks (1 s), the feed's busy history (3.2 s) placing those a second old as
/// well: each `nvmlDeviceGetSamples` stalls the program's next driver call past 1 ms, about every
/// time (H200, session 27: 5.1 slow 1-MiB malloc+free pairs a second beside one call every 200
/// ms, none beside `nvmlDeviceGetUtilizationRates`).
pub const SAMPLES_EVERY: u32 = 5;

/// Another process of the container that launched within this long may have work on the GPU
/// (its monitor notes a launch every publishing tick, 200 ms).
pub const SIBLING_RECENT_NS: u64 = 1_000_000_000;

/// Did another process of the container launch lately, from the times its monitor noted a
/// launch (0: never)? A paced launch here may then wait behind its work, so it is timed by an
/// event, not charged its kind's figure from its submission (`limiter::meter`).
pub fn siblings_active(others_last_launch_ns: impl IntoIterator<Item = u64>, now: u64) -> bool {
    others_last_launch_ns.into_iter().any(|t| t != 0 && now.saturating_sub(t) < SIBLING_RECENT_NS)
}

/// Does tick `tick` fetch NVML's utilization samples (a publishing tick, once a second)?
pub fn samples_due(tick: u32) -> bool {
    tick.is_multiple_of(PUBLISH_EVERY * SAMPLES_EVERY)
}

/// Does publishing tick `tick` ask NVML about a device? Every one while something follows the
/// other tenants there (`plain` false: a cap to calibrate, contention to see, a soft cap to
/// give back); else once per `PLAIN_NVML_EVERY` ticks, enough for the utilization it publishes.
pub fn nvml_due(tick: u32, plain: bool) -> bool {
    !plain || tick.is_multiple_of(PLAIN_NVML_EVERY)
}

/// What tick number `tick` does (besides refreshing the gate, which every tick does).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Schedule {
    pub upkeep: bool,
    pub publish: bool,
    /// Only on publishing ticks.
    pub growth: bool,
}

pub fn schedule(tick: u32) -> Schedule {
    let publish = tick.is_multiple_of(PUBLISH_EVERY);
    Schedule { upkeep: tick.is_multiple_of(UPKEEP_EVERY), publish, growth: publish && tick.is_multiple_of(GROWTH_EVERY) }
}

/// What the monitor last learned from one device's gate (kept across ticks on which the gate
/// was busy, so counters never drop and rates divide by the time they really cover).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GateStats {
    pub busy_ns: u64,
    pub launches: u64,
    pub at_ns: u64,
}

/// The process's use of a device between two gate readings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GateSample {
    /// Busy time per elapsed time, in percent (at most 100): the process's SM utilization.
    pub util_pct: u64,
    /// Whether a kernel ran or was launched.
    pub launched: bool,
}

impl GateStats {
    /// Fold the gate's counters (`busy` ns, `launches`) read at `now`; returns the interval's
    /// sample when an earlier reading exists (the first one only starts the interval).
    pub fn advance(&mut self, busy: u64, launches: u64, now: u64) -> Option<GateSample> {
        let last = *self;
        let sample = (last.at_ns > 0 && now > last.at_ns).then(|| {
            let delta = busy.saturating_sub(last.busy_ns);
            GateSample {
                util_pct: (delta.saturating_mul(100) / (now - last.at_ns)).min(100),
                launched: delta > 0 || launches > last.launches,
            }
        });
        *self = GateStats { busy_ns: busy, launches, at_ns: now };
        sample
    }
}

/// The process's busy ns and launches over every device (the region's extension fields).
pub fn totals(stats: &[GateStats]) -> (u64, u64) {
    (stats.iter().map(|s| s.busy_ns).sum(), stats.iter().map(|s| s.launches).sum())
}

/// Utilization taken from NVML (devices without a gate measure nothing themselves).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NvmlUtil {
    /// The process's utilization (percent).
    pub proc_util: u32,
    /// The container's utilization to write (percent); `None` leaves the figure alone: an idle
    /// process of the container must not zero what a busy one wrote.
    pub container_util: Option<u32>,
}

/// Utilization without a cap: NVML's per-process samples (`proc_sm(hostpid)`) when our host PID
/// is known (shared PID namespace), else the device's utilization (`gpu()`) while this process
/// launched (exact when the container is alone on the GPU), else 0. Only a process that launched
/// writes the container's figure: the device's utilization, or its own when NVML has none.
pub fn nvml_util(hostpid: i32, launched: bool, proc_sm: impl FnOnce(u32) -> Option<u32>,
    mut gpu: impl FnMut() -> Option<u32>) -> NvmlUtil {
    let proc_util = if hostpid > 0 {
        proc_sm(hostpid as u32).unwrap_or(0)
    } else if launched {
        gpu().unwrap_or(0)
    } else {
        0
    };
    let container_util = launched.then(|| gpu().unwrap_or(proc_util));
    NvmlUtil { proc_util, container_util }
}

/// NVML's per-process utilization is not asked for while nothing of this process can be running
/// on the device: it launched nothing yet, or nothing for this long and the last reading was 0 (a
/// kernel still running by then is in that reading: each covers the `NVML_LOOKBACK_US` before
/// it). Each ask takes about 2.8 ms of the driver and stalls another thread's allocation past
/// 1 ms (H200, session 25), so a process that only allocates asks nothing.
pub const PROC_QUIET_NS: u64 = 3_000_000_000;

/// What the per-process NVML readings of one device have seen (`ProcLook::proc_util`).
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcLook {
    /// When a look last found launches since the one before (monotonic ns).
    last_launch_ns: Option<u64>,
    /// The last reading taken.
    last_util: Option<u32>,
}

impl ProcLook {
    /// The process's utilization at `now` (`launched`: it launched since the last look), from
    /// `ask` (NVML) unless nothing of it can be running (`PROC_QUIET_NS`): then 0 unasked.
    pub fn proc_util(&mut self, launched: bool, now: u64, ask: impl FnOnce() -> Option<u32>) -> u32 {
        if launched {
            self.last_launch_ns = Some(now);
        }
        let quiet = self.last_launch_ns.is_none_or(|t| self.last_util == Some(0) && now.saturating_sub(t) >= PROC_QUIET_NS);
        if quiet {
            return 0;
        }
        let util = ask().unwrap_or(0);
        self.last_util = Some(util);
        util
    }
}

/// Where the next per-process NVML reading starts, given the wall clock now (µs since the epoch).
pub fn nvml_next_since(now_unix_us: u64) -> u64 {
    now_unix_us.saturating_sub(NVML_LOOKBACK_US)
}

/// A change of the process's context charge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Adjust {
    Charge(u64),
    Release(u64),
}

/// Follow what the device holds for this process beyond the hook's own accounting (a context
/// grows after it was measured), from NVML's per-process figure `held(hostpid)`, when NVML can see
/// the process (host PID known); `accounted()` is the region's total for the process (growth
/// included). Returns the charge to add or give back, after two agreeing readings (`Growth`).
pub fn follow_growth(g: &mut Growth, hostpid: i32, held: impl FnOnce(u32) -> Option<u64>,
    accounted: impl FnOnce() -> u64) -> Option<Adjust> {
    if hostpid <= 0 {
        return None;
    }
    let held = held(hostpid as u32)?;
    match g.update(held, accounted()) {
        0 => None,
        d if d > 0 => Some(Adjust::Charge(d as u64)),
        d => Some(Adjust::Release(d.unsigned_abs())),
    }
}

/// The cap the charge calibration learns under: only a capped device the container has alone;
/// else why it pauses.
pub fn calibration_cap(cap: Option<u32>, alone: bool) -> Result<u32, &'static str> {
    match cap {
        Some(c) if alone => Ok(c),
        _ => Err(if alone { "no cap" } else { "another tenant" }),
    }
}

/// One NVML sample's value as a percent, from the raw bytes of its `nvmlValue_t` and the
/// `nvmlValueType_t` the call named (double, unsigned int, unsigned long, unsigned long long,
/// signed long long, signed int, unsigned short); `None` for a type NVML does not define.
pub fn sample_percent(value_type: i32, raw: u64) -> Option<u32> {
    let v: f64 = match value_type {
        0 => f64::from_bits(raw),
        1 => raw as u32 as f64,
        2 | 3 => raw as f64,
        4 => raw as i64 as f64,
        5 => raw as u32 as i32 as f64,
        6 => raw as u16 as f64,
        _ => return None,
    };
    Some(if v.is_nan() { 0 } else { v.clamp(0.0, 100.0).round() as u32 })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn a_sibling_counts_as_active_for_a_second_after_its_last_launch() {
        let now = 10 * SIBLING_RECENT_NS;
        assert!(!siblings_active([], now), "alone");
        assert!(!siblings_active([0, now - SIBLING_RECENT_NS], now), "never launched, or a second ago");
        assert!(siblings_active([0, now - SIBLING_RECENT_NS + 1], now));
        assert!(siblings_active([now + 5], now), "a time noted after ours was read");
    }

    #[test]
    fn samples_are_fetched_once_a_second_on_publishing_ticks() {
        let due: Vec<u32> = (1..=40).filter(|&t| samples_due(t)).collect();
        assert_eq!(due, [10, 20, 30, 40]);
        assert!(due.iter().all(|&t| schedule(t).publish));
    }

    #[test]
    fn sample_values_decode_by_their_type() {
        assert_eq!(sample_percent(1, 0xFFFF_FFFF_0000_0019), Some(25), "unsigned int: the low 4 bytes");
        assert_eq!(sample_percent(0, 37.6f64.to_bits()), Some(38));
        assert_eq!(sample_percent(3, 250), Some(100), "clamped");
        assert_eq!(sample_percent(5, (-3i32) as u32 as u64), Some(0));
        assert_eq!(sample_percent(6, 0xAAAA_0040), Some(64));
        assert_eq!(sample_percent(0, f64::NAN.to_bits()), Some(0));
        assert_eq!(sample_percent(9, 1), None);
    }

    const MIB: u64 = 1 << 20;
    const MS: u64 = 1_000_000;

    #[test]
    fn a_plain_device_asks_nvml_once_a_second_and_a_followed_one_each_publishing_tick() {
        let plain: Vec<u32> = (1..=40).filter(|&t| schedule(t).publish && nvml_due(t, true)).collect();
        assert_eq!(plain, vec![10, 20, 30, 40]);
        let followed = (1..=40).filter(|&t| schedule(t).publish && nvml_due(t, false)).count();
        assert_eq!(followed, 20);
        assert!(nvml_due(0, true)); // the tick counter wraps to 0
    }

    #[test]
    fn the_schedule() {
        let s: Vec<Schedule> = (1..=20).map(schedule).collect();
        assert_eq!(s.iter().filter(|s| s.publish).count(), 10);
        assert_eq!(s.iter().filter(|s| s.upkeep).count(), 2);
        assert_eq!(s.iter().filter(|s| s.growth).count(), 2);
        assert_eq!(schedule(10), Schedule { upkeep: true, publish: true, growth: true });
        assert_eq!(schedule(3), Schedule { upkeep: false, publish: false, growth: false });
        assert!(s.iter().all(|s| !s.growth || s.publish));
        assert!(schedule(0).publish); // the tick counter wraps to 0
    }

    #[test]
    fn gate_samples_from_scripted_readings() {
        let mut g = GateStats::default();
        // First reading: starts the interval, publishes nothing.
        assert_eq!(g.advance(5 * MS, 10, 100 * MS), None);
        // 50 ms busy over 200 ms: 25%, launched.
        assert_eq!(g.advance(55 * MS, 12, 300 * MS), Some(GateSample { util_pct: 25, launched: true }));
        // Nothing new: 0%, no launch.
        assert_eq!(g.advance(55 * MS, 12, 500 * MS), Some(GateSample { util_pct: 0, launched: false }));
        // A launch that has not run yet still counts as launched.
        assert_eq!(g.advance(55 * MS, 13, 700 * MS), Some(GateSample { util_pct: 0, launched: true }));
        // Busy time covering more than the interval (queued work) is capped at 100%.
        assert_eq!(g.advance(600 * MS, 13, 900 * MS), Some(GateSample { util_pct: 100, launched: true }));
        // A clock that did not move: no sample, the counters still advance.
        assert_eq!(g.advance(700 * MS, 14, 900 * MS), None);
        assert_eq!(g, GateStats { busy_ns: 700 * MS, launches: 14, at_ns: 900 * MS });
        // Counters that went back (a gate reset) never give a negative or huge figure.
        assert_eq!(g.advance(0, 0, 1100 * MS), Some(GateSample { util_pct: 0, launched: false }));
        assert_eq!(totals(&[g, GateStats { busy_ns: 3, launches: 4, at_ns: 1 }]), (3, 4));
    }

    #[test]
    fn nvml_util_with_a_host_pid_uses_the_process_samples() {
        let asked = Cell::new(0);
        let u = nvml_util(4012, true, |pid| { assert_eq!(pid, 4012); Some(30) }, || { asked.set(asked.get() + 1); Some(70) });
        assert_eq!(u, NvmlUtil { proc_util: 30, container_util: Some(70) });
        assert_eq!(asked.get(), 1, "the device reading is taken once, for the container");
        // Not launched: its own figure only, the container's is left alone.
        let u = nvml_util(4012, false, |_| Some(0), || panic!("no device reading needed"));
        assert_eq!(u, NvmlUtil { proc_util: 0, container_util: None });
        // No sample for the process: 0.
        assert_eq!(nvml_util(4012, false, |_| None, || None).proc_util, 0);
    }

    #[test]
    fn nvml_util_without_a_host_pid_uses_the_device_while_launching() {
        let u = nvml_util(0, true, |_| panic!("no per-process reading without a host PID"), || Some(64));
        assert_eq!(u, NvmlUtil { proc_util: 64, container_util: Some(64) });
        let u = nvml_util(-1, false, |_| panic!(), || panic!("an idle process reads nothing"));
        assert_eq!(u, NvmlUtil { proc_util: 0, container_util: None });
        // NVML failing: 0 for the process, and the container's figure is its own.
        assert_eq!(nvml_util(0, true, |_| None, || None), NvmlUtil { proc_util: 0, container_util: Some(0) });
        // The device reading failing only the second time: the process's figure is kept.
        let n = Cell::new(0);
        let gpu = || { n.set(n.get() + 1); (n.get() == 1).then_some(40) };
        assert_eq!(nvml_util(0, true, |_| None, gpu), NvmlUtil { proc_util: 40, container_util: Some(40) });
    }

    #[test]
    fn the_process_reading_is_not_asked_for_while_nothing_of_ours_can_be_running() {
        const S: u64 = 1_000_000_000;
        let asked = Cell::new(0);
        // Counts when NVML is asked (the closure called), not when one is made.
        let ask = |u: u32| { let asked = &asked; move || { asked.set(asked.get() + 1); Some(u) } };
        let mut look = ProcLook::default();
        // Never launched (a process that only allocates): 0, and NVML is never asked.
        for t in 1..10 {
            assert_eq!(look.proc_util(false, t * S, ask(50)), 0);
        }
        assert_eq!(asked.get(), 0);
        // A launch: asked at every look while it may still run, even where a reading was 0 (its
        // samples had not arrived yet) ...
        assert_eq!(look.proc_util(true, 10 * S, ask(0)), 0);
        assert_eq!(look.proc_util(false, 11 * S, ask(0)), 0);
        assert_eq!(look.proc_util(false, 12 * S, ask(70)), 70);
        // ... and while the readings say it runs, however long ago it was launched.
        assert_eq!(look.proc_util(false, 20 * S, ask(65)), 65);
        assert_eq!(look.proc_util(false, 21 * S, ask(0)), 0);
        assert_eq!(asked.get(), 5);
        // A 0 reading PROC_QUIET_NS after the last launch: quiet until the next launch.
        assert_eq!(look.proc_util(false, 22 * S, ask(40)), 0);
        assert_eq!(look.proc_util(false, 30 * S, ask(40)), 0);
        assert_eq!(asked.get(), 5);
        assert_eq!(look.proc_util(true, 31 * S, ask(40)), 40);
        // Under PROC_QUIET_NS since the launch: asked even after a 0.
        assert_eq!(look.proc_util(false, 32 * S, ask(0)), 0);
        assert_eq!(look.proc_util(false, 33 * S, ask(0)), 0);
        assert_eq!(look.proc_util(false, 34 * S, ask(9)), 0, "3 s after the launch and read 0: not asked");
        assert_eq!(asked.get(), 8);
        // NVML giving nothing reads 0, and quiets like a 0.
        let mut look = ProcLook::default();
        assert_eq!(look.proc_util(true, S, || None), 0);
        assert_eq!(look.proc_util(false, 5 * S, || panic!("quiet: not asked")), 0);
    }

    #[test]
    fn nvml_lookback() {
        assert_eq!(nvml_next_since(10_000_000), 8_000_000);
        assert_eq!(nvml_next_since(1), 0);
    }

    #[test]
    fn growth_follows_scripted_nvml_readings() {
        let mut g = Growth::default();
        // No host PID: NVML cannot see us, nothing is read.
        assert_eq!(follow_growth(&mut g, 0, |_| panic!("no reading"), || panic!()), None);
        // NVML has no figure for the process: nothing.
        assert_eq!(follow_growth(&mut g, 77, |_| None, || panic!("not read without a reading")), None);
        // The context grew from 518 to 537 MiB: charged after the second agreeing reading.
        let accounted = Cell::new(518 * MIB);
        let mut step = |held: u64| follow_growth(&mut g, 77, |pid| { assert_eq!(pid, 77); Some(held) }, || accounted.get());
        assert_eq!(step(537 * MIB), None);
        assert_eq!(step(537 * MIB), Some(Adjust::Charge(19 * MIB)));
        accounted.set(537 * MIB);
        assert_eq!(step(537 * MIB), None);
        // It shrinks back: given back after two readings.
        assert_eq!(step(518 * MIB), None);
        assert_eq!(step(518 * MIB), Some(Adjust::Release(19 * MIB)));
    }

    #[test]
    fn calibration_runs_only_capped_and_alone() {
        assert_eq!(calibration_cap(Some(30), true), Ok(30));
        assert_eq!(calibration_cap(None, true), Err("no cap"));
        assert_eq!(calibration_cap(Some(30), false), Err("another tenant"));
        assert_eq!(calibration_cap(None, false), Err("another tenant"));
    }
}
