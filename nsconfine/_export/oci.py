"""One reviewed plan, other executors: the plan as an OCI runtime spec (runc), a bundle that
runs it, podman's arguments and a Kubernetes Pod.

Each entry is stated the way the OCI spec can state it, never wider:

- a bind is a bind (`rbind`, `nosuid`, `nodev`, `rprivate`, and `ro` with `rro` where
  read-only; the root's propagation private), a
  `/proc` part the plan covers read-only is one of `linux.readonlyPaths` (one it covers with
  an empty file, one of `linux.maskedPaths`: runc binds nothing else there), a tmpfs is a tmpfs
  the session's account owns, /proc a new procfs, /dev the runtime's minimal one;
- what OCI has no operation for is made expressible in the bundle: a generated (data) file is
  written into it and bound read-only, a tmpfs the plan remounts read-only (with its copies,
  directories and links) becomes a directory of the bundle bound read-only, a pinned file is
  copied in (its digest checked on the copy) and bound read-only, the root's links and
  directories are made in the bundle's rootfs, which is read-only; what still cannot be said
  (a directory or link inside a writable tmpfs) is refused;
- the seccomp filter is csrc/seccomp.c's own table (nsconfine._kernel.syscalls.seccomp_rules), in
  the spec's JSON: every condition the C filter reads on an argument's low 32 bits is a
  SCMP_CMP_MASKED_EQ on those bits (an allow-list becomes the prefix blocks of its
  complement), so the JSON refuses exactly what the BPF refuses;
- the limits (nsconfine._plan.limits): each tmpfs's size= and nr_inodes= and the devpts's max= as
  mount options,
  the read-only /dev as one of `linux.readonlyPaths` (runc applies those once it has made its
  devices), open files as the process's RLIMIT_NOFILE, processes as the container's pids
  limit (a cgroup of the runtime's: RLIMIT_NPROC would count the account's whole host), and
  System V IPC's (shared memory, semaphores, message queues) as its IPC namespace's sysctls.

What the spec cannot carry at all (Landlock scopes, the exec shim and its pid-1 guard, the
mount-table check after set-up, --disable-userns, inotify counts of the session's own) is
listed in the annotations (NOT_EXPRESSED), with each entry's reason.
"""

from __future__ import annotations

import os
import posixpath
import stat

from nsconfine._errors import NsconfineError, PlanError, UsageError, path_refusal
from nsconfine._kernel import syscalls as _syscalls
from nsconfine._kernel.accounts import untrusted_reason
from nsconfine._plan.bwrap_args import SESSION_HOSTNAME
from nsconfine._plan.limits import SYSV_MESSAGE_QUEUES, SYSV_SEMAPHORES, tmpfs_shape
from nsconfine._plan.model import Entry, Kind, Mode, Plan, has_own_network
from nsconfine._text import ancestors, inside, printable

TYPE_CHECKING = False  # see nsconfine/_launch/stage.py
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, BinaryIO

OCI_VERSION = "1.0.2"
ANNOTATION = "org.nsconfine"
MASK32 = 0xFFFF_FFFF
ARCHITECTURES = {"x86_64": "SCMP_ARCH_X86_64", "aarch64": "SCMP_ARCH_AARCH64"}
DEFAULT_COMMAND = ("/bin/sh",)

# What a Pod cannot say that the bundle does (a Pod has no rlimits).
POD_NOT_EXPRESSED = {
    "rlimits": "a Pod has no rlimits: the open_files limit (RLIMIT_NOFILE) and no core dumps "
    "(RLIMIT_CORE 0) are the container runtime's (containerd's unit sets LimitCORE=infinity)",
}

# What no OCI field expresses, and what the export therefore does not promise.
NOT_EXPRESSED = {
    "landlock": "Landlock scopes (no abstract unix socket or signal out of the sandbox) have no "
    "OCI field: with the host network, host abstract sockets stay reachable (--network none "
    "closes them)",
    "exec-shim": "nsconfine's exec shim and its pid-1 guard: under runc the command is pid 1 "
    "itself, and its exit status is the container's",
    "mount-check": "the check of the built sandbox's mount table against the plan, inode by "
    "inode, before the command runs: the runtime's own mounting is trusted instead",
    "disable-userns": "bwrap's --disable-userns: nested user namespaces are refused by the "
    "seccomp filter alone (unshare, clone with namespace flags, clone3, setns)",
    "session-keyring": "a fresh session keyring is the runtime's choice (runc joins a new one "
    "per container unless told not to); the filter refuses the keyring calls either way",
    "stubs": "mount points the plan makes for missing protected paths are made by oci-bundle "
    "when it writes the bundle and kept while the bundle's config.json exists; the first "
    "nsconfine session of the workspace to end after the bundle is gone removes them",
    "protection-refresh": "the protected paths are those found when the bundle was written: a "
    "repository made in the workspace after that is not protected in the container",
    "inotify": "the session's own inotify counts (its inotify_instances and inotify_watches "
    "limits) take a user namespace of its own, which the spec does not make: the account's "
    "user.max_inotify_* apply, shared with its other processes",
    "relay": "the loopback relay of a proxy network (127.0.0.1:3128 to nsconfine's proxy): "
    "the container gets the network namespace with only a loopback, no proxy's socket (the "
    "launcher's proxy makes one at each launch), and nothing listens on 127.0.0.1:3128",
    "podman-dev": "under podman-args, podman makes /dev, /dev/pts and /dev/shm itself: /dev "
    "stays writable and the ptys are limited only by the host's (its /dev/shm is sized by "
    "--shm-size); the bundle under runc states all three",
}


# ------------------------------------------------------------------ seccomp


