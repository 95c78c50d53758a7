//! Safe wrappers over the real driver/NVML functions the policies call: queries they do not
//! hook, and hooked ones' real implementations. Every call goes through a typed slot of `sys`
//! (the one list); never through our shims.
// Handles (`CUstream`, `nvmlDevice_t`) are opaque values handed to the driver, never dereferenced.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use crate::ffi::*;
use crate::sys::real;
use std::ffi::{c_char, c_int, c_uint, c_void};

/// Call the real `$name` through its typed slot: `None` when the library does not export it.
macro_rules! call {
    ($name:ident($($a:expr),* $(,)?)) => {
        match real::$name.get() {
            // SAFETY: the slot's signature is the symbol's (sys.rs, checked by ci/check-abi.py);
            // every wrapper below passes valid out pointers and handles the driver gave us.
            Some(f) => Some(unsafe { f($($a),*) }),
            None => None,
        }
    };
}

/// Number of devices the driver shows this process (after CUDA_VISIBLE_DEVICES); `None` when the
/// driver is not initialized or absent.
pub fn device_count() -> Option<usize> {
    let mut n: c_int = 0;
    let r = call!(cuDeviceGetCount(&mut n))?;
    (r == CUDA_SUCCESS && n >= 0).then_some(n as usize)
}

pub fn device_get(ordinal: usize) -> Option<CUdevice> {
    let mut d: CUdevice = 0;
    let r = call!(cuDeviceGet(&mut d, ordinal as c_int))?;
    (r == CUDA_SUCCESS).then_some(d)
}

pub fn device_uuid(dev: CUdevice) -> Option<CUuuid> {
    let mut u = CUuuid::default();
    let r = call!(cuDeviceGetUuid_v2(&mut u, dev))
        .or_else(|| call!(cuDeviceGetUuid(&mut u, dev)))?;
    (r == CUDA_SUCCESS).then_some(u)
}

/// Physical memory of `dev` (the real `cuDeviceTotalMem_v2`).
pub fn device_total_mem(dev: CUdevice) -> Option<u64> {
    let mut b: usize = 0;
    let r = call!(cuDeviceTotalMem_v2(&mut b, dev))?;
    (r == CUDA_SUCCESS).then_some(b as u64)
}

pub fn device_attribute(attr: CUdevice_attribute, dev: CUdevice) -> Option<c_int> {
    let mut v: c_int = 0;
    let r = call!(cuDeviceGetAttribute(&mut v, attr, dev))?;
    (r == CUDA_SUCCESS).then_some(v)
}

/// Device of the calling thread's current context.
pub fn current_device() -> Option<CUdevice> {
    let mut d: CUdevice = 0;
    let r = call!(cuCtxGetDevice(&mut d))?;
    (r == CUDA_SUCCESS).then_some(d)
}

/// The calling thread's current context (0 when none).
#[inline]
pub fn current_context() -> u64 {
    let mut c: CUcontext = std::ptr::null_mut();
    match call!(cuCtxGetCurrent(&mut c)) {
        Some(CUDA_SUCCESS) => c as u64,
        _ => 0,
    }
}

/// Context of an explicitly created stream.
pub fn stream_context(stream: CUstream) -> Option<CUcontext> {
    let mut c: CUcontext = std::ptr::null_mut();
    let r = call!(cuStreamGetCtx(stream, &mut c))?;
    (r == CUDA_SUCCESS && !c.is_null()).then_some(c)
}

/// A new non-blocking stream in the current context.
pub fn stream_create_nonblocking() -> Option<CUstream> {
    const CU_STREAM_NON_BLOCKING: c_uint = 1;
    let mut s: CUstream = std::ptr::null_mut();
    let r = call!(cuStreamCreate(&mut s, CU_STREAM_NON_BLOCKING))?;
    (r == CUDA_SUCCESS).then_some(s)
}

