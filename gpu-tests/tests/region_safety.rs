//! Issue 12: the shared region under hostile paths, full filesystems, stopped processes, exits,
//! deletion, and internal panics, with hooked processes on the mock GPU. Every wait is bounded.

mod stress_util;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use stress_util::*;

const GIB: u64 = 1 << 30;

/// `fill` under a memory cap on region path `region`: (status, stdout, stderr).
fn fill_at(s: &Scratch, region: &Path, cap: &str) -> (std::process::ExitStatus, String, String) {
    let mut c = worker("fill", s, true);
    c.env("CUDA_DEVICE_MEMORY_LIMIT", cap).env("CUDA_DEVICE_MEMORY_SHARED_CACHE", region);
    Live::spawn(&mut c).finish(Duration::from_secs(60))
}

/// The lines libvgpu printed about the shared region.
fn region_lines(stderr: &str) -> Vec<&str> {
    stderr.lines().filter(|l| l.contains("libvgpu") && l.contains("region")).collect()
}

/// A hooked run that must have been capped at `cap` bytes (context included), exit 0, and said
/// exactly one line about the region.
fn assert_capped_with_one_line(what: &str, (st, out, err): (std::process::ExitStatus, String, String), cap: u64) {
    assert!(st.success(), "{what}: {st}\n{out}\n{err}");
    let filled = num(&out, "filled");
    assert!(filled > 0 && filled + CTX <= cap, "{what}: filled {filled} under a cap of {cap}\n{out}\n{err}");
    let lines = region_lines(&err);
    assert_eq!(lines.len(), 1, "{what}: one line about the region expected:\n{err}");
}

#[test]
fn symlink_at_the_region_path_is_not_followed_and_the_program_stays_capped() {
    let s = Scratch::new("rs-symlink");
    let victim = s.dir.join("victim");
    std::fs::write(&victim, b"someone's data\n").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
    let link = s.dir.join("cudevshr-link.cache");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let r = fill_at(&s, &link, "1g");
    assert!(r.2.contains("symbolic link"), "{}", r.2);
    assert_capped_with_one_line("symlink", r, GIB);
    assert_eq!(std::fs::read(&victim).unwrap(), b"someone's data\n");
    assert_eq!(std::fs::metadata(&victim).unwrap().permissions().mode() & 0o777, 0o600);
}

#[test]
fn foreign_file_at_the_region_path_is_untouched_and_the_program_stays_capped() {
    let s = Scratch::new("rs-foreign");
    let path = s.dir.join("cudevshr.cache");
    let content: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
    std::fs::write(&path, &content).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_capped_with_one_line("foreign file", fill_at(&s, &path, "1g"), GIB);
    assert!(std::fs::read(&path).unwrap() == content, "the foreign file changed");
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
}

/// A small tmpfs, unmounted on drop; `None` (with a loud line) where mounting is impossible.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(s: &Scratch, size: &str) -> Option<Tmpfs> {
        let dir = s.dir.join("tmpfs");
        std::fs::create_dir_all(&dir).ok()?;
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .status()
            .is_ok_and(|st| st.success());
        if !ok {
            eprintln!("SKIPPED: cannot mount a tmpfs here (needs root and CAP_SYS_ADMIN); the full-filesystem case is NOT tested");
            return None;
        }
        Some(Tmpfs(dir))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn full_filesystem_no_sigbus_and_still_capped() {
    let s = Scratch::new("rs-fullfs");
    let Some(fs) = Tmpfs::mount(&s, "1m") else { return };
    let path = fs.0.join("cudevshr.cache");
    let r = fill_at(&s, &path, "1g");
    assert!(r.2.contains("no space"), "{}", r.2);
    assert_capped_with_one_line("full tmpfs", r, GIB);
}

