//! Bad configuration: every malformed value gives exactly one clear line naming the variable, and
//! the hook fails closed (a malformed memory limit caps the device at 0, never uncapped).

mod hook_util;
use hook_util::*;

/// Run test_vram_limit (64 MiB steps, at most 1 GiB) with `vars`; returns (stdout, stderr).
fn run_with(vars: &[(&str, &str)]) -> (String, String) {
    let s = Scratch::new("hk-cfg");
    let mut c = hooked("test_vram_limit", &s, None);
    c.args(["--step", "64m", "--max", "1g"]);
    for (k, v) in vars {
        c.env(k, v);
    }
    let out = output(&mut c);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{vars:?}: {}\n{stdout}\n{stderr}", out.status);
    (stdout, stderr)
}

fn one_line_naming(stderr: &str, var: &str) {
    let hits: Vec<&str> = stderr.lines().filter(|l| l.contains(var)).collect();
    assert_eq!(hits.len(), 1, "expected one line naming {var}, got:\n{stderr}");
    assert!(hits[0].contains("libvgpu"), "{hits:?}");
}

#[test]
fn malformed_memory_limits_block_the_device() {
    for (var, val) in [
        ("CUDA_DEVICE_MEMORY_LIMIT", "2GBx"),
        ("CUDA_DEVICE_MEMORY_LIMIT_0", "lots"),
        ("CUDA_MEM_LIMIT", "1.5.5g"),
        ("CUDA_MEM_LIMIT_0", "-1g"),
        ("CUDA_DEVICE_MEMORY_LIMIT", ""),
    ] {
        let (out, err) = run_with(&[(var, val)]);
        one_line_naming(&err, var);
        assert_eq!(num(&out, "allocations"), 0, "{var}={val:?} must cap the device at 0:\n{out}");
        assert_eq!(value(&out, "stop_reason"), Some("oom"), "{out}");
    }
}

#[test]
fn malformed_other_values_one_line_each() {
    for (var, val) in [
        ("CUDA_DEVICE_SM_LIMIT", "half"),
        ("CUDA_DEVICE_SM_LIMIT_0", "250"),
        ("CUDA_OVERSUBSCRIBE", "maybe"),
        ("GPU_CORE_UTILIZATION_POLICY", "sometimes"),
        ("CUDA_TASK_PRIORITY", "high"),
        ("LIBCUDA_LOG_LEVEL", "loud"),
        ("VGPU_CONTEXT_RESERVE", "zz"),
    ] {
        let (out, err) = run_with(&[(var, val), ("CUDA_DEVICE_MEMORY_LIMIT", "512m")]);
        one_line_naming(&err, var);
        // the valid cap still applies: 512 MiB minus the context
        assert!(num(&out, "allocated_bytes") <= 512 * MIB - CTX + 2 * MIB, "{var}: {out}");
    }
}

/// A malformed CUDA_DISABLE_CONTROL leaves control on (fail closed).
#[test]
fn malformed_disable_control_keeps_control() {
    let (out, err) = run_with(&[("CUDA_DISABLE_CONTROL", "perhaps"), ("CUDA_DEVICE_MEMORY_LIMIT", "512m")]);
    one_line_naming(&err, "CUDA_DISABLE_CONTROL");
    assert_eq!(num(&out, "allocated_bytes"), 512 * MIB - CTX, "{out}");
}

