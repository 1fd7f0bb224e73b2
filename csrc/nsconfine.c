/* nsconfine's native layer: see nsconfine.h for the contract. */
#include "nsconfine.h"
#include "decimal.h"
#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/asan_interface.h>
#endif

#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <linux/capability.h>
#include <linux/keyctl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/mman.h>
#include <sys/personality.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

/* Same number on every architecture with the generic syscall table. */
#ifndef __NR_close_range
#define __NR_close_range 436
#endif
#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

/* Room for the child's frames and lazy symbol binding (its fd tables are on the heap). */
#define CHILD_STACK_SIZE (64 * 1024)

/* What a failed child writes to the error pipe before _exit(127). */
struct child_report {
    int err;
    int stage;
};

static inline int sys_close_range(unsigned int first, unsigned int last, unsigned int flags)
{
    return (int)syscall(__NR_close_range, first, last, flags);
}

static ssize_t write_all(int fd, const void *buf, size_t len)
{
    size_t done = 0;
    while (done < len) {
        ssize_t n = write(fd, (const char *)buf + done, len - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -1;
        done += (size_t)n;
    }
    return (ssize_t)done;
}

static ssize_t read_retry(int fd, void *buf, size_t len)
{
    ssize_t n;
    do
        n = read(fd, buf, len);
    while (n < 0 && errno == EINTR);
    return n;
}

static int close_retry(int fd)
{
    /* On Linux the fd is gone even when close reports EINTR: never retry. */
    return close(fd) < 0 && errno != EINTR ? -1 : 0;
}

static int dup2_retry(int from, int to)
{
    int r;
    do
        r = dup2(from, to);
    while (r < 0 && errno == EINTR);
    return r;
}

static pid_t waitpid_retry(pid_t pid, int *status)
{
    pid_t r;
    do
        r = waitpid(pid, status, 0);
    while (r < 0 && errno == EINTR);
    return r;
}

/* ------------------------------------------------------------------ spawn */

struct spawn_args {
    const char *path;
    int exec_fd; /* >= 0: execveat this file instead of path */
    char *const *argv;
    char *const *envp;
    int *sources; /* fd to place at each target, -1: keep */
    int *moved;   /* the child's copy of each source, above the target range */
    int n_targets; /* 3 + n_pass_fds */
    unsigned int flags; /* NSC_SPAWN_* */
    uid_t run_uid;
    gid_t run_gid;
    int landlock_fd; /* >= 0: landlock_restrict_self with it */
    int pdeathsig;
    pid_t parent;
    int errpipe_w;
    sigset_t parent_mask;
};

__attribute__((noreturn)) static void child_fail(int errpipe_w, int stage)
{
    struct child_report report = { errno, stage };
    (void)write_all(errpipe_w, &report, sizeof report);
    _exit(127);
}

/*
 * Mark every fd >= first close-on-exec. Marking rather than closing keeps
 * the error pipe (which is above first) open until execve succeeds, and
 * is one syscall on Linux >= 5.11.
 */
static int cloexec_from(int first)
{
    if (sys_close_range((unsigned int)first, ~0U, CLOSE_RANGE_CLOEXEC) == 0)
        return 0;
    /* ENOSYS before 5.9, EINVAL for the CLOEXEC flag before 5.11. */
    if (errno != ENOSYS && errno != EINVAL)
        return -1;
    struct rlimit lim;
    if (getrlimit(RLIMIT_NOFILE, &lim) < 0)
        return -1;
    rlim_t end = lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur > INT_MAX ? INT_MAX : lim.rlim_cur;
    for (rlim_t fd = (rlim_t)first; fd < end; fd++)
        (void)fcntl((int)fd, F_SETFD, FD_CLOEXEC); /* EBADF: not open */
    return 0;
}

/*
 * Change ids with raw syscalls, never glibc's setresuid/setgroups: those
 * broadcast the change to every thread of the process (a signal per thread,
 * through nptl's setxid machinery), and this child runs on the caller's
 * memory and thread descriptor, so glibc would make the *launcher's* threads
 * change ids. A raw syscall changes this task alone, which is the point.
 */
static int become(uid_t uid, gid_t gid, int *stage)
{
    if (syscall(SYS_setgroups, 0, NULL) < 0) {
        *stage = NSC_STAGE_DROP_GROUPS;
        return -1;
    }
    if (syscall(SYS_setresgid, gid, gid, gid) < 0) {
        *stage = NSC_STAGE_SETGID;
        return -1;
    }
    if (syscall(SYS_setresuid, uid, uid, uid) < 0) {
        *stage = NSC_STAGE_SETUID;
        return -1;
    }
    /* Trust, but verify: every id is the one asked for, and no group is left. */
    uid_t r, e, s;
    gid_t rg, eg, sg;
    *stage = NSC_STAGE_CHECK_IDS;
    if (syscall(SYS_getresuid, &r, &e, &s) < 0 || syscall(SYS_getresgid, &rg, &eg, &sg) < 0)
        return -1;
    if (r != uid || e != uid || s != uid || rg != gid || eg != gid || sg != gid ||
        syscall(SYS_getgroups, 0, NULL) != 0) {
        errno = EPERM;
        return -1;
    }
    return 0;
}

/*
 * A session gets no more than a default share of the machine, whatever its
 * launcher has: a real-time or deadline policy becomes SCHED_OTHER (a busy
 * loop at SCHED_RR would take a CPU from every other process), a negative
 * nice becomes 0, the real-time I/O class best-effort, and a negative
 * oom_score_adj 0 (the OOM killer would spare the session and kill others);
 * the limits that would let it take a real-time policy or a negative nice
 * back are 0, and its personality is Linux's own (a launcher's setarch -R
 * would turn off its address randomization; the session's filter refuses to
 * set any other). Each is a step down, which needs no privilege. A
 * launcher's positive nice or oom_score_adj (a broker putting its sessions
 * behind the host) is kept.
 */
static int fair_share(void)
{
    long persona = syscall(SYS_personality, 0xffffffffUL);
    if (persona < 0 || (persona != PER_LINUX && syscall(SYS_personality, PER_LINUX) < 0))
        return -1;
    const struct rlimit none = { 0, 0 };
    if (setrlimit(RLIMIT_RTPRIO, &none) < 0 || setrlimit(RLIMIT_NICE, &none) < 0)
        return -1;
    long policy = syscall(SYS_sched_getscheduler, 0);
    if (policy < 0)
        return -1;
    policy &= ~(long)SCHED_RESET_ON_FORK;
    if (policy != SCHED_OTHER && policy != SCHED_BATCH && policy != SCHED_IDLE) {
        struct sched_param param = { .sched_priority = 0 };
        if (syscall(SYS_sched_setscheduler, 0, SCHED_OTHER, &param) < 0)
            return -1;
    }
    errno = 0;
    int nice = getpriority(PRIO_PROCESS, 0);
    if (nice == -1 && errno != 0)
        return -1;
    if (nice < 0 && syscall(SYS_setpriority, PRIO_PROCESS, 0, 0) < 0)
        return -1;
    enum { IOPRIO_WHO_PROCESS = 1, IOPRIO_CLASS_RT = 1, IOPRIO_CLASS_BE = 2, IOPRIO_SHIFT = 13 };
    long ioprio = syscall(SYS_ioprio_get, IOPRIO_WHO_PROCESS, 0);
    if (ioprio < 0)
        return -1;
    if ((ioprio >> IOPRIO_SHIFT) == IOPRIO_CLASS_RT &&
        syscall(SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0, (IOPRIO_CLASS_BE << IOPRIO_SHIFT) | 4) < 0)
        return -1;
    int fd = open("/proc/self/oom_score_adj", O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return -1;
    char text[16];
    ssize_t got = read_retry(fd, text, sizeof text - 1);
    int failed = got <= 0;
    if (!failed && text[0] == '-')
        failed = write_all(fd, "0", 1) != 1;
    close_retry(fd);
    return failed ? -1 : 0;
}

/* Clear every capability set this task may hold, and check that they are empty. */
static int drop_capabilities(void)
{
    /* EINVAL: a kernel without ambient capabilities (before 4.3) has none to clear. */
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL)
        return -1;
    struct __user_cap_header_struct header = { _LINUX_CAPABILITY_VERSION_3, 0 };
    struct __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3];
    memset(data, 0, sizeof data);
    if (syscall(SYS_capset, &header, data) < 0)
        return -1;
    if (syscall(SYS_capget, &header, data) < 0)
        return -1;
    for (int i = 0; i < _LINUX_CAPABILITY_U32S_3; i++) {
        if (data[i].effective || data[i].permitted || data[i].inheritable) {
            errno = EPERM;
            return -1;
        }
    }
    return 0;
}

