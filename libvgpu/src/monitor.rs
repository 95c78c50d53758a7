//! The monitor thread (started lazily by init, never by a constructor).
//!
//! Every `TICK`: recompute `caps::GATE` from the shared region (so `shrreg-tool --set-sm-limit`,
//! `--suspend` and the HAMi monitor's fields take effect in running processes within a tick),
//! flush pending limiter occupancy, close utilization windows and publish this process's
//! SM utilization and last-kernel time into the HAMi v1 fields the monitor exports. What it
//! publishes, when, and the growth it charges are `vgpu_core::policy::monitor`'s decisions.

use std::sync::atomic::{AtomicBool, Ordering::*};
use std::time::Duration;

use vgpu_core::limiter::calibrate::{Feed, Window};
use vgpu_core::limiter::tenants::{Reading, TenantSignal};
use vgpu_core::ledger::Growth;
use vgpu_core::policy::monitor::{self as policy, Adjust, GateStats};
use vgpu_core::region::MemKind;
use vgpu_core::MAX_DEVICES;

use crate::caps::{refresh_gate, CONTENDED, GATE, LAUNCHED, OTHERS_IDLE, SIBLINGS_ACTIVE};
use crate::runtime::{ProcState, Runtime};

/// Monitor period: bounds how late a runtime cap change or a suspend takes effect.
const TICK: Duration = Duration::from_millis(100);

static STARTED: AtomicBool = AtomicBool::new(false);

/// Start the monitor thread once per process (call again after fork in the child: threads do
/// not survive fork, so the child's flag is reset by `after_fork_child`).
pub(crate) fn start(rt: &'static Runtime) {
    if STARTED.swap(true, AcqRel) {
        return;
    }
    if let Some(ps) = rt.proc_if_ready() {
        // The node view too, before the program's next launch: the thread's first round may
        // come late on a loaded machine, and launches before it went ungated (a program that
        // never synchronizes queued ~2 s of 20 ms kernels beside a higher priority on the mock).
        crate::node::refresh(rt, ps, caps(rt, ps), false, GATE.load(Relaxed));
        refresh_gate(rt, ps);
    }
    vgpu_core::clock::calibrate();
    let spawned = std::thread::Builder::new().name("vgpu-monitor".into()).spawn(move || run(rt));
    if let Err(e) = spawned {
        // Without the thread, caps set later are not noticed; caps set now still apply. Nothing
        // would restore a short timeslice the first round set: the groups keep libcuda's.
        vgpu_core::error!("cannot start the monitor thread ({e}); run-time limit changes will not apply");
        GATE.store(true, Release);
        crate::tsg::apply(None);
    }
}

/// Device d's cap and soft cap, as the node file carries them.
fn caps<'a>(rt: &'a Runtime, ps: &'a ProcState) -> impl Fn(usize) -> (Option<u32>, Option<u32>) + 'a {
    move |d| {
        // Under `disable` the process runs uncapped: it says so (no cap), so that no one hands
        // out a spare it takes, or turns it does not follow.
        if rt.config.policy == vgpu_core::config::UtilPolicy::Disable {
            return (None, None);
        }
        let hard = ps.region.sm_limit(d).filter(|&p| p > 0 && p < 100);
        // A soft cap we may not use (policy `force`, or HAMi demands the hard cap) is not one to
        // be given a share of the spare GPU for.
        let soft_usable = rt.config.policy == vgpu_core::config::UtilPolicy::Default && ps.region.utilization_switch() != 1;
        (hard, ps.region.soft_sm_limit(d).filter(|_| soft_usable))
    }
}

pub(crate) fn after_fork_child() {
    STARTED.store(false, Release);
    vgpu_core::clock::reset_calibration();
    crate::launch::after_fork_child();
}

