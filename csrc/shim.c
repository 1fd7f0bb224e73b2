/*
 * nsconfine's exec shim: the command bwrap execs in a pre-staged sandbox.
 *
 *     _shim SOCKET_FD IDLE_TIMEOUT_MS
 *
 * The sandbox is already built (namespaces, mounts, environment, working
 * directory) when this runs; what is missing is the caller's command. The
 * shim writes one byte 'R' on its socket (the launcher's sign that the shim
 * started), then waits for ONE launch message (nsconfine/_pool.py writes it):
 *
 *     struct launch_header (below), then `size` bytes: `argc` NUL-terminated
 *     arguments, then `envc` NUL-terminated NAME=VALUE strings
 *     SCM_RIGHTS on the first byte: the error pipe's write end, then one fd
 *     for each of the low bits set in fd_mask (bit i: the fd to place at i,
 *     i = 0..2); bit 4 + i set instead closes fd i; neither keeps it
 *
 * It puts the fds in place, sets the extra variables over the environment
 * bwrap gave it (the plan's), resets every signal disposition and the
 * signal mask, marks every fd from 3 up close-on-exec and execvp's argv[0].
 * nsconfine.spawn sends no fds (the command keeps the stdio bwrap got);
 * nsconfine.Pool sends the caller's. The error pipe is the
 * launcher's proof: it closes at a successful exec (EOF); on failure the
 * shim writes {errno, stage} into it and exits 127. EOF on the socket (the
 * launcher closed the pool or died) or the idle timeout: exit 0, the
 * sandbox ends and the launcher reaps it.
 *
 * Statically linked where the toolchain can, so it runs in a plan without
 * /usr. No Python, no locale, nothing it does not need.
 */
#define _GNU_SOURCE
#include "nsconfine.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SHIM_MAX_FDS 4 /* the error pipe and 0, 1, 2 */

#ifndef __NR_close_range
#define __NR_close_range 436
#endif
#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

struct launch_header {
    uint32_t magic;
    uint32_t fd_mask;
    uint32_t argc;
    uint32_t envc;
    uint32_t size;
};

struct report {
    int32_t err;
    int32_t stage;
};

static int errpipe = -1;

__attribute__((noreturn)) static void fail(int stage)
{
    struct report r = { errno, stage };
    if (errpipe >= 0) {
        ssize_t n;
        do
            n = write(errpipe, &r, sizeof r);
        while (n < 0 && errno == EINTR);
    }
    _exit(127);
}

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/*
 * Wait until the socket is readable. 0 on data (or EOF, which the read then
 * sees), -1 when the idle time is up with nothing queued. A message that
 * lands as the timer runs out still counts: the launcher only uses a staged
 * sandbox before its deadline, so anything queued is a real launch.
 */
static int wait_readable(int sock, long long timeout_ms)
{
    long long deadline = now_ms() + timeout_ms;
    for (;;) {
        long long left = deadline - now_ms();
        struct pollfd p = { .fd = sock, .events = POLLIN };
        int r = poll(&p, 1, left <= 0 ? 0 : left > INT_MAX ? INT_MAX : (int)left);
        if (r > 0)
            return 0;
        if (r < 0 && errno != EINTR)
            return 0; /* let recvmsg report it */
        if (r == 0 && left <= 0) {
            char c;
            return recv(sock, &c, 1, MSG_PEEK | MSG_DONTWAIT) > 0 ? 0 : -1;
        }
    }
}

