//! Calibrating the charge to what NVML counts (the cap is NVML's utilization, docs/design.md).
//!
//! Timing events measure when kernels ran; NVML counts more. On an H100 under PyTorch training
//! (`bench/py/gap_probe.py`, cap 99, same 3-s window): ResNet-50 NVML 58.0, CUPTI's union of
//! every kernel/memset/copy 49.8, our events 46.9; GPT-2 47.6 / 43.0 / 39.3. At cap 50 the gap
//! grew to NVML 61.8 for our 36.7. No host-side measure equals NVML's, and how far it is off
//! depends on the program (1 ms kernels agree within 0.5 point; tens of thousands of short
//! kernels a second do not). So while the container is alone on the GPU, where NVML's device
//! utilization is the container's own, each measured nanosecond is charged `scale` ns: NVML's
//! busy time per measured ns over the last second, blended into the scale so far.
//!
//! The scale lives in the region (`SharedDeviceState::charge_scale_milli`), one per container
//! and device; whichever process of the container first finds a second passed updates it.

/// Scale when none was learned: charge what the events measured.
pub const UNIT_SCALE_MILLI: u64 = 1000;
/// Bounds of the scale: NVML has been seen counting up to 1.7x our measure (GPT-2, cap 50), and
/// a little less than it for sparse tiny kernels.
pub const MIN_SCALE_MILLI: u64 = 700;
pub const MAX_SCALE_MILLI: u64 = 3000;
/// Length of one window of NVML readings (one step per window).
pub const CALIBRATE_EVERY_NS: u64 = 1_000_000_000;
/// Below this much measured utilization (x100) a window says nothing about the ratio.
pub const MIN_OWN_CENTI: u64 = 200;
/// Weight (x1000) of a new window's ratio against the scale so far: most of it when the ratio
/// moved far (a new program phase, a new cap), less when it is within NVML's noise (1-s readings
/// of a training job swing by +-4 points).
pub const BETA_FAR_MILLI: u64 = 800;
pub const BETA_NEAR_MILLI: u64 = 400;
/// "Far": the window's ratio differs from the scale by more than this (x1000, relative).
pub const FAR_MILLI: u64 = 150;

/// What one step sees, over the last `CALIBRATE_EVERY_NS`.
#[derive(Clone, Copy, Debug)]
pub struct Window {
    /// Mean NVML device utilization, percent x 100.
    pub nvml_centi: u64,
    /// The container's own utilization as its events measured it (unscaled), percent x 100.
    pub own_centi: u64,
    /// The cap in force, percent.
    pub cap: u32,
    /// The container is the only one with compute processes on the device (NVML's list).
    pub alone: bool,
}

/// The next scale: NVML's busy time per measured ns over the window, blended into the scale so
/// far. Only while alone (with other tenants NVML's figure is not ours) and under a cap. The
/// ratio is the program's, whether or not the cap binds, so the scale is right before it does.
pub fn next_scale(scale_milli: u64, w: Window) -> u64 {
    let scale = effective(scale_milli);
    if !w.alone || w.cap == 0 || w.cap >= 100 || w.own_centi < MIN_OWN_CENTI {
        return scale;
    }
    let ratio = (w.nvml_centi.saturating_mul(1000) / w.own_centi).clamp(MIN_SCALE_MILLI, MAX_SCALE_MILLI);
    let beta = if ratio.abs_diff(scale) * 1000 > scale * FAR_MILLI { BETA_FAR_MILLI } else { BETA_NEAR_MILLI };
    ((scale * (1000 - beta) + ratio * beta) / 1000).clamp(MIN_SCALE_MILLI, MAX_SCALE_MILLI)
}

/// A stored scale as used: 0 (a fresh region) is the unit scale.
pub fn effective(stored_milli: u64) -> u64 {
    if stored_milli == 0 {
        UNIT_SCALE_MILLI
    } else {
        stored_milli.clamp(MIN_SCALE_MILLI, MAX_SCALE_MILLI)
    }
}

/// One NVML reading set beside what the container measured over the same time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// NVML's utilization over the span, percent.
    pub pct: u32,
    pub span_ns: u64,
    /// The container's measured busy time within the span.
    pub own_ns: u64,
}

