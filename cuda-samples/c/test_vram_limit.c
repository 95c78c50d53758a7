/*
 * test_vram_limit: allocate fixed-size steps until CUDA_ERROR_OUT_OF_MEMORY and report how
 * much fit. With --expect, fail unless the amount is within --tolerance of the expectation.
 *
 *   --api driver|pitch|managed|vmm|async   which allocation entry point (default driver)
 *   --step SIZE        bytes per allocation (default 100m)
 *   --expect SIZE      expected allocatable amount; exit 1 if outside the tolerance
 *   --tolerance SIZE   allowed |allocated - expect| (default: one step)
 *   --max SIZE         stop (without OOM) after this much; default unlimited, except
 *                      managed: 2 x cuDeviceTotalMem (managed memory may oversubscribe)
 *
 * Output: api= step_bytes=, then allocated_bytes= allocated_mib= allocations=
 * stop_reason=oom|max meminfo_total= meminfo_free= (meminfo read while still holding it all),
 * with --expect: expect_bytes= tolerance_bytes= within_tolerance=1|0. Any error other than
 * CUDA_ERROR_OUT_OF_MEMORY fails with error=NAME.
 */
#include <stdlib.h>
#include <string.h>

#include "gpu.h"

enum api { API_DRIVER, API_PITCH, API_MANAGED, API_VMM, API_ASYNC };

struct block {
    CUdeviceptr ptr;
    size_t size;
    CUmemGenericAllocationHandle handle; /* vmm */
};

static CUstream stream;
static size_t vmm_granularity;
static CUmemAllocationProp vmm_prop;

/* One allocation of `step` bytes; fills b (b->size = bytes really allocated). */
static CUresult alloc_one(enum api api, size_t step, struct block *b)
{
    memset(b, 0, sizeof *b);
    switch (api) {
    case API_DRIVER:
        b->size = step;
        return cuMemAlloc_v2(&b->ptr, step);
    case API_PITCH: {
        const size_t width = 64 * 1024;
        size_t height = (step + width - 1) / width, pitch = 0;
        CUresult r = cuMemAllocPitch_v2(&b->ptr, &pitch, width, height, 4);
        b->size = pitch * height;
        return r;
    }
    case API_MANAGED:
        b->size = step;
        return cuMemAllocManaged(&b->ptr, step, CU_MEM_ATTACH_GLOBAL);
    case API_ASYNC: {
        b->size = step;
        CUresult r = cuMemAllocAsync(&b->ptr, step, stream);
        if (r == CUDA_SUCCESS)
            r = cuStreamSynchronize(stream);
        return r;
    }
    case API_VMM: {
        size_t sz = (step + vmm_granularity - 1) / vmm_granularity * vmm_granularity;
        CUresult r = cuMemCreate(&b->handle, sz, &vmm_prop, 0);
        if (r != CUDA_SUCCESS)
            return r;
        CHECK(cuMemAddressReserve(&b->ptr, sz, 0, 0, 0));
        r = cuMemMap(b->ptr, sz, 0, b->handle, 0);
        if (r == CUDA_SUCCESS) {
            CUmemAccessDesc acc;
            memset(&acc, 0, sizeof acc);
            acc.location = vmm_prop.location;
            acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
            r = cuMemSetAccess(b->ptr, sz, &acc, 1);
            if (r != CUDA_SUCCESS)
                CHECK(cuMemUnmap(b->ptr, sz));
        }
        if (r != CUDA_SUCCESS) {
            CHECK(cuMemAddressFree(b->ptr, sz));
            CHECK(cuMemRelease(b->handle));
            return r;
        }
        b->size = sz;
        return CUDA_SUCCESS;
    }
    }
    return CUDA_ERROR_INVALID_VALUE;
}

static void free_one(enum api api, struct block *b)
{
    switch (api) {
    case API_VMM:
        CHECK(cuMemUnmap(b->ptr, b->size));
        CHECK(cuMemAddressFree(b->ptr, b->size));
        CHECK(cuMemRelease(b->handle));
        break;
    case API_ASYNC:
        CHECK(cuMemFreeAsync(b->ptr, stream));
        break;
    default:
        CHECK(cuMemFree_v2(b->ptr));
        break;
    }
}

