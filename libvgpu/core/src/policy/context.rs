//! Context memory: what a new context is charged (from NVML readings around its creation), when
//! one that does not fit is refused, and the per-process bookkeeping of primary, created and green
//! contexts that says when a context's charge goes.

use crate::ledger::accounted_size;
use crate::region::ReserveError;
use crate::MAX_DEVICES;
use std::collections::HashMap;

/// Largest context charge we believe a measurement for.
pub const MAX_CONTEXT_BYTES: u64 = 4 << 30;

/// Bytes to charge for a context given NVML's used memory of the device before and after its
/// creation: the difference (rounded up to the 2 MiB the driver maps), else `default` (no NVML,
/// a negative or implausibly large difference).
pub fn context_charge(before: Option<u64>, after: Option<u64>, default: u64) -> u64 {
    match (before, after) {
        (Some(b), Some(a)) if a >= b && a - b <= MAX_CONTEXT_BYTES => accounted_size(a - b),
        _ => accounted_size(default),
    }
}

/// The context's size from NVML's figure for this very process (exact, immune to other tenants):
/// `after` minus `before` (not listed before the process's first context on the device: nothing
/// held there yet); `None` when NVML does not list the process or the difference is implausible.
pub fn own_growth(before: Option<u64>, after: Option<u64>) -> Option<u64> {
    after.map(|a| a.saturating_sub(before.unwrap_or(0))).filter(|&b| b <= MAX_CONTEXT_BYTES)
}

/// What a module load made the device hold (its code and globals, and the context's growth at
/// its first load: an H100's primary context grows from 518 to 537 MiB), from the process's own
/// NVML figure before and after, else the device's used memory, which other processes may move
/// meanwhile: believed only up to `MAX_MODULE_GUESS_BYTES`. Nothing when neither tells (the
/// monitor's NVML growth charge catches up later).
pub fn module_charge(own_before: Option<u64>, own_after: Option<u64>, device_before: Option<u64>, device_after: Option<u64>) -> u64 {
    if let Some(a) = own_after {
        return accounted_size(a.saturating_sub(own_before.unwrap_or(0)));
    }
    match (device_before, device_after) {
        (Some(b), Some(a)) if a > b && a - b <= MAX_MODULE_GUESS_BYTES => accounted_size(a - b),
        _ => 0,
    }
}

/// Largest module charge taken from the device-wide figure (a context's growth and a typical
/// module's globals fit; more is more likely another process's allocation).
pub const MAX_MODULE_GUESS_BYTES: u64 = 256 << 20;

/// Within this much of the cap, an allocation first asks NVML whether the device holds more for
/// the process than the region charges (a context's growth the hook could not see: lazy module
/// loading grows a context at its first launch). Larger than any growth seen (19-32 MiB on an
/// H100), so the growth is charged before the cap can be crossed by it.
pub const NEAR_CAP_BYTES: u64 = 256 << 20;

/// Is a reservation that brought the container's usage to `used` under `limit` near the cap?
pub fn near_cap(used: u64, limit: u64) -> bool {
    limit.saturating_sub(used) < NEAR_CAP_BYTES
}

/// What the device holds for the process beyond its charges, to charge now: NVML's figure for
/// the process (`held`) over what the region charges it (`charged`), less `in_flight` (reserved,
/// not yet allocated: NVML cannot show it yet). Differences under 2 MiB are NVML's rounding.
pub fn unseen_growth(held: Option<u64>, charged: u64, in_flight: u64) -> u64 {
    let Some(held) = held else { return 0 };
    match held.saturating_sub(charged.saturating_sub(in_flight)) {
        d if d < 2 << 20 => 0,
        d => d,
    }
}

/// The device's used memory before this process's first context on it, to measure the process's
/// holdings against later: only when NVML listed no compute process there (`procs_before`), so
/// all the growth since is the process's own while it stays the only one.
pub fn device_base(procs_before: Option<usize>, used_before: Option<u64>) -> Option<u64> {
    (procs_before == Some(0)).then_some(used_before).flatten()
}

/// Most a device holds for a process beyond NVML's figure for it that we believe is the
/// process's (an H100: ~5.6 MiB per context and a primary context's 19 MiB growth). More than
/// this is someone else's: a process NVML does not list as a compute process.
pub const MAX_UNLISTED_BYTES: u64 = 256 << 20;

