//! What the launch gate asks on every gated launch: the share each device may use now, whether
//! the container is paused, and the flags the monitor thread keeps fresh for it. Below both the
//! gate (`launch`) and the monitor (`monitor`), so neither depends on the other for them.

use std::sync::atomic::{AtomicBool, Ordering::*};
use std::time::Duration;

use vgpu_core::limiter::CapPercent;
use vgpu_core::policy::caps as policy;
use vgpu_core::MAX_DEVICES;

use crate::runtime::{ProcState, Runtime};

/// Some device has a cap, or the container is suspended/paused: launches take the slow path.
pub(crate) static GATE: AtomicBool = AtomicBool::new(false);
/// A launch happened since the monitor last looked (last-kernel-time without a clock read).
pub(crate) static LAUNCHED: AtomicBool = AtomicBool::new(false);

/// The launch path: note a launch. Written only when it is not already noted (at most once per
/// monitor publish, which clears it), so threads launching side by side can share the line with
/// `GATE` read-only instead of taking it from each other at every launch.
#[inline]
pub(crate) fn note_launch() {
    if !LAUNCHED.load(Relaxed) {
        LAUNCHED.store(true, Relaxed);
    }
}
/// Another tenant is busy on device d (set by the monitor from NVML).
pub(crate) static CONTENDED: [AtomicBool; MAX_DEVICES] = [const { AtomicBool::new(false) }; MAX_DEVICES];
/// No other tenant is busy on device d: the soft cap may apply (set by the monitor).
pub(crate) static OTHERS_IDLE: [AtomicBool; MAX_DEVICES] = [const { AtomicBool::new(false) }; MAX_DEVICES];
/// Another process of the container launched lately (set by the monitor; until it has looked,
/// assumed so: `Meter::siblings_active`).
pub(crate) static SIBLINGS_ACTIVE: AtomicBool = AtomicBool::new(true);

/// A forked child has launched nothing and has not looked at the other tenants yet: what the
/// parent's monitor set goes (the child's monitor sets it again). `GATE` stays: it follows the
/// configuration, which the child shares, and clearing it would let the child launch uncapped.
pub(crate) fn after_fork_child() {
    LAUNCHED.store(false, Relaxed);
    SIBLINGS_ACTIVE.store(true, Relaxed);
    for d in 0..MAX_DEVICES {
        CONTENDED[d].store(false, Relaxed);
        OTHERS_IDLE[d].store(false, Relaxed);
    }
}

/// This process said that the container is suspended: once per suspension, not per held launch
/// (cleared by the monitor once it is resumed).
static SAID_SUSPENDED: AtomicBool = AtomicBool::new(false);

/// Gate launches when any device has a cap or the container is paused (`policy::caps::gate_on`).
pub(crate) fn refresh_gate(rt: &Runtime, ps: &ProcState) {
    let suspended = ps.region.suspended();
    if !suspended && SAID_SUSPENDED.load(Relaxed) {
        SAID_SUSPENDED.store(false, Relaxed);
    }
    let paused = suspended || low_priority_paused(rt, ps);
    let capped = (0..ps.devices.len()).any(|d| effective_cap(rt, ps, d).is_some());
    GATE.store(policy::gate_on(paused, capped, crate::node::gating()), Release);
}

/// HAMi's priority protocol (`policy::caps::low_priority_paused`) on the region's live value.
fn low_priority_paused(rt: &Runtime, ps: &ProcState) -> bool {
    policy::low_priority_paused(ps.region.recent_kernel(), rt.config.priority)
}

/// The share `dev` may use right now (`policy::caps::effective_cap`): the live region's caps, the
/// soft cap as far as the other tenants leave room (the node file's view when there is one: our
/// part of what their caps leave; else NVML's: all of it while no other tenant uses the GPU).
pub(crate) fn effective_cap(rt: &Runtime, ps: &ProcState, dev: usize) -> CapPercent {
    policy::effective_cap(
        rt.config.policy,
        || ps.region.sm_limit(dev),
        || ps.region.utilization_switch(),
        || vgpu_core::node::soft_ceiling_now(crate::node::soft_ceiling(dev), OTHERS_IDLE[dev].load(Relaxed)),
        || ps.region.soft_sm_limit(dev),
    )
}

/// The container is suspended, or paused for a higher priority: launches wait (`wait_while_paused`).
pub(crate) fn paused(rt: &Runtime, ps: &ProcState) -> bool {
    ps.region.suspended() || low_priority_paused(rt, ps)
}

/// Hold a launch while the container is suspended (`shrreg-tool --suspend`: until resumed) or
/// paused by the priority protocol (at most `max_ns`, so a collective cannot deadlock on it).
/// Returns how long the priority pause held it (a suspension is the operator's, and not
/// counted): the launch's later holds get only what is left of the same bound.
pub(crate) fn wait_while_paused(rt: &Runtime, ps: &ProcState, max_ns: u64) -> u64 {
    if !paused(rt, ps) {
        return 0; // the common case: no clock read
    }
    let (mut last, mut held) = (vgpu_core::clock::now_ns(), 0u64);
    let mut said = false;
    loop {
        let now = vgpu_core::clock::now_ns();
        let suspended = ps.region.suspended();
        if !suspended {
            held += now.saturating_sub(last);
        }
        last = now;
        let priority_hold = low_priority_paused(rt, ps) && held < max_ns;
        if !suspended && !priority_hold {
            return held.min(max_ns);
        }
        if suspended {
            // Held until `--resume`, however long: said at the default level, so a container left
            // suspended (its controller gone) does not hang silently.
            if !SAID_SUSPENDED.swap(true, Relaxed) {
                let path = ps.region.path().map_or_else(String::new, |p| format!(" {}", p.display()));
                vgpu_core::warn!("launches held: the container is suspended (shrreg-tool --suspend on the shared region{path}); they go on at shrreg-tool --resume");
            }
        } else if !said {
            vgpu_core::info!("launches held: lower priority");
            said = true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
