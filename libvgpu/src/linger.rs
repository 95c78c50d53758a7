//! The linger's glue (`vgpu_core::policy::linger` decides when and how long): at a stream or
//! event synchronize of a process that lingers on the current device, a one-thread spin
//! (`vgpu_linger`, PTX below) is queued on a stream of our own behind the awaited work, and the
//! word that ends spins is moved, which ends the one queued before; a context synchronize, or a
//! context's end, moves every word first (the context synchronize would wait for the spin). The
//! spin is launched through the gate like the program's own work, so lower priorities hold while
//! it runs.
//!
//! The words live in static pages of this library, registered with each context that uses one:
//! ending spins writes only memory that is always ours, without a lock, whatever happened to the
//! context. Our objects in a context (module, stream, event) are made at its first linger and
//! forgotten when the program destroys it or its last release or reset ends it. Calls that wait
//! for all of a context's work (frees, module unloads, releases) end every spin first. The
//! table's lock is only tried on the synchronize path: a synchronize never waits for it, it skips
//! that linger.

use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::*};
use std::sync::{Mutex, MutexGuard};

use vgpu_core::policy::linger::{next_word, note_gap, spin_ns, spin_pays, ALL_QUICK};
use vgpu_core::MAX_DEVICES;

use crate::driver;
use crate::ffi::*;

/// What a synchronize waits for.
pub enum Awaited {
    /// A stream; `true`: from a `_ptsz` entry point, where stream 0 is the thread's own.
    Stream(CUstream, bool),
    Event(CUevent),
    /// A context (null: the current one).
    Context(CUcontext),
}

/// Spins while the word at `param_0` holds `param_1` and fewer than `param_2` ns have passed.
const PTX: &CStr = c".version 6.0
.target sm_50
.address_size 64

.visible .entry vgpu_linger(
    .param .u64 vgpu_linger_param_0,
    .param .u32 vgpu_linger_param_1,
    .param .u64 vgpu_linger_param_2
)
{
    .reg .pred %p<3>;
    .reg .b32 %r<3>;
    .reg .b64 %rd<6>;
    ld.param.u64 %rd1, [vgpu_linger_param_0];
    ld.param.u32 %r1, [vgpu_linger_param_1];
    ld.param.u64 %rd2, [vgpu_linger_param_2];
    mov.u64 %rd3, %globaltimer;
SPIN:
    ld.volatile.u32 %r2, [%rd1];
    setp.ne.u32 %p1, %r2, %r1;
    @%p1 bra DONE;
    mov.u64 %rd4, %globaltimer;
    sub.u64 %rd5, %rd4, %rd3;
    setp.lt.u64 %p2, %rd5, %rd2;
    @%p2 bra SPIN;
DONE:
    ret;
}
";


/// Contexts that can linger at once in this process.
const SLOTS: usize = 16;
const PAGE: usize = 4096;

/// One page per slot; the first word of each ends that slot's spins.
#[repr(C, align(4096))]
struct Page([AtomicU32; PAGE / 4]);
static WORDS: [Page; SLOTS] = [const { Page([const { AtomicU32::new(0) }; PAGE / 4]) }; SLOTS];

/// Our objects in one context (handles as integers; `func` 0: this context cannot linger).
#[derive(Clone, Copy)]
struct Slot {
    pid: u32,
    ctx: usize,
    func: usize,
    stream: usize,
    event: usize,
    /// Recorded on our stream once it waits for all of a context's work: what an answered
    /// context synchronize waits for.
    join: usize,
    /// The slot's word, as the device addresses it.
    word: u64,
}
static TABLE: Mutex<[Option<Slot>; SLOTS]> = Mutex::new([None; SLOTS]);

