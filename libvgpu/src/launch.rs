//! Launch gate: the FFI side of the compute limiter (`vgpu_core::limiter` holds the policy).
//!
//! Every kernel/graph launch shim calls `before_launch` then `after_launch`; every synchronize
//! shim calls `after_sync`. With no cap and no suspend anywhere, `before_launch` is two relaxed
//! loads (and a store at most once per monitor publish; no lock, no clock, no syscall): `GATE` is refreshed by the monitor
//! thread from the shared region, so a cap set at run time takes effect within its period.
//!
//! Gated, a launch waits while the policy says so (nothing locked meanwhile), and a timing event
//! is recorded after it (and before it, when its stream was idle) so the policy learns when the
//! launch really ran on the GPU.

use std::cell::Cell;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering::*};
use std::sync::Mutex;

use vgpu_core::limiter::eventclock::EventClock;
use vgpu_core::limiter::{hold_for, Clock, EventState, Events, Meter, Step, StreamKey};
use vgpu_core::log::Spent;
use vgpu_core::MAX_DEVICES;

use crate::caps::{note_launch, CONTENDED, GATE, SIBLINGS_ACTIVE};
use crate::driver;
use crate::ffi::{CUcontext, CUevent, CUfunction, CUresult, CUDA_ERROR_NOT_READY, CUDA_SUCCESS, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD};
use crate::runtime::{ProcState, Runtime};

pub use crate::ffi::CUstream;

/// Counters for the debug log (`LIBCUDA_LOG_LEVEL=4`): where gated launches went.
pub(crate) struct GateCounters {
    pub gated: AtomicU64,
    pub untracked_stream: AtomicU64,
    pub captured: AtomicU64,
    pub events: AtomicU64,
    pub record_failed: AtomicU64,
    pub lost: AtomicU64,
    /// Time launches spent held by the gate (ns).
    pub held_ns: AtomicU64,
    /// With the debug log on: time spent in the gated path before launches (held time
    /// included), after them, in the linger's part of synchronizes and after synchronizes,
    /// each with its longest single stretch; and how many synchronizes.
    pub before: Spent,
    pub after: Spent,
    pub linger: Spent,
    pub sync: Spent,
    pub syncs: AtomicU64,
    /// Of those, time in the driver's event calls: records, and queries with elapsed times.
    pub record: Spent,
    pub query: Spent,
}
pub(crate) static COUNTERS: GateCounters = GateCounters {
    gated: AtomicU64::new(0),
    untracked_stream: AtomicU64::new(0),
    captured: AtomicU64::new(0),
    events: AtomicU64::new(0),
    record_failed: AtomicU64::new(0),
    lost: AtomicU64::new(0),
    held_ns: AtomicU64::new(0),
    before: Spent::new(),
    after: Spent::new(),
    linger: Spent::new(),
    sync: Spent::new(),
    syncs: AtomicU64::new(0),
    record: Spent::new(),
    query: Spent::new(),
};

impl GateCounters {
    pub(crate) fn summary(&self) -> String {
        let g = |a: &AtomicU64| a.load(Relaxed);
        format!(
            "gated={} untracked_stream={} captured={} events={} record_failed={} lost={} held_us={} {} {} syncs={} {} {} {} {} {}",
            g(&self.gated),
            g(&self.untracked_stream),
            g(&self.captured),
            g(&self.events),
            g(&self.record_failed),
            g(&self.lost),
            g(&self.held_ns) / 1000,
            self.before.show("before"),
            self.after.show("after"),
            g(&self.syncs),
            self.linger.show("linger"),
            self.sync.show("sync"),
            self.record.show("record"),
            self.query.show("query"),
            crate::node::WRITES.show("node_write")
        )
    }
}

/// What `before_launch` decided, handed back to `after_launch`.
#[derive(Clone, Copy, Default)]
pub struct LaunchTicket {
    /// The gated launch (`None` = fast path or untracked, nothing to do afterwards).
    gated: Option<Gated>,
}

