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
#include <sys/socket.h>
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
#ifndef __NR_clone3
#define __NR_clone3 435
#endif
#ifndef __NR_open_tree
#define __NR_open_tree 428
#define __NR_move_mount 429
#define __NR_fsopen 430
#define __NR_fsconfig 431
#define __NR_fsmount 432
#define __NR_fspick 433
#endif
#ifndef __NR_mount_setattr
#define __NR_mount_setattr 442
#endif
#ifndef __NR_quotactl_fd
#define __NR_quotactl_fd 443
#endif
#ifndef __NR_set_mempolicy_home_node
#define __NR_set_mempolicy_home_node 450
#endif
#ifndef __O_TMPFILE
#define __O_TMPFILE 020000000
#endif

#define MAX_INSNS (NSC_SECCOMP_MAX_BYTES / sizeof(struct sock_filter))
/* The namespace flags of clone (whose low byte is the exit signal, so no CLONE_NEWTIME) and
 * of unshare. */
#define CLONE_NAMESPACES 0x7e020000u /* NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET */
#define UNSHARE_NAMESPACES (CLONE_NAMESPACES | 0x80u) /* and NEWTIME */
#define TIOCSTI_ 0x5412u
#define TIOCLINUX_ 0x541cu
#define TIOCSETD_ 0x5423u
#define PER_LINUX_ 0u
#define PER_LINUX32_ 8u
#define PERSONALITY_QUERY 0xffffffffu
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

/* nr returns on_match when the low 32 bits of argument arg equal one of values (n of them),
 * else otherwise. */
static void by_argument(struct program *p, unsigned int nr, int arg, const unsigned int *values,
                        unsigned char n, unsigned int on_match, unsigned int otherwise)
{
    emit(p, BPF_JMP | BPF_JEQ | BPF_K, 0, (unsigned char)(n + 3), nr);
    emit(p, BPF_LD | BPF_W | BPF_ABS, 0, 0, arg_low(arg));
    for (unsigned char i = 0; i < n; i++)
        emit(p, BPF_JMP | BPF_JEQ | BPF_K, (unsigned char)(n - i), 0, values[i]);
    ret(p, otherwise);
    ret(p, on_match);
}