/// Run `f` with this thread's stream-capture mode set to relaxed, restoring it afterwards: our
/// own event calls must never invalidate a capture another thread runs in global mode.
pub fn with_relaxed_capture<T>(f: impl FnOnce() -> T) -> T {
    let prev = relax_capture();
    let r = f();
    restore_capture(prev);
    r
}

/// Switch this thread to relaxed capture mode; returns the mode to restore (`None`: unchanged).
pub fn relax_capture() -> Option<c_int> {
    const CU_STREAM_CAPTURE_MODE_RELAXED: c_int = 2;
    let mut mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    let r = call!(cuThreadExchangeStreamCaptureMode(&mut mode));
    (r == Some(CUDA_SUCCESS)).then_some(mode)
}

/// Undo `relax_capture`.
pub fn restore_capture(prev: Option<c_int>) {
    if let Some(mut mode) = prev {
        call!(cuThreadExchangeStreamCaptureMode(&mut mode));
    }
}

const CU_EVENT_BLOCKING_SYNC: c_uint = 1;
const CU_EVENT_DISABLE_TIMING: c_uint = 2;

/// An event in the current context, timing or not.
pub fn event_create(timing: bool) -> Option<CUevent> {
    event_with_flags(if timing { 0 } else { CU_EVENT_DISABLE_TIMING })
}

/// An untimed event to wait on as the current context's own synchronize would: sleeping where
/// the context was made for blocking waits (`CU_CTX_SCHED_BLOCKING_SYNC`), polling otherwise.
pub fn event_create_for_waiting() -> Option<CUevent> {
    const CU_CTX_SCHED_BLOCKING_SYNC: c_uint = 4;
    let mut flags: c_uint = 0;
    let blocking = call!(cuCtxGetFlags(&mut flags)) == Some(CUDA_SUCCESS) && flags & CU_CTX_SCHED_BLOCKING_SYNC != 0;
    event_with_flags(CU_EVENT_DISABLE_TIMING | if blocking { CU_EVENT_BLOCKING_SYNC } else { 0 })
}

fn event_with_flags(flags: c_uint) -> Option<CUevent> {
    let mut e: CUevent = std::ptr::null_mut();
    let r = call!(cuEventCreate(&mut e, flags))?;
    (r == CUDA_SUCCESS).then_some(e)
}

pub fn event_record(ev: CUevent, stream: CUstream) -> CUresult {
    call!(cuEventRecord(ev, stream)).unwrap_or(CUDA_ERROR_NOT_FOUND)
}

/// Whether `stream`'s work is all done (`CUDA_SUCCESS`; `CUDA_ERROR_NOT_READY`: not yet).
pub fn stream_query(stream: CUstream) -> CUresult {
    call!(cuStreamQuery(stream)).unwrap_or(CUDA_ERROR_NOT_FOUND)
}

/// Wait for `ev`'s work (the real call: no linger here).
pub fn event_synchronize(ev: CUevent) -> CUresult {
    call!(cuEventSynchronize(ev)).unwrap_or(CUDA_ERROR_NOT_FOUND)
}

pub fn event_query(ev: CUevent) -> CUresult {
    call!(cuEventQuery(ev)).unwrap_or(CUDA_ERROR_NOT_FOUND)
}

pub fn stream_wait_event(stream: CUstream, ev: CUevent) -> CUresult {
    call!(cuStreamWaitEvent(stream, ev, 0)).unwrap_or(CUDA_ERROR_NOT_FOUND)
}

/// Milliseconds from `start` to `end` (both completed timing events of one context).
pub fn event_elapsed_ms(start: CUevent, end: CUevent) -> Option<f32> {
    let mut ms: f32 = 0.0;
    let r = call!(cuEventElapsedTime(&mut ms, start, end))?;
    (r == CUDA_SUCCESS).then_some(ms)
}


