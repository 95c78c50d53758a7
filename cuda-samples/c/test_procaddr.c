/*
 * test_procaddr: reach the driver the way the CUDA runtime does. The program does not link
 * libcuda.so.1: it dlopen()s it, dlsym()s cuGetProcAddress_v2 and asks that for every entry
 * point by base name ("cuMemAlloc", ...) with a cudaVersion and flags, then uses only those
 * pointers to allocate until CUDA_ERROR_OUT_OF_MEMORY.
 *
 *   --cuda-version V   version used for the functions that do the work (default 12000)
 *   --step SIZE        allocation step (default 64m)
 *
 * Output: one `lookup symbol=NAME version=V flags=default|ptds result=R status=S found=0|1
 * same_as_dlsym=0|1` line per lookup (versions 12000 and 13000; same_as_dlsym compares with
 * dlsym of the versioned export, e.g. cuMemAlloc_v2 / cuLaunchKernel_ptsz, and for 13000
 * cuCtxSynchronize_v2), then
 * launch_default=R launch_ptds=R, procaddr_allocated_bytes= procaddr_allocated_mib=
 * allocations= last_result=, meminfo_total= meminfo_free= device_total_mem=, result=.
 */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "kernels_ptx.h"

enum fn {
    F_INIT, F_DEVICE_GET, F_PRIMARY_RETAIN, F_PRIMARY_RELEASE, F_CTX_SET_CURRENT,
    F_CTX_SYNC, F_MEM_ALLOC, F_MEM_FREE, F_MEM_GET_INFO, F_DEVICE_TOTAL_MEM,
    F_MODULE_LOAD_DATA, F_MODULE_GET_FUNCTION, F_LAUNCH, F_LAUNCH_PTDS, F_COUNT
};

static const struct lookup {
    const char *base;     /* name given to cuGetProcAddress */
    cuuint64_t flags;     /* CU_GET_PROC_ADDRESS_* */
    const char *exported; /* the versioned export it should resolve to (cudaVersion 12000) */
    const char *exported13; /* same for cudaVersion 13000, when it differs */
} lookups[F_COUNT] = {
    [F_INIT] = {"cuInit", 0, "cuInit", NULL},
    [F_DEVICE_GET] = {"cuDeviceGet", 0, "cuDeviceGet", NULL},
    [F_PRIMARY_RETAIN] = {"cuDevicePrimaryCtxRetain", 0, "cuDevicePrimaryCtxRetain", NULL},
    [F_PRIMARY_RELEASE] = {"cuDevicePrimaryCtxRelease", 0, "cuDevicePrimaryCtxRelease_v2", NULL},
    [F_CTX_SET_CURRENT] = {"cuCtxSetCurrent", 0, "cuCtxSetCurrent", NULL},
    /* CUDA 13 maps cuCtxSynchronize to cuCtxSynchronize_v2, another ABI: the work below always
     * calls the 12000 one. */
    [F_CTX_SYNC] = {"cuCtxSynchronize", 0, "cuCtxSynchronize", "cuCtxSynchronize_v2"},
    [F_MEM_ALLOC] = {"cuMemAlloc", 0, "cuMemAlloc_v2", NULL},
    [F_MEM_FREE] = {"cuMemFree", 0, "cuMemFree_v2", NULL},
    [F_MEM_GET_INFO] = {"cuMemGetInfo", 0, "cuMemGetInfo_v2", NULL},
    [F_DEVICE_TOTAL_MEM] = {"cuDeviceTotalMem", 0, "cuDeviceTotalMem_v2", NULL},
    [F_MODULE_LOAD_DATA] = {"cuModuleLoadData", 0, "cuModuleLoadData", NULL},
    [F_MODULE_GET_FUNCTION] = {"cuModuleGetFunction", 0, "cuModuleGetFunction", NULL},
    [F_LAUNCH] = {"cuLaunchKernel", CU_GET_PROC_ADDRESS_DEFAULT, "cuLaunchKernel", NULL},
    [F_LAUNCH_PTDS] = {"cuLaunchKernel", CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
                       "cuLaunchKernel_ptsz", NULL},
};

typedef CUresult (*fn_init)(unsigned int);
typedef CUresult (*fn_device_get)(CUdevice *, int);
typedef CUresult (*fn_primary_retain)(CUcontext *, CUdevice);
typedef CUresult (*fn_device_only)(CUdevice);
typedef CUresult (*fn_ctx_set_current)(CUcontext);
typedef CUresult (*fn_void)(void);
typedef CUresult (*fn_mem_alloc)(CUdeviceptr *, size_t);
typedef CUresult (*fn_mem_free)(CUdeviceptr);
typedef CUresult (*fn_mem_get_info)(size_t *, size_t *);
typedef CUresult (*fn_device_total_mem)(size_t *, CUdevice);
typedef CUresult (*fn_module_load_data)(CUmodule *, const void *);
typedef CUresult (*fn_module_get_function)(CUfunction *, CUmodule, const char *);
typedef CUresult (*fn_launch)(CUfunction, unsigned int, unsigned int, unsigned int,
                              unsigned int, unsigned int, unsigned int, unsigned int, CUstream,
                              void **, void **);

/* Cast a looked-up pointer to its function type (object -> function pointer via memcpy). */
#define FN(type, p) ((type)fn_ptr(p))
static void (*fn_ptr(void *p))(void)
{
    void (*f)(void);
    memcpy(&f, &p, sizeof f);
    return f;
}

static void *require(void *const table[F_COUNT], enum fn f, int version)
{
    if (!table[f])
        die("cuGetProcAddress_v2(\"%s\", version %d) gave no function", lookups[f].base, version);
    return table[f];
}

