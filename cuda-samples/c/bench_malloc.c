/*
 * bench_malloc: cost of a cuMemAlloc_v2 + cuMemFree_v2 pair of --size bytes. Each run times
 * --n pairs; prints the median of --runs runs after one warm-up run.
 *
 * Output: size_bytes= n= runs=, malloc_free_ns= (median) malloc_free_ns_min= malloc_free_ns_max=.
 */
#include <stdlib.h>

#include "gpu.h"

int main(int argc, char **argv)
{
    uint64_t size = MIB;
    int n = 2000, runs = 11;
    const struct opt opts[] = {
        {"--size", OPT_SIZE, &size, "bytes per allocation (default 1m)"},
        {"--n", OPT_INT, &n, "pairs per run (default 2000)"},
        {"--runs", OPT_INT, &runs, "measured runs, median reported (default 11)"},
        {NULL, OPT_FLAG, NULL, NULL},
    };
    parse_opts(argc, argv, opts, "cuMemAlloc_v2 + cuMemFree_v2 cost (median ns per pair).");
    if (n < 1 || runs < 1 || size == 0)
        die("need --n >= 1, --runs >= 1, --size > 0");

    struct gpu g;
    gpu_open(&g, opt_device);
    double *per = calloc((size_t)runs, sizeof *per);
    for (int run = -1; run < runs; run++) {
        uint64_t t0 = now_ns();
        for (int i = 0; i < n; i++) {
            CUdeviceptr p;
            CHECK(cuMemAlloc_v2(&p, (size_t)size));
            CHECK(cuMemFree_v2(p));
        }
        if (run >= 0)
            per[run] = (double)(now_ns() - t0) / n;
    }
    out("size_bytes=%llu n=%d runs=%d\n", (unsigned long long)size, n, runs);
    print_median("malloc_free_ns", per, runs);
    free(per);
    gpu_close(&g);
    return 0;
}
