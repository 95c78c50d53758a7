/* common.c: driver-independent helpers shared by the samples (see common.h). */
#include "common.h"

#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------------ errors */

static const struct {
    int code;
    const char *name;
} cu_names[] = {
    {0, "CUDA_SUCCESS"},
    {1, "CUDA_ERROR_INVALID_VALUE"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY"},
    {3, "CUDA_ERROR_NOT_INITIALIZED"},
    {4, "CUDA_ERROR_DEINITIALIZED"},
    {34, "CUDA_ERROR_STUB_LIBRARY"},
    {46, "CUDA_ERROR_DEVICE_UNAVAILABLE"},
    {100, "CUDA_ERROR_NO_DEVICE"},
    {101, "CUDA_ERROR_INVALID_DEVICE"},
    {200, "CUDA_ERROR_INVALID_IMAGE"},
    {201, "CUDA_ERROR_INVALID_CONTEXT"},
    {209, "CUDA_ERROR_NO_BINARY_FOR_GPU"},
    {218, "CUDA_ERROR_INVALID_PTX"},
    {221, "CUDA_ERROR_JIT_COMPILER_NOT_FOUND"},
    {222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"},
    {300, "CUDA_ERROR_INVALID_SOURCE"},
    {400, "CUDA_ERROR_INVALID_HANDLE"},
    {401, "CUDA_ERROR_ILLEGAL_STATE"},
    {500, "CUDA_ERROR_NOT_FOUND"},
    {600, "CUDA_ERROR_NOT_READY"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS"},
    {701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"},
    {702, "CUDA_ERROR_LAUNCH_TIMEOUT"},
    {708, "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE"},
    {709, "CUDA_ERROR_CONTEXT_IS_DESTROYED"},
    {719, "CUDA_ERROR_LAUNCH_FAILED"},
    {720, "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE"},
    {800, "CUDA_ERROR_NOT_PERMITTED"},
    {801, "CUDA_ERROR_NOT_SUPPORTED"},
    {999, "CUDA_ERROR_UNKNOWN"},
};

const char *cu_name(CUresult r)
{
    /* Looked up lazily through the global scope: present when libcuda.so.1 is loaded
     * (linked or dlopen'ed with RTLD_GLOBAL), tolerated when absent. */
    static PFN_cuGetErrorName get_name;
    static int looked_up;
    if (!looked_up) {
        looked_up = 1;
        *(void **)&get_name = dlsym(RTLD_DEFAULT, "cuGetErrorName");
    }
    if (get_name) {
        const char *s = NULL;
        if (get_name(r, &s) == CUDA_SUCCESS && s)
            return s;
    }
    for (size_t i = 0; i < sizeof cu_names / sizeof cu_names[0]; i++)
        if (cu_names[i].code == (int)r)
            return cu_names[i].name;
    static char buf[32];
    snprintf(buf, sizeof buf, "CUDA_ERROR_%d", (int)r);
    return buf;
}

void out(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
}

void cu_fail(CUresult r, const char *expr, const char *file, int line)
{
    const char *slash = strrchr(file, '/');
    file = slash ? slash + 1 : file;
    out("error=%s code=%d call=\"%s\" at=%s:%d\n", cu_name(r), (int)r, expr, file, line);
    exit(1);
}

void die(const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    out("error=%s\n", msg);
    exit(1);
}

size_t alloc_until_fail(CUresult (*alloc)(CUdeviceptr *, size_t), size_t step, CUdeviceptr **ptrs,
                        CUresult *last)
{
    size_t cap = 64, n = 0;
    CUdeviceptr *v = malloc(cap * sizeof *v);
    for (;;) {
        if (n == cap && !(v = realloc(v, (cap *= 2) * sizeof *v)))
            die("out of host memory for the allocation list");
        *last = alloc(&v[n], step);
        if (*last != CUDA_SUCCESS)
            break;
        n++;
    }
    *ptrs = v;
    return n;
}

/* ------------------------------------------------------------- command line */

int opt_device;

int parse_size(const char *s, uint64_t *out_bytes)
{
    if (!s)
        return -1;
    while (isspace((unsigned char)*s))
        s++;
    if (!isdigit((unsigned char)*s) && *s != '.')
        return -1;
    errno = 0;
    char *end = NULL;
    unsigned long long whole = strtoull(s, &end, 10);
    if (errno)
        return -1;
    double frac = 0.0;
    int has_frac = 0;
    if (*end == '.') {
        char *fend = NULL;
        frac = strtod(end, &fend); /* parses ".5" */
        if (fend == end + 1 && end == s)
            return -1; /* just "." */
        has_frac = 1;
        end = fend;
    }
    uint64_t mult = 1;
    switch (tolower((unsigned char)*end)) {
    case 'k': mult = 1ull << 10; end++; break;
    case 'm': mult = 1ull << 20; end++; break;
    case 'g': mult = 1ull << 30; end++; break;
    case 't': mult = 1ull << 40; end++; break;
    default: break;
    }
    if (mult > 1 && tolower((unsigned char)*end) == 'i')
        end++;
    if (tolower((unsigned char)*end) == 'b')
        end++;
    if (*end != '\0')
        return -1;
    if (has_frac && mult == 1 && frac != 0.0)
        return -1; /* fractional bytes */
    long double v = (long double)whole * mult + (long double)frac * mult;
    if (v > 18446744073709551615.0L)
        return -1;
    *out_bytes = (uint64_t)(v + 0.5L);
    return 0;
}

static void print_usage(const char *prog, const struct opt *opts, const char *summary)
{
    printf("usage: %s [options]\n%s\n  --device D  CUDA device ordinal (default: env VGPU_SAMPLE_DEVICE or 0)\n",
           prog, summary);
    for (const struct opt *o = opts; o && o->name; o++) {
        const char *arg = o->kind == OPT_FLAG ? "" : o->kind == OPT_SIZE ? " SIZE"
                                                : o->kind == OPT_STR    ? " STR"
                                                                        : " N";
        printf("  %s%s  %s\n", o->name, arg, o->help);
    }
}

static void usage_error(const char *prog, const char *what, const char *arg)
{
    fprintf(stderr, "%s: %s: %s (try --help)\n", prog, what, arg);
    printf("error=usage what=\"%s\" arg=\"%s\"\n", what, arg);
    exit(2);
}

static void set_value(const char *prog, const struct opt *o, const char *v)
{
    char *end = NULL;
    switch (o->kind) {
    case OPT_INT: {
        errno = 0;
        long n = strtol(v, &end, 10);
        if (errno || end == v || *end || n < -2147483647L || n > 2147483647L)
            usage_error(prog, "not an integer", v);
        *(int *)o->dst = (int)n;
        break;
    }
    case OPT_DOUBLE: {
        errno = 0;
        double d = strtod(v, &end);
        if (errno || end == v || *end || !isfinite(d))
            usage_error(prog, "not a number", v);
        *(double *)o->dst = d;
        break;
    }
    case OPT_SIZE:
        if (parse_size(v, (uint64_t *)o->dst))
            usage_error(prog, "not a size (e.g. 4096, 100m, 1.5g)", v);
        break;
    case OPT_STR:
        *(const char **)o->dst = v;
        break;
    case OPT_FLAG:
        break;
    }
}

void parse_opts(int argc, char **argv, const struct opt *opts, const char *summary)
{
    const char *prog = argc > 0 ? argv[0] : "sample";
    const char *env_dev = getenv("VGPU_SAMPLE_DEVICE");
    opt_device = 0;
    const struct opt device_opt = {"--device", OPT_INT, &opt_device, "device ordinal"};
    if (env_dev && *env_dev)
        set_value(prog, &device_opt, env_dev);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            print_usage(prog, opts, summary);
            exit(0);
        }
        const char *eq = strchr(a, '=');
        size_t nlen = eq ? (size_t)(eq - a) : strlen(a);
        const struct opt *o = NULL;
        if (strlen(device_opt.name) == nlen && !strncmp(a, device_opt.name, nlen))
            o = &device_opt;
        for (const struct opt *p = opts; !o && p && p->name; p++)
            if (strlen(p->name) == nlen && !strncmp(a, p->name, nlen))
                o = p;
        if (!o)
            usage_error(prog, "unknown option", a);
        if (o->kind == OPT_FLAG) {
            if (eq)
                usage_error(prog, "flag takes no value", a);
            *(int *)o->dst = 1;
            continue;
        }
        const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!v)
            usage_error(prog, "missing value for", a);
        set_value(prog, o, v);
    }
    if (opt_device < 0)
        usage_error(prog, "device must be >= 0", "--device");
}

/* -------------------------------------------------------------------- time */

uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void sleep_ns(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR && !stop_requested) {
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double median(double *v, int n)
{
    if (n <= 0)
        return 0.0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0;
}

void print_median(const char *key, double *v, int n)
{
    double m = median(v, n);
    out("%s=%.1f %s_min=%.1f %s_max=%.1f\n", key, m, key, n > 0 ? v[0] : 0.0, key,
        n > 0 ? v[n - 1] : 0.0);
}

void time_runs(const char *key, int runs, int ab, double (*run_once)(int which, void *ctx), void *ctx)
{
    double *per = calloc((size_t)runs, sizeof *per), *per_d = calloc((size_t)runs, sizeof *per_d);
    double *ratio = calloc((size_t)runs, sizeof *ratio);
    if (!per || !per_d || !ratio)
        die("out of memory");
    for (int run = -1; run < runs; run++) {
        double t[2] = {0, 0};
        for (int j = 0; j < (ab ? 2 : 1); j++) {
            int which = ab ? (j + run + 1) % 2 : 0; /* alternate which path goes first */
            t[which] = run_once(which, ctx);
        }
        if (run >= 0) {
            per[run] = t[0];
            per_d[run] = t[1];
            ratio[run] = ab ? t[0] / t[1] : 0;
        }
    }
    char name[64];
    snprintf(name, sizeof name, "%s_ns", key);
    print_median(name, per, runs);
    if (ab) {
        snprintf(name, sizeof name, "%s_driver_ns", key);
        print_median(name, per_d, runs);
        double m = median(ratio, runs);
        out("ab_ratio=%.4f ab_ratio_min=%.4f ab_ratio_max=%.4f\n", m, ratio[0], ratio[runs - 1]);
    }
    free(per);
    free(per_d);
    free(ratio);
}

/* -------------------------------------------------------------- stop flag */

volatile sig_atomic_t stop_requested;

static void on_stop_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}

void stop_on_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
}

