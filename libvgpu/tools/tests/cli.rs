//! CLI tests of shrreg-tool and vgpu-smi against region files made through vgpu-core (no GPU).

use assert_cmd::Command;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use vgpu_core::region::{MemKind, Region, RegionInit};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
static N: AtomicUsize = AtomicUsize::new(0);

struct Tmp(PathBuf);
impl Tmp {
    fn new() -> Tmp {
        let n = N.fetch_add(1, Ordering::Relaxed);
        Tmp(std::env::temp_dir().join(format!("vgpu-tools-{}-{n}.cache", std::process::id())))
    }
}
impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn init() -> RegionInit {
    let mut i = RegionInit { device_num: 2, uuids: vec!["GPU-1111".into(), "GPU-\"q\"".into()], ..Default::default() };
    i.physical = [16 * GIB; 16];
    i.mem_limits[0] = Some(4 * GIB);
    i.sm_limits[1] = Some(30);
    i
}

/// A region with one live process (this test's handle) using memory on device 0.
fn populated(p: &Path) -> Region {
    let r = Region::open(p, &init()).unwrap();
    let s = r.register(4242).unwrap();
    r.try_reserve(s, 0, MemKind::Context, 512 * MIB).unwrap();
    r.try_reserve(s, 0, MemKind::Data, GIB).unwrap();
    r.set_proc_sm_util(s, 0, 42);
    r
}

fn tool(bin: &str) -> Command {
    let mut c = Command::cargo_bin(bin).unwrap();
    c.env_remove("CUDA_DEVICE_MEMORY_SHARED_CACHE");
    c
}

fn stdout(a: &assert_cmd::assert::Assert) -> String {
    String::from_utf8(a.get_output().stdout.clone()).unwrap()
}

fn stderr(a: &assert_cmd::assert::Assert) -> String {
    String::from_utf8(a.get_output().stderr.clone()).unwrap()
}

#[test]
fn print_shows_devices_limits_processes() {
    let t = Tmp::new();
    let _r = populated(&t.0);
    let a = tool("shrreg-tool").args(["--file", t.0.to_str().unwrap(), "--print"]).assert().success();
    let out = stdout(&a);
    assert!(out.contains("device 0: uuid GPU-1111  memory limit 4.00GiB  used 1.50GiB"), "{out}");
    assert!(out.contains("device 1:") && out.contains("sm limit 30%"), "{out}");
    assert!(out.contains("pid 4242") && out.contains("sm util 42%"), "{out}");
    assert!(out.contains("running"), "{out}");
}

#[test]
fn path_from_env() {
    let t = Tmp::new();
    let _r = populated(&t.0);
    let a = tool("shrreg-tool").env("CUDA_DEVICE_MEMORY_SHARED_CACHE", &t.0).arg("--print").assert().success();
    assert!(stdout(&a).contains("pid 4242"));
}

#[test]
fn suspend_resume() {
    let t = Tmp::new();
    let r = populated(&t.0);
    let f = t.0.to_str().unwrap();
    tool("shrreg-tool").args(["--file", f, "--suspend"]).assert().success();
    assert!(r.suspended());
    let a = tool("shrreg-tool").args(["--file", f, "--print"]).assert().success();
    assert!(stdout(&a).contains("SUSPENDED"));
    tool("shrreg-tool").args(["--file", f, "--resume"]).assert().success();
    assert!(!r.suspended());
}

#[test]
fn set_limits() {
    let t = Tmp::new();
    let r = populated(&t.0);
    let f = t.0.to_str().unwrap();
    let e = r.limits_epoch();
    tool("shrreg-tool").args(["--file", f, "--set-sm-limit", "0", "25"]).assert().success();
    assert_eq!(r.sm_limit(0), Some(25));
    tool("shrreg-tool").args(["--file", f, "--set-sm-limit", "1", "100"]).assert().success();
    assert_eq!(r.sm_limit(1), None);
    tool("shrreg-tool").args(["--file", f, "--set-mem-limit", "1", "2g"]).assert().success();
    assert_eq!(r.limit(1), Some(2 * GIB));
    tool("shrreg-tool").args(["--file", f, "--set-mem-limit", "1", "50%"]).assert().success();
    assert_eq!(r.limit(1), Some(8 * GIB));
    tool("shrreg-tool").args(["--file", f, "--set-mem-limit", "1", "0"]).assert().success();
    assert_eq!(r.limit(1), None);
    // below current use: accepted, nothing freed, new allocations refused
    let a = tool("shrreg-tool").args(["--file", f, "--set-mem-limit", "0", "1g"]).assert().success();
    assert!(stdout(&a).contains("refused"), "{}", stdout(&a));
    assert_eq!(r.device_used(0), 1536 * MIB);
    let s = r.live_slots().next().unwrap();
    assert!(r.try_reserve(s, 0, MemKind::Data, 1).is_err());
    assert!(r.limits_epoch() > e);
    // several actions in one run
    tool("shrreg-tool").args(["--file", f, "--suspend", "--set-sm-limit", "0", "60", "--print"]).assert().success();
    assert!(r.suspended() && r.sm_limit(0) == Some(60));
}

