"""The README says what is true: its Python quickstart runs as written, every relative link in
it and in docs/ leads somewhere, and its CLI reference names exactly the subcommands there are."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import SESSION_USER, open_up, session_uid

REPOSITORY = Path(__file__).resolve().parent.parent
README = REPOSITORY / "README.md"
DOCUMENTS = [README, *sorted((REPOSITORY / "docs").glob("*.md"))]
# [text](target) and [text](target "title"); images too. Autolinks and bare URLs are not links
# to check.
LINK = re.compile(r"\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")


def _section(text: str, heading: str) -> str:
    """The body of the `## heading` section of a Markdown text."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def _fenced(section: str, language: str) -> list[str]:
    """The fenced code blocks of language in section, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)


def _anchors(path: Path) -> set[str]:
    """The anchors GitHub makes for path's headings: lowercase, punctuation but `-` and `_`
    dropped, spaces made hyphens (code fences' `#` lines are no headings)."""
    text = re.sub(r"^```.*?^```$", "", path.read_text(), flags=re.MULTILINE | re.DOTALL)
    anchors = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.MULTILINE):
        anchors.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return anchors


def _relative_links(path: Path) -> list[str]:
    text = re.sub(r"^```.*?^```$", "", path.read_text(), flags=re.MULTILINE | re.DOTALL)
    return [
        target
        for target in LINK.findall(text)
        if not re.match(r"[a-z][a-z0-9+.-]*:", target)  # https:, mailto:
    ]


@pytest.mark.confinement
def test_the_python_quickstart_runs_as_written(sandbox_ready: None, tmp_path: Path) -> None:
    """The README's Python quickstart, run unchanged in a fresh interpreter (as root, with
    SESSION_USER naming the tests' session account, as the README says), prints the manifest
    and the session's output, and its note lands in the host's workspace, owned by the
    session's account."""
    blocks = _fenced(_section(README.read_text(), "Quickstart"), "python")
    assert len(blocks) == 1, "the quickstart has one Python block"
    temporary = tmp_path / "tmp"  # where the quickstart's tempfile.mkdtemp makes its places
    temporary.mkdir()
    open_up(temporary)
    environment = {**os.environ, "TMPDIR": str(temporary)}
    environment.pop("SESSION_USER", None)
    if SESSION_USER:
        environment["SESSION_USER"] = SESSION_USER
    finished = subprocess.run(
        [sys.executable, "-c", blocks[0]],
        cwd="/",  # the installed package, not the source tree
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert finished.returncode == 0, finished.stderr
    output = finished.stdout
    assert "KIND" in output, output  # the manifest's table
    assert "runs as:" in output, output
    account = SESSION_USER or subprocess.check_output(["id", "-un"], text=True).strip()
    assert f"\n{account}\n" in output, output  # id -un, inside
    assert "/etc/shadow: No such file or directory" in output, output
    assert "status 1\n" in output, output  # cat's status, the command's
    notes = list(temporary.glob("coder-*/ws/note.txt"))
    assert len(notes) == 1, notes
    assert notes[0].read_text() == "hello\n"  # $GREETING, from setenv
    assert notes[0].stat().st_uid == session_uid()
    assert "the workspace holds: hello" in output


@pytest.mark.confinement
def test_the_shell_quickstart_runs_as_written(sandbox_ready: None, tmp_path: Path) -> None:
    """The README's command-line quickstart does what its comments say: the manifest, a run
    whose `ls` of the host's ~/.ssh fails and whose note lands, and explain saying ~/.ssh is
    not visible (review of stop 44: only the Python block was run). As root, its commented
    lines, as the README says, with the tests' session account and the test's own directory
    for /srv/demo; unprivileged, HOME is the test's own."""
    [block] = _fenced(_section(README.read_text(), "Quickstart"), "sh")
    lines = block.splitlines()
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)  # there to be listed, but for the sandbox
    (home / ".ssh" / "id_ed25519").write_text("a key\n")
    demo = home / "work" / "demo"
    if SESSION_USER:
        prefix = "# as root: "
        lines = [line.removeprefix(prefix) for line in lines if line.startswith(prefix)] + [
            line for line in lines[2:] if not line.startswith(prefix)
        ]
        demo = tmp_path / "srv" / "demo"
        open_up(tmp_path)
    script = (
        "\n".join(lines)
        .replace("/srv/demo", str(demo))
        .replace("nobody", SESSION_USER or "nobody")  # (the chown, and --user)
        .replace(".venv/bin/nsconfine", str(Path(sys.executable).parent / "nsconfine"))
    )
    finished = subprocess.run(
        ["bash", "-c", script],
        cwd="/",
        env={**os.environ, "HOME": str(home)} if not SESSION_USER else None,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert "Traceback" not in finished.stderr, finished.stderr
    assert "KIND" in finished.stdout, finished.stdout  # the manifest's table
    ssh = f"{os.path.expanduser('~') if SESSION_USER else home}/.ssh"
    assert f"ls: cannot access '{ssh}'" in finished.stderr, finished.stderr
    assert (demo / "ws" / "note.txt").read_text() == "hi\n"
    explained = [line for line in finished.stdout.splitlines() if line.startswith(f"{ssh}: ")]
    assert explained, finished.stdout
    assert "not visible" in explained[0], finished.stdout


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: path.name)
def test_every_relative_link_leads_somewhere(document: Path) -> None:
    """Each relative link of the README and docs/ names a file (or folder) of the repository,
    and its #anchor, where it has one into a Markdown file, a heading there."""
    links = _relative_links(document)
    assert links or document.name == "options.md", f"{document.name} links nowhere"
    for target in links:
        place, _, anchor = target.partition("#")
        path = (document.parent / place).resolve() if place else document
        assert path.exists(), f"{document.name}: {target} leads nowhere"
        assert path.is_relative_to(REPOSITORY), f"{document.name}: {target} leaves the repository"
        if anchor and path.suffix == ".md":
            assert anchor in _anchors(path), f"{document.name}: {target}: no such heading"


def test_the_docs_are_all_linked_from_the_readme() -> None:
    """Every file of docs/ is reachable from the README's own links."""
    linked = {
        (README.parent / target.partition("#")[0]).resolve() for target in _relative_links(README)
    }
    unlinked = [path.name for path in DOCUMENTS[1:] if path.resolve() not in linked]
    assert not unlinked, f"docs the README does not link: {unlinked}"


def test_the_cli_reference_names_each_subcommand_once() -> None:
    """The README's CLI reference has one line per subcommand, and its subcommands are
    exactly those `nsconfine --help` lists."""
    reference = _fenced(_section(README.read_text(), "CLI"), "")[0]
    named = re.findall(r"^nsconfine ([a-z][a-z-]*)", reference, re.MULTILINE)
    usage = subprocess.run(
        [sys.executable, "-m", "nsconfine", "--help"],
        cwd="/",
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    listed = re.search(r"\{([a-z,-]+)\}", usage)
    assert listed is not None, usage
    assert sorted(named) == sorted(set(named)), f"a subcommand has two lines: {named}"
    assert sorted(named) == sorted(listed[1].split(","))