/// Device a stream belongs to: `cuStreamGetDevice` (CUDA >= 12.8), else the device of the
/// stream's context (`cuStreamGetCtx`, then `known` (the caller's table of contexts it saw
/// created), `cuCtxGetDevice_v2` (13.0) or a push/get/pop of that context), else the current
/// device.
pub fn stream_device(stream: CUstream, known: impl Fn(CUcontext) -> Option<CUdevice>) -> Option<CUdevice> {
    let mut d: CUdevice = 0;
    if call!(cuStreamGetDevice(stream, &mut d)) == Some(CUDA_SUCCESS) {
        return Some(d);
    }
    let mut ctx: CUcontext = std::ptr::null_mut();
    if call!(cuStreamGetCtx(stream, &mut ctx)) == Some(CUDA_SUCCESS) && !ctx.is_null() {
        if let Some(d) = known(ctx).or_else(|| context_device(ctx)) {
            return Some(d);
        }
    }
    current_device()
}

/// Device of context `ctx` (not necessarily current).
pub fn context_device(ctx: CUcontext) -> Option<CUdevice> {
    let mut d: CUdevice = 0;
    match call!(cuCtxGetDevice_v2(&mut d, ctx)) {
        Some(CUDA_SUCCESS) => return Some(d),
        Some(_) => return None,
        None => {}
    }
    if call!(cuCtxPushCurrent_v2(ctx)) != Some(CUDA_SUCCESS) {
        return None;
    }
    let dev = current_device();
    let mut popped: CUcontext = std::ptr::null_mut();
    let _ = call!(cuCtxPopCurrent_v2(&mut popped));
    dev
}

/// Whether `stream` is capturing into a graph (work on it becomes graph nodes); `None` where
/// the driver cannot say (as on the legacy stream while another stream captures).
pub fn stream_capture_state(stream: CUstream) -> Option<bool> {
    let mut st: c_int = 0;
    (call!(cuStreamIsCapturing(stream, &mut st))? == CUDA_SUCCESS).then_some(st != 0)
}

/// `stream` is known to be capturing.
pub fn stream_capturing(stream: CUstream) -> bool {
    stream_capture_state(stream) == Some(true)
}

/// A 64-bit attribute of a memory pool.
pub fn pool_attr(pool: CUmemoryPool, attr: c_int) -> Option<u64> {
    let mut v: u64 = 0;
    // Relaxed: a free may come from inside the caller's stream capture.
    let r = with_relaxed_capture(|| {
        call!(cuMemPoolGetAttribute(pool, attr, &mut v as *mut u64 as *mut c_void))
    })?;
    (r == CUDA_SUCCESS).then_some(v)
}

/// Memory a pool reserves from the device (live allocations and what it keeps after frees).
pub fn pool_reserved(pool: CUmemoryPool) -> Option<u64> {
    pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)
}

/// The current pool of `dev` (where `cuMemAllocAsync` allocates), via the real function.
pub fn device_mem_pool(dev: CUdevice) -> Option<CUmemoryPool> {
    let mut p: CUmemoryPool = std::ptr::null_mut();
    let r = call!(cuDeviceGetMemPool(&mut p, dev))?;
    (r == CUDA_SUCCESS && !p.is_null()).then_some(p)
}

/// Give a pool's unused memory back (the real `cuMemPoolTrimTo`).
pub fn pool_trim(pool: CUmemoryPool, keep: usize) {
    call!(cuMemPoolTrimTo(pool, keep));
}

/// Graph memory reserved on `dev` (`CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`).
pub fn graph_mem_reserved(dev: CUdevice) -> Option<u64> {
    let mut v: u64 = 0;
    let r = call!(cuDeviceGetGraphMemAttribute(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &mut v as *mut u64 as *mut c_void))?;
    (r == CUDA_SUCCESS).then_some(v)
}

/// Give unused graph memory of `dev` back (the real `cuDeviceGraphMemTrim`).
pub fn graph_mem_trim(dev: CUdevice) {
    call!(cuDeviceGraphMemTrim(dev));
}

