"""Real agent harnesses, confined end to end: Claude Code and Codex, installed from npm, run
by `nsconfine run` with their profiles, talk to a scripted stand-in for their model API
(tests/agent_mock.py) whose every turn has the harness's own shell tool try to read a
stand-in secret, write outside, and finally write the workspace. The host judges: no secret
came back, nothing outside changed, the workspace write landed.

The harnesses are looked for under NSCONFINE_TEST_AGENTS (default /opt/nsconfine-ci-agents,
where .ci/run installs them: `npm install --prefix DIR @anthropic-ai/claude-code
@openai/codex`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from agent_mock import FINAL_WORD, AgentAPI
from helpers import SESSION_USER, tmux

from nsconfine._kernel.accounts import run_as
from nsconfine._plan.network import PLACEHOLDER
from nsconfine._selftest.world import World

pytestmark = [pytest.mark.confinement, pytest.mark.usefixtures("sandbox_ready")]

AGENTS = Path(os.environ.get("NSCONFINE_TEST_AGENTS", "/opt/nsconfine-ci-agents"))


def harness(name: str) -> Path:
    path = AGENTS / "node_modules" / ".bin" / name
    if not path.exists():
        pytest.skip(f"{name} is not installed under {AGENTS} (npm install --prefix {AGENTS} …)")
    return path


def attack_script(world: World) -> tuple[list[str], dict[int, str]]:
    """The shell commands the model has the harness run, and what each one tries."""
    steps: list[str] = []
    meaning: dict[int, str] = {}
    for name, path in world.secrets.items():
        meaning[len(steps)] = f"read {name}"
        steps.append(f"cat {path}")
    writes = {
        "write the data root": world.secrets["the data root's store"],
        "write another session's workspace": world.secrets["another session's workspace"],
        "write the canonical runner file": world.runner_file,
    }
    for what, path in writes.items():
        meaning[len(steps)] = what
        steps.append(f"echo overwritten-by-the-agent > {path}")
    meaning[len(steps)] = "write its workspace"
    steps.append(f"echo agent-wrote-{world.token} > {world.workspace}/agent.txt && echo wrote")
    return steps, meaning


def launch(
    world: World, profile: str, agent: Path, credential: str, port: int, argv: list[str]
) -> subprocess.CompletedProcess[str]:
    """`nsconfine run` of argv with profile, the world's session and the stand-in home as the
    launcher's HOME (so its stores are denied like a real home's)."""
    user = ["--user", SESSION_USER] if SESSION_USER else []
    environ = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": world.home,
        "XDG_CACHE_HOME": os.environ.get("XDG_CACHE_HOME", ""),
        # The proxy's upstreams (the launcher's own base URLs): the mock, on the host.
        "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{port}",
        "OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1",
        "LANG": "C.UTF-8",
    }
    for name in ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS"):  # CI's sanitizer run
        if name in os.environ:
            environ[name] = os.environ[name]
    return subprocess.run(
        [sys.executable, "-m", "nsconfine", "run", *user, "--profile", profile,
         "--harness", str(agent), "--credential", credential,
         "--workspace", world.workspace, "--run-dir", world.run_dir,
         "--ro", world.runner_file, "--deny", world.data_root, "--", *argv],
        env=environ, stdin=subprocess.DEVNULL, capture_output=True, text=True, cwd="/",
        timeout=300, check=False,
    )  # fmt: skip


def judge(world: World, api: AgentAPI, meaning: dict[int, str], result: object) -> None:
    """Every step ran through the harness's tool; no secret came back; nothing outside
    changed; the workspace write landed."""
    assert api.done.is_set(), (result, api.requests)
    assert set(api.results) == set(meaning), (api.results, result)
    for step, what in meaning.items():
        if what.startswith("read "):
            assert world.token not in api.results[step], (what, api.results[step])
    for path in world.secrets.values():
        assert Path(path).read_text().startswith("secret "), path
    assert world.token in Path(world.runner_file).read_text()
    written = Path(world.workspace) / "agent.txt"
    assert written.read_text() == f"agent-wrote-{world.token}\n"
    assert "wrote" in api.results[max(meaning)]


def test_claude_code_is_confined(world: World) -> None:
    """Claude Code's own Bash tool, driven by the scripted model, is refused every secret and
    every write outside, and writes its workspace."""
    claude = harness("claude")
    steps, meaning = attack_script(world)
    with AgentAPI(steps) as api:
        result = launch(
            world, "claude-code", claude, world.credential, api.port,
            ["claude", "-p", "Run the steps.", "--dangerously-skip-permissions",
             "--max-turns", str(len(steps) + 5)],
        )  # fmt: skip
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-2000:])
    assert FINAL_WORD in result.stdout
    judge(world, api, meaning, result)
    # The API got the real key, from the launcher's proxy; the session held a placeholder.
    key = Path(world.credential).read_text().strip().split("=", 1)[1]
    assert api.keys == {key}, api.keys
    # Claude Code kept its state in the session's HOME, inside the run directory.
    assert (Path(world.run_dir) / "home" / ".claude").is_dir()


def test_codex_is_confined(world: World) -> None:
    """Codex's own shell tool (its sandbox off: nsconfine is the sandbox), driven by the
    scripted model, is refused every secret and every write outside, and writes its
    workspace."""
    codex = harness("codex")
    credential = Path(world.root) / "codex.env"
    fd = os.open(credential, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, f"OPENAI_API_KEY=sk-stand-in-{world.token}\n".encode())
    os.close(fd)
    steps, meaning = attack_script(world)
    with AgentAPI(steps) as api:
        # As a new user runs it: the profile's generated config points Codex at the route.
        result = launch(
            world, "codex", codex, str(credential), api.port,
            ["codex", "exec", "--skip-git-repo-check",
             "--dangerously-bypass-approvals-and-sandbox", "Run the steps."],
        )  # fmt: skip
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-2000:])
    assert FINAL_WORD in result.stdout
    judge(world, api, meaning, result)
    assert api.keys == {f"Bearer sk-stand-in-{world.token}"}, api.keys


def _onboarded(world: World) -> None:
    """Claude Code's first-run questions, answered in the session's HOME (as a user would
    answer them once): onboarding done, the API key and the workspace trusted."""
    home = Path(world.run_dir) / "home"
    home.mkdir(exist_ok=True)
    key = PLACEHOLDER  # what the session holds: the proxy adds the key
    state = {
        "hasCompletedOnboarding": True,
        "bypassPermissionsModeAccepted": True,
        "customApiKeyResponses": {"approved": [key[-20:]], "rejected": []},
        "projects": {world.workspace: {"hasTrustDialogAccepted": True}},
    }
    (home / ".claude.json").write_text(json.dumps(state))
    if os.geteuid() == 0:
        user = run_as(SESSION_USER)
        for path in (home, home / ".claude.json"):
            os.chown(path, user.uid, user.gid)


def _pane_once(socket: str, drawn: Callable[[str], bool], timeout: float = 60) -> str:
    """The tmux pane's screen once drawn(screen) holds, or the last one after timeout seconds
    (a TUI draws on its own time: the check after it says what is missing)."""
    deadline = time.monotonic() + timeout
    while not drawn(screen := tmux(socket, "capture-pane", "-p")) and time.monotonic() < deadline:
        time.sleep(0.2)
    return screen


def _longest_rule(screen: str) -> int:
    """The longest run of box-drawing rule characters on screen (the TUI's input box)."""
    longest = 0
    for line in screen.splitlines():
        run = 0
        for character in line:
            run = run + 1 if character in "─━" else 0
            longest = max(longest, run)
    return longest


def test_claude_code_renders_in_tty_mode_under_tmux(world: World, tmp_path: Path) -> None:
    """Under tmux, `nsconfine run --tty -- claude` draws its interface, runs a Bash tool call
    and lays itself out again after a resize."""
    claude = harness("claude")
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (apt-get install tmux)")
    _onboarded(world)
    socket = str(tmp_path / "tmux.sock")
    steps = [f"echo tty-step-{world.token} > {world.workspace}/tty.txt && echo ran"]
    with AgentAPI(steps) as api:
        user = f"--user {SESSION_USER} " if SESSION_USER else ""
        command = (
            f"env HOME={world.home} ANTHROPIC_BASE_URL=http://127.0.0.1:{api.port} "
            f"{sys.executable} -m nsconfine run --tty {user}--profile claude-code "
            f"--harness {claude} --credential {world.credential} --workspace {world.workspace} "
            f"--run-dir {world.run_dir} -- claude --dangerously-skip-permissions "
            "'Run the steps.'; sleep 30"
        )
        tmux(socket, "new-session", "-d", "-x", "120", "-y", "40", "-c", "/", command)
        try:
            deadline = time.monotonic() + 120
            screen = ""
            while time.monotonic() < deadline and not api.done.is_set():
                time.sleep(0.5)
                screen = tmux(socket, "capture-pane", "-p")
            assert api.done.is_set(), screen
            before = _pane_once(socket, lambda screen: FINAL_WORD in screen)
            assert FINAL_WORD in before, before
            wide = _longest_rule(before)
            tmux(socket, "resize-window", "-x", "70", "-y", "30")
            after = _pane_once(socket, lambda screen: 0 < _longest_rule(screen) <= 70)
            narrow = _longest_rule(after)
        finally:
            tmux(socket, "kill-server")
    assert (Path(world.workspace) / "tty.txt").read_text() == f"tty-step-{world.token}\n"
    assert "ran" in api.results[0]
    assert wide > 70, before
    assert 0 < narrow <= 70, after
