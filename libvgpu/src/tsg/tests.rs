//! The channel-group record against a fake resource manager behind the `ioctl` override (the
//! real one is a GPU's): each case is a finding of the session-13 review that failed before its
//! fix. The statics are the process's, so the cases run in one test, in order.

use super::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::{Duration, Instant};

/// Timeslice per (client, object) of the fake driver's channel groups.
static RM: Mutex<Option<HashMap<(u32, u32), u64>>> = Mutex::new(None);
static FAIL_ALLOC: AtomicBool = AtomicBool::new(false);
/// A set-timeslice of this value waits (inside the driver) until `RELEASE`.
static PARK_ON: AtomicU64 = AtomicU64::new(u64::MAX);
static PARKED: AtomicBool = AtomicBool::new(false);
static RELEASE: AtomicBool = AtomicBool::new(false);
/// A set-timeslice of this value takes effect, then waits (before the driver returns) until `RELEASE`.
static PARK_AFTER: AtomicU64 = AtomicU64::new(u64::MAX);
/// Set-timeslice controls on this object fail (as the driver refuses one below its minimum).
static FAIL_SET_OBJECT: AtomicU32 = AtomicU32::new(u32::MAX);
/// Get-timeslice controls on this object fail with a status that does not say it is gone.
static FAIL_GET_OBJECT: AtomicU32 = AtomicU32::new(u32::MAX);

fn rm() -> std::sync::MutexGuard<'static, Option<HashMap<(u32, u32), u64>>> {
    RM.lock().unwrap_or_else(|e| e.into_inner())
}

unsafe extern "C" fn fake(_fd: c_int, request: c_ulong, arg: *mut c_void) -> c_int {
    match rm::decode(request) {
        Call::Alloc => {
            let a = arg.cast::<rm::AllocHead>().read();
            let status = arg.cast::<u8>().add(28).cast::<u32>();
            if FAIL_ALLOC.load(SeqCst) {
                *status = 0x1f; // NV_ERR_INSERT_DUPLICATE_NAME: nothing allocated
            } else {
                rm().get_or_insert_default().insert((a.root, a.new), 2048);
                *status = 0;
            }
            0
        }
        Call::Free => {
            let f = arg.cast::<rm::Free>();
            let fr = f.read();
            rm().get_or_insert_default().retain(|k, _| !(k.0 == fr.root && (k.1 == fr.old || fr.old == fr.root)));
            (*f).status = 0;
            0
        }
        Call::Control => {
            let c = arg.cast::<rm::Control>();
            let ts = (*c).params as usize as *mut rm::Timeslice;
            if (*c).cmd == rm::CTRL_SET_TIMESLICE && (*ts).us == PARK_ON.load(SeqCst) {
                PARKED.store(true, SeqCst);
                while !RELEASE.load(SeqCst) {
                    std::thread::yield_now();
                }
            }
            {
                let mut m = rm();
                let Some(v) = m.get_or_insert_default().get_mut(&((*c).client, (*c).object)) else {
                    (*c).status = 0x57; // NV_ERR_OBJECT_NOT_FOUND
                    return 0;
                };
                if (*c).cmd == rm::CTRL_GET_TIMESLICE && (*c).object == FAIL_GET_OBJECT.load(SeqCst) {
                    (*c).status = 0x56; // NV_ERR_NOT_SUPPORTED
                    return 0;
                }
                if (*c).cmd == rm::CTRL_SET_TIMESLICE && (*c).object == FAIL_SET_OBJECT.load(SeqCst) {
                    (*c).status = 0x56; // NV_ERR_NOT_SUPPORTED
                    return 0;
                }
                match (*c).cmd {
                    rm::CTRL_GET_TIMESLICE => (*ts).us = *v,
                    rm::CTRL_SET_TIMESLICE => *v = (*ts).us,
                    _ => {}
                }
                (*c).status = 0;
            }
            if (*c).cmd == rm::CTRL_SET_TIMESLICE && (*ts).us == PARK_AFTER.load(SeqCst) {
                PARKED.store(true, SeqCst);
                while !RELEASE.load(SeqCst) {
                    std::thread::yield_now();
                }
            }
            0
        }
        Call::Other => -1,
    }
}