/// One process's running sums of NVML readings for the current window, each beside the busy time
/// the container measured over the same span (`Feed` places them).
#[derive(Clone, Copy, Debug, Default)]
pub struct NvmlMean {
    cap: u32,
    /// Readings before this are left out: NVML's own sample period still covers what came
    /// before a new cap, or before the container was alone.
    settle_until_ns: u64,
    settled: bool,
    /// Sums over the window: NVML percent x span ns, measured busy ns, span ns.
    nvml_pct_ns: u128,
    own_ns: u64,
    span_ns: u64,
}

impl NvmlMean {
    /// Add a span taken under `cap`, seen at `now` (monotonic). Once the spans add up to
    /// `CALIBRATE_EVERY_NS`, returns NVML's mean and the measured utilization over them (percent
    /// x 100) and starts the next window. A changed cap (or a first span) starts anew after
    /// NVML's sample period has passed.
    pub fn add(&mut self, s: Span, cap: u32, now: u64) -> Option<(u64, u64)> {
        if cap != self.cap || !self.settled {
            *self = NvmlMean { cap, settled: true, settle_until_ns: now + CALIBRATE_EVERY_NS, ..NvmlMean::default() };
        }
        if now < self.settle_until_ns || s.span_ns == 0 {
            return None;
        }
        self.nvml_pct_ns += s.pct.min(100) as u128 * s.span_ns as u128;
        self.own_ns = self.own_ns.saturating_add(s.own_ns.min(s.span_ns));
        self.span_ns = self.span_ns.saturating_add(s.span_ns);
        if self.span_ns < CALIBRATE_EVERY_NS {
            return None;
        }
        let nvml = (self.nvml_pct_ns * 100 / self.span_ns as u128) as u64;
        let own = (self.own_ns as u128 * 10_000 / self.span_ns as u128).min(10_000) as u64;
        (self.nvml_pct_ns, self.own_ns, self.span_ns) = (0, 0, 0);
        Some((nvml, own))
    }

    /// Settling on `cap` at `now`: a new cap, no span yet, or within the settle. The samples
    /// are fetched every tick then (`policy::monitor::samples_due` otherwise), so those covering
    /// the time before are fetched, and left out, during the settle as they always were; fetched
    /// only after it, they would count (a window after a run-time change 25 -> 50 read NVML 54%
    /// for 34.5% measured, simulated).
    pub fn settling(&self, cap: u32, now: u64) -> bool {
        cap != self.cap || !self.settled || now < self.settle_until_ns
    }

    /// Readings are being collected (nothing reset it since).
    pub fn is_running(&self) -> bool {
        self.settled
    }

    /// Forget the readings so far (the gate went off, or another tenant appeared).
    pub fn reset(&mut self) {
        *self = NvmlMean::default();
    }
}

/// The container's measured busy time (cumulative) at the last few monitor ticks, by wall clock:
/// what it was when an NVML sample was taken, by interpolation.
#[derive(Clone, Copy, Debug, Default)]
pub struct BusyHistory {
    /// (at_us, busy_ns), oldest first, the newest `len` of `HISTORY` kept.
    pts: [(u64, u64); HISTORY],
    len: usize,
}

/// Ticks of history kept (3.2 s at the monitor's 200 ms): NVML's samples arrive well within.
const HISTORY: usize = 16;

impl BusyHistory {
    pub fn push(&mut self, at_us: u64, busy_ns: u64) {
        if self.len > 0 && at_us <= self.pts[self.len - 1].0 {
            return; // not newer: keep what is ordered (`Feed::tick` starts over on a clock step)
        }
        if self.len == HISTORY {
            self.pts.copy_within(1.., 0);
            self.len -= 1;
        }
        self.pts[self.len] = (at_us, busy_ns);
        self.len += 1;
    }

    /// Busy time at `at_us`, interpolated between the ticks around it; `None` outside them.
    pub fn at(&self, at_us: u64) -> Option<u64> {
        let pts = &self.pts[..self.len];
        let i = pts.iter().position(|&(t, _)| t >= at_us)?;
        let (t1, b1) = pts[i];
        if t1 == at_us {
            return Some(b1);
        }
        let (t0, b0) = *pts.get(i.checked_sub(1)?)?;
        Some(b0 + ((b1.saturating_sub(b0)) as u128 * (at_us - t0) as u128 / (t1 - t0) as u128) as u64)
    }

    /// The newest tick's time.
    pub fn newest_us(&self) -> Option<u64> {
        self.len.checked_sub(1).map(|i| self.pts[i].0)
    }
}