#[test]
fn filesystem_filling_after_creation_kills_no_later_process() {
    let s = Scratch::new("rs-fills");
    let Some(fs) = Tmpfs::mount(&s, "3m") else { return };
    let path = fs.0.join("cudevshr.cache");
    let (st, out, err) = fill_at(&s, &path, "1g");
    assert!(st.success() && region_lines(&err).is_empty(), "{st}\n{out}\n{err}");
    let mut filler = std::fs::File::create(fs.0.join("filler")).unwrap();
    let chunk = vec![1u8; 64 * 1024];
    while std::io::Write::write_all(&mut filler, &chunk).is_ok() {}
    drop(filler);
    // 12 processes at once: each registers its own slot, touching pages nobody touched before
    let mut kids: Vec<Live> = (0..12)
        .map(|_| {
            let mut c = worker("survivor", &s, true);
            c.env("CUDA_DEVICE_MEMORY_LIMIT", "4g").env("CUDA_DEVICE_MEMORY_SHARED_CACHE", &path).env("STRESS_HOLD", (64u64 << 20).to_string());
            Live::spawn(&mut c)
        })
        .collect();
    for k in kids.iter_mut() {
        k.expect_line("ready", Duration::from_secs(60));
    }
    for (i, mut k) in kids.into_iter().enumerate() {
        k.send("quit");
        let (st, out, err) = k.finish(Duration::from_secs(30));
        assert!(st.success(), "process {i} after the filesystem filled: {st}\n{out}\n{err}");
    }
}

/// Whether another (live) process holds device 0's region lock.
fn device_lock_held(region: &Path) -> bool {
    let Ok(r) = vgpu_core::region::Region::open_existing(region) else { return false };
    r.device_lock_held(0)
}

#[test]
fn a_stopped_lock_holder_delays_nobody_by_more_than_a_second() {
    let s = Scratch::new("rs-stopped");
    let cap = |c: &mut std::process::Command| {
        c.env("CUDA_DEVICE_MEMORY_LIMIT", "2g");
    };
    let mut sv = worker("survivor", &s, true);
    cap(&mut sv);
    let mut survivor = Live::spawn(&mut sv);
    survivor.expect_line("ready", Duration::from_secs(30));
    // the holder measures its first context under the device lock; the mock stretches it
    let mut h = worker("lockholder", &s, true);
    cap(&mut h);
    h.env("MOCK_CUDA_DELAY", "cuDevicePrimaryCtxRetain:20000000");
    let mut holder = Live::spawn(&mut h);
    holder.expect_line("retaining", Duration::from_secs(20));
    let t = Instant::now();
    while !device_lock_held(&s.region()) {
        assert!(t.elapsed() < Duration::from_secs(10), "the holder never took the device lock");
        std::thread::sleep(Duration::from_millis(5));
    }
    // SAFETY: stopping our own child.
    unsafe { libc::kill(holder.pid(), libc::SIGSTOP) };
    let mut slowest = Duration::ZERO;
    for i in 0..20 {
        let t = Instant::now();
        survivor.send("probe");
        let l = survivor.expect_line("probe", Duration::from_secs(10));
        let took = t.elapsed();
        assert!(l.contains("alloc_result=0"), "try {i}: {l}");
        assert!(took < Duration::from_secs(1), "try {i} took {took:?} behind a stopped lock holder: {l}");
        slowest = slowest.max(took);
    }
    assert!(device_lock_held(&s.region()), "the stopped holder still holds the lock");
    report("stopped_holder", &[("tries", "20".into()), ("slowest", ms(slowest))]);
    holder.sigkill();
    let _ = holder.finish(Duration::from_secs(10));
    survivor.send("quit");
    let (st, _, err) = survivor.finish(Duration::from_secs(10));
    assert!(st.success(), "{err}");
}

/// HAMi's monitor's view of the raw file: (slots with status != 0 in procs[0..proc_num], sum of
/// their used[0].total).
fn raw_live(region: &Path) -> (usize, u64) {
    let b = std::fs::read(region).unwrap();
    let n = i32::from_le_bytes(b[2_008_896..2_008_900].try_into().unwrap()).clamp(0, 1024) as usize;
    let mut live = 0;
    let mut sum = 0u64;
    for i in 0..n {
        let base = 1856 + i * 1960;
        if i32::from_le_bytes(b[base + 1928..base + 1932].try_into().unwrap()) != 0 {
            live += 1;
            sum += u64::from_le_bytes(b[base + 8 + 32..base + 8 + 40].try_into().unwrap());
        }
    }
    (live, sum)
}

