/*
 * The loopback relay of a session whose network is "proxy" (part of the exec shim:
 * shim.c starts it; see relay.h).
 *
 * The session's network namespace has only a loopback; the way out is a unix stream
 * socket the launcher binds into the sandbox (nsconfine's proxy outside, which allows only
 * the plan's destinations). Programs speak TCP to an HTTP proxy, so the relay listens on
 * 127.0.0.1:PORT and joins each accepted connection to a new connection to that socket.
 *
 * Shape, and why:
 *   - The shim binds and listens before it execs the command, so the port is never free for
 *     the command to take, and a client connecting as soon as the command starts finds the
 *     listener (its backlog holds the connection until the relay accepts it).
 *   - The relay is the sandbox's pid 1's child (CLONE_PARENT), not the command's: the command
 *     never sees an extra child (a wait() for all its children would never return), and the
 *     sandbox still ends when the command does (bwrap's monitor exits when its first child
 *     does; the pid namespace's init dies with it, and the relay with the namespace).
 *   - A session and a process group of its own, fds 0-2 on /dev/null, every other fd closed
 *     before the shim goes on to exec the command (which may stop the relay and open its
 *     fds): it holds neither the launcher's channel nor the caller's stdio or terminal (no
 *     pipe waits on it for EOF; no ^C of the terminal's foreground group reaches it).
 *   - A process per connection (auto-reaped: SIGCHLD ignored): a connection that fails, or
 *     never reads, stops only itself. Each shuttles both ways through a bounded pipe per
 *     direction (splice(2): the bytes stay in the kernel) with ppoll, and passes a half-close
 *     on with shutdown(SHUT_WR).
 *   - The unix socket missing or refusing: that TCP connection is reset, the next is tried
 *     afresh.
 * It runs as the session's account and holds nothing the command cannot open itself: the
 * listener, and connections to a socket the command can connect to as well.
 */
#include "relay.h"

#define AF_UNIX_ 1
#define AF_INET_ 2
#define SOCK_STREAM_ 1
#define SOCK_CLOEXEC_ O_CLOEXEC
#define SOL_SOCKET_LEVEL 1
#define SO_LINGER_ 13
#define SHUT_WR_ 1
#define LISTEN_BACKLOG 128
#define RELAY_BUFFER_BYTES 262144 /* per direction: what one connection holds in flight */
#define SPLICE_F_MOVE_ 1
#define SPLICE_F_NONBLOCK_ 2
#ifndef F_SETPIPE_SZ
#define F_SETPIPE_SZ 1031
#endif
#define RELAY_ROUNDS 8            /* reads and writes one direction makes before the other's */

struct inet_address { /* struct sockaddr_in, in bytes: network order whatever the CPU's */
    uint16_t family;
    uint8_t port[2];
    uint8_t address[4];
    uint8_t zero[8];
};

struct unix_address { /* struct sockaddr_un */
    uint16_t family;
    char path[RELAY_MAX_PATH];
};

struct linger_option {
    int on;
    int seconds;
};

/* Close fd so that its peer sees a reset, not a clean end: the relay had nothing to give. */
static void reset_and_close(int fd)
{
    struct linger_option abort_now = { 1, 0 };
    (void)SYS5(__NR_setsockopt, fd, SOL_SOCKET_LEVEL, SO_LINGER_, &abort_now, sizeof abort_now);
    (void)SYS1(__NR_close, fd);
}

/* One direction of a connection: bytes read from `from` into a pipe of its own, not yet
 * written to `to`. splice(2) moves them from socket to pipe to socket inside the kernel: no
 * copy through the relay's memory, which a large download through the proxy would pay twice. */
struct direction {
    int from, to;
    int pipe_r, pipe_w;
    long pending; /* bytes in the pipe */
    int at_eof;   /* `from` has nothing more to give */
    int done;     /* and all of it went out, and `to` was told (shutdown) */
};

/* What this direction waits for on fd: POLLIN on its source, POLLOUT on its destination. */
static short wanted_on(const struct direction *d, int fd)
{
    if (d->done)
        return 0;
    if (!d->pending)
        return d->from == fd && !d->at_eof ? POLLIN : 0;
    return d->to == fd ? POLLOUT : 0;
}

