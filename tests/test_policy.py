"""The policy lint on real files: no bind may expose a home, its credential stores, or a denied
path, judged by what the bind's source resolves to."""

from __future__ import annotations

import os
import pwd
from collections.abc import Sequence
from pathlib import Path
from subprocess import PIPE

import pytest
from helpers import session

import nsconfine
from nsconfine._errors import PlanError
from nsconfine._plan import model as p
from nsconfine._plan.model import Kind, Plan
from nsconfine._policy import lint as _lint
from nsconfine._session import Session, build_plan

STORE_NAMES = [*(name for name, _ in _lint.HOME_CREDENTIAL_STORES), _lint.RECORDS]


def plan_for(
    standin_home: Path,
    ws_run: tuple[Path, Path],
    *,
    ro: Sequence[str | Path] = (),
    deny: Sequence[str | Path] = (),
    credential: Path | None = None,
) -> Plan:
    """The checked plan of a session on ws_run, with home as the stand-in home."""
    workspace, run_dir = ws_run
    session = Session(workspace=workspace, run_dir=run_dir, ro=ro, deny=deny, credential=credential)
    return build_plan(session, homes=[str(standin_home)], environ={})


def refused(
    standin_home: Path,
    ws_run: tuple[Path, Path],
    *,
    ro: Sequence[str | Path] = (),
    deny: Sequence[str | Path] = (),
    credential: Path | None = None,
) -> str:
    """The message of the PlanError the session's plan is refused with."""
    with pytest.raises(PlanError) as refusal:
        plan_for(standin_home, ws_run, ro=ro, deny=deny, credential=credential)
    assert refusal.value.code == "plan-refused"
    return refusal.value.message


def bound_sources(plan: Plan) -> set[str]:
    """The host paths a plan binds."""
    return {entry.source for entry in plan.entries if entry.kind is Kind.BIND}


def make_store(standin_home: Path, name: str) -> Path:
    """Create the credential store `name` in home as a directory holding one secret file."""
    store = standin_home / name
    store.mkdir(parents=True, exist_ok=True)
    (store / "secret").write_text("s3cret\n")
    return store


def test_allowed_ro_bind_is_in_the_plan(standin_home: Path, ws_run: tuple[Path, Path]) -> None:
    """A file in the home outside every store may be bound (the control for every refusal)."""
    plan = plan_for(standin_home, ws_run, ro=[standin_home / "notes.txt"])
    assert str(standin_home / "notes.txt") in bound_sources(plan)


@pytest.mark.parametrize("name", STORE_NAMES)
def test_credential_store_itself_is_refused(
    standin_home: Path, ws_run: tuple[Path, Path], name: str
) -> None:
    """Binding a credential store of the home is refused, naming the store."""
    store = make_store(standin_home, name)
    message = refused(standin_home, ws_run, ro=[store])
    assert f"is or contains {store} " in message


@pytest.mark.parametrize("name", STORE_NAMES)
def test_path_inside_credential_store_is_refused(
    standin_home: Path, ws_run: tuple[Path, Path], name: str
) -> None:
    """Binding anything inside a credential store is refused, naming the store."""
    store = make_store(standin_home, name)
    message = refused(standin_home, ws_run, ro=[store / "secret"])
    assert f"lies inside {store} " in message


@pytest.mark.parametrize("name", STORE_NAMES)
def test_sibling_named_like_a_store_is_allowed(
    standin_home: Path, ws_run: tuple[Path, Path], name: str
) -> None:
    """A path whose name only starts with a store's name (`.ssh-notes`) is not inside it."""
    make_store(standin_home, name)
    sibling = standin_home / (name + "-notes")
    sibling.write_text("not a secret\n")
    assert str(sibling) in bound_sources(plan_for(standin_home, ws_run, ro=[sibling]))


@pytest.mark.parametrize(
    "relative", [".ssh/id_ed25519", ".config/app/secrets", ".config/app", ".ssh"]
)
def test_named_secrets_are_refused(
    standin_home: Path, ws_run: tuple[Path, Path], relative: str
) -> None:
    """Binding ~/.ssh, a key in it, or an application's secrets under ~/.config is refused."""
    store = standin_home / relative.split("/")[0]
    message = refused(standin_home, ws_run, ro=[standin_home / relative])
    assert str(store) in message


