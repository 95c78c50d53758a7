//! One-line diagnostics on stderr, filtered by a level read once at init (never `getenv` per call:
//! a peer lost 23% of training time to that).
//!
//! Levels follow HAMi's `LIBCUDA_LOG_LEVEL`: 0 errors, 1-2 also warnings/messages (default 2),
//! 3 also info, 4 also debug.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

pub const ERROR: u8 = 0;
pub const WARN: u8 = 2;
pub const INFO: u8 = 3;
pub const DEBUG: u8 = 4;

static LEVEL: AtomicU8 = AtomicU8::new(WARN);

pub fn set_level(level: u8) {
    LEVEL.store(level.min(DEBUG), Ordering::Relaxed);
}

#[inline]
pub fn enabled(level: u8) -> bool {
    level <= LEVEL.load(Ordering::Relaxed)
}

/// Time spent in one part of the hook, kept only while the debug log is on (the monitor's
/// debug lines print it): the total, and the longest single stretch, so that one rare stall
/// shows beside a small total.
pub struct Spent {
    total_ns: AtomicU64,
    max_ns: AtomicU64,
}

impl Spent {
    pub const fn new() -> Self {
        Spent { total_ns: AtomicU64::new(0), max_ns: AtomicU64::new(0) }
    }

    /// Run `f`, counting its wall time when the debug log is on.
    #[inline]
    pub fn time<T>(&self, f: impl FnOnce() -> T) -> T {
        if !enabled(DEBUG) {
            return f();
        }
        let t0 = crate::clock::fast_now_ns();
        let r = f();
        self.add(crate::clock::fast_now_ns().saturating_sub(t0));
        r
    }

    pub fn add(&self, ns: u64) {
        self.total_ns.fetch_add(ns, Ordering::Relaxed);
        self.max_ns.fetch_max(ns, Ordering::Relaxed);
    }

    /// `NAME_us=TOTAL NAME_max_us=LONGEST`
    pub fn show(&self, name: &str) -> String {
        let us = |a: &AtomicU64| a.load(Ordering::Relaxed) / 1000;
        format!("{name}_us={} {name}_max_us={}", us(&self.total_ns), us(&self.max_ns))
    }
}

impl Default for Spent {
    fn default() -> Self {
        Self::new()
    }
}

/// Write one line `[libvgpu pid N] LEVEL: msg` with a single `write(2)` so lines from many
/// processes do not interleave. Never panics, never allocates on failure paths beyond the line.
pub fn emit(level: u8, args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let tag = match level {
        ERROR => "ERROR",
        1..=WARN => "WARN",
        INFO => "INFO",
        _ => "DEBUG",
    };
    let mut line = Vec::with_capacity(160);
    let _ = write!(line, "[libvgpu pid {}] {}: ", std::process::id(), tag);
    let _ = line.write_fmt(args);
    line.push(b'\n');
    write_stderr_quietly(&line);
}

/// One `write(2)` to fd 2 that cannot raise SIGPIPE in the host program (a stderr whose reader
/// is gone would kill it, for a line it never asked for): SIGPIPE is blocked on this thread for
/// the write, and one it raised is taken back before the mask is restored. A failed write is
/// ignored on purpose.
fn write_stderr_quietly(buf: &[u8]) {
    // SAFETY: signal-set calls on local sets; the write is of a valid buffer; the old mask is
    // restored on every path.
    unsafe {
        let mut pipe: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut pipe);
        libc::sigaddset(&mut pipe, libc::SIGPIPE);
        let mut pending: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut pending);
        libc::sigpending(&mut pending);
        let already = libc::sigismember(&pending, libc::SIGPIPE) == 1;
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, &pipe, &mut old);
        let r = libc::write(2, buf.as_ptr().cast(), buf.len());
        if r < 0 && *libc::__errno_location() == libc::EPIPE && !already {
            let none = libc::timespec { tv_sec: 0, tv_nsec: 0 };
            libc::sigtimedwait(&pipe, std::ptr::null_mut(), &none);
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
    }
}

#[macro_export]
macro_rules! vgpu_log {
    ($lvl:expr, $($arg:tt)*) => {
        if $crate::log::enabled($lvl) { $crate::log::emit($lvl, format_args!($($arg)*)) }
    };
}
#[macro_export]
macro_rules! error { ($($arg:tt)*) => { $crate::vgpu_log!($crate::log::ERROR, $($arg)*) }; }
#[macro_export]
macro_rules! warn { ($($arg:tt)*) => { $crate::vgpu_log!($crate::log::WARN, $($arg)*) }; }
#[macro_export]
macro_rules! info { ($($arg:tt)*) => { $crate::vgpu_log!($crate::log::INFO, $($arg)*) }; }
#[macro_export]
macro_rules! debug { ($($arg:tt)*) => { $crate::vgpu_log!($crate::log::DEBUG, $($arg)*) }; }

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn level_filters() {
        set_level(ERROR);
        assert!(enabled(ERROR) && !enabled(WARN));
        set_level(9);
        assert!(enabled(DEBUG));
        set_level(WARN);
        assert!(enabled(WARN) && !enabled(INFO));
    }

    #[test]
    fn spent_keeps_the_total_and_the_longest_stretch() {
        let s = Spent::new();
        assert_eq!(s.show("sync"), "sync_us=0 sync_max_us=0");
        for ns in [2_000, 100_450_000, 7_000] {
            s.add(ns);
        }
        assert_eq!(s.show("sync"), "sync_us=100459 sync_max_us=100450");
    }
}