/// The wall clock moved against the monotonic clock by more than this between two ticks: it was
/// stepped (NTP), and so were NVML's timestamps.
pub const CLOCK_STEP_NS: u64 = 5_000_000;
/// Readings closer than this say nothing of NVML's sample period; a reading counts for at most
/// the shortest spacing seen at or above it (an idle GPU may leave gaps in NVML's samples: the
/// first sample after one must not stand for the whole gap), and never more than
/// `MAX_SPAN_NS` (NVML's longest sample period).
const MIN_PERIOD_US: u64 = 20_000;
pub const MAX_SPAN_NS: u64 = 1_000_000_000;
/// NVML's samples placed nothing for this long while they were asked for: use the one reading
/// per tick instead (a driver whose sample timestamps are on another clock never matches ours).
pub const SAMPLES_SILENT_NS: u64 = 3_000_000_000;

/// One process's calibration input for one device: NVML's samples (or one reading per tick),
/// each set beside the busy time measured over the period it covers. NVML's samples arrive a
/// few hundred ms after their period; compared with the busy time of the moments before their
/// arrival instead, a step of the scale showed up twice (once in the samples still from before
/// it), and the scale swung.
#[derive(Clone, Copy, Debug, Default)]
pub struct Feed {
    pub mean: NvmlMean,
    history: BusyHistory,
    /// Newest reading taken in (wall clock, us; 0: none yet).
    seen_us: u64,
    /// The previous reading placed, and the shortest spacing of readings seen (0: none yet).
    last_at_us: Option<u64>,
    period_us: u64,
    /// Wall clock minus monotonic clock at the last tick (ns).
    offset_ns: Option<i128>,
    /// When a sample was last placed (or the feed started), monotonic.
    placed_ns: u64,
    /// This tick's readings came from `nvmlDeviceGetUtilizationRates`, not NVML's samples.
    pub on_readings: bool,
}

impl Feed {
    /// Record this tick's measured busy time (`now_us` wall clock, `now_ns` monotonic); returns
    /// the timestamp after which NVML's samples are new (now, the first time: samples from before
    /// say nothing of this cap).
    pub fn tick(&mut self, now_us: u64, now_ns: u64, busy_ns: u64) -> u64 {
        let offset = now_us as i128 * 1000 - now_ns as i128;
        if self.offset_ns.is_some_and(|o| o.abs_diff(offset) > CLOCK_STEP_NS as u128) {
            // The wall clock stepped: the history, the newest sample seen and the spacing are on
            // the old one (a step back would hold every new sample back until the clock passed
            // them; a step forward would count one reading for the whole step).
            *self = Feed { mean: self.mean, ..Feed::default() };
        }
        self.offset_ns = Some(offset);
        if self.placed_ns == 0 {
            self.placed_ns = now_ns;
        }
        self.history.push(now_us, busy_ns);
        if self.seen_us == 0 {
            self.seen_us = now_us;
        }
        self.seen_us
    }

    /// Add NVML's samples taken since `tick`'s timestamp. This tick's reading `snapshot` stands
    /// for the period just ended instead when NVML gives no samples (`None`) or its samples placed
    /// nothing for `SAMPLES_SILENT_NS`. Samples newer than the last tick wait for the next.
    /// Returns the last window this closed, as `NvmlMean::add` (after a stall of seconds, the
    /// earlier of two closing at once is not stepped on: a step a second is all the scale takes).
    pub fn add(&mut self, samples: Option<Vec<(u64, u32)>>, snapshot: Option<u32>, cap: u32, now: u64) -> Option<(u64, u64)> {
        let silent = now.saturating_sub(self.placed_ns) >= SAMPLES_SILENT_NS;
        let readings: Vec<(u64, u32)> = match samples {
            Some(s) if !(s.is_empty() && silent) => {
                self.on_readings = false;
                s
            }
            _ => {
                self.on_readings = true;
                self.history.newest_us().zip(snapshot).into_iter().collect()
            }
        };
        let mut closed = None;
        for (at_us, pct) in readings {
            if at_us <= self.seen_us {
                continue; // taken in already, or from before the first tick
            }
            let Some(busy_ns) = self.history.at(at_us) else {
                if self.history.newest_us().is_some_and(|n| at_us > n) {
                    break; // after the last tick: the next tick places it
                }
                self.seen_us = at_us;
                continue; // before the history
            };
            self.seen_us = at_us;
            if !self.on_readings {
                self.placed_ns = now;
            }
            let Some(prev) = self.last_at_us.replace(at_us) else { continue };
            let spacing = at_us - prev;
            if spacing >= MIN_PERIOD_US && (self.period_us == 0 || spacing < self.period_us) {
                self.period_us = spacing;
            }
            let span_us = match self.period_us {
                0 => spacing,
                p => spacing.min(p),
            }
            .min(MAX_SPAN_NS / 1000);
            let Some(from_ns) = self.history.at(at_us - span_us) else { continue };
            let span = Span { pct, span_ns: span_us * 1000, own_ns: busy_ns.saturating_sub(from_ns) };
            closed = self.mean.add(span, cap, now).or(closed);
        }
        closed
    }