#[derive(Clone, Copy)]
struct Gated {
    dev: usize,
    key: StreamKey,
    /// The stream as the driver's event calls must name it.
    record_on: CUstream,
    ctx: usize,
    start_ev: Option<Ev>,
    submit_ns: u64,
    /// The launch's kind (`vgpu_core::limiter::kinds`; 0: unknown).
    kind: u64,
}

/// Called by every launch shim before the real launch. May block (bounded) when over budget.
/// `ptsz`: the shim is a `_ptsz` entry point (stream 0 = the per-thread default stream).
/// `kind`: what the launch runs (`vgpu_core::limiter::kinds`; 0: unknown), so its
/// queued work is valued at what that kind took before; worked out only when the gate is on.
/// `kernels`: it runs kernels (a kernel or graph launch, not a copy or memset).
#[inline]
pub fn before_launch(stream: CUstream, ptsz: bool, kernels: bool, kind: impl FnOnce() -> u64) -> LaunchTicket {
    if !GATE.load(Relaxed) {
        note_launch();
        return LaunchTicket::default();
    }
    COUNTERS.before.time(|| gated_before(stream, ptsz, kind(), Launcher::Program { kernels })).unwrap_or_default()
}

/// Who launches through the gate.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Launcher {
    /// The program: waits as the gate says (bounded), and its launch is new work to linger after;
    /// one that runs kernels is what a linger waits for (a copy or memset reading a result back
    /// right after a synchronize is not a next request).
    Program { kernels: bool },
    /// The linger's spin, from inside a synchronize: never waits (where the program's launch would
    /// wait, there is no spin), and is not the program's work.
    Spin,
}

/// Called by every launch shim after the real launch with its result.
#[inline]
pub fn after_launch(ticket: LaunchTicket, result: i32) {
    if let Some(g) = ticket.gated {
        COUNTERS.after.time(|| gated_after(g, result));
    }
}

/// Launch one thread of `f` on `stream` through the gate, as a program's launch would go (the
/// linger's spin: lower priorities see it as our work, and the meter times it).
/// Where the gate would hold it (a suspended or paused container, a higher priority's work, a
/// budget), it is not launched: `CUDA_ERROR_NOT_READY`.
pub fn gated_one_thread(f: CUfunction, stream: CUstream, params: &mut [*mut std::ffi::c_void]) -> CUresult {
    let ticket = match GATE.load(Relaxed) {
        true => match COUNTERS.before.time(|| gated_before(stream, false, 0, Launcher::Spin)) {
            Some(t) => t,
            None => return CUDA_ERROR_NOT_READY,
        },
        false => LaunchTicket::default(),
    };
    let r = driver::launch_one_thread(f, stream, params);
    after_launch(ticket, r);
    r
}

/// Called by synchronize shims before the real call: when it was entered (0: no gate, no
/// clock read), so that a synchronize that blocked shows how long our work ran.
#[inline]
pub fn sync_entered() -> u64 {
    if GATE.load(Relaxed) { vgpu_core::clock::fast_now_ns() } else { 0 }
}

/// Called by synchronize shims (stream/context/event synchronize) after the real call returned.
#[inline]
pub fn after_sync(entered: u64) {
    if GATE.load(Relaxed) {
        COUNTERS.sync.time(|| gated_sync(entered));
    }
}

// ---- streams -------------------------------------------------------------------------------


thread_local! {
    static TID: Cell<u64> = const { Cell::new(0) };
}

fn thread_id() -> u64 {
    TID.with(|t| {
        if t.get() == 0 {
            // SAFETY: gettid has no preconditions.
            t.set(unsafe { libc::gettid() } as u64);
        }
        t.get()
    })
}

