/*
 * nsconfine's reaper: the launcher's child, which runs bwrap and makes sure
 * nothing of the session outlives either of them.
 *
 *     _reaper LIFELINE_FD INFO_FD LIMITS HOLDS_FD BWRAP [ARG...]
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
 *   - the launcher itself ends (a pidfd of the parent): a fork of it that
 *     ran none of Python's at-fork handlers (C code's) holds a copy of the
 *     lifeline's write end, which would then outlive the launcher;
 *   - it gets SIGTERM, SIGINT, SIGHUP or SIGQUIT (Sandbox.kill sends SIGTERM);
 *   - bwrap ends on its own (then normally nothing is left to kill).
 * Once they are all gone it closes a unix socket of its own, which runs the kernel's
 * unix garbage collector (see collect_sockets_in_flight).
 * Then it exits as bwrap did: the same exit code, or the same signal; after a
 * teardown, always as killed by SIGKILL, which is what it did to the session
 * (bwrap may have seen its pid 1 killed first, and exited 137 on its own).
 *
 * If bwrap cannot be executed, it writes {"reaper-errno": N} on INFO_FD
 * (where bwrap would have written its own report) and exits 127.
 *
 * LIMITS is "-", or PROCESSES,PTYS,INOTIFY_INSTANCES,INOTIFY_WATCHES,SHM_PAGES
 * followed by a ",KIB:FILES" for each writable tmpfs of the session (its size and number
 * of files; see mount_tmpfs_shares): the session's share (nsconfine/_plan/limits.py),
 * which the reaper takes before it starts bwrap (take_limits below); if a step fails it writes
 * {"reaper-errno": N, "reaper-stage": S} (S: an NSC_STAGE_*) and exits 127.
 *
 * HOLDS_FD is "-", or the first of the fds (up to the last the reaper was
 * given) that hold the session's mount points in its workspace: each a
 * shared lock on a stub the sandbox binds over, which no launcher removes
 * while it is held. The reaper keeps them for as long as it lives (the
 * session's life) and never lets bwrap have them; the launcher then holds
 * none of them (a live session costs it a few fds, whatever its plan).
 *
 * The launcher started it with everything bwrap needs at the right fd
 * numbers; bwrap inherits them all, and the reaper closes its own copies
 * once bwrap runs, so it never holds a session's pipe open. No libc (see
 * freestanding.h): it runs once per launch, and must start fast.
 */
#include "freestanding.h"
#include "nsconfine.h" /* the stages it reports */

#include <linux/capability.h>
#include <linux/mount.h>
#include <linux/sched.h>

#define RLIMIT_CORE_ 4  /* the same on x86_64 and aarch64 */
#define RLIMIT_NPROC_ 6 /* the same on x86_64 and aarch64 */

#define TEARDOWN_SIGNALS                                                                       \
    (KSIGBIT(SIGTERM) | KSIGBIT(SIGINT) | KSIGBIT(SIGHUP) | KSIGBIT(SIGQUIT))

/* {"reaper-errno": err} on the info fd, with "reaper-stage" when stage > 0. */
static void report_failure(int info_fd, long err, int stage)
{
    char text[96] = "{\"reaper-errno\": ";
    size_t n = strlen(text);
    n += format_unsigned(text + n, (unsigned long)err);
    if (stage > 0) {
        memcpy(text + n, ", \"reaper-stage\": ", 18);
        n += 18;
        n += format_unsigned(text + n, (unsigned long)stage);
    }
    text[n++] = '}';
    text[n++] = '\n';
    (void)sys_write_all(info_fd, text, n);
}

#define LIMIT_COUNT 5

/* KIB:FILES[,KIB:FILES...], each a run of 1 to 20 digits, or nothing: 0, or -1 if not. */
static int check_tmpfs_specs(const char *specs)
{
    if (!*specs)
        return 0;
    int digits = 0, colon = 0;
    for (const char *c = specs;; c++) {
        if (*c >= '0' && *c <= '9') {
            if (++digits > 20)
                return -1;
        } else if (digits > 0 && *c == ':' && !colon) {
            colon = 1;
            digits = 0;
        } else if (digits > 0 && colon && (*c == ',' || *c == '\0')) {
            if (*c == '\0')
                return 0;
            colon = 0;
            digits = 0;
        } else {
            return -1;
        }
    }
}

