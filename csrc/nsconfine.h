/*
 * The contract between nsconfine's C layer and nsconfine/_kernel/syscalls.py.
 * Everything inside the include guard but the #include is fed to cffi's cdef,
 * so it holds only plain prototypes and integer #defines.
 *
 * Every function returns 0 or a positive errno, and on failure writes the
 * step that failed into *stage_out (NSC_STAGE_NONE on success).
 */
#ifndef NSCONFINE_H
#define NSCONFINE_H

#include <stddef.h>

#define NSC_STAGE_NONE 0
#define NSC_STAGE_PIPE 1        /* pipe2 for an error pipe */
#define NSC_STAGE_CLONE 2       /* clone (spawn) or fork (probe) */
#define NSC_STAGE_PDEATHSIG 3   /* prctl(PR_SET_PDEATHSIG) */
#define NSC_STAGE_PARENT_DIED 4 /* getppid() changed before PDEATHSIG took: ESRCH */
#define NSC_STAGE_DUP 5         /* fcntl(F_DUPFD_CLOEXEC) / dup2 of an fd into place */
#define NSC_STAGE_CLOSE 6       /* close_range(CLOSE_RANGE_CLOEXEC) */
#define NSC_STAGE_SIGNALS 7     /* sigprocmask */
#define NSC_STAGE_EXEC 8        /* execve */
#define NSC_STAGE_MEMFD 9       /* memfd_create */
#define NSC_STAGE_WRITE 10      /* write into the memfd */
#define NSC_STAGE_SEAL 11       /* fcntl(F_ADD_SEALS) */
#define NSC_STAGE_SEEK 12       /* lseek back to 0 */
#define NSC_STAGE_UNSHARE 13    /* unshare(CLONE_NEWUSER) */
#define NSC_STAGE_SETGROUPS 14  /* write "deny" to /proc/self/setgroups */
#define NSC_STAGE_UID_MAP 15    /* write /proc/self/uid_map */
#define NSC_STAGE_GID_MAP 16    /* write /proc/self/gid_map */
#define NSC_STAGE_WAIT 17       /* waitpid */
#define NSC_STAGE_SETPGID 18    /* setpgid(0, 0) */
#define NSC_STAGE_DROP_GROUPS 19 /* setgroups(0, NULL) */
#define NSC_STAGE_SETGID 20     /* setresgid */
#define NSC_STAGE_SETUID 21     /* setresuid */
#define NSC_STAGE_CHECK_IDS 22  /* the ids after the drop are not the ones asked for: EPERM */
#define NSC_STAGE_CAPS 23       /* clearing or checking capabilities */
#define NSC_STAGE_NO_NEW_PRIVS 24 /* prctl(PR_SET_NO_NEW_PRIVS) */
#define NSC_STAGE_KEYRING 25    /* keyctl(KEYCTL_JOIN_SESSION_KEYRING) */
#define NSC_STAGE_FILTER 26     /* building the seccomp filter: ENOSPC, or ENOSYS off x86_64/aarch64 */
/* The reaper's steps for a session's limits (csrc/reaper.c), reported on its info fd. */
#define NSC_STAGE_SESSION_NS 29 /* unshare(CLONE_NEWUSER | CLONE_NEWNS) for the session's limits */
#define NSC_STAGE_DEVPTS 30     /* mount the session's own devpts at /dev/pts */
#define NSC_STAGE_INOTIFY 31    /* write that namespace's /proc/sys/user/max_inotify_* */
#define NSC_STAGE_NPROC 32      /* prlimit(RLIMIT_NPROC) */
#define NSC_STAGE_IPC_NS 33     /* unshare(CLONE_NEWUSER), its maps, unshare(CLONE_NEWIPC) */
#define NSC_STAGE_IPC_LIMITS 34 /* write that IPC namespace's /proc/sys/kernel/{shm,sem,msg}* */
#define NSC_STAGE_TMPFS 35      /* mount the session's sized tmpfs at /dev/shm/<i> */
#define NSC_STAGE_PRIVATE 36    /* make the session's mount namespace's mounts private */
#define NSC_STAGE_FAIR_SHARE 37 /* a default share: fair_share() in nsconfine.c */