/// What the device holds for the process: NVML's figure for it (`own`), or the device's growth
/// since `base` (`device_used - base`) when the process is the only one NVML lists there and that
/// growth is larger by at most `MAX_UNLISTED_BYTES`: a real device keeps memory for every
/// context outside the process's figure. `None` when NVML does not list the process.
pub fn held_for_process(own: Option<u64>, device_used: Option<u64>, base: Option<u64>, only_process: bool) -> Option<u64> {
    let own = own?;
    let grown = match (device_used, base) {
        (Some(used), Some(base)) if only_process => used.saturating_sub(base),
        _ => return Some(own),
    };
    Some(if grown > own && grown - own <= MAX_UNLISTED_BYTES { grown } else { own })
}

/// What a new context is charged, and from which reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Charge {
    pub bytes: u64,
    /// From NVML's per-process figure: NVML sees our PID (the host PID is the container's).
    pub own: bool,
}

/// The best of the readings: the process's own growth, else the device's, else `default`.
pub fn charge(own: Option<u64>, device_before: Option<u64>, device_after: Option<u64>, default: u64) -> Charge {
    match own {
        Some(b) => Charge { bytes: accounted_size(b), own: true },
        None => Charge { bytes: context_charge(device_before, device_after, default), own: false },
    }
}

/// What to do with a context whose charge the cap refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// A cap smaller than one context (a fail-closed 0 included) can never hold it: charge it
    /// anyway and let every allocation be refused, rather than fail the program before it can
    /// even ask the device anything.
    ChargeAnyway,
    /// Give the context back and answer `CUDA_ERROR_OUT_OF_MEMORY`, as a full GPU does: processes
    /// and contexts starting late cannot push the container over its cap.
    OutOfMemory,
}

pub fn on_refused(bytes: u64, e: &ReserveError) -> Refused {
    match *e {
        ReserveError::OverLimit { limit, .. } if bytes > limit => Refused::ChargeAnyway,
        _ => Refused::OutOfMemory,
    }
}

/// The context whose allocations a green context's destruction frees (its own handle when the
/// driver could not say).
pub fn green_alloc_ctx(ctx: u64, green: u64) -> u64 {
    if ctx != 0 { ctx } else { green }
}

/// Context bookkeeping: every context is charged its device memory while it lives (the primary
/// context of a device from its first retain to its last release, created and green contexts
/// from creation to destruction).
#[derive(Debug, Default)]
pub struct Contexts {
    pub primary_refs: [u32; MAX_DEVICES],
    /// The primary context's handle per device (0 = none seen).
    pub primary_ctx: [usize; MAX_DEVICES],
    /// Created and green contexts -> (device index, bytes charged as MemKind::Context).
    pub created: HashMap<usize, (usize, u64)>,
    /// Loaded modules -> (device index, bytes charged as MemKind::Context, their context).
    pub modules: HashMap<usize, (usize, u64, u64)>,
    /// Bytes charged for the primary context per device (0 = none charged).
    pub charged: [u64; MAX_DEVICES],
    /// Whether the primary context's charge exists (a measured 0 is still a charge).
    pub active: [bool; MAX_DEVICES],
}

impl Contexts {
    /// Forget the modules of context `ctx` (gone with it); returns their (device, bytes).
    pub fn drain_modules(&mut self, ctx: u64) -> Vec<(usize, u64)> {
        let gone: Vec<usize> = self.modules.iter().filter(|(_, m)| m.2 == ctx).map(|(&k, _)| k).collect();
        gone.into_iter().filter_map(|k| self.modules.remove(&k)).map(|(d, b, _)| (d, b)).collect()
    }

    /// Whether a retain of `dev`'s primary context creates it (and must be measured and charged);
    /// a further reference costs nothing.
    pub fn primary_needs_charge(&self, dev: usize) -> bool {
        self.primary_refs[dev] == 0
    }

    /// A successful `cuDevicePrimaryCtxRetain` of `dev` that returned `ctx`, charged `bytes`.
    pub fn primary_retained(&mut self, dev: usize, bytes: u64, ctx: Option<usize>) {
        self.primary_refs[dev] = self.primary_refs[dev].saturating_add(1);
        self.charged[dev] = self.charged[dev].saturating_add(bytes);
        self.active[dev] = true;
        if let Some(c) = ctx {
            self.primary_ctx[dev] = c;
        }
    }

