/*
 * test_alloc: allocate and free sizes around powers of two (2^k - 1, 2^k, 2^k + 1 for
 * --min-k..--max-k) and a few sizes over 1 GiB. After each allocation the used memory seen by
 * cuMemGetInfo (and NVML when it loads) must have grown by at least the size and by no more
 * than the size rounded up to 2 MiB plus --tolerance; sizes below --check-from are only
 * reported (the driver sub-allocates small blocks). At the end usage must be back to the
 * start within --tolerance. Sizes larger than the free memory are skipped with a reason.
 *
 * Output per size: size= result= meminfo_delta= [nvml_delta=] check=ok|fail|info
 *                  or size= skipped=1 reason="..."
 * Summary: allocs_ok= allocs_failed= checks_failed= final_delta= [final_nvml_delta=] result=
 */
#include <stdlib.h>

#include "gpu.h"

static int within(long long delta, uint64_t size, uint64_t tolerance)
{
    uint64_t rounded = (size + 2 * MIB - 1) / (2 * MIB) * (2 * MIB);
    return delta >= (long long)size && delta <= (long long)(rounded + tolerance);
}

static long long llabs_diff(long long a, long long b)
{
    return a > b ? a - b : b - a;
}

int main(int argc, char **argv)
{
    int min_k = 10, max_k = 30, no_big = 0;
    uint64_t check_from = 2 * MIB, tolerance = 4 * MIB;
    const struct opt opts[] = {
        {"--min-k", OPT_INT, &min_k, "smallest exponent (default 10)"},
        {"--max-k", OPT_INT, &max_k, "largest exponent (default 30 = 1 GiB)"},
        {"--no-big", OPT_FLAG, &no_big, "skip the sizes over 1 GiB"},
        {"--check-from", OPT_SIZE, &check_from, "check deltas from this size up (default 2m)"},
        {"--tolerance", OPT_SIZE, &tolerance, "slack on deltas and the final usage (default 4m)"},
        {NULL, OPT_FLAG, NULL, NULL},
    };
    parse_opts(argc, argv, opts,
               "Allocate/free sizes around powers of two and check usage accounting.");
    if (min_k < 1 || max_k > 40 || min_k > max_k)
        die("need 1 <= --min-k <= --max-k <= 40");

    struct gpu g;
    gpu_open(&g, opt_device);
    int have_nvml = nvml_used(&g) >= 0;

    uint64_t sizes[3 * 41 + 8];
    int ns = 0;
    for (int k = min_k; k <= max_k; k++) {
        uint64_t p = 1ull << k;
        sizes[ns++] = p - 1;
        sizes[ns++] = p;
        sizes[ns++] = p + 1;
    }
    if (!no_big) {
        const uint64_t big[] = {GIB + GIB / 2, 2 * GIB, 3 * GIB - 1, 4 * GIB + 1};
        for (size_t i = 0; i < sizeof big / sizeof big[0]; i++)
            sizes[ns++] = big[i];
    }

    long long start = (long long)mem_used();
    long long nvml_start = have_nvml ? nvml_used(&g) : -1;
    out("start_used=%lld%s\n", start, have_nvml ? "" : " nvml_checks=skipped");
    int ok = 0, failed = 0, bad_checks = 0;
    for (int i = 0; i < ns; i++) {
        uint64_t size = sizes[i];
        size_t mfree = 0, mtotal = 0;
        meminfo(&mfree, &mtotal);
        if (size > mfree) {
            out("size=%llu skipped=1 reason=\"larger than free memory (%zu)\"\n",
                (unsigned long long)size, mfree);
            continue;
        }
        long long before = (long long)(mtotal - mfree);
        long long nvml_before = have_nvml ? nvml_used(&g) : -1;
        CUdeviceptr p = 0;
        CUresult r = cuMemAlloc_v2(&p, (size_t)size);
        if (r != CUDA_SUCCESS) {
            out("size=%llu result=%s check=fail\n", (unsigned long long)size, cu_name(r));
            failed++;
            continue;
        }
        ok++;
        long long delta = (long long)mem_used() - before;
        long long nvml_delta = have_nvml ? nvml_used(&g) - nvml_before : 0;
        const char *check = "info";
        if (size >= check_from) {
            int good = within(delta, size, tolerance) &&
                       (!have_nvml || within(nvml_delta, size, tolerance));
            check = good ? "ok" : "fail";
            bad_checks += !good;
        }
        if (have_nvml)
            out("size=%llu result=%s meminfo_delta=%lld nvml_delta=%lld check=%s\n",
                (unsigned long long)size, cu_name(r), delta, nvml_delta, check);
        else
            out("size=%llu result=%s meminfo_delta=%lld check=%s\n", (unsigned long long)size,
                cu_name(r), delta, check);
        CHECK(cuMemFree_v2(p));
    }

    long long final_delta = (long long)mem_used() - start;
    int final_ok = llabs_diff(final_delta, 0) <= (long long)tolerance;
    if (have_nvml) {
        long long nd = nvml_used(&g) - nvml_start;
        final_ok = final_ok && llabs_diff(nd, 0) <= (long long)tolerance;
        out("final_nvml_delta=%lld\n", nd);
    }
    int pass = failed == 0 && bad_checks == 0 && final_ok;
    out("allocs_ok=%d allocs_failed=%d checks_failed=%d final_delta=%lld result=%s\n", ok, failed,
        bad_checks, final_delta, pass ? "PASS" : "FAIL");
    gpu_close(&g);
    return pass ? 0 : 1;
}