/* At most this many fds after 0-2 (a plan's copied files each take one). */
#define NSC_MAX_PASS_FDS 65536

/* What nsc_spawn's child does before execve, in this order (see nsconfine.c). */
#define NSC_SPAWN_NEW_PGRP 1      /* setpgid(0, 0): the terminal's signals do not reach it */
#define NSC_SPAWN_SET_IDS 2       /* setgroups(0), then gid and uid to run_gid/run_uid; checked */
#define NSC_SPAWN_DROP_CAPS 4     /* ambient, inheritable, permitted and effective: cleared, checked */
#define NSC_SPAWN_NO_NEW_PRIVS 8  /* PR_SET_NO_NEW_PRIVS: no setuid or file-capability gain */
#define NSC_SPAWN_NEW_KEYRING 16  /* join a fresh anonymous session keyring */
#define NSC_SPAWN_FAIR_SHARE 32   /* no real-time policy, I/O class, negative nice or oom_score_adj */

/*
 * Start path (absolute, no PATH search) with argv and exactly envp; both
 * NULL-terminated. exec_fd >= 0 executes that open file instead of path
 * (execveat, AT_EMPTY_PATH): a program in a memfd, which the child's account
 * may run wherever the program was installed. stdin_fd/stdout_fd/stderr_fd: -1
 * keeps 0/1/2, else the fd to place there. pass_fds[i] lands at 3 + i; every
 * other fd is closed. flags: NSC_SPAWN_*. pdeathsig > 0 sets PR_SET_PDEATHSIG
 * in the child, after any change of ids (which would clear it). Returns once
 * the exec has succeeded (*pid_out is the child) or the child has been reaped.
 */
int nsc_spawn(const char *path, int exec_fd, char *const argv[], char *const envp[],
              int stdin_fd, int stdout_fd, int stderr_fd,
              const int pass_fds[], int n_pass_fds,
              unsigned int flags, unsigned int run_uid, unsigned int run_gid,
              int landlock_fd, int pdeathsig, int *pid_out, int *stage_out);

/*
 * Landlock. nsc_landlock_abi: the kernel's Landlock ABI version, 0 if it has none.
 * nsc_landlock_scopes: a ruleset that handles no file system or network access, only
 * scopes (ABI >= 6): abstract unix sockets and signals may not reach outside the domain.
 * nsc_spawn's child restricts itself with it (landlock_fd) after no_new_privs, before exec:
 * bwrap still mounts freely (file system rights would stop it), and the whole session then
 * lives in that domain.
 */
#define NSC_STAGE_LANDLOCK 28
/* Its system calls (one number on every architecture; older headers lack them), the
 * ruleset's flag that asks for the ABI version, and the two scopes: for the exec shim too. */
#define NSC_LANDLOCK_CREATE_RULESET 444
#define NSC_LANDLOCK_RESTRICT_SELF 446
#define NSC_LANDLOCK_CREATE_RULESET_VERSION 1
#define NSC_LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET 1
#define NSC_LANDLOCK_SCOPE_SIGNAL 2
int nsc_landlock_abi(void);
int nsc_landlock_scopes(int *fd_out, int *stage_out);

/* A sealed, CLOEXEC memfd holding data, its offset at 0. */
int nsc_memfd_sealed(const char *name, const char *data, size_t len,
                     int *fd_out, int *stage_out);

/* Can a child of this process create a user namespace and map itself? */
int nsc_probe_userns(int *stage_out);

/* Does the kernel discard this process's children's exit statuses (SIGCHLD set to SIG_IGN,
 * or SA_NOCLDWAIT), as the sigaction itself says, whoever set it? */
int nsc_child_statuses_discarded(void);

/* The path with every symlink resolved (as realpath(3)) into out, NSC_PATH_MAX bytes: the
 * policy lint resolves every bind source on every launch. */
#define NSC_PATH_MAX 4096
int nsc_realpath(const char *path, char *out);