/// The context of a green context.
pub fn green_ctx_context(g: CUgreenCtx) -> Option<CUcontext> {
    let mut c: CUcontext = std::ptr::null_mut();
    let r = call!(cuCtxFromGreenCtx(&mut c, g))?;
    (r == CUDA_SUCCESS && !c.is_null()).then_some(c)
}

/// Free/total of the current context's device from the real `cuMemGetInfo_v2`.
pub fn mem_get_info() -> Option<(u64, u64)> {
    let (mut free, mut total) = (0usize, 0usize);
    let r = call!(cuMemGetInfo_v2(&mut free, &mut total))?;
    (r == CUDA_SUCCESS).then_some((free as u64, total as u64))
}

/// Advise the driver that managed memory `[ptr, ptr+len)` prefers device `dev`.
pub fn advise_preferred_device(ptr: CUdeviceptr, len: usize, dev: CUdevice) -> bool {
    let loc = CUmemLocation { type_: CU_MEM_LOCATION_TYPE_DEVICE, id: dev };
    let r = call!(cuMemAdvise_v2(ptr, len, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, loc))
    .or_else(|| call!(cuMemAdvise(ptr, len, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, dev)));
    r == Some(CUDA_SUCCESS)
}

/// Load a module from an image in the current context (the real `cuModuleLoadData`).
pub fn module_load_data(image: &std::ffi::CStr) -> Option<CUmodule> {
    let mut m: CUmodule = std::ptr::null_mut();
    let r = call!(cuModuleLoadData(&mut m, image.as_ptr().cast()))?;
    (r == CUDA_SUCCESS && !m.is_null()).then_some(m)
}

pub fn module_function(m: CUmodule, name: &std::ffi::CStr) -> Option<CUfunction> {
    let mut f: CUfunction = std::ptr::null_mut();
    let r = call!(cuModuleGetFunction(&mut f, m, name.as_ptr()))?;
    (r == CUDA_SUCCESS && !f.is_null()).then_some(f)
}

/// Page-locks and maps host memory for the current context (the real `cuMemHostRegister_v2`);
/// its device address.
pub fn host_register(p: *mut c_void, bytes: usize) -> Option<CUdeviceptr> {
    const CU_MEMHOSTREGISTER_DEVICEMAP: c_uint = 0x02;
    // Registered already: by a context still alive, whose mapping this one may not share.
    if call!(cuMemHostRegister_v2(p, bytes, CU_MEMHOSTREGISTER_DEVICEMAP))? != CUDA_SUCCESS {
        return None;
    }
    let mut d: CUdeviceptr = 0;
    let r = call!(cuMemHostGetDevicePointer_v2(&mut d, p, 0))?;
    (r == CUDA_SUCCESS && d != 0).then_some(d)
}

/// Launch `f` as one thread on `stream` with `params` (the real `cuLaunchKernel`: not gated).
pub fn launch_one_thread(f: CUfunction, stream: CUstream, params: &mut [*mut c_void]) -> CUresult {
    call!(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, stream, params.as_mut_ptr(), std::ptr::null_mut())).unwrap_or(CUDA_ERROR_NOT_FOUND)
}

/// Drop the primary-context reference just taken on `dev` (the real `cuDevicePrimaryCtxRelease_v2`).
pub fn primary_ctx_release(dev: CUdevice) {
    call!(cuDevicePrimaryCtxRelease_v2(dev));
}

/// Destroy a context this process just created (the real `cuCtxDestroy_v2`).
pub fn ctx_destroy(ctx: CUcontext) {
    call!(cuCtxDestroy_v2(ctx));
}

/// Destroy a green context this process just created (the real `cuGreenCtxDestroy`).
pub fn green_ctx_destroy(ctx: CUgreenCtx) {
    call!(cuGreenCtxDestroy(ctx));
}

