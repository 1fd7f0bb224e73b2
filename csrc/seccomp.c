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
#include <linux/fs.h> /* RENAME_WHITEOUT */
#include <linux/seccomp.h>
#include <stddef.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/prctl.h>
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
#ifndef __NR_pidfd_getfd
#define __NR_pidfd_getfd 438
#endif
#ifndef __NR_process_madvise
#define __NR_process_madvise 440
#endif
#ifndef __NR_set_mempolicy_home_node
#define __NR_set_mempolicy_home_node 450
#endif
#ifndef __O_TMPFILE
#define __O_TMPFILE 020000000
#endif

#define MAX_INSNS (NSC_SECCOMP_MAX_BYTES / sizeof(struct sock_filter))
/* The namespace flags of clone (whose low byte is the exit signal, so no CLONE_NEWTIME). */
#define CLONE_NAMESPACES 0x7e020000u /* NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET */
#define TIOCSTI_ 0x5412u
#define TIOCLINUX_ 0x541cu
#define TIOCSETD_ 0x5423u
/* An fscrypt key: charged to the account's key quota, and kept by the file system past the
 * session (the keyring calls are refused for the same reason). */
#define FS_IOC_ADD_ENCRYPTION_KEY_ 0xc0506617u
/* A lease: every other open of the file, the host's own, waits for its holder up to
 * fs.lease-break-time (45 s), and a session owns its workspace's files, read-only binds too. */
#define F_SETLEASE_ 1024u
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

/* nr fails with err when argument arg has any bit of mask and argument arg2 any of mask2 (the
 * open family: the mode only counts when the flags create). */
static void refuse_if_both(struct program *p, unsigned int nr, int arg, unsigned int mask,
                           int arg2, unsigned int mask2, int err)
{
    emit(p, BPF_JMP | BPF_JEQ | BPF_K, 0, 6, nr);
    emit(p, BPF_LD | BPF_W | BPF_ABS, 0, 0, arg_low(arg));
    emit(p, BPF_JMP | BPF_JSET | BPF_K, 0, 3, mask);
    emit(p, BPF_LD | BPF_W | BPF_ABS, 0, 0, arg_low(arg2));
    emit(p, BPF_JMP | BPF_JSET | BPF_K, 0, 1, mask2);
    ret(p, RET_ERRNO(err));
    ret(p, SECCOMP_RET_ALLOW);
}

/* nr fails with err when the low 32 bits of argument arg are not value, or those of argument
 * arg2 are value2 (setpriority: only its own process's, and not pid 1's). */
static void refuse_unless_or_if(struct program *p, unsigned int nr, int arg, unsigned int value,
                                int arg2, unsigned int value2, int err)
{
    emit(p, BPF_JMP | BPF_JEQ | BPF_K, 0, 7, nr);
    emit(p, BPF_LD | BPF_W | BPF_ABS, 0, 0, arg_low(arg));
    emit(p, BPF_JMP | BPF_JEQ | BPF_K, 1, 0, value);
    ret(p, RET_ERRNO(err));
    emit(p, BPF_LD | BPF_W | BPF_ABS, 0, 0, arg_low(arg2));
    emit(p, BPF_JMP | BPF_JEQ | BPF_K, 0, 1, value2);
    ret(p, RET_ERRNO(err));
    ret(p, SECCOMP_RET_ALLOW);
}

/* nr fails with err when the low 32 bits of argument arg are value, and those of argument arg2,
 * masked with mask, are one of values (n of them): a socket of one family and type, an option
 * of one level. Unlike the blocks above, one whose arguments do not match goes on to the next
 * rule, the number loaded again: a call may have several such rules, before its last. */