def seccomp_profile(plan: Plan) -> dict[str, Any]:
    """The plan's seccomp filter in the OCI spec's JSON form (also a Kubernetes localhost
    profile and podman's --security-opt seccomp= file)."""
    rules = _syscalls.seccomp_groups(plan.nested_userns is None, has_own_network(plan.network))
    machine = os.uname().machine
    if machine not in ARCHITECTURES:
        raise PlanError(f"the seccomp filter is built for x86_64 and aarch64, not {machine}")
    syscalls: list[dict[str, Any]] = []
    for rule in _syscalls.seccomp_rules(rules):
        base = {"names": [rule.name], "action": "SCMP_ACT_ERRNO", "errnoRet": rule.err}
        syscalls += [{**base, "args": args} if args else dict(base) for args in _conditions(rule)]
    return {
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": [ARCHITECTURES[machine]],
        "syscalls": syscalls,
    }


def _masked(index: int, mask: int, value: int) -> dict[str, Any]:
    return {"index": index, "value": mask, "valueTwo": value, "op": "SCMP_CMP_MASKED_EQ"}


def _bits(mask: int) -> list[int]:
    return [1 << bit for bit in range(32) if mask >> bit & 1]


def _conditions(rule: _syscalls.SeccompRule) -> list[list[dict[str, Any]]]:
    """The rule as OCI argument lists, any of which refuses the call (each list's conditions
    all hold; runtimes make one libseccomp rule per list)."""
    if rule.when == _syscalls.RULE_ALWAYS:
        return [[]]
    if rule.when == _syscalls.RULE_ARG_IN:
        return [[_masked(rule.arg, MASK32, value)] for value in rule.values]
    if rule.when == _syscalls.RULE_ARG_NOT_IN:
        return [[_masked(rule.arg, m, v)] for m, v in complement_blocks(rule.values)]
    if rule.when == _syscalls.RULE_ANY_BIT:
        return [[_masked(rule.arg, bit, bit)] for bit in _bits(rule.values[0])]
    if rule.when == _syscalls.RULE_BOTH_ANY_BIT:
        return [
            [_masked(rule.arg, first, first), _masked(rule.arg2, second, second)]
            for first in _bits(rule.values[0])
            for second in _bits(rule.values[1])
        ]
    if rule.when == _syscalls.RULE_ARG_IS_AND_ARG2_MASKED_IN:
        first, mask = _masked(rule.arg, MASK32, rule.values[0]), rule.values[1]
        return [[first, _masked(rule.arg2, mask, value)] for value in rule.values[2:]]
    if rule.when == _syscalls.RULE_SOCKET_TYPE_PROTOCOLS:  # family, type, protocol: 0, 1, 2
        mask, kind = rule.values[1:3]
        given = [_masked(0, MASK32, rule.values[0]), *([_masked(1, mask, kind)] if mask else [])]
        return [[*given, _masked(2, m, v)] for m, v in complement_blocks(rule.values[3:])]
    if rule.when == _syscalls.RULE_ARG_NOT_OR_ARG2_IN:
        others = complement_blocks(rule.values[:1])
        return [[_masked(rule.arg, m, v)] for m, v in others] + [
            [_masked(rule.arg2, MASK32, rule.values[1])]
        ]
    raise PlanError(f"the seccomp rule for {rule.name} has a condition the export cannot state")


def complement_blocks(values: Sequence[int], width: int = 32) -> list[tuple[int, int]]:
    """Every width-bit number but values, as disjoint (mask, value) prefix blocks: x is in a
    block when x & mask == value. OCI's conditions on one argument are ANDed and no runtime
    takes two on the same argument, so "none of these values" is stated this way."""
    wanted = {value & ((1 << width) - 1) for value in values}
    blocks: list[tuple[int, int]] = []

    def cover(prefix: int, length: int) -> None:
        shift = width - length
        if not any(value >> shift == prefix for value in wanted):
            mask = ((1 << length) - 1) << shift
            blocks.append((mask, prefix << shift))
        elif length < width:
            cover(prefix << 1, length + 1)
            cover(prefix << 1 | 1, length + 1)

    cover(0, 0)
    return blocks


# ------------------------------------------------------------------ mounts


class Artifact:
    """Something the bundle holds: a directory, a symlink, a file (content, or a host file
    copied, its digest checked when pinned), or a mount point made for a bind under a
    read-only directory of the bundle. path is relative to the bundle."""

    __slots__ = ("content", "kind", "path", "perms", "sha256", "source")

    def __init__(
        self,
        kind: str,
        path: str,
        *,
        content: bytes | None = None,
        source: str = "",
        perms: int = 0o444,
        sha256: str | None = None,
    ) -> None:
        self.kind, self.path, self.content, self.source = kind, path, content, source
        self.perms, self.sha256 = perms, sha256


class Export:
    """The plan as the OCI spec states it: config.json's content (secrets shown only when
    asked for), the seccomp profile, and what the bundle must hold."""

    __slots__ = ("artifacts", "config", "notes", "seccomp")

    def __init__(self) -> None:
        self.config: dict[str, Any] = {}
        self.seccomp: dict[str, Any] = {}
        self.artifacts: list[Artifact] = []
        self.notes: list[tuple[Entry, str]] = []  # each entry and how the export states it


def _bind_options(mode: Mode) -> list[str]:
    # bwrap binds recursively with nosuid and nodev (and read-only all the way down), and
    # nsconfine's reaper makes every mount private (no mount the host makes later reaches the
    # session): so here, where a runtime's default is rslave.
    return ["rbind", "nosuid", "nodev", "rprivate", *(["ro", "rro"] if mode is Mode.RO else [])]


