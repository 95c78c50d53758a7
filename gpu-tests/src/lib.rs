//! Test support for the integration tests: builds the preload library, the mocks and the tools
//! once per test process and lays the mocks out under the file names the loader looks for.
//!
//! Profiles: by default everything runs against the mock driver and NVML. With
//! `VGPU_TEST_PROFILE=real` the tests use the system's NVIDIA driver and prebuilt artifacts from
//! `VGPU_ARTIFACTS_DIR` (the `dist/` tree of `ci/package-gpu.sh`, which holds no Rust toolchain
//! needs); asked for without a GPU, every test fails loudly. `ci/gpu-tests.sh` runs them so.
//!
//! The mocks are cdylib crates, which cargo cannot hand to another crate's tests as artifacts, so
//! `artifacts()` runs a nested `cargo build` into its own target directory (`target/artifacts`),
//! which cannot deadlock on the outer `cargo test`'s build lock.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Where the built pieces are.
#[derive(Debug, Clone)]
pub struct Artifacts {
    /// `libvgpu.so`, the preload library under test.
    pub libvgpu: PathBuf,
    /// Directory with `libcuda.so.1` and `libnvidia-ml.so.1` (the mocks): put on LD_LIBRARY_PATH.
    pub mock_lib_dir: PathBuf,
    /// Directory with `shrreg-tool` and `vgpu-smi`.
    pub tools_dir: PathBuf,
    /// Directory with the C sample programs (`test_alloc`, `test_vram_limit`, ...).
    pub samples_dir: PathBuf,
}

impl Artifacts {
    pub fn sample(&self, name: &str) -> PathBuf {
        self.samples_dir.join(name)
    }
    pub fn tool(&self, name: &str) -> PathBuf {
        self.tools_dir.join(name)
    }
}

/// The workspace root (parent of this crate's directory).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// Build (once per process) and return the artifacts. Panics with cargo's output on failure:
/// a test that cannot get its artifacts must fail loudly, never skip.
pub fn artifacts() -> &'static Artifacts {
    static ARTIFACTS: OnceLock<Artifacts> = OnceLock::new();
    ARTIFACTS.get_or_init(|| if real_gpu() { real_artifacts() } else { build_artifacts() })
}

/// `VGPU_TEST_PROFILE=real`: run against the system driver on a real GPU.
pub fn real_gpu() -> bool {
    match std::env::var("VGPU_TEST_PROFILE").as_deref() {
        Ok("real") => true,
        Ok("mock") | Err(_) => false,
        Ok(other) => panic!("VGPU_TEST_PROFILE={other:?}: expected \"mock\" or \"real\""),
    }
}

