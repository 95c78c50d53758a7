//! Several mock GPUs: per-device memory and SM caps, and device remapping. The program's device
//! ordinal (after `CUDA_VISIBLE_DEVICES`, by index or UUID, reordered or subset) is the config and
//! region index; NVML, which numbers devices physically, is mapped by UUID (devices the program
//! cannot see are passed through unchanged).
//!
//! The mock GPU applies `CUDA_VISIBLE_DEVICES` like the real driver (`mock-libcuda/src/visible.rs`)
//! and its NVML shows every physical device. Physical device 0 has 8 GiB and device 1 4 GiB, so
//! an unhooked `cuDeviceTotalMem` tells which physical device an ordinal is.
//!
//! Worker processes are this test binary re-run in a worker mode (env `MD_MODE`), loading the mock
//! driver and NVML with libloading (dlopen + dlsym, hooked under LD_PRELOAD).

mod hook_util;
use hook_util::*;
use serial_test::serial;
use std::ffi::{c_char, c_void, CStr};
use std::process::Command;

const MODE: &str = "MD_MODE";
const STEP: u64 = 64 * MIB;

/// A mock GPU of `count` devices: physical 0 has 8 GiB, 1 has 4 GiB, 2 has 8 GiB.
fn gpus(c: &mut Command, count: u32) -> &mut Command {
    mock_env(c);
    c.env("MOCK_GPU_COUNT", count.to_string()).env("MOCK_GPU_MEM_1", "4g")
}

fn sample(name: &str, s: &Scratch, count: u32, hooked: bool) -> Command {
    let mut c = mock_command(&artifacts().sample(name), s, hooked);
    gpus(&mut c, count);
    c
}

/// This binary re-run as a worker of `mode`.
fn worker(mode: &str, s: &Scratch, count: u32, hooked: bool) -> Command {
    let exe = std::env::current_exe().unwrap();
    let mut c = mock_command(&exe, s, hooked);
    gpus(&mut c, count);
    c.env(MODE, mode);
    c
}

// Worker processes: this binary with the mode variable set runs the worker instead of the tests.
gpu_tests::worker_entry!(MODE, |mode| match mode {
    "alloc" => alloc_worker(),
    "nvml" => nvml_worker(false),
    "nvml-cuda" => nvml_worker(true),
    m => panic!("unknown worker mode {m}"),
});

type Cu = i32;

/// One process, every visible device: allocate `STEP` blocks until OOM on each device in turn,
/// holding everything (so each device's cap is checked while the others are full), then try one
/// more block on every device, then free all.
fn alloc_worker() {
    // SAFETY: the (mock) driver's symbols have the cuda.h signatures.
    unsafe {
        let lib = libloading::Library::new("libcuda.so.1").unwrap();
        let init: libloading::Symbol<unsafe extern "C" fn(u32) -> Cu> = lib.get(b"cuInit").unwrap();
        let count: libloading::Symbol<unsafe extern "C" fn(*mut i32) -> Cu> = lib.get(b"cuDeviceGetCount").unwrap();
        let get: libloading::Symbol<unsafe extern "C" fn(*mut i32, i32) -> Cu> = lib.get(b"cuDeviceGet").unwrap();
        let retain: libloading::Symbol<unsafe extern "C" fn(*mut *mut c_void, i32) -> Cu> =
            lib.get(b"cuDevicePrimaryCtxRetain").unwrap();
        let set: libloading::Symbol<unsafe extern "C" fn(*mut c_void) -> Cu> = lib.get(b"cuCtxSetCurrent").unwrap();
        let alloc: libloading::Symbol<unsafe extern "C" fn(*mut u64, usize) -> Cu> = lib.get(b"cuMemAlloc_v2").unwrap();
        let free: libloading::Symbol<unsafe extern "C" fn(u64) -> Cu> = lib.get(b"cuMemFree_v2").unwrap();
        let info: libloading::Symbol<unsafe extern "C" fn(*mut usize, *mut usize) -> Cu> = lib.get(b"cuMemGetInfo_v2").unwrap();
        let total_mem: libloading::Symbol<unsafe extern "C" fn(*mut usize, i32) -> Cu> = lib.get(b"cuDeviceTotalMem_v2").unwrap();
        assert_eq!(init(0), 0);
        let mut n = 0;
        assert_eq!(count(&mut n), 0);
        let mut ctxs = Vec::new();
        let mut held: Vec<Vec<u64>> = Vec::new();
        for o in 0..n {
            let mut dev = 0;
            assert_eq!(get(&mut dev, o), 0);
            let mut ctx = std::ptr::null_mut();
            assert_eq!(retain(&mut ctx, dev), 0);
            assert_eq!(set(ctx), 0);
            ctxs.push(ctx);
            let mut mine = Vec::new();
            let last = loop {
                let mut p = 0u64;
                let r = alloc(&mut p, STEP as usize);
                if r != 0 {
                    break r;
                }
                mine.push(p);
                assert!(mine.len() < 1024, "device {o}: no OOM after 64 GiB");
            };
            let (mut f, mut t, mut dt) = (0usize, 0usize, 0usize);
            assert_eq!(info(&mut f, &mut t), 0);
            assert_eq!(total_mem(&mut dt, dev), 0);
            println!(
                "dev{o}_allocated={} dev{o}_last={last} dev{o}_meminfo_total={t} dev{o}_meminfo_free={f} dev{o}_total_mem={dt}",
                mine.len() as u64 * STEP
            );
            held.push(mine);
        }
        for (o, ctx) in ctxs.iter().enumerate() {
            assert_eq!(set(*ctx), 0);
            let mut p = 0u64;
            let r = alloc(&mut p, STEP as usize);
            println!("dev{o}_again={r}");
            if r == 0 {
                assert_eq!(free(p), 0);
            }
        }
        for (o, ctx) in ctxs.iter().enumerate() {
            assert_eq!(set(*ctx), 0);
            for p in held[o].drain(..) {
                assert_eq!(free(p), 0);
            }
        }
        println!("devices={n}");
    }
}

