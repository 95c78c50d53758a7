//! This process's channel groups (`vgpu_core::rm`): the `ioctl` shim (`hooks::ioctl`) records
//! the ones the driver allocates on its own character devices and forgets the freed ones; while
//! a higher-priority container shares the GPU (`node`), the monitor sets their timeslice short,
//! so the GPU switches to that container's work within about that much of a kernel of ours, and
//! sets back what libcuda chose once it is gone. While it holds them short, each tick reads every
//! group first: a set of libcuda's we did not see (on a descriptor we do not watch) is undone
//! within a tick, and a group the driver says is gone (`rm::STATUS_GONE`) is forgotten; a read
//! that fails otherwise leaves the group as it is and the process not short until one reads it.
//!
//! Every request reaches the driver first, unchanged; the caller's memory is read only after the
//! driver accepted the call on one of its own files (so it read those bytes itself), and errno
//! is kept. The record belongs to one process: a forked child starts its own without touching
//! (or waiting on) the parent's. A signal handler that allocates a channel group while its
//! thread is inside `apply` would wait on the record's lock (libcuda is not async-signal-safe).

use std::ffi::{c_int, c_ulong, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicPtr, AtomicU32, AtomicUsize, Ordering::*};
use std::sync::{Mutex, MutexGuard};

use crate::real::{Lib, Slot};
use vgpu_core::rm::{self, Call, Groups, Step};

type IoctlFn = unsafe extern "C" fn(c_int, c_ulong, *mut c_void) -> c_int;

/// glibc's `ioctl`.
// SAFETY: `ioctl(int, unsigned long, ...)`: its third argument is passed as a pointer.
static REAL: Slot<IoctlFn> = unsafe { Slot::new(Lib::Libc, c"ioctl") };
/// The unit tests' fake driver, in place of glibc's `ioctl`.
#[cfg(test)]
static FAKE: std::sync::OnceLock<IoctlFn> = std::sync::OnceLock::new();
/// This process's record; a forked child makes its own (the parent's may have been locked by a
/// thread the child does not have), so the owner's pid is part of it.
struct Record {
    owner: u32,
    /// Groups recorded: frees look at the record only while some are.
    tracked: AtomicUsize,
    groups: Mutex<Groups>,
}
static RECORD: AtomicPtr<Record> = AtomicPtr::new(std::ptr::null_mut());
/// Descriptors seen to be the driver's character devices (+1; 0: empty): only calls on them are
/// looked at, so other ioctls cost no `fstat`. Inherited by a forked child with the descriptors.
const KNOWN_FDS: usize = 8;
static KNOWN: [AtomicI64; KNOWN_FDS] = [const { AtomicI64::new(0) }; KNOWN_FDS];
/// Every channel group of this process runs the short timeslice (read on the launch path: a
/// plain load, no `getpid`). A forked child inherits it, but cannot launch before it makes
/// groups of its own, and a new group clears it.
static SHORT: AtomicBool = AtomicBool::new(false);
static WARNED: AtomicBool = AtomicBool::new(false);
/// The driver's device major (tests use another device's).
static DRIVER_MAJOR: AtomicU32 = AtomicU32::new(rm::DRIVER_MAJOR);

fn pid() -> u32 {
    std::process::id()
}

/// Does the GPU switch away from all our kernels within a short timeslice now?
pub(crate) fn short() -> bool {
    SHORT.load(Relaxed)
}

/// This process's record, made on first use (in a forked child: its own, the parent's untouched).
fn record() -> &'static Record {
    let me = pid();
    loop {
        let p = RECORD.load(Acquire);
        // SAFETY: records are leaked, never freed.
        if let Some(r) = unsafe { p.as_ref() }.filter(|r| r.owner == me) {
            return r;
        }
        let fresh = Box::into_raw(Box::new(Record { owner: me, tracked: AtomicUsize::new(0), groups: Mutex::new(Groups::default()) }));
        if RECORD.compare_exchange(p, fresh, AcqRel, Acquire).is_ok() {
            // SAFETY: just published, never freed.
            return unsafe { &*fresh };
        }
        // SAFETY: `fresh` was never shared; another thread published first: look again.
        drop(unsafe { Box::from_raw(fresh) });
    }
}

/// This process's record if it tracks some groups (never makes one).
fn tracking() -> Option<&'static Record> {
    // SAFETY: records are leaked, never freed.
    let r = unsafe { RECORD.load(Acquire).as_ref() }?;
    (r.tracked.load(Relaxed) > 0 && r.owner == pid()).then_some(r)
}

fn lock(r: &Record) -> MutexGuard<'_, Groups> {
    r.groups.lock().unwrap_or_else(|e| e.into_inner())
}