#[test]
fn error_paths() {
    let t = Tmp::new();
    let f = t.0.to_str().unwrap().to_string();
    // missing region
    for args in [vec!["--print"], vec!["--suspend"], vec!["--set-sm-limit", "0", "5"]] {
        let a = tool("shrreg-tool").args(["--file", &f]).args(&args).assert().code(1);
        let e = stderr(&a);
        assert!(e.contains("does not exist") && e.lines().count() == 1, "{e}");
    }
    let _r = populated(&t.0);
    for (args, needle) in [
        (vec!["--set-sm-limit", "16", "5"], "the region has 2 device(s)"),
        (vec!["--set-sm-limit", "x", "5"], "invalid device index"),
        (vec!["--set-sm-limit", "0", "101"], "invalid SM limit"),
        (vec!["--set-sm-limit", "0", "-1"], "invalid SM limit"),
        (vec!["--set-mem-limit", "0", "12x"], "invalid size \"12x\""),
        (vec!["--set-mem-limit", "-1", "1g"], "invalid device index"),
    ] {
        let a = tool("shrreg-tool").args(["--file", &f]).args(&args).assert().code(1);
        let e = stderr(&a);
        assert!(e.contains(needle) && e.lines().count() == 1, "{args:?}: {e}");
    }
    // usage errors
    tool("shrreg-tool").args(["--file", &f]).assert().code(2);
    tool("shrreg-tool").args(["--bogus"]).assert().code(2);
    tool("shrreg-tool").args(["--set-sm-limit", "0"]).assert().code(2);
    tool("shrreg-tool").args(["--help"]).assert().success();
    // corrupt file
    let t2 = Tmp::new();
    std::fs::write(&t2.0, b"garbage").unwrap();
    let a = tool("shrreg-tool").args(["--file", t2.0.to_str().unwrap(), "--print"]).assert().code(1);
    assert!(stderr(&a).contains("invalid"), "{}", stderr(&a));
    let a = tool("vgpu-smi").args(["--file", t2.0.to_str().unwrap()]).assert().code(1);
    assert!(stderr(&a).contains("invalid"));
    assert_eq!(std::fs::read(&t2.0).unwrap(), b"garbage", "tools never repair");
}

#[test]
fn create_new_and_version() {
    let t = Tmp::new();
    let f = t.0.to_str().unwrap();
    tool("shrreg-tool")
        .args(["--file", f, "--create_new"])
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "3000m")
        .env("CUDA_DEVICE_SM_LIMIT", "40")
        .assert()
        .success();
    let r = Region::open_existing(&t.0).unwrap();
    assert_eq!(r.limit(0), Some(3000 * MIB));
    assert_eq!(r.sm_limit(0), Some(40));
    assert_eq!(r.device_num(), 1, "a global SM cap invented devices");
    drop(r);
    // a global cap alone: one device, not sixteen
    let t2 = Tmp::new();
    tool("shrreg-tool").args(["--file", t2.0.to_str().unwrap(), "--create_new"]).env("CUDA_DEVICE_MEMORY_LIMIT", "1g").assert().success();
    assert_eq!(Region::open_existing(&t2.0).unwrap().device_num(), 1);
    let a = tool("shrreg-tool").args(["--file", f, "--version"]).assert().success();
    assert!(stdout(&a).contains("layout 1.2"), "{}", stdout(&a));
    // refused while a live process uses the region
    let _live = populated(&t.0);
    let a = tool("shrreg-tool").args(["--file", f, "--create_new"]).assert().code(1);
    assert!(stderr(&a).contains("live processes"), "{}", stderr(&a));
}

#[test]
fn read_only_file_prints() {
    // SAFETY: trivial syscall.
    if unsafe { libc::geteuid() } == 0 {
        return; // root ignores file modes
    }
    let t = Tmp::new();
    drop(Region::create_new(&t.0, &init()).unwrap());
    std::fs::set_permissions(&t.0, std::os::unix::fs::PermissionsExt::from_mode(0o444)).unwrap();
    tool("shrreg-tool").args(["--file", t.0.to_str().unwrap(), "--print"]).assert().success();
    tool("vgpu-smi").args(["--file", t.0.to_str().unwrap()]).assert().success();
    let a = tool("shrreg-tool").args(["--file", t.0.to_str().unwrap(), "--suspend"]).assert().code(1);
    assert!(stderr(&a).contains("permission denied"));
}