/*
 * The session's process tree must not share the launcher's session keyring
 * (a broker's keys would be readable, and keys planted there would outlive
 * the session): join a fresh anonymous one. ENOSYS: no keyrings, nothing to
 * share.
 */
static int join_new_keyring(void)
{
    if (syscall(SYS_keyctl, KEYCTL_JOIN_SESSION_KEYRING, NULL) < 0 && errno != ENOSYS)
        return -1;
    return 0;
}

/*
 * The child of nsc_spawn, between clone and execve.
 *
 * It shares the caller's memory (CLONE_VM) and runs while the calling
 * thread is suspended, but other threads of the caller keep running and
 * may hold any lock, including malloc's. So only async-signal-safe calls
 * happen here: no malloc, no stdio, nothing that takes a lock. errno is
 * the calling thread's (the child runs on its TLS): that is harmless
 * because that thread is suspended and does not read errno after a
 * successful clone. Everything the child changes must be its own: it has
 * its own fd table and signal handler table (no CLONE_FILES and no
 * CLONE_SIGHAND), and writes nothing into the shared memory but its stack.
 */
static int spawn_child(void *opaque)
{
    const struct spawn_args *a = opaque;
    int errpipe_w = a->errpipe_w;

    /*
     * All signals are blocked (the parent did it before clone), so no
     * handler of the caller can run here on the caller's memory. Set every
     * disposition to default before unblocking: a handler would run the
     * parent's code in the child, and an ignored disposition survives
     * execve (Python ignores SIGPIPE, and a payload that inherits that
     * never dies writing to a closed pipe). glibc refuses its own internal
     * signals with EINVAL, and there is nothing else sigaction can fail on,
     * so its result is not checked.
     */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; sig++) {
        if (sig != SIGKILL && sig != SIGSTOP)
            (void)sigaction(sig, &dfl, NULL);
    }
    if (sigprocmask(SIG_SETMASK, &a->parent_mask, NULL) < 0)
        child_fail(errpipe_w, NSC_STAGE_SIGNALS);

    if ((a->flags & NSC_SPAWN_NEW_PGRP) && setpgid(0, 0) < 0)
        child_fail(errpipe_w, NSC_STAGE_SETPGID);
    if ((a->flags & NSC_SPAWN_FAIR_SHARE) && fair_share() < 0)
        child_fail(errpipe_w, NSC_STAGE_FAIR_SHARE);
    int stage;
    if ((a->flags & NSC_SPAWN_SET_IDS) && become(a->run_uid, a->run_gid, &stage) < 0)
        child_fail(errpipe_w, stage);
    if ((a->flags & NSC_SPAWN_DROP_CAPS) && drop_capabilities() < 0)
        child_fail(errpipe_w, NSC_STAGE_CAPS);
    if ((a->flags & NSC_SPAWN_NO_NEW_PRIVS) && prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        child_fail(errpipe_w, NSC_STAGE_NO_NEW_PRIVS);
    if ((a->flags & NSC_SPAWN_NEW_KEYRING) && join_new_keyring() < 0)
        child_fail(errpipe_w, NSC_STAGE_KEYRING);
    if (a->landlock_fd >= 0 && syscall(NSC_LANDLOCK_RESTRICT_SELF, a->landlock_fd, 0) < 0)
        child_fail(errpipe_w, NSC_STAGE_LANDLOCK);

    /*
     * After the ids changed (which clears the parent-death signal). The
     * parent may have been killed before prctl took effect: then we were
     * reparented, getppid() no longer names it, and no death signal will
     * ever come. (PDEATHSIG fires when the parent *thread* exits.)
     */
    if (a->pdeathsig > 0) {
        if (prctl(PR_SET_PDEATHSIG, a->pdeathsig) < 0)
            child_fail(errpipe_w, NSC_STAGE_PDEATHSIG);
        if (getppid() != a->parent) {
            errno = ESRCH;
            child_fail(errpipe_w, NSC_STAGE_PARENT_DIED);
        }
    }

    /*
     * Place each source at its target without one dup2 clobbering a source
     * still to be moved (pass_fds = [4, 3] swaps them; stdout_fd = 0 moves
     * stdin's own fd). First every source, and the error pipe, leave the
     * target range 0..n_targets-1 as fresh copies above it; only then is
     * each copy dup2'd into place. That also handles a source already at
     * its own target: dup2(fd, fd) would leave FD_CLOEXEC set on it,
     * dup2(copy, fd) clears it.
     */
    int first = a->n_targets;
    int *moved = a->moved;
    if (errpipe_w < first) {
        errpipe_w = fcntl(errpipe_w, F_DUPFD_CLOEXEC, first);
        if (errpipe_w < 0)
            child_fail(a->errpipe_w, NSC_STAGE_DUP);
    }
    int exec_fd = a->exec_fd;
    if (exec_fd >= 0 && exec_fd < first) { /* its number may be a target: move it up too */
        exec_fd = fcntl(exec_fd, F_DUPFD_CLOEXEC, first);
        if (exec_fd < 0)
            child_fail(errpipe_w, NSC_STAGE_DUP);
    }
    for (int t = 0; t < a->n_targets; t++) {
        if (a->sources[t] < 0)
            continue;
        moved[t] = fcntl(a->sources[t], F_DUPFD_CLOEXEC, first);
        if (moved[t] < 0)
            child_fail(errpipe_w, NSC_STAGE_DUP);
    }
    for (int t = 0; t < a->n_targets; t++) {
        if (a->sources[t] >= 0 && dup2_retry(moved[t], t) < 0)
            child_fail(errpipe_w, NSC_STAGE_DUP);
    }

    /*
     * Now 0..first-1 hold exactly what the caller asked for; everything
     * above (the copies, the error pipe and any fd the launcher left
     * inheritable) closes at execve.
     */
    if (cloexec_from(first) < 0)
        child_fail(errpipe_w, NSC_STAGE_CLOSE);

    if (exec_fd >= 0)
        syscall(SYS_execveat, exec_fd, "", a->argv, a->envp, AT_EMPTY_PATH);
    else
        execve(a->path, a->argv, a->envp);
    child_fail(errpipe_w, NSC_STAGE_EXEC);
}

