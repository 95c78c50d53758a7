//! Run-time policy and control on the mock GPU (issues 4 and 5): `GPU_CORE_UTILIZATION_POLICY`,
//! the soft cap and HAMi's `utilization_switch`, the priority protocol (`recent_kernel`),
//! `shrreg-tool --set-mem-limit` on a live container, and a running sample's usage and
//! utilization in `shrreg-tool --print`, `vgpu-smi --json` and `vgpu-smi --metrics`.
//!
//! Shares are kernels/s against the uncapped rate measured with the hook loaded (as in
//! `limiter.rs`), with the same ±10 point tolerances for a loaded 2-core machine. Timing tests
//! share the `mock_gpu_timing` serial key with the other limiter tests.

mod common;
mod hook_util;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::{live_region, mean, metric_samples, poll, second_rates, tool, Bg, Json, Scratch};
use hook_util::{hooked, num};
use serial_test::serial;
use vgpu_core::region::Region;

const GIB: u64 = 1 << 30;
/// Kernel length of the share tests (as limiter.rs), synchronized after each launch.
const KERNEL_US: &str = "2000";

/// test_runtime_launch on a fresh 8 GiB mock GPU under the hook, with `env`.
fn launcher(s: &Scratch, us: &str, seconds: u32, env: &[(&str, &str)]) -> std::process::Command {
    let mut c = hooked("test_runtime_launch", s, None);
    c.args(["--us", us, "--seconds", &seconds.to_string(), "--sync-every", "1"]);
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

/// Mean kernels/s of a 6-second run from its third second on; `during` runs while it starts.
fn run_rate(env: &[(&str, &str)], during: impl FnOnce(&Scratch)) -> f64 {
    let s = Scratch::new("ctl-share");
    let bg = Bg::spawn(launcher(&s, KERNEL_US, 6, env), "test_runtime_launch");
    during(&s);
    let text = bg.finish(Duration::from_secs(15));
    mean(&second_rates(&text, 2), &format!("rates after second 2 in:\n{text}"))
}

/// Uncapped kernels/s with the hook loaded, measured once per test binary.
fn baseline() -> f64 {
    static BASE: OnceLock<f64> = OnceLock::new();
    *BASE.get_or_init(|| {
        let s = Scratch::new("ctl-base");
        let text = Bg::spawn(launcher(&s, KERNEL_US, 4, &[]), "baseline").finish(Duration::from_secs(12));
        mean(&second_rates(&text, 1), &format!("baseline rates in:\n{text}"))
    })
}

fn share_of(env: &[(&str, &str)], during: impl FnOnce(&Scratch)) -> f64 {
    let base = baseline();
    100.0 * run_rate(env, during) / base
}

fn assert_share(got: f64, want: f64, what: &str) {
    eprintln!("{what}: {got:.1}% of the uncapped rate");
    assert!((got - want).abs() <= 10.0, "{what}: delivered {got:.1}% of the uncapped rate, expected about {want}%");
}

// ---------- (a) and (b): policy, soft cap, utilization_switch ----------

#[test]
#[serial(mock_gpu_timing)]
fn policy_disable_never_caps() {
    let got = share_of(&[("CUDA_DEVICE_SM_LIMIT", "25"), ("GPU_CORE_UTILIZATION_POLICY", "disable")], |_| {});
    assert_share(got, 100.0, "cap 25 with GPU_CORE_UTILIZATION_POLICY=disable");
}

#[test]
#[serial(mock_gpu_timing)]
fn soft_cap_applies_while_the_gpu_is_otherwise_idle() {
    let got = share_of(&[("CUDA_DEVICE_SM_LIMIT", "25"), ("CUDA_CORE_SOFT_LIMIT", "60")], |_| {});
    assert_share(got, 60.0, "hard cap 25, soft cap 60, alone on the GPU");
}

#[test]
#[serial(mock_gpu_timing)]
fn policy_force_ignores_the_soft_cap() {
    let got = share_of(
        &[("CUDA_DEVICE_SM_LIMIT", "25"), ("CUDA_CORE_SOFT_LIMIT", "60"), ("GPU_CORE_UTILIZATION_POLICY", "force")],
        |_| {},
    );
    assert_share(got, 25.0, "hard cap 25, soft cap 60, GPU_CORE_UTILIZATION_POLICY=force");
}

#[test]
#[serial(mock_gpu_timing)]
fn utilization_switch_one_enforces_the_hard_cap() {
    let got = share_of(&[("CUDA_DEVICE_SM_LIMIT", "25"), ("CUDA_CORE_SOFT_LIMIT", "60")], |s| {
        // As HAMi's monitor does when the GPU is contended: written as soon as the region exists.
        live_region(&s.region()).set_utilization_switch(1);
    });
    assert_share(got, 25.0, "hard cap 25, soft cap 60, region utilization_switch=1");
}

// ---------- (c): priority protocol ----------

/// A free-running 1 ms kernel loop with `CUDA_TASK_PRIORITY=prio`, its rate before `T` (after
/// its third second), then `recent_kernel = -1` written at `T`.
fn start_priority_run(s: &Scratch, prio: &str) -> (Bg, Region, f64, Instant) {
    let mut bg = Bg::spawn(launcher(s, "1000", 0, &[("CUDA_TASK_PRIORITY", prio)]), "test_runtime_launch");
    bg.wait_line("second=3 ", Duration::from_secs(10));
    let before = mean(&second_rates(&bg.text(), 1), "rates before recent_kernel=-1");
    let region = live_region(&s.region());
    region.set_recent_kernel(-1);
    (bg, region, before, Instant::now())
}

fn sleep_until(t: Instant) {
    if let Some(d) = t.checked_duration_since(Instant::now()) {
        std::thread::sleep(d);
    }
}

#[test]
#[serial(mock_gpu_timing)]
fn recent_kernel_minus_one_pauses_a_lower_priority_container_and_zero_resumes() {
    let s = Scratch::new("ctl-prio");
    let (bg, region, before, t) = start_priority_run(&s, "1");
    // Launches are held within a monitor tick; a held launch returns after 2 s at most, so the
    // first per-second line after T (~T+2 s) still counts pre-T kernels; later ones do not.
    let resume_at = t + Duration::from_millis(5500);
    sleep_until(resume_at);
    let paused = bg.rates(t + Duration::from_millis(2800), resume_at);
    region.set_recent_kernel(0);
    let r = Instant::now();
    sleep_until(r + Duration::from_millis(3700));
    let after = bg.rates(r + Duration::from_millis(1500), Instant::now());
    let text = bg.text();
    eprintln!("before {before:.0}/s, paused {paused:?}, after {after:?}");
    assert!(!paused.is_empty(), "no per-second line while paused (before {before:.0}/s)\n{text}");
    let worst = paused.iter().cloned().fold(0.0, f64::max);
    assert!(
        worst < 0.1 * before,
        "recent_kernel=-1 with CUDA_TASK_PRIORITY=1: {worst:.1} kernels/s while paused, {before:.0}/s before\n{text}"
    );
    let after = mean(&after, &format!("rates after recent_kernel=0\n{text}"));
    assert!(after > 0.7 * before, "recent_kernel=0: {after:.0} kernels/s, {before:.0}/s before the pause\n{text}");
    bg.stop();
}

#[test]
#[serial(mock_gpu_timing)]
fn recent_kernel_minus_one_does_not_pause_priority_zero() {
    let s = Scratch::new("ctl-prio0");
    let (bg, region, before, t) = start_priority_run(&s, "0");
    sleep_until(t + Duration::from_millis(3700));
    let during = bg.rates(t + Duration::from_millis(1200), Instant::now());
    let text = bg.text();
    assert_eq!(region.recent_kernel(), -1, "recent_kernel was reset by the hook");
    let during = mean(&during, &format!("rates after recent_kernel=-1\n{text}"));
    assert!(
        during > 0.7 * before,
        "recent_kernel=-1 paused a CUDA_TASK_PRIORITY=0 process: {during:.0} kernels/s, {before:.0}/s before\n{text}"
    );
    bg.stop();
}

// ---------- (d): lowering the memory cap below current use ----------

fn slot_of(r: &Region, pid: i32) -> vgpu_core::region::SlotId {
    r.live_slots().find(|&sl| r.slot_pid(sl) == pid).unwrap_or_else(|| panic!("no live slot for pid {pid}"))
}

/// A hooked one-shot allocation of 64 MiB under the same env as the holder: (succeeded, stdout).
fn try_alloc(s: &Scratch) -> (bool, String) {
    let mut c = hooked("test_alloc_paths", s, Some("4g"));
    c.args(["--path", "mem_alloc", "--size", "64m"]);
    let (st, out) = Bg::spawn(c, "test_alloc_paths 64m").outcome(Duration::from_secs(10));
    eprintln!("64 MiB allocation: {st}\n{out}");
    (st.success(), out)
}

#[test]
#[serial(mock_gpu_timing)]
fn set_mem_limit_below_use_refuses_new_allocations_and_frees_nothing() {
    let s = Scratch::new("ctl-mem");
    let mut c = hooked("test_alloc_paths", &s, Some("4g"));
    c.args(["--path", "mem_alloc", "--size", "1g", "--hold", "--hold-seconds", "30"]);
    let mut holder = Bg::spawn(c, "holder");
    let held = num(&holder.wait_line("holding=1", Duration::from_secs(10)), "used");
    let r = live_region(&s.region());
    let slot = slot_of(&r, holder.pid());
    let used = r.device_used(0);
    let mine = r.proc_usage(slot, 0);
    assert_eq!(used, held, "region usage vs the holder's own cuMemGetInfo view");
    assert!(mine.data >= GIB, "holder's slot does not show its 1 GiB: {mine:?}");

    let low = used / 2;
    let said = tool(&s, "shrreg-tool", &["--set-mem-limit", "0", &low.to_string()]);
    assert!(said.contains("below current use"), "shrreg-tool did not say the cap is below use: {said}");
    assert_eq!(r.limit(0), Some(low));
    // The holder's own view first (SIGUSR2: it prints what cuMemGetInfo shows now): the lowered
    // cap has reached it, then nothing of its allocation moved.
    // SAFETY: signalling our own child.
    unsafe { libc::kill(holder.pid(), libc::SIGUSR2) };
    let seen = holder.wait_line("report=1 ", Duration::from_secs(10));
    assert_eq!(num(&seen, "total"), low, "the holder does not see the lowered cap: {seen}");
    assert_eq!(num(&seen, "free"), 0, "the holder sees room under a cap below its use: {seen}");
    assert!(holder.alive(), "the holder died after the cap was lowered\n{}", holder.text());
    assert_eq!(r.device_used(0), used, "lowering the cap changed the container's usage");
    assert_eq!(r.proc_usage(slot, 0), mine, "lowering the cap changed the holder's accounting");

    let (ok, out) = try_alloc(&s);
    assert!(!ok && out.contains("CUDA_ERROR_OUT_OF_MEMORY"), "a new allocation under a cap below use was not refused with OOM:\n{out}");
    assert_eq!(r.limit(0), Some(low), "the new process replaced the lowered cap");
    assert_eq!(r.device_used(0), used, "the refused process left usage behind");

    tool(&s, "shrreg-tool", &["--set-mem-limit", "0", "4g"]);
    let (ok, out) = try_alloc(&s);
    assert!(ok && out.contains("result=CUDA_SUCCESS"), "allocation after raising the cap again failed:\n{out}");
    assert_eq!(r.device_used(0), used, "the finished process left usage behind");
    assert!(holder.alive(), "the holder died\n{}", holder.text());
    let out = holder.stop();
    assert!(out.contains("free_result=CUDA_SUCCESS"), "the holder could not free its allocation:\n{out}");
}

/// A cap set at run time above the device (`--set-mem-limit 0 100t` on an 8 GiB GPU, no
/// oversubscription) is the device: NVML shows what `cuMemGetInfo` shows, as for the same value
/// in the environment (clamped). Hostile review: `nvidia-smi` in the container showed a 100 TiB
/// GPU with 100 TiB free beside `cuMemGetInfo`'s 8 GiB.
#[test]
#[serial(mock_gpu_timing)]
fn a_cap_set_above_the_device_shows_the_device_in_nvml() {
    let s = Scratch::new("ctl-mem-huge");
    let meminfo = || {
        let (st, out) = Bg::spawn(hooked("test_meminfo", &s, Some("2g")), "test_meminfo").outcome(Duration::from_secs(10));
        assert!(st.success(), "test_meminfo failed: {st}\n{out}");
        out
    };
    let before = meminfo();
    assert_eq!(num(&before, "nvml_total"), 2 * GIB, "{before}");
    tool(&s, "shrreg-tool", &["--set-mem-limit", "0", "100t"]);
    let out = meminfo();
    let total = num(&out, "meminfo_total");
    assert_eq!(total, 8 * GIB, "cuMemGetInfo under a 100 TiB cap on an 8 GiB device\n{out}");
    for k in ["nvml_total", "nvml_v2_total"] {
        assert_eq!(num(&out, k), total, "{k} under a 100 TiB cap on an 8 GiB device\n{out}");
    }
    assert!(num(&out, "nvml_free") <= total, "{out}");
}

// ---------- (e): usage and utilization in the tools ----------

/// test_runtime_launch (1 ms kernels) under an SM cap of 50% and a 4 GiB memory cap, past its
/// second second (utilization is published every 200 ms, the container's over 500 ms windows).
fn capped_launcher(s: &Scratch) -> Bg {
    let mut run = Bg::spawn(
        launcher(s, "1000", 0, &[("CUDA_DEVICE_SM_LIMIT", "50"), ("CUDA_DEVICE_MEMORY_LIMIT", "4g")]),
        "test_runtime_launch",
    );
    run.wait_line("second=2 ", Duration::from_secs(10));
    run
}

fn smi_json(s: &Scratch) -> Json {
    Json::parse(&tool(s, "vgpu-smi", &["--json"]))
}

#[test]
#[serial(mock_gpu_timing)]
fn running_usage_and_utilization_show_in_print_json_and_metrics() {
    let s = Scratch::new("ctl-tools");
    let run = capped_launcher(&s);
    let lp = run.pid();
    let r = live_region(&s.region());
    let used = r.proc_usage(slot_of(&r, lp), 0).total;
    assert!(used > 0 && r.device_used(0) == used, "launcher {used}, device {}", r.device_used(0));
    // Plausible, not exact: occupancy over a short window of a capped loop.
    let dev_util_ok = |u: f64| (5.0..=100.0).contains(&u);
    let proc_util_ok = |u: f64| u > 0.0 && u <= 100.0;

    // --print: the device row and the process row.
    let print = tool(&s, "shrreg-tool", &["--print"]);
    let pct_after = |l: &str, key: &str| -> f64 {
        let rest = &l[l.find(key).unwrap_or_else(|| panic!("no {key:?} in {l:?}")) + key.len()..];
        rest.trim_start().split('%').next().unwrap().trim().parse().unwrap_or_else(|_| panic!("bad {key:?} in {l:?}"))
    };
    let row = print.lines().find(|l| l.contains(&format!(" pid {lp} "))).unwrap_or_else(|| panic!("no row for pid {lp}:\n{print}"));
    assert!(proc_util_ok(pct_after(row, "sm util")), "launcher's row shows no SM utilization:\n{print}");
    assert!(!row.contains("used 0B"), "launcher's row shows no memory:\n{print}");
    let dev = print.lines().find(|l| l.starts_with("device 0:")).unwrap_or_else(|| panic!("no device row:\n{print}"));
    assert!(dev.contains("sm limit 50%") && dev.contains("memory limit 4.00GiB"), "device row: {dev}");
    assert!(dev_util_ok(pct_after(dev, "util")), "device row shows no utilization: {dev}");

    // --json
    let j = smi_json(&s);
    let d = &j.get("devices").arr()[0];
    assert_eq!(d.get("memory_used_bytes").num() as u64, used, "{j:?}");
    assert_eq!(d.get("memory_limit_bytes").num() as u64, 4 * GIB);
    assert_eq!(d.get("sm_limit_percent").num(), 50.0);
    assert!(dev_util_ok(d.get("utilization_percent").num()), "device utilization: {d:?}");
    let p = d.get("processes").arr().iter().find(|p| p.get("pid").num() as i32 == lp).unwrap_or_else(|| panic!("no process {lp} in {d:?}"));
    assert_eq!(p.get("used_bytes").num() as u64, used);
    assert!(proc_util_ok(p.get("sm_util_percent").num()), "launcher: {p:?}");
    assert!(j.get("last_kernel_time").num() > 0.0);

    // --metrics
    let m = tool(&s, "vgpu-smi", &["--metrics"]);
    let one = |name: &str, label: &str| -> f64 {
        let v: Vec<f64> = metric_samples(&m, name).into_iter().filter(|(l, _)| l.contains(label)).map(|(_, v)| v).collect();
        assert_eq!(v.len(), 1, "{name} with {label:?}:\n{m}");
        v[0]
    };
    let dev0 = "vdevice_index=\"0\"";
    assert_eq!(one("hami_vgpu_memory_used_bytes", dev0) as u64, used, "{m}");
    assert_eq!(one("hami_vgpu_memory_limit_bytes", dev0) as u64, 4 * GIB);
    assert_eq!(one("vgpu_device_sm_limit_percent", dev0), 50.0);
    assert!(dev_util_ok(one("hami_container_device_utilization_ratio", dev0) * 100.0), "{m}");
    assert_eq!(one("vgpu_process_memory_used_bytes", &format!("pid=\"{lp}\"")) as u64, used);
    let elapsed = one("hami_container_last_kernel_elapsed_seconds", dev0);
    assert!(elapsed <= 5.0, "last kernel {elapsed} s ago");
    run.stop();
}

#[test]
#[serial(mock_gpu_timing)]
fn container_utilization_is_not_zeroed_by_an_idle_process() {
    let s = Scratch::new("ctl-util-idle");
    let mut c = hooked("test_alloc_paths", &s, Some("4g"));
    c.args(["--path", "mem_alloc", "--size", "512m", "--hold", "--hold-seconds", "30"]).env("CUDA_DEVICE_SM_LIMIT", "50");
    let mut holder = Bg::spawn(c, "holder");
    holder.wait_line("holding=1", Duration::from_secs(10));
    let run = capped_launcher(&s);
    let util = || smi_json(&s).get("devices").arr()[0].get("utilization_percent").num();
    // Settled first (the container's figure is a rate over a window), then sampled.
    let settled = poll(Duration::from_secs(5), || Some(util()).filter(|u| (35.0..=65.0).contains(u)));
    assert!(settled.is_some(), "container utilization never settled under the 50% cap: {} %", util());
    let seen: Vec<f64> = (0..10)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(150));
            util()
        })
        .collect();
    assert!(seen.iter().all(|u| (35.0..=65.0).contains(u)), "container utilization under a 50% cap, sampled every 150 ms: {seen:?}");
    run.stop();
    holder.stop();
}

