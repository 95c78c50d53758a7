/*
 * test_mem_escape: documented patterns that hold device memory beyond plain cuMemAlloc, each run
 * to the cap. A memory cap must hold against all of them (issue 11), and usage must come back to
 * the baseline when everything is freed.
 *
 *   --case NAME    vmm | pool | graph | contexts | ctx-destroy | two-dev | fork-hold | vllm
 *   --chunk SIZE   allocation step (default 512m for vmm, 64m for the fill loops)
 *   --count N      chunks / contexts / rounds (default per case)
 *   --green N      contexts: also create N green contexts (cuGreenCtxCreate; skipped if absent)
 *   --size SIZE    ctx-destroy: per-round allocation (300m); fork-hold: parent allocation (400m)
 *   --pause        at each check point wait for SIGUSR1 (SIGTERM ends the program)
 *   --retain       vmm: retain chunk 0's handle from its address, unmap it, then release it
 *   --nodes        graph: explicit cuGraphAddMemAllocNode / cuGraphAddMemFreeNode
 *   --child-cuda   fork-hold: the forked child calls cuInit (and then sleeps)
 *   --launch       before the case: load the sample kernels, launch one and synchronize (with
 *                  lazy module loading the context grows at that first launch, not at the load)
 *   --device N     device ordinal (two-dev uses devices 0 and 1)
 *
 * Cases (what the device would hold without a faithful cap):
 *   vmm          cuMemCreate + cuMemAddressReserve + cuMemMap + cuMemSetAccess, then cuMemRelease
 *                right away (memory lives until also unmapped); --count chunks (6)
 *   pool         512 MiB freed with the default threshold (given back at the sync), then the
 *                default pool with CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = max; cuMemAllocAsync 1g +
 *                cuMemFreeAsync + sync (the pool keeps it), then cuMemAlloc up to the cap
 *   graph        cuMemAllocAsync 1g + cuMemFreeAsync captured into a graph (graph memory
 *                nodes), instantiated and launched, then cuMemAlloc up to the cap
 *   contexts     --count (8) cuCtxCreate_v2 (+ --green), then cuMemAlloc up to the cap
 *   ctx-destroy  --count (5) rounds of cuCtxCreate + cuMemAlloc --size + cuCtxDestroy, then one
 *                1 GiB allocation (must succeed on an empty GPU)
 *   two-dev      a device-1 pool used on a device-0 stream, and cuMemAllocAsync on device 1's
 *                stream while device 0 is current, each up to the cap
 *   fork-hold    allocate --size, fork a child that never uses CUDA and sleeps, print
 *                child_pid=, then wait to be killed
 *   vllm         --count (6) chunks of --chunk (256m) mapped into one reservation; 3 cycles of
 *                wake (cuMemCreate + cuMemMap) / graph replay / sleep (cuMemUnmap + cuMemRelease)
 *
 * Output: `check=NAME used=BYTES` at each check point (used = cuMemGetInfo total - free: the
 * container's usage under the hook), `filled=BYTES stop=CUDA_...` after a fill loop, and
 * `result=PASS` at the end (every call that must succeed did).
 */
#include <dlfcn.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu.h"

#define CU_MEMPOOL_ATTR_RELEASE_THRESHOLD 4
#define CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT 2

static int opt_pause, opt_retain, opt_nodes, opt_child_cuda, opt_launch;
static uint64_t opt_chunk, opt_size;
static int opt_count = -1, opt_green;
static struct gpu g;

static void check(const char *name)
{
    out("check=%s used=%llu\n", name, (unsigned long long)mem_used());
    if (!opt_pause)
        return;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    int sig = 0;
    sigwait(&set, &sig);
    if (sig != SIGUSR1)
        exit(0);
}

/* cuMemAlloc in `step` chunks until a failure (or `max` bytes); returns the count held. */
static size_t fill(uint64_t step, CUdeviceptr *ptrs, size_t max_n)
{
    size_t n = 0;
    CUresult r = CUDA_SUCCESS;
    while (n < max_n && (r = cuMemAlloc_v2(&ptrs[n], (size_t)step)) == CUDA_SUCCESS)
        n++;
    out("filled=%llu stop=%s\n", (unsigned long long)(n * step), n < max_n ? cu_name(r) : "max");
    return n;
}

static void unfill(CUdeviceptr *ptrs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        CHECK(cuMemFree_v2(ptrs[i]));
}

