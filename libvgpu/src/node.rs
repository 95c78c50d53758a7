//! Node-level coordination, the glue (`vgpu_core::node` holds the file format and the policy):
//! one entry per process in the node file of each of its GPUs, refreshed by the monitor thread
//! every tick; the launch gate asks `hold_now` (a higher-priority container has work) and tells
//! `declare` / `idle` (our work, for lower-priority containers).
//!
//! Nothing here runs on the ungated fast path: the gate is on for node reasons only while a
//! container of another priority shares one of our GPUs (`gating`). Without the directory
//! (`VGPU_NODE_DIR`, default `/tmp/vgpulock`) nothing is opened and nothing changes. A file that
//! cannot be used costs one warning per GPU and process, and today's behaviour on that GPU.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering::*};
use std::sync::Mutex;

use vgpu_core::node::{self, Entry, NodeError, NodeFile, Peers};
use vgpu_core::MAX_DEVICES;

use crate::runtime::{ProcState, Runtime};

/// This process's entry in one GPU's node file.
struct DevNode {
    file: NodeFile,
    idx: usize,
    /// The process that claimed it (a forked child claims its own).
    pid: u32,
    /// Our container's id (fixed for the entry's life: read by the launch path without a lock).
    container: u64,
    /// The entry as last written; the mutex also orders writes of the launch path and the monitor.
    entry: Mutex<Entry>,
    /// `entry.active_until_ns`, readable without the mutex.
    declared_ns: AtomicU64,
    /// When the launch path last read the file and found no reason to hold (clock::now_ns).
    clear_at_ns: AtomicU64,
}

static NODES: [AtomicPtr<DevNode>; MAX_DEVICES] = [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_DEVICES];
/// A higher-priority container shares device d: hold while it has work (`node::lower_queue_ns`
/// bounds our queue then, unless the GPU switches away from all our work by itself).
static DEFER: [AtomicBool; MAX_DEVICES] = [const { AtomicBool::new(false) }; MAX_DEVICES];
/// ... and it has work (`Peers::higher_working`): our queue stays bounded at the shared timeslice.
static HIGHER_WORKING: [AtomicBool; MAX_DEVICES] = [const { AtomicBool::new(false) }; MAX_DEVICES];
/// The monitor set our channel groups to `SHARED_TIMESLICE_US` (not the short one).
static SHARED: AtomicBool = AtomicBool::new(false);
/// A lower-priority container shares device d: declare our work.
static ANNOUNCE: [AtomicBool; MAX_DEVICES] = [const { AtomicBool::new(false) }; MAX_DEVICES];
/// How far our soft cap may reach on device d (`node::soft_ceiling`; `NO_CEILING`: the file does
/// not account for the GPU), and when a tick set it; meaningful while attached.
static SOFT_CEILING: [AtomicU32; MAX_DEVICES] = [const { AtomicU32::new(0) }; MAX_DEVICES];
static SOFT_CEILING_AT: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
const NO_CEILING: u32 = u32::MAX;
/// Compute processes NVML lists on device d (`NO_COUNT`: not known), from the monitor's readings.
static GPU_PROCESSES: [AtomicU32; MAX_DEVICES] = [const { AtomicU32::new(NO_COUNT) }; MAX_DEVICES];
const NO_COUNT: u32 = u32::MAX;
/// Per device: 0 not tried, 1 attached, 2 off (no directory, refused, full, failed).
static STATE: [AtomicU32; MAX_DEVICES] = [const { AtomicU32::new(0) }; MAX_DEVICES];
/// The pid that decided `STATE` (a forked child decides again).
static STATE_PID: AtomicU32 = AtomicU32::new(0);
/// Our part of each turn period on device d (`node::turn`): offset us << 32 | length us; 0 none.
static TURN: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
/// This process's latest gated launch on device d (`launched_on`): its entry says what it did
/// itself, not its container (`node::own_activity`).
static OWN_LAUNCH: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
/// Ticks since the last reap.
static TICKS: AtomicU64 = AtomicU64::new(0);
/// Re-attaches to device d's node file after it was deleted or replaced (`reattach`; a forked
/// child counts again). Each keeps the old file open (the launch path may be reading it).
static REATTACHES: [AtomicU32; MAX_DEVICES] = [const { AtomicU32::new(0) }; MAX_DEVICES];
const MAX_REATTACHES: u32 = 8;

