/*
 * nvml_watch: the device's utilization as NVML reports it, sampled from outside the container
 * (run it without LD_PRELOAD: an independent observer, like host nvidia-smi).
 *
 *   nvml_watch [--seconds S] [--every-ms M] [--skip S0] [--index I]
 *
 * Prints `nvml_util t=<seconds> pct=<P>` per sample, then `mean_util=<mean> max_util=<max>
 * samples=<n>` over the samples taken after --skip seconds.
 */
#include <time.h>

#include "common.h"

int main(int argc, char **argv)
{
    double seconds = 5, skip = 0;
    int every_ms = 100, index = 0;
    const struct opt opts[] = {
        {"--seconds", OPT_DOUBLE, &seconds, "how long to sample (default 5)"},
        {"--every-ms", OPT_INT, &every_ms, "sampling period (default 100)"},
        {"--skip", OPT_DOUBLE, &skip, "seconds left out of the mean (warm-up)"},
        {"--index", OPT_INT, &index, "NVML device index (default 0)"},
        {NULL, 0, NULL, NULL},
    };
    parse_opts(argc, argv, opts, "NVML device utilization, sampled");
    nvmlDevice_t dev;
    if (!nvml_device(NULL, index, &dev))
        die("no NVML device %d", index);
    uint64_t t0 = now_ns();
    double sum = 0;
    unsigned int max = 0;
    int n = 0;
    for (;;) {
        double t = (now_ns() - t0) / 1e9;
        if (t >= seconds)
            break;
        unsigned int pct = 0;
        int rc = nvml_gpu_util(dev, &pct);
        if (rc != 0)
            die("nvmlDeviceGetUtilizationRates returned %d (%s)", rc, nvml_error(rc));
        out("nvml_util t=%.3f pct=%u\n", t, pct);
        if (t >= skip) {
            sum += pct;
            n++;
            if (pct > max)
                max = pct;
        }
        struct timespec ts = {every_ms / 1000, (long)(every_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    out("mean_util=%.1f max_util=%u samples=%d\n", n ? sum / n : 0.0, max, n);
    return 0;
}