static void refuse_if_arg_and_masked(struct program *p, unsigned int nr, int arg,
                                     unsigned int value, int arg2, unsigned int mask,
                                     const unsigned int *values, unsigned char n, int err)
{
    emit(p, BPF_JMP | BPF_JEQ | BPF_K, 0, (unsigned char)(n + 6), nr);
    emit(p, BPF_LD | BPF_W | BPF_ABS, 0, 0, arg_low(arg));
    emit(p, BPF_JMP | BPF_JEQ | BPF_K, 0, (unsigned char)(n + 3), value);
    emit(p, BPF_LD | BPF_W | BPF_ABS, 0, 0, arg_low(arg2));
    emit(p, BPF_ALU | BPF_AND | BPF_K, 0, 0, mask);
    for (unsigned char i = 0; i < n; i++)
        emit(p, BPF_JMP | BPF_JEQ | BPF_K, (unsigned char)(n - 1 - i), i == n - 1 ? 1 : 0,
             values[i]);
    ret(p, RET_ERRNO(err));
    emit(p, BPF_LD | BPF_W | BPF_ABS, 0, 0, offsetof(struct seccomp_data, nr));
}

/* socket or socketpair (nr) fails with err when its family is family, its type masked with
 * mask is type (any type, for a mask of 0: then it is not read), and its protocol none of
 * values (n of them); else the next rule is looked at. */
static void refuse_socket_protocols(struct program *p, unsigned int nr, unsigned int family,
                                    unsigned int mask, unsigned int type,
                                    const unsigned int *values, unsigned char n, int err)
{
    unsigned char typed = mask ? 3 : 0; /* the type's load, mask and test */
    emit(p, BPF_JMP | BPF_JEQ | BPF_K, 0, (unsigned char)(n + 5 + typed), nr);
    emit(p, BPF_LD | BPF_W | BPF_ABS, 0, 0, arg_low(0));
    emit(p, BPF_JMP | BPF_JEQ | BPF_K, 0, (unsigned char)(n + 2 + typed), family);
    if (typed) {
        emit(p, BPF_LD | BPF_W | BPF_ABS, 0, 0, arg_low(1));
        emit(p, BPF_ALU | BPF_AND | BPF_K, 0, 0, mask);
        emit(p, BPF_JMP | BPF_JEQ | BPF_K, 0, (unsigned char)(n + 2), type);
    }
    emit(p, BPF_LD | BPF_W | BPF_ABS, 0, 0, arg_low(2));
    for (unsigned char i = 0; i < n; i++) /* one of values: on to the next rule */
        emit(p, BPF_JMP | BPF_JEQ | BPF_K, (unsigned char)(n - i), 0, values[i]);
    ret(p, RET_ERRNO(err));
    emit(p, BPF_LD | BPF_W | BPF_ABS, 0, 0, offsetof(struct seccomp_data, nr));
}

/* The rules, in the order the filter checks them. SYSCALL(name) gives the name (as libseccomp
 * and the OCI runtime spec spell it) and its number on this architecture. */
#define SYSCALL(name) #name, __NR_##name
#define ALWAYS(group, name, err) { SYSCALL(name), group, err, NSC_RULE_ALWAYS, 0, 0, 0, { 0 } }
#define ANY_BIT(group, name, arg, mask, err) \
    { SYSCALL(name), group, err, NSC_RULE_ANY_BIT, arg, 0, 1, { mask } }
#define SETID_MODE(name, arg) ANY_BIT(NSC_SECCOMP_SETID, name, arg, SETID_BITS, EPERM)
/* mknod's mode: set-id bits, or a device's type (S_IFCHR's bit, which S_IFBLK holds too, and
 * S_IFLNK, which mknod refuses anyway; not S_IFIFO, S_IFSOCK or S_IFREG). In the SETID group,
 * as renameat2's whiteout: what the session leaves in its files that the host then trusts. */
#define NODE_MODE(name, arg) ANY_BIT(NSC_SECCOMP_SETID, name, arg, SETID_BITS | S_IFCHR, EPERM)
#define SETID_CREATE(name, flags_arg, mode_arg)                                          \
    { SYSCALL(name), NSC_SECCOMP_SETID, EPERM, NSC_RULE_BOTH_ANY_BIT, flags_arg, mode_arg, 2, \
      { O_CREAT | __O_TMPFILE, SETID_BITS } }
