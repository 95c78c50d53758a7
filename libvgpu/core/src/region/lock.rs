//! OFD (open file description) byte-range locks. The kernel drops them when the last descriptor of
//! the description closes, so a SIGKILLed holder never blocks anyone. They do not exclude threads
//! sharing one description: callers pair them with an in-process `Mutex`.
//!
//! Lock bytes live far beyond any data (`LOCK_BASE`), so the layout can grow without moving them.

use std::io;
use std::os::fd::RawFd;

pub const LOCK_BASE: i64 = 1 << 40;
/// Slot table (register/unregister/reap, initialization).
pub const LOCK_TABLE: i64 = LOCK_BASE;
// LOCK_BASE + 1 ..= + 16 were the device ledgers' bytes (now `ledger_lock` words): left unused, so
// an older build's byte lock never meets a newer lock here.
/// Every process using the region holds a read lock here for its lifetime; a write lock that can
/// be taken proves nobody lives on the file (safe to recreate it).
pub const LOCK_LIVENESS: i64 = LOCK_BASE + 48;
/// Slot s's owner holds a write lock on `LOCK_SLOT + s` for its lifetime.
pub const LOCK_SLOT: i64 = LOCK_BASE + 64;

fn flock(kind: libc::c_int, start: i64) -> libc::flock {
    // SAFETY: flock is plain old data; all-zero is valid (l_pid must be 0 for OFD locks).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = start;
    fl.l_len = 1;
    fl
}

/// Non-blocking lock of one byte: Ok(true) taken, Ok(false) held by another description.
pub fn try_lock(fd: RawFd, write: bool, byte: i64) -> io::Result<bool> {
    let fl = flock(if write { libc::F_WRLCK } else { libc::F_RDLCK }, byte);
    // SAFETY: as above.
    let r = unsafe { libc::fcntl(fd, libc::F_OFD_SETLK, &fl) };
    if r == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EACCES) => Ok(false),
        _ => Err(e),
    }
}

/// Release one byte.
pub fn unlock(fd: RawFd, byte: i64) {
    let fl = flock(libc::F_UNLCK, byte);
    // SAFETY: as above; unlocking a byte we do not hold is a no-op.
    unsafe { libc::fcntl(fd, libc::F_OFD_SETLK, &fl) };
}

/// Lock one byte, polling `F_OFD_SETLK` until `deadline`: Ok(true) taken, Ok(false) still held by
/// another description at the deadline. Never waits on a stopped or frozen holder past the bound.
pub fn lock_until(fd: RawFd, write: bool, byte: i64, deadline: std::time::Instant) -> io::Result<bool> {
    let mut pause = std::time::Duration::from_micros(20);
    loop {
        if try_lock(fd, write, byte)? {
            return Ok(true);
        }
        let now = std::time::Instant::now();
        if now >= deadline {
            return Ok(false);
        }
        std::thread::sleep(pause.min(deadline - now));
        // Short pauses: polling is less fair than a queued F_OFD_SETLKW, so a waiter must look
        // often enough not to be starved by newcomers while the lock changes hands quickly.
        pause = (pause * 2).min(std::time::Duration::from_micros(250));
    }
}

/// Whether another open file description holds a lock on `byte` that a write lock would conflict
/// with (`F_OFD_GETLK`; read access suffices). Errors read as "not held".
pub fn held_by_other(fd: RawFd, byte: i64) -> bool {
    let mut fl = flock(libc::F_WRLCK, byte);
    // SAFETY: valid fd, valid flock; the kernel only writes into `fl`.
    let r = unsafe { libc::fcntl(fd, libc::F_OFD_GETLK, &mut fl) };
    r == 0 && fl.l_type != libc::F_UNLCK as libc::c_short
}
