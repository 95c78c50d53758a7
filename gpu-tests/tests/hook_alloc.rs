//! Memory caps on every allocation path, under LD_PRELOAD=libvgpu.so against the mock driver.

mod hook_util;
use hook_util::*;

/// Each allocation API stops at the cap minus the context charge (256 MiB here), to the step.
#[test]
fn every_allocation_api_stops_at_the_cap() {
    for api in ["driver", "pitch", "managed", "vmm", "async"] {
        let s = Scratch::new("hk-api");
        let out = run_ok(hooked("test_vram_limit", &s, Some("1g")).args(["--api", api, "--step", "64m"]));
        let got = num(&out, "allocated_bytes");
        assert_eq!(value(&out, "stop_reason"), Some("oom"), "{api}: {out}");
        assert!(got <= GIB - CTX, "{api}: allocated {got} over cap-minus-context\n{out}");
        assert!(got >= GIB - CTX - 64 * MIB, "{api}: allocated only {got}\n{out}");
        assert_eq!(num(&out, "meminfo_total"), GIB, "{api}: cuMemGetInfo total is the cap\n{out}");
    }
}

/// One allocation larger than the cap is refused with CUDA_ERROR_OUT_OF_MEMORY; the program goes
/// on (frees, exits 0) and the refusal is logged at info level only.
#[test]
fn single_over_cap_allocation_is_oom_and_program_continues() {
    let s = Scratch::new("hk-over");
    let mut c = hooked("test_vram_limit", &s, Some("1g"));
    c.args(["--step", "2g"]).env("LIBCUDA_LOG_LEVEL", "3");
    let out = output(&mut c);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert_eq!(num(&text, "allocations"), 0, "{text}");
    assert_eq!(value(&text, "last_result"), Some("CUDA_ERROR_OUT_OF_MEMORY"), "{text}");
    let refusals = lines_with(&out.stderr, "refused");
    assert_eq!(refusals.len(), 1, "one info line per refusal: {refusals:?}");
    assert!(refusals[0].contains("INFO"), "{refusals:?}");
}

/// Every path allocates and frees through the hook and the region ledger returns to the context
/// charge only (nothing leaks, nothing is released twice).
#[test]
fn all_paths_alloc_and_free_balance() {
    let s = Scratch::new("hk-paths");
    let out = run_ok(hooked("test_alloc_paths", &s, Some("2g")).args(["--size", "64m"]));
    assert_eq!(value(&out, "result"), Some("PASS"), "{out}");
    assert_eq!(num(&out, "failed"), 0, "{out}");
}

/// Holding one allocation of each path: the region shows exactly context + size (2 MiB rounded).
#[test]
fn each_path_is_charged_in_the_region_while_held() {
    for path in ["mem_alloc", "mem_alloc_pitch", "mem_alloc_managed", "array", "array3d", "mipmapped_array",
        "mem_alloc_async", "mem_alloc_from_pool", "vmm"]
    {
        let s = Scratch::new("hk-hold");
        let mut c = hooked("test_alloc_paths", &s, Some("2g"));
        c.args(["--size", "64m", "--path", path, "--hold"]);
        while_holding(&mut c, || {
            let used = region_used(&s.region(), 0);
            // mipmapped arrays of the sample are a full chain: up to 4/3 of the base level
            let hi = if path == "mipmapped_array" { CTX + 64 * MIB * 4 / 3 + 2 * MIB } else { CTX + 64 * MIB };
            assert!(used >= CTX + 64 * MIB && used <= hi, "{path}: region used {used}");
        });
    }
}

/// CUDA_DISABLE_CONTROL=true: exact pass-through, the cap does not apply.
#[test]
fn disable_control_passes_through() {
    let s = Scratch::new("hk-disable");
    let mut c = hooked("test_vram_limit", &s, Some("1g"));
    c.args(["--step", "256m", "--max", "3g"]).env("CUDA_DISABLE_CONTROL", "true");
    let out = run_ok(&mut c);
    assert_eq!(value(&out, "stop_reason"), Some("max"), "{out}");
    assert_eq!(num(&out, "meminfo_total"), 8 * GIB, "{out}");
    assert!(!s.region().exists() || region_used(&s.region(), 0) == 0);
}

/// With no cap configured the hook changes nothing the program can see.
#[test]
fn uncapped_is_transparent() {
    let s = Scratch::new("hk-nocap");
    let out = run_ok(hooked("test_vram_limit", &s, None).args(["--step", "1g"]));
    assert_eq!(num(&out, "meminfo_total"), 8 * GIB, "{out}");
    // 8 GiB minus the mock's 256 MiB context: 7 whole GiB
    assert_eq!(num(&out, "allocations"), 7, "{out}");
}

/// Oversubscription: the cap may exceed physical memory (the region keeps 12 GiB on an 8 GiB
/// device), while cuMemGetInfo still reports at most the physical total.
#[test]
fn oversubscription_keeps_cap_above_physical() {
    let s = Scratch::new("hk-oversub");
    let mut c = hooked("test_alloc_paths", &s, Some("12g"));
    c.args(["--size", "64m", "--path", "mem_alloc", "--hold"]).env("CUDA_OVERSUBSCRIBE", "true");
    while_holding(&mut c, || assert_eq!(region_limit(&s.region(), 0), Some(12 * GIB)));
}

/// Oversubscription: allocations past physical memory are served from managed memory and still
/// counted, up to the cap (the mock's managed memory exceeds the device like unified memory).
#[test]
fn oversubscription_serves_past_physical_from_managed() {
    let s = Scratch::new("hk-oversub2");
    let mut c = hooked("test_vram_limit", &s, Some("12g"));
    c.args(["--step", "1g"]).env("CUDA_OVERSUBSCRIBE", "true");
    let out = run_ok(&mut c);
    let got = num(&out, "allocated_bytes");
    assert!(got > 8 * GIB, "oversubscribed allocations stopped at {got}\n{out}");
    assert!(got <= 12 * GIB - CTX, "{got}\n{out}");
}

/// test_alloc's sizes (2^k-1, 2^k, 2^k+1) all allocate and free through the hook under a cap.
#[test]
fn alloc_paths_test_alloc_sizes() {
    let s = Scratch::new("hk-sizes");
    let out = run_ok(hooked("test_alloc", &s, Some("4g")).args(["--max-k", "28", "--no-big"]));
    assert_eq!(value(&out, "result"), Some("PASS"), "{out}");
}

/// A process whose first context does not fit under a cap the container already filled gets
/// CUDA_ERROR_OUT_OF_MEMORY (as from a full GPU), and the container never goes over the cap.
#[test]
fn a_context_that_does_not_fit_under_the_cap_is_refused() {
    let s = Scratch::new("hk-ctx-full");
    let mut holder = hooked("test_alloc_paths", &s, Some("1g"));
    holder.args(["--size", "640m", "--path", "mem_alloc", "--hold"]);
    while_holding(&mut holder, || {
        let before = region_used(&s.region(), 0);
        assert!(before <= GIB && before + CTX > GIB, "holder uses {before}");
        let late = output(&mut hooked("test_meminfo", &s, Some("1g")));
        let text = format!("{}{}", String::from_utf8_lossy(&late.stdout), String::from_utf8_lossy(&late.stderr));
        assert!(!late.status.success() && text.contains("CUDA_ERROR_OUT_OF_MEMORY"), "late process:\n{text}");
        assert_eq!(region_used(&s.region(), 0), before, "the refused context left a charge");
    });
}
