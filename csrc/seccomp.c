/*
 * The seccomp filter every session runs under, as classic BPF that bwrap loads
 * (--seccomp FD) in the sandbox's pid 1 and in the command, after its own set-up.
 *
 * Layout: check the architecture (anything but the native one is killed: a
 * 64-bit process may still enter through the i386 or x32 tables, whose numbers
 * mean other calls), load the syscall number, then one small block per rule,
 * each ending in its own return, and ALLOW at the end. A block that does not
 * match jumps over itself with the number still in the accumulator, so the
 * number is loaded once.
 */
#include "nsconfine.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#if defined(__x86_64__)
#define NATIVE_ARCH AUDIT_ARCH_X86_64
#define X32_SYSCALL_BIT 0x40000000u
#elif defined(__aarch64__)
#define NATIVE_ARCH AUDIT_ARCH_AARCH64
#endif

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the argument offsets below assume a little-endian machine"
#endif

/* Numbers newer than some build hosts' headers: the same on x86_64 and aarch64. */
#ifndef __NR_io_uring_setup
#define __NR_io_uring_setup 425
#define __NR_io_uring_enter 426
#define __NR_io_uring_register 427
#endif
#ifndef __NR_openat2
#define __NR_openat2 437
#endif
#ifndef __NR_fchmodat2
#define __NR_fchmodat2 452
#endif
#ifndef __O_TMPFILE
#define __O_TMPFILE 020000000
#endif

#define MAX_INSNS (NSC_SECCOMP_MAX_BYTES / sizeof(struct sock_filter))
#define SETID_BITS (S_ISUID | S_ISGID)
#define RET_ERRNO(e) (SECCOMP_RET_ERRNO | ((e) & SECCOMP_RET_DATA))

struct program {
    struct sock_filter insns[MAX_INSNS];
    size_t n;
    int overflow;
};

static void emit(struct program *p, unsigned short code, unsigned char jt, unsigned char jf,
                 unsigned int k)
{
    if (p->n == MAX_INSNS) {
        p->overflow = 1;
        return;
    }
    p->insns[p->n++] = (struct sock_filter)BPF_JUMP(code, k, jt, jf);
}

/* The low 32 bits of argument i (modes, flags and request numbers are 32-bit). */
static unsigned int arg_low(int i)
{
    return (unsigned int)(offsetof(struct seccomp_data, args) + 8 * (size_t)i);
}

static void ret(struct program *p, unsigned int value)
{
    emit(p, BPF_RET | BPF_K, 0, 0, value);
}

/* nr fails with err, whatever its arguments. */
static void refuse(struct program *p, unsigned int nr, int err)
{
    emit(p, BPF_JMP | BPF_JEQ | BPF_K, 0, 1, nr);
    ret(p, RET_ERRNO(err));
}

/* nr fails with EPERM when argument mode_arg asks for a set-user-ID or set-group-ID bit. */
static void refuse_setid_mode(struct program *p, unsigned int nr, int mode_arg)
{
    emit(p, BPF_JMP | BPF_JEQ | BPF_K, 0, 4, nr);
    emit(p, BPF_LD | BPF_W | BPF_ABS, 0, 0, arg_low(mode_arg));
    emit(p, BPF_JMP | BPF_JSET | BPF_K, 0, 1, SETID_BITS);
    ret(p, RET_ERRNO(EPERM));
    ret(p, SECCOMP_RET_ALLOW);
}

/* As refuse_setid_mode, for the open family: the mode only counts when the flags create. */
static void refuse_setid_create(struct program *p, unsigned int nr, int flags_arg, int mode_arg)
{
    emit(p, BPF_JMP | BPF_JEQ | BPF_K, 0, 6, nr);
    emit(p, BPF_LD | BPF_W | BPF_ABS, 0, 0, arg_low(flags_arg));
    emit(p, BPF_JMP | BPF_JSET | BPF_K, 0, 3, O_CREAT | __O_TMPFILE);
    emit(p, BPF_LD | BPF_W | BPF_ABS, 0, 0, arg_low(mode_arg));
    emit(p, BPF_JMP | BPF_JSET | BPF_K, 0, 1, SETID_BITS);
    ret(p, RET_ERRNO(EPERM));
    ret(p, SECCOMP_RET_ALLOW);
}

/*
 * A file the session leaves with a set-id bit keeps it on the host, where the
 * mount has no nosuid: any local user running it becomes the session's user.
 * Every call that can set the bit on a file is covered; io_uring (which can
 * create files with its own opcodes, out of the filter's sight) and openat2
 * (whose mode sits in a struct the filter cannot read; ENOSYS, so callers fall
 * back to openat) are refused whole.
 */
static void setid_rules(struct program *p)
{
    refuse_setid_mode(p, __NR_fchmod, 1);
    refuse_setid_mode(p, __NR_fchmodat, 2);
    refuse_setid_mode(p, __NR_fchmodat2, 2);
    refuse_setid_mode(p, __NR_mknodat, 2);
    refuse_setid_create(p, __NR_openat, 2, 3);
    refuse_setid_create(p, __NR_mq_open, 1, 2); /* a queue file, copied up by an overlay */
#ifdef __NR_chmod /* the legacy calls that aarch64 never had */
    refuse_setid_mode(p, __NR_chmod, 1);
    refuse_setid_mode(p, __NR_creat, 1);
    refuse_setid_mode(p, __NR_mknod, 1);
    refuse_setid_create(p, __NR_open, 1, 2);
#endif
    refuse(p, __NR_openat2, ENOSYS);
    refuse(p, __NR_io_uring_setup, EPERM);
    refuse(p, __NR_io_uring_enter, EPERM);
    refuse(p, __NR_io_uring_register, EPERM);
}

int nsc_seccomp_filter(unsigned int rules, unsigned char *out, size_t cap, size_t *len_out,
                       int *stage_out)
{
    *len_out = 0;
    *stage_out = NSC_STAGE_NONE;
#ifndef NATIVE_ARCH
    (void)rules;
    (void)out;
    (void)cap;
    *stage_out = NSC_STAGE_FILTER;
    return ENOSYS;
#else
    struct program p; /* 8 KiB on the caller's stack: threads may build filters at once */
    memset(&p, 0, sizeof p);
    emit(&p, BPF_LD | BPF_W | BPF_ABS, 0, 0, offsetof(struct seccomp_data, arch));
    emit(&p, BPF_JMP | BPF_JEQ | BPF_K, 1, 0, NATIVE_ARCH);
    ret(&p, SECCOMP_RET_KILL_PROCESS);
    emit(&p, BPF_LD | BPF_W | BPF_ABS, 0, 0, offsetof(struct seccomp_data, nr));
#ifdef X32_SYSCALL_BIT
    emit(&p, BPF_JMP | BPF_JGE | BPF_K, 0, 1, X32_SYSCALL_BIT);
    ret(&p, SECCOMP_RET_KILL_PROCESS);
#endif
    if (rules & NSC_SECCOMP_SETID)
        setid_rules(&p);
    ret(&p, SECCOMP_RET_ALLOW);
    size_t bytes = p.n * sizeof p.insns[0];
    if (p.overflow || bytes > cap) {
        *stage_out = NSC_STAGE_FILTER;
        return ENOSPC;
    }
    memcpy(out, p.insns, bytes);
    *len_out = bytes;
    return 0;
#endif
}
