// runtime_launch.cu: CUDA-runtime (cudart) variants of the sample workloads, so the path the
// runtime takes into the driver (cuGetProcAddress_v2 for every entry point) is measured too.
//
//   runtime_launch spin   [--us 1000] [--seconds 10] [--sync-every 1]   full-GPU spin kernel
//                         (4 blocks/SM x 256 threads) back to back: second=K kernels_per_sec=X,
//                         total_kernels= elapsed_s= avg_kernels_per_sec=
//   runtime_launch launch [--n 20000] [--runs 11]    empty-kernel launch cost: launch_ns= (median)
//   runtime_launch malloc [--size-mib 1] [--n 2000] [--runs 11]
//                         cudaMalloc + cudaFree pair cost: malloc_free_ns= (median)
//   runtime_launch oom    [--step-mib 256]           cudaMalloc until cudaErrorMemoryAllocation:
//                         allocated_bytes= allocated_mib= last_error= meminfo_total= meminfo_free=
// Common: [--device D]. Exit 0 on success, 1 on a CUDA error (error=NAME), 2 on bad usage.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

static volatile std::sig_atomic_t g_stop = 0;
static void on_signal(int) { g_stop = 1; }

#define CK(expr)                                                                          \
    do {                                                                                  \
        cudaError_t e_ = (expr);                                                          \
        if (e_ != cudaSuccess) {                                                          \
            std::printf("error=%s call=\"%s\" line=%d\n", cudaGetErrorName(e_), #expr, __LINE__); \
            std::fflush(stdout);                                                          \
            std::exit(1);                                                                 \
        }                                                                                 \
    } while (0)

__global__ void spin_kernel(unsigned long long cycles)
{
    unsigned long long start = clock64();
    while ((unsigned long long)(clock64() - start) < cycles) {
    }
}

__global__ void empty_kernel() {}

static double now_s()
{
    using namespace std::chrono;
    return duration<double>(steady_clock::now().time_since_epoch()).count();
}

struct Args {
    std::string mode;
    double us = 1000.0;
    int seconds = 10, sync_every = 1, n = -1, runs = 11, device = 0;
    double size_mib = 1.0, step_mib = 256.0;
};

static void usage_fail(const char *what, const char *arg)
{
    std::fprintf(stderr, "runtime_launch: %s: %s\n", what, arg);
    std::printf("error=usage what=\"%s\" arg=\"%s\"\n", what, arg);
    std::exit(2);
}

static double num(const char *flag, const char *v)
{
    if (!v)
        usage_fail("missing value for", flag);
    char *end = nullptr;
    double d = std::strtod(v, &end);
    if (end == v || *end)
        usage_fail("not a number", v);
    return d;
}

static Args parse(int argc, char **argv)
{
    Args a;
    if (argc < 2)
        usage_fail("mode required", "spin|launch|malloc|oom");
    a.mode = argv[1];
    for (int i = 2; i < argc; i++) {
        const char *f = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : nullptr;
        if (!std::strcmp(f, "--us")) a.us = num(f, v);
        else if (!std::strcmp(f, "--seconds")) a.seconds = (int)num(f, v);
        else if (!std::strcmp(f, "--sync-every")) a.sync_every = (int)num(f, v);
        else if (!std::strcmp(f, "--n")) a.n = (int)num(f, v);
        else if (!std::strcmp(f, "--runs")) a.runs = (int)num(f, v);
        else if (!std::strcmp(f, "--device")) a.device = (int)num(f, v);
        else if (!std::strcmp(f, "--size-mib")) a.size_mib = num(f, v);
        else if (!std::strcmp(f, "--step-mib")) a.step_mib = num(f, v);
        else usage_fail("unknown option", f);
        i++;
    }
    if (a.runs < 1 || a.seconds < 0 || a.sync_every < 0 || a.us <= 0)
        usage_fail("bad value", "need --runs >= 1, --seconds >= 0, --sync-every >= 0, --us > 0");
    return a;
}

static void print_median(const char *key, std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    double m = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    std::printf("%s=%.1f %s_min=%.1f %s_max=%.1f\n", key, m, key, v.front(), key, v.back());
}

static int run_spin(const Args &a, cudaStream_t s)
{
    int sms = 0, khz = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, a.device));
    CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, a.device));
    unsigned long long cycles = (unsigned long long)(a.us * khz / 1000.0 + 0.5);
    std::printf("sms=%d clock_khz=%d kernel_us=%.1f kernel_cycles=%llu blocks=%d threads=256 "
                "sync_every=%d\n", sms, khz, a.us, cycles, sms * 4, a.sync_every);
    std::fflush(stdout);
    double t0 = now_s(), win = t0, last = t0;
    unsigned long long total = 0, in_win = 0, since_sync = 0;
    int second = 0;
    while (!g_stop) {
        spin_kernel<<<sms * 4, 256, 0, s>>>(cycles);
        CK(cudaGetLastError());
        if (a.sync_every > 0 && ++since_sync >= (unsigned)a.sync_every) {
            CK(cudaStreamSynchronize(s));
            since_sync = 0;
        }
        total++;
        in_win++;
        last = now_s();
        if (last - win >= 1.0) {
            if (a.sync_every == 0)
                CK(cudaStreamSynchronize(s));
            std::printf("second=%d kernels_per_sec=%.1f\n", ++second, in_win / (last - win));
            std::fflush(stdout);
            win = last;
            in_win = 0;
        }
        if (a.seconds > 0 && last - t0 >= a.seconds)
            break;
    }
    CK(cudaStreamSynchronize(s));
    double el = now_s() - t0;
    std::printf("total_kernels=%llu elapsed_s=%.3f\navg_kernels_per_sec=%.1f\n", total, el,
                total / el);
    return 0;
}