    /// Forget everything (calibration paused).
    pub fn reset(&mut self) {
        *self = Feed::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_mean_settles_on_a_first_span_and_on_each_new_cap() {
        const S: u64 = 1_000_000_000;
        let span = Span { pct: 50, span_ns: S / 5, own_ns: S / 10 };
        let mut m = NvmlMean::default();
        assert!(m.settling(25, S), "no span yet");
        m.add(span, 25, S);
        assert!(m.settling(25, S + S / 2), "within the settle");
        assert!(!m.settling(25, 2 * S), "settled");
        assert!(m.settling(50, 2 * S), "a new cap");
        m.add(span, 50, 3 * S);
        assert!(m.settling(50, 3 * S + S / 2) && !m.settling(50, 4 * S));
        m.reset();
        assert!(m.settling(50, 5 * S), "reset");
    }

    fn w(nvml: f64, own: f64, cap: u32) -> Window {
        Window { nvml_centi: (nvml * 100.0) as u64, own_centi: (own * 100.0) as u64, cap, alone: true }
    }

    /// A plant like the H100's: NVML reports `gain` x the measured busy time, and the budget
    /// holds measured time to cap / scale.
    fn converge(gain: f64, cap: u32, steps: usize) -> Vec<f64> {
        let mut scale = UNIT_SCALE_MILLI;
        let mut seen = Vec::new();
        for _ in 0..steps {
            let measured = cap as f64 * 1000.0 / scale as f64;
            let nvml = (measured * gain).min(100.0);
            seen.push(nvml);
            scale = next_scale(scale, w(nvml, measured, cap));
        }
        seen
    }

    #[test]
    fn pytorch_training_gaps_converge_to_the_cap_within_three_steps() {
        // GPT-2 at cap 50 on the H100: NVML 61.8 for 36.7 measured (gain 1.68); ResNet-50 1.24.
        for (gain, cap) in [(1.68, 50), (1.24, 25), (1.24, 50), (1.10, 25), (0.95, 50)] {
            let seen = converge(gain, cap, 6);
            assert!((seen[3] - cap as f64).abs() < 2.0, "gain {gain} cap {cap}: {seen:?}");
            assert!((seen[5] - cap as f64).abs() <= 1.0, "gain {gain} cap {cap}: {seen:?}");
        }
    }

    #[test]
    fn nothing_changes_with_another_tenant_without_a_cap_or_without_work() {
        let mut x = w(80.0, 40.0, 50);
        x.alone = false;
        assert_eq!(next_scale(1200, x), 1200);
        assert_eq!(next_scale(1200, w(80.0, 40.0, 100)), 1200);
        assert_eq!(next_scale(1200, w(1.0, 1.0, 50)), 1200, "too little measured to tell");
        assert_eq!(next_scale(0, w(50.0, 50.0, 50)), UNIT_SCALE_MILLI);
    }

    #[test]
    fn a_program_below_its_cap_teaches_its_ratio_before_the_cap_binds() {
        // u0 = 30 measured, NVML 39 under cap 50: the ratio is learned all the same.
        let mut scale = UNIT_SCALE_MILLI;
        for _ in 0..6 {
            scale = next_scale(scale, w(39.0, 30.0, 50));
        }
        assert!((1280..=1300).contains(&scale), "{scale}");
    }

    #[test]
    fn a_noisy_nvml_keeps_the_mean_at_the_cap() {
        // NVML readings off by up to +-4 points at random around the plant's true value.
        let (gain, cap) = (1.3f64, 25u32);
        let mut scale = UNIT_SCALE_MILLI;
        let mut rng = 12345u64;
        let mut tail = Vec::new();
        for i in 0..200 {
            rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let noise = ((rng >> 33) % 801) as f64 / 100.0 - 4.0;
            let measured = cap as f64 * 1000.0 / scale as f64;
            let truth = (measured * gain).min(100.0);
            if i >= 20 {
                tail.push(truth);
            }
            scale = next_scale(scale, w(truth + noise, measured, cap));
        }
        let mean = tail.iter().sum::<f64>() / tail.len() as f64;
        let worst = tail.iter().map(|t| (t - cap as f64).abs()).fold(0.0, f64::max);
        assert!((mean - cap as f64).abs() < 1.0, "mean {mean}");
        assert!(worst < 4.0, "worst {worst}");
    }

    const T0_US: u64 = 1_700_000_000_000_000;
    const MS: u64 = 1_000_000;
    /// A span of `ms` at `pct` with `own_ms` measured in it.
    fn sp(pct: u32, ms: u64, own_ms: u64) -> Span {
        Span { pct, span_ns: ms * MS, own_ns: own_ms * MS }
    }

    #[test]
    fn the_mean_closes_a_window_after_a_second_of_spans() {
        let s = CALIBRATE_EVERY_NS;
        let mut m = NvmlMean::default();
        assert_eq!(m.add(sp(90, 200, 0), 25, 0), None, "the first second is NVML's before the cap");
        assert_eq!(m.add(sp(40, 500, 100), 25, s), None);
        assert_eq!(m.add(sp(60, 500, 300), 25, s + s / 2), Some((5000, 4000)));
        assert_eq!(m.add(sp(30, 1000, 0), 25, 3 * s), Some((3000, 0)), "windows follow on");
        assert_eq!(m.add(sp(30, 0, 0), 25, 3 * s), None, "an empty span adds nothing");
        assert_eq!(m.add(sp(30, 500, 900), 25, 4 * s), None);
        assert_eq!(m.add(sp(30, 500, 0), 25, 4 * s), Some((3000, 5000)), "busy beyond a span counts as the span");
        assert_eq!(m.add(sp(50, 1000, 500), 50, 5 * s), None, "the cap changed: NVML settles first");
        m.reset();
        assert!(!m.is_running());
    }

    #[test]
    fn busy_time_is_interpolated_between_ticks() {
        let mut h = BusyHistory::default();
        assert_eq!(h.at(T0_US), None);
        h.push(T0_US, 0);
        h.push(T0_US + 200_000, 100 * MS);
        h.push(T0_US + 100_000, 5 * MS); // not newer: ignored
        assert_eq!(h.at(T0_US + 50_000), Some(25 * MS));
        assert_eq!(h.at(T0_US + 200_000), Some(100 * MS));
        assert_eq!(h.at(T0_US + 200_001), None, "after the newest tick");
        assert_eq!(h.at(T0_US - 1), None, "before the oldest");
        for k in 2..40 {
            h.push(T0_US + k * 200_000, k * 100 * MS);
        }
        assert_eq!(h.at(T0_US + 39 * 200_000 - 100_000), Some(3850 * MS));
        assert_eq!(h.at(T0_US), None, "only the last 16 ticks are kept");
        assert_eq!(h.newest_us(), Some(T0_US + 39 * 200_000));
    }

    /// Drive a feed for `ticks` monitor ticks 200 ms apart: `wall_us(ms)` the wall clock at
    /// monotonic `ms`, `busy_ms(ms)` the measured busy time by then, `samples(ms, since)` what
    /// NVML gives at that tick. Returns the windows closed after `from_ms`.
    fn drive(
        ticks: u64,
        from_ms: u64,
        wall_us: impl Fn(u64) -> u64,
        busy_ms: impl Fn(u64) -> u64,
        samples: impl Fn(u64, u64) -> Option<Vec<(u64, u32)>>,
        snapshot: Option<u32>,
    ) -> Vec<(u64, u64)> {
        let mut f = Feed::default();
        let mut windows = Vec::new();
        for tick in 0..=ticks {
            let ms = tick * 200;
            let now = 10 * CALIBRATE_EVERY_NS + ms * MS;
            let since = f.tick(wall_us(ms), now, busy_ms(ms) * MS);
            let got = samples(ms, since).map(|v| v.into_iter().filter(|&(at, _)| at > since).collect());
            if let (true, Some(w)) = (ms >= from_ms, f.add(got, snapshot, 25, now)) {
                windows.push(w);
            }
        }
        windows
    }

    fn near(windows: &[(u64, u64)], pts: u64) {
        assert!(windows.len() >= 3, "{windows:?}");
        for (nvml, own) in windows {
            assert!(nvml.abs_diff(*own) <= pts, "NVML {nvml} for {own} measured: {windows:?}");
        }
    }

    #[test]
    fn a_late_sample_is_set_beside_the_busy_time_of_its_own_period() {
        // The container ran 20% of the time until 2 s, then 40% (the scale stepped). NVML's
        // samples (200 ms periods) say exactly that but each arrives 300 ms after its period:
        // every closed window must read NVML / measured = 1, the step included.
        let busy = |ms: u64| if ms <= 2000 { ms / 5 } else { 400 + (ms - 2000) * 2 / 5 };
        let nvml = |ms: u64, _| Some((1..=ms / 200).map(|k| k * 200).filter(|&end| end + 300 <= ms).map(|end| (T0_US + end * 1000, if end <= 2000 { 20 } else { 40 })).collect());
        near(&drive(30, 0, |ms| T0_US + ms * 1000, busy, nvml, Some(99)), 10);
    }

    /// 30% busy, NVML's samples 30%, each 200 ms period's sample at its end.
    fn steady_busy(ms: u64) -> u64 {
        ms * 3 / 10
    }

    #[test]
    fn a_wall_clock_step_starts_the_feed_over() {
        // NTP steps the wall clock (and NVML's timestamps) an hour back, or a second forward, at
        // 4 s: windows keep closing, and none counts the step as time NVML measured.
        for step_us in [-3_600_000_000i64, 1_000_000] {
            let wall = move |ms: u64| (T0_US as i64 + ms as i64 * 1000 + if ms < 4000 { 0 } else { step_us }) as u64;
            let nvml = move |ms: u64, _| Some(vec![(wall(ms) - 1, 30)]);
            near(&drive(60, 6000, wall, steady_busy, nvml, None), 100);
        }
    }

    #[test]
    fn a_sample_after_a_gap_counts_for_its_own_period_only() {
        // A driver that keeps no samples while the GPU idles: from 2 s on nothing, busy again at
        // 60% from 3.2 s, the first sample at 3.4 s (60%, its own 200 ms). Set beside the whole
        // 1.4 s since the previous sample it read 42 for 24 measured.
        let busy = |ms: u64| if ms < 2000 { ms * 3 / 10 } else if ms < 3200 { 600 } else { 600 + (ms - 3200) * 6 / 10 };
        let pct = move |ms: u64| ((busy(ms) - busy(ms.saturating_sub(200))) / 2) as u32;
        let nvml = move |ms: u64, _| Some(if (2200..3400).contains(&ms) { vec![] } else { vec![(T0_US + ms * 1000, pct(ms))] });
        let windows = drive(40, 2000, |ms| T0_US + ms * 1000, busy, nvml, None);
        assert!(windows.len() >= 2, "{windows:?}");
        for (nvml, own) in &windows {
            assert!(nvml.abs_diff(*own) <= 300, "NVML {nvml} for {own} measured: {windows:?}");
        }
    }

    #[test]
    fn silent_samples_give_way_to_the_readings() {
        // NVML answers every sample query with nothing (its timestamps on another clock): after
        // SAMPLES_SILENT_NS the one reading per tick (30%) calibrates instead.
        let windows = drive(40, 0, |ms| T0_US + ms * 1000, steady_busy, |_, _| Some(vec![]), Some(30));
        near(&windows, 100);
    }

    #[test]
    fn without_samples_each_reading_stands_for_the_tick_just_ended() {
        assert_eq!(drive(12, 0, |ms| T0_US + ms * 1000, |ms| ms * 3 / 10, |_, _| None, Some(30)).last(), Some(&(3000, 3000)));
    }

    proptest! {
        #[test]
        fn the_scale_stays_in_bounds(stored in 0u64..10_000, nvml in 0u64..=10_000, own in 0u64..=10_000, cap in 0u32..=100, alone: bool) {
            let s = next_scale(stored, Window { nvml_centi: nvml, own_centi: own, cap, alone });
            prop_assert!((MIN_SCALE_MILLI..=MAX_SCALE_MILLI).contains(&s));
        }
    }
}
