fn main() {
    // Loaded as libcuda.so.1; -Bsymbolic-functions makes the addresses cuGetProcAddress hands out
    // our own definitions, equal to dlsym on our handle even when a preload interposes the names.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic-functions");
}