/// A fresh fake driver on a character device of ours (`/dev/null`, its major the driver's).
fn reset() -> c_int {
    let _ = FAKE.set(fake);
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::stat(c"/dev/null".as_ptr(), &mut st) }, 0);
    DRIVER_MAJOR.store(libc::major(st.st_rdev), SeqCst);
    RECORD.store(std::ptr::null_mut(), SeqCst);
    SHORT.store(false, SeqCst);
    for k in &KNOWN {
        k.store(0, SeqCst);
    }
    *rm() = Some(HashMap::new());
    FAIL_ALLOC.store(false, SeqCst);
    FAIL_SET_OBJECT.store(u32::MAX, SeqCst);
    FAIL_GET_OBJECT.store(u32::MAX, SeqCst);
    PARK_ON.store(u64::MAX, SeqCst);
    PARK_AFTER.store(u64::MAX, SeqCst);
    PARKED.store(false, SeqCst);
    RELEASE.store(false, SeqCst);
    unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) }
}

#[repr(C)]
struct Nvos21 {
    h: rm::AllocHead,
    params: u64,
    size: u32,
    status: u32,
}

fn alloc(fd: c_int, client: u32, parent: u32, object: u32) {
    let mut a = Nvos21 { h: rm::AllocHead { root: client, parent, new: object, class: rm::CHANNEL_GROUP }, params: 0, size: 0, status: 0 };
    unsafe { ioctl(fd, 0xc020_462b, (&mut a as *mut Nvos21).cast()) };
}

fn libcuda_sets(fd: c_int, client: u32, object: u32, us: u64) {
    let mut ts = rm::Timeslice { us };
    let mut c = rm::Control { client, object, cmd: rm::CTRL_SET_TIMESLICE, params: &mut ts as *mut _ as u64, params_size: 8, ..Default::default() };
    unsafe { ioctl(fd, rm::control_request(), (&mut c as *mut rm::Control).cast()) };
    assert_eq!(ts.us, us, "the caller's value is never changed");
}

fn free(fd: c_int, client: u32, object: u32) {
    let mut f = rm::Free { root: client, parent: client, old: object, status: 0 };
    unsafe { ioctl(fd, 0xc010_4629, (&mut f as *mut rm::Free).cast()) };
}

fn tracked_now() -> usize {
    tracking().map_or(0, |r| r.tracked.load(SeqCst))
}

fn actual(client: u32, object: u32) -> Option<u64> {
    rm().as_ref().and_then(|m| m.get(&(client, object)).copied())
}

