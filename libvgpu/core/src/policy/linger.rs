//! The linger (issue 14): while a lower-priority container shares a GPU, a higher-priority
//! process keeps its context on the GPU for a while after each stream or event synchronize, with
//! a one-thread spin queued behind the awaited work on a stream of its own. A request launched in
//! the host gap that follows then finds the GPU still on this context, instead of waiting for it
//! to switch back from the lower priority's work that ran in the gap. The service's own such spin
//! took that switch (0.35 ms) out of its tail on an H200 (docs/benchmarks.md, session 26); the
//! hook's, launched through the launch gate like the program's kernels, did the same (session
//! 27). A context synchronize gets none: a spin queued once it returned made the tail worse.
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
    fn the_word_moves_and_skips_zero() {
        assert_eq!(next_word(0), 1);
        assert_eq!(next_word(7), 8);
        assert_eq!(next_word(u32::MAX), 1);
    }
}
