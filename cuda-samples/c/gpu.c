/* gpu.c: helpers over the linked driver (see gpu.h). */
#include "gpu.h"

#include <dlfcn.h>

#include <string.h>

#include "kernels_ptx.h"

void gpu_open(struct gpu *g, int ordinal)
{
    memset(g, 0, sizeof *g);
    g->ordinal = ordinal;
    CHECK(cuInit(0));
    int count = 0;
    CHECK(cuDeviceGetCount(&count));
    if (ordinal >= count)
        die("device %d requested but only %d visible", ordinal, count);
    CHECK(cuDeviceGet(&g->dev, ordinal));
    CHECK(cuDevicePrimaryCtxRetain(&g->ctx, g->dev));
    CHECK(cuCtxSetCurrent(g->ctx));
    CHECK(cuDeviceGetAttribute(&g->sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, g->dev));
    CHECK(cuDeviceGetAttribute(&g->clock_khz, CU_DEVICE_ATTRIBUTE_CLOCK_RATE, g->dev));
    CHECK(cuDeviceGetName(g->name, (int)sizeof g->name, g->dev));
    CHECK(cuDeviceGetUuid_v2(&g->uuid, g->dev));
    for (char *p = g->name; *p; p++)
        if (*p == ' ')
            *p = '_';
    out("device=%d name=%s sms=%d clock_khz=%d\n", ordinal, g->name, g->sms, g->clock_khz);
}

void gpu_close(struct gpu *g)
{
    if (g->ctx) {
        CHECK(cuCtxSynchronize());
        CHECK(cuDevicePrimaryCtxRelease_v2(g->dev));
        g->ctx = NULL;
    }
}

void kernels_load(struct kernels *k)
{
    char err_log[8192] = "";
    CUjit_option opts[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void *vals[] = {err_log, (void *)(uintptr_t)sizeof err_log};
    memset(k, 0, sizeof *k);
    CUresult r = cuModuleLoadDataEx(&k->mod, vgpu_kernels_ptx, 2, opts, vals);
    if (r != CUDA_SUCCESS) {
        for (char *p = err_log; *p; p++)
            if (*p == '\n')
                *p = ' ';
        out("jit_log=\"%s\"\n", err_log);
        cu_fail(r, "cuModuleLoadDataEx(vgpu_kernels_ptx)", __FILE__, __LINE__);
    }
    CHECK(cuModuleGetFunction(&k->empty, k->mod, VGPU_KERNEL_EMPTY));
    CHECK(cuModuleGetFunction(&k->spin, k->mod, VGPU_KERNEL_SPIN));
    CHECK(cuModuleGetFunction(&k->fill_u32, k->mod, VGPU_KERNEL_FILL_U32));
    CHECK(cuModuleGetFunction(&k->spin_traced, k->mod, VGPU_KERNEL_SPIN_TRACED));
}

void kernels_unload(struct kernels *k)
{
    if (k->mod)
        CHECK(cuModuleUnload(k->mod));
    k->mod = NULL;
}

uint64_t spin_cycles(const struct gpu *g, double us)
{
    double c = us * (double)g->clock_khz / 1000.0; /* kHz = cycles per ms */
    return c < 1.0 ? 1 : (uint64_t)(c + 0.5);
}

void gpu_open_launching(struct gpu *g, struct kernels *k, CUstream *s, int stream)
{
    gpu_open(g, opt_device);
    kernels_load(k);
    *s = NULL;
    if (stream)
        CHECK(cuStreamCreate(s, CU_STREAM_NON_BLOCKING));
}

CUresult launch_spin(const struct gpu *g, const struct kernels *k, uint64_t cycles, CUstream s)
{
    void *args[] = {&cycles};
    unsigned int blocks = (unsigned int)(g->sms > 0 ? g->sms : 1) * SPIN_BLOCKS_PER_SM;
    return cuLaunchKernel(k->spin, blocks, 1, 1, SPIN_THREADS, 1, 1, 0, s, args, NULL);
}

void *driver_symbol(const char *name)
{
    typedef void *(*dlsym_fn)(void *, const char *);
    dlsym_fn real = NULL;
    const char *versions[] = {"GLIBC_2.34", "GLIBC_2.2.5"};
    for (unsigned i = 0; i < sizeof versions / sizeof *versions && !real; i++)
        real = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", versions[i]);
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    void *p = real && lib ? real(lib, name) : NULL;
    if (!p)
        die("driver_symbol: %s not found in libcuda.so.1", name);
    return p;
}

CUresult launch_empty(const struct kernels *k, CUstream s)
{
    return cuLaunchKernel(k->empty, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL);
}

void meminfo(size_t *free_b, size_t *total_b)
{
    CHECK(cuMemGetInfo_v2(free_b, total_b));
}

uint64_t mem_used(void)
{
    size_t f = 0, t = 0;
    meminfo(&f, &t);
    return (uint64_t)(t - f);
}

long long nvml_used(const struct gpu *g)
{
    nvmlDevice_t d;
    nvmlMemory_t m;
    if (!nvml_device(&g->uuid, g->ordinal, &d) || nvml_memory(d, &m) != 0)
        return -1;
    return (long long)m.used;
}
