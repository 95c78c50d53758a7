//! Mapping a context's timing-event times onto the host clock.
//!
//! The driver tells how far apart two events completed (`cuEventElapsedTime`, GPU time); the
//! meter needs host times (`clock::now_ns`) to compare with submissions and to share one busy map
//! with other processes. One event whose host time is known (the anchor) maps every other:
//! anchor + elapsed. But the GPU's timer and CLOCK_MONOTONIC run at slightly different rates
//! (NTP slews the host clock by up to 500 ppm), so an anchor taken once drifts: at 100 ppm a
//! process is 3 ms off after 30 s, far more than the 10-100 us a training kernel takes. An event
//! mapped too early ends before its launch was submitted and its interval vanishes (an H100 saw
//! GPT-2 and torch.compile training measured at a third, then a tenth, of what NVML counted, the
//! gap growing with the process's age).
//!
//! Every event also brackets its own host time: the GPU cannot complete it before the host began
//! recording it, nor after the host saw it complete. A mapped time outside that bracket moves the
//! anchor by the difference, so the mapping follows the drift. A slow GPU timer runs into the
//! lower edge, and events recorded on an idle stream (they complete microseconds after their
//! record) hold it tight. A fast one runs into the upper edge, which is as late as the events are
//! seen; so the idle-stream events also pull it back: when none of them over a window mapped
//! closer to its record than `IDLE_SLACK_NS`, the anchor moves back by the excess (the glue
//! records one such event a window when the meter's own spacing would leave none).

/// Re-anchor on a completed event this often (float milliseconds lose precision with distance).
pub const REANCHOR_NS: u64 = 1_000_000_000;
/// How long after its record an event on an idle stream completes, at most (an H100's launch
/// latency is a few microseconds).
pub const IDLE_SLACK_NS: u64 = 10_000;
/// Window over which the idle-stream events' closest mapping is taken.
pub const IDLE_WINDOW_NS: u64 = 20_000_000;
/// Most a window may pull the anchor back: what a timer 1000 ppm fast drifts in a window. An
/// "idle" stream's event can also wait (time-slicing with another context, the legacy stream
/// behind other streams, a cross-stream wait): that must not drag the clock back by the wait.
pub const MAX_PULL_NS: u64 = IDLE_WINDOW_NS / 1000;

/// The host time of one context's anchor event, and what the idle-stream events of the current
/// window showed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventClock {
    anchor_ns: u64,
    window_start_ns: u64,
    /// Smallest mapped-time-after-record of the window's idle-stream events (`u64::MAX`: none).
    idle_slack_min_ns: u64,
}

impl EventClock {
    /// An anchor event seen complete at `seen_ns`.
    pub fn new(seen_ns: u64) -> Self {
        EventClock { anchor_ns: seen_ns, window_start_ns: seen_ns, idle_slack_min_ns: u64::MAX }
    }

    /// Host time of the anchor.
    pub fn anchor_ns(&self) -> u64 {
        self.anchor_ns
    }

    /// Host time of an event that completed `elapsed_ns` (GPU time) after the anchor, whose
    /// record began at `recorded_ns` and which was seen complete at `seen_ns` (host times);
    /// `idle`: it was recorded on an idle stream. A mapping outside `[recorded_ns, seen_ns]` has
    /// drifted: the anchor moves so it is inside.
    pub fn host_time(&mut self, elapsed_ns: i64, recorded_ns: u64, seen_ns: u64, idle: bool) -> u64 {
        let mut t = (self.anchor_ns as i128 + elapsed_ns as i128).max(0) as u64;
        let lo = recorded_ns.min(seen_ns);
        if t < lo {
            self.anchor_ns += lo - t;
            t = lo;
        } else if t > seen_ns {
            self.anchor_ns -= (t - seen_ns).min(self.anchor_ns);
            t = seen_ns;
        }
        if idle {
            self.idle_slack_min_ns = self.idle_slack_min_ns.min(t - lo);
        }
        if seen_ns < self.window_start_ns {
            self.window_start_ns = seen_ns; // a clock read from the future: start over
        }
        if seen_ns - self.window_start_ns >= IDLE_WINDOW_NS {
            // Every idle-stream event of the window mapped late: the timer runs fast.
            if self.idle_slack_min_ns != u64::MAX && self.idle_slack_min_ns > IDLE_SLACK_NS {
                self.anchor_ns -= (self.idle_slack_min_ns - IDLE_SLACK_NS).min(MAX_PULL_NS).min(self.anchor_ns);
            }
            self.window_start_ns = seen_ns;
            self.idle_slack_min_ns = u64::MAX;
        }
        t
    }

    /// No idle-stream event was seen this window yet: the glue records one before the next launch
    /// onto an idle stream (one event per window at most beyond the meter's own).
    pub fn wants_idle_event(&self) -> bool {
        self.idle_slack_min_ns == u64::MAX
    }

