//! Tests of the GPU-less harness itself: the mock driver and NVML, across processes.
//!
//! Each scenario runs in helper processes (this test binary re-executed with `MOCK_ROLE` set, see
//! `gpu_tests::worker_entry!`), because the mocks bind a process to one state file for its lifetime. Helpers
//! load the mocks with libloading and report `OUT key=value` lines.

use gpu_tests::{artifacts, mock_command, Scratch};
use libloading::Library;
use std::collections::HashMap;
use std::ffi::{c_char, c_void, CString};
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStdout, Stdio};
use std::time::{Duration, Instant};

const ROLE: &str = "MOCK_ROLE";
const LIBDIR: &str = "MOCK_ROLE_LIBDIR";
const GIB: u64 = 1 << 30;
const CTX_MEM: u64 = 300 << 20;

const PTX: &str = ".version 8.0\n.target sm_90\n.address_size 64\n\
    .visible .entry vgpu_spin(\n\t.param .u64 vgpu_spin_param_0\n)\n{\n\tret;\n}\n\
    .visible .entry empty()\n{\n\tret;\n}\n\0";

type Ptr = *mut c_void;

// ---- the helper side ---------------------------------------------------------------------------

/// Typed symbol lookup; panics name the symbol.
unsafe fn sym<T: Copy>(lib: &Library, name: &str) -> T {
    *lib.get::<T>(name.as_bytes()).unwrap_or_else(|e| panic!("{name}: {e}"))
}

struct Cu {
    lib: Library,
}

impl Cu {
    fn load() -> Cu {
        let dir = std::env::var(LIBDIR).expect("helper without lib dir");
        Cu { lib: unsafe { Library::new(format!("{dir}/libcuda.so.1")).unwrap() } }
    }
    fn init_ctx(&self) -> Ptr {
        unsafe {
            assert_eq!(sym::<unsafe extern "C" fn(u32) -> u32>(&self.lib, "cuInit")(0), 0);
            let mut ctx: Ptr = std::ptr::null_mut();
            assert_eq!(sym::<unsafe extern "C" fn(*mut Ptr, i32) -> u32>(&self.lib, "cuDevicePrimaryCtxRetain")(&mut ctx, 0), 0);
            assert_eq!(sym::<unsafe extern "C" fn(Ptr) -> u32>(&self.lib, "cuCtxSetCurrent")(ctx), 0);
            ctx
        }
    }
    fn alloc(&self, size: u64) -> (u32, u64) {
        let mut p = 0u64;
        let r = unsafe { sym::<unsafe extern "C" fn(*mut u64, usize) -> u32>(&self.lib, "cuMemAlloc_v2")(&mut p, size as usize) };
        (r, p)
    }
    fn free(&self, p: u64) -> u32 {
        unsafe { sym::<unsafe extern "C" fn(u64) -> u32>(&self.lib, "cuMemFree_v2")(p) }
    }
    fn mem_info(&self) -> (u64, u64) {
        let (mut free, mut total) = (0usize, 0usize);
        let r = unsafe { sym::<unsafe extern "C" fn(*mut usize, *mut usize) -> u32>(&self.lib, "cuMemGetInfo_v2")(&mut free, &mut total) };
        assert_eq!(r, 0);
        (free as u64, total as u64)
    }
    fn function(&self, name: &str) -> Ptr {
        unsafe {
            let mut m: Ptr = std::ptr::null_mut();
            let load = sym::<unsafe extern "C" fn(*mut Ptr, *const c_void) -> u32>(&self.lib, "cuModuleLoadData");
            assert_eq!(load(&mut m, PTX.as_ptr() as *const c_void), 0);
            let mut f: Ptr = std::ptr::null_mut();
            let get = sym::<unsafe extern "C" fn(*mut Ptr, Ptr, *const c_char) -> u32>(&self.lib, "cuModuleGetFunction");
            let n = CString::new(name).unwrap();
            assert_eq!(get(&mut f, m, n.as_ptr()), 0);
            f
        }
    }
    /// Launch `f` with `blocks` blocks of 256 threads and one u64 parameter.
    fn launch(&self, f: Ptr, blocks: u32, arg: u64, stream: Ptr) -> u32 {
        type Launch = unsafe extern "C" fn(Ptr, u32, u32, u32, u32, u32, u32, u32, Ptr, *mut Ptr, *mut Ptr) -> u32;
        let mut a = arg;
        let mut params = [&mut a as *mut u64 as Ptr];
        unsafe { sym::<Launch>(&self.lib, "cuLaunchKernel")(f, blocks, 1, 1, 256, 1, 1, 0, stream, params.as_mut_ptr(), std::ptr::null_mut()) }
    }
    fn stream_call(&self, name: &str, s: Ptr) -> u32 {
        unsafe { sym::<unsafe extern "C" fn(Ptr) -> u32>(&self.lib, name)(s) }
    }
}