#[test]
fn smi_table() {
    let t = Tmp::new();
    let _r = populated(&t.0);
    let a = tool("vgpu-smi").args(["--file", t.0.to_str().unwrap()]).assert().success();
    let out = stdout(&a);
    assert!(out.contains("GPU-1111") && out.contains("1536MiB / 4096MiB"), "{out}");
    assert!(out.contains("4242"), "{out}");
    assert!(out.contains("unlimited"), "{out}");
}

// ---------- a minimal JSON parser, to check structure ----------

#[derive(Debug, PartialEq)]
enum J {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<J>),
    Obj(Vec<(String, J)>),
}

impl J {
    fn get(&self, k: &str) -> &J {
        match self {
            J::Obj(m) => &m.iter().find(|(kk, _)| kk == k).unwrap_or_else(|| panic!("no key {k}")).1,
            _ => panic!("not an object"),
        }
    }
    fn arr(&self) -> &Vec<J> {
        match self {
            J::Arr(a) => a,
            _ => panic!("not an array"),
        }
    }
    fn num(&self) -> f64 {
        match self {
            J::Num(n) => *n,
            _ => panic!("not a number: {self:?}"),
        }
    }
}

struct P<'a>(&'a [u8], usize);

impl P<'_> {
    fn ws(&mut self) {
        while self.1 < self.0.len() && b" \t\r\n".contains(&self.0[self.1]) {
            self.1 += 1;
        }
    }
    fn eat(&mut self, s: &str) -> Result<(), String> {
        if self.0[self.1..].starts_with(s.as_bytes()) {
            self.1 += s.len();
            Ok(())
        } else {
            Err(format!("expected {s} at {}", self.1))
        }
    }
    fn value(&mut self) -> Result<J, String> {
        self.ws();
        let c = *self.0.get(self.1).ok_or("eof")?;
        let v = match c {
            b'n' => self.eat("null").map(|_| J::Null)?,
            b't' => self.eat("true").map(|_| J::Bool(true))?,
            b'f' => self.eat("false").map(|_| J::Bool(false))?,
            b'"' => J::Str(self.string()?),
            b'[' => {
                self.1 += 1;
                let mut a = Vec::new();
                self.ws();
                if self.eat("]").is_err() {
                    loop {
                        a.push(self.value()?);
                        self.ws();
                        if self.eat(",").is_ok() {
                            continue;
                        }
                        self.eat("]")?;
                        break;
                    }
                }
                J::Arr(a)
            }
            b'{' => {
                self.1 += 1;
                let mut m = Vec::new();
                self.ws();
                if self.eat("}").is_err() {
                    loop {
                        self.ws();
                        let k = self.string()?;
                        self.ws();
                        self.eat(":")?;
                        m.push((k, self.value()?));
                        self.ws();
                        if self.eat(",").is_ok() {
                            continue;
                        }
                        self.eat("}")?;
                        break;
                    }
                }
                J::Obj(m)
            }
            _ => {
                let start = self.1;
                while self.1 < self.0.len() && b"+-0123456789.eE".contains(&self.0[self.1]) {
                    self.1 += 1;
                }
                let s = std::str::from_utf8(&self.0[start..self.1]).unwrap();
                J::Num(s.parse().map_err(|_| format!("bad number {s:?}"))?)
            }
        };
        Ok(v)
    }
    fn string(&mut self) -> Result<String, String> {
        self.eat("\"")?;
        let mut out = String::new();
        loop {
            let c = *self.0.get(self.1).ok_or("eof in string")?;
            self.1 += 1;
            match c {
                b'"' => return Ok(out),
                b'\\' => {
                    let e = *self.0.get(self.1).ok_or("eof")?;
                    self.1 += 1;
                    match e {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'n' => out.push('\n'),
                        b't' => out.push('\t'),
                        b'r' => out.push('\r'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'u' => {
                            let h = std::str::from_utf8(&self.0[self.1..self.1 + 4]).unwrap();
                            out.push(char::from_u32(u32::from_str_radix(h, 16).map_err(|e| e.to_string())?).unwrap());
                            self.1 += 4;
                        }
                        _ => return Err("bad escape".into()),
                    }
                }
                c if c < 0x20 => return Err("raw control char in string".into()),
                _ => {
                    // copy one UTF-8 sequence
                    let start = self.1 - 1;
                    let len = match c {
                        0..=0x7f => 1,
                        0xc0..=0xdf => 2,
                        0xe0..=0xef => 3,
                        _ => 4,
                    };
                    out.push_str(std::str::from_utf8(&self.0[start..start + len]).map_err(|e| e.to_string())?);
                    self.1 = start + len;
                }
            }
        }
    }
}

