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

typedef CUresult (*launch_fn)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,
                              unsigned int, unsigned int, CUstream, void **, void **);
/* Path 0: the exported cuLaunchKernel (an LD_PRELOAD hook's); path 1: the driver's own (--ab). */
static launch_fn launches[2] = {cuLaunchKernel, NULL};
static int n = 20000, sync_every = 0;
static struct kernels k;
static CUstream s;

static double batch(int which, void *ctx)
{
    (void)ctx;
    uint64_t t0 = now_ns();
    for (int i = 1; i <= n; i++) {
        CHECK(launches[which](k.empty, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
        if (sync_every && i % sync_every == 0)
            CHECK(cuStreamSynchronize(s));
    }
    CHECK(cuStreamSynchronize(s));
    return (double)(now_ns() - t0) / n;
}

int main(int argc, char **argv)
{
    int runs = 11, ab = 0;
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
    gpu_open_launching(&g, &k, &s, 1);
    if (ab)
        launches[1] = (launch_fn)driver_symbol("cuLaunchKernel");
    out("n=%d runs=%d sync_every=%d\n", n, runs, sync_every);
    time_runs("launch", runs, ab, batch, NULL);
    CHECK(cuStreamDestroy_v2(s));
    kernels_unload(&k);
    gpu_close(&g);
    return 0;
}