/// Each device's spin length (ns; 0: no linger), set by the monitor every tick.
static SPIN_NS: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
/// A device lingered at some point: synchronizes look further (a spin may still be queued).
static ACTIVE: AtomicBool = AtomicBool::new(false);
/// The table could not be locked at a context's end: lingering is off for the process.
static OFF: AtomicBool = AtomicBool::new(false);
static WARNED: AtomicBool = AtomicBool::new(false);
/// Work was launched since the last spin (set on the gated launch path, which a lingering
/// process is on): a synchronize with nothing new behind it does not linger, or a loop of
/// synchronizes would hold the GPU on spins alone.
static FRESH: AtomicBool = AtomicBool::new(false);
/// The share of recent gaps from a lingering synchronize's return to the next kernel launch that
/// a spin would have filled (`policy::linger::note_gap`): whether a spin pays. And how many
/// gaps were noted (the monitor's debug line).
static QUICK: AtomicU64 = AtomicU64::new(0);
pub(crate) static GAPS_NOTED: AtomicU64 = AtomicU64::new(0);
/// When the last lingering synchronize returned (`clock::fast_now_ns`; 0: its gap was noted),
/// and the spin length then.
static RETURNED_AT: AtomicU64 = AtomicU64::new(0);
static RETURNED_SPIN_NS: AtomicU64 = AtomicU64::new(0);
/// Context synchronizes in progress (between their move and their return).
static SYNCING: AtomicU32 = AtomicU32::new(0);
/// Spins queued, and context synchronizes answered with events (the monitor's debug line).
pub(crate) static QUEUED: AtomicU64 = AtomicU64::new(0);
pub(crate) static ANSWERED: AtomicU64 = AtomicU64::new(0);
/// Spins not launched because the gate would have held them (a suspended container).
pub(crate) static WITHHELD: AtomicU64 = AtomicU64::new(0);

/// The monitor's tick: device `dev` lingers `linger_us` after each synchronize while a lower
/// priority shares it and no hard cap bounds it.
pub(crate) fn set(dev: usize, linger_us: u32, lower_shares: bool, hard_cap: Option<u32>) {
    let ns = if OFF.load(Relaxed) { 0 } else { spin_ns(linger_us, lower_shares, hard_cap) };
    let Some(slot) = SPIN_NS.get(dev) else { return };
    let was = slot.swap(ns, Relaxed);
    if ns != 0 {
        ACTIVE.store(true, Relaxed);
    }
    if (was == 0) != (ns == 0) {
        match ns {
            0 => vgpu_core::debug!("device {dev}: no linger after synchronizes"),
            _ => vgpu_core::debug!("device {dev}: a lower priority shares the GPU; lingering {linger_us} us after each synchronize"),
        }
    }
}

/// A gated launch of the program's: new work, and where it runs `kernels`, the end of the gap
/// after a lingering synchronize (one relaxed load where there is none to note). A copy or memset
/// does not end it: reading a result back right after a synchronize is not the next request.
#[inline]
pub(crate) fn note_launch(kernels: bool) {
    if !FRESH.load(Relaxed) {
        FRESH.store(true, Relaxed);
    }
    if !kernels {
        return;
    }
    let at = RETURNED_AT.load(Relaxed);
    if at != 0 && RETURNED_AT.compare_exchange(at, 0, Relaxed, Relaxed).is_ok() {
        let gap = vgpu_core::clock::fast_now_ns().saturating_sub(at);
        let spin = RETURNED_SPIN_NS.load(Relaxed);
        let _ = QUICK.fetch_update(Relaxed, Relaxed, |q| Some(note_gap(q, gap, spin)));
        GAPS_NOTED.fetch_add(1, Relaxed);
    }
}

/// The share of recent gaps a spin would have filled, in percent (the monitor's debug line).
pub(crate) fn quick_gap_pct() -> f64 {
    QUICK.load(Relaxed) as f64 * 100.0 / ALL_QUICK as f64
}

/// How a spin is launched: one thread of the function on the stream, with these parameters,
/// through the launch gate (`launch::gated_one_thread`; the hooks hand it in, the gate being
/// above this module).
pub type Launch = fn(CUfunction, CUstream, &mut [*mut c_void]) -> CUresult;

