//! Shared helpers of the `stress_*` reliability tests (issue 6). Every stress test is
//! `#[ignore = "run by ci/stress.sh"]`; `ci/stress.sh` runs them with `--ignored` at the size
//! chosen by `VGPU_STRESS_SCALE` (`ci`, the default, or `full`). Worker processes are the test
//! binary itself re-run in a worker mode (`STRESS_MODE`, see [`worker_main`]), loading the mock
//! driver with dlopen + dlsym (the path the CUDA runtime takes), so they work under
//! LD_PRELOAD=libvgpu.so exactly like a CUDA program. Everything that waits is bounded.
#![allow(dead_code)]

use std::ffi::c_void;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

pub use gpu_tests::{artifacts, mock_command, Scratch};

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;
/// Context memory of the mock and the hook's context reserve in every stress test.
pub const CTX: u64 = 64 * MIB;
pub const MODE: &str = "STRESS_MODE";

// ------------------------------------------------------------------------------------------
// size and reporting

/// `VGPU_STRESS_SCALE=full` selects the issue's full sizes; anything else (or unset) CI sizes.
pub fn full() -> bool {
    std::env::var("VGPU_STRESS_SCALE").as_deref() == Ok("full")
}

pub fn scaled(ci: usize, full_size: usize) -> usize {
    if full() {
        full_size
    } else {
        ci
    }
}

pub fn scale_name() -> &'static str {
    if full() {
        "full"
    } else {
        "ci"
    }
}

/// One result row: printed as `STRESS test=NAME k=v ...` and appended to `$VGPU_STRESS_REPORT`
/// (ci/stress.sh turns the rows into its table).
pub fn report(test: &str, kv: &[(&str, String)]) {
    let mut line = format!("STRESS test={test} scale={}", scale_name());
    for (k, v) in kv {
        line.push_str(&format!(" {k}={v}"));
    }
    println!("{line}");
    if let Ok(p) = std::env::var("VGPU_STRESS_REPORT") {
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(p) {
            let _ = writeln!(f, "{line}");
        }
    }
}

pub fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

/// Percentile (0..=100) of `v` (sorted copy), nearest rank.
pub fn pct(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let idx = ((p / 100.0) * s.len() as f64).ceil() as usize;
    s[idx.clamp(1, s.len()) - 1]
}

/// Small deterministic PRNG; seed from `VGPU_STRESS_SEED` or the clock (printed for replay).
pub struct Rng(u64);
impl Rng {
    pub fn from_env(test: &str) -> Rng {
        let seed = std::env::var("VGPU_STRESS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
        });
        println!("{test}: VGPU_STRESS_SEED={seed}");
        Rng(seed | 1)
    }
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

// ------------------------------------------------------------------------------------------
// commands and bounded waiting

/// The stress tests' mock GPU: 8 GiB, 64 MiB contexts (the hook told the same reserve).
pub fn mock_env(c: &mut Command) {
    c.env("MOCK_GPU_MEM", "8g").env("MOCK_GPU_CTX_MEM", "64m").env("VGPU_CONTEXT_RESERVE", "64m");
}

/// A sample on the stress mock GPU (hooked or not).
pub fn sample(name: &str, s: &Scratch, hooked: bool) -> Command {
    let mut c = mock_command(&artifacts().sample(name), s, hooked);
    mock_env(&mut c);
    c
}

/// This test binary re-run as a worker of `mode`.
pub fn worker(mode: &str, s: &Scratch, hooked: bool) -> Command {
    let exe = std::env::current_exe().unwrap();
    let mut c = mock_command(&exe, s, hooked);
    mock_env(&mut c);
    c.env(MODE, mode);
    c.env_remove("MOCK_CUDA_FAULT").env_remove("MOCK_CUDA_DELAY");
    c
}