def _bind(source: str, dest: str, mode: Mode) -> dict[str, Any]:
    return {"destination": dest, "type": "bind", "source": source, "options": _bind_options(mode)}


def _covering(entries: Sequence[Entry], index: int) -> Entry | None:
    """The innermost mount an earlier entry made that contains entries[index]'s dest."""
    dest = entries[index].dest
    found: Entry | None = None
    for entry in entries[:index]:
        if entry.kind in (Kind.DIR, Kind.SYMLINK, Kind.COPY, Kind.REMOUNT_RO):
            continue
        if inside(dest, entry.dest) and (found is None or len(entry.dest) > len(found.dest)):
            found = entry
    return found


def export(
    plan: Plan,
    bundle: str,
    argv: Sequence[str] = DEFAULT_COMMAND,
    *,
    reveal_secrets: bool = False,
) -> Export:
    """plan as an OCI bundle at bundle (an absolute path): config.json's content and what the
    bundle holds. Values from --pass-env and the credential file are shown as (hidden) unless
    reveal_secrets (the bundle's own config.json, which only its owner reads)."""
    if not os.path.isabs(bundle):
        raise UsageError(f"the bundle directory {printable(bundle)} must be an absolute path")
    if not argv:
        raise UsageError("no command given for the bundle's process")
    _refuse_root(plan)
    _refuse_what_utf8_cannot_hold(plan, bundle, argv)
    result = Export()
    entries = plan.entries
    remounted = {e.dest for e in entries if e.kind is Kind.REMOUNT_RO}
    trees: dict[str, str] = {}  # a tmpfs the plan remounts read-only -> its bundle directory
    mounts: list[dict[str, Any]] = []
    read_only_paths: list[str] = []
    masked_paths: list[str] = []
    files = 0

    def note(entry: Entry, how: str) -> None:
        result.notes.append((entry, how))

    def bundle_file(entry: Entry, **artifact: Any) -> str:
        nonlocal files
        files += 1
        path = f"files/{files:04d}-{posixpath.basename(entry.dest) or 'root'}"
        result.artifacts.append(Artifact("file", path, **artifact))
        return path

    for index, entry in enumerate(entries):
        kind = entry.kind
        parent = _covering(entries, index)
        tree = trees.get(parent.dest) if parent is not None else None
        in_tree = None if tree is None or parent is None else inside(entry.dest, parent.dest)
        in_root = parent is None
        if kind is Kind.REMOUNT_RO:
            if entry.dest == "/":
                note(entry, "root.readonly")
            elif any(e.kind is Kind.DEV and e.dest == entry.dest for e in entries):
                read_only_paths.append(entry.dest)
                note(entry, "linux.readonlyPaths (once runc has made its devices)")
            elif entry.dest in trees:
                note(entry, f"the bundle's {trees[entry.dest]}, bound read-only")
            else:
                raise _unexpressible(entry, "a read-only remount of what is not a tmpfs")
            continue
        if kind is Kind.TMPFS and entry.dest in remounted:
            trees[entry.dest] = f"trees/{len(trees):04d}"
            result.artifacts.append(Artifact("dir", trees[entry.dest], perms=0o755))
            mounts.append(_bind(f"{bundle}/{trees[entry.dest]}", entry.dest, Mode.RO))
            note(entry, f"the bundle's {trees[entry.dest]} (read-only, as the plan remounts it)")
            continue
        if in_tree is not None and kind in (Kind.DIR, Kind.SYMLINK, Kind.COPY, Kind.DATA):
            path = f"{tree}/{in_tree}"
            if kind is Kind.DIR:
                result.artifacts.append(Artifact("dir", path, perms=0o755))
            elif kind is Kind.SYMLINK:
                result.artifacts.append(Artifact("symlink", path, source=entry.source))
            elif kind is Kind.COPY:
                perms = 0o444 if entry.perms is None else entry.perms & 0o555
                result.artifacts.append(Artifact("file", path, source=entry.source, perms=perms))
            else:
                result.artifacts.append(Artifact("file", path, content=entry.content))
            note(entry, f"in the bundle's {path}")
            continue
        if in_root and kind in (Kind.DIR, Kind.SYMLINK):
            path = f"rootfs{entry.dest}"
            if kind is Kind.DIR:
                result.artifacts.append(Artifact("dir", path, perms=0o755))
            else:
                result.artifacts.append(Artifact("symlink", path, source=entry.source))
            note(entry, f"in the bundle's {path} (the read-only root)")
            continue
        match kind:
            case Kind.BIND if entry.dest.startswith("/proc/") and entry.source == entry.dest:
                read_only_paths.append(entry.dest)
                note(entry, "linux.readonlyPaths (the container's own /proc, read-only)")
            case Kind.DATA if entry.dest.startswith("/proc/") and not entry.content:
                masked_paths.append(entry.dest)
                note(entry, "linux.maskedPaths (the container's own /proc: empty)")
            case Kind.BIND if entry.sha256 is not None:
                copied = bundle_file(entry, source=entry.source, perms=0o555, sha256=entry.sha256)
                mounts.append(_bind(f"{bundle}/{copied}", entry.dest, Mode.RO))
                note(entry, f"pinned: copied into the bundle's {copied} (digest checked)")
            case Kind.BIND:
                mounts.append(_bind(entry.source, entry.dest, _mode(entry, remounted)))
                if in_tree is not None:
                    result.artifacts.append(
                        Artifact("mountpoint", f"{tree}/{in_tree}", source=entry.source)
                    )
                note(entry, "a bind")
            case Kind.DATA | Kind.COPY:
                path = bundle_file(
                    entry,
                    content=entry.content,
                    source=entry.source if kind is Kind.COPY else "",
                    perms=0o444,
                )
                mounts.append(_bind(f"{bundle}/{path}", entry.dest, Mode.RO))
                note(entry, f"the bundle's {path}, bound read-only")
            case Kind.TMPFS:
                uid, gid = plan.user.uid, plan.user.gid
                options = ["nosuid", "nodev", "mode=755", f"uid={uid}", f"gid={gid}"]
                if entry.capacity is not None:
                    options += (
                        f"size={entry.capacity}",
                        f"nr_inodes={tmpfs_shape(entry.capacity)[1]}",
                    )
                mounts.append(
                    {
                        "destination": entry.dest,
                        "type": "tmpfs",
                        "source": "tmpfs",
                        "options": options,
                    }
                )
                note(entry, "a tmpfs the session's account owns")
            case Kind.PROC:
                mounts.append(
                    {
                        "destination": entry.dest,
                        "type": "proc",
                        "source": "proc",
                        "options": ["nosuid", "noexec", "nodev"],
                    }
                )
                note(entry, "a procfs of the container's pid namespace")
            case Kind.DEV:
                mounts += _dev_mounts(entry.dest, plan)
                note(entry, "the runtime's minimal /dev (null, zero, full, random, urandom, tty)")
            case Kind.DEVPTS:
                note(entry, f"the devpts of the runtime's /dev, max={entry.capacity}")
            case Kind.DIR if parent is not None and parent.kind is Kind.BIND:
                # Made by oci-bundle on the host, as a launch makes it (nsconfine._launch.sources).
                note(entry, "made on the host by oci-bundle, as a launch makes it")
            case _:
                raise _unexpressible(entry, f"a {kind} inside the writable {parent_dest(parent)}")
    uid, gid = plan.user.uid, plan.user.gid
    namespaces = [{"type": name} for name in ("pid", "ipc", "uts", "mount", "cgroup")]
    if has_own_network(plan.network):
        namespaces.append({"type": "network"})
    result.seccomp = seccomp_profile(plan)
    result.config = {
        "ociVersion": OCI_VERSION,
        "process": {
            "terminal": False,
            "user": {"uid": uid, "gid": gid, "additionalGids": []},
            "args": list(argv),
            "env": [
                f"{v.name}={v.value if reveal_secrets or v.origin.shown else '(hidden)'}"
                for v in plan.env
            ],
            "cwd": plan.chdir,
            "capabilities": {
                name: []
                for name in ("bounding", "effective", "inheritable", "permitted", "ambient")
            },
            "noNewPrivileges": True,
            "rlimits": [
                {
                    "type": "RLIMIT_NOFILE",
                    "hard": plan.limits.open_files,
                    "soft": plan.limits.open_files,
                },
                {"type": "RLIMIT_CORE", "hard": 0, "soft": 0},  # no core dumps, as the reaper
            ],
        },
        "root": {"path": "rootfs", "readonly": "/" in remounted},
        "hostname": SESSION_HOSTNAME,  # (a new UTS namespace's, as bwrap is given it)
        "mounts": mounts,
        "linux": {
            "rootfsPropagation": "private",  # (see _bind_options; the spec says no rprivate)
            "namespaces": namespaces,
            "readonlyPaths": read_only_paths,
            "maskedPaths": masked_paths,
            "seccomp": result.seccomp,
            "resources": {"pids": {"limit": plan.limits.processes}},
            "sysctl": ipc_sysctls(plan),
        },
        "annotations": _annotations(plan, result.notes),
    }
    return result


