"""A bind's source is the file the plan names, whatever a session did to the path before the
launch: a symlink planted where the next workspace goes, a directory swapped for a symlink
while sessions launch, a directory renamed from under a read-only file, a second hard link,
or a symlink in place of the run directory's home. Each is planted for real between or
during real launches."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import (
    CHILD_PRELUDE,
    SESSION_USER,
    attempt,
    give_to_session_user,
    session,
    session_dirs,
    sh,
    swap_with_symlink,
    unchecked_launcher,
    unlinted_next_plan,
)

import nsconfine
from nsconfine._selftest.report import (
    planted_symlink_leaks,
)
from nsconfine._selftest.world import World

pytestmark = [pytest.mark.confinement, pytest.mark.usefixtures("sandbox_ready")]


@pytest.mark.usefixtures("open_walk")
def test_a_concurrent_swapper_cannot_redirect_a_read_only_bind(tmp_path: Path) -> None:
    """While a host process swaps the workspace's lib/ for a symlink to elsewhere, every
    launch either is refused or shows lib/config.py read-only with its real content: nothing
    is bound read-write that the manifest says is ro, and no secret is read. With the source
    opened by openat2, and by the fallback walk, forced."""
    workspace, run_dir, elsewhere = session_dirs(tmp_path, "ws", "run", "elsewhere")
    lib = workspace / "lib"
    lib.mkdir()
    (lib / "config.py").write_text("real config\n")
    (elsewhere / "config.py").write_text("secret elsewhere\n")
    give_to_session_user(lib, elsewhere)
    plan = session(workspace, run_dir, ro=[lib / "config.py"]).plan()
    probe = f"cat {lib}/config.py; echo tampered >> {lib}/config.py && echo WROTE"
    stop = threading.Event()
    swapper = threading.Thread(target=swap_with_symlink, args=(lib, elsewhere, stop), daemon=True)
    swapper.start()
    outcomes: list[tuple[int, str]] = []
    try:  # 60 launches, and more until 20 have run (how many a swap refuses, the machine says)
        while len(outcomes) < 60 or (
            sum(status != -1 for status, _ in outcomes) < 20 and len(outcomes) < 400
        ):
            outcomes.append(attempt(plan, probe))
    finally:
        stop.set()
        swapper.join()
    ran = [output for status, output in outcomes if status != -1]
    for output in ran:
        assert "WROTE" not in output, outcomes
        assert "secret elsewhere" not in output, outcomes
    assert (elsewhere / "config.py").read_text() == "secret elsewhere\n"
    assert "tampered" not in (lib / "config.py").read_text()
    assert ran, outcomes


def test_a_symlinked_home_in_the_run_dir_is_refused(tmp_path: Path) -> None:
    """A session that replaced run/home with a symlink to elsewhere: the next launch is
    refused by name, and nothing is created there."""
    workspace, run_dir, elsewhere = session_dirs(tmp_path, "ws", "run", "elsewhere")
    plan = session(workspace, run_dir).plan()
    home = run_dir / "home"
    if home.exists():
        home.rmdir()
    home.symlink_to(elsewhere / "planted-home")
    status, output = attempt(plan, "true")
    assert status == -1
    assert "home" in output
    assert not (elsewhere / "planted-home").exists()


def _write_file(path: str) -> None:
    Path(path).write_text("x")


# What a session can leave where a launch makes HOME or a file in it, and what it then is.
_WRONG_KIND: dict[str, tuple[str, Callable[[str], None], str]] = {
    "fifo-home": ("home", os.mkfifo, "a FIFO"),
    "file-home": ("home", _write_file, "a file"),
    "dir-gitconfig": ("home/.gitconfig", os.mkdir, "a directory"),
}


@pytest.mark.parametrize("case", sorted(_WRONG_KIND))
def test_a_mount_point_of_the_wrong_kind_is_a_clear_refusal(tmp_path: Path, case: str) -> None:
    """A session that left its HOME a FIFO or a file, or a directory where the launch writes
    HOME's .gitconfig: bwrap failed, and the launch was refused as a bwrap that cannot fork
    ("check --fresh": attacker's pass, stop 40). The refusal names the path, says what is
    there and what to do; nothing runs."""
    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    relative, make, what = _WRONG_KIND[case]
    plan = session(workspace, run_dir, git_identity="A <a@example.org>").plan()
    assert sh(plan, "true") == (0, "")  # the control: HOME as the launch makes it
    shutil.rmtree(run_dir / "home")
    if case == "dir-gitconfig":
        (run_dir / "home").mkdir()
    make(str(run_dir / relative))
    status, output = attempt(plan, "echo ran")
    assert status == -1, output
    assert f"{run_dir / relative} is {what}" in output, output
    assert "remove it" in output, output
    assert "fork" not in output, output


@pytest.mark.parametrize(
    ("source", "left", "what"),
    [("/etc/hostname", os.mkdir, "a directory"), ("/usr/share/doc", _write_file, "a file")],
    ids=["file-bind-dir-left", "dir-bind-file-left"],
)
def test_a_bind_s_mount_point_of_the_wrong_kind_is_a_clear_refusal(
    tmp_path: Path, source: str, left: Callable[[str], None], what: str
) -> None:
    """A bind into HOME whose mount point a session left of the other kind (a directory where
    a file is bound, or a file where a directory is): the launch was refused as a source
    "replaced while it was checked ... launch again", which launching again never helps
    (review of cb2a3ea, stop 40). Refused by the mount point's name, saying what is there."""
    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    dest = run_dir / "home" / "bound"
    dest.parent.mkdir(exist_ok=True)
    if os.path.isdir(source):
        dest.mkdir()
    else:
        dest.write_text("")
    give_to_session_user(dest.parent)
    bind = nsconfine.Bind(source, str(dest), "ro", "a test's bind")
    plan = session(workspace, run_dir, binds=[bind]).plan()
    # The control: the source shown there (before this review, such a bind, from elsewhere
    # into a writable bind, was refused as "replaced while it was checked", every time).
    shown = f'[ -s {dest} ] || [ -n "$(ls -A {dest})" ] && echo shown'
    assert sh(plan, shown) == (0, "shown\n")
    if dest.is_dir():
        dest.rmdir()
    else:
        dest.unlink()
    left(str(dest))
    status, output = attempt(plan, "echo ran")
    assert status == -1, output
    assert f"{dest} is {what}" in output, output
    assert "replaced" not in output, output


def test_a_read_only_file_in_the_workspace_stays_read_only_after_a_rename(
    tmp_path: Path,
) -> None:
    """`mv lib lib.old` cannot carry a read-only runner file in the workspace away to leave a
    writable one in its place (its directory is a mount point: EBUSY)."""
    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    (lib := workspace / "lib").mkdir()
    (lib / "config.py").write_text("real\n")
    give_to_session_user(lib)
    plan = session(workspace, run_dir, ro=[lib / "config.py"]).plan()
    _, output = attempt(
        plan, f"mv {lib} {lib}.old; mkdir -p {lib}; echo forged > {lib}/config.py; cat {lib}/*"
    )
    assert "forged" not in output, output
    assert (lib / "config.py").read_text() == "real\n"


def test_a_hardlinked_read_only_runner_file_is_refused(tmp_path: Path) -> None:
    """A --ro file inside the workspace with a second, writable name there is refused."""
    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    (runner := workspace / "runner.py").write_text("print(1)\n")
    os.link(runner, workspace / "alias.py")
    give_to_session_user(workspace)
    with pytest.raises(nsconfine.NsconfineError, match=r"runner\.py"):
        nsconfine.spawn(session(workspace, run_dir, ro=[runner]).plan(), ["/bin/true"]).wait()


def test_a_read_only_symlink_inside_another_bind_is_refused_when_planned(tmp_path: Path) -> None:
    """A --ro path that is a symlink inside a directory the plan already binds (`--ro
    /usr/bin/python3`) is bad input, refused when the plan is built and saying what to give
    (attackers' pass: it passed the plan, and bwrap's "Race condition binding dirfd" then
    refused the launch as if bwrap could not confine)."""
    workspace, run_dir, tools = session_dirs(tmp_path, "ws", "run", "tools")
    (tools / "python3.11").write_text("")
    (tools / "python3").symlink_to("python3.11")
    with pytest.raises(nsconfine.PlanError, match=r"python3 is a symlink") as refused:
        session(workspace, run_dir, ro=[tools, tools / "python3"]).plan()
    assert "python3.11" in refused.value.message
    assert session(workspace, run_dir, ro=[tools, tools / "python3.11"]).plan()  # no symlink


def test_a_read_only_path_through_a_symlink_the_session_sees_is_refused_when_planned(
    tmp_path: Path,
) -> None:
    """A --ro path below a symlink the session already sees (a symlinked directory inside a
    directory the plan binds, or the plan's own merged-/usr link: `--ro /bin/true`, /bin ->
    usr/bin) is bad input, refused when the plan is built and saying what to give. (Stop 35's
    third review: bwrap followed the link and mounted where it leads, and every launch was
    refused, the message blaming bwrap.) The path it leads to is taken, and the session reads
    the file by the linked name."""
    workspace, run_dir, tools = session_dirs(tmp_path, "ws", "run", "tools")
    (tools / "real").mkdir()
    (tools / "real" / "lib.py").write_text("loaded\n")
    (tools / "alias").symlink_to("real")
    with pytest.raises(nsconfine.PlanError, match=r"alias, a symlink") as refused:
        session(workspace, run_dir, ro=[tools, tools / "alias" / "lib.py"]).plan()
    assert str(tools / "real" / "lib.py") in refused.value.message
    plan = session(workspace, run_dir, ro=[tools, tools / "real" / "lib.py"]).plan()
    assert attempt(plan, f"cat {tools}/alias/lib.py") == (0, "loaded\n")
    merged = next(link for link in ("/bin", "/lib", "/sbin") if os.path.islink(link))
    program = next(
        f"{merged}/{name}"
        for name in sorted(os.listdir(merged))
        if os.path.isfile(f"{merged}/{name}") and not os.path.islink(f"{merged}/{name}")
    )
    with pytest.raises(nsconfine.PlanError, match=rf"{merged}, a symlink") as refused:
        session(workspace, run_dir, ro=[program]).plan()
    assert os.path.realpath(program) in refused.value.message


@pytest.mark.parametrize("given", ["ro", "tool_socket"])
def test_a_path_reaching_the_workspace_through_a_link_outside_it_is_judged(
    tmp_path: Path, given: str
) -> None:
    """A read-only path (or the tool socket) that reaches the workspace through the host's own
    symlink outside it (alias -> ws), and on through one inside it (ws/tools -> the
    toolchain): the session re-points its link, and the next launch of the same command line
    bound what it chose, any file its account could read (attacker's pass, stop 41: only a
    path under the workspace as written was judged). Refused, naming the link inside the
    workspace; the real path is taken."""
    import socket as _socket

    workspace, run_dir, toolchain = session_dirs(tmp_path, "ws", "run", "toolchain")
    (alias := tmp_path / "alias").symlink_to(workspace)
    with _socket.socket(_socket.AF_UNIX) as server:
        server.bind(str(toolchain / "sock"))
        os.chmod(toolchain / "sock", 0o777)  # (the session's account may connect)
        (workspace / "tools").symlink_to(toolchain)
        give_to_session_user(workspace)

        def given_as(tools: Path) -> dict[str, object]:
            return {"ro": [tools]} if given == "ro" else {"tool_socket": tools / "sock"}

        with pytest.raises(nsconfine.PlanError, match=rf"{workspace}/tools") as refused:
            session(workspace, run_dir, **given_as(alias / "tools")).plan()
        assert "symlink" in str(refused.value)
        assert session(workspace, run_dir, **given_as(toolchain)).plan()


_THROUGH_A_BIND_MOUNT_VIEW = """
import subprocess
workspace, run_dir, view = sys.argv[1], sys.argv[2], sys.argv[4]
subprocess.run(["mount", "--bind", workspace, view], check=True)  # (this mount namespace's own)
try:
    session_plan(workspace, run_dir, sys.argv[3], ro=[view + "/tools/f"])
    print("planned")
except nsconfine.PlanError as refused:
    print(refused)
"""


@pytest.mark.root  # only root makes a bind-mount view (in a mount namespace of the test's own)
def test_a_path_reaching_the_workspace_through_a_bind_mount_view_is_judged(
    tmp_path: Path,
) -> None:
    """A read-only path named through a bind-mount view of the workspace (the host's `mount
    --bind ws view`, no symlink) and on through the session's link inside it: the review of
    faeb2b6 (stop 41) found the way judged by the workspace's path alone, and the bind led
    where the session chose. Refused, naming the link."""
    workspace, run_dir, elsewhere, view = session_dirs(tmp_path, "ws", "run", "elsewhere", "view")
    (elsewhere / "f").write_text("the host's\n")
    (workspace / "tools").symlink_to("../elsewhere")
    give_to_session_user(workspace)
    planned = subprocess.run(
        ["unshare", "-m", "--propagation", "private", sys.executable, "-c",
         CHILD_PRELUDE + _THROUGH_A_BIND_MOUNT_VIEW, str(workspace), str(run_dir),
         SESSION_USER or "", str(view)],
        cwd="/", capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert f"{view}/tools" in planned.stdout, planned
    assert "symlink" in planned.stdout, planned


def test_a_workspace_through_a_symlinked_parent_launches(tmp_path: Path) -> None:
    """A workspace named through a legitimate symlink (made by the host: root's, in a directory
    only root can write) launches. For a launcher whose sessions run as its own account, a
    symlink of that account's could be a session's: refused, naming the real path."""
    session_dirs(tmp_path / "real", "ws", "run")
    (alias := tmp_path / "alias").symlink_to(tmp_path / "real")
    if os.geteuid() == 0:
        plan = session(alias / "ws", alias / "run").plan()
        assert attempt(plan, "true") == (0, "")
    else:
        with pytest.raises(nsconfine.PlanError) as refused:
            session(alias / "ws", alias / "run").plan()
        assert str(tmp_path / "real" / "ws") in str(refused.value)


def test_a_workspace_below_a_symlink_a_session_planted_is_refused(tmp_path: Path) -> None:
    """A session plants `next -> …/checkout` in its workspace, and the broker puts the next
    session's workspace (or run directory) below it, at next/proj: refused, and nothing of the
    checkout is read or written (attacker's pass, stop 38: only a symlink at the workspace's own
    path was refused; one above it led the next session into the checkout)."""
    workspace, run_dir, checkout, next_run = session_dirs(tmp_path, "ws", "run", "checkout", "r2")
    (checkout / "proj").mkdir()
    (checkout / "proj" / "secret.txt").write_text("the checkout's\n")
    give_to_session_user(checkout)
    status, output = attempt(session(workspace, run_dir).plan(), f"ln -s {checkout} next")
    assert (status, output) == (0, "")
    for planted in (
        {"workspace": workspace / "next" / "proj", "run_dir": next_run},
        {"workspace": next_run, "run_dir": workspace / "next" / "proj"},
        # A read-only workspace is no less the broker's path (hostile review, stop 38)
        {"workspace": workspace / "next" / "proj", "run_dir": next_run, "workspace_mode": "ro"},
    ):
        try:
            plan = session(**planted).plan()
        except nsconfine.PlanError as refused:
            status, output = -1, str(refused)
        else:
            status, output = attempt(plan, "cat secret.txt; echo x > written.txt")
        assert status == -1, output
        assert "symlink" in output, output
    assert not (checkout / "proj" / "written.txt").exists()


def test_the_planted_symlink_twin_leaks(world: World) -> None:
    """selftest's planted-symlink check can fail: past the lint, the next session's workspace
    leads into the checkout and its internal file is read."""
    assert planted_symlink_leaks(world) is None
    assert planted_symlink_leaks(world, unchecked_launcher, unlinted_next_plan) is not None
    assert planted_symlink_leaks(world, above=True) is None
    assert planted_symlink_leaks(world, unchecked_launcher, unlinted_next_plan, True) is not None


@pytest.mark.parametrize("kind", ["socket", "fifo"])
def test_a_read_only_socket_or_fifo_is_refused(tmp_path: Path, kind: str) -> None:
    """A read-only bind stops no one connecting to a socket or writing into a FIFO: `--ro` on
    one handed the session a host service (or whoever reads the FIFO), under the reason "a
    file the runner loads" and a network of none (attackers' passes, stop 39: a root
    listener answered the session). Refused, naming --tool-socket; the tool socket itself,
    which says why, is still bound."""
    import socket as _socket

    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    path = tmp_path / kind
    listener = None
    if kind == "socket":
        listener = _socket.socket(_socket.AF_UNIX)
        listener.bind(str(path))
    else:
        os.mkfifo(path, 0o666)
    try:
        with pytest.raises(nsconfine.PlanError, match="tool-socket"):
            session(workspace, run_dir, ro=[path]).plan()
        if listener is not None:  # a writable bind of one reaches the service as well (review)
            os.chmod(path, 0o777)  # (the session's account may connect: nothing else refuses)
            scratch = nsconfine.Bind(str(path), str(path), "rw", "a scratch file")
            with pytest.raises(nsconfine.PlanError, match="tool-socket"):
                session(workspace, run_dir, binds=[scratch]).plan()
        if listener is not None:
            os.chmod(path, 0o777)
            plan = session(workspace, run_dir, tool_socket=path).plan()
            assert any(e.source == str(path) for e in plan.entries)
    finally:
        if listener is not None:
            listener.close()


def test_a_writable_bind_from_elsewhere_onto_a_place_in_the_workspace_launches(
    tmp_path: Path,
) -> None:
    """A writable bind of a directory outside the workspace onto a place inside it (a cache
    kept between tasks, at ws/cache): the plan protects what the host trusts in its source, as
    in any writable tree, but the launch made those mount points in the workspace's own
    ws/cache instead, and every launch was refused ("src/.gitmodules changed since its plan
    was checked", hostile review, stop 44). They are made in the source, and removed after."""
    workspace, run_dir = session_dirs(tmp_path, "ws", "run")
    (cache,) = session_dirs(tmp_path, "cache")
    (workspace / "cache").mkdir()
    give_to_session_user(workspace / "cache")
    bind = nsconfine.Bind(str(cache), str(workspace / "cache"), "rw", "a cache kept between tasks")
    plan = session(workspace, run_dir, binds=[bind]).plan()
    _status, output = sh(
        plan, f"echo kept > {workspace}/cache/note; (echo x > {workspace}/cache/.envrc) 2>&1"
    )
    assert (cache / "note").read_text() == "kept\n", output
    assert not (workspace / "cache" / "note").exists()
    assert "Read-only file system" in output, output
    assert sorted(p.name for p in cache.iterdir()) == ["note"]  # (its mount points removed)