static int spawn_with(int *buffers, const char *path, int exec_fd, char *const argv[],
                      char *const envp[],
                      int stdin_fd, int stdout_fd, int stderr_fd,
                      const int pass_fds[], int n_pass_fds,
                      unsigned int flags, unsigned int run_uid, unsigned int run_gid,
                      int landlock_fd, int pdeathsig, int *pid_out, int *stage_out)
{
    struct spawn_args a = {
        .path = path, .exec_fd = exec_fd, .argv = argv, .envp = envp,
        .n_targets = 3 + n_pass_fds, .flags = flags,
        .run_uid = (uid_t)run_uid, .run_gid = (gid_t)run_gid, .landlock_fd = landlock_fd,
        .pdeathsig = pdeathsig, .parent = getpid(),
    };
    a.sources = buffers;
    a.moved = buffers + a.n_targets;
    a.sources[0] = stdin_fd;
    a.sources[1] = stdout_fd;
    a.sources[2] = stderr_fd;
    for (int i = 0; i < n_pass_fds; i++)
        a.sources[3 + i] = pass_fds[i];

    int errpipe[2];
    if (pipe2(errpipe, O_CLOEXEC | O_NONBLOCK) < 0) {
        *stage_out = NSC_STAGE_PIPE;
        return errno;
    }
    a.errpipe_w = errpipe[1];

    /*
     * A source fd that was closed when we were called may now be the
     * error pipe. Passing that on would let the payload hold the pipe open
     * past exec, and this function would wait for the payload to exit.
     */
    for (int t = 0; t < a.n_targets; t++) {
        if (a.sources[t] == errpipe[0] || a.sources[t] == errpipe[1]) {
            (void)close_retry(errpipe[0]);
            (void)close_retry(errpipe[1]);
            *stage_out = NSC_STAGE_DUP;
            return EBADF;
        }
    }

    /*
     * Why clone(CLONE_VM | CLONE_VFORK) rather than fork: fork copies the
     * page tables of the whole (large) Python process on every spawn, while
     * a CLONE_VM child shares them and costs about the same however big the
     * caller is. Why clone rather than vfork: the child runs spawn_child on
     * a stack of its own, so it cannot overwrite this function's frame or
     * saved registers the way a vfork child returning through shared stack
     * frames can, and the compiler needs no returns_twice reasoning.
     *
     * The child's stack can live in this frame: CLONE_VFORK suspends this
     * thread until the child has exec'd or exited, so the frame outlives
     * every use of the stack, and nothing else touches it meanwhile (other
     * threads have stacks of their own). Stacks grow down on every
     * architecture we build for, so the child starts at the top.
     *
     * Blocking every signal around clone keeps the caller's handlers (here
     * CPython's, which write to its wakeup fd and set flags in shared
     * memory) from running in the child before it has reset them.
     */
    _Alignas(16) char stack[CHILD_STACK_SIZE];
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &a.parent_mask);
    pid_t pid = clone(spawn_child, stack + sizeof stack, CLONE_VM | CLONE_VFORK | SIGCHLD, &a);
    int clone_err = errno;
