//! Helpers of the run-time control and monitoring tests (`control.rs`, `hami_monitor.rs`):
//! background samples whose stdout lines are timestamped as they arrive (so a test can look at the
//! rates before and after it changes something), killed on drop; the tools; a small JSON reader
//! for `vgpu-smi --json` and a Prometheus text reader for `--metrics`. Every wait is bounded.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use gpu_tests::{artifacts, mock_command, Scratch};

type Lines = Arc<Mutex<Vec<(Instant, String)>>>;

/// A sample running in the background. Its stdout lines are kept with their arrival time.
/// Dropping it SIGKILLs and reaps the process (every exit path of a test, panics included).
pub struct Bg {
    name: String,
    child: Option<Child>,
    lines: Lines,
    stderr: Arc<Mutex<String>>,
    readers: Vec<JoinHandle<()>>,
}

impl Bg {
    pub fn spawn(mut c: Command, name: &str) -> Bg {
        let mut child = c
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {name} ({c:?}): {e}"));
        let lines: Lines = Arc::default();
        let stderr: Arc<Mutex<String>> = Arc::default();
        let out = child.stdout.take().unwrap();
        let err = child.stderr.take().unwrap();
        let l = lines.clone();
        let e = stderr.clone();
        let readers = vec![
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines() {
                    let Ok(line) = line else { break };
                    l.lock().unwrap().push((Instant::now(), line));
                }
            }),
            std::thread::spawn(move || {
                let mut s = String::new();
                let _ = BufReader::new(err).read_to_string(&mut s);
                e.lock().unwrap().push_str(&s);
            }),
        ];
        Bg { name: name.into(), child: Some(child), lines, stderr, readers }
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().map_or(0, |c| c.id() as i32)
    }

    /// Still running (not exited)?
    pub fn alive(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Everything printed so far (stdout, then stderr), for failure messages.
    pub fn text(&self) -> String {
        let out: Vec<String> = self.lines.lock().unwrap().iter().map(|(_, l)| l.clone()).collect();
        format!("--- {} (pid {}) stdout:\n{}\n--- stderr:\n{}", self.name, self.pid(), out.join("\n"), self.stderr.lock().unwrap())
    }

    /// Wait (at most `limit`) for a stdout line containing `pat`; returns it. Panics with the
    /// output when the process exits first or the time is up.
    pub fn wait_line(&mut self, pat: &str, limit: Duration) -> String {
        let t = Instant::now();
        loop {
            if let Some((_, l)) = self.lines.lock().unwrap().iter().find(|(_, l)| l.contains(pat)) {
                return l.clone();
            }
            if !self.alive() {
                std::thread::sleep(Duration::from_millis(50)); // let the readers drain
                if let Some((_, l)) = self.lines.lock().unwrap().iter().find(|(_, l)| l.contains(pat)) {
                    return l.clone();
                }
                panic!("{} exited before printing {pat:?}\n{}", self.name, self.text());
            }
            if t.elapsed() > limit {
                panic!("{} printed no {pat:?} within {limit:?}\n{}", self.name, self.text());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// `kernels_per_sec` of the per-second lines that arrived in `[from, to]`.
    pub fn rates(&self, from: Instant, to: Instant) -> Vec<f64> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|(t, _)| *t >= from && *t <= to)
            .filter_map(|(_, l)| {
                l.contains("second=").then_some(())?;
                l.split_whitespace().find_map(|kv| kv.strip_prefix("kernels_per_sec="))?.parse().ok()
            })
            .collect()
    }

    /// Arrival times of the stdout lines starting with `prefix` that arrived in `[from, to]`.
    pub fn times_of(&self, prefix: &str, from: Instant, to: Instant) -> Vec<Instant> {
        self.lines.lock().unwrap().iter().filter(|(t, l)| *t >= from && *t <= to && l.starts_with(prefix)).map(|(t, _)| *t).collect()
    }

    /// Wait (at most `limit`) for the process to exit by itself: (exit status, stdout). Panics
    /// with its output if it is still running then.
    pub fn outcome(mut self, limit: Duration) -> (ExitStatus, String) {
        let st = self.wait_exit(limit).unwrap_or_else(|| panic!("{} still running after {limit:?}\n{}", self.name, self.text()));
        (st, self.stdout())
    }

    /// Like [`Bg::outcome`], requiring success. Returns stdout.
    pub fn finish(mut self, limit: Duration) -> String {
        let st = self.wait_exit(limit).unwrap_or_else(|| panic!("{} still running after {limit:?}\n{}", self.name, self.text()));
        assert!(st.success(), "{} failed: {st}\n{}", self.name, self.text());
        self.stdout()
    }

    /// Like [`Bg::finish`], returning stdout and stderr.
    pub fn finish_both(mut self, limit: Duration) -> (String, String) {
        let st = self.wait_exit(limit).unwrap_or_else(|| panic!("{} still running after {limit:?}\n{}", self.name, self.text()));
        assert!(st.success(), "{} failed: {st}\n{}", self.name, self.text());
        (self.stdout(), self.stderr.lock().unwrap().clone())
    }

    /// SIGTERM, then wait (bounded) for a clean exit; returns stdout. Panics with the output if
    /// it does not exit cleanly.
    pub fn stop(mut self) -> String {
        // SAFETY: signalling our own child, not yet reaped.
        unsafe { libc::kill(self.pid(), libc::SIGTERM) };
        let st = self.wait_exit(Duration::from_secs(10));
        let st = st.unwrap_or_else(|| panic!("{} did not exit within 10 s of SIGTERM\n{}", self.name, self.text()));
        assert!(st.success(), "{} failed: {st}\n{}", self.name, self.text());
        self.stdout()
    }

    fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let t = Instant::now();
        let child = self.child.as_mut()?;
        loop {
            if let Ok(Some(st)) = child.try_wait() {
                self.child = None;
                for r in self.readers.drain(..) {
                    let _ = r.join();
                }
                return Some(st);
            }
            if t.elapsed() > limit {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn stdout(&self) -> String {
        self.lines.lock().unwrap().iter().map(|(_, l)| format!("{l}\n")).collect()
    }
}

impl Drop for Bg {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `kernels_per_sec` of the per-second lines (`second=K kernels_per_sec=X`) of `out` with K > `after`.
pub fn second_rates(out: &str, after: u32) -> Vec<f64> {
    out.lines()
        .filter_map(|l| {
            let kv = |k: &str| l.split_whitespace().find_map(|w| w.strip_prefix(k).map(str::to_string));
            let sec: u32 = kv("second=")?.parse().ok()?;
            (sec > after).then_some(kv("kernels_per_sec=")?.parse::<f64>().ok()?)
        })
        .collect()
}

/// Mean of `v`; panics on an empty slice with `what`.
pub fn mean(v: &[f64], what: &str) -> f64 {
    assert!(!v.is_empty(), "no samples for {what}");
    v.iter().sum::<f64>() / v.len() as f64
}

/// Run a tool (`shrreg-tool`, `vgpu-smi`) on the scratch's region; requires exit 0, returns stdout.
pub fn tool(s: &Scratch, name: &str, args: &[&str]) -> String {
    let out = mock_command(&artifacts().tool(name), s, false)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("spawn {name}: {e}"));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{name} {args:?} failed: {}\nstdout:\n{text}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// The live region at `path`, waiting (bounded) until a hooked process has created it.
pub fn live_region(path: &Path) -> vgpu_core::region::Region {
    let t = Instant::now();
    loop {
        match vgpu_core::region::Region::open_existing(path) {
            Ok(r) => return r,
            Err(e) if t.elapsed() > Duration::from_secs(10) => panic!("region {} not usable: {e}", path.display()),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Poll `f` every 50 ms until it returns Some, at most `limit`.
pub fn poll<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let t = Instant::now();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if t.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

// ---------- JSON (enough for vgpu-smi --json) ----------

#[derive(Clone, Debug, PartialEq)]
pub enum Json {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    pub fn parse(s: &str) -> Json {
        let b = s.as_bytes();
        let mut i = 0;
        let v = parse_value(b, &mut i).unwrap_or_else(|| panic!("bad JSON at byte {i}: {s}"));
        skip_ws(b, &mut i);
        assert_eq!(i, b.len(), "trailing bytes after JSON: {s}");
        v
    }
    /// Member `k` of an object; panics if absent.
    pub fn get(&self, k: &str) -> &Json {
        match self {
            Json::Obj(m) => m.iter().find(|(n, _)| n == k).map(|(_, v)| v).unwrap_or_else(|| panic!("no {k:?} in {self:?}")),
            _ => panic!("not an object (looking for {k:?}): {self:?}"),
        }
    }
    pub fn num(&self) -> f64 {
        match self {
            Json::Num(n) => *n,
            _ => panic!("not a number: {self:?}"),
        }
    }
    pub fn arr(&self) -> &[Json] {
        match self {
            Json::Arr(a) => a,
            _ => panic!("not an array: {self:?}"),
        }
    }
}

fn skip_ws(b: &[u8], i: &mut usize) {
    while *i < b.len() && b[*i].is_ascii_whitespace() {
        *i += 1;
    }
}

fn parse_value(b: &[u8], i: &mut usize) -> Option<Json> {
    skip_ws(b, i);
    let lit = |i: &mut usize, w: &str, v: Json| b[*i..].starts_with(w.as_bytes()).then(|| {
        *i += w.len();
        v
    });
    match *b.get(*i)? {
        b'n' => lit(i, "null", Json::Null),
        b't' => lit(i, "true", Json::Bool(true)),
        b'f' => lit(i, "false", Json::Bool(false)),
        b'"' => parse_str(b, i).map(Json::Str),
        b'[' => {
            *i += 1;
            let mut a = Vec::new();
            skip_ws(b, i);
            if b.get(*i) == Some(&b']') {
                *i += 1;
                return Some(Json::Arr(a));
            }
            loop {
                a.push(parse_value(b, i)?);
                skip_ws(b, i);
                match *b.get(*i)? {
                    b',' => *i += 1,
                    b']' => {
                        *i += 1;
                        return Some(Json::Arr(a));
                    }
                    _ => return None,
                }
            }
        }
        b'{' => {
            *i += 1;
            let mut m = Vec::new();
            skip_ws(b, i);
            if b.get(*i) == Some(&b'}') {
                *i += 1;
                return Some(Json::Obj(m));
            }
            loop {
                skip_ws(b, i);
                let k = parse_str(b, i)?;
                skip_ws(b, i);
                (*b.get(*i)? == b':').then_some(())?;
                *i += 1;
                m.push((k, parse_value(b, i)?));
                skip_ws(b, i);
                match *b.get(*i)? {
                    b',' => *i += 1,
                    b'}' => {
                        *i += 1;
                        return Some(Json::Obj(m));
                    }
                    _ => return None,
                }
            }
        }
        _ => {
            let start = *i;
            while *i < b.len() && matches!(b[*i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9') {
                *i += 1;
            }
            std::str::from_utf8(&b[start..*i]).ok()?.parse().ok().map(Json::Num)
        }
    }
}

fn parse_str(b: &[u8], i: &mut usize) -> Option<String> {
    (*b.get(*i)? == b'"').then_some(())?;
    *i += 1;
    let mut s = Vec::new();
    loop {
        match *b.get(*i)? {
            b'"' => {
                *i += 1;
                return String::from_utf8(s).ok();
            }
            b'\\' => {
                let c = *b.get(*i + 1)?;
                *i += 2;
                match c {
                    b'u' => {
                        let h = std::str::from_utf8(b.get(*i..*i + 4)?).ok()?;
                        let ch = char::from_u32(u32::from_str_radix(h, 16).ok()?)?;
                        s.extend_from_slice(ch.to_string().as_bytes());
                        *i += 4;
                    }
                    b'n' => s.push(b'\n'),
                    b't' => s.push(b'\t'),
                    b'r' => s.push(b'\r'),
                    b'b' => s.push(8),
                    b'f' => s.push(12),
                    c => s.push(c),
                }
            }
            c => {
                s.push(c);
                *i += 1;
            }
        }
    }
}

// ---------- Prometheus text ----------

/// Samples of metric `name`: (label text inside the braces, value).
pub fn metric_samples(text: &str, name: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let (labels, value) = match rest.strip_prefix('{') {
                Some(r) => {
                    let end = r.rfind('}')?;
                    (r[..end].to_string(), r[end + 1..].trim())
                }
                None if rest.starts_with(' ') => (String::new(), rest.trim()),
                None => return None,
            };
            Some((labels, value.parse().ok()?))
        })
        .collect()
}
