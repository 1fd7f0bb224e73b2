"""The plan model: entries are well-formed and reasoned, plans ordered, manifests complete."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import pytest

from nsconfine._errors import PlanError
from nsconfine._kernel.accounts import RunAs
from nsconfine._plan import model as p
from nsconfine._plan.model import DenyRule, Entry, EnvVar, Kind, Mode, Origin, Plan

ENTRY_KEYS = {"kind", "source", "dest", "mode", "reason"}


def sample_plan() -> Plan:
    """A small plan with one entry of every kind, given out of execution order."""
    return Plan(
        [
            p.remount_ro("/", "read-only root"),
            p.rw_bind("/srv/ws", "/srv/ws", "the workspace"),
            p.directory("/srv/ws/home", "an empty HOME"),
            p.data(b"root:x:0:0::/:/bin/sh\n", "/etc/passwd", "names root only"),
            p.tmpfs("/tmp", "a private /tmp"),
            p.ro_bind("/usr", "/usr", "system programs", sha256="ab" * 32),
            p.symlink("usr/bin", "/bin", "merged /usr"),
            p.proc("/proc", "own pids"),
            p.dev("/dev", "harmless devices"),
            p.devpts("its own ptys"),
            p.copy("/srv/runner.py", "/srv/ws/runner.py", "a runner file, copied", 0o644),
        ],
        env=[
            EnvVar("HOME", "/srv/ws/home", Origin.NSCONFINE),
            EnvVar("FROM_LAUNCHER", "launcher-value-1f3a", Origin.LAUNCHER),
            EnvVar("TOKEN", "credential-value-9c2e", Origin.CREDENTIAL),
        ],
        chdir="/srv/ws",
        deny=[DenyRule("/root/.ssh", "SSH keys"), DenyRule("/root", "home", inside=False)],
    )


# Characters that show as nothing, or nothing but a blank: a no-break space, a Hangul filler
# (a letter to str.isalnum), a braille blank (a symbol), a zero-width space and a joiner
# (format characters), a combining mark on nothing.
BLANK_LOOKING = [
    "\u00a0", "\u3164\u3164", "\u2800", "\u200b\u2060", "\u115f\u1160", "\u0301",
    "\U0001d159 \u200b",  # a musical null notehead, drawn as nothing (its review, stop 40)
]  # fmt: skip


@pytest.mark.parametrize("reason", ["", " ", "\t\n  ", *BLANK_LOOKING])
def test_entry_without_reason_is_refused(reason: str) -> None:
    """An entry whose reason is empty, only whitespace or only what shows as blank cannot be
    built (attacker's pass, stop 39: a reason of Hangul fillers was accepted)."""
    with pytest.raises(PlanError, match="no reason") as refused:
        p.tmpfs("/tmp", reason)
    assert refused.value.code == "plan-refused"
    assert refused.value.exit_status == 65


@pytest.mark.parametrize("reason", ["a private /tmp", "私用の /tmp", "\u3164x", "—"])
def test_entry_with_reason_is_built(reason: str) -> None:
    """An entry with a reason is built and keeps it, in any script (the control for the
    refusal above)."""
    assert p.tmpfs("/tmp", reason).reason == reason


@pytest.mark.parametrize(
    "dest", ["tmp", "", "./tmp", "/tmp/", "/tmp/../etc", "/tmp/./x", "/tmp//x", "/a/.."]
)
def test_destination_must_be_absolute_and_normalized(dest: str) -> None:
    """A relative or non-normalized destination is refused."""
    with pytest.raises(PlanError, match="absolute, normalized") as refused:
        p.tmpfs(dest, "a reason")
    assert refused.value.code == "plan-refused"


def test_double_slash_destination_is_refused() -> None:
    """A destination with two leading slashes is not normalized and is refused."""
    with pytest.raises(PlanError):
        p.tmpfs("//tmp", "a reason")


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(lambda: Entry(Kind.BIND, "/x", Mode.RO, "why"), id="bind-without-source"),
        pytest.param(lambda: Entry(Kind.SYMLINK, "/x", Mode.RO, "why"), id="symlink-no-target"),
        pytest.param(
            lambda: Entry(Kind.TMPFS, "/x", Mode.RW, "why", source="/host"), id="tmpfs-source"
        ),
        pytest.param(lambda: Entry(Kind.DIR, "/x", Mode.RW, "why", source="/h"), id="dir-source"),
        pytest.param(lambda: Entry(Kind.PROC, "/x", Mode.RW, "why", source="/h"), id="proc-src"),
        pytest.param(lambda: Entry(Kind.DATA, "/x", Mode.RO, "why"), id="data-without-content"),
        pytest.param(
            lambda: Entry(Kind.TMPFS, "/x", Mode.RW, "why", content=b"x"), id="tmpfs-content"
        ),
        pytest.param(
            lambda: Entry(Kind.BIND, "/x", Mode.RO, "why", source="/h", content=b"x"),
            id="bind-content",
        ),
        pytest.param(
            lambda: Entry(Kind.TMPFS, "/x", Mode.RW, "why", sha256="ab" * 32), id="tmpfs-pin"
        ),
        pytest.param(lambda: p.rw_bind("/h\0x", "/x", "why"), id="nul-in-source"),
        pytest.param(lambda: p.tmpfs("/x\0y", "why"), id="nul-in-dest"),
        pytest.param(lambda: p.tmpfs("/", "why"), id="tmpfs-over-root"),
        pytest.param(lambda: p.rw_bind("/srv", "/", "why"), id="bind-over-root"),
    ],
)
def test_kind_needs_the_right_source_and_content(build: Callable[[], Entry]) -> None:
    """An entry whose source, content or digest does not fit its kind is refused."""
    with pytest.raises(PlanError) as refused:
        build()
    assert refused.value.code == "plan-refused"


