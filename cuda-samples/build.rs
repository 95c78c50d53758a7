fn main() {
    let out = std::env::var("OUT_DIR").unwrap();
    let bin = std::path::Path::new(&out).join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    println!("cargo:rustc-env=CUDA_SAMPLES_BIN_DIR={}", bin.display());
}
