//! Shared helpers of the `hook_*` integration tests (libvgpu.so under LD_PRELOAD on the mocks).
#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

pub use gpu_tests::{artifacts, mock_command, Scratch};

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// Context memory the mock charges per context; the hook is told the same reserve, so a context
/// costs the same whether it measures (mock NVML) or falls back to the default.
pub const CTX: u64 = 256 * MIB;

/// A sample under the hook on a fresh 8 GiB mock GPU with `cap` (a size string) on every device.
pub fn hooked(sample: &str, s: &Scratch, cap: Option<&str>) -> Command {
    let mut c = mock_command(&artifacts().sample(sample), s, true);
    mock_env(&mut c);
    if let Some(cap) = cap {
        c.env("CUDA_DEVICE_MEMORY_LIMIT", cap);
    }
    c
}

pub fn mock_env(c: &mut Command) {
    c.env("MOCK_GPU_MEM", "8g").env("MOCK_GPU_CTX_MEM", "256m").env("VGPU_CONTEXT_RESERVE", "256m");
}

pub fn output(c: &mut Command) -> Output {
    c.output().unwrap_or_else(|e| panic!("spawn {c:?}: {e}"))
}

/// Run and require exit 0; returns stdout.
pub fn run_ok(c: &mut Command) -> String {
    let out = output(c);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{c:?} failed: {}\nstdout:\n{text}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

pub fn spawn(c: &mut Command) -> Child {
    c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn")
}

/// Value of `key=` in the last line of `out` that has it.
pub fn value<'a>(out: &'a str, key: &str) -> Option<&'a str> {
    let pat = format!("{key}=");
    out.lines().rev().find_map(|l| {
        l.split_whitespace().find_map(|kv| kv.strip_prefix(pat.as_str()))
    })
}

pub fn num(out: &str, key: &str) -> u64 {
    value(out, key)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no numeric {key}= in:\n{out}"))
}

/// Usage of device `dev` recorded in the region file (every live process of the container).
pub fn region_used(path: &Path, dev: usize) -> u64 {
    vgpu_core::region::Region::snapshot(path).expect("region snapshot").device_used(dev)
}

pub fn region_limit(path: &Path, dev: usize) -> Option<u64> {
    vgpu_core::region::Region::snapshot(path).expect("region snapshot").limit(dev)
}

/// Lines of `stderr` that mention `needle`.
pub fn lines_with(stderr: &[u8], needle: &str) -> Vec<String> {
    String::from_utf8_lossy(stderr).lines().filter(|l| l.contains(needle)).map(String::from).collect()
}

/// Run a `--hold` sample: wait for `holding=1`, call `f` while it holds, then SIGTERM it and
/// require a clean exit. Returns everything it printed.
pub fn while_holding(c: &mut Command, f: impl FnOnce()) -> String {
    use std::io::{BufRead, BufReader, Read};
    let mut child = spawn(c);
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let mut seen = String::new();
    loop {
        let mut l = String::new();
        if reader.read_line(&mut l).unwrap_or(0) == 0 {
            break;
        }
        seen.push_str(&l);
        if l.contains("holding=1") {
            break;
        }
    }
    if !seen.contains("holding=1") {
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        panic!("never held:\n{seen}\nstderr:\n{}", String::from_utf8_lossy(&out.stderr));
    }
    f();
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = reader.read_to_string(&mut seen);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}: {seen}\nstderr:\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    seen
}
