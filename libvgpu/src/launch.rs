//! Launch gate: the FFI side of the compute limiter (`vgpu_core::limiter` holds the policy).
//!
//! Every kernel/graph launch shim calls `before_launch` then `after_launch`; every synchronize
//! shim calls `after_sync`. With no cap and no suspend anywhere, `before_launch` is one relaxed
//! load plus one relaxed store (no lock, no clock, no syscall): `GATE` is refreshed by the monitor
//! thread from the shared region, so a cap set at run time takes effect within its period.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering::*};
use std::sync::Mutex;

use vgpu_core::limiter::{Bucket, Clock, Markers, Tracker, MAX_HOLD_NS};
use vgpu_core::MAX_DEVICES;

use crate::real::{Lib, RealFn};
use crate::runtime::{ProcState, Runtime};

pub use crate::ffi::CUstream;
use crate::ffi::CUevent;

/// Some device has a cap, or the container is suspended/paused: launches take the slow path.
pub(crate) static GATE: AtomicBool = AtomicBool::new(false);
/// A launch happened since the monitor last looked (last-kernel-time without a clock read).
pub(crate) static LAUNCHED: AtomicBool = AtomicBool::new(false);

/// What `before_launch` decided, handed back to `after_launch`.
#[derive(Clone, Copy, Default)]
pub struct LaunchTicket {
    /// Device index the launch was gated on (`None` = fast path, nothing to do afterwards).
    dev: Option<usize>,
}

/// Called by every launch shim before the real launch. May block (bounded) when over budget.
#[inline]
pub fn before_launch(stream: CUstream) -> LaunchTicket {
    if !GATE.load(Relaxed) {
        LAUNCHED.store(true, Relaxed);
        return LaunchTicket::default();
    }
    gated_before(stream)
}

/// Called by every launch shim after the real launch with its result. The gate already counted
/// the launch; only a refused one needs work here.
#[inline]
pub fn after_launch(ticket: LaunchTicket, _stream: CUstream, result: i32) {
    if let (Some(dev), true) = (ticket.dev, result != 0) {
        gated_failed(dev);
    }
}

/// Called by synchronize shims (stream/context/event synchronize) after the real call returned.
#[inline]
pub fn after_sync() {
    if GATE.load(Relaxed) {
        gated_sync();
    }
}

// ---- real driver entry points the gate needs (not hooked, resolved on our own handle) ----

static CU_EVENT_CREATE: RealFn = RealFn::new(Lib::Cuda, c"cuEventCreate");
static CU_EVENT_RECORD: RealFn = RealFn::new(Lib::Cuda, c"cuEventRecord");
static CU_EVENT_QUERY: RealFn = RealFn::new(Lib::Cuda, c"cuEventQuery");
static CU_STREAM_IS_CAPTURING: RealFn = RealFn::new(Lib::Cuda, c"cuStreamIsCapturing");
static CU_THREAD_EXCHANGE_CAPTURE_MODE: RealFn = RealFn::new(Lib::Cuda, c"cuThreadExchangeStreamCaptureMode");

/// `CU_STREAM_CAPTURE_MODE_RELAXED`: our marker calls must never invalidate a capture that
/// another thread of the program runs in global mode.
const CU_STREAM_CAPTURE_MODE_RELAXED: i32 = 2;

/// Run `f` with this thread's stream-capture mode set to relaxed, restoring it afterwards.
fn relaxed_capture<T>(f: impl FnOnce() -> T) -> T {
    let Some(x) = CU_THREAD_EXCHANGE_CAPTURE_MODE.get() else { return f() };
    // SAFETY: cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode*) with a valid pointer.
    let xchg = unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut i32) -> i32>(x) };
    let mut mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    let ok = unsafe { xchg(&mut mode) } == 0;
    let r = f();
    if ok {
        unsafe { xchg(&mut mode) };
    }
    r
}

/// Is `stream` being captured into a graph? Captured launches do not run now (the graph's
/// launch is gated instead), so they are not tracked.
fn capturing(stream: CUstream) -> bool {
    let Some(f) = CU_STREAM_IS_CAPTURING.get() else { return false };
    let mut status: i32 = 0;
    // SAFETY: cuStreamIsCapturing(CUstream, CUstreamCaptureStatus*) with a valid pointer.
    let r = unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn(CUstream, *mut i32) -> i32>(f)(stream, &mut status) };
    r == 0 && status != 0
}

/// `CU_EVENT_DISABLE_TIMING`: markers only need completion, and untimed events are cheaper.
const CU_EVENT_DISABLE_TIMING: u32 = 0x2;
const CUDA_ERROR_NOT_READY: i32 = 600;

/// The container's device index of this launch: with one visible device no driver call is
/// needed; otherwise the device of the calling thread's current context.
fn launch_device(ps: &ProcState) -> Option<usize> {
    if ps.devices.len() == 1 {
        return Some(0);
    }
    let dev = crate::driver::current_device()?;
    (dev >= 0 && (dev as usize) < MAX_DEVICES).then_some(dev as usize)
}

/// Another tenant is using device d (set by the monitor from NVML).
pub(crate) static CONTENDED: [AtomicBool; MAX_DEVICES] = [const { AtomicBool::new(false) }; MAX_DEVICES];

/// Marker events for one device of this process, recycled through a free list.
struct EventMarkers {
    free: Vec<CUevent>,
}

impl Markers for EventMarkers {
    type M = CUevent;

    fn record(&mut self, stream: usize) -> Option<CUevent> {
        relaxed_capture(|| self.record_now(stream))
    }

    fn done(&mut self, ev: CUevent) -> bool {
        relaxed_capture(|| self.query_now(ev))
    }

