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
 * its command, either way holding every fd it inherited, so nobody reading
 * the session's stdout ever sees EOF. The reaper is a child subreaper: any
 * orphan of bwrap becomes its child, and it kills them all once bwrap ends.
 *
 * It tears the session down (SIGKILL to bwrap, then to every child it has
 * left, until it has none) when:
 *   - the lifeline reaches EOF: the launcher holds its write end, so that
 *     happens when the launcher *process* is gone, however it died;
 *   - it gets SIGTERM, SIGINT, SIGHUP or SIGQUIT (Sandbox.kill sends SIGTERM);
 *   - bwrap ends on its own (then normally nothing is left to kill).
 * Then it exits as bwrap did: the same exit code, or the same signal; after a
 * teardown, always as killed by SIGKILL, which is what it did to the session
 * (bwrap may have seen its pid 1 killed first, and exited 137 on its own).
 *
 * If bwrap cannot be executed, it writes {"reaper-errno": N} on INFO_FD
 * (where bwrap would have written its own report) and exits 127.
 *
 * The launcher started it with everything bwrap needs at the right fd
 * numbers; bwrap inherits them all, and the reaper closes its own copies
 * once bwrap runs, so it never holds a session's pipe open. No libc (see
 * freestanding.h): it runs once per launch, and must start fast.
 */
#include "freestanding.h"

#define TEARDOWN_SIGNALS                                                                       \
    (KSIGBIT(SIGTERM) | KSIGBIT(SIGINT) | KSIGBIT(SIGHUP) | KSIGBIT(SIGQUIT))

static void report_exec_failure(int info_fd, long err)
{
    char text[64] = "{\"reaper-errno\": ";
    size_t n = strlen(text);
    n += format_unsigned(text + n, (unsigned long)err);
    text[n++] = '}';
    text[n++] = '\n';
    (void)sys_write_all(info_fd, text, n);
}