/* PROCESSES,PTYS,INOTIFY_INSTANCES,INOTIFY_WATCHES,SHM_PAGES[,KIB:FILES...] into limits and
 * *tmpfs_specs (the rest, "" if none); 0, or -1 if malformed. */
static int parse_limits(char *text, long limits[LIMIT_COUNT], const char **tmpfs_specs)
{
    for (int i = 0; i < LIMIT_COUNT; i++) {
        char *end = text;
        while (*end && *end != ',')
            end++;
        if (i < LIMIT_COUNT - 1 && *end != ',')
            return -1;
        *tmpfs_specs = *end ? end + 1 : end;
        *end = '\0';
        limits[i] = parse_unsigned(text);
        if (limits[i] < 0)
            return -1;
        text = end + 1;
    }
    return check_tmpfs_specs(*tmpfs_specs);
}

static long write_text(const char *path, const char *text, size_t len)
{
    long fd = RETRY(SYS4(__NR_openat, AT_FDCWD_, path, O_WRONLY | O_CLOEXEC, 0));
    if (fd < 0)
        return fd;
    long r = sys_write_all((int)fd, text, len);
    (void)SYS1(__NR_close, fd);
    return r < 0 ? r : 0;
}

/* "<inside> <outside> 1\n": one id mapped. */
static long map_one(const char *path, unsigned long inside, unsigned long outside)
{
    char map[64];
    size_t n = format_unsigned(map, inside);
    map[n++] = ' ';
    n += format_unsigned(map + n, outside);
    memcpy(map + n, " 1\n", 3);
    return write_text(path, map, n + 3);
}

static long write_number(const char *path, unsigned long value)
{
    char text[24];
    return write_text(path, text, format_unsigned(text, value));
}

/* System V semaphores and message queues in the session's IPC namespace: the kernel's limits
 * before 3.19 raised them (nsconfine/_plan/limits.py's SYSV_*, which the manifest states). A
 * semaphore costs ~64 bytes, and a queue up to 16 KiB (msgmnb) of messages or 16,384 empty
 * ones (~1 MiB), of memory no process is charged for; at the kernel's defaults (32,000 sets
 * of 32,000 semaphores; 32,000 queues) a session could take 64 GiB. */
#define SEMAPHORE_LIMITS "250 32000 32 128" /* SEMMSL SEMMNS SEMOPM SEMMNI */
#define MESSAGE_QUEUES 32

/*
 * The session's IPC namespace, with System V limits: its shared memory in all at most
 * SHM_PAGES (shmall; no one segment can be larger), its semaphores and queues as above.
 *
 * The kernel lets only the uid that is 0 in the IPC namespace's user namespace write these
 * sysctls, so that user namespace maps 0 to our uid; the session's own (take_limits) is made
 * inside it and maps our uid back onto that 0, so that bwrap still runs under the ids it
 * would have. bwrap makes no IPC namespace of its own (the launcher leaves out its
 * --unshare-ipc). The session's processes run as that same uid and could therefore write
 * these sysctls too, through a writable /proc/sys: bwrap's is read-only (a mount locked by its
 * user namespace). With no capability, a session cannot make another IPC namespace, with the
 * kernel's defaults; one allowed user namespaces of its own can (as it can mount a tmpfs).
 */
static long take_ipc_limits(unsigned long uid, unsigned long gid, const long limits[LIMIT_COUNT],
                            int *stage)
{
    long r;
    *stage = NSC_STAGE_IPC_NS;
    if ((r = SYS1(__NR_unshare, CLONE_NEWUSER)) < 0 ||
        (r = write_text("/proc/self/setgroups", "deny", 4)) < 0 ||
        (r = map_one("/proc/self/uid_map", 0, uid)) < 0 ||
        (r = map_one("/proc/self/gid_map", 0, gid)) < 0 ||
        (r = SYS1(__NR_unshare, CLONE_NEWIPC)) < 0)
        return r;
    *stage = NSC_STAGE_IPC_LIMITS;
    if ((r = write_number("/proc/sys/kernel/shmall", (unsigned long)limits[4])) < 0 ||
        (r = write_text("/proc/sys/kernel/sem", SEMAPHORE_LIMITS, strlen(SEMAPHORE_LIMITS))) < 0)
        return r;
    return write_number("/proc/sys/kernel/msgmni", MESSAGE_QUEUES);
}

