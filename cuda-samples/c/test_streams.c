/*
 * test_streams: the launch patterns real programs use, for the compute cap. N host threads,
 * each launching the spin kernel round-robin over its own M streams, synchronizing (or not) in
 * one of several ways, with fixed or random kernel lengths, for a fixed time.
 *
 *   --threads N        host threads (default 1), each with its own streams
 *   --streams M        streams per thread, launches round-robin over them (default 1)
 *   --us US            kernel length in microseconds (default 1000)
 *   --us-max US        if set: each kernel's length is drawn uniformly from [--us, --us-max]
 *   --blocks B         grid size (default 4 per SM: the whole GPU)
 *   --sync-every K     synchronize each stream after every K launches on it (default 1;
 *                      0 = only once at the end)
 *   --sync-by HOW      stream (cuStreamSynchronize, default), query (busy-poll cuStreamQuery),
 *                      event (cuEventRecord + cuEventSynchronize)
 *   --stream-kind K    nonblocking (default), blocking, priority, legacy (stream 0 shared by
 *                      all threads), per-thread (CU_STREAM_PER_THREAD)
 *   --seconds S        run time (default 5)
 *   --gap-us US        host busy-wait after each launch (and its synchronize): CPU time between kernels
 *   --op OP            what each launch is: kernel (default), memset (cuMemsetD32Async of
 *                      --bytes) or copy (cuMemcpyDtoDAsync_v2 of --bytes): NVML counts all three
 *   --bytes N          size of a memset or copy (default 64m)
 *   --progress         print `progress t=<CLOCK_MONOTONIC s> n=<GPU ms launched>` every 250 ms
 *   --trace N          each thread's first N spin kernels record when they ran on the GPU
 *                      (%globaltimer, first block's start and last block's end; no host or hook
 *                      involved) and are printed at the end, one line each:
 *                      `trace thread=T stream=S start_us=A end_us=B` (from the earliest start)
 *
 * Output: the configuration, then at the end total_kernels= gpu_ms= (sum of kernel lengths)
 * elapsed_s= (to the end of the final synchronize) kernels_per_sec= gpu_ms_per_sec=.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "gpu.h"

#define MAX_THREADS 64
#define MAX_STREAMS 64
#define CU_STREAM_LEGACY_H ((CUstream)0x1)
#define CU_STREAM_PER_THREAD_H ((CUstream)0x2)

static struct gpu g;
static struct kernels k;
static int threads = 1, streams = 1, sync_every = 1, seconds = 5, blocks = 0;
static double us = 1000.0, us_max = 0.0;
static const char *sync_by = "stream", *stream_kind = "nonblocking";
static int progress = 0;
static double gap_us = 0.0;
static const char *op = "kernel";
static uint64_t op_bytes = 64 * MIB;
static uint64_t t_start, t_stop;
static int trace = 0;

struct worker {
    int id;
    CUdeviceptr a, b;
    CUstream s[MAX_STREAMS];
    CUevent ev;
    uint64_t launches, gpu_ns, rng;
    pthread_t th;
    /* --trace: per launch, (~start, end) in GPU nanoseconds, and the launch's stream index. */
    CUdeviceptr tr_buf;
    int *tr_stream;
};

static void sync_stream(struct worker *w, CUstream s)
{
    if (strcmp(sync_by, "query") == 0) {
        CUresult r;
        while ((r = cuStreamQuery(s)) == CUDA_ERROR_NOT_READY)
            ;
        CHECK(r);
    } else if (strcmp(sync_by, "event") == 0) {
        CHECK(cuEventRecord(w->ev, s));
        CHECK(cuEventSynchronize(w->ev));
    } else {
        CHECK(cuStreamSynchronize(s));
    }
}

static double next_us(struct worker *w)
{
    if (us_max <= us)
        return us;
    w->rng ^= w->rng << 13;
    w->rng ^= w->rng >> 7;
    w->rng ^= w->rng << 17;
    return us + (us_max - us) * (double)(w->rng % 1000001) / 1e6;
}

