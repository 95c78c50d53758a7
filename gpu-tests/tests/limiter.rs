//! Compute limiter end to end on the mock GPU: the C samples under LD_PRELOAD=libvgpu.so, the
//! mock's shared timeline standing in for the GPU. Tolerances are wide enough for a loaded
//! 2-core CI machine; the precise matrix is checked by the limiter's simulation unit tests and,
//! on real GPUs, by `ci/gpu-suite.sh`.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpu_tests::{artifacts, mock_command, Scratch};
use serial_test::serial;

/// Per-second kernel rates printed by test_runtime_launch / test_graph (`second=K kernels_per_sec=X`).
fn per_second_rates(out: &str) -> Vec<(u32, f64)> {
    out.lines()
        .filter_map(|l| {
            let mut sec = None;
            let mut rate = None;
            for kv in l.split_whitespace() {
                if let Some(v) = kv.strip_prefix("second=") {
                    sec = v.parse().ok();
                }
                if let Some(v) = kv.strip_prefix("kernels_per_sec=") {
                    rate = v.parse().ok();
                }
            }
            Some((sec?, rate?))
        })
        .collect()
}

/// Mean kernels/s over seconds `from..` of a finished run's output.
fn mean_rate(out: &str, from: u32) -> f64 {
    let r: Vec<f64> = per_second_rates(out).into_iter().filter(|(s, _)| *s > from).map(|(_, r)| r).collect();
    assert!(!r.is_empty(), "no per-second rates after second {from} in:\n{out}");
    r.iter().sum::<f64>() / r.len() as f64
}

fn launch_cmd(s: &Scratch, us: u32, seconds: u32, sync_every: u32, cap: Option<u32>) -> Command {
    let a = artifacts();
    let mut c = mock_command(&a.sample("test_runtime_launch"), s, true);
    c.args(["--us", &us.to_string(), "--seconds", &seconds.to_string(), "--sync-every", &sync_every.to_string()]);
    if let Some(cap) = cap {
        c.env("CUDA_DEVICE_SM_LIMIT", cap.to_string());
    }
    c
}

fn run_ok(mut c: Command) -> String {
    let out = c.output().expect("spawn sample");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "sample failed: {}\nstdout:\n{text}\nstderr:\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    text
}

fn spawn(mut c: Command) -> Child {
    c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn sample")
}

fn finish(child: Child) -> String {
    let out = child.wait_with_output().expect("wait sample");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "sample failed: {}\nstdout:\n{text}\nstderr:\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    text
}

/// The uncapped rate of a kernel length, measured with the hook loaded and no cap.
fn baseline(us: u32, sync_every: u32) -> f64 {
    let s = Scratch::new("lim-base");
    mean_rate(&run_ok(launch_cmd(&s, us, 4, sync_every, None)), 1)
}

#[test]
#[serial(mock_gpu_timing)]
fn cap_delivers_its_share_sync_each_and_async() {
    for (us, sync_every) in [(2000u32, 1u32), (500, 100)] {
        let base = baseline(us, sync_every);
        for cap in [25u32, 60] {
            let s = Scratch::new("lim-cap");
            let got = mean_rate(&run_ok(launch_cmd(&s, us, 5, sync_every, Some(cap))), 2);
            let share = 100.0 * got / base;
            assert!(
                (share - cap as f64).abs() <= 10.0,
                "{us} us kernels, sync every {sync_every}: cap {cap}% delivered {share:.1}% ({got:.0}/s of {base:.0}/s)"
            );
        }
    }
}

#[test]
#[serial(mock_gpu_timing)]
fn processes_of_one_container_share_one_cap() {
    let base = baseline(2000, 1);
    let s = Scratch::new("lim-two");
    let a = spawn(launch_cmd(&s, 2000, 5, 1, Some(40)));
    let b = spawn(launch_cmd(&s, 2000, 5, 1, Some(40)));
    let total = mean_rate(&finish(a), 2) + mean_rate(&finish(b), 2);
    let share = 100.0 * total / base;
    assert!((share - 40.0).abs() <= 10.0, "two processes under one 40% cap got {share:.1}% together");
}