#define ARG_IN(group, name, arg, err, n, ...) \
    { SYSCALL(name), group, err, NSC_RULE_ARG_IN, arg, 0, n, { __VA_ARGS__ } }
#define ARG_NOT_IN(group, name, arg, err, n, ...) \
    { SYSCALL(name), group, err, NSC_RULE_ARG_NOT_IN, arg, 0, n, { __VA_ARGS__ } }
#define KERNEL NSC_SECCOMP_KERNEL
#define NAMESPACES NSC_SECCOMP_NAMESPACES
#define PID_1(name, arg) ARG_IN(KERNEL, name, arg, EPERM, 1, 1)
#define FAMILIES(name) \
    ARG_NOT_IN(KERNEL, name, 0, EAFNOSUPPORT, 4, AF_UNIX, AF_INET, AF_INET6, AF_NETLINK)
#define ARG_IS_AND_MASKED(group, name, arg, value, arg2, mask, err, n, ...)                    \
    { SYSCALL(name), group, err, NSC_RULE_ARG_IS_AND_ARG2_MASKED_IN, arg, arg2, (n) + 2,        \
      { value, mask, __VA_ARGS__ } }
#define SOCKET_OPTIONS(...) ARG_IS_AND_MASKED(KERNEL, setsockopt, 1, SOL_SOCKET, 2, ~0u, EPERM, 2, \
                                              __VA_ARGS__)
/* Within a family the filter allows, the types and protocols programs use: for another the
 * kernel finds no protocol of its own and loads a module for it (modprobe, run as root on the
 * host), before any permission is checked: SCTP, DCCP (SOCK_DCCP, protocol 0), L2TP; netlink's
 * generic family, whose own families load by name, its crypto and netfilter ones. INET and
 * INET6: a stream of the default protocol, TCP or MPTCP (built in, never a module); a datagram
 * of the default, UDP or that family's ICMP (ping); a raw socket of any (it takes every
 * protocol, and only with CAP_NET_RAW). NETLINK: routing (getifaddrs) and uevents (udev). Not
 * socket diagnostics (ss), which load a family's diag module, and with it the family (TIPC,
 * vsock), by number. */
#define SOCK_TYPE_MASK 0xfu /* the type, without SOCK_NONBLOCK and SOCK_CLOEXEC */
#define INET_TYPES(name, family)                                                              \
    ARG_IS_AND_MASKED(KERNEL, name, 0, family, 1, SOCK_TYPE_MASK, EPERM, 13, 0, 4, 5, 6, 7, 8, \
                      9, 10, 11, 12, 13, 14, 15)
#define TYPE_PROTOCOLS(name, family, type, n, ...)                                          \
    { SYSCALL(name), KERNEL, EPERM, NSC_RULE_SOCKET_TYPE_PROTOCOLS, 0, 1, (n) + 3,          \
      { family, SOCK_TYPE_MASK, type, __VA_ARGS__ } }
#define INET_PROTOCOLS(name)                                                                \
    INET_TYPES(name, AF_INET), TYPE_PROTOCOLS(name, AF_INET, SOCK_STREAM, 3, 0, 6, 262),    \
        TYPE_PROTOCOLS(name, AF_INET, SOCK_DGRAM, 3, 0, 17, 1), INET_TYPES(name, AF_INET6), \
        TYPE_PROTOCOLS(name, AF_INET6, SOCK_STREAM, 3, 0, 6, 262),                          \
        TYPE_PROTOCOLS(name, AF_INET6, SOCK_DGRAM, 3, 0, 17, 58)
#define NETLINK_PROTOCOLS(name) /* of any type: netlink loads no module by its type */ \
    { SYSCALL(name), KERNEL, EPERM, NSC_RULE_SOCKET_TYPE_PROTOCOLS, 0, 1, 5, { AF_NETLINK, 0, 0, 0, 15 } }
