//! A device ledger's lock across processes: one word in the shared region
//! (`SharedDeviceState::ledger_lock`), 0 when free, else a token naming its holder. Taking and
//! giving it back is a compare-and-swap each, where the OFD byte lock it replaces cost two
//! `fcntl` calls per capped allocation (1.6 us of a capped cuMemAlloc + cuMemFree on the mock, 2%
//! of a 1 MiB pair on an H100). Threads of one process exclude each other with an in-process
//! mutex first (`Region::lock_device`).
//!
//! The kernel does not release a word, so a waiter takes it over when its holder is gone. A
//! process with a slot in the region holds it as that slot (index and generation): gone when the
//! slot was freed or retaken, or when nobody holds the slot's lifetime byte (`LOCK_SLOT + s`, an
//! OFD lock the kernel drops at death and at exec, whatever the PID namespace, unless a forked
//! child keeps the descriptor: then the holder counts as alive, as its slot does). A process without
//! a slot (a tool) holds it by PID: gone when `kill(pid, 0)` fails or the process is a zombie with
//! no thread left; a PID names a process only in the namespace that wrote it, so a tool must run
//! in the container's. A value that is neither (garbage written into the file) is taken over.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{AcqRel, Acquire};
use std::time::{Duration, Instant};

const SLOT_TAG: u64 = 1 << 63;

/// Who a lock word names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holder {
    /// A process holding the lock as its region slot `index`, taken at `generation`.
    Slot { index: usize, generation: u32 },
    /// A process without a slot, by PID.
    Pid(u32),
    /// Not a value any holder writes.
    Garbage,
}

impl Holder {
    pub fn token(self) -> u64 {
        match self {
            Holder::Slot { index, generation } => SLOT_TAG | (generation as u64) << 16 | (index as u64 & 0xffff),
            Holder::Pid(pid) => pid as u64,
            Holder::Garbage => u64::MAX,
        }
    }

    pub fn of(token: u64) -> Holder {
        if token & SLOT_TAG != 0 {
            if token >> 48 & 0x7fff != 0 {
                return Holder::Garbage;
            }
            Holder::Slot { index: (token & 0xffff) as usize, generation: (token >> 16) as u32 }
        } else if token == 0 || token > i32::MAX as u64 {
            Holder::Garbage
        } else {
            Holder::Pid(token as u32)
        }
    }
}

/// Whether process `pid` (of our PID namespace) is alive: `kill(pid, 0)` finds it (EPERM
/// included) and it is not a zombie.
pub fn pid_alive(pid: u32) -> bool {
    if pid == 0 || pid > i32::MAX as u32 {
        return false;
    }
    let pid = pid as libc::pid_t;
    // SAFETY: signal 0 only checks that the process exists and may be signalled.
    let found = unsafe { libc::kill(pid, 0) } == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    found && !super::teardown::zombie(pid)
}

/// One attempt: take a free word, or one whose holder `alive` says is gone.
pub fn try_take(word: &AtomicU64, me: u64, alive: impl Fn(u64) -> bool) -> bool {
    match word.compare_exchange(0, me, AcqRel, Acquire) {
        Ok(_) => true,
        Err(held) => !alive(held) && word.compare_exchange(held, me, AcqRel, Acquire).is_ok(),
    }
}

/// Take the word, polling until `deadline()` (asked only if the first attempt fails): false if it
/// is still held by a live holder then.
pub fn take_until(word: &AtomicU64, me: u64, deadline: impl Fn() -> Instant, alive: impl Fn(u64) -> bool) -> bool {
    let mut pause = Duration::from_micros(10);
    loop {
        if try_take(word, me, &alive) {
            return true;
        }
        let (now, deadline) = (Instant::now(), deadline());
        if now >= deadline {
            return false;
        }
        std::thread::sleep(pause.min(deadline - now));
        // Short pauses: a waiter must look often enough not to be starved by newcomers while the
        // lock changes hands quickly.
        pause = (pause * 2).min(Duration::from_micros(250));
    }
}

/// Give the word back, unless someone took it over meanwhile (we were taken for gone).
pub fn give(word: &AtomicU64, me: u64) {
    let _ = word.compare_exchange(me, 0, AcqRel, Acquire);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_free_word_is_taken_and_given_back() {
        let w = AtomicU64::new(0);
        assert!(try_take(&w, 7, |_| true));
        assert_eq!(w.load(Acquire), 7);
        assert!(!try_take(&w, 8, |_| true), "held by a live holder");
        give(&w, 7);
        assert_eq!(w.load(Acquire), 0);
    }

    #[test]
    fn a_gone_holders_word_is_taken_over() {
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
        assert!(!take_until(&w, 8, || t + Duration::from_millis(30), |_| true));
        let took = t.elapsed();
        assert!(took >= Duration::from_millis(30) && took < Duration::from_secs(2), "{took:?}");
    }

    #[test]
    fn tokens_name_their_holder_and_nothing_else() {
        for h in [Holder::Slot { index: 0, generation: 0 }, Holder::Slot { index: 1023, generation: u32::MAX }, Holder::Pid(1), Holder::Pid(i32::MAX as u32)] {
            assert_eq!(Holder::of(h.token()), h);
            assert_ne!(h.token(), 0, "a holder never reads as free");
        }
        assert_eq!(Holder::of(u64::MAX), Holder::Garbage);
        assert_eq!(Holder::of(1 << 40), Holder::Garbage, "beyond any PID");
        assert_eq!(Holder::of(SLOT_TAG | 1 << 50), Holder::Garbage, "bits no slot token sets");
    }

    proptest::proptest! {
        #[test]
        fn any_word_decodes_without_panicking(token: u64) {
            let h = Holder::of(token);
            if h != Holder::Garbage {
                proptest::prop_assert_eq!(Holder::of(h.token()), h);
            }
        }
    }

    #[test]
    fn liveness_knows_this_process_a_zombie_a_reaped_one_and_garbage() {
        assert!(pid_alive(std::process::id()));
        assert!(!pid_alive(0));
        assert!(!pid_alive(u32::MAX), "not a pid");
        let mut c = std::process::Command::new("true").spawn().unwrap();
        let pid = c.id();
        // exited but not reaped: a zombie holds nothing
        let t = Instant::now();
        while pid_alive(pid) && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!pid_alive(pid), "a zombie counts as gone");
        c.wait().unwrap();
        assert!(!pid_alive(pid), "a reaped process is gone");
    }
}
