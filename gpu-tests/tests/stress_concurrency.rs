//! Issue 6: concurrency (processes x threads allocating, freeing and launching under a memory
//! cap and an SM cap, watched by an unhooked monitor), fork/exec (children with and without CUDA
//! forked while other threads allocate; exec keeps the hook) and signals (the library takes no
//! signal handler from the program).

mod stress_util;
use stress_util::*;
use std::time::{Duration, Instant};

#[test]
#[ignore = "run by ci/stress.sh"]
fn cap_never_exceeded_and_counters_return_to_zero() {
    let (procs, threads, iters) = if full() { (16, 8, 300) } else { (4, 4, 300) };
    let cap = GIB;
    let s = Scratch::new("st-conc");
    let stop = s.dir.join("stop");
    // the unhooked monitor creates the mock state first (so the config is the stress one)
    // Contexts are charged even past the cap (by design, a context is never refused): small
    // contexts, all created before anyone allocates (STRESS_START), so they fit under the cap
    let small_ctx = [("MOCK_GPU_CTX_MEM", "16m"), ("VGPU_CONTEXT_RESERVE", "16m")];
    let mut m = worker("monitor", &s, false);
    m.env("STRESS_STOP", &stop).envs(small_ctx);
    let mut mon = Live::spawn(&mut m);
    mon.expect_line("monitor_ready=1", Duration::from_secs(30));
    let start = s.dir.join("start");
    let kids: Vec<Live> = (0..procs)
        .map(|_| {
            let mut c = worker("churn", &s, true);
            c.envs(small_ctx).env("CUDA_DEVICE_MEMORY_LIMIT", "1g")
                .env("CUDA_DEVICE_SM_LIMIT", "50")
                .env("STRESS_THREADS", threads.to_string())
                .env("STRESS_ITERS", iters.to_string())
                .env("STRESS_MAX_KIB", (48 * 1024).to_string())
                .env("STRESS_START", &start);
            Live::spawn(&mut c)
        })
        .collect();
    let mut kids = kids;
    for k in &mut kids {
        k.expect_line("ready", Duration::from_secs(120));
    }
    let t = Instant::now();
    std::fs::write(&start, b"").unwrap();
    let (mut ok, mut oom, mut launches) = (0, 0, 0);
    for k in kids {
        let (st, out, err) = k.finish(Duration::from_secs(240));
        assert!(st.success(), "worker failed: {st}\n{out}\n{err}");
        assert_eq!(num(&out, "churn_other"), 0, "{out}\n{err}");
        ok += num(&out, "churn_ok");
        oom += num(&out, "churn_oom");
        launches += num(&out, "churn_launches");
    }
    let elapsed = t.elapsed();
    std::fs::write(&stop, b"").unwrap();
    let (st, out, err) = mon.finish(Duration::from_secs(30));
    assert!(st.success(), "monitor: {out}\n{err}");
    let (max_nvml, max_region) = (num(&out, "monitor_max_nvml"), num(&out, "monitor_max_region"));
    let samples = num(&out, "monitor_nvml_samples") + num(&out, "monitor_region_samples");
    assert!(num(&out, "monitor_region_samples") > 20, "{out}");
    assert!(max_nvml <= cap, "device use {max_nvml} > cap {cap}");
    assert!(max_region <= cap, "region ledger {max_region} > cap {cap}");
    assert!(ok > 0 && oom > 0, "no pressure on the cap: ok={ok} oom={oom}");
    assert!(max_region > cap / 2, "cap barely used: {max_region}");
    let (used, pids) = region_state(&s.region());
    assert_eq!((used, pids.len()), (0, 0), "region counters after every process exited");
    assert_eq!(mock_nvml_used(&s), 0, "mock device memory after every process exited");
    report(
        "concurrency",
        &[
            ("procs", procs.to_string()),
            ("threads", threads.to_string()),
            ("allocs_ok", ok.to_string()),
            ("allocs_oom", oom.to_string()),
            ("launches", launches.to_string()),
            ("monitor_samples", samples.to_string()),
            ("max_device_mib", (max_nvml / MIB).to_string()),
            ("max_ledger_mib", (max_region / MIB).to_string()),
            ("cap_mib", (cap / MIB).to_string()),
            ("elapsed_s", format!("{:.1}", elapsed.as_secs_f64())),
        ],
    );
}

