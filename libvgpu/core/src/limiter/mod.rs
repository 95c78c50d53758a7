//! Compute limiter policy (pure; the FFI glue is `libvgpu/src/launch.rs`).
//!
//! # What the cap means
//! `CUDA_DEVICE_SM_LIMIT=p` bounds the container's GPU utilization as NVML / nvidia-smi report
//! it for the device: the fraction of wall time during which at least one kernel of the
//! container is executing, across all its processes, threads, streams and contexts. A program
//! whose uncapped utilization u0 is below p is not slowed; above, it runs at p/u0 of its
//! uncapped throughput (CPU time between kernels is not GPU time and is never charged).
//!
//! # How
//! * `meter`: each process measures when its kernels ran with a timing event after every gated
//!   launch (`[max(previous end on the stream, submit), event time)`).
//! * `busy`: those intervals are marked in a per-device bitmap shared by the container, so the
//!   time charged is the union over streams and processes, whatever order they report in.
//! * `Bucket`: the container's token bucket, refilled at cap x wall time (up to `save_ns`),
//!   pays for the newly covered time. In debt, launches
//!   wait; queued work is bounded so the GPU cannot run far past the budget before the
//!   measurements arrive.
//! * Every wait is bounded (`MAX_HOLD_NS`): a stalled rank must not deadlock a collective.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::*};

pub mod busy;
pub mod calibrate;
pub mod eventclock;
pub mod kinds;
pub mod meter;
pub mod tenants;

pub use busy::BusyMap;
pub use meter::{hold, hold_for, EventState, Events, Meter, MeterStats, Step, StreamKey};

/// Per-device limiter state shared by every process of a container (lives in the region
/// extension, one per device). All fields are atomics: processes update it without a lock.
#[repr(C, align(64))]
#[derive(Default)]
pub struct SharedDeviceState {
    /// Token bucket balance in nanoseconds of GPU time; negative = debt.
    pub tokens_ns: AtomicI64,
    /// When the bucket was last refilled (clock::now_ns).
    pub refilled_at_ns: AtomicU64,
    /// Unused since the busy bitmap (kept for the layout).
    pub charged_until_ns: AtomicU64,
    /// Busy time charged since `window_start_ns` (utilization reporting).
    pub window_busy_ns: AtomicU64,
    pub window_start_ns: AtomicU64,
    /// Last completed window's utilization in percent x 100 (0..=10000).
    pub util_centi_percent: AtomicU64,
    /// Total busy time charged, ns (monotonic counter for tools).
    pub total_busy_ns: AtomicU64,
    /// Latest launch on this device by any process of the container (clock::now_ns).
    pub last_launch_ns: AtomicU64,
    /// The container's launches wait until then (set by whoever found the bucket in debt):
    /// every thread and process resumes at the same instant, so kernels that ran side by side
    /// uncapped still do under the cap. Its low 7 bits: the cap it was reckoned at
    /// (`meter::closure_of`).
    pub closed_until_ns: AtomicU64,
    /// End of the latest interval charged, and which process (`Meter::owner`) charged it.
    pub union_end_ns: AtomicU64,
    pub union_owner: AtomicU64,
    /// NVML busy time per measured ns, x1000 (`calibrate`; 0 = not learned, 1000).
    pub charge_scale_milli: AtomicU64,
    /// When the scale last stepped (clock::now_ns): one step a second per container.
    pub calibrated_at_ns: AtomicU64,
    /// The device's memory ledger lock (`region::ledger_lock`): 0 free, else the holder's pid.
    pub ledger_lock: AtomicU64,
    /// Room to grow without changing the extension layout.
    pub reserved: [AtomicU64; 2],
}

const _: () = assert!(std::mem::size_of::<SharedDeviceState>() == 128);

/// Bucket ceiling, at least: how far ahead of its rate a container may burst.
pub const BURST_NS: i64 = 4_000_000;
/// A container idle on the GPU saves cap% of this much wall time (`save_ns`), to spend when its
/// work comes: a training step whose host side left the GPU idle 20 ms a step kept 4 ms of the
/// 10 it saved under a cap of 50 and ran at 40% (simulator).
pub const SAVE_WINDOW_NS: u64 = 100_000_000;
/// But never more than this: 12 ms spent at once adds at most 6 points to a 200 ms NVML sample
/// (cap% of 100 ms let one read 1.5 x cap). An H100's one-a-second reading covers about 100 ms
/// (`bench/py/reading_window.py`: a 20 ms pulse reads 20), where right after a long idle it may
/// read up to 9-10 points over the cap (simulator); a program idle that long reads far under the
/// cap in the readings of its idle anyway.
pub const SAVE_MAX_NS: i64 = 12_000_000;
/// Debt tolerated before a launch waits (amortizes sleep overshoot and syscalls).
pub const DEBT_SLEEP_NS: i64 = 1_000_000;