fn parse_json(s: &str) -> J {
    let mut p = P(s.as_bytes(), 0);
    let v = p.value().unwrap_or_else(|e| panic!("{e}: {s}"));
    p.ws();
    assert_eq!(p.1, s.len(), "trailing data in {s}");
    v
}

#[test]
fn smi_json() {
    let t = Tmp::new();
    let _r = populated(&t.0);
    let a = tool("vgpu-smi").args(["--file", t.0.to_str().unwrap(), "--json"]).assert().success();
    let j = parse_json(stdout(&a).trim());
    assert_eq!(j.get("suspended"), &J::Bool(false));
    let devs = j.get("devices").arr();
    assert_eq!(devs.len(), 2);
    assert_eq!(devs[0].get("memory_limit_bytes").num(), (4 * GIB) as f64);
    assert_eq!(devs[0].get("memory_used_bytes").num(), (1536 * MIB) as f64);
    assert_eq!(devs[1].get("memory_limit_bytes"), &J::Null);
    assert_eq!(devs[1].get("uuid"), &J::Str("GPU-\"q\"".into()));
    assert_eq!(devs[1].get("sm_limit_percent").num(), 30.0);
    let procs = devs[0].get("processes").arr();
    assert_eq!(procs.len(), 1);
    assert_eq!(procs[0].get("pid").num(), 4242.0);
    assert_eq!(procs[0].get("context_bytes").num(), (512 * MIB) as f64);
}

/// Parse Prometheus text with a real parser; returns the samples.
fn parse_prom(text: &str) -> Vec<prometheus_parse::Sample> {
    let lines = text.lines().map(|l| Ok(l.to_string()));
    prometheus_parse::Scrape::parse(lines).expect("Prometheus text format").samples
}

fn prom_value(samples: &[prometheus_parse::Sample], name: &str, dev: &str) -> f64 {
    let s = samples
        .iter()
        .find(|s| s.metric == name && s.labels.get("vdevice_index") == Some(dev))
        .unwrap_or_else(|| panic!("no {name} for device {dev}"));
    match s.value {
        prometheus_parse::Value::Gauge(v) | prometheus_parse::Value::Untyped(v) => v,
        ref v => panic!("{name}: {v:?}"),
    }
}

#[test]
fn smi_metrics_speak_hami_names_without_values_in_labels() {
    let t = Tmp::new();
    let _r = populated(&t.0);
    let a = tool("vgpu-smi").args(["--file", t.0.to_str().unwrap(), "--metrics"]).assert().success();
    let out = stdout(&a);
    let samples = parse_prom(&out);
    assert_eq!(prom_value(&samples, "hami_vgpu_memory_used_bytes", "0"), (1536 * MIB) as f64);
    assert_eq!(prom_value(&samples, "hami_vgpu_memory_limit_bytes", "0"), (4 * GIB) as f64);
    assert_eq!(prom_value(&samples, "hami_vgpu_memory_limit_bytes", "1"), (16 * GIB) as f64);
    assert_eq!(prom_value(&samples, "hami_vgpu_memory_context_bytes", "0"), (512 * MIB) as f64);
    assert_eq!(prom_value(&samples, "hami_vgpu_memory_module_bytes", "0"), 0.0);
    assert_eq!(prom_value(&samples, "hami_vgpu_memory_buffer_bytes", "0"), GIB as f64);
    let ratio = prom_value(&samples, "hami_container_device_utilization_ratio", "0");
    assert!((0.0..=1.0).contains(&ratio));
    assert!(out.contains("hami_vgpu_memory_used_bytes{vdevice_index=\"1\",device_uuid=\"GPU-\\\"q\\\"\"} 0"), "escaped label: {out}");
    for s in &samples {
        for (k, v) in s.labels.iter() {
            assert!(!(k.ends_with("bytes") || ["context", "module", "data", "offset"].contains(&k.as_str())), "value in label {k}={v}");
        }
    }
    for line in out.lines().filter(|l| l.starts_with("# TYPE ")) {
        assert!(line.ends_with(" gauge"), "{line}");
    }
    assert!(!out.contains("vGPU_device_memory_usage_in_bytes"), "legacy names without --legacy-metrics");
    assert!(out.contains("\nvgpu_suspended 0\n"));
    // never launched: no elapsed-seconds series yet
    assert!(!samples.iter().any(|s| s.metric == "hami_container_last_kernel_elapsed_seconds"));
}