/// Before a synchronize's real call; what it returns goes to `after_sync`.
#[inline]
pub fn before_sync(awaited: &Awaited, launch: Launch) -> Syncing {
    if !ACTIVE.load(Relaxed) {
        return Syncing::default();
    }
    // Whether this synchronize could linger (its gap to the next launch is noted), and whether
    // a spin pays now; one that does not consumes the new work as a spin would.
    let mut now = None;
    guarded(|| now = here());
    let paying = now.filter(|_| spin_pays(QUICK.load(Relaxed)));
    if now.is_some() && paying.is_none() {
        FRESH.store(false, Relaxed);
    }
    let gap_spin_ns = now.map(|(_, ns)| ns);
    match *awaited {
        Awaited::Context(c) => {
            end_all();
            let mut answer = None;
            if let Some(here) = paying {
                guarded(|| answer = answer_context(c, here, launch));
            }
            if answer.is_some() {
                return Syncing { counted: false, answer, gap_spin_ns };
            }
            // The driver's own: counted until it returns, so that a spin another thread queues
            // meanwhile ends itself (`spin`), this one's move having perhaps come before it.
            SYNCING.fetch_add(1, SeqCst);
            end_all();
            return Syncing { counted: true, answer: None, gap_spin_ns };
        }
        Awaited::Stream(s, ptsz) => {
            if let Some(here) = paying {
                guarded(|| queue(Some((s, ptsz)), None, here, launch));
            }
        }
        Awaited::Event(e) => {
            if let Some(here) = paying {
                guarded(|| queue(None, Some(e), here, launch));
            }
        }
    }
    Syncing { gap_spin_ns, ..Syncing::default() }
}

/// What `before_sync` did: a context synchronize counted in `SYNCING` (uncounted once it
/// returns), or one it answered itself (the real call is not made); the spin length where the
/// synchronize could linger (its gap to the next launch is noted).
#[derive(Default)]
pub struct Syncing {
    counted: bool,
    answer: Option<CUresult>,
    gap_spin_ns: Option<u64>,
}

impl Syncing {
    /// The synchronize's result, where `before_sync` waited for the work itself.
    #[inline]
    pub fn answered(&self) -> Option<CUresult> {
        self.answer
    }
}

/// After a synchronize's real call (or its answer).
#[inline]
pub fn after_sync(s: Syncing) {
    if s.counted {
        SYNCING.fetch_sub(1, SeqCst);
    }
    if let Some(ns) = s.gap_spin_ns {
        RETURNED_SPIN_NS.store(ns, Relaxed);
        RETURNED_AT.store(vgpu_core::clock::fast_now_ns(), Relaxed);
    }
}

/// The linger never fails a synchronize: a panic in it is caught here and the call goes on.
fn guarded(f: impl FnOnce()) {
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
}

/// Move every word: each queued spin ends (at once, or as soon as it starts).
fn end_all() {
    for p in &WORDS {
        let _ = p.0[0].fetch_update(SeqCst, SeqCst, |w| (w != 0).then(|| next_word(w)));
    }
}

/// Move `word` to its next value (ending the spin waiting on the old one); the old value.
fn advance(word: &AtomicU32) -> u32 {
    word.fetch_update(SeqCst, SeqCst, |w| Some(next_word(w))).unwrap_or_else(|w| w)
}

/// Before a call that waits for all of the context's work (a free, a module unload, a primary
/// context's release or reset): end every spin so that it does not wait for one.
#[inline]
pub(crate) fn end_spins() {
    if ACTIVE.load(Relaxed) {
        end_all();
    }
}

/// Context `ctx` is destroyed (before the real call) or gone (a primary context's last release
/// or reset): end every spin and forget our objects in it, which go with it.
pub(crate) fn forget(ctx: CUcontext) {
    crate::streams::forget_context(ctx);
    if !ACTIVE.load(Relaxed) || OFF.load(Relaxed) {
        return;
    }
    end_all();
    let Some(mut table) = lock_briefly() else {
        // A lock held across a fork, or a thread stuck inside: an entry could outlive its context.
        OFF.store(true, Relaxed);
        SPIN_NS.iter().for_each(|s| s.store(0, Relaxed));
        vgpu_core::warn!("linger: cannot update its table; no linger from now on in this process");
        return;
    };
    for e in table.iter_mut() {
        if e.is_some_and(|s| s.ctx == ctx as usize) {
            *e = None;
        }
    }
    // A spin queued between the first move and the lock.
    end_all();
}

/// The table, trying a bounded number of times (its holders do a few driver calls).
fn lock_briefly() -> Option<Table> {
    crate::guard::try_lock_yielding(&TABLE, 100_000)
}

