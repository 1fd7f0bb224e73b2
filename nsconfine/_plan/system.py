"""The read-only system every sandbox sees: /usr and its merged links, the /etc files tools
need, generated passwd and group, a new /proc (its writable parts covered read-only), a minimal
read-only /dev with ptys and shared memory of the session's own, a private /tmp, and a
read-only root.
"""

from __future__ import annotations

import os
import stat

from nsconfine._digest import sha256_hex
from nsconfine._kernel.accounts import RunAs
from nsconfine._kernel.syscalls import realpath
from nsconfine._plan import model as p

TYPE_CHECKING = False  # see nsconfine/_launch/stage.py
if TYPE_CHECKING:
    from typing import Final

# The top-level links of a merged /usr (Debian ≥ 12): mirrored as the same symlinks.
USR_MERGED_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")

# The DNS resolver's address: of use to a session sharing the host's network alone (with none
# there is no resolver to reach; behind the proxy, the proxy resolves names).
RESOLVER: Final = "/etc/resolv.conf"

# The static host names: the host's, on the host's network; on a network of the session's own,
# localhost alone, which is the session's host name too (the host's file names the machine).
HOSTS: Final = "/etc/hosts"
OWN_HOSTS: Final = b"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"

# Of /etc, only what the harness and its tools need, each for a stated reason.
ETC_NEEDS: tuple[tuple[str, str], ...] = (
    ("/etc/ld.so.cache", "the dynamic linker's library index, so programs start"),
    ("/etc/alternatives", "Debian's alternatives links that /usr/bin commands go through"),
    ("/etc/nsswitch.conf", "how libc looks up users, groups and hosts"),
    (HOSTS, "static host names, for the shared network (--network host only)"),
    (RESOLVER, "the DNS resolver, for the shared network (--network host only)"),
    ("/etc/host.conf", "resolver options read by libc"),
    ("/etc/gai.conf", "getaddrinfo's address ordering"),
    ("/etc/services", "port names for network tools"),
    ("/etc/protocols", "protocol names for network tools"),
    ("/etc/ssl/certs", "the CA certificates that verify TLS servers (git, curl, the API)"),
    ("/etc/ssl/openssl.cnf", "OpenSSL's configuration"),
    ("/etc/ca-certificates.conf", "which CA certificates the system trusts"),
    ("/etc/localtime", "the host's time zone"),
    ("/etc/os-release", "the distribution's name and version (harnesses and tools read it)"),
    ("/etc/locale.alias", "locale name aliases, for setlocale"),
    ("/etc/manpath.config", "where man looks for pages"),
)

# Of /sys, what runtimes read to size themselves (lscpu, nproc-alikes, the JVM, node): the
# CPU and NUMA topology, read-only.
SYS_NEEDS: tuple[tuple[str, str], ...] = (
    (
        "/sys/devices/system/cpu",
        "the CPU topology (lscpu, runtimes sizing their threads); it also shows the kernel's "
        "report of the CPU's vulnerabilities and their mitigations",
    ),
    ("/sys/devices/system/node", "the NUMA topology (runtimes placing their memory)"),
)

# The parts of procfs a process with enough privilege can write, which change the host (or
# the session's own namespaces) rather than the writer: each is covered read-only where the
# host has it. bwrap covers only those it can write itself, and never /proc/sys (procfs
# refuses access(W_OK) on that directory to everyone), so the plan does it, visibly.
PROC_READ_ONLY: tuple[tuple[str, str], ...] = (
    ("/proc/sys", "sysctls (kernel.core_pattern, vm.drop_caches, the namespaces' own limits)"),
    ("/proc/sysrq-trigger", "magic SysRq: reboot, crash or sync the host"),
    ("/proc/irq", "interrupt affinity of the host's devices"),
    ("/proc/bus", "PCI and USB device configuration"),
    ("/proc/fs", "file system tunables (nfsd and others)"),
    ("/proc/mtrr", "the CPU's memory type ranges"),
    ("/proc/pressure", "pressure-stall triggers"),
    ("/proc/scsi", "adding and removing SCSI devices"),
    ("/proc/acpi", "ACPI wake-up and other device controls"),
    ("/proc/driver", "driver controls (the RTC among them)"),
)

