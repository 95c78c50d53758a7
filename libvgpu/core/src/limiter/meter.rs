//! One process's measurement of its own GPU time on one device, and the launch gate built on it.
//!
//! After every gated launch the glue records a timing event on the launch's stream. When the
//! event completes, the launch ran during `[max(end of the stream's previous event, submit
//! time), event time)`: on one stream kernels run in order, and none starts before it was
//! submitted. Those intervals, from every stream of every process of the container, are marked in
//! the shared `BusyMap`, whose newly covered time is the container's GPU utilization as NVML
//! reports it (the time during which at least one of its kernels ran). CPU time between kernels
//! is never charged; several threads, streams or processes running at once are charged once.
//!
//! The gate then keeps two promises:
//! * queued work is bounded (under a cap, `QUEUE_TARGET_NS` or what the bucket can pay, whichever
//!   is more, of estimated GPU time per process), because
//!   the GPU runs whatever is queued, and measurements arrive only as work completes;
//! * a launch waits while the container's bucket (refilled at cap x wall time) is in debt.

use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;

use super::busy::HORIZON_NS;
use super::kinds::{Bag, KindTable};
use super::{Bucket, CapPercent, Clock, DEBT_SLEEP_NS, MAX_HOLD_NS};

/// Which stream a launch went to, as the glue names it (per-thread default streams differ per
/// thread, the legacy stream per context).
pub type StreamKey = u64;

/// What became of a timing event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventState {
    Pending,
    /// Completed at this host time (`clock::now_ns` time base).
    Done(u64),
    /// Unusable (its context was destroyed, the driver failed): nothing to learn from it.
    Lost,
}

/// The glue's timing events.
pub trait Events {
    type Ev: Copy;
    fn poll(&mut self, ev: Self::Ev) -> EventState;
    /// When the host began recording `ev` (`clock::now_ns` time base), where known.
    fn recorded_ns(&self, _ev: Self::Ev) -> Option<u64> {
        None
    }
    /// The meter no longer needs the event (it may be recycled).
    fn release(&mut self, ev: Self::Ev);
}

/// What the gate wants the launching thread to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    Go,
    /// Come back after about this long (nothing held meanwhile).
    Wait(u64),
}

/// Estimated GPU time a process may keep queued on a device while capped.
pub const QUEUE_TARGET_NS: u64 = 2_000_000;
/// What a queue run back to back may add to a 100-ms reading over the cap, at most (1 point).
const QUEUE_OVERSHOOT_NS: u64 = 1_000_000;
/// How long after its container's budget last closed a process keeps to what the bucket saves.
const DEEP_AFTER_CLOSED_NS: u64 = 1_000_000_000;

/// The deepest queue a process may keep on what its bucket can pay: what the bucket saves
/// (`save_ns`) or, for a container whose budget has not closed for a second (it spends less than
/// its cap refills), what adds at most 1 point to a 100-ms reading where that is more (a queue of
/// Q run at full speed, the rest of the reading at the cap, reads (1 - cap) * Q over it): 100 ms
/// at cap 99, the bucket's save below cap 92. At 12 ms a training step whose host runs 40 ms ahead
/// of the GPU lost its cushion (`sim::deep_phased_step`: 78.8% busy of 97.7% at cap 99); a
/// saturating stream queued that deep owed it back as idle GPU (100-ms readings 87-99 at cap 97).
pub fn queue_ceiling_ns(cap: u32, save_ns: i64, closed_until_ns: u64, now: u64) -> u64 {
    let save = save_ns.max(0) as u64;
    if now <= closed_until_ns.saturating_add(DEEP_AFTER_CLOSED_NS) {
        return save;
    }
    save.max(QUEUE_OVERSHOOT_NS * 100 / (100 - cap.min(99)) as u64)
}

/// Per-launch estimate for a stream that has not completed anything yet (conservative: the
/// first launches are not queued deep).
pub const INITIAL_LAUNCH_EST_NS: u64 = 1_000_000;
/// Samples the per-launch estimate averages over.
const EST_WINDOW: u32 = 8;
/// Longest single wait the gate asks for (then it looks again).
pub const MAX_WAIT_NS: u64 = 20_000_000;
/// Shortest wait for queued work (a poll interval).
pub const MIN_WAIT_NS: u64 = 5_000;
/// A kernel this far past its estimated end is waited for by sleeping (`overdue_wait_ns`).
/// Not less: a training below a higher-priority service, its kernels time-sliced with the
/// service's, kept 0.765 of its share on an H200 with 2 ms (0.82-0.90 before; session 32).
const OVERDUE_POLL_NS: u64 = 20_000_000;
/// One look's sleep behind a kernel past `OVERDUE_POLL_NS` (an eighth of the lateness, up to
/// 20 ms, let a launch go 20 ms after a kernel 160 ms late ended: a review, session 32).
const OVERDUE_SLEEP_NS: u64 = 1_000_000;
/// Streams remembered per device; idle ones beyond this are forgotten.
const MAX_STREAMS: usize = 64;
/// Timing events are recorded at most this often per stream (host time): a framework launching
/// tens of thousands of kernels a second would pay two event records per launch (an H100 saw
/// GPT-2 training at 0.73 of its speed under a cap of 99). Launches in between are folded into
/// the next event's interval, or charged at the next synchronize.
pub const EVENT_SPACING_NS: u64 = 100_000;
/// A launch on an idle stream gets a start event at most this often per stream. A program that
/// synchronizes after every kernel starts an idle stream each time: one start event (and its end
/// event) per `EVENT_SPACING_NS` cost an H100 9-13% of the speed of 10 us kernels under a cap
/// above their utilization, and an event record takes 1.4-4 us there. In between, such a launch
/// is timed by the spaced end event, from its submission plus the start latency the start events
/// showed.
pub const IDLE_START_SPACING_NS: u64 = 5_000_000;
/// End events on a stream synchronized after each launch, whose launches are short (estimate
/// under `EVENT_SPACING_NS`), at most this often: each synchronize brackets the launch without
/// one (`StreamTrack::close_at_sync`), so the events only keep the learned return delay and
/// estimate current. At `EVENT_SPACING_NS` a program synchronizing after each 10 us kernel paid a
/// record every sixth launch and a query for it: an H100 ran an empty kernel and synchronize
/// 1.064 times as long as the driver alone under a cap of 75, 1.043 at this spacing.
pub const SYNCED_EVENT_SPACING_NS: u64 = 1_000_000;
/// A start event this much later than its submission and the learned start latency, after
/// launches closed without an event, says one of those was still running (`Meter::poll`). At
/// 20 us the mock's own jitter on a loaded 2-core machine crossed it four times in 8 s.
const LATE_START_NS: u64 = 100_000;
/// How long after such a late start every paced launch on the stream gets its own end event
/// (`Meter::closable`): a kind learned at 10 us that ran 5 ms every 20 ms was charged 0.71 of
/// its time when only the timed launches' start events showed it.
const TIMED_AFTER_LATE_NS: u64 = 200_000_000;
/// A start latency sample above the learned one raises it by this fraction of the difference.
const LAT_RISE_DIV: u64 = 16;
/// Most host time counted between a start event's record and its launch's submission
/// (`Submitted::start_gap_ns`): the hook's own work between them takes microseconds.
const START_GAP_MAX_NS: u64 = 50_000;
/// A launch closed at its synchronize (`StreamTrack::close_at_sync`) is charged at most this
/// many times its stream's estimate.
const SYNC_WINDOW_EST_MAX: u64 = 4;
/// A synchronize that returned within this of being entered, less the driver's wake-up
/// (`Meter::sync_wake_ns`), waited on no GPU work worth charging.
const SYNC_BLOCKED_MIN_NS: u64 = 20_000;
/// A synchronize that returned later than this after the work it waited for ended was late
/// (its thread preempted), not the driver's wake-up: it teaches nothing.
const SYNC_WAKE_MAX_NS: u64 = 200_000;
/// Launches poll their events at most this often (the queue bound polls when it must).
pub const POLL_SPACING_NS: u64 = 20_000;
/// How fast the shortest per-launch time (the solo time of a stream that never ran alone) may
/// rise: 1% per this much wall time.
pub const MIN_DRIFT_NS: u64 = 100_000_000;
/// Intervals of less than this per launch are measurement artifacts (an event mapped onto its
/// start), not GPU time: nothing is learned from them.
pub const MIN_LEARN_NS: u64 = 500;
/// Least share (x1000) of an interval charged under contention: the solo time a stream compares
/// with may come from other kernels than today's, so the discount is bounded (2.5x).
const MIN_SHARE_MILLI: u64 = 400;
/// Deepest debt a launch may still go in beside queued work (`Meter::runs_beside_queued_work`).
pub const BESIDE_DEBT_NS: i64 = DEBT_SLEEP_NS + super::BURST_NS;
/// Slowdowns below this (x1000) are jitter, not contention.
const SLOWDOWN_DEADBAND_MILLI: u64 = 1_150;

struct Submitted<E> {
    /// `None`: closed without an event (`StreamTrack::close_valued`), at `clip_ns` from its start.
    ev: Option<E>,
    /// Event recorded just before the first launch when the stream was idle: its time is when
    /// the GPU reached the launch (submit time plus the driver's launch latency).
    start_ev: Option<E>,
    /// Host time from the start event's record to the launch's submission: the GPU reached
    /// the start event that much before the launch (counted up to `START_GAP_MAX_NS`).
    start_gap_ns: u64,
    /// Earliest time the covered launches could start (host submit time of the first).
    submit_ns: u64,
    launches: u32,
    /// Their kinds; what those of a learned kind were thought to take when launched, and how
    /// many others there are (valued at the stream's estimate of the moment).
    bag: Bag,
    value_ns: u64,
    unvalued: u32,
    /// When the last of them was submitted.
    last_submit_ns: u64,
    /// `ev` was recorded before a later launch, after a pause: it completed when these launches
    /// did, or (the stream idle) only when the GPU reached it. Their interval is clipped to this
    /// much after its start.
    clip_ns: Option<u64>,
    /// When `ev` was recorded because the next launch was about to wait (`Meter::flushed`; 0:
    /// not so): the interval may hold the host's time after these launches, so it teaches no
    /// tight figure, and launches closable at their kinds' figures are charged those unless the
    /// event came late (they still ran).
    flushed_ns: u64,
}

struct StreamTrack<E> {
    key: StreamKey,
    pending: VecDeque<Submitted<E>>,
    pending_launches: u64,
    /// What the pending launches of a learned kind were thought to take, and how many others.
    pending_value_ns: u64,
    pending_unvalued: u64,
    /// Launches whose event could not be recorded: folded into the next event, or charged up to
    /// the next synchronize; their kinds and what they are thought to take.
    unevented: u32,
    unevented_bag: Bag,
    unevented_value_ns: u64,
    unevented_unvalued: u32,
    /// How many of them may not be closed at what their kinds take (`unevented_valued`).
    unevented_loose: u32,
    unevented_since_ns: u64,
    /// Submit time of the latest launch without an event.
    unevented_last_ns: u64,
    /// When this stream's latest timing event was recorded (host time; 0 = never).
    recorded_ns: u64,
    /// When its latest start event on an idle stream was recorded (0 = never).
    started_ns: u64,
    /// How long after their submission start events complete (the floor of recent samples,
    /// `learn_start_latency`): where a launch on the idle stream begins when it has no start
    /// event of its own.
    start_lat_ns: u64,
    /// When the stream's previous event completed: the next launch cannot start earlier.
    last_end_ns: u64,
    /// Until then every paced launch gets an end event: a start event came late after launches
    /// closed without one (`LATE_START_NS`).
    timed_until_ns: u64,
    /// `last_end_ns` is what launches closed without an event were thought to take
    /// (`close_valued`): a longer one may still have run past it.
    last_end_estimated: bool,
    /// Host time between its launches (mean of the last few): how many launches an event
    /// every `SYNCED_EVENT_SPACING_NS` or so means (`Meter::samples`).
    launch_gap_ns: u64,
    /// When its latest launch was submitted (0 = never).
    last_launch_ns: u64,
    /// A synchronize found the stream with nothing in flight, and nothing was launched since.
    synced_idle: bool,
    /// The one launch since the last synchronize came right after it (`synced_idle`): the next
    /// synchronize brackets it.
    lone_after_sync: bool,
    /// How long after such a launch's end its synchronize returned (mean of the last few, from
    /// those with an end event; 0 = not seen yet): the driver's wake-up, plus any CPU work the
    /// program does between its launch and its synchronize.
    sync_lat_ns: u64,
    /// Estimated GPU time per launch: measured interval time over the launches it covered,
    /// both sums decaying by 1/`EST_WINDOW` per interval (launches in thousandths).
    est_ns: u64,
    est_sum_ns: u64,
    est_launches_milli: u64,
    /// Per-launch time while we had the GPU to ourselves (sums like the estimate's, learned
    /// only while alone): the recent estimate over it is how much another tenant slows us.
    /// Started beside another tenant, the shortest per-launch time seen stands in for it
    /// (rising 1% per `MIN_DRIFT_NS`, so one odd interval does not stand forever).
    solo_sum_ns: u64,
    solo_launches_milli: u64,
    min_ns: u64,
    min_at_ns: u64,
    touched_ns: u64,
}

/// A mean over about the last `EST_WINDOW` samples, `sample` the newest (`mean` 0: none yet).
fn mean_of_last_few(mean: u64, sample: u64) -> u64 {
    let w = EST_WINDOW as u64;
    if mean == 0 { sample } else { mean - mean / w + sample / w }
}

impl<E: Copy> StreamTrack<E> {
    fn new(key: StreamKey, now: u64) -> Self {
        StreamTrack {
            key,
            pending: VecDeque::new(),
            pending_launches: 0,
            pending_value_ns: 0,
            pending_unvalued: 0,
            unevented: 0,
            unevented_bag: Bag::default(),
            unevented_value_ns: 0,
            unevented_unvalued: 0,
            unevented_loose: 0,
            unevented_since_ns: 0,
            unevented_last_ns: 0,
            recorded_ns: 0,
            started_ns: 0,
            start_lat_ns: 0,
            last_end_ns: 0,
            last_end_estimated: false,
            timed_until_ns: 0,
            launch_gap_ns: 0,
            last_launch_ns: 0,
            synced_idle: false,
            lone_after_sync: false,
            sync_lat_ns: 0,
            est_ns: INITIAL_LAUNCH_EST_NS,
            est_sum_ns: 0,
            est_launches_milli: 0,
            solo_sum_ns: 0,
            solo_launches_milli: 0,
            min_ns: 0,
            min_at_ns: 0,
            touched_ns: now,
        }
    }

    /// Is a launch at `now` paced by the host (everything queued on its stream was thought done
    /// before it was submitted, so the GPU idles between them) under a cap (`capped`,
    /// `Meter::capped`)? Each
    /// such launch gets an end event, or is closed at its kind's tight figure
    /// (`Meter::wants_end_event`). Spaced `EVENT_SPACING_NS` apart, one event covered several such
    /// launches and the host's gaps between them, and so did the event recorded when the next
    /// launch was held: on an H200, under a cap of 25, kernels of 5-20 us submitted every 25-70
    /// us read 11-19% by NVML for 33.5% measured, at 0.37-0.44 of their speed. Only while the
    /// budget held the process (sessions 37-39), eager GPT-2 inference, which a cap of 50 holds
    /// seldom, was measured at 48-65% for NVML's 14% on an H100 and kept 0.89 of its speed.
    /// Paced meant submitted at least the stream's per-launch estimate after the launch before:
    /// under a cap never reached, the small kernels a host launches behind a queue of GEMMs
    /// passed for paced (the simulator's deep phased step: 74.8% busy of 97.7% at cap 99).
    fn paced(&self, capped: bool, now: u64) -> bool {
        capped && !self.synced_idle && self.last_launch_ns != 0 && self.queued_end().is_none_or(|e| now >= e)
    }

    /// Can the launches without an event be closed at what their kinds take (`close_valued`):
    /// was every one of them, when launched, paced with the GPU thought free of our other work
    /// (`Meter::closable`), of a kind with a tight figure (`KindTable::get_tight`)?
    /// Others (kind 0: copies, sets and legacy launches; a kind not seen before) have only the
    /// stream's estimate, a mean that charged paced 300 us kernels beside 10 us ones 0.36 of
    /// their time, or a figure that holds the host's time between launches.
    fn unevented_valued(&self) -> bool {
        self.unevented_loose == 0
    }

    /// The host paced a launch after the launches without an event, all of a learned kind: they
    /// ended at what their kinds take from their start, in order behind what is pending on the
    /// stream (charged when it reaches the head, `Meter::poll`). Returns how many it closed.
    fn close_valued(&mut self) -> u32 {
        let (launches, value) = (self.unevented, self.unevented_value_ns);
        if launches > 0 {
            self.push_unevented(None, None, 0, Some(value));
        }
        launches
    }

    /// Fold a measured interval of `launches` launches into the estimates. The per-launch
    /// estimate weighs every launch alike (interval time over launches, over the last
    /// `EST_WINDOW` or so intervals): a mean of per-interval averages counted a lone 1.5 ms GEMM
    /// as much as an interval of fifty 5 us kernels, and the queue bound then let a training
    /// step queue a handful of launches (an H100 ran GPT-2 training at 39% under a cap of 50,
    /// 0.51 of its throughput, the budget never binding). Moving both ways alike: rising by 3/4
    /// of every larger sample, it held tiny kernels as if each were the last large one. While
    /// alone (`contended` false) the same average also teaches the solo per-launch time.
    fn learn(&mut self, interval_ns: u64, launches: u32, contended: bool, now: u64) {
        let launches = launches.max(1) as u64;
        let per_launch = interval_ns / launches;
        if per_launch < MIN_LEARN_NS {
            return; // (nearly) collapsed: its event mapped about where it had to start; says nothing
        }
        if self.min_ns == 0 || per_launch <= self.min_ns {
            (self.min_ns, self.min_at_ns) = (per_launch, now);
        } else if now.saturating_sub(self.min_at_ns) >= MIN_DRIFT_NS {
            (self.min_ns, self.min_at_ns) = (self.min_ns + self.min_ns / 100 + 1, now);
        }
        let decay = |x: u64| x - x / EST_WINDOW as u64;
        self.est_sum_ns = decay(self.est_sum_ns).saturating_add(interval_ns);
        self.est_launches_milli = decay(self.est_launches_milli).saturating_add(launches * 1000);
        self.est_ns = (self.est_sum_ns as u128 * 1000 / self.est_launches_milli as u128).max(1) as u64;
        if !contended {
            // The solo per-launch time: the same launch-weighted average, only while alone.
            self.solo_sum_ns = decay(self.solo_sum_ns).saturating_add(interval_ns);
            self.solo_launches_milli = decay(self.solo_launches_milli).saturating_add(launches * 1000);
        }
    }

