//! Many processes and threads sharing one cap, death, fork, and what NVML shows inside the
//! container. Worker processes are this test binary itself re-run in a worker mode (env
//! `HOOK_MP_MODE`), loading the mock driver with libloading (dlopen + dlsym: the path the CUDA
//! runtime takes) under LD_PRELOAD=libvgpu.so; that also exercises the dlsym override inside a
//! multi-threaded Rust program.

mod hook_util;
use hook_util::*;
use std::ffi::c_void;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const MODE: &str = "HOOK_MP_MODE";

/// This binary re-run as a worker of `mode`.
fn self_cmd(mode: &str, s: &Scratch, hooked: bool) -> Command {
    let exe = std::env::current_exe().unwrap();
    let mut c = mock_command(&exe, s, hooked);
    mock_env(&mut c);
    c.env(MODE, mode);
    c
}

// Worker processes: this binary with `HOOK_MP_MODE` set runs the worker instead of the tests.
gpu_tests::worker_entry!(MODE, |mode| match mode {
    "alloc" => alloc_worker(),
    "monitor" => monitor_worker(),
    "nvml" => nvml_probe(),
    m => panic!("unknown worker mode {m}"),
});

type Cu = i32;

/// Threads allocating and freeing sizes of 2..40 MiB through cuMemAlloc_v2, each holding up to
/// `HOOK_MP_HOLD` allocations.
fn alloc_worker() {
    let threads: usize = std::env::var("HOOK_MP_THREADS").unwrap().parse().unwrap();
    let iters: usize = std::env::var("HOOK_MP_ITERS").unwrap().parse().unwrap();
    let hold: usize = std::env::var("HOOK_MP_HOLD").unwrap().parse().unwrap();
    // SAFETY: loading the (mock) driver; symbols have the cuda.h signatures.
    unsafe {
        let lib: &'static libloading::Library = Box::leak(Box::new(libloading::Library::new("libcuda.so.1").unwrap()));
        let init: libloading::Symbol<unsafe extern "C" fn(u32) -> Cu> = lib.get(b"cuInit").unwrap();
        let retain: libloading::Symbol<unsafe extern "C" fn(*mut *mut c_void, i32) -> Cu> =
            lib.get(b"cuDevicePrimaryCtxRetain").unwrap();
        assert_eq!(init(0), 0);
        let mut ctx: *mut c_void = std::ptr::null_mut();
        assert_eq!(retain(&mut ctx, 0), 0);
        let ctx = ctx as usize;
        // Every worker has its context before anyone allocates (a late context would find the
        // cap filled by the others and be refused, as on a full GPU): mark ready, wait for go.
        if let (Ok(dir), Ok(go)) = (std::env::var("HOOK_MP_READY_DIR"), std::env::var("HOOK_MP_GO")) {
            std::fs::write(std::path::Path::new(&dir).join(std::process::id().to_string()), b"").unwrap();
            let t = std::time::Instant::now();
            while !std::path::Path::new(&go).exists() && t.elapsed() < std::time::Duration::from_secs(60) {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        // The threads allocate together: optimized, one could run all its iterations before the
        // next was spawned, and the cap saw no pressure (a CI run: ok=6400 oom=0).
        let start = std::sync::Arc::new(std::sync::Barrier::new(threads));
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let start = start.clone();
                std::thread::spawn(move || {
                    let set: libloading::Symbol<unsafe extern "C" fn(*mut c_void) -> Cu> = lib.get(b"cuCtxSetCurrent").unwrap();
                    let alloc: libloading::Symbol<unsafe extern "C" fn(*mut u64, usize) -> Cu> = lib.get(b"cuMemAlloc_v2").unwrap();
                    let free: libloading::Symbol<unsafe extern "C" fn(u64) -> Cu> = lib.get(b"cuMemFree_v2").unwrap();
                    assert_eq!(set(ctx as *mut c_void), 0);
                    start.wait();
                    let sizes = [2 * MIB, 6 * MIB, 16 * MIB, 40 * MIB];
                    let mut seed = 0x9e37_79b9u64.wrapping_mul(t as u64 + 1) ^ std::process::id() as u64;
                    let mut held = std::collections::VecDeque::new();
                    let (mut ok, mut oom, mut other) = (0u64, 0u64, 0u64);
                    for _ in 0..iters {
                        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                        let size = sizes[(seed >> 33) as usize % sizes.len()] as usize;
                        let mut p = 0u64;
                        match alloc(&mut p, size) {
                            0 => {
                                ok += 1;
                                held.push_back(p);
                            }
                            2 => oom += 1,
                            _ => other += 1,
                        }
                        if held.len() > hold {
                            assert_eq!(free(held.pop_front().unwrap()), 0);
                        }
                    }
                    for p in held {
                        assert_eq!(free(p), 0);
                    }
                    (ok, oom, other)
                })
            })
            .collect();
        let (mut ok, mut oom, mut other) = (0, 0, 0);
        for h in handles {
            let (a, b, c) = h.join().unwrap();
            ok += a;
            oom += b;
            other += c;
        }
        println!("worker_ok={ok} worker_oom={oom} worker_other={other}");
    }
}