/// The stream a launch went to: its identity for the meter, the handle to record events on,
/// and its context. `None`: not trackable (no context, or a stream of another context).
fn resolve_stream(stream: CUstream, ptsz: bool) -> Option<(StreamKey, CUstream, CUcontext)> {
    let h = stream as usize;
    let current = match driver::current_context() {
        0 => return None,
        c => c as CUcontext,
    };
    if h == CU_STREAM_PER_THREAD || (h == 0 && ptsz) {
        let key = (current as u64) ^ (thread_id() << 40) ^ CU_STREAM_PER_THREAD as u64;
        return Some((key, CU_STREAM_PER_THREAD as CUstream, current));
    }
    if h == 0 || h == CU_STREAM_LEGACY {
        return Some(((current as u64) ^ CU_STREAM_LEGACY as u64, std::ptr::null_mut(), current));
    }
    let ctx = driver::stream_context(stream)?;
    // Events must be recorded in the stream's context, which launches use as the current one.
    (ctx == current).then_some((h as u64, stream, ctx))
}

// ---- timing events ---------------------------------------------------------------------------

/// One of our timing events, with the index of its context's clock, the host time its record
/// began (it cannot have completed earlier) and whether its stream was idle then (it completed
/// right after).
#[derive(Clone, Copy, PartialEq)]
struct Ev {
    ev: CUevent,
    ctx: usize,
    recorded_ns: u64,
    idle: bool,
}

/// Per-context mapping of event times to host time: an anchor event whose host time is known;
/// an event's time is the anchor's plus `cuEventElapsedTime(anchor, event)`, kept from drifting
/// by each event's own bracket (`EventClock`).
struct CtxClock {
    ctx: CUcontext,
    anchor: CUevent,
    clock: EventClock,
    /// Recycled timing events of this context.
    free: Vec<CUevent>,
}

/// How long the first anchor may take to complete on our own idle stream.
const ANCHOR_WAIT_NS: u64 = 20_000_000;

impl CtxClock {
    /// Anchor a context: record an event on a private idle stream and see it complete.
    fn new(ctx: CUcontext) -> Option<CtxClock> {
        let stream = driver::stream_create_nonblocking()?;
        let anchor = driver::event_create(true)?;
        if driver::event_record(anchor, stream) != CUDA_SUCCESS {
            return None;
        }
        let t0 = vgpu_core::clock::now_ns();
        loop {
            let now = vgpu_core::clock::now_ns();
            match driver::event_query(anchor) {
                CUDA_SUCCESS => return Some(CtxClock { ctx, anchor, clock: EventClock::new(now), free: Vec::new() }),
                CUDA_ERROR_NOT_READY if now - t0 < ANCHOR_WAIT_NS => std::thread::yield_now(),
                _ => return None,
            }
        }
    }

    fn event(&mut self) -> Option<CUevent> {
        self.free.pop().or_else(|| driver::event_create(true))
    }
}

/// The events of one device of this process.
#[derive(Default)]
struct EventClocks {
    ctxs: Vec<CtxClock>,
    /// Records that failed (logged once).
    failures: u64,
    /// The calling thread's capture mode while relaxed (`relax`), to restore (`settle`).
    relaxed: Option<Option<std::ffi::c_int>>,
}

impl EventClocks {
    /// Event calls run in relaxed capture mode: in the default (global) mode, another thread's
    /// stream capture would make them fail and invalidate that capture. Switched lazily, on the
    /// first event call of a gate step, so a launch that makes none pays nothing.
    fn relax(&mut self) {
        if self.relaxed.is_none() {
            self.relaxed = Some(driver::relax_capture());
        }
    }

    /// Back to the caller's capture mode after a gate step (if it was switched).
    fn settle(&mut self) {
        if let Some(prev) = self.relaxed.take() {
            driver::restore_capture(prev);
        }
    }

    fn ctx_index(&mut self, ctx: CUcontext) -> Option<usize> {
        if let Some(i) = self.ctxs.iter().position(|c| c.ctx == ctx) {
            return Some(i);
        }
        self.relax();
        let c = CtxClock::new(ctx)?;
        self.ctxs.push(c);
        Some(self.ctxs.len() - 1)
    }