/* Socket ioctls that load 8021q or bridge before their own capability check. */
#define SIOCGIFBR_ 0x8940u
#define SIOCSIFBR_ 0x8941u
#define SIOCGIFVLAN_ 0x8982u
#define SIOCSIFVLAN_ 0x8983u
#define SIOCBRADDBR_ 0x89a0u
#define SIOCBRDELBR_ 0x89a1u
#define SIOCBRADDIF_ 0x89a2u /* (handled in sock_ioctl, as the above, since 6.15) */
#define SIOCBRDELIF_ 0x89a3u
/* TCP options that allocate a hash by its name (crypto-NAME): MD5 signatures, TCP-AO keys. */
#define IPPROTO_TCP_ 6u
#define TCP_MD5SIG_ 14u
#define TCP_MD5SIG_EXT_ 32u
#define TCP_AO_ADD_KEY_ 38u
#define DATAGRAMS(family)                                                                  \
    ARG_IS_AND_MASKED(NSC_SECCOMP_OWN_NETWORK, socket, 0, family, 1, SOCK_TYPE_MASK, EPERM, 1, \
                      SOCK_DGRAM)

/*
 * SETID. A file the session leaves with a set-id bit keeps it on the host, where the mount has
 * no nosuid: any local user running it becomes the session's user. Every call that can set the
 * bit on a file is covered; io_uring (which can create files with its own opcodes, out of the
 * filter's sight) and openat2 (whose mode sits in a struct the filter cannot read; ENOSYS, so
 * callers fall back to openat) are refused whole. mq_open: a queue file, copied up by an
 * overlay. Nor a device node: the one mknod makes without a capability, a character device
 * 0:0, is an overlay's whiteout to the host's tools, and its cp -a and rsync -a carry it;
 * renameat2's RENAME_WHITEOUT leaves one where the name was, also without a capability.
 *
 * KERNEL. Kernel surface no session needs, what flatpak's list and Docker's default profile
 * refuse (README, "Kernel layers", compares them call by call): the keyrings (the launcher's
 * session keyring is already out of reach; this keeps a session from making its own), NUMA
 * policy, accounting, the kernel log, quotas, perf, bpf, userfaultfd (a classic exploit aid),
 * kexec and modules, and any personality but Linux's (which can turn off ASLR); modify_ldt
 * (CVE-2015-5157, CVE-2017-17053: only 16-bit code and Wine need it), the port I/O calls, the
 * obsolete ustat, sysfs and _sysctl (which wrote sysctls past a read-only /proc/sys), the
 * clocks, reboot, swap, vhangup, lookup_dcookie, and the calls that reach into another
 * process or a file by handle past the path checks: kcmp, pidfd_getfd, process_madvise,
 * open_by_handle_at, fanotify_init. Most need a capability the session lacks: these are a
 * second wall. ptrace and process_vm_* stay (gdb and strace need them; Docker allows them).
 * clone3 gets ENOSYS: its flags sit in a struct the filter cannot read, and libc falls back to
 * clone. The sandbox's pid 1 holds the exit status the launcher reads: no ptrace or
 * process_vm_* of it (the session's own programs stay debuggable; Landlock covers
 * /proc/1/mem); a CPU limit on pid 1 kills it (and the status with it), and its priority and
 * CPUs are the sandbox's own to keep (setpriority's who is its argument 1). Sockets: UNIX,
 * INET, INET6 and NETLINK only, by socket and socketpair alike. Memory one count for the whole
 * host, which one session could take: socket filters (each JIT-compiled into the host's
 * budget for unprivileged programs, net.core.bpf_jit_limit: one session filled it, and every
 * later launch's own filter failed) and io_setup (one call took fs.aio-max-nr, the host's
 * whole); and, on a network of the session's own (OWN_NETWORK: none, proxy), UDP, whose
 * buffers are one count for the host (net.ipv4.udp_mem: past it, every UDP socket on the
 * host drops what it gets). TIOCSTI and TIOCLINUX push
 * input into a terminal, TIOCSETD swaps its line discipline (N_NULL leaves the caller's
 * terminal dead); the request is compared on its low 32 bits, as the kernel reads it.
 *
 * NAMESPACES. No namespace of the session's own (bwrap's --disable-userns already stops new
 * user namespaces; without one the rest needs capabilities it lacks, so these are a second
 * wall): unshare (whole, as flatpak and Docker refuse it: its other flags are used by no
 * named workload) and clone with a namespace flag, setns, the mount calls, the new mount API
 * (ENOSYS, so that libc and tools fall back to mount(2), which fails plainly), and the host
 * and domain names (a nested bwrap's --hostname sets them in its own UTS namespace). Nor a
 * seccomp filter of its own: each is JIT-compiled into the host's budget for unprivileged
 * programs (net.core.bpf_jit_limit), and a session's processes, each stacking filters up to
 * the kernel's 32,768 instructions, took 300 MiB of its 504. A session allowed nested user
 * namespaces (a harness that sandboxes its own tools, with bwrap and seccomp) gets none of
 * this.
 */