#ifdef __SANITIZE_ADDRESS__
    /* The child's frames poisoned this array's shadow (the memory is shared): clear it, or
     * AddressSanitizer reports this frame's later neighbours (the CI's sanitizer build). */
    __asan_unpoison_memory_region(stack, sizeof stack);
#endif
    pthread_sigmask(SIG_SETMASK, &a.parent_mask, NULL);
    (void)close_retry(errpipe[1]);
    if (pid < 0) {
        (void)close_retry(errpipe[0]);
        *stage_out = NSC_STAGE_CLONE;
        return clone_err;
    }

    /*
     * CLONE_VFORK resumed this thread only once the child had passed
     * execve's point of no return (it can no longer report anything) or had
     * written its report and exited: so the pipe is read now, without
     * waiting for its end. Waiting for EOF would also wait for any process
     * forked by another thread meanwhile (a multiprocessing worker), which
     * inherited the write end and holds it as long as it lives. A report is
     * smaller than PIPE_BUF, so it arrives whole in one read; nothing there
     * (EAGAIN), or EOF, is an exec that succeeded.
     */
    struct child_report report;
    ssize_t n = read_retry(errpipe[0], &report, sizeof report);
    int read_err = errno;
    (void)close_retry(errpipe[0]);
    if (n == 0 || (n < 0 && read_err == EAGAIN)) {
        *pid_out = pid;
        return 0;
    }
    int status;
    (void)waitpid_retry(pid, &status); /* ECHILD if SIGCHLD is ignored: nothing to reap */
    if (n != (ssize_t)sizeof report) {
        *stage_out = NSC_STAGE_PIPE;
        return n < 0 ? read_err : EIO;
    }
    *stage_out = report.stage;
    return report.err;
}

