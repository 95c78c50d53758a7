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
#include <unistd.h>

#define NV_TYPE 0x46 /* 'F' */
#define NV_ESC_RM_CONTROL 0x2A
#define NV_ESC_RM_ALLOC 0x2B
#define TSG_CLASS 0xa06c
#define CTRL_SET_TIMESLICE 0xa06c0103u
#define CTRL_GET_TIMESLICE 0xa06c0104u

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

static int call(int fd, unsigned long req, void *arg) {
    if (!real_ioctl) real_ioctl = (int (*)(int, unsigned long, void *))dlsym(RTLD_NEXT, "ioctl");
    return real_ioctl(fd, req, arg);
}

static unsigned long control_req(void) {
    return (3ul << 30) | ((unsigned long)sizeof(struct rm_control) << 16) | (NV_TYPE << 8) | NV_ESC_RM_CONTROL;
}

static uint32_t tsg_control(int fd, uint32_t client, uint32_t object, uint32_t cmd, uint64_t *us) {
    struct timeslice ts = { *us };
    struct rm_control c = { client, object, cmd, 0, (uint64_t)(uintptr_t)&ts, sizeof ts, 0 };
    int rc = call(fd, control_req(), &c);
    *us = ts.us;
    return rc != 0 ? 0xffffffffu : c.status;
}

int ioctl(int fd, unsigned long req, ...) {
    va_list ap;
    va_start(ap, req);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    unsigned nr = req & 0xff, type = (req >> 8) & 0xff, size = (req >> 16) & 0x3fff;
    if (type == NV_TYPE && nr == NV_ESC_RM_CONTROL && size == sizeof(struct rm_control) && arg) {
        struct rm_control *c = arg;
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

__attribute__((constructor)) static void probe_init(void) {
    const char *w = getenv("TSG_TIMESLICE_US");
    if (w && *w) want_us = atol(w);
    if (want_us > 0) {
        pthread_t t;
        pthread_create(&t, NULL, setter, NULL);
        pthread_detach(t);
    }
}