    /// A start event completed `lat_ns` after its launch's submission: the latency follows the
    /// lowest recent samples, down at once and up by 1/`LAT_RISE_DIV` of a higher one. A sample
    /// only errs high: the host may reach the driver late with the record (a thread just woken
    /// from a hold), and a mean of those shortened every paced launch measured after it.
    fn learn_start_latency(&mut self, lat_ns: u64) {
        let lat_ns = lat_ns.max(1);
        self.start_lat_ns = match self.start_lat_ns {
            0 => lat_ns,
            cur if lat_ns <= cur => lat_ns,
            cur => cur + (lat_ns - cur) / LAT_RISE_DIV,
        };
    }

    /// Share (x1000) of a measured interval our work really had the GPU: all of it, unless
    /// another tenant is known to be active and our launches take longer than alone.
    fn share_milli(&self, contended: bool) -> u64 {
        if !contended || self.min_ns == 0 {
            return 1000; // alone, or nothing measured yet: charge it all
        }
        let solo = match self.solo_launches_milli {
            0 => self.min_ns as u128,
            n => (self.solo_sum_ns as u128 * 1000 / n as u128).max(1),
        };
        let slowdown = (self.est_ns as u128 * 1000 / solo).min(100_000) as u64;
        if slowdown < SLOWDOWN_DEADBAND_MILLI {
            return 1000;
        }
        (1_000_000 / slowdown).clamp(MIN_SHARE_MILLI, 1000)
    }

    /// A synchronize returned at `now`. The one launch since the previous synchronize, if it had
    /// an end event, teaches how long after its end the synchronize returns; without one it is
    /// charged up to then (at most `SYNC_WINDOW_EST_MAX` times its estimate: a pause before one
    /// synchronize is not GPU time): measured, where the estimate is a mean that cut the longer
    /// of kernels of varying length short. Other launches without an event are charged their
    /// estimate (`close_unevented`).
    fn close_at_sync(&mut self, bucket: &Bucket<'_>, now: u64, owner: u64) -> u64 {
        let lone = std::mem::take(&mut self.lone_after_sync);
        // (Its event ended it only if it ended after its submission: a lost one did not.)
        if lone && self.unevented == 0 && self.pending.is_empty() && self.last_end_ns >= self.unevented_last_ns {
            self.sync_lat_ns = mean_of_last_few(self.sync_lat_ns, now.saturating_sub(self.last_end_ns).max(1));
            return 0;
        }
        if !(lone && self.unevented == 1 && self.sync_lat_ns > 0) {
            return self.close_unevented(bucket, now, owner);
        }
        let start = self.last_end_ns.max(self.unevented_since_ns);
        let most = start.saturating_add(self.est_ns.saturating_mul(SYNC_WINDOW_EST_MAX));
        self.close_between(start, now.saturating_sub(self.sync_lat_ns).min(most), bucket, now, owner)
    }

    /// Charge the launches without an event at their estimated GPU time from the stream's last
    /// known end (or their submission), never past `now`, and forget them.
    fn close_unevented(&mut self, bucket: &Bucket<'_>, now: u64, owner: u64) -> u64 {
        if self.unevented == 0 {
            return 0;
        }
        let start = self.last_end_ns.max(self.unevented_since_ns);
        // Paced launches of kinds with a tight figure at that; others at the stream's mean (a
        // 300 us kernel after two of 10 us was charged their 60 us mean at its synchronize).
        let est = if self.unevented_valued() { self.unevented_value_ns } else { (self.unevented as u64).saturating_mul(self.est_ns) };
        self.close_between(start, start.saturating_add(est), bucket, now, owner)
    }

    /// Charge the launches without an event as having run from `start` to `end` (never past
    /// `now`), and forget them.
    fn close_between(&mut self, start: u64, end: u64, bucket: &Bucket<'_>, now: u64, owner: u64) -> u64 {
        let end = now.min(end).max(start);
        // Whatever ran longer ended by now (a synchronize), before any later launch.
        (self.last_end_ns, self.last_end_estimated) = (end, false);
        self.take_unevented();
        bucket.charge(start, end, 1000, now, owner)
    }

    /// A launch of `kind` thought to take `value_ns` (`None`: not learned) joins the launches
    /// without an event; `closable`: at that value (`unevented_valued`).
    fn add_unevented(&mut self, kind: u64, value_ns: Option<u64>, closable: bool) {
        self.unevented += 1;
        self.unevented_loose += !closable as u32;
        self.unevented_bag.add(kind);
        match value_ns {
            Some(v) => self.unevented_value_ns = self.unevented_value_ns.saturating_add(v),
            None => self.unevented_unvalued += 1,
        }
    }

    /// Forget the launches without an event: (how many, their kinds, value, unvalued).
    fn take_unevented(&mut self) -> (u32, Bag, u64, u32) {
        let bag = std::mem::take(&mut self.unevented_bag);
        self.unevented_loose = 0;
        (std::mem::take(&mut self.unevented), bag, std::mem::take(&mut self.unevented_value_ns), std::mem::take(&mut self.unevented_unvalued))
    }

    /// The launches without an event get `ev`: they become one pending batch.
    fn push_unevented(&mut self, ev: Option<E>, start_ev: Option<E>, start_gap_ns: u64, clip_ns: Option<u64>) {
        let (submit_ns, last_submit_ns) = (self.unevented_since_ns, self.unevented_last_ns);
        let (launches, bag, value_ns, unvalued) = self.take_unevented();
        let s = Submitted { ev, start_ev, start_gap_ns, submit_ns, launches, bag, value_ns, unvalued, last_submit_ns, clip_ns, flushed_ns: 0 };
        self.pending.push_back(s);
        self.pending_launches += launches as u64;
        self.pending_value_ns = self.pending_value_ns.saturating_add(value_ns);
        self.pending_unvalued += unvalued as u64;
    }

    /// GPU time thought queued: launches of a learned kind at what each was thought to take,
    /// the others at the stream's estimate.
    fn queued_value_ns(&self) -> u64 {
        let unvalued = self.pending_unvalued + self.unevented_unvalued as u64;
        (self.pending_value_ns + self.unevented_value_ns).saturating_add(unvalued.saturating_mul(self.est_ns))
    }

    /// When work thought to take `value_ns`, the first of it submitted at `first_submit_ns`, will
    /// probably be done: it starts no earlier than the stream's last known end.
    fn expected_end(&self, first_submit_ns: u64, value_ns: u64) -> u64 {
        first_submit_ns.max(self.last_end_ns).saturating_add(value_ns)
    }

    /// When everything queued on the stream will probably be done (`None`: nothing queued).
    fn queued_end(&self) -> Option<u64> {
        let queued = self.pending_launches + self.unevented as u64;
        let first = self.pending.front().map_or(self.unevented_since_ns, |h| h.submit_ns);
        (queued > 0).then(|| self.expected_end(first, self.queued_value_ns()))
    }

    /// What the oldest pending batch is thought to take.
    fn head_value_ns(&self) -> u64 {
        self.pending.front().map_or(0, |h| h.value_ns.saturating_add((h.unvalued as u64).saturating_mul(self.est_ns)))
    }

    /// When the oldest pending launch will probably be done.
    fn head_expected_end(&self) -> u64 {
        self.pending.front().map_or(0, |h| self.expected_end(h.submit_ns, self.head_value_ns()))
    }
}

/// What `Meter::start_event` found for a launch's stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StartEvent {
    /// Record a start event before the launch.
    pub wanted: bool,
    /// Nothing of ours is known to be queued on the stream.
    pub idle: bool,
}

/// What a meter did, cumulative (the debug log prints it: how a real program's launches were
/// measured and why it waited).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MeterStats {
    /// Event intervals completed, and how many of them were clipped to their estimate (a batch
    /// closed after a pause), with the interval time the clips cut.
    pub batches: u64,
    pub clipped: u64,
    pub clipped_ns: u64,
    /// Launches without an event charged at a synchronize, and the time charged for them.
    pub closed_at_sync: u64,
    pub closed_at_sync_ns: u64,
    /// Host-paced launches of a learned kind closed without an event at what their kinds take
    /// (`StreamTrack::close_valued`), and the time charged for them.
    pub closed_valued: u64,
    pub closed_valued_ns: u64,
    /// GPU time a synchronize showed by blocking, beyond what its launches were charged
    /// (`Meter::synced`).
    pub sync_blocked_ns: u64,
    /// Start events that found the stream still busy after such launches (`LATE_START_NS`).
    pub late_starts: u64,
    /// Gate steps that said wait: for the queue bound, for the budget.
    pub waits_queue: u64,
    pub waits_budget: u64,
    /// Launches let go in debt because they run beside work already queued on another stream
    /// (`Meter::runs_beside_queued_work`).
    pub beside_queued: u64,
}

/// One process's meter and gate for one device.
pub struct Meter<E: Copy> {
    streams: Vec<StreamTrack<E>>,
    /// What each kind of launch takes: queued work is valued launch by launch (`kinds`).
    kinds: KindTable,
    /// Busy time this process's intervals added to the container's union (ns).
    pub charged_total_ns: u64,
    launches: u64,
    /// When events were last polled.
    polled_ns: u64,
    /// Another tenant is using the GPU (set by the glue from NVML).
    pub contended: bool,
    /// Another process of the container launched work lately (set by the glue from the region).
    pub siblings_active: bool,
    /// Which process of the container this is (nonzero; tells context switches from idle gaps).
    pub owner: u64,
    /// Keep at most this much estimated GPU time queued, capped or not (a higher-priority
    /// container shares the GPU: `node::lower_queue_ns`). `None`: under a cap, the larger of
    /// `QUEUE_TARGET_NS` and the bucket's balance.
    pub queue_bound_ns: Option<u64>,
    /// How far ahead of its rate the container may save (`Bucket::refill_to`) while it takes
    /// turns with other containers: its part of the period (`node::Turn`). `None`:
    /// `save_ns(cap)`.
    pub burst_ns: Option<i64>,
    /// The latest gate look was under a cap (below 100): host-paced launches are timed one by
    /// one (`StreamTrack::paced`).
    capped: bool,
    /// How long after the GPU work it waited for ended a synchronize returns (mean of the last
    /// few, from end events; 0 = not seen yet): the driver's wake-up alone.
    sync_wake_ns: u64,
    pub stats: MeterStats,
}

impl<E: Copy> Default for Meter<E> {
    fn default() -> Self {
        Meter {
            streams: Vec::new(),
            kinds: KindTable::default(),
            charged_total_ns: 0,
            launches: 0,
            polled_ns: 0,
            contended: false,
            siblings_active: false,
            owner: 1,
            queue_bound_ns: None,
            burst_ns: None,
            capped: false,
            sync_wake_ns: 0,
            stats: MeterStats::default(),
        }
    }
}

impl<E: Copy> Meter<E> {
    /// Launches this meter counted.
    pub fn launches(&self) -> u64 {
        self.launches
    }

    /// Launches submitted whose completion has not been seen.
    pub fn pending_launches(&self) -> u64 {
        self.streams.iter().map(|s| s.pending_launches + s.unevented as u64).sum()
    }

    /// The per-launch estimates of the streams with work queued, in microseconds (debug log).
    pub fn estimates_us(&self) -> Vec<u64> {
        self.streams.iter().filter(|s| s.pending_launches + s.unevented as u64 > 0).map(|s| s.est_ns / 1000).collect()
    }

    /// Estimated GPU time of everything we have queued.
    pub fn queued_est_ns(&self) -> u64 {
        self.streams.iter().map(StreamTrack::queued_value_ns).sum()
    }

    fn track(&mut self, key: StreamKey, now: u64) -> usize {
        if let Some(i) = self.streams.iter().position(|s| s.key == key) {
            self.streams[i].touched_ns = now;
            return i;
        }
        if self.streams.len() >= MAX_STREAMS {
            // Forget the longest-idle stream with nothing in flight (a destroyed one, typically).
            let idle = self
                .streams
                .iter()
                .enumerate()
                .filter(|(_, s)| s.pending.is_empty() && s.unevented == 0)
                .min_by_key(|(_, s)| s.touched_ns)
                .map(|(i, _)| i);
            match idle {
                Some(i) => {
                    self.streams.swap_remove(i);
                }
                None => {
                    // Every stream has work in flight: share the oldest one's record rather than
                    // grow without bound (its intervals stay correct, only less precise).
                    return 0;
                }
            }
        }
        self.streams.push(StreamTrack::new(key, now));
        self.streams.len() - 1
    }

    /// Charge every completed launch to the container's union.
    pub fn poll(&mut self, evs: &mut impl Events<Ev = E>, bucket: &Bucket<'_>, now: u64) {
        self.polled_ns = now;
        let (contended, owner) = (self.contended, self.owner);
        for st in &mut self.streams {
            while let Some(head) = st.pending.front() {
                // Closed without an event: it ends its `clip_ns` after its start; not charged before
                // then (a launch closed by a wait may still run: ended at the next look, a 1 ms
                // GEMM was charged 150 us).
                let state = match head.ev {
                    Some(ev) => evs.poll(ev),
                    None => {
                        let end = st.last_end_ns.max(head.submit_ns).saturating_add(head.clip_ns.unwrap_or(0));
                        if end > now { EventState::Pending } else { EventState::Done(end) }
                    }
                };
                if state == EventState::Pending {
                    break;
                }
                let head = st.pending.pop_front().expect("front exists");
                st.pending_launches -= head.launches as u64;
                st.pending_value_ns = st.pending_value_ns.saturating_sub(head.value_ns);
                st.pending_unvalued = st.pending_unvalued.saturating_sub(head.unvalued as u64);
                if let Some(ev) = head.ev {
                    evs.release(ev);
                }
                let (began, start_seen) = match head.start_ev {
                    Some(se) => {
                        let s = evs.poll(se);
                        evs.release(se);
                        match s {
                            EventState::Done(t) => {
                                // The host's time from the record to the submission (the hook's
                                // own work) is not the GPU's; a thread preempted longer between
                                // them says nothing of the latency, and the launch began no
                                // earlier than its submission (one preempted 1 ms was charged it).
                                let t = t + head.start_gap_ns.min(START_GAP_MAX_NS);
                                if head.start_gap_ns <= START_GAP_MAX_NS {
                                    st.learn_start_latency(t.saturating_sub(head.submit_ns));
                                }
                                (t.max(head.submit_ns), true)
                            }
                            _ => (head.submit_ns, false),
                        }
                    }
                    None => (head.submit_ns, false),
                };
                let EventState::Done(t) = state else { continue };
                // All of them were queued before the stream's earlier work ended: the interval is
                // their GPU time alone, no host time between them.
                let estimated = std::mem::replace(&mut st.last_end_estimated, head.ev.is_none());
                let backlogged = !estimated && st.last_end_ns >= head.last_submit_ns;
                // Where the earlier end was only thought, a start event says where these began.
                let start = if estimated && start_seen { began } else { st.last_end_ns.max(began) };
                // Reached late after launches closed at their kinds' figures (nothing else of ours
                // ran beside them: `Meter::closable`): one of those ran longer, and the stream was
                // busy from this launch's submission until it began. A kind learned at 10 us
                // that ran 5 ms every 20 ms was charged 0.17 of its time without this.
                if estimated && start_seen && began > head.submit_ns.saturating_add(st.start_lat_ns).saturating_add(LATE_START_NS) {
                    let from = st.last_end_ns.max(head.submit_ns);
                    self.stats.late_starts += 1;
                    // What ran before the timed launch is not seen: time every launch a while.
                    st.timed_until_ns = now.saturating_add(TIMED_AFTER_LATE_NS);
                    self.charged_total_ns += bucket.charge(from, began.max(from), st.share_milli(contended), now, owner);
                }
                let end = t.max(start);
                // A flush event that came late found its launches still running: not clipped.
                let ran_on = head.flushed_ns != 0 && t > head.flushed_ns.saturating_add(st.start_lat_ns).saturating_add(LATE_START_NS);
                let clipped = head.clip_ns.filter(|_| !ran_on).map_or(end, |c| end.min(start.saturating_add(c)));
                if head.ev.is_none() {
                    self.stats.closed_valued_ns += clipped - start;
                } else {
                    self.stats.batches += 1;
                    if clipped < end {
                        self.stats.clipped += 1;
                        self.stats.clipped_ns += end - clipped;
                    }
                }
                let end = clipped;
                st.last_end_ns = end;
                if head.clip_ns.is_none() {
                    // Back to back, or one launch from where it is known to have begun: GPU time
                    // alone (after an end only thought, it may have waited behind a longer launch).
                    let tight = head.flushed_ns == 0 && (backlogged || (head.launches == 1 && (start_seen || !estimated)));
                    self.kinds.learn(&head.bag, end - start, st.est_ns, backlogged, tight, now);
                    st.learn(end - start, head.launches, contended, now);
                }
                self.charged_total_ns += bucket.charge(start, end, st.share_milli(contended), now, owner);
            }
        }
    }

    /// A synchronize entered at `entered` returned at `now`: everything submitted before it is
    /// complete. Launches without an event ran after the stream's last known end (or their
    /// submission) and before now, for about their estimated GPU time each: they are charged
    /// that, never past now. A program that did CPU work before synchronizing is not charged for
    /// it. A synchronize that blocked shows our work ran until it returned, less the driver's
    /// wake-up: that much is charged too (a launch of a 10 us kind that ran 3 ms was closed at
    /// 10 us).
    pub fn synced(&mut self, evs: &mut impl Events<Ev = E>, bucket: &Bucket<'_>, entered: u64, now: u64) {
        self.poll(evs, bucket, now);
        let owner = self.owner;
        let entered = entered.min(now);
        self.learn_sync_wake(entered, now);
        // Where launches without an event could have begun (not before: the launch latency is
        // not GPU time); `None` where there are none, or where another stream's timed work ran
        // into the synchronize (it may be what it waited on, and its event told its time).
        let began = self.streams.iter().filter(|s| s.unevented > 0).map(|s| s.last_end_ns.max(s.unevented_since_ns)).min();
        let timed_ran_into = self.streams.iter().any(|s| s.unevented == 0 && !s.last_end_estimated && s.last_end_ns > entered);
        let began = began.filter(|_| !timed_ran_into);
        // Which stream it synchronized is not known: only when one stream had work since the
        // last synchronize does it bracket that stream's launch (another thread's may still run,
        // or have ended long before).
        let alone = self.streams.iter().filter(|s| s.lone_after_sync || s.unevented > 0 || !s.pending.is_empty()).count() <= 1;
        for st in &mut self.streams {
            let (launches, before) = (st.unevented as u64, st.last_end_ns.max(st.unevented_since_ns));
            st.lone_after_sync &= alone;
            self.charged_total_ns += st.close_at_sync(bucket, now, owner);
            st.synced_idle = alone && st.pending.is_empty();
            if launches > 0 {
                self.stats.closed_at_sync += launches;
                self.stats.closed_at_sync_ns += st.last_end_ns.saturating_sub(before);
            }
        }
        // Only where launches went without an event: the others' events told their time (and
        // the container's union counts time once). Not beside another tenant: the wait may be
        // its time slice. Not past the busy map's horizon: the union cannot see what events
        // charged there.
        let ran_until = now.saturating_sub(self.sync_wake_ns);
        let from = began.map(|b| entered.max(b).max(now.saturating_sub(HORIZON_NS))).filter(|_| !self.contended);
        if let Some(from) = from.filter(|&f| ran_until > f.saturating_add(SYNC_BLOCKED_MIN_NS)) {
            let fresh = bucket.charge(from, ran_until, 1000, now, owner);
            self.charged_total_ns += fresh;
            self.stats.sync_blocked_ns += fresh;
        }
    }