static CUmemAllocationProp prop_on(int dev)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = dev;
    return p;
}

static CUresult map_chunk(CUdeviceptr at, size_t size, CUmemGenericAllocationHandle *h)
{
    CUmemAllocationProp p = prop_on(g.dev);
    CUresult r = cuMemCreate(h, size, &p, 0);
    if (r != CUDA_SUCCESS)
        return r;
    if ((r = cuMemMap(at, size, 0, *h, 0)) != CUDA_SUCCESS) {
        cuMemRelease(*h);
        return r;
    }
    CUmemAccessDesc a = {.location = p.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    return cuMemSetAccess(at, size, &a, 1);
}

#define MAXN 4096

static int case_vmm(void)
{
    size_t chunk = opt_chunk ? opt_chunk : 512 * MIB, n = opt_count >= 0 ? (size_t)opt_count : 6, mapped = 0;
    CUdeviceptr va;
    CHECK(cuMemAddressReserve(&va, chunk * n, 0, 0, 0));
    CUresult r = CUDA_SUCCESS;
    for (; mapped < n; mapped++) {
        CUmemGenericAllocationHandle h;
        if ((r = map_chunk(va + mapped * chunk, chunk, &h)) != CUDA_SUCCESS)
            break;
        CHECK(cuMemRelease(h)); /* lives on while mapped */
    }
    out("mapped=%zu stop=%s\n", mapped, mapped < n ? cu_name(r) : "max");
    check("mapped");
    size_t first = 0;
    if (opt_retain && mapped > 0) {
        /* A reference taken from the address keeps the memory after its last unmap. */
        CUmemGenericAllocationHandle h;
        CHECK(cuMemRetainAllocationHandle(&h, (void *)(uintptr_t)va));
        CHECK(cuMemUnmap(va, chunk));
        check("retained_unmapped");
        CHECK(cuMemRelease(h));
        check("retain_released");
        first = 1;
    }
    for (size_t i = first; i < mapped; i++)
        CHECK(cuMemUnmap(va + i * chunk, chunk));
    CHECK(cuMemAddressFree(va, chunk * n));
    check("freed");
    return 0;
}

static int case_pool(void)
{
    static CUdeviceptr ptrs[MAXN];
    CUmemoryPool pool;
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CHECK(cuDeviceGetDefaultMemPool(&pool, g.dev));
    uint64_t max = UINT64_MAX, zero = 0;
    /* Default threshold 0: the pool gives freed memory back at the next synchronize. */
    CUdeviceptr q;
    CHECK(cuMemAllocAsync(&q, 512 * MIB, s));
    CHECK(cuMemFreeAsync(q, s));
    CHECK(cuStreamSynchronize(s));
    check("released_at_sync");
    CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &max));
    CUdeviceptr p;
    CHECK(cuMemAllocAsync(&p, 1 << 30, s));
    CHECK(cuMemFreeAsync(p, s));
    CHECK(cuStreamSynchronize(s));
    check("pool_cached");
    size_t n = fill(opt_chunk ? opt_chunk : 64 * MIB, ptrs, MAXN);
    check("filled");
    unfill(ptrs, n);
    CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &zero));
    CHECK(cuMemPoolTrimTo(pool, 0));
    CHECK(cuStreamDestroy_v2(s));
    check("freed");
    return 0;
}

static int case_graph(void)
{
    static CUdeviceptr ptrs[MAXN];
    CUstream s;
    CUgraph graph;
    CUgraphExec exec;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    if (opt_nodes) {
        /* Explicit nodes: cuGraphAddMemAllocNode + cuGraphAddMemFreeNode. */
        CUDA_MEM_ALLOC_NODE_PARAMS np;
        memset(&np, 0, sizeof np);
        np.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        np.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        np.poolProps.location.id = g.dev;
        np.bytesize = 1 << 30;
        CUgraphNode alloc_node, free_node;
        CHECK(cuGraphCreate(&graph, 0));
        CHECK(cuGraphAddMemAllocNode(&alloc_node, graph, NULL, 0, &np));
        CHECK(cuGraphAddMemFreeNode(&free_node, graph, &alloc_node, 1, np.dptr));
    } else {
        CHECK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
        CUdeviceptr p;
        CHECK(cuMemAllocAsync(&p, 1 << 30, s));
        CHECK(cuMemsetD32Async(p, 0, 1024, s));
        CHECK(cuMemFreeAsync(p, s));
        CHECK(cuStreamEndCapture(s, &graph));
    }
    CHECK(cuGraphInstantiateWithFlags(&exec, graph, 0));
    CHECK(cuGraphLaunch(exec, s));
    CHECK(cuStreamSynchronize(s));
    uint64_t reserved = 0;
    CHECK(cuDeviceGetGraphMemAttribute(g.dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &reserved));
    out("graph_reserved=%llu\n", (unsigned long long)reserved);
    check("graph_launched");
    size_t n = fill(opt_chunk ? opt_chunk : 64 * MIB, ptrs, MAXN);
    check("filled");
    unfill(ptrs, n);
    CHECK(cuGraphExecDestroy(exec));
    CHECK(cuGraphDestroy(graph));
    CHECK(cuDeviceGraphMemTrim(g.dev));
    CHECK(cuStreamDestroy_v2(s));
    check("freed");
    return 0;
}

