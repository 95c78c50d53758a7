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
 *
 * --slow-us N: also time each pair and count those over N us (per path): slow_pairs= (the exported
 * entry points), slow_pairs_driver= (--ab), pairs= (per path, the warm-up run's included),
 * max_pair_us=, max_pair_driver_us=, seconds= (all runs), slow_pairs_per_s= (slow_pairs / seconds),
 * first_slow_s= (when the exported path's first slow pair ended, seconds after the first run, the
 * warm-up's included, began; -1: none: a stall of the hook's start-up comes early, a periodic one anywhere),
 * slow_time_share= (the exported path's time spent in its slow pairs, over all its timed pairs:
 * at most what the stalls add to its mean).
 * A pair that waits for something else in the driver (another thread's NVML calls, if they hold a
 * lock the allocation needs) is a slow pair; a median of runs hides a few of them.
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
static double slow_us = 0;
/* --slow-us: per path, pairs over slow_us, pairs timed, the longest pair, and the time (ns) in
 * slow pairs and in all timed pairs. */
static long slow[2], timed[2];
static uint64_t longest[2], slow_time[2], timed_time[2];
/* When the timed runs began, and when each path's first slow pair ended (0: none yet). */
static uint64_t runs_t0, first_slow[2];

static double pairs(int which, void *ctx)
{
    (void)ctx;
    uint64_t t0 = now_ns(), slow_ns = (uint64_t)(slow_us * 1000.0);
    for (int i = 0; i < n; i++) {
        uint64_t p0 = slow_ns ? now_ns() : 0;
        CUdeviceptr p;
        CHECK(allocs[which](&p, (size_t)size));
        CHECK(frees[which](p));
        if (slow_ns) {
            uint64_t d = now_ns() - p0;
            slow[which] += d > slow_ns;
            if (d > slow_ns && !first_slow[which])
                first_slow[which] = now_ns() - runs_t0;
            slow_time[which] += d > slow_ns ? d : 0;
            timed[which]++;
            timed_time[which] += d;
            longest[which] = d > longest[which] ? d : longest[which];
        }
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
        {"--slow-us", OPT_DOUBLE, &slow_us, "also count pairs slower than this many microseconds"},
        {NULL, OPT_FLAG, NULL, NULL},
    };
    parse_opts(argc, argv, opts, "cuMemAlloc_v2 + cuMemFree_v2 cost (median ns per pair).");
    if (n < 1 || runs < 1 || size == 0 || slow_us < 0)
        die("need --n >= 1, --runs >= 1, --size > 0, --slow-us >= 0");

    struct gpu g;
    gpu_open(&g, opt_device);
    if (ab) {
        allocs[1] = (alloc_fn)driver_symbol("cuMemAlloc_v2");
        frees[1] = (free_fn)driver_symbol("cuMemFree_v2");
    }
    out("size_bytes=%llu n=%d runs=%d\n", (unsigned long long)size, n, runs);
    uint64_t t0 = now_ns();
    runs_t0 = t0;
    time_runs("malloc_free", runs, ab, pairs, NULL);
    double secs = (double)(now_ns() - t0) / 1e9;
    if (slow_us > 0)
        out("slow_over_us=%.0f slow_pairs=%ld slow_pairs_driver=%ld pairs=%ld max_pair_us=%.0f max_pair_driver_us=%.0f seconds=%.3f "
            "slow_pairs_per_s=%.2f first_slow_s=%.3f slow_time_share=%.5f\n",
            slow_us, slow[0], slow[1], timed[0], (double)longest[0] / 1000.0, (double)longest[1] / 1000.0, secs,
            (double)slow[0] / secs, first_slow[0] ? (double)first_slow[0] / 1e9 : -1.0, timed_time[0] ? (double)slow_time[0] / (double)timed_time[0] : 0.0);
    gpu_close(&g);
    return 0;
}
