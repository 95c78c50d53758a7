/*
 * test_alloc_paths: exercise every device-memory allocation path once, with its free.
 *
 *   --size SIZE     bytes per allocation (default 64m)
 *   --path NAME     only this path (names below)
 *   --hold          after allocating, print `holding=1` and wait for SIGTERM/SIGINT/SIGUSR1
 *                   (or --hold-seconds), then free: lets a test inspect accounting meanwhile
 *   --hold-seconds N  bound the hold (default 0 = until a signal)
 *                   While holding, each SIGUSR2 prints `report=N free=BYTES total=BYTES` (the
 *                   device as cuMemGetInfo shows it now): a test's signal that the process
 *                   sees a change made from outside.
 *
 * Paths: mem_alloc (cuMemAlloc_v2), mem_alloc_pitch (cuMemAllocPitch_v2), mem_alloc_managed
 * (cuMemAllocManaged), array (cuArrayCreate_v2), array3d (cuArray3DCreate_v2), mipmapped_array
 * (cuMipmappedArrayCreate), mem_alloc_async (cuMemAllocAsync on the default pool, trimmed after
 * the free), mem_alloc_from_pool (cuMemPoolCreate + cuMemAllocFromPoolAsync), vmm (cuMemCreate +
 * cuMemAddressReserve + cuMemMap + cuMemSetAccess).
 *
 * Output per path: path=NAME result=CUDA_SUCCESS|CUDA_ERROR_... used_delta=BYTES, then after the
 * free: path=NAME free_result=... freed_delta=BYTES. Summary: paths= failed= result=PASS|FAIL.
 * Exit 0 only when every selected path allocated and freed successfully.
 */
#include <signal.h>
#include <string.h>

#include "gpu.h"

static volatile sig_atomic_t report_requested;

static void on_report_signal(int sig)
{
    (void)sig;
    report_requested = 1;
}

struct alloc {
    CUdeviceptr ptr;
    CUarray array;
    CUmipmappedArray mipmap;
    CUmemoryPool pool;
    CUmemGenericAllocationHandle handle;
    size_t size;
};

static struct gpu g;
static CUstream stream;

static CUresult a_mem_alloc(struct alloc *a)
{
    return cuMemAlloc_v2(&a->ptr, a->size);
}

static CUresult f_mem_free(struct alloc *a)
{
    return cuMemFree_v2(a->ptr);
}

static CUresult a_pitch(struct alloc *a)
{
    const size_t width = 64 * 1024;
    size_t pitch = 0;
    return cuMemAllocPitch_v2(&a->ptr, &pitch, width, (a->size + width - 1) / width, 4);
}

static CUresult a_managed(struct alloc *a)
{
    return cuMemAllocManaged(&a->ptr, a->size, CU_MEM_ATTACH_GLOBAL);
}

/* 2D array of 32-bit texels, rows of 32 KiB. */
static CUresult a_array(struct alloc *a)
{
    CUDA_ARRAY_DESCRIPTOR d;
    memset(&d, 0, sizeof d);
    d.Width = 8192;
    d.Height = (a->size + 32 * 1024 - 1) / (32 * 1024);
    d.Format = CU_AD_FORMAT_UNSIGNED_INT32;
    d.NumChannels = 1;
    return cuArrayCreate_v2(&a->array, &d);
}

static CUresult f_array(struct alloc *a)
{
    return cuArrayDestroy(a->array);
}

/* 3D array of 32-bit texels, 1 MiB slices (1024 x 256). */
static CUresult a_array3d(struct alloc *a)
{
    CUDA_ARRAY3D_DESCRIPTOR d;
    memset(&d, 0, sizeof d);
    d.Width = 1024;
    d.Height = 256;
    d.Depth = (a->size + MIB - 1) / MIB;
    d.Format = CU_AD_FORMAT_UNSIGNED_INT32;
    d.NumChannels = 1;
    return cuArray3DCreate_v2(&a->array, &d);
}