/* Green contexts (CUDA 12.4+), looked up at run time. */
typedef struct { unsigned int type; unsigned char pad[92]; unsigned char sm[48]; unsigned char more[256]; } dev_resource;
typedef CUresult (*pfn_get_resource)(CUdevice, dev_resource *, int);
typedef CUresult (*pfn_gen_desc)(void **, dev_resource *, unsigned int);
typedef CUresult (*pfn_green_create)(void **, void *, CUdevice, unsigned int);
typedef CUresult (*pfn_green_destroy)(void *);

static int green_create(int n, void **greens)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    pfn_get_resource get = lib ? (pfn_get_resource)dlsym(lib, "cuDeviceGetDevResource") : NULL;
    pfn_gen_desc gen = lib ? (pfn_gen_desc)dlsym(lib, "cuDevResourceGenerateDesc") : NULL;
    pfn_green_create create = lib ? (pfn_green_create)dlsym(lib, "cuGreenCtxCreate") : NULL;
    if (!get || !gen || !create) {
        out("green=unsupported\n");
        return 0;
    }
    dev_resource res;
    memset(&res, 0, sizeof res);
    CHECK(get(g.dev, &res, 1 /* CU_DEV_RESOURCE_TYPE_SM */));
    void *desc = NULL;
    CHECK(gen(&desc, &res, 1));
    int made = 0;
    for (; made < n; made++) {
        CUresult r = create(&greens[made], desc, g.dev, 1 /* CU_GREEN_CTX_DEFAULT_STREAM */);
        if (r != CUDA_SUCCESS) {
            out("green_stop=%s\n", cu_name(r));
            break;
        }
    }
    out("green=%d\n", made);
    return made;
}

static void green_destroy(void **greens, int n)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    pfn_green_destroy destroy = lib ? (pfn_green_destroy)dlsym(lib, "cuGreenCtxDestroy") : NULL;
    for (int i = 0; i < n && destroy; i++)
        CHECK(destroy(greens[i]));
}

static int case_contexts(void)
{
    static CUdeviceptr ptrs[MAXN];
    static CUcontext ctxs[256];
    static void *greens[256];
    int n = opt_count >= 0 ? (int)opt_count : 8, made = 0;
    if (n > 256)
        n = 256;
    CUresult r = CUDA_SUCCESS;
    for (; made < n; made++)
        if ((r = cuCtxCreate_v2(&ctxs[made], 0, g.dev)) != CUDA_SUCCESS)
            break;
    out("contexts=%d stop=%s\n", made, made < n ? cu_name(r) : "max");
    int greens_made = green_create(opt_green > 256 ? 256 : opt_green, greens);
    check("contexts");
    size_t k = fill(opt_chunk ? opt_chunk : 64 * MIB, ptrs, MAXN);
    check("filled");
    unfill(ptrs, k);
    green_destroy(greens, greens_made);
    for (int i = made - 1; i >= 0; i--)
        CHECK(cuCtxDestroy_v2(ctxs[i]));
    CHECK(cuCtxSetCurrent(g.ctx));
    check("freed");
    return 0;
}

static int case_ctx_destroy(void)
{
    uint64_t size = opt_size ? opt_size : 300 * MIB;
    int rounds = opt_count >= 0 ? (int)opt_count : 5;
    for (int i = 0; i < rounds; i++) {
        CUcontext c;
        CUdeviceptr p;
        CHECK(cuCtxCreate_v2(&c, 0, g.dev));
        CHECK(cuMemAlloc_v2(&p, (size_t)size)); /* freed by the driver with its context */
        CHECK(cuCtxDestroy_v2(c));
    }
    CHECK(cuCtxSetCurrent(g.ctx));
    check("rounds");
    CUdeviceptr big;
    CUresult r = cuMemAlloc_v2(&big, 1 << 30);
    out("big_alloc=%s\n", cu_name(r));
    check("big");
    if (r == CUDA_SUCCESS)
        CHECK(cuMemFree_v2(big));
    check("freed");
    return r == CUDA_SUCCESS ? 0 : 1;
}

