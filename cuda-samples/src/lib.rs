//! Paths of the C sample programs that build.rs compiled (being written).

/// Directory holding the built sample executables.
pub fn bin_dir() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CUDA_SAMPLES_BIN_DIR"))
}