/// Managed memory (the real `cuMemAllocManaged`); `None` when the driver does not export it.
pub fn mem_alloc_managed(dptr: &mut CUdeviceptr, bytes: usize, flags: c_uint) -> Option<CUresult> {
    call!(cuMemAllocManaged(dptr, bytes, flags))
}

/// Free a `cuMemAlloc_v2` allocation (the real `cuMemFree_v2`).
pub fn mem_free(ptr: CUdeviceptr) {
    call!(cuMemFree_v2(ptr));
}

/// Free a legacy 32-bit `cuMemAlloc` allocation (the real `cuMemFree`).
pub fn mem_free_v1(ptr: CUdeviceptr_v1) {
    call!(cuMemFree(ptr));
}

/// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (NVML's spelling of a CUDA UUID).
pub fn uuid_string(u: &CUuuid) -> String {
    use std::fmt::Write;
    let b = &u.bytes;
    let mut s = String::with_capacity(40);
    s.push_str("GPU-");
    for (i, x) in b.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        let _ = write!(s, "{x:02x}");
    }
    s
}

// ---------------------------------------------------------------------------------------------
// NVML (opened lazily: only context measurement and NVML hooks get here)

/// Initialize NVML once for our own queries (NVML counts init calls; the program's own
/// `nvmlShutdown` cannot take ours away). `false` when NVML is absent or fails.
pub fn nvml_ready() -> bool {
    use std::sync::atomic::{AtomicU8, Ordering};
    static STATE: AtomicU8 = AtomicU8::new(0); // 0 unknown, 1 ok, 2 failed
    match STATE.load(Ordering::Acquire) {
        1 => true,
        2 => false,
        _ => {
            let ok = call!(nvmlInit_v2()) == Some(NVML_SUCCESS);
            STATE.store(if ok { 1 } else { 2 }, Ordering::Release);
            ok
        }
    }
}

pub fn nvml_handle_by_uuid(uuid: &str) -> Option<nvmlDevice_t> {
    if !nvml_ready() {
        return None;
    }
    let c = std::ffi::CString::new(uuid).ok()?;
    let mut h: nvmlDevice_t = std::ptr::null_mut();
    let r = call!(nvmlDeviceGetHandleByUUID(c.as_ptr(), &mut h))?;
    (r == NVML_SUCCESS && !h.is_null()).then_some(h)
}

/// Percent of NVML's last sample period during which a kernel ran on the device (any tenant).
pub fn nvml_gpu_util(h: nvmlDevice_t) -> Option<u32> {
    let mut u = nvmlUtilization_t::default();
    let r = call!(nvmlDeviceGetUtilizationRates(h, &mut u))?;
    (r == NVML_SUCCESS).then_some(u.gpu)
}

/// NVML's own device utilization samples (`nvmlDeviceGetSamples`) taken after `since_us`
/// (CLOCK_REALTIME microseconds), as (timestamp, percent), oldest first: each covers one of
/// NVML's sample periods (200 ms on an H100), so their mean is the utilization over the time
/// they span. `Some(empty)`: nothing new; `None`: NVML cannot give them (no such call, an error).
pub fn nvml_gpu_util_samples(h: nvmlDevice_t, since_us: u64) -> Option<Vec<(u64, u32)>> {
    let mut buf = [nvmlSample_t::default(); 128];
    let (mut kind, mut n) = (0 as c_int, buf.len() as c_uint);
    let r = call!(nvmlDeviceGetSamples(h, NVML_GPU_UTILIZATION_SAMPLES, since_us, &mut kind, &mut n, buf.as_mut_ptr()))?;
    match r {
        NVML_SUCCESS => {}
        NVML_ERROR_NOT_FOUND => return Some(Vec::new()),
        _ => return None,
    }
    let mut got: Vec<(u64, u32)> = buf[..(n as usize).min(buf.len())]
        .iter()
        .filter(|s| s.time_stamp > since_us)
        .filter_map(|s| vgpu_core::policy::monitor::sample_percent(kind, s.sample_value).map(|v| (s.time_stamp, v)))
        .collect();
    got.sort_unstable();
    Some(got)
}