/* nr fails with err when argument arg has any of the bits in mask. */
static void refuse_if_any_bit(struct program *p, unsigned int nr, int arg, unsigned int mask, int err)
{
    emit(p, BPF_JMP | BPF_JEQ | BPF_K, 0, 4, nr);
    emit(p, BPF_LD | BPF_W | BPF_ABS, 0, 0, arg_low(arg));
    emit(p, BPF_JMP | BPF_JSET | BPF_K, 0, 1, mask);
    ret(p, RET_ERRNO(err));
    ret(p, SECCOMP_RET_ALLOW);
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

/*
 * Kernel surface no session needs, modelled on flatpak's list: the keyrings (the launcher's
 * session keyring is already out of reach; this keeps a session from making its own), NUMA
 * policy, accounting, the kernel log, quotas, perf, bpf, userfaultfd (a classic exploit aid),
 * kexec and modules, and any personality but Linux's (which can turn off ASLR). clone3 gets
 * ENOSYS: its flags sit in a struct the filter cannot read, and libc falls back to clone. The
 * sandbox's pid 1 holds the exit status the launcher reads: no ptrace or process_vm_* of it
 * (the session's own programs stay debuggable; Landlock covers /proc/1/mem). Sockets: UNIX,
 * INET, INET6 and NETLINK only, by socket and socketpair alike. TIOCSTI and TIOCLINUX push input
 * into a terminal, TIOCSETD swaps its line discipline (N_NULL leaves the caller's terminal
 * dead); the request is compared on its low 32 bits, as the kernel reads it.
 */
static void kernel_rules(struct program *p)
{
    static const unsigned int pid_1[] = { 1 };
    static const unsigned int personalities[] = { PER_LINUX_, PER_LINUX32_, PERSONALITY_QUERY };
    static const unsigned int families[] = { AF_UNIX, AF_INET, AF_INET6, AF_NETLINK };
    static const unsigned int ioctls[] = { TIOCSTI_, TIOCLINUX_, TIOCSETD_ };
    static const unsigned int refused[] = {
        __NR_add_key, __NR_keyctl, __NR_request_key,
        __NR_mbind, __NR_get_mempolicy, __NR_set_mempolicy, __NR_migrate_pages,
        __NR_move_pages, __NR_set_mempolicy_home_node,
        __NR_acct, __NR_syslog, __NR_quotactl, __NR_quotactl_fd,
        __NR_perf_event_open, __NR_bpf, __NR_userfaultfd,
        __NR_kexec_load, __NR_kexec_file_load,
        __NR_init_module, __NR_finit_module, __NR_delete_module,
#ifdef __NR_uselib
        __NR_uselib,
#endif
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
        refuse(p, refused[i], EPERM);
    refuse(p, __NR_clone3, ENOSYS);
    const unsigned int allow = SECCOMP_RET_ALLOW, eperm = RET_ERRNO(EPERM);
    by_argument(p, __NR_personality, 0, personalities, 3, allow, eperm);
    by_argument(p, __NR_ptrace, 1, pid_1, 1, eperm, allow);
    by_argument(p, __NR_process_vm_readv, 0, pid_1, 1, eperm, allow);
    by_argument(p, __NR_process_vm_writev, 0, pid_1, 1, eperm, allow);
    /* A CPU limit on pid 1 kills it (and the status with it); its priority and CPUs are the
     * sandbox's own to keep (setpriority's who is its argument 1). */
    by_argument(p, __NR_prlimit64, 0, pid_1, 1, eperm, allow);
    by_argument(p, __NR_setpriority, 1, pid_1, 1, eperm, allow);
    by_argument(p, __NR_sched_setaffinity, 0, pid_1, 1, eperm, allow);
    by_argument(p, __NR_sched_setscheduler, 0, pid_1, 1, eperm, allow);
    by_argument(p, __NR_sched_setparam, 0, pid_1, 1, eperm, allow);
    by_argument(p, __NR_sched_setattr, 0, pid_1, 1, eperm, allow);
    by_argument(p, __NR_socket, 0, families, 4, allow, RET_ERRNO(EAFNOSUPPORT));
    by_argument(p, __NR_socketpair, 0, families, 4, allow, RET_ERRNO(EAFNOSUPPORT));
    by_argument(p, __NR_ioctl, 1, ioctls, 3, eperm, allow);
}

/*
 * No namespace of the session's own (bwrap's --disable-userns already stops new user
 * namespaces; without one the rest needs capabilities it lacks, so these are a second wall):
 * unshare and clone with a namespace flag, setns, the mount calls, and the new mount API
 * (ENOSYS, so that libc and tools fall back to mount(2), which fails plainly). A session
 * allowed nested user namespaces (a harness that runs bwrap itself) gets none of this.
 */
static void namespace_rules(struct program *p)
{
    static const unsigned int mount_calls[] = { __NR_mount, __NR_umount2, __NR_pivot_root,
                                                __NR_chroot, __NR_setns };
    static const unsigned int mount_api[] = { __NR_open_tree, __NR_move_mount, __NR_fsopen,
                                              __NR_fsconfig, __NR_fsmount, __NR_fspick,
                                              __NR_mount_setattr };
    for (size_t i = 0; i < sizeof mount_calls / sizeof mount_calls[0]; i++)
        refuse(p, mount_calls[i], EPERM);
    for (size_t i = 0; i < sizeof mount_api / sizeof mount_api[0]; i++)
        refuse(p, mount_api[i], ENOSYS);
    refuse_if_any_bit(p, __NR_unshare, 0, UNSHARE_NAMESPACES, EPERM);
    refuse_if_any_bit(p, __NR_clone, 0, CLONE_NAMESPACES, EPERM);
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
    if (rules & NSC_SECCOMP_KERNEL)
        kernel_rules(&p);
    if (rules & NSC_SECCOMP_NAMESPACES)
        namespace_rules(&p);
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
