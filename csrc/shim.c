/*
 * nsconfine's exec shim: the first command of every sandbox (bwrap runs it
 * from a sealed memfd, as /proc/self/fd/7).
 *
 *     _shim SOCKET_FD IDLE_TIMEOUT_MS GUARD_PID_1 OPEN_FILES [RELAY_PORT RELAY_SOCKET]
 *
 * The sandbox is already built (namespaces, mounts, environment, working
 * directory) when this runs; what is missing is the caller's command. The
 * shim writes one byte 'R' on its socket (the launcher's sign that the
 * sandbox is built; the kernel attaches the shim's pid to it; 'U' instead if
 * nsconfine's seccomp filter does not answer, below), then waits for
 * ONE launch message (nsconfine/_launch/handoff.py writes it; the numbers are
 * NSC_SHIM_* in nsconfine.h):
 *
 *     a header of five uint32 (magic, fd mask, argc, envc, body size), then
 *     `size` bytes: argc NUL-terminated arguments, then envc NUL-terminated
 *     NAME=VALUE strings; SCM_RIGHTS on the first byte: the error pipe's
 *     write end, then one fd for each of the low bits set in the fd mask (bit
 *     i: the fd to place at i, i = 0..2); bit 4 + i instead closes fd i;
 *     neither keeps it
 *
 * With NSC_SHIM_TTY in the mask (and no fd to place), the shim opens a new pty
 * in the sandbox's own devpts, starts a session of its own and makes the pty its
 * controlling terminal and its 0, 1 and 2, and sends the
 * controller back on the socket ('T', the fd by SCM_RIGHTS); it goes on once
 * the launcher answers 'G' (having set the window size).
 *
 * It puts the fds in place, sets the extra variables over the environment
 * bwrap gave it (the plan's), resets every signal disposition and the signal
 * mask, marks every fd from 3 up close-on-exec and execs argv[0] as execvp
 * would (a name without a slash is searched in the PATH of that environment;
 * a file the kernel cannot execute is run with /bin/sh). The launcher sends
 * the caller's stdio (bwrap itself has /dev/null at 0 and 1: its --dev binds
 * the terminal at its fd 1 as the sandbox's /dev/console). The error pipe is
 * the launcher's proof: the shim writes
 * NSC_SHIM_EXECUTING into it once all is in place, and the pipe closes at a
 * successful exec (EOF); on failure the shim writes {errno, stage} into it
 * and exits 127. EOF with neither means the shim was killed first. EOF on the socket (the launcher closed the sandbox or died)
 * or the idle timeout: exit 0, the sandbox ends and the launcher reaps it.
 *
 * OPEN_FILES > 0 is the most files each process of the command may hold open: the shim
 * lowers its RLIMIT_NOFILE (soft and hard) to it, never raising either, just before the exec
 * (bwrap, which holds an fd for every copied runner file, keeps the launcher's). (Its
 * RLIMIT_CORE is 0 already: the reaper set it for all the sandbox holds.)
 *
 * With GUARD_PID_1 = 1 the shim first takes a Landlock domain of its own, scoped
 * (ABI 6): its command, and all it starts, can then neither ptrace, read or
 * write the memory of, nor signal the sandbox's pid 1 (bwrap's init, outside
 * that domain), which holds the exit status the launcher reads; nor connect to
 * an abstract socket outside it. If that fails it sends 'L' instead of 'R'.
 *
 * With RELAY_PORT and RELAY_SOCKET (a session whose network is "proxy"), once the launch
 * message is read and before anything of the command is put in place, the shim listens on
 * 127.0.0.1:RELAY_PORT and starts the relay (relay.c) on that listener, which joins each
 * connection to the unix socket at RELAY_SOCKET; if it cannot, the launch fails (stage
 * NSC_SHIM_STAGE_RELAY) and the command never runs. The relay holds open no more files than
 * the command (OPEN_FILES): the command may drive it (its sibling, its own account's).
 *
 * No libc (see freestanding.h): it starts once per launch.
 */
#include "freestanding.h"
#include "nsconfine.h"
#include "relay.h"

#define SHIM_MAX_FDS 4 /* the error pipe and 0, 1, 2 */
#define DEFAULT_PATH "/bin:/usr/bin" /* execvp's, when the environment has no PATH */
#define MAX_PATH_BYTES 4096

struct launch_header {
    uint32_t magic;
    uint32_t fd_mask;
    uint32_t argc;
    uint32_t envc;
    uint32_t size;
};

static int errpipe = -1;