/// The deepest debt a container capped at `cap`% keeps: what one full hold (`MAX_HOLD_NS`) at
/// the cap repays, and the tolerated debt. Work a hold that ran out let go is not owed beyond
/// it: 500 ms kernels under a cap of 10 ran up 0.1 s of debt a second without it, and after an
/// hour every launch of every process waited its full 2 s, long after the work or the cap changed.
/// Normal debts are a few ms (the queue bound); this binds only when holds run out.
pub fn max_debt_ns(cap: u32) -> i64 {
    (MAX_HOLD_NS as i64).saturating_mul(cap.min(100) as i64) / 100 + DEBT_SLEEP_NS
}
/// Longest a single launch may be held back, all waits included.
pub const MAX_HOLD_NS: u64 = 2_000_000_000;
/// Minimum spacing of bucket refills.
pub const REFILL_MIN_NS: u64 = 50_000;
/// Period of the utilization window kept in `SharedDeviceState`.
pub const UTIL_WINDOW_NS: u64 = 500_000_000;
/// A gap this short between the kernels of two processes of the container is the GPU switching
/// between their contexts (time-slicing): NVML counts it busy, so it is charged too.
pub const SWITCH_GAP_NS: u64 = 100_000;
/// Waits shorter than this poll (yield) instead of sleeping, and longer waits sleep this much
/// less than asked, then poll: a sleep overshoots by the timer slack (~50 us, varying), which
/// would leave the GPU idle behind a short queue and wake the container's threads apart.
pub const SPIN_WAIT_NS: u64 = 80_000;

/// Effective share for a device right now, in percent (1..=100); `None` = no cap.
pub type CapPercent = Option<u32>;

/// Time and waiting, abstracted so the policy runs against a virtual clock in tests.
pub trait Clock {
    fn now_ns(&self) -> u64;
    fn sleep_ns(&mut self, ns: u64);
    /// Give the CPU away briefly while polling (sched_yield): returns within microseconds.
    fn pause(&mut self);
}

/// The container's bucket and busy map for one device, refilled lazily by whichever process
/// looks first.
pub struct Bucket<'a> {
    pub s: &'a SharedDeviceState,
    pub map: &'a BusyMap,
}

/// How much budget a container capped at `cap`% may save while idle on the GPU.
pub fn save_ns(cap: u32) -> i64 {
    ((SAVE_WINDOW_NS * cap.min(100) as u64 / 100) as i64).clamp(BURST_NS, SAVE_MAX_NS)
}

impl<'a> Bucket<'a> {
    pub fn new(s: &'a SharedDeviceState, map: &'a BusyMap) -> Self {
        Bucket { s, map }
    }
}