def _refuse_root(plan: Plan) -> None:
    """No export runs a session as uid 0 or in group 0: the spec has no user namespace, and
    root's runtime would run it as root (as the launch's gate refuses too)."""
    if plan.user.uid == 0 or plan.user.gid == 0:
        which = "uid" if plan.user.uid == 0 else "gid"
        raise PlanError(
            f"the session would run as {which} 0: name an unprivileged account whose group is "
            "not root's (--user NAME)"
        )


def _refuse_what_utf8_cannot_hold(plan: Plan, bundle: str, argv: Sequence[str]) -> None:
    """Refuse a name or value holding a byte no UTF-8 text holds (kept as a lone surrogate):
    config.json and the Pod are UTF-8, and a runtime written in Go reads such a byte as U+FFFD,
    so a bind would land on another name, one a session may have made for it."""
    texts = [bundle, plan.chdir, *argv]
    texts += [text for entry in plan.entries for text in (entry.source, entry.dest)]
    texts += [text for variable in plan.env for text in (variable.name, variable.value)]
    for text in texts:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise PlanError(
                f"{printable(text)} is not UTF-8: config.json and a Pod hold UTF-8 text only, "
                "and a runtime reads such a byte as another character (U+FFFD), so a mount "
                "would land on another name; rename it (nsconfine run binds it by its bytes)"
            ) from None


def ipc_sysctls(plan: Plan) -> dict[str, str]:
    """The session's System V limits (nsconfine._plan.limits), as its IPC namespace's
    sysctls."""
    return {
        "kernel.shmall": str(plan.limits.sysv_shm_pages()),
        "kernel.sem": SYSV_SEMAPHORES,
        "kernel.msgmni": str(SYSV_MESSAGE_QUEUES),
    }


def parent_dest(parent: Entry | None) -> str:
    return "/" if parent is None else printable(parent.dest)


def _mode(entry: Entry, remounted: set[str]) -> Mode:
    return Mode.RO if entry.dest in remounted else entry.mode