/// Every NVML device by (physical) index: `nvml{i}_uuid= nvml{i}_total= nvml{i}_used=`. With
/// `cuda`, the process initializes CUDA and retains every device's primary context first.
fn nvml_worker(cuda: bool) {
    // SAFETY: the (mock) driver and NVML with cuda.h / nvml.h signatures.
    unsafe {
        let _cuda = cuda.then(|| {
            let lib = libloading::Library::new("libcuda.so.1").unwrap();
            let init: libloading::Symbol<unsafe extern "C" fn(u32) -> Cu> = lib.get(b"cuInit").unwrap();
            let count: libloading::Symbol<unsafe extern "C" fn(*mut i32) -> Cu> = lib.get(b"cuDeviceGetCount").unwrap();
            let retain: libloading::Symbol<unsafe extern "C" fn(*mut *mut c_void, i32) -> Cu> =
                lib.get(b"cuDevicePrimaryCtxRetain").unwrap();
            assert_eq!(init(0), 0);
            let mut n = 0;
            assert_eq!(count(&mut n), 0);
            for d in 0..n {
                let mut ctx = std::ptr::null_mut();
                assert_eq!(retain(&mut ctx, d), 0);
            }
            lib
        });
        let lib = libloading::Library::new("libnvidia-ml.so.1").unwrap();
        let init: libloading::Symbol<unsafe extern "C" fn() -> u32> = lib.get(b"nvmlInit_v2").unwrap();
        let count: libloading::Symbol<unsafe extern "C" fn(*mut u32) -> u32> = lib.get(b"nvmlDeviceGetCount_v2").unwrap();
        let by_index: libloading::Symbol<unsafe extern "C" fn(u32, *mut *mut c_void) -> u32> =
            lib.get(b"nvmlDeviceGetHandleByIndex_v2").unwrap();
        let uuid: libloading::Symbol<unsafe extern "C" fn(*mut c_void, *mut c_char, u32) -> u32> =
            lib.get(b"nvmlDeviceGetUUID").unwrap();
        let info: libloading::Symbol<unsafe extern "C" fn(*mut c_void, *mut [u64; 3]) -> u32> =
            lib.get(b"nvmlDeviceGetMemoryInfo").unwrap();
        assert_eq!(init(), 0);
        let mut n = 0u32;
        assert_eq!(count(&mut n), 0);
        for i in 0..n {
            let mut h = std::ptr::null_mut();
            assert_eq!(by_index(i, &mut h), 0);
            let mut buf = [0 as c_char; 96];
            assert_eq!(uuid(h, buf.as_mut_ptr(), buf.len() as u32), 0);
            let u = CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned();
            let mut m = [0u64; 3];
            assert_eq!(info(h, &mut m), 0);
            println!("nvml{i}_uuid={u} nvml{i}_total={} nvml{i}_free={} nvml{i}_used={}", m[0], m[1], m[2]);
        }
        println!("nvml_devices={n}");
    }
}