int main(int argc, char **argv)
{
    int version = 12000;
    uint64_t step = 64 * MIB;
    const struct opt opts[] = {
        {"--cuda-version", OPT_INT, &version, "cudaVersion for the working set (default 12000)"},
        {"--step", OPT_SIZE, &step, "allocation step (default 64m)"},
        {NULL, OPT_FLAG, NULL, NULL},
    };
    parse_opts(argc, argv, opts,
               "Use the driver only through dlopen + cuGetProcAddress_v2, like the CUDA runtime.");
    if (step == 0)
        die("--step must be > 0");

    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h)
        die("dlopen(libcuda.so.1) failed: %s", dlerror());
    PFN_cuGetProcAddress_v2 gpa;
    *(void **)&gpa = dlsym(h, "cuGetProcAddress_v2");
    if (!gpa)
        die("dlsym(cuGetProcAddress_v2) failed: %s", dlerror());

    const int versions[] = {12000, 13000};
    void *work[F_COUNT] = {0};
    int chosen_seen = 0;
    for (size_t v = 0; v < sizeof versions / sizeof versions[0]; v++) {
        for (int f = 0; f < F_COUNT; f++) {
            void *pfn = NULL;
            CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
            CUresult r = gpa(lookups[f].base, &pfn, versions[v], lookups[f].flags, &status);
            const char *exp = versions[v] >= 13000 && lookups[f].exported13
                                  ? lookups[f].exported13
                                  : lookups[f].exported;
            void *direct = dlsym(h, exp);
            out("lookup symbol=%s version=%d flags=%s result=%s status=%d found=%d "
                "same_as_dlsym=%d\n",
                lookups[f].base, versions[v], lookups[f].flags ? "ptds" : "default", cu_name(r),
                (int)status, r == CUDA_SUCCESS && pfn != NULL, pfn != NULL && pfn == direct);
            int use = f == F_CTX_SYNC ? versions[v] == 12000 : versions[v] == version;
            if (use && r == CUDA_SUCCESS)
                work[f] = pfn;
        }
        chosen_seen |= versions[v] == version;
    }
    if (!chosen_seen)
        for (int f = 0; f < F_COUNT; f++) {
            if (f == F_CTX_SYNC)
                continue;
            CUdriverProcAddressQueryResult status;
            if (gpa(lookups[f].base, &work[f], version, lookups[f].flags, &status) != CUDA_SUCCESS)
                work[f] = NULL;
        }

    CUdevice dev;
    CUcontext ctx;
    CHECK(FN(fn_init, require(work, F_INIT, version))(0));
    CHECK(FN(fn_device_get, require(work, F_DEVICE_GET, version))(&dev, opt_device));
    CHECK(FN(fn_primary_retain, require(work, F_PRIMARY_RETAIN, version))(&ctx, dev));
    CHECK(FN(fn_ctx_set_current, require(work, F_CTX_SET_CURRENT, version))(ctx));

    CUmodule mod;
    CUfunction empty;
    CHECK(FN(fn_module_load_data, require(work, F_MODULE_LOAD_DATA, version))(&mod,
                                                                               vgpu_kernels_ptx));
    CHECK(FN(fn_module_get_function, require(work, F_MODULE_GET_FUNCTION, version))(
        &empty, mod, VGPU_KERNEL_EMPTY));
    CUresult l1 = FN(fn_launch, require(work, F_LAUNCH, version))(empty, 1, 1, 1, 1, 1, 1, 0,
                                                                  NULL, NULL, NULL);
    CUresult l2 = FN(fn_launch, require(work, F_LAUNCH_PTDS, version))(empty, 1, 1, 1, 1, 1, 1,
                                                                       0, NULL, NULL, NULL);
    CHECK(FN(fn_void, require(work, F_CTX_SYNC, version))());
    out("launch_default=%s launch_ptds=%s\n", cu_name(l1), cu_name(l2));

    fn_mem_alloc mem_alloc = FN(fn_mem_alloc, require(work, F_MEM_ALLOC, version));
    fn_mem_free mem_free = FN(fn_mem_free, require(work, F_MEM_FREE, version));
    fn_mem_get_info mem_get_info = FN(fn_mem_get_info, require(work, F_MEM_GET_INFO, version));
    CUdeviceptr *ptrs;
    CUresult last;
    size_t n = alloc_until_fail(mem_alloc, (size_t)step, &ptrs, &last);
    size_t mfree = 0, mtotal = 0, dtotal = 0;
    CHECK(mem_get_info(&mfree, &mtotal));
    CHECK(FN(fn_device_total_mem, require(work, F_DEVICE_TOTAL_MEM, version))(&dtotal, dev));
    out("procaddr_allocated_bytes=%llu procaddr_allocated_mib=%llu allocations=%zu "
        "last_result=%s\n",
        (unsigned long long)(n * step), (unsigned long long)(n * step / MIB), n, cu_name(last));
    out("meminfo_total=%zu meminfo_free=%zu device_total_mem=%zu\n", mtotal, mfree, dtotal);
    for (size_t i = 0; i < n; i++)
        CHECK(mem_free(ptrs[i]));
    free(ptrs);
    CHECK(FN(fn_device_only, require(work, F_PRIMARY_RELEASE, version))(dev));

    int pass = last == CUDA_ERROR_OUT_OF_MEMORY && l1 == CUDA_SUCCESS && l2 == CUDA_SUCCESS;
    if (last != CUDA_ERROR_OUT_OF_MEMORY)
        out("error=%s reason=\"allocation stopped with an error other than OOM\"\n",
            cu_name(last));
    out("result=%s\n", pass ? "PASS" : "FAIL");
    return pass ? 0 : 1;
}
