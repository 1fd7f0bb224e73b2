/*
 * The little runtime nsconfine's two helper programs (reaper.c, shim.c) are
 * built on instead of libc: raw system calls, an entry point, and the few
 * memory functions the compiler may call. Why: both run once per session
 * launch, and a statically linked glibc program spends most of its life
 * starting up (about 0.35 ms of a 0.5 ms run on the machines measured, for
 * IRELATIVE relocations, TLS and CPU feature setup), where a program without
 * libc execs in 0.15 ms. Built with -nostdlib -ffreestanding -static.
 *
 * Only what the helpers need, only for x86_64 and aarch64. Calls return the
 * kernel's value: >= 0, or -errno; nothing here has an errno variable.
 */
#ifndef NSCONFINE_FREESTANDING_H
#define NSCONFINE_FREESTANDING_H

#include <asm/unistd.h>
#include <linux/errno.h>
#include <linux/fcntl.h>
#include <linux/mman.h>
#include <linux/poll.h>
#include <linux/prctl.h>
#include <linux/signal.h>
#include <linux/signalfd.h>
#include <linux/time_types.h>
#include <linux/types.h>
#include <linux/uio.h>
#include <linux/wait.h>
#include <stddef.h>
#include <stdint.h>

#include "decimal.h"

#if !defined(__x86_64__) && !defined(__aarch64__)
#error "nsconfine's helpers are built for x86_64 and aarch64 only"
#endif

static inline long sys6(long n, long a, long b, long c, long d, long e, long f)
{
#if defined(__x86_64__)
    long ret;
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    register long r9 __asm__("r9") = f;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                     : "rcx", "r11", "memory");
    return ret;
#else
    register long x8 __asm__("x8") = n;
    register long x0 __asm__("x0") = a;
    register long x1 __asm__("x1") = b;
    register long x2 __asm__("x2") = c;
    register long x3 __asm__("x3") = d;
    register long x4 __asm__("x4") = e;
    register long x5 __asm__("x5") = f;
    __asm__ volatile("svc 0"
                     : "+r"(x0)
                     : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x5)
                     : "memory");
    return x0;
#endif
}

#define SYS0(n) sys6(n, 0, 0, 0, 0, 0, 0)
#define SYS1(n, a) sys6(n, (long)(a), 0, 0, 0, 0, 0)
#define SYS2(n, a, b) sys6(n, (long)(a), (long)(b), 0, 0, 0, 0)
#define SYS3(n, a, b, c) sys6(n, (long)(a), (long)(b), (long)(c), 0, 0, 0)
#define SYS4(n, a, b, c, d) sys6(n, (long)(a), (long)(b), (long)(c), (long)(d), 0, 0)
#define SYS5(n, a, b, c, d, e) sys6(n, (long)(a), (long)(b), (long)(c), (long)(d), (long)(e), 0)
#define SYS6(n, a, b, c, d, e, f)                                                              \
    sys6(n, (long)(a), (long)(b), (long)(c), (long)(d), (long)(e), (long)(f))

