// call_cost: what the driver calls on libvgpu's gated launch path cost on this machine (ns per
// call, median of 7 batches of 20000), without any hook: context and stream lookups, the capture
// checks, and the timing-event calls. Usage: bench/gpu/bin/call_cost
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <algorithm>

__global__ void empty_kernel() {}
__global__ void spin_kernel(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}

static double now_ns() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { printf("error=%s rc=%d\n", #x, r_); exit(1); } } while (0)

template <class F> static void timeit(const char *name, F f, int n = 20000) {
    const int reps = 7;
    double v[reps];
    for (int r = 0; r < reps; r++) {
        double t0 = now_ns();
        for (int i = 0; i < n; i++) f();
        v[r] = (now_ns() - t0) / n;
    }
    std::sort(v, v + reps);
    printf("call=%s ns=%.1f min=%.1f max=%.1f\n", name, v[reps / 2], v[0], v[reps - 1]);
}

int main() {
    cudaFree(0);
    CUcontext ctx;
    CK(cuCtxGetCurrent(&ctx));
    CUstream s;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUevent e0, e1;
    CK(cuEventCreate(&e0, 0));
    CK(cuEventCreate(&e1, 0));
    CK(cuEventRecord(e0, s));
    CK(cuStreamSynchronize(s));
    cudaFunction_t kf;
    if (cudaGetFuncBySymbol(&kf, (const void *)empty_kernel) != cudaSuccess) { printf("error=cudaGetFuncBySymbol\n"); return 1; }
    CUfunction k = (CUfunction)kf;
    timeit("cuCtxGetCurrent", [&] { CUcontext c; cuCtxGetCurrent(&c); });
    timeit("cuStreamIsCapturing", [&] { CUstreamCaptureStatus st; cuStreamIsCapturing(s, &st); });
    timeit("cuStreamGetCtx", [&] { CUcontext c; cuStreamGetCtx(s, &c); });
    timeit("cuThreadExchangeStreamCaptureMode", [&] { CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED; cuThreadExchangeStreamCaptureMode(&m); });
    timeit("cuEventRecord_idle_stream", [&] { cuEventRecord(e1, s); });
    CK(cuStreamSynchronize(s));
    timeit("cuEventQuery_done", [&] { cuEventQuery(e1); });
    timeit("cuEventElapsedTime_done", [&] { float ms; cuEventElapsedTime(&ms, e0, e1); });
    timeit("cuStreamQuery_idle", [&] { cuStreamQuery(s); });
    timeit("cuLaunchKernel_async", [&] { cuLaunchKernel(k, 1, 1, 1, 1, 1, 1, 0, s, nullptr, nullptr); });
    CK(cuStreamSynchronize(s));
    timeit("launch_then_sync", [&] { cuLaunchKernel(k, 1, 1, 1, 1, 1, 1, 0, s, nullptr, nullptr); cuStreamSynchronize(s); });
    // The same calls while a kernel runs on the stream (fewer: each record queues behind it).
    cudaFunction_t sf;
    if (cudaGetFuncBySymbol(&sf, (const void *)spin_kernel) != cudaSuccess) { printf("error=cudaGetFuncBySymbol\n"); return 1; }
    long long cycles = 2000000000LL;  // about 1 s at 2 GHz
    void *args[] = {&cycles};
    CK(cuLaunchKernel((CUfunction)sf, 1, 1, 1, 1, 1, 1, 0, s, args, nullptr));
    timeit("cuEventRecord_busy_stream", [&] { cuEventRecord(e1, s); }, 100);
    timeit("cuEventQuery_pending", [&] { cuEventQuery(e1); }, 2000);
    timeit("cuStreamIsCapturing_busy", [&] { CUstreamCaptureStatus st; cuStreamIsCapturing(s, &st); }, 2000);
    CK(cuStreamSynchronize(s));
    timeit("record_launch_record_sync", [&] { cuEventRecord(e0, s); cuLaunchKernel(k, 1, 1, 1, 1, 1, 1, 0, s, nullptr, nullptr); cuEventRecord(e1, s); cuStreamSynchronize(s); });
    return 0;
}
