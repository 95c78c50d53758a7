//! Node-level coordination on the mock GPU (issue 14): containers of one GPU (one mock state, a
//! region each) meet in a node directory (`VGPU_NODE_DIR`, HAMi's `/tmp/vgpulock`). While a
//! higher-priority container has work queued or running, lower-priority ones hold new launches;
//! they resume when it goes idle; a SIGKILLed one stops holding anyone within a second; a corrupt
//! or symlinked node file costs one log line and leaves today's behaviour.
//! A soft cap (`CUDA_CORE_SOFT_LIMIT`) reaches as far as the other containers with work leave room.
//!
//! Latencies and rates are measured on the mock's shared timeline (wall time of a launch +
//! synchronize, kernels per second), with tolerances for a loaded 2-core machine.

mod common;
mod hook_util;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{mean, Bg, Scratch};
use hook_util::hooked;
use serial_test::serial;

/// One container: its own region in the scratch dir, the shared mock GPU, the node dir.
fn container(s: &Scratch, name: &str, sample: &str, prio: u32, env: &[(&str, &str)]) -> Command {
    let mut c = hooked(sample, s, None);
    c.env("CUDA_DEVICE_MEMORY_SHARED_CACHE", s.dir.join(format!("{name}.cache")))
        .env("VGPU_NODE_DIR", node_dir(s))
        .env("CUDA_TASK_PRIORITY", prio.to_string());
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

fn node_dir(s: &Scratch) -> PathBuf {
    let d = s.dir.join("vgpulock");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A saturating loop of 1 ms kernels, synchronizing every `sync_every` launches, until killed.
fn saturating(s: &Scratch, name: &str, prio: u32, sync_every: u32, env: &[(&str, &str)]) -> Command {
    let mut c = container(s, name, "test_runtime_launch", prio, env);
    c.args(["--us", "1000", "--seconds", "0", "--sync-every", &sync_every.to_string()]);
    c
}

/// The usual low-priority neighbour (container "lo", priority 1, synchronizing every 10
/// launches), once it has reported `seconds` seconds of progress.
fn low_priority_running(s: &Scratch, seconds: u32) -> Bg {
    let mut low = Bg::spawn(saturating(s, "lo", 1, 10, &[]), "low priority");
    low.wait_line(&format!("second={seconds} "), Duration::from_secs(10));
    low
}

/// Requests of `us` microseconds of GPU time each, `gap_us` apart.
fn requests(s: &Scratch, name: &str, prio: u32, us: u32, gap_us: u32, seconds: u32, extra: &[&str]) -> Command {
    let mut c = container(s, name, "test_requests", prio, &[]);
    c.args(["--us", &us.to_string(), "--gap-us", &gap_us.to_string(), "--seconds", &seconds.to_string()]);
    c.args(extra);
    c
}

/// `key=` of the line that has it, as a number.
fn field(text: &str, key: &str) -> f64 {
    let pat = format!("{key}=");
    text.lines()
        .rev()
        .find_map(|l| l.split_whitespace().find_map(|kv| kv.strip_prefix(pat.as_str())))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key}= in:\n{text}"))
}

/// p50 latency (us) of a request run alone on a fresh mock GPU.
fn alone_p50(us: u32, gap_us: u32) -> f64 {
    let s = Scratch::new("node-alone");
    let text = Bg::spawn(requests(&s, "hi", 0, us, gap_us, 3, &[]), "requests alone").finish(Duration::from_secs(15));
    field(&text, "lat_p50_us")
}

fn sleep_until(t: Instant) {
    if let Some(d) = t.checked_duration_since(Instant::now()) {
        std::thread::sleep(d);
    }
}

/// `watched`'s per-second rates while `requests` (a `test_requests` run with `--idle-seconds`)
/// serves and after it went idle: each window starts `settle` after the change (monitor ticks,
/// the last held launches), the second one ends `until` after it went idle.
fn busy_then_idle(watched: &Bg, requests: &mut Bg, settle: Duration, until: Duration) -> (Vec<f64>, Vec<f64>) {
    requests.wait_line("serving=1", Duration::from_secs(10));
    let t = Instant::now();
    requests.wait_line("idle=1", Duration::from_secs(15));
    let idle_at = Instant::now();
    let during = watched.rates(t + settle, idle_at);
    sleep_until(idle_at + until);
    (during, watched.rates(idle_at + settle, Instant::now()))
}

#[test]
#[serial(mock_gpu_timing)]
fn high_priority_requests_are_not_delayed_by_a_low_priority_saturating_container() {
    let alone = alone_p50(2000, 15000);
    let s = Scratch::new("node-prio");
    // Without coordination the low one keeps up to 10 ms queued ahead of every request.
    let mut low = low_priority_running(&s, 1);
    let high = Bg::spawn(requests(&s, "hi", 0, 2000, 15000, 4, &[]), "high priority");
    let text = high.finish(Duration::from_secs(20));
    let (p50, p90) = (field(&text, "lat_p50_us"), field(&text, "lat_p90_us"));
    eprintln!("request latency alone p50 {alone:.0} us; beside a low-priority saturating container p50 {p50:.0} p90 {p90:.0} us");
    assert!(
        p50 <= alone + 1500.0,
        "high-priority p50 latency {p50:.0} us beside a low-priority saturating container, {alone:.0} us alone\n{text}\n{}",
        low.text()
    );
    assert!(low.alive(), "the low-priority container died\n{}", low.text());
    low.stop();
}

#[test]
#[serial(mock_gpu_timing)]
fn low_priority_holds_while_the_high_priority_one_works_and_resumes_when_it_goes_idle() {
    let s = Scratch::new("node-resume");
    let low = low_priority_running(&s, 2);
    let before = mean(&low.rates(Instant::now() - Duration::from_secs(3), Instant::now()), "low rate alone");
    // Busy back to back (5 ms requests, no pause) for 4 s, then idle but alive.
    let mut high = Bg::spawn(requests(&s, "hi", 0, 5000, 0, 4, &["--idle-seconds", "6"]), "high priority");
    let (during, after) = busy_then_idle(&low, &mut high, Duration::from_millis(1100), Duration::from_millis(3200));
    eprintln!("low priority: {before:.0}/s alone, {during:?} while the high one works, {after:?} after it went idle");
    let ctx = format!("{}\n{}", low.text(), high.text());
    let during = mean(&during, &format!("low rates while the high one works\n{ctx}"));
    assert!(during <= 0.3 * before, "low priority ran {during:.0}/s beside a busy high-priority container ({before:.0}/s alone)\n{ctx}");
    let after = mean(&after, &format!("low rates after the high one went idle\n{ctx}"));
    assert!(after >= 0.7 * before, "low priority ran {after:.0}/s after the high-priority one went idle ({before:.0}/s alone)\n{ctx}");
    high.stop();
    low.stop();
}

#[test]
#[serial(mock_gpu_timing)]
fn two_low_priority_containers_split_what_the_high_one_leaves() {
    // Uncapped rate of one low container alone (1 ms kernels, synchronized each).
    let base = alone_rate(&[]);
    let s = Scratch::new("node-three");
    let cap50 = [("CUDA_DEVICE_SM_LIMIT", "50")];
    let mut a = Bg::spawn(saturating(&s, "a", 1, 1, &cap50), "low a");
    let b = Bg::spawn(saturating(&s, "b", 1, 1, &cap50), "low b");
    a.wait_line("second=1 ", Duration::from_secs(10));
    // The high one: 3 ms requests, 3 ms apart: it leaves about half the GPU. The split is read
    // over 10 s: each low container's 1-s rates wander about 10% on a loaded 2-core machine, and
    // 5 s read the two 3.1 and 3.5 points apart in one CI run and 1 of 12 runs here (before and
    // after the per-kind queue values); 10 s read them at most 1.3 apart in 8 runs.
    const HIGH_SECS: u32 = 12;
    let mut high = Bg::spawn(requests(&s, "hi", 0, 3000, 3000, HIGH_SECS, &[]), "high priority");
    high.wait_line("serving=1", Duration::from_secs(10));
    let t = Instant::now();
    sleep_until(t + Duration::from_millis(11_500));
    let (ra, rb) = (a.rates(t + Duration::from_millis(1500), Instant::now()), b.rates(t + Duration::from_millis(1500), Instant::now()));
    let text = high.finish(Duration::from_secs(20));
    let ctx = format!("{}\n{}\n{text}", a.text(), b.text());
    let (sa, sb) = (100.0 * mean(&ra, &format!("a\n{ctx}")) / base, 100.0 * mean(&rb, &format!("b\n{ctx}")) / base);
    let high_busy = 100.0 * field(&text, "requests") * 3.0 / (HIGH_SECS as f64 * 1000.0);
    eprintln!("baseline {base:.0}/s; high busy {high_busy:.0}%; low a {sa:.1}%, low b {sb:.1}% ({ra:?} / {rb:?})");
    assert!((sa - sb).abs() <= 3.0, "the two low-priority containers got {sa:.1}% and {sb:.1}%: not within 3 points\n{ctx}");
    let left = 100.0 - high_busy;
    assert!(sa + sb >= 0.6 * left, "the low-priority containers got {sa:.1}% + {sb:.1}% of the {left:.0}% the high one left\n{ctx}");
    assert!(sa <= 55.0 && sb <= 55.0, "a low-priority container exceeded its cap of 50: {sa:.1}%, {sb:.1}%\n{ctx}");
    a.stop();
    b.stop();
}

#[test]
#[serial(mock_gpu_timing)]
fn a_killed_high_priority_container_blocks_the_others_for_at_most_a_second() {
    let s = Scratch::new("node-kill");
    // Low priority: 1 ms requests back to back, each completion printed as it happens.
    let mut low = Bg::spawn(requests(&s, "lo", 1, 1000, 0, 30, &["--print-each"]), "low priority");
    low.wait_line("req=200 ", Duration::from_secs(10));
    let mut high = Bg::spawn(saturating(&s, "hi", 0, 1, &[]), "high priority");
    // Its first second of launches is out (its entry declared busy since its first launch), and
    // the monitors' 100 ms ticks have passed: the low one is held over the last second from here.
    high.wait_line("second=", Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(300));
    let count = |from: Instant, to: Instant| -> Vec<Instant> { low.times_of("req=", from, to) };
    let t = Instant::now();
    let held = count(t - Duration::from_secs(1), t).len();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(high.pid(), libc::SIGKILL) };
    std::thread::sleep(Duration::from_millis(2500));
    let after = count(t, Instant::now());
    let ctx = format!("{}\n{}", low.text(), high.text());
    assert!(held <= 150, "the low-priority container completed {held} 1 ms requests in the second before the kill: not held\n{ctx}");
    let first = after.first().map(|f| f.duration_since(t));
    eprintln!("held: {held} requests in the last second; first completion {first:?} after the SIGKILL; {} in 2.5 s", after.len());
    let first = first.unwrap_or_else(|| panic!("no request completed within 2.5 s of the SIGKILL\n{ctx}"));
    assert!(first <= Duration::from_millis(1000), "the killed high-priority container held the low one for {first:?}\n{ctx}");
    let resumed = after.iter().filter(|&&x| x >= t + Duration::from_millis(1500)).count();
    assert!(resumed >= 300, "only {resumed} requests in the second after resuming\n{ctx}");
    drop(high);
    low.stop();
}