fn known(fd: c_int) -> bool {
    KNOWN.iter().any(|k| k.load(Relaxed) == fd as i64 + 1)
}

fn remember(fd: c_int) {
    if known(fd) {
        return;
    }
    for k in &KNOWN {
        if k.compare_exchange(0, fd as i64 + 1, Relaxed, Relaxed).is_ok() {
            return;
        }
    }
}

/// The driver's call, by glibc's `ioctl` (or the system call, should it not be found).
unsafe fn call(fd: c_int, request: c_ulong, arg: *mut c_void) -> c_int {
    #[cfg(test)]
    if let Some(f) = FAKE.get() {
        return f(fd, request, arg);
    }
    match REAL.get() {
        Some(f) => f(fd, request, arg),
        None => libc::syscall(libc::SYS_ioctl, fd, request, arg) as c_int,
    }
}

/// The (device, inode) of `fd` when it is one of the NVIDIA driver's character devices.
fn driver_file(fd: c_int) -> Option<(u64, u64)> {
    // SAFETY: fstat writes into the zeroed struct only.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } != 0 || st.st_mode & libc::S_IFMT != libc::S_IFCHR {
        return None;
    }
    (libc::major(st.st_rdev) == DRIVER_MAJOR.load(Relaxed)).then_some((st.st_dev, st.st_ino))
}

/// The exported `ioctl` (`hooks::ioctl`): the driver's answer, always.
pub(crate) unsafe fn ioctl(fd: c_int, request: c_ulong, arg: *mut c_void) -> c_int {
    let kind = if arg.is_null() { Call::Other } else { rm::decode(request) };
    let rc = call(fd, request, arg);
    // Allocations on any descriptor (a channel group may come on a new one); frees and controls
    // only on a driver descriptor seen before.
    let watch = rc == 0
        && match kind {
            Call::Other => false,
            Call::Alloc => true,
            Call::Free | Call::Control => known(fd),
        };
    if watch {
        let errno = *libc::__errno_location();
        // Bookkeeping only: whatever happens in it, the caller gets the driver's answer.
        let _ = catch_unwind(AssertUnwindSafe(|| observe(fd, request, kind, arg)));
        *libc::__errno_location() = errno;
    }
    rc
}

/// The driver accepted an allocation, free or control on `fd`: record or forget channel groups;
/// after libcuda set a group's timeslice, remember it and set the group where it must end.
unsafe fn observe(fd: c_int, request: c_ulong, kind: Call, arg: *mut c_void) {
    // Only on the driver's own files: it copied at least the size the request names from `arg`,
    // so those bytes are readable. A known descriptor was one (closing and reusing it for another
    // driver's 'F' requests of these exact shapes is not guarded).
    // The file, when this call had to look (the first call on a descriptor).
    let mut file = None;
    if !known(fd) {
        file = driver_file(fd);
        if file.is_none() {
            return;
        }
        remember(fd);
    }
    match kind {
        Call::Alloc => {
            let a = arg.cast::<rm::AllocHead>().read_unaligned();
            let Some(at) = rm::alloc_status_offset(request) else { return };
            let status = arg.cast::<u8>().add(at).cast::<u32>().read_unaligned();
            if a.class != rm::CHANNEL_GROUP || status != rm::STATUS_OK {
                return;
            }
            let Some(file) = file.or_else(|| driver_file(fd)) else { return };
            let r = record();
            let mut g = lock(r);
            g.allocated(fd, file, a.root, a.parent, a.new);
            r.tracked.store(g.list.len(), Relaxed);
            SHORT.store(false, Relaxed); // it runs libcuda's timeslice until the monitor's next tick
        }
        Call::Free => {
            let f = arg.cast::<rm::Free>().read_unaligned();
            // The status first: `tracking` asks for the pid.
            if f.status != rm::STATUS_OK {
                return;
            }
            let Some(r) = tracking() else { return };
            let mut g = lock(r);
            g.freed(f.root, f.old);
            r.tracked.store(g.list.len(), Relaxed);
            publish_short(&g);
        }
        Call::Control => {
            let c = arg.cast::<rm::Control>().read_unaligned();
            let ts = c.params as usize as *const rm::Timeslice;
            if c.cmd != rm::CTRL_SET_TIMESLICE || c.status != rm::STATUS_OK || ts.is_null() || (c.params_size as usize) < size_of::<rm::Timeslice>() {
                return;
            }
            let Some(r) = tracking() else { return };
            let Some(file) = file.or_else(|| driver_file(fd)) else { return };
            // The driver took the value from there (status OK): readable.
            let asked = ts.read_unaligned().us;
            let mut g = lock(r);
            if let Some((i, us)) = g.on_set(file, c.client, c.object, asked) {
                if group_control(&g.list[i], rm::CTRL_SET_TIMESLICE, us).is_err() {
                    g.refuse(i);
                    publish_short(&g);
                }
            }
        }
        Call::Other => {}
    }
}