def test_every_kind_builds_with_its_own_fields() -> None:
    """Each kind builds when given exactly the fields it needs (the control for the above)."""
    entries = sample_plan().entries
    assert {entry.kind for entry in entries} == set(Kind)
    assert p.remount_ro("/", "read-only root").dest == "/"


def test_plan_sorts_parents_before_children_and_remount_last() -> None:
    """A plan puts every entry after those above it, and remount-ro entries after all others."""
    entries = sample_plan().entries
    dests = [entry.dest for entry in entries]
    for index, entry in enumerate(entries):
        for parent in entries[index + 1 :]:
            assert not entry.dest.startswith(parent.dest.rstrip("/") + "/") or (
                parent.kind is Kind.REMOUNT_RO
            ), f"{parent.dest} comes after its child {entry.dest}: {dests}"
    assert entries[-1].kind is Kind.REMOUNT_RO
    assert all(entry.kind is not Kind.REMOUNT_RO for entry in entries[:-1])
    assert dests.index("/srv/ws") < dests.index("/srv/ws/home")


def test_plan_sorts_a_child_given_first_after_its_parent() -> None:
    """A tmpfs given after a bind below it is still set up first, so it cannot hide the bind."""
    plan = Plan([p.rw_bind("/srv/ws", "/tmp/ws", "ws"), p.tmpfs("/tmp", "tmp")])
    assert [entry.dest for entry in plan.entries] == ["/tmp", "/tmp/ws"]


def test_plan_refuses_duplicate_destinations() -> None:
    """Two entries at the same destination are refused, naming it."""
    with pytest.raises(PlanError, match="/tmp") as refused:
        Plan([p.tmpfs("/tmp", "one"), p.rw_bind("/srv", "/tmp", "two")])
    assert refused.value.code == "plan-refused"


def test_plan_refuses_duplicate_environment_names() -> None:
    """Setting one environment variable twice is refused, naming it."""
    with pytest.raises(PlanError, match="TOKEN") as refused:
        Plan(
            [p.tmpfs("/tmp", "tmp")],
            env=[
                EnvVar("TOKEN", "a", Origin.NSCONFINE),
                EnvVar("OTHER", "b", Origin.NSCONFINE),
                EnvVar("TOKEN", "c", Origin.CREDENTIAL),
            ],
        )
    assert refused.value.code == "plan-refused"


def test_without_drops_exactly_the_entry_at_dest() -> None:
    """`without(dest)` returns the plan less that entry, keeping env, chdir and deny rules."""
    plan = sample_plan()
    smaller = plan.without("/tmp")
    assert [e.dest for e in smaller.entries] == [e.dest for e in plan.entries if e.dest != "/tmp"]
    assert (smaller.env, smaller.chdir, smaller.deny) == (plan.env, plan.chdir, plan.deny)
    assert "/tmp" in [e.dest for e in plan.entries]  # the original is unchanged