/* A scope-only Landlock domain over this process and what it execs; 0, or -errno. */
static long guard_pid_1(void)
{
    /* fs, net, scoped: the ABI 6 layout */
    uint64_t attr[3] = { 0, 0,
                         NSC_LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET | NSC_LANDLOCK_SCOPE_SIGNAL };
    long fd = SYS3(NSC_LANDLOCK_CREATE_RULESET, attr, sizeof attr, 0);
    if (fd < 0)
        return fd;
    long r = SYS2(NSC_LANDLOCK_RESTRICT_SELF, fd, 0);
    (void)SYS1(__NR_close, fd);
    return r;
}

__attribute__((noreturn)) static void fail(long err, int stage)
{
    int32_t report[2] = { (int32_t)-err, stage };
    if (errpipe >= 0)
        (void)sys_write_all(errpipe, report, sizeof report);
    sys_exit(127);
}

static void *map(size_t bytes)
{
    long p = sys_map(bytes);
    if (p < 0 && p > -4096)
        fail(p, NSC_SHIM_STAGE_RECV);
    return (void *)p;
}

/*
 * Wait until the socket is readable: 0 on data (or EOF, which the read then
 * sees), -1 when the idle time is up with nothing queued. A message that
 * lands as the timer runs out still counts: the launcher only uses a staged
 * sandbox before its deadline, so anything queued is a real launch.
 */
static int wait_readable(int sock, long timeout_ms)
{
    struct pollfd p = { sock, POLLIN, 0 };
    struct __kernel_timespec limit = { timeout_ms / 1000, (timeout_ms % 1000) * 1000000 };
    long r = RETRY(SYS5(__NR_ppoll, &p, 1, &limit, 0, 0));
    if (r != 0)
        return 0;
    char c;
    return SYS6(__NR_recvfrom, sock, &c, 1, MSG_PEEK_ | MSG_DONTWAIT_, 0, 0) > 0 ? 0 : -1;
}

/* Read exactly len bytes; the first call also collects the passed fds. 1: clean EOF. */
static int read_exact(int sock, void *buf, size_t len, int *fds, int *n_fds)
{
    size_t done = 0;
    while (done < len) {
        union {
            struct kcmsghdr align;
            char buf[KCMSG_SPACE(sizeof(int) * SHIM_MAX_FDS)];
        } control;
        struct iovec iov = { (char *)buf + done, len - done };
        struct kmsghdr msg = { 0 };
        msg.iov = &iov;
        msg.iovlen = 1;
        if (fds) {
            msg.control = control.buf;
            msg.controllen = sizeof control.buf;
        }
        long n = RETRY(SYS3(__NR_recvmsg, sock, &msg, MSG_CMSG_CLOEXEC_));
        if (n < 0)
            fail(n, NSC_SHIM_STAGE_RECV);
        if (n == 0) {
            if (done == 0)
                return 1;
            fail(-EPROTO, NSC_SHIM_STAGE_PROTOCOL); /* EOF inside a message */
        }
        if (fds) {
            if (msg.flags & MSG_CTRUNC_)
                fail(-EMSGSIZE, NSC_SHIM_STAGE_RECV);
            struct kcmsghdr *c = msg.controllen >= sizeof *c ? (void *)control.buf : 0;
            if (c && c->level == SOL_SOCKET_ && c->type == SCM_RIGHTS_) {
                size_t count = (c->len - sizeof *c) / sizeof(int);
                for (size_t i = 0; i < count && *n_fds < SHIM_MAX_FDS; i++)
                    memcpy(&fds[(*n_fds)++], KCMSG_DATA(c) + i * sizeof(int), sizeof(int));
            }
            fds = 0; /* fds travel with the first byte only */
        }
        done += (size_t)n;
    }
    return 0;
}

#define TIOCSCTTY_ 0x540e
#define TIOCSPTLCK_ 0x40045431
#define TIOCGPTPEER_ 0x5441

/* Send one byte and one fd on sock. */
static long send_fd(int sock, char byte, int fd)
{
    union {
        struct kcmsghdr align;
        char buf[KCMSG_SPACE(sizeof(int))];
    } control;
    memset(&control, 0, sizeof control);
    struct kcmsghdr *c = (struct kcmsghdr *)control.buf;
    c->len = sizeof(struct kcmsghdr) + sizeof(int);
    c->level = SOL_SOCKET_;
    c->type = SCM_RIGHTS_;
    memcpy(KCMSG_DATA(c), &fd, sizeof fd);
    struct iovec iov = { &byte, 1 };
    struct kmsghdr msg = { 0 };
    msg.iov = &iov;
    msg.iovlen = 1;
    msg.control = control.buf;
    msg.controllen = sizeof control.buf;
    return RETRY(SYS3(__NR_sendmsg, sock, &msg, 0));
}

