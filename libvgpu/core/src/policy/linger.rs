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
//! priority meanwhile: a process spins only where two of its last 64 gaps from a lingering
//! synchronize's return to its next launch were shorter than the spin (`note_gap`, `spin_pays`).
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

/// The gaps kept, newest in the lowest bit, with `gap_ns` (from a lingering synchronize's return
/// to the next launch) added: 1 where a spin of `spin_ns` would still have been running.
pub fn note_gap(gaps: u64, gap_ns: u64, spin_ns: u64) -> u64 {
    (gaps << 1) | u64::from(gap_ns < spin_ns)
}

/// Whether a spin pays: a launch came within the spin after two of the last 64 synchronizes
/// (3%, above the 1% of a service's requests its p99 is made of). One is not enough: a start-up
/// synchronize followed at once by the first real work would buy 64 spins for nothing.
pub fn spin_pays(gaps: u64) -> bool {
    gaps.count_ones() >= 2
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

    #[test]
    fn a_spin_pays_while_two_of_the_last_64_launches_came_within_it() {
        assert!(!spin_pays(0), "no launch yet came within a spin");
        let mut g = note_gap(0, 100_000, 300_000);
        assert!(!spin_pays(g), "one quick launch (a start-up's) is not enough");
        g = note_gap(g, 1_500_000, 300_000);
        g = note_gap(g, 200_000, 300_000);
        assert!(spin_pays(g), "two launches within 300-us spins");
        for _ in 0..61 {
            g = note_gap(g, 1_500_000, 300_000);
        }
        assert!(spin_pays(g), "the first quick one is the 64th gap back");
        g = note_gap(g, 1_500_000, 300_000);
        assert!(!spin_pays(g), "one quick gap left in the last 64");
        assert!(!spin_pays(note_gap(note_gap(0, 300_000, 300_000), 300_001, 300_000)), "a launch as the spin ends finds it gone");
        assert!(!spin_pays(note_gap(note_gap(0, 0, 0), 0, 0)), "no spin length: nothing pays");
    }

    #[test]
    fn the_word_moves_and_skips_zero() {
        assert_eq!(next_word(0), 1);
        assert_eq!(next_word(7), 8);
        assert_eq!(next_word(u32::MAX), 1);
    }
}