/// Value of `key=` on test_meminfo's lines for device ordinal `d`.
fn dev_value(out: &str, d: usize, key: &str) -> String {
    let head = format!("device={d} ");
    let pat = format!("{key}=");
    out.lines()
        .filter(|l| l.starts_with(&head))
        .find_map(|l| l.split_whitespace().find_map(|kv| kv.strip_prefix(pat.as_str())))
        .unwrap_or_else(|| panic!("no {key}= for device {d} in:\n{out}"))
        .to_string()
}

fn dev_num(out: &str, d: usize, key: &str) -> u64 {
    dev_value(out, d, key).parse().unwrap_or_else(|_| panic!("{key} of device {d} is not a number:\n{out}"))
}

/// Physical UUIDs (NVML order), from the unhooked NVML worker.
fn physical_uuids(s: &Scratch, count: u32) -> Vec<String> {
    let out = run_ok(&mut worker("nvml", s, count, false));
    (0..count as usize).map(|i| value(&out, &format!("nvml{i}_uuid")).unwrap().to_string()).collect()
}

/// Allocatable bytes in 64 MiB steps under a cap: the cap less the context, in whole steps.
fn allocatable(cap: u64) -> u64 {
    (cap - CTX) / STEP * STEP
}

#[test]
fn per_device_caps_in_one_process() {
    let s = Scratch::new("md-caps");
    let mut c = worker("alloc", &s, 3, true);
    c.env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g").env("CUDA_DEVICE_MEMORY_LIMIT_1", "2g");
    let out = run_ok(&mut c);
    assert_eq!(num(&out, "devices"), 3, "{out}");
    for (d, cap) in [(0, GIB), (1, 2 * GIB)] {
        assert_eq!(num(&out, &format!("dev{d}_allocated")), allocatable(cap), "device {d}:\n{out}");
        assert_eq!(num(&out, &format!("dev{d}_last")), 2, "device {d} stops with OOM:\n{out}");
        assert_eq!(num(&out, &format!("dev{d}_meminfo_total")), cap, "{out}");
        assert_eq!(num(&out, &format!("dev{d}_total_mem")), cap, "{out}");
        assert!(num(&out, &format!("dev{d}_meminfo_free")) < STEP, "{out}");
        assert_eq!(num(&out, &format!("dev{d}_again")), 2, "device {d} still full after the others:\n{out}");
        assert_eq!(region_limit(&s.region(), d), Some(cap));
    }
    // Device 2 has no cap: the physical 8 GiB (less the context) is allocatable.
    assert_eq!(num(&out, "dev2_allocated"), allocatable(8 * GIB), "{out}");
    assert_eq!(num(&out, "dev2_meminfo_total"), 8 * GIB, "{out}");
    assert_eq!(region_limit(&s.region(), 2), None);
}

#[test]
fn mock_honours_visible_devices() {
    let s = Scratch::new("md-mock");
    let uuids = physical_uuids(&s, 3);
    let cases: [(&str, &[usize]); 5] = [
        ("1,0", &[1, 0]),
        ("2", &[2]),
        (&format!("{},{}", uuids[2], &uuids[0][..12]), &[2, 0]),
        ("1,9,0", &[1]),
        ("0,0", &[0]),
    ];
    for (spec, want) in cases {
        let mut c = sample("test_meminfo", &s, 3, false);
        c.env("CUDA_VISIBLE_DEVICES", spec);
        let out = run_ok(&mut c);
        assert_eq!(num(&out, "devices"), want.len() as u64, "CUDA_VISIBLE_DEVICES={spec}:\n{out}");
        for (o, &p) in want.iter().enumerate() {
            assert_eq!(dev_value(&out, o, "uuid"), uuids[p], "CUDA_VISIBLE_DEVICES={spec} ordinal {o}:\n{out}");
            let phys = if p == 1 { 4 * GIB } else { 8 * GIB };
            assert_eq!(dev_num(&out, o, "device_total_mem"), phys, "{out}");
        }
    }
    // Nothing visible: cuInit fails with CUDA_ERROR_NO_DEVICE (100), as on the real driver.
    let mut c = sample("test_meminfo", &s, 3, false);
    c.env("CUDA_VISIBLE_DEVICES", "");
    let out = output(&mut c);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("CUDA_ERROR_NO_DEVICE"), "{out:?}");
}