# The parts of procfs that list what the session's account holds beyond the sandbox, covered
# by an empty file: the kernel shows every key the account may view (a token a host tool put in
# its keyring, by name) and every other session's keyring, and the account's key count. And
# the host's lock table, whose every read holds every lock and unlock on the host while it
# walks all their locks (it shows a session none but its own).
PROC_EMPTY: tuple[tuple[str, str], ...] = (
    ("/proc/keys", "the kernel lists every key the account may view, by name, there"),
    ("/proc/key-users", "the kernel shows the account's key count there (its live sessions)"),
    ("/proc/locks", "each read walks every lock on the host, holding every other lock call"),
)

_cache: dict[tuple[object, ...], tuple[p.Entry, ...]] = {}


def system_entries(user: RunAs, home: str) -> tuple[p.Entry, ...]:
    """The read-only system for a session running as user with its HOME at home.

    Reused while /, /etc and /etc/ssl are unchanged (adding, removing or replacing a file
    there changes the directory's mtime); the lint re-resolves every source at launch anyway."""
    key = (user, home, *(_mtime(path) for path in ("/", "/etc", "/etc/ssl")))
    cached = _cache.get(key)
    if cached is None:
        _cache.clear()
        cached = _cache[key] = tuple(_system_entries(user, home))
    return cached