#[test]
fn channel_groups_against_a_fake_driver() {
    // Shortened, then restored to what it was; short() says so.
    let fd = reset();
    alloc(fd, 1, 5, 10);
    apply(Some(50));
    assert_eq!((actual(1, 10), short()), (Some(50), true));
    apply(None);
    assert_eq!((actual(1, 10), short()), (Some(2048), false));

    // Between our two timeslices (short, shared) and back: libcuda's is the one restored, and
    // while a change is under way the launch path does not read the groups as set.
    apply(Some(50));
    apply(Some(500));
    assert_eq!((actual(1, 10), short()), (Some(500), true));
    PARK_ON.store(50, SeqCst);
    let t = std::thread::spawn(|| apply(Some(50)));
    while !PARKED.load(SeqCst) {
        std::thread::yield_now();
    }
    assert!(!short(), "a group still at 500 us read as set while the monitor moves it to 50");
    RELEASE.store(true, SeqCst);
    t.join().unwrap();
    PARK_ON.store(u64::MAX, SeqCst);
    PARKED.store(false, SeqCst);
    RELEASE.store(false, SeqCst);
    assert_eq!((actual(1, 10), short()), (Some(50), true));
    apply(None);
    assert_eq!((actual(1, 10), short()), (Some(2048), false), "restored to a timeslice of ours");

    // libcuda changes the timeslice while the group is not held: a later restore writes that.
    libcuda_sets(fd, 1, 10, 1024);
    apply(Some(50));
    apply(None);
    assert_eq!(actual(1, 10), Some(1024), "a restore wrote a stale original");

    // libcuda sets a held group: the driver gets libcuda's value, then ours again.
    apply(Some(50));
    libcuda_sets(fd, 1, 10, 2048);
    assert_eq!((actual(1, 10), short()), (Some(50), true));
    apply(None);
    assert_eq!(actual(1, 10), Some(2048));

    // One group the driver will not shorten: our work is not all preempted quickly, so the
    // launches keep giving way themselves (node); the other group is still shortened.
    let fd = reset();
    alloc(fd, 1, 5, 10);
    alloc(fd, 1, 5, 11);
    FAIL_SET_OBJECT.store(11, SeqCst);
    apply(Some(50));
    assert_eq!((actual(1, 10), actual(1, 11), short()), (Some(50), Some(2048), false), "short() with a group at libcuda's timeslice");

    // A group made between two ticks runs libcuda's timeslice until the next: not short till then.
    let fd = reset();
    alloc(fd, 1, 5, 10);
    apply(Some(50));
    alloc(fd, 1, 5, 11);
    assert!(!short(), "short() with a new group at libcuda's timeslice");
    apply(Some(50));
    assert_eq!((actual(1, 11), short()), (Some(50), true));

    // libcuda sets a held group on a descriptor we do not watch (more driver descriptors than
    // `KNOWN` holds): the next tick reads the group, keeps libcuda's value, and sets ours again.
    let _ = reset();
    let fds: Vec<c_int> = (0..=KNOWN_FDS).map(|_| unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) }).collect();
    for (i, &f) in fds.iter().enumerate() {
        alloc(f, 1, 5, 10 + i as u32);
    }
    apply(Some(50));
    let last = 10 + KNOWN_FDS as u32;
    libcuda_sets(fds[KNOWN_FDS], 1, last, 1024);
    apply(Some(50));
    assert_eq!((actual(1, last), short()), (Some(50), true), "a group set unseen stays at libcuda's timeslice");
    apply(None);
    assert_eq!(actual(1, last), Some(1024), "libcuda's value is the one to restore");
    fds.iter().for_each(|&f| unsafe {
        libc::close(f);
    });

    // A refused group whose client went away unseen: forgotten, the others count again.
    let fd = reset();
    alloc(fd, 1, 5, 10);
    FAIL_SET_OBJECT.store(10, SeqCst);
    apply(Some(50));
    unsafe { libc::close(fd) };
    rm().as_mut().unwrap().retain(|k, _| k.0 != 1);
    FAIL_SET_OBJECT.store(u32::MAX, SeqCst);
    let fd2 = unsafe { libc::open(c"/dev/zero".as_ptr(), libc::O_RDWR) };
    alloc(fd2, 2, 6, 20);
    apply(Some(50));
    assert_eq!((actual(2, 20), short(), tracked_now()), (Some(50), true, 1), "a refused group that is gone still counts");
    unsafe { libc::close(fd2) };

    // Reads of a live group at libcuda's timeslice keep failing (not with "no such object"):
    // it is never taken for gone, and the process is not short meanwhile.
    let fd = reset();
    alloc(fd, 1, 5, 10);
    alloc(fd, 1, 5, 11);
    FAIL_GET_OBJECT.store(11, SeqCst);
    apply(Some(50));
    assert!(!short());
    apply(Some(50));
    assert_eq!((actual(1, 10), actual(1, 11), short(), tracked_now()), (Some(50), Some(2048), false, 2), "a live group taken for gone");
    unsafe { libc::close(fd) };

    // A free in the tick after a failed read does not make the process short again: the group
    // that could not be read may run libcuda's timeslice (set unseen).
    let fd = reset();
    alloc(fd, 1, 5, 10);
    alloc(fd, 1, 5, 11);
    apply(Some(50));
    rm().as_mut().unwrap().insert((1, 10), 2048); // libcuda's set on a descriptor not watched
    FAIL_GET_OBJECT.store(10, SeqCst);
    apply(Some(50));
    free(fd, 1, 11);
    assert!(!short(), "short while an unread group runs 2048 us");
    FAIL_GET_OBJECT.store(u32::MAX, SeqCst);
    apply(Some(50));
    assert_eq!((actual(1, 10), short()), (Some(50), true));
    unsafe { libc::close(fd) };

    // One failed read of a held group: short again once reads work, and restored after.
    let fd = reset();
    alloc(fd, 1, 5, 10);
    apply(Some(50));
    FAIL_GET_OBJECT.store(10, SeqCst);
    apply(Some(50));
    assert!(!short(), "an unread group is not known to be short");
    FAIL_GET_OBJECT.store(u32::MAX, SeqCst);
    apply(Some(50));
    let held_short = short();
    apply(None);
    assert_eq!((held_short, actual(1, 10)), (true, Some(2048)), "one failed read left the group refused for good");
    unsafe { libc::close(fd) };

    // A failed allocation reusing a held group's handle is not a group.
    let fd = reset();
    alloc(fd, 1, 5, 10);
    apply(Some(50));
    FAIL_ALLOC.store(true, SeqCst);
    alloc(fd, 1, 5, 10);
    apply(None);
    assert_eq!(actual(1, 10), Some(2048), "the held group was never restored");

    // Its descriptor closed: not short any more, whatever the next ticks want.
    let fd = reset();
    alloc(fd, 1, 5, 10);
    apply(Some(50));
    unsafe { libc::close(fd) };
    apply(None);
    apply(Some(50));
    assert!(!short(), "short() with no live group");

    // Freed with its parent (the device object): forgotten.
    let fd = reset();
    alloc(fd, 1, 5, 10);
    apply(Some(50));
    free(fd, 1, 5);
    assert_eq!((tracked_now(), short()), (0, false));

    // libcuda's set is inside the driver when the monitor shortens the group: ours wins after.
    let fd = reset();
    alloc(fd, 1, 5, 10);
    PARK_ON.store(1024, SeqCst);
    let t = std::thread::spawn(move || libcuda_sets(fd, 1, 10, 1024));
    while !PARKED.load(SeqCst) {
        std::thread::yield_now();
    }
    apply(Some(50));
    RELEASE.store(true, SeqCst);
    t.join().unwrap();
    assert_eq!((actual(1, 10), short()), (Some(50), true), "the group runs libcuda's value while we count it short");
    apply(None);
    assert_eq!(actual(1, 10), Some(1024), "libcuda asked 1024 last");

    // libcuda's set lands, then our restore, then libcuda's bookkeeping: libcuda's value wins.
    let fd = reset();
    alloc(fd, 1, 5, 10);
    apply(Some(50));
    PARK_AFTER.store(1024, SeqCst);
    let t = std::thread::spawn(move || libcuda_sets(fd, 1, 10, 1024));
    while !PARKED.load(SeqCst) {
        std::thread::yield_now();
    }
    apply(None);
    RELEASE.store(true, SeqCst);
    t.join().unwrap();
    assert_eq!((actual(1, 10), short()), (Some(1024), false), "a restore overwrote libcuda's newer value");

    // Threads making their first channel groups at once: none is lost.
    for round in 0..500 {
        let fd = reset();
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(4));
        let threads: Vec<_> = (0..4u32)
            .map(|i| {
                let b = barrier.clone();
                std::thread::spawn(move || {
                    b.wait();
                    alloc(fd, 1, 5, 100 + i);
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(tracked_now(), 4, "round {round}: a group allocated on a fresh record was lost");
        unsafe { libc::close(fd) };
    }

    // A file that is not the driver's: nothing recorded.
    let fd = reset();
    DRIVER_MAJOR.store(u32::MAX, SeqCst);
    alloc(fd, 1, 5, 10);
    assert_eq!(tracked_now(), 0);

    // A forked child never waits on the parent's record, even one locked at the fork.
    let fd = reset();
    alloc(fd, 1, 5, 10);
    let held = std::thread::spawn(|| {
        let _g = lock(record());
        std::thread::sleep(Duration::from_millis(1500));
    });
    std::thread::sleep(Duration::from_millis(100));
    let child = unsafe { libc::fork() };
    if child == 0 {
        free(fd, 1, 5);
        alloc(fd, 2, 5, 11);
        libcuda_sets(fd, 2, 11, 1024);
        apply(Some(50));
        unsafe { libc::_exit(if short() && tracked_now() == 1 { 0 } else { 3 }) };
    }
    let t0 = Instant::now();
    let mut status = 0;
    while unsafe { libc::waitpid(child, &mut status, libc::WNOHANG) } == 0 {
        if t0.elapsed() > Duration::from_secs(1) {
            unsafe { libc::kill(child, libc::SIGKILL) };
            unsafe { libc::waitpid(child, &mut status, 0) };
            panic!("the forked child waited on the parent's record");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    held.join().unwrap();
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child status {status:#x}");
    assert_eq!(tracked_now(), 1, "the parent's record is its own");
}