/* Read exactly len bytes; the first call also collects the passed fds. */
static int read_exact(int sock, void *buf, size_t len, int *fds, int *n_fds)
{
    size_t done = 0;
    while (done < len) {
        union {
            struct cmsghdr align;
            char buf[CMSG_SPACE(sizeof(int) * SHIM_MAX_FDS)];
        } control;
        struct iovec iov = { (char *)buf + done, len - done };
        struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
        if (fds) {
            msg.msg_control = control.buf;
            msg.msg_controllen = sizeof control.buf;
        }
        ssize_t n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -1;
        if (n == 0)
            return done == 0 ? 1 : -1; /* EOF: clean only before a message began */
        if (fds) {
            if (msg.msg_flags & MSG_CTRUNC) {
                errno = EMSGSIZE;
                return -1;
            }
            for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
                if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
                    size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                    for (size_t i = 0; i < count && *n_fds < SHIM_MAX_FDS; i++)
                        memcpy(&fds[(*n_fds)++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
                }
            }
            fds = NULL; /* fds travel with the first byte only */
        }
        done += (size_t)n;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    char *end;
    long sock = strtol(argv[1], &end, 10);
    if (*end || sock < 3 || sock > INT_MAX)
        return 2;
    long long timeout_ms = strtoll(argv[2], &end, 10);
    if (*end || timeout_ms < 0)
        return 2;

    /* Started: the launcher waits for this before it counts the sandbox as staged. */
    ssize_t w;
    do
        w = write((int)sock, "R", 1);
    while (w < 0 && errno == EINTR);
    if (w != 1)
        return 0;

    if (wait_readable((int)sock, timeout_ms) < 0)
        _exit(0);

    struct launch_header h;
    int fds[SHIM_MAX_FDS];
    int n_fds = 0;
    int r = read_exact((int)sock, &h, sizeof h, fds, &n_fds);
    if (r == 1)
        _exit(0);
    if (n_fds > 0)
        errpipe = fds[0];
    if (r < 0)
        fail(NSC_SHIM_STAGE_RECV);
    int wanted = 1 + __builtin_popcount(h.fd_mask & NSC_SHIM_PLACE_MASK);
    if (h.magic != NSC_SHIM_MAGIC || n_fds != wanted || h.argc == 0 ||
        h.size > NSC_SHIM_MAX_BODY || (h.fd_mask & ~(uint32_t)(NSC_SHIM_PLACE_MASK | NSC_SHIM_CLOSE_MASK)) ||
        (h.fd_mask & (h.fd_mask >> 4) & NSC_SHIM_PLACE_MASK)) {
        errno = EPROTO;
        fail(NSC_SHIM_STAGE_PROTOCOL);
    }

    char *body = malloc((size_t)h.size + 1);
    char **args = calloc((size_t)h.argc + 1, sizeof *args);
    if (!body || !args)
        fail(NSC_SHIM_STAGE_RECV);
    if (read_exact((int)sock, body, h.size, NULL, NULL) != 0)
        fail(NSC_SHIM_STAGE_RECV);
    body[h.size] = '\0';

    /* Split the body: argc arguments, then envc variables, each NUL-terminated. */
    char *p = body, *limit = body + h.size;
    for (uint32_t i = 0; i < h.argc + h.envc; i++) {
        char *nul = memchr(p, '\0', (size_t)(limit - p));
        if (!nul) {
            errno = EPROTO;
            fail(NSC_SHIM_STAGE_PROTOCOL);
        }
        if (i < h.argc) {
            args[i] = p;
        } else {
            if (!strchr(p, '=')) {
                errno = EINVAL;
                fail(NSC_SHIM_STAGE_ENV);
            }
            if (putenv(p) != 0)
                fail(NSC_SHIM_STAGE_ENV);
        }
        p = nul + 1;
    }
    if (p != limit) {
        errno = EPROTO;
        fail(NSC_SHIM_STAGE_PROTOCOL);
    }

    /*
     * A received fd lands on the lowest free number, which is below 3 if
     * bwrap was started with a closed stdio fd: move such fds up first, so
     * no dup2 below clobbers a source still to be placed. dup2 clears
     * FD_CLOEXEC on the target, which is what the payload needs.
     */
    for (int i = 1; i < n_fds; i++) {
        if (fds[i] < 3 && (fds[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 3)) < 0)
            fail(NSC_SHIM_STAGE_DUP);
    }
    int next = 1;
    for (int target = 0; target < 3; target++) {
        if (h.fd_mask & (1u << target)) {
            if (dup2(fds[next++], target) < 0)
                fail(NSC_SHIM_STAGE_DUP);
        } else if (h.fd_mask & (0x10u << target)) {
            (void)close(target);
        }
    }

    /* The command starts with default signal handling, whatever bwrap left. */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; sig++) {
        if (sig != SIGKILL && sig != SIGSTOP)
            (void)sigaction(sig, &dfl, NULL); /* EINVAL for libc's own: nothing to reset */
    }
    sigset_t none;
    sigemptyset(&none);
    if (sigprocmask(SIG_SETMASK, &none, NULL) < 0)
        fail(NSC_SHIM_STAGE_SIGNALS);
    /* Everything else, the socket and the error pipe too, closes at exec. */
    if (syscall(__NR_close_range, 3u, ~0u, CLOSE_RANGE_CLOEXEC) < 0) {
        /* ENOSYS before Linux 5.9, EINVAL for the flag before 5.11. */
        if (errno != ENOSYS && errno != EINVAL)
            fail(NSC_SHIM_STAGE_CLOSE);
        long max = sysconf(_SC_OPEN_MAX);
        for (long fd = 3; fd < (max < 0 || max > 65536 ? 65536 : max); fd++)
            (void)fcntl((int)fd, F_SETFD, FD_CLOEXEC); /* EBADF: not open */
    }

    execvp(args[0], args);
    fail(NSC_SHIM_STAGE_EXEC);
}