/// Wait for `child` at most `limit`; on timeout SIGKILL it and return None.
pub fn wait_timeout(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let t = Instant::now();
    loop {
        if let Ok(Some(st)) = child.try_wait() {
            return Some(st);
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

pub struct Done {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Run to completion within `limit`; a timeout fails the test loudly (with what it printed).
pub fn run_limited(c: &mut Command, limit: Duration) -> Done {
    let mut child = c.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()
        .unwrap_or_else(|e| panic!("spawn {c:?}: {e}"));
    let out = drain(child.stdout.take().unwrap());
    let err = drain(child.stderr.take().unwrap());
    let st = wait_timeout(&mut child, limit);
    let stdout = out.join().unwrap();
    let stderr = err.join().unwrap();
    match st {
        Some(status) => Done { status, stdout, stderr },
        None => panic!("HANG: {c:?} did not finish within {limit:?}\nstdout:\n{stdout}\nstderr:\n{stderr}"),
    }
}

pub fn run_ok(c: &mut Command, limit: Duration) -> String {
    let d = run_limited(c, limit);
    assert!(d.status.success(), "{c:?} failed: {}\nstdout:\n{}\nstderr:\n{}", d.status, d.stdout, d.stderr);
    d.stdout
}

fn drain<R: Read + Send + 'static>(mut r: R) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = r.read_to_end(&mut b);
        String::from_utf8_lossy(&b).into_owned()
    })
}

/// A running child whose stdout lines arrive on a channel (reads never block the test).
pub struct Live {
    pub child: Child,
    pub lines: Receiver<String>,
    pub seen: String,
    pub stdin: Option<ChildStdin>,
    err: Option<std::thread::JoinHandle<String>>,
}

impl Live {
    pub fn spawn(c: &mut Command) -> Live {
        let mut child = c.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()
            .unwrap_or_else(|e| panic!("spawn {c:?}: {e}"));
        let out = child.stdout.take().unwrap();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let err = drain(child.stderr.take().unwrap());
        let stdin = child.stdin.take();
        Live { child, lines: rx, seen: String::new(), stdin, err: Some(err) }
    }
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }
    /// Next line containing `needle` within `limit` (None on timeout or EOF).
    pub fn wait_line(&mut self, needle: &str, limit: Duration) -> Option<String> {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    self.seen.push_str(&l);
                    self.seen.push('\n');
                    if l.contains(needle) {
                        return Some(l);
                    }
                }
                Err(_) => return None,
            }
        }
    }
    pub fn expect_line(&mut self, needle: &str, limit: Duration) -> String {
        match self.wait_line(needle, limit) {
            Some(l) => l,
            None => {
                let _ = self.child.kill();
                let _ = self.child.wait();
                let err = self.err.take().map(|h| h.join().unwrap()).unwrap_or_default();
                panic!("no line with {needle:?} within {limit:?}; stdout:\n{}\nstderr:\n{err}", self.seen)
            }
        }
    }
    pub fn send(&mut self, line: &str) {
        let w = self.stdin.as_mut().expect("stdin");
        writeln!(w, "{line}").and_then(|_| w.flush()).expect("write to child");
    }
    pub fn sigkill(&mut self) {
        // SAFETY: signalling our own child by pid.
        unsafe { libc::kill(self.pid(), libc::SIGKILL) };
    }
    /// Wait (bounded) and return status, everything it printed on stdout, and stderr.
    pub fn finish(mut self, limit: Duration) -> (ExitStatus, String, String) {
        drop(self.stdin.take());
        let st = wait_timeout(&mut self.child, limit);
        let err = self.err.take().map(|h| h.join().unwrap()).unwrap_or_default();
        // The reader thread may still be forwarding the last lines: take them until it sees EOF
        // (bounded: a grandchild may hold the pipe open).
        let deadline = Instant::now() + Duration::from_secs(2);
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    self.seen.push_str(&l);
                    self.seen.push('\n');
                }
                Err(_) => break,
            }
        }
        match st {
            Some(s) => (s, std::mem::take(&mut self.seen), err),
            None => panic!("HANG: child did not exit within {limit:?}\nstdout:\n{}\nstderr:\n{err}", self.seen),
        }
    }
}

/// Value of `key=` in the last line of `out` that has it.
pub fn value<'a>(out: &'a str, key: &str) -> Option<&'a str> {
    let pat = format!("{key}=");
    out.lines().rev().find_map(|l| l.split_whitespace().find_map(|kv| kv.strip_prefix(pat.as_str())))
}

pub fn num(out: &str, key: &str) -> u64 {
    value(out, key).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("no numeric {key}= in:\n{out}"))
}

// ------------------------------------------------------------------------------------------
// region and mock NVML views

/// Region state after reclaiming dead processes: (device 0 usage, live slot pids).
pub fn region_state(path: &Path) -> (u64, Vec<i32>) {
    let r = vgpu_core::region::Region::open_existing(path).unwrap_or_else(|e| panic!("region {}: {e}", path.display()));
    r.reap_dead();
    let used = r.device_used(0);
    let pids = r.live_slots().map(|s| r.slot_pid(s)).collect();
    (used, pids)
}

/// Every live slot's usage, summed from the per-slot figures (must equal `device_used`) and
/// checked for internal consistency (total = context + module + data).
pub fn region_consistent(path: &Path) -> Result<u64, String> {
    let r = vgpu_core::region::Region::open_existing(path).map_err(|e| e.to_string())?;
    r.reap_dead();
    let mut sum = 0u64;
    for s in r.live_slots() {
        let u = r.proc_usage(s, 0);
        if u.context + u.module + u.data != u.total {
            return Err(format!("slot {s:?}: parts {u:?} do not add up to the total"));
        }
        let pid = r.slot_pid(s);
        // SAFETY: signal 0 probes existence only.
        if pid <= 0 || unsafe { libc::kill(pid, 0) } != 0 {
            return Err(format!("slot {s:?} live with dead pid {pid}"));
        }
        sum += u.total;
    }
    if sum != r.device_used(0) {
        return Err(format!("slot sum {sum} != device_used {}", r.device_used(0)));
    }
    if r.live_slots().any(|s| s.index() >= r.proc_num()) {
        return Err("live slot beyond proc_num".into());
    }
    Ok(sum)
}