/* Fresh zeroed memory of at least bytes (the helpers' only allocator), or -errno. */
static inline long sys_map(size_t bytes)
{
    return SYS6(__NR_mmap, 0, bytes ? bytes : 1, PROT_READ | PROT_WRITE,
                MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
}

/* Retry a call while it fails with EINTR. */
#define RETRY(call)                                                                            \
    ({                                                                                         \
        long retry_result_;                                                                    \
        do                                                                                     \
            retry_result_ = (call);                                                            \
        while (retry_result_ == -EINTR);                                                       \
        retry_result_;                                                                         \
    })

#ifndef __NR_close_range
#define __NR_close_range 436
#endif
#define CLOSE_RANGE_CLOEXEC_ (1U << 2)
#define AT_FDCWD_ (-100)

__attribute__((noreturn)) static inline void sys_exit(int status)
{
    for (;;)
        SYS1(__NR_exit_group, status);
}

static inline long sys_read(int fd, void *buf, size_t len)
{
    return RETRY(SYS3(__NR_read, fd, buf, len));
}

static inline long sys_write_all(int fd, const void *buf, size_t len)
{
    size_t done = 0;
    while (done < len) {
        long n = RETRY(SYS3(__NR_write, fd, (const char *)buf + done, len - done));
        if (n <= 0)
            return n < 0 ? n : -EIO;
        done += (size_t)n;
    }
    return (long)done;
}

/* Close (flags 0) or mark close-on-exec (CLOSE_RANGE_CLOEXEC_) fds first..last. */
static inline long sys_close_range(unsigned int first, unsigned int last, unsigned int flags)
{
    long r = SYS3(__NR_close_range, first, last, flags);
    if (r != -ENOSYS && r != -EINVAL)
        return r;
    /* Before Linux 5.9 (5.11 for the flag): one by one, to a bound nothing sane exceeds. */
    unsigned int end = last > 65535 ? 65535 : last;
    for (unsigned int fd = first; fd <= end; fd++) {
        if (flags)
            (void)SYS3(__NR_fcntl, fd, F_SETFD, FD_CLOEXEC);
        else
            (void)SYS1(__NR_close, fd);
    }
    return 0;
}

/* fd itself, or for one below 3 a close-on-exec copy above 2, the low number freed (it
 * was free before); an error (< 0) as it is. */
static inline long above_stdio(long fd)
{
    if (fd < 0 || fd > 2)
        return fd;
    long moved = SYS3(__NR_fcntl, fd, F_DUPFD_CLOEXEC, 3);
    (void)SYS1(__NR_close, fd);
    return moved;
}

#define RLIMIT_NOFILE_ 7 /* the same on x86_64 and aarch64 */

/* RLIMIT_NOFILE lowered to at most most (soft and hard), never raised; 0, or -errno. */
static inline long cap_open_files(uint64_t most)
{
    uint64_t limit[2]; /* struct rlimit64: soft, hard */
    long r = SYS4(__NR_prlimit64, 0, RLIMIT_NOFILE_, 0, limit);
    if (r < 0)
        return r;
    for (int i = 0; i < 2; i++)
        limit[i] = limit[i] < most ? limit[i] : most;
    return SYS4(__NR_prlimit64, 0, RLIMIT_NOFILE_, limit, 0);
}

/* The kernel's sigset is one word here (both architectures have 64 signals). */
typedef unsigned long ksigset_t;
#define KSIGBIT(sig) (1UL << ((sig) - 1))
#define KNSIG 64

static inline long sys_sigprocmask(int how, const ksigset_t *set, ksigset_t *old)
{
    return SYS4(__NR_rt_sigprocmask, how, set, old, sizeof(ksigset_t));
}

/* The rt_sigaction layout of x86_64 and arm64 alike (both have sa_restorer). */
struct ksigaction {
    void *handler;
    unsigned long flags;
    void *restorer;
    ksigset_t mask;
};

/* Every disposition back to default: a command never inherits an ignored signal. */
static inline void reset_signal_dispositions(void)
{
    struct ksigaction dfl = { 0 };
    for (int sig = 1; sig <= KNSIG; sig++) {
        if (sig != SIGKILL && sig != SIGSTOP)
            (void)SYS4(__NR_rt_sigaction, sig, &dfl, 0, sizeof(ksigset_t));
    }
}

/* The ABI's struct msghdr and cmsghdr (uapi headers do not carry them). */
struct kmsghdr {
    void *name;
    int namelen;
    struct iovec *iov;
    size_t iovlen;
    void *control;
    size_t controllen;
    unsigned int flags;
};
struct kcmsghdr {
    size_t len;
    int level;
    int type;
};
#define KCMSG_ALIGN(len) (((len) + sizeof(size_t) - 1) & ~(sizeof(size_t) - 1))
#define KCMSG_SPACE(len) (sizeof(struct kcmsghdr) + KCMSG_ALIGN(len))
#define KCMSG_DATA(c) ((unsigned char *)(c) + sizeof(struct kcmsghdr))
#define SOL_SOCKET_ 1
#define SCM_RIGHTS_ 1
#define MSG_CTRUNC_ 0x8
#define MSG_PEEK_ 0x2
#define MSG_DONTWAIT_ 0x40
#define MSG_CMSG_CLOEXEC_ 0x40000000


/* A non-negative decimal that fits an int, or -1. */
static inline long parse_unsigned(const char *text)
{
    long value = 0;
    if (!*text)
        return -1;
    for (; *text; text++) {
        if (*text < '0' || *text > '9' || value > (INT32_MAX - 9) / 10)
            return -1;
        value = value * 10 + (*text - '0');
    }
    return value;
}

/* The memory functions the compiler may emit calls to, and strlen/strchr/memchr. */
void *memcpy(void *dest, const void *src, size_t n);
void *memset(void *dest, int c, size_t n);
void *memmove(void *dest, const void *src, size_t n);
int memcmp(const void *a, const void *b, size_t n);
size_t strlen(const char *s);

/* The program's main, called by _start with the kernel's argc, argv and envp. */
int helper_main(int argc, char **argv, char **envp);

#endif