struct Nvml {
    lib: Library,
    dev: Ptr,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct ProcInfo {
    pid: u32,
    used: u64,
    gi: u32,
    ci: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Sample {
    pid: u32,
    ts: u64,
    sm: u32,
    mem: u32,
    enc: u32,
    dec: u32,
}

impl Nvml {
    fn load() -> Nvml {
        let dir = std::env::var(LIBDIR).unwrap();
        let lib = unsafe { Library::new(format!("{dir}/libnvidia-ml.so.1")).unwrap() };
        let mut dev: Ptr = std::ptr::null_mut();
        unsafe {
            assert_eq!(sym::<unsafe extern "C" fn() -> u32>(&lib, "nvmlInit_v2")(), 0);
            assert_eq!(sym::<unsafe extern "C" fn(u32, *mut Ptr) -> u32>(&lib, "nvmlDeviceGetHandleByIndex_v2")(0, &mut dev), 0);
        }
        Nvml { lib, dev }
    }
    fn used(&self) -> u64 {
        let mut m = [0u64; 3];
        let r = unsafe { sym::<unsafe extern "C" fn(Ptr, *mut [u64; 3]) -> u32>(&self.lib, "nvmlDeviceGetMemoryInfo")(self.dev, &mut m) };
        assert_eq!(r, 0);
        m[2]
    }
    fn processes(&self) -> Vec<ProcInfo> {
        type F = unsafe extern "C" fn(Ptr, *mut u32, *mut ProcInfo) -> u32;
        let f = unsafe { sym::<F>(&self.lib, "nvmlDeviceGetComputeRunningProcesses_v3") };
        let mut n = 0u32;
        let r = unsafe { f(self.dev, &mut n, std::ptr::null_mut()) };
        assert!(r == 0 || r == 7, "size query returned {r}");
        let mut v = vec![ProcInfo::default(); n as usize];
        assert_eq!(unsafe { f(self.dev, &mut n, v.as_mut_ptr()) }, 0);
        v.truncate(n as usize);
        v
    }
    fn gpu_util(&self) -> u32 {
        let mut u = [0u32; 2];
        let r = unsafe { sym::<unsafe extern "C" fn(Ptr, *mut [u32; 2]) -> u32>(&self.lib, "nvmlDeviceGetUtilizationRates")(self.dev, &mut u) };
        assert_eq!(r, 0);
        u[0]
    }
    fn process_util(&self, since_us: u64) -> Vec<Sample> {
        type F = unsafe extern "C" fn(Ptr, *mut Sample, *mut u32, u64) -> u32;
        let f = unsafe { sym::<F>(&self.lib, "nvmlDeviceGetProcessUtilization") };
        let mut n = 0u32;
        let r = unsafe { f(self.dev, std::ptr::null_mut(), &mut n, since_us) };
        assert_eq!(r, 7, "size query: NVML_ERROR_INSUFFICIENT_SIZE");
        let mut v = vec![Sample::default(); n as usize];
        assert_eq!(unsafe { f(self.dev, v.as_mut_ptr(), &mut n, since_us) }, 0);
        v
    }
}

fn emit(k: &str, v: impl std::fmt::Display) {
    println!("OUT {k}={v}");
}

fn realtime_us() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_micros() as u64
}

/// Hold a context and 1 GiB until stdin closes (or we are killed).
fn role_hold() {
    let cu = Cu::load();
    cu.init_ctx();
    assert_eq!(cu.alloc(GIB).0, 0);
    emit("ready", 1);
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
}

/// Report what this process sees of the device: driver and NVML.
fn role_observe() {
    let cu = Cu::load();
    cu.init_ctx();
    let (free, total) = cu.mem_info();
    emit("free", free);
    emit("total", total);
    let nv = Nvml::load();
    emit("nvml_used", nv.used());
    let procs = nv.processes();
    emit("pids", procs.iter().map(|p| p.pid.to_string()).collect::<Vec<_>>().join(","));
    emit("proc_used", procs.iter().map(|p| p.used.to_string()).collect::<Vec<_>>().join(","));
}

fn role_faults() {
    let cu = Cu::load();
    cu.init_ctx();
    let allocs: Vec<String> = (0..4).map(|_| cu.alloc(1 << 20).0.to_string()).collect();
    emit("allocs", allocs.join(","));
    let f = cu.function("empty");
    let launches: Vec<String> = (0..2).map(|_| cu.launch(f, 1, 0, std::ptr::null_mut()).to_string()).collect();
    emit("launches", launches.join(","));
    let nv = Nvml::load();
    let count = unsafe { sym::<unsafe extern "C" fn(*mut u32) -> u32>(&nv.lib, "nvmlDeviceGetCount_v2") };
    let mut n = 0;
    let counts: Vec<String> = (0..3).map(|_| unsafe { count(&mut n) }.to_string()).collect();
    emit("nvml_counts", counts.join(","));
}

/// 2 ms spin kernels launched every 4 ms (absolute schedule, so scheduling noise on a loaded
/// machine only shifts kernels, never changes their total), then read NVML.
fn role_half_busy() {
    let cu = Cu::load();
    cu.init_ctx();
    let f = cu.function("vgpu_spin");
    let nv = Nvml::load();
    let start = Instant::now();
    let period = Duration::from_millis(4);
    for k in 0..300u32 {
        let at = start + period * k;
        if let Some(d) = at.checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
        // 2,000,000 cycles at the mock's 1 GHz clock = 2 ms; 64 blocks fit one wave of 16 SMs.
        assert_eq!(cu.launch(f, 64, 2_000_000, std::ptr::null_mut()), 0);
    }
    assert_eq!(cu.stream_call("cuStreamSynchronize", std::ptr::null_mut()), 0);
    emit("gpu", nv.gpu_util());
    let me = std::process::id();
    let samples = nv.process_util(realtime_us() - 1_000_000);
    emit("proc", samples.iter().find(|s| s.pid == me).map_or(0, |s| s.sm));
    emit("wall_ms", start.elapsed().as_millis());
}

/// Streams, events and error codes of the memory calls.
fn role_sync() {
    let cu = Cu::load();
    cu.init_ctx();
    let f = cu.function("vgpu_spin");
    let null = std::ptr::null_mut();
    let (mut e0, mut e1): (Ptr, Ptr) = (null, null);
    unsafe {
        let create = sym::<unsafe extern "C" fn(*mut Ptr, u32) -> u32>(&cu.lib, "cuEventCreate");
        assert_eq!(create(&mut e0, 0) + create(&mut e1, 0), 0);
        let record = sym::<unsafe extern "C" fn(Ptr, Ptr) -> u32>(&cu.lib, "cuEventRecord");
        assert_eq!(record(e0, null), 0);
        assert_eq!(cu.launch(f, 1, 20_000_000, null), 0);
        assert_eq!(record(e1, null), 0);
        emit("query_busy", cu.stream_call("cuStreamQuery", null));
        emit("event_busy", cu.stream_call("cuEventQuery", e1));
        let t = Instant::now();
        assert_eq!(cu.stream_call("cuStreamSynchronize", null), 0);
        emit("sync_ms", t.elapsed().as_secs_f64() * 1e3);
        emit("query_idle", cu.stream_call("cuStreamQuery", null));
        let mut ms = 0f32;
        let el = sym::<unsafe extern "C" fn(*mut f32, Ptr, Ptr) -> u32>(&cu.lib, "cuEventElapsedTime");
        assert_eq!(el(&mut ms, e0, e1), 0);
        emit("elapsed_ms", ms);
    }
    let (r, p) = cu.alloc(1 << 20);
    assert_eq!(r, 0);
    emit("free_ok", cu.free(p));
    emit("free_again", cu.free(p));
    emit("free_unknown", cu.free(0x1234));
    emit("oom", cu.alloc(64 * GIB).0);
    emit("zero", cu.alloc(0).0);
}

fn role_nvml_wrapper() {
    let dir = std::env::var(LIBDIR).unwrap();
    let path = std::ffi::OsString::from(format!("{dir}/libnvidia-ml.so.1"));
    let nvml = nvml_wrapper::Nvml::builder().lib_path(&path).init().expect("nvml-wrapper init");
    emit("count", nvml.device_count().unwrap());
    let d = nvml.device_by_index(0).unwrap();
    emit("name", d.name().unwrap());
    emit("uuid", d.uuid().unwrap());
    let m = d.memory_info().unwrap();
    emit("total", m.total);
    emit("used", m.used);
    let pids: Vec<String> = d.running_compute_processes().unwrap().iter().map(|p| p.pid.to_string()).collect();
    emit("pids", pids.join(","));
}

// Helper processes: this binary with the role variable set runs the helper instead of the tests.
gpu_tests::worker_entry!(ROLE, |role| match role {
    "hold" => role_hold(),
    "observe" => role_observe(),
    "faults" => role_faults(),
    "half_busy" => role_half_busy(),
    "sync" => role_sync(),
    "nvml_wrapper" => role_nvml_wrapper(),
    other => panic!("unknown role {other}"),
});

// ---- the orchestrating side --------------------------------------------------------------------

fn spawn(scratch: &Scratch, role: &str, env: &[(&str, &str)]) -> Child {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = mock_command(&exe, scratch, false);
    cmd.env(ROLE, role)
        .env(LIBDIR, &artifacts().mock_lib_dir)
        .env_remove("MOCK_CUDA_FAULT")
        .env_remove("MOCK_NVML_FAULT")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

/// Read `OUT` lines until `stop` is seen (or EOF).
fn read_outs(out: &mut BufReader<ChildStdout>, stop: Option<&str>) -> HashMap<String, String> {
    let mut m = HashMap::new();
    let mut line = String::new();
    while out.read_line(&mut line).unwrap() > 0 {
        let report = line.find("OUT ").map(|i| &line[i + 4..]);
        if let Some((k, v)) = report.and_then(|l| l.trim_end().split_once('=')) {
            m.insert(k.to_string(), v.to_string());
            if Some(k) == stop {
                break;
            }
        }
        line.clear();
    }
    m
}

/// Run a helper to completion and return its report (it must pass).
fn run(scratch: &Scratch, role: &str, env: &[(&str, &str)]) -> HashMap<String, String> {
    let mut c = spawn(scratch, role, env);
    drop(c.stdin.take());
    let mut out = BufReader::new(c.stdout.take().unwrap());
    let m = read_outs(&mut out, None);
    let st = c.wait().unwrap();
    assert!(st.success(), "helper {role} failed: {st:?}, report {m:?}");
    m
}

fn num(m: &HashMap<String, String>, k: &str) -> f64 {
    m.get(k).unwrap_or_else(|| panic!("no {k} in {m:?}")).parse().unwrap()
}

/// A helper holding a context and 1 GiB until stopped.
struct Holder {
    child: Child,
    out: BufReader<ChildStdout>,
}

impl Holder {
    fn start(scratch: &Scratch) -> Holder {
        let mut child = spawn(scratch, "hold", &[]);
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let m = read_outs(&mut out, Some("ready"));
        assert_eq!(m.get("ready").map(String::as_str), Some("1"), "holder did not get ready");
        Holder { child, out }
    }
    fn pid(&self) -> String {
        self.child.id().to_string()
    }
    /// Let it exit normally (stdin closed), draining its output so it never sees a broken pipe.
    fn stop(mut self) {
        drop(self.child.stdin.take());
        let _ = self.out.read_to_end(&mut Vec::new());
        assert!(self.child.wait().unwrap().success());
    }
}

#[test]
fn two_processes_see_each_others_memory() {
    let s = Scratch::new("mock-see");
    let holder = Holder::start(&s);
    let m = run(&s, "observe", &[]);
    let total = num(&m, "total") as u64;
    assert_eq!(total, 8 * GIB);
    // Holder: context + 1 GiB; observer: its context.
    let expect_used = GIB + 2 * CTX_MEM;
    assert_eq!(total - num(&m, "free") as u64, expect_used, "cuMemGetInfo: {m:?}");
    assert_eq!(num(&m, "nvml_used") as u64, expect_used, "NVML: {m:?}");
    let pids = &m["pids"];
    assert!(pids.split(',').any(|p| p == holder.pid()), "holder missing from {pids}");
    assert!(m["proc_used"].split(',').any(|u| u == (GIB + CTX_MEM).to_string()), "{m:?}");
    holder.stop();
}

#[test]
fn sigkilled_process_memory_is_reclaimed() {
    let s = Scratch::new("mock-kill");
    let mut holder = Holder::start(&s);
    let before = run(&s, "observe", &[]);
    assert_eq!(num(&before, "nvml_used") as u64, GIB + 2 * CTX_MEM);
    holder.child.kill().unwrap(); // SIGKILL
    holder.child.wait().unwrap();
    let after = run(&s, "observe", &[]);
    assert_eq!(num(&after, "total") as u64 - num(&after, "free") as u64, CTX_MEM, "cuMemGetInfo after kill: {after:?}");
    assert_eq!(num(&after, "nvml_used") as u64, CTX_MEM, "NVML after kill: {after:?}");
    assert!(!after["pids"].split(',').any(|p| p == holder.pid()));
}

#[test]
fn fault_injection_hits_the_requested_calls() {
    let s = Scratch::new("mock-fault");
    let m = run(
        &s,
        "faults",
        &[("MOCK_CUDA_FAULT", "cuMemAlloc_v2:3:2,cuLaunchKernel:1:700"), ("MOCK_NVML_FAULT", "nvmlDeviceGetCount_v2:2*:999")],
    );
    assert_eq!(m["allocs"], "0,0,2,0");
    assert_eq!(m["launches"], "700,0");
    assert_eq!(m["nvml_counts"], "0,999,999");
}

#[test]
fn timeline_gives_the_expected_busy_share() {
    let s = Scratch::new("mock-util");
    let m = run(&s, "half_busy", &[]);
    let (gpu, proc_) = (num(&m, "gpu"), num(&m, "proc"));
    eprintln!("half-busy schedule: device {gpu}%, process {proc_}%, {} ms", m["wall_ms"]);
    assert!((40.0..=60.0).contains(&gpu), "device utilization {gpu}% (want ~50): {m:?}");
    assert!((40.0..=60.0).contains(&proc_), "process utilization {proc_}% (want ~50): {m:?}");
}

#[test]
fn streams_events_and_memory_errors() {
    let s = Scratch::new("mock-sync");
    let m = run(&s, "sync", &[]);
    assert_eq!(m["query_busy"], "600", "CUDA_ERROR_NOT_READY while the kernel runs");
    assert_eq!(m["event_busy"], "600");
    assert_eq!(m["query_idle"], "0");
    let sync_ms = num(&m, "sync_ms");
    assert!(sync_ms > 15.0 && sync_ms < 500.0, "sync waited {sync_ms} ms for a 20 ms kernel");
    let el = num(&m, "elapsed_ms");
    assert!((19.9..=21.0).contains(&el), "event elapsed {el} ms");
    assert_eq!(m["free_ok"], "0");
    assert_eq!(m["free_again"], "1", "double free: CUDA_ERROR_INVALID_VALUE");
    assert_eq!(m["free_unknown"], "1");
    assert_eq!(m["oom"], "2");
    assert_eq!(m["zero"], "1");
}

#[test]
fn nvml_wrapper_reads_the_mock() {
    let s = Scratch::new("mock-nvmlw");
    let holder = Holder::start(&s);
    let m = run(&s, "nvml_wrapper", &[]);
    assert_eq!(m["count"], "1");
    assert_eq!(m["name"], "Mock GPU");
    assert!(m["uuid"].starts_with("GPU-") && m["uuid"].len() == 40, "{m:?}");
    assert_eq!(num(&m, "total") as u64, 8 * GIB);
    assert_eq!(num(&m, "used") as u64, GIB + CTX_MEM, "the holder's context and 1 GiB");
    assert_eq!(m["pids"], holder.pid());
    holder.stop();
}

/// cuGetProcAddress_v2 hands out exactly the exported versioned symbols (as dlsym sees them).
#[test]
fn proc_address_matches_dlsym() {
    let lib = unsafe { Library::new(artifacts().mock_lib_dir.join("libcuda.so.1")).unwrap() };
    type Gpa = unsafe extern "C" fn(*const c_char, *mut Ptr, i32, u64, *mut i32) -> u32;
    let gpa = unsafe { sym::<Gpa>(&lib, "cuGetProcAddress_v2") };
    let cases: &[(&str, i32, u64, &str)] = &[
        ("cuMemAlloc", 12000, 0, "cuMemAlloc_v2"),
        ("cuMemFree", 13000, 1, "cuMemFree_v2"),
        ("cuCtxCreate", 11000, 0, "cuCtxCreate_v2"),
        ("cuCtxCreate", 12000, 0, "cuCtxCreate_v3"),
        ("cuCtxCreate", 13000, 0, "cuCtxCreate_v4"),
        ("cuLaunchKernel", 12000, 0, "cuLaunchKernel"),
        ("cuLaunchKernel", 12000, 2, "cuLaunchKernel_ptsz"),
        ("cuLaunchKernelEx", 12000, 2, "cuLaunchKernelEx_ptsz"),
        ("cuMemcpyHtoD", 12000, 2, "cuMemcpyHtoD_v2_ptds"),
        ("cuMemcpyHtoDAsync", 12000, 2, "cuMemcpyHtoDAsync_v2_ptsz"),
        ("cuStreamBeginCapture", 12000, 2, "cuStreamBeginCapture_v2_ptsz"),
        ("cuGraphLaunch", 12000, 2, "cuGraphLaunch_ptsz"),
        ("cuMemAllocAsync", 12000, 0, "cuMemAllocAsync"),
        ("cuDevicePrimaryCtxRelease", 12000, 0, "cuDevicePrimaryCtxRelease_v2"),
        ("cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2"),
    ];
    for &(base, ver, flags, want) in cases {
        let name = CString::new(base).unwrap();
        let (mut pfn, mut status): (Ptr, i32) = (std::ptr::null_mut(), -1);
        let r = unsafe { gpa(name.as_ptr(), &mut pfn, ver, flags, &mut status) };
        assert_eq!((r, status), (0, 0), "{base} @ {ver} flags {flags}");
        let direct = unsafe { *lib.get::<Ptr>(want.as_bytes()).unwrap() };
        assert_eq!(pfn, direct, "{base} @ {ver} flags {flags} should be {want}");
    }
    let name = CString::new("cuNotAFunction").unwrap();
    let (mut pfn, mut status): (Ptr, i32) = (1 as Ptr, -1);
    assert_eq!(unsafe { gpa(name.as_ptr(), &mut pfn, 12000, 0, &mut status) }, 500);
    assert_eq!((pfn, status), (std::ptr::null_mut(), 1), "CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND");
}
