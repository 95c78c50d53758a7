//! Every way a program reaches the driver goes through the hook: direct linking, dlopen+dlsym,
//! cuGetProcAddress (the CUDA runtime's path), dlsym(RTLD_NEXT) from a wrapping program; and the
//! dlsym override leaves everything else alone.

mod hook_util;
use hook_util::*;

/// The CUDA runtime's path: dlopen + dlsym("cuGetProcAddress_v2"), then every function by base
/// name for two CUDA versions; the pointers handed out are the hooks, so the cap holds.
#[test]
fn cu_get_proc_address_path_is_capped() {
    for ver in ["12000", "13000"] {
        let s = Scratch::new("hk-procaddr");
        let out = run_ok(hooked("test_procaddr", &s, Some("1g")).args(["--cuda-version", ver, "--step", "64m"]));
        assert_eq!(value(&out, "result"), Some("PASS"), "{out}");
        let got = num(&out, "procaddr_allocated_bytes");
        assert_eq!(got, GIB - CTX, "{ver}: {out}");
        assert_eq!(num(&out, "meminfo_total"), GIB, "{out}");
        assert_eq!(num(&out, "device_total_mem"), GIB, "{out}");
        assert!(out.contains("launch_default=CUDA_SUCCESS") && out.contains("launch_ptds=CUDA_SUCCESS"), "{out}");
        for l in out.lines().filter(|l| l.starts_with("lookup ") && l.contains("found=1")) {
            assert!(l.contains("same_as_dlsym=1"), "cuGetProcAddress and dlsym disagree: {l}");
        }
    }
}

/// A program that wraps cuMemAlloc_v2 itself and forwards with dlsym(RTLD_NEXT): RTLD_NEXT stays
/// relative to the program, reaches the hook, and the cap holds.
#[test]
fn rtld_next_from_a_wrapping_program() {
    let s = Scratch::new("hk-rtld");
    let out = run_ok(hooked("test_rtld_next", &s, Some("1g")).args(["--step", "64m"]));
    assert_eq!(value(&out, "result"), Some("PASS"), "{out}");
    assert_eq!(num(&out, "rtld_next_allocated_bytes"), GIB - CTX, "{out}");
}

/// Programs that never touch CUDA run unchanged under the preload (shell, a Rust program that
/// spawns threads: std's own weak-symbol dlsym lookups go through our override), and print
/// nothing from the hook (init is lazy: no constructor work).
#[test]
fn non_cuda_programs_are_untouched() {
    let s = Scratch::new("hk-noncuda");
    let a = artifacts();
    for prog in ["/bin/sh", "/bin/ls"] {
        if !std::path::Path::new(prog).exists() {
            continue;
        }
        let mut c = mock_command(std::path::Path::new(prog), &s, true);
        if prog == "/bin/sh" {
            c.args(["-c", "echo ok"]);
        } else {
            c.arg("/");
        }
        c.env("LIBCUDA_LOG_LEVEL", "4");
        let out = output(&mut c);
        assert!(out.status.success(), "{prog}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(lines_with(&out.stderr, "libvgpu").is_empty(), "{prog}: {}", String::from_utf8_lossy(&out.stderr));
    }
    // A Rust program (the shrreg tool) spawning threads and using std under the preload.
    let mut c = mock_command(&a.tool("shrreg-tool"), &s, true);
    c.arg("--help");
    let out = output(&mut c);
    assert!(lines_with(&out.stderr, "libvgpu").is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.code().is_none_or(|c| c <= 2), "shrreg-tool crashed: {:?}", out.status);
}

/// The hook exports dlsym and every symbol of its table; nothing runs from .init_array but the
/// runtime's own argv capture and crt's frame_dummy.
#[test]
fn library_exports() {
    let a = artifacts();
    let out = std::process::Command::new("nm").args(["-D", "--defined-only"]).arg(&a.libvgpu).output().expect("nm");
    let text = String::from_utf8_lossy(&out.stdout);
    let names: Vec<&str> = text.lines().filter_map(|l| l.split_whitespace().nth(2)).collect();
    for want in ["dlsym", "cuGetProcAddress", "cuGetProcAddress_v2", "cuMemAlloc_v2", "cuMemFree_v2", "cuMemCreate",
        "cuLaunchKernel", "cuLaunchKernel_ptsz", "cuGraphLaunch", "cuMemGetInfo_v2", "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetMemoryInfo_v2", "cuCtxCreate_v4", "cuDevicePrimaryCtxRetain", "ioctl"]
    {
        assert!(names.contains(&want), "{want} not exported");
    }
    assert!(!names.contains(&"cuGetExportTable"), "cuGetExportTable must pass straight through");
}

/// The `ioctl` override (it watches the resource manager's channel-group calls, issue 14) is the
/// one programs get, and gives every call exactly what glibc's system call gives: return value,
/// errno and output, for ordinary requests and for ones shaped like the resource manager's on a
/// file that is not the driver's.
#[test]
fn ioctl_passes_everything_through_unchanged() {
    let s = Scratch::new("hk-ioctl");
    let out = run_ok(&mut hooked("test_ioctl", &s, None));
    assert_eq!(value(&out, "result"), Some("PASS"), "{out}");
    assert!(value(&out, "ioctl_from").is_some_and(|p| p.contains("libvgpu")), "the program's ioctl is not the hook's: {out}");
    assert_eq!(out.lines().filter(|l| l.starts_with("case ")).count(), 6, "{out}");
}