/// Shorter hold re-checks are not worth a read: a launch found clear this recently goes.
const RECHECK_NS: u64 = 20_000;
/// A declaration is rewritten only when it moves by more than this.
const REDECLARE_NS: u64 = 500_000;

fn dev_node(dev: usize) -> Option<&'static DevNode> {
    let p = NODES.get(dev)?.load(Acquire);
    // SAFETY: pointers in NODES come from Box::leak and are never freed.
    (!p.is_null()).then(|| unsafe { &*p })
}

fn my_pid() -> u32 {
    std::process::id()
}

/// This process keeps an entry in `dev`'s node file (other containers may follow it).
pub(crate) fn on_node(dev: usize) -> bool {
    dev_node(dev).is_some()
}

/// A lower-priority container shares device `dev` (as of the last refresh).
pub(crate) fn lower_shares(dev: usize) -> bool {
    ANNOUNCE.get(dev).is_some_and(|a| a.load(Relaxed))
}

/// Some device needs the gate for node reasons (a container of another priority is there).
pub(crate) fn gating() -> bool {
    (0..MAX_DEVICES).any(|d| DEFER[d].load(Relaxed) || ANNOUNCE[d].load(Relaxed))
}

fn defer(dev: usize) -> bool {
    DEFER.get(dev).is_some_and(|d| d.load(Relaxed))
}

/// How far our soft cap may reach on `dev`, by the node view (`node::soft_ceiling`). `None`: no
/// node file for this GPU, or one that does not account for it (the soft cap follows NVML's
/// view, as without one). A value no tick refreshed within `STALE_NS` (our monitor is stuck, and
/// the others stopped counting us) gives no room above the hard cap.
pub(crate) fn soft_ceiling(dev: usize) -> Option<u32> {
    if STATE.get(dev)?.load(Relaxed) != 1 {
        return None;
    }
    let ceiling = SOFT_CEILING[dev].load(Relaxed);
    if ceiling == NO_CEILING {
        return None;
    }
    let fresh = vgpu_core::clock::fast_now_ns().saturating_sub(SOFT_CEILING_AT[dev].load(Relaxed)) <= node::STALE_NS;
    Some(if fresh { ceiling } else { 0 })
}

/// The monitor's reading of how many compute processes NVML lists on `dev`.
pub(crate) fn gpu_processes(dev: usize, listed: Option<usize>) {
    if let Some(a) = GPU_PROCESSES.get(dev) {
        a.store(listed.map_or(NO_COUNT, |n| n.min(NO_COUNT as usize - 1) as u32), Relaxed);
    }
}

/// What this process keeps queued at most on `dev` (`tsg::short`: a new channel group clears
/// it at once, so the bound is back before the monitor's next tick).
pub(crate) fn queue_bound(dev: usize) -> Option<u64> {
    let working = HIGHER_WORKING.get(dev).is_some_and(|w| w.load(Relaxed));
    node::lower_queue_ns(defer(dev), crate::tsg::short(), SHARED.load(Relaxed), working)
}

/// Our turn on `dev`, while capped containers of our priority take turns there.
pub(crate) fn turn(dev: usize) -> Option<node::Turn> {
    match TURN.get(dev)?.load(Relaxed) {
        0 => None,
        t => Some(node::Turn { offset_ns: (t >> 32) * 1000, len_ns: (t & 0xFFFF_FFFF) * 1000 }),
    }
}

/// Does a higher-priority container have work on `dev` right now? (Launch path, gated only.)
pub(crate) fn hold_now(rt: &Runtime, dev: usize, now: u64) -> bool {
    if !defer(dev) {
        return false;
    }
    let Some(n) = dev_node(dev) else { return false };
    if now.saturating_sub(n.clear_at_ns.load(Relaxed)) < RECHECK_NS {
        return false;
    }
    let Ok(slots) = n.file.read() else { return false }; // the monitor reports and detaches
    let container = n.container;
    let p = node::peers(&slots, container, rt.config.priority, now);
    // A request that arrives between ticks bounds our queue from the next launch on (only
    // raised here: a read older than the monitor's must not clear it; the tick clears it).
    if p.higher_working {
        HIGHER_WORKING[dev].store(true, Relaxed);
    }
    let hold = p.higher_busy;
    if !hold {
        n.clear_at_ns.store(now, Relaxed);
    }
    hold
}