/* ------------------------------------------------------------ rate reports */

void rate_start(struct rate *r, const char *unit, uint64_t kernels_per_unit)
{
    memset(r, 0, sizeof *r);
    r->unit = unit;
    r->kernels_per_unit = kernels_per_unit ? kernels_per_unit : 1;
    r->start_ns = r->window_ns = now_ns();
    r->min_rate = -1.0;
}

static void rate_line(const struct rate *r, const char *prefix, double units_per_sec)
{
    if (r->kernels_per_unit == 1)
        out("%s%s_per_sec=%.1f\n", prefix, r->unit, units_per_sec);
    else
        out("%s%s_per_sec=%.2f kernels_per_sec=%.1f\n", prefix, r->unit, units_per_sec,
            units_per_sec * (double)r->kernels_per_unit);
}

double rate_add(struct rate *r, uint64_t n)
{
    uint64_t t = now_ns();
    r->window_count += n;
    r->total += n;
    if (t - r->window_ns >= 1000000000ull) {
        double secs = (double)(t - r->window_ns) / 1e9;
        double rate = (double)r->window_count / secs;
        char prefix[32];
        snprintf(prefix, sizeof prefix, "second=%d ", ++r->second);
        rate_line(r, prefix, rate);
        if (r->min_rate < 0 || rate < r->min_rate)
            r->min_rate = rate;
        if (rate > r->max_rate)
            r->max_rate = rate;
        r->window_ns = t;
        r->window_count = 0;
    }
    return (double)(t - r->start_ns) / 1e9;
}