#[test]
fn smi_legacy_metrics_keep_the_old_names() {
    let t = Tmp::new();
    let r = populated(&t.0);
    r.set_last_kernel_time(1_700_000_000);
    let a = tool("vgpu-smi").args(["--file", t.0.to_str().unwrap(), "--legacy-metrics"]).assert().success();
    let out = stdout(&a);
    parse_prom(&out);
    assert!(out.contains("vGPU_device_memory_usage_in_bytes{vdeviceid=\"0\",deviceuuid=\"GPU-1111\"} 1610612736"), "{out}");
    assert!(out.contains("vGPU_device_memory_limit_in_bytes{vdeviceid=\"1\",deviceuuid=\"GPU-\\\"q\\\"\"} 17179869184"), "{out}");
    assert!(out.contains("Device_last_kernel_of_container{vdeviceid=\"0\",deviceuuid=\"GPU-1111\"} 1700000000"));
    let a = tool("vgpu-smi").args(["--file", t.0.to_str().unwrap(), "--metrics"]).assert().success();
    let samples = parse_prom(&stdout(&a));
    assert!(prom_value(&samples, "hami_container_last_kernel_elapsed_seconds", "0") > 1000.0);
}

#[test]
fn invalid_values_change_nothing_with_one_line() {
    let t = Tmp::new();
    let _r = populated(&t.0);
    let f = t.0.to_str().unwrap();
    let before = std::fs::read(&t.0).unwrap();
    let cases: &[&[&str]] = &[
        &["--set-mem-limit", "0", "0.0001k"],
        &["--set-mem-limit", "0", "-1g"],
        &["--set-mem-limit", "0", "lots"],
        &["--set-mem-limit", "0", "0.00001%"],
        &["--set-mem-limit", "2", "1g"],
        &["--set-mem-limit", "15", "1g"],
        &["--set-mem-limit", "16", "1g"],
        &["--set-sm-limit", "5", "30"],
        &["--set-sm-limit", "0", "101"],
        &["--set-sm-limit", "0", "-3"],
        &["--set-sm-limit", "x", "30"],
        // a valid change before an invalid one is not applied either
        &["--set-sm-limit", "0", "40", "--set-mem-limit", "9", "1g"],
        &["--suspend", "--set-sm-limit", "1", "abc"],
    ];
    for args in cases {
        let a = tool("shrreg-tool").args(["--file", f]).args(*args).assert().code(1);
        let err = stderr(&a);
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(stdout(&a).is_empty(), "{args:?}");
        assert!(std::fs::read(&t.0).unwrap() == before, "{args:?} changed the region");
    }
    // the same value in the environment fails closed; here it is refused, never an uncap
    let a = tool("shrreg-tool").args(["--file", f, "--set-mem-limit", "0", "0.0001k"]).assert().code(1);
    assert!(stderr(&a).contains("rounds down to 0"), "{}", stderr(&a));
    // devices beyond the region are never invented
    let a = tool("vgpu-smi").args(["--file", f, "--json"]).assert().success();
    assert_eq!(parse_json(stdout(&a).trim()).get("devices").arr().len(), 2);
}

#[test]
fn conflicting_or_bad_flags_are_refused_with_one_line() {
    let t = Tmp::new();
    let _r = populated(&t.0);
    let f = t.0.to_str().unwrap();
    let cases: &[(&str, &[&str])] = &[
        ("vgpu-smi", &["--json", "--metrics"]),
        ("vgpu-smi", &["--metrics", "--legacy-metrics"]),
        ("vgpu-smi", &["--count", "0"]),
        ("vgpu-smi", &["--count", "x"]),
        ("vgpu-smi", &["--interval", "0"]),
        ("vgpu-smi", &["--bogus"]),
        ("shrreg-tool", &["--suspend", "--resume"]),
        ("shrreg-tool", &["--set-sm-limit", "0"]),
        ("shrreg-tool", &[]),
        ("shrreg-tool", &["--bogus"]),
    ];
    for (bin, args) in cases {
        let a = tool(bin).args(["--file", f]).args(*args).assert().code(2);
        let err = stderr(&a);
        assert_eq!(err.lines().count(), 1, "{bin} {args:?}: {err}");
    }
}

