/*
 * nsconfine's reaper: the launcher's child, which runs bwrap and makes sure
 * nothing of the session outlives either of them.
 *
 *     _reaper LIFELINE_FD INFO_FD BWRAP [ARG...]
 *
 * Why it exists: bwrap's sandbox child has no parent-death signal from its
 * clone until its pid 1 starts (bubblewrap sets it only then). Kill bwrap in
 * that window (the launcher dies, or kill() comes right after spawn) and the
 * child is orphaned: blocked forever on bwrap's eventfd, or going on to run
 * the command, either way holding every fd it inherited, so nobody reading
 * the session's stdout ever sees EOF. The reaper is a child subreaper: any
 * orphan of bwrap becomes its child, and it kills them all once bwrap ends.
 *
 * It tears the session down (SIGKILL to bwrap, then to every child it has
 * left, until it has none) when:
 *   - the lifeline reaches EOF: the launcher holds its write end, so that
 *     happens when the launcher *process* is gone, however it died;
 *   - it gets SIGTERM, SIGINT, SIGHUP or SIGQUIT (Sandbox.kill sends SIGTERM);
 *   - bwrap ends on its own (then normally nothing is left to kill).
 * Then it exits as bwrap did: the same exit code, or the same signal.
 *
 * If bwrap cannot be executed, it writes {"reaper-errno": N} on INFO_FD
 * (where bwrap would have written its own report) and exits 127.
 *
 * The launcher started it with everything bwrap needs at the right fd
 * numbers; bwrap inherits them all, and the reaper closes its own copies
 * once bwrap runs, so it never holds a session's pipe open. Static, no libc
 * beyond syscall wrappers, async-signal-safe throughout.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef __NR_close_range
#define __NR_close_range 436
#endif

static volatile int exec_errno; /* written by the vfork child, read once it is gone */

static int parse_fd(const char *text)
{
    char *end;
    errno = 0;
    long fd = strtol(text, &end, 10);
    return (*end || errno || fd < 0 || fd > INT_MAX) ? -1 : (int)fd;
}

