//! What the launch gate asks on every gated launch, as pure functions: the share a device may use
//! now (hard cap, or the soft cap while nobody else needs the GPU), whether HAMi's priority
//! protocol pauses a lower-priority container, and whether launches take the gated path at all.

use crate::config::UtilPolicy;

/// The share a device may use now, `None` for no cap. `hard`: the live region's cap (0 or 100
/// and above: none). The soft cap, when higher, applies under the default policy while HAMi's
/// monitor does not demand the hard cap (`utilization_switch() == 1`) and the soft cap is allowed
/// (no other tenant busy: `soft_allowed()`). `Force` always applies the hard cap; `Disable` never
/// caps. The readings are taken only when the decision needs them (this runs on every gated
/// launch): without a hard cap, under `Force`, or with the switch set, nothing more is read.
pub fn effective_cap(policy: UtilPolicy, hard: impl FnOnce() -> Option<u32>, utilization_switch: impl FnOnce() -> i32,
    soft_allowed: impl FnOnce() -> bool, soft: impl FnOnce() -> Option<u32>) -> Option<u32> {
    if policy == UtilPolicy::Disable {
        return None;
    }
    let hard = hard().filter(|&p| p > 0 && p < 100)?;
    if policy == UtilPolicy::Default && utilization_switch() != 1 && soft_allowed() {
        if let Some(soft) = soft().filter(|&s| s > hard) {
            return (soft < 100).then_some(soft);
        }
    }
    Some(hard)
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

    /// `effective_cap` on plain values.
    fn cap(policy: UtilPolicy, hard: Option<u32>, soft: Option<u32>, switch: i32, allowed: bool) -> Option<u32> {
        effective_cap(policy, || hard, || switch, || allowed, || soft)
    }

    #[test]
    fn nothing_is_read_that_the_decision_does_not_need() {
        let unread = || -> Option<u32> { panic!("read") };
        assert_eq!(effective_cap(Disable, unread, || panic!("read"), || panic!("read"), unread), None);
        assert_eq!(effective_cap(Default, || None, || panic!("read"), || panic!("read"), unread), None);
        assert_eq!(effective_cap(Force, || Some(30), || panic!("read"), || panic!("read"), unread), Some(30));
        assert_eq!(effective_cap(Default, || Some(30), || 1, || panic!("read"), unread), Some(30));
        assert_eq!(effective_cap(Default, || Some(30), || 0, || false, unread), Some(30));
    }

    #[test]
    fn the_hard_cap_unless_the_soft_cap_may_apply() {
        assert_eq!(cap(Default, Some(30), None, 0, true), Some(30));
        assert_eq!(cap(Default, Some(30), Some(60), 0, true), Some(60), "nobody else busy: the soft cap");
        assert_eq!(cap(Default, Some(30), Some(60), 0, false), Some(30), "another tenant busy");
        assert_eq!(cap(Default, Some(30), Some(60), 1, true), Some(30), "HAMi demands the hard cap");
        assert_eq!(cap(Default, Some(30), Some(100), 0, true), None, "a soft cap of 100 is no cap");
        assert_eq!(cap(Default, Some(30), Some(20), 0, true), Some(30), "a lower soft cap is ignored");
        assert_eq!(cap(Force, Some(30), Some(60), 0, true), Some(30));
        assert_eq!(cap(Disable, Some(30), Some(60), 0, true), None);
        for none in [None, Some(0), Some(100), Some(150)] {
            assert_eq!(cap(Default, none, Some(60), 0, true), None, "{none:?}");
        }
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
            switch in -1i32..3, allowed in any::<bool>()) {
            for policy in [Default, Force, Disable] {
                if let Some(c) = cap(policy, hard, soft, switch, allowed) {
                    prop_assert!(c > 0 && c < 100);
                    let h = hard.unwrap();
                    prop_assert!(c >= h, "never below the hard cap");
                    if policy == Force || switch == 1 || !allowed {
                        prop_assert_eq!(c, h);
                    }
                }
            }
        }
    }
}
