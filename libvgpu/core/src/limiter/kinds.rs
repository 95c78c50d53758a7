//! What each kind of launch takes on the GPU, so queued work is valued launch by launch.
//!
//! A launch's kind is what the glue can name without a driver call: the kernel function and its
//! grid size, or the graph exec (`0`: unknown, e.g. a memset). The meter's per-stream estimate is
//! one figure per launch for the whole stream; after a run of GEMMs it is about a GEMM's length,
//! and every small kernel queued behind them was then valued as a GEMM: on an H200, GPT-2
//! training under a cap of 99 had 315 small launches pending read as 134 ms, and its launching
//! thread was held 2.38 s of 45 s (docs/benchmarks.md, session 21). A kernel of one kind takes
//! about as long each time, whatever phase the program is in.
//!
//! Launches between two timing events share one measured interval. A batch of one kind teaches
//! that kind its interval over its launches; a mixed batch is split in proportion to what each
//! kind is thought to take (an unknown kind: the stream's estimate), so a kind that recurs among
//! others converges on its own length.

/// Kinds remembered per device (a training step has a few hundred distinct kernel launches).
const SLOTS: usize = 1024;
/// Slots probed for a kind before the first of them is taken over.
const PROBE: usize = 8;
/// New measurements weigh 1/`WEIGHT` against a kind's estimate.
const WEIGHT: u64 = 4;
/// A tight interval over this many times a kind's tight figure makes the kind erratic for
/// `ERRATIC_NS`: a kernel whose length depends on its data (a kind learned at 10 us that ran
/// 5 ms as a step's last launch) is charged its figure only while it keeps to it. (Shorter ones
/// only over-charge; at 4 one kind of 10 or 60 us turned erratic.) And over `ERRATIC_MIN_NS`
/// more, twice within `ERRATIC_PAIR_NS`: one 5 us kernel timed at 100 us and more (the mock's GPU
/// thread descheduled on a loaded machine, a GPU's clock change) is jitter, and once was enough
/// to turn 5 us kernels paced 20 us apart back to an event each (0.77 of their want); at 100 us
/// twice, CI's loaded machine did it to 10 us ones (0.86).
const ERRATIC_RATIO: u64 = 8;
const ERRATIC_MIN_NS: u64 = 1_000_000;
const ERRATIC_PAIR_NS: u64 = 2_000_000_000;
const ERRATIC_NS: u64 = 10_000_000_000;
/// A kind with no back-to-back measurement for this long learns from any (`KindTable::learn`).
pub const STALE_NS: u64 = 200_000_000;
/// Distinct kinds one batch keeps apart; launches of further kinds are valued and learned at
/// the stream's estimate (`Bag::other`).
pub const BAG_KINDS: usize = 4;

/// The kind of a kernel launch: its function and grid size (a GEMM's length scales with its
/// grid). Never 0 (0 is "unknown").
pub fn kernel_kind(function: u64, blocks: u64) -> u64 {
    let k = function ^ blocks.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    if k == 0 { 1 } else { k }
}

/// The kind of a kernel launched on a grid of `gx * gy * gz` blocks.
pub fn grid_kind(function: u64, gx: u32, gy: u32, gz: u32) -> u64 {
    kernel_kind(function, gx as u64 * gy as u64 * gz as u64)
}

/// The launches one timing event covers, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bag {
    kinds: [(u64, u32); BAG_KINDS],
    /// Launches of an unknown kind, or of kinds past `BAG_KINDS`.
    pub other: u32,
}

impl Bag {
    pub fn add(&mut self, kind: u64) {
        if kind != 0 {
            for slot in &mut self.kinds {
                if slot.0 == kind {
                    slot.1 += 1;
                    return;
                }
                if slot.1 == 0 {
                    *slot = (kind, 1);
                    return;
                }
            }
        }
        self.other += 1;
    }

    fn known(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.kinds.iter().copied().filter(|k| k.1 > 0)
    }
}

/// Per-kind estimates of GPU time per launch, a fixed table (no allocation on the launch path).
pub struct KindTable {
    slots: Box<[Slot]>,
}

#[derive(Clone, Copy, Default)]
struct Slot {
    kind: u64,
    est_ns: u64,
    /// When a back-to-back batch last taught it.
    backlogged_ns: u64,
    /// `est_ns` came from intervals of its GPU time alone (`KindTable::learn`'s `tight`): a
    /// host-paced launch of it may be charged that without an event.
    tight: bool,
    /// Until then its figure is not charged without an event (`get_tight`): two tight
    /// intervals far over it came within `ERRATIC_PAIR_NS` (`ERRATIC_RATIO`).
    erratic_until_ns: u64,
    /// When the latest such interval came (0: never).
    outlier_ns: u64,
}

impl Default for KindTable {
    fn default() -> Self {
        KindTable { slots: vec![Slot::default(); SLOTS].into_boxed_slice() }
    }
}

impl KindTable {
    fn home(kind: u64) -> usize {
        (kind.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 54) as usize % SLOTS
    }