fn run(rt: &'static Runtime) {
    let mut stats = [GateStats::default(); MAX_DEVICES];
    let mut tick = 0u32;
    let mut nvml_handles: [Option<usize>; MAX_DEVICES] = [None; MAX_DEVICES];
    let mut nvml_seen_us = 0u64;
    let mut tenants = [TenantSignal::default(); MAX_DEVICES];
    let mut feeds = [Feed::default(); MAX_DEVICES];
    let mut growth = [Growth::default(); MAX_DEVICES];
    // Whether this process launched since NVML was last asked about a plain device.
    let mut launched_since_nvml = [false; MAX_DEVICES];
    let mut proc_looks = [policy::ProcLook::default(); MAX_DEVICES];
    let mut first = true;
    loop {
        // The first round runs at once: the node view (a higher priority's queue bound) and the
        // gate are in place before the program's first launches, not a tick into them (a
        // program that never synchronizes queued 0.5 s of 20 ms kernels on the mock by then).
        if !std::mem::take(&mut first) {
            std::thread::sleep(TICK);
        }
        tick = tick.wrapping_add(1);
        vgpu_core::clock::calibrate();
        // Re-read each tick: a forked child replaces the process state.
        let Some(ps) = rt.proc_if_ready() else { continue };
        let when = policy::schedule(tick);
        if when.upkeep {
            region_upkeep(ps);
        }
        let caps = caps(rt, ps);
        crate::node::refresh(rt, ps, &caps, LAUNCHED.load(Relaxed), GATE.load(Relaxed));
        for dev in 0..ps.devices.len() {
            crate::linger::set(dev, rt.config.linger_us, crate::node::lower_shares(dev), caps(dev).0);
        }
        refresh_gate(rt, ps);
        if !when.publish {
            continue;
        }
        let now = vgpu_core::clock::now_ns();
        let mut launched = [false; MAX_DEVICES];
        let mut gated = [false; MAX_DEVICES];
        crate::launch::flush_and_report(ps, |dev, fresh| {
            gated[dev] = true;
            let Some((busy, n)) = fresh else { return }; // gate busy: keep the last values
            if let Some(sample) = stats[dev].advance(busy, n, now) {
                ps.region.set_proc_sm_util(ps.slot, dev, sample.util_pct);
                launched[dev] = sample.launched;
            }
        });
        let any_launch = LAUNCHED.swap(false, AcqRel);
        for dev in 0..ps.devices.len() {
            let gating = gated[dev] && GATE.load(Relaxed);
            let plain = !GATE.load(Relaxed) && caps(dev) == (None, None) && !crate::node::on_node(dev);
            let nvml_due = policy::nvml_due(tick, plain);
            launched_since_nvml[dev] |= any_launch;
            if gating {
                ps.region.bucket(dev).roll_window(now);
            } else if nvml_due {
                // No gate, no occupancy tracking (the uncapped fast path measures nothing):
                // take utilization from NVML instead.
                let launched = std::mem::take(&mut launched_since_nvml[dev]);
                publish_nvml_util(ps, dev, nvml_handles[dev], launched, &mut proc_looks[dev], &mut nvml_seen_us);
            }
            let device_util = if nvml_due { observe_tenants(ps, dev, &mut nvml_handles[dev], &mut tenants[dev]) } else { None };
            let cap = if gating { crate::caps::effective_cap(rt, ps, dev) } else { None };
            let cap = policy::calibration_cap(cap, tenants[dev].alone);
            calibrate_charge(ps, dev, nvml_handles[dev], device_util, cap, &mut feeds[dev], now, policy::samples_due(tick));
            if when.growth {
                follow_growth(ps, dev, nvml_handles[dev], &mut growth[dev]);
            }
        }
        if GATE.load(Relaxed) {
            vgpu_core::debug!(
                "launch gate: {} lingers={} answered_ctx_syncs={} linger_gaps={} quick_gap_pct={:.1} withheld_spins={}",
                crate::launch::COUNTERS.summary(),
                crate::linger::QUEUED.load(Relaxed),
                crate::linger::ANSWERED.load(Relaxed),
                crate::linger::GAPS_NOTED.load(Relaxed),
                crate::linger::quick_gap_pct(),
                crate::linger::WITHHELD.load(Relaxed)
            );
        }
        let ext = ps.region.slot_ext(ps.slot);
        let (busy_ns, launches) = policy::totals(&stats);
        ext.busy_ns.store(busy_ns, Relaxed);
        ext.launches.store(launches, Relaxed);
        if any_launch || launched.iter().any(|&l| l) {
            ps.region.set_last_kernel_time(vgpu_core::clock::unix_seconds());
            ext.last_launch_ns.store(now, Relaxed);
        }
        let others = ps.region.live_slots().filter(|s| s.index() != ps.slot.index()).map(|s| ps.region.slot_ext(s).last_launch_ns.load(Relaxed));
        SIBLINGS_ACTIVE.store(policy::siblings_active(others, now), Relaxed);
    }
}

