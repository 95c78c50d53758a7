//! The streams the program created, by context: what a context synchronize waits for beyond the
//! legacy stream (which orders after every blocking stream, per-thread default streams included).
//! `linger` answers a lingering service's context synchronize with events on these and queues its
//! spin behind them, so that the synchronize does not wait for the spin, as a real one would.
//! Kept from every process's first stream on, whatever its limits (a service may start to linger
//! long after it made its streams); a creation or a destroy takes a lock, briefly.
//!
//! Where the list may miss a stream (a green context's stream, which a context synchronize also
//! waits for; a creation with no current context; more streams than the list holds; the lock
//! unavailable at a destroy, which would leave a dead handle in it; a gated launch on a stream it
//! does not have, made where the hook did not see it), it is `incomplete` for the rest of the
//! process, and context synchronizes are the driver's own.

use std::cell::Cell;
use std::ffi::{c_int, c_uint};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};

use crate::driver;
use crate::ffi::*;
use crate::runtime::Runtime;
use crate::sys::sig;

/// Live streams the list holds at most (PyTorch's pools make 32 per priority and device).
const MAX_STREAMS: usize = 1024;

struct Known {
    /// The process these are of: a forked child starts with none (its parent's are not its own).
    pid: u32,
    /// (context, stream) as integers.
    streams: Vec<(u64, u64)>,
}
static KNOWN: Mutex<Known> = Mutex::new(Known { pid: 0, streams: Vec::new() });
static INCOMPLETE: AtomicBool = AtomicBool::new(false);

/// The list, tried a bounded number of times (its holders do no more than a few event calls).
fn lock() -> Option<MutexGuard<'static, Known>> {
    crate::guard::try_lock_yielding(&KNOWN, 100_000).map(own)
}