def _unexpressible(entry: Entry, what: str) -> PlanError:
    return PlanError(
        f"the OCI export cannot state the {entry.kind} entry at {printable(entry.dest)} ({what}): "
        "it would have to widen the plan, so nothing was written; run this session with "
        "nsconfine run"
    )


def _dev_mounts(dest: str, plan: Plan) -> list[dict[str, Any]]:
    """The runtime's /dev: a small tmpfs, a devpts holding the plan's ptys (where it has the
    entry), and a /dev/shm unless the plan has one of its own (a tmpfs entry of its own)."""
    ptys = [f"max={e.capacity}" for e in plan.entries if e.kind is Kind.DEVPTS]
    mounts = [
        {
            "destination": dest,
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
        },
        {
            "destination": f"{dest}/pts",
            "type": "devpts",
            "source": "devpts",
            "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", *ptys],
        },
    ]
    if not any(entry.dest == f"{dest}/shm" for entry in plan.entries):
        mounts.append(
            {
                "destination": f"{dest}/shm",
                "type": "tmpfs",
                "source": "shm",
                "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
            }
        )
    return mounts


def _annotations(plan: Plan, notes: list[tuple[Entry, str]]) -> dict[str, str]:
    annotations = {
        f"{ANNOTATION}.runs-as": str(plan.user),
        f"{ANNOTATION}.network": plan.network,
        **({f"{ANNOTATION}.network-reason": plan.network_reason} if plan.network_reason else {}),
        f"{ANNOTATION}.nested-userns": plan.nested_userns or "refused",
        f"{ANNOTATION}.hidden-env": ",".join(v.name for v in plan.env if not v.origin.shown),
    }
    for limit in plan.limits.to_json():
        value = "not limited" if limit["value"] is None else plan.limits.shown(limit["name"])
        annotations[f"{ANNOTATION}.limit.{limit['name']}"] = f"{value}: {limit['reason']}"
    for number, (entry, how) in enumerate(notes):
        annotations[f"{ANNOTATION}.entry.{number:04d}"] = (
            f"{entry.kind} {entry.mode} {entry.dest} <- {entry.source_label}: {entry.reason} "
            f"[oci: {how}]"
        )
    for name, what in NOT_EXPRESSED.items():
        annotations[f"{ANNOTATION}.not-expressed.{name}"] = what
    return annotations


# ------------------------------------------------------------------ the bundle


def write_bundle(plan: Plan, directory: str, argv: Sequence[str] = DEFAULT_COMMAND) -> Export:
    """Check plan as a launch does (the lint, the pins, the mount points inside its writable
    binds, made as a launch makes them), then write the runnable bundle into directory (new,
    or empty): config.json (0600: it holds the credential's values), seccomp.json (a
    Kubernetes localhost profile too), pod.json, and the files, trees and rootfs the mounts
    name."""
    from nsconfine._gate import lint

    bundle = os.path.abspath(directory)
    _refuse_root(plan)  # (before any mount point is made)
    writable = {
        _syscalls.identity(e.source): e
        for e in plan.entries
        if e.kind is Kind.BIND and e.mode is Mode.RW
    }
    writable.pop(None, None)  # a missing source (the lint refuses it) is nothing to be inside
    # By what each directory above the bundle is, not by how its path reads: a symlink or a
    # bind mount of the workspace elsewhere names the very same directory.
    for above in {*ancestors(bundle), *ancestors(os.path.realpath(bundle))}:
        entry = writable.get(_syscalls.identity(above))
        if entry is not None:
            raise UsageError(
                f"the bundle {printable(bundle)} lies inside {printable(entry.source)}, "
                "which the session can write: it could rewrite its own config.json"
            )
    plan.require_launchable()  # the bundle holds the credential's values
    try:  # an OSError on a path (unreadable, swapped while checked) refuses, naming it
        lint(plan)
        _refuse_replaceable_sources(plan)
        return materialize(plan, bundle, argv)
    except NsconfineError:  # some are OSErrors too (CredentialMissing): each says its own
        raise
    except OSError as error:
        raise path_refusal(error, "the bundle") from error


def _refuse_replaceable_sources(plan: Plan) -> None:
    """runc opens each bind source by its path when it starts, where bwrap binds an fd the lint
    judged: a source someone other than root or the launcher could replace (the session's
    account among them) could be swapped for a symlink to anywhere after this check. So each
    source must lie where only they can change it: one of theirs, with every directory above
    it (a sticky one as /tmp holds what is theirs); another's (the workspace, the session's
    tools), in a directory of theirs. The protected paths inside the workspace are the case
    docs/export.md states; a pinned file is copied into the bundle, and a /proc part is the
    container's own."""
    protected = set() if plan.protection is None else set(plan.protection.entries)
    trusted = {0, os.geteuid()}
    for entry in plan.entries:
        if entry.kind is not Kind.BIND or entry.sha256 is not None or entry in protected:
            continue
        if entry.dest.startswith("/proc/") and entry.source == entry.dest:
            continue
        try:
            info = os.lstat(entry.source)
        except OSError:
            continue  # the lint has judged it missing, or will
        # Where the kernel goes when runc mounts it: a symlink with where it leads; a file of
        # theirs with all above it; another's by the directory that holds it, which must not
        # let its owner rename it.
        theirs = info.st_uid in trusted and not stat.S_ISLNK(info.st_mode)
        if theirs or stat.S_ISLNK(info.st_mode):
            judged = entry.source
        else:
            judged = posixpath.dirname(entry.source)
        reason = untrusted_reason(judged)
        if reason is not None:
            raise PlanError(
                f"the bind source {printable(entry.source)} lies where someone other than root "
                f"or you can change it ({printable(reason)}), a session's account among them: "
                "runc opens it by its path when it starts, so they could put a symlink to "
                "anywhere in its place after this check; give sources in directories only root "
                "or you can write (nsconfine run binds each by an fd it opened, and is not "
                "affected)"
            )


