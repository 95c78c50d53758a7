/*
 * common.h: helpers shared by every sample.
 *
 * common.c holds what needs no linked driver (error names, option parsing, sizes, time,
 * NVML via dlopen, per-second rate reporting), so test_procaddr can use it without linking
 * libcuda.so.1. gpu.c holds what calls the linked driver (context, kernels, memory info).
 *
 * Output convention: results on stdout as `key=value` pairs (several per line allowed),
 * flushed per line. Exit status 0 = success, 1 = a CUDA call failed or a check did not hold,
 * 2 = bad command line.
 */
#ifndef VGPU_COMMON_H
#define VGPU_COMMON_H

#include <signal.h>
#include <stdint.h>
#include <stdio.h>

#include "vgpu_cuda.h"

#define MIB (1024ull * 1024ull)
#define GIB (1024ull * MIB)

/* ---- errors ---- */
/* Name of a CUresult: the driver's cuGetErrorName when it resolves, else a built-in table,
 * else "CUDA_ERROR_<number>". Never NULL. */
const char *cu_name(CUresult r);
/* Print `error=NAME code=N call=EXPR at=FILE:LINE` and exit(1). */
void cu_fail(CUresult r, const char *expr, const char *file, int line) __attribute__((noreturn));
#define CHECK(expr)                                                   \
    do {                                                              \
        CUresult check_r_ = (expr);                                   \
        if (check_r_ != CUDA_SUCCESS)                                 \
            cu_fail(check_r_, #expr, __FILE__, __LINE__);             \
    } while (0)
/* Print `error=<message>` and exit(1). */
void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
/* printf to stdout + fflush (one result line). */
void out(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Call alloc(&ptr, step) until it fails. Returns how many succeeded; their pointers are in
 * *ptrs (malloc'ed; the caller frees them and the array), the failing result in *last. */
size_t alloc_until_fail(CUresult (*alloc)(CUdeviceptr *, size_t), size_t step, CUdeviceptr **ptrs,
                        CUresult *last);

/* ---- command line ---- */
enum opt_kind { OPT_FLAG, OPT_INT, OPT_SIZE, OPT_DOUBLE, OPT_STR };
struct opt {
    const char *name; /* "--size" */
    enum opt_kind kind;
    void *dst;        /* int* (FLAG, INT), uint64_t* (SIZE), double*, const char** (STR) */
    const char *help;
};
/* Device ordinal every sample uses: --device D, else env VGPU_SAMPLE_DEVICE, else 0. */
extern int opt_device;
/* Parse argv against opts (plus the built-in --device and --help). Accepts `--name value`
 * and `--name=value`. Unknown options, missing or malformed values: message + exit(2). */
void parse_opts(int argc, char **argv, const struct opt *opts, const char *summary);
/* Size string: bytes, or a decimal number with k/m/g/t (powers of 1024), optional b/ib,
 * any case ("1g", "1.5GiB", "100m", "4096"). Returns 0 on success, -1 if malformed. */
int parse_size(const char *s, uint64_t *out);

/* ---- time ---- */
uint64_t now_ns(void);
void sleep_ns(uint64_t ns);
double median(double *v, int n); /* sorts v */
/* Prints `KEY=median KEY_min=min KEY_max=max` of n samples (sorts v). */
void print_median(const char *key, double *v, int n);
/* One warm-up run, then `runs` measured runs of `run_once(0, ctx)` (ns per operation through the
 * exported entry points); prints `KEY_ns=` (print_median). With `ab`, each run also times
 * `run_once(1, ctx)` (the driver's own entry points), alternating which goes first, and prints
 * `KEY_driver_ns=` and `ab_ratio=` (the median of per-run ratios, exported / driver). */
void time_runs(const char *key, int runs, int ab, double (*run_once)(int which, void *ctx), void *ctx);

/* ---- stop flag: set by SIGINT/SIGTERM/SIGUSR1 once stop_on_signals() was called ---- */
extern volatile sig_atomic_t stop_requested;
void stop_on_signals(void);

/* ---- per-second rate reports (test_runtime_launch, test_graph) ----
 * Every full second prints `second=K <unit>_per_sec=X` (and kernels_per_sec when
 * kernels_per_unit != 1), flushed; rate_finish prints the totals and averages. */
struct rate {
    const char *unit;          /* "kernels", "graphs" */
    uint64_t kernels_per_unit; /* kernels in one unit */
    uint64_t start_ns, window_ns, window_count, total;
    int second;
    double min_rate, max_rate; /* over full windows, in units per second */
};
void rate_start(struct rate *r, const char *unit, uint64_t kernels_per_unit);
/* Count n more units; prints when a window closed. Returns seconds elapsed since start. */
double rate_add(struct rate *r, uint64_t n);
void rate_finish(struct rate *r);

/* ---- NVML, loaded at run time ---- */
/* Loads libnvidia-ml.so.1 and calls nvmlInit_v2 once; prints `nvml=loaded` or
 * `nvml=absent reason=...` the first time. Returns 1 when NVML is usable. */
int nvml_open(void);
/* NVML handle of the device with this CUDA UUID (falling back to the same index when the
 * UUID lookup is unavailable). Returns 1 on success. */
int nvml_device(const CUuuid *uuid, int index, nvmlDevice_t *dev);
/* nvmlDeviceGetMemoryInfo / _v2; return the nvmlReturn_t (0 = success, -1 = not exported). */
int nvml_memory(nvmlDevice_t dev, nvmlMemory_t *m);
int nvml_memory_v2(nvmlDevice_t dev, nvmlMemory_v2_t *m);
/* nvmlDeviceGetUtilizationRates' GPU percent; returns the nvmlReturn_t (-1 = not exported). */
int nvml_gpu_util(nvmlDevice_t dev, unsigned int *pct);
const char *nvml_error(int code);

/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (41 bytes with the NUL). */
void format_uuid(const CUuuid *u, char out[64]);

#endif /* VGPU_COMMON_H */
