/*
 * bench_launch: cost of launching an empty kernel (1 block x 1 thread). Each run issues --n
 * asynchronous launches on one stream and synchronizes at the end of the batch (and after every
 * --sync-every launches when given); the cost is the run's wall time / n. Prints the median of
 * --runs runs after one warm-up run.
 *
 * Output: n= runs= sync_every=, launch_ns= (median) launch_ns_min= launch_ns_max=.
 *
 * --ab: each run also times --n launches through the driver's own cuLaunchKernel (driver_symbol:
 * no hook), alternating which goes first; prints launch_driver_ns= (median) and ab_ratio= (the
 * median of per-run ratios, exported / driver; min, max): the hook's cost in one process.
 */
#include <stdlib.h>

#include "gpu.h"

int main(int argc, char **argv)
{
    int n = 20000, runs = 11, sync_every = 0, ab = 0;
    const struct opt opts[] = {
        {"--n", OPT_INT, &n, "launches per run (default 20000)"},
        {"--runs", OPT_INT, &runs, "measured runs, median reported (default 11)"},
        {"--sync-every", OPT_INT, &sync_every, "also synchronize every N launches (default 0)"},
        {"--ab", OPT_FLAG, &ab, "also time the driver's own cuLaunchKernel in each run (in-process A/B)"},
        {NULL, OPT_FLAG, NULL, NULL},
    };
    parse_opts(argc, argv, opts, "Empty-kernel launch cost (median ns per launch).");
    if (n < 1 || runs < 1 || sync_every < 0)
        die("need --n >= 1, --runs >= 1, --sync-every >= 0");

    struct gpu g;
    struct kernels k;
    CUstream s;
    gpu_open_launching(&g, &k, &s, 1);
    typedef CUresult (*launch_fn)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,
                                  unsigned int, unsigned int, CUstream, void **, void **);
    launch_fn launches[2] = {cuLaunchKernel, ab ? (launch_fn)driver_symbol("cuLaunchKernel") : NULL};
    double *per = calloc((size_t)runs, sizeof *per), *per_d = calloc((size_t)runs, sizeof *per_d);
    double *ratio = calloc((size_t)runs, sizeof *ratio);
    for (int run = -1; run < runs; run++) {
        double t[2] = {0, 0};
        for (int j = 0; j < (ab ? 2 : 1); j++) {
            int which = ab ? (j + run + 1) % 2 : 0; /* alternate which path goes first */
            uint64_t t0 = now_ns();
            for (int i = 1; i <= n; i++) {
                CHECK(launches[which](k.empty, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
                if (sync_every && i % sync_every == 0)
                    CHECK(cuStreamSynchronize(s));
            }
            CHECK(cuStreamSynchronize(s));
            t[which] = (double)(now_ns() - t0) / n;
        }
        if (run >= 0) {
            per[run] = t[0];
            per_d[run] = t[1];
            ratio[run] = ab ? t[0] / t[1] : 0;
        }
    }
    out("n=%d runs=%d sync_every=%d\n", n, runs, sync_every);
    print_median("launch_ns", per, runs);
    if (ab) {
        print_median("launch_driver_ns", per_d, runs);
        print_median_ratio("ab_ratio", ratio, runs);
    }
    free(per);
    free(per_d);
    free(ratio);
    CHECK(cuStreamDestroy_v2(s));
    kernels_unload(&k);
    gpu_close(&g);
    return 0;
}
