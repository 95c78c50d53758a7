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

/// A cap set at run time above the device (`shrreg-tool --set-mem-limit 0 100t`, no
/// oversubscription) shows the device in NVML, as the same value in the environment would; one
/// set below it shows the cap. On a real GPU NVML's total is not cuMemGetInfo's, so the device
/// is what NVML says without the hook.
#[test]
fn a_cap_set_at_run_time_shows_in_nvml_within_the_device() {
    let s = Scratch::new("profile-runtime-cap");
    let meminfo = |hooked: bool| {
        let mut c = mock_command(&artifacts().sample("test_meminfo"), &s, hooked);
        c.env("CUDA_DEVICE_MEMORY_LIMIT", "1g");
        run_ok(&mut c)
    };
    let set = |v: &str| {
        let mut c = mock_command(&artifacts().tool("shrreg-tool"), &s, false);
        run_ok(c.args(["--set-mem-limit", "0", v]))
    };
    let native = meminfo(false);
    let Some(device) = key(&native, "nvml_total") else {
        eprintln!("SKIP a_cap_set_at_run_time_shows_in_nvml_within_the_device: NVML does not load here\n{native}");
        return;
    };
    assert_eq!(key(&meminfo(true), "nvml_total"), Some(CAP), "the environment's 1 GiB cap");
    set("100t");
    let out = meminfo(true);
    for k in ["nvml_total", "nvml_v2_total"] {
        assert_eq!(key(&out, k), key(&native, k), "{k} under a 100 TiB cap set at run time\n{out}\n---native\n{native}");
    }
    assert!(key(&out, "nvml_free").expect("nvml_free") <= device, "{out}");
    set("2g");
    let out = meminfo(true);
    assert_eq!(key(&out, "nvml_total"), Some(2 * CAP), "a 2 GiB cap set at run time\n{out}");
}
