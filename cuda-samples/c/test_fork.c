/*
 * test_fork: allocate --size, then fork(). The parent's accounting must survive the child:
 * the child inherits the hook's state (region file descriptor, locks) and exits with exit(),
 * running the exit handlers. The child optionally uses CUDA itself:
 *
 *   --child none    the child only reports its pid and exits (default)
 *   --child cuda    the child calls cuInit and allocates --size itself in the forked image
 *                   (CUDA does not support this after the parent initialized it; the child
 *                   reports the error it gets and that is not a failure of this sample)
 *   --child exec    the child re-executes this program (fresh image), which initializes CUDA,
 *                   allocates --size, reports, frees and exits: must succeed
 *   --size SIZE     bytes allocated by the parent and by a CUDA-using child (default 256m)
 *   --tolerance SIZE  allowed change of the parent's usage across the child (default 0; on a
 *                   real GPU without the hook other processes move the device-wide number)
 *
 * Output: parent_used_before= parent_used_after_alloc=, child lines prefixed child_,
 * child_exit=, parent_used_after_child= parent_used_after_free=, result=PASS|FAIL.
 * PASS: the parent's usage is unchanged (within --tolerance) and the child exited 0.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpu.h"

/* The exec'ed child: fresh CUDA in a fresh image. */
static int run_as_child(uint64_t size)
{
    struct gpu g;
    gpu_open(&g, opt_device);
    CUdeviceptr p;
    CUresult r = cuMemAlloc_v2(&p, (size_t)size);
    out("child_alloc_result=%s child_used=%llu\n", cu_name(r), (unsigned long long)mem_used());
    if (r == CUDA_SUCCESS)
        CHECK(cuMemFree_v2(p));
    gpu_close(&g);
    return r == CUDA_SUCCESS ? 0 : 1;
}

/* The forked child using CUDA in the inherited image. */
static int forked_cuda_child(uint64_t size)
{
    CUresult r = cuInit(0);
    out("child_cuinit_result=%s\n", cu_name(r));
    if (r != CUDA_SUCCESS)
        return 0;
    CUdevice dev;
    CUcontext ctx;
    r = cuDeviceGet(&dev, opt_device);
    if (r == CUDA_SUCCESS)
        r = cuDevicePrimaryCtxRetain(&ctx, dev);
    if (r == CUDA_SUCCESS)
        r = cuCtxSetCurrent(ctx);
    CUdeviceptr p = 0;
    if (r == CUDA_SUCCESS)
        r = cuMemAlloc_v2(&p, (size_t)size);
    out("child_alloc_result=%s\n", cu_name(r));
    if (r == CUDA_SUCCESS) {
        out("child_used=%llu\n", (unsigned long long)mem_used());
        CHECK(cuMemFree_v2(p));
    }
    return 0;
}

int main(int argc, char **argv)
{
    uint64_t size = 256 * MIB, tolerance = 0;
    const char *child = "none";
    int as_child = 0;
    const struct opt opts[] = {
        {"--size", OPT_SIZE, &size, "bytes to allocate (default 256m)"},
        {"--child", OPT_STR, &child, "none|cuda|exec: what the child does (default none)"},
        {"--tolerance", OPT_SIZE, &tolerance, "allowed change of the parent's usage (default 0)"},
        {"--as-child", OPT_FLAG, &as_child, "internal: the exec'ed child"},
        {NULL, OPT_FLAG, NULL, NULL},
    };
    parse_opts(argc, argv, opts, "Allocate, fork, and check the parent's usage survives the child.");
    if (as_child)
        return run_as_child(size);
    if (strcmp(child, "none") && strcmp(child, "cuda") && strcmp(child, "exec")) {
        out("error=usage what=\"unknown --child\" arg=\"%s\"\n", child);
        return 2;
    }

    struct gpu g;
    gpu_open(&g, opt_device);
    uint64_t before = mem_used();
    CUdeviceptr p;
    CHECK(cuMemAlloc_v2(&p, (size_t)size));
    uint64_t after_alloc = mem_used();
    out("parent_used_before=%llu parent_used_after_alloc=%llu\n", (unsigned long long)before,
        (unsigned long long)after_alloc);

    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        die("fork failed");
    if (pid == 0) {
        out("child_pid=%d child_mode=%s\n", (int)getpid(), child);
        if (!strcmp(child, "cuda"))
            exit(forked_cuda_child(size));
        if (!strcmp(child, "exec")) {
            char dev[16], sz[32];
            snprintf(dev, sizeof dev, "%d", opt_device);
            snprintf(sz, sizeof sz, "%llu", (unsigned long long)size);
            char *args[] = {argv[0], "--as-child", "--device", dev, "--size", sz, NULL};
            execv("/proc/self/exe", args);
            out("error=exec_failed\n");
            _exit(127);
        }
        exit(0);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid)
        die("waitpid failed");
    int child_exit = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    uint64_t after_child = mem_used();
    out("child_exit=%d parent_used_after_child=%llu\n", child_exit,
        (unsigned long long)after_child);
    CHECK(cuMemFree_v2(p));
    uint64_t after_free = mem_used();
    out("parent_used_after_free=%llu\n", (unsigned long long)after_free);
    gpu_close(&g);
    uint64_t drift = after_child > after_alloc ? after_child - after_alloc : after_alloc - after_child;
    int pass = child_exit == 0 && drift <= tolerance;
    out("result=%s\n", pass ? "PASS" : "FAIL");
    return pass ? 0 : 1;
}