    /// Should the event mapped to `t` become the anchor (it is far enough ahead)?
    pub fn reanchor_due(&self, t: u64) -> bool {
        t.saturating_sub(self.anchor_ns) >= REANCHOR_NS
    }

    /// The event mapped to `t` is the anchor from now on.
    pub fn reanchor(&mut self, t: u64) {
        self.anchor_ns = t;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const T0: u64 = 1_000_000_000_000;

    /// A GPU whose timer runs at (1 + ppm/1e6) of the host's, and a program that records an
    /// event each `every_ns`: on an idle stream (it completes 5 us after its record) every
    /// `idle_each`-th time, otherwise behind `busy_ns` of queued work. The mapper sees each
    /// event 10-30 us after it completed. Returns the worst mapping error.
    fn worst_error(ppm: i64, every_ns: u64, idle_each: u64, busy_ns: u64, secs: u64) -> u64 {
        let gpu = |host: u64| -> i128 { (host - T0) as i128 * (1_000_000 + ppm as i128) / 1_000_000 };
        let mut clock = EventClock::new(T0);
        let mut anchor_gpu = gpu(T0);
        let mut worst = 0;
        let mut i = 0;
        let mut recorded = T0 + every_ns;
        while recorded < T0 + secs * 1_000_000_000 {
            let done = recorded + if i % idle_each == 0 { 5_000 } else { busy_ns };
            let seen = done + 10_000 + (i * 7_919) % 20_000;
            let elapsed = (gpu(done) - anchor_gpu) as i64;
            let t = clock.host_time(elapsed, recorded, seen, i % idle_each == 0);
            assert!(t >= recorded && t <= seen, "outside its own bracket");
            worst = worst.max(t.abs_diff(done));
            if clock.reanchor_due(t) {
                clock.reanchor(t);
                anchor_gpu = gpu(done);
            }
            recorded += every_ns;
            i += 1;
        }
        worst
    }

    #[test]
    fn a_drifting_gpu_timer_stays_mapped_within_microseconds() {
        for ppm in [-500, -100, 0, 100, 500] {
            let worst = worst_error(ppm, 200_000, 10, 300_000, 60);
            // A slow timer is held by the idle events' records, a fast one by the window's
            // closest idle event (plus what it drifts within a window).
            assert!(worst <= 10_000 + IDLE_WINDOW_NS * ppm.unsigned_abs() / 1_000_000, "{ppm} ppm: {worst} ns off after a minute");
        }
    }

    #[test]
    fn without_the_bracket_the_same_drift_is_milliseconds() {
        // The anchor alone (what the meter used): 100 ppm over a minute is 6 ms.
        let gpu_ms = 60_000.0 * (1.0 - 100e-6);
        let mapped = T0 as f64 + gpu_ms * 1e6;
        let truth = T0 as f64 + 60e9;
        assert!((truth - mapped) > 5e6);
        // The bracket pulls an event recorded then back to no earlier than its record.
        let mut clock = EventClock::new(T0);
        let t = clock.host_time((gpu_ms * 1e6) as i64, T0 + 60_000_000_000, T0 + 60_000_020_000, false);
        assert_eq!(t, T0 + 60_000_000_000);
        assert_eq!(clock.anchor_ns(), T0 + 6_000_000, "the anchor moved by the drift");
    }

    #[test]
    fn idle_events_that_wait_do_not_drag_the_clock_back() {
        // Every "idle" event completes 2 ms after its record (another context has the GPU):
        // with no drift, the anchor moves back at most MAX_PULL_NS a window, not 2 ms.
        let mut clock = EventClock::new(T0);
        let mut recorded = T0;
        for _ in 0..100 {
            recorded += 1_000_000;
            let elapsed = (recorded + 2_000_000 - T0) as i64;
            clock.host_time(elapsed, recorded, recorded + 2_010_000, true);
        }
        let windows = 100 * 1_000_000 / IDLE_WINDOW_NS;
        assert!(T0 - clock.anchor_ns() <= (windows + 1) * MAX_PULL_NS, "anchor pulled back {} ns", T0 - clock.anchor_ns());
    }

    proptest! {
        #[test]
        fn a_mapped_time_is_always_inside_its_bracket(anchor in 0u64..1u64 << 50, elapsed in -(1i64 << 40)..1i64 << 40,
                                                     recorded in 0u64..1u64 << 50, wait in 0u64..1u64 << 30) {
            let mut clock = EventClock::new(anchor);
            let seen = recorded + wait;
            let t = clock.host_time(elapsed, recorded, seen, elapsed % 2 == 0);
            prop_assert!(t >= recorded && t <= seen);
        }
    }
}