    /// Record a timing event on `stream` (of context `ctx`); `idle`: nothing is queued there.
    fn record(&mut self, ctx: usize, stream: CUstream, idle: bool) -> Option<Ev> {
        self.relax();
        let c = self.ctxs.get_mut(ctx)?;
        let ev = c.event()?;
        let recorded_ns = vgpu_core::clock::fast_now_ns();
        if COUNTERS.record.time(|| driver::event_record(ev, stream)) == CUDA_SUCCESS {
            COUNTERS.events.fetch_add(1, Relaxed);
            return Some(Ev { ev, ctx, recorded_ns, idle });
        }
        c.free.push(ev);
        COUNTERS.record_failed.fetch_add(1, Relaxed);
        self.failures += 1;
        if self.failures == 1 {
            vgpu_core::warn!("cannot record a timing event; launches are charged up to the next synchronize");
        }
        None
    }
}

impl Events for EventClocks {
    type Ev = Ev;

    fn recorded_ns(&self, e: Ev) -> Option<u64> {
        Some(e.recorded_ns)
    }

    fn poll(&mut self, e: Ev) -> EventState {
        self.relax();
        let Some(c) = self.ctxs.get_mut(e.ctx) else { return EventState::Lost };
        match COUNTERS.query.time(|| driver::event_query(e.ev)) {
            CUDA_SUCCESS => {}
            CUDA_ERROR_NOT_READY => return EventState::Pending,
            _ => {
                COUNTERS.lost.fetch_add(1, Relaxed);
                return EventState::Lost; // e.g. the context was destroyed: never wait on it
            }
        }
        let seen_ns = vgpu_core::clock::fast_now_ns();
        let Some(ms) = COUNTERS.query.time(|| driver::event_elapsed_ms(c.anchor, e.ev)) else {
            COUNTERS.lost.fetch_add(1, Relaxed);
            return EventState::Lost;
        };
        let t = c.clock.host_time((ms as f64 * 1e6) as i64, e.recorded_ns, seen_ns, e.idle);
        if c.clock.reanchor_due(t) {
            // Chain the anchor forward: this event's host time is as good as the anchor's.
            let old = std::mem::replace(&mut c.anchor, e.ev);
            c.clock.reanchor(t);
            c.free.push(old);
        }
        EventState::Done(t)
    }

    fn release(&mut self, e: Ev) {
        if let Some(c) = self.ctxs.get_mut(e.ctx) {
            if c.anchor != e.ev {
                c.free.push(e.ev);
            }
        }
    }
}

// ---- per-device gates ------------------------------------------------------------------------

struct SysClock;

impl Clock for SysClock {
    fn now_ns(&self) -> u64 {
        vgpu_core::clock::fast_now_ns()
    }
    fn sleep_ns(&mut self, ns: u64) {
        vgpu_core::clock::sleep_ns(ns)
    }
    fn pause(&mut self) {
        std::thread::yield_now()
    }
}

/// This process's limiter state for one device.
#[derive(Default)]
struct DeviceGate {
    meter: Meter<Ev>,
    events: EventClocks,
}

// SAFETY: the raw handles are plain driver handles usable from any thread of the process.
unsafe impl Send for DeviceGate {}

/// Per-device gates, allocated on first gated launch. Atomic pointers (not a static Mutex) so
/// a forked child can drop its parent's state without touching a lock another thread held.
static GATES: [AtomicPtr<Mutex<DeviceGate>>; MAX_DEVICES] = [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_DEVICES];

fn gate(dev: usize) -> &'static Mutex<DeviceGate> {
    let p = GATES[dev].load(Acquire);
    if !p.is_null() {
        // SAFETY: pointers in GATES come from Box::leak and are never freed.
        return unsafe { &*p };
    }
    let fresh = Box::into_raw(Box::new(Mutex::new(DeviceGate::default())));
    match GATES[dev].compare_exchange(std::ptr::null_mut(), fresh, AcqRel, Acquire) {
        // SAFETY: we just published it; never freed.
        Ok(_) => unsafe { &*fresh },
        Err(existing) => {
            // SAFETY: `fresh` was never shared; `existing` is a leaked, live gate.
            drop(unsafe { Box::from_raw(fresh) });
            unsafe { &*existing }
        }
    }
}

/// Attempts to take a busy gate, yielding between them, before sleeping on it.
const LOCK_TRIES: u32 = 1000;