static void write_all(int fd, const char *buf, size_t len)
{
    while (len > 0) {
        ssize_t n = write(fd, buf, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return;
        buf += n;
        len -= (size_t)n;
    }
}

static void report_exec_failure(int info_fd, int err)
{
    char text[64] = "{\"reaper-errno\": ";
    size_t n = strlen(text);
    char digits[12];
    int nd = 0;
    do {
        digits[nd++] = (char)('0' + err % 10);
        err /= 10;
    } while (err > 0 && nd < (int)sizeof digits);
    while (nd > 0)
        text[n++] = digits[--nd];
    text[n++] = '}';
    text[n++] = '\n';
    write_all(info_fd, text, n);
}

/* Close every fd but keep_a and keep_b (keep_a < keep_b). */
static void close_all_but(int keep_a, int keep_b)
{
    unsigned int ranges[3][2] = {
        { 0, (unsigned int)keep_a - 1 },
        { (unsigned int)keep_a + 1, (unsigned int)keep_b - 1 },
        { (unsigned int)keep_b + 1, ~0U },
    };
    for (int i = 0; i < 3; i++) {
        if (ranges[i][0] > ranges[i][1] || (i == 0 && keep_a == 0))
            continue;
        if (syscall(__NR_close_range, ranges[i][0], ranges[i][1], 0) < 0) {
            /* Before Linux 5.9: one by one, up to a bound nothing sensible exceeds. */
            unsigned int last = ranges[i][1] > 65535 ? 65535 : ranges[i][1];
            for (unsigned int fd = ranges[i][0]; fd <= last; fd++)
                (void)close((int)fd);
        }
    }
}

/* SIGKILL every child this process has (bwrap's orphans land here); 0 if it had none. */
static int kill_children(void)
{
    char path[64] = "/proc/self/task/";
    char digits[12];
    int nd = 0, n = (int)strlen(path);
    pid_t self = getpid();
    do {
        digits[nd++] = (char)('0' + self % 10);
        self /= 10;
    } while (self > 0);
    while (nd > 0)
        path[n++] = digits[--nd];
    memcpy(path + n, "/children", sizeof "/children");

    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    char buf[4096];
    ssize_t got;
    int found = 0;
    long pid = 0;
    int in_number = 0;
    while ((got = read(fd, buf, sizeof buf)) > 0 || (got < 0 && errno == EINTR)) {
        for (ssize_t i = 0; i < got; i++) {
            if (buf[i] >= '0' && buf[i] <= '9') {
                pid = pid * 10 + (buf[i] - '0');
                in_number = 1;
            } else if (in_number) {
                (void)kill((pid_t)pid, SIGKILL);
                found = 1;
                pid = 0;
                in_number = 0;
            }
        }
    }
    if (in_number) {
        (void)kill((pid_t)pid, SIGKILL);
        found = 1;
    }
    (void)close(fd);
    return found;
}

/* Kill and reap every child left, including orphans reparented while doing so. */
static void sweep(void)
{
    for (;;) {
        (void)kill_children();
        int status;
        pid_t reaped = waitpid(-1, &status, __WALL);
        if (reaped < 0 && errno == ECHILD)
            return;
    }
}

__attribute__((noreturn)) static void exit_like(int status)
{
    if (WIFEXITED(status))
        _exit(WEXITSTATUS(status));
    int sig = WTERMSIG(status);
    sigset_t only;
    sigemptyset(&only);
    sigaddset(&only, sig);
    (void)signal(sig, SIG_DFL);
    (void)prctl(PR_SET_DUMPABLE, 0, 0, 0, 0); /* no core file for a re-raised SIGSEGV */
    (void)kill(getpid(), sig);
    (void)sigprocmask(SIG_UNBLOCK, &only, NULL);
    _exit(128 + sig);
}

int main(int argc, char **argv)
{
    if (argc < 4)
        return 2;
    int lifeline = parse_fd(argv[1]);
    int info_fd = parse_fd(argv[2]);
    if (lifeline < 0 || info_fd < 0)
        return 2;

    if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) < 0)
        return 2;
    sigset_t watched, old;
    sigemptyset(&watched);
    int signals[] = { SIGCHLD, SIGTERM, SIGINT, SIGHUP, SIGQUIT };
    for (size_t i = 0; i < sizeof signals / sizeof signals[0]; i++)
        sigaddset(&watched, signals[i]);
    if (sigprocmask(SIG_BLOCK, &watched, &old) < 0)
        return 2;
    int sigfd = signalfd(-1, &watched, SFD_CLOEXEC);
    if (sigfd < 0)
        return 2;
    /* bwrap must not inherit the lifeline: it would keep itself alive. */
    if (fcntl(lifeline, F_SETFD, FD_CLOEXEC) < 0)
        return 2;

    pid_t self = getpid();
    pid_t bwrap = vfork();
    if (bwrap == 0) {
        (void)sigprocmask(SIG_SETMASK, &old, NULL);
        /* bwrap dies with us (and we die only after killing what it leaves); if we were
         * killed before prctl took, no death signal would ever come. */
        if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0) {
            exec_errno = errno;
            _exit(127);
        }
        if (getppid() != self) {
            exec_errno = ESRCH;
            _exit(127);
        }
        execv(argv[3], argv + 3);
        exec_errno = errno;
        _exit(127);
    }
    if (bwrap < 0 || exec_errno != 0) {
        report_exec_failure(info_fd, bwrap < 0 ? errno : exec_errno);
        if (bwrap > 0)
            (void)waitpid(bwrap, NULL, 0);
        _exit(127);
    }
    if (sigfd < lifeline)
        close_all_but(sigfd, lifeline);
    else
        close_all_but(lifeline, sigfd);

    int torn_down = 0;
    for (;;) {
        struct pollfd fds[2] = { { sigfd, POLLIN, 0 }, { lifeline, POLLIN, 0 } };
        if (poll(fds, torn_down ? 1 : 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        int teardown = 0;
        if (fds[1].revents)
            teardown = 1; /* EOF (or an error): the launcher is gone */
        if (fds[0].revents & POLLIN) {
            struct signalfd_siginfo info;
            while (read(sigfd, &info, sizeof info) == (ssize_t)sizeof info) {
                if (info.ssi_signo != SIGCHLD)
                    teardown = 1;
                break;
            }
        }
        if (teardown && !torn_down) {
            (void)kill(bwrap, SIGKILL);
            torn_down = 1;
        }
        int status;
        pid_t reaped;
        while ((reaped = waitpid(-1, &status, WNOHANG | __WALL)) > 0) {
            if (reaped == bwrap) {
                sweep();
                exit_like(status);
            }
        }
    }
    (void)kill(bwrap, SIGKILL);
    int status = 0;
    while (waitpid(bwrap, &status, __WALL) < 0 && errno == EINTR)
        ;
    sweep();
    exit_like(status);
}