def test_without_an_absent_dest_is_refused() -> None:
    """`without` of a destination the plan does not have is refused, naming it."""
    with pytest.raises(PlanError, match="/nowhere"):
        sample_plan().without("/nowhere")


def test_manifest_has_a_row_per_entry_with_its_reason() -> None:
    """The manifest table has a header and one row per entry showing kind, mode, dest, reason."""
    plan = sample_plan()
    lines = plan.manifest().splitlines()
    assert lines[0].split() == ["KIND", "MODE", "DEST", "SOURCE", "REASON"]
    rows = lines[1 : 1 + len(plan.entries)]
    for row, entry in zip(rows, plan.entries, strict=True):
        assert row.split()[:3] == [str(entry.kind), str(entry.mode), entry.dest]
        assert row.endswith(entry.reason)
        assert entry.source_label in row
    assert lines[1 + len(plan.entries)] == ""
    assert "working directory: /srv/ws" in lines


def test_to_json_entry_keys_are_exact() -> None:
    """Each manifest entry has exactly kind, source, dest, mode, reason, plus sha256, perms,
    content or capacity only where the entry has one."""
    plan = sample_plan()
    record = plan.to_json()
    assert set(record) == {
        "user",
        "kept_groups",
        "entries",
        "env",
        "chdir",
        "deny",
        "network",
        "network_reason",
        "destinations",
        "routes",
        "audit",
        "credential_needed",
        "nested_userns",
        "protection",
        "limits",
        "layers",
    }
    assert len(record["entries"]) == len(plan.entries)
    for entry, shown in zip(plan.entries, record["entries"], strict=True):
        extra = set()
        if entry.sha256 is not None:
            extra.add("sha256")
            assert shown["sha256"] == entry.sha256
        if entry.perms is not None:
            extra.add("perms")
            assert shown["perms"] == f"{entry.perms:04o}"
        if entry.content is not None:
            extra.add("content")
            assert shown["content"] == entry.content.decode()
        if entry.capacity is not None:
            extra.add("capacity")
            assert shown["capacity"] == entry.capacity
        assert set(shown) == ENTRY_KEYS | extra
        assert (shown["kind"], shown["dest"], shown["mode"], shown["reason"]) == (
            str(entry.kind),
            entry.dest,
            str(entry.mode),
            entry.reason,
        )
    assert record["chdir"] == "/srv/ws"
    assert record["deny"][1] == {
        "path": "/root",
        "reason": "home",
        "inside": False,
        "origin": "",
        "matches_now": True,
        "mask": False,
    }
    assert json.loads(plan.manifest_json()) == record


def test_secret_environment_values_are_hidden() -> None:
    """Launcher and credential values show as (hidden) in both manifests; nsconfine's own show."""
    plan = sample_plan()
    shown = {v["name"]: v for v in plan.to_json()["env"]}
    assert shown["HOME"] == {"name": "HOME", "value": "/srv/ws/home", "origin": "nsconfine"}
    assert shown["FROM_LAUNCHER"] == {
        "name": "FROM_LAUNCHER",
        "value": "(hidden)",
        "origin": "launcher",
    }
    assert shown["TOKEN"] == {"name": "TOKEN", "value": "(hidden)", "origin": "credential"}
    for text in (plan.manifest(), plan.manifest_json(), repr(plan)):
        assert "launcher-value-1f3a" not in text
        assert "credential-value-9c2e" not in text
    assert "  TOKEN=(hidden)  [credential]" in plan.manifest().splitlines()
    assert "  HOME=/srv/ws/home  [nsconfine]" in plan.manifest().splitlines()


def test_plans_and_sessions_copy_and_pickle(ws_run: tuple[Any, Any]) -> None:
    """A Plan, a Session and their records copy, deep-copy and pickle, each rebuilt through its
    own checks, equal to the original (broker's pass, stop 32: a broker handing a plan to a
    worker process, or deep-copying its configuration, got "Plan is immutable")."""
    import copy
    import pickle

    from helpers import session

    made = session(*ws_run)
    plan = made.plan()
    for value in (plan, made, plan.entries[0]):
        assert copy.copy(value) == value
        assert copy.deepcopy(value) == value
        assert pickle.loads(pickle.dumps(value)) == value


