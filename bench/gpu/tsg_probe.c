/*
 * tsg_probe.so: does the GPU honour a process's own channel-group (TSG) timeslice? (issue 14:
 * a lower-priority container's kernel already running when a higher-priority request arrives
 * delays it until the kernel ends or the GPU's timeslice (~2 ms) expires.)
 *
 * LD_PRELOAD it (no libvgpu) into a CUDA program. It interposes ioctl and, for the NVIDIA
 * resource manager's calls on /dev/nvidiactl, logs to stderr the channel groups the driver
 * allocates (class KEPLER_CHANNEL_GROUP_A, 0xa06c) and every control libcuda sends them.
 * With TSG_TIMESLICE_US=N it rewrites the timeslice libcuda sets on them to N microseconds, and
 * a thread sets N on every group it saw (every 500 ms, for late ones) and reads it back.
 * It also logs the compute preemption mode libcuda asks for on each group
 * (NV2080_CTRL_CMD_GR_SET_CTXSW_PREEMPTION_MODE / _PREEMPTION_BIND, on the subdevice); with
 * TSG_CILP=M (0 WFI, 1 CTA, 2 CILP) it rewrites that request to M before the driver sees it. With
 * TSG_PROBE_LOG=PATH a thread appends to PATH.<pid>, every 2 s, each group's context-switch counts
 * (GR_GET_CTXSW_STATS: saves by kind) and its mode (GR_GET_CTXSW_MODES).
 * With TSG_TOGGLE=OFF_US:PERIOD_US (and TSG_PROBE_LOG), from 8 s on, every PERIOD_US a thread
 * takes each of the process's groups off the runlist (NVA06C_CTRL_CMD_GPFIFO_SCHEDULE, bEnable 0)
 * for OFF_US and puts it back, and logs the calls' statuses and how long they took: can a process
 * keep its own queued work off the GPU for a while, and what does it cost?
 * A probe for the benchmarks, not part of the hook.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NV_TYPE 0x46 /* 'F' */
#define NV_ESC_RM_CONTROL 0x2A
#define NV_ESC_RM_ALLOC 0x2B
#define TSG_CLASS 0xa06c
#define CTRL_SET_TIMESLICE 0xa06c0103u
#define CTRL_GET_TIMESLICE 0xa06c0104u
#define CTRL_GPFIFO_SCHEDULE 0xa06c0101u
#define SUBDEVICE_CLASS 0x2080
#define CTRL_SET_PREEMPTION_MODE 0x20801210u
#define CTRL_PREEMPTION_BIND 0x20801211u
#define CTRL_GET_CTXSW_STATS 0x20801215u
#define CTRL_GET_CTXSW_MODES 0x20801235u

struct rm_control { /* NVOS54_PARAMETERS */
    uint32_t h_client, h_object, cmd, flags;
    uint64_t params;
    uint32_t params_size, status;
};
struct rm_alloc_head { /* NVOS21 / NVOS64: the common head */
    uint32_t h_root, h_parent, h_new, h_class;
};
struct timeslice { uint64_t us; };

static int (*real_ioctl)(int, unsigned long, void *);
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
#define MAX_TSG 64
static struct { int fd; uint32_t client, object; } tsgs[MAX_TSG];
static int ntsg;
static long want_us = -1;
static long want_cilp = -1;
static const char *probe_log;
/* The subdevice libcuda set the preemption mode on (its client, fd): the stats are read there. */
static struct { int fd; uint32_t client, object, channel; } subdev;
struct set_mode { uint32_t flags, h_channel, gfxp, cilp, route_flags, pad; uint64_t route; };
struct ctxsw_stats { uint32_t h_channel, flags, save, restore, wfi, cta, cilp, gfxp; };
struct ctxsw_modes { uint32_t h_channel, zcull, pm, smpc, cilp, gfxp; };