/*
 * send_fd with the soft RLIMIT_NOFILE raised to the hard one for the send, then put back: the
 * account has one count of fds sent and not yet received, and a send fails (ETOOMANYREFS)
 * once it passes the sender's soft limit; another session of the account can fill it.
 */
static long send_fd_past_others(int sock, char byte, int fd)
{
    uint64_t limit[2], raised[2]; /* struct rlimit64: soft, hard */
    long got = SYS4(__NR_prlimit64, 0, RLIMIT_NOFILE_, 0, limit);
    if (got == 0 && limit[0] < limit[1]) {
        raised[0] = raised[1] = limit[1];
        (void)SYS4(__NR_prlimit64, 0, RLIMIT_NOFILE_, raised, 0);
    }
    long r = send_fd(sock, byte, fd);
    if (got == 0 && limit[0] < limit[1])
        (void)SYS4(__NR_prlimit64, 0, RLIMIT_NOFILE_, limit, 0);
    return r;
}

/*
 * A new pty of the sandbox's own as the command's terminal: its controlling terminal and
 * stdio; the controller goes to the launcher, which answers 'G' once it has set the size.
 */
static void take_new_terminal(int sock)
{
    /* Both above stdio: one opened where the launcher had no stdio fd would be overwritten
     * below (and dup3 of a fd onto itself fails). */
    long master = above_stdio(
        SYS4(__NR_openat, AT_FDCWD_, "/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC, 0));
    if (master < 0)
        fail(master, NSC_SHIM_STAGE_TTY);
    int unlock = 0;
    long r = SYS3(__NR_ioctl, master, TIOCSPTLCK_, &unlock);
    long terminal = r < 0 ? r : above_stdio(SYS3(__NR_ioctl, master, TIOCGPTPEER_, O_RDWR));
    if (terminal < 0)
        fail(terminal, NSC_SHIM_STAGE_TTY);
    /* A session of its own, whose leader can take a controlling terminal (bwrap's
     * --new-session made pid 1 the leader of the sandbox's session). */
    r = SYS0(__NR_setsid);
    if (r >= 0)
        r = SYS3(__NR_ioctl, terminal, TIOCSCTTY_, 0);
    if (r < 0)
        fail(r, NSC_SHIM_STAGE_TTY);
    for (int target = 0; target < 3; target++) {
        r = SYS3(__NR_dup3, terminal, target, 0);
        if (r < 0)
            fail(r, NSC_SHIM_STAGE_TTY);
    }
    (void)SYS1(__NR_close, terminal);
    r = send_fd_past_others(sock, 'T', (int)master);
    if (r < 0)
        fail(r, NSC_SHIM_STAGE_TTY);
    (void)SYS1(__NR_close, master);
    char go = 0;
    if (read_exact(sock, &go, 1, 0, 0) != 0 || go != 'G')
        fail(-EPROTO, NSC_SHIM_STAGE_PROTOCOL);
}

/* Length of the NAME= part of a NAME=VALUE string (0 if it has no '='). */
static size_t name_length(const char *var)
{
    for (size_t n = 0; var[n]; n++) {
        if (var[n] == '=')
            return n + 1;
    }
    return 0;
}

/* envp with the message's variables added, each replacing one of the same name. */
static char **merge_environment(char **envp, char **extra, uint32_t envc)
{
    size_t count = 0;
    while (envp[count])
        count++;
    char **merged = map((count + envc + 1) * sizeof *merged);
    size_t out = 0;
    for (size_t i = 0; i < count; i++) {
        size_t len = name_length(envp[i]);
        int replaced = 0;
        for (uint32_t j = 0; j < envc && !replaced; j++)
            replaced = len && name_length(extra[j]) == len && memcmp(envp[i], extra[j], len) == 0;
        if (!replaced)
            merged[out++] = envp[i];
    }
    for (uint32_t j = 0; j < envc; j++)
        merged[out++] = extra[j];
    merged[out] = 0;
    return merged;
}

static const char *lookup(char **envp, const char *name, size_t len)
{
    for (; *envp; envp++) {
        if (memcmp(*envp, name, len) == 0)
            return *envp + len;
    }
    return 0;
}

/* execve, and as execvp: a file the kernel cannot run as a program is run with /bin/sh. */
static long exec_file(const char *path, char **args, char **envp)
{
    long err = SYS3(__NR_execve, path, args, envp);
    if (err == -ENOEXEC) {
        /* args has one free slot before it: the caller allocated it for this. */
        char **with_shell = args - 1;
        char *name = args[0];
        with_shell[0] = "/bin/sh";
        args[0] = (char *)path;
        err = SYS3(__NR_execve, "/bin/sh", with_shell, envp);
        args[0] = name;
    }
    return err;
}

/* execvp's search: a name with a slash is a path; else each PATH entry in turn. */
__attribute__((noreturn)) static void exec_command(char **args, char **envp)
{
    const char *name = args[0];
    size_t name_len = strlen(name);
    for (size_t i = 0; i < name_len; i++) {
        if (name[i] == '/')
            fail(exec_file(name, args, envp), NSC_SHIM_STAGE_EXEC);
    }
    if (name_len == 0)
        fail(-ENOENT, NSC_SHIM_STAGE_EXEC);
    const char *search = lookup(envp, "PATH=", 5);
    if (!search)
        search = DEFAULT_PATH;
    long saw_eacces = 0;
    char path[MAX_PATH_BYTES];
    for (const char *p = search;; p++) {
        const char *end = p;
        while (*end && *end != ':')
            end++;
        size_t dir_len = (size_t)(end - p);
        if (dir_len == 0) { /* an empty entry is the working directory */
            p = ".";
            dir_len = 1;
        }
        if (dir_len + 1 + name_len + 1 <= sizeof path) {
            memcpy(path, p, dir_len);
            path[dir_len] = '/';
            memcpy(path + dir_len + 1, name, name_len + 1);
            long err = exec_file(path, args, envp);
            if (err == -EACCES)
                saw_eacces = 1;
            else if (err != -ENOENT && err != -ENOTDIR && err != -ESTALE && err != -ENODEV &&
                     err != -ETIMEDOUT)
                fail(err, NSC_SHIM_STAGE_EXEC);
        }
        if (!*end)
            break;
        p = end;
    }
    fail(saw_eacces ? -EACCES : -ENOENT, NSC_SHIM_STAGE_EXEC);
}

int helper_main(int argc, char **argv, char **envp)
{
    if (argc != 5 && argc != 7)
        return 2;
    long sock = parse_unsigned(argv[1]);
    long timeout_ms = parse_unsigned(argv[2]);
    long guard = parse_unsigned(argv[3]);
    long open_files = parse_unsigned(argv[4]);
    long relay_port = argc == 7 ? parse_unsigned(argv[5]) : 0;
    const char *relay_socket = argc == 7 ? argv[6] : 0;
    if (sock < 3 || timeout_ms < 0 || guard < 0 || guard > 1 || open_files < 0 ||
        (relay_socket && (relay_port < 1 || relay_port > 65535 || relay_socket[0] != '/' ||
                          strlen(relay_socket) >= RELAY_MAX_PATH)))
        return 2;
    if (guard && guard_pid_1() < 0) {
        (void)sys_write_all((int)sock, "L", 1);
        return 3;
    }

    /* The command starts with default signal handling, whatever bwrap left: set while the
     * shim waits, not at the hand-off (64 system calls a warm launch need not wait for). No
     * call of the shim before its exec relies on an ignored signal; a SIGPIPE from a launcher
     * gone as the shim writes to it ends the shim, as its error return would. */
    reset_signal_dispositions();

    /*
     * Built: the launcher waits for this before it checks the sandbox. 'R' also says that
     * nsconfine's seccomp filter holds the shim: its probe request (NSC_SECCOMP_PROBE_REQUEST)
     * refused with ENOTRECOVERABLE, as every filter nsconfine builds refuses it and nothing
     * else does (the kernel says EBADF of fd -1); 'U' that it does not. The kernel shows only
     * that some filter is there: a bwrap that loaded another than the one it was given, or
     * none under a launcher's own (a container's), must not pass for one that loaded it.
     */
    long probe = SYS3(__NR_ioctl, -1, NSC_SECCOMP_PROBE_REQUEST, 0);
    if (sys_write_all((int)sock, probe == -ENOTRECOVERABLE ? "R" : "U", 1) != 1)
        return 0;
    if (wait_readable((int)sock, timeout_ms) < 0)
        return 0;

    struct launch_header h;
    int fds[SHIM_MAX_FDS];
    int n_fds = 0;
    if (read_exact((int)sock, &h, sizeof h, fds, &n_fds) == 1)
        return 0;
    if (n_fds > 0)
        errpipe = fds[0];
    int wanted = 1 + __builtin_popcount(h.fd_mask & NSC_SHIM_PLACE_MASK);
    /* Each argument and variable ends in a NUL of the body: counts past its size are no
     * launch (and their 32-bit sum could wrap). */
    if (h.magic != NSC_SHIM_MAGIC || n_fds != wanted || h.argc == 0 ||
        h.size > NSC_SHIM_MAX_BODY || (uint64_t)h.argc + h.envc > h.size ||
        (h.fd_mask & ~(uint32_t)(NSC_SHIM_PLACE_MASK | NSC_SHIM_CLOSE_MASK | NSC_SHIM_TTY)) ||
        (h.fd_mask & (h.fd_mask >> 4) & NSC_SHIM_PLACE_MASK) ||
        ((h.fd_mask & NSC_SHIM_TTY) && (h.fd_mask & NSC_SHIM_PLACE_MASK)))
        fail(-EPROTO, NSC_SHIM_STAGE_PROTOCOL);

    long r;
    /* One mapping for the argument and variable pointers and the body, in that order (the
     * pointers stay aligned). One slot before the arguments, for /bin/sh should the command
     * need it. The counts are 32 bits: no sum here overflows. */
    size_t slot_count = (size_t)h.argc + 2, extra_count = (size_t)h.envc + 1;
    char **slots = map((slot_count + extra_count) * sizeof *slots + (size_t)h.size + 1);
    char **args = slots + 1;
    char **extra = slots + slot_count;
    char *body = (char *)(extra + extra_count);
    if (h.size && read_exact((int)sock, body, h.size, 0, 0) != 0)
        fail(-EPROTO, NSC_SHIM_STAGE_PROTOCOL);
    body[h.size] = '\0';

    /* Split the body: argc arguments, then envc variables, each NUL-terminated. */
    char *p = body, *limit = body + h.size;
    for (uint64_t i = 0; i < (uint64_t)h.argc + h.envc; i++) {
        char *nul = p;
        while (nul < limit && *nul)
            nul++;
        if (nul == limit)
            fail(-EPROTO, NSC_SHIM_STAGE_PROTOCOL);
        if (i < h.argc)
            args[i] = p;
        else if (name_length(p) > 1)
            extra[i - h.argc] = p;
        else
            fail(-EINVAL, NSC_SHIM_STAGE_ENV);
        p = nul + 1;
    }
    if (p != limit)
        fail(-EPROTO, NSC_SHIM_STAGE_PROTOCOL);
    args[h.argc] = 0;
    char **environment = merge_environment(envp, extra, h.envc);

    /* Before the command's fds are placed (the relay keeps none of them anyway) and long
     * before its exec: the port is taken and listening by the time the command can run. */
    if (relay_socket && (r = start_relay(relay_port, relay_socket, (uint64_t)open_files)) < 0)
        fail(r, NSC_SHIM_STAGE_RELAY);

    /*
     * A received fd lands on the lowest free number, which is below 3 if
     * bwrap was started with a closed stdio fd: move such fds up first (the
     * error pipe too), so no placement below clobbers or closes one still
     * needed. dup3 clears close-on-exec on the target, which is what the
     * command needs; the moved copies keep it.
     */
    for (int i = 0; i < n_fds; i++) {
        long moved = above_stdio(fds[i]);
        if (moved < 0)
            fail(moved, NSC_SHIM_STAGE_DUP);
        fds[i] = (int)moved;
    }
    errpipe = fds[0];
    int next = 1;
    for (int target = 0; target < 3; target++) {
        if (h.fd_mask & (1u << target)) {
            long r = SYS3(__NR_dup3, fds[next++], target, 0);
            if (r < 0)
                fail(r, NSC_SHIM_STAGE_DUP);
        } else if (h.fd_mask & (0x10u << target)) {
            (void)SYS1(__NR_close, target);
        }
    }

    if (h.fd_mask & NSC_SHIM_TTY)
        take_new_terminal((int)sock);

    ksigset_t none = 0;
    r = sys_sigprocmask(SIG_SETMASK, &none, 0);
    if (r < 0)
        fail(r, NSC_SHIM_STAGE_SIGNALS);
    if (open_files > 0 && (r = cap_open_files((uint64_t)open_files)) < 0)
        fail(r, NSC_SHIM_STAGE_LIMITS);
    /* Everything else, the socket and the error pipe too, closes at exec. */
    r = sys_close_range(3, ~0U, CLOSE_RANGE_CLOEXEC_);
    if (r < 0)
        fail(r, NSC_SHIM_STAGE_CLOSE);
    char executing = NSC_SHIM_EXECUTING;
    if (sys_write_all(errpipe, &executing, 1) != 1)
        sys_exit(127); /* the launcher is gone: nobody to run the command for */
    exec_command(args, environment);
}