#[test]
fn help_documents_every_flag_the_default_path_and_the_interval() {
    let a = tool("vgpu-smi").arg("--help").assert().success();
    let h = stdout(&a);
    for w in ["--file", "--json", "--metrics", "--legacy-metrics", "--watch", "--count", "--interval", "/tmp/cudevshr.cache", "CUDA_DEVICE_MEMORY_SHARED_CACHE", "[default: 1]"] {
        assert!(h.contains(w), "vgpu-smi --help lacks {w}:\n{h}");
    }
    let a = tool("shrreg-tool").arg("--help").assert().success();
    let h = stdout(&a);
    for w in ["--file", "--create_new", "--print", "--version", "--suspend", "--resume", "--set-sm-limit", "--set-mem-limit", "/tmp/cudevshr.cache", "CUDA_DEVICE_MEMORY_SHARED_CACHE"] {
        assert!(h.contains(w), "shrreg-tool --help lacks {w}:\n{h}");
    }
}

#[test]
fn closed_pipes_end_quietly() {
    use std::io::Read;
    use std::process::{Command as Cmd, Stdio};
    let t = Tmp::new();
    let _r = populated(&t.0);
    let bin = assert_cmd::cargo::cargo_bin("vgpu-smi");
    for args in [&["--watch", "--interval", "0.1"][..], &["--metrics", "--count", "50"][..]] {
        let mut c = Cmd::new(&bin)
            .args(["--file", t.0.to_str().unwrap()])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // read a little, then close our end (what `| head -3` does)
        let mut out = c.stdout.take().unwrap();
        let mut buf = [0u8; 64];
        out.read_exact(&mut buf).unwrap();
        drop(out);
        let st = c.wait().unwrap();
        let mut err = String::new();
        c.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        assert!(st.success(), "{args:?}: {st}\n{err}");
        assert!(err.is_empty(), "{args:?}: {err}");
    }
}

#[test]
fn table_shows_a_full_uuid() {
    let t = Tmp::new();
    let uuid = "GPU-12345678-1234-1234-1234-123456789abc";
    let mut i = init();
    i.uuids = vec![uuid.into()];
    i.device_num = 1;
    let _r = Region::open(&t.0, &i).unwrap();
    let a = tool("vgpu-smi").args(["--file", t.0.to_str().unwrap()]).assert().success();
    assert!(stdout(&a).contains(uuid), "{}", stdout(&a));
}

#[test]
fn exited_and_dead_processes_are_not_shown() {
    let t = Tmp::new();
    let r = populated(&t.0);
    // a slot whose owner died without cleaning up: status set, lifetime lock free
    let s2 = r.register(777).unwrap();
    r.try_reserve(s2, 0, MemKind::Data, GIB).unwrap();
    drop(r);
    // forge a leftover slot with status 1 (as a SIGKILLed process leaves it)
    let bytes = std::fs::read(&t.0).unwrap();
    assert!(bytes.len() > 1856);
    let r = Region::open_existing(&t.0).unwrap();
    r.v1().procs[5].status.store(1, Ordering::Release);
    r.v1().procs[5].pid.store(999, Ordering::Release);
    r.v1().procs[5].used[0].total.store(GIB, Ordering::Release);
    r.v1().proc_num.store(6, Ordering::Release);
    let a = tool("vgpu-smi").args(["--file", t.0.to_str().unwrap(), "--json"]).assert().success();
    let j = parse_json(stdout(&a).trim());
    assert_eq!(j.get("process_count").num(), 0.0, "{}", stdout(&a));
    assert_eq!(j.get("devices").arr()[0].get("memory_used_bytes").num(), 0.0);
    let a = tool("shrreg-tool").args(["--file", t.0.to_str().unwrap(), "--print"]).assert().success();
    assert!(!stdout(&a).contains("pid 999"), "{}", stdout(&a));
}

#[test]
fn smi_watch_and_errors() {
    let t = Tmp::new();
    let _r = populated(&t.0);
    let f = t.0.to_str().unwrap();
    let start = std::time::Instant::now();
    let a = tool("vgpu-smi").args(["--file", f, "--watch", "--count", "2", "--json"]).assert().success();
    assert!(start.elapsed() >= std::time::Duration::from_millis(900));
    let out = stdout(&a);
    assert_eq!(out.lines().count(), 2);
    for l in out.lines() {
        parse_json(l);
    }
    let a = tool("vgpu-smi").args(["--file", "/nonexistent/x.cache"]).assert().code(1);
    assert!(stderr(&a).contains("does not exist"));
}

