/*
 * bench_launch: cost of launching an empty kernel (1 block x 1 thread). Each run issues --n
 * asynchronous launches on one stream and synchronizes at the end of the batch (and after every
 * --sync-every launches when given); the cost is the run's wall time / n. Prints the median of
 * --runs runs after one warm-up run.
 *
 * Output: n= runs= sync_every=, launch_ns= (median) launch_ns_min= launch_ns_max=.
 */
#include <stdlib.h>

#include "gpu.h"

int main(int argc, char **argv)
{
    int n = 20000, runs = 11, sync_every = 0;
    const struct opt opts[] = {
        {"--n", OPT_INT, &n, "launches per run (default 20000)"},
        {"--runs", OPT_INT, &runs, "measured runs, median reported (default 11)"},
        {"--sync-every", OPT_INT, &sync_every, "also synchronize every N launches (default 0)"},
        {NULL, OPT_FLAG, NULL, NULL},
    };
    parse_opts(argc, argv, opts, "Empty-kernel launch cost (median ns per launch).");
    if (n < 1 || runs < 1 || sync_every < 0)
        die("need --n >= 1, --runs >= 1, --sync-every >= 0");

    struct gpu g;
    struct kernels k;
    CUstream s;
    gpu_open_launching(&g, &k, &s, 1);
    double *per = calloc((size_t)runs, sizeof *per);
    for (int run = -1; run < runs; run++) {
        uint64_t t0 = now_ns();
        for (int i = 1; i <= n; i++) {
            CHECK(launch_empty(&k, s));
            if (sync_every && i % sync_every == 0)
                CHECK(cuStreamSynchronize(s));
        }
        CHECK(cuStreamSynchronize(s));
        if (run >= 0)
            per[run] = (double)(now_ns() - t0) / n;
    }
    out("n=%d runs=%d sync_every=%d\n", n, runs, sync_every);
    print_median("launch_ns", per, runs);
    free(per);
    CHECK(cuStreamDestroy_v2(s));
    kernels_unload(&k);
    gpu_close(&g);
    return 0;
}