/// The node file of the mock GPU once a hooked process has created it.
fn node_file(s: &Scratch) -> PathBuf {
    let t = Instant::now();
    loop {
        let found = std::fs::read_dir(node_dir(s)).unwrap().flatten().map(|e| e.path()).find(|p| p.extension().is_some_and(|x| x == "node"));
        if let Some(p) = found {
            return p;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "no node file appeared in {}", node_dir(s).display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The live entries of the GPU's node file whose name is `uuid` (`None`: no valid file).
fn live_entries(s: &Scratch, uuid: &str) -> Option<Vec<vgpu_core::node::Entry>> {
    use vgpu_core::node::{self, NodeFile, Slot};
    let slots = NodeFile::open(&node_dir(s), uuid, false).ok()?.read().ok()?;
    let now = vgpu_core::clock::now_ns();
    Some(slots.into_iter().filter_map(|e| match e {
        Slot::Used(e) if node::live(&e, now) => Some(e),
        _ => None,
    }).collect())
}

/// Container `name`'s saturating loop (priority 1) for `seconds`, once it reported its first second.
fn saturating_for(s: &Scratch, name: &str, seconds: u32, what: &str) -> Bg {
    let mut c = saturating(s, name, 1, 10, &[]);
    c.args(["--seconds", &seconds.to_string()]);
    let mut bg = Bg::spawn(c, what);
    bg.wait_line("second=1 ", Duration::from_secs(10));
    bg
}

/// A 2-second low-priority loop beside a live high-priority entry: (kernels/s, stderr lines about the node file).
fn low_run(s: &Scratch) -> (f64, Vec<String>) {
    let out = saturating(s, "lo", 1, 1, &[]).args(["--seconds", "3"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "low run failed\n{text}\n{err}");
    let lines = err.lines().filter(|l| l.contains("node")).map(String::from).collect();
    (field(&text, "avg_kernels_per_sec"), lines)
}

#[test]
#[serial(mock_gpu_timing)]
fn a_corrupt_or_symlinked_node_file_gives_one_line_and_todays_behaviour() {
    let s = Scratch::new("node-bad");
    // A valid run creates the file; then plant bad ones in its place.
    let (alone, lines) = low_run(&s);
    assert!(lines.is_empty(), "a valid node file was complained about: {lines:?}");
    let file = node_file(&s);
    let garbage: Vec<u8> = (0..std::fs::metadata(&file).unwrap().len()).map(|i| (i * 7 + 3) as u8).collect();
    let elsewhere = s.dir.join("elsewhere");
    let valid = std::fs::read(&file).unwrap();
    for (what, plant) in [
        ("garbage of the right size", Box::new(|f: &PathBuf| std::fs::write(f, &garbage).unwrap()) as Box<dyn Fn(&PathBuf)>),
        ("a short file", Box::new(|f: &PathBuf| std::fs::write(f, b"LVGPUNOD").unwrap())),
        ("a symbolic link to a valid file", Box::new(|f: &PathBuf| {
            std::fs::write(&elsewhere, &valid).unwrap();
            std::os::unix::fs::symlink(&elsewhere, f).unwrap();
        })),
    ] {
        std::fs::remove_file(&file).unwrap();
        plant(&file);
        let before = std::fs::symlink_metadata(&file).unwrap();
        let (rate, lines) = low_run(&s);
        eprintln!("{what}: {rate:.0}/s ({alone:.0}/s with a valid file); {lines:?}");
        assert_eq!(lines.len(), 1, "{what}: expected one line about the node file, got {lines:?}");
        assert!(rate >= 0.7 * alone, "{what}: {rate:.0} kernels/s, {alone:.0}/s with a valid file");
        let now = std::fs::symlink_metadata(&file).unwrap();
        assert_eq!((now.len(), now.file_type().is_symlink()), (before.len(), before.file_type().is_symlink()), "{what}: the file was changed");
    }
    assert_eq!(std::fs::read(&elsewhere).unwrap(), valid, "the symbolic link's target was written");
}

/// Runs hooked commands as uid/gid 65534 without groups (std drops them: `CommandExt::uid` as
/// root), from copies in a directory all may read: the build's own directories need not be
/// readable by that uid. Its region goes in a directory of its own.
struct Nobody {
    bin: PathBuf,
    home: PathBuf,
}

const NOBODY: u32 = 65534;

impl Nobody {
    /// `Err(why)` where uid 65534 cannot run them here.
    fn new(s: &Scratch, sample: &str) -> Result<Nobody, String> {
        use std::os::unix::fs::PermissionsExt;
        use std::os::unix::process::CommandExt;
        let chmod = |p: &std::path::Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
        let a = gpu_tests::artifacts();
        chmod(&s.dir, 0o755);
        let bin = s.dir.join("nobody-bin");
        std::fs::create_dir_all(&bin).unwrap();
        chmod(&bin, 0o755);
        for from in [a.libvgpu.clone(), a.mock_lib_dir.join("libcuda.so.1"), a.mock_lib_dir.join("libnvidia-ml.so.1"), a.sample(sample), a.tool("vgpu-smi")] {
            let to = bin.join(from.file_name().unwrap());
            std::fs::copy(&from, &to).map_err(|e| format!("copy {}: {e}", from.display()))?;
            chmod(&to, 0o755);
        }
        let home = s.dir.join("nobody-home");
        std::fs::create_dir_all(&home).unwrap();
        std::os::unix::fs::chown(&home, Some(NOBODY), Some(NOBODY)).map_err(|e| format!("chown {}: {e}", home.display()))?;
        // What it will be and may do, asked as it.
        let probe = Command::new("/bin/sh")
            .args(["-c", r#"test -x "$1/$2" -a -r "$1/libvgpu.so" -a -r "$1/libcuda.so.1" -a -w "$3" -a -w "$4" -a -w "$5" && echo "$(id -u) $(id -G)""#, "probe"])
            .arg(&bin)
            .arg(sample)
            .args([&home, &s.mock_state(), &node_dir(s)])
            .current_dir(&home)
            .uid(NOBODY)
            .gid(NOBODY)
            .output()
            .map_err(|e| format!("spawn /bin/sh as uid {NOBODY}: {e}"))?;
        let ids = String::from_utf8_lossy(&probe.stdout);
        if ids.trim() != format!("{NOBODY} {NOBODY}") {
            return Err(format!("as uid {NOBODY} the copies, its directory, the mock state or the node dir are out of reach ({}; {ids:?} {})", probe.status, String::from_utf8_lossy(&probe.stderr)));
        }
        Ok(Nobody { bin, home })
    }

    /// `c` (made by the helpers above) as uid 65534: the same arguments and environment, from
    /// the copies, with its own region.
    fn command(&self, c: &Command) -> Command {
        use std::os::unix::process::CommandExt;
        let mut n = Command::new(self.bin.join(std::path::Path::new(c.get_program()).file_name().unwrap()));
        n.args(c.get_args());
        for (k, v) in c.get_envs() {
            match (k.to_str(), v) {
                (_, None) => n.env_remove(k),
                (Some("LD_PRELOAD"), Some(_)) => n.env(k, self.bin.join("libvgpu.so")),
                (Some("LD_LIBRARY_PATH"), Some(_)) => n.env(k, &self.bin),
                (_, Some(v)) => n.env(k, v),
            };
        }
        n.env("CUDA_DEVICE_MEMORY_SHARED_CACHE", self.home.join("nobody.cache")).current_dir(&self.home).uid(NOBODY).gid(NOBODY);
        n
    }
}

/// A node file this process can read but not write (another tenant's under another uid, or
/// root's: 0644), or not even read (000): one line naming it, and the process runs on, capped,
/// as without a node file; the file keeps its bytes. `vgpu-smi`, which only reads it, shows the
/// containers of a 0644 one. The samples run as uid 65534: only root can set that up.
/// (`stress_input::node_files_this_process_may_not_write`, run by `ci/stress.sh` only, checks
/// the memory cap through `setpriv`; this one the SM cap and the reader, in every run.)
#[test]
#[serial(mock_gpu_timing)]
fn a_node_file_this_process_cannot_write_gives_one_line_and_the_cap_still_holds() {
    use std::os::unix::fs::PermissionsExt;
    const SAMPLE: &str = "test_runtime_launch";
    let name = "a_node_file_this_process_cannot_write_gives_one_line_and_the_cap_still_holds";
    // SAFETY: no arguments.
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        eprintln!("SKIPPED: {name}: runs a sample as uid {NOBODY}, which needs root (euid {euid})");
        return;
    }
    let s = Scratch::new("node-perm");
    std::fs::set_permissions(node_dir(&s), std::fs::Permissions::from_mode(0o777)).unwrap();
    // Root's uncapped run creates the node file (mode 0666) and the mock GPU (its state 0666).
    let (alone, lines) = low_run(&s);
    assert!(lines.is_empty(), "a valid node file was complained about: {lines:?}");
    let file = node_file(&s);
    let nobody = match Nobody::new(&s, SAMPLE) {
        Ok(n) => n,
        Err(why) => {
            eprintln!("SKIPPED: {name}: {why}");
            return;
        }
    };
    let capped: &[(&str, &str)] = &[("CUDA_DEVICE_SM_LIMIT", "50"), ("LIBCUDA_LOG_LEVEL", "4")];
    for mode in [0o644, 0o000] {
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
        let before = std::fs::read(&file).unwrap();
        let mut c = saturating(&s, "nobody", 1, 1, capped);
        c.args(["--seconds", "2"]);
        let t = Instant::now();
        let (out, err) = Bg::spawn(nobody.command(&c), &format!("uid {NOBODY}, node file {mode:03o}")).finish_both(Duration::from_secs(20));
        let took = t.elapsed();
        let said: Vec<&str> = err.lines().filter(|l| l.contains("] WARN: ") || l.contains("] ERROR: ")).collect();
        let rate = field(&out, "avg_kernels_per_sec");
        eprintln!("node file {mode:03o}, uid {NOBODY}, capped 50: {rate:.0}/s ({alone:.0}/s uncapped), gated {}, {took:?}; {said:?}", gated(&err));
        let ctx = format!("{out}\n{err}");
        assert_eq!(said.len(), 1, "mode {mode:03o}: expected one warning, got {said:?}\n{ctx}");
        let path = file.display().to_string();
        let says = |w: &str| said[0].contains(w);
        assert!(says(&path) && says("uid 65534 may not read and write it") && says("node-level coordination is off"), "mode {mode:03o}: the line does not name the file, the access and the outcome: {}", said[0]);
        assert!(gated(&err) > 0 && rate <= 0.75 * alone, "mode {mode:03o}: not capped ({rate:.0}/s, {alone:.0}/s uncapped, gated {})\n{ctx}", gated(&err));
        let meta = std::fs::metadata(&file).unwrap();
        assert_eq!((meta.permissions().mode() & 0o7777, std::fs::read(&file).unwrap() == before), (mode, true), "mode {mode:03o}: the node file was changed");
        if mode == 0o644 {
            // Only reading it, vgpu-smi sees root's container there.
            let root = saturating_for(&s, "root", 3, "root's container");
            let mut smi = gpu_tests::mock_command(&gpu_tests::artifacts().tool("vgpu-smi"), &s, false);
            smi.env("VGPU_NODE_DIR", node_dir(&s)).arg("--json");
            let got = nobody.command(&smi).output().unwrap();
            let text = String::from_utf8_lossy(&got.stdout);
            assert!(got.status.success(), "vgpu-smi as uid {NOBODY}: {}\n{text}\n{}", got.status, String::from_utf8_lossy(&got.stderr));
            let j = common::Json::parse(&text);
            let cs = j.get("devices").arr()[0].get("node_containers").arr().len();
            assert_eq!(cs, 1, "vgpu-smi as uid {NOBODY} on a 0644 node file\n{text}\n{}", root.text());
            root.stop();
        }
    }
}

#[test]
#[serial(mock_gpu_timing)]
fn an_absent_node_dir_changes_nothing() {
    let s = Scratch::new("node-absent");
    let mut c = hooked("test_runtime_launch", &s, None);
    let dir = s.dir.join("no-such-dir");
    c.env("VGPU_NODE_DIR", &dir).env("CUDA_TASK_PRIORITY", "1").args(["--us", "1000", "--seconds", "1"]);
    let out = c.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("node"), "an absent node dir was complained about: {err}");
    assert!(!dir.exists(), "the node dir was created");
}

/// A node directory whose name is not UTF-8 is the one used: the library read the variable as a
/// string, took such a value for unset and went to the default `/tmp/vgpulock` (another
/// directory than the one named, or off without a word; hostile review).
#[test]
#[serial(mock_gpu_timing)]
fn a_node_dir_whose_name_is_not_utf8_is_the_one_used() {
    use std::os::unix::ffi::OsStrExt;
    let s = Scratch::new("node-bytes");
    let dir = s.dir.join(std::ffi::OsStr::from_bytes(b"vgpulock-\xff"));
    std::fs::create_dir(&dir).unwrap();
    let mut c = hooked("test_runtime_launch", &s, None);
    c.env("VGPU_NODE_DIR", &dir).env("CUDA_TASK_PRIORITY", "1").args(["--us", "1000", "--seconds", "1"]);
    let out = c.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let files: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.path()).collect();
    assert!(files.iter().any(|p| p.extension().is_some_and(|x| x == "node")), "no node file in {dir:?}: {files:?}\n{err}");
}

/// The node file deleted (a `/tmp` cleaner, a tenant) or truncated (`: > file`) under a running
/// process: within about a second the path holds a valid file with the process's live entry
/// again, without a line. Before, a deleted file left the process on an unlinked one that no
/// newcomer saw (a silent split of the node's view), and a truncated one was written past its end
/// by the heartbeat into a size every newcomer refused, for good (hostile review).
#[test]
#[serial(mock_gpu_timing)]
fn a_node_file_deleted_or_truncated_under_a_running_process_is_restored() {
    let s = Scratch::new("node-cut");
    let low = saturating_for(&s, "lo", 8, "low priority");
    let file = node_file(&s);
    let uuid = file.file_stem().unwrap().to_str().unwrap().to_owned();
    let restored = || common::poll(Duration::from_millis(1500), || live_entries(&s, &uuid).filter(|v| !v.is_empty()));
    assert!(restored().is_some(), "no live entry to begin with\n{}", low.text());
    std::fs::remove_file(&file).unwrap();
    assert!(restored().is_some(), "deleted: no valid file with a live entry within 1.5 s\n{}", low.text());
    std::fs::OpenOptions::new().write(true).open(&file).unwrap().set_len(0).unwrap();
    assert!(restored().is_some(), "truncated: no valid file with a live entry within 1.5 s ({} bytes)\n{}", std::fs::metadata(&file).map_or(0, |m| m.len()), low.text());
    let (_, err) = low.finish_both(Duration::from_secs(10));
    let lines: Vec<&str> = err.lines().filter(|l| l.contains("node")).collect();
    assert!(lines.is_empty(), "lines about the node file: {lines:?}");
}

/// A container's region file deleted under its running process: the process re-attaches to the
/// file created in its place, where the container's later processes meet it, and its node entry
/// must follow, or the container has two ids on the GPU and takes turns with itself.
#[test]
#[serial(mock_gpu_timing)]
fn a_container_whose_region_file_is_replaced_keeps_one_id() {
    let s = Scratch::new("node-region-moved");
    let first = saturating_for(&s, "lo", 10, "first process");
    let region = s.dir.join("lo.cache");
    std::fs::remove_file(&region).unwrap();
    let back = common::poll(Duration::from_secs(3), || region.exists().then_some(()));
    assert!(back.is_some(), "the region was not created again within 3 s\n{}", first.text());
    let second = saturating_for(&s, "lo", 6, "second process");
    let file = node_file(&s);
    let uuid = file.file_stem().unwrap().to_str().unwrap().to_owned();
    let ids = || live_entries(&s, &uuid).map(|v| v.iter().map(|e| e.container).collect::<Vec<_>>());
    let one = common::poll(Duration::from_secs(4), || ids().filter(|v| v.len() == 2 && v[0] == v[1]));
    assert!(one.is_some(), "live entries' container ids 4 s after the second process began: {:x?}\n{}\n{}", ids(), first.text(), second.text());
    second.stop();
    first.stop();
}

/// A tenant that lies (claims priority 0 with work declared a minute ahead) holds a
/// lower-priority container only while it keeps its heartbeat going; once it stops (frozen,
/// or gone without its lock being released), the others resume within a second.
#[test]
#[serial(mock_gpu_timing)]
fn a_lying_entry_holds_others_only_while_its_heartbeat_goes_on() {
    use vgpu_core::node::{Entry, NodeFile};
    let s = Scratch::new("node-liar");
    let mut low = Bg::spawn(requests(&s, "lo", 1, 1000, 0, 30, &["--print-each"]), "low priority");
    low.wait_line("req=200 ", Duration::from_secs(10));
    let file = node_file(&s);
    let uuid = file.file_stem().unwrap().to_str().unwrap().to_owned();
    let liar = NodeFile::open(&node_dir(&s), &uuid, true).expect("open the node file as a tenant would");
    let now = vgpu_core::clock::now_ns;
    let idx = liar.claim(now()).unwrap().expect("a free entry");
    let lie = |t: u64| Entry { container: 0x11a8, priority: -7, heartbeat_ns: t, active_until_ns: t + 60_000_000_000, pid: 1, ..Entry::default() };
    let until = Instant::now() + Duration::from_millis(2500);
    while Instant::now() < until {
        assert!(liar.write(idx, &lie(now())));
        std::thread::sleep(Duration::from_millis(100));
    }
    let t = Instant::now(); // the heartbeat stops here; the entry stays, its lock held
    let held = low.times_of("req=", t - Duration::from_secs(1), t).len();
    std::thread::sleep(Duration::from_millis(2500));
    let after = low.times_of("req=", t, Instant::now());
    let ctx = low.text();
    let first = after.first().map(|f| f.duration_since(t));
    eprintln!("held: {held} requests in the last second of the lie; first completion {first:?} after its heartbeat stopped; {} in 2.5 s", after.len());
    assert!(held <= 150, "a priority-0 entry with work declared did not hold the low-priority container: {held} requests/s\n{ctx}");
    let first = first.unwrap_or_else(|| panic!("no request completed within 2.5 s of the liar's last heartbeat\n{ctx}"));
    assert!(first <= Duration::from_millis(1000), "a stale lying entry held the low one for {first:?}\n{ctx}");
    assert!(after.len() >= 900, "only {} requests in the 2.5 s after the lie went stale\n{ctx}", after.len());
    drop(liar);
    low.stop();
}

/// `vgpu-smi` of the low-priority container shows both containers of the GPU (table, JSON,
/// Prometheus) with priority, cap and utilization.
#[test]
#[serial(mock_gpu_timing)]
fn vgpu_smi_shows_the_containers_of_the_gpu() {
    use common::{metric_samples, Json};
    let s = Scratch::new("node-smi");
    let high = Bg::spawn(saturating(&s, "hi", 0, 1, &[]), "high priority");
    let mut low = Bg::spawn(saturating(&s, "lo", 1, 10, &[("CUDA_DEVICE_SM_LIMIT", "50")]), "low priority");
    low.wait_line("second=2 ", Duration::from_secs(10));
    let smi = |args: &[&str]| -> String {
        let out = gpu_tests::mock_command(&gpu_tests::artifacts().tool("vgpu-smi"), &s, false)
            .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", s.dir.join("lo.cache"))
            .env("VGPU_NODE_DIR", node_dir(&s))
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "vgpu-smi {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let j = Json::parse(&smi(&["--json"]));
    let cs = j.get("devices").arr()[0].get("node_containers").arr().to_vec();
    let ctx = format!("{cs:?}\n{}\n{}", low.text(), high.text());
    assert_eq!(cs.len(), 2, "{ctx}");
    let (hi, lo) = (&cs[0], &cs[1]);
    assert_eq!((hi.get("priority").num(), hi.get("own"), hi.get("sm_limit_percent")), (0.0, &Json::Bool(false), &Json::Null), "{ctx}");
    assert_eq!((lo.get("priority").num(), lo.get("own"), lo.get("sm_limit_percent").num()), (1.0, &Json::Bool(true), 50.0), "{ctx}");
    assert!(hi.get("utilization_percent").num() > 20.0, "the busy high-priority container shows no utilization: {ctx}");
    let table = smi(&["--count", "1"]);
    assert!(table.contains("Containers on the GPU") && table.contains("(this container)"), "{table}");
    let m = smi(&["--metrics"]);
    let prios: Vec<f64> = metric_samples(&m, "vgpu_node_container_priority").into_iter().map(|(_, v)| v).collect();
    assert_eq!(prios, vec![0.0, 1.0], "{m}");
    assert_eq!(metric_samples(&m, "vgpu_node_container_sm_limit_percent").len(), 2, "{m}");
    low.stop();
    high.stop();
}

/// Mean kernels/s of one saturating container alone on a fresh mock GPU with `env`.
fn alone_rate(env: &[(&str, &str)]) -> f64 {
    let s = Scratch::new("node-alone-rate");
    let mut b = Bg::spawn(saturating(&s, "solo", 1, 1, env), "alone");
    b.wait_line("second=3 ", Duration::from_secs(10));
    let r = mean(&b.rates(Instant::now() - Duration::from_millis(2500), Instant::now()), "alone");
    b.stop();
    r
}

#[test]
#[serial(mock_gpu_timing)]
fn two_capped_containers_take_turns_instead_of_time_slicing() {
    // Two containers of one priority, capped 50 and 50 (then 30 and 60), both saturating with
    // 1 ms kernels. Side by side the GPU time-slices their contexts, and each switch costs GPU
    // time: an H100 ran them at 44.4% of one container's throughput each whatever the caps. The
    // mock charges 150 us per switch. Each must get its cap of the throughput within 3 points,
    // and when the caps add up to 100 the GPU must do at least 95% of one container's work (the
    // issue's "95% busy": a synchronize after each 1 ms kernel leaves the mock's GPU 9% idle
    // even for one container alone, so NVML's figure is printed, not judged). Before the turns:
    // 36.7% and 38.2% at 50/50 (74.9% of the work). On a loaded 2-core machine the alone rate
    // itself swings by 5-10% between runs (789-917/s) and a late wake-up costs a container part
    // of its turn (44.0/44.5% once while a build ran beside it, 47-50% otherwise), so this mock
    // test guards the mechanism with bounds the old behaviour fails by a wide margin: each
    // within 6 points of its cap, and 88% of the work at 50/50. The issue's 3 points and 95% busy
    // are judged on a GPU (`ci/gpu-limiter.sh containers` prints PASS/FAIL). A pair that misses
    // is measured once more, alone rate included, and only a second miss fails: in a clean-clone
    // CI run (session 25, nothing else running) b lost part of its turns for two seconds (334/s
    // against 404-460 the others) beside an alone rate of 922/s and read 42.0% at 50/50, where
    // five runs in a row read 46.8-50.8; time-slicing (the old behaviour) misses every time.
    let switch = [("MOCK_GPU_SWITCH_NS", "150000")];
    let measure = |ca: u32, cb: u32| -> Result<(), String> {
        let base = alone_rate(&switch);
        let s = Scratch::new("node-turns");
        let (ea, eb) = ([switch[0], ("CUDA_DEVICE_SM_LIMIT", &*ca.to_string())], [switch[0], ("CUDA_DEVICE_SM_LIMIT", &*cb.to_string())]);
        let mut a = Bg::spawn(saturating(&s, "a", 1, 1, &ea), "container a");
        let b = Bg::spawn(saturating(&s, "b", 1, 1, &eb), "container b");
        a.wait_line("second=2 ", Duration::from_secs(10));
        let mut w = hooked("nvml_watch", &s, None);
        w.env_remove("LD_PRELOAD").envs(switch).args(["--seconds", "6", "--every-ms", "250"]);
        let t = Instant::now();
        let watched = w.output().expect("nvml_watch");
        let watched = String::from_utf8_lossy(&watched.stdout).to_string();
        let (ra, rb) = (a.rates(t, Instant::now()), b.rates(t, Instant::now()));
        let ctx = format!("{}\n{}\n{watched}", a.text(), b.text());
        let (sa, sb) = (100.0 * mean(&ra, &format!("a\n{ctx}")) / base, 100.0 * mean(&rb, &format!("b\n{ctx}")) / base);
        let busy = field(&watched, "mean_util");
        eprintln!("caps {ca}/{cb}: alone {base:.0}/s; a {sa:.1}%, b {sb:.1}%, GPU {busy:.1}% busy");
        a.stop();
        b.stop();
        if (sa - ca as f64).abs() > 6.0 || (sb - cb as f64).abs() > 6.0 {
            return Err(format!("caps {ca}/{cb}: the containers got {sa:.1}% and {sb:.1}% of one's throughput\n{ctx}"));
        }
        if ca + cb == 100 && sa + sb < 88.0 {
            return Err(format!("caps {ca}/{cb}: the GPU did {:.1}% of one container's work ({busy:.1}% busy)\n{ctx}", sa + sb));
        }
        Ok(())
    };
    for (ca, cb) in [(50, 50), (30, 60)] {
        if let Err(first) = measure(ca, cb) {
            eprintln!("RETRY caps {ca}/{cb} once: {}", first.lines().next().unwrap_or_default());
            if let Err(second) = measure(ca, cb) {
                panic!("twice in a row: {}\nthe first time: {first}", second);
            }
        }
    }
}

/// A lower-priority program that never synchronizes (20 ms kernels, async): its queue is bounded
/// from its first launches, not from the monitor's first tick (it had queued 486 kernels, ~10 s
/// of GPU time, in its first second), and it keeps its share of what the high one leaves.
#[test]
#[serial(mock_gpu_timing)]
fn a_low_priority_program_that_never_synchronizes_is_bounded_from_its_first_launch() {
    let s = Scratch::new("node-async");
    let mut high = Bg::spawn(requests(&s, "hi", 0, 1000, 20000, 8, &[]), "high priority");
    high.wait_line("serving=1", Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(300));
    let mut c = container(&s, "lo", "test_runtime_launch", 1, &[]);
    c.args(["--us", "20000", "--seconds", "0", "--sync-every", "0"]);
    let mut low = Bg::spawn(c, "low priority");
    let first = low.wait_line("second=1 ", Duration::from_secs(10));
    let t = Instant::now();
    sleep_until(t + Duration::from_millis(4000));
    let rates = low.rates(t, Instant::now());
    let text = high.finish(Duration::from_secs(15));
    let ctx = format!("{}\n{text}", low.text());
    let launched = field(&first, "kernels_per_sec");
    eprintln!("low priority, 20 ms kernels never synchronized: {launched:.0} launched in its first second, then {rates:?}/s");
    // 50 kernels of 20 ms fill a second; a few more may be queued within the bound.
    assert!(launched <= 60.0, "{launched:.0} kernels of 20 ms launched in the first second: the queue was not bounded\n{ctx}");
    let rate = mean(&rates, &format!("low rates\n{ctx}"));
    assert!(rate >= 0.8 * 50.0 * 0.95, "the low-priority program ran {rate:.1} kernels/s beside a 5%-busy high one (50/s alone)\n{ctx}");
    low.stop();
}

/// Each process's entry says what the process itself did (`node::own_activity`): an idle process
/// of a busy container must not look busy, or it would keep the container's working process at
/// libcuda's timeslice beside a higher-priority one (`node::may_shorten`).
#[test]
#[serial]
fn an_idle_process_of_a_busy_container_writes_no_work_into_its_entry() {
    use vgpu_core::node::{parse, Slot, RECENT_NS};
    let s = Scratch::new("node-idle-sibling");
    // One container (one region): a capped (so gated) saturating process, and one that ran
    // requests for a second and then idles, alive.
    let cap = [("CUDA_DEVICE_SM_LIMIT", "50")];
    let mut busy = Bg::spawn(saturating(&s, "lo", 1, 1, &cap), "busy process");
    busy.wait_line("second=1 ", Duration::from_secs(10));
    let mut idle = container(&s, "lo", "test_requests", 1, &cap);
    idle.args(["--us", "1000", "--gap-us", "1000", "--seconds", "1", "--idle-seconds", "8"]);
    let mut idle = Bg::spawn(idle, "idle process");
    idle.wait_line("idle=1", Duration::from_secs(15));
    // Past the 2 s its utilization may follow its last launch, and past RECENT_NS.
    std::thread::sleep(Duration::from_millis(2600));
    let bytes = std::fs::read(node_file(&s)).unwrap();
    let now = vgpu_core::clock::now_ns();
    let entries: Vec<_> = parse(&bytes).unwrap().into_iter().filter_map(|x| if let Slot::Used(e) = x { Some(e) } else { None }).collect();
    let ctx = format!("{entries:?}\n{}\n{}", busy.text(), idle.text());
    let of = |pid: i32| entries.iter().find(|e| e.pid == pid as u32).copied().unwrap_or_else(|| panic!("no entry of pid {pid}\n{ctx}"));
    let (b, i) = (of(busy.pid()), of(idle.pid()));
    assert_eq!((b.container, b.cap), (i.container, 50), "one capped container\n{ctx}");
    assert!(now.saturating_sub(b.last_launch_ns) <= RECENT_NS && b.util_centi > 0, "the busy process shows its work\n{ctx}");
    assert!(now.saturating_sub(i.last_launch_ns) > RECENT_NS, "the idle process shows a recent launch (its container's)\n{ctx}");
    assert_eq!(i.util_centi, 0, "the idle process shows its container's utilization\n{ctx}");
    idle.stop();
    busy.stop();
}

/// A kernel that runs for seconds after its launch is still work: the process's entry keeps
/// saying so (the monitor dates it while the gate has launches pending), or a peer beside a
/// higher priority would take it for idle and run the short timeslice beside it.
#[test]
#[serial]
fn a_long_kernel_keeps_its_process_entry_busy_after_the_launch() {
    use vgpu_core::node::{parse, Slot, RECENT_NS};
    let s = Scratch::new("node-long-kernel");
    // A higher-priority container on the GPU (idle) gates the lower one's launches.
    let mut high = Bg::spawn(requests(&s, "hi", 0, 1000, 1000, 1, &["--idle-seconds", "15"]), "high priority");
    high.wait_line("idle=1", Duration::from_secs(15));
    let mut long = container(&s, "lo", "test_streams", 1, &[]);
    long.args(["--us", "3000000", "--seconds", "1", "--sync-every", "1"]);
    let long = Bg::spawn(long, "3 s kernels");
    std::thread::sleep(Duration::from_millis(2300));
    let bytes = std::fs::read(node_file(&s)).unwrap();
    let now = vgpu_core::clock::now_ns();
    let e = parse(&bytes).unwrap().into_iter().find_map(|x| match x {
        Slot::Used(e) if e.pid == long.pid() as u32 => Some(e),
        _ => None,
    });
    let ctx = format!("{e:?}\n{}\n{}", long.text(), high.text());
    let e = e.unwrap_or_else(|| panic!("no entry of the long-kernel process\n{ctx}"));
    assert!(e.last_launch_ns != 0 && now.saturating_sub(e.last_launch_ns) <= RECENT_NS, "2.3 s into a 3 s kernel its entry looks idle\n{ctx}");
    long.stop();
    high.stop();
}

/// The soft cap through the node view (issue 14: caps work-conserving without HAMi's monitor):
/// a container capped 15 with a soft cap of 60 runs at its soft cap while no other container of
/// the node has work, at most at its hard cap while one has, and at its soft cap again within a few
/// seconds of that neighbour going idle (still alive, still in the node file). The neighbour is
/// uncapped, one 1 ms request at a time: it takes the whole GPU's share, so nothing is left above
/// the hard cap (the GPU itself would give the soft-capped one about 42%). The neighbour's
/// kernels also delay its own, so beside it only an upper bound is judged. Tolerances as
/// control.rs's share tests (±10 points on a loaded 2-core machine).
#[test]
#[serial(mock_gpu_timing)]
fn the_soft_cap_gives_way_while_another_container_works_and_comes_back_after() {
    let base = alone_rate(&[]);
    let s = Scratch::new("node-soft");
    let mut a = Bg::spawn(saturating(&s, "a", 1, 1, &[("CUDA_DEVICE_SM_LIMIT", "15"), ("CUDA_CORE_SOFT_LIMIT", "60")]), "soft-capped");
    a.wait_line("second=3 ", Duration::from_secs(10));
    let share = |r: Vec<f64>, what: &str, ctx: &str| 100.0 * mean(&r, &format!("{what}\n{ctx}")) / base;
    let alone = share(a.rates(Instant::now() - Duration::from_millis(2500), Instant::now()), "a alone", &a.text());
    // The neighbour: 1 ms requests back to back for 5 s, then idle but alive.
    let mut b = Bg::spawn(requests(&s, "b", 1, 1000, 0, 5, &["--idle-seconds", "8"]), "neighbour");
    let (during, after) = busy_then_idle(&a, &mut b, Duration::from_millis(2500), Duration::from_millis(5000));
    let ctx = format!("{}\n{}", a.text(), b.text());
    let (during, after) = (share(during, "a beside the working neighbour", &ctx), share(after, "a after the neighbour went idle", &ctx));
    eprintln!("alone {base:.0}/s; soft-capped container: {alone:.1}% alone, {during:.1}% beside a working neighbour, {after:.1}% after it went idle");
    assert!((alone - 60.0).abs() <= 10.0, "hard cap 15, soft cap 60, alone on the GPU: {alone:.1}% of the uncapped rate\n{ctx}");
    assert!(during <= 25.0, "hard cap 15, soft cap 60, beside a container with work: {during:.1}%\n{ctx}");
    assert!((after - 60.0).abs() <= 10.0, "hard cap 15, soft cap 60, after the neighbour went idle: {after:.1}%\n{ctx}");
    b.stop();
    a.stop();
}

/// Soft caps share what the hard caps leave (issue 14: work-conserving caps): two containers of
/// one priority, each capped 25 with a soft cap of 60, both saturating, get half the GPU each
/// (their turns and their caps both follow `policy::caps::soft_shares`), where the rule "the soft
/// cap only while nobody else has work" held them at 25 each and left half the GPU idle.
/// Bounds for a loaded 2-core machine, where one container's own rate swings 5-10% between runs:
/// each at least 38 (the old rule gives 25), within 12 points of each other, 85% of one
/// container's work together (the old rule: 50%). A CI run once gave 41.3 / 52.0 (a's rate fell
/// by a fifth for three seconds, b's did not): not explained; the GPU check is
/// `ci/gpu-limiter.sh soft` (each within 3 points of 50).
#[test]
#[serial(mock_gpu_timing)]
fn two_soft_capped_containers_share_what_their_hard_caps_leave() {
    let caps: &[(&str, &str)] = &[("CUDA_DEVICE_SM_LIMIT", "25"), ("CUDA_CORE_SOFT_LIMIT", "60")];
    let (shares, ctx) = side_by_side("node-soft-two", &[("a", caps), ("b", caps)]);
    let (sa, sb) = (shares[0], shares[1]);
    eprintln!("two containers capped 25, soft 60: a {sa:.1}%, b {sb:.1}%");
    assert!(sa >= 38.0 && sb >= 38.0 && (sa - sb).abs() <= 12.0, "each should get about half the GPU: {sa:.1}% and {sb:.1}%\n{ctx}");
    assert!(sa + sb >= 85.0, "together {:.1}% of one container's work\n{ctx}", sa + sb);
}

/// A tenant the node file does not see (no node directory mounted for it, a full file, a
/// process not under libvgpu) keeps its hard cap: the containers in the file share a spare only
/// while NVML lists no compute process beyond their entries. Two containers in the file capped 20
/// with soft caps of 100, beside one capped 60 outside it (the hard caps add up to 100): sharing
/// the spare among the two took the outside one to 39-42% (a review's run); the rule without a
/// node file keeps it at about 56%.
#[test]
#[serial(mock_gpu_timing)]
fn a_tenant_outside_the_node_file_keeps_its_hard_cap() {
    let soft: &[(&str, &str)] = &[("CUDA_DEVICE_SM_LIMIT", "20"), ("CUDA_CORE_SOFT_LIMIT", "100")];
    let outside: &[(&str, &str)] = &[("CUDA_DEVICE_SM_LIMIT", "60"), ("VGPU_NODE_DIR", "")];
    let (shares, ctx) = side_by_side("node-outside", &[("c", outside), ("a", soft), ("b", soft)]);
    let (sc, sa, sb) = (shares[0], shares[1], shares[2]);
    eprintln!("a {sa:.1}%, b {sb:.1}% (20, soft 100, in the file); c {sc:.1}% (60, outside it)");
    assert!(sc >= 50.0, "the container outside the node file, capped 60, got {sc:.1}%\n{ctx}");
    assert!(sa <= 30.0 && sb <= 30.0, "the containers in the file took a spare that was not there: {sa:.1}%, {sb:.1}%\n{ctx}");
}

/// Saturating containers (name, env) side by side on one mock GPU for 3 s after the first one's
/// fourth second: each one's share of one container's rate alone, and their output.
fn side_by_side(tag: &str, containers: &[(&str, &[(&str, &str)])]) -> (Vec<f64>, String) {
    let base = alone_rate(&[]);
    let s = Scratch::new(tag);
    let mut run: Vec<Bg> = containers.iter().map(|(name, env)| Bg::spawn(saturating(&s, name, 1, 1, env), name)).collect();
    run[0].wait_line("second=4 ", Duration::from_secs(10));
    let t = Instant::now();
    sleep_until(t + Duration::from_millis(3000));
    let now = Instant::now();
    let ctx = run.iter().map(Bg::text).collect::<Vec<_>>().join("\n");
    let shares = run.iter().zip(containers).map(|(b, (name, _))| 100.0 * mean(&b.rates(t, now), &format!("{name}\n{ctx}")) / base).collect();
    eprintln!("alone {base:.0}/s");
    for b in run {
        b.stop();
    }
    (shares, ctx)
}

/// The last `lingers=` of the hook's debug lines (0 when it printed none: no gate, no linger).
fn lingers(stderr: &str) -> u64 {
    stderr.lines().rev().find_map(|l| l.split_whitespace().find_map(|kv| kv.strip_prefix("lingers="))).map_or(0, |v| v.parse().unwrap())
}

/// The launches the gate saw, from the hook's last debug line.
fn gated(stderr: &str) -> u64 {
    stderr.lines().rev().find_map(|l| l.split_whitespace().find_map(|kv| kv.strip_prefix("gated="))).map_or(0, |v| v.parse().unwrap())
}

/// A `test_requests` service at priority 0 (500-us requests 20 ms apart, 5 ms lingers, debug
/// log): its stdout and stderr. With `--random` (exponential pauses) about a fifth of its
/// requests come within a spin, so it lingers; with fixed pauses none does, so it does not.
fn lingering_service(s: &Scratch, env: &[(&str, &str)], args: &[&str]) -> (String, String) {
    // The caller's env last: it may turn the linger off.
    let mut all = vec![("VGPU_PRIORITY_LINGER_US", "5000"), ("LIBCUDA_LOG_LEVEL", "4")];
    all.extend_from_slice(env);
    let mut c = container(s, "hi", "test_requests", 0, &all);
    c.args(["--us", "500", "--gap-us", "20000", "--seconds", "3"]).args(args);
    let out = c.output().unwrap();
    let (o, e) = (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    assert!(out.status.success(), "the service failed: {}\n{o}\n{e}", out.status);
    (o, e)
}

/// Issue 14's linger: beside a lower priority, a priority-0 service queues a spin after each
/// stream synchronize (one thread on a stream of the hook's own, ended by a word it moves), and a
/// context synchronize does not wait for it: the hook moves the word first. The spin is the
/// service's work to the lower priority, which holds while it runs. A synchronize with no launch
/// since the last spin queues none. A context synchronize is answered with events on every
/// stream, the spin queued behind them. Alone, or under a hard cap, it queues none. The
/// service's pauses are random: about a fifth of its requests come within a spin, which pays.
#[test]
#[serial(mock_gpu_timing)]
fn a_service_lingers_beside_a_lower_priority_and_its_context_synchronize_does_not_wait() {
    let s = Scratch::new("node-linger");
    let stream_waits: &[&str] = &["--ctx-sync", "--extra-syncs", "3", "--random"];
    let (_, alone) = lingering_service(&s, &[], stream_waits);
    // The hook says so at its first spin (info), gated or not.
    assert!(!alone.contains("spins of"), "alone on the GPU, the service lingered\n{alone}");
    let mut low = low_priority_running(&s, 1);
    let (out, err) = lingering_service(&s, &[], stream_waits);
    let n = lingers(&err);
    assert!(err.contains("linger: 1 spins of 5000 us queued"), "no first-spin line\n{err}");
    let p90 = field(&out, "ctx_sync_p90_us");
    eprintln!("beside a lower priority: {n} lingers; context synchronize p90 {p90:.0} us (a linger runs 5000 us)");
    let requests = field(&out, "requests") as u64;
    assert!(n >= 20, "the service lingered {n} times in {requests} requests\n{out}\n{err}");
    // Each request's three more synchronizes have nothing new to wait for: no spin each.
    assert!(n <= requests + 5, "the service lingered {n} times in {requests} requests (its extra synchronizes lingered)\n{err}");
    assert!(p90 < 2500.0, "a context synchronize waited {p90:.0} us (p90) for the service's 5 ms lingers\n{out}");
    // Not suspended, no spin is held back (`withheld_spins` counts only the gate's holds).
    assert_eq!(field(&err, "withheld_spins"), 0.0, "spins were held back with nothing holding the gate\n{err}");
    // Each spin goes through the gate, as the program's launches do (lower priorities see it
    // as the service's work): the same service without spins launches `per` a request.
    let (out_off, err_off) = lingering_service(&s, &[("VGPU_PRIORITY_LINGER_US", "0")], stream_waits);
    assert_eq!(lingers(&err_off), 0, "VGPU_PRIORITY_LINGER_US=0 lingered\n{err_off}");
    let per = gated(&err_off) as f64 / field(&out_off, "requests");
    let own = per * requests as f64;
    let spins = gated(&err) as f64 - own;
    eprintln!("gated launches: {per:.2} a request without spins; {spins:.0} more with {n} spins");
    assert!(spins >= n as f64 * 0.9 - 5.0, "{n} spins but {spins:.0} gated launches beyond the service's own {own:.0}: the spins bypassed the gate\n{err}");
    // A service that waits by context synchronize lingers too: the hook answers the synchronize
    // with events on its streams and queues the spin behind them. Each request also runs a
    // 1.5-ms kernel on a second, non-blocking stream of the program's: every synchronize must
    // wait for it (a real one would), and none for the 5-ms spin.
    let (out, err) = lingering_service(&s, &[], &["--ctx-only", "--side-us", "1500", "--random"]);
    let (n, requests) = (lingers(&err), field(&out, "requests"));
    let answered = field(&err, "answered_ctx_syncs");
    eprintln!("context-synchronizing service: {n} lingers, {answered} answered, in {requests} requests; latency p50 {} p90 {} us", field(&out, "lat_p50_us"), field(&out, "lat_p90_us"));
    assert!(n as f64 >= 0.8 * requests && n as f64 <= requests + 5.0, "a context-synchronizing service lingered {n} times in {requests} requests\n{err}");
    assert!(answered >= 0.8 * requests, "{answered} context synchronizes answered with events in {requests} requests\n{err}");
    assert_eq!(field(&out, "side_unfinished"), 0.0, "a context synchronize returned before the second stream's kernel completed\n{out}");
    // A synchronize that waited for the spin it queued would take 5 ms more, every request: the
    // median is over 5 ms then (7 on the mock), and 2.2-3.8 ms otherwise, a loaded 2-core
    // machine included, where the tail reads 4-9 ms without any wait for a spin.
    let p50 = field(&out, "lat_p50_us");
    assert!(p50 < 5000.0, "a context-synchronizing request took {p50:.0} us (median): it waited for the 5-ms spin it queued\n{out}");
    // The second stream destroyed right after its launch each request: its kernel still runs,
    // and every context synchronize still waits for it.
    let (out, _) = lingering_service(&s, &[], &["--ctx-only", "--side-us", "1500", "--side-destroy", "--random"]);
    assert_eq!(field(&out, "side_early"), 0.0, "a context synchronize returned before a destroyed stream's kernel could have ended\n{out}");
    // The second stream made with the cuStreamCreate that cuGetProcAddress hands out, which this
    // driver gives at an internal address (MOCK_CUDA_INTERNAL_PROCS): the hook does not see the
    // stream made, only launches on it. Every context synchronize still waits for its kernel.
    let unseen = [("MOCK_CUDA_INTERNAL_PROCS", "cuStreamCreate")];
    let (out, err) = lingering_service(&s, &unseen, &["--ctx-only", "--side-us", "1500", "--side-procaddr", "--random"]);
    assert!(err.contains("passed through"), "the stream was made through the hook, not around it\n{err}");
    assert!(err.contains("a launch on a stream the hook did not see made"), "the hook did not say why its list is incomplete\n{err}");
    assert_eq!(field(&out, "side_unfinished"), 0.0, "a context synchronize returned before the unseen stream's kernel completed\n{out}");
    assert_eq!(field(&out, "side_early"), 0.0, "a context synchronize returned before the unseen stream's kernel could have ended\n{out}");
    // A stream that once waited on the GPU for a value: such a wait could hang behind the legacy
    // stream's record, so every context synchronize is the driver's own.
    let (_, err) = lingering_service(&s, &[], &["--ctx-only", "--wait-value", "--random"]);
    assert_eq!(field(&err, "answered_ctx_syncs"), 0.0, "a context synchronize was answered after a GPU-side wait on a value\n{err}");
    let (_, capped) = lingering_service(&s, &[("CUDA_DEVICE_SM_LIMIT", "90")], stream_waits);
    assert!(!capped.contains("spins of"), "under a hard cap the service lingered\n{capped}");
    assert!(low.alive(), "the low-priority container died\n{}", low.text());
    low.stop();
}

/// A linger pays only where the next request can come while it runs. A service whose requests
/// come 20 ms apart, never sooner, never finds its 5-ms spin still running (reading its result
/// back right after the synchronize is not a next request): it queues none, and its context
/// synchronizes are the driver's own (each spin would take the GPU from the lower
/// priority for nothing: on an H200 a priority-0 process with 1.5 ms between 1-ms kernels left
/// its two lower-priority neighbours 37% of the GPU with 300-us spins, 58% without; session 29).
#[test]
#[serial(mock_gpu_timing)]
fn a_service_whose_next_request_comes_after_the_linger_does_not_linger() {
    let s = Scratch::new("node-linger-late");
    let mut low = low_priority_running(&s, 1);
    // Each request's result read back right after its synchronize (a copy, not a next request).
    let (out, err) = lingering_service(&s, &[], &["--ctx-sync", "--readback"]);
    let (n, requests) = (lingers(&err), field(&out, "requests"));
    let gaps = field(&err, "linger_gaps");
    eprintln!("requests 20 ms apart, read back, 5-ms lingers: {n} spins in {requests} requests, {gaps} gaps noted");
    assert!(requests >= 50.0, "too few requests\n{out}");
    // The service could have lingered: the hook timed its gaps.
    assert!(gaps >= 0.8 * requests, "{gaps} gaps noted in {requests} requests: the service was not lingering-capable\n{err}");
    assert_eq!(n, 0, "the service lingered {n} times in {requests} requests, none of which came within the linger\n{err}");
    let (_, err) = lingering_service(&s, &[], &["--ctx-only"]);
    assert_eq!(field(&err, "answered_ctx_syncs"), 0.0, "context synchronizes were answered (each with a spin) where none pays\n{err}");
    assert!(low.alive(), "the low-priority container died\n{}", low.text());
    low.stop();
}

/// A lingering service whose container is suspended between a launch and its synchronize: the
/// synchronize returns once the request's work is done, not at the resume. Its spin would wait
/// in the gate like a launch (suspended): none is queued then.
#[test]
#[serial(mock_gpu_timing)]
fn a_suspended_lingering_service_synchronizes_without_waiting_for_the_resume() {
    let s = Scratch::new("node-linger-suspend");
    let mut low = low_priority_running(&s, 1);
    let mut c = container(&s, "hi", "test_requests", 0, &[("VGPU_PRIORITY_LINGER_US", "5000"), ("LIBCUDA_LOG_LEVEL", "4")]);
    // Each request: a 500-us kernel, 400 ms of host pause, then its stream synchronize; the next
    // launched 1 ms after it returns, within the spin (so the spin pays).
    c.args(["--us", "500", "--gap-us", "1000", "--pause-us", "400000", "--seconds", "3", "--print-each"]);
    let mut hi = Bg::spawn(c, "service");
    // Five requests first: a spin pays from the third quick gap on (2% of the gaps' weight,
    // `policy::linger::spin_pays`). Suspended after two, the synchronize under suspension tried
    // no spin (withheld_spins=0, quick_gap_pct 1.6) and the rest of this test still passed.
    hi.wait_line("req=5 ", Duration::from_secs(10));
    // Request 6 is launched about 1 ms later and synchronizes 400 ms after its launch.
    std::thread::sleep(Duration::from_millis(150));
    let region = s.dir.join("hi.cache");
    let region = region.to_str().unwrap();
    common::tool(&s, "shrreg-tool", &["--file", region, "--suspend"]);
    std::thread::sleep(Duration::from_millis(1500));
    common::tool(&s, "shrreg-tool", &["--file", region, "--resume"]);
    let (out, err) = hi.finish_both(Duration::from_secs(20));
    // It lingered (its requests before the suspension), and under the suspension the gate held
    // a spin back: the path that could wait was taken.
    assert!(lingers(&err) >= 1, "the service did not linger\n{err}");
    assert!(field(&err, "withheld_spins") >= 1.0, "no spin was held back under the suspension: the synchronize did not take the spin's path\n{err}");
    let syncs: Vec<f64> = out.lines().filter(|l| l.starts_with("req=")).map(|l| field(l, "sync_us")).collect();
    let worst = syncs.iter().cloned().fold(0.0, f64::max);
    eprintln!("synchronizes of {} requests, the longest {worst:.0} us", syncs.len());
    assert!(syncs.len() >= 3, "too few requests\n{out}");
    assert!(worst < 300_000.0, "a synchronize took {worst:.0} us: it waited for the resume (1.5 s suspended)\n{out}");
    assert!(low.alive(), "the low-priority container died\n{}", low.text());
    low.stop();
}