/// Caps 1 GiB (index 0) and 2 GiB (index 1) under a CUDA_VISIBLE_DEVICES order that puts
/// physical device 1 first: check CUDA's answers, allocation, and NVML per physical device.
fn remapped(tag: &str, spec: impl Fn(&[String]) -> String) {
    let s = Scratch::new(tag);
    let uuids = physical_uuids(&s, 2);
    let vis = spec(&uuids);
    let caps = |c: &mut Command| {
        c.env("CUDA_VISIBLE_DEVICES", &vis)
            .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")
            .env("CUDA_DEVICE_MEMORY_LIMIT_1", "2g");
    };
    let mut c = sample("test_meminfo", &s, 2, true);
    caps(&mut c);
    let out = run_ok(&mut c);
    for (o, phys, cap) in [(0, 1, GIB), (1, 0, 2 * GIB)] {
        assert_eq!(dev_value(&out, o, "uuid"), uuids[phys], "{vis}: ordinal {o}:\n{out}");
        for key in ["meminfo_total", "device_total_mem", "nvml_total", "nvml_v2_total"] {
            assert_eq!(dev_num(&out, o, key), cap, "{vis}: ordinal {o} {key}:\n{out}");
        }
    }
    for (o, cap) in [(0, GIB), (1, 2 * GIB)] {
        let mut c = sample("test_vram_limit", &s, 2, true);
        caps(&mut c);
        c.args(["--device", &o.to_string(), "--step", "64m"]);
        let out = run_ok(&mut c);
        assert_eq!(num(&out, "allocated_bytes"), allocatable(cap), "{vis}: ordinal {o}:\n{out}");
        assert_eq!(num(&out, "meminfo_total"), cap, "{out}");
    }
    // The region records the program's devices in ordinal order.
    let snap = vgpu_core::region::Region::snapshot(s.region()).unwrap();
    assert_eq!(snap.uuid(0), uuids[1]);
    assert_eq!(snap.uuid(1), uuids[0]);
    // NVML by physical index, in a CUDA process and in NVML-only processes (nvidia-smi): physical
    // device 0 is the program's device 1 (2 GiB), physical 1 its device 0 (1 GiB).
    let want = |out: &str, what: &str| {
        assert_eq!(num(out, "nvml_devices"), 2, "{out}");
        assert_eq!(value(out, "nvml0_uuid").unwrap(), uuids[0]);
        assert_eq!(num(out, "nvml0_total"), 2 * GIB, "{what}, {vis}:\n{out}");
        assert_eq!(num(out, "nvml1_total"), GIB, "{what}, {vis}:\n{out}");
    };
    let mut c = worker("nvml-cuda", &s, 2, true);
    caps(&mut c);
    let out = run_ok(&mut c);
    want(&out, "CUDA process");
    assert_eq!(num(&out, "nvml0_used"), CTX, "{out}");
    assert_eq!(num(&out, "nvml1_used"), CTX, "{out}");
    // NVML-only, mapped through the UUIDs in the region (even without CUDA_VISIBLE_DEVICES).
    let mut c = worker("nvml", &s, 2, true);
    caps(&mut c);
    want(&run_ok(&mut c), "NVML-only with region");
    let mut c = worker("nvml", &s, 2, true);
    caps(&mut c);
    c.env_remove("CUDA_VISIBLE_DEVICES");
    want(&run_ok(&mut c), "NVML-only, region, no CUDA_VISIBLE_DEVICES");
    // NVML-only before any CUDA process: mapped through CUDA_VISIBLE_DEVICES itself.
    let fresh = Scratch::new(tag);
    std::fs::copy(s.mock_state(), fresh.mock_state()).unwrap();
    let mut c = worker("nvml", &fresh, 2, true);
    caps(&mut c);
    want(&run_ok(&mut c), "NVML-only, no region");
    assert!(!fresh.region().exists(), "an NVML-only process must not create the region");
}

#[test]
fn visible_devices_reordered_by_index() {
    remapped("md-idx", |_| "1,0".into());
}

#[test]
fn visible_devices_reordered_by_uuid() {
    // A whole UUID and a unique prefix.
    remapped("md-uuid", |u| format!("{},{}", u[1], &u[0][..13]));
}

