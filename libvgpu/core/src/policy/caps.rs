//! What the launch gate asks on every gated launch, as pure functions: the share a device may use
//! now (hard cap, or up to the soft cap as far as the others with work leave room), how soft caps
//! share the GPU's spare time, whether HAMi's priority protocol pauses a lower-priority container,
//! and whether launches take the gated path at all.

use crate::config::UtilPolicy;

/// The share a device may use now, `None` for no cap. `hard`: the live region's cap (0 or 100
/// and above: none). The soft cap, when higher, applies under the default policy while HAMi's
/// monitor does not demand the hard cap (`utilization_switch() == 1`), as far as
/// `soft_ceiling()` allows (100: all of it, nobody else has work; at or below the hard cap:
/// none; between: our part of what the others leave, `soft_shares`). `Force` always applies the
/// hard cap; `Disable` never caps. The readings are taken only when the decision needs them
/// (this runs on every gated launch): without a hard cap, under `Force`, or with the switch set,
/// nothing more is read; without a soft cap above the hard cap, not the ceiling (a clock read).
pub fn effective_cap(policy: UtilPolicy, hard: impl FnOnce() -> Option<u32>, utilization_switch: impl FnOnce() -> i32,
    soft_ceiling: impl FnOnce() -> u32, soft: impl FnOnce() -> Option<u32>) -> Option<u32> {
    if policy == UtilPolicy::Disable {
        return None;
    }
    let hard = hard().filter(|&p| p > 0 && p < 100)?;
    if policy == UtilPolicy::Default && utilization_switch() != 1 {
        if let Some(soft) = soft().filter(|&s| s > hard) {
            let cap = soft.min(soft_ceiling());
            if cap > hard {
                return (cap < 100).then_some(cap);
            }
        }
    }
    Some(hard)
}

/// What a hard cap reserves of the GPU for `soft_shares`: itself (1..=99), else all of it.
pub fn reserved(hard: u32) -> u32 {
    if (1..100).contains(&hard) {
        hard
    } else {
        100
    }
}

/// Soft caps made work-conserving (`CUDA_CORE_SOFT_LIMIT`): containers with work on one GPU,
/// each with a hard cap (1..=99; anything else: none, which takes the whole GPU) and a soft cap
/// (above the hard cap, 100 and above: the whole GPU; anything else: none). Each keeps its hard
/// cap; what the hard caps leave of the GPU goes in equal parts to those with a soft cap, none
/// past its soft cap (what one cannot take goes on to the others; points that do not divide
/// go one each, in `caps`' order, which every caller keeps by container id). Each one's share,
/// in `caps`' order (100: the whole GPU). Without soft caps, or when the hard caps take the
/// whole GPU, the hard caps themselves.
pub fn soft_shares(caps: &[(u32, u32)]) -> Vec<u32> {
    let mut share: Vec<u32> = caps.iter().map(|&(h, _)| reserved(h)).collect();
    let reserved = share.iter().map(|&h| h as u64).sum::<u64>();
    let mut spare = 100u64.saturating_sub(reserved) as u32;
    let mut room: Vec<u32> = caps.iter().map(|&(h, s)| if (1..100).contains(&h) && s > h { s.min(100) - h } else { 0 }).collect();
    while spare > 0 {
        let open: Vec<usize> = (0..caps.len()).filter(|&i| room[i] > 0).collect();
        if open.is_empty() {
            break;
        }
        let each = (spare / open.len() as u32).max(1);
        for i in open {
            let give = each.min(room[i]).min(spare);
            share[i] += give;
            room[i] -= give;
            spare -= give;
        }
    }
    share
}

/// HAMi's monitor writes `recent_kernel = -1` to tell containers of lower priority (a priority
/// number above 0) to hold their launches.
pub fn low_priority_paused(recent_kernel: i32, priority: i32) -> bool {
    recent_kernel < 0 && priority > 0
}

