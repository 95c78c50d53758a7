/*
 * test_rtld_next: a program with its own cuMemAlloc_v2 (exported with -rdynamic, so it is
 * the definition every call in the program binds to) that forwards with
 * dlsym(RTLD_NEXT, "cuMemAlloc_v2"), the way profilers and tracing shims wrap the driver.
 * RTLD_NEXT is relative to this program, so it must reach the next object in the search order
 * (the preloaded libvgpu.so hook, else the driver) and allocations must still be capped.
 *
 *   --step SIZE   allocation step (default 64m)
 *   --over SIZE   first try one allocation of this size and report it (e.g. over a cap)
 *
 * Output: rtld_next=found [over_bytes= over_result=], then rtld_next_allocated_bytes=
 * rtld_next_allocated_mib= allocations= last_result= wrapper_calls=, meminfo_total=
 * meminfo_free=, result=PASS|FAIL (PASS: every call went through the wrapper and allocation
 * stopped with CUDA_ERROR_OUT_OF_MEMORY).
 */
#include <dlfcn.h>
#include <stdlib.h>

#include "gpu.h"

typedef CUresult (*fn_mem_alloc)(CUdeviceptr *, size_t);
static fn_mem_alloc next_mem_alloc;
static unsigned long wrapper_calls;

static fn_mem_alloc resolve_next(void)
{
    if (!next_mem_alloc) {
        *(void **)&next_mem_alloc = dlsym(RTLD_NEXT, "cuMemAlloc_v2");
        if (!next_mem_alloc)
            die("dlsym(RTLD_NEXT, \"cuMemAlloc_v2\") found nothing: %s", dlerror());
    }
    return next_mem_alloc;
}

/* The program's own definition: interposes on every later object for this symbol. */
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    wrapper_calls++;
    return resolve_next()(dptr, bytesize);
}

int main(int argc, char **argv)
{
    uint64_t step = 64 * MIB, over = 0;
    const struct opt opts[] = {
        {"--step", OPT_SIZE, &step, "allocation step (default 64m)"},
        {"--over", OPT_SIZE, &over, "first try one allocation of this size"},
        {NULL, OPT_FLAG, NULL, NULL},
    };
    parse_opts(argc, argv, opts,
               "Wrap cuMemAlloc_v2 in the program and forward with dlsym(RTLD_NEXT).");
    if (step == 0)
        die("--step must be > 0");
    resolve_next();
    out("rtld_next=found\n");

    struct gpu g;
    gpu_open(&g, opt_device);
    unsigned long expected_calls = 0;
    if (over) {
        CUdeviceptr p = 0;
        CUresult r = cuMemAlloc_v2(&p, (size_t)over);
        expected_calls++;
        out("over_bytes=%llu over_result=%s\n", (unsigned long long)over, cu_name(r));
        if (r == CUDA_SUCCESS)
            CHECK(cuMemFree_v2(p));
    }

    CUdeviceptr *ptrs;
    CUresult last;
    size_t n = alloc_until_fail(cuMemAlloc_v2, (size_t)step, &ptrs, &last);
    expected_calls += n + 1;
    size_t mfree = 0, mtotal = 0;
    meminfo(&mfree, &mtotal);
    out("rtld_next_allocated_bytes=%llu rtld_next_allocated_mib=%llu allocations=%zu "
        "last_result=%s wrapper_calls=%lu\n",
        (unsigned long long)(n * step), (unsigned long long)(n * step / MIB), n, cu_name(last),
        wrapper_calls);
    out("meminfo_total=%zu meminfo_free=%zu\n", mtotal, mfree);
    for (size_t i = 0; i < n; i++)
        CHECK(cuMemFree_v2(ptrs[i]));
    free(ptrs);
    gpu_close(&g);
    int pass = last == CUDA_ERROR_OUT_OF_MEMORY && wrapper_calls == expected_calls;
    out("result=%s\n", pass ? "PASS" : "FAIL");
    return pass ? 0 : 1;
}