def test_the_manifest_says_which_supplementary_groups_an_unprivileged_launcher_keeps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An unprivileged launcher's session keeps its supplementary groups (its user namespace
    denies setgroups), and reads in what it is given what they may: a `root:messagebus 0640`
    file in a --ro directory (attacker's pass, stop 39), while the manifest said only "runs as:
    uid, gid". The manifest names them; a root launcher's sessions keep none."""
    plan = sample_plan().replace(user=RunAs("someone", 1001, 1001))
    monkeypatch.setattr(os, "geteuid", lambda: 1001)
    monkeypatch.setattr(os, "getgroups", lambda: [1001, 102, 4])
    assert "keeps the launcher's supplementary groups 4, 102" in plan.manifest()
    assert plan.to_json()["kept_groups"] == [4, 102]
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert "supplementary" not in plan.manifest()
    assert plan.to_json()["kept_groups"] == []


def test_the_manifest_says_when_an_unprivileged_launcher_s_sessions_keep_gid_0(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An unprivileged launcher whose primary group is gid 0 (a container platform's
    arbitrary uid) runs its sessions as host gid 0, which it cannot change, and the manifest
    said only "gid 0" (attackers' pass, stop 44). It says what that group may; a root
    launcher refuses such a session (test_root)."""
    plan = sample_plan().replace(user=RunAs("someone", 1001, 0))
    monkeypatch.setattr(os, "geteuid", lambda: 1001)
    monkeypatch.setattr(os, "getgroups", lambda: [0])
    assert "its group is gid 0, root's" in plan.manifest()
    plan = sample_plan().replace(user=RunAs("someone", 1001, 1001))
    assert "root's" not in plan.manifest()


@pytest.mark.parametrize(
    "build",
    [
        lambda: p.data("text, not bytes", "/d", "a file"),  # type: ignore[arg-type]
        lambda: p.tmpfs(5, "a private /tmp"),  # type: ignore[arg-type]
        lambda: p.tmpfs("/tmp", None),  # type: ignore[arg-type]
        lambda: p.ro_bind(b"/usr", "/usr", "system programs"),  # type: ignore[arg-type]
        lambda: p.copy("/etc/hosts", "/etc/hosts", "names", "0644"),  # type: ignore[arg-type]
        lambda: Entry(Kind.TMPFS, "/tmp", "rx", "a private /tmp"),  # type: ignore[arg-type]
        lambda: Entry(Kind.TMPFS, "/tmp", None, "a private /tmp"),  # type: ignore[arg-type]
        lambda: sample_plan().replace(entries=None),
        lambda: sample_plan().replace(entries=5),
        lambda: sample_plan().replace(env=None),
        lambda: sample_plan().replace(deny=3),
    ],
)
def test_a_record_of_the_wrong_type_is_a_usage_error(build: Callable[[], object]) -> None:
    """An entry or plan built by hand with a value of the wrong type is refused as it is
    built, not with a TypeError deep in a launch (attacker's pass, stop 40: data() of a str
    passed the lint, and spawn() raised cffi's TypeError; replace(entries=None) Python's)."""
    from nsconfine._errors import UsageError

    with pytest.raises(UsageError):
        build()


def test_an_entry_takes_a_kind_and_mode_by_their_values() -> None:
    """A kind or mode given as the manifest writes it ("ro") is the member it names, as
    `entry.mode is Mode.RO` reads it."""
    entry = p.tmpfs("/tmp", "a private /tmp").replace(mode="ro", kind="tmpfs")
    assert entry.mode is Mode.RO
    assert entry.kind is Kind.TMPFS


def test_a_control_character_is_named_where_it_is() -> None:
    """A destination holding a NUL, under a plain source, is named, not the source (review,
    stop 40: "/tmp holds a control character" for a dest of "/x\\0y")."""
    with pytest.raises(PlanError, match=r"/x\\x00y holds a control character"):
        Entry(Kind.BIND, "/x\0y", Mode.RO, "a bind", "/tmp")
    with pytest.raises(PlanError, match=r"/t\\nmp holds a control character"):
        Entry(Kind.BIND, "/x", Mode.RO, "a bind", "/t\nmp")