static int case_two_dev(void)
{
    static CUdeviceptr ptrs[MAXN];
    struct gpu g1;
    gpu_open(&g1, 1);
    uint64_t step = opt_chunk ? opt_chunk : 64 * MIB;
    CUstream s0, s1;
    CHECK(cuCtxSetCurrent(g1.ctx));
    CHECK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
    CHECK(cuCtxSetCurrent(g.ctx));
    CHECK(cuStreamCreate(&s0, CU_STREAM_NON_BLOCKING));
    /* (a) a device-1 pool, allocated from on a device-0 stream */
    CUmemPoolProps pp;
    memset(&pp, 0, sizeof pp);
    pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    pp.location.id = g1.dev;
    CUmemoryPool pool1;
    CHECK(cuMemPoolCreate(&pool1, &pp));
    size_t n = 0;
    CUresult r = CUDA_SUCCESS;
    while (n < MAXN && (r = cuMemAllocFromPoolAsync(&ptrs[n], (size_t)step, pool1, s0)) == CUDA_SUCCESS)
        n++;
    CHECK(cuStreamSynchronize(s0));
    out("pool_filled=%llu stop=%s\n", (unsigned long long)(n * step), cu_name(r));
    check("pool_filled");
    for (size_t i = 0; i < n; i++)
        CHECK(cuMemFreeAsync(ptrs[i], s0));
    CHECK(cuStreamSynchronize(s0));
    CHECK(cuMemPoolDestroy(pool1));
    check("pool_freed");
    /* (b) cuMemAllocAsync on device 1's stream while device 0 is current */
    n = 0;
    while (n < MAXN && (r = cuMemAllocAsync(&ptrs[n], (size_t)step, s1)) == CUDA_SUCCESS)
        n++;
    CHECK(cuStreamSynchronize(s1));
    out("async_filled=%llu stop=%s\n", (unsigned long long)(n * step), cu_name(r));
    check("async_filled");
    for (size_t i = 0; i < n; i++)
        CHECK(cuMemFreeAsync(ptrs[i], s1));
    CHECK(cuStreamSynchronize(s1));
    CUmemoryPool def1;
    CHECK(cuDeviceGetDefaultMemPool(&def1, g1.dev));
    CHECK(cuMemPoolTrimTo(def1, 0));
    CHECK(cuStreamDestroy_v2(s0));
    CHECK(cuStreamDestroy_v2(s1));
    check("freed");
    return 0;
}

static int case_fork_hold(void)
{
    uint64_t size = opt_size ? opt_size : 400 * MIB;
    CUdeviceptr p;
    CHECK(cuMemAlloc_v2(&p, (size_t)size));
    fflush(stdout);
    pid_t child = fork();
    if (child < 0)
        die("fork failed");
    if (child == 0) {
        /* Never touches CUDA; keeps the inherited descriptors (and so the device files) open. */
        if (!freopen("/dev/null", "w", stdout))
            _exit(1);
        if (opt_child_cuda)
            (void)cuInit(0); /* any driver call in the forked image (it may fail: that is fine) */
        for (;;)
            pause();
    }
    out("child_pid=%d\n", (int)child);
    check("forked");
    for (;;)
        pause();
    return 0;
}