#[test]
#[serial(mock_gpu_timing)]
fn process_sm_util_follows_the_cap_and_launch_counts_only_grow() {
    let s = Scratch::new("ctl-util-proc");
    let run = capped_launcher(&s);
    let lp = run.pid();
    let sample = || {
        let j = smi_json(&s);
        let d = &j.get("devices").arr()[0];
        let p = d.get("processes").arr().iter().find(|p| p.get("pid").num() as i32 == lp).unwrap().clone();
        (p.get("sm_util_percent").num(), p.get("launches").num())
    };
    // Settled first (the first figures cover the start-up), then sampled.
    let settled = poll(Duration::from_secs(5), || Some(sample()).filter(|(u, _)| (30.0..=70.0).contains(u)));
    assert!(settled.is_some(), "the process's utilization never settled under the 50% cap: {:?}", sample());
    let seen: Vec<(f64, f64)> = (0..10)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(150));
            sample()
        })
        .collect();
    assert!(
        seen.iter().all(|(u, _)| (30.0..=70.0).contains(u)),
        "(sm_util, launches) of a process capped at 50%, sampled every 150 ms: {seen:?}"
    );
    assert!(
        seen.windows(2).all(|w| w[0].1 > 0.0 && w[1].1 >= w[0].1),
        "launch count of a running process (cumulative) went to 0 or backwards: {seen:?}"
    );
    run.stop();
}