    /// A synchronize that waited for launches with an end event, all seen, teaches how long
    /// after the last of them ended it returns (the mean of the last few: its floor charged the
    /// wake-up's jitter as GPU time, 0.218 of uncapped throughput for 0.270 in
    /// `sim::one_stream_delivers_the_cap`, 10 us kernels synchronized each).
    fn learn_sync_wake(&mut self, entered: u64, now: u64) {
        if self.streams.iter().any(|s| s.unevented > 0 || !s.pending.is_empty() || s.last_end_estimated) {
            return;
        }
        let Some(end) = self.streams.iter().map(|s| s.last_end_ns).max() else { return };
        if end > entered && end <= now && now - end <= SYNC_WAKE_MAX_NS {
            self.sync_wake_ns = mean_of_last_few(self.sync_wake_ns, (now - end).max(1));
        }
    }

    /// Decide whether a launch on `key` may go now. Uncapped: always (the bucket is kept full so
    /// a cap set later starts clean).
    pub fn gate(&mut self, evs: &mut impl Events<Ev = E>, bucket: &Bucket<'_>, cap: CapPercent, key: StreamKey, now: u64) -> Step {
        if now.saturating_sub(self.polled_ns) >= POLL_SPACING_NS {
            self.poll(evs, bucket, now);
        }
        let cap = cap.filter(|c| *c < 100);
        self.capped = cap.is_some();
        let mut queued_now = None; // walked once, and only where needed
        let target = match (cap, self.queue_bound_ns) {
            (Some(_), Some(b)) => b.min(QUEUE_TARGET_NS),
            // What the bucket can pay may be queued: held at 2 ms, a program under its cap lost
            // the cushion its host keeps ahead of the GPU, and each host pause idled the GPU
            // (`sim::gpt2_like_step`). Queued work is valued per launch kind (limiter::kinds): GPT-2
            // at cap 99 on an H100 ran 1.076x the per-stream estimate's speed (6 paired rounds, session 22).
            (Some(c), None) => {
                let save = self.burst_ns.unwrap_or_else(|| super::save_ns(c));
                let balance = bucket.balance_at(now, c, save).max(0) as u64;
                // Beyond the balance, the refill at the cap while the GPU runs the queue
                // (balance / (1 - cap)), and only for a launch that fits whole: past it, the
                // queue runs over the cap in a 100 ms sample (two 10 ms kernels at cap 10).
                let next = self.streams.iter().find(|s| s.key == key).map_or(0, |s| s.est_ns);
                let ceiling = queue_ceiling_ns(c, save, closure_of(bucket.s.closed_until_ns.load(Relaxed)).0, now);
                let payable = (balance as u128 * 100 / (100 - c.min(99)) as u128).min(ceiling as u128) as u64;
                let base = QUEUE_TARGET_NS.max(balance);
                let queued = *queued_now.insert(self.queued_est_ns());
                if queued.saturating_add(next) <= payable { payable.max(base) } else { base }
            }
            (None, Some(b)) => b,
            (None, None) => {
                bucket.refill(now, 100);
                return Step::Go;
            }
        };
        let i = self.track(key, now);
        // 1. Bound our queue: the GPU runs whatever is queued, budget or not.
        let mut queued = queued_now.unwrap_or_else(|| self.queued_est_ns());
        if queued >= target && self.polled_ns != now {
            self.poll(evs, bucket, now); // decide on fresh completions
            queued = self.queued_est_ns();
        }
        if !self.streams[i].pending.is_empty() && queued >= target {
            self.stats.waits_queue += 1;
            let due = self.streams[i].head_expected_end();
            let wait = if due > now { due - now } else { overdue_wait_ns(now - due) };
            return Step::Wait(wait.clamp(MIN_WAIT_NS, MAX_WAIT_NS));
        }
        let Some(cap) = cap else {
            bucket.refill(now, 100);
            return Step::Go;
        };
        let cap = cap.max(1) as u64;
        // 2. Budget: closed until the debt is repaid, for every thread and process alike.
        let word = bucket.s.closed_until_ns.load(Relaxed);
        let (mut closed, closed_at_cap) = closure_of(word);
        if now < closed {
            if self.runs_beside_queued_work(i, || bucket.balance(), now) {
                return Step::Go;
            }
            // A cap raised since the closure repays what is left of it faster (old / new); the
            // time before the raise stays repaid at the old cap. At the same cap nothing moves.
            if closed_at_cap != 0 && closed_at_cap < cap {
                let reopen = now + ((closed - now) as u128 * closed_at_cap as u128 / cap as u128) as u64;
                // One look shortens it once: a closure another look moved meanwhile is read anew.
                if bucket.s.closed_until_ns.compare_exchange(word, closure_word(reopen, cap), Relaxed, Relaxed).is_ok() {
                    closed = reopen;
                }
            }
            if now < closed {
                self.stats.waits_budget += 1;
                return Step::Wait((closed - now).clamp(MIN_WAIT_NS, MAX_WAIT_NS));
            }
        }
        bucket.refill_to(now, cap as u32, self.burst_ns.unwrap_or_else(|| super::save_ns(cap as u32)));
        // Floored as the refill floors it (a charge since the last refill may be below): no
        // closure past one full hold.
        let balance = bucket.balance().max(-super::max_debt_ns(cap as u32));
        if balance >= -DEBT_SLEEP_NS || self.runs_beside_queued_work(i, || balance, now) {
            return Step::Go;
        }
        self.stats.waits_budget += 1;
        let until = now + closure_ns(balance, cap);
        bucket.s.closed_until_ns.fetch_max(closure_word(until, cap), Relaxed);
        Step::Wait((until - now).clamp(MIN_WAIT_NS, MAX_WAIT_NS))
    }

    /// May a launch on stream `i` go in debt because it will run beside work already queued on
    /// one other stream of ours, for at least half its estimated time? It adds little to the
    /// union then, and holding it splits kernels that run side by side uncapped (a budget closing
    /// between the two launches of a round leaves one running alone). On an H100 the kernels of
    /// two streams kept 1.91-1.95 of their 1.97-1.99 uncapped overlap with this rule, 1.87-1.95
    /// without, in one run; two threads synchronizing each launch vary more than that from run
    /// to run with either (docs/benchmarks.md, session 7). What it does add is measured and charged like any work, so the long-run share
    /// stays the cap; the debt it may run up is bounded (`BESIDE_DEBT_NS`) for kernels that
    /// cannot share the GPU after all. With two or more other streams queued, a kernel waits
    /// behind them rather than beside: letting those go too kept eight threads launching
    /// together until that bound, then waiting together (an H100's readings of such bursts
    /// scattered 18-35% under a cap of 25). Takes `balance` lazily: a single-stream process
    /// (most) reads nothing more while it waits.
    fn runs_beside_queued_work(&mut self, i: usize, balance: impl FnOnce() -> i64, now: u64) -> bool {
        if self.streams.len() < 2 || balance() < -BESIDE_DEBT_NS {
            return false;
        }
        let me = &self.streams[i];
        let start = me.queued_end().unwrap_or(now).max(now);
        // Only work expected to run on past our start: a stream with launches not yet closed by
        // an event or a synchronize, but long done, is no queue.
        let mut others = self.streams.iter().enumerate().filter(|&(j, _)| j != i).filter_map(|(_, s)| s.queued_end()).filter(|&e| e > start);
        let (first, second) = (others.next(), others.next());
        let beside = second.is_none() && first.is_some_and(|e| e >= start.saturating_add(me.est_ns / 2));
        self.stats.beside_queued += beside as u64;
        beside
    }

    /// Does a launch on `key` start an idle stream? Then the glue records a start event before
    /// it (at most one per `IDLE_START_SPACING_NS`): otherwise the launch latency of every
    /// isolated kernel would be charged as GPU time.
    pub fn wants_start_event(&self, key: StreamKey, now: u64) -> bool {
        self.start_event(key, now).wanted
    }

    /// `wants_start_event`, and whether nothing of ours is known to be queued on `key` (an event
    /// recorded there now completes right away, unless another stream's work is ordered before
    /// it: `eventclock`'s idle events), from one look at the stream.
    pub fn start_event(&self, key: StreamKey, now: u64) -> StartEvent {
        let Some(s) = self.streams.iter().find(|s| s.key == key) else { return StartEvent { wanted: true, idle: true } };
        let idle = s.pending.is_empty() && s.unevented == 0;
        // Launches without an event, then a pause: the event also closes their interval (unless
        // the launch closes them at what their kinds take, `StreamTrack::close_valued`).
        let closes_valued = s.unevented_valued() && s.paced(self.capped, now);
        let paused = s.unevented > 0 && now.saturating_sub(s.unevented_last_ns) >= EVENT_SPACING_NS && !closes_valued;
        // The paced launches that keep the kinds' tight figures current: timed from a start
        // event, they are measured alone, whatever ran before them (`Meter::samples`).
        let sample = closes_valued && self.samples(s);
        StartEvent { wanted: (idle && now.saturating_sub(s.started_ns) >= IDLE_START_SPACING_NS) || paused || sample, idle }
    }

    /// Does the launch of `kind` just made on `key` get a timing event after it? At most one per
    /// `EVENT_SPACING_NS` per stream; the launches in between share the next one. A short launch
    /// right after a synchronize, at most one per `SYNCED_EVENT_SPACING_NS`. Every launch the
    /// host paced (submitted at least its stream's estimate after the one before) under a cap:
    /// its event ends its interval before the host's next gap; but one of a kind with a tight
    /// figure is closed at it by the next paced launch (`StreamTrack::close_valued`), with no
    /// event unless it is one of the samples that keep the figures current (`Meter::samples`:
    /// those get a start event, and so an end event): an event after each cost an H200 0.82-0.95
    /// of the want of host-paced kernels of 20 us and less (each event is host time, and NVML
    /// counts it as busy time).
    pub fn wants_end_event(&self, key: StreamKey, kind: u64, now: u64) -> bool {
        self.streams.iter().find(|s| s.key == key).is_none_or(|s| {
            let paced = s.paced(self.capped, now);
            if paced && s.unevented_valued() && self.closable(key, kind, now) {
                return false;
            }
            let synced_short = s.synced_idle && s.est_ns < EVENT_SPACING_NS;
            now.saturating_sub(s.recorded_ns) >= if synced_short { SYNCED_EVENT_SPACING_NS } else { EVENT_SPACING_NS } || paced
        })
    }
    /// May a paced launch of `kind` on `key` at `now` go without an event, to be charged its
    /// kind's tight figure from where it begins (`StreamTrack::close_valued`)? Only where it
    /// begins about when submitted: no other stream of ours has work thought queued past now,
    /// no other process of the container launched lately, and no other tenant is busy (a
    /// kernel waiting behind theirs would be charged where theirs ran: the union counts that
    /// once). Four threads each synchronizing its own stream after each 1 ms kernel read 27.9% by
    /// the simulator under a cap of 25 without this. And not for a while after a launch on the
    /// stream was found to run far past its kind's figure (`TIMED_AFTER_LATE_NS`).
    fn closable(&self, key: StreamKey, kind: u64, now: u64) -> bool {
        kind != 0
            && self.kinds.get_tight(kind, now).is_some()
            && !self.contended
            && !self.siblings_active
            && self.streams.iter().all(|o| if o.key == key { now >= o.timed_until_ns } else { o.queued_end().is_none_or(|e| e <= now) })
    }

    /// Is the next launch on stream `s` one of the paced launches timed to keep the kinds' tight
    /// figures current? About one per `SYNCED_EVENT_SPACING_NS` of its launches, chosen by the
    /// launch count: chosen by time (the first launch a millisecond after the last event), the
    /// launch after the longer host gap was timed most, and a kind that ran 100 us then 10 us
    /// 250 us later was charged 0.74 of its time.
    fn samples(&self, s: &StreamTrack<E>) -> bool {
        one_in(self.launches, SYNCED_EVENT_SPACING_NS / s.launch_gap_ns.max(1))
    }

    /// A launch on `key` was submitted at `submit_ns` and succeeded; `ev` is the timing event
    /// recorded after it (`None`: recording failed), `start_ev` the one recorded before it.
    pub fn launched(&mut self, key: StreamKey, start_ev: Option<E>, ev: Option<E>, submit_ns: u64, evs: &mut impl Events<Ev = E>) {
        self.launched_kind(key, 0, start_ev, ev, submit_ns, evs);
    }

    /// `launched`, for a launch of `kind` (`kinds::kernel_kind`; 0: unknown, valued at its
    /// stream's estimate).
    pub fn launched_kind(&mut self, key: StreamKey, kind: u64, start_ev: Option<E>, ev: Option<E>, submit_ns: u64, evs: &mut impl Events<Ev = E>) {
        self.launches += 1;
        let i = self.track(key, submit_ns);
        // Closing launches without an event moves them to the pending queue but not when it is
        // thought done: one look serves the whole launch.
        let paced = self.streams[i].paced(self.capped, submit_ns);
        let closable = paced && self.closable(key, kind, submit_ns);
        let st = &mut self.streams[i];
        let mut start_ev = start_ev;
        if st.unevented_valued() && paced {
            self.stats.closed_valued += st.close_valued() as u64;
        }
        if let (Some(se), true) = (start_ev, st.unevented > 0) {
            // Launches without an event came before (then a pause): the event recorded before
            // this launch ends their interval, clipped to their estimated time (the stream may
            // have gone idle during the pause; if it was still busy, this launch's interval,
            // which starts at its submission, covers the rest).
            let clip = (st.unevented as u64).saturating_mul(st.est_ns);
            st.push_unevented(Some(se), None, 0, Some(clip));
            st.recorded_ns = submit_ns;
            start_ev = None;
        }
        if start_ev.is_some() {
            st.started_ns = submit_ns;
        }
        if st.unevented == 0 {
            // Starting the idle stream without a start event: it begins about when one would have.
            // A launch the host paced finds its stream's earlier work done, seen or not.
            let idle = start_ev.is_none() && (st.pending.is_empty() || paced);
            st.unevented_since_ns = submit_ns + if idle { st.start_lat_ns } else { 0 };
        }
        st.add_unevented(kind, (kind != 0).then(|| self.kinds.get(kind)).flatten(), closable);
        st.unevented_last_ns = submit_ns;
        if st.last_launch_ns != 0 {
            st.launch_gap_ns = mean_of_last_few(st.launch_gap_ns, submit_ns.saturating_sub(st.last_launch_ns).max(1));
        }
        st.last_launch_ns = submit_ns;
        // The first launch since a synchronize that found the stream idle; a second one is not.
        st.lone_after_sync = std::mem::take(&mut st.synced_idle);
        match ev {
            Some(ev) => {
                st.recorded_ns = submit_ns;
                let gap = start_ev.and_then(|se| evs.recorded_ns(se)).map_or(0, |r| submit_ns.saturating_sub(r));
                st.push_unevented(Some(ev), start_ev, gap, None);
            }
            None => {
                if let Some(se) = start_ev {
                    evs.release(se);
                }
            }
        }
    }

    /// A launch on `key` is about to wait: do launches without an event sit on that stream?
    /// Then the glue records an event now (`flushed`), so their interval ends where they do,
    /// not after the wait.
    pub fn wants_flush_event(&self, key: StreamKey) -> bool {
        self.streams.iter().any(|s| s.key == key && s.unevented > 0)
    }

    /// The event recorded on `key` at `now` for the launches without one (`wants_flush_event`).
    pub fn flushed(&mut self, key: StreamKey, ev: E, now: u64) {
        let Some(st) = self.streams.iter_mut().find(|s| s.key == key && s.unevented > 0) else { return };
        let clip = st.unevented_valued().then_some(st.unevented_value_ns);
        st.push_unevented(Some(ev), None, 0, clip);
        if let Some(b) = st.pending.back_mut() {
            b.flushed_ns = now.max(1);
        }
        st.recorded_ns = now;
    }

    /// Give every event back (the process forgets this device, e.g. its context is gone).
    pub fn clear(&mut self, evs: &mut impl Events<Ev = E>) {
        for st in self.streams.drain(..) {
            for p in st.pending {
                if let Some(ev) = p.ev {
                    evs.release(ev);
                }
                if let Some(se) = p.start_ev {
                    evs.release(se);
                }
            }
        }
    }
}

/// Is the launch numbered `n` (this meter's count) one of about one in `every`? A mix of the
/// count (splitmix64), so the choice follows no period of the program's.
fn one_in(n: u64, every: u64) -> bool {
    let mut z = n.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)).is_multiple_of(every.max(1))
}

/// The low bits of the shared closure word (`closed_until_ns`) hold the cap the closure was
/// reckoned at, so a raised cap can shorten it by old / new: one word, which processes race on
/// with `fetch_max` and compare-and-swap. 0: not known (left as it is).
const CLOSURE_CAP_MASK: u64 = 0x7F;

/// The closure word for a budget closed until `until` (rounded up to the next 128 ns) at `cap`%.
fn closure_word(until: u64, cap: u64) -> u64 {
    (until.saturating_add(CLOSURE_CAP_MASK) & !CLOSURE_CAP_MASK) | cap.min(CLOSURE_CAP_MASK)
}

/// When a closure word says the budget reopens, and the cap it was reckoned at.
fn closure_of(word: u64) -> (u64, u64) {
    (word & !CLOSURE_CAP_MASK, word & CLOSURE_CAP_MASK)
}

/// How long a budget in debt by `-balance` stays closed at `cap`% (0 when not in debt).
fn closure_ns(balance: i64, cap: u64) -> u64 {
    balance.min(0).unsigned_abs().saturating_mul(100) / cap.max(1)
}

/// How long a launch waits, per look, behind a kernel `late_ns` past its estimated end. Up to
/// `OVERDUE_POLL_NS` late it polls (an estimate a little short, or a kernel time-sliced with
/// another container's, is the common case, and the queue behind may be short); later it
/// sleeps `OVERDUE_SLEEP_NS` a look: a kernel far past its estimate (the first launch of a long
/// kind) is not waited for by a core yielding for up to 2 s, and the launch goes at most that
/// late after it ends.
fn overdue_wait_ns(late_ns: u64) -> u64 {
    if late_ns < OVERDUE_POLL_NS { MIN_WAIT_NS } else { OVERDUE_SLEEP_NS }
}

/// Run gate steps until one says go, or `MAX_HOLD_NS` passed in total (a stalled rank must not
/// deadlock a collective). `step` takes whatever lock it needs itself: nothing is held while this
/// waits. Returns the time held.
pub fn hold(clk: &mut impl Clock, step: impl FnMut(u64) -> Step) -> u64 {
    hold_for(clk, MAX_HOLD_NS, step)
}