static int case_vllm(void)
{
    static CUmemGenericAllocationHandle hs[MAXN];
    size_t chunk = opt_chunk ? opt_chunk : 256 * MIB, n = opt_count >= 0 ? (size_t)opt_count : 6;
    if (n > MAXN)
        n = MAXN;
    /* Wake only what fits beside the context (its size differs between GPUs: 518 MiB on an
     * H100), so every cycle wakes all n chunks; the cap itself is checked by the oom case. */
    size_t free_b = 0, total_b = 0;
    meminfo(&free_b, &total_b);
    if (n > free_b / chunk)
        n = free_b / chunk;
    out("vllm_chunks=%zu\n", n);
    struct kernels k;
    kernels_load(&k);
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUdeviceptr va;
    CHECK(cuMemAddressReserve(&va, chunk * n, 0, 0, 0));
    CUgraph graph = NULL;
    CUgraphExec exec = NULL;
    char name[64];
    int ok = 1;
    for (int cycle = 1; cycle <= 3; cycle++) {
        size_t woke = 0;
        CUresult r = CUDA_SUCCESS;
        for (; woke < n; woke++)
            if ((r = map_chunk(va + woke * chunk, chunk, &hs[woke])) != CUDA_SUCCESS)
                break;
        out("cycle=%d woke=%zu stop=%s\n", cycle, woke, woke < n ? cu_name(r) : "max");
        ok &= woke == n;
        snprintf(name, sizeof name, "wake%d", cycle);
        check(name);
        if (!exec) {
            CHECK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
            for (int i = 0; i < 8; i++)
                CHECK(launch_empty(&k, s));
            CHECK(cuStreamEndCapture(s, &graph));
            CHECK(cuGraphInstantiateWithFlags(&exec, graph, 0));
        }
        CHECK(cuGraphLaunch(exec, s));
        CHECK(cuStreamSynchronize(s));
        snprintf(name, sizeof name, "replay%d", cycle);
        check(name);
        for (size_t i = 0; i < woke; i++) {
            CHECK(cuMemUnmap(va + i * chunk, chunk));
            CHECK(cuMemRelease(hs[i]));
        }
        snprintf(name, sizeof name, "sleep%d", cycle);
        check(name);
    }
    CHECK(cuGraphExecDestroy(exec));
    CHECK(cuGraphDestroy(graph));
    CHECK(cuMemAddressFree(va, chunk * n));
    CHECK(cuStreamDestroy_v2(s));
    kernels_unload(&k);
    return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
    const char *which = "vmm";
    const struct opt opts[] = {
        {"--case", OPT_STR, &which, "vmm|pool|graph|contexts|ctx-destroy|two-dev|fork-hold|vllm"},
        {"--chunk", OPT_SIZE, &opt_chunk, "allocation step"},
        {"--count", OPT_INT, &opt_count, "chunks / contexts / rounds"},
        {"--green", OPT_INT, &opt_green, "contexts: green contexts to create too"},
        {"--size", OPT_SIZE, &opt_size, "ctx-destroy / fork-hold allocation"},
        {"--pause", OPT_FLAG, &opt_pause, "wait for SIGUSR1 at each check point"},
        {"--retain", OPT_FLAG, &opt_retain, "vmm: also retain a handle from its address and unmap it"},
        {"--nodes", OPT_FLAG, &opt_nodes, "graph: explicit cuGraphAddMemAllocNode/FreeNode instead of capture"},
        {"--child-cuda", OPT_FLAG, &opt_child_cuda, "fork-hold: the child calls cuInit"},
        {"--launch", OPT_FLAG, &opt_launch, "first load the kernels, launch one and synchronize"},
        {NULL, OPT_FLAG, NULL, NULL},
    };
    parse_opts(argc, argv, opts, "Memory patterns that must stay under the cap (issue 11).");
    if (opt_pause) {
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, SIGUSR1);
        sigaddset(&set, SIGTERM);
        sigaddset(&set, SIGINT);
        pthread_sigmask(SIG_BLOCK, &set, NULL);
    }
    gpu_open(&g, strcmp(which, "two-dev") == 0 ? 0 : opt_device);
    struct kernels lk;
    if (opt_launch) {
        kernels_load(&lk);
        CHECK(launch_empty(&lk, NULL));
        CHECK(cuCtxSynchronize());
    }
    int rc;
    if (!strcmp(which, "vmm"))
        rc = case_vmm();
    else if (!strcmp(which, "pool"))
        rc = case_pool();
    else if (!strcmp(which, "graph"))
        rc = case_graph();
    else if (!strcmp(which, "contexts"))
        rc = case_contexts();
    else if (!strcmp(which, "ctx-destroy"))
        rc = case_ctx_destroy();
    else if (!strcmp(which, "two-dev"))
        rc = case_two_dev();
    else if (!strcmp(which, "fork-hold"))
        rc = case_fork_hold();
    else if (!strcmp(which, "vllm"))
        rc = case_vllm();
    else
        die("unknown --case %s", which);
    if (opt_launch)
        kernels_unload(&lk);
    out("result=%s\n", rc == 0 ? "PASS" : "FAIL");
    return rc;
}