/// Our entry's writes to the file (the debug log's `node_write_us`): a write on a launch or
/// synchronize path is a syscall on a file another filesystem may hold up.
pub(crate) static WRITES: vgpu_core::log::Spent = vgpu_core::log::Spent::new();

fn write_entry(n: &DevNode, f: impl FnOnce(&mut Entry)) {
    let mut e = n.entry.lock().unwrap_or_else(|p| p.into_inner());
    f(&mut e);
    n.declared_ns.store(e.active_until_ns, Relaxed);
    WRITES.time(|| n.file.write(n.idx, &e));
}

/// We have work queued on `dev` (estimated `queued_est_ns` of GPU time): tell lower priorities.
pub(crate) fn declare(dev: usize, now: u64, queued_est_ns: impl FnOnce() -> u64) {
    if !ANNOUNCE.get(dev).is_some_and(|a| a.load(Relaxed)) {
        return;
    }
    let Some(n) = dev_node(dev) else { return };
    let until = node::declare_until(now, queued_est_ns());
    let declared = n.declared_ns.load(Relaxed);
    if declared > now && until.abs_diff(declared) <= REDECLARE_NS {
        return;
    }
    write_entry(n, |e| e.active_until_ns = until);
}

/// Nothing of ours is queued on `dev` any more: lower priorities may go (after a short grace).
pub(crate) fn idle(dev: usize, now: u64) {
    if !ANNOUNCE.get(dev).is_some_and(|a| a.load(Relaxed)) {
        return;
    }
    let Some(n) = dev_node(dev) else { return };
    let until = now + node::IDLE_GRACE_NS;
    if n.declared_ns.load(Relaxed) > until {
        write_entry(n, |e| e.active_until_ns = until);
    }
}

/// Our container's id: that of the region file we share (a re-attach to a replacement moves it,
/// with the container's later processes); a private region's process is a container of its own.
fn container_id(ps: &ProcState) -> u64 {
    match ps.region.identity() {
        Some((dev, ino)) => node::container_id(dev, ino),
        None => node::container_id(u64::MAX, ps.pid as u64),
    }
}

fn detach(dev: usize) {
    DEFER[dev].store(false, Relaxed);
    HIGHER_WORKING[dev].store(false, Relaxed);
    ANNOUNCE[dev].store(false, Relaxed);
    SOFT_CEILING[dev].store(0, Relaxed);
    TURN[dev].store(0, Relaxed);
    STATE[dev].store(2, Relaxed);
    // The leaked entry keeps its lock until exit; readers ignore it once its heartbeat stops.
    NODES[dev].store(std::ptr::null_mut(), Release);
}

/// Open and claim this process's entry on each of its GPUs (once per process; a forked child
/// again). Every failure but a missing directory is one warning line.
fn attach(rt: &Runtime, ps: &ProcState) {
    if STATE_PID.swap(my_pid(), AcqRel) == my_pid() {
        return;
    }
    let container = container_id(ps);
    let now = vgpu_core::clock::now_ns();
    for dev in 0..MAX_DEVICES {
        NODES[dev].store(std::ptr::null_mut(), Release);
        DEFER[dev].store(false, Relaxed);
        HIGHER_WORKING[dev].store(false, Relaxed);
        ANNOUNCE[dev].store(false, Relaxed);
        SOFT_CEILING[dev].store(0, Relaxed);
        TURN[dev].store(0, Relaxed);
        STATE[dev].store(2, Relaxed);
        REATTACHES[dev].store(0, Relaxed);
        OWN_LAUNCH[dev].store(0, Relaxed); // a forked child's entry says what the child did
        attach_dev(rt, ps, dev, container, now);
    }
}