#[test]
#[serial(mock_gpu_timing)]
fn graph_launches_obey_the_cap() {
    let a = artifacts();
    let run = |cap: Option<u32>| {
        let s = Scratch::new("lim-graph");
        let mut c = mock_command(&a.sample("test_graph"), &s, true);
        c.args(["--kernels", "20", "--us", "200", "--seconds", "5"]);
        if let Some(cap) = cap {
            c.env("CUDA_DEVICE_SM_LIMIT", cap.to_string());
        }
        mean_rate(&run_ok(c), 2)
    };
    let base = run(None);
    let got = run(Some(30));
    let share = 100.0 * got / base;
    assert!((share - 30.0).abs() <= 10.0, "graphs under a 30% cap ran at {share:.1}%");
}

#[test]
#[serial(mock_gpu_timing)]
fn cap_changes_at_run_time_take_effect_within_two_seconds() {
    let a = artifacts();
    let base = baseline(2000, 1);
    let s = Scratch::new("lim-runtime");
    let child = spawn(launch_cmd(&s, 2000, 9, 1, Some(80)));
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_millis(3000));
    let set = mock_command(&a.tool("shrreg-tool"), &s, false).args(["--set-sm-limit", "0", "20"]).output().unwrap();
    assert!(set.status.success(), "shrreg-tool failed: {}", String::from_utf8_lossy(&set.stderr));
    let changed_at = t0.elapsed().as_secs_f64();
    let out = finish(child);
    let rates = per_second_rates(&out);
    let before: Vec<f64> = rates.iter().filter(|(s, _)| (2..=3).contains(s)).map(|r| r.1).collect();
    // Seconds that start at least 2 s after the change.
    let after: Vec<f64> = rates.iter().filter(|(s, _)| (*s as f64 - 1.0) >= changed_at + 2.0).map(|r| r.1).collect();
    assert!(!before.is_empty() && !after.is_empty(), "not enough samples:\n{out}");
    let share_before = 100.0 * before.iter().sum::<f64>() / before.len() as f64 / base;
    let share_after = 100.0 * after.iter().sum::<f64>() / after.len() as f64 / base;
    assert!((share_before - 80.0).abs() <= 12.0, "before the change: {share_before:.1}%\n{out}");
    assert!((share_after - 20.0).abs() <= 10.0, "after --set-sm-limit 0 20: {share_after:.1}%\n{out}");
}

#[test]
#[serial(mock_gpu_timing)]
fn suspend_pauses_and_resume_continues() {
    let a = artifacts();
    let s = Scratch::new("lim-suspend");
    let child = spawn(launch_cmd(&s, 1000, 7, 1, None));
    std::thread::sleep(Duration::from_millis(2000));
    let tool = |arg: &str| {
        let o = mock_command(&a.tool("shrreg-tool"), &s, false).arg(arg).output().unwrap();
        assert!(o.status.success(), "shrreg-tool {arg}: {}", String::from_utf8_lossy(&o.stderr));
    };
    tool("--suspend");
    std::thread::sleep(Duration::from_millis(2500));
    tool("--resume");
    let out = finish(child);
    let rates = per_second_rates(&out);
    // Some full second inside the suspension shows (almost) no launches, and launches resume.
    let min = rates.iter().map(|r| r.1).fold(f64::MAX, f64::min);
    let last = rates.last().map(|r| r.1).unwrap_or(0.0);
    let max = rates.iter().map(|r| r.1).fold(0.0, f64::max);
    assert!(min < 0.1 * max, "no paused second while suspended:\n{out}");
    assert!(last > 0.5 * max, "launches did not resume after --resume:\n{out}");
}