void rate_finish(struct rate *r)
{
    double secs = (double)(now_ns() - r->start_ns) / 1e9;
    double avg = secs > 0 ? (double)r->total / secs : 0.0;
    if (r->kernels_per_unit == 1)
        out("total_%s=%llu elapsed_s=%.3f\n", r->unit, (unsigned long long)r->total, secs);
    else
        out("total_%s=%llu total_kernels=%llu elapsed_s=%.3f\n", r->unit,
            (unsigned long long)r->total, (unsigned long long)(r->total * r->kernels_per_unit),
            secs);
    rate_line(r, "avg_", avg);
    if (r->second > 0)
        out("min_%s_per_sec=%.1f max_%s_per_sec=%.1f\n", r->unit, r->min_rate, r->unit,
            r->max_rate);
}

/* ---------------------------------------------------------------------- NVML */

static struct {
    int tried, ok;
    void *lib;
    int (*init_v2)(void);
    int (*get_handle_by_index_v2)(unsigned int, nvmlDevice_t *);
    int (*get_handle_by_uuid)(const char *, nvmlDevice_t *);
    int (*get_memory_info)(nvmlDevice_t, nvmlMemory_t *);
    int (*get_memory_info_v2)(nvmlDevice_t, nvmlMemory_v2_t *);
    int (*get_utilization_rates)(nvmlDevice_t, unsigned int *);
    const char *(*error_string)(int);
} nvml;