/*
 * The regular files with more than one name in dir and in the directories below it, depth
 * levels in all (1: dir's own entries), as the policy lint's look for other names of denied
 * files needs them on every launch (a user's ~/.config holds thousands of entries). No
 * symlink is followed below dir. Each entry looked at takes one from *budget; at 0 the walk
 * stops. Each file found is written to found[*found_out] (room for max_found): its identity,
 * and where its path, relative to dir and NUL-terminated, starts in names (names_size bytes).
 * ENOBUFS if they do not fit; the errno of opening dir. An entry that cannot be looked at, or
 * a directory below that cannot be opened, is skipped.
 */
struct nsc_linked {
    unsigned long long dev;
    unsigned long long ino;
    size_t name;
};
int nsc_linked_files(const char *dir, int depth, long *budget, struct nsc_linked *found,
                     size_t max_found, char *names, size_t names_size, size_t *found_out);

/*
 * Has any of count paths (NUL-terminated, one after another in paths) changed since a scan
 * looked at it? expected[i] is what lstat(2) of the i-th gave then: present 0 if it failed
 * (a path still failing is unchanged, whatever the errno), else 1 and the identity. Every
 * launch asks this of the paths its protection scan depended on (nsconfine._plan.protect):
 * the index of the first that differs, or -1. same_file: only which file each path names is
 * asked, by stat(2), following symlinks, against the device and inode (the times are not
 * compared): a pool's launch asks it of each bind's source, since a directory moved away and
 * another put at its path is no longer the one the staged sandbox binds.
 */
struct nsc_identity {
    long long present;
    unsigned long long dev;
    unsigned long long ino;
    long long mtime_sec;
    long long mtime_nsec;
    long long ctime_sec;
    long long ctime_nsec;
};
long nsc_first_changed(const char *paths, size_t count, const struct nsc_identity *expected,
                       int same_file);

/*
 * An O_PATH, close-on-exec fd for the absolute path, opened without following
 * any symlink on the way (ELOOP if one is there): a bind source is handed to
 * bwrap as exactly the file the lint judged. openat2(RESOLVE_NO_SYMLINKS |
 * RESOLVE_NO_MAGICLINKS) where the kernel has it (5.6), else one openat
 * (O_NOFOLLOW) per component. force_walk: the fallback, for the test that
 * forces it.
 */
#define NSC_STAGE_OPEN 27
int nsc_open_path(const char *path, int force_walk, int *fd_out, int *stage_out);

/*
 * The seccomp filter sessions run under (csrc/seccomp.c), as the raw
 * struct sock_filter array bwrap's --seccomp reads: written into out (cap
 * bytes), its length into *len_out. rules: NSC_SECCOMP_* groups.
 */
#define NSC_SECCOMP_MAX_BYTES 8192
#define NSC_SECCOMP_SETID 1 /* no S_ISUID/S_ISGID by chmod, open, creat, mknod; no io_uring, openat2 */
#define NSC_SECCOMP_KERNEL 2 /* keyrings, NUMA, acct, syslog, quotas, perf, bpf, userfaultfd, kexec,
                                modules, personality, clone3, ptrace of pid 1, socket families,
                                socket filters, Linux AIO, TIOCSTI and TIOCLINUX */
#define NSC_SECCOMP_NAMESPACES 4 /* no new namespace, no setns, no mount API, no seccomp filter
                                    of the session's own: what nested sandboxes need */
#define NSC_SECCOMP_OWN_NETWORK 8 /* no UDP socket: a network of the session's own has no UDP
                                     destination, and the host's UDP memory is one count */
/* An ioctl request no program uses (dir 3, size 16383, type 'N', number 'S'), which every
 * filter nsconfine builds refuses on fd -1 with ENOTRECOVERABLE, an answer no kernel (EBADF)
 * and no other filter gives it: the exec shim's sign that nsconfine's filter holds it. */
#define NSC_SECCOMP_PROBE_REQUEST 0xffff4e53
int nsc_seccomp_filter(unsigned int rules, unsigned char *out, size_t cap, size_t *len_out,
                       int *stage_out);

