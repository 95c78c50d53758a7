//! Memory virtualization end to end, written to hold on the mock GPU (default) and on a real one
//! (`VGPU_TEST_PROFILE=real`, see gpu-tests/src/lib.rs and ci/gpu-tests.sh). Only the samples'
//! printed `key=value` lines are used, so nothing here depends on which driver answers.

use gpu_tests::{artifacts, mock_command, Scratch};

mod hook_util;
use hook_util::{run_ok, value};

const MIB: u64 = 1 << 20;
const CAP: u64 = 1 << 30;
/// The most a context may cost (the real H200 primary context measured 518 MiB; the mock 300).
const MAX_CONTEXT: u64 = 640 * MIB;

/// The first device's `k=` value (test_meminfo prints a line per device).
fn key(out: &str, k: &str) -> Option<u64> {
    out.lines().find_map(|l| value(l, k)).and_then(|v| v.parse().ok())
}

fn run(sample: &str, args: &[&str], env: &[(&str, &str)], hooked: bool) -> String {
    let s = Scratch::new("profile");
    let mut c = mock_command(&artifacts().sample(sample), &s, hooked);
    c.args(args).envs(env.iter().copied());
    run_ok(&mut c)
}

#[test]
fn allocation_stops_within_one_step_of_the_cap_minus_the_context() {
    let out = run("test_vram_limit", &["--step", "64m"], &[("CUDA_DEVICE_MEMORY_LIMIT", "1g")], true);
    let got = key(&out, "allocated_bytes").expect("allocated_bytes");
    assert_eq!(key(&out, "meminfo_total"), Some(CAP), "{out}");
    assert!(got <= CAP, "allocated {got} over the 1 GiB cap\n{out}");
    assert!(got + MAX_CONTEXT + 64 * MIB >= CAP, "stopped too early: {got} bytes\n{out}");
}

#[test]
fn memory_info_shows_the_virtual_gpu() {
    let out = run("test_meminfo", &[], &[("CUDA_DEVICE_MEMORY_LIMIT", "1g")], true);
    assert_eq!(key(&out, "meminfo_total"), Some(CAP), "{out}");
    let free = key(&out, "meminfo_free").expect("meminfo_free");
    assert!(free < CAP && free + MAX_CONTEXT >= CAP, "free {free} under a 1 GiB cap\n{out}");
    if let Some(t) = key(&out, "nvml_total") {
        assert_eq!(t, CAP, "NVML total under the hook\n{out}");
    }
}

#[test]
fn the_runtime_lookup_path_is_capped() {
    let out = run("test_procaddr", &[], &[("CUDA_DEVICE_MEMORY_LIMIT", "1g")], true);
    let got = key(&out, "procaddr_allocated_bytes").expect("procaddr_allocated_bytes");
    assert!(got <= CAP && got + MAX_CONTEXT + 64 * MIB >= CAP, "via cuGetProcAddress: {got}\n{out}");
    assert_eq!(key(&out, "meminfo_total"), Some(CAP), "{out}");
}

#[test]
fn disabled_control_is_a_pass_through() {
    let native = run("test_meminfo", &[], &[], false);
    let disabled = run(
        "test_meminfo",
        &[],
        &[("CUDA_DEVICE_MEMORY_LIMIT", "1g"), ("CUDA_DISABLE_CONTROL", "true")],
        true,
    );
    assert_eq!(key(&native, "meminfo_total"), key(&disabled, "meminfo_total"), "{native}\n---\n{disabled}");
}