/// Compare the device's utilization (every tenant, from NVML) with our container's own, with
/// NVML's process list telling whether anyone else is there (`limiter::tenants`). Without NVML
/// nothing is flagged. Returns the device's utilization NVML reported.
fn observe_tenants(ps: &ProcState, dev: usize, handle: &mut Option<usize>, sig: &mut TenantSignal) -> Option<u32> {
    if handle.is_none() {
        let info = ps.devices.get(dev)?;
        *handle = crate::driver::nvml_handle_by_uuid(&info.uuid).map(|h| h as usize);
    }
    let h = (*handle)? as crate::ffi::nvmlDevice_t;
    let gpu = crate::driver::nvml_gpu_util(h)?;
    let listed = crate::driver::nvml_compute_processes(h).map(|p| p.len());
    crate::node::gpu_processes(dev, listed);
    sig.update(Reading {
        device_util: gpu,
        own_util: (ps.region.limiter(dev).util_centi_percent.load(Relaxed) / 100) as u32,
        device_processes: listed,
        own_processes: ps.region.live_slots().count(),
    });
    CONTENDED[dev].store(sig.contended, Relaxed);
    OTHERS_IDLE[dev].store(sig.others_idle, Relaxed);
    Some(gpu)
}

/// Feed NVML's device utilization under a cap to the charge calibration (`limiter::calibrate`)
/// while the container is alone on the device: NVML's own samples, each beside the busy time
/// measured over the period it covers, or this tick's reading (`snapshot`) where NVML gives no
/// samples. Each second, the container's scale moves towards NVML's busy time per measured ns.
/// `cap`: `policy::calibration_cap`'s verdict. `fetch`: this tick asks NVML for its samples
/// (`policy::samples_due`; every tick while the mean settles on a cap); on the others the
/// tick's busy time is only recorded, or the reading placed where NVML gives no samples.
#[allow(clippy::too_many_arguments)]
fn calibrate_charge(ps: &ProcState, dev: usize, handle: Option<usize>, snapshot: Option<u32>, cap: Result<u32, &str>, feed: &mut Feed, now: u64, fetch: bool) {
    let cap = match cap {
        Ok(cap) => cap,
        Err(why) => {
            if feed.mean.is_running() {
                vgpu_core::debug!("device {dev}: charge calibration paused ({why})");
            }
            feed.reset();
            return;
        }
    };
    let bucket = ps.region.bucket(dev);
    // Both clocks read together: their difference tells a stepped wall clock (`Feed::tick`).
    let (wall_us, mono_ns) = (vgpu_core::clock::unix_micros(), vgpu_core::clock::now_ns());
    let since_us = feed.tick(wall_us, mono_ns, bucket.s.total_busy_ns.load(Relaxed));
    let fetch = fetch || feed.mean.settling(cap, now);
    let samples = match fetch {
        true => handle.and_then(|h| crate::driver::nvml_gpu_util_samples(h as crate::ffi::nvmlDevice_t, since_us)),
        false if feed.on_readings => None,
        false => return, // the samples since come with the next fetch
    };
    let was_on_readings = feed.on_readings;
    let closed = feed.add(samples, snapshot, cap, now);
    if feed.on_readings != was_on_readings {
        let from = if feed.on_readings { "its utilization readings (no samples)" } else { "its samples" };
        vgpu_core::debug!("device {dev}: charge calibration reads NVML's {from}");
    }
    let Some((nvml_centi, own_centi)) = closed else { return };
    if let Some(scale) = bucket.calibrate(Window { nvml_centi, own_centi, cap, alone: true }, now) {
        vgpu_core::debug!(
            "device {dev}: NVML {:.1}% ({}) for {:.1}% measured under cap {cap}%: charge scale {scale}/1000",
            nvml_centi as f64 / 100.0,
            if feed.on_readings { "readings" } else { "samples" },
            own_centi as f64 / 100.0
        );
    }
}