/*
 * The filter's rules, as data: the one table nsc_seccomp_filter compiles to BPF, for whoever
 * must state the same filter in another form (the OCI export, nsconfine/_export/oci.py). Each rule:
 * the syscall (its name as libseccomp spells it, and its number here) fails with err when:
 * ALWAYS; ARG_IN: the low 32 bits of argument arg equal one of values; ARG_NOT_IN: they equal
 * none of them; ANY_BIT: argument arg has any bit of values[0]; BOTH_ANY_BIT: argument arg has
 * any bit of values[0] and argument arg2 any bit of values[1]; ARG_NOT_OR_ARG2_IN: the low 32
 * bits of argument arg are not values[0], or those of argument arg2 are values[1];
 * ARG_IS_AND_ARG2_MASKED_IN: the low 32 bits of argument arg are values[0], and those of
 * argument arg2, masked with values[1], are one of values[2..n_values-1];
 * SOCKET_TYPE_PROTOCOLS (socket's and socketpair's arguments, arg 0 and arg2 1): the family is
 * values[0], the type masked with values[1] is values[2] (any type, for a mask of 0), and the
 * protocol (argument 2) none of values[3..n_values-1]. Everything else is allowed.
 * nsc_seccomp_rules copies those of the groups in rules (NSC_SECCOMP_*), in the filter's order.
 */
#define NSC_RULE_ALWAYS 0
#define NSC_RULE_ARG_IN 1
#define NSC_RULE_ARG_NOT_IN 2
#define NSC_RULE_ANY_BIT 3
#define NSC_RULE_BOTH_ANY_BIT 4
#define NSC_RULE_ARG_NOT_OR_ARG2_IN 5 /* arg is not values[0], or arg2 is values[1] */
#define NSC_RULE_ARG_IS_AND_ARG2_MASKED_IN 6 /* arg is values[0], arg2 & values[1] in the rest */
#define NSC_RULE_SOCKET_TYPE_PROTOCOLS 7 /* family, type & mask: protocol none of the rest */
#define NSC_RULE_MAX_VALUES 16
#define NSC_SECCOMP_MAX_RULES 128
struct nsc_seccomp_rule {
    const char *name;
    int nr;
    unsigned int group;
    int err;
    int when;
    int arg;
    int arg2;
    unsigned int n_values;
    unsigned int values[16]; /* NSC_RULE_MAX_VALUES */
};
int nsc_seccomp_rules(unsigned int rules, struct nsc_seccomp_rule *out, size_t cap,
                      size_t *n_out);

/*
 * The wire between a launcher and the exec shim inside each sandbox (csrc/shim.c, which
 * includes this header). The launch message is a header of five uint32 in native byte order
 * (magic, fd mask, argc, envc, body size), then the body: argc NUL-terminated arguments and
 * envc NUL-terminated NAME=VALUE strings. A failure report on the error pipe is two int32:
 * errno and one of the stages below.
 */
#define NSC_SHIM_MAGIC 0x6e736331 /* "nsc1" */
#define NSC_SHIM_MAX_BODY 67108864 /* 64 MiB */
#define NSC_SHIM_PLACE_MASK 7      /* bit i: the next received fd goes to fd i (i = 0..2) */
#define NSC_SHIM_CLOSE_MASK 112    /* bit 4 + i: close fd i; neither bit: keep it */
#define NSC_SHIM_TTY 256           /* a new pty is the command's terminal: its controller is sent
                                      back ('T' with the fd); the shim waits for 'G' to go on */
#define NSC_SHIM_STAGE_RECV 1
#define NSC_SHIM_STAGE_PROTOCOL 2
#define NSC_SHIM_STAGE_DUP 3
#define NSC_SHIM_STAGE_ENV 4
#define NSC_SHIM_STAGE_CLOSE 5
#define NSC_SHIM_STAGE_EXEC 6
#define NSC_SHIM_STAGE_SIGNALS 7
#define NSC_SHIM_STAGE_TTY 8
#define NSC_SHIM_STAGE_LIMITS 9 /* prlimit(RLIMIT_NOFILE) of the command */
#define NSC_SHIM_STAGE_RELAY 10 /* the loopback relay of a "proxy" network: listen, fork */
#define NSC_SHIM_EXECUTING 88 /* 'X' on the error pipe: the shim took its command and now execs
                                 it; EOF without it means the shim ended before (killed) */

#endif
