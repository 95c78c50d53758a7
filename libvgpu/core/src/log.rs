//! One-line diagnostics on stderr, filtered by a level read once at init (never `getenv` per call:
//! a peer lost 23% of training time to that).
//!
//! Levels follow HAMi's `LIBCUDA_LOG_LEVEL`: 0 errors, 1-2 also warnings/messages (default 2),
//! 3 also info, 4 also debug.

use std::sync::atomic::{AtomicU8, Ordering};

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
    // SAFETY: writing a valid buffer to fd 2; a failed write is ignored on purpose.
    unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
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
}