static int call(int fd, unsigned long req, void *arg) {
    if (!real_ioctl) real_ioctl = (int (*)(int, unsigned long, void *))dlsym(RTLD_NEXT, "ioctl");
    return real_ioctl(fd, req, arg);
}

static unsigned long control_req(void) {
    return (3ul << 30) | ((unsigned long)sizeof(struct rm_control) << 16) | (NV_TYPE << 8) | NV_ESC_RM_CONTROL;
}

static uint32_t control(int fd, uint32_t client, uint32_t object, uint32_t cmd, void *params, uint32_t size) {
    struct rm_control c = { client, object, cmd, 0, (uint64_t)(uintptr_t)params, size, 0 };
    int rc = call(fd, control_req(), &c);
    return rc != 0 ? 0xffffffffu : c.status;
}

static uint32_t tsg_control(int fd, uint32_t client, uint32_t object, uint32_t cmd, uint64_t *us) {
    struct timeslice ts = { *us };
    uint32_t status = control(fd, client, object, cmd, &ts, sizeof ts);
    *us = ts.us;
    return status;
}

/* TSG_PROBE_LOG.<pid>, to append to (NULL without TSG_PROBE_LOG or when it cannot be opened). */
static FILE *log_open(void) {
    if (!probe_log || !*probe_log) return NULL;
    char path[512];
    snprintf(path, sizeof path, "%s.%d", probe_log, (int)getpid());
    return fopen(path, "a");
}

/* SET_CTXSW_PREEMPTION_MODE / PREEMPTION_BIND: log (and with TSG_CILP rewrite) the compute mode. */
static int preemption_control(int fd, unsigned long req, struct rm_control *c) {
    uint32_t *cilp = NULL, *flags = NULL, h_channel = 0;
    if (c->cmd == CTRL_SET_PREEMPTION_MODE && c->params_size >= sizeof(struct set_mode)) {
        struct set_mode *m = (struct set_mode *)(uintptr_t)c->params;
        cilp = &m->cilp, flags = &m->flags, h_channel = m->h_channel;
    } else if (c->cmd == CTRL_PREEMPTION_BIND && c->params_size >= 96) {
        uint8_t *b = (uint8_t *)(uintptr_t)c->params;
        flags = (uint32_t *)b, h_channel = *(uint32_t *)(b + 8), cilp = (uint32_t *)(b + 92);
    }
    uint32_t asked_flags = flags ? *flags : 0, asked = cilp ? *cilp : 0;
    if (cilp && want_cilp >= 0 && (asked_flags & 1)) *cilp = (uint32_t)want_cilp;
    int rc = call(fd, req, c);
    char line[256];
    snprintf(line, sizeof line, "tsg_probe preemption cmd=0x%08x client=0x%x subdevice=0x%x channel=0x%x flags=0x%x cilp_asked=%u cilp_sent=%u rc=%d status=0x%x\n",
             c->cmd, c->h_client, c->h_object, h_channel, asked_flags, asked, cilp ? *cilp : 0, rc, c->status);
    fputs(line, stderr);
    FILE *f = log_open();
    if (f) fputs(line, f), fclose(f);
    if (rc == 0 && c->status == 0) {
        pthread_mutex_lock(&mu);
        subdev.fd = fd, subdev.client = c->h_client, subdev.object = c->h_object, subdev.channel = h_channel;
        pthread_mutex_unlock(&mu);
    }
    return rc;
}