/// The gate's lock. Held for microseconds (a few driver event calls), so a thread that finds it
/// taken yields and tries again rather than sleeping on it: two threads released by the budget
/// at once launched 25 us apart (median) on an H100 when the second slept, 16 us when it yields,
/// and kernels that run side by side uncapped run alone for that long each round.
fn lock(dev: usize) -> std::sync::MutexGuard<'static, DeviceGate> {
    let m = gate(dev);
    crate::guard::try_lock_yielding(m, LOCK_TRIES).unwrap_or_else(|| m.lock().unwrap_or_else(|p| p.into_inner()))
}

/// In a forked child: forget the parent's gates (their events belong to the parent's contexts,
/// and a parent thread may have held their locks at fork time). Leaks them on purpose.
pub(crate) fn after_fork_child() {
    for g in &GATES {
        g.store(std::ptr::null_mut(), Release);
    }
}

/// The container's device index of this launch: with one visible device no driver call is
/// needed; otherwise the device of the calling thread's current context.
fn launch_device(ps: &ProcState) -> Option<usize> {
    if ps.devices.len() == 1 {
        return Some(0);
    }
    let dev = driver::current_device()?;
    (dev >= 0 && (dev as usize) < MAX_DEVICES).then_some(dev as usize)
}

/// `None`: the spin would have to wait (`Launcher::Spin` only).
#[inline(never)]
fn gated_before(stream: CUstream, ptsz: bool, kind: u64, who: Launcher) -> Option<LaunchTicket> {
    note_launch();
    if let Launcher::Program { kernels } = who {
        crate::linger::note_launch(kernels);
        // A context synchronize answered from the list of streams waits only for those it has.
        if !matches!(stream as usize, 0 | CU_STREAM_LEGACY | CU_STREAM_PER_THREAD) {
            crate::streams::launched_on(stream);
        }
    }
    let Some((rt, ps)) = state() else { return Some(LaunchTicket::default()) };
    let Some(dev) = launch_device(ps) else { return Some(LaunchTicket::default()) };
    if who == Launcher::Spin && crate::caps::paused(rt, ps) {
        return None;
    }
    crate::node::launched_on(dev, vgpu_core::clock::fast_now_ns());
    // One bound for all of a launch's waits (`MAX_HOLD_NS`): the pause's share, then the gate's.
    let paused_ns = crate::caps::wait_while_paused(rt, ps, vgpu_core::limiter::MAX_HOLD_NS);
    // A launch into a capture does not run now (the graph's launch is gated instead).
    COUNTERS.gated.fetch_add(1, Relaxed);
    if driver::stream_capturing(stream) {
        COUNTERS.captured.fetch_add(1, Relaxed);
        return Some(LaunchTicket::default());
    }
    let Some((key, record_on, ctx)) = resolve_stream(stream, ptsz) else {
        COUNTERS.untracked_stream.fetch_add(1, Relaxed);
        return Some(LaunchTicket::default());
    };
    let bucket = ps.region.bucket(dev);
    let contended = CONTENDED[dev].load(Relaxed);
    let siblings = SIBLINGS_ACTIVE.load(Relaxed);
    let owner = ps.slot.index() as u64 + 1;
    // When the gate says go, the same lock and capture-mode switch also prepare the launch.
    let mut prepared = None;
    let mut step = |now| {
        // Read at every look: a cap raised while the launch is held (shrreg-tool, a soft cap given
        // the spare) shortens the hold (`Meter::gate`).
        let cap = crate::caps::effective_cap(rt, ps, dev);
        // A higher-priority container has work on this GPU (node file): wait, bounded as any hold.
        if crate::node::hold_now(rt, dev, now) {
            // Held, the container saves no more than a burst: it must not make up for the hold
            // by running flat out in the higher-priority tenant's gaps.
            if let Some(c) = cap.filter(|c| *c < 100) {
                bucket.refill_to(now, c, vgpu_core::limiter::BURST_NS);
            }
            return Step::Wait(vgpu_core::node::HOLD_POLL_NS);
        }
        let mut g = lock(dev);
        let g = &mut *g;
        g.meter.contended = contended;
        g.meter.siblings_active = siblings;
        g.meter.owner = owner;
        g.meter.queue_bound_ns = crate::node::queue_bound(dev);
        // Capped containers of our priority take turns (node file): outside ours, wait.
        let turn = crate::node::turn(dev);
        g.meter.burst_ns = turn.map(|t| t.len_ns as i64);
        // The bucket saves our share while the others run (up to our part's length), so it
        // does not cut our part short; work spilling past it still runs into debt.
        let step = match turn.map_or(0, |t| t.wait_ns(now)) {
            0 => g.meter.gate(&mut g.events, &bucket, cap, key, now),
            w => Step::Wait(w),
        };
        match step {
            Step::Go => {
                // Lower priorities learn of the work before it reaches the GPU: declared only
                // after the launch, a lower-priority kernel launched in between runs first.
                crate::node::declare(dev, now, || g.meter.queued_est_ns());
                prepared = Some(prepare(g, key, record_on, ctx, now))
            }
            // About to wait: an event now ends the stream's launches without one where they
            // end, not after the wait (spaced events would stretch their interval over it).
            Step::Wait(_) if g.meter.wants_flush_event(key) => {
                if let Some(ev) = g.events.ctx_index(ctx).and_then(|c| g.events.record(c, record_on, false)) {
                    g.meter.flushed(key, ev, now);
                }
            }
            Step::Wait(_) => {}
        }
        g.events.settle();
        step
    };
    let held = match who {
        Launcher::Program { .. } => hold_for(&mut SysClock, vgpu_core::limiter::MAX_HOLD_NS - paused_ns, &mut step),
        // The spin goes only where the gate says go at once.
        Launcher::Spin => match step(vgpu_core::clock::now_ns()) {
            Step::Go => 0,
            Step::Wait(_) => return None,
        },
    };
    if held > 0 {
        COUNTERS.held_ns.fetch_add(held, Relaxed);
    }
    // A hold that ran out (MAX_HOLD_NS) lets the launch go unprepared: prepare it now.
    let prepared = prepared.unwrap_or_else(|| {
        let mut g = lock(dev);
        let p = prepare(&mut g, key, record_on, ctx, vgpu_core::clock::fast_now_ns());
        g.events.settle();
        p
    });
    let Some((ctx, start_ev)) = prepared else {
        COUNTERS.untracked_stream.fetch_add(1, Relaxed);
        return Some(LaunchTicket::default());
    };
    let submit_ns = vgpu_core::clock::fast_now_ns();
    // Shared line: written at most once a millisecond, not on every launch.
    if submit_ns.saturating_sub(bucket.s.last_launch_ns.load(Relaxed)) > 1_000_000 {
        bucket.s.last_launch_ns.store(submit_ns, Relaxed);
    }
    Some(LaunchTicket { gated: Some(Gated { dev, key, record_on, ctx, start_ev, submit_ns, kind }) })
}