/// Highest SM utilization NVML sampled for host process `pid` since `since_us` (NVML's
/// microsecond timestamps); `None` when NVML has no sample of it (or no NVML).
pub fn nvml_process_sm_util(h: nvmlDevice_t, pid: u32, since_us: u64) -> Option<u32> {
    let mut n: c_uint = 0;
    let probe = call!(nvmlDeviceGetProcessUtilization(h, std::ptr::null_mut(), &mut n, since_us))?;
    if probe != NVML_ERROR_INSUFFICIENT_SIZE || n == 0 {
        return None;
    }
    let mut v = vec![nvmlProcessUtilizationSample_t::default(); n as usize + 4];
    let mut n = v.len() as c_uint;
    let r = call!(nvmlDeviceGetProcessUtilization(h, v.as_mut_ptr(), &mut n, since_us))?;
    if r != NVML_SUCCESS {
        return None;
    }
    v.iter().take(n as usize).filter(|x| x.pid == pid).map(|x| x.sm_util).max()
}

/// Device memory used as NVML reports it (the real `nvmlDeviceGetMemoryInfo`).
pub fn nvml_used(h: nvmlDevice_t) -> Option<u64> {
    let mut m = nvmlMemory_t::default();
    let r = call!(nvmlDeviceGetMemoryInfo(h, &mut m))?;
    (r == NVML_SUCCESS).then_some(m.used)
}

pub fn nvml_uuid(h: nvmlDevice_t) -> Option<String> {
    let mut buf = [0 as c_char; NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    let r = call!(nvmlDeviceGetUUID(h, buf.as_mut_ptr(), buf.len() as c_uint))?;
    if r != NVML_SUCCESS {
        return None;
    }
    // SAFETY: NVML NUL-terminates within the buffer on success; the last byte is NUL anyway.
    buf[buf.len() - 1] = 0;
    let s = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    Some(s.to_string_lossy().into_owned())
}

pub fn nvml_index(h: nvmlDevice_t) -> Option<u32> {
    let mut i: c_uint = 0;
    let r = call!(nvmlDeviceGetIndex(h, &mut i))?;
    (r == NVML_SUCCESS).then_some(i)
}


/// Device memory NVML attributes to process `pid` in a compute process list
/// (`nvml_compute_processes`); `None` when `pid` is not listed (e.g. a container PID namespace:
/// NVML lists host PIDs).
pub fn nvml_process_used(procs: &[nvmlProcessInfo_t], pid: u32) -> Option<u64> {
    procs.iter().find(|p| p.pid == pid).map(|p| p.used_gpu_memory)
}

/// The compute processes host NVML lists on a device (every tenant's), `None` when it cannot say.
pub fn nvml_compute_processes(h: nvmlDevice_t) -> Option<Vec<nvmlProcessInfo_t>> {
    let f = real::nvmlDeviceGetComputeRunningProcesses_v3.get()?;
    let mut cap = 64usize;
    while cap <= 4096 {
        let mut buf = vec![nvmlProcessInfo_t::default(); cap];
        let mut n = cap as c_uint;
        // SAFETY: `buf` holds `n` entries.
        let r = unsafe { f(h, &mut n, buf.as_mut_ptr()) };
        match r {
            NVML_SUCCESS => {
                buf.truncate(n as usize);
                return Some(buf);
            }
            NVML_ERROR_INSUFFICIENT_SIZE => cap = (n as usize).max(cap * 2),
            _ => return None,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn uuid_format() {
        let u = CUuuid { bytes: [0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 1, 2, 3, 4, 5, 6, 7, 8] };
        assert_eq!(uuid_string(&u), "GPU-12345678-9abc-def0-0102-030405060708");
    }
}