@pytest.mark.parametrize("above", [0, 1, 2], ids=["home", "parent", "grandparent"])
def test_home_and_above_are_refused(
    standin_home: Path, ws_run: tuple[Path, Path], above: int
) -> None:
    """Binding the home itself or a directory containing it is refused, naming the home."""
    target = standin_home
    for _ in range(above):
        target = target.parent
    message = refused(standin_home, ws_run, ro=[target])
    assert f"is or contains {standin_home} " in message


def test_symlink_into_ssh_is_refused_by_its_target(
    standin_home: Path, ws_run: tuple[Path, Path], tmp_path: Path
) -> None:
    """A symlink outside the home that points into ~/.ssh is judged by what it resolves to."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    to_key = elsewhere / "innocent-looking"
    to_key.symlink_to(standin_home / ".ssh" / "id_ed25519")
    to_store = elsewhere / "also-innocent"
    to_store.symlink_to(standin_home / ".ssh")
    message = refused(standin_home, ws_run, ro=[to_key])
    assert str(to_key) in message
    assert f"-> {standin_home / '.ssh' / 'id_ed25519'}" in message
    assert str(standin_home / ".ssh") in message
    assert str(standin_home / ".ssh") in refused(standin_home, ws_run, ro=[to_store])


def test_symlink_to_harmless_file_is_allowed(
    standin_home: Path, ws_run: tuple[Path, Path], tmp_path: Path
) -> None:
    """A symlink to a file outside every store is allowed (the control for the symlink test)."""
    link = tmp_path / "link"
    link.symlink_to(standin_home / "notes.txt")
    assert str(link) in bound_sources(plan_for(standin_home, ws_run, ro=[link]))


def test_root_is_refused(standin_home: Path, ws_run: tuple[Path, Path], tmp_path: Path) -> None:
    """Binding `/`, directly or through a symlink, is refused."""
    refused(standin_home, ws_run, ro=["/"])
    to_root = tmp_path / "to-root"
    to_root.symlink_to("/")
    assert "resolves to /" in refused(standin_home, ws_run, ro=[to_root])


def test_check_plan_refuses_a_bind_of_root() -> None:
    """check_plan refuses a hand-built plan binding `/` at any destination."""
    with pytest.raises(PlanError, match="resolves to /"):
        _lint.check_plan(Plan([p.ro_bind("/", "/host", "everything")]))


def test_deny_path_and_inside_it_are_refused(
    standin_home: Path, ws_run: tuple[Path, Path], tmp_path: Path
) -> None:
    """A --deny path, anything inside it, and anything containing it cannot be bound."""
    secret = tmp_path / "data-root"
    (secret / "sub").mkdir(parents=True)
    (secret / "sub" / "file").write_text("x\n")
    outside = tmp_path / "outside"
    (outside / "secret").mkdir(parents=True)
    for bound in (secret, secret / "sub", secret / "sub" / "file"):
        assert str(secret) in refused(standin_home, ws_run, ro=[bound], deny=[secret])
    assert str(outside / "secret") in refused(
        standin_home, ws_run, ro=[outside], deny=[outside / "secret"]
    )
    # The same binds pass without the rule: the refusals above are the rule's doing.
    assert str(secret) in bound_sources(plan_for(standin_home, ws_run, ro=[secret]))


def test_missing_source_is_a_clear_refusal(
    standin_home: Path, ws_run: tuple[Path, Path], tmp_path: Path
) -> None:
    """A read-only path that does not exist, or a dangling symlink, is refused by name."""
    missing = tmp_path / "no-such-file"
    message = refused(standin_home, ws_run, ro=[missing])
    assert str(missing) in message
    assert "does not exist" in message
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "gone")
    message = refused(standin_home, ws_run, ro=[dangling])
    assert str(dangling) in message
    assert "No such file" in message


def test_check_plan_refuses_a_missing_source() -> None:
    """check_plan refuses a hand-built bind whose source is gone, naming it."""
    plan = Plan([p.ro_bind("/nonexistent/nsconfine-test", "/x", "gone")])
    with pytest.raises(PlanError, match="/nonexistent/nsconfine-test"):
        _lint.check_plan(plan)


@pytest.mark.parametrize("what", ["workspace", "run_dir"])
def test_real_home_as_workspace_or_run_dir_is_refused(tmp_path: Path, what: str) -> None:
    """The invoking user's real home, or `/` above it, cannot be the workspace or run dir."""
    real_home = pwd.getpwuid(os.getuid()).pw_dir
    if not os.path.isdir(real_home):
        pytest.skip(f"the invoking user's home {real_home} does not exist on this host")
    if os.stat(real_home).st_uid != os.getuid():
        # A home the account does not own (games: /usr/games) holds no credential store of
        # its, and is not denied (lint._owns_home); test_stand_in_home_* cover the refusal.
        pytest.skip(f"the invoking user does not own its home {real_home}")
    other = tmp_path / "other"
    other.mkdir()
    for where in (real_home, "/"):
        workspace, run_dir = (where, other) if what == "workspace" else (other, where)
        with pytest.raises(PlanError, match="is the home directory") as refusal:
            build_plan(Session(workspace=workspace, run_dir=run_dir), environ={})
        assert real_home in refusal.value.message