def materialize(plan: Plan, bundle: str, argv: Sequence[str] = DEFAULT_COMMAND) -> Export:
    """Write plan's bundle without the checks write_bundle runs first (the lint, the pins):
    for the tests' weakened twins, which must expose what the lint refuses."""
    from nsconfine._launch import sources as _sources

    exported = export(plan, bundle, argv, reveal_secrets=True)
    stubs, fds = _sources.open_for_launch(plan)
    for fd in fds.values():
        os.close(fd)
    try:
        _write_bundle_files(plan, bundle, argv, exported)
        # Left in place for the runtime, and kept while the bundle exists: the container
        # would otherwise lose its protected paths to the next session of the workspace.
        _sources.keep_for_bundle(stubs, os.path.join(bundle, "config.json"))
    except BaseException:
        _sources.remove(stubs)  # a bundle refused leaves nothing in the workspace
        raise
    _sources.release(stubs)
    return exported


def _write_bundle_files(plan: Plan, bundle: str, argv: Sequence[str], exported: Export) -> None:
    _make_bundle_directory(bundle)
    for artifact in exported.artifacts:
        _write_artifact(bundle, artifact)
    _write_json(os.path.join(bundle, "config.json"), exported.config, 0o600)
    _write_json(os.path.join(bundle, "seccomp.json"), exported.seccomp, 0o644)
    if not any("\n" in variable.value for variable in plan.env):  # podman's --env-file
        lines = "".join(f"{variable.name}={variable.value}\n" for variable in plan.env)
        fd = os.open(os.path.join(bundle, "env"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as file:
            file.write(lines)
    pod = pod_spec(plan, exported, argv)
    _write_json(os.path.join(bundle, "pod.json"), pod, 0o644)


def _make_bundle_directory(bundle: str) -> None:
    made = False
    try:
        os.mkdir(bundle, 0o700)
        made = True
    except FileExistsError:
        if not os.path.isdir(bundle) or os.path.islink(bundle) or os.listdir(bundle):
            raise UsageError(
                f"{printable(bundle)} exists and is not an empty directory: give a new one"
            ) from None
    except OSError as error:
        raise UsageError(
            f"the bundle {printable(bundle)} cannot be made: {error.strerror}"
        ) from error
    # Its directory and every one above it, each way it is reached (a bind mount of a session's
    # directory named elsewhere too): whoever else may change them may swap in a config.json
    # of their own, which a root runtime runs as root.
    reason = untrusted_reason(bundle)
    if reason is not None:
        if made:
            os.rmdir(bundle)
        raise UsageError(
            f"the bundle {printable(bundle)} could be changed by someone other than root or "
            f"you ({reason}), a session's account among them: its config.json would run as "
            "they wrote it; give a directory only you can write"
        )
    os.chmod(bundle, 0o700)
    os.mkdir(os.path.join(bundle, "rootfs"), 0o755)
    os.chmod(os.path.join(bundle, "rootfs"), 0o755)  # whatever the umask


def _write_json(path: str, value: Any, perms: int) -> None:
    import json

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, perms)
    with os.fdopen(fd, "w") as file:
        json.dump(value, file, indent=2)
        file.write("\n")
    os.chmod(path, perms)


def _write_artifact(bundle: str, artifact: Artifact) -> None:
    path = os.path.join(bundle, artifact.path)
    os.makedirs(os.path.dirname(path), 0o755, exist_ok=True)
    if artifact.kind == "dir":
        os.makedirs(path, 0o755, exist_ok=True)
        os.chmod(path, artifact.perms)
    elif artifact.kind == "symlink":
        os.symlink(artifact.source, path)
    elif artifact.kind == "mountpoint":
        if os.path.isdir(artifact.source):
            os.makedirs(path, 0o755, exist_ok=True)
        else:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o444))
    else:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as file:
            if artifact.content is not None:
                file.write(artifact.content)
            else:
                _copy_host_file(artifact, file)
        os.chmod(path, artifact.perms)


