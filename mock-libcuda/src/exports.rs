//! The exported driver API: one line per symbol (see `driver_exports!`).
#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

use crate::driver::*;
use crate::driver_exports;
use crate::ffi::*;
use mock_gpu::{now_ns, sleep_until_ns, GpuState};
use std::ffi::{c_char, c_uint, c_void, CStr};

fn rc(r: R<()>) -> CUresult {
    r.err().unwrap_or(CUDA_SUCCESS)
}

/// Run on the initialized process state.
fn run(f: impl FnOnce(&mut Proc, &'static GpuState) -> R<()>) -> CUresult {
    rc(with_init(f))
}

/// Run `f` until it completes, sleeping (outside the lock) whenever it asks to wait.
fn run_steps(mut f: impl FnMut(&mut Proc, &'static GpuState) -> R<Step>) -> CUresult {
    loop {
        match with_init(&mut f) {
            Ok(Step::Done) => return CUDA_SUCCESS,
            Ok(Step::WaitThen(t)) => sleep_until_ns(t),
            Err(e) => return e,
        }
    }
}

/// A synchronize: `f` says until when, we sleep, then pools release their idle memory.
fn sync_until<U: Into<Until>>(f: impl FnOnce(&mut Proc) -> R<U>) -> CUresult {
    match with_init(|p, _| f(p).map(Into::into)) {
        Ok(until) => {
            // A spin's word can move meanwhile (another thread's synchronize): look again often.
            loop {
                let (end, now) = (until.ends(), now_ns());
                if now >= end {
                    break;
                }
                sleep_until_ns(if until.spins.is_empty() { end } else { end.min(now + 100_000) });
            }
            run(|p, st| {
                p.release_pools(st);
                Ok(())
            })
        }
        Err(e) => e,
    }
}

/// Copy a Rust string into a caller's C buffer of `len` bytes, truncating, NUL-terminated.
unsafe fn copy_cstr(dst: *mut c_char, len: i32, s: &str) -> R<()> {
    if dst.is_null() || len <= 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let n = s.len().min(len as usize - 1);
    std::ptr::copy_nonoverlapping(s.as_ptr() as *const c_char, dst, n);
    *dst.add(n) = 0;
    Ok(())
}

unsafe fn ctx_create(pctx: *mut Handle, dev: CUdevice) -> CUresult {
    run(|p, st| {
        if pctx.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let d = p.dev(st, dev)?;
        let c = p.create_ctx(st, d, false)?;
        STACK.with(|s| s.borrow_mut().push(c));
        out(pctx, h(c))
    })
}

unsafe fn primary_release(dev: CUdevice, reset: bool) -> CUresult {
    run(|p, st| {
        let d = p.dev(st, dev)?;
        p.release_primary(st, d, reset)
    })
}

unsafe fn primary_set_flags(dev: CUdevice, flags: c_uint) -> CUresult {
    run(|p, st| {
        let d = p.dev(st, dev)?;
        // Scheduling mask, blocking sync, map host, lmem resize, coredump/ sync-memops bits.
        if flags & !0x7F != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        p.primary[d].flags = flags;
        Ok(())
    })
}

unsafe fn mem_alloc(dptr: *mut CUdeviceptr, size: u64, kind: Kind) -> CUresult {
    run(|p, st| {
        let (c, d) = p.cur()?;
        if dptr.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let ptr = p.alloc(st, c, d, size, kind)?;
        out(dptr, ptr)
    })
}

unsafe fn host_alloc(pp: *mut *mut c_void, size: usize) -> CUresult {
    run(|p, _| {
        if pp.is_null() || size == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        p.cur()?;
        let mut mem: *mut c_void = std::ptr::null_mut();
        // Pinned host memory is real host memory; page-aligned like the driver's.
        if libc::posix_memalign(&mut mem, 4096, size) != 0 {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        p.host.insert(mem as usize);
        out(pp, mem)
    })
}

/// Synchronous copies and sets order after all earlier work of the context (legacy stream).
/// Bytes a copy or memset moves per nanosecond (100 GB/s). Copies and memsets take device time
/// like kernels, and NVML counts it (on an H100 a loop of memsets or copies, no kernel at all,
/// reads 98-100% utilization).
const COPY_BYTES_PER_NS: u64 = 100;

fn copy_node(bytes: u64) -> Node {
    Node { blocks: 1, wave_ns: (bytes / COPY_BYTES_PER_NS).max(1_000), threads: 1 }
}

/// A synchronous copy or memset: queued on the legacy stream, returns when the context is idle.
fn sync_copy(bytes: u64, check: impl Fn(&Proc) -> R<()>) -> CUresult {
    let r = run_steps(|p, st| {
        p.cur()?;
        check(p)?;
        if bytes == 0 {
            return Ok(Step::Done);
        }
        p.submit(st, 0, &[copy_node(bytes)])
    });
    if r != CUDA_SUCCESS {
        return r;
    }
    sync_until(|p| {
        let (c, _) = p.cur()?;
        Ok(p.ctx_idle_at(c))
    })
}

fn async_copy(stream: Handle, bytes: u64, check: impl Fn(&Proc) -> R<()>) -> CUresult {
    run_steps(|p, st| {
        p.cur()?;
        p.stream_mut(stream as u64)?;
        check(p)?;
        if bytes == 0 {
            return Ok(Step::Done);
        }
        p.submit(st, stream as u64, &[copy_node(bytes)])
    })
}

unsafe fn memset(dst: CUdeviceptr, elem: u64, n: usize, stream: Option<Handle>) -> CUresult {
    let check = |p: &Proc| {
        if !dst.is_multiple_of(elem) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if n == 0 {
            return Ok(());
        }
        p.check_range(dst, elem * n as u64)
    };
    let bytes = elem * n as u64;
    match stream {
        Some(s) => async_copy(s, bytes, check),
        None => sync_copy(bytes, check),
    }
}

unsafe fn alloc_async(dptr: *mut CUdeviceptr, size: usize, pool: Option<Handle>, stream: Handle) -> CUresult {
    run(|p, st| {
        if dptr.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (c, d) = p.stream_dev(stream as u64)?;
        let pool = match pool {
            Some(pl) => pl as u64,
            None => p.current_pool(d),
        };
        // Captured: an alloc node of the capture graph (memory comes with the graph's launch).
        if let Some(g) = p.stream_mut(stream as u64)?.capture {
            let pd = p.pools.get(&pool).ok_or(CUDA_ERROR_INVALID_VALUE)?.dev;
            let ptr = p.graph_alloc(g, pd, size as u64)?;
            return out(dptr, ptr);
        }
        let ptr = p.alloc_from_pool(st, c, pool, size as u64)?;
        out(dptr, ptr)
    })
}

unsafe fn free_async(dptr: CUdeviceptr, stream: Handle) -> CUresult {
    run(|p, st| {
        p.stream_dev(stream as u64)?;
        if p.is_graph_ptr(dptr) {
            return Ok(()); // a free node: graph memory lives with the graph
        }
        p.free(st, dptr)
    })
}

/// `CUDA_MODULE_LOADING=LAZY` (the real driver's default since CUDA 12.2): a module's code is
/// loaded, and its context grows, at the first launch rather than at the load. The mock grows at
/// the load unless the variable says LAZY.
fn lazy_loading() -> bool {
    static LAZY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *LAZY.get_or_init(|| std::env::var("CUDA_MODULE_LOADING").is_ok_and(|v| v.trim().eq_ignore_ascii_case("lazy")))
}

unsafe fn load_data(module: *mut Handle, image: *const c_void) -> CUresult {
    run(|p, st| {
        p.cur()?;
        if module.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let m = p.load_module(image_bytes(image)?)?;
        if !lazy_loading() {
            p.grow_current_ctx(st);
        }
        out(module, h(m))
    })
}

unsafe fn launch(f: Handle, grid: [u32; 3], block: [u32; 3], shmem: u32, stream: Handle, params: *mut *mut c_void, extra: *mut *mut c_void, cooperative: bool) -> CUresult {
    if with_init(|p, _| Ok(p.funcs.get(&(f as u64)).is_some_and(|x| x.name == "vgpu_linger"))) == Ok(true) {
        return linger(stream, params);
    }
    let priced = with_init(|p, st| {
        p.cur()?;
        let n = p.price(st, f as u64, grid, block, shmem, params, extra)?;
        if lazy_loading() {
            p.grow_current_ctx(st);
        }
        let (_, d) = p.stream_dev(stream as u64)?;
        if cooperative && n.blocks > st.device(d).sms as u64 * 32 {
            return Err(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE);
        }
        Ok(n)
    });
    match priced {
        Ok(n) => run_steps(|p, st| p.submit(st, stream as u64, &[n])),
        Err(e) => e,
    }
}

/// libvgpu's spin (`driver::Linger`): parameters (word pointer, its number, ns).
unsafe fn linger(stream: Handle, params: *mut *mut c_void) -> CUresult {
    if params.is_null() || (0..3).any(|i| (*params.add(i)).is_null()) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let word = (*params as *const u64).read_unaligned() as usize;
    let gen = (*params.add(1) as *const u32).read_unaligned();
    let ns = (*params.add(2) as *const u64).read_unaligned();
    run(|p, _| p.queue_linger(stream as u64, word, gen, ns))
}

unsafe fn launch_ex(cfg: *const CUlaunchConfig, f: Handle, params: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult {
    if cfg.is_null() {
        return with_init(|_, _| Err::<(), _>(CUDA_ERROR_INVALID_VALUE)).err().unwrap_or(CUDA_ERROR_INVALID_VALUE);
    }
    let c = &*cfg;
    if c.num_attrs > 0 && c.attrs.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    launch(f, c.grid, c.block, c.shared_mem_bytes, c.h_stream, params, extra, false)
}

unsafe fn stream_create(ps: *mut Handle, flags: c_uint) -> CUresult {
    run(|p, _| {
        if ps.is_null() || flags > 1 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let s = p.new_stream()?;
        out(ps, h(s))
    })
}

unsafe fn stream_sync(stream: Handle) -> CUresult {
    sync_until(|p| {
        let s = p.stream_mut(stream as u64)?;
        if s.capture.is_some() {
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        let at = s.last_end;
        Ok(Until { at, spins: p.spins_on(stream as u64) })
    })
}

unsafe fn stream_query(stream: Handle) -> CUresult {
    let r = run(|p, _| {
        let s = p.stream_mut(stream as u64)?;
        if s.capture.is_some() {
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        let at = s.last_end;
        if now_ns() < (Until { at, spins: p.spins_on(stream as u64) }).ends() {
            return Err(CUDA_ERROR_NOT_READY);
        }
        Ok(())
    });
    not_ready_pause(r, false)
}

/// A real query reads a completion word without holding any lock of the process and never
/// yields; ours takes the mock's process lock. A thread busy-polling "not ready" would hold it
/// nearly all the time and starve the process's other threads (not what a GPU program sees).
/// Stream queries, which programs poll in tight loops, give way after every miss: without it, two
/// threads synchronizing by `cuStreamQuery` on this 2-core test machine held the gated launches
/// of each other back, and got 0.16 of their rate under a 30% cap where an H200 gave 0.250 at 25.
/// Event queries (libvgpu's meter asks its events once per look) give way only to a thread
/// waiting for the lock: on a machine whose cores are all busy a yield costs a scheduler slice,
/// and a starved memset loop got 0.20 of its rate under a 30% cap where an H200 held 29.8%.
fn not_ready_pause(r: CUresult, only_to_a_waiter: bool) -> CUresult {
    if r == CUDA_ERROR_NOT_READY && (!only_to_a_waiter || crate::driver::others_waiting()) {
        std::thread::yield_now();
    }
    r
}

/// An event call's host time (`MOCK_EVENT_CALL_NS`), half before and half after its work, outside
/// the mock's locks: a busy wait, as the driver's call is CPU work, not a sleep.
fn event_call<T>(f: impl FnOnce() -> T) -> T {
    let ns = mock_gpu::shared().map_or(0, |st| st.header().event_call_ns);
    let spin = |ns: u64| {
        let until = now_ns() + ns;
        while now_ns() < until {
            std::hint::spin_loop();
        }
    };
    spin(ns / 2);
    let r = f();
    spin(ns - ns / 2);
    r
}

unsafe fn stream_wait_event(stream: Handle, event: Handle, flags: c_uint) -> CUresult {
    run(|p, _| {
        if flags > 1 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // A spin the event waits for is taken as ending where its word says now (a later move
        // does not shorten the wait; libvgpu's spins are waited for by none of its streams).
        let e = p.events.get(&(event as u64)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let stamp = e.until().map_or(0, |u| u.ends());
        let s = p.stream_mut(stream as u64)?;
        s.last_end = s.last_end.max(stamp);
        Ok(())
    })
}

unsafe fn event_record(event: Handle, stream: Handle) -> CUresult {
    run(|p, st| {
        p.cur()?;
        let (_, d) = p.stream_dev(stream as u64)?;
        let s = p.stream_mut(stream as u64)?;
        // While capturing, a record becomes a graph node in the real driver; here it is a no-op.
        let stamp = (s.capture.is_none()).then(|| s.last_end.max(now_ns()));
        if let Some(at) = stamp {
            st.event_reached(d, at);
        }
        let behind = p.spins_on(stream as u64).into_iter().rev().find(|l| stamp.is_some_and(|t| l.ends_at() > t));
        let e = p.events.get_mut(&(event as u64)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        if stamp.is_some() {
            (e.stamp, e.behind) = (stamp, behind);
        }
        Ok(())
    })
}

unsafe fn elapsed(ms: *mut f32, start: Handle, end: Handle) -> CUresult {
    run(|p, st| {
        if ms.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let stamp = |e: Handle| -> R<u64> {
            let ev = p.events.get(&(e as u64)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            if ev.flags & CU_EVENT_DISABLE_TIMING != 0 {
                return Err(CUDA_ERROR_INVALID_HANDLE);
            }
            ev.stamp.ok_or(CUDA_ERROR_INVALID_HANDLE)
        };
        let (a, b) = (stamp(start)?, stamp(end)?);
        if now_ns() < a.max(b) {
            return Err(CUDA_ERROR_NOT_READY);
        }
        let ppm = st.header().timer_ppm as f64;
        out(ms, ((b as i128 - a as i128) as f64 * (1.0 + ppm / 1e6) / 1e6) as f32)
    })
}

unsafe fn begin_capture(stream: Handle) -> CUresult {
    run(|p, _| {
        let s = stream as u64;
        if s == 0 || s == CU_STREAM_LEGACY {
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        if p.stream_mut(s)?.capture.is_some() {
            return Err(CUDA_ERROR_ILLEGAL_STATE);
        }
        let g = p.new_graph();
        p.stream_mut(s)?.capture = Some(g);
        Ok(())
    })
}

unsafe fn add_kernel_node(node: *mut Handle, graph: Handle, deps: *const Handle, ndeps: usize, prm: *const CudaKernelNodeParams, kern: Handle) -> CUresult {
    run(|p, st| {
        if node.is_null() || prm.is_null() || (ndeps > 0 && deps.is_null()) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let k = &*prm;
        if k.func.is_null() && !kern.is_null() {
            // CUkernel (cuLibrary) handles are not simulated.
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        let n = p.price(st, k.func as u64, k.grid, k.block, k.shared_mem_bytes, k.kernel_params, k.extra)?;
        p.graphs.get_mut(&(graph as u64)).ok_or(CUDA_ERROR_INVALID_VALUE)?.push(n);
        let nh = p.new_node_handle();
        out(node, h(nh))
    })
}

unsafe fn graph_launch(exec: Handle, stream: Handle) -> CUresult {
    let nodes = with_init(|p, _| p.execs.get(&(exec as u64)).cloned().ok_or(CUDA_ERROR_INVALID_VALUE));
    let nodes = match nodes {
        Ok(n) => n,
        Err(e) => return e,
    };
    if let Err(e) = with_init(|p, st| p.back_exec(st, exec as u64)) {
        return e;
    }
    let mut i = 0;
    run_steps(|p, st| {
        // One node at a time, so a full queue makes only the remaining nodes wait.
        while i < nodes.len() {
            match p.submit(st, stream as u64, &nodes[i..=i])? {
                Step::Done => i += 1,
                w => return Ok(w),
            }
        }
        if nodes.is_empty() {
            p.stream_mut(stream as u64)?;
        }
        Ok(Step::Done)
    })
}

unsafe fn end_capture(stream: Handle, graph: *mut Handle) -> CUresult {
    run(|p, _| {
        if graph.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let g = p.stream_mut(stream as u64)?.capture.take().ok_or(CUDA_ERROR_ILLEGAL_STATE)?;
        out(graph, h(g))
    })
}

unsafe fn is_capturing(stream: Handle, status: *mut u32) -> CUresult {
    run(|p, _| {
        let cap = p.stream_mut(stream as u64)?.capture.is_some();
        out(status, cap as u32)
    })
}

/// `cuStreamCreate` as `cuGetProcAddress` hands it out under `MOCK_CUDA_INTERNAL_PROCS`: the same
/// work at an address no export has, as a real driver may hand out an internal entry point (a
/// hook that swaps only its exports' addresses does not see the call).
unsafe extern "C" fn internal_stream_create(ps: *mut Handle, flags: c_uint) -> CUresult {
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    crate::guard("cuStreamCreate(internal)", &CALLS, || stream_create(ps, flags))
}

/// The internal entry point `cuGetProcAddress` gives for `base` instead of its export, where
/// `MOCK_CUDA_INTERNAL_PROCS` (a comma-separated list of base names) names it.
fn internal_proc(base: &str) -> Option<usize> {
    let listed = std::env::var("MOCK_CUDA_INTERNAL_PROCS").ok()?.split(',').any(|n| n.trim() == base);
    match base {
        "cuStreamCreate" if listed => Some(internal_stream_create as *const () as usize),
        _ => None,
    }
}

unsafe fn proc_address(symbol: *const c_char, pfn: *mut *mut c_void, version: i32, flags: u64, status: *mut i32) -> CUresult {
    if symbol.is_null() || pfn.is_null() || flags > 3 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let name = CStr::from_ptr(symbol).to_string_lossy();
    let (r, addr, s) = match crate::resolve(&name, version, flags) {
        Ok(a) => (CUDA_SUCCESS, internal_proc(&name).unwrap_or(a), CU_GET_PROC_ADDRESS_SUCCESS),
        Err((e, s)) => (e, 0, s),
    };
    *pfn = addr as *mut c_void;
    if !status.is_null() {
        *status = s;
    }
    r
}

unsafe fn error_text(code: CUresult, p: *mut *const c_char, pick: fn(&(CUresult, &'static str, &'static str)) -> &'static str) -> CUresult {
    if p.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    match ERRORS.iter().find(|e| e.0 == code) {
        Some(e) => {
            *p = pick(e).as_ptr() as *const c_char;
            CUDA_SUCCESS
        }
        None => {
            *p = std::ptr::null();
            CUDA_ERROR_INVALID_VALUE
        }
    }
}

/// Arrays cost their texels, summed over mip levels (each level halves every extent).
unsafe fn array_create(arr: *mut Handle, dims: [usize; 3], format: u32, channels: u32, levels: c_uint) -> CUresult {
    run(|p, st| {
        if arr.is_null() || dims[0] == 0 || levels == 0 || ![1, 2, 4].contains(&channels) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let texel = channels as u64 * format_bytes(format);
        let mut ext = dims.map(|x| x.max(1) as u64);
        let mut bytes = 0u64;
        for _ in 0..levels {
            bytes = bytes.saturating_add(ext.iter().product::<u64>().saturating_mul(texel));
            ext = ext.map(|x| (x / 2).max(1));
        }
        let a = p.charge_object(st, bytes)?;
        out(arr, h(a))
    })
}

fn pool_dev(p: &Proc, pool: Handle) -> R<&Pool> {
    p.pools.get(&(pool as u64)).ok_or(CUDA_ERROR_INVALID_VALUE)
}

driver_exports! {
    "cuInit" @ 2000 => fn cuInit(flags: c_uint) {
        if flags != 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        rc(with(|p| {
            if p.st.is_some() {
                return Ok(());
            }
            let st = mock_gpu::shared().map_err(|e| {
                eprintln!("[mock-cuda] error: {e}");
                CUDA_ERROR_OPERATING_SYSTEM
            })?;
            if crate::visible::devices(st).is_empty() {
                return Err(CUDA_ERROR_NO_DEVICE);
            }
            st.register().map_err(|e| {
                eprintln!("[mock-cuda] error: {e}");
                CUDA_ERROR_OPERATING_SYSTEM
            })?;
            p.st = Some(st);
            Ok(())
        }))
    }
    "cuDriverGetVersion" @ 2020 => fn cuDriverGetVersion(v: *mut i32) {
        rc(out(v, 13000))
    }
    "cuDeviceGet" @ 2000 => fn cuDeviceGet(dev: *mut CUdevice, ordinal: i32) {
        run(|p, st| {
            p.dev(st, ordinal)?;
            out(dev, ordinal)
        })
    }
    "cuDeviceGetCount" @ 2000 => fn cuDeviceGetCount(n: *mut i32) {
        run(|_, st| out(n, crate::visible::devices(st).len() as i32))
    }
    "cuDeviceGetName" @ 2000 => fn cuDeviceGetName(name: *mut c_char, len: i32, dev: CUdevice) {
        run(|p, st| {
            let d = p.dev(st, dev)?;
            copy_cstr(name, len, &st.device_name(d))
        })
    }
    "cuDeviceGetUuid" @ 9020 => fn cuDeviceGetUuid(uuid: *mut [u8; 16], dev: CUdevice) {
        run(|p, st| {
            let d = p.dev(st, dev)?;
            out(uuid, st.device(d).uuid)
        })
    }
    "cuDeviceGetUuid" @ 11040 => fn cuDeviceGetUuid_v2(uuid: *mut [u8; 16], dev: CUdevice) {
        run(|p, st| {
            let d = p.dev(st, dev)?;
            out(uuid, st.device(d).uuid)
        })
    }
    "cuDeviceTotalMem" @ 3020 => fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) {
        run(|p, st| {
            let d = p.dev(st, dev)?;
            out(bytes, st.device(d).total_mem as usize)
        })
    }
    "cuDeviceGetAttribute" @ 2000 => fn cuDeviceGetAttribute(v: *mut i32, attrib: i32, dev: CUdevice) {
        run(|p, st| {
            let d = p.dev(st, dev)?;
            let h = st.header();
            let dv = st.device(d);
            let a = device_attribute(attrib, dv.sms, h.clock_khz, (h.cc_major, h.cc_minor), dv.pci_bus).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            out(v, a)
        })
    }
    "cuDeviceGetPCIBusId" @ 4010 => fn cuDeviceGetPCIBusId(id: *mut c_char, len: i32, dev: CUdevice) {
        run(|p, st| {
            let d = p.dev(st, dev)?;
            copy_cstr(id, len, &format!("0000:{:02x}:00.0", st.device(d).pci_bus))
        })
    }
    "cuDeviceGetByPCIBusId" @ 4010 => fn cuDeviceGetByPCIBusId(dev: *mut CUdevice, id: *const c_char) {
        run(|_, st| {
            if id.is_null() {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            let s = CStr::from_ptr(id).to_string_lossy().to_ascii_lowercase();
            let bus = s.split(':').rev().nth(1).and_then(|b| u32::from_str_radix(b, 16).ok()).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            let d = (0..st.device_count()).find(|&d| st.device(d).pci_bus == bus).ok_or(CUDA_ERROR_INVALID_DEVICE)?;
            out(dev, crate::visible::ordinal(st, d).ok_or(CUDA_ERROR_INVALID_DEVICE)?)
        })
    }
    "cuDeviceComputeCapability" @ 2000 => fn cuDeviceComputeCapability(major: *mut i32, minor: *mut i32, dev: CUdevice) {
        run(|p, st| {
            p.dev(st, dev)?;
            if major.is_null() || minor.is_null() {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            out(major, st.header().cc_major as i32)?;
            out(minor, st.header().cc_minor as i32)
        })
    }
    "cuDevicePrimaryCtxRetain" @ 7000 => fn cuDevicePrimaryCtxRetain(pctx: *mut Handle, dev: CUdevice) {
        run(|p, st| {
            if pctx.is_null() {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            let d = p.dev(st, dev)?;
            let c = p.retain_primary(st, d)?;
            out(pctx, h(c))
        })
    }
    "cuDevicePrimaryCtxRelease" @ 7000 => fn cuDevicePrimaryCtxRelease(dev: CUdevice) {
        primary_release(dev, false)
    }
    "cuDevicePrimaryCtxRelease" @ 11000 => fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) {
        primary_release(dev, false)
    }
    "cuDevicePrimaryCtxReset" @ 7000 => fn cuDevicePrimaryCtxReset(dev: CUdevice) {
        primary_release(dev, true)
    }
    "cuDevicePrimaryCtxReset" @ 11000 => fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) {
        primary_release(dev, true)
    }
    "cuDevicePrimaryCtxSetFlags" @ 7000 => fn cuDevicePrimaryCtxSetFlags(dev: CUdevice, flags: c_uint) {
        primary_set_flags(dev, flags)
    }
    "cuDevicePrimaryCtxSetFlags" @ 11000 => fn cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, flags: c_uint) {
        primary_set_flags(dev, flags)
    }
    "cuDevicePrimaryCtxGetState" @ 7000 => fn cuDevicePrimaryCtxGetState(dev: CUdevice, flags: *mut c_uint, active: *mut i32) {
        run(|p, st| {
            let d = p.dev(st, dev)?;
            if flags.is_null() || active.is_null() {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            out(flags, p.primary[d].flags)?;
            out(active, (p.primary[d].refs > 0) as i32)
        })
    }
    "cuCtxCreate" @ 3020 => fn cuCtxCreate_v2(pctx: *mut Handle, _flags: c_uint, dev: CUdevice) {
        ctx_create(pctx, dev)
    }
    "cuCtxCreate" @ 11040 => fn cuCtxCreate_v3(pctx: *mut Handle, params: *mut c_void, nparams: i32, _flags: c_uint, dev: CUdevice) {
        if nparams < 0 || (nparams > 0 && params.is_null()) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        ctx_create(pctx, dev)
    }
    "cuCtxCreate" @ 12050 => fn cuCtxCreate_v4(pctx: *mut Handle, _params: *mut c_void, _flags: c_uint, dev: CUdevice) {
        ctx_create(pctx, dev)
    }
    "cuCtxDestroy" @ 4000 => fn cuCtxDestroy_v2(ctx: Handle) {
        run(|p, st| {
            let c = ctx as u64;
            if p.ctxs.get(&c).ok_or(CUDA_ERROR_INVALID_CONTEXT)?.primary {
                return Err(CUDA_ERROR_INVALID_CONTEXT);
            }
            p.destroy_ctx(st, c);
            Ok(())
        })
    }
    "cuCtxGetCurrent" @ 4000 => fn cuCtxGetCurrent(pctx: *mut Handle) {
        run(|_, _| out(pctx, h(current_handle().unwrap_or(0))))
    }
    "cuCtxSetCurrent" @ 4000 => fn cuCtxSetCurrent(ctx: Handle) {
        run(|p, _| {
            let c = ctx as u64;
            if c != 0 {
                p.ctx_known(c)?;
            }
            STACK.with(|s| {
                let mut s = s.borrow_mut();
                s.pop();
                if c != 0 {
                    s.push(c);
                }
            });
            Ok(())
        })
    }
    "cuCtxPushCurrent" @ 4000 => fn cuCtxPushCurrent_v2(ctx: Handle) {
        run(|p, _| {
            p.ctx_known(ctx as u64)?;
            STACK.with(|s| s.borrow_mut().push(ctx as u64));
            Ok(())
        })
    }
    "cuCtxPopCurrent" @ 4000 => fn cuCtxPopCurrent_v2(pctx: *mut Handle) {
        run(|_, _| {
            let c = STACK.with(|s| s.borrow_mut().pop()).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
            if !pctx.is_null() {
                *pctx = h(c);
            }
            Ok(())
        })
    }
    "cuCtxGetDevice" @ 2000 => fn cuCtxGetDevice(dev: *mut CUdevice) {
        run(|p, st| out(dev, crate::visible::ordinal(st, p.cur()?.1).ok_or(CUDA_ERROR_INVALID_DEVICE)?))
    }
    "cuCtxGetDevice" @ 13000 => fn cuCtxGetDevice_v2(dev: *mut CUdevice, ctx: Handle) {
        run(|p, st| {
            let d = match ctx as u64 {
                0 => p.cur()?.1,
                c => p.ctxs.get(&c).ok_or(CUDA_ERROR_INVALID_CONTEXT)?.dev,
            };
            out(dev, crate::visible::ordinal(st, d).ok_or(CUDA_ERROR_INVALID_DEVICE)?)
        })
    }
    "cuCtxSynchronize" @ 2000 => fn cuCtxSynchronize() {
        sync_until(|p| Ok(p.ctx_idle_at(p.cur()?.0)))
    }
    // CUDA 13: synchronize a given context (NULL: the current one).
    "cuCtxSynchronize" @ 13000 => fn cuCtxSynchronize_v2(ctx: Handle) {
        sync_until(|p| {
            let c = match ctx as u64 {
                0 => p.cur()?.0,
                c => c,
            };
            p.ctx_known(c)?;
            Ok(p.ctx_idle_at(c))
        })
    }
    "cuMemGetInfo" @ 3020 => fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) {
        run(|p, st| {
            let (_, d) = p.cur()?;
            if free.is_null() || total.is_null() {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            st.reap();
            let t = st.device(d).total_mem;
            out(free, t.saturating_sub(st.device_used_now(d)) as usize)?;
            out(total, t as usize)
        })
    }
    "cuMemAlloc" @ 3020 => fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, size: usize) {
        mem_alloc(dptr, size as u64, Kind::Device)
    }
    "cuMemAllocPitch" @ 3020 => fn cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, elem: c_uint) {
        if pitch.is_null() || width == 0 || height == 0 || ![4, 8, 16].contains(&elem) {
            return if with_init(|_, _| Ok(())).is_err() { CUDA_ERROR_NOT_INITIALIZED } else { CUDA_ERROR_INVALID_VALUE };
        }
        let pt = round_up(width as u64, 512);
        let r = mem_alloc(dptr, pt * height as u64, Kind::Device);
        if r == CUDA_SUCCESS {
            *pitch = pt as usize;
        }
        r
    }
    "cuMemAllocManaged" @ 6000 => fn cuMemAllocManaged(dptr: *mut CUdeviceptr, size: usize, flags: c_uint) {
        if flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST {
            return if with_init(|_, _| Ok(())).is_err() { CUDA_ERROR_NOT_INITIALIZED } else { CUDA_ERROR_INVALID_VALUE };
        }
        mem_alloc(dptr, size as u64, Kind::Managed)
    }
    "cuMemFree" @ 3020 => fn cuMemFree_v2(dptr: CUdeviceptr) {
        run(|p, st| p.free(st, dptr))
    }
    "cuMemGetAddressRange" @ 3020 => fn cuMemGetAddressRange_v2(base: *mut CUdeviceptr, size: *mut usize, dptr: CUdeviceptr) {
        run(|p, _| {
            let (&b, a) = p.allocs.range(..=dptr).next_back().filter(|(&b, a)| dptr < b + a.size).ok_or(CUDA_ERROR_NOT_FOUND)?;
            if !base.is_null() {
                *base = b;
            }
            if !size.is_null() {
                *size = a.size as usize;
            }
            Ok(())
        })
    }
    "cuMemAllocHost" @ 3020 => fn cuMemAllocHost_v2(pp: *mut *mut c_void, size: usize) {
        host_alloc(pp, size)
    }
    "cuMemHostAlloc" @ 2020 => fn cuMemHostAlloc(pp: *mut *mut c_void, size: usize, _flags: c_uint) {
        host_alloc(pp, size)
    }
    "cuMemHostRegister" @ 6050 => fn cuMemHostRegister_v2(ptr: *mut c_void, size: usize, flags: c_uint) {
        run(|p, _| {
            if ptr.is_null() || size == 0 || flags > 0xF {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            let (c, _) = p.cur()?;
            let start = ptr as usize;
            let overlaps = p.registered.range(..start + size).next_back().is_some_and(|(&b, &(len, _))| b + len > start);
            if overlaps {
                return Err(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
            }
            p.registered.insert(start, (size, c));
            Ok(())
        })
    }
    "cuMemHostGetDevicePointer" @ 3020 => fn cuMemHostGetDevicePointer_v2(pdptr: *mut CUdeviceptr, ptr: *mut c_void, flags: c_uint) {
        run(|p, _| {
            let a = ptr as usize;
            let mapped = p.host.contains(&a) || p.registered_at(a).is_some();
            if pdptr.is_null() || flags != 0 || !mapped {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            // Unified addressing: the device sees host memory at its host address.
            out(pdptr, a as CUdeviceptr)
        })
    }
    "cuMemHostUnregister" @ 4000 => fn cuMemHostUnregister(ptr: *mut c_void) {
        run(|p, _| p.registered.remove(&(ptr as usize)).map(|_| ()).ok_or(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED))
    }
    "cuMemFreeHost" @ 2000 => fn cuMemFreeHost(ptr: *mut c_void) {
        run(|p, _| {
            if !p.host.remove(&(ptr as usize)) {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            libc::free(ptr);
            Ok(())
        })
    }
    "cuMemAllocAsync" @ 11020 / 11020 cuMemAllocAsync_ptsz => fn cuMemAllocAsync (dptr: *mut CUdeviceptr, size: usize, stream: Handle) {
        alloc_async(dptr, size, None, stream)
    }
    "cuMemAllocFromPoolAsync" @ 11020 / 11020 cuMemAllocFromPoolAsync_ptsz => fn cuMemAllocFromPoolAsync (dptr: *mut CUdeviceptr, size: usize, pool: Handle, stream: Handle) {
        alloc_async(dptr, size, Some(pool), stream)
    }
    "cuMemFreeAsync" @ 11020 / 11020 cuMemFreeAsync_ptsz => fn cuMemFreeAsync (dptr: CUdeviceptr, stream: Handle) {
        free_async(dptr, stream)
    }
    "cuDeviceGetDefaultMemPool" @ 11020 => fn cuDeviceGetDefaultMemPool(pool: *mut Handle, dev: CUdevice) {
        run(|p, st| {
            let d = p.dev(st, dev)?;
            let pl = p.default_pool(d);
            out(pool, h(pl))
        })
    }
    "cuDeviceGetMemPool" @ 11020 => fn cuDeviceGetMemPool(pool: *mut Handle, dev: CUdevice) {
        run(|p, st| {
            let d = p.dev(st, dev)?;
            let pl = p.current_pool(d);
            out(pool, h(pl))
        })
    }
    "cuDeviceSetMemPool" @ 11020 => fn cuDeviceSetMemPool(dev: CUdevice, pool: Handle) {
        run(|p, st| {
            let d = p.dev(st, dev)?;
            if pool_dev(p, pool)?.dev != d {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            p.current_pool[d] = pool as u64;
            Ok(())
        })
    }
    "cuMemPoolCreate" @ 11020 => fn cuMemPoolCreate(pool: *mut Handle, props: *const AllocPropHead) {
        run(|p, st| {
            if pool.is_null() || props.is_null() {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            let pr = &*props;
            if pr.type_ != CU_MEM_ALLOCATION_TYPE_PINNED || pr.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            let d = p.dev(st, pr.location.id).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
            let pl = p.new_pool(d);
            out(pool, h(pl))
        })
    }
    "cuMemPoolDestroy" @ 11020 => fn cuMemPoolDestroy(pool: Handle) {
        run(|p, st| p.destroy_pool(st, pool as u64))
    }
    "cuMemPoolTrimTo" @ 11020 => fn cuMemPoolTrimTo(pool: Handle, keep: usize) {
        run(|p, st| {
            pool_dev(p, pool)?;
            p.trim_pool(st, pool as u64, Some(keep as u64));
            Ok(())
        })
    }
    "cuMemPoolSetAttribute" @ 11020 => fn cuMemPoolSetAttribute(pool: Handle, attr: u32, value: *mut c_void) {
        run(|p, _| {
            if value.is_null() {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            let pl = p.pools.get_mut(&(pool as u64)).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            match attr {
                CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES..=CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES => {}
                CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => pl.threshold = *(value as *const u64),
                CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH if *(value as *const u64) == 0 => pl.reserved_high = pl.reserved,
                CU_MEMPOOL_ATTR_USED_MEM_HIGH if *(value as *const u64) == 0 => pl.used_high = pl.used,
                _ => return Err(CUDA_ERROR_INVALID_VALUE),
            }
            Ok(())
        })
    }
    "cuMemPoolGetAttribute" @ 11020 => fn cuMemPoolGetAttribute(pool: Handle, attr: u32, value: *mut c_void) {
        run(|p, _| {
            if value.is_null() {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            let pl = pool_dev(p, pool)?;
            let v = match attr {
                CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES..=CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
                    *(value as *mut i32) = 1;
                    return Ok(());
                }
                CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => pl.threshold,
                CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT => pl.reserved,
                CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH => pl.reserved_high,
                CU_MEMPOOL_ATTR_USED_MEM_CURRENT => pl.used,
                CU_MEMPOOL_ATTR_USED_MEM_HIGH => pl.used_high,
                _ => return Err(CUDA_ERROR_INVALID_VALUE),
            };
            *(value as *mut u64) = v;
            Ok(())
        })
    }
    "cuMemAddressReserve" @ 10020 => fn cuMemAddressReserve(ptr: *mut CUdeviceptr, size: usize, align: usize, _addr: CUdeviceptr, flags: u64) {
        run(|p, _| {
            if ptr.is_null() || flags != 0 {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            let a = p.reserve(size as u64, align as u64)?;
            out(ptr, a)
        })
    }
    "cuMemAddressFree" @ 10020 => fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) {
        run(|p, _| {
            if p.reserves.get(&ptr) != Some(&(size as u64)) {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            p.reserves.remove(&ptr);
            Ok(())
        })
    }
    "cuMemCreate" @ 10020 => fn cuMemCreate(handle: *mut u64, size: usize, prop: *const AllocPropHead, flags: u64) {
        run(|p, st| {
            if handle.is_null() || prop.is_null() || flags != 0 {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            let pr = &*prop;
            if pr.type_ != CU_MEM_ALLOCATION_TYPE_PINNED || pr.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            let d = p.dev(st, pr.location.id).map_err(|_| CUDA_ERROR_INVALID_DEVICE)?;
            let hd = p.create_phys(st, d, size as u64)?;
            out(handle, hd)
        })
    }
    "cuMemRelease" @ 10020 => fn cuMemRelease(handle: u64) {
        run(|p, st| {
            p.release_handle(st, handle)
        })
    }
    "cuMemMap" @ 10020 => fn cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: u64, flags: u64) {
        run(|p, _| {
            let size = size as u64;
            let ph = p.phys.get(&handle).filter(|ph| !ph.released || ph.retains > 0).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            if flags != 0 || size == 0 || offset as u64 + size > ph.size || !p.in_reserve(ptr, size) {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            let overlaps = p.maps.range(..ptr + size).next_back().is_some_and(|(&b, m)| b + m.size > ptr);
            if overlaps {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            p.phys.get_mut(&handle).expect("checked").maps += 1;
            p.maps.insert(ptr, Mapping { size, handle });
            Ok(())
        })
    }
    "cuMemUnmap" @ 10020 => fn cuMemUnmap(ptr: CUdeviceptr, size: usize) {
        run(|p, st| {
            let inside: Vec<u64> = p.maps.range(ptr..ptr + size as u64).filter(|(&b, m)| b + m.size <= ptr + size as u64).map(|(&b, _)| b).collect();
            if inside.is_empty() {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            for b in inside {
                let m = p.maps.remove(&b).expect("listed");
                if let Some(ph) = p.phys.get_mut(&m.handle) {
                    ph.maps -= 1;
                }
                p.drop_phys_if_done(st, m.handle);
            }
            Ok(())
        })
    }
    "cuMemSetAccess" @ 10020 => fn cuMemSetAccess(ptr: CUdeviceptr, size: usize, desc: *const c_void, count: usize) {
        run(|p, _| {
            if desc.is_null() || count == 0 {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            p.maps.get(&ptr).filter(|m| m.size <= size as u64).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            Ok(())
        })
    }
    "cuMemGetAllocationGranularity" @ 10020 => fn cuMemGetAllocationGranularity(g: *mut usize, prop: *const AllocPropHead, _option: u32) {
        run(|_, _| {
            if prop.is_null() {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            out(g, MIB2 as usize)
        })
    }
    "cuArrayCreate" @ 3020 => fn cuArrayCreate_v2(arr: *mut Handle, desc: *const CudaArrayDescriptor) {
        match desc.as_ref() {
            Some(d) => array_create(arr, [d.width, d.height, 1], d.format, d.num_channels, 1),
            None => array_create(arr, [0; 3], 0, 0, 1),
        }
    }
    "cuArray3DCreate" @ 3020 => fn cuArray3DCreate_v2(arr: *mut Handle, desc: *const CudaArray3DDescriptor) {
        match desc.as_ref() {
            Some(d) => array_create(arr, [d.width, d.height, d.depth], d.format, d.num_channels, 1),
            None => array_create(arr, [0; 3], 0, 0, 1),
        }
    }
    "cuArrayDestroy" @ 2000 => fn cuArrayDestroy(arr: Handle) {
        run(|p, st| p.destroy_object(st, arr as u64))
    }
    "cuMipmappedArrayCreate" @ 5000 => fn cuMipmappedArrayCreate(arr: *mut Handle, desc: *const CudaArray3DDescriptor, levels: c_uint) {
        match desc.as_ref() {
            Some(d) => array_create(arr, [d.width, d.height, d.depth], d.format, d.num_channels, levels),
            None => array_create(arr, [0; 3], 0, 0, levels),
        }
    }
    "cuMipmappedArrayDestroy" @ 5000 => fn cuMipmappedArrayDestroy(arr: Handle) {
        run(|p, st| p.destroy_object(st, arr as u64))
    }
    "cuMemcpyHtoD" @ 3020 / 7000 cuMemcpyHtoD_v2_ptds => fn cuMemcpyHtoD_v2 (dst: CUdeviceptr, src: *const c_void, n: usize) {
        sync_copy(n as u64, |p| if src.is_null() { Err(CUDA_ERROR_INVALID_VALUE) } else { p.check_range(dst, n as u64) })
    }
    "cuMemcpyDtoH" @ 3020 / 7000 cuMemcpyDtoH_v2_ptds => fn cuMemcpyDtoH_v2 (dst: *mut c_void, src: CUdeviceptr, n: usize) {
        sync_copy(n as u64, |p| if dst.is_null() { Err(CUDA_ERROR_INVALID_VALUE) } else { p.check_range(src, n as u64) })
    }
    "cuMemcpyDtoD" @ 3020 / 7000 cuMemcpyDtoD_v2_ptds => fn cuMemcpyDtoD_v2 (dst: CUdeviceptr, src: CUdeviceptr, n: usize) {
        sync_copy(n as u64, |p| p.check_range(dst, n as u64).and_then(|_| p.check_range(src, n as u64)))
    }
    "cuMemcpyHtoDAsync" @ 3020 / 7000 cuMemcpyHtoDAsync_v2_ptsz => fn cuMemcpyHtoDAsync_v2 (dst: CUdeviceptr, src: *const c_void, n: usize, stream: Handle) {
        async_copy(stream, n as u64, |p| if src.is_null() { Err(CUDA_ERROR_INVALID_VALUE) } else { p.check_range(dst, n as u64) })
    }
    "cuMemcpyDtoHAsync" @ 3020 / 7000 cuMemcpyDtoHAsync_v2_ptsz => fn cuMemcpyDtoHAsync_v2 (dst: *mut c_void, src: CUdeviceptr, n: usize, stream: Handle) {
        async_copy(stream, n as u64, |p| if dst.is_null() { Err(CUDA_ERROR_INVALID_VALUE) } else { p.check_range(src, n as u64) })
    }
    "cuMemcpyDtoDAsync" @ 3020 / 7000 cuMemcpyDtoDAsync_v2_ptsz => fn cuMemcpyDtoDAsync_v2 (dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: Handle) {
        async_copy(stream, n as u64, |p| p.check_range(dst, n as u64).and_then(|_| p.check_range(src, n as u64)))
    }
    "cuMemsetD8" @ 3020 / 7000 cuMemsetD8_v2_ptds => fn cuMemsetD8_v2 (dst: CUdeviceptr, _v: u8, n: usize) {
        memset(dst, 1, n, None)
    }
    "cuMemsetD32" @ 3020 / 7000 cuMemsetD32_v2_ptds => fn cuMemsetD32_v2 (dst: CUdeviceptr, _v: c_uint, n: usize) {
        memset(dst, 4, n, None)
    }
    "cuMemsetD8Async" @ 3020 / 7000 cuMemsetD8Async_ptsz => fn cuMemsetD8Async (dst: CUdeviceptr, _v: u8, n: usize, stream: Handle) {
        memset(dst, 1, n, Some(stream))
    }
    "cuMemsetD32Async" @ 3020 / 7000 cuMemsetD32Async_ptsz => fn cuMemsetD32Async (dst: CUdeviceptr, _v: c_uint, n: usize, stream: Handle) {
        memset(dst, 4, n, Some(stream))
    }
    "cuModuleLoad" @ 2000 => fn cuModuleLoad(module: *mut Handle, fname: *const c_char) {
        if fname.is_null() {
            return load_data(module, std::ptr::null());
        }
        let path = CStr::from_ptr(fname).to_string_lossy().into_owned();
        match std::fs::read(&path) {
            Ok(mut bytes) => {
                bytes.push(0);
                load_data(module, bytes.as_ptr() as *const c_void)
            }
            Err(_) => run(|_, _| Err(CUDA_ERROR_FILE_NOT_FOUND)),
        }
    }
    "cuModuleLoadData" @ 2000 => fn cuModuleLoadData(module: *mut Handle, image: *const c_void) {
        load_data(module, image)
    }
    "cuModuleLoadDataEx" @ 2010 => fn cuModuleLoadDataEx(module: *mut Handle, image: *const c_void, nopt: c_uint, opts: *mut c_void, vals: *mut *mut c_void) {
        if nopt > 0 && (opts.is_null() || vals.is_null()) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        load_data(module, image)
    }
    "cuModuleUnload" @ 2000 => fn cuModuleUnload(module: Handle) {
        run(|p, _| p.unload_module(module as u64))
    }
    "cuModuleGetFunction" @ 2000 => fn cuModuleGetFunction(f: *mut Handle, module: Handle, name: *const c_char) {
        run(|p, _| {
            if f.is_null() || name.is_null() {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            let want = CStr::from_ptr(name).to_string_lossy();
            let funcs = p.modules.get(&(module as u64)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            let found = funcs.iter().find(|fh| p.funcs.get(fh).is_some_and(|x| x.name == want)).ok_or(CUDA_ERROR_NOT_FOUND)?;
            out(f, h(*found))
        })
    }
    "cuLaunchKernel" @ 4000 / 7000 cuLaunchKernel_ptsz => fn cuLaunchKernel (f: Handle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: Handle, params: *mut *mut c_void, extra: *mut *mut c_void) {
        launch(f, [gx, gy, gz], [bx, by, bz], shmem, stream, params, extra, false)
    }
    "cuLaunchKernelEx" @ 11060 / 11060 cuLaunchKernelEx_ptsz => fn cuLaunchKernelEx (cfg: *const CUlaunchConfig, f: Handle, params: *mut *mut c_void, extra: *mut *mut c_void) {
        launch_ex(cfg, f, params, extra)
    }
    "cuLaunchCooperativeKernel" @ 9000 / 9000 cuLaunchCooperativeKernel_ptsz => fn cuLaunchCooperativeKernel (f: Handle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: Handle, params: *mut *mut c_void) {
        launch(f, [gx, gy, gz], [bx, by, bz], shmem, stream, params, std::ptr::null_mut(), true)
    }
    "cuStreamCreate" @ 2000 => fn cuStreamCreate(ps: *mut Handle, flags: c_uint) {
        stream_create(ps, flags)
    }
    "cuStreamCreateWithPriority" @ 5050 => fn cuStreamCreateWithPriority(ps: *mut Handle, flags: c_uint, _priority: i32) {
        stream_create(ps, flags)
    }
    "cuStreamDestroy" @ 4000 => fn cuStreamDestroy_v2(stream: Handle) {
        run(|p, _| {
            let gone = p.streams.remove(&(stream as u64)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            // Its queued work still runs, and a context synchronize still waits for it.
            if let Some(c) = p.ctxs.get_mut(&gone.ctx) {
                c.destroyed_until = c.destroyed_until.max(gone.last_end);
            }
            Ok(())
        })
    }
    "cuStreamSynchronize" @ 2000 / 7000 cuStreamSynchronize_ptsz => fn cuStreamSynchronize (stream: Handle) {
        stream_sync(stream)
    }
    "cuStreamWaitValue32" @ 11070 => fn cuStreamWaitValue32_v2(_stream: Handle, _addr: CUdeviceptr, _value: u32, _flags: c_uint) {
        // Stream memory operations are not simulated: the mock is a GPU without them.
        CUDA_ERROR_NOT_SUPPORTED
    }
    "cuStreamQuery" @ 2000 / 7000 cuStreamQuery_ptsz => fn cuStreamQuery (stream: Handle) {
        stream_query(stream)
    }
    "cuStreamWaitEvent" @ 3020 / 7000 cuStreamWaitEvent_ptsz => fn cuStreamWaitEvent (stream: Handle, event: Handle, flags: c_uint) {
        stream_wait_event(stream, event, flags)
    }
    "cuEventCreate" @ 2000 => fn cuEventCreate(pe: *mut Handle, flags: c_uint) {
        run(|p, _| {
            if pe.is_null() {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            let e = p.new_event(flags)?;
            out(pe, h(e))
        })
    }
    "cuEventRecord" @ 2000 / 7000 cuEventRecord_ptsz => fn cuEventRecord (event: Handle, stream: Handle) {
        event_call(|| event_record(event, stream))
    }
    "cuEventRecordWithFlags" @ 11010 / 11010 cuEventRecordWithFlags_ptsz => fn cuEventRecordWithFlags (event: Handle, stream: Handle, flags: c_uint) {
        if flags > 1 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        event_call(|| event_record(event, stream))
    }
    "cuEventQuery" @ 2000 => fn cuEventQuery(event: Handle) {
        let r = event_call(|| run(|p, _| {
            let e = p.events.get(&(event as u64)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            if e.until().is_some_and(|u| now_ns() < u.ends()) {
                return Err(CUDA_ERROR_NOT_READY);
            }
            Ok(())
        }));
        not_ready_pause(r, true)
    }
    "cuEventSynchronize" @ 2000 => fn cuEventSynchronize(event: Handle) {
        sync_until(|p| Ok(p.events.get(&(event as u64)).ok_or(CUDA_ERROR_INVALID_HANDLE)?.until().unwrap_or(0.into())))
    }
    "cuEventElapsedTime" @ 2000 => fn cuEventElapsedTime(ms: *mut f32, start: Handle, end: Handle) {
        not_ready_pause(event_call(|| elapsed(ms, start, end)), true)
    }
    "cuEventElapsedTime" @ 12080 => fn cuEventElapsedTime_v2(ms: *mut f32, start: Handle, end: Handle) {
        not_ready_pause(event_call(|| elapsed(ms, start, end)), true)
    }
    "cuEventDestroy" @ 4000 => fn cuEventDestroy_v2(event: Handle) {
        run(|p, _| p.events.remove(&(event as u64)).map(|_| ()).ok_or(CUDA_ERROR_INVALID_HANDLE))
    }
    "cuStreamBeginCapture" @ 10000 / 10000 cuStreamBeginCapture_ptsz => fn cuStreamBeginCapture (stream: Handle) {
        begin_capture(stream)
    }
    "cuStreamBeginCapture" @ 10010 / 10010 cuStreamBeginCapture_v2_ptsz => fn cuStreamBeginCapture_v2 (stream: Handle, mode: u32) {
        if mode > 2 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        begin_capture(stream)
    }
    "cuStreamEndCapture" @ 10000 / 10000 cuStreamEndCapture_ptsz => fn cuStreamEndCapture (stream: Handle, graph: *mut Handle) {
        end_capture(stream, graph)
    }
    "cuStreamIsCapturing" @ 10000 / 10000 cuStreamIsCapturing_ptsz => fn cuStreamIsCapturing (stream: Handle, status: *mut u32) {
        is_capturing(stream, status)
    }
    "cuGraphCreate" @ 10000 => fn cuGraphCreate(graph: *mut Handle, flags: c_uint) {
        run(|p, _| {
            if graph.is_null() || flags != 0 {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            let g = p.new_graph();
            out(graph, h(g))
        })
    }
    "cuGraphAddKernelNode" @ 10000 => fn cuGraphAddKernelNode(node: *mut Handle, graph: Handle, deps: *const Handle, ndeps: usize, prm: *const CudaKernelNodeParams) {
        add_kernel_node(node, graph, deps, ndeps, prm, std::ptr::null_mut())
    }
    "cuGraphAddKernelNode" @ 12000 => fn cuGraphAddKernelNode_v2(node: *mut Handle, graph: Handle, deps: *const Handle, ndeps: usize, prm: *const CudaKernelNodeParamsV2) {
        let kern = if prm.is_null() { std::ptr::null_mut() } else { (*prm).kern };
        add_kernel_node(node, graph, deps, ndeps, prm as *const CudaKernelNodeParams, kern)
    }
    "cuGraphInstantiateWithFlags" @ 11040 => fn cuGraphInstantiateWithFlags(exec: *mut Handle, graph: Handle, _flags: u64) {
        run(|p, _| {
            if exec.is_null() {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            let x = p.instantiate(graph as u64)?;
            out(exec, h(x))
        })
    }
    "cuGraphLaunch" @ 10000 / 10000 cuGraphLaunch_ptsz => fn cuGraphLaunch (exec: Handle, stream: Handle) {
        graph_launch(exec, stream)
    }
    "cuGraphExecDestroy" @ 10000 => fn cuGraphExecDestroy(exec: Handle) {
        run(|p, _| {
            p.execs.remove(&(exec as u64)).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            p.exec_mem_destroyed(exec as u64);
            Ok(())
        })
    }
    "cuGraphDestroy" @ 10000 => fn cuGraphDestroy(graph: Handle) {
        run(|p, _| {
            p.graphs.remove(&(graph as u64)).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            p.graph_mem.remove(&(graph as u64));
            Ok(())
        })
    }
    // ---- graph memory, VMM references, stream contexts, green contexts (graphmem.rs) ----------
    "cuGraphAddMemAllocNode" @ 11040 => fn cuGraphAddMemAllocNode(node: *mut Handle, graph: Handle, deps: *const Handle, ndeps: usize, params: *mut MemAllocNodeParams) {
        run(|p, st| {
            if node.is_null() || params.is_null() || (ndeps > 0 && deps.is_null()) {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            p.graphs.get(&(graph as u64)).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            let prm = &mut *params;
            if prm.pool_props.type_ != CU_MEM_ALLOCATION_TYPE_PINNED || prm.pool_props.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            let d = p.dev(st, prm.pool_props.location.id)?;
            prm.dptr = p.graph_alloc(graph as u64, d, prm.bytesize as u64)?;
            let nh = p.new_node_handle();
            out(node, h(nh))
        })
    }
    "cuGraphAddMemFreeNode" @ 11040 => fn cuGraphAddMemFreeNode(node: *mut Handle, graph: Handle, deps: *const Handle, ndeps: usize, dptr: CUdeviceptr) {
        run(|p, _| {
            if node.is_null() || (ndeps > 0 && deps.is_null()) || !p.is_graph_ptr(dptr) {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            p.graphs.get(&(graph as u64)).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            let nh = p.new_node_handle();
            out(node, h(nh))
        })
    }
    "cuDeviceGetGraphMemAttribute" @ 11040 => fn cuDeviceGetGraphMemAttribute(dev: CUdevice, attr: u32, value: *mut u64) {
        run(|p, st| {
            let d = p.dev(st, dev)?;
            let v = p.graph_mem_attr(d, attr)?;
            out(value, v)
        })
    }
    "cuDeviceGraphMemTrim" @ 11040 => fn cuDeviceGraphMemTrim(dev: CUdevice) {
        run(|p, st| {
            let d = p.dev(st, dev)?;
            p.graph_mem_trim(st, d);
            Ok(())
        })
    }
    "cuMemRetainAllocationHandle" @ 11000 => fn cuMemRetainAllocationHandle(handle: *mut u64, addr: *mut c_void) {
        run(|p, _| {
            if handle.is_null() {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            let hd = p.retain_handle(addr as u64)?;
            out(handle, hd)
        })
    }
    "cuStreamGetCtx" @ 9020 / 9020 cuStreamGetCtx_ptsz => fn cuStreamGetCtx (stream: Handle, pctx: *mut Handle) {
        run(|p, _| {
            let (c, _) = p.stream_dev(stream as u64)?;
            out(pctx, h(c))
        })
    }
    "cuDeviceGetDevResource" @ 12040 => fn cuDeviceGetDevResource(dev: CUdevice, res: *mut DevResource, typ: u32) {
        run(|p, st| {
            let d = p.dev(st, dev)?;
            if res.is_null() || typ != CU_DEV_RESOURCE_TYPE_SM {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            res.write(DevResource { type_: typ, pad: [0; 92], sm_count: st.device(d).sms, rest: [0; 44] });
            Ok(())
        })
    }
    "cuDevResourceGenerateDesc" @ 12040 => fn cuDevResourceGenerateDesc(desc: *mut Handle, res: *const DevResource, n: c_uint) {
        run(|p, _| {
            if res.is_null() || n == 0 || (*res).type_ != CU_DEV_RESOURCE_TYPE_SM {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            let dh = p.new_node_handle();
            out(desc, h(dh))
        })
    }
    // A green context is a context (it costs the same memory); its handle is its context's.
    "cuGreenCtxCreate" @ 12040 => fn cuGreenCtxCreate(pctx: *mut Handle, desc: Handle, dev: CUdevice, flags: c_uint) {
        run(|p, st| {
            if pctx.is_null() || desc.is_null() || flags != CU_GREEN_CTX_DEFAULT_STREAM {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            let d = p.dev(st, dev)?;
            let c = p.create_ctx(st, d, false)?;
            out(pctx, h(c))
        })
    }
    "cuGreenCtxDestroy" @ 12040 => fn cuGreenCtxDestroy(ctx: Handle) {
        run(|p, st| {
            p.ctx_known(ctx as u64)?;
            p.destroy_ctx(st, ctx as u64);
            Ok(())
        })
    }
    "cuCtxFromGreenCtx" @ 12040 => fn cuCtxFromGreenCtx(pctx: *mut Handle, green: Handle) {
        run(|p, _| {
            p.ctx_known(green as u64)?;
            out(pctx, green)
        })
    }
    "cuGetErrorName" @ 6000 => fn cuGetErrorName(code: CUresult, s: *mut *const c_char) {
        error_text(code, s, |e| e.1)
    }
    "cuGetErrorString" @ 6000 => fn cuGetErrorString(code: CUresult, s: *mut *const c_char) {
        error_text(code, s, |e| e.2)
    }
    "cuGetExportTable" @ 3000 => fn cuGetExportTable(table: *mut *const c_void, _id: *const c_void) {
        // The runtime's private tables are not simulated: programs must use the driver API.
        if !table.is_null() {
            *table = std::ptr::null();
        }
        CUDA_ERROR_NOT_SUPPORTED
    }
    "cuGetProcAddress" @ 11030 => fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, version: i32, flags: u64) {
        proc_address(symbol, pfn, version, flags, std::ptr::null_mut())
    }
    "cuGetProcAddress" @ 12000 => fn cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, version: i32, flags: u64, status: *mut i32) {
        proc_address(symbol, pfn, version, flags, status)
    }
}
