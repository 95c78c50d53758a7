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

int main(int argc, char **argv)
{
    uint64_t size = MIB;
    int n = 2000, runs = 11, ab = 0;
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
    typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
    typedef CUresult (*free_fn)(CUdeviceptr);
    alloc_fn allocs[2] = {cuMemAlloc_v2, ab ? (alloc_fn)driver_symbol("cuMemAlloc_v2") : NULL};
    free_fn frees[2] = {cuMemFree_v2, ab ? (free_fn)driver_symbol("cuMemFree_v2") : NULL};
    double *per = calloc((size_t)runs, sizeof *per), *per_d = calloc((size_t)runs, sizeof *per_d);
    double *ratio = calloc((size_t)runs, sizeof *ratio);
    for (int run = -1; run < runs; run++) {
        double t[2] = {0, 0};
        for (int k = 0; k < (ab ? 2 : 1); k++) {
            int which = ab ? (k + run + 1) % 2 : 0; /* alternate which path goes first */
            uint64_t t0 = now_ns();
            for (int i = 0; i < n; i++) {
                CUdeviceptr p;
                CHECK(allocs[which](&p, (size_t)size));
                CHECK(frees[which](p));
            }
            t[which] = (double)(now_ns() - t0) / n;
        }
        if (run >= 0) {
            per[run] = t[0];
            per_d[run] = t[1];
            ratio[run] = ab ? t[0] / t[1] : 0;
        }
    }
    out("size_bytes=%llu n=%d runs=%d\n", (unsigned long long)size, n, runs);
    print_median("malloc_free_ns", per, runs);
    if (ab) {
        print_median("malloc_free_driver_ns", per_d, runs);
        print_median_ratio("ab_ratio", ratio, runs);
    }
    free(per);
    free(per_d);
    free(ratio);
    gpu_close(&g);
    return 0;
}