/// The current context and the spin's length, where this process lingers on the current device
/// now and has launched since its last spin.
fn here() -> Option<(u64, u64)> {
    if OFF.load(Relaxed) || !FRESH.load(Relaxed) {
        return None;
    }
    let rt = crate::runtime::get()?;
    let ps = rt.proc_if_ready()?;
    let ctx = driver::current_context();
    if ctx == 0 {
        return None;
    }
    let dev = ps.dev_index(driver::current_device()?)?;
    let ns = SPIN_NS.get(dev).map_or(0, |s| s.load(Relaxed));
    (ns != 0).then_some((ctx, ns))
}

type Table = MutexGuard<'static, [Option<Slot>; SLOTS]>;

/// The table, held, and `ctx`'s slot in it (made at its first linger); `None` where another
/// thread of ours holds the table (this synchronize does not wait for it) or `ctx` cannot linger.
fn slot_of(ctx: u64) -> Option<(Table, usize, Slot)> {
    // Tried once. A panic caught while it was held (`guarded`) left the table as it was: go on with it.
    let mut table = crate::guard::try_lock_yielding(&TABLE, 1)?;
    let pid = std::process::id();
    let i = match table.iter().position(|e| e.is_some_and(|s| s.pid == pid && s.ctx == ctx as usize)) {
        Some(i) => i,
        None => {
            // A free slot, or one a forked child inherited from its parent.
            let i = table.iter().position(|e| e.is_none_or(|s| s.pid != pid))?;
            table[i] = Some(driver::with_relaxed_capture(|| make(i, ctx)));
            i
        }
    };
    let slot = table[i]?;
    (slot.func != 0).then_some((table, i, slot))
}

/// Queue a spin behind the awaited stream's work or event, on the current context `ctx`'s slot
/// (`here`: the context and the spin's length).
fn queue(stream: Option<(CUstream, bool)>, event: Option<CUevent>, (ctx, ns): (u64, u64), launch: Launch) {
    let stream = match stream {
        Some((s, ptsz)) => {
            let s = if ptsz && s.is_null() { CU_STREAM_PER_THREAD as CUstream } else { s };
            // A stream of another context, or one being captured (the synchronize fails there,
            // and our record would become part of the graph): no linger.
            if (s as usize > CU_STREAM_PER_THREAD && driver::stream_context(s) != Some(ctx as CUcontext)) || driver::stream_capture_state(s) != Some(false) {
                return;
            }
            Some(s)
        }
        None => None,
    };
    // An event recorded in a capture: waiting on it would join our stream to the capture.
    if event.is_some_and(|e| !matches!(driver::event_query(e), CUDA_SUCCESS | CUDA_ERROR_NOT_READY)) {
        return;
    }
    // Another thread of ours is queueing one: this synchronize does not wait for it.
    let Some((_table, i, slot)) = slot_of(ctx) else { return };
    driver::with_relaxed_capture(|| {
        let waited = match (stream, event) {
            (Some(s), _) => match driver::event_record(slot.event as CUevent, s) {
                CUDA_SUCCESS => driver::stream_wait_event(slot.stream as CUstream, slot.event as CUevent),
                r => r,
            },
            (None, Some(e)) => driver::stream_wait_event(slot.stream as CUstream, e),
            (None, None) => CUDA_SUCCESS,
        };
        if waited == CUDA_SUCCESS {
            spin(i, &slot, ns, launch);
        }
    });
}