static long splice_(int from, int to, long bytes)
{
    return RETRY(SYS6(__NR_splice, from, 0, to, 0, bytes, SPLICE_F_MOVE_ | SPLICE_F_NONBLOCK_));
}

/*
 * What splice(2) cannot give: it stops at TCP urgent data (a peer's MSG_OOB), returning 0 or
 * -EAGAIN as if at the end or with nothing to read, while ppoll says the socket is readable:
 * the connection would end early, or spin at a full core. A read passes the mark (the urgent
 * byte dropped, as any reader without SO_OOBINLINE drops it); what it read goes into the
 * direction's pipe, empty here, which takes it whole. What recv says is the truth: 0 is the
 * end, -EAGAIN nothing yet.
 */
static long read_instead(struct direction *d)
{
    char buffer[4096];
    long n = RETRY(SYS6(__NR_recvfrom, d->from, buffer, sizeof buffer, 0, 0, 0));
    if (n <= 0)
        return n;
    long written = RETRY(SYS3(__NR_write, d->pipe_w, buffer, n));
    return written == n ? n : -EIO;
}

/*
 * Move what revents allow, and then what the other side turns out to allow too: after a read
 * the destination usually has room, and after a write the source usually has more, so each is
 * tried at once (without a ppoll between) until one would block, a few rounds at the most so
 * that the other direction gets its turn. 0, or -1 when the connection cannot go on.
 */
static int advance(struct direction *d, const struct pollfd *polled)
{
    if (d->done)
        return 0;
    const struct pollfd *from = polled[0].fd == d->from ? &polled[0] : &polled[1];
    const struct pollfd *to = polled[0].fd == d->to ? &polled[0] : &polled[1];
    int may_read = (from->revents & (POLLIN | POLLHUP | POLLERR)) != 0;
    int may_write = (to->revents & (POLLOUT | POLLHUP | POLLERR)) != 0;
    for (int round = 0; round < RELAY_ROUNDS; round++) {
        if (!d->pending && !d->at_eof) {
            if (!may_read)
                break;
            long n = splice_(d->from, d->pipe_w, RELAY_BUFFER_BYTES);
            if (n == -EAGAIN || n == 0)
                n = read_instead(d);
            if (n == -EAGAIN)
                break;
            if (n < 0)
                return -1;
            if (n == 0)
                d->at_eof = 1;
            d->pending = n;
            may_write = 1;
        }
        if (!d->pending)
            break;
        if (!may_write)
            break;
        long n = splice_(d->pipe_r, d->to, d->pending);
        if (n == -EAGAIN)
            break;
        if (n < 0)
            return -1;
        d->pending -= n;
        if (d->pending)
            break; /* the destination is full: ppoll says when it has room */
        may_read = 1;
    }
    if (d->at_eof && !d->pending) {
        (void)SYS2(__NR_shutdown, d->to, SHUT_WR_); /* the half-close, passed on */
        d->done = 1;
    }
    return 0;
}

/* Make fd non-blocking: splice(2) from a socket waits, or not, by the socket's own flag. */
static long nonblocking(int fd)
{
    long flags = SYS2(__NR_fcntl, fd, F_GETFL);
    return flags < 0 ? flags : SYS3(__NR_fcntl, fd, F_SETFL, flags | O_NONBLOCK);
}

/* A direction's pipe, sized to hold what one connection has in flight each way. */
static long open_pipe(struct direction *d)
{
    int ends[2];
    long r = SYS2(__NR_pipe2, ends, O_CLOEXEC | O_NONBLOCK);
    if (r < 0)
        return r;
    d->pipe_r = ends[0];
    d->pipe_w = ends[1];
    (void)SYS3(__NR_fcntl, ends[1], F_SETPIPE_SZ, RELAY_BUFFER_BYTES); /* else the default */
    return 0;
}

/*
 * Shuttle bytes between tcp and proxy both ways until both directions have ended. A fd
 * neither direction reads or writes now is polled (for nothing) only when everything it had
 * has been read and data may yet have to go to it: a hang-up then means its peer is gone and
 * can take nothing more, and the connection ends. Any other such fd is left out: a unix
 * socket hangs up while data is still queued on it (read later, when the buffer has room),
 * and a hung-up fd polled in vain would wake ppoll at once, forever.
 */