/// The real-GPU profile's artifacts: prebuilt, from `VGPU_ARTIFACTS_DIR`; a GPU must be present.
fn real_artifacts() -> Artifacts {
    let gpu = Command::new("nvidia-smi").arg("-L").output();
    match gpu {
        Ok(o) if o.status.success() && !o.stdout.is_empty() => {}
        Ok(o) => panic!(
            "VGPU_TEST_PROFILE=real but nvidia-smi finds no GPU: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => panic!("VGPU_TEST_PROFILE=real but nvidia-smi cannot run ({e}): no NVIDIA driver here"),
    }
    let dir = PathBuf::from(
        std::env::var("VGPU_ARTIFACTS_DIR")
            .expect("VGPU_TEST_PROFILE=real needs VGPU_ARTIFACTS_DIR (the dist/ tree of ci/package-gpu.sh)"),
    );
    let a = Artifacts {
        libvgpu: dir.join("libvgpu.so"),
        mock_lib_dir: PathBuf::new(),
        tools_dir: dir.join("tools"),
        samples_dir: dir.join("samples"),
    };
    for p in [&a.libvgpu, &a.tools_dir, &a.samples_dir] {
        assert!(p.exists(), "VGPU_ARTIFACTS_DIR: {} is missing", p.display());
    }
    a
}

fn build_artifacts() -> Artifacts {
    let root = workspace_root();
    let target = root.join("target").join("artifacts");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(&root)
        .args(["build", "--quiet", "-p", "libvgpu", "-p", "mock-libcuda", "-p", "mock-nvml"])
        .args(["-p", "vgpu-tools", "--target-dir"])
        .arg(&target)
        .env_remove("RUSTFLAGS")
        .output()
        .expect("failed to run cargo to build the test artifacts");
    assert!(
        out.status.success(),
        "building libvgpu/mocks/tools failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let built = target.join("debug");
    let mock_lib_dir = target.join("mock-lib");
    std::fs::create_dir_all(&mock_lib_dir).unwrap();
    install(&built.join("libcuda.so"), &mock_lib_dir.join("libcuda.so.1"));
    install(&built.join("libnvidia_ml.so"), &mock_lib_dir.join("libnvidia-ml.so.1"));
    Artifacts {
        libvgpu: built.join("libvgpu.so"),
        mock_lib_dir,
        tools_dir: built.clone(),
        samples_dir: cuda_samples::bin_dir(),
    }
}

/// Copy `from` to `to` atomically (rename), so concurrent test processes never see a torn file.
fn install(from: &Path, to: &Path) {
    let tmp = to.with_extension(format!("tmp{}", std::process::id()));
    std::fs::copy(from, &tmp).unwrap_or_else(|e| panic!("copy {} -> {}: {e}", from.display(), tmp.display()));
    std::fs::rename(&tmp, to).unwrap();
}

/// A fresh scratch directory for one test (mock state file, region file, logs), removed on drop.
pub struct Scratch {
    pub dir: PathBuf,
}

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("vgpu-test-{}-{}-{}", tag, std::process::id(), n));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch { dir }
    }
    /// Path of the mock GPU state file for this test.
    pub fn mock_state(&self) -> PathBuf {
        self.dir.join("mock-gpu.state")
    }
    /// Path of the libvgpu shared region for this test.
    pub fn region(&self) -> PathBuf {
        self.dir.join("cudevshr.cache")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A command for `program` running against the mock GPU (the real one in the real profile): the
/// mocks on LD_LIBRARY_PATH, the scratch dir's mock state and region, and (if `hooked`)
/// libvgpu.so preloaded. Any inherited
/// CUDA_*/MOCK_* variables are cleared so the host environment cannot leak into a test.
pub fn mock_command(program: &Path, scratch: &Scratch, hooked: bool) -> Command {
    let a = artifacts();
    let mut cmd = Command::new(program);
    for (k, _) in std::env::vars() {
        if k.starts_with("CUDA_") || k.starts_with("MOCK_GPU") || k.starts_with("LIBCUDA_")
            || k.starts_with("VGPU_") || k == "LD_PRELOAD" || k == "GPU_CORE_UTILIZATION_POLICY"
        {
            cmd.env_remove(k);
        }
    }
    if !real_gpu() {
        cmd.env("LD_LIBRARY_PATH", &a.mock_lib_dir).env("MOCK_GPU_STATE", scratch.mock_state());
    }
    cmd.env("CUDA_DEVICE_MEMORY_SHARED_CACHE", scratch.region());
    if hooked {
        cmd.env("LD_PRELOAD", &a.libvgpu);
    }
    cmd
}

/// Make this test binary double as a worker process: when the environment variable `$var` is
/// set, `$dispatch(&value)` runs *instead of* the tests (before `main`, from an `.init_array`
/// entry) and the process exits 0 when it returns, 101 when it panics, as a failed test would.
/// Without the variable nothing happens and the tests run. Tests re-run `current_exe()` with the
/// variable set to start a worker; no `#[test]` is a no-op entry point.
#[macro_export]
macro_rules! worker_entry {
    ($var:expr, $dispatch:expr) => {
        #[used]
        #[link_section = ".init_array"]
        static WORKER_ENTRY: extern "C" fn() = {
            extern "C" fn worker_entry() {
                $crate::run_worker($var, $dispatch);
            }
            worker_entry
        };
    };
}

/// The body of [`worker_entry!`]'s entry: returns when `var` is not set, else never.
pub fn run_worker(var: &str, dispatch: fn(&str)) {
    let Some(mode) = std::env::var_os(var) else { return };
    let mode = mode.to_string_lossy().into_owned();
    let code = match std::panic::catch_unwind(|| dispatch(&mode)) {
        Ok(()) => 0,
        Err(_) => 101,
    };
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    std::process::exit(code);
}