#[test]
fn closed_stderr_keeps_the_documented_exit_status() {
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::process::{Command as Cmd, Stdio};
    // a pipe whose read end is closed: every write to the other end fails with EPIPE
    let mut fds = [0; 2];
    // SAFETY: pipe(2) fills two descriptors we own; the read end is closed at once.
    let w = unsafe {
        assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
        libc::close(fds[0]);
        OwnedFd::from_raw_fd(fds[1])
    };
    let cases: &[(&str, &[&str], i32)] = &[
        ("shrreg-tool", &["--bogus"], 2),
        ("shrreg-tool", &["--file", "/nonexistent/x.cache", "--print"], 1),
        ("vgpu-smi", &["--bogus"], 2),
        ("vgpu-smi", &["--file", "/nonexistent/x.cache"], 1),
    ];
    for (bin, args, code) in cases {
        let st = Cmd::new(assert_cmd::cargo::cargo_bin(bin))
            .args(*args)
            .env_remove("CUDA_DEVICE_MEMORY_SHARED_CACHE")
            .stdout(Stdio::null())
            .stderr(Stdio::from(w.try_clone().unwrap()))
            .status()
            .unwrap();
        assert_eq!(st.code(), Some(*code), "{bin} {args:?}: {st}");
    }
}

#[test]
fn create_new_survives_a_non_utf8_environment() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let t = Tmp::new();
    let bad = OsStr::from_bytes(b"\xff");
    let a = tool("shrreg-tool")
        .args(["--file", t.0.to_str().unwrap(), "--create_new"])
        .env("VGPU_TOOLS_TEST_JUNK", bad)
        .env(OsStr::from_bytes(b"VGPU_TOOLS_TEST_\xfe"), "x")
        .env("CUDA_DEVICE_MEMORY_LIMIT_1", bad)
        .assert()
        .success();
    // a value it reads that is not UTF-8 is malformed, as in the library: one line, capped at 0
    let err = stderr(&a);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("CUDA_DEVICE_MEMORY_LIMIT_1") && err.contains("capped at 0 bytes"), "{err}");
    let r = Region::open_existing(&t.0).unwrap();
    assert_eq!(r.device_num(), 2);
    assert_eq!(r.limit(0), None);
    assert_eq!(r.limit(1), Some(0));
}

#[test]
fn create_new_with_an_invalid_value_changes_nothing() {
    let t = Tmp::new();
    let f = t.0.to_str().unwrap();
    tool("shrreg-tool").args(["--file", f, "--create_new"]).assert().success();
    tool("shrreg-tool").args(["--file", f, "--set-mem-limit", "0", "2g"]).assert().success();
    let before = std::fs::read(&t.0).unwrap();
    let cases: &[&[&str]] = &[
        &["--create_new", "--set-sm-limit", "0", "abc"],
        // the new region has one device and no known physical size
        &["--create_new", "--set-mem-limit", "1", "1g"],
        &["--create_new", "--set-mem-limit", "0", "50%"],
        &["--create_new", "--suspend", "--set-mem-limit", "0", "0.0001k"],
    ];
    for args in cases {
        let a = tool("shrreg-tool").args(["--file", f]).args(*args).assert().code(1);
        let err = stderr(&a);
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(stdout(&a).is_empty(), "{args:?}: {}", stdout(&a));
        assert!(std::fs::read(&t.0).unwrap() == before, "{args:?} changed the region");
    }
    assert_eq!(Region::open_existing(&t.0).unwrap().limit(0), Some(2 * GIB));
    // a change before --create_new would be wiped by it: refused with one line, nothing changes
    let a = tool("shrreg-tool").args(["--file", f, "--set-sm-limit", "0", "50", "--create_new"]).assert().code(2);
    let err = stderr(&a);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("--create_new") && !err.contains("no region"), "{err}");
    assert!(std::fs::read(&t.0).unwrap() == before, "a refused call changed the region");
    // valid values after --create_new apply to the new region
    tool("shrreg-tool").args(["--file", f, "--create_new", "--set-sm-limit", "0", "50"]).assert().success();
    let r = Region::open_existing(&t.0).unwrap();
    assert_eq!((r.limit(0), r.sm_limit(0)), (None, Some(50)));
}