static void *run(void *arg)
{
    struct worker *w = arg;
    CHECK(cuCtxSetCurrent(g.ctx));
    for (int i = 0; i < streams; i++) {
        if (strcmp(stream_kind, "legacy") == 0)
            w->s[i] = CU_STREAM_LEGACY_H;
        else if (strcmp(stream_kind, "per-thread") == 0)
            w->s[i] = CU_STREAM_PER_THREAD_H;
        else if (strcmp(stream_kind, "blocking") == 0)
            CHECK(cuStreamCreate(&w->s[i], 0));
        else if (strcmp(stream_kind, "priority") == 0)
            CHECK(cuStreamCreateWithPriority(&w->s[i], CU_STREAM_NON_BLOCKING, -1));
        else
            CHECK(cuStreamCreate(&w->s[i], CU_STREAM_NON_BLOCKING));
    }
    CHECK(cuEventCreate(&w->ev, 0x2 /* CU_EVENT_DISABLE_TIMING */));
    if (trace > 0) {
        CHECK(cuMemAlloc_v2(&w->tr_buf, (size_t)trace * 16));
        CHECK(cuMemsetD32_v2(w->tr_buf, 0, (size_t)trace * 4));
        if (!(w->tr_stream = calloc((size_t)trace, sizeof(int))))
            die("out of memory for --trace");
    }
    int is_memset = strcmp(op, "memset") == 0, is_copy = strcmp(op, "copy") == 0;
    if (is_memset || is_copy) {
        CHECK(cuMemAlloc_v2(&w->a, op_bytes));
        CHECK(cuMemAlloc_v2(&w->b, op_bytes));
    }
    unsigned int nb = blocks > 0 ? (unsigned int)blocks : (unsigned int)(g.sms > 0 ? g.sms : 1) * SPIN_BLOCKS_PER_SM;
    uint64_t since[MAX_STREAMS] = {0};
    while (!stop_requested && now_ns() < t_stop) {
        int i = (int)(w->launches % (uint64_t)streams);
        double len = next_us(w);
        uint64_t cycles = spin_cycles(&g, len);
        void *args[] = {&cycles};
        if (is_memset)
            CHECK(cuMemsetD32Async(w->a, 0, op_bytes / 4, w->s[i]));
        else if (is_copy)
            CHECK(cuMemcpyDtoDAsync_v2(w->a, w->b, op_bytes, w->s[i]));
        else if (w->launches < (uint64_t)trace) {
            CUdeviceptr slot = w->tr_buf + w->launches * 16;
            void *targs[] = {&cycles, &slot};
            w->tr_stream[w->launches] = i;
            CHECK(cuLaunchKernel(k.spin_traced, nb, 1, 1, SPIN_THREADS, 1, 1, 0, w->s[i], targs, NULL));
        } else
            CHECK(cuLaunchKernel(k.spin, nb, 1, 1, SPIN_THREADS, 1, 1, 0, w->s[i], args, NULL));
        w->launches++;
        __atomic_store_n(&w->gpu_ns, w->gpu_ns + (uint64_t)(len * 1000.0), __ATOMIC_RELAXED);
        if (sync_every > 0 && ++since[i] >= (uint64_t)sync_every) {
            sync_stream(w, w->s[i]);
            since[i] = 0;
        }
        if (gap_us > 0) {
            uint64_t until = now_ns() + (uint64_t)(gap_us * 1000.0);
            while (now_ns() < until)
                ;
        }
    }
    for (int i = 0; i < streams; i++)
        sync_stream(w, w->s[i]);
    if (w->a) {
        CHECK(cuMemFree_v2(w->a));
        CHECK(cuMemFree_v2(w->b));
    }
    return NULL;
}

/* The --trace lines, from the earliest recorded start (the mock records nothing: no lines). */
static void print_trace(struct worker *w)
{
    uint64_t *t[MAX_THREADS] = {0}, t0 = UINT64_MAX;
    for (int i = 0; i < threads && trace > 0; i++) {
        if (!(t[i] = malloc((size_t)trace * 16)))
            die("out of memory for --trace");
        CHECK(cuMemcpyDtoH_v2(t[i], w[i].tr_buf, (size_t)trace * 16));
        for (uint64_t l = 0; l < w[i].launches && l < (uint64_t)trace; l++)
            if (t[i][2 * l + 1] && ~t[i][2 * l] < t0)
                t0 = ~t[i][2 * l];
    }
    for (int i = 0; i < threads && trace > 0; i++) {
        for (uint64_t l = 0; l < w[i].launches && l < (uint64_t)trace; l++)
            if (t[i][2 * l + 1])
                out("trace thread=%d stream=%d start_us=%.3f end_us=%.3f\n", i, w[i].tr_stream[l],
                    (double)(~t[i][2 * l] - t0) / 1e3, (double)(t[i][2 * l + 1] - t0) / 1e3);
        CHECK(cuMemFree_v2(w[i].tr_buf));
        free(t[i]);
        free(w[i].tr_stream);
    }
}

