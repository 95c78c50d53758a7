//! The container's busy time on one device as a union over every stream and process.
//!
//! Each process learns when its kernels ran (timing events) in whatever order its streams
//! complete, and several processes of a container may run kernels at overlapping times. To
//! charge the *union* (the time during which at least one kernel of the container ran, which is
//! what NVML reports as utilization) without ordering or locks, time is quantized into
//! `QUANTUM_NS` slots and every process sets the slots its intervals cover in a shared bitmap:
//! the slots that were not set before are the newly busy time, whoever reports first.
//!
//! Each 64-bit word holds `SLOTS_PER_WORD` slot bits and a 16-bit epoch tag, so a word reused
//! for a later lap of the ring is reset by the same compare-and-swap that sets its bits: no
//! clearing pass, no lock, and a process dying mid-update leaves a consistent word.

use std::sync::atomic::{AtomicU64, Ordering::*};

/// Width of one slot. Interval edges round to the nearest slot, so the error is unbiased and at
/// most half a slot per edge; back-to-back kernels share edges and lose nothing.
pub const QUANTUM_NS: u64 = 10_000;
pub const SLOTS_PER_WORD: u64 = 48;
/// Words in the ring: 4096 x 48 x 10 us = 1.97 s of history.
pub const WORDS: usize = 4096;
/// Intervals reaching further back than this are charged without union (history is gone).
pub const HORIZON_NS: u64 = (WORDS as u64 - 64) * SLOTS_PER_WORD * QUANTUM_NS;
const SLOT_MASK: u64 = (1 << SLOTS_PER_WORD) - 1;

/// One device's busy bitmap in the shared region (32 KiB).
#[repr(C, align(64))]
pub struct BusyMap {
    words: [AtomicU64; WORDS],
}

impl Default for BusyMap {
    fn default() -> Self {
        BusyMap { words: [const { AtomicU64::new(0) }; WORDS] }
    }
}

impl BusyMap {
    /// Mark `[start, end)` busy; returns the nanoseconds that were not busy before (the part of
    /// the interval no process of the container had reported yet). `now` bounds the history.
    pub fn mark(&self, start: u64, end: u64, now: u64) -> u64 {
        if end <= start {
            return 0;
        }
        let floor = now.saturating_sub(HORIZON_NS);
        // Anything older than the ring is charged whole: no one can have marked it.
        let fresh = if start < floor { end.min(floor) - start } else { 0 };
        let start = start.max(floor);
        if end <= start {
            return fresh;
        }
        let (s0, s1) = ((start + QUANTUM_NS / 2) / QUANTUM_NS, (end + QUANTUM_NS / 2) / QUANTUM_NS);
        let mut slot = s0;
        let mut new_slots = 0u64;
        while slot < s1 {
            let word = slot / SLOTS_PER_WORD;
            let first = slot % SLOTS_PER_WORD;
            let last = (s1 - word * SLOTS_PER_WORD).min(SLOTS_PER_WORD);
            let bits = (SLOT_MASK >> (SLOTS_PER_WORD - (last - first))) << first;
            new_slots += self.set(word, bits);
            slot = (word + 1) * SLOTS_PER_WORD;
        }
        fresh + new_slots * QUANTUM_NS
    }

    /// Set `bits` in absolute word `word`; returns how many were newly set.
    fn set(&self, word: u64, bits: u64) -> u64 {
        let cell = &self.words[(word % WORDS as u64) as usize];
        let tag = (word / WORDS as u64) & 0xFFFF;
        let mut cur = cell.load(Relaxed);
        loop {
            let (old_bits, old_tag) = (cur & SLOT_MASK, cur >> SLOTS_PER_WORD);
            let before = if old_tag == tag { old_bits } else { 0 };
            let new = before | bits;
            if old_tag == tag && new == old_bits {
                return 0;
            }
            match cell.compare_exchange_weak(cur, (tag << SLOTS_PER_WORD) | new, AcqRel, Relaxed) {
                Ok(_) => return (new & !before).count_ones() as u64,
                Err(v) => cur = v,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const T0: u64 = 1_000_000_000_000;

    #[test]
    fn overlap_is_counted_once_in_any_order() {
        let m = BusyMap::default();
        assert_eq!(m.mark(T0 + 200_000, T0 + 300_000, T0 + 1_000_000), 100_000);
        assert_eq!(m.mark(T0, T0 + 1_000_000, T0 + 1_000_000), 900_000);
        assert_eq!(m.mark(T0 + 500_000, T0 + 600_000, T0 + 1_000_000), 0);
    }

    #[test]
    fn back_to_back_intervals_lose_nothing() {
        let m = BusyMap::default();
        let mut total = 0;
        let mut t = T0 + 3_333;
        for _ in 0..1000 {
            total += m.mark(t, t + 7_001, t + 7_001);
            t += 7_001;
        }
        assert!((total as i64 - 7_001_000).abs() <= QUANTUM_NS as i64, "{total}");
    }

    #[test]
    fn a_later_lap_of_the_ring_starts_empty() {
        let m = BusyMap::default();
        let lap = WORDS as u64 * SLOTS_PER_WORD * QUANTUM_NS;
        assert_eq!(m.mark(T0, T0 + 1_000_000, T0 + 1_000_000), 1_000_000);
        assert_eq!(m.mark(T0 + lap, T0 + lap + 1_000_000, T0 + lap + 1_000_000), 1_000_000);
    }

    #[test]
    fn history_beyond_the_ring_is_charged_whole() {
        let m = BusyMap::default();
        let now = T0 + 10 * HORIZON_NS;
        let got = m.mark(now - HORIZON_NS - 5_000_000, now - HORIZON_NS + 5_000_000, now);
        assert_eq!(got, 10_000_000);
        assert_eq!(m.mark(now - HORIZON_NS - 5_000_000, now - HORIZON_NS - 1_000_000, now), 4_000_000);
    }

    proptest! {
        /// Whatever the intervals and their order, the total charged is their union (within half
        /// a quantum per edge).
        #[test]
        fn charges_the_union(ivs in proptest::collection::vec((0u64..50_000_000, 1u64..5_000_000), 1..40)) {
            let m = BusyMap::default();
            let now = T0 + 60_000_000;
            let charged: u64 = ivs.iter().map(|&(s, d)| m.mark(T0 + s, T0 + s + d, now)).sum();
            let mut v: Vec<(u64, u64)> = ivs.iter().map(|&(s, d)| (s, s + d)).collect();
            v.sort();
            let (mut union, mut cur) = (0u64, (0u64, 0u64));
            for (s, e) in v {
                if s > cur.1 { union += cur.1 - cur.0; cur = (s, e); } else { cur.1 = cur.1.max(e); }
            }
            union += cur.1 - cur.0;
            let slack = ivs.len() as u64 * QUANTUM_NS;
            prop_assert!(charged.abs_diff(union) <= slack, "charged {} union {}", charged, union);
        }
    }
}