static int run_launch(const Args &a, cudaStream_t s)
{
    int n = a.n > 0 ? a.n : 20000;
    std::vector<double> per;
    for (int run = -1; run < a.runs; run++) {
        double t0 = now_s();
        for (int i = 0; i < n; i++)
            empty_kernel<<<1, 1, 0, s>>>();
        CK(cudaGetLastError());
        CK(cudaStreamSynchronize(s));
        if (run >= 0)
            per.push_back((now_s() - t0) * 1e9 / n);
    }
    std::printf("n=%d runs=%d\n", n, a.runs);
    print_median("launch_ns", per);
    return 0;
}

static int run_malloc(const Args &a)
{
    int n = a.n > 0 ? a.n : 2000;
    size_t size = (size_t)(a.size_mib * 1024 * 1024);
    std::vector<double> per;
    for (int run = -1; run < a.runs; run++) {
        double t0 = now_s();
        for (int i = 0; i < n; i++) {
            void *p = nullptr;
            CK(cudaMalloc(&p, size));
            CK(cudaFree(p));
        }
        if (run >= 0)
            per.push_back((now_s() - t0) * 1e9 / n);
    }
    std::printf("size_bytes=%zu n=%d runs=%d\n", size, n, a.runs);
    print_median("malloc_free_ns", per);
    return 0;
}

static int run_oom(const Args &a)
{
    size_t step = (size_t)(a.step_mib * 1024 * 1024);
    std::vector<void *> ptrs;
    cudaError_t last = cudaSuccess;
    for (;;) {
        void *p = nullptr;
        last = cudaMalloc(&p, step);
        if (last != cudaSuccess)
            break;
        ptrs.push_back(p);
    }
    (void)cudaGetLastError(); // clear the sticky-less allocation error
    size_t f = 0, t = 0;
    CK(cudaMemGetInfo(&f, &t));
    unsigned long long bytes = (unsigned long long)ptrs.size() * step;
    std::printf("allocated_bytes=%llu allocated_mib=%llu allocations=%zu last_error=%s\n", bytes,
                bytes >> 20, ptrs.size(), cudaGetErrorName(last));
    std::printf("meminfo_total=%zu meminfo_free=%zu\n", t, f);
    for (void *p : ptrs)
        CK(cudaFree(p));
    int ok = last == cudaErrorMemoryAllocation;
    std::printf("result=%s\n", ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
    Args a = parse(argc, argv);
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    CK(cudaSetDevice(a.device));
    CK(cudaFree(nullptr)); // create the primary context
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int rc;
    if (a.mode == "spin") rc = run_spin(a, s);
    else if (a.mode == "launch") rc = run_launch(a, s);
    else if (a.mode == "malloc") rc = run_malloc(a);
    else if (a.mode == "oom") rc = run_oom(a);
    else usage_fail("unknown mode", a.mode.c_str());
    CK(cudaStreamDestroy(s));
    std::fflush(stdout);
    return rc;
}