int main(int argc, char **argv)
{
    const struct opt opts[] = {
        {"--threads", OPT_INT, &threads, "host threads (default 1)"},
        {"--streams", OPT_INT, &streams, "streams per thread (default 1)"},
        {"--us", OPT_DOUBLE, &us, "kernel length in microseconds (default 1000)"},
        {"--us-max", OPT_DOUBLE, &us_max, "random kernel lengths in [--us, --us-max]"},
        {"--blocks", OPT_INT, &blocks, "grid size (default 4 per SM)"},
        {"--sync-every", OPT_INT, &sync_every, "synchronize after K launches per stream (0 = at the end)"},
        {"--sync-by", OPT_STR, &sync_by, "stream | query | event"},
        {"--stream-kind", OPT_STR, &stream_kind, "nonblocking | blocking | priority | legacy | per-thread"},
        {"--seconds", OPT_INT, &seconds, "run time in seconds (default 5)"},
        {"--progress", OPT_FLAG, &progress, "print launched GPU ms every 250 ms"},
        {"--gap-us", OPT_DOUBLE, &gap_us, "host busy-wait after each launch (CPU time between kernels)"},
        {"--op", OPT_STR, &op, "kernel | memset | copy"},
        {"--trace", OPT_INT, &trace, "record when each thread's first N spin kernels ran on the GPU"},
        {"--bytes", OPT_SIZE, &op_bytes, "size of a memset or copy (default 64m)"},
        {NULL, OPT_FLAG, NULL, NULL},
    };
    parse_opts(argc, argv, opts, "Launch the spin kernel from threads and streams; print the throughput.");
    if (threads < 1 || threads > MAX_THREADS || streams < 1 || streams > MAX_STREAMS || us <= 0 || seconds < 1 ||
        sync_every < 0 || trace < 0)
        die("need 1 <= --threads <= %d, 1 <= --streams <= %d, --us > 0, --seconds >= 1", MAX_THREADS, MAX_STREAMS);
    stop_on_signals();
    gpu_open(&g, opt_device);
    kernels_load(&k);
    out("threads=%d streams=%d us=%.1f us_max=%.1f sync_every=%d sync_by=%s stream_kind=%s\n", threads, streams, us,
        us_max, sync_every, sync_by, stream_kind);

    static struct worker w[MAX_THREADS];
    t_start = now_ns();
    t_stop = t_start + (uint64_t)seconds * 1000000000ull;
    for (int i = 0; i < threads; i++) {
        w[i].id = i;
        w[i].rng = 0x9E3779B97F4A7C15ull ^ (uint64_t)(i + 1);
        if (pthread_create(&w[i].th, NULL, run, &w[i]) != 0)
            die("pthread_create failed");
    }
    while (progress && !stop_requested && now_ns() < t_stop) {
        sleep_ns(250000000ull);
        uint64_t sum = 0;
        for (int i = 0; i < threads; i++)
            sum += __atomic_load_n(&w[i].gpu_ns, __ATOMIC_RELAXED);
        out("progress t=%.4f n=%.3f\n", (double)now_ns() / 1e9, (double)sum / 1e6);
    }
    uint64_t total = 0, gpu_ns = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(w[i].th, NULL);
        total += w[i].launches;
        gpu_ns += w[i].gpu_ns;
    }
    CHECK(cuCtxSynchronize());
    double el = (double)(now_ns() - t_start) / 1e9;
    print_trace(w);
    out("total_kernels=%llu gpu_ms=%.1f elapsed_s=%.3f kernels_per_sec=%.1f gpu_ms_per_sec=%.2f\n",
        (unsigned long long)total, (double)gpu_ns / 1e6, el, (double)total / el, (double)gpu_ns / 1e6 / el);
    kernels_unload(&k);
    gpu_close(&g);
    return 0;
}