static int shuttle(int tcp, int proxy)
{
    struct direction up = { tcp, proxy, -1, -1, 0, 0, 0 };
    struct direction down = { proxy, tcp, -1, -1, 0, 0, 0 };
    if (nonblocking(tcp) < 0 || nonblocking(proxy) < 0 || open_pipe(&up) < 0 ||
        open_pipe(&down) < 0)
        return -1; /* (the process exits: its pipes go with it) */
    while (!(up.done && down.done)) {
        struct pollfd polled[2];
        int fds[2] = { tcp, proxy };
        for (int i = 0; i < 2; i++) {
            short events = (short)(wanted_on(&up, fds[i]) | wanted_on(&down, fds[i]));
            const struct direction *into = fds[i] == tcp ? &down : &up;
            const struct direction *out = fds[i] == tcp ? &up : &down;
            polled[i].fd = events || (out->at_eof && !into->done) ? fds[i] : -1;
            polled[i].events = events;
            polled[i].revents = 0;
        }
        long ready = RETRY(SYS5(__NR_ppoll, polled, 2, 0, 0, 0));
        if (ready < 0)
            return -1;
        for (int i = 0; i < 2; i++) {
            if (polled[i].fd >= 0 && !polled[i].events && (polled[i].revents & (POLLHUP | POLLERR)))
                return -1;
        }
        polled[0].fd = tcp; /* advance finds each fd by number, polled or not */
        polled[1].fd = proxy;
        if (advance(&up, polled) < 0 || advance(&down, polled) < 0)
            return -1;
    }
    return 0;
}

/* One accepted connection, in a process of its own: joined to the proxy, or reset. */
__attribute__((noreturn)) static void serve(int tcp, const char *socket_path)
{
    struct unix_address proxy_address = { AF_UNIX_, { 0 } };
    size_t path_length = strlen(socket_path);
    memcpy(proxy_address.path, socket_path, path_length + 1);
    long proxy = SYS3(__NR_socket, AF_UNIX_, SOCK_STREAM_ | SOCK_CLOEXEC_, 0);
    long r = proxy < 0 ? proxy
                       : RETRY(SYS3(__NR_connect, proxy, &proxy_address,
                                    sizeof proxy_address.family + path_length + 1));
    if (r < 0 || shuttle(tcp, (int)proxy) < 0) {
        reset_and_close(tcp);
        sys_exit(1);
    }
    sys_exit(0);
}

/* A short pause after a failure that retrying at once would only repeat (no fd, no memory). */
static void back_off(void)
{
    struct __kernel_timespec pause = { 0, 10 * 1000000 };
    (void)SYS2(__NR_nanosleep, &pause, 0);
}

/* Close every fd from 3 up but keep_low and keep_high (keep_low < keep_high, both >= 3). */
static void close_all_but(unsigned int keep_low, unsigned int keep_high)
{
    if (keep_low > 3)
        (void)sys_close_range(3, keep_low - 1, 0);
    if (keep_high > keep_low + 1)
        (void)sys_close_range(keep_low + 1, keep_high - 1, 0);
    (void)sys_close_range(keep_high + 1, ~0U, 0);
}