@pytest.mark.parametrize("what", ["workspace", "run_dir"])
@pytest.mark.parametrize("above", [0, 1, 2], ids=["home", "parent", "grandparent"])
def test_stand_in_home_as_workspace_or_run_dir_is_refused(
    standin_home: Path, tmp_path: Path, what: str, above: int
) -> None:
    """The stand-in home, or a directory above it, cannot be the workspace or run dir."""
    where = standin_home
    for _ in range(above):
        where = where.parent
    other = tmp_path / "other"
    other.mkdir()
    workspace, run_dir = (where, other) if what == "workspace" else (other, where)
    session = Session(workspace=workspace, run_dir=run_dir)
    with pytest.raises(PlanError, match="is the home directory") as refusal:
        build_plan(session, homes=[str(standin_home)], environ={})
    assert str(standin_home) in refusal.value.message


def test_workspace_inside_home_outside_stores_is_allowed(standin_home: Path) -> None:
    """A workspace and run dir inside the home but outside every store are bound read-write."""
    workspace, run_dir = standin_home / "work" / "s1", standin_home / "work" / "s1-run"
    workspace.mkdir(parents=True)
    run_dir.mkdir()
    plan = build_plan(
        Session(workspace=workspace, run_dir=run_dir), homes=[str(standin_home)], environ={}
    )
    writable = {e.source for e in plan.entries if e.kind is Kind.BIND and e.mode == "rw"}
    assert writable == {str(workspace), str(run_dir)}
    assert plan.chdir == str(workspace)


def test_workspace_inside_a_store_is_refused(standin_home: Path, tmp_path: Path) -> None:
    """A workspace under ~/.config is refused: it would expose the store read-write."""
    workspace = standin_home / ".config" / "ws"
    workspace.mkdir()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with pytest.raises(PlanError, match="lies inside") as refusal:
        build_plan(
            Session(workspace=workspace, run_dir=run_dir), homes=[str(standin_home)], environ={}
        )
    assert str(standin_home / ".config") in refusal.value.message


def test_credential_file_cannot_be_bound(
    standin_home: Path, ws_run: tuple[Path, Path], tmp_path: Path
) -> None:
    """The session's credential file, or a directory holding it, cannot also be bound."""
    keep = tmp_path / "keep"
    keep.mkdir()
    credential = keep / "session.env"
    credential.write_text("TOKEN=abc\n")
    credential.chmod(0o600)
    for bound in (credential, keep):
        message = refused(standin_home, ws_run, credential=credential, ro=[bound])
        assert str(credential) in message
        assert "credential" in message
    # Without the bind the same session is fine: the refusal is the bind's.
    plan_for(standin_home, ws_run, credential=credential)


