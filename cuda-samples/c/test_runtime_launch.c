/*
 * test_runtime_launch: launch the full-GPU spin kernel (4 blocks per SM x 256 threads, each
 * spinning --us microseconds of device clock) back to back and report the rate every second.
 * It keeps launching until --seconds pass (0 = until SIGINT/SIGTERM), so a cap can be changed
 * while it runs and the per-second lines show the effect.
 *
 *   --us US            kernel length in microseconds (default 1000)
 *   --seconds N        run time, 0 = forever (default 10)
 *   --sync-every N     cuStreamSynchronize after every N launches (default 1; 0 = only once
 *                      per second)
 *   --default-stream   launch on the legacy default stream (0) instead of a created stream
 *
 * Output: kernel_us= kernel_cycles= blocks= threads= sync_every=, then each second
 * `second=K kernels_per_sec=X`, at the end total_kernels= elapsed_s= avg_kernels_per_sec=
 * min_kernels_per_sec= max_kernels_per_sec=.
 */
#include "gpu.h"

int main(int argc, char **argv)
{
    double us = 1000.0;
    int seconds = 10, sync_every = 1, default_stream = 0;
    const struct opt opts[] = {
        {"--us", OPT_DOUBLE, &us, "kernel length in microseconds (default 1000)"},
        {"--seconds", OPT_INT, &seconds, "run time in seconds, 0 = forever (default 10)"},
        {"--sync-every", OPT_INT, &sync_every, "synchronize after every N launches (default 1)"},
        {"--default-stream", OPT_FLAG, &default_stream, "use stream 0 instead of a new stream"},
        {NULL, OPT_FLAG, NULL, NULL},
    };
    parse_opts(argc, argv, opts, "Launch the spin kernel back to back; print kernels/s each second.");
    if (us <= 0 || seconds < 0 || sync_every < 0)
        die("need --us > 0, --seconds >= 0, --sync-every >= 0");
    stop_on_signals();

    struct gpu g;
    struct kernels k;
    CUstream s;
    gpu_open_launching(&g, &k, &s, !default_stream);
    uint64_t cycles = spin_cycles(&g, us);
    out("kernel_us=%.1f kernel_cycles=%llu blocks=%d threads=%d sync_every=%d\n", us,
        (unsigned long long)cycles, g.sms * SPIN_BLOCKS_PER_SM, SPIN_THREADS, sync_every);

    struct rate r;
    rate_start(&r, "kernels", 1);
    int last_second = 0;
    uint64_t since_sync = 0;
    while (!stop_requested) {
        CHECK(launch_spin(&g, &k, cycles, s));
        since_sync++;
        if (sync_every > 0 && since_sync >= (uint64_t)sync_every) {
            CHECK(cuStreamSynchronize(s));
            since_sync = 0;
        }
        double t = rate_add(&r, 1);
        if (r.second != last_second) {
            last_second = r.second;
            if (sync_every == 0) {
                CHECK(cuStreamSynchronize(s));
                since_sync = 0;
            }
        }
        if (seconds > 0 && t >= seconds)
            break;
    }
    CHECK(cuStreamSynchronize(s));
    rate_finish(&r);
    if (s)
        CHECK(cuStreamDestroy_v2(s));
    kernels_unload(&k);
    gpu_close(&g);
    return 0;
}