/// NVML loaded by dlopen (+ dlsym, hooked when preloaded), initialized; device 0's handle.
unsafe fn nvml_device0() -> (libloading::Library, *mut c_void) {
    let lib = libloading::Library::new("libnvidia-ml.so.1").unwrap();
    let init: libloading::Symbol<unsafe extern "C" fn() -> u32> = lib.get(b"nvmlInit_v2").unwrap();
    let by_index: libloading::Symbol<unsafe extern "C" fn(u32, *mut *mut c_void) -> u32> =
        lib.get(b"nvmlDeviceGetHandleByIndex_v2").unwrap();
    assert_eq!(init(), 0);
    let mut h = std::ptr::null_mut();
    assert_eq!(by_index(0, &mut h), 0);
    (lib, h)
}

/// Polls the mock GPU's device-used memory through (unhooked) NVML until the stop file appears.
fn monitor_worker() {
    let stop = std::env::var("HOOK_MP_STOP").unwrap();
    // SAFETY: mock NVML with nvml.h signatures.
    unsafe {
        let (lib, h) = nvml_device0();
        let info: libloading::Symbol<unsafe extern "C" fn(*mut c_void, *mut [u64; 3]) -> u32> =
            lib.get(b"nvmlDeviceGetMemoryInfo").unwrap();
        let mut max_used = 0u64;
        let mut samples = 0u64;
        println!("monitor_ready=1");
        let deadline = Instant::now() + Duration::from_secs(120);
        while !Path::new(&stop).exists() && Instant::now() < deadline {
            let mut m = [0u64; 3];
            if info(h, &mut m) == 0 {
                max_used = max_used.max(m[2]);
                samples += 1;
            }
            std::thread::sleep(Duration::from_micros(300));
        }
        println!("monitor_max_used={max_used} monitor_samples={samples}");
    }
}

/// NVML as nvidia-smi sees it inside the container (no CUDA in this process).
fn nvml_probe() {
    // SAFETY: (mock) NVML with nvml.h signatures, reached through dlsym (hooked).
    unsafe {
        let (lib, h) = nvml_device0();
        let info: libloading::Symbol<unsafe extern "C" fn(*mut c_void, *mut [u64; 3]) -> u32> =
            lib.get(b"nvmlDeviceGetMemoryInfo").unwrap();
        let procs: libloading::Symbol<unsafe extern "C" fn(*mut c_void, *mut u32, *mut [u64; 3]) -> u32> =
            lib.get(b"nvmlDeviceGetComputeRunningProcesses_v3").unwrap();
        let mut m = [0u64; 3];
        assert_eq!(info(h, &mut m), 0);
        println!("nvml_total={} nvml_free={} nvml_used={}", m[0], m[1], m[2]);
        let mut n = 16u32;
        let mut buf = [[0u64; 3]; 16];
        assert_eq!(procs(h, &mut n, buf.as_mut_ptr()), 0);
        let pids: Vec<String> = buf[..n as usize].iter().map(|p| (p[0] as u32).to_string()).collect();
        println!("nvml_procs={n} nvml_pids={}", pids.join(","));
    }
}

fn cap_shared_by(procs: usize, threads: usize, iters: usize, hold: usize) {
    let s = Scratch::new("hk-mp");
    let stop = s.dir.join("stop");
    let ctx_env = [("MOCK_GPU_CTX_MEM", "32m"), ("VGPU_CONTEXT_RESERVE", "32m")];
    let cap = 2 * GIB;
    // The first process fixes the mock's config (8 GiB, 32 MiB contexts): start the monitor first.
    let mut mon = self_cmd("monitor", &s, false);
    mon.envs(ctx_env).env("HOOK_MP_STOP", &stop);
    let mut mon = spawn(&mut mon);
    let mut line = String::new();
    let mut mon_out = std::io::BufReader::new(mon.stdout.take().unwrap());
    while !line.contains("monitor_ready=1") {
        line.clear();
        assert!(std::io::BufRead::read_line(&mut mon_out, &mut line).unwrap() > 0, "monitor died");
    }
    let ready = s.dir.join("ready");
    std::fs::create_dir_all(&ready).unwrap();
    let go = s.dir.join("go");
    let workers: Vec<_> = (0..procs)
        .map(|_| {
            let mut c = self_cmd("alloc", &s, true);
            c.envs(ctx_env)
                .env("HOOK_MP_READY_DIR", &ready)
                .env("HOOK_MP_GO", &go)
                .env("CUDA_DEVICE_MEMORY_LIMIT", "2g")
                .env("HOOK_MP_THREADS", threads.to_string())
                .env("HOOK_MP_ITERS", iters.to_string())
                .env("HOOK_MP_HOLD", hold.to_string());
            spawn(&mut c)
        })
        .collect();
    let t = std::time::Instant::now();
    while std::fs::read_dir(&ready).unwrap().count() < procs {
        assert!(t.elapsed() < std::time::Duration::from_secs(60), "workers never all got a context");
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    std::fs::write(&go, b"").unwrap();
    let (mut ok, mut oom) = (0, 0);
    for w in workers {
        let out = w.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "worker: {text}\n{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(num(&text, "worker_other"), 0, "unexpected errors: {text}");
        ok += num(&text, "worker_ok");
        oom += num(&text, "worker_oom");
    }
    std::fs::write(&stop, b"").unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut mon_out, &mut rest).unwrap();
    assert!(mon.wait().unwrap().success());
    let max_used = num(&rest, "monitor_max_used");
    assert!(num(&rest, "monitor_samples") > 10, "{rest}");
    assert!(max_used <= cap, "device use reached {max_used} > cap {cap} ({procs} procs x {threads} threads)");
    assert!(ok > 0 && oom > 0, "no pressure: ok={ok} oom={oom}");
    assert!(max_used > cap / 2, "cap barely used: {max_used}");
}

