//! Which NVML calls the hook's monitor makes, and how often (issue 10's overheads). Some NVML
//! calls stall the program's driver calls: each `nvmlDeviceGetSamples` held the next 1-MiB
//! cuMemAlloc+cuMemFree of a process past 1 ms, about every time (H200, session 27). Read from
//! the mock NVML's call trace (`MOCK_NVML_TRACE`); on a real GPU there is no trace to read, and
//! the tests say so and pass.

mod common;
mod hook_util;

use std::time::Duration;

use common::{Bg, Scratch};
use gpu_tests::real_gpu;
use hook_util::hooked;

/// Runs `c` with the trace on and returns the NVML calls it made, one name each.
fn traced_calls(s: &Scratch, mut c: std::process::Command, name: &str) -> Vec<String> {
    let trace = s.dir.join("nvml.trace");
    c.env("MOCK_NVML_TRACE", &trace);
    Bg::spawn(c, name).finish(Duration::from_secs(30));
    let text = std::fs::read_to_string(&trace).unwrap_or_default();
    text.lines().filter_map(|l| l.split_whitespace().nth(1)).map(str::to_string).collect()
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
    let count = |name: &str| calls.iter().filter(|c| *c == name).count();
    let (samples, readings) = (count("nvmlDeviceGetSamples"), count("nvmlDeviceGetUtilizationRates"));
    eprintln!("in about 4.5 s: {samples} sample fetches, {readings} utilization readings");
    // The monitor still looks at the device every publishing tick (200 ms) ...
    assert!(readings >= 12, "the monitor read the device's utilization {readings} times (is the trace working?): {calls:?}");
    // ... and fetches the samples the calibration needs once a second.
    assert!((2..=7).contains(&samples), "{samples} nvmlDeviceGetSamples in a 4-s capped run (want about one a second)");
}