    /// What a launch of `kind` is thought to take (`None`: not learned yet).
    pub fn get(&self, kind: u64) -> Option<u64> {
        self.slot(kind).map(|s| s.est_ns)
    }

    /// What a launch of `kind` takes, if learned from intervals of GPU time alone (`learn`) and
    /// not erratic at `now`.
    pub fn get_tight(&self, kind: u64, now: u64) -> Option<u64> {
        self.slot(kind).filter(|s| s.tight && now >= s.erratic_until_ns).map(|s| s.est_ns)
    }

    fn slot(&self, kind: u64) -> Option<Slot> {
        let h = Self::home(kind);
        (0..PROBE).map(|i| self.slots[(h + i) % SLOTS]).find(|s| s.kind == kind && s.est_ns > 0)
    }

    fn set(&mut self, slot: Slot) {
        let h = Self::home(slot.kind);
        let i = (0..PROBE).map(|i| (h + i) % SLOTS).find(|&i| self.slots[i].kind == slot.kind || self.slots[i].kind == 0).unwrap_or(h);
        self.slots[i] = Slot { est_ns: slot.est_ns.max(1), ..slot };
    }

    /// What the launches of `bag` are thought to take, `fallback_ns` a launch for the others.
    pub fn value(&self, bag: &Bag, fallback_ns: u64) -> u64 {
        let known: u64 = bag.known().map(|(k, n)| n as u64 * self.get(k).unwrap_or(fallback_ns)).sum();
        known.saturating_add(bag.other as u64 * fallback_ns)
    }