def test_workspace_holding_the_credential_is_refused(standin_home: Path, tmp_path: Path) -> None:
    """A workspace that contains the credential file would expose it, so it is refused."""
    workspace, run_dir = tmp_path / "ws", tmp_path / "run"
    workspace.mkdir()
    run_dir.mkdir()
    credential = workspace / "session.env"
    credential.write_text("TOKEN=abc\n")
    credential.chmod(0o600)
    session = Session(workspace=workspace, run_dir=run_dir, credential=credential)
    with pytest.raises(PlanError, match="credential"):
        build_plan(session, homes=[str(standin_home)], environ={})


def _violated_rule(source: str, rules: list[p.DenyRule]) -> p.DenyRule | None:
    found = _lint.Judge(rules).violated(source)
    return None if found is None else found[0]


def test_a_deny_rule_judges_paths_not_prefixes() -> None:
    """A deny rule matches whole path components: /a/bc is neither in nor above /a/b."""
    rules = [p.DenyRule("/a/b", "secret")]
    assert _violated_rule("/a/b", rules) is rules[0]
    assert _violated_rule("/a/b/c", rules) is rules[0]
    assert _violated_rule("/a", rules) is rules[0]
    assert _violated_rule("/a/bc", rules) is None
    assert _violated_rule("/a/b/c", [p.DenyRule("/a/b", "home", inside=False)]) is None


# ------------------------------------------------------------------ the host's /proc and /dev