#[test]
fn non_utf8_region_path_resolves_as_the_library_does() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let n = N.fetch_add(1, Ordering::Relaxed);
    let raw = format!("{}/vgpu-tools-{}-{n}-", std::env::temp_dir().display(), std::process::id());
    let mut bytes = raw.into_bytes();
    bytes.extend_from_slice(b"\xff.cache");
    let var = OsStr::from_bytes(&bytes).to_os_string();
    // the library opens the lossy conversion of the value
    let t = Tmp(PathBuf::from(var.to_string_lossy().into_owned()));
    drop(Region::create_new(&t.0, &init()).unwrap());
    let a = tool("vgpu-smi").env("CUDA_DEVICE_MEMORY_SHARED_CACHE", &var).arg("--json").assert().success();
    assert_eq!(parse_json(stdout(&a).trim()).get("region"), &J::Str(t.0.to_str().unwrap().to_string()));
    let err = stderr(&a);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("CUDA_DEVICE_MEMORY_SHARED_CACHE") && err.contains("not valid UTF-8"), "{err}");
    let a = tool("shrreg-tool").env("CUDA_DEVICE_MEMORY_SHARED_CACHE", &var).args(["--set-sm-limit", "0", "70"]).assert().success();
    assert_eq!(stderr(&a).lines().count(), 1, "{}", stderr(&a));
    assert_eq!(Region::open_existing(&t.0).unwrap().sm_limit(0), Some(70));
}

/// A relative or empty region path: the tools fall back to the default as the library does, and
/// say so in one line (never a silent look at another file).
#[test]
fn a_region_path_the_library_refuses_is_named_in_one_line() {
    for val in ["relative.cache", " "] {
        let a = tool("vgpu-smi").env("CUDA_DEVICE_MEMORY_SHARED_CACHE", val).arg("--json").assert();
        let err = stderr(&a);
        let ours: Vec<&str> = err.lines().filter(|l| l.contains("CUDA_DEVICE_MEMORY_SHARED_CACHE")).collect();
        assert_eq!(ours.len(), 1, "{val:?}: {err}");
        assert!(ours[0].contains("/tmp/cudevshr.cache"), "{val:?}: {err}");
    }
}

/// `vgpu-smi --watch` outlives the region's recreation (deleted, then made again by the library's
/// next look): one line while it is gone, rounds again once it is back, exit 0. It ended with
/// "does not exist" (exit 1) when a round fell in the gap.
#[test]
fn watch_waits_out_a_recreated_region() {
    let t = Tmp::new();
    drop(Region::create_new(&t.0, &init()).unwrap());
    let bin = assert_cmd::cargo::cargo_bin("vgpu-smi");
    let mut child = std::process::Command::new(bin)
        .env_remove("CUDA_DEVICE_MEMORY_SHARED_CACHE")
        .args(["--file", t.0.to_str().unwrap(), "--watch", "--json", "--interval", "0.1", "--count", "15"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Deleted after the first round (however slow the start), back 0.5 s later: about 5 rounds
    // fall in the gap.
    use std::io::{BufRead, Read};
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    lines.read_line(&mut first).unwrap();
    std::fs::remove_file(&t.0).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    drop(Region::create_new(&t.0, &init()).unwrap());
    let mut rest = String::new();
    lines.read_to_string(&mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let rounds = 1 + rest.lines().count();
    assert!(out.status.success(), "{:?}: {err}", out.status);
    assert_eq!(err.lines().count(), 1, "one line for the gap: {err}");
    assert!(err.contains("does not exist"), "{err}");
    assert!((1..15).contains(&rounds), "rounds outside the gap: {rounds}");
}

/// An empty `--file` is a usage error naming the flag (it said "shared region  does not exist").
#[test]
fn an_empty_file_flag_is_a_usage_error() {
    for bin in ["vgpu-smi", "shrreg-tool"] {
        let a = tool(bin).args(["--file", ""]).assert().code(2);
        let err = stderr(&a);
        assert!(err.contains("--file") && !err.contains("does not exist"), "{bin}: {err}");
    }
}

/// `--create_new` cannot resolve a percentage (the tool does not know the device's size): it is
/// refused with a line and nothing is made. It made a 0-byte cap, silently (a hostile review).
#[test]
fn create_new_refuses_a_percentage_it_cannot_resolve() {
    let t = Tmp::new();
    let a = tool("shrreg-tool").env("CUDA_DEVICE_MEMORY_LIMIT", "50%").args(["--file", t.0.to_str().unwrap(), "--create_new"]).assert().code(1);
    let err = stderr(&a);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("50%") && err.contains("percentage"), "{err}");
    assert!(!t.0.exists(), "a region was made");
}

/// The environment's region path is the tools' to name only where they use it, and once.
#[test]
fn create_new_names_an_unused_region_path_variable_nowhere() {
    let t = Tmp::new();
    let a = tool("shrreg-tool")
        .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", "relative.cache")
        .args(["--file", t.0.to_str().unwrap(), "--create_new"])
        .assert()
        .success();
    assert!(!stderr(&a).contains("CUDA_DEVICE_MEMORY_SHARED_CACHE"), "{}", stderr(&a));
}
