/*
 * gpu.h: helpers that call the linked driver (libcuda.so.1): context setup, the PTX
 * kernels, full-GPU spin launches, device memory usage.
 */
#ifndef VGPU_GPU_H
#define VGPU_GPU_H

#include "common.h"

struct gpu {
    int ordinal;
    CUdevice dev;
    CUcontext ctx;
    int sms;       /* CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT */
    int clock_khz; /* CU_DEVICE_ATTRIBUTE_CLOCK_RATE */
    char name[256];
    CUuuid uuid;
};

/* cuInit, device `ordinal`, retain its primary context and make it current, read the
 * attributes. Prints `device=D name=... sms=N clock_khz=K`. Exits on failure. */
void gpu_open(struct gpu *g, int ordinal);
void gpu_close(struct gpu *g);

struct kernels {
    CUmodule mod;
    CUfunction empty, spin, fill_u32, spin_traced;
};
/* JIT-loads the PTX (printing the JIT error log on failure) and looks up the kernels. */
void kernels_load(struct kernels *k);
void kernels_unload(struct kernels *k);

/* What the launching samples begin with: gpu_open on --device, kernels_load, and a
 * non-blocking stream (left NULL when `stream` is 0: the legacy default stream). */
void gpu_open_launching(struct gpu *g, struct kernels *k, CUstream *s, int stream);

/* The driver's own entry point `name` (libcuda.so.1's symbol, looked up with glibc's dlsym, which
 * an LD_PRELOAD hook overriding dlsym does not see): calls through it bypass any hook, for the
 * in-process hook-on / hook-off comparisons (--ab). Dies when it cannot be found. */
void *driver_symbol(const char *name);

/* Spin length in clock cycles for `us` microseconds at the device's clock rate. */
uint64_t spin_cycles(const struct gpu *g, double us);
/* Blocks of the full-GPU spin launch: 4 per SM, 256 threads each. */
#define SPIN_BLOCKS_PER_SM 4
#define SPIN_THREADS 256
CUresult launch_spin(const struct gpu *g, const struct kernels *k, uint64_t cycles, CUstream s);
CUresult launch_empty(const struct kernels *k, CUstream s);

/* cuMemGetInfo_v2: used = total - free. Exits on failure. */
void meminfo(size_t *free_b, size_t *total_b);
uint64_t mem_used(void);
/* NVML used bytes of this GPU, or -1 when NVML is unavailable. */
long long nvml_used(const struct gpu *g);

#endif /* VGPU_GPU_H */
