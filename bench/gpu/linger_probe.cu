// linger_probe: can a latency-critical process keep its context on the GPU across its own host
// gaps, so that a request launched in such a gap does not wait for a switch from another
// process's context (issue 14: queued requests pay that switch twice beside a training)? And does
// the way it lingers make cudaDeviceSynchronize (PyTorch's torch.cuda.synchronize) wait longer?
// A probe for the benchmarks, not part of the hook. Built by bench/gpu/build.sh; written in session
// 19; first run in session 20 (H100).
//
//   linger_probe train SECONDS
//       the other tenant: back-to-back 100-us kernels over every SM, 20 queued at a time; prints
//       `train kernels_per_s=`
//   linger_probe service SECONDS none|stream|green|ctx LINGER_US
//       requests at random (exponential gaps, mean 20 ms), each a 1-ms kernel over every SM and
//       cudaDeviceSynchronize. After each request's kernel it lingers: a one-thread spin of
//       LINGER_US (up to a newer request) waiting on the request's end event, on
//         none:   no linger;
//         stream: a non-blocking stream of the same (primary) context: cudaDeviceSynchronize
//                 waits for it;
//         green:  a stream of a green context of 8 SMs (cuGreenCtxCreate). Session 20 (H100):
//                 cudaDeviceSynchronize on the primary context waits for it too (alone, p50
//                 1.12 ms none, 1.44 ms green or stream at 300 us);
//         ctx:    a stream of a second ordinary context (cuCtxCreate): its own channel group,
//                 which cudaDeviceSynchronize on the primary context does not wait for; whether
//                 it keeps the GPU on this process (a switch between our own two groups with
//                 nothing to preempt, where the linger ends as the next request is launched) is
//                 what the latency beside `train` shows. Session 20 (H100): alone, p50 1.29 ms
//                 against 1.16 (the switch back costs ~0.13 ms); beside `train` or GPT-2 at 50 us
//                 the same p50 / p99 as none. Neither form helps: docs/benchmarks.md, issue 14.
//       prints `service mode= linger_us= requests= p50_ms= p99_ms= max_ms= queued= queued_p50_ms=
//       queued_p99_ms=` (queued: requests that arrived before the previous one returned). Alone, a mode whose
//       p50 is LINGER_US above none's makes cudaDeviceSynchronize wait for the linger.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#define CK(x)                                                                              \
    do {                                                                                   \
        cudaError_t e_ = (x);                                                              \
        if (e_ != cudaSuccess) {                                                           \
            fprintf(stderr, "error=%s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)
#define CKD(x)                                                                             \
    do {                                                                                   \
        CUresult r_ = (x);                                                                 \
        if (r_ != CUDA_SUCCESS) {                                                          \
            const char *s_ = nullptr;                                                      \
            cuGetErrorString(r_, &s_);                                                     \
            fprintf(stderr, "error=%s at %s:%d\n", s_ ? s_ : "?", __FILE__, __LINE__);     \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

__device__ __forceinline__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Every block spins `ns`.
__global__ void work(long long ns) {
    unsigned long long end = now_ns() + ns;
    while (now_ns() < end) {
    }
}

// One thread spins `ns`, or less once `generation` moves past `mine` (a newer linger is queued).
__global__ void linger(long long ns, const volatile unsigned *generation, unsigned mine) {
    unsigned long long end = now_ns() + ns;
    while (now_ns() < end && *generation == mine) {
    }
}

static double secs_now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static int sms() {
    int n = 0;
    CK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, 0));
    return n;
}

static int train(double seconds) {
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int blocks = sms();
    long n = 0;
    double t0 = secs_now();
    while (secs_now() - t0 < seconds) {
        for (int i = 0; i < 20; i++) work<<<blocks, 32, 0, s>>>(100000);
        CK(cudaStreamSynchronize(s));
        n += 20;
    }
    printf("train kernels_per_s=%.1f\n", n / (secs_now() - t0));
    return 0;
}

static double pct(std::vector<double> v, double q) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, (size_t)(q * v.size()))];
}