/// Charge what the device holds for this process beyond the hook's own accounting (a context
/// grows after it was measured), from NVML's per-process figure, when NVML can see our process
/// (host PID known). Over the cap, later allocations are refused: the host stays under it.
fn follow_growth(ps: &ProcState, dev: usize, handle: Option<usize>, g: &mut Growth) {
    // Growth an allocation near the cap charged meanwhile is growth like this one's.
    g.charged += crate::physmem::take_near_cap_growth(dev);
    let Some(h) = handle else { return };
    let held = |pid| crate::physmem::held_for_process(dev, h as crate::ffi::nvmlDevice_t, pid);
    match policy::follow_growth(g, ps.region.slot_hostpid(ps.slot), held, || ps.region.proc_used(ps.slot, dev)) {
        Some(Adjust::Charge(b)) => ps.region.charge(ps.slot, dev, MemKind::Context, b),
        Some(Adjust::Release(b)) => ps.region.release(ps.slot, dev, MemKind::Context, b),
        None => {}
    }
}

/// Utilization without a cap: NVML's per-process samples when our host PID is known (shared PID
/// namespace), else the device's utilization while this process launched (exact when the
/// container is alone on the GPU). Published as the process's and the container's utilization.
fn publish_nvml_util(ps: &ProcState, dev: usize, handle: Option<usize>, launched: bool, look: &mut policy::ProcLook, seen_us: &mut u64) {
    let Some(h) = handle else { return };
    let h = h as crate::ffi::nvmlDevice_t;
    let hostpid = ps.region.slot_hostpid(ps.slot);
    let since = *seen_us;
    *seen_us = policy::nvml_next_since(vgpu_core::clock::unix_micros());
    let now = vgpu_core::clock::now_ns();
    let util = policy::nvml_util(
        hostpid,
        launched,
        // Not asked while nothing of ours can be running (`policy::ProcLook`): the ask stalls
        // other threads' allocations.
        |pid| Some(look.proc_util(launched, now, || crate::driver::nvml_process_sm_util(h, pid, since))),
        || crate::driver::nvml_gpu_util(h),
    );
    ps.region.set_proc_sm_util(ps.slot, dev, util.proc_util as u64);
    if let Some(u) = util.container_util {
        ps.region.limiter(dev).util_centi_percent.store(u as u64 * 100, Relaxed);
    }
}

/// On upkeep ticks: re-attach when the region file was deleted or replaced (one `lstat`), and
/// reap slots of processes that died without cleaning up (never waits for the table lock) so
/// lock-free readers such as HAMi's monitor see only live processes.
fn region_upkeep(ps: &ProcState) {
    if let Err(e) = ps.region.reattach_if_replaced() {
        vgpu_core::error!("the shared region was deleted or replaced and re-attaching failed ({e}); keeping the old one");
    }
    ps.region.reap_dead_nowait();
}