int nsc_spawn(const char *path, int exec_fd, char *const argv[], char *const envp[],
              int stdin_fd, int stdout_fd, int stderr_fd,
              const int pass_fds[], int n_pass_fds,
              unsigned int flags, unsigned int run_uid, unsigned int run_gid,
              int landlock_fd, int pdeathsig, int *pid_out, int *stage_out)
{
    *pid_out = -1;
    *stage_out = NSC_STAGE_NONE;
    if (n_pass_fds < 0 || n_pass_fds > NSC_MAX_PASS_FDS)
        return EINVAL;
    /* The fd tables live here, allocated before clone: the child shares this memory and must
     * not call malloc, and a thousand fds would not fit its small stack. */
    int *buffers = malloc(2 * (size_t)(3 + n_pass_fds) * sizeof(int));
    if (buffers == NULL) {
        *stage_out = NSC_STAGE_CLONE;
        return ENOMEM;
    }
    int err = spawn_with(buffers, path, exec_fd, argv, envp, stdin_fd, stdout_fd, stderr_fd,
                         pass_fds, n_pass_fds, flags, run_uid, run_gid, landlock_fd, pdeathsig,
                         pid_out, stage_out);
    free(buffers);
    return err;
}

/* ------------------------------------------------------------------ memfd */

int nsc_memfd_sealed(const char *name, const char *data, size_t len,
                     int *fd_out, int *stage_out)
{
    *fd_out = -1;
    *stage_out = NSC_STAGE_NONE;
    int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        *stage_out = NSC_STAGE_MEMFD;
        return errno;
    }
    int stage = NSC_STAGE_NONE;
    if (write_all(fd, data, len) < 0)
        stage = NSC_STAGE_WRITE;
    else if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) < 0)
        stage = NSC_STAGE_SEAL;
    else if (lseek(fd, 0, SEEK_SET) < 0) /* bwrap's --args reads from the offset */
        stage = NSC_STAGE_SEEK;
    if (stage != NSC_STAGE_NONE) {
        int err = errno;
        (void)close_retry(fd);
        *stage_out = stage;
        return err;
    }
    *fd_out = fd;
    return 0;
}