@pytest.mark.parametrize(
    ("source", "dest", "mode"),
    [
        ("/proc", "/hostproc", "ro"),  # every process's environment, the launcher's among them
        ("/proc/self", "/launcher", "ro"),  # the launcher's own /proc/PID
        ("/proc/1", "/proc/1", "ro"),
        ("/proc/sys", "/hostsys", "ro"),  # a system entry's source, at another destination
        ("/proc/sys", "/writable-sys", "rw"),  # ... or writable
        ("/dev", "/hostdev", "rw"),  # host devices and /dev/shm
        ("/dev/shm", "/shm", "rw"),  # (at /dev/shm itself it would meet the plan's own)
        ("/dev/pts", "/pts", "ro"),
        # magic links out of /proc: resolved by the launcher, they name its own directories
        ("/proc/self/cwd", "/cwd", "ro"),
        ("/proc/self/root/etc/hostname", "/hostname", "ro"),
        ("/etc/hostname", "/proc/1/root/etc/hostname-too", "ro"),  # a destination in /proc
    ],
)
def test_the_hosts_proc_and_dev_cannot_be_bound(
    ws_run: tuple[Path, Path], source: str, dest: str, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No session bind exposes the host's procfs or devices: the sandbox has its own /proc and
    /dev; only the system's read-only covers of /proc's writable parts come from the host's.
    (From a working directory of its own: /proc/self/cwd at / is refused as the whole host.)"""
    monkeypatch.chdir(ws_run[0])
    bind = nsconfine.Bind(source, dest, mode, "asked for")
    with pytest.raises(PlanError, match=r"host's /proc|host's /dev"):
        session(*ws_run, binds=[bind]).plan()


def test_a_dev_shm_that_links_elsewhere_is_not_taken_for_dev(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host whose /dev/shm is a symlink (to /run/shm, or a directory of its root file
    system): the lint takes /dev's own file systems by what lies there, not by where a link
    leads, or every bind of the root file system (/usr) would be refused as the host's /dev."""
    from nsconfine._policy import lint

    link = tmp_path / "shm"
    link.symlink_to("/")
    monkeypatch.setattr(lint, "_SUB_MOUNTS", (str(link),))
    assert os.stat("/").st_dev not in lint._kernel_file_systems()


def test_the_cli_cannot_bind_the_launchers_own_proc(ws_run: tuple[Path, Path]) -> None:
    """--ro /proc/self (the launcher's own /proc entry) is refused as the host's /proc."""
    with pytest.raises(PlanError, match="host's /proc"):
        session(*ws_run, ro=["/proc/self"]).plan()


def test_the_systems_read_only_proc_covers_still_pass(ws_run: tuple[Path, Path]) -> None:
    """The control: the plan's own read-only binds over /proc (/proc/sys) pass the lint."""
    plan = session(*ws_run).plan()
    assert any(e.kind is Kind.BIND and e.dest == "/proc/sys" for e in plan.entries)


def test_a_deep_missing_path_is_resolved_without_keeping_each_of_its_parents(
    tmp_path: Path,
) -> None:
    """A rule's path missing below a directory keeps that directory resolved, and the missing
    rest as written. The memo that many rules share holds the few missing directories just
    below what resolves (~/.config), not every parent of a deep path: one of 2,000 missing
    components kept 8 MB of its parents' names, 500 of them (what a command line holds) 4 GB
    (found by a fuzzing pass)."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to("real")
    deep = "a/" * 2000
    memo: dict[str, str] = {}
    resolved = _lint._resolve_missing(f"{tmp_path}/link/{deep}key", memo)
    assert resolved == f"{tmp_path}/real/{deep}key"
    assert len(memo) <= 8, len(memo)
    assert memo[f"{tmp_path}/link/a"] == f"{tmp_path}/real/a"
    # another rule below the same missing directory is resolved the same from the memo
    assert _lint._resolve_missing(f"{tmp_path}/link/a/b", memo) == f"{tmp_path}/real/a/b"


def test_the_mount_tree_places_a_deep_path_without_keeping_each_of_its_parents() -> None:
    """Where a path lies is walked from the root mount into the mount seen at each mount point
    on its way (the last stacked there). What is remembered is the mount points met, not
    every parent of a deep path: 500 deny rules of 2,030 components each kept 2 GB of their
    parents' names (found by the review of the lint's own memo fix)."""
    from nsconfine._kernel.mountinfo import MountTree

    table = "\n".join(
        [
            "1 0 8:1 / / rw - ext4 /dev/sda1 rw",
            "2 1 8:2 / /home rw - ext4 /dev/sda2 rw",
            "3 1 0:9 /views/home /home rw - ext4 /dev/sda3 rw",  # stacked on /home: seen
            "4 2 8:4 / /home/hidden rw - ext4 /dev/sda4 rw",  # below the hidden one: unseen
        ]
    )
    tree = MountTree(table)
    deep = "/home/" + "a/" * 2030 + "key"
    assert tree.seen_at(deep) == ("/home", "0:9", "/views/home")
    assert tree.seen_at("/home/hidden/key") == ("/home", "0:9", "/views/home")
    assert tree.seen_at("/homework/key") == ("/", "8:1", "/")
    assert len(tree._seen) <= 8, len(tree._seen)


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
@pytest.mark.parametrize(
    "chdir",
    ["/nonexistent", "/etc/passwd", "{workspace}/missing", "/dev/null", "/proc/keys",
     "{workspace}/tovar", "/opt/tools/absolute", "{workspace}/up-after-a-link",
     "{workspace}/chain40"],
)  # fmt: skip
def test_a_working_directory_the_sandbox_lacks_is_refused(
    ws_run: tuple[Path, Path], chdir: str
) -> None:
    """A plan whose working directory is no directory in the sandbox (a plan edited through
    the API) was refused by bwrap alone, and the launch told as sandbox-unavailable, with the
    advice for a bwrap at its process limit (attacker's pass, stop 41). The lint refuses it,
    naming it; one bwrap makes (the root, a parent of a place, an entry's own, a directory in
    a bind) is run in. A link in a bind is followed as the sandbox follows it (its reviews: an
    absolute one to the bind's own host path leads nowhere there; `..` after a link goes up
    from where the link led; a chain of links within the kernel's bound)."""
    workspace, tools = ws_run[0], ws_run[0].parent / "tools"
    (workspace / "tovar").symlink_to("/var")  # (the sandbox has no /var: it leads nowhere)
    (workspace / "tosub").symlink_to("sub")
    (workspace / "sub").mkdir()
    (tools / "sub").mkdir(parents=True)
    (tools / "absolute").symlink_to(tools / "sub")
    (tools / "relative").symlink_to("sub")
    (workspace / "d" / "e").mkdir(parents=True)
    (workspace / "rel").symlink_to("d/e")
    (workspace / "up-after-a-link").symlink_to("rel/../d")  # (the kernel: d/d, no such)
    (workspace / "down-after-a-link").symlink_to("rel/../e")  # (the kernel: d/e)
    (workspace / "chain0").symlink_to("d")
    for link in range(1, 41):  # chainN is N+1 links to d: chain40, 41, past the kernel's 40
        (workspace / f"chain{link}").symlink_to(f"chain{link - 1}")
    plan = session(*ws_run).plan()
    plan = plan.replace(entries=(*plan.entries, p.ro_bind(str(tools), "/opt/tools", "tools")))
    with pytest.raises(nsconfine.PlanError, match="working directory"):
        nsconfine.spawn(plan.replace(chdir=chdir.format(workspace=workspace)), ["pwd"])
    merged = next(link for link in ("/bin", "/lib", "/sbin") if os.path.islink(link))
    for there, real in (
        *((path, os.path.realpath(path)) for path in ("/", "/usr/bin", "/tmp", "/dev/pts")),
        ("/proc/sys", "/proc/sys"), (merged, os.path.realpath(merged)),
        (str(workspace), str(workspace)), (f"{workspace}/sub", f"{workspace}/sub"),
        (f"{workspace}/tosub", f"{workspace}/sub"), ("/opt/tools/relative", "/opt/tools/sub"),
        (f"{workspace}/down-after-a-link", f"{workspace}/d/e"),
        (f"{workspace}/chain9", f"{workspace}/d"),  # (10: the kernel is sure of it, see lint.py)
    ):  # fmt: skip
        sandbox = nsconfine.spawn(plan.replace(chdir=there), ["pwd", "-P"], stdout=PIPE)
        out, _ = sandbox.communicate()
        assert (sandbox.returncode, out) == (0, f"{real}\n".encode()), there


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
@pytest.mark.parametrize("chdir", ["{workspace}/a\0b", "{workspace}/\udc80\ud800"])
def test_a_working_directory_no_path_can_name_is_refused(
    ws_run: tuple[Path, Path], chdir: str
) -> None:
    """A working directory with a NUL or a lone surrogate, which no path holds: the lint's
    look raised a bare ValueError (the review of 880f351, stop 41). Refused."""
    plan = session(*ws_run).plan()
    with pytest.raises(nsconfine.PlanError):
        nsconfine.spawn(plan.replace(chdir=chdir.format(workspace=ws_run[0])), ["pwd"])


@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
def test_a_read_only_workspace_its_account_may_not_enter_is_refused(
    ws_run: tuple[Path, Path],
) -> None:
    """A read-only workspace the session's account may not search (mode 0600): an
    unprivileged launcher, whose sessions are its own account, took it for one it could
    enter, and bwrap refused it as a set-up failure (the review of 880f351, stop 41)."""
    workspace, run_dir = ws_run
    plan = session(workspace, run_dir, workspace_mode="ro").plan()
    mode = workspace.stat().st_mode & 0o7777
    workspace.chmod(0o600)
    try:
        with pytest.raises(nsconfine.PlanError, match="working directory"):
            nsconfine.spawn(plan, ["true"])
    finally:
        workspace.chmod(mode)


@pytest.mark.root  # (a launcher's own sessions could not plan a workspace it may not list)
@pytest.mark.confinement
@pytest.mark.usefixtures("sandbox_ready")
def test_a_working_directory_below_one_the_account_may_not_search_is_refused(
    ws_run: tuple[Path, Path],
) -> None:
    """A directory on the way that the session's account may not search (mode 000, root's)
    passed a root launcher's look, which lstat()s as root, and bwrap refused it as a set-up
    failure (the review of 45d353c, stop 41)."""
    workspace, run_dir = ws_run
    (workspace / "locked" / "in").mkdir(parents=True)
    plan = session(workspace, run_dir).plan()
    (workspace / "locked").chmod(0)
    try:
        with pytest.raises(nsconfine.PlanError, match="working directory"):
            nsconfine.spawn(plan.replace(chdir=f"{workspace}/locked/in"), ["pwd"])
    finally:
        (workspace / "locked").chmod(0o755)
