/*
 * test_graph: capture --kernels full-GPU spin kernels from a stream into a CUDA graph
 * (cuStreamBeginCapture_v2 / cuStreamEndCapture), instantiate it, and launch the graph back to
 * back with a stream synchronize after each graph launch. Proves graph launches are covered by
 * the compute limiter (a hook that ignores cuGraphLaunch lets this run uncapped).
 *
 *   --kernels N    kernels per graph (default 100)
 *   --us US        kernel length in microseconds (default 100)
 *   --seconds N    run time, 0 = until SIGINT/SIGTERM (default 10)
 *
 * Output: kernels_per_graph= kernel_us= kernel_cycles=, each second
 * `second=K graphs_per_sec=X kernels_per_sec=Y`, at the end total_graphs= total_kernels=
 * elapsed_s= avg_graphs_per_sec= kernels_per_sec= min_graphs_per_sec= max_graphs_per_sec=.
 */
#include "gpu.h"

int main(int argc, char **argv)
{
    int kernels = 100, seconds = 10;
    double us = 100.0;
    const struct opt opts[] = {
        {"--kernels", OPT_INT, &kernels, "kernels per graph (default 100)"},
        {"--us", OPT_DOUBLE, &us, "kernel length in microseconds (default 100)"},
        {"--seconds", OPT_INT, &seconds, "run time in seconds, 0 = forever (default 10)"},
        {NULL, OPT_FLAG, NULL, NULL},
    };
    parse_opts(argc, argv, opts, "Launch a captured graph of spin kernels back to back.");
    if (kernels < 1 || us <= 0 || seconds < 0)
        die("need --kernels >= 1, --us > 0, --seconds >= 0");
    stop_on_signals();

    struct gpu g;
    struct kernels k;
    CUstream s;
    gpu_open_launching(&g, &k, &s, 1);
    uint64_t cycles = spin_cycles(&g, us);

    CUgraph graph;
    CUgraphExec exec;
    CHECK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    for (int i = 0; i < kernels; i++)
        CHECK(launch_spin(&g, &k, cycles, s));
    CHECK(cuStreamEndCapture(s, &graph));
    CHECK(cuGraphInstantiateWithFlags(&exec, graph, 0));
    out("kernels_per_graph=%d kernel_us=%.1f kernel_cycles=%llu\n", kernels, us,
        (unsigned long long)cycles);

    struct rate r;
    rate_start(&r, "graphs", (uint64_t)kernels);
    while (!stop_requested) {
        CHECK(cuGraphLaunch(exec, s));
        CHECK(cuStreamSynchronize(s));
        if (rate_add(&r, 1) >= seconds && seconds > 0)
            break;
    }
    rate_finish(&r);
    CHECK(cuGraphExecDestroy(exec));
    CHECK(cuGraphDestroy(graph));
    CHECK(cuStreamDestroy_v2(s));
    kernels_unload(&k);
    gpu_close(&g);
    return 0;
}
