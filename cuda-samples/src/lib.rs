//! Paths of the C sample programs that build.rs compiled (see `cuda-samples/README.md`).

use std::path::PathBuf;

/// Names of every sample executable in [`bin_dir`].
pub const SAMPLES: &[&str] = &[
    "test_alloc",
    "test_vram_limit",
    "test_runtime_launch",
    "test_alloc_paths",
    "test_procaddr",
    "test_rtld_next",
    "test_graph",
    "bench_launch",
    "bench_malloc",
    "test_meminfo",
    "test_fork",
];

/// Directory holding the built sample executables.
pub fn bin_dir() -> PathBuf {
    PathBuf::from(env!("CUDA_SAMPLES_BIN_DIR"))
}

/// Path of one sample executable.
pub fn sample(name: &str) -> PathBuf {
    bin_dir().join(name)
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_sample_was_built() {
        for name in super::SAMPLES {
            let p = super::sample(name);
            assert!(p.is_file(), "{} missing", p.display());
        }
    }
}