/// Open and claim our entry in device `dev`'s node file. Every failure but a missing directory
/// is one warning line.
fn attach_dev(rt: &Runtime, ps: &ProcState, dev: usize, container: u64, now: u64) {
    // A path is bytes: a value that is not UTF-8 is that directory, not the default.
    let dir = node::dir_from(std::env::var_os(node::DIR_ENV).as_deref());
    let (Some(info), Some(dir)) = (ps.devices.get(dev), dir.as_deref()) else { return };
    let file = match NodeFile::open(dir, &info.uuid, true) {
        Ok(f) => f,
        Err(NodeError::NoDir) => return,
        Err(NodeError::Refused(why)) => {
            vgpu_core::warn!("{why}");
            return;
        }
    };
    let idx = match file.claim(now) {
        Ok(Some(idx)) => idx,
        Ok(None) => {
            vgpu_core::warn!("node file {}: no free entry; node-level coordination is off for this GPU", file.path.display());
            return;
        }
        Err(why) => {
            vgpu_core::warn!("node file {}: {why}; node-level coordination is off for this GPU", file.path.display());
            return;
        }
    };
    let entry = Entry { container, priority: rt.config.priority, pid: my_pid(), heartbeat_ns: now, ..Entry::default() };
    let n = DevNode { file, idx, pid: my_pid(), container, entry: Mutex::new(entry), declared_ns: AtomicU64::new(0), clear_at_ns: AtomicU64::new(0) };
    n.file.write(idx, &entry);
    vgpu_core::debug!("node file {}: entry {idx}, container {container:016x}, priority {}", n.file.path.display(), rt.config.priority);
    NODES[dev].store(Box::into_raw(Box::new(n)), Release);
    STATE[dev].store(1, Relaxed);
}

/// Our node file's path names another file now (deleted by a `/tmp` cleaner or a tenant, or
/// replaced), or our container's id moved (its region file was replaced, and we re-attached to the
/// new one): give our entry up and claim one, with the id `container`, in the file at the path
/// (created when absent), as a newcomer would, without a line; left as we were we would see no
/// newcomer, nor they us, or our container would take turns with itself. At most
/// `MAX_REATTACHES` times per device (each keeps the old file open), then off for this GPU with
/// one line.
fn reattach(rt: &Runtime, ps: &ProcState, dev: usize, n: &DevNode, container: u64, now: u64) {
    n.file.clear(n.idx);
    detach(dev);
    if REATTACHES[dev].fetch_add(1, Relaxed) >= MAX_REATTACHES {
        vgpu_core::warn!("node file {}: deleted or replaced {MAX_REATTACHES} times; node-level coordination is off for this GPU", n.file.path.display());
        return;
    }
    attach_dev(rt, ps, dev, container, now);
}