/// Device 0's used memory as the (unhooked) mock NVML reports it.
pub fn mock_nvml_used(s: &Scratch) -> u64 {
    let out = run_ok(&mut worker("nvml_used", s, false), Duration::from_secs(20));
    num(&out, "nvml_used")
}

// ------------------------------------------------------------------------------------------
// the driver through dlopen + dlsym

pub type R = i32;
pub const PTX: &str = ".version 7.0\n.target sm_52\n.address_size 64\n\n.visible .entry vgpu_empty()\n{\n    ret;\n}\n\0";

/// Driver entry points resolved once (dlsym: hooked when libvgpu is preloaded).
#[derive(Clone, Copy)]
pub struct Cu {
    pub init: unsafe extern "C" fn(u32) -> R,
    pub retain: unsafe extern "C" fn(*mut *mut c_void, i32) -> R,
    pub release: unsafe extern "C" fn(i32) -> R,
    pub set_current: unsafe extern "C" fn(*mut c_void) -> R,
    pub ctx_create: unsafe extern "C" fn(*mut *mut c_void, u32, i32) -> R,
    pub ctx_destroy: unsafe extern "C" fn(*mut c_void) -> R,
    pub alloc: unsafe extern "C" fn(*mut u64, usize) -> R,
    pub free: unsafe extern "C" fn(u64) -> R,
    pub mem_info: unsafe extern "C" fn(*mut usize, *mut usize) -> R,
    pub module_load_data: unsafe extern "C" fn(*mut *mut c_void, *const c_void) -> R,
    pub get_function: unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *const u8) -> R,
    #[allow(clippy::type_complexity)]
    pub launch: unsafe extern "C" fn(*mut c_void, u32, u32, u32, u32, u32, u32, u32, *mut c_void,
        *mut *mut c_void, *mut *mut c_void) -> R,
    pub sync: unsafe extern "C" fn() -> R,
}

impl Cu {
    pub fn load() -> Cu {
        // SAFETY: the (mock) driver, symbols with cuda.h signatures.
        unsafe {
            let lib: &'static libloading::Library =
                Box::leak(Box::new(libloading::Library::new("libcuda.so.1").expect("dlopen libcuda.so.1")));
            macro_rules! s {
                ($n:literal) => {
                    *lib.get($n).expect(std::str::from_utf8($n).unwrap())
                };
            }
            Cu {
                init: s!(b"cuInit"),
                retain: s!(b"cuDevicePrimaryCtxRetain"),
                release: s!(b"cuDevicePrimaryCtxRelease_v2"),
                set_current: s!(b"cuCtxSetCurrent"),
                ctx_create: s!(b"cuCtxCreate_v2"),
                ctx_destroy: s!(b"cuCtxDestroy_v2"),
                alloc: s!(b"cuMemAlloc_v2"),
                free: s!(b"cuMemFree_v2"),
                mem_info: s!(b"cuMemGetInfo_v2"),
                module_load_data: s!(b"cuModuleLoadData"),
                get_function: s!(b"cuModuleGetFunction"),
                launch: s!(b"cuLaunchKernel"),
                sync: s!(b"cuCtxSynchronize"),
            }
        }
    }
    /// cuInit + primary context of device 0 made current; returns the context.
    pub fn open(&self) -> usize {
        unsafe {
            assert_eq!((self.init)(0), 0, "cuInit");
            let mut ctx = std::ptr::null_mut();
            assert_eq!((self.retain)(&mut ctx, 0), 0, "cuDevicePrimaryCtxRetain");
            assert_eq!((self.set_current)(ctx), 0, "cuCtxSetCurrent");
            ctx as usize
        }
    }
    pub fn alloc(&self, size: u64) -> (R, u64) {
        let mut p = 0u64;
        let r = unsafe { (self.alloc)(&mut p, size as usize) };
        (r, p)
    }
    pub fn free(&self, p: u64) -> R {
        unsafe { (self.free)(p) }
    }
    /// (free, total) from cuMemGetInfo_v2 (virtualized under the hook).
    pub fn mem_info(&self) -> (u64, u64) {
        let (mut f, mut t) = (0usize, 0usize);
        assert_eq!(unsafe { (self.mem_info)(&mut f, &mut t) }, 0, "cuMemGetInfo_v2");
        (f as u64, t as u64)
    }
    pub fn used(&self) -> u64 {
        let (f, t) = self.mem_info();
        t - f
    }
    /// The empty kernel from PTX.
    pub fn empty_kernel(&self) -> usize {
        unsafe {
            let mut m = std::ptr::null_mut();
            assert_eq!((self.module_load_data)(&mut m, PTX.as_ptr().cast()), 0, "cuModuleLoadData");
            let mut f = std::ptr::null_mut();
            assert_eq!((self.get_function)(&mut f, m, c"vgpu_empty".as_ptr().cast()), 0, "cuModuleGetFunction");
            f as usize
        }
    }
    pub fn launch(&self, f: usize, blocks: u32) -> R {
        unsafe {
            (self.launch)(f as *mut c_void, blocks, 1, 1, 32, 1, 1, 0, std::ptr::null_mut(), std::ptr::null_mut(),
                std::ptr::null_mut())
        }
    }
    pub fn sync(&self) -> R {
        unsafe { (self.sync)() }
    }
}

