//! Process-local record of what this process charged to the region, keyed by device pointer or
//! handle, so a free releases exactly what its allocation reserved. Unknown keys (allocations made
//! before the hook loaded or through paths it does not see) pass through untouched.

use crate::region::MemKind;
use crate::MAX_DEVICES;
use std::collections::HashMap;

/// Driver granularity for large allocations.
pub const LARGE_PAGE: u64 = 2 << 20;
/// From this size on, an allocation gets its own 2 MiB pages.
pub const LARGE_THRESHOLD: u64 = 1 << 20;
/// Rounding of small (sub-allocated) requests.
pub const SMALL_GRAIN: u64 = 4 << 10;

/// Bytes charged for a request of `requested` bytes.
///
/// Rule: requests >= 1 MiB are rounded up to whole 2 MiB pages (the driver maps large allocations
/// in 2 MiB pages, so that is their real footprint); smaller ones round up to 4 KiB because the
/// driver packs them into shared 2 MiB chunks: the sum charged is at least the sum requested, and
/// the slack of at most one partly filled chunk per pool is covered by the context reserve.
/// Saturates at `u64::MAX` (then it is over any cap).
pub fn accounted_size(requested: u64) -> u64 {
    let grain = if requested >= LARGE_THRESHOLD { LARGE_PAGE } else { SMALL_GRAIN };
    match requested.checked_add(grain - 1) {
        Some(v) => v / grain * grain,
        None => u64::MAX,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocation {
    pub dev: usize,
    pub bytes_accounted: u64,
    pub kind: MemKind,
    /// The context it was allocated in (0: unknown); the driver frees it with that context.
    pub ctx: u64,
}

#[derive(Default, Debug)]
pub struct Ledger {
    map: HashMap<u64, Allocation>,
    totals: [u64; MAX_DEVICES],
}

impl Ledger {
    pub fn new() -> Ledger {
        Ledger::default()
    }

    /// Record an allocation. If `ptr` was already recorded (a free we never saw), the old entry is
    /// replaced and returned so the caller can release its charge.
    pub fn insert(&mut self, ptr: u64, alloc: Allocation) -> Option<Allocation> {
        let old = self.map.insert(ptr, alloc);
        if let Some(o) = old {
            self.sub(o);
        }
        if let Some(t) = self.totals.get_mut(alloc.dev) {
            *t = t.saturating_add(alloc.bytes_accounted);
        }
        old
    }

    /// Forget an allocation; `None` for unknown pointers (pass through).
    pub fn remove(&mut self, ptr: u64) -> Option<Allocation> {
        let a = self.map.remove(&ptr)?;
        self.sub(a);
        Some(a)
    }

    pub fn get(&self, ptr: u64) -> Option<&Allocation> {
        self.map.get(&ptr)
    }

    /// Bytes this process has recorded on `dev`.
    pub fn total(&self, dev: usize) -> u64 {
        self.totals.get(dev).copied().unwrap_or(0)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Remove every allocation of `dev` (context destroyed / device reset), returning them.
    pub fn drain_device(&mut self, dev: usize) -> Vec<(u64, Allocation)> {
        let keys: Vec<u64> = self.map.iter().filter(|(_, a)| a.dev == dev).map(|(k, _)| *k).collect();
        keys.into_iter().filter_map(|k| self.remove(k).map(|a| (k, a))).collect()
    }

    /// Remove every allocation made in context `ctx` (destroyed: the driver freed them).
    pub fn drain_ctx(&mut self, ctx: u64) -> Vec<(u64, Allocation)> {
        if ctx == 0 {
            return Vec::new();
        }
        let keys: Vec<u64> = self.map.iter().filter(|(_, a)| a.ctx == ctx).map(|(k, _)| *k).collect();
        keys.into_iter().filter_map(|k| self.remove(k).map(|a| (k, a))).collect()
    }

    pub fn iter(&self) -> impl Iterator<Item = (u64, &Allocation)> + '_ {
        self.map.iter().map(|(k, v)| (*k, v))
    }

    fn sub(&mut self, a: Allocation) {
        if let Some(t) = self.totals.get_mut(a.dev) {
            *t = t.saturating_sub(a.bytes_accounted);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn rounding() {
        assert_eq!(accounted_size(0), 0);
        assert_eq!(accounted_size(1), 4096);
        assert_eq!(accounted_size(4096), 4096);
        assert_eq!(accounted_size(LARGE_THRESHOLD - 1), LARGE_THRESHOLD);
        assert_eq!(accounted_size(LARGE_THRESHOLD), LARGE_PAGE);
        assert_eq!(accounted_size(LARGE_PAGE + 1), 2 * LARGE_PAGE);
        assert_eq!(accounted_size(u64::MAX - 5), u64::MAX);
    }

    #[test]
    fn unknown_passes_through() {
        let mut l = Ledger::new();
        assert_eq!(l.remove(0xdead), None);
        let a = Allocation { dev: 1, bytes_accounted: 10, kind: MemKind::Data, ctx: 7 };
        assert_eq!(l.insert(1, a), None);
        assert_eq!(l.insert(1, a), Some(a));
        assert_eq!(l.total(1), 10);
        assert_eq!(l.remove(1), Some(a));
        assert_eq!(l.total(1), 0);
        assert_eq!(l.total(99), 0);
        l.insert(2, a);
        l.insert(3, Allocation { ctx: 8, ..a });
        assert_eq!(l.drain_ctx(0), vec![]);
        assert_eq!(l.drain_ctx(7), vec![(2, a)]);
        assert_eq!(l.total(1), 10);
    }

    proptest! {
        #[test]
        fn totals_match_live(ops in prop::collection::vec((any::<bool>(), 0u64..32, 0usize..18, 0u64..(1u64 << 34)), 0..200)) {
            let mut l = Ledger::new();
            for (ins, ptr, dev, req) in ops {
                if ins {
                    l.insert(ptr, Allocation { dev, bytes_accounted: accounted_size(req), kind: MemKind::Data, ctx: ptr % 3 });
                } else {
                    l.remove(ptr);
                }
                for d in 0..MAX_DEVICES {
                    let sum: u64 = l.iter().filter(|(_, a)| a.dev == d).map(|(_, a)| a.bytes_accounted).sum();
                    prop_assert_eq!(l.total(d), sum);
                }
            }
            for d in 0..MAX_DEVICES { l.drain_device(d); }
            prop_assert!((0..MAX_DEVICES).all(|d| l.total(d) == 0));
        }

        #[test]
        fn accounted_covers_request(req in any::<u64>()) {
            let a = accounted_size(req);
            prop_assert!(a >= req);
            if req >= LARGE_THRESHOLD && a != u64::MAX { prop_assert_eq!(a % LARGE_PAGE, 0); }
        }
    }
}

/// Memory the device holds for a process beyond what the hook charged: a context keeps growing
/// after it was measured (an H100's: 518 MiB at creation, 537 MiB once it ran kernels). Followed
/// from NVML's figure for the process, so the container's total matches what the device holds.
/// A change is taken only when two readings agree within `GROWTH_SLACK`: an allocation racing a
/// reading (charged before NVML shows it, or freed after) does not move it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Growth {
    /// Bytes charged for growth now.
    pub charged: u64,
    pending: Option<u64>,
}

/// NVML counts whole MiB; differences below this are noise.
pub const GROWTH_SLACK: u64 = 2 << 20;

impl Growth {
    /// `held`: NVML's device memory for the process; `accounted`: the region's total for it
    /// (growth included). Returns the change to charge now (+) or give back (-).
    pub fn update(&mut self, held: u64, accounted: u64) -> i64 {
        let base = accounted.saturating_sub(self.charged);
        let want = held.saturating_sub(base);
        let want = if want < GROWTH_SLACK { 0 } else { want };
        if want.abs_diff(self.charged) < GROWTH_SLACK {
            self.pending = None;
            return 0;
        }
        if self.pending.is_some_and(|p| p.abs_diff(want) < GROWTH_SLACK) {
            let delta = want as i64 - self.charged as i64;
            self.charged = want;
            self.pending = None;
            return delta;
        }
        self.pending = Some(want);
        0
    }
}

#[cfg(test)]
mod growth_tests {
    use super::*;
    const MIB: u64 = 1 << 20;

    #[test]
    fn context_growth_is_charged_after_two_readings_and_given_back() {
        let mut g = Growth::default();
        // 518 MiB charged for the context, the device holds 537.
        assert_eq!(g.update(537 * MIB, 518 * MIB), 0);
        assert_eq!(g.update(537 * MIB, 518 * MIB), 19 * MIB as i64);
        assert_eq!(g.update(537 * MIB, 537 * MIB), 0);
        // The context shrinks back (or goes): given back after two readings.
        assert_eq!(g.update(518 * MIB, 537 * MIB), 0);
        assert_eq!(g.update(518 * MIB, 537 * MIB), -(19 * MIB as i64));
    }

    #[test]
    fn an_allocation_racing_one_reading_moves_nothing() {
        let mut g = Growth::default();
        // 1 GiB charged before the driver call; NVML does not show it yet: one reading only.
        assert_eq!(g.update(518 * MIB, 1542 * MIB), 0);
        assert_eq!(g.update(1542 * MIB, 1542 * MIB), 0);
        // A free: NVML still shows it for one reading.
        assert_eq!(g.update(1542 * MIB, 518 * MIB), 0);
        assert_eq!(g.update(518 * MIB, 518 * MIB), 0);
        assert_eq!(g.charged, 0);
    }

    #[test]
    fn differences_within_nvml_rounding_are_ignored() {
        let mut g = Growth::default();
        assert_eq!(g.update(519 * MIB, 518 * MIB), 0);
        assert_eq!(g.update(519 * MIB, 518 * MIB), 0);
    }
}