static int service(double seconds, const char *mode, double linger_us) {
    bool use_stream = !strcmp(mode, "stream"), use_green = !strcmp(mode, "green"), use_ctx = !strcmp(mode, "ctx");
    if (!use_stream && !use_green && !use_ctx && strcmp(mode, "none")) {
        fprintf(stderr, "error=unknown_mode %s\n", mode);
        return 2;
    }
    CK(cudaFree(0));  // the primary context, current
    CUcontext primary;
    CKD(cuCtxGetCurrent(&primary));
    cudaStream_t app;
    CK(cudaStreamCreateWithFlags(&app, cudaStreamNonBlocking));
    unsigned *generation;  // host memory the linger reads: a newer request ends the older linger
    CK(cudaHostAlloc((void **)&generation, sizeof *generation, cudaHostAllocMapped | cudaHostAllocPortable));
    *generation = 0;
    unsigned *generation_dev;
    CK(cudaHostGetDevicePointer((void **)&generation_dev, generation, 0));
    CUstream side = nullptr;
    CUcontext side_ctx = nullptr;  // ctx mode: launches on `side` are made with it current
    if (use_ctx) {
        CUdevice dev;
        CKD(cuDeviceGet(&dev, 0));
        CKD(cuCtxCreate(&side_ctx, nullptr, 0, dev));  // makes it current
        CKD(cuStreamCreate(&side, CU_STREAM_NON_BLOCKING));
        CKD(cuCtxSetCurrent(primary));
    } else if (use_stream) {
        CK(cudaStreamCreateWithFlags((cudaStream_t *)&side, cudaStreamNonBlocking));
    } else if (use_green) {
        CUdevice dev;
        CKD(cuDeviceGet(&dev, 0));
        CUdevResource all, part, rest;
        CKD(cuDeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM));
        unsigned groups = 1;
        CKD(cuDevSmResourceSplitByCount(&part, &groups, &all, &rest, 0, 8));
        CUdevResourceDesc desc;
        CKD(cuDevResourceGenerateDesc(&desc, &part, 1));
        CUgreenCtx green;
        CKD(cuGreenCtxCreate(&green, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM));
        CKD(cuGreenCtxStreamCreate(&side, green, CU_STREAM_NON_BLOCKING, 0));
        CKD(cuCtxSetCurrent(primary));
        fprintf(stderr, "green_ctx sms=%u\n", part.sm.smCount);
    }
    // The linger kernel as a context-independent handle: launched on `side`, it loads into the
    // stream's context (the green one included).
    cudaKernel_t lk;
    CK(cudaGetKernel(&lk, (const void *)linger));
    int blocks = sms();
    cudaEvent_t end;
    CK(cudaEventCreateWithFlags(&end, cudaEventDisableTiming));
    for (int i = 0; i < 20; i++) {  // warm up
        work<<<blocks, 32, 0, app>>>(1000000);
        CK(cudaDeviceSynchronize());
    }
    std::mt19937_64 rng(1);
    std::exponential_distribution<double> gap(1.0 / 0.020);
    std::vector<double> lat, queued;
    double t0 = secs_now(), arrival = t0, prev_done = t0;
    long long linger_ns = (long long)(linger_us * 1e3);
    while (arrival - t0 < seconds) {
        arrival += gap(rng);
        double now = secs_now();
        if (arrival > now) std::this_thread::sleep_for(std::chrono::duration<double>(arrival - now));
        work<<<blocks, 32, 0, app>>>(1000000);
        CK(cudaEventRecord(end, app));
        if (side) {
            unsigned mine = ++*generation;  // ends the previous linger, if it still runs
            CKD(cuStreamWaitEvent(side, (CUevent)end, 0));
            const unsigned *g = generation_dev;
            void *args[] = {&linger_ns, &g, &mine};
            if (side_ctx) CKD(cuCtxPushCurrent(side_ctx));
            CKD(cuLaunchKernel((CUfunction)lk, 1, 1, 1, 1, 1, 1, 0, side, args, nullptr));
            if (side_ctx) CKD(cuCtxPopCurrent(nullptr));
        }
        CK(cudaDeviceSynchronize());
        double done = secs_now();
        lat.push_back((done - arrival) * 1e3);
        if (arrival < prev_done) queued.push_back((done - arrival) * 1e3);
        prev_done = done;
    }
    printf("service mode=%s linger_us=%g requests=%zu p50_ms=%.3f p99_ms=%.3f max_ms=%.3f queued=%zu queued_p50_ms=%.3f "
           "queued_p99_ms=%.3f\n",
           mode, linger_us, lat.size(), pct(lat, 0.5), pct(lat, 0.99), pct(lat, 1.0), queued.size(), pct(queued, 0.5),
           pct(queued, 0.99));
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 3 && !strcmp(argv[1], "train")) return train(atof(argv[2]));
    if (argc >= 5 && !strcmp(argv[1], "service")) return service(atof(argv[2]), argv[3], atof(argv[4]));
    fprintf(stderr, "usage: linger_probe train SECONDS | service SECONDS none|stream|green|ctx LINGER_US\n");
    return 2;
}