static const struct nsc_seccomp_rule RULES[] = {
    SETID_MODE(fchmod, 1),
    SETID_MODE(fchmodat, 2),
    SETID_MODE(fchmodat2, 2),
    NODE_MODE(mknodat, 2),
    ANY_BIT(NSC_SECCOMP_SETID, renameat2, 4, RENAME_WHITEOUT, EPERM),
    SETID_CREATE(openat, 2, 3),
    SETID_CREATE(mq_open, 1, 2),
#ifdef __NR_chmod /* the legacy calls that aarch64 never had */
    SETID_MODE(chmod, 1),
    SETID_MODE(creat, 1),
    NODE_MODE(mknod, 1),
    SETID_CREATE(open, 1, 2),
#endif
    ALWAYS(NSC_SECCOMP_SETID, openat2, ENOSYS),
    ALWAYS(NSC_SECCOMP_SETID, io_uring_setup, EPERM),
    ALWAYS(NSC_SECCOMP_SETID, io_uring_enter, EPERM),
    ALWAYS(NSC_SECCOMP_SETID, io_uring_register, EPERM),

    ALWAYS(KERNEL, add_key, EPERM),
    ALWAYS(KERNEL, keyctl, EPERM),
    ALWAYS(KERNEL, request_key, EPERM),
    ALWAYS(KERNEL, mbind, EPERM),
    ALWAYS(KERNEL, get_mempolicy, EPERM),
    ALWAYS(KERNEL, set_mempolicy, EPERM),
    ALWAYS(KERNEL, migrate_pages, EPERM),
    ALWAYS(KERNEL, move_pages, EPERM),
    ALWAYS(KERNEL, set_mempolicy_home_node, EPERM),
    ALWAYS(KERNEL, acct, EPERM),
    ALWAYS(KERNEL, syslog, EPERM),
    ALWAYS(KERNEL, quotactl, EPERM),
    ALWAYS(KERNEL, quotactl_fd, EPERM),
    ALWAYS(KERNEL, perf_event_open, EPERM),
    ALWAYS(KERNEL, bpf, EPERM),
    ALWAYS(KERNEL, userfaultfd, EPERM),
    ALWAYS(KERNEL, kexec_load, EPERM),
    ALWAYS(KERNEL, kexec_file_load, EPERM),
    ALWAYS(KERNEL, init_module, EPERM),
    ALWAYS(KERNEL, finit_module, EPERM),
    ALWAYS(KERNEL, delete_module, EPERM),
#ifdef __NR_uselib
    ALWAYS(KERNEL, uselib, EPERM),
#endif
    ALWAYS(KERNEL, clone3, ENOSYS),
#ifdef __NR_modify_ldt /* x86's */
    ALWAYS(KERNEL, modify_ldt, EPERM),
    ALWAYS(KERNEL, iopl, EPERM),
    ALWAYS(KERNEL, ioperm, EPERM),
#endif
#ifdef __NR_ustat /* the obsolete calls that aarch64 never had */
    ALWAYS(KERNEL, ustat, EPERM),
    ALWAYS(KERNEL, sysfs, EPERM),
    ALWAYS(KERNEL, _sysctl, EPERM),
#endif
    ALWAYS(KERNEL, settimeofday, EPERM),
    ALWAYS(KERNEL, clock_settime, EPERM),
    ALWAYS(KERNEL, reboot, EPERM),
    ALWAYS(KERNEL, swapon, EPERM),
    ALWAYS(KERNEL, swapoff, EPERM),
    ALWAYS(KERNEL, vhangup, EPERM),
    ALWAYS(KERNEL, lookup_dcookie, EPERM),
    ALWAYS(KERNEL, kcmp, EPERM),
    ALWAYS(KERNEL, pidfd_getfd, EPERM),
    ALWAYS(KERNEL, process_madvise, EPERM),
    ALWAYS(KERNEL, open_by_handle_at, EPERM),
    ALWAYS(KERNEL, fanotify_init, EPERM),
    ARG_NOT_IN(KERNEL, personality, 0, EPERM, 3, PER_LINUX_, PER_LINUX32_, PERSONALITY_QUERY),
    PID_1(ptrace, 1),
    PID_1(process_vm_readv, 0),
    PID_1(process_vm_writev, 0),
    PID_1(prlimit64, 0),
    /* setpriority of a whole process group or user (which 1 or 2, who 0: the caller's own)
     * renices pid 1 as well: only a process's own, and never pid 1's. */
    { SYSCALL(setpriority), KERNEL, EPERM, NSC_RULE_ARG_NOT_OR_ARG2_IN, 0, 1, 2, { 0, 1 } },
    /* ioprio_set alike (IOPRIO_WHO_PROCESS is 1). */
    { SYSCALL(ioprio_set), KERNEL, EPERM, NSC_RULE_ARG_NOT_OR_ARG2_IN, 0, 1, 2, { 1, 1 } },
    PID_1(sched_setaffinity, 0),
    PID_1(sched_setscheduler, 0),
    PID_1(sched_setparam, 0),
    PID_1(sched_setattr, 0),
    DATAGRAMS(AF_INET), /* before FAMILIES(socket), which ends socket's rules */
    DATAGRAMS(AF_INET6),
    INET_PROTOCOLS(socket),
    NETLINK_PROTOCOLS(socket),
    FAMILIES(socket),
    INET_PROTOCOLS(socketpair), /* (the kernel makes the socket, then refuses the pair) */
    NETLINK_PROTOCOLS(socketpair),
    FAMILIES(socketpair),
    SOCKET_OPTIONS(SO_ATTACH_FILTER, SO_ATTACH_BPF),
    SOCKET_OPTIONS(SO_ATTACH_REUSEPORT_CBPF, SO_ATTACH_REUSEPORT_EBPF),
    ARG_IS_AND_MASKED(KERNEL, setsockopt, 1, IPPROTO_TCP_, 2, ~0u, EPERM, 3, TCP_MD5SIG_,
                      TCP_MD5SIG_EXT_, TCP_AO_ADD_KEY_),
    ALWAYS(KERNEL, io_setup, ENOSYS),
    /* the shim's probe (nsconfine.h): the request on fd -1, before ioctl's last rule */
    ARG_IS_AND_MASKED(KERNEL, ioctl, 1, NSC_SECCOMP_PROBE_REQUEST, 0, ~0u, ENOTRECOVERABLE, 1,
                      0xffffffffu),
    ARG_IN(KERNEL, ioctl, 1, EPERM, 12, TIOCSTI_, TIOCLINUX_, TIOCSETD_, SIOCGIFBR_, SIOCSIFBR_,
           SIOCGIFVLAN_, SIOCSIFVLAN_, SIOCBRADDBR_, SIOCBRDELBR_, SIOCBRADDIF_, SIOCBRDELIF_,
           FS_IOC_ADD_ENCRYPTION_KEY_),
    ARG_IN(KERNEL, fcntl, 1, EPERM, 1, F_SETLEASE_),

    ALWAYS(NAMESPACES, mount, EPERM),
    ALWAYS(NAMESPACES, umount2, EPERM),
    ALWAYS(NAMESPACES, pivot_root, EPERM),
    ALWAYS(NAMESPACES, chroot, EPERM),
    ALWAYS(NAMESPACES, setns, EPERM),
    ALWAYS(NAMESPACES, open_tree, ENOSYS),
    ALWAYS(NAMESPACES, move_mount, ENOSYS),
    ALWAYS(NAMESPACES, fsopen, ENOSYS),
    ALWAYS(NAMESPACES, fsconfig, ENOSYS),
    ALWAYS(NAMESPACES, fsmount, ENOSYS),
    ALWAYS(NAMESPACES, fspick, ENOSYS),
    ALWAYS(NAMESPACES, mount_setattr, ENOSYS),
    ALWAYS(NAMESPACES, sethostname, EPERM),
    ALWAYS(NAMESPACES, setdomainname, EPERM),
    ALWAYS(NAMESPACES, unshare, EPERM),
    /* A seccomp filter of the session's own: EINVAL, as a kernel without seccomp filters
     * answers (sandboxers then run without one). */
    ARG_IN(NAMESPACES, seccomp, 0, EINVAL, 1, SECCOMP_SET_MODE_FILTER),
    ARG_IS_AND_MASKED(NAMESPACES, prctl, 0, PR_SET_SECCOMP, 1, ~0u, EINVAL, 1,
                      SECCOMP_MODE_FILTER),
    ANY_BIT(NAMESPACES, clone, 0, CLONE_NAMESPACES, EPERM),
};

