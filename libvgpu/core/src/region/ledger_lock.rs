//! A device ledger's lock: one word in the shared region (`SharedDeviceState::ledger_lock`), 0
//! when free, else the holder's process id. Taking and giving it back is a compare-and-swap each,
//! where the OFD byte lock it replaces cost two `fcntl` calls per capped allocation (1.6 us of a
//! capped cuMemAlloc + cuMemFree on the mock, 2% of a 1 MiB pair on an H100).
//!
//! The kernel does not drop a word for a dead holder, so a waiter takes over a word whose process
//! is gone (a zombie counts as gone), and a value that names no process (garbage written into the
//! file) is taken over too. A stopped or frozen holder is waited for at most until the caller's
//! deadline, as before. Threads of one process exclude each other the same way (their id is the
//! same; the holder is alive, so they wait). The id is the process id as the container sees it:
//! every process sharing a region shares its PID namespace.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{AcqRel, Acquire};
use std::time::{Duration, Instant};

/// This process's id as a lock value (never 0).
pub fn own_id() -> u64 {
    std::process::id() as u64
}

/// Whether `id` is a live process that could hold the lock: `kill(id, 0)` finds it (EPERM
/// included) and it is not a zombie. Values outside the PID range name nobody.
pub fn holder_alive(id: u64) -> bool {
    if id == 0 || id > i32::MAX as u64 {
        return false;
    }
    let pid = id as libc::pid_t;
    // SAFETY: signal 0 only checks that the process exists and may be signalled.
    let found = unsafe { libc::kill(pid, 0) } == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    found && !zombie(pid)
}

/// The whole process exited and waits to be reaped: its leader's state is `Z` and no other thread
/// is left. A leader is `Z` too while its other threads still run (it called pthread_exit) or
/// still tear down (a SIGKILL reaches every thread; the descriptors close with the last one), and
/// then the process may still hold what it held.
fn zombie(pid: libc::pid_t) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    // The state follows the command name, which is in parentheses and may itself hold any byte.
    let leader_z = stat.rfind(')').and_then(|i| stat[i + 1..].trim_start().chars().next()) == Some('Z');
    leader_z && std::fs::read_dir(format!("/proc/{pid}/task")).is_ok_and(|d| d.count() == 1)
}

/// One attempt: take a free word, or one whose holder `alive` says is gone.
pub fn try_take(word: &AtomicU64, me: u64, alive: impl Fn(u64) -> bool) -> bool {
    match word.compare_exchange(0, me, AcqRel, Acquire) {
        Ok(_) => true,
        Err(held) => !alive(held) && word.compare_exchange(held, me, AcqRel, Acquire).is_ok(),
    }
}

/// Take the word, polling until `deadline`: false if it is still held by a live process then.
pub fn take_until(word: &AtomicU64, me: u64, deadline: Instant, alive: impl Fn(u64) -> bool) -> bool {
    let mut pause = Duration::from_micros(10);
    loop {
        if try_take(word, me, &alive) {
            return true;
        }
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        std::thread::sleep(pause.min(deadline - now));
        // Short pauses: a waiter must look often enough not to be starved by newcomers while the
        // lock changes hands quickly.
        pause = (pause * 2).min(Duration::from_micros(250));
    }
}

/// Give the word back, unless someone took it over meanwhile (we were taken for dead).
pub fn give(word: &AtomicU64, me: u64) {
    let _ = word.compare_exchange(me, 0, AcqRel, Acquire);
}

/// The live holder of `word`, if any.
pub fn holder(word: &AtomicU64) -> Option<u64> {
    Some(word.load(Acquire)).filter(|&h| holder_alive(h))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_free_word_is_taken_and_given_back() {
        let w = AtomicU64::new(0);
        assert!(try_take(&w, 7, |_| true));
        assert_eq!(w.load(Acquire), 7);
        assert!(!try_take(&w, 8, |_| true), "held by a live process");
        give(&w, 7);
        assert_eq!(w.load(Acquire), 0);
    }

    #[test]
    fn a_dead_holders_word_is_taken_over() {
        let w = AtomicU64::new(7);
        assert!(try_take(&w, 8, |h| h != 7));
        assert_eq!(w.load(Acquire), 8);
        give(&w, 7); // the old holder's late give-back must not free the new holder's lock
        assert_eq!(w.load(Acquire), 8);
    }

    #[test]
    fn a_live_holder_is_waited_for_until_the_deadline_only() {
        let w = AtomicU64::new(7);
        let t = Instant::now();
        assert!(!take_until(&w, 8, t + Duration::from_millis(30), |_| true));
        let took = t.elapsed();
        assert!(took >= Duration::from_millis(30) && took < Duration::from_secs(2), "{took:?}");
    }

    #[test]
    fn threads_of_one_process_exclude_each_other() {
        use std::sync::atomic::AtomicU32;
        let w = AtomicU64::new(0);
        let inside = AtomicU32::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..200 {
                        assert!(take_until(&w, own_id(), Instant::now() + Duration::from_secs(10), holder_alive));
                        assert_eq!(inside.fetch_add(1, AcqRel), 0, "two threads inside at once");
                        inside.fetch_sub(1, AcqRel);
                        give(&w, own_id());
                    }
                });
            }
        });
    }

    #[test]
    fn liveness_knows_this_process_a_reaped_one_and_garbage() {
        assert!(holder_alive(own_id()));
        assert!(!holder_alive(0));
        assert!(!holder_alive(u64::MAX), "not a pid");
        let mut c = std::process::Command::new("true").spawn().unwrap();
        let pid = c.id() as u64;
        // exited but not reaped: a zombie holds nothing
        let t = Instant::now();
        while holder_alive(pid) && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!holder_alive(pid), "a zombie counts as gone");
        c.wait().unwrap();
        assert!(!holder_alive(pid), "a reaped process is gone");
    }
}