int ioctl(int fd, unsigned long req, ...) {
    va_list ap;
    va_start(ap, req);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    unsigned nr = req & 0xff, type = (req >> 8) & 0xff, size = (req >> 16) & 0x3fff;
    if (type == NV_TYPE && nr == NV_ESC_RM_CONTROL && size == sizeof(struct rm_control) && arg) {
        struct rm_control *c = arg;
        if ((c->cmd == CTRL_SET_PREEMPTION_MODE || c->cmd == CTRL_PREEMPTION_BIND) && c->params) return preemption_control(fd, req, c);
        if ((c->cmd >> 16) == TSG_CLASS) {
            uint64_t asked = 0;
            if (c->cmd == CTRL_SET_TIMESLICE && c->params && c->params_size >= 8) {
                struct timeslice *ts = (struct timeslice *)(uintptr_t)c->params;
                asked = ts->us;
                if (want_us > 0) ts->us = (uint64_t)want_us;
            }
            int rc = call(fd, req, arg);
            fprintf(stderr, "tsg_probe control cmd=0x%08x client=0x%x object=0x%x asked_us=%lu rc=%d status=0x%x\n", c->cmd,
                    c->h_client, c->h_object, (unsigned long)asked, rc, c->status);
            return rc;
        }
    }
    int rc = call(fd, req, arg);
    if (type == NV_TYPE && nr == NV_ESC_RM_ALLOC && size >= sizeof(struct rm_alloc_head) && arg) {
        struct rm_alloc_head *a = arg;
        FILE *f = log_open(); /* every allocation: which class is libcuda's group? */
        if (f) fprintf(f, "tsg_probe alloc client=0x%x parent=0x%x object=0x%x class=0x%x size=%u fd=%d rc=%d\n", a->h_root,
                           a->h_parent, a->h_new, a->h_class, size, fd, rc), fclose(f);
        if (a->h_class == TSG_CLASS && rc == 0) {
            pthread_mutex_lock(&mu);
            if (ntsg < MAX_TSG) tsgs[ntsg++] = (typeof(tsgs[0])){ fd, a->h_root, a->h_new };
            pthread_mutex_unlock(&mu);
            fprintf(stderr, "tsg_probe alloc tsg client=0x%x object=0x%x fd=%d\n", a->h_root, a->h_new, fd);
        }
    }
    return rc;
}

static void *setter(void *unused) {
    (void)unused;
    int done[MAX_TSG] = { 0 };
    for (;;) {
        usleep(500000);
        pthread_mutex_lock(&mu);
        int n = ntsg;
        pthread_mutex_unlock(&mu);
        for (int i = 0; i < n; i++) {
            if (done[i]) continue;
            uint64_t us = (uint64_t)want_us, before = 0;
            uint32_t s0 = tsg_control(tsgs[i].fd, tsgs[i].client, tsgs[i].object, CTRL_GET_TIMESLICE, &before);
            uint32_t s1 = tsg_control(tsgs[i].fd, tsgs[i].client, tsgs[i].object, CTRL_SET_TIMESLICE, &us);
            uint64_t after = 0;
            uint32_t s2 = tsg_control(tsgs[i].fd, tsgs[i].client, tsgs[i].object, CTRL_GET_TIMESLICE, &after);
            fprintf(stderr, "tsg_probe set object=0x%x before_us=%lu (0x%x) set=%ld (0x%x) after_us=%lu (0x%x)\n", tsgs[i].object,
                    (unsigned long)before, s0, want_us, s1, (unsigned long)after, s2);
            done[i] = 1;
        }
    }
    return NULL;
}