    /// A successful release (`reset`: a reset, which drops every reference) of `dev`'s primary
    /// context. When no reference is left, the primary context is gone: returns its charge and
    /// handle, to release with everything allocated in it.
    pub fn primary_released(&mut self, dev: usize, reset: bool) -> Option<(u64, usize)> {
        self.primary_refs[dev] = if reset { 0 } else { self.primary_refs[dev].saturating_sub(1) };
        if self.primary_refs[dev] > 0 || !self.active[dev] {
            return None;
        }
        self.active[dev] = false;
        Some((std::mem::take(&mut self.charged[dev]), std::mem::take(&mut self.primary_ctx[dev])))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    const MIB: u64 = 1 << 20;

    #[test]
    fn module_loads_are_charged_from_the_best_reading() {
        // The process's own figure wins, even when the device moved more (another process).
        assert_eq!(module_charge(Some(518 * MIB), Some(537 * MIB), Some(1000 * MIB), Some(2000 * MIB)), 20 * MIB);
        // Listed only after the load: all of it is the load's.
        assert_eq!(module_charge(None, Some(19 * MIB), None, None), 20 * MIB);
        // The device's figure, within reason; a fall or a jump beyond the guess bound: nothing.
        assert_eq!(module_charge(None, None, Some(100 * MIB), Some(119 * MIB)), 20 * MIB);
        assert_eq!(module_charge(None, None, Some(100 * MIB), Some(90 * MIB)), 0);
        assert_eq!(module_charge(None, None, Some(0), Some(MAX_MODULE_GUESS_BYTES + 1)), 0);
        assert_eq!(module_charge(None, None, None, Some(50 * MIB)), 0);
    }

    #[test]
    fn a_destroyed_context_takes_its_modules_with_it() {
        let mut c = Contexts::default();
        c.modules.insert(1, (0, 20 * MIB, 7));
        c.modules.insert(2, (0, 4 * MIB, 7));
        c.modules.insert(3, (1, 2 * MIB, 8));
        let mut gone = c.drain_modules(7);
        gone.sort();
        assert_eq!(gone, vec![(0, 4 * MIB), (0, 20 * MIB)]);
        assert_eq!(c.modules.len(), 1);
        assert!(c.drain_modules(7).is_empty());
    }

    #[test]
    fn charge_rules() {
        assert_eq!(context_charge(Some(100 * MIB), Some(620 * MIB), 512 * MIB), 520 * MIB);
        assert_eq!(context_charge(Some(0), Some(3 * MIB), 512 * MIB), 4 * MIB); // 2 MiB pages
        assert_eq!(context_charge(Some(5), Some(5), 512 * MIB), 0); // measured nothing
        assert_eq!(context_charge(None, Some(5), 512 * MIB), 512 * MIB); // no NVML
        assert_eq!(context_charge(Some(10 * MIB), Some(MIB), 512 * MIB), 512 * MIB); // negative
        assert_eq!(context_charge(Some(0), Some(8 << 30), 512 * MIB), 512 * MIB); // implausible
    }

    #[test]
    fn own_reading_wins_over_the_device_reading() {
        // NVML lists us after the creation only (first context on the device).
        assert_eq!(own_growth(None, Some(500 * MIB)), Some(500 * MIB));
        assert_eq!(own_growth(Some(100 * MIB), Some(600 * MIB)), Some(500 * MIB));
        assert_eq!(own_growth(Some(100 * MIB), None), None); // not listed: no own figure
        assert_eq!(own_growth(None, Some(5 << 30)), None); // implausible
        // Another tenant allocated meanwhile: the device grew by 2 GiB, we by 500 MiB.
        let own = own_growth(Some(0), Some(500 * MIB));
        assert_eq!(charge(own, Some(0), Some(2548 * MIB), 512 * MIB), Charge { bytes: 500 * MIB, own: true });
        assert_eq!(charge(None, Some(0), Some(501 * MIB), 512 * MIB), Charge { bytes: 502 * MIB, own: false });
        assert_eq!(charge(None, None, None, 64 * MIB), Charge { bytes: 64 * MIB, own: false });
    }

    #[test]
    fn a_context_is_refused_only_under_a_cap_that_could_hold_it() {
        let over = |limit| ReserveError::OverLimit { used: 900 * MIB, limit, requested: 500 * MIB };
        assert_eq!(on_refused(500 * MIB, &over(1024 * MIB)), Refused::OutOfMemory);
        assert_eq!(on_refused(500 * MIB, &over(0)), Refused::ChargeAnyway); // fail-closed cap 0
        assert_eq!(on_refused(500 * MIB, &over(400 * MIB)), Refused::ChargeAnyway);
        assert_eq!(on_refused(500 * MIB, &ReserveError::BadDevice(3)), Refused::OutOfMemory);
        assert_eq!(on_refused(500 * MIB, &ReserveError::Lock("x".into())), Refused::OutOfMemory);
    }

    #[test]
    fn green_contexts_free_their_context_or_themselves() {
        assert_eq!(green_alloc_ctx(0x10, 0x20), 0x10);
        assert_eq!(green_alloc_ctx(0, 0x20), 0x20);
    }

    #[test]
    fn primary_context_charge_lives_from_first_retain_to_last_release() {
        let mut c = Contexts::default();
        assert!(c.primary_needs_charge(1));
        c.primary_retained(1, 500 * MIB, Some(0xabc));
        assert!(!c.primary_needs_charge(1));
        c.primary_retained(1, 0, Some(0xabc));
        assert_eq!(c.primary_released(1, false), None);
        assert_eq!(c.primary_released(1, false), Some((500 * MIB, 0xabc)));
        assert_eq!(c.primary_released(1, false), None); // already gone
        // A reset drops every reference at once; a measured 0 is a charge too.
        c.primary_retained(2, 0, None);
        c.primary_retained(2, 0, None);
        assert_eq!(c.primary_released(2, true), Some((0, 0)));
        assert!(c.primary_needs_charge(2));
    }

    proptest! {
        #[test]
        fn charges_are_rounded_and_bounded(before in proptest::option::of(0u64..(1 << 40)),
                                           after in proptest::option::of(0u64..(1 << 40)),
                                           default in 0u64..(1 << 32)) {
            let c = context_charge(before, after, default);
            prop_assert_eq!(c, accounted_size(c));
            prop_assert!(c <= accounted_size(MAX_CONTEXT_BYTES.max(default)));
            if let (Some(b), Some(a)) = (before, after) {
                if a >= b && a - b <= MAX_CONTEXT_BYTES {
                    prop_assert!(c >= a - b);
                }
            }
        }

        #[test]
        fn every_retain_and_release_sequence_releases_the_charge_once(ops in proptest::collection::vec(0u8..3, 0..40)) {
            // 0 = retain, 1 = release, 2 = reset, as the driver allows them (no release of nothing).
            let mut c = Contexts::default();
            let (mut refs, mut charged, mut released) = (0u32, 0u64, 0u64);
            for op in ops {
                match op {
                    0 => {
                        let bytes = if c.primary_needs_charge(0) { 100 } else { 0 };
                        charged += bytes;
                        c.primary_retained(0, bytes, Some(7));
                        refs += 1;
                    }
                    _ if refs == 0 => {}
                    r => {
                        refs = if r == 2 { 0 } else { refs - 1 };
                        if let Some((b, ctx)) = c.primary_released(0, r == 2) {
                            prop_assert_eq!(refs, 0);
                            prop_assert_eq!(ctx, 7);
                            released += b;
                        }
                    }
                }
                prop_assert_eq!(c.primary_refs[0], refs);
                prop_assert_eq!(charged - released, if refs > 0 { 100 } else { 0 });
            }
        }
    }

    #[test]
    fn growth_nvml_shows_beyond_the_charges_is_charged_near_the_cap() {
        const MIB: u64 = 1 << 20;
        assert_eq!(device_base(Some(0), Some(483 * MIB)), Some(483 * MIB));
        assert_eq!(device_base(Some(1), Some(483 * MIB)), None, "another process's memory is in it");
        assert_eq!(device_base(None, Some(483 * MIB)), None);
        assert_eq!(device_base(Some(0), None), None);
        // H100: 518 MiB listed for the process, the device grew 524 since the base.
        let held = |own, used, only| held_for_process(own, used, Some(483 * MIB), only);
        assert_eq!(held(Some(518 * MIB), Some(1007 * MIB), true), Some(524 * MIB));
        assert_eq!(held(Some(518 * MIB), Some(1007 * MIB), false), Some(518 * MIB), "not alone: own figure");
        assert_eq!(held(Some(518 * MIB), Some(900 * MIB), true), Some(518 * MIB), "never less than NVML lists");
        assert_eq!(held(Some(518 * MIB), Some(2000 * MIB), true), Some(518 * MIB), "an unlisted process's memory");
        assert_eq!(held(None, Some(1007 * MIB), true), None);
        assert_eq!(held_for_process(Some(518 * MIB), Some(1007 * MIB), None, true), Some(518 * MIB));
        assert!(!near_cap(600 * MIB, 1024 * MIB));
        assert!(near_cap(900 * MIB, 1024 * MIB));
        assert!(near_cap(1100 * MIB, 1024 * MIB));
        // The process holds 20 MiB more than charged (the 4 MiB just reserved is not on the
        // device yet): charge 20.
        assert_eq!(unseen_growth(Some(1020 * MIB), 1004 * MIB, 4 * MIB), 20 * MIB);
        // NVML's rounding, an unlisted process, in-flight reservations: nothing.
        assert_eq!(unseen_growth(Some(1001 * MIB), 1004 * MIB, 4 * MIB), 0);
        assert_eq!(unseen_growth(None, 1004 * MIB, 4 * MIB), 0);
        assert_eq!(unseen_growth(Some(500 * MIB), 1004 * MIB, 4 * MIB), 0);
    }
}