#define N_RULES (sizeof RULES / sizeof RULES[0])

static void emit_rule(struct program *p, const struct nsc_seccomp_rule *r)
{
    unsigned int nr = (unsigned int)r->nr, fail = RET_ERRNO(r->err);
    switch (r->when) {
    case NSC_RULE_ALWAYS:
        refuse(p, nr, r->err);
        break;
    case NSC_RULE_ARG_IN:
        by_argument(p, nr, r->arg, r->values, (unsigned char)r->n_values, fail, SECCOMP_RET_ALLOW);
        break;
    case NSC_RULE_ARG_NOT_IN:
        by_argument(p, nr, r->arg, r->values, (unsigned char)r->n_values, SECCOMP_RET_ALLOW, fail);
        break;
    case NSC_RULE_ANY_BIT:
        refuse_if_any_bit(p, nr, r->arg, r->values[0], r->err);
        break;
    case NSC_RULE_BOTH_ANY_BIT:
        refuse_if_both(p, nr, r->arg, r->values[0], r->arg2, r->values[1], r->err);
        break;
    case NSC_RULE_ARG_NOT_OR_ARG2_IN:
        refuse_unless_or_if(p, nr, r->arg, r->values[0], r->arg2, r->values[1], r->err);
        break;
    case NSC_RULE_ARG_IS_AND_ARG2_MASKED_IN:
        refuse_if_arg_and_masked(p, nr, r->arg, r->values[0], r->arg2, r->values[1],
                                 r->values + 2, (unsigned char)(r->n_values - 2), r->err);
        break;
    case NSC_RULE_SOCKET_TYPE_PROTOCOLS:
        refuse_socket_protocols(p, nr, r->values[0], r->values[1], r->values[2], r->values + 3,
                                (unsigned char)(r->n_values - 3), r->err);
        break;
    default:
        p->overflow = 1; /* a rule this generator cannot emit: refuse to build a filter */
    }
}

int nsc_seccomp_rules(unsigned int rules, struct nsc_seccomp_rule *out, size_t cap,
                      size_t *n_out)
{
    size_t n = 0;
    for (size_t i = 0; i < N_RULES; i++) {
        if (!(RULES[i].group & rules))
            continue;
        if (n == cap)
            return ENOSPC;
        out[n++] = RULES[i];
    }
    *n_out = n;
    return 0;
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
    for (size_t i = 0; i < N_RULES; i++)
        if (RULES[i].group & rules)
            emit_rule(&p, &RULES[i]);
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