/// Monitor tick: heartbeat our entries (cap, soft cap, utilization, latest launch), read the
/// others, set the flags the gate reads; reap entries of dead processes about once a second.
/// `launched`: this process launched since the monitor's last publish; `gated`: its launches go
/// through the gate (which dates them per GPU, `launched_on`).
pub(crate) fn refresh(rt: &Runtime, ps: &ProcState, caps: impl Fn(usize) -> (Option<u32>, Option<u32>), launched: bool, gated: bool) {
    attach(rt, ps);
    let now = vgpu_core::clock::now_ns();
    let reap = TICKS.fetch_add(1, Relaxed).is_multiple_of(10);
    let container = reap.then(|| container_id(ps));
    let ndev = ps.devices.len().min(MAX_DEVICES);
    let mut gpus: Vec<(u64, Option<Seen>)> = Vec::with_capacity(ndev);
    for dev in 0..ndev {
        let own_last = node::own_last_launch(OWN_LAUNCH[dev].load(Relaxed), launched, ndev == 1, gated, now);
        gpus.push((own_last, None));
        let Some(mut n) = dev_node(dev) else { continue };
        if n.pid != my_pid() {
            continue;
        }
        if let Some(c) = container.filter(|&c| c != n.container || n.file.replaced()) {
            reattach(rt, ps, dev, n, c, now);
            let Some(again) = dev_node(dev) else { continue };
            n = again;
        }
        let lim = ps.region.limiter(dev);
        let (cap, soft) = caps(dev);
        write_entry(n, |e| {
            e.heartbeat_ns = now;
            e.priority = rt.config.priority;
            e.cap = cap.unwrap_or(0);
            e.soft_cap = soft.unwrap_or(0);
            (e.last_launch_ns, e.util_centi) = node::own_activity(e.last_launch_ns, own_last, lim.util_centi_percent.load(Relaxed).min(10_000) as u32, now);
        });
        // Cut short under us (`: > file`): sized again (`NodeFile::repair`) and our entry
        // rewritten, as every owner does at its next tick; anything else is refused.
        let read = n.file.read().or_else(|why| if n.file.repair() { write_entry(n, |_| {}); n.file.read() } else { Err(why) });
        let slots = match read {
            Ok(s) => s,
            Err(why) => {
                vgpu_core::warn!("node file {}: {why}; node-level coordination is off for this GPU", n.file.path.display());
                detach(dev);
                continue;
            }
        };
        let container = n.container;
        let p: Peers = node::peers(&slots, container, rt.config.priority, now);
        DEFER[dev].store(p.higher, Relaxed);
        HIGHER_WORKING[dev].store(p.higher_working, Relaxed);
        let listed = match GPU_PROCESSES[dev].load(Relaxed) {
            NO_COUNT => None,
            n => Some(n as usize),
        };
        let ceiling = node::soft_ceiling(&slots, container, (cap.unwrap_or(0), soft.unwrap_or(0)), now, listed);
        let turn = node::turn(&slots, container, rt.config.priority, (cap, soft), ceiling.is_some(), now);
        TURN[dev].store(turn.map_or(0, |t| (t.offset_ns / 1000) << 32 | (t.len_ns / 1000).max(1)), Relaxed);
        ANNOUNCE[dev].store(p.lower, Relaxed);
        SOFT_CEILING[dev].store(ceiling.unwrap_or(NO_CEILING), Relaxed);
        SOFT_CEILING_AT[dev].store(vgpu_core::clock::fast_now_ns(), Relaxed);
        gpus[dev].1 = Some(Seen { higher: p.higher, slots, n });
        if reap {
            n.file.reap(Some(n.idx));
        }
    }
    // While a higher-priority container is on a GPU of ours, our channel groups give way quickly:
    // within the short timeslice when no other process with work on any of our GPUs would run it
    // too (two short contexts nearly stop each other), else within the shared one. A group that
    // does not run it leaves our queue bounded (`queue_bound`). The lock probes of `may_shorten`
    // only while a higher priority is there.
    let higher = gpus.iter().any(|(_, g)| g.as_ref().is_some_and(|g| g.higher));
    let views: Vec<node::GpuView> = gpus
        .iter()
        .map(|(own_last, g)| node::GpuView {
            higher: g.as_ref().is_some_and(|g| g.higher),
            active: *own_last != 0 && now.saturating_sub(*own_last) <= node::RECENT_NS,
            may: g.as_ref().filter(|_| higher).map(|g| may_shorten_on(rt.config.priority, g.n, &g.slots, now)),
        })
        .collect();
    let want = node::group_timeslice_us(&views);
    // The shared timeslice (bounded while the higher priority works) is declared before the
    // groups move to it and left after they moved away (`apply` reads them as not set while
    // they move): the queue is never unbounded at 500 us beside a working higher priority.
    let shared = want == Some(node::SHARED_TIMESLICE_US);
    if shared {
        SHARED.store(true, Relaxed);
    }
    crate::tsg::apply(want);
    if !shared {
        SHARED.store(false, Relaxed);
    }
}

/// One GPU's node file as a tick read it (per GPU of ours, with our latest launch there).
struct Seen<'a> {
    /// A live higher-priority container is there.
    higher: bool,
    slots: Vec<node::Slot>,
    n: &'a DevNode,
}

/// `node::may_shorten` on one GPU's entries, and only while our own entry reads back as we wrote
/// it (a tenant overwriting it could otherwise make us look idle to the others). Its declared
/// work is left out of the comparison: the launch path may have rewritten it since the read.
fn may_shorten_on(priority: i32, n: &DevNode, slots: &[node::Slot], now: u64) -> bool {
    let ours = *n.entry.lock().unwrap_or_else(|p| p.into_inner());
    let intact = matches!(slots.get(n.idx), Some(node::Slot::Used(e)) if Entry { active_until_ns: e.active_until_ns, ..ours } == *e);
    intact && node::may_shorten(slots, n.idx, priority, now, |i| n.file.owned_elsewhere(i))
}

