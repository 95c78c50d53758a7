/*
 * test_ioctl: the hook's `ioctl` override (it watches the NVIDIA resource manager's channel-group
 * calls) must leave every other ioctl exactly as glibc's: each case below is made through
 * `ioctl` (the override when preloaded) and through the raw system call, and must give the same
 * return value, errno and output. Cases: FIONREAD on a pipe; a closed descriptor; requests shaped
 * like the resource manager's control (a set-timeslice), allocation (a channel group) and free
 * calls, on a regular file, and with a NULL argument.
 *
 * Output: `ioctl_from=PATH` (the object whose `ioctl` a program gets), one
 * `case NAME rc= errno= same=0|1` line per case, then result=PASS|FAIL.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common.h"

struct rm_control { uint32_t client, object, cmd, flags; uint64_t params; uint32_t size, status; };
struct rm_alloc { uint32_t root, parent, new_, class_; uint64_t params; uint32_t size, status; };

static int pass = 1;

static void one(const char *name, int fd, unsigned long req, void *arg, void *copy, size_t len) {
    unsigned char before[64] = {0}, hooked[64] = {0};
    if (len) memcpy(before, arg, len);
    errno = 0;
    int rc = ioctl(fd, req, arg);
    int err = errno;
    if (len) {
        memcpy(hooked, arg, len);
        memcpy(copy, before, len);
    }
    errno = 0;
    long rc2 = syscall(SYS_ioctl, fd, req, len ? copy : arg);
    int err2 = errno;
    int same = rc == rc2 && err == err2 && (!len || memcmp(hooked, copy, len) == 0);
    out("case %s rc=%d errno=%d raw_rc=%ld raw_errno=%d same=%d\n", name, rc, err, rc2, err2, same);
    pass &= same;
}

int main(void) {
    Dl_info info;
    void *f = dlsym(RTLD_DEFAULT, "ioctl");
    out("ioctl_from=%s\n", f && dladdr(f, &info) && info.dli_fname ? info.dli_fname : "?");

    int p[2];
    if (pipe(p) != 0 || write(p[1], "hello", 5) != 5) die("pipe");
    int n = -1, n2 = -1;
    one("fionread_pipe", p[0], FIONREAD, &n, &n2, sizeof n);
    if (n != 5) pass = 0;
    one("closed_fd", 1000, FIONREAD, &n, &n2, sizeof n);

    char path[] = "/tmp/test_ioctl_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) die("mkstemp");
    unlink(path);
    uint64_t ts = 2048;
    struct rm_control c = { 1, 2, 0xa06c0103u, 0, (uint64_t)(uintptr_t)&ts, 8, 0 }, c2;
    one("rm_control_shape", fd, 0xc020462aul, &c, &c2, sizeof c);
    if (ts != 2048) pass = 0;
    struct rm_alloc a = { 1, 2, 3, 0xa06c, 0, 0, 0 }, a2;
    one("rm_alloc_shape", fd, 0xc020462bul, &a, &a2, sizeof a);
    uint32_t fr[4] = { 1, 2, 3, 0 }, fr2[4];
    one("rm_free_shape", fd, 0xc0104629ul, fr, fr2, sizeof fr);
    one("rm_control_null", fd, 0xc020462aul, NULL, NULL, 0);
    close(fd);
    out("result=%s\n", pass ? "PASS" : "FAIL");
    return pass ? 0 : 1;
}