/* ------------------------------------------------------------ user namespace */

/* "0 <id> 1\n" into buf, without snprintf (not async-signal-safe). */
static size_t format_id_map(char *buf, unsigned long id)
{
    size_t n = 0;
    buf[n++] = '0';
    buf[n++] = ' ';
    n += format_unsigned(buf + n, id);
    memcpy(buf + n, " 1\n", 3);
    return n + 3;
}

static int write_file(const char *path, const char *data, size_t len)
{
    int fd;
    do
        fd = open(path, O_WRONLY | O_CLOEXEC);
    while (fd < 0 && errno == EINTR);
    if (fd < 0)
        return -1;
    if (write_all(fd, data, len) < 0) {
        int err = errno;
        (void)close_retry(fd);
        errno = err;
        return -1;
    }
    return close_retry(fd);
}

/* The probe's child: only async-signal-safe calls, as after any fork. */
__attribute__((noreturn)) static void probe_child(int errpipe_w, uid_t euid, gid_t egid)
{
    char map[64];
    if (unshare(CLONE_NEWUSER) < 0)
        child_fail(errpipe_w, NSC_STAGE_UNSHARE);
    if (write_file("/proc/self/setgroups", "deny", 4) < 0)
        child_fail(errpipe_w, NSC_STAGE_SETGROUPS);
    if (write_file("/proc/self/uid_map", map, format_id_map(map, euid)) < 0)
        child_fail(errpipe_w, NSC_STAGE_UID_MAP);
    if (write_file("/proc/self/gid_map", map, format_id_map(map, egid)) < 0)
        child_fail(errpipe_w, NSC_STAGE_GID_MAP);
    _exit(0);
}

int nsc_probe_userns(int *stage_out)
{
    *stage_out = NSC_STAGE_NONE;
    uid_t euid = geteuid(); /* after unshare the child's own read as the overflow id */
    gid_t egid = getegid();
    int errpipe[2];
    if (pipe2(errpipe, O_CLOEXEC) < 0) {
        *stage_out = NSC_STAGE_PIPE;
        return errno;
    }

    /*
     * A plain fork: the probe is off the hot path, and a child with its
     * own copy of memory needs none of nsc_spawn's care. (A CLONE_VM child
     * could unshare a user namespace too; only a process with other threads
     * in its thread group gets EINVAL.) Signals stay blocked in the child,
     * so the caller's handlers never run there and write to its wakeup fd.
     */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pid_t pid = fork();
    if (pid == 0)
        probe_child(errpipe[1], euid, egid);
    int fork_err = errno;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    (void)close_retry(errpipe[1]);
    if (pid < 0) {
        (void)close_retry(errpipe[0]);
        *stage_out = NSC_STAGE_CLONE;
        return fork_err;
    }

    struct child_report report;
    ssize_t n = read_retry(errpipe[0], &report, sizeof report);
    int read_err = errno;
    (void)close_retry(errpipe[0]);
    int status = 0;
    pid_t reaped = waitpid_retry(pid, &status);
    int wait_err = errno;
    if (n == (ssize_t)sizeof report) {
        *stage_out = report.stage;
        return report.err;
    }
    if (n < 0) {
        *stage_out = NSC_STAGE_PIPE;
        return read_err;
    }
    if (reaped < 0) {
        *stage_out = NSC_STAGE_WAIT;
        return wait_err;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        *stage_out = NSC_STAGE_WAIT; /* killed before it could report */
        return EIO;
    }
    return 0;
}


int nsc_realpath(const char *path, char *out)
{
    _Static_assert(NSC_PATH_MAX >= PATH_MAX, "realpath(3) writes up to PATH_MAX bytes");
    return realpath(path, out) == NULL ? errno : 0;
}


/* ------------------------------------------------------------ other names of denied files */