def _copy_host_file(artifact: Artifact, out: BinaryIO) -> None:
    """Copy into out a host file for a copy, opened as a launch opens it (no symlink on its
    way, a regular file, never waiting on a FIFO swapped in), or a pinned file, opened as the
    pins are (a regular file of bounded size); either read up to the size it had then, and a
    pinned one's digest checked on what was read."""
    import hashlib

    from nsconfine._launch.sources import open_copy_source
    from nsconfine._policy.pins import open_pinned

    source = artifact.source
    try:
        fd = open_copy_source(source) if artifact.sha256 is None else open_pinned(source)[0]
    except OSError as error:
        raise PlanError(
            f"{printable(source)} cannot be copied into the bundle: {error.strerror}"
        ) from error
    digest = None if artifact.sha256 is None else hashlib.sha256()  # (a pinned file's only)
    try:
        left = os.fstat(fd).st_size
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            if digest is not None:
                digest.update(chunk)
            out.write(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    if digest is not None and digest.hexdigest() != artifact.sha256:
        raise PlanError(
            f"{printable(source)} has sha256 {digest.hexdigest()}, not the pinned "
            f"{artifact.sha256}: the harness changed; the bundle is incomplete, remove it"
        )


# ------------------------------------------------------------------ Kubernetes and podman


K8S_ANNOTATION = "nsconfine.io"
SECCOMP_PROFILE_DIR = "nsconfine"  # under the kubelet's seccomp directory


def pod_spec(
    plan: Plan,
    exported: Export,
    argv: Sequence[str] = DEFAULT_COMMAND,
    *,
    name: str = "nsconfine-session",
    image: str = "debian:12-slim",
) -> dict[str, Any]:
    """A Kubernetes Pod running plan's session on the node that holds the bundle: every bind a
    hostPath volume (readOnly as planned), every tmpfs a memory emptyDir, the bundle's files
    and trees by their paths on the node, the seccomp profile as a localhost profile
    (SECCOMP_PROFILE_DIR/NAME.json under the kubelet's seccomp directory), values from --pass-env
    and the credential file from a Secret NAME-env, never written here."""
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    for mount in exported.config["mounts"]:
        kind = mount["type"]
        if kind in ("proc", "devpts") or mount["destination"] in ("/dev", "/dev/shm"):
            continue  # the runtime's own /proc and /dev
        volume = f"v{len(volumes):04d}"
        if kind == "bind":
            volumes.append({"name": volume, "hostPath": {"path": mount["source"]}})
        else:
            memory: dict[str, Any] = {"medium": "Memory"}
            sizes = [o.removeprefix("size=") for o in mount["options"] if o.startswith("size=")]
            if sizes:
                memory["sizeLimit"] = sizes[0]  # bytes: a quantity without a suffix
            volumes.append({"name": volume, "emptyDir": memory})
        read_only = "ro" in mount["options"]
        # None (rprivate), as each bind of the bundle: no mount the node makes later reaches it
        stated: dict[str, Any] = {
            "name": volume,
            "mountPath": mount["destination"],
            "readOnly": read_only,
            "mountPropagation": "None",
        }
        if read_only:  # all the way down, as bwrap's and the bundle's (rro); a node that
            stated["recursiveReadOnly"] = "Enabled"  # cannot refuses the Pod (k8s 1.30+)
        mounts.append(stated)
    env: list[dict[str, Any]] = []
    for variable in plan.env:
        if variable.origin.shown:
            env.append({"name": variable.name, "value": variable.value})
        else:
            secret = {"name": f"{name}-env", "key": variable.name}
            env.append({"name": variable.name, "valueFrom": {"secretKeyRef": secret}})
    root_made = [
        f"{entry.dest} ({how})" for entry, how in exported.notes if "the read-only root" in how
    ]
    annotations = {
        f"{K8S_ANNOTATION}/runs-as": str(plan.user),
        # A pod has no "no network": its own network reaches the cluster's.
        f"{K8S_ANNOTATION}/network": "the host's"
        if plan.network == "host"
        else (
            f"{plan.network} is not expressed: the pod's network reaches the cluster; deny its "
            "egress with a NetworkPolicy"
        ),
        f"{K8S_ANNOTATION}/image-must-provide": "; ".join(root_made),
        f"{K8S_ANNOTATION}/proc-read-only": ", ".join(exported.config["linux"]["readonlyPaths"])
        + ": left to the runtime's default read-only and masked /proc paths (procMount Default)",
        f"{K8S_ANNOTATION}/proc-masked": ", ".join(exported.config["linux"]["maskedPaths"])
        + ": left to the runtime's default masked /proc paths (procMount Default)",
    }
    for number, (entry, how) in enumerate(exported.notes):
        annotations[f"{K8S_ANNOTATION}/entry-{number:04d}"] = (
            f"{entry.kind} {entry.mode} {entry.dest}: {entry.reason} [{how}]"
        )
    for key, what in {**NOT_EXPRESSED, **POD_NOT_EXPRESSED}.items():
        annotations[f"{K8S_ANNOTATION}/not-expressed-{key}"] = what
    container = {
        "name": "session",
        "image": image,
        "command": list(argv),
        "workingDir": plan.chdir,
        "env": env,
        "volumeMounts": mounts,
        "securityContext": {
            "runAsUser": plan.user.uid,
            "runAsGroup": plan.user.gid,
            "runAsNonRoot": True,
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {
                "type": "Localhost",
                "localhostProfile": f"{SECCOMP_PROFILE_DIR}/{name}.json",
            },
        },
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "restartPolicy": "Never",
            "hostNetwork": plan.network == "host",
            "hostPID": False,
            "hostIPC": False,
            "automountServiceAccountToken": False,  # no API credential inside the session
            "enableServiceLinks": False,  # no service addresses in its environment
            "securityContext": {"supplementalGroups": []},
            "containers": [container],
            "volumes": volumes,
        },
    }


def _ulimits(plan: Plan) -> list[str]:
    # podman raises the open-file and process limits by default, which a root without
    # CAP_SYS_RESOURCE (a container's) cannot: the session keeps the launcher's, as under
    # bwrap, its open files lowered to the plan's; its processes are the pids limit's.
    import resource

    limits = ["--pids-limit", str(plan.limits.processes)]
    for name, which in (("nofile", resource.RLIMIT_NOFILE), ("nproc", resource.RLIMIT_NPROC)):
        soft, hard = (-1 if v == resource.RLIM_INFINITY else v for v in resource.getrlimit(which))
        if name == "nofile":
            soft, hard = (v if 0 <= v < plan.limits.open_files else plan.limits.open_files
                          for v in (soft, hard))  # fmt: skip
        limits += ["--ulimit", f"{name}={soft}:{hard}"]
    return [*limits, "--ulimit", "core=0:0"]  # no core dumps, as the reaper