/* 2D mipmapped array, 4 levels: the base level holds about 3/4 of the size. */
static CUresult a_mipmap(struct alloc *a)
{
    CUDA_ARRAY3D_DESCRIPTOR d;
    memset(&d, 0, sizeof d);
    d.Width = 8192;
    d.Height = (a->size * 3 / 4 + 32 * 1024 - 1) / (32 * 1024);
    if (d.Height == 0)
        d.Height = 1;
    d.Depth = 0;
    d.Format = CU_AD_FORMAT_UNSIGNED_INT32;
    d.NumChannels = 1;
    return cuMipmappedArrayCreate(&a->mipmap, &d, 4);
}

static CUresult f_mipmap(struct alloc *a)
{
    return cuMipmappedArrayDestroy(a->mipmap);
}

static CUresult a_async(struct alloc *a)
{
    CUresult r = cuMemAllocAsync(&a->ptr, a->size, stream);
    return r == CUDA_SUCCESS ? cuStreamSynchronize(stream) : r;
}

static CUresult f_async(struct alloc *a)
{
    CUresult r = cuMemFreeAsync(a->ptr, stream);
    if (r == CUDA_SUCCESS)
        r = cuStreamSynchronize(stream);
    CUmemoryPool pool;
    if (r == CUDA_SUCCESS)
        r = cuDeviceGetDefaultMemPool(&pool, g.dev);
    return r == CUDA_SUCCESS ? cuMemPoolTrimTo(pool, 0) : r;
}

static CUresult a_from_pool(struct alloc *a)
{
    CUmemPoolProps p;
    memset(&p, 0, sizeof p);
    p.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = g.dev;
    CUresult r = cuMemPoolCreate(&a->pool, &p);
    if (r != CUDA_SUCCESS)
        return r;
    r = cuMemAllocFromPoolAsync(&a->ptr, a->size, a->pool, stream);
    if (r == CUDA_SUCCESS)
        r = cuStreamSynchronize(stream);
    if (r != CUDA_SUCCESS) {
        CHECK(cuMemPoolDestroy(a->pool));
        a->pool = NULL;
    }
    return r;
}

static CUresult f_from_pool(struct alloc *a)
{
    CUresult r = cuMemFreeAsync(a->ptr, stream);
    if (r == CUDA_SUCCESS)
        r = cuStreamSynchronize(stream);
    return r == CUDA_SUCCESS ? cuMemPoolDestroy(a->pool) : r;
}

static CUmemAllocationProp vmm_prop(void)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = g.dev;
    return p;
}