/// What one yield (`Clock::pause`) counts towards a hold when the clock does not move: a system
/// call takes at least this long, so the count never runs ahead of real time.
const PAUSE_COUNTS_NS: u64 = 100;

/// `hold` for at most `budget_ns` (what is left of `MAX_HOLD_NS` after other waits of the same
/// launch). The hold ends by the clock or by what it slept and yielded, whichever says more: a
/// clock that stops (a time-stamp counter a resume reset runs behind its calibration point)
/// would otherwise hold a launch forever.
pub fn hold_for(clk: &mut impl Clock, budget_ns: u64, mut step: impl FnMut(u64) -> Step) -> u64 {
    let t0 = clk.now_ns();
    let mut waited = 0u64;
    loop {
        let now = clk.now_ns();
        let held = now.saturating_sub(t0).max(waited);
        match step(now) {
            Step::Go => return held,
            Step::Wait(ns) => {
                if held >= budget_ns {
                    return held;
                }
                let ns = ns.min(budget_ns - held);
                // At the boundary too: a sleep of `ns - SPIN_WAIT_NS` = 0 would count nothing.
                if ns <= super::SPIN_WAIT_NS {
                    clk.pause();
                    waited += PAUSE_COUNTS_NS;
                } else {
                    clk.sleep_ns(ns - super::SPIN_WAIT_NS);
                    waited += ns - super::SPIN_WAIT_NS;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{BusyMap, SharedDeviceState};
    use std::collections::HashMap;

    #[test]
    fn the_queue_runs_deeper_than_the_bucket_saves_only_at_high_caps_and_only_while_the_budget_stays_open() {
        let (save, now) = (12_000_000, 10_000_000_000);
        assert_eq!(queue_ceiling_ns(50, save, 0, now), 12_000_000);
        assert_eq!(queue_ceiling_ns(91, save, 0, now), 12_000_000);
        assert_eq!(queue_ceiling_ns(95, save, 0, now), 20_000_000);
        assert_eq!(queue_ceiling_ns(99, save, 0, now), 100_000_000);
        assert_eq!(queue_ceiling_ns(100, save, 0, now), 100_000_000);
        // Closed within the last second: a saturating container keeps to what the bucket saves.
        assert_eq!(queue_ceiling_ns(99, save, now - 999_000_000, now), 12_000_000);
        assert_eq!(queue_ceiling_ns(99, save, now - 1_001_000_000, now), 100_000_000);
        assert_eq!(queue_ceiling_ns(99, -5, now, now), 0);
    }

    const T0: u64 = 1_000_000_000_000;
    const MS: u64 = 1_000_000;

    /// Events whose fate the test sets by hand.
    #[derive(Default)]
    struct Scripted {
        states: HashMap<u32, EventState>,
        released: Vec<u32>,
        /// When the host began recording them, where a test says.
        recorded: HashMap<u32, u64>,
    }
    impl Events for Scripted {
        type Ev = u32;
        fn poll(&mut self, ev: u32) -> EventState {
            *self.states.get(&ev).unwrap_or(&EventState::Pending)
        }
        fn recorded_ns(&self, ev: u32) -> Option<u64> {
            self.recorded.get(&ev).copied()
        }
        fn release(&mut self, ev: u32) {
            self.released.push(ev);
        }
    }

    /// A container's shared state for one device, scripted events and a fresh meter.
    fn fixture() -> (SharedDeviceState, BusyMap, Scripted, Meter<u32>) {
        (SharedDeviceState::default(), BusyMap::default(), Scripted::default(), Meter::default())
    }

    /// Put the bucket `debt_ns` in debt at cap `cap` (refilled at `T0`), let a launch at `at`
    /// find it closed; returns the closure word it left.
    fn close_with_debt(meter: &mut Meter<u32>, evs: &mut impl Events<Ev = u32>, b: &Bucket<'_>, cap: u32, debt_ns: i64, at: u64) -> u64 {
        b.refill(T0, cap);
        b.s.tokens_ns.store(-debt_ns, Relaxed);
        assert!(matches!(meter.gate(evs, b, Some(cap), 1, at), Step::Wait(_)));
        b.s.closed_until_ns.load(Relaxed)
    }

    #[test]
    fn the_launch_estimate_weighs_every_launch_alike() {
        // A training step: a lone 1.5 ms GEMM, then fifty 5 us kernels in one event interval.
        let mut st = StreamTrack::<u32>::new(1, T0);
        for _ in 0..40 {
            st.learn(1_500_000, 1, false, T0);
            st.learn(250_000, 50, false, T0);
        }
        let per_launch = 1_750_000 / 51;
        assert!(
            st.est_ns.abs_diff(per_launch) * 2 < per_launch,
            "estimate {} ns for a mean of {per_launch} ns per launch (a mean of interval averages is ~750 us)",
            st.est_ns
        );
        // It follows a change of program phase: up within tens of intervals (launches, not
        // intervals, are what it averages), down within a few.
        for _ in 0..40 {
            st.learn(1_000_000, 1, false, T0);
        }
        assert!(st.est_ns > 700_000, "up to 1 ms kernels: {}", st.est_ns);
        for _ in 0..12 {
            st.learn(100_000, 20, false, T0);
        }
        assert!(st.est_ns < 50_000, "down to 5 us kernels: {}", st.est_ns);
    }

    #[test]
    fn a_collapsed_interval_does_not_make_later_ones_look_slowed() {
        // An interval measured as nothing (its event mapped no later than where it had to
        // start) is no per-launch time: taken as the solo time, it made every later interval
        // look slowed 1000x, and under contention each was charged a fifth of its length (two
        // containers capped 30 and 60 on an H100 both ran at 44% of the GPU, neither held).
        let mut st = StreamTrack::<u32>::new(1, T0);
        st.learn(0, 1, false, T0);
        st.learn(10, 50, false, T0); // 0.2 ns a launch: an event mapped onto its start
        for _ in 1..20 {
            st.learn(MS, 1, false, T0);
        }
        for _ in 20..40 {
            st.learn(MS, 1, true, T0);
        }
        assert_eq!(st.share_milli(true), 1000, "1 ms kernels that take 1 ms are not slowed");
    }

    #[test]
    fn the_solo_time_is_learned_only_while_alone() {
        // Started beside another tenant: no solo time known, nothing is discounted.
        let mut st = StreamTrack::<u32>::new(1, T0);
        for _ in 0..20 {
            st.learn(2 * MS, 1, true, T0);
        }
        assert_eq!(st.share_milli(true), 1000);
        // Alone, 1 ms per launch; then beside a tenant, 2 ms: half of each interval was ours.
        for _ in 20..40 {
            st.learn(MS, 1, false, T0);
        }
        for _ in 40..60 {
            st.learn(2 * MS, 1, true, T0);
        }
        let share = st.share_milli(true);
        assert!((450..=550).contains(&share), "share {share}");
        // A mix of kernels compares like with like: a 5 us kernel after 1 ms ones is not faster.
        let mut st = StreamTrack::<u32>::new(1, T0);
        for i in 0..40 {
            st.learn(if i % 2 == 0 { 5_000 } else { MS }, 1, false, T0);
        }
        for i in 40..80 {
            st.learn(if i % 2 == 0 { 5_000 } else { MS }, 1, true, T0);
        }
        assert_eq!(st.share_milli(true), 1000, "the same mix, not slowed");
        // Alone with 5 us kernels, then 500 us ones beside a tenant: the comparison is between
        // different kernels, so the discount is bounded (a fifth of the charge let a container
        // run at five times its cap).
        let mut st = StreamTrack::<u32>::new(1, T0);
        for _ in 0..20 {
            st.learn(5_000, 1, false, T0);
        }
        for _ in 0..20 {
            st.learn(500_000, 1, true, T0);
        }
        assert_eq!(st.share_milli(true), MIN_SHARE_MILLI);
    }

    #[test]
    fn a_launch_without_an_event_is_charged_at_the_next_synchronize() {
        let (s, m, mut evs, mut meter) = fixture();
        let b = Bucket::new(&s, &m);
        meter.launched(1, None, None, T0, &mut evs);
        assert_eq!(meter.pending_launches(), 1);
        meter.poll(&mut evs, &b, T0 + 2 * MS);
        assert_eq!(meter.charged_total_ns, 0, "nothing is known before the synchronize");
        meter.synced(&mut evs, &b, T0 + 2 * MS, T0 + 2 * MS);
        assert_eq!(meter.charged_total_ns, INITIAL_LAUNCH_EST_NS, "its estimated time, not the whole wait");
        assert_eq!(meter.pending_launches(), 0);
        meter.launched(1, None, None, T0 + 3 * MS, &mut evs);
        meter.synced(&mut evs, &b, T0 + 3 * MS + 300_000, T0 + 3 * MS + 300_000);
        assert_eq!(meter.charged_total_ns, INITIAL_LAUNCH_EST_NS + 300_000, "never past the synchronize");
    }

    #[test]
    fn a_synchronize_that_blocked_charges_the_wait_less_the_drivers_wake_up() {
        let (s, m, mut evs, mut meter) = fixture();
        let b = Bucket::new(&s, &m);
        // No event, entered 10 us after the launch, returned 5 ms later: the GPU ran until then.
        meter.launched(1, None, None, T0, &mut evs);
        meter.synced(&mut evs, &b, T0 + 10_000, T0 + 5 * MS);
        assert_eq!(meter.charged_total_ns, 5 * MS, "the estimate and the wait, each instant once");
        assert_eq!(meter.stats.sync_blocked_ns, 4 * MS);
        // A launch with an end event, its synchronize returning 20 us after it ended: the wake-up.
        let t = T0 + 10 * MS;
        evs.states.insert(1, EventState::Done(t + 100_000));
        meter.launched(1, None, Some(1), t, &mut evs);
        meter.synced(&mut evs, &b, t + 5_000, t + 120_000);
        assert_eq!(meter.sync_wake_ns, 20_000);
        let before = meter.charged_total_ns;
        let t = T0 + 20 * MS;
        meter.launched(1, None, None, t, &mut evs);
        meter.synced(&mut evs, &b, t + 5_000, t + 3 * MS);
        assert_eq!(meter.charged_total_ns - before, 3 * MS - 20_000, "up to its return less the wake-up");
        // One that returned 15 us after it was entered waited on nothing worth charging.
        let (before, blocked) = (meter.charged_total_ns, meter.stats.sync_blocked_ns);
        let t = T0 + 30 * MS;
        meter.launched(1, None, None, t, &mut evs);
        meter.synced(&mut evs, &b, t + 500_000, t + 515_000);
        assert_eq!(meter.stats.sync_blocked_ns, blocked);
        assert!(meter.charged_total_ns - before <= 500_000, "its estimate, not past the synchronize");
    }

    #[test]
    fn a_lost_event_charges_nothing_and_does_not_block_the_stream() {
        let (s, m, mut evs, mut meter) = fixture();
        let b = Bucket::new(&s, &m);
        meter.launched(1, None, Some(10), T0, &mut evs);
        meter.launched(1, None, Some(11), T0 + MS, &mut evs);
        evs.states.insert(10, EventState::Lost);
        evs.states.insert(11, EventState::Done(T0 + 3 * MS));
        meter.poll(&mut evs, &b, T0 + 4 * MS);
        assert_eq!(meter.pending_launches(), 0);
        assert_eq!(meter.charged_total_ns, 2 * MS, "the second launch: from its submit to its end");
        assert_eq!(evs.released, vec![10, 11]);
    }

    #[test]
    fn a_start_event_sets_where_an_idle_stream_began() {
        let (s, m, mut evs, mut meter) = fixture();
        let b = Bucket::new(&s, &m);
        assert!(meter.wants_start_event(1, T0));
        meter.launched(1, Some(20), Some(21), T0, &mut evs);
        assert!(!meter.wants_start_event(1, T0 + MS), "work in flight: no start event");
        evs.states.insert(20, EventState::Done(T0 + 50_000));
        evs.states.insert(21, EventState::Done(T0 + 1_050_000));
        meter.poll(&mut evs, &b, T0 + 2 * MS);
        assert_eq!(meter.charged_total_ns, MS, "launch latency before the start event is not GPU time");
        assert!(!meter.wants_start_event(1, T0 + 2 * MS), "start events are spaced");
        assert!(meter.wants_start_event(1, T0 + IDLE_START_SPACING_NS));
        // Without one, the next launch on the idle stream begins where its start event would
        // have completed: 50 us after its submission, as this one's did.
        meter.launched(1, None, Some(22), T0 + 2 * MS, &mut evs);
        evs.states.insert(22, EventState::Done(T0 + 3 * MS));
        meter.poll(&mut evs, &b, T0 + 4 * MS);
        assert_eq!(meter.charged_total_ns, 2 * MS - 50_000);
    }

    #[test]
    fn a_launch_begins_after_its_start_event_by_the_host_time_between_them() {
        // The start event was recorded 30 us before the launch's submission and completed 1 us
        // after its record; the kernel reached the GPU those 30 us later, and ran 100 us (the
        // busy map counts in 10 us quanta).
        let (s, m, mut evs, mut meter) = fixture();
        let b = Bucket::new(&s, &m);
        let t = T0 + 10 * MS;
        meter.launched(1, None, Some(19), T0, &mut evs);
        evs.states.insert(19, EventState::Done(T0 + MS));
        meter.poll(&mut evs, &b, T0 + 2 * MS);
        let before = meter.charged_total_ns;
        evs.recorded.insert(20, t - 30_000);
        evs.states.insert(20, EventState::Done(t - 29_000));
        evs.states.insert(21, EventState::Done(t + 101_000));
        meter.launched(1, Some(20), Some(21), t, &mut evs);
        meter.poll(&mut evs, &b, t + MS);
        assert_eq!(meter.charged_total_ns - before, 100_000, "the hook's own 30 us before the launch is not GPU time");
    }

    #[test]
    fn launches_between_spaced_events_share_the_next_one() {
        // 20 us launches back to back: one event per EVENT_SPACING_NS, each covering its batch.
        let (s, m, mut evs, mut meter) = fixture();
        let b = Bucket::new(&s, &m);
        let mut recorded = 0u32;
        for k in 0..50u64 {
            let t = T0 + k * 20_000;
            let ev = meter.wants_end_event(1, 0, t).then(|| {
                recorded += 1;
                evs.states.insert(recorded, EventState::Done(t + 20_000));
                recorded
            });
            meter.launched(1, None, ev, t, &mut evs);
        }
        assert!((10..=11).contains(&recorded), "{recorded} events for 1 ms of launches");
        meter.synced(&mut evs, &b, T0 + 50 * 20_000, T0 + 50 * 20_000);
        assert_eq!(meter.charged_total_ns, 50 * 20_000, "every launch charged once, batches included");
    }

    /// 10 us kernels submitted every 50 us from `t0` (each runs 3..13 us after its submission),
    /// 40 of them, their events polled between launches as the gate does, each held briefly
    /// where `held`: what they were charged and how many events they got.
    fn paced_launches(meter: &mut Meter<u32>, evs: &mut Scripted, b: &Bucket<'_>, t0: u64, held: bool, next: &mut u32) -> (u64, u32) {
        paced_launches_late(meter, evs, b, t0, held, next, 0)
    }

    /// `paced_launches`, a start event's time showing `start_late_ns` more than the launch
    /// latency (the host was slow to reach the driver with its record).
    fn paced_launches_late(meter: &mut Meter<u32>, evs: &mut Scripted, b: &Bucket<'_>, t0: u64, held: bool, next: &mut u32, start_late_ns: u64) -> (u64, u32) {
        let (charged, mut events) = (meter.charged_total_ns, 0);
        let mut record = |evs: &mut Scripted, done: u64| {
            *next += 1;
            events += 1;
            evs.states.insert(*next, EventState::Done(done));
            *next
        };
        for k in 0..40 {
            let t = t0 + k * 50_000;
            // Held, a launch first waits: an event then ends the launches without one (on the
            // idle stream it completes at once, after the host's gap).
            if held && meter.wants_flush_event(1) {
                let ev = record(evs, t - 4_000);
                meter.flushed(1, ev, t - 5_000);
            }
            let start = meter.start_event(1, t).wanted.then(|| record(evs, t + 3_000 + start_late_ns));
            let end = (start.is_some() || meter.wants_end_event(1, 0, t)).then(|| record(evs, t + 13_000));
            meter.launched(1, start, end, t, evs);
            meter.poll(evs, b, t + 40_000);
        }
        (meter.charged_total_ns - charged, events)
    }

    #[test]
    fn a_start_event_the_host_was_slow_to_record_does_not_shorten_paced_launches() {
        // A thread just woken from a hold can take microseconds to reach the driver with its
        // record, and the start event's time shows that delay as launch latency. On the mock,
        // half the start events of 40 us kernels paced 60 us apart read 8-10 us where the
        // launches began 1-2 us after submission: their mean charged each about 36 us, and NVML
        // read 31.5% under a cap of 30. Here every other round's start event reads 7 us late.
        let (s, m, mut evs, mut meter) = fixture();
        let b = Bucket::new(&s, &m);
        let mut next = 100;
        paced_launches(&mut meter, &mut evs, &b, T0, false, &mut next);
        paced_launches(&mut meter, &mut evs, &b, T0 + 10 * MS, false, &mut next);
        close_with_debt(&mut meter, &mut evs, &b, 30, 20 * MS as i64, T0 + 20 * MS);
        for r in 0..20 {
            let late = if r % 2 == 0 { 7_000 } else { 0 };
            let t0 = T0 + 21 * MS + r * (IDLE_START_SPACING_NS + MS);
            paced_launches_late(&mut meter, &mut evs, &b, t0, true, &mut next, late);
        }
        // Each launch is measured from its submission plus the learned latency to its end event.
        let st = meter.streams.iter().find(|s| s.key == 1).expect("the stream");
        assert!(st.est_ns.abs_diff(10_000) <= 500, "10 us kernels measured {} ns each (start latency {} ns for 3 us)", st.est_ns, st.start_lat_ns);
    }

    #[test]
    fn host_paced_launches_of_an_unknown_kind_get_an_end_event_each_under_a_cap() {
        let (s, m, mut evs, mut meter) = fixture();
        let b = Bucket::new(&s, &m);
        let mut next = 100;
        // Uncapped, spaced events span the host's gaps: 40 launches of 10 us charged about twice that.
        paced_launches(&mut meter, &mut evs, &b, T0, false, &mut next);
        let (spaced, spaced_events) = paced_launches(&mut meter, &mut evs, &b, T0 + 10 * MS, false, &mut next);
        assert!(spaced >= 800_000 && spaced_events <= 25, "uncapped: {spaced} ns in {spaced_events} events");
        // Under a cap (here held, too): an end event after each launch of kind 0, each charged its
        // 10 us (from its submission plus the start latency the start events showed).
        close_with_debt(&mut meter, &mut evs, &b, 30, 20 * MS as i64, T0 + 20 * MS);
        let (capped, capped_events) = paced_launches(&mut meter, &mut evs, &b, T0 + 21 * MS, true, &mut next);
        assert!((400_000..=410_000).contains(&capped) && capped_events >= 40, "capped: {capped} ns in {capped_events} events");
        // The cap lifted, spaced events again (each event costs the host a record).
        assert_eq!(meter.gate(&mut evs, &b, None, 1, T0 + 30 * MS), Step::Go);
        let (_, later_events) = paced_launches(&mut meter, &mut evs, &b, T0 + 30 * MS, false, &mut next);
        assert!(later_events <= 25, "{later_events} events once the cap was lifted");
    }

    #[test]
    fn backlogged_launches_keep_spaced_events_while_the_budget_holds() {
        // 20 us launches queued back to back (the GPU, not the host, sets the pace): one event per
        // EVENT_SPACING_NS, held or not.
        let (s, m, mut evs, mut meter) = fixture();
        let b = Bucket::new(&s, &m);
        close_with_debt(&mut meter, &mut evs, &b, 30, 5 * MS as i64, T0);
        let mut recorded = 0u32;
        for k in 0..50u64 {
            let t = T0 + k * 5_000;
            let start = meter.start_event(1, t).wanted.then(|| {
                recorded += 1;
                recorded
            });
            let ev = (start.is_some() || meter.wants_end_event(1, 0, t)).then(|| {
                recorded += 1;
                recorded
            });
            meter.launched(1, start, ev, t, &mut evs);
        }
        assert!(recorded <= 5, "{recorded} events for 250 us of launches");
    }

    #[test]
    fn a_stream_synchronized_after_each_short_launch_gets_few_start_events() {
        // 10 us kernels, each synchronized (16 us cycles; the kernel runs 4..14 us after its
        // submission; a start event there completes 3 us after it) for 10 ms: a start event
        // before a launch on the idle stream at most once per IDLE_START_SPACING_NS (an H100
        // lost 9-13% of such a program's speed to one per 100 us); the launches without one are
        // charged from where their start event would have completed (11 us each), not from
        // their submission (14 us).
        let (s, m, mut evs, mut meter) = fixture();
        let b = Bucket::new(&s, &m);
        let (mut ids, mut starts, mut ends) = (0u32, 0u32, 0u32);
        let mut next_id = |evs: &mut Scripted, done: u64| {
            ids += 1;
            evs.states.insert(ids, EventState::Done(done));
            ids
        };
        let cycles = 10 * MS / 16_000;
        for k in 0..cycles {
            let t = T0 + k * 16_000;
            let se = meter.start_event(1, t);
            let start_ev = se.wanted.then(|| next_id(&mut evs, t + 3_000));
            starts += start_ev.is_some() as u32;
            let end_ev = (start_ev.is_some() || meter.wants_end_event(1, 0, t)).then(|| next_id(&mut evs, t + 14_000));
            ends += end_ev.is_some() as u32;
            meter.launched(1, start_ev, end_ev, t, &mut evs);
            meter.synced(&mut evs, &b, t + 15_000, t + 15_000);
        }
        assert!(starts <= 3, "{starts} start events in 10 ms");
        assert!(ends <= 12, "{ends} end events in 10 ms");
        let charged = meter.charged_total_ns;
        assert!((cycles * 10_000..=cycles * 11_500).contains(&charged), "charged {charged} for {cycles} launches");
    }

    #[test]
    fn a_lone_launch_after_a_synchronize_is_charged_up_to_the_next_one() {
        let (s, m, mut evs, mut meter) = fixture();
        let b = Bucket::new(&s, &m);
        // Two 50 us kernels with end events, each synchronized 10 us after it ended: the second
        // (the first after a synchronize) shows the synchronize returns 10 us after the end.
        for (k, ev) in [(0, 1u32), (1, 2)] {
            let t = T0 + k * 100_000;
            evs.states.insert(ev, EventState::Done(t + 50_000));
            meter.launched(1, None, Some(ev), t, &mut evs);
            meter.synced(&mut evs, &b, t + 60_000, t + 60_000);
        }
        assert_eq!(meter.charged_total_ns, 100_000);
        // An 80 us kernel without an event: charged up to its synchronize less those 10 us, not
        // the 50 us estimate.
        meter.launched(1, None, None, T0 + 200_000, &mut evs);
        meter.synced(&mut evs, &b, T0 + 290_000, T0 + 290_000);
        assert_eq!(meter.charged_total_ns, 180_000);
        // A 10 ms pause before the synchronize is not GPU time: at most 4 estimates.
        meter.launched(1, None, None, T0 + 300_000, &mut evs);
        meter.synced(&mut evs, &b, T0 + 10 * MS, T0 + 10 * MS);
        let est = meter.streams[0].est_ns;
        assert!((180_000 + est..=180_000 + SYNC_WINDOW_EST_MAX * est).contains(&meter.charged_total_ns), "charged {}", meter.charged_total_ns);
        // Two launches between synchronizes: their estimate, as before.
        let before = meter.charged_total_ns;
        meter.launched(1, None, None, T0 + 11 * MS, &mut evs);
        meter.launched(1, None, None, T0 + 11 * MS + 1_000, &mut evs);
        meter.synced(&mut evs, &b, T0 + 12 * MS, T0 + 12 * MS);
        assert_eq!(meter.charged_total_ns - before, 2 * est);
    }

    #[test]
    fn a_wait_closes_the_launches_without_an_event_where_they_end() {
        let (s, m, mut evs, mut meter) = fixture();
        let b = Bucket::new(&s, &m);
        meter.launched(1, None, Some(1), T0, &mut evs);
        meter.launched(1, None, None, T0 + 10_000, &mut evs);
        assert!(meter.wants_flush_event(1) && !meter.wants_flush_event(2));
        meter.flushed(1, 2, T0 + 20_000);
        assert!(!meter.wants_flush_event(1));
        assert_eq!(meter.pending_launches(), 2);
        evs.states.insert(1, EventState::Done(T0 + 300_000));
        evs.states.insert(2, EventState::Done(T0 + 600_000));
        // The wait lasts 5 ms; the next launch's interval must not include it.
        meter.poll(&mut evs, &b, T0 + 5 * MS);
        assert_eq!(meter.charged_total_ns, 600_000);
    }

    #[test]
    fn cpu_work_before_a_synchronize_is_not_charged() {
        // Evented 100 us launches teach the estimate; then three launches without events, 1 s
        // of CPU work, a synchronize: charged about their estimated time, not the second.
        let (s, m, mut evs, mut meter) = fixture();
        let b = Bucket::new(&s, &m);
        for k in 0..5u64 {
            let t = T0 + k * 200_000;
            evs.states.insert(k as u32, EventState::Done(t + 100_000));
            meter.launched(1, None, Some(k as u32), t, &mut evs);
        }
        meter.poll(&mut evs, &b, T0 + MS);
        let before = meter.charged_total_ns;
        for k in 0..3u64 {
            meter.launched(1, None, None, T0 + MS + k * 1_000, &mut evs);
        }
        meter.synced(&mut evs, &b, T0 + 1_000 * MS, T0 + 1_000 * MS);
        let tail = meter.charged_total_ns - before;
        assert!((300_000..=700_000).contains(&tail), "charged {tail} ns for three ~100 us launches");
    }

    #[test]
    fn many_short_lived_streams_are_forgotten_when_idle() {
        let (s, m, mut evs, mut meter) = fixture();
        let b = Bucket::new(&s, &m);
        for k in 0..500u32 {
            let t = T0 + k as u64 * MS;
            meter.launched(k as u64, None, Some(k), t, &mut evs);
            evs.states.insert(k, EventState::Done(t + MS / 2));
            meter.poll(&mut evs, &b, t + MS);
        }
        assert!(meter.streams.len() <= MAX_STREAMS);
        assert_eq!(meter.launches(), 500);
        assert_eq!(meter.charged_total_ns, 500 * MS / 2);
    }

    #[test]
    fn uncapped_never_waits_and_keeps_the_bucket_full() {
        let (s, m, mut evs, mut meter) = fixture();
        let b = Bucket::new(&s, &m);
        b.refill(T0, 100);
        for i in 0..100 {
            meter.launched(1, None, Some(i), T0 + i as u64 * MS, &mut evs);
            assert_eq!(meter.gate(&mut evs, &b, None, 1, T0 + i as u64 * MS), Step::Go);
        }
        assert!(b.balance() >= 0);
    }

    /// A 1 ms GEMM and a 10 us kernel measured once each on stream 1, then one more small
    /// kernel with an event and `n` without (named by their kind, or of unknown kind): may a
    /// further launch go under a cap of 50 (a 2 ms queue target, the bucket empty)?
    fn small_kernels_behind_a_gemm_may_queue(by_kind: bool, n: u32) -> bool {
        let (s, m, mut evs, mut meter) = fixture();
        let b = Bucket::new(&s, &m);
        b.refill(T0, 50);
        let (gemm, tiny) = (crate::limiter::kinds::kernel_kind(0x1000, 132), crate::limiter::kinds::kernel_kind(0x2000, 8));
        meter.launched_kind(1, gemm, None, Some(1), T0, &mut evs);
        meter.launched_kind(1, tiny, None, Some(2), T0 + 1_100_000, &mut evs);
        evs.states.insert(1, EventState::Done(T0 + MS));
        evs.states.insert(2, EventState::Done(T0 + 1_110_000));
        meter.poll(&mut evs, &b, T0 + 1_200_000);
        let kind = if by_kind { tiny } else { 0 };
        meter.launched_kind(1, kind, None, Some(3), T0 + 1_300_000, &mut evs);
        for i in 0..n {
            meter.launched_kind(1, kind, None, None, T0 + 1_310_000 + i as u64 * 1_000, &mut evs);
        }
        meter.gate(&mut evs, &b, Some(50), 1, T0 + 2 * MS) == Step::Go
    }

    #[test]
    fn small_kernels_queued_behind_a_gemm_count_at_their_own_length() {
        // The stream's per-launch estimate is the GEMM's and the small kernel's average (about
        // 0.5 ms): fifty small kernels read as 25 ms and held the host while the GPU had 0.5 ms
        // (GPT-2 on an H200: 315 launches pending read as 134 ms). Valued by their kind they go.
        assert!(small_kernels_behind_a_gemm_may_queue(true, 50));
        assert!(!small_kernels_behind_a_gemm_may_queue(false, 50), "without a kind they are valued at the stream's estimate");
        assert!(!small_kernels_behind_a_gemm_may_queue(true, 300), "300 of them are 3 ms: over the target");
    }

    #[test]
    fn a_full_queue_waits_for_its_own_stream() {
        let (s, m, mut evs, mut meter) = fixture();
        let b = Bucket::new(&s, &m);
        b.refill(T0, 50);
        meter.launched(1, None, Some(1), T0, &mut evs);
        meter.launched(1, None, Some(2), T0, &mut evs);
        // Two launches of an unmeasured stream (1 ms each by the initial estimate) fill the queue.
        assert!(matches!(meter.gate(&mut evs, &b, Some(50), 1, T0 + 10_000), Step::Wait(_)));
        // Another stream with nothing queued is held by the same bound only if it has work.
        assert_eq!(meter.gate(&mut evs, &b, Some(50), 2, T0 + 10_000), Step::Go);
        evs.states.insert(1, EventState::Done(T0 + MS));
        evs.states.insert(2, EventState::Done(T0 + 2 * MS));
        assert_eq!(meter.gate(&mut evs, &b, Some(50), 1, T0 + 2 * MS), Step::Go);
    }

    #[test]
    fn a_queue_bound_holds_uncapped_launches_behind_their_own_queue() {
        // Below a higher-priority container (issue 14): at most about 1 ms queued, cap or not.
        let (s, m, mut evs, mut meter) = fixture();
        let b = Bucket::new(&s, &m);
        meter.queue_bound_ns = Some(MS);
        assert_eq!(meter.gate(&mut evs, &b, None, 1, T0), Step::Go);
        meter.launched(1, None, Some(1), T0, &mut evs);
        assert!(matches!(meter.gate(&mut evs, &b, None, 1, T0 + 10_000), Step::Wait(_)), "1 ms queued");
        evs.states.insert(1, EventState::Done(T0 + MS));
        assert_eq!(meter.gate(&mut evs, &b, None, 1, T0 + MS), Step::Go);
        // Under a cap the tighter of the two bounds applies.
        meter.launched(1, None, Some(2), T0 + MS, &mut evs);
        assert!(matches!(meter.gate(&mut evs, &b, Some(50), 1, T0 + MS + 10_000), Step::Wait(_)));
        meter.queue_bound_ns = None;
        assert_eq!(meter.gate(&mut evs, &b, None, 1, T0 + MS + 10_000), Step::Go, "no bound, no cap: never waits");
    }

    #[test]
    fn in_debt_a_launch_that_runs_beside_queued_work_goes() {
        let (s, m, mut evs, mut meter) = fixture();
        let b = Bucket::new(&s, &m);
        b.refill(T0, 50);
        let debt = |d: i64| s.tokens_ns.store(-d, Relaxed);
        // Stream 1 holds 1 ms of work (the initial estimate), queued just now.
        meter.launched(1, None, Some(1), T0, &mut evs);
        debt(2 * MS as i64);
        let at = T0 + 10_000;
        assert_eq!(meter.gate(&mut evs, &b, Some(50), 2, at), Step::Go, "stream 2's 1 ms runs beside it");
        assert_eq!(meter.stats.beside_queued, 1);
        assert!(matches!(meter.gate(&mut evs, &b, Some(50), 1, at), Step::Wait(_)), "behind its own queue: adds its whole time");
        assert!(matches!(meter.gate(&mut evs, &b, Some(50), 2, T0 + 600_000), Step::Wait(_)), "would run mostly alone");
        debt(BESIDE_DEBT_NS + 1);
        assert!(matches!(meter.gate(&mut evs, &b, Some(50), 2, at), Step::Wait(_)), "too deep in debt");
        // The budget closed by another thread: the same rule, the same bound.
        debt(2 * MS as i64);
        s.closed_until_ns.store(closure_word(T0 + 5 * MS, 50), Relaxed);
        assert_eq!(meter.gate(&mut evs, &b, Some(50), 2, at), Step::Go);
        // Its work done, nothing is queued to run beside.
        evs.states.insert(1, EventState::Done(T0 + MS));
        assert!(matches!(meter.gate(&mut evs, &b, Some(50), 2, T0 + MS + 30_000), Step::Wait(_)));
        assert_eq!(meter.stats.beside_queued, 2);
    }

    #[test]
    fn a_long_idle_stream_does_not_count_as_queued_work() {
        // Stream 3 ran one launch without an event 50 ms ago and went idle (nothing closes it
        // until its next launch or a synchronize): stream 2 still pairs with stream 1's work.
        let (s, m, mut evs, mut meter) = fixture();
        let b = Bucket::new(&s, &m);
        b.refill(T0, 50);
        meter.launched(3, None, None, T0 - 50 * MS, &mut evs);
        meter.launched(1, None, Some(1), T0, &mut evs);
        s.tokens_ns.store(-2 * MS as i64, Relaxed);
        assert_eq!(meter.gate(&mut evs, &b, Some(50), 2, T0 + 10_000), Step::Go);
    }

    #[test]
    fn in_debt_a_launch_waits_when_several_streams_have_work_queued() {
        let (s, m, mut evs, mut meter) = fixture();
        let b = Bucket::new(&s, &m);
        b.refill(T0, 50);
        // Streams 1 and 2 hold 1 ms each: a third kernel would queue behind a pair already
        // sharing the GPU, not run beside it (eight threads went in debt together this way).
        meter.launched(1, None, Some(1), T0, &mut evs);
        meter.launched(2, None, Some(2), T0, &mut evs);
        s.tokens_ns.store(-2 * MS as i64, Relaxed);
        assert!(matches!(meter.gate(&mut evs, &b, Some(50), 3, T0 + 10_000), Step::Wait(_)));
        assert_eq!(meter.stats.beside_queued, 0);
    }

    /// Virtual time for `hold`: sleeps and yields move it.
    struct Virt {
        now: u64,
    }
    impl crate::limiter::Clock for Virt {
        fn now_ns(&self) -> u64 {
            self.now
        }
        fn sleep_ns(&mut self, ns: u64) {
            self.now += ns
        }
        fn pause(&mut self) {
            self.now += 10_000;
        }
    }

    #[test]
    fn work_a_hold_let_go_is_not_owed_past_one_full_hold() {
        // 500 ms kernels under a cap of 10: every hold runs out (2 s) and the kernel goes. The
        // debt that leaves is floored at what one full hold repays: without the floor it grew
        // 0.1 s a second, and after 100 kernels a launch 10 s later still waited its 2 s.
        let (s, m, mut evs, mut meter) = fixture();
        let b = Bucket::new(&s, &m);
        b.refill(T0, 10);
        let mut clk = Virt { now: T0 };
        for k in 0..100u32 {
            hold(&mut clk, |now| meter.gate(&mut evs, &b, Some(10), 1, now));
            evs.states.insert(k, EventState::Done(clk.now + 500 * MS));
            meter.launched(1, None, Some(k), clk.now, &mut evs);
            clk.now += 500 * MS;
            meter.synced(&mut evs, &b, clk.now, clk.now);
        }
        let closed = closure_of(s.closed_until_ns.load(Relaxed)).0;
        assert!(closed <= clk.now + MAX_HOLD_NS, "closed {} ms ahead", (closed - clk.now) / MS);
        clk.now += 10_000 * MS; // 10 s idle at cap 10 refill 1 s
        let held = hold(&mut clk, |now| meter.gate(&mut evs, &b, Some(10), 1, now));
        assert_eq!(held, 0, "balance {} ms", b.balance() / MS as i64);
    }

    #[test]
    fn uncapped_the_bucket_stays_full_whatever_the_charge_scale() {
        // Charged at a scale learned under a cap (NVML counted 1.7x what the events saw),
        // a busy uncapped container must still start a later cap clean (it ran up 7 s of debt).
        let (s, m, mut evs, mut meter) = fixture();
        let b = Bucket::new(&s, &m);
        s.charge_scale_milli.store(1700, Relaxed);
        b.refill(T0, 100);
        for k in 0..10_000u32 {
            let t = T0 + k as u64 * MS;
            assert_eq!(meter.gate(&mut evs, &b, None, 1, t), Step::Go);
            evs.states.insert(k, EventState::Done(t + MS));
            meter.launched(1, None, Some(k), t, &mut evs);
        }
        assert!(b.balance() >= 0, "balance {} ms", b.balance() / MS as i64);
    }

    #[test]
    fn a_refill_never_wraps_the_balance() {
        // A bogus `now` (a clock jump) adds an absurd refill: the balance saturates at the
        // bucket's ceiling, it does not wrap to -9e18 (a container that then never runs).
        let (s, m) = (SharedDeviceState::default(), BusyMap::default());
        let b = Bucket::new(&s, &m);
        b.refill(1_000, 99);
        s.tokens_ns.store(crate::limiter::save_ns(99), Relaxed);
        b.refill_to(u64::MAX, 99, crate::limiter::save_ns(99));
        assert_eq!(b.balance(), crate::limiter::save_ns(99));
    }

    #[test]
    fn a_hold_ends_even_when_the_clock_stops() {
        // A clock frozen at one instant (a time-stamp counter a resume reset): the hold ends by
        // what it slept, and by what it yielded.
        struct Frozen {
            slept: u64,
            pauses: u64,
        }
        impl crate::limiter::Clock for Frozen {
            fn now_ns(&self) -> u64 {
                T0
            }
            fn sleep_ns(&mut self, ns: u64) {
                self.slept += ns
            }
            fn pause(&mut self) {
                self.pauses += 1
            }
        }
        let mut clk = Frozen { slept: 0, pauses: 0 };
        assert!(hold(&mut clk, |_| Step::Wait(MAX_WAIT_NS)) >= MAX_HOLD_NS);
        assert!(clk.slept <= MAX_HOLD_NS && clk.slept + clk.pauses * PAUSE_COUNTS_NS >= MAX_HOLD_NS, "slept {} ms", clk.slept / MS);
        let mut clk = Frozen { slept: 0, pauses: 0 };
        assert!(hold(&mut clk, |_| Step::Wait(MIN_WAIT_NS)) >= MAX_HOLD_NS);
        assert_eq!(clk.pauses, MAX_HOLD_NS / PAUSE_COUNTS_NS);
    }

    #[test]
    fn a_raised_cap_reopens_a_closed_budget_as_soon_as_it_repays_the_debt() {
        // One 200 ms kernel under a cap of 5 closes the budget for 2 s (its debt, floored at
        // one full hold's worth). Raised to 50, the same debt is repaid in 0.2 s: the closure,
        // reckoned at the old cap, must not hold the launch for the rest of the 2 s.
        let (s, m, mut evs, mut meter) = fixture();
        let b = Bucket::new(&s, &m);
        b.refill(T0, 5);
        assert_eq!(meter.gate(&mut evs, &b, Some(5), 1, T0), Step::Go);
        evs.states.insert(0, EventState::Done(T0 + 200 * MS));
        meter.launched(1, None, Some(0), T0, &mut evs);
        let t = T0 + 200 * MS;
        meter.synced(&mut evs, &b, t, t);
        assert!(matches!(meter.gate(&mut evs, &b, Some(5), 1, t), Step::Wait(_)));
        let closed = closure_of(s.closed_until_ns.load(Relaxed)).0;
        assert!(closed >= t + 1_900 * MS, "closed {} ms", (closed - t) / MS);
        let mut clk = Virt { now: t };
        let held = hold(&mut clk, |now| meter.gate(&mut evs, &b, Some(50), 1, now));
        assert!((150 * MS..=250 * MS).contains(&held), "held {} ms at the raised cap", held / MS);
        // A lower cap does not shorten it, and the same cap keeps the closure it set.
        let (s, m, mut evs, mut meter) = fixture();
        let b = Bucket::new(&s, &m);
        let closed = close_with_debt(&mut meter, &mut evs, &b, 50, 100 * MS as i64, T0);
        assert!(matches!(meter.gate(&mut evs, &b, Some(50), 1, T0 + 100 * MS), Step::Wait(_)));
        assert!(matches!(meter.gate(&mut evs, &b, Some(10), 1, T0 + 100 * MS), Step::Wait(_)));
        assert_eq!(s.closed_until_ns.load(Relaxed), closed);
    }

    #[test]
    fn a_cap_raised_midway_through_a_closure_repays_at_the_old_cap_until_the_raise() {
        // A 101 ms debt closes the budget for 2.02 s at cap 5. Raised to 10 after 1.0 s, 50 ms
        // were repaid at 5%: the 51 ms left take 0.51 s at 10%. Credited at 10% for the whole
        // closure (the refill's view), the launch went 9 ms after the raise (a review).
        let (s, m, mut evs, mut meter) = fixture();
        let b = Bucket::new(&s, &m);
        let t = T0 + MS;
        close_with_debt(&mut meter, &mut evs, &b, 5, 101 * MS as i64, t);
        let mut clk = Virt { now: t + 1_000 * MS };
        let held = hold(&mut clk, |now| meter.gate(&mut evs, &b, Some(10), 1, now));
        assert!((480 * MS..=540 * MS).contains(&held), "went {} ms after the raise", held / MS);
    }

    #[test]
    fn at_an_unchanged_cap_no_look_moves_the_closure() {
        // A look whose `now` is older than another process's closure (read before it took the
        // lock), and a look within a skipped refill (`REFILL_MIN_NS`), both left the closure
        // earlier when it was reckoned again from the balance (a review: by 10 ms, by 40 us).
        let (s, m, mut evs, mut meter) = fixture();
        let b = Bucket::new(&s, &m);
        let closed = close_with_debt(&mut meter, &mut evs, &b, 50, 100 * MS as i64, T0 + 10 * MS);
        let (_, _, mut evs2, mut other) = fixture();
        assert!(matches!(other.gate(&mut evs2, &b, Some(50), 1, T0), Step::Wait(_)));
        assert_eq!(s.closed_until_ns.load(Relaxed), closed, "a stale look");
        let (s, m, mut evs, mut meter) = fixture();
        let b = Bucket::new(&s, &m);
        let closed = close_with_debt(&mut meter, &mut evs, &b, 50, 100 * MS as i64, T0 + 40_000);
        assert!(matches!(meter.gate(&mut evs, &b, Some(50), 1, T0 + MS), Step::Wait(_)));
        assert_eq!(s.closed_until_ns.load(Relaxed), closed, "a look within a skipped refill");
    }

    /// Two launches of an unmeasured stream (1 ms each by the initial estimate) fill a 2 ms
    /// queue bound at `T0`; the first ends at `end`, the second right after. Holds a third
    /// launch behind them from `clk`'s time until it goes; returns the time held.
    fn wait_behind_a_kernel_ending_at(clk: &mut impl crate::limiter::Clock, end: u64) -> u64 {
        let (s, m, mut evs, mut meter) = fixture();
        let b = Bucket::new(&s, &m);
        b.refill(T0, 50);
        meter.queue_bound_ns = Some(2 * MS);
        meter.launched(1, None, Some(1), T0, &mut evs);
        meter.launched(1, None, Some(2), T0, &mut evs);
        hold(clk, |now| {
            if now >= end {
                evs.states.insert(1, EventState::Done(end - 1));
                evs.states.insert(2, EventState::Done(end));
            }
            meter.gate(&mut evs, &b, None, 1, now)
        })
    }

    #[test]
    fn behind_an_overdue_kernel_a_launch_goes_within_a_millisecond_of_its_end() {
        // The kernel ends 1 us after a look 170 ms past its estimate: an eighth of the lateness
        // per look (up to 20 ms) let the launch go 19.9 ms after it (a review).
        let end = T0 + 170 * MS + 1_000;
        let mut clk = Virt { now: T0 + 170 * MS };
        wait_behind_a_kernel_ending_at(&mut clk, end);
        assert!(clk.now - end <= MS, "went {} us after the kernel ended", (clk.now - end) / 1_000);
    }

    #[test]
    fn a_launch_behind_a_kernel_far_past_its_estimate_sleeps_rather_than_spins() {
        // The first launch of a long kind: estimated 1 ms (an unmeasured stream), it runs
        // 500 ms. The launch queued behind it waits for it, but not by yielding in a loop (one
        // core busy for the whole kernel): once the kernel is well past its estimate it sleeps,
        // and it still goes soon after the kernel ends.
        struct Counting {
            now: u64,
            sleeps: u64,
            yielded_ns: u64,
        }
        impl crate::limiter::Clock for Counting {
            fn now_ns(&self) -> u64 {
                self.now
            }
            fn sleep_ns(&mut self, ns: u64) {
                self.now += ns;
                self.sleeps += 1;
            }
            fn pause(&mut self) {
                self.now += 10_000;
                self.yielded_ns += 10_000;
            }
        }
        let end = T0 + 500 * MS;
        let mut clk = Counting { now: T0 + 10_000, sleeps: 0, yielded_ns: 0 };
        let held = wait_behind_a_kernel_ending_at(&mut clk, end);
        assert!(clk.now >= end && clk.now <= end + MS, "went {} us after the kernel ended", (clk.now - end) / 1_000);
        assert!(clk.yielded_ns <= OVERDUE_POLL_NS + 2 * MS, "yielded {} ms of a {} ms wait", clk.yielded_ns / MS, held / MS);
        assert!(clk.sleeps <= 600, "{} sleeps in a {} ms wait", clk.sleeps, held / MS);
    }

    #[test]
    fn a_hold_keeps_to_what_is_left_of_the_bound() {
        let mut clk = Virt { now: T0 };
        let held = hold_for(&mut clk, 500 * MS, |_| Step::Wait(MAX_WAIT_NS));
        assert!((500 * MS..501 * MS).contains(&held), "held {} ms", held / MS);
        let mut clk = Virt { now: T0 };
        assert_eq!(hold_for(&mut clk, 0, |_| Step::Wait(MAX_WAIT_NS)), 0, "nothing left: the launch goes");
        assert_eq!(hold_for(&mut clk, 0, |_| Step::Go), 0);
    }

    /// Shapes a host-paced close at the stream's estimate got wrong (a hostile review of 0beea06,
    /// reverted in session 39; each failed there and passes here): launches of different lengths on
    /// one stream, a model GPU running each stream in order, charges against its real busy time.
    /// Host-paced shapes against a model GPU: what the launches were charged beside the GPU time
    /// they took (the union of their runs), and the events they cost.
    mod paced_shapes {
        use super::*;
        use std::collections::HashSet;

        const US: u64 = 1_000;
        /// How long after its submission the GPU reaches a launch on an idle stream.
        const LAT: u64 = 3_000;
        /// How long after the GPU drains a synchronize returns.
        const SYNC_LAT: u64 = 5_000;

        /// A GPU model: one in-order queue per stream; events complete when the GPU reaches them and
        /// are seen only once the poll's `now` is past that.
        #[derive(Default)]
        struct Gpu {
            /// When the GPU reaches each event.
            done: HashMap<u32, u64>,
            /// Host time of the latest poll.
            now: u64,
            released: HashSet<u32>,
            next: u32,
            /// When each stream's queue drains.
            tail: HashMap<u64, u64>,
            /// Every kernel's run on the GPU.
            busy: Vec<(u64, u64)>,
            /// Review: events that read `Lost`, and when the host recorded some.
            lost: HashSet<u32>,
            recorded: HashMap<u32, u64>,
        }
        impl Events for Gpu {
            type Ev = u32;
            fn recorded_ns(&self, ev: u32) -> Option<u64> {
                self.recorded.get(&ev).copied()
            }
            fn poll(&mut self, ev: u32) -> EventState {
                if self.lost.contains(&ev) {
                    return EventState::Lost;
                }
                match self.done.get(&ev) {
                    Some(&t) if t <= self.now => EventState::Done(t),
                    _ => EventState::Pending,
                }
            }
            fn release(&mut self, ev: u32) {
                assert!(self.released.insert(ev), "event {ev} released twice");
            }
        }
        impl Gpu {
            fn record(&mut self, key: u64, at: u64) -> u32 {
                self.next += 1;
                let t = self.tail.get(&key).copied().unwrap_or(0).max(at + LAT);
                self.done.insert(self.next, t);
                self.next
            }
            /// The union of the kernels' busy time, from the `from`th kernel on.
            fn union_from(&self, from: usize) -> u64 {
                let mut v = self.busy[from..].to_vec();
                v.sort();
                let (mut total, mut cur) = (0u64, (0u64, 0u64));
                for (s, e) in v {
                    if s > cur.1 {
                        total += cur.1 - cur.0;
                        cur = (s, e);
                    } else {
                        cur.1 = cur.1.max(e);
                    }
                }
                total + cur.1 - cur.0
            }
            fn all_done(&self) -> u64 {
                self.tail.values().copied().max().unwrap_or(0)
            }
        }

        /// A meter, the GPU it times, and where the counted launches begin.
        struct Sim<'a> {
            meter: Meter<u32>,
            gpu: Gpu,
            b: &'a Bucket<'a>,
            /// Launch as if under a cap (`Meter::capped`; the gate looks uncapped here).
            capped: bool,
            /// Counted from here (`mark`): charged, kernels, events.
            from: (u64, usize, u32),
        }
        impl Sim<'_> {
            /// Count the launches from here on only.
            fn mark(&mut self) {
                self.from = (self.meter.charged_total_ns, self.gpu.busy.len(), self.gpu.next);
            }
            /// One launch as the glue makes it (gate look, start event, end event) of `kind` on
            /// `key`, submitted at `t`, running `dur`, beginning no earlier than `after` (a
            /// cuStreamWaitEvent before it on other work; 0: none). Returns when it ends.
            fn launch_after(&mut self, key: u64, kind: u64, t: u64, dur: u64, after: u64) -> u64 {
                self.gpu.now = t;
                assert_eq!(self.meter.gate(&mut self.gpu, self.b, None, key, t), Step::Go);
                self.meter.capped = self.capped;
                let tail = self.gpu.tail.get(&key).copied().unwrap_or(0).max(after);
                self.gpu.tail.insert(key, tail);
                let se = self.meter.start_event(key, t).wanted.then(|| self.gpu.record(key, t));
                let begin = tail.max(t + LAT);
                self.gpu.tail.insert(key, begin + dur);
                self.gpu.busy.push((begin, begin + dur));
                let ev = (se.is_some() || self.meter.wants_end_event(key, kind, t)).then(|| self.gpu.record(key, t));
                self.meter.launched_kind(key, kind, se, ev, t, &mut self.gpu);
                begin + dur
            }
            fn launch(&mut self, key: u64, kind: u64, t: u64, dur: u64) -> u64 {
                self.launch_after(key, kind, t, dur, 0)
            }
            /// The budget holds a launch on stream 1 at `t`, as the glue does: a gate look that
            /// says wait, then a flush event if the meter wants one (`wants_flush_event`); then
            /// the budget opens again.
            fn hold(&mut self, t: u64) {
                self.gpu.now = t;
                close_with_debt(&mut self.meter, &mut self.gpu, self.b, 30, 10 * MS as i64, t);
                if self.meter.wants_flush_event(1) {
                    let ev = self.gpu.record(1, t);
                    self.meter.flushed(1, ev, t);
                }
                self.b.s.closed_until_ns.store(0, Relaxed);
                self.b.s.tokens_ns.store(0, Relaxed);
            }
            /// The host synchronizes at `t`: when it returns.
            /// A synchronize entered at `t`; returns when it returned.
            fn sync(&mut self, t: u64) -> u64 {
                sync_until(self, t, 0)
            }
        }

        /// What a shape's launches were charged, the GPU time they took, and the timing events
        /// recorded for them.
        struct Figures {
            charged: u64,
            busy: u64,
            events: u32,
        }
        impl Figures {
            fn ratio(&self) -> f64 {
                self.charged as f64 / self.busy as f64
            }
        }

        /// After a warm stream 1 (kind 0, 10 us every 50 us for 10 ms, uncapped), the launches
        /// `shape` makes from the time it is given, under a cap (`capped`) or not, then a
        /// synchronize: nothing may stay pending.
        fn run(capped: bool, shape: impl FnOnce(&mut Sim<'_>, u64)) -> Figures {
            let (s, m) = (SharedDeviceState::default(), BusyMap::default());
            let b = Bucket::new(&s, &m);
            let mut sim = Sim { meter: Meter::default(), gpu: Gpu::default(), b: &b, capped: false, from: (0, 0, 0) };
            for k in 0..200 {
                sim.launch(1, 0, T0 + k * 50 * US, 10 * US);
            }
            let t0 = T0 + 200 * 50 * US;
            sim.mark();
            sim.capped = capped;
            shape(&mut sim, t0);
            let (c0, n0, e0) = sim.from;
            sim.sync(sim.gpu.all_done() + MS);
            assert_eq!(sim.meter.pending_launches(), 0);
            Figures { charged: sim.meter.charged_total_ns - c0, busy: sim.gpu.union_from(n0), events: sim.gpu.next - e0 }
        }

        /// A pseudo-random draw below `n` (xorshift from `seed`).
        fn rng(mut seed: u64) -> impl FnMut(u64) -> u64 {
            move |n| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed % n
            }
        }

        /// Charged within `lo..=hi` of the GPU time (`PACED_PRINT=1`: print the figures).
        fn check(name: &str, f: &Figures, lo: f64, hi: f64) {
            if std::env::var_os("PACED_PRINT").is_some() {
                eprintln!("{name}: charged {:.3} of the GPU time, {} events", f.ratio(), f.events);
            }
            assert!((lo..=hi).contains(&f.ratio()), "{name}: charged {:.3} of the GPU time ({} events)", f.ratio(), f.events);
        }

        /// 300 us kernels and 10 us ones alternating, each submitted after the one before ended.
        fn alternating(capped: bool, long_kind: impl Fn(u64) -> u64) -> Figures {
            run(capped, |sim, t0| {
                for c in 0..300 {
                    let t = t0 + c * 650 * US;
                    sim.launch(1, long_kind(c), t, 300 * US);
                    sim.launch(1, 8, t + 400 * US, 10 * US);
                }
            })
        }

        #[test]
        fn paced_long_kernels_of_an_unknown_kind_are_charged_their_length() {
            for capped in [false, true] {
                // cuMemcpyAsync / cuMemsetAsync / cuLaunch: kind 0
                check(&format!("kind 0, capped {capped}"), &alternating(capped, |_| 0), 0.9, 1.2);
            }
        }

        #[test]
        fn paced_long_kernels_of_fresh_kinds_are_charged_their_length() {
            for capped in [false, true] {
                // a GEMM whose grid follows the input's shape
                check(&format!("fresh kinds, capped {capped}"), &alternating(capped, |c| 1000 + c), 0.9, 1.2);
            }
        }

        #[test]
        fn paced_short_kernels_after_a_long_one_are_not_charged_its_length() {
            // Every 3.55 ms: a 300 us kernel, then ten 10 us kernels 150 us apart (kind 0).
            for capped in [false, true] {
                let f = run(capped, |sim, t0| {
                    for c in 0..56 {
                        let t = t0 + c * 3550 * US;
                        sim.launch(1, 0, t, 300 * US);
                        for k in 1..=10 {
                            sim.launch(1, 0, t + k * 150 * US, 10 * US);
                        }
                    }
                });
                check(&format!("capped {capped}"), &f, 0.0, 1.2);
            }
        }

        /// Paced kernels under a cap, of kinds the meter has learned, short (10 us every 40 us) or
        /// long beside short (300 us, then 10 us), or of lengths that alternate within one kind:
        /// each charged its length within 5%, with a start and an end event about every
        /// millisecond, not one each (an end event per paced launch while held cost an H200
        /// 0.82-0.95 of the want of kernels of 20 us and less).
        #[test]
        fn capped_paced_kernels_of_learned_kinds_are_charged_their_length_with_few_events() {
            // (name, milliseconds, shape)
            type Shape = fn(&mut Sim<'_>, u64);
            let shapes: [(&str, f64, Shape); 3] = [
                ("10 us every 40 us", 40.0, |sim, t0| {
                    (0..1000).for_each(|c| {
                        sim.launch(1, 8, t0 + c * 40 * US, 10 * US);
                    })
                }),
                ("300 us then 10 us", 39.0, |sim, t0| {
                    (0..60).for_each(|c| {
                        sim.launch(1, 9, t0 + c * 650 * US, 300 * US);
                        sim.launch(1, 8, t0 + c * 650 * US + 400 * US, 10 * US);
                    })
                }),
                // Every third 60 us: its figure follows the sampled launches, a mean over seconds.
                // (Submitted at varying microseconds: the busy map's 10 us slots round edges to
                // the nearest, unbiased only over varying phases.)
                ("one kind, 10 or 60 us", 600.0, |sim, t0| {
                    (0..6000).for_each(|c| {
                        sim.launch(1, 8, t0 + c * 100 * US + c * 3_700 % (10 * US), if c % 3 == 0 { 60 * US } else { 10 * US });
                    })
                }),
            ];
            for (name, ms, shape) in shapes {
                let f = run(true, shape);
                check(name, &f, 0.95, 1.05);
                assert!(f.events as f64 <= 3.0 * ms + 10.0, "{name}: {} events in {ms} ms", f.events);
            }
        }

        /// One kind (same function and grid; its work varies: a GEMM's K, an attention's kv
        /// length) runs 100 us, then 250 us of host work later 10 us, every 300 us; and the
        /// mirror (10 us, then 480 us later 100 us, every 600 us). Sampled by time (the first
        /// launch a millisecond after the last event), the launch after the longer host gap was
        /// timed 5 times in 6: charged 0.742 and 1.265 of their time.
        #[test]
        fn a_kind_whose_length_follows_the_host_gap_before_it_is_sampled_evenly() {
            let f = run(true, |sim, t0| {
                for c in 0..1000 {
                    let t = t0 + c * 300 * US + c * 3_700 % (10 * US);
                    sim.launch(1, 8, t, 100 * US);
                    sim.launch(1, 8, t + 250 * US, 10 * US);
                }
            });
            check("100 us, then 10 us after 250 us", &f, 0.9, 1.1);
            let f = run(true, |sim, t0| {
                for c in 0..500 {
                    let t = t0 + c * 600 * US + c * 3_700 % (10 * US);
                    sim.launch(1, 8, t, 10 * US);
                    sim.launch(1, 8, t + 480 * US, 100 * US);
                }
            });
            check("10 us, then 100 us after 480 us", &f, 0.9, 1.1);
        }

        /// A step ends with a long kernel and a synchronize (a benchmark loop, `.item()` after the
        /// last kernel): 10 us, 10 us, 300 us (another kind), synchronize. The 300 us launch has
        /// no event; the synchronize charged it the stream's mean (0.240 of the GPU time).
        #[test]
        fn a_long_last_kernel_before_a_synchronize_is_charged_its_kinds_length() {
            let f = run(true, |sim, t0| {
                let mut t = t0;
                for _ in 0..300 {
                    sim.launch(1, 8, t, 10 * US);
                    sim.launch(1, 8, t + 100 * US, 10 * US);
                    sim.launch(1, 9, t + 200 * US, 300 * US);
                    t = sim.sync(t + 210 * US) + 100 * US;
                }
            });
            check("10, 10, 300 us, synchronize", &f, 0.9, 1.2);
        }

        /// A binding cap: 10 us kernels of a learned kind every 100 us, every tenth held 1 ms by
        /// the budget. The flush event recorded at the hold, 90 us after the paced launch before
        /// it ended, closed that launch: charged with the host's gap and taught to its kind as one
        /// launch's time (4.744 of the GPU time).
        #[test]
        fn a_hold_after_paced_launches_charges_them_their_kinds_length() {
            let f = run(true, |sim, t0| {
                let mut t = t0;
                for c in 0..2000 {
                    if c % 10 == 9 {
                        sim.hold(t);
                        t += MS;
                    }
                    sim.launch(1, 8, t, 10 * US);
                    t += 100 * US;
                }
            });
            check("10 us every 100 us, every tenth held 1 ms", &f, 0.9, 1.2);
        }

        /// A kind learned at 10 us (every 100 us) that once, or every 20 ms, takes 5 ms (the
        /// occasional big input). The launches after it queue behind it; the next timed one
        /// measured its wait behind it as its own time (from the end only thought for the launch
        /// before) and taught it to its kind: 2.912 and 1.232 of the GPU time. Timed from a start
        /// event, the figure stays the kind's, but the long launch was charged only that (0.17 of
        /// the GPU time every 20 ms); the start events of the timed launches behind it show the
        /// stream busy, and that is charged.
        #[test]
        fn a_launch_far_longer_than_its_kind_is_charged_and_does_not_teach_the_kind_its_wait() {
            let once = run(true, |sim, t0| {
                for c in 0..400 {
                    sim.launch(1, 8, t0 + c * 100 * US, if c == 100 { 5 * MS } else { 10 * US });
                }
            });
            check("10 us every 100 us, once 5 ms", &once, 0.85, 1.2);
            let periodic = run(true, |sim, t0| {
                for c in 0..20_000 {
                    sim.launch(1, 8, t0 + c * 100 * US + c * 3_700 % (10 * US), if c % 200 == 100 { 5 * MS } else { 10 * US });
                }
            });
            check("10 us every 100 us, 5 ms every 20 ms", &periodic, 0.85, 1.2);
        }

        /// Shapes that came out right before and must stay so: an eager step of six kinds with
        /// host gaps of 15-40 us; one kind of random length 10-200 us every 300 us; two streams
        /// taking turns; a long kernel on one stream with short ones beside it on another.
        #[test]
        fn eager_and_two_stream_shapes_are_charged_their_length() {
            let mut rnd = rng(0xdead_beef_1234_5678);
            let lens = [30u64, 5, 12, 80, 5, 20, 30, 5, 12, 80, 5, 20];
            let f = run(true, |sim, t0| {
                let mut t = t0;
                for _ in 0..500 {
                    for (i, &l) in lens.iter().enumerate() {
                        let end = sim.launch(1, 20 + i as u64 % 6, t, l * US);
                        t = end.max(t) + (15 + rnd(26)) * US;
                    }
                }
            });
            check("eager step", &f, 0.95, 1.1);
            let f = run(true, |sim, t0| {
                for c in 0..2000 {
                    sim.launch(1, 8, t0 + c * 300 * US + c * 3_700 % (10 * US), (10 + rnd(191)) * US);
                }
            });
            check("one kind of random length 10-200 us", &f, 0.95, 1.05);
            let f = run(true, |sim, t0| {
                for c in 0..2000 {
                    sim.launch(1 + c % 2, 8, t0 + c * 20 * US + c * 3_700 % (10 * US), 10 * US);
                }
            });
            check("two streams taking turns", &f, 0.95, 1.1);
            let f = run(true, |sim, t0| {
                for c in 0..300 {
                    let t = t0 + c * 700 * US;
                    sim.launch(1, 9, t, 300 * US);
                    for k in 0..5 {
                        sim.launch(2, 8, t + 50 * US + k * 100 * US, 10 * US);
                    }
                }
            });
            check("300 us on one stream, 10 us beside", &f, 0.95, 1.1);
        }

        #[test]
        fn a_launch_the_gpu_reached_late_is_not_charged_the_wait() {
            // The start latency learned at 3 us; then a launch whose stream first waits 1 ms (a
            // cuStreamWaitEvent on another context's work, or another tenant's time slice): its
            // start event completes 1 ms after submission, its 100 us kernel after that.
            run(false, |sim, t0| {
                let t = sim.sync(t0) + 10 * MS;
                let c0 = sim.meter.charged_total_ns;
                sim.gpu.done.insert(9001, t + MS);
                sim.gpu.done.insert(9002, t + MS + 100 * US);
                sim.meter.launched(1, Some(9001), Some(9002), t, &mut sim.gpu);
                sim.gpu.now = t + 2 * MS;
                sim.meter.poll(&mut sim.gpu, sim.b, t + 2 * MS);
                let charged = sim.meter.charged_total_ns - c0;
                assert!(charged <= 110 * US, "charged {charged} ns for a 100 us kernel");
            });
        }


        // Review, round 2 (fdb5fec): launch patterns against the paced launches closed at figures.


        /// `Sim::launch`, but a start event recorded for it is lost (`EventState::Lost`).
        fn launch_losing_start(sim: &mut Sim<'_>, key: u64, kind: u64, t: u64, dur: u64) -> u64 {
            let before = sim.gpu.next;
            let end = sim.launch(key, kind, t, dur);
            if sim.gpu.next - before == 2 {
                sim.gpu.lost.insert(before + 1);
            }
            end
        }

        /// A launch whose thread is preempted `g` between recording its start event (at `t`, the
        /// glue's `recorded_ns`) and submitting the launch (at `t + g`). Returns when it ends.
        fn launch_preempted(sim: &mut Sim<'_>, key: u64, kind: u64, t: u64, dur: u64, g: u64) -> u64 {
            sim.gpu.now = t;
            assert_eq!(sim.meter.gate(&mut sim.gpu, sim.b, None, key, t), Step::Go);
            sim.meter.capped = sim.capped;
            let se = sim.meter.start_event(key, t).wanted.then(|| sim.gpu.record(key, t));
            if let Some(se) = se {
                sim.gpu.recorded.insert(se, t);
            }
            let s = t + g;
            sim.gpu.now = s;
            let begin = sim.gpu.tail.get(&key).copied().unwrap_or(0).max(s + LAT);
            sim.gpu.tail.insert(key, begin + dur);
            sim.gpu.busy.push((begin, begin + dur));
            let ev = (se.is_some() || sim.meter.wants_end_event(key, kind, s)).then(|| sim.gpu.record(key, s));
            sim.meter.launched_kind(key, kind, se, ev, s, &mut sim.gpu);
            begin + dur
        }

        /// A kind learned at 10 us (50 launches 40 us apart a step) whose last launch of the step
        /// runs 5 ms (same function and grid: a data-dependent length), then the host works 5 ms
        /// before the next step: nothing queues behind the long launch, so no start event comes
        /// late; unless it is itself a sample (1 in 25), it is closed at 10 us.
        #[test]
        #[ignore = "KNOWN FAILURE: 0.787 of the GPU time (51be794: 0.658); a launch far past its kind's figure with nothing queued behind it is seen only once a sample lands on it; run with --ignored"]
        fn a_long_launch_of_a_short_kind_before_a_host_pause() {
            let f = run(true, |sim, t0| {
                for s in 0..400 {
                    let t = t0 + s * 10 * MS + s * 3_700 % (10 * US);
                    for k in 0..50 {
                        sim.launch(1, 8, t + k * 40 * US, if k == 49 { 5 * MS } else { 10 * US });
                    }
                }
            });
            check("50 x 10 us every 40 us, the last 5 ms, host pause, every 10 ms", &f, 0.9, 1.2);
        }

        /// The same kind, the step's last launch 3 ms, then a synchronize (`.item()`): the
        /// synchronize closes it at its kind's figure (10 us), but it returned 3 ms after it was
        /// entered: that wait is charged too (08c2414: 0.457, without the entry time).
        #[test]
        fn a_long_launch_of_a_short_kind_before_a_synchronize() {
            let f = run(true, |sim, t0| {
                let mut t = t0;
                for _ in 0..60 {
                    for k in 0..20 {
                        sim.launch(1, 8, t + k * 40 * US, if k == 19 { 3 * MS } else { 10 * US });
                    }
                    t = sim.sync(t + 19 * 40 * US + 10 * US) + 100 * US;
                }
            });
            check("20 x 10 us every 40 us, the last 3 ms, synchronize", &f, 0.9, 1.2);
        }

        /// The same kind, a 3 ms launch right before the budget holds the next launch 1 ms or
        /// 4 ms (`Meter::wait` closes it at 10 us), then 10 us launches every 100 us again.
        #[test]
        fn a_long_launch_of_a_short_kind_before_a_hold() {
            for held in [MS, 4 * MS] {
                let f = run(true, |sim, t0| {
                    let mut t = t0;
                    for c in 0..3000 {
                        if c % 30 == 29 {
                            sim.hold(t);
                            t += held;
                        }
                        sim.launch(1, 8, t, if c % 30 == 28 { 3 * MS } else { 10 * US });
                        t += 100 * US;
                    }
                });
                let name = format!("10 us every 100 us, every 30th 3 ms then held {} ms", held / MS);
                check(&name, &f, 0.9, 1.2);
            }
        }

        /// 10 us launches of a learned kind every 50 us whose stream now and then waits on no
        /// GPU work of ours (`launch_after`): a host function (cuLaunchHostFunc), a
        /// cuStreamWaitValue on a flag, or another tenant's time slice before NVML shows it
        /// (`contended` not yet set). A sample reached late charges the wait from its
        /// submission, and times every launch 200 ms; and a launch latency that rises (150 us
        /// from 3 us: a loaded driver) is charged until the start latency learns it.
        #[test]
        #[ignore = "KNOWN FAILURE, as at 51be794: 2.043 (2.241), an event per launch: a wait on no GPU work of ours is charged as busy; run with --ignored"]
        fn waits_on_no_gpu_work_of_ours_before_launches() {
            // (name, launches, every, wait)
            for (name, n, every, wait) in [
                ("500 us wait every 2 ms", 8000u64, 40u64, 500 * US),
                ("150 us delay every 5 ms", 8000, 100, 150 * US),
                ("2 ms slice every 50 ms", 8000, 1000, 2 * MS),
            ] {
                let f = run(true, |sim, t0| {
                    for c in 0..n {
                        let t = t0 + c * 50 * US + c * 3_700 % (10 * US);
                        sim.launch_after(1, 8, t, 10 * US, if c % every == every / 2 { t + wait } else { 0 });
                    }
                });
                check(name, &f, 0.9, 1.2);
            }
        }

        /// The GPU's launch latency rises from 3 us to 150 us (a loaded driver, MPS) under 10 us
        /// launches every 300 us: charged until the start latency (up 1/16 a sample) learns it.
        #[test]
        #[ignore = "KNOWN FAILURE, as at 51be794: 1.374 (3.716): charged until the start latency learns the rise; run with --ignored"]
        fn the_launch_latency_rises() {
            let f = run(true, |sim, t0| {
                for c in 0..1300 {
                    let t = t0 + c * 300 * US + c * 3_700 % (10 * US);
                    sim.launch_after(1, 8, t, 10 * US, t + 150 * US);
                }
            });
            check("launch latency 3 -> 150 us, 10 us every 300 us", &f, 0.9, 1.2);
        }

        /// A GEMM kind learned tight at 1 ms, paced among 10 us launches 40 us apart (so it is
        /// seldom a sample); 50 us after it the budget holds the next launch 100 us
        /// (`Meter::wait` closes the GEMM at its figure) and the next gate look's poll ends that
        /// closed batch at `now`, 150 us into the GEMM (its clip is `min(now, start + figure)`);
        /// then a 10 us launch and a host pause to the next 8 ms step.
        #[test]
        fn a_short_hold_right_after_a_long_launch_clips_it_at_the_next_poll() {
            let f = run(true, |sim, t0| {
                for c in 0..20 {
                    let t = t0 + c * 3 * MS;
                    sim.launch(1, 9, t, MS);
                    sim.launch(1, 8, t + 1100 * US, 10 * US);
                }
                let t1 = t0 + 60 * MS;
                sim.mark();
                for c in 0..50 {
                    let t = t1 + c * 8 * MS + c * 3_700 % (10 * US);
                    for k in 0..40 {
                        sim.launch(1, 8, t + k * 40 * US, 10 * US);
                    }
                    let g = t + 1600 * US;
                    sim.launch(1, 9, g, MS);
                    sim.hold(g + 50 * US);
                    sim.launch(1, 8, g + 150 * US, 10 * US);
                }
            });
            check("40 x 10 us every 40 us, 1 ms GEMM, held 100 us 50 us after it, 10 us, pause", &f, 0.9, 1.2);
        }

        /// The clip in one launch: a paced 1 ms GEMM of a kind learned tight at 1 ms goes
        /// without an event; the budget holds the next launch 50 us later (`Meter::wait` closes
        /// the GEMM at its figure); the gate look 100 us after that polls, and the closed batch
        /// ends at that `now`: charged about 150 us of its 1 ms.
        #[test]
        fn wait_closes_a_running_launch_and_the_next_poll_clips_it() {
            run(true, |sim, t0| {
                for c in 0..20 {
                    let t = t0 + c * 3 * MS;
                    sim.launch(1, 9, t, MS);
                    sim.launch(1, 8, t + 1100 * US, 10 * US);
                }
                // Dense 10 us launches, so the launch gap is short and the GEMM seldom a sample;
                // the first GEMM that goes without an event is the one looked at.
                let mut t = t0 + 60 * MS;
                for _ in 0..100 {
                    for k in 0..40 {
                        sim.launch(1, 8, t + k * 40 * US, 10 * US);
                    }
                    let g = t + 1600 * US;
                    let before = sim.gpu.next;
                    sim.launch(1, 9, g, MS);
                    if sim.gpu.next == before {
                        sim.hold(g + 50 * US);
                        let c0 = sim.meter.charged_total_ns;
                        sim.gpu.now = g + 1200 * US;
                        sim.meter.poll(&mut sim.gpu, sim.b, g + 1200 * US);
                        let charged = sim.meter.charged_total_ns - c0;
                                                assert!(charged >= 900 * US, "a 1 ms GEMM charged {charged} ns");
                        return;
                    }
                    t = sim.gpu.all_done() + 5 * MS;
                }
                panic!("every GEMM had an event");
            });
        }

        /// Round 1's shape: a copy stream (kind 0: small copies, then a 1 ms one each step) and
        /// a compute stream that waits on the big copy (cuStreamWaitEvent) and launches 20 paced
        /// 10 us kernels of a learned kind: the copy stream's estimate says the copy ended long
        /// before, so they are closable, closed at 10 us each inside the copy's time.
        #[test]
        fn a_stream_waiting_on_another_streams_copy() {
            let f = run(true, |sim, t0| {
                for c in 0..50 {
                    sim.launch(1, 8, t0 + c * 40 * US, 10 * US);
                }
                for c in 0..80 {
                    let t = t0 + 2 * MS + c * 4 * MS;
                    for k in 0..5 {
                        sim.launch(2, 0, t + k * 50 * US, 10 * US);
                    }
                    let copied = sim.launch(2, 0, t + 300 * US, MS);
                    for k in 0..20 {
                        sim.launch_after(1, 8, t + 400 * US + k * 20 * US, 10 * US, if k == 0 { copied } else { 0 });
                    }
                }
            });
            check("compute stream waiting on a 1 ms copy, 20 paced 10 us kernels", &f, 0.9, 1.2);
        }

        /// A kind learned at 10 us (every 40 us) lengthens to 80 us (same grid, more work);
        /// every start event is lost (`EventState::Lost`: a sample then teaches no tight figure,
        /// and a looser interval above a tight figure says nothing).
        #[test]
        fn a_kind_that_lengthens_while_its_start_events_are_lost() {
            let f = run(true, |sim, t0| {
                for c in 0..500 {
                    sim.launch(1, 8, t0 + c * 40 * US, 10 * US);
                }
                let t1 = t0 + 500 * 40 * US;
                sim.mark();
                for c in 0..3000 {
                    launch_losing_start(sim, 1, 8, t1 + c * 130 * US + c * 3_700 % (10 * US), 80 * US);
                }
            });
            check("10 us kind lengthens to 80 us, start events lost", &f, 0.9, 1.2);
        }

        /// 10 us launches of a learned kind every 40 us; every 20th launch's thread is
        /// preempted 1 ms between its start event's record and its submission (a loaded host).
        #[test]
        fn preempted_between_start_event_and_launch() {
            let f = run(true, |sim, t0| {
                let mut t = t0;
                for c in 0..8000u64 {
                    let g = if c % 20 == 7 { MS } else { 0 };
                    launch_preempted(sim, 1, 8, t, 10 * US, g);
                    t += g + 40 * US + c * 3_700 % (5 * US);
                }
            });
            check("10 us every 40 us, every 20th preempted 1 ms after its start event", &f, 0.9, 1.2);
        }

        /// A step: a memset (kind 0, paced: an end event), a 10 us kernel of a learned kind 1 us
        /// later and a 300 us one (kind 9, learned) 1 us after that, then a synchronize: the
        /// last two have no event (within 100 us of the memset's) and are not all closable, so
        /// the synchronize charges them the stream's mean each, and the time it blocked
        /// (08c2414: 0.871).
        #[test]
        fn closable_and_loose_launches_before_a_synchronize() {
            let f = run(true, |sim, t0| {
                let mut t = t0;
                for _ in 0..300 {
                    sim.launch(1, 0, t, 5 * US);
                    sim.launch(1, 8, t + US, 10 * US);
                    sim.launch(1, 9, t + 2 * US, 300 * US);
                    t = sim.sync(t + 10 * US) + 100 * US;
                    sim.launch(1, 8, t, 10 * US);
                    sim.launch(1, 9, t + 100 * US, 300 * US);
                    t += 500 * US;
                }
            });
            check("memset, 10 us, 300 us, synchronize; 10 us, 300 us paced", &f, 0.9, 1.2);
        }

        /// One kind of random length 10-200 us every 300 us; a sibling process of the container
        /// launches 1 ms of every 3 (`siblings_active`): then the launches are not closable, get
        /// an end event each, and those after a closed one are loose intervals, which only bring
        /// the kind's tight figure down.
        #[test]
        fn loose_intervals_drag_a_varying_kinds_figure_down() {
            let mut rnd = rng(0x5eed_1234_abcd_0001);
            let f = run(true, |sim, t0| {
                for c in 0..2000 {
                    let t = t0 + c * 300 * US + c * 3_700 % (10 * US);
                    sim.meter.siblings_active = (t - t0) % (3 * MS) < MS;
                    sim.launch(1, 8, t, (10 + rnd(191)) * US);
                }
                sim.meter.siblings_active = false;
            });
            check("one kind of random 10-200 us every 300 us, siblings 1 ms in 3", &f, 0.9, 1.2);
        }

        /// Bursty host: each 1.5 ms, a burst of 30 memsets 1 us apart (queued: the stream's
        /// launch gap falls to a few us, and with it the sample rate), then after it drains 5
        /// paced launches of kind 8, 100 us apart, which lengthen from 20 us to 120 us at step
        /// 30 (a lengthening below the late-start threshold: only samples teach it).
        #[test]
        fn bursts_thin_the_samples_of_a_kind_that_lengthens() {
            let f = run(true, |sim, t0| {
                for s in 0..250u64 {
                    let t = t0 + s * 1500 * US + s * 3_700 % (10 * US);
                    for k in 0..30 {
                        sim.launch(1, 0, t + k * US, 5 * US);
                    }
                    for k in 0..5 {
                        sim.launch(1, 8, t + 500 * US + k * 150 * US, if s < 30 { 20 * US } else { 120 * US });
                    }
                }
            });
            check("bursts of 30 memsets, then 5 paced launches 20 -> 120 us", &f, 0.9, 1.2);
        }

        /// Fine expected: eight streams (threads), each a 10 us kernel of one kind every 400 us,
        /// staggered 50 us.
        #[test]
        fn eight_streams_paced() {
            let f = run(true, |sim, t0| {
                for c in 0..8000u64 {
                    sim.launch(1 + c % 8, 8, t0 + c * 50 * US + c * 3_700 % (10 * US), 10 * US);
                }
            });
            check("8 streams, 10 us every 400 us each, staggered", &f, 0.9, 1.2);
        }

        /// Round 1's shapes: a memset (kind 0) then a kernel of a learned kind that grows (20 to
        /// 220 us) or lengthens once (20 then 150 us), every 400 us.
        #[test]
        fn a_kernel_that_grows_behind_a_memset_each_step() {
            let f = run(true, |sim, t0| {
                for c in 0..1000 {
                    let t = t0 + c * 400 * US;
                    sim.launch(1, 0, t, 5 * US);
                    sim.launch(1, 8, t + 50 * US, (20 + c * 200 / 1000) * US);
                }
            });
            check("memset then a kernel growing 20 to 220 us, every 400 us", &f, 0.9, 1.2);
            let f = run(true, |sim, t0| {
                for c in 0..1000 {
                    let t = t0 + c * 400 * US;
                    sim.launch(1, 0, t, 5 * US);
                    sim.launch(1, 8, t + 50 * US, if c < 100 { 20 * US } else { 150 * US });
                }
            });
            check("memset then a kernel of 20 us, later 150 us, every 400 us", &f, 0.9, 1.2);
        }

        /// A steady paced shape of one learned kind: 10 us every 40 us for 400 ms. Events
        /// should be about 2 per ms (start and end of a sample), not one per launch.
        #[test]
        fn steady_paced_one_kind_events() {
            let f = run(true, |sim, t0| {
                for c in 0..10_000u64 {
                    sim.launch(1, 8, t0 + c * 40 * US + c * 3_700 % (5 * US), 10 * US);
                }
            });
            check("10 us every 40 us, 400 ms", &f, 0.9, 1.2);
            assert!(f.events <= 3 * 400 + 10, "{} events for 10000 launches", f.events);
        }


        // Review of 75f56e8: a synchronize that blocked is charged from its entry to its return,
        // less the driver's wake-up, where launches went without an event.

        /// `Sim::sync`, returning no earlier than `ret` (0: as the GPU allows): a thread
        /// preempted inside the synchronize. Returns when it returned.
        fn sync_until(sim: &mut Sim<'_>, t: u64, ret: u64) -> u64 {
            let now = (sim.gpu.all_done().max(t) + SYNC_LAT).max(ret);
            sim.gpu.now = now;
            sim.meter.synced(&mut sim.gpu, sim.b, t, now);
            now
        }

        /// A step of 20 x 10 us every 40 us whose last launch waits `wait` on a host function
        /// (cuLaunchHostFunc, TF's host callbacks) or another process's event, every `every`th
        /// step, then a synchronize: the GPU idles through the wait.
        #[test]
        #[ignore = "KNOWN FAILURE: 1 ms every step 5.727 (08c2414: 4.974), 200 us every 4th step 1.364 (1.295): a wait on no GPU work of ours is charged (late starts, and since 75f56e8 the synchronize's block); run with --ignored"]
        fn a_synchronize_after_a_launch_behind_a_host_function() {
            for (name, every, wait) in [("200 us every 4th step", 4, 200 * US), ("1 ms every step", 1, MS)] {
                let f = run(true, |sim, t0| {
                    let mut t = t0;
                    for s in 0..300 {
                        for k in 0..20 {
                            let a = t + k * 40 * US;
                            sim.launch_after(1, 8, a, 10 * US, if k == 19 && s % every == 0 { a + wait } else { 0 });
                        }
                        t = sim.sync(t + 19 * 40 * US + 10 * US) + 100 * US;
                    }
                });
                check(&format!("20 x 10 us, the last behind a host function {name}, synchronize"), &f, 0.9, 1.2);
            }
        }

        /// 20 x 10 us every 40 us, then a synchronize whose thread returns `late` after the GPU
        /// is done (preempted on a loaded host, a CPU quota's throttle) every `every`th step.
        #[test]
        #[ignore = "KNOWN FAILURE: 200 us late every step 1.164 (08c2414: 1.094), 1 ms late every 5th step 1.962 (1.119): a late return is charged as GPU time less the mean wake-up; run with --ignored"]
        fn a_synchronize_that_returns_late() {
            for (name, every, late) in [("200 us late every step", 1, 200 * US), ("1 ms late every 5th step", 5, MS)] {
                let f = run(true, |sim, t0| {
                    let mut t = t0;
                    for s in 0..300 {
                        for k in 0..20 {
                            sim.launch(1, 8, t + k * 40 * US, 10 * US);
                        }
                        let ret = if s % every == 0 { sim.gpu.all_done() + late } else { 0 };
                        t = sync_until(sim, t + 19 * 40 * US + 10 * US, ret) + 100 * US;
                    }
                });
                check(&format!("20 x 10 us, synchronize {name}"), &f, 0.9, 1.2);
            }
        }

        /// A kernel, then a synchronize 1 us after its submission (a loop of `.item()` after one
        /// op), every `every`; the GPU reaches it `lat` later than the model's latency (a loaded
        /// driver; learned by start events): the latency is not GPU time (75f56e8: 1.472 and
        /// 1.363 with 10 and 20 us more, charged from the synchronize's entry; 08c2414: 1.026, 1.030).
        #[test]
        fn a_kernel_then_a_synchronize_right_after_it() {
            for capped in [false, true] {
                for (dur, every, lat) in [(10 * US, 30 * US, 0), (20 * US, 40 * US, 0), (20 * US, 60 * US, 10 * US), (50 * US, 100 * US, 20 * US)] {
                    let f = run(capped, |sim, t0| {
                        for c in 0..5000 {
                            let t = t0 + c * every;
                            sim.launch_after(1, 8, t, dur, if lat > 0 { t + LAT + lat } else { 0 });
                            sim.sync(t + US);
                        }
                    });
                    let name = format!("{} us, synchronize, every {} us, latency +{} us, capped {capped}", dur / US, every / US, lat / US);
                    check(&name, &f, 0.9, 1.2);
                }
            }
        }

        /// Beside another tenant (`contended`): 40 x 50 us kernels submitted 5 us apart (the last
        /// few share no event), the last behind a 2 ms time slice of the other tenant, then a
        /// synchronize; 1 ms of host between steps (75f56e8: 2.002, the slice charged as the
        /// synchronize's block; 08c2414: 0.999).
        #[test]
        fn a_queued_steps_tail_behind_another_tenants_slice() {
            for capped in [false, true] {
                let f = run(capped, |sim, t0| {
                    sim.meter.contended = true;
                    let mut t = t0;
                    for _ in 0..200 {
                        let mut end = 0;
                        for k in 0..40 {
                            end = sim.launch_after(1, 8, t + k * 5 * US, 50 * US, if k == 39 { end + 2 * MS } else { 0 });
                        }
                        t = sim.sync(t + 200 * US) + MS;
                    }
                });
                check(&format!("40 x 50 us queued, the last behind a 2 ms slice, capped {capped}"), &f, 0.9, 1.2);
            }
        }

        /// Stream 1 (a thread): paced 10 us kernels every 40 us, no synchronize; stream 2 (another
        /// thread): every 2 ms a 100 us kernel (an end event each), behind a 500 us host function
        /// or not, then a stream synchronize: stream 1's launches without an event let the
        /// synchronize charge the wait stream 2 blocked on (75f56e8: 1.583; 08c2414: 1.100).
        #[test]
        fn a_stream_synchronize_beside_another_threads_paced_launches() {
            for wait in [0, 500 * US] {
                let f = run(true, |sim, t0| {
                    for c in 0..50 {
                        sim.launch(2, 9, t0 + c * 300 * US, 100 * US);
                    }
                    let t1 = t0 + 20 * MS;
                    let mut next = t1;
                    for c in 0..5000u64 {
                        let t = t1 + c * 40 * US;
                        if t >= next {
                            sim.launch_after(2, 9, t, 100 * US, if wait > 0 { t + wait } else { 0 });
                            sim.sync(t + 5 * US);
                            next = t + 2 * MS;
                        }
                        sim.launch(1, 8, t + 20 * US, 10 * US);
                    }
                });
                check(&format!("paced 10 us on one stream, 100 us behind a {} us host function + synchronize on another", wait / US), &f, 0.9, 1.2);
            }
        }

        /// A context synchronize over two streams: a 1 ms copy (kind 0, with its event) on
        /// stream 2, behind a 1 ms host function or not, and ten paced 10 us kernels on stream 1.
        #[test]
        fn a_context_synchronize_over_a_copy_and_paced_kernels() {
            for capped in [false, true] {
                for wait in [0, MS] {
                    let f = run(capped, |sim, t0| {
                        let mut t = t0;
                        for _ in 0..300 {
                            sim.launch_after(2, 0, t, MS, if wait > 0 { t + wait } else { 0 });
                            for k in 0..10 {
                                sim.launch(1, 8, t + k * 40 * US, 10 * US);
                            }
                            t = sim.sync(t + 400 * US) + 200 * US;
                        }
                    });
                    check(&format!("1 ms copy behind a {} us host function, 10 x 10 us, capped {capped}", wait / US), &f, 0.9, 1.2);
                }
            }
        }

        /// A 2 ms copy (kind 0) queued right behind five 10 us kernels (within 100 us of their
        /// event: none of its own), then a synchronize: the block shows the copy's length
        /// (08c2414: 0.030, charged the stream's mean).
        #[test]
        fn a_synchronize_on_a_long_copy_without_an_event() {
            for capped in [false, true] {
                let f = run(capped, |sim, t0| {
                    let mut t = t0;
                    for _ in 0..300 {
                        for k in 0..5 {
                            sim.launch(1, 8, t + k * 5 * US, 10 * US);
                        }
                        sim.launch(1, 0, t + 30 * US, 2 * MS);
                        t = sim.sync(t + 40 * US) + 300 * US;
                    }
                });
                check(&format!("2 ms copy behind 5 x 10 us, synchronize, capped {capped}"), &f, 0.9, 1.2);
            }
        }

        /// 10 x 10 us every 40 us, then 500 us of host work before a synchronize that returns at
        /// once (the change adds nothing: the figure is 08c2414's).
        #[test]
        #[ignore = "KNOWN FAILURE, as at 08c2414: 1.298; the first launch after a synchronize is loose, and the next one's event holds the host's gap; run with --ignored"]
        fn a_synchronize_after_host_work_returns_at_once() {
            let f = run(true, |sim, t0| {
                let mut t = t0;
                for _ in 0..500 {
                    for k in 0..10 {
                        sim.launch(1, 8, t + k * 40 * US, 10 * US);
                    }
                    t = sim.sync(t + 900 * US) + 100 * US;
                }
            });
            check("10 x 10 us, 500 us of host, synchronize", &f, 0.9, 1.2);
        }

        /// A decode loop beside another tenant (`contended`): a 100 us kernel, a synchronize
        /// (`.item()`), 50 us of host; every other kernel waits 0-2 ms for the other tenant's
        /// time slice (the change adds nothing: the figures are 08c2414's).
        #[test]
        #[ignore = "KNOWN FAILURE, as at 08c2414: 5.619 (bucket cost with the share: 2.248); the launches after a synchronize have no start event, so their interval holds the slice; run with --ignored"]
        fn a_decode_loop_beside_another_tenant() {
            let mut rnd = rng(0x5eed_0000_0000_0075);
            let f = run(true, |sim, t0| {
                let mut t = t0;
                for _ in 0..200 {
                    sim.launch(1, 8, t, 100 * US);
                    t = sim.sync(t + 5 * US) + 50 * US;
                }
                sim.mark();
                sim.meter.contended = true;
                for c in 0..2000 {
                    sim.launch_after(1, 8, t, 100 * US, if c % 2 == 0 { t + rnd(2000) * US } else { 0 });
                    t = sim.sync(t + 5 * US) + 50 * US;
                }
            });
            check("100 us, synchronize, every other behind a 0-2 ms slice", &f, 0.9, 1.2);
        }

        /// The 3 ms shape (`a_long_launch_of_a_short_kind_before_a_synchronize`), its first
        /// synchronize that teaches the wake-up returning 10 ms late: taken as a wake-up, that
        /// sample hid the block for a while (0.877; 08c2414: 0.454); over `SYNC_WAKE_MAX_NS`, it
        /// teaches nothing.
        #[test]
        fn the_first_wake_up_sample_returns_late() {
            let mut first = true;
            let f = run(true, |sim, t0| {
                let mut t = t0;
                for _ in 0..60 {
                    for k in 0..20 {
                        sim.launch(1, 8, t + k * 40 * US, if k == 19 { 3 * MS } else { 10 * US });
                    }
                    let evented = sim.meter.streams.iter().all(|s| s.unevented == 0);
                    let ret = if first && evented { first = false; sim.gpu.all_done() + 10 * MS } else { 0 };
                    t = sync_until(sim, t + 19 * 40 * US + 10 * US, ret) + 100 * US;
                }
            });
            check("20 x 10 us, the last 3 ms, synchronize; the first evented one 10 ms late", &f, 0.9, 1.2);
        }

        /// A synchronize that blocks about 3 s, past the busy map's horizon (1.9 s): uncapped,
        /// 1000 x 3 ms kernels queued 2 us apart (a JAX loop dispatching ahead, then
        /// `block_until_ready`); or one 3 s kernel (its event) and a 10 us one behind it
        /// (none), capped. The union cannot tell what is older than the horizon: charged again
        /// (75f56e8: 1.354 and 1.355; 08c2414: 1.000).
        #[test]
        fn a_synchronize_that_blocks_past_the_busy_maps_horizon() {
            let f = run(false, |sim, t0| {
                for c in 0..1000 {
                    sim.launch(1, 9, t0 + c * 2 * US, 3 * MS);
                }
                sim.sync(t0 + 3 * MS);
            });
            check("1000 x 3 ms queued, one synchronize, uncapped", &f, 0.9, 1.2);
            let f = run(true, |sim, t0| {
                sim.launch(1, 50, t0, 3_000 * MS);
                sim.launch(1, 8, t0 + 5 * US, 10 * US);
                sim.sync(t0 + 10 * US);
            });
            check("3 s kernel, 10 us behind it, synchronize, capped", &f, 0.9, 1.2);
        }
    }
}
