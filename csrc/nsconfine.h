/*
 * The contract between nsconfine's C layer and nsconfine/_syscalls.py.
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
#define NSC_STAGE_SETSID 18     /* reserved */

/* At most this many fds after 0-2 (a plan's copied files each take one). */
#define NSC_MAX_PASS_FDS 65536

/*
 * Start path (absolute, no PATH search) with argv and exactly envp; both
 * NULL-terminated. stdin_fd/stdout_fd/stderr_fd: -1 keeps 0/1/2, else the
 * fd to place there. pass_fds[i] lands at 3 + i; every other fd is closed.
 * pdeathsig > 0 sets PR_SET_PDEATHSIG in the child. Returns once execve
 * has succeeded (*pid_out is the child) or the child has been reaped.
 */
int nsc_spawn(const char *path, char *const argv[], char *const envp[],
              int stdin_fd, int stdout_fd, int stderr_fd,
              const int pass_fds[], int n_pass_fds,
              int pdeathsig, int *pid_out, int *stage_out);

/* A sealed, CLOEXEC memfd holding data, its offset at 0. */
int nsc_memfd_sealed(const char *name, const char *data, size_t len,
                     int *fd_out, int *stage_out);

/* Can a child of this process create a user namespace and map itself? */
int nsc_probe_userns(int *stage_out);

/* The path with every symlink resolved (as realpath(3)) into out, NSC_PATH_MAX bytes: the
 * policy lint resolves every bind source on every launch. */
#define NSC_PATH_MAX 4096
int nsc_realpath(const char *path, char *out);

#endif