#[test]
fn hidden_device_is_passed_through() {
    let s = Scratch::new("md-hide");
    let uuids = physical_uuids(&s, 2);
    let caps = |c: &mut Command| {
        c.env("CUDA_VISIBLE_DEVICES", "1").env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g").env("CUDA_DEVICE_MEMORY_LIMIT_1", "2g");
    };
    let mut c = sample("test_meminfo", &s, 2, true);
    caps(&mut c);
    let out = run_ok(&mut c);
    assert_eq!(num(&out, "devices"), 1, "{out}");
    assert_eq!(dev_value(&out, 0, "uuid"), uuids[1]);
    assert_eq!(dev_num(&out, 0, "meminfo_total"), GIB, "cap 0 on physical 1:\n{out}");
    assert_eq!(dev_num(&out, 0, "nvml_total"), GIB, "{out}");
    for mode in ["nvml-cuda", "nvml"] {
        let mut c = worker(mode, &s, 2, true);
        caps(&mut c);
        let out = run_ok(&mut c);
        assert_eq!(num(&out, "nvml_devices"), 2, "NVML keeps every physical device:\n{out}");
        assert_eq!(num(&out, "nvml0_total"), 8 * GIB, "{mode}: physical 0 is not the container's: unchanged:\n{out}");
        assert_eq!(num(&out, "nvml1_total"), GIB, "{mode}:\n{out}");
    }
    // nvidia-smi without CUDA_VISIBLE_DEVICES: the region (physical 1 at index 0) decides; NVML's
    // index 0 is not the container's device 0.
    let mut c = worker("nvml", &s, 2, true);
    caps(&mut c);
    c.env_remove("CUDA_VISIBLE_DEVICES");
    let out = run_ok(&mut c);
    assert_eq!(num(&out, "nvml0_total"), 8 * GIB, "physical 0 unchanged:\n{out}");
    assert_eq!(num(&out, "nvml1_total"), GIB, "{out}");
}

// ---------------------------------------------------------------------------------------------
// SM caps per device

fn rates(out: &str, from: u32) -> f64 {
    let r: Vec<f64> = out
        .lines()
        .filter_map(|l| {
            let sec: u32 = value(l, "second")?.parse().ok()?;
            let rate: f64 = value(l, "kernels_per_sec")?.parse().ok()?;
            (sec > from).then_some(rate)
        })
        .collect();
    assert!(!r.is_empty(), "no per-second rates in:\n{out}");
    r.iter().sum::<f64>() / r.len() as f64
}

fn launch(s: &Scratch, dev: u32, seconds: u32) -> Command {
    let mut c = sample("test_runtime_launch", s, 2, true);
    c.args(["--us", "2000", "--seconds", &seconds.to_string(), "--sync-every", "1", "--device", &dev.to_string()]);
    c
}

fn finish(child: std::process::Child) -> String {
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{}:\n{text}\nstderr:\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    text
}

#[test]
#[serial(mock_gpu_timing)]
fn per_device_sm_caps_at_once() {
    let base_s = Scratch::new("md-sm-base");
    let before = rates(&run_ok(&mut launch(&base_s, 1, 3)), 0);
    // CUDA_VISIBLE_DEVICES=1,0: ordinal 0 (cap 75) is physical 1, ordinal 1 (cap 25) physical 0;
    // both run at the same time from two processes sharing the region.
    let s = Scratch::new("md-sm");
    let capped = |dev: u32| {
        let mut c = launch(&s, dev, 5);
        c.env("CUDA_VISIBLE_DEVICES", "1,0").env("CUDA_DEVICE_SM_LIMIT_0", "75").env("CUDA_DEVICE_SM_LIMIT_1", "25");
        spawn(&mut c)
    };
    let (a, b) = (capped(0), capped(1));
    let (out0, out1) = (finish(a), finish(b));
    // The uncapped rate again: load from this file's other tests (they start together) only
    // lowers a rate, and a lowered baseline once read 413/s and a cap of 75 as 90%.
    let base = before.max(rates(&run_ok(&mut launch(&base_s, 1, 3)), 0));
    let (share0, share1) = (100.0 * rates(&out0, 1) / base, 100.0 * rates(&out1, 1) / base);
    eprintln!("baseline {base:.0}/s: device 0 (cap 75) {share0:.1}%, device 1 (cap 25) {share1:.1}%");
    assert!((60.0..=90.0).contains(&share0), "device 0 under cap 75 ran at {share0:.1}%:\n{out0}");
    assert!((15.0..=37.0).contains(&share1), "device 1 under cap 25 ran at {share1:.1}%:\n{out1}");
    assert!(share0 > 2.0 * share1, "{share0:.1}% vs {share1:.1}%");
    let snap = vgpu_core::region::Region::snapshot(s.region()).unwrap();
    assert_eq!((snap.sm_limit(0), snap.sm_limit(1)), (Some(75), Some(25)));
}