/// An unusable region path: one error line, a private region, the cap still enforced.
#[test]
fn unusable_region_falls_back_to_private_and_still_caps() {
    let (out, err) = run_with(&[
        ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/proc/no-such-dir/cudevshr.cache"),
        ("CUDA_DEVICE_MEMORY_LIMIT", "512m"),
    ]);
    let lines: Vec<&str> = err.lines().filter(|l| l.contains("private region")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert_eq!(lines[0].matches("/proc/no-such-dir/cudevshr.cache").count(), 1, "the path once: {}", lines[0]);
    assert_eq!(num(&out, "allocated_bytes"), 512 * MIB - CTX, "{out}");
}

/// `test_vram_limit` under a 512 MiB cap exits 0, reaches exactly the cap, and printed one line
/// containing `needle`.
fn vram_limit_capped_with_one_line(s: &Scratch, needle: &str) {
    let mut c = hooked("test_vram_limit", s, Some("512m"));
    c.args(["--step", "64m"]);
    let out = output(&mut c);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(stderr.lines().filter(|l| l.contains(needle)).count(), 1, "{stderr}");
    assert_eq!(num(&stdout, "allocated_bytes"), 512 * MIB - CTX, "{stdout}");
}

/// A damaged libvgpu region (our extension magic, a wrong HAMi magic) nobody uses is recreated
/// (one warning) and used.
#[test]
fn corrupt_region_is_recreated() {
    let s = Scratch::new("hk-corrupt");
    drop(vgpu_core::region::Region::create_new(s.region(), &Default::default()).unwrap());
    let mut bytes = std::fs::read(s.region()).unwrap();
    bytes[0] ^= 0xff;
    std::fs::write(s.region(), &bytes).unwrap();
    vram_limit_capped_with_one_line(&s, "recreating");
    assert_eq!(region_limit(&s.region(), 0), Some(512 * MIB));
}

/// A file at the region path that is not a libvgpu region is someone else's: left untouched,
/// one error line, a private region, still capped.
#[test]
fn foreign_file_is_left_alone() {
    let s = Scratch::new("hk-foreign");
    std::fs::write(s.region(), b"definitely not a region").unwrap();
    vram_limit_capped_with_one_line(&s, "private region");
    assert_eq!(std::fs::read(s.region()).unwrap(), b"definitely not a region");
}

/// A valid configuration prints nothing at the default log level.
#[test]
fn valid_configuration_is_silent() {
    let (_out, err) = run_with(&[("CUDA_DEVICE_MEMORY_LIMIT", "512m"), ("CUDA_DEVICE_SM_LIMIT", "50")]);
    assert!(!err.contains("libvgpu"), "{err}");
}

/// A process whose environment changes the container's cap (newer intent, applied to every
/// process sharing the region) says so in one line; one that changes nothing says nothing. One
/// whose environment names no cap (a child started with a scrubbed env) keeps the container's,
/// and says which applies: a hostile test saw such a sibling lift a running process's cap.
#[test]
fn a_process_that_changes_the_containers_cap_says_so() {
    let s = Scratch::new("hk-intent");
    let run = |limit: Option<&str>| {
        let mut c = hooked("test_vram_limit", &s, limit);
        c.args(["--step", "64m", "--max", "1g"]);
        if limit.is_none() {
            c.env_remove("CUDA_DEVICE_MEMORY_LIMIT");
        }
        let out = output(&mut c);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{limit:?}: {stderr}");
        let lines = stderr.lines().filter(|l| l.contains("libvgpu")).map(String::from).collect::<Vec<_>>();
        (num(&stdout, "allocated_bytes"), lines)
    };
    let (capped, lines) = run(Some("512m"));
    assert_eq!(lines, Vec::<String>::new(), "a fresh region: nothing changes");
    assert_eq!(run(Some("512m")).1, Vec::<String>::new(), "the same cap: nothing changes");
    let (got, unset) = run(None);
    assert_eq!(got, capped, "an unset variable kept the container's cap");
    assert_eq!(unset.len(), 1, "{unset:?}");
    assert!(unset[0].contains("not set") && unset[0].contains("512MiB applies"), "{unset:?}");
    let (_, lifted) = run(Some("0"));
    assert_eq!(lifted.len(), 1, "{lifted:?}");
    assert!(lifted[0].contains("CUDA_DEVICE_MEMORY_LIMIT") && lifted[0].contains("from 512MiB to none"), "{lifted:?}");
    let (_, set) = run(Some("256m"));
    assert_eq!(set.len(), 1, "{set:?}");
    assert!(set[0].contains("from none to 256MiB"), "{set:?}");
}

/// A process whose stderr blocks (a full pipe nobody reads) while it says which cap applies must
/// not keep the region's table lock meanwhile: a newcomer then took a private region and the
/// container went past its cap (a hostile review: 1.7 GiB under 1 GiB).
#[test]
fn a_process_blocked_on_its_stderr_keeps_no_lock_from_the_others() {
    use std::io::{BufRead, BufReader, Write};
    use std::os::fd::FromRawFd;
    use std::process::Stdio;
    let s = Scratch::new("hk-blocked");
    let mut a = hooked("test_alloc_paths", &s, Some("1g"));
    a.args(["--path", "mem_alloc", "--size", "256m", "--hold", "--hold-seconds", "60"]).stdout(Stdio::piped()).stderr(Stdio::null());
    let mut a = a.spawn().unwrap();
    let mut lines = BufReader::new(a.stdout.take().unwrap()).lines();
    assert!(lines.any(|l| l.unwrap().contains("holding=1")), "A never held its 256 MiB");
    // B names no cap, so it says the container's applies, into a full pipe.
    let mut fds = [0; 2];
    // SAFETY: a fresh pipe, filled while non-blocking, then blocking again for the child.
    let (reader, mut full) = unsafe {
        assert_eq!(libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK), 0);
        (std::fs::File::from_raw_fd(fds[0]), std::fs::File::from_raw_fd(fds[1]))
    };
    while full.write(&[b'x'; 4096]).is_ok() {}
    unsafe { libc::fcntl(fds[1], libc::F_SETFL, 0) };
    let mut b = hooked("test_alloc_paths", &s, None);
    b.env_remove("CUDA_DEVICE_MEMORY_LIMIT").args(["--path", "mem_alloc", "--size", "1m"]).stdout(Stdio::null()).stderr(full);
    let mut b = b.spawn().unwrap();
    std::thread::sleep(std::time::Duration::from_secs(1));
    let c = output(hooked("test_alloc_paths", &s, Some("1g")).args(["--path", "mem_alloc", "--size", "600m"]));
    let _ = b.kill();
    let _ = a.kill();
    let _ = (b.wait(), a.wait());
    drop(reader);
    let (out, err) = (String::from_utf8_lossy(&c.stdout), String::from_utf8_lossy(&c.stderr));
    assert!(!err.contains("private region"), "the newcomer lost the shared region:\n{err}");
    assert!(out.contains("path=mem_alloc result=CUDA_ERROR_OUT_OF_MEMORY"), "past the container's cap:\n{out}\n{err}");
}
