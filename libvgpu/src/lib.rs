//! libvgpu.so: the LD_PRELOAD hook. Thin FFI shims over `vgpu-core` policy (being written).
mod launch;