/* Start bwrap: a plain fork (this process is small), so the child may use its own stack. */
static long start_bwrap(char **argv, char **envp, const ksigset_t *old_mask, int status_fd)
{
    long parent = SYS0(__NR_getpid);
    long pid = SYS5(__NR_clone, SIGCHLD, 0, 0, 0, 0);
    if (pid != 0)
        return pid;
    (void)sys_sigprocmask(SIG_SETMASK, old_mask, 0);
    /* bwrap dies with us (and we die only after killing what it leaves); if we were
     * killed before prctl took, no death signal would ever come. */
    long err = SYS5(__NR_prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    if (err == 0 && SYS0(__NR_getppid) != parent)
        err = -ESRCH;
    if (err == 0)
        err = SYS3(__NR_execve, argv[0], argv, envp);
    int code = (int)-err;
    (void)sys_write_all(status_fd, &code, sizeof code);
    sys_exit(127);
}

/* SIGKILL every child this process has (bwrap's orphans land here). */
static void kill_children(void)
{
    char path[64] = "/proc/self/task/";
    size_t n = strlen(path);
    n += format_unsigned(path + n, (unsigned long)SYS0(__NR_getpid));
    memcpy(path + n, "/children", sizeof "/children");
    long fd = SYS4(__NR_openat, AT_FDCWD_, path, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0)
        return;
    char buf[4096]; /* "PID PID …": a session leaves a handful of orphans at most */
    long len = 0, got;
    while (len < (long)sizeof buf &&
           (got = sys_read((int)fd, buf + len, sizeof buf - (size_t)len)) > 0)
        len += got;
    (void)SYS1(__NR_close, fd);
    long pid = 0;
    for (long i = 0; i <= len; i++) {
        if (i < len && buf[i] >= '0' && buf[i] <= '9') {
            pid = pid * 10 + (buf[i] - '0');
        } else if (pid > 0) {
            (void)SYS2(__NR_kill, pid, SIGKILL);
            pid = 0;
        }
    }
}

/* Kill and reap every child left, including orphans reparented while doing so. */
static void sweep(void)
{
    for (;;) {
        kill_children();
        int status;
        if (RETRY(SYS4(__NR_wait4, -1, &status, __WALL, 0)) == -ECHILD)
            return;
    }
}

__attribute__((noreturn)) static void exit_like(int status)
{
    if ((status & 0x7f) == 0) /* exited */
        sys_exit((status >> 8) & 0xff);
    int sig = status & 0x7f;
    struct ksigaction dfl = { 0 };
    ksigset_t only = KSIGBIT(sig);
    (void)SYS4(__NR_rt_sigaction, sig, &dfl, 0, sizeof(ksigset_t));
    (void)SYS5(__NR_prctl, PR_SET_DUMPABLE, 0, 0, 0, 0); /* no core for a re-raised SIGSEGV */
    (void)SYS2(__NR_kill, SYS0(__NR_getpid), sig);
    (void)sys_sigprocmask(SIG_UNBLOCK, &only, 0);
    sys_exit(128 + sig);
}

int helper_main(int argc, char **argv, char **envp)
{
    if (argc < 4)
        return 2;
    long lifeline = parse_unsigned(argv[1]);
    long info_fd = parse_unsigned(argv[2]);
    if (lifeline < 0 || info_fd < 0)
        return 2;
    if (SYS5(__NR_prctl, PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) < 0)
        return 2;
    ksigset_t watched = KSIGBIT(SIGCHLD) | TEARDOWN_SIGNALS, old;
    if (sys_sigprocmask(SIG_BLOCK, &watched, &old) < 0)
        return 2;
    long sigfd = SYS4(__NR_signalfd4, -1, &watched, sizeof watched, O_CLOEXEC);
    if (sigfd < 0)
        return 2;
    /* bwrap must not inherit the lifeline (it would keep the launcher "alive"). */
    if (SYS3(__NR_fcntl, lifeline, F_SETFD, FD_CLOEXEC) < 0)
        return 2;

    /* The exec's outcome: EOF on this close-on-exec pipe, or bwrap's errno. */
    int status_pipe[2];
    if (SYS2(__NR_pipe2, status_pipe, O_CLOEXEC) < 0)
        return 2;
    long bwrap = start_bwrap(argv + 3, envp, &old, status_pipe[1]);
    (void)SYS1(__NR_close, status_pipe[1]);
    int exec_errno = 0;
    long got = bwrap < 0 ? 0 : sys_read(status_pipe[0], &exec_errno, sizeof exec_errno);
    if (bwrap < 0 || got == (long)sizeof exec_errno) {
        report_exec_failure((int)info_fd, bwrap < 0 ? -bwrap : exec_errno);
        sweep();
        return 127;
    }
    (void)SYS1(__NR_close, status_pipe[0]);

    /* Keep only the lifeline and the signalfd: a session's pipes must reach EOF. */
    int low = (int)(sigfd < lifeline ? sigfd : lifeline);
    int high = (int)(sigfd < lifeline ? lifeline : sigfd);
    if (low > 0)
        (void)sys_close_range(0, (unsigned int)low - 1, 0);
    if (high > low + 1)
        (void)sys_close_range((unsigned int)low + 1, (unsigned int)high - 1, 0);
    (void)sys_close_range((unsigned int)high + 1, ~0U, 0);

    int torn_down = 0;
    for (;;) {
        struct pollfd fds[2] = { { (int)sigfd, POLLIN, 0 }, { (int)lifeline, POLLIN, 0 } };
        long ready = SYS5(__NR_ppoll, fds, torn_down ? 1 : 2, 0, 0, 0);
        if (ready < 0 && ready != -EINTR)
            break;
        int teardown = !torn_down && ready > 0 && fds[1].revents != 0; /* launcher gone */
        if (ready > 0 && (fds[0].revents & POLLIN)) {
            struct signalfd_siginfo info;
            if (sys_read((int)sigfd, &info, sizeof info) == (long)sizeof info &&
                info.ssi_signo != SIGCHLD)
                teardown = 1;
        }
        if (teardown && !torn_down) {
            (void)SYS2(__NR_kill, bwrap, SIGKILL);
            torn_down = 1;
        }
        int status;
        long reaped;
        while ((reaped = SYS4(__NR_wait4, -1, &status, WNOHANG | __WALL, 0)) > 0) {
            if (reaped == bwrap) {
                sweep();
                exit_like(torn_down ? SIGKILL : status); /* a wait status: killed by SIGKILL */
            }
        }
    }
    (void)SYS2(__NR_kill, bwrap, SIGKILL);
    int status = 0;
    (void)RETRY(SYS4(__NR_wait4, bwrap, &status, __WALL, 0));
    sweep();
    exit_like(status);
}