/// Issue 12: the container's utilization is a rate over a recent window: once the last launching
/// process has gone (an idle one stays), every view reads 0 within a few seconds, and stays 0.
#[test]
#[serial(mock_gpu_timing)]
fn utilization_decays_to_zero_when_nothing_launches() {
    let s = Scratch::new("ctl-util-decay");
    let mut c = hooked("test_alloc_paths", &s, Some("4g"));
    c.args(["--path", "mem_alloc", "--size", "512m", "--hold", "--hold-seconds", "60"]).env("CUDA_DEVICE_SM_LIMIT", "50");
    let mut holder = Bg::spawn(c, "holder");
    holder.wait_line("holding=1", Duration::from_secs(10));
    let run = capped_launcher(&s);
    let util = |s: &Scratch| smi_json(s).get("devices").arr()[0].get("utilization_percent").num();
    assert!(poll(Duration::from_secs(5), || (util(&s) > 10.0).then_some(())).is_some(), "no utilization while launching");
    run.stop();
    let t = Instant::now();
    assert!(
        poll(Duration::from_secs(6), || (util(&s) == 0.0).then_some(())).is_some(),
        "utilization {} % {:?} after the last launching process exited",
        util(&s),
        t.elapsed()
    );
    let m = tool(&s, "vgpu-smi", &["--metrics"]);
    let ratio: Vec<f64> = metric_samples(&m, "hami_container_device_utilization_ratio").into_iter().map(|(_, v)| v).collect();
    assert_eq!(ratio, vec![0.0], "{m}");
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(util(&s), 0.0);
    }
    holder.stop();
}
