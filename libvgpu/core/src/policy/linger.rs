//! The linger (issue 14): while a lower-priority container shares a GPU, a higher-priority
//! process keeps its context on the GPU for a while after each stream or event synchronize, with
//! a one-thread spin queued behind the awaited work on a stream of its own. A request launched in
//! the host gap that follows then finds the GPU still on this context, instead of waiting for it
//! to switch back from the lower priority's work that ran in the gap. The service's own such spin
//! took that switch (0.35 ms) out of its tail on an H200 (docs/benchmarks.md, session 26); the
//! hook's, launched through the launch gate like the program's kernels, did the same (session
//! 27). A context synchronize is answered with events, the spin queued behind them (a spin
//! queued once the real call returned made the tail worse).
//!
//! A spin helps only a launch that comes while it runs, and takes the GPU from the lower
//! priority meanwhile: a process spins only while 2% or more of its recent gaps, from a
//! lingering synchronize's return to its next kernel launch, were shorter than the spin
//! (`note_gap`, `spin_pays`).
//! A service's queued requests, launched as soon as the one before returns, are such gaps; a
//! process whose next launch always comes later spins never (on an H200, a priority-0 process
//! with 1.5 ms of CPU between 1-ms kernels left its two lower-priority neighbours 37% of the GPU
//! with 300-us spins, 58% without; session 29).
//!
//! The spin runs until its time is up or a word of pinned host memory moves. The next synchronize
//! moves it once the next spin is queued, so the previous spin overlaps the next request's
//! start (it takes one thread, no SMs the request needs). A context synchronize, or the context's
//! end, moves it before the call, since a context synchronize would otherwise wait for the spin.

/// How long each spin runs (ns) on a device, or 0 for no linger: the process is configured to
/// linger (`linger_us`), a lower-priority container shares the GPU, and no hard cap bounds the
/// device (the spin is GPU time NVML counts as ours; under a cap it would spend the cap).
pub fn spin_ns(linger_us: u32, lower_shares: bool, hard_cap: Option<u32>) -> u64 {
    if linger_us == 0 || !lower_shares || hard_cap.is_some() {
        return 0;
    }
    linger_us as u64 * 1000
}

/// The share of a process's recent gaps (from a lingering synchronize's return to its next
/// kernel launch) shorter than the spin, in 1/65536ths: each new gap weighs 1/128 and the older
/// ones fade by as much (about the last 128 count).
pub const ALL_QUICK: u64 = 65536;
const WEIGHT: u64 = 128;

/// `quick` with `gap_ns` noted: a gap shorter than `spin_ns` is one a spin would have filled.
pub fn note_gap(quick: u64, gap_ns: u64, spin_ns: u64) -> u64 {
    let hit = if gap_ns < spin_ns { ALL_QUICK / WEIGHT } else { 0 };
    quick - quick / WEIGHT + hit
}

/// Whether a spin pays: at least 2% of recent gaps were quick, above the 1% of a service's
/// requests its p99 is made of (a service's queued requests are such gaps: 7% in the
/// acceptance's). A start-up synchronize followed at once by the first work, even twice, is not
/// enough (1.6%): it would buy spins for nothing.
pub fn spin_pays(quick: u64) -> bool {
    quick >= ALL_QUICK / 50
}

/// The word's next value: each queued spin spins while the word holds its own number, so moving
/// the word ends every spin queued before. Never 0, the value the word starts with before a spin.
pub fn next_word(word: u32) -> u32 {
    match word.wrapping_add(1) {
        0 => 1,
        w => w,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lingers_only_beside_a_lower_priority_and_without_a_hard_cap() {
        assert_eq!(spin_ns(300, true, None), 300_000);
        assert_eq!(spin_ns(300, false, None), 0, "alone or beside higher priorities only");
        assert_eq!(spin_ns(300, true, Some(50)), 0, "a hard cap");
        assert_eq!(spin_ns(0, true, None), 0, "configured off");
    }

    fn after(gaps: &[(u64, u64)]) -> u64 {
        gaps.iter().fold(0, |q, &(gap, spin)| note_gap(q, gap, spin))
    }

    #[test]
    fn a_spin_pays_once_2_percent_of_recent_gaps_came_within_it() {
        assert!(!spin_pays(0), "no launch yet came within a spin");
        let start = [(100_000, 300_000), (200_000, 300_000)];
        assert!(!spin_pays(after(&start)), "two quick launches in a row (a start-up's) are not enough");
        assert!(spin_pays(after(&[(100_000, 300_000); 3])), "three are");
        // 1.5 ms between a return and the next launch, with 300-us spins: never pays.
        let mut q = after(&[(100_000, 300_000); 3]);
        let mut paid = 0;
        for _ in 0..1000 {
            q = note_gap(q, 1_500_000, 300_000);
            paid += spin_pays(q) as u32;
        }
        assert!(paid <= 25, "a quick start paid for {paid} of 1000 slow gaps");
        assert!(!spin_pays(q));
        assert!(!spin_pays(after(&[(300_000, 300_000); 50])), "a launch as the spin ends finds it gone");
        assert!(!spin_pays(after(&[(0, 0); 50])), "no spin length: nothing pays");
    }

    #[test]
    fn a_service_with_7_percent_queued_requests_keeps_paying_one_with_half_a_percent_does_not() {
        // Every 14th gap quick (7%), as the acceptance's service's queued requests.
        let mut q = 0;
        let mut unpaid = 0;
        for i in 0..5000u64 {
            q = note_gap(q, if i % 14 == 0 { 50_000 } else { 20_000_000 }, 300_000);
            unpaid += (i > 300 && !spin_pays(q)) as u32;
        }
        assert_eq!(unpaid, 0, "a 7% service stopped paying {unpaid} times");
        // Every 200th (0.5%).
        let mut paid = 0;
        q = 0;
        for i in 0..5000u64 {
            q = note_gap(q, if i % 200 == 0 { 50_000 } else { 20_000_000 }, 300_000);
            paid += spin_pays(q) as u32;
        }
        assert_eq!(paid, 0, "a 0.5% service paid {paid} times");
    }

    #[test]
    fn all_quick_gaps_stay_below_the_top() {
        let q = after(&[(0, 1); 10_000]);
        assert!(q <= ALL_QUICK && q > ALL_QUICK * 99 / 100, "{q}");
    }

    #[test]
    fn the_word_moves_and_skips_zero() {
        assert_eq!(next_word(0), 1);
        assert_eq!(next_word(7), 8);
        assert_eq!(next_word(u32::MAX), 1);
    }
}
