"""Many runner files are copied, not bound: the sandbox must show exactly the same paths.

bwrap re-reads mountinfo after every bind, so a thousand file binds cost it seconds; past
COPY_FILES_ABOVE files nsconfine copies them into a read-only tmpfs instead. These tests compare
what a session sees both ways, and check that the lint and read-only-ness still hold, and
that a runner file swapped for a FIFO after the plan was built is refused, not waited on.
"""

from __future__ import annotations

import os
import resource
import subprocess
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    SESSION_USER,
    ended_child_output,
    give_to_session_user,
    open_up,
    python_child,
    session,
    session_dirs,
    unchecked_launcher,
)

import nsconfine
from nsconfine import _gate, _session
from nsconfine._plan import model as p
from nsconfine._plan.model import Kind
from nsconfine._selftest.report import run_script

pytestmark = [pytest.mark.confinement, pytest.mark.usefixtures("sandbox_ready")]

COUNT = 40


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, list[str]]:
    """A checkout with COUNT listed files in two directories, and unlisted siblings."""
    checkout = tmp_path / "checkout"
    listed = []
    for index in range(COUNT):
        path = checkout / ("src" if index % 2 else "lib") / f"m{index}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"module {index}\n")
        listed.append(str(path))
    (checkout / "src" / "unlisted.py").write_text("secret sibling\n")
    (checkout / "notes").mkdir()
    (checkout / "notes" / "private.md").write_text("secret\n")
    (checkout / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (checkout / "run.sh").chmod(0o755)
    listed.append(str(checkout / "run.sh"))
    session_dirs(tmp_path, "ws", "run")
    open_up(checkout)
    return tmp_path, listed


def _session_plan(root: Path, listed: list[str]) -> nsconfine.Plan:
    return session(root / "ws", root / "run", ro=listed).plan()


FIND = "find {} | sort; cat {}"


def test_copies_show_the_same_paths_as_binds(
    tree: tuple[Path, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With copies the session sees the same paths and contents as with one bind per file."""
    root, listed = tree
    copied = _session_plan(root, listed)
    assert sum(entry.kind is Kind.COPY for entry in copied.entries) == len(listed)
    monkeypatch.setattr(_session, "COPY_FILES_ABOVE", 10**6)
    bound = _session_plan(root, listed)
    assert not any(entry.kind is Kind.COPY for entry in bound.entries)
    script = FIND.format(root / "checkout", " ".join(listed))
    seen_copied = run_script(copied, script)
    seen_bound = run_script(bound, script)
    assert seen_copied.status == seen_bound.status == 0
    assert seen_copied.stdout == seen_bound.stdout
    assert "unlisted" not in seen_copied.stdout
    assert "private.md" not in seen_copied.stdout


def test_an_unlisted_sibling_would_show_if_bound(tree: tuple[Path, list[str]]) -> None:
    """The comparison can fail: binding the unlisted sibling's directory makes it appear."""
    root, listed = tree
    plan = _session_plan(root, listed)
    notes = str(root / "checkout" / "notes")
    weakened = plan.replace(entries=(*plan.entries, p.ro_bind(notes, notes, "weakened")))
    seen = run_script(weakened, f"find {root / 'checkout'}", unchecked_launcher)
    assert "private.md" in seen.stdout


def test_copies_are_read_only_and_keep_their_modes(tree: tuple[Path, list[str]]) -> None:
    """A copied file cannot be written or replaced, and an executable copy still runs."""
    root, listed = tree
    target = listed[0]
    outcome = run_script(
        _session_plan(root, listed),
        f"echo x >> {target}; rm -f {target}; touch {root}/checkout/lib/new.py; "
        f"{root}/checkout/run.sh",
    )
    assert outcome.stdout == "ran\n"
    assert outcome.stderr.count("Read-only file system") == 3
    assert Path(target).read_text() == "module 0\n"


def test_a_denied_file_is_refused_among_copies(tree: tuple[Path, list[str]]) -> None:
    """The lint judges each copy's source like a bind: one denied file refuses the plan."""
    root, listed = tree
    secret = root / "data" / "store.db"
    secret.parent.mkdir()
    secret.write_text("secret\n")
    session = nsconfine.Session(
        workspace=root / "ws",
        run_dir=root / "run",
        ro=[*listed, str(secret)],
        deny=[root / "data"],
    )
    with pytest.raises(nsconfine.PlanError, match=r"store\.db"):
        session.plan()


def test_the_manifest_says_where_copies_are_made_and_why(tree: tuple[Path, list[str]]) -> None:
    """Every copy is an entry with its reason, and each copy root is a tmpfs made read-only."""
    root, listed = tree
    plan = _session_plan(root, listed)
    copies = [entry for entry in plan.entries if entry.kind is Kind.COPY]
    assert all("copied at launch" in entry.reason for entry in copies)
    roots = {entry.dest for entry in plan.entries if entry.kind is Kind.TMPFS} - {
        "/tmp",
        "/dev/shm",
    }
    remounted = {entry.dest for entry in plan.entries if entry.kind is Kind.REMOUNT_RO}
    assert roots
    assert roots <= remounted
    assert all(any(c.dest.startswith(r + "/") for r in roots) for c in copies)


_SPAWN_WITH_FIFO = r"""
tree = sys.argv[1]
files = [os.path.join(tree, f"f{i}.py") for i in range(20)]
plan = session_plan(sys.argv[2], sys.argv[3], sys.argv[4], ro=files)
os.unlink(files[7])
os.mkfifo(files[7])
try:
    nsconfine.spawn(plan, ["/bin/true"]).wait(timeout=30)
    print("ran")
except nsconfine.PlanError as refused:
    print(refused.code, refused.message)
"""


def test_a_fifo_among_copied_runner_files_is_refused(tmp_path: Path) -> None:
    """A runner file swapped for a FIFO after the plan was built is refused, not waited on."""
    workspace, run_dir, tree = session_dirs(tmp_path, "ws", "run", "tree")
    for i in range(20):
        (tree / f"f{i}.py").write_text(f"print({i})\n")
    give_to_session_user(tree)
    child = python_child(
        _SPAWN_WITH_FIFO, str(tree), str(workspace), str(run_dir), SESSION_USER or "",
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    out, err = ended_child_output(child, 60, "spawn, on the FIFO,")
    assert out.startswith("plan-refused"), out + err
    assert "f7.py" in out


@pytest.fixture
def hostile_tree(tmp_path: Path) -> tuple[Path, Path, list[str]]:
    """Runner files to copy (COUNT of them, in a tree the session account owns: another
    session's workspace, say), one in sub/, and a secret elsewhere, readable by the launcher
    only: (tmp_path, the secret's directory, the listed files)."""
    tree = session_dirs(tmp_path, "ws", "run", "tree")[2]
    listed = []
    for index in range(COUNT):
        (tree / f"f{index}.py").write_text(f"print({index})\n")
        listed.append(str(tree / f"f{index}.py"))
    (tree / "sub").mkdir()
    (tree / "sub" / "config").write_text("benign\n")
    listed.append(str(tree / "sub" / "config"))
    give_to_session_user(tree)
    secrets = tmp_path / "secrets"
    secrets.mkdir(mode=0o700)
    (secrets / "config").write_text("SECRET\n")
    return tmp_path, secrets, listed


def _cat_copied_config(root: Path, plan: nsconfine.Plan) -> str:
    """What a session of plan reads at tree/sub/config (or the refusal's code and message)."""
    return _cat(plan, root / "tree" / "sub" / "config")


def _assert_refused(seen: str, secret: str, code: str) -> None:
    """What _cat gave is a refusal with code, and shows nothing of secret."""
    assert secret not in seen
    assert seen.startswith(f"refused: {code}"), seen


def _cat(plan: nsconfine.Plan, path: Path) -> str:
    """What a session of plan reads at path (or the refusal's code and message)."""
    try:
        sandbox = nsconfine.spawn(plan, ["cat", str(path)], stdout=subprocess.PIPE)
    except nsconfine.NsconfineError as refused:
        return f"refused: {refused.code}: {refused.message}"
    output = sandbox.communicate(timeout=60)[0] or b""
    sandbox.wait()
    return output.decode()


def test_a_symlink_made_above_a_copied_runner_file_is_refused(
    hostile_tree: tuple[Path, Path, list[str]],
) -> None:
    """A directory above a copied runner file replaced by a symlink after the plan was built
    (by a session that can write where it lies) is refused at launch, as it is for a bind:
    the launcher, perhaps root, never copies what lies where it leads (attackers' pass: the
    copy was opened with O_NOFOLLOW, which refuses a symlink only as its last component, and
    a kept plan copied in a root-only file)."""
    root, secrets, listed = hostile_tree
    plan = session(root / "ws", root / "run", ro=listed).plan()
    assert _cat_copied_config(root, plan) == "benign\n"  # the control: copied, and shown
    (root / "tree" / "sub").rename(root / "tree" / "sub.old")
    (root / "tree" / "sub").symlink_to(secrets)
    seen = _cat_copied_config(root, plan)
    _assert_refused(seen, "SECRET", "sandbox-unavailable")


def test_a_copied_runner_file_must_be_the_file_the_lint_judged(
    hostile_tree: tuple[Path, Path, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runner file that is another file when the launch opens it than when the lint judges
    it (a hard link to a denied file, swapped back meanwhile) is refused, as a bind is
    (attackers' pass: copies were never compared with what the lint judged)."""
    root, secrets, listed = hostile_tree
    config = root / "tree" / "sub" / "config"
    plan = session(root / "ws", root / "run", ro=listed, deny=[secrets]).plan()
    assert _cat_copied_config(root, plan) == "benign\n"  # the control
    config.rename(root / "tree" / "sub" / "benign")
    os.link(secrets / "config", config)  # the launch opens the secret...
    judge = _gate.lint

    def lint_once_swapped_back(plan: nsconfine.Plan) -> object:
        os.rename(root / "tree" / "sub" / "benign", config)  # ...the lint, the benign file
        return judge(plan)

    monkeypatch.setattr(_gate, "lint", lint_once_swapped_back)
    seen = _cat_copied_config(root, plan)
    _assert_refused(seen, "SECRET", "sandbox-unavailable")


def test_a_runner_file_written_to_as_bwrap_copies_it_is_copied_as_measured(
    hostile_tree: tuple[Path, Path, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a writer adds to a runner file once the launch has measured it (here: just before
    bwrap starts) is not copied: bwrap copies a sealed snapshot (attackers' pass: bwrap read
    the file to its end, and a file grown while it copied, by a session that can write where
    it lies, filled the copy's tmpfs, half the host's memory)."""
    from nsconfine._kernel import syscalls as _syscalls

    root = hostile_tree[0]
    config = root / "tree" / "sub" / "config"
    plan = session(root / "ws", root / "run", ro=hostile_tree[2]).plan()
    spawn = _syscalls.spawn

    def grown_then_spawned(*args: Any, **kwargs: Any) -> Any:
        with config.open("a") as grown:
            grown.write("appended\n")
        return spawn(*args, **kwargs)

    monkeypatch.setattr(_syscalls, "spawn", grown_then_spawned)
    assert _cat_copied_config(root, plan) == "benign\n"


def test_runner_files_too_large_to_copy_are_refused(
    hostile_tree: tuple[Path, Path, list[str]],
) -> None:
    """A runner file grown past what a launch copies (a sparse file of terabytes costs its
    writer nothing) is refused, saying what to do, rather than copied into memory."""
    root = hostile_tree[0]
    plan = session(root / "ws", root / "run", ro=hostile_tree[2]).plan()
    os.truncate(root / "tree" / "sub" / "config", 1 << 40)
    seen = _cat_copied_config(root, plan)
    assert seen.startswith("refused: plan-refused"), seen
    assert "bind the directory" in seen, seen


def _root_owned_runner_files(tmp_path: Path) -> tuple[Path, Path, Path, list[str]]:
    """The session's directories, and COUNT runner files (mode 0644) in a directory of root's:
    (workspace, run_dir, that directory, the files)."""
    workspace, run_dir, tool = session_dirs(tmp_path, "ws", "run", "tool")
    os.chown(tool, 0, 0)
    files = []
    for index in range(COUNT):
        (path := tool / f"f{index}.txt").write_text(f"{index}\n")
        path.chmod(0o644)
        files.append(str(path))
    return workspace, run_dir, tool, files


@pytest.mark.root  # a file the session's account may not read, the launcher may
def test_a_runner_file_the_session_may_no_longer_read_is_not_copied(tmp_path: Path) -> None:
    """A runner file made unreadable to the session's account after the plan was built (a
    kept plan, a Pool) is refused at launch, as a bind of it would show it unreadable: the
    launcher, root, reads it for the copy (hostile review: a file made 0600 after the plan
    was copied in as the session's own, mode 0644)."""
    workspace, run_dir, tool, files = _root_owned_runner_files(tmp_path)
    plan = session(workspace, run_dir, ro=files).plan()
    secret = tool / "f0.txt"
    secret.write_text("ROOT-ONLY\n")
    secret.chmod(0o600)
    seen = _cat(plan, secret)
    _assert_refused(seen, "ROOT-ONLY", "plan-refused")
    assert "f0.txt" in seen, seen


def _deny_by_acl(path: Path, uid: int) -> None:
    """Give path an access ACL that denies uid everything (user::rw-, user:uid:---, group::r--,
    mask::r--, other::r--), written as the kernel's xattr (no setfacl needed)."""
    import struct

    entries = [(0x01, 6, 0xFFFFFFFF), (0x02, 0, uid), (0x04, 4, 0xFFFFFFFF),
               (0x10, 4, 0xFFFFFFFF), (0x20, 4, 0xFFFFFFFF)]  # fmt: skip
    value = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)
    os.setxattr(path, "system.posix_acl_access", value)


@pytest.mark.root  # a file the session's account may not read, the launcher may
def test_a_runner_file_an_acl_keeps_from_the_session_is_not_copied(tmp_path: Path) -> None:
    """A runner file whose ACL denies the session's account (mode 0644 all the same) is not
    copied by the launcher, root, for the session: nsconfine does not judge ACLs, and a file
    with one is refused for a copy (hostile review of this stop: the session read it, as its
    own 0644 copy, where a bind of it showed Permission denied)."""
    from helpers import session_uid

    workspace, run_dir, tool, files = _root_owned_runner_files(tmp_path)
    secret = tool / "f0.txt"
    secret.write_text("ACL-DENIED\n")
    _deny_by_acl(secret, session_uid())
    plan = session(workspace, run_dir, ro=files).plan()
    seen = _cat(plan, secret)
    _assert_refused(seen, "ACL-DENIED", "plan-refused")
    assert "ACL" in seen, seen


@pytest.mark.root  # a file the session's account may not read, the launcher may
def test_a_runner_file_swapped_after_its_opening_is_judged_as_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session's account may not read the file the launch opened; by the time the file's
    path is looked at again it leads to a decoy it may read, and back to the file by the time
    the lint judges it (a session that can rename where it lies, exchanging the two in a loop:
    hostile review, 17 of 200 launches copied the file in). The file is judged as opened."""
    from nsconfine._launch import sources as _sources

    workspace, run_dir, tool = session_dirs(tmp_path, "ws", "run", "tool")
    files = []
    for index in range(COUNT):
        (path := tool / f"f{index}.txt").write_text(f"{index}\n")
        files.append(str(path))
    give_to_session_user(tool)
    secret, decoy = tool / "f0.txt", tool / "decoy"
    plan = session(workspace, run_dir, ro=files).plan()
    secret.write_text("ROOT-ONLY\n")
    os.chown(secret, 0, 0)
    secret.chmod(0o600)
    decoy.write_text("decoy\n")
    give_to_session_user(decoy)

    def exchange() -> None:
        os.rename(secret, tool / "swap")
        os.rename(decoy, secret)
        os.rename(tool / "swap", decoy)

    opener, judge = _sources._open_regular, _gate.lint

    def opened_then_exchanged(parent: int, source: str) -> int:
        fd = opener(parent, source)
        if source == str(secret):
            exchange()  # the path now leads to the decoy...
        return fd

    def exchanged_back_then_judged(plan: nsconfine.Plan) -> object:
        exchange()  # ...and back to the file when the lint looks
        return judge(plan)

    monkeypatch.setattr(_sources, "_open_regular", opened_then_exchanged)
    monkeypatch.setattr(_gate, "lint", exchanged_back_then_judged)
    seen = _cat(plan, secret)
    _assert_refused(seen, "ROOT-ONLY", "plan-refused")


# A launcher at the usual soft limit of 1,024 fds and the given hard one, launching `cat` of the
# last of the runner files listed on its command line: what it printed, or the refusal's code.
_AT_FD_LIMITS = """
import resource, subprocess
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (1024, min(int(sys.argv[1]), hard)))
workspace, run_dir, user, *files = sys.argv[2:]
try:
    sandbox = nsconfine.spawn(session_plan(workspace, run_dir, user, ro=files),
                              ["cat", files[-1]], stdout=subprocess.PIPE)
except nsconfine.NsconfineError as refused:
    print("refused", refused.code, refused.message)
else:
    print(sandbox.communicate(timeout=60)[0].decode().strip())
"""


@pytest.mark.parametrize(("hard", "expected"), [(2400, "999"), (0, "999"), (2100, "refused")])
def test_a_thousand_runner_files_launch_from_a_launcher_at_the_usual_fd_limit(
    tmp_path: Path, hard: int, expected: str
) -> None:
    """A thousand listed runner files launch from a launcher whose soft fd limit is the usual
    1,024 (Debian's, systemd's) where its hard limit leaves room for two fds of each (about
    2,230 here: the acceptance re-check found them refused with EMFILE past ~450, and the
    review of its fix a launch refused at a hard limit of 3,000 that fits); below that the
    plan is refused, saying what to do."""
    workspace, run_dir, tool = session_dirs(tmp_path, "ws", "run", "tool")
    files = []
    for index in range(1000):
        (path := tool / f"f{index}.txt").write_text(f"{index}\n")
        files.append(str(path))
    open_up(tool)
    suites = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    hard = hard or suites  # 0: the suite's own
    if hard > suites:
        pytest.skip(f"the suite's hard fd limit is below {hard}")  # CI's is 20,000
    child = python_child(
        _AT_FD_LIMITS, str(hard), str(workspace), str(run_dir), SESSION_USER or "", *files,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    printed, errors = child.communicate(timeout=120)
    assert child.returncode == 0, errors
    if expected == "refused":
        assert printed.startswith("refused plan-refused"), printed
        assert "ulimit -Hn" in printed, printed
    else:
        assert printed == f"{expected}\n", (printed, errors)