/// The context clock of the launch's stream, and a start event when the stream is idle (its
/// launch latency is not GPU time). `None`: the context cannot be timed, the launch goes untracked.
fn prepare(g: &mut DeviceGate, key: StreamKey, record_on: CUstream, ctx: CUcontext, now: u64) -> Option<(usize, Option<Ev>)> {
    let ctx = g.events.ctx_index(ctx)?;
    let se = g.meter.start_event(key, now);
    // Also one start event a window on an idle stream, to hold the context's clock mapping.
    let sync = se.idle && g.events.ctxs[ctx].clock.wants_idle_event();
    let start_ev = if se.wanted || sync { g.events.record(ctx, record_on, se.idle) } else { None };
    Some((ctx, start_ev))
}

#[cold]
fn gated_after(t: Gated, result: i32) {
    let mut g = lock(t.dev);
    let g = &mut *g;
    if result != CUDA_SUCCESS {
        if let Some(se) = t.start_ev {
            g.events.release(se);
        }
        return;
    }
    // A start event needs its end event; otherwise one event per `EVENT_SPACING_NS`.
    let ev = if t.start_ev.is_some() || g.meter.wants_end_event(t.key, t.kind, t.submit_ns) { g.events.record(t.ctx, t.record_on, false) } else { None };
    g.meter.launched_kind(t.key, t.kind, t.start_ev, ev, t.submit_ns, &mut g.events);
    g.events.settle();
    // The queue estimate walks every stream: only when the node file wants it.
    crate::node::declare(t.dev, t.submit_ns, || g.meter.queued_est_ns());
}