// Each thread holds up to 150-160 allocations of 16 MiB on average (2.4 GiB or more): one alone
// exceeds the 2 GiB cap, however the machine schedules the threads. With 24 held per thread, a
// 2-core CI machine ran too few at once to reach it (ok=6400 oom=0, twice).

#[test]
fn two_processes_many_threads_never_exceed_the_cap() {
    cap_shared_by(2, 8, 400, 160);
}

#[test]
fn sixteen_processes_never_exceed_the_cap() {
    cap_shared_by(16, 4, 300, 150);
}

/// A holder killed with SIGKILL leaves its charge in its slot; the next process reclaims it.
#[test]
fn sigkill_reclaims_the_dead_process_memory() {
    let s = Scratch::new("hk-kill");
    let mut holder = hooked("test_alloc_paths", &s, Some("1g"));
    holder.args(["--size", "512m", "--path", "mem_alloc", "--hold"]);
    let mut child = spawn(&mut holder);
    let mut r = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut l = String::new();
    while !l.contains("holding=1") {
        l.clear();
        assert!(std::io::BufRead::read_line(&mut r, &mut l).unwrap() > 0, "holder died");
    }
    // While it lives: 1 GiB - (256m ctx + 512m) leaves one 256m context for us and nothing else.
    let out = run_ok(hooked("test_vram_limit", &s, Some("1g")).args(["--step", "64m"]));
    assert_eq!(num(&out, "allocations"), 0, "{out}");
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
    let out = run_ok(hooked("test_vram_limit", &s, Some("1g")).args(["--step", "64m"]));
    assert_eq!(num(&out, "allocated_bytes"), GIB - CTX, "dead holder not reclaimed: {out}");
}

/// fork: the child re-registers (its own slot), the parent's usage is unchanged.
#[test]
fn fork_children_reregister() {
    for mode in ["none", "cuda", "exec"] {
        let s = Scratch::new("hk-fork");
        let out = run_ok(hooked("test_fork", &s, Some("2g")).args(["--size", "256m", "--child", mode]));
        assert_eq!(value(&out, "result"), Some("PASS"), "{mode}: {out}");
    }
}

/// Inside the container, CUDA and NVML both see the virtual GPU: total = cap, used = the
/// container's usage; the process list shows the container's processes.
#[test]
fn memory_info_is_virtualized_for_cuda_and_nvml() {
    let s = Scratch::new("hk-info");
    let mut holder = hooked("test_alloc_paths", &s, Some("1g"));
    holder.args(["--size", "512m", "--path", "mem_alloc", "--hold"]);
    let held = while_holding(&mut holder, || {
        // A CUDA process: cuMemGetInfo / cuDeviceTotalMem / NVML v1 and v2.
        let out = run_ok(&mut hooked("test_meminfo", &s, Some("1g")));
        assert_eq!(num(&out, "meminfo_total"), GIB, "{out}");
        assert_eq!(num(&out, "device_total_mem"), GIB, "{out}");
        assert_eq!(num(&out, "nvml_total"), GIB, "{out}");
        assert_eq!(num(&out, "nvml_v2_total"), GIB, "{out}");
        // holder: ctx + 512m; this process: its own context
        assert_eq!(num(&out, "nvml_used"), CTX + 512 * MIB + CTX, "{out}");
        assert_eq!(num(&out, "meminfo_free"), GIB - (CTX + 512 * MIB + CTX), "{out}");
        // An NVML-only process (nvidia-smi): no CUDA, sees the same virtual device.
        let mut c = self_cmd("nvml", &s, true);
        c.env("CUDA_DEVICE_MEMORY_LIMIT", "1g");
        let out = run_ok(&mut c);
        assert_eq!(num(&out, "nvml_total"), GIB, "{out}");
        assert_eq!(num(&out, "nvml_used"), CTX + 512 * MIB, "{out}");
        assert_eq!(num(&out, "nvml_free"), GIB - CTX - 512 * MIB, "{out}");
        assert_eq!(num(&out, "nvml_procs"), 1, "{out}");
    });
    assert!(held.contains("holding=1"));
}
