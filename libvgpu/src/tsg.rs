//! This process's channel groups (`vgpu_core::rm`): the `ioctl` shim (`hooks::ioctl`) records
//! the ones the driver allocates on `/dev/nvidiactl` and forgets the freed ones; while a
//! higher-priority container shares the GPU (`node`), the monitor sets their timeslice short, so
//! the GPU switches to that container's work within about that much of a kernel of ours, and
//! sets back what libcuda chose once it is gone. Every other ioctl goes straight through.

use std::ffi::{c_int, c_ulong, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering::*};
use std::sync::{Mutex, MutexGuard};

use vgpu_core::rm::{self, Call, Groups, Step};

type IoctlFn = unsafe extern "C" fn(c_int, c_ulong, *mut c_void) -> c_int;

/// glibc's `ioctl` (0: not resolved yet).
static REAL: AtomicUsize = AtomicUsize::new(0);
/// The record; replaced (leaked) in a forked child, whose parent may have held it at the fork.
static GROUPS: AtomicPtr<Mutex<Groups>> = AtomicPtr::new(std::ptr::null_mut());
/// Groups recorded: frees look at the record only while some are.
static TRACKED: AtomicUsize = AtomicUsize::new(0);
static WARNED: AtomicBool = AtomicBool::new(false);
/// Some group of ours runs the short timeslice (the last `apply` wanted one and set it).
static SHORT: AtomicBool = AtomicBool::new(false);

/// Does the GPU switch away from our kernels within a short timeslice now?
pub(crate) fn short() -> bool {
    SHORT.load(Relaxed)
}

fn real() -> Option<IoctlFn> {
    let mut p = REAL.load(Relaxed);
    if p == 0 {
        // SAFETY: NUL-terminated name; glibc's dlsym called from this object: RTLD_NEXT is libc's.
        p = unsafe { crate::real::real_dlsym()(libc::RTLD_NEXT, c"ioctl".as_ptr()) } as usize;
        REAL.store(p, Relaxed);
    }
    // SAFETY: `ioctl(int, unsigned long, ...)`: its third argument is passed as a pointer.
    (p != 0).then(|| unsafe { std::mem::transmute::<usize, IoctlFn>(p) })
}

/// The driver's call, by glibc's `ioctl` (or the system call, should it not be found).
unsafe fn call(fd: c_int, request: c_ulong, arg: *mut c_void) -> c_int {
    match real() {
        Some(f) => f(fd, request, arg),
        None => libc::syscall(libc::SYS_ioctl, fd, request, arg) as c_int,
    }
}

fn groups() -> MutexGuard<'static, Groups> {
    let mut p = GROUPS.load(Acquire);
    if p.is_null() {
        let fresh = Box::into_raw(Box::new(Mutex::new(Groups::default())));
        p = match GROUPS.compare_exchange(std::ptr::null_mut(), fresh, AcqRel, Acquire) {
            Ok(_) => fresh,
            Err(existing) => {
                // SAFETY: `fresh` was never shared.
                drop(unsafe { Box::from_raw(fresh) });
                existing
            }
        };
    }
    // SAFETY: leaked, never freed.
    unsafe { &*p }.lock().unwrap_or_else(|e| e.into_inner())
}