/* ready: the write end of the shim's pipe, closed last: the shim waits for its EOF. */
__attribute__((noreturn)) static void relay_main(int listener, int ready, const char *socket_path,
                                                uint64_t open_files)
{
    (void)SYS0(__NR_setsid); /* out of the command's session and process group */
    /* The command may stop it and drive it (ptrace: its sibling, its own account's): with
     * the launcher's fd limit it could hold the account's whole count of fds in flight. */
    if (open_files > 0 && cap_open_files(open_files) < 0)
        sys_exit(1); /* (the shim's wait for it ends: the command runs with no relay) */

    /* Only the listener stays; stdio goes to /dev/null (closed if the sandbox has none). */
    if (listener < ready)
        close_all_but((unsigned int)listener, (unsigned int)ready);
    else
        close_all_but((unsigned int)ready, (unsigned int)listener);
    long null = SYS4(__NR_openat, AT_FDCWD_, "/dev/null", O_RDWR | O_CLOEXEC, 0);
    for (int target = 0; target < 3; target++) {
        if (null < 0)
            (void)SYS1(__NR_close, target);
        else if (null != target)
            (void)SYS3(__NR_dup3, null, target, 0);
    }
    if (null > 2)
        (void)SYS1(__NR_close, null);
    (void)SYS1(__NR_close, ready); /* the shim may exec the command now */

    reset_signal_dispositions();
    struct ksigaction ignore = { SIG_IGN, 0, 0, 0 };
    (void)SYS4(__NR_rt_sigaction, SIGCHLD, &ignore, 0, sizeof(ksigset_t)); /* auto-reaped */
    (void)SYS4(__NR_rt_sigaction, SIGPIPE, &ignore, 0, sizeof(ksigset_t));
    ksigset_t none = 0;
    (void)sys_sigprocmask(SIG_SETMASK, &none, 0);

    for (;;) {
        long connection = SYS4(__NR_accept4, listener, 0, 0, SOCK_CLOEXEC_);
        if (connection == -EBADF || connection == -EINVAL || connection == -ENOTSOCK)
            sys_exit(1); /* no listener left: nothing more to relay */
        if (connection < 0) {
            if (connection != -EINTR && connection != -ECONNABORTED)
                back_off(); /* out of fds or memory: give what holds them time to end */
            continue;
        }
        long child = SYS5(__NR_clone, SIGCHLD, 0, 0, 0, 0);
        if (child == 0) {
            (void)SYS1(__NR_close, listener);
            serve((int)connection, socket_path);
        }
        if (child < 0) /* no process for it (the session's process limit): refuse this one */
            reset_and_close((int)connection);
        else
            (void)SYS1(__NR_close, connection);
    }
}

long start_relay(long port, const char *socket_path, uint64_t open_files)
{
    if (port < 1 || port > 65535 || socket_path[0] != '/' ||
        strlen(socket_path) >= RELAY_MAX_PATH)
        return -EINVAL;
    long listener =
        above_stdio(SYS3(__NR_socket, AF_INET_, SOCK_STREAM_ | SOCK_CLOEXEC_, 0));
    if (listener < 0)
        return listener;
    /* No SO_REUSEPORT: with it, a command setting it too could bind the same port and take
     * connections meant for the proxy. The namespace is new: nothing to reuse an address of. */
    struct inet_address loopback = {
        AF_INET_, { (uint8_t)(port >> 8), (uint8_t)port }, { 127, 0, 0, 1 }, { 0 }
    };
    long r = SYS3(__NR_bind, listener, &loopback, sizeof loopback);
    if (r == 0)
        r = SYS2(__NR_listen, listener, LISTEN_BACKLOG);
    int ready[2] = { -1, -1 };
    if (r == 0)
        r = SYS2(__NR_pipe2, ready, O_CLOEXEC);
    for (int i = 0; r == 0 && i < 2; i++) { /* above 0-2, which the relay points at /dev/null */
        long moved = above_stdio(ready[i]);
        ready[i] = (int)moved;
        r = moved < 0 ? moved : 0;
    }
    if (r == 0) {
        /* CLONE_PARENT: pid 1's child, the command's sibling. Its exit signal is the shim's
         * own (SIGCHLD), so pid 1 reaps it. */
        r = SYS5(__NR_clone, CLONE_PARENT_, 0, 0, 0, 0);
        if (r == 0)
            relay_main((int)listener, ready[1], socket_path, open_files);
    }
    if (ready[1] >= 0)
        (void)SYS1(__NR_close, ready[1]);
    if (r > 0) {
        /* The command may stop the relay, and open its fds (its own account's), once it
         * runs: wait until the relay holds nothing but its listener and /dev/null (the error
         * pipe, bwrap's stderr, the launcher's socket and the caller's stdio all closed). Its
         * last close, or its death, ends the pipe; nothing else in the sandbox can reach it
         * before the command runs. */
        char byte;
        while (RETRY(sys_read(ready[0], &byte, 1)) > 0)
            ;
    }
    if (ready[0] >= 0)
        (void)SYS1(__NR_close, ready[0]);
    (void)SYS1(__NR_close, listener);
    return r < 0 ? r : 0;
}