#[cold]
fn gated_sync(entered: u64) {
    COUNTERS.syncs.fetch_add(1, Relaxed);
    let Some((_, ps)) = state() else { return };
    let Some(dev) = launch_device(ps) else { return };
    if GATES[dev].load(Acquire).is_null() {
        return;
    }
    let now = vgpu_core::clock::fast_now_ns();
    let mut g = lock(dev);
    let g = &mut *g;
    // Gated while it ran: when it was entered is not known, so it counts as not having blocked.
    let entered = if entered == 0 { now } else { entered };
    g.meter.synced(&mut g.events, &ps.region.bucket(dev), entered, now);
    g.events.settle();
    if g.meter.pending_launches() == 0 {
        crate::node::idle(dev, now);
    }
}

/// Devices this process has gated launches on, and for each the cumulative busy time (ns) and
/// launches its meter counted (only while a cap or suspend is active: the uncapped fast path
/// counts nothing). Charges whatever completed meanwhile. Never blocks: a gate busy in a launch
/// reports `None` this round, but still counts as gated.
pub(crate) fn flush_and_report(ps: &ProcState, mut report: impl FnMut(usize, Option<(u64, u64)>)) {
    for (dev, p) in GATES.iter().enumerate() {
        let p = p.load(Acquire);
        if p.is_null() {
            continue;
        }
        // SAFETY: leaked, never freed.
        let m = unsafe { &*p };
        match m.try_lock() {
            Ok(mut g) => {
                let g = &mut *g;
                let now = vgpu_core::clock::now_ns();
                g.meter.poll(&mut g.events, &ps.region.bucket(dev), now);
                g.events.settle();
                // Work still queued or running counts as ours now: a kernel outliving its launch
                // by seconds must not make us look idle to the node view (`node::may_shorten`).
                if g.meter.pending_launches() > 0 {
                    crate::node::launched_on(dev, now);
                }
                match g.meter.queued_est_ns() {
                    0 => crate::node::idle(dev, now),
                    queued => crate::node::declare(dev, now, || queued),
                }
                if vgpu_core::log::enabled(vgpu_core::log::DEBUG) {
                    let m = &g.meter;
                    let s = m.stats;
                    vgpu_core::debug!(
                        "meter dev {dev}: batches={} clipped={} clipped_ms={} closed_at_sync={} closed_at_sync_ms={} closed_valued={} closed_valued_ms={} sync_blocked_ms={} late_starts={} waits_queue={} waits_budget={} beside_queued={} queued_est_us={} pending={} est_us={:?}",
                        s.batches,
                        s.clipped,
                        s.clipped_ns / 1_000_000,
                        s.closed_at_sync,
                        s.closed_at_sync_ns / 1_000_000,
                        s.closed_valued,
                        s.closed_valued_ns / 1_000_000,
                        s.sync_blocked_ns / 1_000_000,
                        s.late_starts,
                        s.waits_queue,
                        s.waits_budget,
                        s.beside_queued,
                        m.queued_est_ns() / 1000,
                        m.pending_launches(),
                        m.estimates_us()
                    );
                }
                report(dev, Some((g.meter.charged_total_ns, g.meter.launches())));
            }
            Err(_) => report(dev, None),
        }
    }
}

/// The runtime and this process's registered state, if both are ready (never initializes).
fn state() -> Option<(&'static Runtime, &'static ProcState)> {
    let rt = crate::runtime::get()?;
    Some((rt, rt.proc_if_ready()?))
}