/// The (device, inode) of the file behind `fd`.
fn file_of(fd: c_int) -> Option<(u64, u64)> {
    // SAFETY: fstat writes into the zeroed struct only.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

/// The exported `ioctl` (`hooks::ioctl`).
pub(crate) unsafe fn ioctl(fd: c_int, request: c_ulong, arg: *mut c_void) -> c_int {
    #[allow(clippy::unnecessary_cast)] // c_ulong is u64 on the one target (x86-64)
    let kind = if arg.is_null() { Call::Other } else { rm::decode(request as u64) };
    match kind {
        Call::Other => call(fd, request, arg),
        Call::Control => control_call(fd, request, arg.cast()),
        Call::Alloc | Call::Free => {
            let rc = call(fd, request, arg);
            if rc == 0 {
                let errno = *libc::__errno_location();
                // Bookkeeping only: whatever happens in it, the caller gets the driver's answer.
                let _ = catch_unwind(AssertUnwindSafe(|| observe(fd, kind, arg)));
                *libc::__errno_location() = errno;
            }
            rc
        }
    }
}

/// An allocation or free went through: record or forget channel groups.
unsafe fn observe(fd: c_int, kind: Call, arg: *mut c_void) {
    if kind == Call::Alloc {
        let a = arg.cast::<rm::AllocHead>().read_unaligned();
        if a.class == rm::CHANNEL_GROUP {
            if let Some(file) = file_of(fd) {
                let mut g = groups();
                g.allocated(fd, file, a.root, a.new);
                TRACKED.store(g.list.len(), Relaxed);
            }
        }
    } else if TRACKED.load(Relaxed) > 0 {
        let f = arg.cast::<rm::Free>().read_unaligned();
        if f.status == rm::STATUS_OK {
            let mut g = groups();
            g.freed(f.root, f.old);
            TRACKED.store(g.list.len(), Relaxed);
        }
    }
}

/// A control call: libcuda setting the timeslice of a group we hold short gets ours instead.
unsafe fn control_call(fd: c_int, request: c_ulong, c: *mut rm::Control) -> c_int {
    let ctl = c.read_unaligned();
    let ts = ctl.params as usize as *mut rm::Timeslice;
    if ctl.cmd != rm::CTRL_SET_TIMESLICE || ts.is_null() || (ctl.params_size as usize) < size_of::<rm::Timeslice>() || TRACKED.load(Relaxed) == 0 {
        return call(fd, request, c.cast());
    }
    let asked = ts.read_unaligned().us;
    let ours = catch_unwind(AssertUnwindSafe(|| groups().on_set(ctl.client, ctl.object, asked))).ok().flatten();
    let Some(us) = ours else { return call(fd, request, c.cast()) };
    ts.write_unaligned(rm::Timeslice { us });
    let rc = call(fd, request, c.cast());
    let errno = *libc::__errno_location();
    ts.write_unaligned(rm::Timeslice { us: asked });
    *libc::__errno_location() = errno;
    rc
}

/// One control on a group of ours: `Ok(timeslice)` or the reason it failed.
fn group_control(g: &rm::Group, cmd: u32, us: u64) -> Result<u64, String> {
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
    let rc = unsafe { call(g.fd, rm::control_request() as c_ulong, (&mut c as *mut rm::Control).cast()) };
    match (rc, c.status) {
        (0, rm::STATUS_OK) => Ok(ts.us),
        (0, s) => Err(format!("status 0x{s:x}")),
        _ => Err(std::io::Error::last_os_error().to_string()),
    }
}

/// Monitor tick: bring every group to `want` (`Some(us)`: that timeslice, a higher-priority
/// container is on the GPU; `None`: the one libcuda gave it). Nothing happens while that holds.
pub(crate) fn apply(want: Option<u64>) {
    if TRACKED.load(Relaxed) == 0 {
        SHORT.store(false, Relaxed);
        return;
    }
    let mut g = groups();
    let steps = g.plan(want);
    if steps.is_empty() {
        SHORT.store(want.is_some() && g.list.iter().any(|x| x.set_us == want), Relaxed);
        return;
    }
    let (mut done, mut failed) = (0, None);
    for (i, step) in steps {
        let grp = &mut g.list[i];
        if file_of(grp.fd) != Some(grp.file) {
            grp.refused = true; // its descriptor was closed (and maybe reused): not ours any more
            continue;
        }
        let result = match step {
            Step::Shorten { us } => {
                let orig = match grp.original_us {
                    Some(o) => Ok(o),
                    None => group_control(grp, rm::CTRL_GET_TIMESLICE, 0),
                };
                orig.and_then(|o| {
                    grp.original_us = Some(o);
                    group_control(grp, rm::CTRL_SET_TIMESLICE, us).map(|_| Some(us))
                })
            }
            Step::Restore { us } => group_control(grp, rm::CTRL_SET_TIMESLICE, us).map(|_| None),
        };
        match result {
            Ok(set) => {
                grp.set_us = set;
                done += 1;
            }
            Err(why) => {
                grp.refused = true;
                failed = Some(why);
            }
        }
    }
    SHORT.store(want.is_some() && g.list.iter().any(|x| x.set_us == want), Relaxed);
    match want {
        Some(us) => vgpu_core::debug!("channel groups: {done} set to a {us} us timeslice (a higher-priority container shares the GPU)"),
        None => vgpu_core::debug!("channel groups: {done} back to their own timeslice"),
    }
    if let Some(why) = failed {
        if !WARNED.swap(true, Relaxed) {
            vgpu_core::warn!(
                "cannot set a channel group's timeslice ({why}): a higher-priority container's work may wait up to ~2 ms behind a kernel of this one"
            );
        }
    }
}

/// In a forked child: the parent's groups are not ours (and its record may have been locked).
pub(crate) fn after_fork_child() {
    GROUPS.store(std::ptr::null_mut(), Release);
    TRACKED.store(0, Relaxed);
    SHORT.store(false, Relaxed);
}
