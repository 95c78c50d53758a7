/*
 * test_requests: a latency-sensitive service on the GPU. Each "request" launches the full-GPU
 * spin kernel for --us microseconds on its own stream and synchronizes; its latency is the wall
 * time from just before the launch to the synchronize's return. Between requests the program
 * sleeps --gap-us microseconds (exponentially distributed around that mean with --random, fixed
 * otherwise), so the GPU sees bursts of work with idle time in between.
 *
 *   --us US            kernel length in microseconds (default 2000)
 *   --gap-us US        (mean) pause between requests in microseconds (default 20000)
 *   --random           draw pauses from an exponential distribution (fixed seed)
 *   --seconds N        time spent serving requests (default 5)
 *   --idle-seconds N   then stay alive this long without launching (default 0)
 *   --print-each       print `req=N lat_us=X sync_us=Y` as each request completes (Y: its
 *                      synchronize alone)
 *   --pause-us US      between each request's launch and its synchronize, sleep this long (a
 *                      window in which to suspend the container; default 0)
 *   --extra-syncs N    after each request, synchronize its stream N more times (nothing new queued)
 *   --ctx-only         wait for each request by synchronizing the context, not the stream
 *   --ctx-sync         after each request's stream synchronize, also synchronize the context
 *                      and time it (`ctx_sync_p90_us=`, `ctx_sync_max_us=` at the end)
 *   --side-us US       each request also runs a kernel of US microseconds on a second stream
 *                      (non-blocking, made by the program); with --ctx-only the context
 *                      synchronize must wait for it: `side_unfinished=N` at the end counts the
 *                      synchronizes after which it had not completed (cuStreamQuery), and
 *                      `side_early=N` those that returned sooner than US after its launch
 *   --side-destroy     make the second stream for each request and destroy it right after its
 *                      launch (its work still runs; a context synchronize still waits for it)
 *   --readback         after each request's synchronize, copy 4 bytes of device memory back
 *                      (cuMemcpyDtoH), as a service reading its result would
 *   --side-procaddr    make the second stream with the cuStreamCreate that cuGetProcAddress_v2
 *                      hands out (from dlopen + dlsym), as the CUDA runtime does
 *   --wait-value       once, before serving, make the stream wait on the GPU for a value that
 *                      is already there (cuStreamWaitValue32; "not supported" is ignored)
 *
 * Output: each second `second=K requests=N p50_us=X max_us=Y`; after serving `requests=N
 * lat_p50_us= lat_p90_us= lat_p99_us= lat_max_us=`, then `idle=1` when it stops launching.
 */
#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>

#include "gpu.h"

typedef CUresult (*stream_create_fn)(CUstream *stream, unsigned int flags);

