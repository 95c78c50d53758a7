/*
 * bench_malloc: cost of a cuMemAlloc_v2 + cuMemFree_v2 pair of --size bytes. Each run times
 * --n pairs; prints the median of --runs runs after one warm-up run.
 *
 * Output: size_bytes= n= runs=, malloc_free_ns= (median) malloc_free_ns_min= malloc_free_ns_max=.
 *
 * --ab: each run also times --n pairs through the driver's own entry points (driver_symbol: no
 * hook), alternating which goes first; prints malloc_free_driver_ns= (median) and ab_ratio= (the
 * median of per-run ratios, exported / driver; min, max). Under an LD_PRELOAD hook that is the
 * hook's cost without the process-to-process spread of separate runs; with no hook, about 1.
 */
#include <stdlib.h>

#include "gpu.h"

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
/* Path 0: the exported entry points (an LD_PRELOAD hook's); path 1: the driver's own (--ab). */
static alloc_fn allocs[2] = {cuMemAlloc_v2, NULL};
static free_fn frees[2] = {cuMemFree_v2, NULL};
static uint64_t size = MIB;
static int n = 2000;

static double pairs(int which, void *ctx)
{
    (void)ctx;
    uint64_t t0 = now_ns();
    for (int i = 0; i < n; i++) {
        CUdeviceptr p;
        CHECK(allocs[which](&p, (size_t)size));
        CHECK(frees[which](p));
    }
    return (double)(now_ns() - t0) / n;
}

int main(int argc, char **argv)
{
    int runs = 11, ab = 0;
    const struct opt opts[] = {
        {"--size", OPT_SIZE, &size, "bytes per allocation (default 1m)"},
        {"--n", OPT_INT, &n, "pairs per run (default 2000)"},
        {"--runs", OPT_INT, &runs, "measured runs, median reported (default 11)"},
        {"--ab", OPT_FLAG, &ab, "also time the driver's own entry points in each run (in-process A/B)"},
        {NULL, OPT_FLAG, NULL, NULL},
    };
    parse_opts(argc, argv, opts, "cuMemAlloc_v2 + cuMemFree_v2 cost (median ns per pair).");
    if (n < 1 || runs < 1 || size == 0)
        die("need --n >= 1, --runs >= 1, --size > 0");

    struct gpu g;
    gpu_open(&g, opt_device);
    if (ab) {
        allocs[1] = (alloc_fn)driver_symbol("cuMemAlloc_v2");
        frees[1] = (free_fn)driver_symbol("cuMemFree_v2");
    }
    out("size_bytes=%llu n=%d runs=%d\n", (unsigned long long)size, n, runs);
    time_runs("malloc_free", runs, ab, pairs, NULL);
    gpu_close(&g);
    return 0;
}