// ------------------------------------------------------------------------------------------
// workers

fn env_u64(k: &str, default: u64) -> u64 {
    std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

// A test binary that includes this module is a worker when `STRESS_MODE` is set (`worker`).
gpu_tests::worker_entry!(MODE, worker_main);

/// Dispatch of `STRESS_MODE`.
fn worker_main(mode: &str) {
    match mode {
        "churn" => churn(),
        "survivor" => survivor(),
        "lockholder" => lockholder(),
        "nvml_used" => nvml_used(),
        "monitor" => monitor(),
        "storm" => storm(),
        "init_cost" => init_cost(),
        "forker" => forker(),
        "signals" => signals(),
        "ctx_faults" => ctx_faults(),
        "launch_faults" => launch_faults(),
        "va_cycle" => va_cycle(),
        "fill" => fill(),
        "alloc_exit" => alloc_exit(),
        m => panic!("unknown worker mode {m}"),
    }
}

/// `STRESS_THREADS` threads allocating/freeing 1 KiB..`STRESS_MAX_KIB` (holding up to 4 each) and launching
/// the empty kernel; `STRESS_ITERS` iterations per thread (0 = until killed). Prints counts;
/// exits 3 on any error other than OOM.
fn churn() {
    let threads = env_u64("STRESS_THREADS", 2) as usize;
    let iters = env_u64("STRESS_ITERS", 0);
    // The mock never reuses freed device addresses (1 TiB per device and state file, see
    // stress_mock.rs), so loops that run long keep sizes small.
    let max_kib = env_u64("STRESS_MAX_KIB", 64 * 1024);
    let cu = Cu::load();
    let ctx = cu.open();
    let f = cu.empty_kernel();
    println!("ready pid={}", std::process::id());
    if let Ok(start) = std::env::var("STRESS_START") {
        // every process has its context before anyone allocates (see stress_concurrency.rs)
        let t = Instant::now();
        while !Path::new(&start).exists() && t.elapsed() < Duration::from_secs(120) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let other = AtomicU64::new(0);
    let (ok, oom, launches) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|sc| {
        for t in 0..threads {
            let (other, ok, oom, launches) = (&other, &ok, &oom, &launches);
            sc.spawn(move || {
                unsafe { assert_eq!((cu.set_current)(ctx as *mut c_void), 0) };
                let mut rng = Rng::new(std::process::id() as u64 * 7919 + t as u64);
                let mut held = std::collections::VecDeque::new();
                let mut i = 0u64;
                while iters == 0 || i < iters {
                    i += 1;
                    let size = (rng.below(max_kib) + 1) * 1024;
                    match cu.alloc(size) {
                        (0, p) => {
                            ok.fetch_add(1, Relaxed);
                            held.push_back(p);
                        }
                        (2, _) => {
                            oom.fetch_add(1, Relaxed);
                        }
                        (e, _) => {
                            eprintln!("churn: cuMemAlloc_v2 returned {e}");
                            other.fetch_add(1, Relaxed);
                        }
                    }
                    if held.len() > 4 {
                        let r = cu.free(held.pop_front().unwrap());
                        if r != 0 {
                            eprintln!("churn: cuMemFree_v2 returned {r}");
                            other.fetch_add(1, Relaxed);
                        }
                    }
                    if i.is_multiple_of(4) {
                        let r = cu.launch(f, 1 + rng.below(128) as u32);
                        if r != 0 {
                            eprintln!("churn: cuLaunchKernel returned {r}");
                            other.fetch_add(1, Relaxed);
                        }
                        launches.fetch_add(1, Relaxed);
                    }
                    if i.is_multiple_of(16) && cu.sync() != 0 {
                        other.fetch_add(1, Relaxed);
                    }
                }
                for p in held {
                    if cu.free(p) != 0 {
                        other.fetch_add(1, Relaxed);
                    }
                }
            });
        }
    });
    assert_eq!(cu.sync(), 0);
    println!(
        "churn_ok={} churn_oom={} churn_launches={} churn_other={} churn_used_after={}",
        ok.load(Relaxed), oom.load(Relaxed), launches.load(Relaxed), other.load(Relaxed), cu.used()
    );
    if other.load(Relaxed) != 0 {
        std::process::exit(3);
    }
}

/// Allocates `STRESS_CHUNK` (default 64 MiB) chunks until the first refusal and prints
/// `fill_first=<result of the first call> filled=<bytes> fill_last=<last result>`; then, on a
/// `STRESS_HOLD_AFTER` stdin handshake, waits for `quit`. Exits 0 (errors are printed, not fatal).
fn fill() {
    let cu = Cu::load();
    cu.open();
    let chunk = env_u64("STRESS_CHUNK", 64 * MIB);
    let (mut filled, mut first, mut last) = (0u64, None, 0);
    for _ in 0..100_000 {
        let (r, _) = cu.alloc(chunk);
        first.get_or_insert(r);
        last = r;
        if r != 0 {
            break;
        }
        filled += chunk;
    }
    println!("fill_first={} filled={filled} fill_last={last}", first.unwrap_or(-1));
    if std::env::var("STRESS_HOLD_AFTER").is_ok() {
        for line in std::io::stdin().lock().lines().map_while(Result::ok) {
            if line.trim() == "quit" {
                break;
            }
        }
    }
}

/// Allocates `STRESS_HOLD` bytes, launches, and exits normally without freeing: from `main`,
/// or with `STRESS_EXIT=thread` by `exit()` from another thread.
fn alloc_exit() {
    let cu = Cu::load();
    cu.open();
    let f = cu.empty_kernel();
    let (r, _) = cu.alloc(env_u64("STRESS_HOLD", 64 * MIB));
    assert_eq!(r, 0, "alloc");
    assert_eq!(cu.launch(f, 4), 0);
    assert_eq!(cu.sync(), 0);
    println!("allocated");
    if std::env::var("STRESS_EXIT").as_deref() == Ok("thread") {
        let t = std::thread::spawn(|| std::process::exit(0));
        let _ = t.join();
    }
    std::process::exit(0);
}

/// Holds `STRESS_HOLD` bytes; on each stdin line `probe`: allocates and frees 64 MiB, launches
/// and synchronizes, and prints how long that took. `quit` frees and exits.
fn survivor() {
    let cu = Cu::load();
    cu.open();
    let f = cu.empty_kernel();
    let (r, held) = cu.alloc(env_u64("STRESS_HOLD", 256 * MIB));
    assert_eq!(r, 0, "survivor hold");
    println!("ready used={}", cu.used());
    let stdin = std::io::stdin();
    for line in stdin.lock().lines().map_while(Result::ok) {
        match line.trim() {
            "probe" => {
                let t = Instant::now();
                let (ra, p) = cu.alloc(64 * MIB);
                let alloc_us = t.elapsed().as_micros();
                let rf = if ra == 0 { cu.free(p) } else { -1 };
                let t2 = Instant::now();
                let rl = cu.launch(f, 64);
                let rs = cu.sync();
                println!(
                    "probe alloc_result={ra} free_result={rf} launch_result={rl} sync_result={rs} alloc_us={alloc_us} launch_us={} total_us={}",
                    t2.elapsed().as_micros(),
                    t.elapsed().as_micros()
                );
            }
            "quit" => break,
            _ => {}
        }
    }
    assert_eq!(cu.free(held), 0);
    println!("survivor_done=1");
}

/// cuInit, print `retaining`, then retain the primary context: with
/// `MOCK_CUDA_DELAY=cuDevicePrimaryCtxRetain:N` the hook holds the region's device lock for N us
/// (it measures the context's memory under that lock).
fn lockholder() {
    let cu = Cu::load();
    unsafe {
        assert_eq!((cu.init)(0), 0);
        println!("retaining");
        let mut ctx = std::ptr::null_mut();
        let r = (cu.retain)(&mut ctx, 0);
        println!("retained result={r}");
    }
    std::thread::sleep(Duration::from_secs(30));
}

type NvmlHandle = *mut c_void;

unsafe fn nvml() -> (&'static libloading::Library, NvmlHandle) {
    let lib: &'static libloading::Library =
        Box::leak(Box::new(libloading::Library::new("libnvidia-ml.so.1").expect("dlopen libnvidia-ml.so.1")));
    let init: libloading::Symbol<unsafe extern "C" fn() -> u32> = lib.get(b"nvmlInit_v2").unwrap();
    let by_index: libloading::Symbol<unsafe extern "C" fn(u32, *mut NvmlHandle) -> u32> =
        lib.get(b"nvmlDeviceGetHandleByIndex_v2").unwrap();
    assert_eq!(init(), 0);
    let mut h = std::ptr::null_mut();
    assert_eq!(by_index(0, &mut h), 0);
    (lib, h)
}

fn nvml_used() {
    unsafe {
        let (lib, h) = nvml();
        let info: libloading::Symbol<unsafe extern "C" fn(NvmlHandle, *mut [u64; 3]) -> u32> =
            lib.get(b"nvmlDeviceGetMemoryInfo").unwrap();
        let mut m = [0u64; 3];
        assert_eq!(info(h, &mut m), 0);
        println!("nvml_total={} nvml_used={}", m[0], m[2]);
    }
}

/// Unhooked: samples device 0's use in a tight loop, from mock NVML (the device) and from the
/// region under its device lock (the ledger), until `STRESS_STOP` exists. Prints the maxima.
fn monitor() {
    let stop = PathBuf::from(std::env::var("STRESS_STOP").unwrap());
    let region_path = PathBuf::from(std::env::var("CUDA_DEVICE_MEMORY_SHARED_CACHE").unwrap());
    unsafe {
        let (lib, h) = nvml();
        let info: libloading::Symbol<unsafe extern "C" fn(NvmlHandle, *mut [u64; 3]) -> u32> =
            lib.get(b"nvmlDeviceGetMemoryInfo").unwrap();
        println!("monitor_ready=1");
        let (mut max_nvml, mut max_region, mut n_nvml, mut n_region) = (0u64, 0u64, 0u64, 0u64);
        let mut region = None;
        let deadline = Instant::now() + Duration::from_secs(600);
        while !stop.exists() && Instant::now() < deadline {
            let mut m = [0u64; 3];
            if info(h, &mut m) == 0 {
                max_nvml = max_nvml.max(m[2]);
                n_nvml += 1;
            }
            if region.is_none() {
                region = vgpu_core::region::Region::open_existing(&region_path).ok();
            }
            if let Some(r) = &region {
                // Under the device lock the ledger cannot move: an exact instant.
                if let Ok(g) = r.lock_device(0) {
                    max_region = max_region.max(g.used());
                    n_region += 1;
                }
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        println!("monitor_max_nvml={max_nvml} monitor_max_region={max_region} monitor_nvml_samples={n_nvml} monitor_region_samples={n_region}");
    }
}

/// Start-up storm member: block on the inherited `STRESS_GO_FD` (EOF = go), after telling the
/// parent through `STRESS_READY_FD`; then cuInit + context + first allocation (timed), a few
/// allocations and frees.
fn storm() {
    let go: i32 = std::env::var("STRESS_GO_FD").unwrap().parse().unwrap();
    let ready: i32 = std::env::var("STRESS_READY_FD").unwrap().parse().unwrap();
    let cu = Cu::load();
    unsafe {
        assert_eq!(libc::write(ready, b"r".as_ptr().cast(), 1), 1);
        let mut b = [0u8; 1];
        while libc::read(go, b.as_mut_ptr().cast(), 1) < 0 {}
    }
    let t0 = mono_ns();
    cu.open();
    let (r, p) = cu.alloc(16 * MIB);
    assert_eq!(r, 0, "first allocation");
    let init_ns = mono_ns() - t0;
    assert_eq!(cu.free(p), 0);
    for _ in 0..4 {
        let (r, p) = cu.alloc(8 * MIB);
        assert_eq!(r, 0);
        assert_eq!(cu.free(p), 0);
    }
    println!("storm_init_ns={init_ns} storm_done_ns={}", mono_ns());
}

/// Time from the parent's spawn (`STRESS_SPAWN_NS`, CLOCK_MONOTONIC) to the first successful
/// cuMemAlloc.
fn init_cost() {
    let spawn: u64 = std::env::var("STRESS_SPAWN_NS").unwrap().parse().unwrap();
    let cu = Cu::load();
    cu.open();
    let (r, p) = cu.alloc(2 * MIB);
    let t = mono_ns();
    assert_eq!(r, 0);
    assert_eq!(cu.free(p), 0);
    println!("init_cost_ns={}", t - spawn);
}

/// Threads allocate and free without pause while the main thread forks `STRESS_FORKS` children:
/// `none` (no CUDA, exits at once), `cuda` (cuInit, context, 16 MiB alloc/free in the child),
/// `exec` (exec test_meminfo `STRESS_EXEC` with its stdout in `STRESS_DIR/exec-N.out`).
/// `STRESS_FORK_MODES` (default `0,1,2`) picks the modes in turn. Each child must exit within 5 s (else it is killed and counted as a deadlock).
fn forker() {
    let forks = env_u64("STRESS_FORKS", 20);
    let modes: Vec<usize> = std::env::var("STRESS_FORK_MODES").unwrap_or("0,1,2".into()).split(',')
        .map(|m| m.parse().unwrap()).collect();
    let dir = PathBuf::from(std::env::var("STRESS_DIR").unwrap());
    let exec = std::ffi::CString::new(std::env::var("STRESS_EXEC").unwrap()).unwrap();
    let cu = Cu::load();
    let ctx = cu.open();
    let stop = AtomicBool::new(false);
    let churned = AtomicU64::new(0);
    let (mut deadlocks, mut failures, mut max_child_ns) = (0u64, 0u64, 0u64);
    let mut per_mode = [0u64; 3];
    std::thread::scope(|sc| {
        for t in 0..2u64 {
            let (stop, churned) = (&stop, &churned);
            sc.spawn(move || {
                unsafe { assert_eq!((cu.set_current)(ctx as *mut c_void), 0) };
                let mut rng = Rng::new(t + 11);
                while !stop.load(Relaxed) {
                    let (r, p) = cu.alloc((rng.below(16) + 1) * MIB);
                    if r == 0 {
                        assert_eq!(cu.free(p), 0);
                    }
                    churned.fetch_add(1, Relaxed);
                }
            });
        }
        for i in 0..forks {
            if deadlocks >= 2 {
                break; // bounded: the verdict is in
            }
            let mode = modes[i as usize % modes.len()];
            let out_path = std::ffi::CString::new(dir.join(format!("exec-{i}.out")).to_str().unwrap()).unwrap();
            let argv = [exec.as_ptr(), std::ptr::null()];
            let t = mono_ns();
            // SAFETY: the child only calls the driver (through the hook) and async-signal-safe
            // functions, then _exits or execs.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                unsafe {
                    let code = match mode {
                        0 => 0,
                        1 => {
                            let mut c2 = std::ptr::null_mut();
                            let mut p = 0u64;
                            if (cu.init)(0) != 0 {
                                20
                            } else if (cu.retain)(&mut c2, 0) != 0 {
                                21
                            } else if (cu.set_current)(c2) != 0 {
                                22
                            } else if (cu.alloc)(&mut p, 16 << 20) != 0 {
                                23
                            } else if (cu.free)(p) != 0 {
                                24
                            } else {
                                0
                            }
                        }
                        _ => {
                            let fd = libc::open(out_path.as_ptr(), libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC, 0o644);
                            libc::dup2(fd, 1);
                            libc::execv(exec.as_ptr(), argv.as_ptr());
                            127
                        }
                    };
                    libc::_exit(code);
                }
            }
            assert!(pid > 0, "fork failed");
            let mut status = 0;
            let deadline = Instant::now() + Duration::from_secs(5);
            let exited = loop {
                let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
                if r == pid {
                    break true;
                }
                if Instant::now() > deadline {
                    unsafe {
                        libc::kill(pid, libc::SIGKILL);
                        libc::waitpid(pid, &mut status, 0);
                    }
                    break false;
                }
                std::thread::sleep(Duration::from_micros(500));
            };
            max_child_ns = max_child_ns.max(mono_ns() - t);
            if !exited {
                deadlocks += 1;
                eprintln!("forker: child {i} (mode {mode}) did not exit within 5 s");
            } else if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
                failures += 1;
                eprintln!("forker: child {i} (mode {mode}) status {status:#x}");
            } else {
                per_mode[mode] += 1;
            }
        }
        stop.store(true, Relaxed);
    });
    println!(
        "forks={forks} deadlocks={deadlocks} failures={failures} ok_none={} ok_cuda={} ok_exec={} max_child_ms={:.1} churned={} forker_used={}",
        per_mode[0], per_mode[1], per_mode[2], max_child_ns as f64 / 1e6, churned.load(Relaxed), cu.used()
    );
}