/*
 * The session's writable tmpfs (/tmp, /dev/shm, a fresh HOME), one for each KIB:FILES of specs:
 * bwrap's --tmpfs takes a size but no number of files, and a tmpfs of the kernel's default
 * number (half the host's pages) lets a session hold gigabytes of the host's memory in empty
 * files (~1 KiB each, charged to no process). So they are mounted here, each at
 * /dev/shm/<i> on a tmpfs of our own mounted over /dev/shm in this mount namespace (whose
 * mounts do not reach the host's), and bwrap binds them from there. /dev/shm is where every
 * Linux host has a directory no bind of a plan's comes from (the lint refuses /dev).
 */
static long mount_tmpfs_shares(const char *specs, int *stage)
{
    if (!*specs)
        return 0;
    *stage = NSC_STAGE_TMPFS;
    long r = SYS5(__NR_mount, "tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                  "size=4k,mode=0700");
    if (r < 0)
        return r;
    char path[40] = "/dev/shm/";
    size_t base = strlen(path);
    for (unsigned long index = 0; *specs; index++) {
        char options[96] = "size="; /* size=<KIB>k,nr_inodes=<FILES>,mode=0755 */
        size_t n = strlen(options);
        while (*specs != ':')
            options[n++] = *specs++;
        memcpy(options + n, "k,nr_inodes=", 12);
        n += 12;
        for (specs++; *specs && *specs != ','; specs++)
            options[n++] = *specs;
        memcpy(options + n, ",mode=0755", sizeof ",mode=0755");
        if (*specs == ',')
            specs++;
        path[base + format_unsigned(path + base, index)] = '\0';
        if ((r = SYS3(__NR_mkdirat, AT_FDCWD_, path, 0700)) < 0 ||
            (r = SYS5(__NR_mount, "tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, options)) < 0)
            return r;
    }
    return 0;
}

/*
 * The session's share: a user and a mount namespace of its own, which bwrap starts in and
 * its namespaces nest in, inside the user namespace that holds its IPC namespace
 * (take_ipc_limits); our ids mapped back to themselves, so that bwrap runs as it would have.
 * Here and not in the launcher's child: that child shares the launcher's memory, and, once a
 * root launcher has given it the session's ids, the kernel no longer lets it be dumped, so
 * its /proc/self files are root's and it could not write its maps; a namespace made before
 * the ids changed would charge root's counts. The reaper is its own exec'd process.
 *
 * The kernel counts an account's processes and inotify instances and watches per user
 * namespace, at every level up to the host's, and checks each level against a limit
 * (kernel/ucount.c): the inotify ones against each namespace's own sysctls, written here;
 * processes against RLIMIT_NPROC below this namespace, and at this namespace's own level
 * against the RLIMIT_NPROC its creator had when it made it. So RLIMIT_NPROC is lowered
 * *after* the unshare, where it caps this session alone and the account's count on the host
 * stays under the launcher's limit; lowered before, it would cap the account's whole count,
 * every other session and the launcher among them. Soft and hard alike, never raised.
 *
 * The ptys: a devpts with max=, mounted over /dev/pts in this mount namespace (whose mounts
 * do not reach the host's: the kernel made its copies of the host's mounts slaves), which
 * bwrap binds from there; its ptys still count against the host's kernel.pty.max.
 *
 * Those copies are then made private: as slaves, they took in every mount the host made
 * later (an automounter's, a disk plugged in), and so did bwrap's copies of them in the
 * sandbox, as the host made it: writable below a read-only bind, without nosuid or nodev, in
 * no plan and past the launch's check of the table. Private, the sandbox keeps what was
 * checked.
 *
 * The capabilities the unshare gave (in the new namespace only) are dropped at the end:
 * bwrap would lose them at its exec anyway; the reaper keeps none for its lifetime.
 */
static long take_limits(const long limits[LIMIT_COUNT], const char *tmpfs_specs, int *stage)
{
    unsigned long uid = (unsigned long)SYS0(__NR_geteuid); /* 0 after take_ipc_limits */
    unsigned long gid = (unsigned long)SYS0(__NR_getegid);
    long r = take_ipc_limits(uid, gid, limits, stage);
    if (r < 0)
        return r;
    *stage = NSC_STAGE_SESSION_NS;
    if ((r = SYS1(__NR_unshare, CLONE_NEWUSER | CLONE_NEWNS)) < 0)
        return r;
    *stage = NSC_STAGE_SETGROUPS;
    if ((r = write_text("/proc/self/setgroups", "deny", 4)) < 0)
        return r;
    *stage = NSC_STAGE_UID_MAP;
    if ((r = map_one("/proc/self/uid_map", uid, 0)) < 0)
        return r;
    *stage = NSC_STAGE_GID_MAP;
    if ((r = map_one("/proc/self/gid_map", gid, 0)) < 0)
        return r;
    *stage = NSC_STAGE_PRIVATE;
    if ((r = SYS5(__NR_mount, 0, "/", 0, MS_REC | MS_PRIVATE, 0)) < 0)
        return r;
    if (limits[1] > 0) {
        char options[96] = "newinstance,ptmxmode=0666,mode=620,max=";
        size_t n = strlen(options);
        options[n + format_unsigned(options + n, (unsigned long)limits[1])] = '\0';
        *stage = NSC_STAGE_DEVPTS;
        r = SYS5(__NR_mount, "devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, options);
        if (r < 0)
            return r;
    }
    if ((r = mount_tmpfs_shares(tmpfs_specs, stage)) < 0)
        return r;
    *stage = NSC_STAGE_INOTIFY;
    if ((r = write_number("/proc/sys/user/max_inotify_instances", (unsigned long)limits[2])) < 0 ||
        (r = write_number("/proc/sys/user/max_inotify_watches", (unsigned long)limits[3])) < 0)
        return r;
    uint64_t nproc[2]; /* struct rlimit64: soft, hard */
    *stage = NSC_STAGE_NPROC;
    if ((r = SYS4(__NR_prlimit64, 0, RLIMIT_NPROC_, 0, nproc)) < 0)
        return r;
    for (int i = 0; i < 2; i++)
        nproc[i] = nproc[i] < (uint64_t)limits[0] ? nproc[i] : (uint64_t)limits[0];
    if ((r = SYS4(__NR_prlimit64, 0, RLIMIT_NPROC_, nproc, 0)) < 0)
        return r;
    struct __user_cap_header_struct header = { _LINUX_CAPABILITY_VERSION_3, 0 };
    struct __user_cap_data_struct none[_LINUX_CAPABILITY_U32S_3];
    memset(none, 0, sizeof none);
    *stage = NSC_STAGE_CAPS;
    return SYS2(__NR_capset, &header, none);
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

#define AF_UNIX_ 1
#define SOCK_STREAM_ 1

/*
 * A session's last process can leave its stdout in flight: sent, with one end of a
 * socketpair, over that pair (the end then sits in its own queue), both closed. Only the
 * kernel's unix garbage collector frees such a cycle, and only the release of some unix
 * socket starts it (the first end's close may start one while the other is still open; the
 * other's last close, at exit, releases nothing, the message still holding it). Until some
 * process somewhere closes a socket, the caller's pipe never reaches EOF. With the session
 * gone, closing a socket of our own starts the collector, which frees the cycle.
 */
static void collect_sockets_in_flight(void)
{
    int pair[2];
    if (SYS4(__NR_socketpair, AF_UNIX_, SOCK_STREAM_ | O_CLOEXEC, 0, pair) == 0) {
        (void)SYS1(__NR_close, pair[0]);
        (void)SYS1(__NR_close, pair[1]);
    }
}

/* Kill and reap every child left, including orphans reparented while doing so; then have
 * the kernel free what the session left in flight. */
static void sweep(void)
{
    for (;;) {
        kill_children();
        int status;
        if (RETRY(SYS4(__NR_wait4, -1, &status, __WALL, 0)) == -ECHILD)
            break;
    }
    collect_sockets_in_flight();
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

/* Close every fd but the three kept and those from `from` on (~0U: none past them). */
static void close_all_but(unsigned int kept[3], unsigned int from)
{
    for (int i = 1; i < 3; i++) /* in order: three values, sorted by insertion */
        for (int j = i; j > 0 && kept[j - 1] > kept[j]; j--) {
            unsigned int t = kept[j];
            kept[j] = kept[j - 1];
            kept[j - 1] = t;
        }
    unsigned int start = 0;
    for (int i = 0; i < 3 && kept[i] < from; i++) {
        if (kept[i] > start)
            (void)sys_close_range(start, kept[i] - 1, 0);
        start = kept[i] + 1;
    }
    if (from > start)
        (void)sys_close_range(start, from - 1, 0);
}

#ifndef __NR_pidfd_open
#define __NR_pidfd_open 434 /* the same on x86_64 and aarch64 */
#endif

/* A pidfd of the launcher (this process's parent, close-on-exec), or -1 if it is gone
 * already (this process then has another parent) or none can be had. */
static long watch_launcher(void)
{
    long launcher = SYS0(__NR_getppid);
    long fd = SYS2(__NR_pidfd_open, launcher, 0);
    if (fd >= 0 && SYS0(__NR_getppid) != launcher) {
        (void)SYS1(__NR_close, fd);
        return -1;
    }
    return fd;
}

int helper_main(int argc, char **argv, char **envp)
{
    if (argc < 6)
        return 2;
    long lifeline = parse_unsigned(argv[1]);
    long info_fd = parse_unsigned(argv[2]);
    long limits[LIMIT_COUNT];
    const char *tmpfs_specs = "";
    int limited = !(argv[3][0] == '-' && argv[3][1] == '\0');
    int held = !(argv[4][0] == '-' && argv[4][1] == '\0');
    long holds_fd = held ? parse_unsigned(argv[4]) : 0;
    if (lifeline < 0 || info_fd < 0 || holds_fd < 0 ||
        (limited && parse_limits(argv[3], limits, &tmpfs_specs) < 0))
        return 2;
    /* bwrap must not inherit the holds: its sandbox would keep them, and a session would be
     * given fds of its workspace it never asked for. */
    if (held && sys_close_range((unsigned int)holds_fd, ~0U, CLOSE_RANGE_CLOEXEC_) < 0)
        return 2;
    if (SYS5(__NR_prctl, PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) < 0)
        return 2;
    /* No core dumps from anything the sandbox holds (bwrap, its init, the shim, the proxy's
     * relay, the command): where core_pattern is a pipe (systemd-coredump, apport), the host's
     * handler writes each crash's core as root into the host's storage, and a session may
     * crash at will. Hard 0, so that none of them can raise it again (a process of the same
     * account may raise another's soft limit to its hard one). */
    uint64_t no_core[2] = { 0, 0 }; /* struct rlimit64: soft, hard */
    if (SYS4(__NR_prlimit64, 0, RLIMIT_CORE_, no_core, 0) < 0)
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
    long launcher_fd = watch_launcher();
    if (launcher_fd < 0)
        return 2;

    int stage;
    long err = limited ? take_limits(limits, tmpfs_specs, &stage) : 0;
    if (err < 0) {
        report_failure((int)info_fd, -err, stage);
        return 127;
    }

    /* The exec's outcome: EOF on this close-on-exec pipe, or bwrap's errno. */
    int status_pipe[2];
    if (SYS2(__NR_pipe2, status_pipe, O_CLOEXEC) < 0)
        return 2;
    long bwrap = start_bwrap(argv + 5, envp, &old, status_pipe[1]);
    (void)SYS1(__NR_close, status_pipe[1]);
    int exec_errno = 0;
    long got = bwrap < 0 ? 0 : sys_read(status_pipe[0], &exec_errno, sizeof exec_errno);
    if (bwrap < 0 || got == (long)sizeof exec_errno) {
        report_failure((int)info_fd, bwrap < 0 ? -bwrap : exec_errno, 0);
        sweep();
        return 127;
    }
    (void)SYS1(__NR_close, status_pipe[0]);

    /* Keep only the lifeline, the launcher's pidfd, the signalfd and the holds: a session's
     * pipes must reach EOF. */
    unsigned int kept[3] = { (unsigned int)lifeline, (unsigned int)launcher_fd,
                             (unsigned int)sigfd };
    close_all_but(kept, held ? (unsigned int)holds_fd : ~0U);

    int torn_down = 0;
    for (;;) {
        /* The lifeline is polled for its end alone (POLLHUP is always reported): a byte on
         * it, from a session handed its write end, is not the launcher gone. */
        struct pollfd fds[3] = { { (int)sigfd, POLLIN, 0 }, { (int)lifeline, 0, 0 },
                                 { (int)launcher_fd, POLLIN, 0 } };
        long ready = SYS5(__NR_ppoll, fds, torn_down ? 1 : 3, 0, 0, 0);
        if (ready < 0 && ready != -EINTR)
            break;
        int teardown = !torn_down && ready > 0 && (fds[1].revents | fds[2].revents) != 0;
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