/// Run the forker (2 threads allocating without pause, main thread forking) with `modes`
/// (0 none, 1 CUDA in the child, 2 exec test_meminfo); returns its output.
fn forker(s: &Scratch, forks: usize, modes: &str) -> (String, Duration) {
    let mut c = worker("forker", s, true);
    c.env("CUDA_DEVICE_MEMORY_LIMIT", "2g")
        .env("CUDA_DEVICE_SM_LIMIT", "50")
        .env("STRESS_FORKS", forks.to_string())
        .env("STRESS_FORK_MODES", modes)
        .env("STRESS_DIR", &s.dir)
        .env("STRESS_EXEC", artifacts().sample("test_meminfo"));
    let t = Instant::now();
    let d = run_limited(&mut c, Duration::from_secs(forks as u64 * 6 + 60));
    assert!(d.status.success(), "forker: {}\n{}\n{}", d.status, d.stdout, d.stderr);
    (format!("{}\n{}", d.stdout, d.stderr), t.elapsed())
}

/// Children without CUDA use and exec'd children, forked while two threads of the parent
/// allocate: none hangs on a lock inherited mid-operation, exec keeps the hook (the exec'd
/// test_meminfo sees the capped virtual device), the parent's accounting is unchanged.
#[test]
#[ignore = "run by ci/stress.sh"]
fn fork_while_allocating_and_exec_keeps_the_hook() {
    let forks = scaled(30, 300);
    let s = Scratch::new("st-fork");
    let (out, elapsed) = forker(&s, forks, "0,2");
    assert_eq!(num(&out, "deadlocks"), 0, "a forked child hung: {out}");
    assert_eq!(num(&out, "failures"), 0, "a forked child failed: {out}");
    assert_eq!(num(&out, "ok_none") + num(&out, "ok_exec"), forks as u64, "{out}");
    // the forker freed everything: the container holds only its context
    assert_eq!(num(&out, "forker_used"), CTX, "parent's accounting after {forks} children: {out}");
    let mut execs = 0;
    for e in std::fs::read_dir(&s.dir).unwrap().map(|e| e.unwrap().path()) {
        if e.file_name().unwrap().to_str().unwrap().starts_with("exec-") {
            let text = std::fs::read_to_string(&e).unwrap();
            let want = (2 * GIB).to_string();
            assert_eq!(value(&text, "meminfo_total"), Some(want.as_str()), "exec'd child not hooked: {}: {text}", e.display());
            execs += 1;
        }
    }
    assert_eq!(execs, forks / 2, "exec outputs");
    let (used, pids) = region_state(&s.region());
    assert_eq!((used, pids.len()), (0, 0), "region after the forker exited");
    report(
        "fork_exec",
        &[
            ("forks", forks.to_string()),
            ("no_cuda", num(&out, "ok_none").to_string()),
            ("exec_hooked", execs.to_string()),
            ("deadlocks", "0".into()),
            ("max_child_ms", value(&out, "max_child_ms").unwrap().to_string()),
            ("parent_allocs_meanwhile", num(&out, "churned").to_string()),
            ("elapsed_s", format!("{:.1}", elapsed.as_secs_f64())),
        ],
    );
}

/// Children that use CUDA themselves (cuInit, context, allocation), forked while two threads of
/// the parent allocate: each must finish within 5 s and be accounted in its own slot.
#[test]
#[ignore = "run by ci/stress.sh"]
fn fork_while_allocating_child_uses_cuda() {
    let forks = scaled(10, 100);
    let s = Scratch::new("st-forkcuda");
    let (out, elapsed) = forker(&s, forks, "1");
    report(
        "fork_cuda_child",
        &[
            ("forks", forks.to_string()),
            ("ok", value(&out, "ok_cuda").unwrap_or("?").to_string()),
            ("deadlocks", value(&out, "deadlocks").unwrap_or("?").to_string()),
            ("failures", value(&out, "failures").unwrap_or("?").to_string()),
            ("elapsed_s", format!("{:.1}", elapsed.as_secs_f64())),
        ],
    );
    assert_eq!(num(&out, "deadlocks"), 0, "a forked child using CUDA hung (>5 s): {out}");
    assert_eq!(num(&out, "failures"), 0, "a forked child using CUDA failed: {out}");
    assert_eq!(num(&out, "ok_cuda"), forks as u64, "{out}");
    assert_eq!(num(&out, "forker_used"), CTX, "parent's accounting: {out}");
    let (used, pids) = region_state(&s.region());
    assert_eq!((used, pids.len()), (0, 0), "region after the forker exited");
}