/* Every 2 s: each group's saves by kind and its compute preemption mode, to TSG_PROBE_LOG.<pid>. */
static void *stats(void *unused) {
    (void)unused;
    for (;;) {
        sleep(2);
        pthread_mutex_lock(&mu);
        int n = ntsg;
        typeof(subdev) sd = subdev;
        pthread_mutex_unlock(&mu);
        if (!sd.object) continue;
        FILE *f = log_open();
        if (!f) continue;
        /* The group libcuda set the preemption mode on first (session 19: it is not among the
         * allocations recorded below), then the recorded ones. */
        for (int i = -1; i < n; i++) {
            uint32_t group = i < 0 ? sd.channel : tsgs[i].object;
            if (i >= 0 && (tsgs[i].client != sd.client || group == sd.channel)) continue;
            struct ctxsw_stats st = { .h_channel = group };
            uint32_t s0 = control(sd.fd, sd.client, sd.object, CTRL_GET_CTXSW_STATS, &st, sizeof st);
            struct ctxsw_modes md = { .h_channel = group };
            uint32_t s1 = control(sd.fd, sd.client, sd.object, CTRL_GET_CTXSW_MODES, &md, sizeof md);
            fprintf(f, "tsg_probe stats tsg=0x%x%s status=0x%x save=%u restore=%u wfi=%u cta=%u cilp=%u gfxp=%u modes_status=0x%x cilp_mode=%u\n",
                    group, i < 0 ? " (libcuda's mode)" : "", s0, st.save, st.restore, st.wfi, st.cta, st.cilp, st.gfxp, s1, md.cilp);
        }
        fclose(f);
    }
    return NULL;
}

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static long toggle_off_us, toggle_period_us;

/* Take every group off the runlist (on = 0) or put it back (on = 1); the slowest call's time. */
static double schedule_all(int on, uint32_t *bad_status, int *calls) {
    pthread_mutex_lock(&mu);
    int n = ntsg;
    pthread_mutex_unlock(&mu);
    double slowest = 0;
    for (int i = 0; i < n; i++) {
        uint8_t p[3] = { (uint8_t)on, 0, 0 };
        double t0 = now_us();
        uint32_t st = control(tsgs[i].fd, tsgs[i].client, tsgs[i].object, CTRL_GPFIFO_SCHEDULE, p, sizeof p);
        double dt = now_us() - t0;
        if (dt > slowest) slowest = dt;
        if (st) *bad_status = st;
        (*calls)++;
    }
    return slowest;
}

static void *toggler(void *unused) {
    (void)unused;
    sleep(8);
    long rounds = 0;
    int calls = 0;
    uint32_t bad = 0;
    double off_max = 0, on_max = 0, off_sum = 0, on_sum = 0;
    double t_last = now_us();
    for (;;) {
        usleep((useconds_t)(toggle_period_us - toggle_off_us));
        double a = schedule_all(0, &bad, &calls);
        usleep((useconds_t)toggle_off_us);
        double b = schedule_all(1, &bad, &calls);
        rounds++, off_sum += a, on_sum += b;
        if (a > off_max) off_max = a;
        if (b > on_max) on_max = b;
        if (now_us() - t_last > 2e6) {
            FILE *f = log_open();
            if (f) {
                fprintf(f, "tsg_probe toggle groups=%d rounds=%ld calls=%d last_bad_status=0x%x off_call_us_mean=%.1f max=%.1f on_call_us_mean=%.1f max=%.1f\n",
                        ntsg, rounds, calls, bad, off_sum / rounds, off_max, on_sum / rounds, on_max);
                fclose(f);
            }
            t_last = now_us();
        }
    }
    return NULL;
}

__attribute__((constructor)) static void probe_init(void) {
    probe_log = getenv("TSG_PROBE_LOG");
    const char *tg = getenv("TSG_TOGGLE");
    if (tg && *tg && sscanf(tg, "%ld:%ld", &toggle_off_us, &toggle_period_us) == 2 && toggle_off_us > 0 &&
        toggle_period_us > toggle_off_us && probe_log && *probe_log) {
        pthread_t t;
        pthread_create(&t, NULL, toggler, NULL);
        pthread_detach(t);
    }
    const char *w = getenv("TSG_TIMESLICE_US");
    if (w && *w) want_us = atol(w);
    const char *m = getenv("TSG_CILP");
    if (m && *m) want_cilp = atol(m);
    if (probe_log && *probe_log) {
        pthread_t t;
        pthread_create(&t, NULL, stats, NULL);
        pthread_detach(t);
    }
    if (want_us > 0) {
        pthread_t t;
        pthread_create(&t, NULL, setter, NULL);
        pthread_detach(t);
    }
}