static CUresult a_vmm(struct alloc *a)
{
    CUmemAllocationProp p = vmm_prop();
    size_t gran = 0;
    CUresult r = cuMemGetAllocationGranularity(&gran, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (r != CUDA_SUCCESS)
        return r;
    a->size = (a->size + gran - 1) / gran * gran;
    r = cuMemCreate(&a->handle, a->size, &p, 0);
    if (r != CUDA_SUCCESS)
        return r;
    CHECK(cuMemAddressReserve(&a->ptr, a->size, 0, 0, 0));
    r = cuMemMap(a->ptr, a->size, 0, a->handle, 0);
    if (r == CUDA_SUCCESS) {
        CUmemAccessDesc acc;
        memset(&acc, 0, sizeof acc);
        acc.location = p.location;
        acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        r = cuMemSetAccess(a->ptr, a->size, &acc, 1);
        if (r != CUDA_SUCCESS)
            CHECK(cuMemUnmap(a->ptr, a->size));
    }
    if (r != CUDA_SUCCESS) {
        CHECK(cuMemAddressFree(a->ptr, a->size));
        CHECK(cuMemRelease(a->handle));
    }
    return r;
}

static CUresult f_vmm(struct alloc *a)
{
    CUresult r = cuMemUnmap(a->ptr, a->size);
    if (r == CUDA_SUCCESS)
        r = cuMemAddressFree(a->ptr, a->size);
    if (r == CUDA_SUCCESS)
        r = cuMemRelease(a->handle);
    return r;
}

static const struct path {
    const char *name;
    CUresult (*alloc)(struct alloc *);
    CUresult (*free)(struct alloc *);
} paths[] = {
    {"mem_alloc", a_mem_alloc, f_mem_free},
    {"mem_alloc_pitch", a_pitch, f_mem_free},
    {"mem_alloc_managed", a_managed, f_mem_free},
    {"array", a_array, f_array},
    {"array3d", a_array3d, f_array},
    {"mipmapped_array", a_mipmap, f_mipmap},
    {"mem_alloc_async", a_async, f_async},
    {"mem_alloc_from_pool", a_from_pool, f_from_pool},
    {"vmm", a_vmm, f_vmm},
};
#define NPATHS (sizeof paths / sizeof paths[0])

int main(int argc, char **argv)
{
    uint64_t size = 64 * MIB;
    const char *only = NULL;
    int hold = 0, hold_seconds = 0;
    const struct opt opts[] = {
        {"--size", OPT_SIZE, &size, "bytes per allocation (default 64m)"},
        {"--path", OPT_STR, &only, "only this path (mem_alloc, mem_alloc_pitch, mem_alloc_managed, "
                                   "array, array3d, mipmapped_array, mem_alloc_async, "
                                   "mem_alloc_from_pool, vmm)"},
        {"--hold", OPT_FLAG, &hold, "keep the allocations until a signal, then free"},
        {"--hold-seconds", OPT_INT, &hold_seconds, "bound the hold (default 0 = until a signal)"},
        {NULL, OPT_FLAG, NULL, NULL},
    };
    parse_opts(argc, argv, opts, "Allocate and free once through every allocation path.");
    if (size == 0)
        die("--size must be > 0");
    int selected[NPATHS] = {0}, nsel = 0;
    for (size_t i = 0; i < NPATHS; i++)
        if (!only || !strcmp(only, paths[i].name))
            selected[i] = 1, nsel++;
    if (nsel == 0) {
        out("error=usage what=\"unknown --path\" arg=\"%s\"\n", only);
        return 2;
    }
    if (hold) {
        stop_on_signals();
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_report_signal;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGUSR2, &sa, NULL);
    }

    gpu_open(&g, opt_device);
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    struct alloc allocs[NPATHS];
    CUresult results[NPATHS];
    int failed = 0;
    for (size_t i = 0; i < NPATHS; i++) {
        if (!selected[i])
            continue;
        memset(&allocs[i], 0, sizeof allocs[i]);
        allocs[i].size = (size_t)size;
        long long before = (long long)mem_used();
        results[i] = paths[i].alloc(&allocs[i]);
        long long delta = (long long)mem_used() - before;
        out("path=%s result=%s used_delta=%lld\n", paths[i].name, cu_name(results[i]), delta);
        failed += results[i] != CUDA_SUCCESS;
        if (!hold && results[i] == CUDA_SUCCESS) {
            before = (long long)mem_used();
            CUresult fr = paths[i].free(&allocs[i]);
            out("path=%s free_result=%s freed_delta=%lld\n", paths[i].name, cu_name(fr),
                before - (long long)mem_used());
            failed += fr != CUDA_SUCCESS;
        }
    }
    if (hold) {
        out("holding=1 used=%llu\n", (unsigned long long)mem_used());
        uint64_t deadline = now_ns() + (uint64_t)hold_seconds * 1000000000ull;
        int reports = 0;
        while (!stop_requested && (hold_seconds == 0 || now_ns() < deadline)) {
            if (report_requested) {
                report_requested = 0;
                size_t f = 0, t = 0;
                meminfo(&f, &t);
                out("report=%d free=%llu total=%llu\n", ++reports, (unsigned long long)f, (unsigned long long)t);
            }
            sleep_ns(20000000ull);
        }
        for (size_t i = 0; i < NPATHS; i++) {
            if (!selected[i] || results[i] != CUDA_SUCCESS)
                continue;
            CUresult fr = paths[i].free(&allocs[i]);
            out("path=%s free_result=%s\n", paths[i].name, cu_name(fr));
            failed += fr != CUDA_SUCCESS;
        }
    }
    CHECK(cuStreamDestroy_v2(stream));
    gpu_close(&g);
    out("paths=%d failed=%d result=%s\n", nsel, failed, failed ? "FAIL" : "PASS");
    return failed ? 1 : 0;
}
