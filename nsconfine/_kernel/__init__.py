"""The kernel's side: raw syscalls, accounts, the mount table, Landlock/seccomp layers,
terminals. Depends on nothing of nsconfine's but errors and records."""