/// Launches take the gated path when the container is suspended or paused, any device has a cap,
/// or the node file needs the gate (a container of another priority shares a GPU).
pub fn gate_on(paused: bool, any_capped: bool, node_gating: bool) -> bool {
    paused || any_capped || node_gating
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use UtilPolicy::*;

    /// `effective_cap` on plain values (`ceiling`: what the soft cap may reach now).
    fn cap(policy: UtilPolicy, hard: Option<u32>, soft: Option<u32>, switch: i32, ceiling: u32) -> Option<u32> {
        effective_cap(policy, || hard, || switch, || ceiling, || soft)
    }

    #[test]
    fn nothing_is_read_that_the_decision_does_not_need() {
        let unread = || -> Option<u32> { panic!("read") };
        assert_eq!(effective_cap(Disable, unread, || panic!("read"), || panic!("read"), unread), None);
        assert_eq!(effective_cap(Default, || None, || panic!("read"), || panic!("read"), unread), None);
        assert_eq!(effective_cap(Force, || Some(30), || panic!("read"), || panic!("read"), unread), Some(30));
        assert_eq!(effective_cap(Default, || Some(30), || 1, || panic!("read"), unread), Some(30));
        assert_eq!(effective_cap(Default, || Some(30), || 0, || panic!("read"), || None), Some(30));
        assert_eq!(effective_cap(Default, || Some(30), || 0, || panic!("read"), || Some(20)), Some(30));
        assert_eq!(effective_cap(Default, || Some(30), || 0, || 0, || Some(60)), Some(30));
    }

    #[test]
    fn the_hard_cap_unless_the_soft_cap_may_apply() {
        assert_eq!(cap(Default, Some(30), None, 0, 100), Some(30));
        assert_eq!(cap(Default, Some(30), Some(60), 0, 100), Some(60), "nobody else busy: the soft cap");
        assert_eq!(cap(Default, Some(30), Some(60), 0, 0), Some(30), "another tenant busy, no room left");
        assert_eq!(cap(Default, Some(30), Some(60), 0, 45), Some(45), "our part of the room the others leave");
        assert_eq!(cap(Default, Some(30), Some(60), 1, 100), Some(30), "HAMi demands the hard cap");
        assert_eq!(cap(Default, Some(30), Some(100), 0, 100), None, "a soft cap of 100 is no cap");
        assert_eq!(cap(Default, Some(30), Some(100), 0, 70), Some(70));
        assert_eq!(cap(Default, Some(30), Some(20), 0, 100), Some(30), "a lower soft cap is ignored");
        assert_eq!(cap(Force, Some(30), Some(60), 0, 100), Some(30));
        assert_eq!(cap(Disable, Some(30), Some(60), 0, 100), None);
        for none in [None, Some(0), Some(100), Some(150)] {
            assert_eq!(cap(Default, none, Some(60), 0, 100), None, "{none:?}");
        }
    }

    #[test]
    fn soft_caps_share_what_the_hard_caps_leave() {
        assert_eq!(soft_shares(&[]), Vec::<u32>::new());
        assert_eq!(soft_shares(&[(25, 60)]), [60], "alone: its soft cap");
        assert_eq!(soft_shares(&[(25, 60), (25, 60)]), [50, 50], "two alike split the spare half");
        assert_eq!(soft_shares(&[(25, 60), (30, 0)]), [60, 30], "a neighbour without a soft cap keeps its hard one");
        assert_eq!(soft_shares(&[(25, 60), (0, 0)]), [25, 100], "an uncapped neighbour takes the GPU: hard caps");
        assert_eq!(soft_shares(&[(25, 30), (25, 100)]), [30, 70], "what one cannot take goes to the other");
        assert_eq!(soft_shares(&[(10, 100), (10, 100), (10, 100)]), [34, 33, 33], "points that do not divide, in order");
        assert_eq!(soft_shares(&[(50, 0), (50, 0)]), [50, 50]);
        assert_eq!(soft_shares(&[(60, 90), (60, 90)]), [60, 60], "overcommitted hard caps: nothing to share");
    }

    #[test]
    fn only_a_lower_priority_pauses_and_only_when_told() {
        assert!(low_priority_paused(-1, 1));
        assert!(!low_priority_paused(-1, 0), "priority 0 is never paused");
        assert!(!low_priority_paused(0, 1));
        assert!(!low_priority_paused(5, 3));
    }

    #[test]
    fn the_gate_is_off_only_when_nothing_needs_it() {
        assert!(!gate_on(false, false, false));
        assert!(gate_on(true, false, false) && gate_on(false, true, false) && gate_on(false, false, true));
    }

    proptest! {
        #[test]
        fn a_cap_is_always_a_share_and_force_never_exceeds_the_hard_cap(
            hard in proptest::option::of(0u32..200), soft in proptest::option::of(0u32..200),
            switch in -1i32..3, ceiling in 0u32..=100) {
            for policy in [Default, Force, Disable] {
                if let Some(c) = cap(policy, hard, soft, switch, ceiling) {
                    prop_assert!(c > 0 && c < 100);
                    let h = hard.unwrap();
                    prop_assert!(c >= h, "never below the hard cap");
                    prop_assert!(c == h || c <= ceiling, "never past the ceiling");
                    if policy == Force || switch == 1 || ceiling <= h {
                        prop_assert_eq!(c, h);
                    }
                }
            }
        }

        #[test]
        fn soft_shares_keep_every_hard_cap_and_use_the_spare(caps in proptest::collection::vec((0u32..120, 0u32..120), 0..8)) {
            let shares = soft_shares(&caps);
            prop_assert_eq!(shares.len(), caps.len());
            let hard = |h: u32| if (1..100).contains(&h) { h } else { 100 };
            let reserved: u32 = caps.iter().map(|&(h, _)| hard(h)).sum();
            for (&(h, s), &got) in caps.iter().zip(&shares) {
                prop_assert!(got >= hard(h), "below its hard cap: {:?} -> {:?}", caps, shares);
                prop_assert!(got == hard(h) || got <= s.min(100), "past its soft cap: {:?} -> {:?}", caps, shares);
            }
            if reserved >= 100 || caps.iter().all(|&(h, s)| !(1..100).contains(&h) || s <= h) {
                prop_assert_eq!(&shares, &caps.iter().map(|&(h, _)| hard(h)).collect::<Vec<_>>(), "nothing to share");
            } else {
                let total: u32 = shares.iter().sum();
                prop_assert!(total <= 100, "more than the GPU: {:?} -> {:?}", caps, shares);
                // Work-conserving: spare left over only when every soft cap is reached.
                let all_reached = caps.iter().zip(&shares).all(|(&(h, s), &got)| !(1..100).contains(&h) || s <= h || got == s.min(100));
                prop_assert!(total == 100 || all_reached, "spare left unused: {:?} -> {:?}", caps, shares);
            }
        }
    }
}