fn own(mut k: MutexGuard<'static, Known>) -> MutexGuard<'static, Known> {
    let pid = std::process::id();
    if k.pid != pid {
        k.pid = pid;
        k.streams.clear();
    }
    k
}

fn incomplete(why: &str) {
    if !INCOMPLETE.swap(true, Relaxed) {
        vgpu_core::debug!("streams: {why}; context synchronizes are the driver's from now on");
    }
}

/// A stream the program created in the current context.
fn note(stream: CUstream) {
    let ctx = driver::current_context();
    if ctx == 0 {
        return incomplete("a stream made with no current context");
    }
    let Some(mut k) = lock() else { return incomplete("the stream list stayed locked at a creation") };
    if k.streams.len() >= MAX_STREAMS {
        drop(k);
        return incomplete("more live streams than the list holds");
    }
    k.streams.push((ctx, stream as u64));
}

pub unsafe fn create(_rt: &'static Runtime, real: sig::cuStreamCreate, ps: *mut CUstream, flags: c_uint) -> CUresult {
    let r = real(ps, flags);
    if r == CUDA_SUCCESS && !ps.is_null() {
        note(*ps);
    }
    r
}

pub unsafe fn create_with_priority(_rt: &'static Runtime, real: sig::cuStreamCreateWithPriority, ps: *mut CUstream, flags: c_uint,
    priority: c_int) -> CUresult {
    let r = real(ps, flags, priority);
    if r == CUDA_SUCCESS && !ps.is_null() {
        note(*ps);
    }
    r
}

/// A green context's stream (`green_context_made` has made the list incomplete already, where
/// the context was made through the hook).
pub unsafe fn green_create(_rt: &'static Runtime, real: sig::cuGreenCtxStreamCreate, ps: *mut CUstream, green: CUgreenCtx,
    flags: c_uint, priority: c_int) -> CUresult {
    let r = real(ps, green, flags, priority);
    if r == CUDA_SUCCESS {
        incomplete("a green context's stream");
    }
    r
}

/// A stream made to wait on the GPU for a value in memory (or a batch of memory operations,
/// which may hold such waits). Such a wait may depend on work queued later on another blocking
/// stream, which the legacy stream's record of an answered context synchronize would order
/// behind it: a deadlock on the GPU the real call does not have. From then on the real call.
fn waits_on_values() {
    if !INCOMPLETE.load(Relaxed) {
        incomplete("a stream waits on the GPU for a value");
    }
}

pub unsafe fn wait_value32(_rt: &'static Runtime, real: sig::cuStreamWaitValue32_v2, stream: CUstream, addr: CUdeviceptr,
    value: u32, flags: c_uint) -> CUresult {
    waits_on_values();
    real(stream, addr, value, flags)
}

pub unsafe fn wait_value64(_rt: &'static Runtime, real: sig::cuStreamWaitValue64_v2, stream: CUstream, addr: CUdeviceptr,
    value: cuuint64_t, flags: c_uint) -> CUresult {
    waits_on_values();
    real(stream, addr, value, flags)
}

pub unsafe fn batch_mem_op(_rt: &'static Runtime, real: sig::cuStreamBatchMemOp_v2, stream: CUstream, count: c_uint,
    ops: *mut std::ffi::c_void, flags: c_uint) -> CUresult {
    waits_on_values();
    real(stream, count, ops, flags)
}

/// Forgotten before the real destroy: a context synchronize answered meanwhile records on the
/// streams with the list locked, so none records on this one once the driver has let it go. A
/// destroy returns at once and the stream's queued work still runs, which a context synchronize
/// waits for: where it has work queued, the list is incomplete from then on.
pub unsafe fn destroy(_rt: &'static Runtime, real: sig::cuStreamDestroy_v2, stream: CUstream) -> CUresult {
    match lock() {
        Some(mut k) => {
            let n = k.streams.len();
            k.streams.retain(|&(_, s)| s != stream as u64);
            DESTROYS.fetch_add(1, Relaxed);
            if k.streams.len() != n && driver::stream_query(stream) != CUDA_SUCCESS {
                drop(k);
                incomplete("a stream destroyed with work queued");
            }
        }
        None => incomplete("the stream list stayed locked at a destroy"),
    }
    real(stream)
}

/// A green context: a context synchronize waits for its work too, and the list does not follow
/// green contexts (their streams, or their own default stream).
pub(crate) fn green_context_made() {
    incomplete("a green context");
}

/// Streams a thread remembers having found in the list (a round robin over a few streams looks
/// none up again).
const FOUND_KEPT: usize = 8;

thread_local! {
    /// The streams this thread's gated launches last went to, found in the list (0: none), and
    /// where the next one found goes.
    static FOUND: [Cell<u64>; FOUND_KEPT] = const { [const { Cell::new(0) }; FOUND_KEPT] };
    static FOUND_NEXT: Cell<usize> = const { Cell::new(0) };
    /// `DESTROYS` when they were found: a destroy may free a handle for a stream made unseen.
    static FOUND_AT: Cell<u64> = const { Cell::new(0) };
}

/// Streams destroyed or forgotten so far (the threads' remembered streams are then looked up again).
static DESTROYS: AtomicU64 = AtomicU64::new(0);

/// A gated launch of the program's on `stream` (not a default stream): a stream the list does
/// not have was made where the hook did not see it (an entry point `cuGetProcAddress` handed out
/// that is none of the driver's exports, say), and a context synchronize answered from the list
/// would not wait for its work. Each thread looks up a stream it has not found lately.
#[inline]
pub(crate) fn launched_on(stream: CUstream) {
    let h = stream as u64;
    if INCOMPLETE.load(Relaxed) {
        return;
    }
    // `try_with`: a thread past its locals' destruction looks every stream up.
    let destroys = DESTROYS.load(Relaxed);
    if !FOUND_AT.try_with(|a| a.replace(destroys) == destroys).unwrap_or(false) {
        // A destroy since they were found: each is looked up again.
        let _ = FOUND.try_with(|f| f.iter().for_each(|c| c.set(0)));
    } else if FOUND.try_with(|f| f.iter().any(|c| c.get() == h)).unwrap_or(false) {
        return;
    }
    let Some(k) = lock() else { return incomplete("the stream list stayed locked at a launch") };
    let found = k.streams.iter().any(|&(_, s)| s == h);
    drop(k);
    if !found {
        return incomplete("a launch on a stream the hook did not see made");
    }
    let _ = FOUND.try_with(|f| {
        let i = FOUND_NEXT.try_with(|n| n.replace((n.get() + 1) % FOUND_KEPT)).unwrap_or(0);
        f[i].set(h);
    });
}

/// Context `ctx` is gone, and its streams with it.
pub(crate) fn forget_context(ctx: CUcontext) {
    match lock() {
        Some(mut k) => {
            k.streams.retain(|&(c, _)| c != ctx as u64);
            DESTROYS.fetch_add(1, Relaxed);
        }
        None => incomplete("the stream list stayed locked at a context's end"),
    }
}

/// Run `f` on the streams the program made in `ctx`, none of them destroyed until it returns;
/// `None` where the list may miss one.
pub(crate) fn with_context_streams<T>(ctx: u64, f: impl FnOnce(&[CUstream]) -> T) -> Option<T> {
    if INCOMPLETE.load(Relaxed) {
        return None;
    }
    let k = lock()?;
    let made: Vec<CUstream> = k.streams.iter().filter(|&&(c, _)| c == ctx).map(|&(_, s)| s as CUstream).collect();
    Some(f(&made))
}