struct linked_walk {
    long *budget;
    struct nsc_linked *found;
    size_t max_found, count;
    char *names;
    size_t names_size, names_used;
    char path[NSC_PATH_MAX]; /* the directory being read, relative to the top, and a '/' */
};

/* Keep path/name of a file with several names; ENOBUFS when the caller's room is full. */
static int keep_linked(struct linked_walk *w, size_t path_len, const char *name,
                       const struct stat *info)
{
    size_t name_len = strlen(name);
    if (w->count == w->max_found || w->names_used + path_len + name_len + 1 > w->names_size)
        return ENOBUFS;
    struct nsc_linked *kept = &w->found[w->count++];
    kept->dev = info->st_dev;
    kept->ino = info->st_ino;
    kept->name = w->names_used;
    memcpy(w->names + w->names_used, w->path, path_len);
    memcpy(w->names + w->names_used + path_len, name, name_len + 1);
    w->names_used += path_len + name_len + 1;
    return 0;
}

/* The entries of the open directory dir (closed here), whose path relative to the top is
 * w->path[0..path_len), depth levels down. Entries are read in getdents order, each
 * directory's own walked where it is met, as os.scandir and a recursion in that order would. */
static int walk_linked(struct linked_walk *w, int dir, size_t path_len, int depth)
{
    DIR *listing = fdopendir(dir);
    if (!listing) {
        (void)close_retry(dir);
        return 0;
    }
    int err = 0;
    struct dirent *entry;
    while (!err && *w->budget > 0 && (entry = readdir(listing)) != NULL) {
        const char *name = entry->d_name;
        if (name[0] == '.' && (name[1] == '\0' || (name[1] == '.' && name[2] == '\0')))
            continue;
        if (--*w->budget <= 0) {
            *w->budget = 0;
            break;
        }
        unsigned char type = entry->d_type;
        struct stat info;
        if (type == DT_UNKNOWN) {
            if (fstatat(dirfd(listing), name, &info, AT_SYMLINK_NOFOLLOW) < 0)
                continue;
            type = S_ISREG(info.st_mode) ? DT_REG : S_ISDIR(info.st_mode) ? DT_DIR : DT_LNK;
        } else if (type == DT_REG && fstatat(dirfd(listing), name, &info, AT_SYMLINK_NOFOLLOW) < 0) {
            continue;
        }
        if (type == DT_REG && S_ISREG(info.st_mode) && info.st_nlink > 1) {
            err = keep_linked(w, path_len, name, &info);
        } else if (type == DT_DIR && depth > 1) {
            size_t name_len = strlen(name);
            if (path_len + name_len + 2 > sizeof w->path)
                continue;
            int below = openat(dirfd(listing), name,
                               O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (below < 0)
                continue;
            memcpy(w->path + path_len, name, name_len);
            w->path[path_len + name_len] = '/';
            err = walk_linked(w, below, path_len + name_len + 1, depth - 1);
        }
    }
    (void)closedir(listing);
    return err;
}

int nsc_linked_files(const char *dir, int depth, long *budget, struct nsc_linked *found,
                     size_t max_found, char *names, size_t names_size, size_t *found_out)
{
    *found_out = 0;
    int top = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (top < 0)
        return errno;
    struct linked_walk *w = malloc(sizeof *w);
    if (!w) {
        (void)close_retry(top);
        return ENOMEM;
    }
    w->budget = budget;
    w->found = found;
    w->max_found = max_found;
    w->count = 0;
    w->names = names;
    w->names_size = names_size;
    w->names_used = 0;
    int err = walk_linked(w, top, 0, depth);
    *found_out = w->count;
    free(w);
    return err;
}


/* ------------------------------------------------------------ opening without symlinks */

#ifndef __NR_openat2
#define __NR_openat2 437
#endif

static int open_by_walk(const char *path, int *fd_out)
{
    int dir = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0)
        return errno;
    char component[NAME_MAX + 1];
    const char *p = path;
    while (*p) {
        while (*p == '/')
            p++;
        if (!*p)
            break;
        size_t len = strcspn(p, "/");
        if (len > NAME_MAX) {
            (void)close_retry(dir);
            return ENAMETOOLONG;
        }
        memcpy(component, p, len);
        component[len] = '\0';
        p += len;
        if (strcmp(component, "..") == 0 || strcmp(component, ".") == 0) {
            (void)close_retry(dir);
            return EINVAL; /* the lint hands over resolved paths only */
        }
        int next = openat(dir, component, O_PATH | O_NOFOLLOW | O_CLOEXEC);
        int err = errno;
        (void)close_retry(dir);
        if (next < 0)
            return err;
        struct stat info;
        if (fstat(next, &info) < 0 || S_ISLNK(info.st_mode)) {
            (void)close_retry(next);
            return ELOOP;
        }
        dir = next;
    }
    *fd_out = dir;
    return 0;
}