static void *nvml_sym(const char *name)
{
    return dlsym(nvml.lib, name);
}

int nvml_open(void)
{
    if (nvml.tried)
        return nvml.ok;
    nvml.tried = 1;
    nvml.lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!nvml.lib) {
        const char *e = dlerror();
        out("nvml=absent reason=\"%s\"\n", e ? e : "dlopen failed");
        return 0;
    }
    *(void **)&nvml.init_v2 = nvml_sym("nvmlInit_v2");
    *(void **)&nvml.get_handle_by_index_v2 = nvml_sym("nvmlDeviceGetHandleByIndex_v2");
    *(void **)&nvml.get_handle_by_uuid = nvml_sym("nvmlDeviceGetHandleByUUID");
    *(void **)&nvml.get_memory_info = nvml_sym("nvmlDeviceGetMemoryInfo");
    *(void **)&nvml.get_memory_info_v2 = nvml_sym("nvmlDeviceGetMemoryInfo_v2");
    *(void **)&nvml.get_utilization_rates = nvml_sym("nvmlDeviceGetUtilizationRates");
    *(void **)&nvml.error_string = nvml_sym("nvmlErrorString");
    if (!nvml.init_v2 || !nvml.get_memory_info) {
        out("nvml=absent reason=\"nvmlInit_v2 or nvmlDeviceGetMemoryInfo not exported\"\n");
        return 0;
    }
    int rc = nvml.init_v2();
    if (rc != 0) {
        out("nvml=absent reason=\"nvmlInit_v2 returned %d (%s)\"\n", rc, nvml_error(rc));
        return 0;
    }
    nvml.ok = 1;
    out("nvml=loaded\n");
    return 1;
}

const char *nvml_error(int code)
{
    if (code == -1)
        return "not exported";
    if (nvml.error_string) {
        const char *s = nvml.error_string(code);
        if (s)
            return s;
    }
    return "NVML error";
}

void format_uuid(const CUuuid *u, char buf[64])
{
    const unsigned char *b = (const unsigned char *)u->bytes;
    snprintf(buf, 64,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
             b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
             b[14], b[15]);
}

int nvml_device(const CUuuid *uuid, int index, nvmlDevice_t *dev)
{
    if (!nvml_open())
        return 0;
    if (uuid && nvml.get_handle_by_uuid) {
        char s[64];
        format_uuid(uuid, s);
        if (nvml.get_handle_by_uuid(s, dev) == 0)
            return 1;
    }
    return nvml.get_handle_by_index_v2 && nvml.get_handle_by_index_v2((unsigned)index, dev) == 0;
}

int nvml_memory(nvmlDevice_t dev, nvmlMemory_t *m)
{
    return nvml.get_memory_info ? nvml.get_memory_info(dev, m) : -1;
}

int nvml_gpu_util(nvmlDevice_t dev, unsigned int *pct)
{
    unsigned int u[2] = {0, 0}; /* nvmlUtilization_t: gpu, memory */
    if (!nvml.get_utilization_rates)
        return -1;
    int rc = nvml.get_utilization_rates(dev, u);
    *pct = u[0];
    return rc;
}

int nvml_memory_v2(nvmlDevice_t dev, nvmlMemory_v2_t *m)
{
    if (!nvml.get_memory_info_v2)
        return -1;
    memset(m, 0, sizeof *m);
    m->version = VGPU_NVML_MEMORY_V2_VERSION;
    return nvml.get_memory_info_v2(dev, m);
}