# What podman (containers/common's defaults) masks and makes read-only in /proc and /sys of
# every container by itself: a path of the bundle's it does not cover is masked by name.
PODMAN_MASKED = frozenset({
    "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
    "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware", "/sys/fs/selinux",
    "/sys/dev/block",
})  # fmt: skip
PODMAN_READ_ONLY = frozenset(
    {"/proc/asound", "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}
)


def _podman_masks(linux: dict[str, Any]) -> list[str]:
    """`--security-opt mask=...` for each path the bundle masks or makes read-only that podman
    leaves as the host shows it. podman has no option for a read-only path: those are masked,
    which hides more (/dev, podman's own, is left to it)."""
    hidden = [*linux.get("maskedPaths", ()), *linux.get("readonlyPaths", ())]
    left = [
        path for path in hidden
        if path != "/dev" and path not in PODMAN_MASKED | PODMAN_READ_ONLY
    ]  # fmt: skip
    return ["--security-opt", "mask=" + ":".join(left)] if left else []


def podman_args(
    plan: Plan, exported: Export, bundle: str, argv: Sequence[str] = DEFAULT_COMMAND
) -> list[str]:
    """`podman run` arguments for plan's session over the bundle at bundle: its rootfs as the
    root, the same mounts, user, filter and namespaces; the environment from the bundle's
    env file (0600), never on a command line."""
    if any("\n" in variable.value for variable in plan.env):
        raise PlanError(
            "an environment value holds a newline, which podman's --env-file cannot carry: "
            "run the bundle with runc instead"
        )
    config = exported.config
    own_network = has_own_network(plan.network)
    # --rootfs is a flag: the rootfs is the first argument after the options (below). podman
    # refuses --dns with --network none, and passes the launcher's proxy variables in unless
    # told not to: the session gets exactly the plan's environment.
    arguments = [
        "podman", "run", "--rm", "--rootfs", "--http-proxy=false",
        "--read-only", "--read-only-tmpfs=false", "--no-hosts",
        *(() if own_network else ("--dns=none",)),
        "--network", "none" if own_network else "host",
        "--user", f"{plan.user.uid}:{plan.user.gid}",
        "--cap-drop", "all", "--security-opt", "no-new-privileges", *_ulimits(plan),
        "--shm-size", str(plan.limits.shm),
        *(f"--sysctl={name}={value}" for name, value in ipc_sysctls(plan).items()),
        "--security-opt", f"seccomp={bundle}/seccomp.json",
        "--pid", "private", "--ipc", "private", "--uts", "private", "--cgroupns", "private",
        "--env-file", f"{bundle}/env", "--workdir", plan.chdir,
        *_podman_masks(config["linux"]),
    ]  # fmt: skip
    for mount in config["mounts"]:
        kind, dest = mount["type"], mount["destination"]
        if kind in ("proc", "devpts") or dest in ("/dev", "/dev/shm"):
            continue  # podman's own
        split_on = ",\n" if kind == "bind" else ",:\n"  # --tmpfs is DEST:OPTIONS
        if any(c in path for path in (mount["source"], dest) for c in split_on):
            raise PlanError(
                f"{printable(mount['source'])} -> {printable(dest)}: podman's --mount and "
                "--tmpfs split a path on ',' and ':', so it would become mount options; "
                "run the bundle with runc instead"
            )
        if kind == "bind":
            read_only = ",ro=true" if "ro" in mount["options"] else ""
            spec = f"type=bind,source={mount['source']},destination={dest}{read_only}"
            arguments += ["--mount", spec + ",bind-propagation=rprivate"]
        else:
            options = ",".join(o for o in mount["options"] if o != "nodev")
            arguments += ["--tmpfs", f"{dest}:rw,nodev,{options}"]
    return [*arguments, "--", f"{bundle}/rootfs", *argv]


# ------------------------------------------------------------------ the CLI's side


def print_export(plan: Plan, form: str, bundle: str) -> int:
    """`nsconfine plan --format oci|k8s`: print what oci-bundle writes into bundle (its
    config.json, or its pod.json), hidden values hidden; nothing is written."""
    import json

    exported = export(plan, os.path.abspath(bundle))
    shown = exported.config if form == "oci" else pod_spec(plan, exported)
    print(json.dumps(shown, indent=2))
    return 0


def _shell_word(word: str) -> str:
    """word quoted for a shell; one holding a character a terminal may act on (an escape, a
    tab, a bidi control) as bash's $'...', that character written as its UTF-8 bytes, each
    \\xHH, so that the line shows as it is and runs as it was meant in any locale (bash reads
    \\u and \\U as they are outside a UTF-8 one; a non-UTF-8 byte of a path: \\xHH too)."""
    import shlex

    if word.isprintable():
        return shlex.quote(word)
    quoted = []
    for character in word:
        code = ord(character)
        if character in "\\'":
            quoted.append("\\" + character)
        elif character.isprintable():
            quoted.append(character)
        elif 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (os.fsdecode's escape)
            quoted.append(f"\\x{code - 0xDC00:02x}")
        else:
            quoted += (f"\\x{byte:02x}" for byte in character.encode())
    return "$'" + "".join(quoted) + "'"


def bundle_command(plan: Plan, subcommand: str, directory: str, argv: Sequence[str]) -> int:
    """`nsconfine oci-bundle` and `nsconfine podman-args`: write the bundle; for the latter,
    print the podman command line that runs it."""
    import shlex

    command = tuple(argv) or DEFAULT_COMMAND
    bundle = os.path.abspath(directory)
    exported = write_bundle(plan, bundle, command)
    if subcommand == "podman-args":
        print(" ".join(map(_shell_word, podman_args(plan, exported, bundle, command))))
    else:
        # One line a terminal shows as it is: the path's control characters escaped.
        runs = printable(f"runc run --bundle {shlex.quote(bundle)} NAME")
        print(f"bundle written: {printable(bundle)} ({runs})")
    return 0