    fn forget(&mut self, ev: CUevent) {
        self.free.push(ev);
    }
}

impl EventMarkers {
    fn record_now(&mut self, stream: usize) -> Option<CUevent> {
        if capturing(stream as CUstream) {
            return None; // an event recorded into a capture would be a graph node, not a marker
        }
        let ev = match self.free.pop() {
            Some(ev) => ev,
            None => {
                let create = CU_EVENT_CREATE.get()?;
                let mut ev: CUevent = std::ptr::null_mut();
                // SAFETY: cuEventCreate(CUevent*, unsigned) with a valid out pointer.
                let r = unsafe {
                    std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut CUevent, u32) -> i32>(create)(
                        &mut ev,
                        CU_EVENT_DISABLE_TIMING,
                    )
                };
                if r != 0 {
                    return None;
                }
                ev
            }
        };
        let record = CU_EVENT_RECORD.get()?;
        // SAFETY: cuEventRecord(CUevent, CUstream) with an event we created.
        let r = unsafe {
            std::mem::transmute::<*mut c_void, unsafe extern "C" fn(CUevent, CUstream) -> i32>(record)(
                ev,
                stream as CUstream,
            )
        };
        if r != 0 {
            // Wrong context for this stream, or a capture in progress: proceed without a marker.
            self.free.push(ev);
            return None;
        }
        Some(ev)
    }

    fn query_now(&mut self, ev: CUevent) -> bool {
        let Some(query) = CU_EVENT_QUERY.get() else { return true };
        // SAFETY: cuEventQuery(CUevent) on an event we created.
        let r = unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn(CUevent) -> i32>(query)(ev) };
        // Any answer but "not ready" (success, or an error such as a destroyed context) means
        // there is nothing left to wait for: never hang on a broken marker.
        let done = r != CUDA_ERROR_NOT_READY;
        if done {
            self.free.push(ev);
        }
        done
    }
}

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
struct DeviceGate {
    tracker: Tracker<CUevent>,
    markers: EventMarkers,
}

// SAFETY: the raw event handles are plain driver handles usable from any thread of the process.
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
    let fresh = Box::into_raw(Box::new(Mutex::new(DeviceGate {
        tracker: Tracker::default(),
        markers: EventMarkers { free: Vec::new() },
    })));
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

/// In a forked child: forget the parent's gates (their events belong to the parent's contexts,
/// and a parent thread may have held their locks at fork time). Leaks them on purpose.
pub(crate) fn after_fork_child() {
    for g in &GATES {
        g.store(std::ptr::null_mut(), Release);
    }
}

#[inline(never)]
fn gated_before(stream: CUstream) -> LaunchTicket {
    let Some((rt, ps)) = state() else { return LaunchTicket::default() };
    let Some(dev) = launch_device(ps) else { return LaunchTicket::default() };
    crate::monitor::wait_while_paused(rt, ps, MAX_HOLD_NS);
    let cap = crate::monitor::effective_cap(rt, ps, dev);
    let bucket = bucket(ps, dev);
    let mut g = gate(dev).lock().unwrap_or_else(|p| p.into_inner());
    let g = &mut *g;
    g.tracker.contended = CONTENDED[dev].load(Relaxed);
    let (_, now) = g.tracker.before_launch(&mut SysClock, &mut g.markers, &bucket, cap, stream as usize);
    // Shared line: written at most once a millisecond, not on every launch.
    if now.saturating_sub(bucket.s.last_launch_ns.load(Relaxed)) > 1_000_000 {
        bucket.s.last_launch_ns.store(now, Relaxed);
    }
    LAUNCHED.store(true, Relaxed);
    LaunchTicket { dev: Some(dev) }
}

#[cold]
fn gated_failed(dev: usize) {
    gate(dev).lock().unwrap_or_else(|p| p.into_inner()).tracker.launch_failed();
}

#[cold]
fn gated_sync() {
    let Some((_, ps)) = state() else { return };
    let Some(dev) = launch_device(ps) else { return };
    let now = vgpu_core::clock::fast_now_ns();
    let bucket = bucket(ps, dev);
    let mut g = gate(dev).lock().unwrap_or_else(|p| p.into_inner());
    let g = &mut *g;
    g.tracker.contended = CONTENDED[dev].load(Relaxed);
    g.tracker.after_sync(&mut g.markers, now, &bucket);
}

/// Devices this process has gated launches on, and for each the cumulative occupancy (ns) and
/// launches its tracker counted (only while a cap or suspend is active: the uncapped fast path
/// counts nothing). Charges whatever the trackers hold pending. Never blocks: a gate busy in a
/// launch (or asleep in one) reports `None` this round, but still counts as gated.
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
                g.tracker.flush_pending(&bucket(ps, dev));
                report(dev, Some((g.tracker.charged_total_ns, g.tracker.launches())));
            }
            Err(_) => report(dev, None),
        }
    }
}

/// The container's bucket for `dev`. `VGPU_LIMITER_CHARGE=sum` (read once) charges each
/// process's occupancy separately instead of their union: an experiment knob for GPUs whose
/// time-slicing lets kernels of several processes progress at once.
pub(crate) fn bucket(ps: &ProcState, dev: usize) -> Bucket<'_> {
    static UNION: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let union = *UNION.get_or_init(|| std::env::var("VGPU_LIMITER_CHARGE").map(|v| v != "sum").unwrap_or(true));
    Bucket { s: ps.region.limiter(dev), union }
}

/// The runtime and this process's registered state, if both are ready (never initializes).
fn state() -> Option<(&'static Runtime, &'static ProcState)> {
    let rt = crate::runtime::get()?;
    Some((rt, rt.proc_if_ready()?))
}
