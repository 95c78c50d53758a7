//! `ffi_guard`: no panic ever crosses the C boundary. The cdylib unwinds (`panic = "unwind"` in
//! every profile), so a panic in our code becomes the library's "unknown error" plus one error
//! line naming the hook, and the host program goes on.
//!
//! `LIBVGPU_TEST_PANIC=NAME` (read once at init) makes the hook `NAME` panic on purpose, so tests
//! can prove the promise on the very build they ship.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, TryLockError};

static INJECT: AtomicBool = AtomicBool::new(false);
static INJECT_NAME: OnceLock<String> = OnceLock::new();

#[inline(always)]
pub fn ffi_guard<F: FnOnce() -> i32>(name: &'static str, unknown: i32, f: F) -> i32 {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            vgpu_core::error!("internal error in hook {name} ({}); returning error {unknown}", payload_text(&*p));
            unknown
        }
    }
}

/// `m`, tried up to `tries` times, yielding between tries: `None` where it stayed taken (the
/// caller never waits on it unboundedly). A poisoned lock is used as it is: a panic caught while
/// it was held left its data as it was.
#[inline]
pub fn try_lock_yielding<T>(m: &Mutex<T>, tries: u32) -> Option<MutexGuard<'_, T>> {
    for i in 0..tries {
        match m.try_lock() {
            Ok(g) => return Some(g),
            Err(TryLockError::Poisoned(p)) => return Some(p.into_inner()),
            Err(TryLockError::WouldBlock) if i + 1 < tries => std::thread::yield_now(),
            Err(TryLockError::WouldBlock) => {}
        }
    }
    None
}

/// A panic's message, on one line.
fn payload_text(p: &(dyn std::any::Any + Send)) -> String {
    let s = p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned()).unwrap_or_default();
    s.replace('\n', " ")
}

/// At init: replace the default panic message (several lines) with nothing in hooked calls (the
/// guard logs one line) and one line elsewhere (the monitor thread), and arm the test injection.
/// The hook is this library's own (its std is not the host program's).
pub fn init() {
    std::panic::set_hook(Box::new(|info| {
        if std::thread::current().name() == Some("vgpu-monitor") {
            let at = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
            vgpu_core::error!("internal error in the monitor thread ({}{at}); run-time limit changes stop applying", payload_text(info.payload()));
        }
    }));
    if let Ok(name) = std::env::var("LIBVGPU_TEST_PANIC") {
        if INJECT_NAME.set(name).is_ok() {
            INJECT.store(true, Ordering::Release);
        }
    }
}

/// Panic if the test asked for it in hook `name` (one relaxed load otherwise).
#[inline(always)]
pub fn maybe_inject(name: &'static str) {
    if INJECT.load(Ordering::Relaxed) && INJECT_NAME.get().is_some_and(|n| n == name) {
        panic!("injected panic (LIBVGPU_TEST_PANIC={name})");
    }
}