/// The launch path (gated): this process launched on `dev` at `now`, or the monitor found work of
/// ours still queued or running there (kept to the millisecond).
pub(crate) fn launched_on(dev: usize, now: u64) {
    if let Some(a) = OWN_LAUNCH.get(dev) {
        if now.saturating_sub(a.load(Relaxed)) > 1_000_000 {
            a.store(now, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Our entry in a fresh node file of a temporary directory, written as `refresh` would.
    fn claimed(tag: &str, now: u64) -> DevNode {
        let dir = std::env::temp_dir().join(format!("vgpu-glue-node-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let file = NodeFile::open(&dir, "GPU-00000000-1111-2222-3333-444444444444", true).unwrap();
        let idx = file.claim(now).unwrap().unwrap();
        let entry = Entry { container: 7, priority: 1, pid: my_pid(), heartbeat_ns: now, last_launch_ns: now, ..Entry::default() };
        let n = DevNode { file, idx, pid: my_pid(), container: 7, entry: Mutex::new(entry), declared_ns: AtomicU64::new(0), clear_at_ns: AtomicU64::new(0) };
        n.file.write(idx, &entry);
        n
    }

    #[test]
    fn a_process_whose_own_entry_was_overwritten_does_not_shorten() {
        let now = vgpu_core::clock::now_ns();
        let n = claimed("overwritten", now);
        assert!(may_shorten_on(1, &n, &n.file.read().unwrap(), now), "alone, intact");
        // The launch path declared work after the read: still ours.
        write_entry(&n, |e| e.active_until_ns = now + 1_000_000);
        let before = n.file.read().unwrap();
        write_entry(&n, |e| e.active_until_ns = now + 2_000_000);
        assert!(may_shorten_on(1, &n, &before, now));
        // A tenant zeroed our entry (the file is writable by all): the others would see no work
        // of ours, so we must not be short beside them.
        let mut forged = n.file.read().unwrap();
        forged[n.idx] = node::Slot::Free;
        assert!(!may_shorten_on(1, &n, &forged, now));
        let mut idle = n.file.read().unwrap();
        idle[n.idx] = node::Slot::Used(Entry { last_launch_ns: 0, ..*n.entry.lock().unwrap() });
        assert!(!may_shorten_on(1, &n, &idle, now), "rewritten to look idle");
    }

    #[test]
    fn a_zeroed_slot_whose_owner_lives_counts_as_work() {
        let now = vgpu_core::clock::now_ns();
        let n = claimed("zeroed", now);
        // Another owner (its own open file: another process to the kernel's OFD locks) whose
        // entry a tenant zeroed.
        let dir = n.file.path.parent().unwrap().to_path_buf();
        let other = NodeFile::open(&dir, "GPU-00000000-1111-2222-3333-444444444444", true).unwrap();
        let j = other.claim(now).unwrap().unwrap();
        assert_ne!(j, n.idx);
        assert_eq!(n.file.read().unwrap()[j], node::Slot::Free);
        assert!(!may_shorten_on(1, &n, &n.file.read().unwrap(), now));
        drop(other); // its owner gone: the slot is nobody's
        assert!(may_shorten_on(1, &n, &n.file.read().unwrap(), now));
    }

    /// The flags are the process's: one test walks the cases in order.
    #[test]
    fn the_gate_is_on_only_beside_a_container_of_another_priority() {
        let clear = || {
            for d in 0..MAX_DEVICES {
                DEFER[d].store(false, Relaxed);
                ANNOUNCE[d].store(false, Relaxed);
            }
        };
        clear();
        assert!(!gating() && queue_bound(0).is_none(), "alone: the launch path is not gated");
        // A higher-priority container on GPU 1: our launches hold there, not on GPU 0.
        DEFER[1].store(true, Relaxed);
        assert!(gating() && defer(1) && !defer(0) && queue_bound(0).is_none());
        // No channel group of ours runs a timeslice we set (none here): bounded there, whether
        // the higher priority works or not and whichever timeslice the monitor chose.
        for (shared, working) in [(false, false), (true, false), (true, true)] {
            SHARED.store(shared, Relaxed);
            HIGHER_WORKING[1].store(working, Relaxed);
            assert_eq!(queue_bound(1), Some(node::LOWER_QUEUE_NS));
        }
        SHARED.store(false, Relaxed);
        HIGHER_WORKING[1].store(false, Relaxed);
        // Only a lower-priority container: our work is declared to it.
        DEFER[1].store(false, Relaxed);
        ANNOUNCE[0].store(true, Relaxed);
        assert!(gating() && queue_bound(0).is_none());
        clear();
    }
}