int main(int argc, char **argv)
{
    const char *api_name = "driver";
    uint64_t step = 100 * MIB, expect = UINT64_MAX, tolerance = UINT64_MAX, max = 0;
    const struct opt opts[] = {
        {"--api", OPT_STR, &api_name, "driver|pitch|managed|vmm|async (default driver)"},
        {"--step", OPT_SIZE, &step, "bytes per allocation (default 100m)"},
        {"--expect", OPT_SIZE, &expect, "expected allocatable bytes (exit 1 if outside tolerance)"},
        {"--tolerance", OPT_SIZE, &tolerance, "allowed deviation from --expect (default one step)"},
        {"--max", OPT_SIZE, &max, "stop after this much (default unlimited; managed: 2x total)"},
        {NULL, OPT_FLAG, NULL, NULL},
    };
    parse_opts(argc, argv, opts,
               "Allocate --step sized blocks until CUDA_ERROR_OUT_OF_MEMORY; print how much fit.");
    int expect_given = expect != UINT64_MAX;
    if (step == 0)
        die("--step must be > 0");
    if (tolerance == UINT64_MAX)
        tolerance = step;

    enum api api;
    if (!strcmp(api_name, "driver"))
        api = API_DRIVER;
    else if (!strcmp(api_name, "pitch"))
        api = API_PITCH;
    else if (!strcmp(api_name, "managed"))
        api = API_MANAGED;
    else if (!strcmp(api_name, "vmm"))
        api = API_VMM;
    else if (!strcmp(api_name, "async"))
        api = API_ASYNC;
    else {
        out("error=usage what=\"unknown --api\" arg=\"%s\"\n", api_name);
        return 2;
    }

    struct gpu g;
    gpu_open(&g, opt_device);
    if (api == API_MANAGED && max == 0) {
        size_t total = 0;
        CHECK(cuDeviceTotalMem_v2(&total, g.dev));
        max = 2 * (uint64_t)total;
    }
    if (api == API_ASYNC)
        CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    if (api == API_VMM) {
        memset(&vmm_prop, 0, sizeof vmm_prop);
        vmm_prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        vmm_prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        vmm_prop.location.id = g.dev;
        CHECK(cuMemGetAllocationGranularity(&vmm_granularity, &vmm_prop,
                                            CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    }
    out("api=%s step_bytes=%llu\n", api_name, (unsigned long long)step);

    size_t cap = 64, n = 0;
    struct block *blocks = malloc(cap * sizeof *blocks);
    uint64_t allocated = 0;
    const char *stop_reason = "oom";
    CUresult last = CUDA_SUCCESS;
    for (;;) {
        if (max && allocated + step > max) {
            stop_reason = "max";
            break;
        }
        if (n == cap) {
            cap *= 2;
            blocks = realloc(blocks, cap * sizeof *blocks);
            if (!blocks)
                die("out of host memory for the block list");
        }
        last = alloc_one(api, (size_t)step, &blocks[n]);
        if (last == CUDA_ERROR_OUT_OF_MEMORY)
            break;
        if (last != CUDA_SUCCESS)
            cu_fail(last, "allocation step", __FILE__, __LINE__);
        allocated += blocks[n].size;
        n++;
    }
    size_t mfree = 0, mtotal = 0;
    meminfo(&mfree, &mtotal);
    out("allocated_bytes=%llu allocated_mib=%llu allocations=%zu stop_reason=%s last_result=%s\n",
        (unsigned long long)allocated, (unsigned long long)(allocated / MIB), n, stop_reason,
        cu_name(last));
    out("meminfo_total=%zu meminfo_free=%zu\n", mtotal, mfree);

    for (size_t i = 0; i < n; i++)
        free_one(api, &blocks[i]);
    if (api == API_ASYNC) {
        CHECK(cuStreamSynchronize(stream));
        CHECK(cuStreamDestroy_v2(stream));
    }
    free(blocks);
    out("freed=%zu\n", n);

    int rc = 0;
    if (expect_given) {
        uint64_t diff = allocated > expect ? allocated - expect : expect - allocated;
        int ok = diff <= tolerance;
        out("expect_bytes=%llu tolerance_bytes=%llu within_tolerance=%d\n",
            (unsigned long long)expect, (unsigned long long)tolerance, ok);
        rc = ok ? 0 : 1;
    }
    gpu_close(&g);
    out("result=%s\n", rc ? "FAIL" : "PASS");
    return rc;
}