fn publish_short(g: &Groups) {
    SHORT.store(g.short(), Relaxed);
}

/// Why a control on a group of ours failed.
enum Failed {
    /// The driver answered with this status.
    Status(u32),
    /// The system call failed.
    Os(std::io::Error),
}

impl Failed {
    /// The driver says the group (or its client) is not there any more.
    fn gone(&self) -> bool {
        matches!(self, Failed::Status(s) if rm::STATUS_GONE.contains(s))
    }
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failed::Status(s) => write!(f, "status 0x{s:x}"),
            Failed::Os(e) => e.fmt(f),
        }
    }
}

/// One control on a group of ours: `Ok(timeslice)` or why it failed.
fn group_control(g: &rm::Group, cmd: u32, us: u64) -> Result<u64, Failed> {
    let mut ts = rm::Timeslice { us };
    let mut c = rm::Control {
        client: g.client,
        object: g.object,
        cmd,
        params: &mut ts as *mut rm::Timeslice as usize as u64,
        params_size: size_of::<rm::Timeslice>() as u32,
        ..rm::Control::default()
    };
    // SAFETY: a control on our own group, on the file it was allocated on; params point at `ts`.
    let rc = unsafe { call(g.fd, rm::control_request(), (&mut c as *mut rm::Control).cast()) };
    match (rc, c.status) {
        (0, rm::STATUS_OK) => Ok(ts.us),
        (0, s) => Err(Failed::Status(s)),
        _ => Err(Failed::Os(std::io::Error::last_os_error())),
    }
}

/// Monitor tick: bring every group to `want` (`Some(us)`: that timeslice, a higher-priority
/// container is on the GPU; `None`: the one libcuda gave it). Nothing happens while that holds.
/// A new `want` reads as not short until every group runs it.
pub(crate) fn apply(want: Option<u64>) {
    let Some(r) = tracking() else {
        SHORT.store(false, Relaxed);
        return;
    };
    let mut g = lock(r);
    if g.want != want {
        // Not the timeslice the launch path thinks we run until every group is set to it.
        SHORT.store(false, Relaxed);
    }
    g.want = want;
    let steps = g.plan(want);
    // `unread`: a held group could not be read this tick (not gone): not known to be short.
    let (mut done, mut failed, mut gone, mut unread) = (0, None, Vec::new(), false);
    for (i, step) in steps {
        if driver_file(g.list[i].fd) != Some(g.list[i].file) {
            gone.push(i); // its descriptor was closed (and maybe reused): the group went with it
            continue;
        }
        let result = match step {
            Step::Probe => {
                if group_control(&g.list[i], rm::CTRL_GET_TIMESLICE, 0).is_err_and(|e| e.gone()) {
                    gone.push(i); // its client went away unseen
                }
                continue;
            }
            Step::Shorten { us } => match group_control(&g.list[i], rm::CTRL_GET_TIMESLICE, 0) {
                Ok(current) if !g.read(i, current, us) => continue,
                Ok(_) => group_control(&g.list[i], rm::CTRL_SET_TIMESLICE, us).map(|_| Some(us)),
                Err(e) if e.gone() => {
                    gone.push(i);
                    continue;
                }
                Err(why) => {
                    unread = true; // left as it was; read again next tick
                    failed = Some(why);
                    continue;
                }
            },
            Step::Restore { us } => group_control(&g.list[i], rm::CTRL_SET_TIMESLICE, us).map(|_| None),
        };
        match result {
            Ok(set) => {
                let grp = &mut g.list[i];
                grp.set_us = set;
                grp.touched = true;
                done += 1;
            }
            Err(why) => {
                g.refuse(i);
                failed = Some(why);
            }
        }
    }
    g.forget(&gone);
    g.unread = unread;
    r.tracked.store(g.list.len(), Relaxed);
    publish_short(&g);
    if done > 0 {
        match want {
            Some(us) => vgpu_core::debug!("channel groups: {done} set to a {us} us timeslice (a higher-priority container shares the GPU)"),
            None => vgpu_core::debug!("channel groups: {done} back to their own timeslice"),
        }
    }
    if let Some(why) = failed {
        if !WARNED.swap(true, Relaxed) {
            vgpu_core::warn!(
                "cannot read or set a channel group's timeslice ({why}): a higher-priority container's work may wait up to ~2 ms behind a kernel of this one"
            );
        }
    }
}

#[cfg(test)]
mod tests;