    /// The launches of `bag` took `interval_ns` together: each kind learns its part, split in
    /// proportion to what each was thought to take (`fallback_ns` for the unknown). Unless they
    /// were `backlogged` (all queued before the GPU reached them), the interval also holds the
    /// host's time between them, and teaches only kinds not learned yet, or not learned back to
    /// back for `STALE_NS`: small kernels a host launches one by one read 25 us where they take
    /// 5 us behind a GEMM (the simulator's phased step), but a kind learned while another
    /// container shared the GPU must come down once the stream no longer backs up (the node
    /// tests: a low-priority container ran at a fifth of its speed after the high one left).
    /// An interval that is `tight` (back to back, or one launch from where the GPU reached it)
    /// holds GPU time alone: its figure replaces one learned from looser intervals at once, and
    /// a looser interval only brings a tight figure down (it bounds it from above), never up:
    /// a host-paced launch of a kind with a tight figure is charged it without an event
    /// (`Meter::wants_end_event`), and ten 10 us kernels 45 us apart in one interval taught
    /// each 50 us.
    pub fn learn(&mut self, bag: &Bag, interval_ns: u64, fallback_ns: u64, backlogged: bool, tight: bool, now: u64) {
        let thought = self.value(bag, fallback_ns).max(1) as u128;
        for (k, _) in bag.known() {
            let slot = self.slot(k);
            let prior = slot.map(|s| s.est_ns);
            let fresh = slot.is_some_and(|s| now.saturating_sub(s.backlogged_ns) < STALE_NS);
            if !backlogged && fresh {
                continue;
            }
            let backlogged_ns = if backlogged { now } else { slot.map_or(0, |s| s.backlogged_ns) };
            // Per launch: the interval times this launch's part of what the batch was thought to take.
            let share = (interval_ns as u128 * prior.unwrap_or(fallback_ns) as u128 / thought) as u64;
            let was_tight = slot.is_some_and(|s| s.tight);
            let est = match prior {
                Some(e) if was_tight == tight || (was_tight && share < e) => e - e / WEIGHT + share / WEIGHT,
                Some(e) if was_tight => e,
                _ => share,
            };
            let (mut erratic_until_ns, mut outlier_ns) = slot.map_or((0, 0), |s| (s.erratic_until_ns, s.outlier_ns));
            if prior.is_some_and(|e| was_tight && tight && share > e.saturating_mul(ERRATIC_RATIO).max(e + ERRATIC_MIN_NS)) {
                if outlier_ns != 0 && now.saturating_sub(outlier_ns) < ERRATIC_PAIR_NS {
                    erratic_until_ns = now.saturating_add(ERRATIC_NS);
                }
                outlier_ns = now;
            }
            self.set(Slot { kind: k, est_ns: est, backlogged_ns, tight: tight || was_tight, erratic_until_ns, outlier_ns });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bag(kinds: &[u64]) -> Bag {
        let mut b = Bag::default();
        kinds.iter().for_each(|&k| b.add(k));
        b
    }

    #[test]
    fn a_batch_of_one_kind_teaches_it_its_length() {
        let mut t = KindTable::default();
        t.learn(&bag(&[7, 7, 7, 7]), 4_000_000, 20_000, true, true, 0);
        assert_eq!(t.get(7), Some(1_000_000));
        assert_eq!(t.value(&bag(&[7, 7, 9]), 20_000), 2_020_000, "an unknown kind is valued at the fallback");
    }

    #[test]
    fn kinds_that_recur_in_mixed_batches_converge_on_their_own_lengths() {
        // A 1 ms GEMM (kind 1) and 10 us kernels (kind 2), batched in varying mixes.
        let mut t = KindTable::default();
        let mixes: [&[u64]; 4] = [&[1, 2, 2], &[2, 2, 2, 2], &[1, 1, 2], &[2, 2]];
        for i in 0..200 {
            let m = mixes[i % mixes.len()];
            let truth: u64 = m.iter().map(|&k| if k == 1 { 1_000_000 } else { 10_000 }).sum();
            t.learn(&bag(m), truth, 100_000, true, true, 0);
        }
        let (gemm, small) = (t.get(1).unwrap(), t.get(2).unwrap());
        assert!((950_000..=1_050_000).contains(&gemm), "gemm {gemm}");
        assert!((8_000..=12_000).contains(&small), "small {small}");
        // 300 small kernels behind the GEMMs are worth 3 ms, not 300 GEMMs.
        let behind = bag(&[2; 300]);
        assert!(t.value(&behind, 1_000_000) < 4_000_000);
    }

    #[test]
    fn host_paced_batches_teach_a_kind_only_once_its_back_to_back_figure_is_stale() {
        let mut t = KindTable::default();
        let s = 1_000_000_000;
        t.learn(&bag(&[3]), 5_000_000, 20_000, true, true, s); // back to back, beside another container
        t.learn(&bag(&[3]), 1_000_000, 20_000, false, false, s + STALE_NS / 2);
        assert_eq!(t.get(3), Some(5_000_000), "host time between launches says nothing while fresh");
        t.learn(&bag(&[3]), 1_000_000, 20_000, false, false, s + STALE_NS);
        assert_eq!(t.get(3), Some(4_000_000), "stale: it comes down");
        t.learn(&bag(&[3]), 1_000_000, 20_000, false, false, s + STALE_NS + 1);
        assert_eq!(t.get(3), Some(3_250_000), "and keeps coming down");
    }

    #[test]
    fn a_tight_figure_replaces_a_loose_one_and_looser_ones_only_bring_it_down() {
        let (mut t, s) = (KindTable::default(), 1_000_000_000);
        t.learn(&bag(&[4, 4]), 100_000, 20_000, false, false, s); // two 10 us launches 80 us apart
        assert_eq!((t.get(4), t.get_tight(4, s + 9)), (Some(50_000), None));
        t.learn(&bag(&[4]), 10_000, 20_000, false, true, s + 1); // one, from where the GPU reached it
        assert_eq!((t.get(4), t.get_tight(4, s + 9)), (Some(10_000), Some(10_000)), "replaced at once");
        t.learn(&bag(&[4, 4]), 100_000, 20_000, false, false, s + 2);
        assert_eq!(t.get_tight(4, s + 9), Some(10_000), "a looser interval above it says nothing");
        t.learn(&bag(&[4]), 6_000, 20_000, false, false, s + 3);
        assert_eq!(t.get_tight(4, s + 9), Some(9_000), "one below it brings it down");
        t.learn(&bag(&[4]), 13_000, 20_000, false, true, s + 4);
        assert_eq!(t.get_tight(4, s + 9), Some(10_000), "tight ones move it both ways");
        t.learn(&bag(&[4]), 1_000, 20_000, false, true, s + 5);
        assert_eq!(t.get_tight(4, s + 9), Some(7_750), "far shorter: only over-charged");
        t.learn(&bag(&[4]), 900_000, 20_000, false, true, s + 6);
        assert_eq!(t.get_tight(4, s + 9), Some(230_813), "eight times, but under 1 ms more: jitter");
        t.learn(&bag(&[4]), 9_000_000, 20_000, false, true, s + 7);
        assert_eq!(t.get_tight(4, s + 9), Some(2_423_110), "once far over: jitter");
        t.learn(&bag(&[4]), 90_000_000, 20_000, false, true, s + 8);
        assert_eq!(t.get_tight(4, s + 9), None, "twice within 2 s: erratic");
        assert_eq!(t.get(4), Some(24_317_333), "still valued for the queue");
        assert_eq!(t.get_tight(4, s + 8 + ERRATIC_NS), Some(24_317_333), "for a while");
    }

    #[test]
    fn a_bag_keeps_a_few_kinds_apart_and_counts_the_rest_as_other() {
        let b = bag(&[1, 2, 3, 4, 5, 0, 1]);
        assert_eq!(b.known().map(|k| k.1).sum::<u32>(), 5);
        assert_eq!(b.other, 2, "kind 5 and the unknown 0");
    }

    #[test]
    fn a_full_neighbourhood_takes_over_a_slot_and_lookups_stay_exact() {
        let mut t = KindTable::default();
        for k in 1..=5_000u64 {
            t.set(Slot { kind: k, est_ns: k, ..Slot::default() });
        }
        for k in 1..=5_000u64 {
            if let Some(v) = t.get(k) {
                assert_eq!(v, k, "a kind never reads another's estimate");
            }
        }
        assert_eq!(t.get(5_000), Some(5_000), "the newest is kept");
        assert_ne!(kernel_kind(0, 0), 0);
    }
}