fn tool_out(s: &Scratch, name: &str, args: &[&str]) -> String {
    let out = mock_command(&artifacts().tool(name), s, false).args(args).output().unwrap();
    assert!(out.status.success(), "{name} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn two_hundred_processes_that_exit_leave_nothing_in_any_view() {
    let s = Scratch::new("rs-exits");
    let n = 200;
    let batch = 8;
    let mut done = 0;
    while done < n {
        let kids: Vec<Live> = (done..(done + batch).min(n))
            .map(|i| {
                let mut c = worker("alloc_exit", &s, true);
                c.env("CUDA_DEVICE_MEMORY_LIMIT", "4g").env("STRESS_HOLD", (32 << 20).to_string());
                if i % 2 == 1 {
                    c.env("STRESS_EXIT", "thread");
                }
                Live::spawn(&mut c)
            })
            .collect();
        for k in kids {
            let (st, out, err) = k.finish(Duration::from_secs(60));
            assert!(st.success() && out.contains("allocated"), "{st}\n{out}\n{err}");
        }
        done += batch;
    }
    // nobody reaped anything: every process cleaned up after itself
    assert_eq!(raw_live(&s.region()), (0, 0), "HAMi's monitor view");
    let j: serde_json::Value = serde_json::from_str(&tool_out(&s, "vgpu-smi", &["--json"])).unwrap();
    assert_eq!(j["process_count"], 0, "{j}");
    assert_eq!(j["devices"][0]["memory_used_bytes"], 0, "{j}");
    let p = tool_out(&s, "shrreg-tool", &["--print"]);
    assert!(p.contains("processes: 0") && !p.contains("slot "), "{p}");
    let m = tool_out(&s, "vgpu-smi", &["--metrics"]);
    assert!(m.contains("hami_vgpu_memory_used_bytes{vdevice_index=\"0\"") && m.lines().any(|l| l.starts_with("hami_vgpu_memory_used_bytes{") && l.ends_with(" 0")), "{m}");
    assert!(!m.contains("vgpu_process_memory_used_bytes{"), "{m}");
}

#[test]
fn a_region_deleted_mid_run_still_yields_one_cap() {
    let s = Scratch::new("rs-unlinked");
    let mut a = worker("survivor", &s, true);
    a.env("CUDA_DEVICE_MEMORY_LIMIT", "3g").env("STRESS_HOLD", (1536u64 << 20).to_string());
    let mut a = Live::spawn(&mut a);
    a.expect_line("ready", Duration::from_secs(30));
    std::fs::remove_file(s.region()).unwrap();
    // the running process notices (monitor thread, about a second) and re-attaches
    let t = Instant::now();
    while !(s.region().exists() && raw_live(&s.region()).1 == CTX + (1536 << 20)) {
        assert!(t.elapsed() < Duration::from_secs(10), "the running process never re-attached");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (st, out, err) = fill_at(&s, &s.region(), "3g");
    assert!(st.success(), "{out}\n{err}");
    let filled = num(&out, "filled");
    let total = CTX + (1536 << 20) + CTX + filled;
    assert!(total <= 3 * GIB, "two caps: {total} bytes held under 3 GiB\n{out}");
    a.send("quit");
    let (st, _, err) = a.finish(Duration::from_secs(10));
    assert!(st.success(), "{err}");
    assert!(err.contains("re-attached"), "{err}");
}

#[test]
fn an_injected_panic_returns_an_error_code_and_one_line() {
    let s = Scratch::new("rs-panic");
    let mut c = worker("fill", &s, true);
    c.env("CUDA_DEVICE_MEMORY_LIMIT", "1g").env("LIBVGPU_TEST_PANIC", "cuMemAlloc_v2");
    let (st, out, err) = Live::spawn(&mut c).finish(Duration::from_secs(30));
    assert!(st.success(), "the program died: {st}\n{out}\n{err}");
    assert_eq!(value(&out, "fill_first"), Some("999"), "CUDA_ERROR_UNKNOWN expected:\n{out}\n{err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line expected:\n{err}");
    assert!(lines[0].contains("internal error in hook cuMemAlloc_v2"), "{err}");
}

#[test]
fn release_builds_unwind() {
    let toml = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml")).unwrap();
    let release = toml.split("[profile.release]").nth(1).expect("a release profile");
    let release = release.split("\n[").next().unwrap();
    assert!(!release.contains("\"abort\""), "panic = \"abort\" in the release profile: ffi_guard could not catch a panic");
}