int nsc_open_path(const char *path, int force_walk, int *fd_out, int *stage_out)
{
    *fd_out = -1;
    *stage_out = NSC_STAGE_NONE;
    if (path[0] != '/') {
        *stage_out = NSC_STAGE_OPEN;
        return EINVAL;
    }
    if (!force_walk) {
        struct open_how how;
        memset(&how, 0, sizeof how);
        how.flags = O_PATH | O_CLOEXEC;
        how.resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
        long fd;
        do
            fd = syscall(__NR_openat2, AT_FDCWD, path, &how, sizeof how);
        while (fd < 0 && errno == EINTR);
        if (fd >= 0) {
            *fd_out = (int)fd;
            return 0;
        }
        if (errno != ENOSYS && errno != EPERM) { /* EPERM: a seccomp filter refusing it */
            *stage_out = NSC_STAGE_OPEN;
            return errno;
        }
    }
    int err = open_by_walk(path, fd_out);
    if (err)
        *stage_out = NSC_STAGE_OPEN;
    return err;
}


/* ------------------------------------------------------------ landlock */


/* The ABI 6 layout of struct landlock_ruleset_attr (older headers lack `scoped`). */
struct ruleset_attr_v6 {
    unsigned long long handled_access_fs;
    unsigned long long handled_access_net;
    unsigned long long scoped;
};

int nsc_child_statuses_discarded(void)
{
    struct sigaction current;
    if (sigaction(SIGCHLD, NULL, &current) != 0)
        return 0;
    return (!(current.sa_flags & SA_SIGINFO) && current.sa_handler == SIG_IGN) ||
           (current.sa_flags & SA_NOCLDWAIT) != 0;
}

long nsc_first_changed(const char *paths, size_t count, const struct nsc_identity *expected,
                       int same_file)
{
    for (size_t i = 0; i < count; i++) {
        struct stat info;
        const struct nsc_identity *was = &expected[i];
        int present = (same_file ? stat(paths, &info) : lstat(paths, &info)) == 0;
        if (present != (was->present != 0))
            return (long)i;
        if (present &&
            ((unsigned long long)info.st_dev != was->dev ||
             (unsigned long long)info.st_ino != was->ino ||
             (!same_file && ((long long)info.st_mtim.tv_sec != was->mtime_sec ||
                             (long long)info.st_mtim.tv_nsec != was->mtime_nsec ||
                             (long long)info.st_ctim.tv_sec != was->ctime_sec ||
                             (long long)info.st_ctim.tv_nsec != was->ctime_nsec))))
            return (long)i;
        paths += strlen(paths) + 1;
    }
    return -1;
}

int nsc_landlock_abi(void)
{
    long abi = syscall(NSC_LANDLOCK_CREATE_RULESET, NULL, 0, NSC_LANDLOCK_CREATE_RULESET_VERSION);
    return abi < 0 ? 0 : (int)abi;
}

int nsc_landlock_scopes(int *fd_out, int *stage_out)
{
    *fd_out = -1;
    *stage_out = NSC_STAGE_NONE;
    if (nsc_landlock_abi() < 6) {
        *stage_out = NSC_STAGE_LANDLOCK;
        return EOPNOTSUPP;
    }
    struct ruleset_attr_v6 attr = {
        .scoped = NSC_LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET | NSC_LANDLOCK_SCOPE_SIGNAL,
    };
    long fd = syscall(NSC_LANDLOCK_CREATE_RULESET, &attr, sizeof attr, 0);
    if (fd < 0) {
        *stage_out = NSC_STAGE_LANDLOCK;
        return errno;
    }
    (void)fcntl((int)fd, F_SETFD, FD_CLOEXEC);
    *fd_out = (int)fd;
    return 0;
}