/* cuStreamCreate as the CUDA runtime finds it: cuGetProcAddress_v2, itself from dlsym. */
static stream_create_fn stream_create_via_procaddr(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    PFN_cuGetProcAddress_v2 gpa = lib ? (PFN_cuGetProcAddress_v2)dlsym(lib, "cuGetProcAddress_v2") : NULL;
    void *f = NULL;
    CUdriverProcAddressQueryResult status;
    if (!gpa || gpa("cuStreamCreate", &f, 12000, 0, &status) != CUDA_SUCCESS || !f)
        die("cuGetProcAddress_v2 gave no cuStreamCreate");
    return (stream_create_fn)f;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(double *sorted, int n, double p)
{
    if (n == 0)
        return 0;
    int i = (int)(p * (n - 1) + 0.5);
    return sorted[i];
}

int main(int argc, char **argv)
{
    double us = 2000.0, gap_us = 20000.0;
    double pause_us = 0, side_us = 0;
    int seconds = 5, idle_seconds = 0, random_gap = 0, print_each = 0, ctx_sync = 0, extra_syncs = 0, ctx_only = 0;
    int side_destroy = 0, wait_value = 0, side_procaddr = 0, readback = 0;
    const struct opt opts[] = {
        {"--us", OPT_DOUBLE, &us, "kernel length in microseconds (default 2000)"},
        {"--gap-us", OPT_DOUBLE, &gap_us, "(mean) pause between requests in microseconds (default 20000)"},
        {"--random", OPT_FLAG, &random_gap, "exponentially distributed pauses (fixed seed)"},
        {"--seconds", OPT_INT, &seconds, "time spent serving requests (default 5)"},
        {"--idle-seconds", OPT_INT, &idle_seconds, "then stay alive without launching (default 0)"},
        {"--print-each", OPT_FLAG, &print_each, "print req=N lat_us=X sync_us=Y per request"},
        {"--pause-us", OPT_DOUBLE, &pause_us, "sleep between each launch and its synchronize (default 0)"},
        {"--ctx-only", OPT_FLAG, &ctx_only, "wait for each request by context synchronize"},
        {"--extra-syncs", OPT_INT, &extra_syncs, "synchronize each request's stream N more times"},
        {"--ctx-sync", OPT_FLAG, &ctx_sync, "also synchronize the context after each request, timed"},
        {"--side-us", OPT_DOUBLE, &side_us, "also run a kernel of US on a second, non-blocking stream"},
        {"--side-destroy", OPT_FLAG, &side_destroy, "make and destroy the second stream each request"},
        {"--readback", OPT_FLAG, &readback, "after each request's synchronize, copy 4 bytes back (cuMemcpyDtoH)"},
        {"--side-procaddr", OPT_FLAG, &side_procaddr, "make the second stream with cuGetProcAddress_v2's cuStreamCreate"},
        {"--wait-value", OPT_FLAG, &wait_value, "once, make the stream wait on the GPU for a value already there"},
        {NULL, OPT_FLAG, NULL, NULL},
    };
    parse_opts(argc, argv, opts, "Timed requests: one kernel + synchronize each; report latencies.");
    if (us <= 0 || gap_us < 0 || seconds <= 0 || idle_seconds < 0 || extra_syncs < 0 || pause_us < 0 || side_us < 0)
        die("need --us > 0, --gap-us >= 0, --seconds > 0, --idle-seconds >= 0, --extra-syncs >= 0, --side-us >= 0");
    stop_on_signals();

    struct gpu g;
    struct kernels k;
    CUstream s;
    gpu_open_launching(&g, &k, &s, 1);
    uint64_t cycles = spin_cycles(&g, us);
    CUstream side = NULL;
    uint64_t side_cycles = side_us > 0 ? spin_cycles(&g, side_us) : 0;
    int side_unfinished = 0, side_early = 0;
    stream_create_fn side_create = side_procaddr ? stream_create_via_procaddr() : cuStreamCreate;
    if (side_us > 0 && !side_destroy)
        CHECK(side_create(&side, CU_STREAM_NON_BLOCKING));
    if (wait_value) {
        CUdeviceptr word;
        CHECK(cuMemAlloc_v2(&word, 4));
        CHECK(cuMemsetD32_v2(word, 0, 1));
        CUresult r = cuStreamWaitValue32_v2(s, word, 0, CU_STREAM_WAIT_VALUE_GEQ);
        if (r != CUDA_SUCCESS && r != CUDA_ERROR_NOT_SUPPORTED)
            CHECK(r);
        CHECK(cuStreamSynchronize(s));
        CHECK(cuMemFree_v2(word));
    }
    CUdeviceptr result = 0;
    if (readback)
        CHECK(cuMemAlloc_v2(&result, 4));
    /* Warm-up request (first launch costs). */
    CHECK(launch_spin(&g, &k, cycles, s));
    CHECK(cuStreamSynchronize(s));
    out("kernel_us=%.1f gap_us=%.1f serving=1\n", us, gap_us);

    int cap = 1 << 16, n = 0, win_start = 0, second = 0;
    double *lat = malloc(sizeof(double) * cap), *tmp = malloc(sizeof(double) * cap);
    double *ctx_us = malloc(sizeof(double) * cap);
    if (!lat || !tmp || !ctx_us)
        die("out of memory");
    srand48(12345);
    uint64_t t_start = now_ns(), t_win = t_start;
    while (!stop_requested && now_ns() - t_start < (uint64_t)seconds * 1000000000ull && n < cap) {
        uint64_t t0 = now_ns();
        CHECK(launch_spin(&g, &k, cycles, s));
        uint64_t side_t0 = now_ns();
        if (side_us > 0 && side_destroy)
            CHECK(side_create(&side, CU_STREAM_NON_BLOCKING));
        if (side)
            CHECK(launch_spin(&g, &k, side_cycles, side));
        if (side && side_destroy) {
            CHECK(cuStreamDestroy_v2(side));
            side = NULL;
        }
        if (pause_us > 0)
            sleep_ns((uint64_t)(pause_us * 1000.0));
        uint64_t s0 = now_ns();
        CHECK(ctx_only ? cuCtxSynchronize() : cuStreamSynchronize(s));
        double sync_us = (double)(now_ns() - s0) / 1000.0;
        if (side && ctx_only && cuStreamQuery(side) != CUDA_SUCCESS)
            side_unfinished++;
        if (side_us > 0 && ctx_only && (double)(now_ns() - side_t0) / 1000.0 < side_us)
            side_early++;
        lat[n++] = (double)(now_ns() - t0) / 1000.0;
        if (readback) {
            uint32_t v;
            CHECK(cuMemcpyDtoH_v2(&v, result, 4));
        }
        for (int i = 0; i < extra_syncs; i++)
            CHECK(cuStreamSynchronize(s));
        if (ctx_sync) {
            uint64_t c0 = now_ns();
            CHECK(cuCtxSynchronize());
            ctx_us[n - 1] = (double)(now_ns() - c0) / 1000.0;
        }
        if (print_each)
            out("req=%d lat_us=%.0f sync_us=%.0f\n", n, lat[n - 1], sync_us);
        uint64_t t = now_ns();
        if (t - t_win >= 1000000000ull) {
            int m = n - win_start;
            for (int i = 0; i < m; i++)
                tmp[i] = lat[win_start + i];
            qsort(tmp, m, sizeof(double), cmp_double);
            out("second=%d requests=%d p50_us=%.0f max_us=%.0f\n", ++second, m, pct(tmp, m, 0.5), m ? tmp[m - 1] : 0.0);
            win_start = n;
            t_win = t;
        }
        double gap = random_gap ? -log(1.0 - drand48()) * gap_us : gap_us;
        if (gap > 0)
            sleep_ns((uint64_t)(gap * 1000.0));
    }
    qsort(lat, n, sizeof(double), cmp_double);
    out("requests=%d lat_p50_us=%.0f lat_p90_us=%.0f lat_p99_us=%.0f lat_max_us=%.0f\n", n, pct(lat, n, 0.5),
        pct(lat, n, 0.9), pct(lat, n, 0.99), n ? lat[n - 1] : 0.0);
    if (ctx_sync) {
        qsort(ctx_us, n, sizeof(double), cmp_double);
        out("ctx_sync_p90_us=%.0f ctx_sync_max_us=%.0f\n", pct(ctx_us, n, 0.9), n ? ctx_us[n - 1] : 0.0);
    }
    if (side_us > 0)
        out("side_unfinished=%d side_early=%d\n", side_unfinished, side_early);
    out("idle=1\n");
    uint64_t t_idle = now_ns();
    while (!stop_requested && now_ns() - t_idle < (uint64_t)idle_seconds * 1000000000ull)
        sleep_ns(10000000ull);
    free(lat);
    free(tmp);
    free(ctx_us);
    CHECK(cuStreamDestroy_v2(s));
    kernels_unload(&k);
    gpu_close(&g);
    return 0;
}
