//! Which NVML calls the hook's monitor makes, and how often (issue 10's overheads). Some NVML
//! calls stall the program's driver calls: each `nvmlDeviceGetSamples` and each
//! `nvmlDeviceGetProcessUtilization` held the next 1-MiB cuMemAlloc+cuMemFree of a process past
//! 1 ms, about every time (H200, session 27). So a process with nothing of its own running never
//! asks for its utilization, and one that launches still does. Read from
//! the mock NVML's call trace (`MOCK_NVML_TRACE`); on a real GPU there is no trace to read, and
//! the tests say so and pass.

mod common;
mod hook_util;

use std::time::Duration;

use common::{Bg, Scratch};
use gpu_tests::real_gpu;
use hook_util::hooked;

const PROC_UTIL: &str = "nvmlDeviceGetProcessUtilization";

/// Runs `c` with the trace on and returns the NVML calls it made: name, and when (ms).
fn traced_calls(s: &Scratch, mut c: std::process::Command, name: &str) -> Vec<(String, u64)> {
    let trace = s.dir.join("nvml.trace");
    c.env("MOCK_NVML_TRACE", &trace);
    Bg::spawn(c, name).finish(Duration::from_secs(30));
    let text = std::fs::read_to_string(&trace).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace().skip(1);
            Some((f.next()?.to_string(), f.next()?.parse().ok()?))
        })
        .collect()
}

fn skip_on_real_gpu(test: &str) -> bool {
    if real_gpu() {
        eprintln!("SKIPPED {test}: MOCK_NVML_TRACE exists only in the mock NVML; on a GPU see bench/py/nvml_poll_cost.py stalls");
    }
    real_gpu()
}

#[test]
fn a_capped_process_fetches_nvml_samples_once_a_second() {
    if skip_on_real_gpu("a_capped_process_fetches_nvml_samples_once_a_second") {
        return;
    }
    let s = Scratch::new("nvml-samples");
    let mut c = hooked("test_runtime_launch", &s, None);
    c.env("CUDA_DEVICE_SM_LIMIT", "50").args(["--us", "1000", "--seconds", "4", "--sync-every", "1"]);
    let calls = traced_calls(&s, c, "test_runtime_launch");
    // The last 1.8 s of the run: the calibration settled on its cap by then (it fetches every
    // tick while it settles: from its first span for a second, about 0.5-1.9 s on the mock).
    let end = calls.iter().map(|c| c.1).max().unwrap_or(0);
    let count = |name: &str| calls.iter().filter(|c| c.0 == name && c.1 + 1800 > end).count();
    let (samples, readings) = (count("nvmlDeviceGetSamples"), count("nvmlDeviceGetUtilizationRates"));
    eprintln!("in the last 1.8 s: {samples} sample fetches, {readings} utilization readings");
    // The monitor still looks at the device every publishing tick (200 ms) ...
    assert!(readings >= 7, "the monitor read the device's utilization {readings} times in 1.8 s (is the trace working?): {calls:?}");
    // ... and fetches the samples the calibration needs once a second.
    assert!((1..=3).contains(&samples), "{samples} nvmlDeviceGetSamples in 1.8 s of a capped run (want about one a second)");
}

#[test]
fn a_process_that_only_allocates_never_asks_nvml_for_its_utilization() {
    if skip_on_real_gpu("a_process_that_only_allocates_never_asks_nvml_for_its_utilization") {
        return;
    }
    let s = Scratch::new("nvml-alloc-only");
    // No SM cap (the monitor asks NVML once a second there), memory capped, held 3.5 s: three
    // or more of the monitor's NVML looks.
    let mut c = hooked("test_alloc_paths", &s, Some("4g"));
    c.args(["--path", "mem_alloc", "--size", "64m", "--hold", "--hold-seconds", "4"]);
    let calls = traced_calls(&s, c, "test_alloc_paths");
    assert!(
        calls.iter().any(|c| c.0 == "nvmlDeviceGetUtilizationRates"),
        "the monitor never looked at the device (is the trace working?): {calls:?}"
    );
    let asked = calls.iter().filter(|c| c.0 == PROC_UTIL).count();
    assert_eq!(asked, 0, "a process that launched nothing asked NVML for its utilization {asked} times");
}

#[test]
fn a_process_that_launches_still_asks_nvml_for_its_utilization() {
    if skip_on_real_gpu("a_process_that_launches_still_asks_nvml_for_its_utilization") {
        return;
    }
    let s = Scratch::new("nvml-launching");
    let mut c = hooked("test_runtime_launch", &s, None);
    c.args(["--us", "1000", "--seconds", "4", "--sync-every", "1"]);
    let calls = traced_calls(&s, c, "test_runtime_launch");
    let asked = calls.iter().filter(|c| c.0 == PROC_UTIL).count();
    assert!(asked >= 2, "a process launching for 4 s asked NVML for its utilization {asked} times (want one a second): {calls:?}");
}