/// A context synchronize answered with events (`streams`): our stream waits for the legacy
/// stream (ordered after every blocking stream, per-thread default streams included), the
/// calling thread's per-thread stream and every stream the program made in the context; the spin
/// is queued behind that, and the caller waits for the join recorded before it, not for the spin
/// (the real call would: a context-synchronizing service otherwise keeps a switch per queued
/// request). `None`, the real call made instead: no linger now, `c` not the current context, a
/// capture in progress (the legacy stream's state says so for every blocking stream), a stream
/// the list may miss (`streams`), or a record that failed (a sticky error: the real call says it).
fn answer_context(c: CUcontext, (ctx, ns): (u64, u64), launch: Launch) -> Option<CUresult> {
    if !c.is_null() && c as u64 != ctx {
        return None;
    }
    let (legacy, own) = (CU_STREAM_LEGACY as CUstream, CU_STREAM_PER_THREAD as CUstream);
    let (table, i, slot) = slot_of(ctx)?;
    let (ev, join, ours) = (slot.event as CUevent, slot.join as CUevent, slot.stream as CUstream);
    let joined = driver::with_relaxed_capture(|| {
        // With the list held, none of its streams is destroyed before its record.
        let waited = crate::streams::with_context_streams(ctx, |made| {
            // A stream being captured: our record would become a node of the program's graph,
            // and our stream would join the capture.
            let all = || [legacy, own].into_iter().chain(made.iter().copied());
            all().all(|s| driver::stream_capture_state(s) == Some(false))
                && all().all(|s| driver::event_record(ev, s) == CUDA_SUCCESS && driver::stream_wait_event(ours, ev) == CUDA_SUCCESS)
        })?;
        if !waited || driver::event_record(join, ours) != CUDA_SUCCESS {
            return None;
        }
        spin(i, &slot, ns, launch);
        Some(())
    });
    // Another thread may record the join again meanwhile: a later record covers this one's work.
    drop(table);
    joined?;
    ANSWERED.fetch_add(1, Relaxed);
    Some(driver::event_synchronize(join))
}

/// Launch the spin on slot `i`'s stream (behind what it waits for), ending the one before.
fn spin(i: usize, slot: &Slot, ns: u64, launch: Launch) {
    FRESH.store(false, Relaxed);
    // The new spin spins while the word holds `gen`; moving the word to it ends the last one,
    // now that the next request's work (launched before this synchronize) is queued.
    let word = &WORDS[i].0[0];
    let mut gen = next_word(advance(word));
    let mut ptr = slot.word;
    let mut len = ns;
    let mut params = [(&raw mut ptr).cast::<c_void>(), (&raw mut gen).cast(), (&raw mut len).cast()];
    // Through the gate, as the program's own launches: lower priorities learn the spin is our
    // work and hold while it runs, and it is timed with them. Ungated, a spin kept nothing (H200,
    // a stream-synchronizing service beside GPT-2: the tail's switch 0.42 ms, 0.33 without a
    // spin, 0.15-0.22 gated); its launch is not the program's new work (`FRESH` stays).
    // Where the gate would hold it, none is launched (`launch::gated_one_thread`).
    let r = launch(slot.func as CUfunction, slot.stream as CUstream, &mut params);
    if r == CUDA_ERROR_NOT_READY {
        WITHHELD.fetch_add(1, Relaxed);
    }
    if r == CUDA_SUCCESS {
        // A context synchronize began meanwhile: its move may have come before ours.
        if SYNCING.load(SeqCst) > 0 {
            advance(word);
        }
        let n = QUEUED.fetch_add(1, Relaxed) + 1;
        if n == 1 || n.is_multiple_of(1000) {
            vgpu_core::info!("linger: {n} spins of {} us queued", ns / 1000);
        }
    }
}

/// Our objects in the current context `ctx`, on slot `i`; a slot with `func` 0 when one cannot
/// be made (said once per process: the program runs as without the linger; what was made of
/// them stays in the context). The first one loads the kernel (the driver compiles the PTX).
fn make(i: usize, ctx: u64) -> Slot {
    let mut slot = Slot { pid: std::process::id(), ctx: ctx as usize, func: 0, stream: 0, event: 0, join: 0, word: 0 };
    let made = (|| -> Result<_, &str> {
        let m = driver::module_load_data(PTX).ok_or("cannot load its kernel")?;
        let f = driver::module_function(m, c"vgpu_linger").ok_or("no kernel in its module")?;
        let s = driver::stream_create_nonblocking().ok_or("cannot create its stream")?;
        let e = driver::event_create(false).ok_or("cannot create its event")?;
        let j = driver::event_create_for_waiting().ok_or("cannot create its event")?;
        let w = driver::host_register(WORDS[i].0.as_ptr() as *mut c_void, PAGE).ok_or("cannot map its word")?;
        Ok((f, s, e, j, w))
    })();
    match made {
        Ok((f, s, e, j, w)) => {
            (slot.func, slot.stream, slot.event, slot.join, slot.word) = (f as usize, s as usize, e as usize, j as usize, w)
        }
        Err(why) => {
            if !WARNED.swap(true, Relaxed) {
                vgpu_core::warn!("linger: {why}; this context does not linger");
            }
        }
    }
    slot
}