static USR1: AtomicU64 = AtomicU64::new(0);
static USR2: AtomicU64 = AtomicU64::new(0);
extern "C" fn on_usr1(_: i32) {
    USR1.fetch_add(1, Relaxed);
}
extern "C" fn on_usr2(_: i32) {
    USR2.fetch_add(1, Relaxed);
}

/// The program's own SIGUSR1/SIGUSR2 handlers, installed before any CUDA call; then CUDA work
/// (context, allocations, launches: the hook's runtime and monitor thread start); prints its
/// SigCgt and `ready`, keeps launching until it saw 3 SIGUSR1 and 2 SIGUSR2 (or 10 s), printing
/// `seen=USR1,USR2` whenever a count moved (so the sender can wait for each signal's delivery).
fn signals() {
    unsafe {
        for (sig, h) in [(libc::SIGUSR1, on_usr1 as extern "C" fn(i32)), (libc::SIGUSR2, on_usr2)] {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = h as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            assert_eq!(libc::sigaction(sig, &sa, std::ptr::null_mut()), 0);
        }
    }
    let cu = Cu::load();
    cu.open();
    let f = cu.empty_kernel();
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(400) {
        let (r, p) = cu.alloc(4 * MIB);
        assert_eq!(r, 0);
        assert_eq!(cu.launch(f, 4), 0);
        assert_eq!(cu.sync(), 0);
        assert_eq!(cu.free(p), 0);
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let cgt = status.lines().find(|l| l.starts_with("SigCgt:")).unwrap().split_whitespace().nth(1).unwrap().to_string();
    println!("sigcgt={cgt}");
    println!("ready");
    let t = Instant::now();
    let mut shown = (0, 0);
    loop {
        let now = (USR1.load(Relaxed), USR2.load(Relaxed));
        if now != shown {
            println!("seen={},{}", now.0, now.1);
            shown = now;
        }
        if (now.0 >= 3 && now.1 >= 2) || t.elapsed() > Duration::from_secs(10) {
            break;
        }
        assert_eq!(cu.launch(f, 4), 0);
        assert_eq!(cu.sync(), 0);
        std::thread::sleep(Duration::from_millis(1));
    }
    println!("usr1={} usr2={}", USR1.load(Relaxed), USR2.load(Relaxed));
}

/// This process's usage in the region (its own slot: the only live process in these tests).
fn own_region_used() -> u64 {
    let p = std::env::var("CUDA_DEVICE_MEMORY_SHARED_CACHE").unwrap();
    match vgpu_core::region::Region::snapshot(&p) {
        Ok(r) => r.device_used(0),
        Err(_) => 0,
    }
}

/// Context paths with `MOCK_CUDA_FAULT` set by the parent (`STRESS_FAULT_CODE` = the injected
/// code): cuDevicePrimaryCtxRetain call 1, cuCtxCreate_v2 call 1, cuCtxDestroy_v2 call 1,
/// cuDevicePrimaryCtxRelease_v2 call 1 fail; each returns the code unchanged and leaves the
/// region usage as before; the retried call succeeds.
fn ctx_faults() {
    let code: i32 = std::env::var("STRESS_FAULT_CODE").unwrap().parse().unwrap();
    let cu = Cu::load();
    let mut lines = Vec::new();
    unsafe {
        assert_eq!((cu.init)(0), 0);
        let u0 = own_region_used();
        let mut ctx = std::ptr::null_mut();
        let r = (cu.retain)(&mut ctx, 0);
        lines.push(format!("call=cuDevicePrimaryCtxRetain result={r} before={u0} after={}", own_region_used()));
        let r = (cu.retain)(&mut ctx, 0);
        assert_eq!(r, 0, "second retain");
        let u1 = own_region_used();
        lines.push(format!("call=retain_ok result={r} before={u0} after={u1}"));
        let mut c2 = std::ptr::null_mut();
        let r = (cu.ctx_create)(&mut c2, 0, 0);
        lines.push(format!("call=cuCtxCreate_v2 result={r} before={u1} after={}", own_region_used()));
        assert_eq!((cu.ctx_create)(&mut c2, 0, 0), 0, "second ctx create");
        let u2 = own_region_used();
        let r = (cu.ctx_destroy)(c2);
        lines.push(format!("call=cuCtxDestroy_v2 result={r} before={u2} after={}", own_region_used()));
        assert_eq!((cu.ctx_destroy)(c2), 0, "second ctx destroy");
        assert_eq!((cu.set_current)(ctx), 0);
        let u3 = own_region_used();
        let r = (cu.release)(0);
        lines.push(format!("call=cuDevicePrimaryCtxRelease_v2 result={r} before={u3} after={}", own_region_used()));
        assert_eq!((cu.release)(0), 0, "second release");
        lines.push(format!("call=release_ok result=0 before={u3} after={}", own_region_used()));
    }
    for l in lines {
        println!("{l}");
    }
    println!("expected_code={code}");
}

/// cuLaunchKernel with `MOCK_CUDA_FAULT=cuLaunchKernel:2:CODE` under an SM cap: launch 1
/// succeeds, launch 2 returns the code, launches 3.. succeed.
fn launch_faults() {
    let cu = Cu::load();
    cu.open();
    let f = cu.empty_kernel();
    let u0 = cu.used();
    let rs: Vec<String> = (0..5).map(|_| cu.launch(f, 8).to_string()).collect();
    println!("launch_results={} sync={} used_before={u0} used_after={}", rs.join(","), cu.sync(), cu.used());
}

/// Allocate and free 1 GiB `STRESS_ITERS` times (never more than 1 GiB live); prints the first
/// failing iteration (0 = none).
fn va_cycle() {
    let iters = env_u64("STRESS_ITERS", 1100);
    let cu = Cu::load();
    cu.open();
    let mut first_fail = 0;
    let mut code = 0;
    for i in 1..=iters {
        let (r, p) = cu.alloc(GIB);
        if r != 0 {
            first_fail = i;
            code = r;
            break;
        }
        assert_eq!(cu.free(p), 0);
    }
    println!("va_cycle_iters={iters} first_fail={first_fail} code={code}");
}