def _mtime(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return -1


def _system_entries(user: RunAs, home: str) -> list[p.Entry]:
    entries = [p.ro_bind("/usr", "/usr", "system programs and libraries the tools run")]
    for link in USR_MERGED_LINKS:
        if os.path.islink(link):
            entries.append(p.symlink(os.readlink(link), link, "merged-/usr link, as on the host"))
        elif os.path.isdir(link):
            entries.append(p.ro_bind(link, link, "system directory of a host without merged /usr"))
    for path, reason in ETC_NEEDS:
        entries += _etc_entry(path, reason)
    entries += identity_files(user, home)
    entries.append(machine_id(home))
    entries.append(
        p.proc("/proc", "a procfs of the sandbox's own pid namespace: no host processes")
    )
    entries += [
        p.ro_bind(path, path, f"read-only: {reason}")
        for path, reason in PROC_READ_ONLY
        if _world_readable(path)
    ]
    entries += [
        p.data(b"", path, f"empty: {reason}") for path, reason in PROC_EMPTY if os.path.exists(path)
    ]
    entries += [
        p.ro_bind(path, path, f"read-only: {reason}")
        for path, reason in SYS_NEEDS
        if _world_readable(path)
    ]
    entries += own_cgroup()
    entries += [
        p.dev(
            "/dev",
            "null, zero, full, random, urandom, tty, its own pts and shm, and the fd, std*, "
            "ptmx and core links only (core leads to /proc/kcore, which no session reads): no "
            "host devices",
        ),
        p.devpts("the session's own terminals, from a devpts of its own that holds its ptys limit"),
        p.tmpfs("/dev/shm", "POSIX shared memory of the session's own, of its shm limit"),
        p.remount_ro(
            "/dev",
            "bwrap's /dev tmpfs has no size: read-only (its devices, /dev/pts and /dev/shm are "
            "mounts of their own)",
        ),
        p.tmpfs("/tmp", "a private /tmp: nothing shared with the host or other sessions"),
        p.remount_ro(
            "/",
            "the sandbox's root is read-only: nothing can be written outside the writable mounts",
        ),
    ]
    return entries


def _world_readable(path: str) -> bool:
    # bwrap binds as the session's user, never root: what that user cannot read it cannot
    # bind (nor write through the sandbox's own procfs).
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return False
    needed = 0o005 if stat.S_ISDIR(mode) else 0o004
    return mode & needed == needed


def _etc_entry(path: str, reason: str) -> list[p.Entry]:
    if not os.path.lexists(path):
        return []
    # A link into /usr (localtime -> /usr/share/zoneinfo/…) stays a link, so tools that read
    # the link's target still work; any other link is bound by what it resolves to.
    if os.path.islink(path):
        target = os.readlink(path)
        try:
            resolved = realpath(path)
        except OSError:
            return []  # dangling
        if resolved.startswith("/usr/"):
            return [p.symlink(target, path, reason)]
        return [p.ro_bind(resolved, path, reason)]
    return [p.ro_bind(path, path, reason)]


def own_hosts() -> p.Entry:
    """/etc/hosts of a session on a network of its own: localhost, its host name, alone."""
    return p.data(
        OWN_HOSTS,
        HOSTS,
        "localhost alone, the session's host name: a network of its own has no other host, and "
        "the host's file names the machine",
    )


def machine_id(home: str) -> p.Entry:
    """A machine-id of the session's own: the same for every launch of one run directory (its
    HOME), different for every other, and not the host's (which identifies the machine)."""
    try:
        with open("/etc/machine-id", "rb") as file:
            host = file.read()
    except OSError:
        host = b""
    digest = sha256_hex(b"nsconfine machine-id\0" + host + b"\0" + os.fsencode(home))
    return p.data(
        digest[:32].encode() + b"\n",
        "/etc/machine-id",
        "the session's own machine id (derived from its run directory), not the host's",
    )


def own_cgroup() -> list[p.Entry]:
    """The launcher's cgroup (cgroup v2), which its sessions share, read-only at
    /sys/fs/cgroup: runtimes read their CPU and memory limits there (inside, the cgroup
    namespace makes it the root). Not the host's root cgroup, which lists every process."""
    try:
        with open("/proc/self/cgroup") as file:
            lines = file.read().splitlines()
    except OSError:
        return []
    unified = next((line[3:] for line in lines if line.startswith("0::")), None)
    if unified is None or unified == "/":
        return []  # the root cgroup holds every process of the host, and no limits
    for hierarchy in ("/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
        if os.path.isfile(os.path.join(hierarchy, "cgroup.controllers")):
            source = os.path.normpath(hierarchy + "/" + unified.lstrip("/"))
            if _world_readable(source):
                return [
                    p.ro_bind(
                        source,
                        "/sys/fs/cgroup",
                        "read-only: the launcher's cgroup, which the session shares: its CPU "
                        "and memory limits",
                    )
                ]
            return []
    return []


def identity_files(user: RunAs, home: str) -> list[p.Entry]:
    """passwd and group naming only the session's user (and root): tools look the uid up
    (node's os.userInfo(), ssh, whoami), and the host's files would list every user."""
    import grp

    try:
        group_name = grp.getgrgid(user.gid).gr_name
    except KeyError:
        group_name = user.name
    # A home passwd cannot hold (its fields are split at each `:`) is left out: tools that
    # read it there fall back, and $HOME names it anyway.
    home_field = "/nonexistent" if ":" in home else home
    passwd = f"{user.name}:x:{user.uid}:{user.gid}::{home_field}:/bin/sh\n"
    group = f"{group_name}:x:{user.gid}:\n"
    if user.uid != 0:
        passwd = "root:x:0:0::/nonexistent:/bin/sh\n" + passwd
    if user.gid != 0:
        group = "root:x:0:\n" + group
    return [
        # (as the kernel names paths: bytes, UTF-8 or not)
        p.data(os.fsencode(passwd), "/etc/passwd", "names the session's own user and root only"),
        p.data(os.fsencode(group), "/etc/group", "names the session's own group and root only"),
    ]
