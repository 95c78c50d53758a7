//! The process lifecycle, as explicit steps the hook layer takes around a policy call: above the
//! process state (`runtime`) and the monitor thread (`monitor`), so neither depends on the other.
//!
//! * [`ensure`] before a policy call: the runtime (phase 1, `runtime::ensure`); in a forked
//!   child, first the fork step: the monitor's and the launch gate's per-process state is reset
//!   (threads do not survive fork), the child registers its own slot (`Runtime::after_fork`),
//!   and its monitor thread starts.
//! * [`after_call`] after it: once the process state exists (phase 2, created by whichever policy
//!   first needed it, or right after `cuInit`), the monitor thread starts: one relaxed load per
//!   call afterwards.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::monitor;
use crate::runtime::{self, Runtime};

/// This process image started its monitor thread (reset in a forked child).
static MONITOR: AtomicBool = AtomicBool::new(false);

/// The runtime for a policy call (`None`: control disabled, pass through), after the fork step
/// when this is a forked child's first hooked call.
#[inline]
pub fn ensure() -> Option<&'static Runtime> {
    let rt = runtime::ensure()?;
    if runtime::take_forked() {
        fork_child(rt);
    }
    Some(rt)
}

/// After a policy call: start the monitor once the process state exists.
#[inline]
pub fn after_call(rt: &'static Runtime) {
    if !MONITOR.load(Ordering::Relaxed) {
        start_monitor(rt);
    }
}

#[cold]
fn start_monitor(rt: &'static Runtime) {
    if rt.proc_if_ready().is_some() && !MONITOR.swap(true, Ordering::AcqRel) {
        monitor::start(rt);
    }
}

/// Child side of fork: reset what died with the parent's threads, re-register, restart.
#[cold]
fn fork_child(rt: &'static Runtime) {
    monitor::after_fork_child();
    crate::physmem::after_fork_child();
    crate::caps::after_fork_child();
    MONITOR.store(false, Ordering::Release);
    rt.after_fork();
    start_monitor(rt);
}