/// SigCgt of `pid` without glibc's internal signals 32 (SIGCANCEL) and 33 (SIGSETXID), which
/// glibc installs itself when a process creates its first thread (the hook starts one).
fn sigcgt_of(pid: i32) -> String {
    let st = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let hex = st.lines().find(|l| l.starts_with("SigCgt:")).unwrap().split_whitespace().nth(1).unwrap().to_string();
    strip_glibc(&hex)
}

fn strip_glibc(hex: &str) -> String {
    let v = u64::from_str_radix(hex, 16).unwrap();
    format!("{:016x}", v & !((1u64 << 31) | (1u64 << 32)))
}

#[test]
#[ignore = "run by ci/stress.sh"]
fn no_signal_handlers_taken() {
    let s = Scratch::new("st-sig");
    let mut cgt = Vec::new();
    for hooked in [false, true] {
        let mut c = worker("signals", &s, hooked);
        c.env("CUDA_DEVICE_MEMORY_LIMIT", "2g").env("CUDA_DEVICE_SM_LIMIT", "30");
        let mut w = Live::spawn(&mut c);
        let line = w.expect_line("sigcgt=", Duration::from_secs(30));
        cgt.push(strip_glibc(value(&line, "sigcgt").unwrap()));
        w.expect_line("ready", Duration::from_secs(10));
        // One at a time, each after the previous one's delivery (a pending signal is not queued
        // twice): the worker prints its handlers' counts whenever they move.
        let (mut usr1, mut usr2) = (0, 0);
        for sig in [libc::SIGUSR1, libc::SIGUSR2, libc::SIGUSR1, libc::SIGUSR2, libc::SIGUSR1] {
            unsafe { libc::kill(w.pid(), sig) };
            if sig == libc::SIGUSR1 { usr1 += 1 } else { usr2 += 1 }
            w.expect_line(&format!("seen={usr1},{usr2}"), Duration::from_secs(10));
        }
        let (st, out, err) = w.finish(Duration::from_secs(20));
        assert!(st.success(), "hooked={hooked}: {st}\n{out}\n{err}");
        assert_eq!(value(&out, "usr1"), Some("3"), "hooked={hooked}: the program's SIGUSR1 handler\n{out}");
        assert_eq!(value(&out, "usr2"), Some("2"), "hooked={hooked}: the program's SIGUSR2 handler\n{out}");
    }
    assert_eq!(cgt[0], cgt[1], "SigCgt differs under the hook (unhooked {}, hooked {})", cgt[0], cgt[1]);
    // A C sample with its own SIGINT/SIGTERM handlers, read from outside while it launches.
    let mut c_cgt = Vec::new();
    for hooked in [false, true] {
        let mut c = sample("test_runtime_launch", &s, hooked);
        c.args(["--us", "200", "--seconds", "3"]).env("CUDA_DEVICE_SM_LIMIT", "50");
        let mut w = Live::spawn(&mut c);
        w.expect_line("second=1", Duration::from_secs(20));
        c_cgt.push(sigcgt_of(w.pid()));
        unsafe { libc::kill(w.pid(), libc::SIGINT) };
        let (st, out, err) = w.finish(Duration::from_secs(20));
        assert!(st.success(), "test_runtime_launch hooked={hooked} did not stop cleanly on its SIGINT handler: {st}\n{out}\n{err}");
    }
    assert_eq!(c_cgt[0], c_cgt[1], "test_runtime_launch SigCgt unhooked {} vs hooked {}", c_cgt[0], c_cgt[1]);
    report(
        "signals",
        &[("sigcgt_worker", cgt[1].clone()), ("sigcgt_sample", c_cgt[1].clone()), ("handlers_fired", "usr1=3,usr2=2".into())],
    );
}