impl Bucket<'_> {
    /// Add `cap`% of the wall time since the last refill, clamped to `BURST_NS`. Refills closer
    /// than `REFILL_MIN_NS` apart are skipped: no shared-line write on every launch.
    pub fn refill(&self, now: u64, cap: u32) {
        self.refill_to(now, cap, BURST_NS)
    }

    /// `refill`, clamped to `burst_ns` (at least `BURST_NS`): `save_ns(cap)` for a capped
    /// container, or its part of the period while it takes turns with others (it saves its
    /// share while they run, to spend it in its own part). The debt is floored at
    /// `max_debt_ns(cap)`, and at 0 uncapped (cap 100): an uncapped container is charged at its
    /// calibrated scale, which may exceed 1, and a cap set later must start clean.
    pub fn refill_to(&self, now: u64, cap: u32, burst_ns: i64) {
        let burst = burst_ns.max(BURST_NS);
        let last = self.s.refilled_at_ns.load(Relaxed);
        if now <= last || (last != 0 && now - last < REFILL_MIN_NS) {
            return;
        }
        if self.s.refilled_at_ns.compare_exchange(last, now, AcqRel, Relaxed).is_err() {
            return; // another process refilled this interval
        }
        if last == 0 {
            // First use: start at zero balance, not with a refill for all of history.
            return;
        }
        let add = ((now - last) as u128 * cap as u128 / 100).min(i64::MAX as u128) as i64;
        let floor = if cap >= 100 { 0 } else { -max_debt_ns(cap) };
        // One compare-and-swap: an add then a separate clamp could wrap the balance (a bogus
        // `now`) or erase a charge another process made in between.
        let _ = self.s.tokens_ns.fetch_update(AcqRel, Acquire, |t| Some(t.saturating_add(add).min(burst).max(floor)));
    }

    /// Charge the busy interval `[start, end)` of one process: only the part no process of the
    /// container reported yet (the union). The bucket pays it at the calibrated scale (NVML's
    /// busy time per measured ns, `calibrate`), times `share_milli`/1000 (less than all when
    /// another tenant slowed our work); utilization counts it at the scale, whole.
    /// Returns the newly covered ns (as measured).
    pub fn charge(&self, start: u64, end: u64, share_milli: u64, now: u64, owner: u64) -> u64 {
        let now = now.max(end);
        let (prev_end, prev_owner) = (self.s.union_end_ns.load(Relaxed), self.s.union_owner.load(Relaxed));
        let switch = prev_owner != owner && start > prev_end && start - prev_end <= SWITCH_GAP_NS;
        let mut fresh = if switch { self.map.mark(prev_end, start, now) } else { 0 };
        fresh += self.map.mark(start, end, now);
        if self.s.union_end_ns.fetch_max(end, Relaxed) < end {
            self.s.union_owner.store(owner, Relaxed);
        }
        if fresh == 0 {
            return 0;
        }
        let scaled = fresh * self.scale_milli() / 1000;
        let cost = scaled * share_milli.min(1000) / 1000;
        self.s.tokens_ns.fetch_sub(cost as i64, AcqRel);
        self.s.window_busy_ns.fetch_add(scaled, Relaxed);
        self.s.total_busy_ns.fetch_add(fresh, Relaxed);
        fresh
    }

    /// The calibrated charge per measured ns, x1000.
    pub fn scale_milli(&self) -> u64 {
        calibrate::effective(self.s.charge_scale_milli.load(Relaxed))
    }

    /// One calibration step from a closed window of NVML readings, by whichever process of the
    /// container gets there first this second; returns the new scale if this call stepped.
    pub fn calibrate(&self, w: calibrate::Window, now: u64) -> Option<u64> {
        let at = self.s.calibrated_at_ns.load(Relaxed);
        if at != 0 && now < at + calibrate::CALIBRATE_EVERY_NS * 9 / 10 {
            return None;
        }
        self.s.calibrated_at_ns.compare_exchange(at, now, AcqRel, Relaxed).ok()?;
        let next = calibrate::next_scale(self.s.charge_scale_milli.load(Relaxed), w);
        self.s.charge_scale_milli.store(next, Relaxed);
        Some(next)
    }

    pub fn balance(&self) -> i64 {
        self.s.tokens_ns.load(Acquire)
    }

    /// The balance a refill at `now` would leave (`refill_to`), without refilling: the bucket
    /// is refilled only where the budget is checked, so a thread held before that check read a
    /// balance that only fell.
    pub fn balance_at(&self, now: u64, cap: u32, burst_ns: i64) -> i64 {
        let (balance, last) = (self.balance(), self.s.refilled_at_ns.load(Acquire));
        if last == 0 || now <= last {
            return balance;
        }
        let add = ((now - last) as u128 * cap as u128 / 100).min(i64::MAX as u128) as i64;
        balance.max(balance.saturating_add(add).min(burst_ns.max(BURST_NS)))
    }

    /// Close the utilization window if it is older than `UTIL_WINDOW_NS`; returns the new
    /// utilization (centi-percent) when a window closed.
    pub fn roll_window(&self, now: u64) -> Option<u64> {
        let start = self.s.window_start_ns.load(Relaxed);
        if start == 0 {
            let _ = self.s.window_start_ns.compare_exchange(0, now, Relaxed, Relaxed);
            return None;
        }
        if now < start + UTIL_WINDOW_NS {
            return None;
        }
        if self.s.window_start_ns.compare_exchange(start, now, AcqRel, Relaxed).is_err() {
            return None;
        }
        let busy = self.s.window_busy_ns.swap(0, AcqRel);
        let util = (busy as u128 * 10_000 / (now - start) as u128).min(10_000) as u64;
        self.s.util_centi_percent.store(util, Relaxed);
        Some(util)
    }
}

#[cfg(test)]
mod sim;
