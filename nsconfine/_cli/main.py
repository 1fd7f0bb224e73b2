"""The command line: `nsconfine SUBCOMMAND`, one per entry of _SUBCOMMANDS (check, plan, run,
explain, oci-bundle, podman-args, profiles, selftest).

Refusals print one line, `nsconfine: CODE: what was refused and what to do`, and exit with the
code's sysexits status; nothing runs and no traceback is shown.
"""

from __future__ import annotations

import errno
import io
import os
import sys

# signal's own C module: importing signal imports enum (~1-2 ms of every command line's start)
from _signal import SIG_DFL, SIGCHLD, signal  # type: ignore[import-not-found]
from collections.abc import Callable, Sequence

from nsconfine._errors import NsconfineError, UsageError, working_directory_exists
from nsconfine._plan.options import REQUIRED, SESSION_OPTIONS, SWITCH, Option, help_text
from nsconfine._text import path_too_long, printable

TYPE_CHECKING = False  # see nsconfine/_launch/stage.py
if TYPE_CHECKING:
    from argparse import ArgumentParser, _ActionsContainer
    from typing import Any, NoReturn

    from nsconfine._cli.argparser import Parser
    from nsconfine._plan.model import Plan
    from nsconfine._session import Session

    Flags = list[tuple[str, dict[str, Any]]]  # each flag, and what add_argument is given for it


EXEC_FAILED_STATUS = 127  # as a shell: the command was not found or could not be executed
DEFAULT_GRACE_SECONDS = 10.0


class Arguments:
    """The parsed command line: argparse's Namespace, without importing argparse (both parsers
    fill one)."""

    subcommand: str
    command: list[str]  # run's, oci-bundle's and podman-args'

    if TYPE_CHECKING:

        def __getattr__(self, name: str) -> Any: ...


def _seconds(text: str) -> float:
    import math

    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        from argparse import ArgumentTypeError  # argparse says it (see _quick_parse)

        raise ArgumentTypeError(f"{text!r} is not a number of seconds (0 or more)")
    return value


def _session_flag(option: Option) -> dict[str, Any]:
    """How option's flag is parsed (its help aside), as add_argument takes it."""
    spec: dict[str, Any] = {"dest": option.name}
    if option.shape == SWITCH:
        spec["action"] = "store_false" if option.default is True else "store_true"
    else:
        spec["metavar"] = option.metavar
        if option.choices:
            spec["choices"] = option.choices
        if option.repeatable:
            spec.update(action="append", default=[])
        spec["required"] = option.default is REQUIRED
    return spec


def _add_session_options(parser: ArgumentParser) -> None:
    """The session's flags: one per row of nsconfine._plan.options that has one."""
    from nsconfine._cli.argparser import Renamed

    group = parser.add_argument_group("session")
    for option in SESSION_OPTIONS:
        if option.flag is None:
            continue
        group.add_argument(
            option.flag, **_session_flag(option), help=help_text(option, as_flags=True)
        )
        for old in option.old_flags:
            group.add_argument(old, action=Renamed, now=option.flag)


# Each subcommand's own flags, for both parsers (see _quick_parse).
_CHECK_FLAGS: Flags = [
    ("--json", {"action": "store_true"}),
    (
        "--fresh",
        {
            "action": "store_true",
            "help": "prove bwrap again (its options, a canary session) rather than take the "
            "proof remembered for this very binary, as every launch does",
        },
    ),
]
_PLAN_SHOWN_FLAGS: Flags = [  # what plan prints: one of them at most
    ("--json", {"action": "store_true", "help": "the manifest as JSON"}),
    (
        "--bwrap-args",
        {
            "action": "store_true",
            "help": "the options bwrap reads from --args 3, as a JSON array "
            "(values from --pass-env and the credential file shown as (hidden))",
        },
    ),
    (
        "--format",
        {
            "choices": ("oci", "k8s"),
            "help": "oci: the OCI runtime spec (config.json) of the bundle at --bundle; k8s: a "
            "Kubernetes Pod (hidden values shown as (hidden), or from a Secret)",
        },
    ),
]
_PLAN_FLAGS: Flags = [
    (
        "--bundle",
        {
            "metavar": "DIR",
            "help": "with --format: where `nsconfine oci-bundle` writes (or wrote) the bundle "
            "(default ./nsconfine-bundle)",
        },
    ),
]
_RUN_FLAGS: Flags = [
    (
        "--grace",
        {
            "type": _seconds,
            "default": DEFAULT_GRACE_SECONDS,
            "metavar": "SECONDS",
            "help": "after a signal is passed on to the command, how long it may take to end "
            "before the whole session is killed; a second signal kills at once (default "
            f"{DEFAULT_GRACE_SECONDS:g})",
        },
    ),
    (
        "--tty",
        {
            "action": "store_true",
            "help": "give the command a terminal of its own (job control, Ctrl-C and Ctrl-Z for "
            "its foreground job, window-size changes), copied to and from this one",
        },
    ),
]


def _add(container: _ActionsContainer, flags: Flags) -> None:
    for flag, spec in flags:
        container.add_argument(flag, **spec)


_COMMAND = "[--] CMD [ARG...]"  # a command after the flags: argparse.REMAINDER


def _check_options(check: ArgumentParser) -> None:
    _add(check, _CHECK_FLAGS)


def _plan_options(plan: ArgumentParser) -> None:
    _add_session_options(plan)
    _add(plan.add_mutually_exclusive_group(), _PLAN_SHOWN_FLAGS)
    _add(plan, _PLAN_FLAGS)


def _run_options(run: ArgumentParser) -> None:
    from argparse import REMAINDER

    _add_session_options(run)
    _add(run, _RUN_FLAGS)
    run.add_argument("command", nargs=REMAINDER, metavar=_COMMAND)


def _explain_options(explain: ArgumentParser) -> None:
    explain.add_argument("path", metavar="PATH")
    _add_session_options(explain)


def _bundle_options(bundle: ArgumentParser) -> None:
    from argparse import REMAINDER

    _add_session_options(bundle)
    bundle.add_argument("directory", metavar="DIR", help="the bundle: a new or empty dir")
    bundle.add_argument("command", nargs=REMAINDER, metavar=_COMMAND)


def _selftest_options(selftest: ArgumentParser) -> None:
    selftest.add_argument("--json", action="store_true")
    selftest.add_argument(
        "--user",
        metavar="NAME",
        help="as root: the account the stand-in sessions run as (default: nobody)",
    )


# Each subcommand: its help line and what adds its options.
_SUBCOMMANDS: dict[str, tuple[str, Callable[[ArgumentParser], None] | None]] = {
    "check": ("preflight: is this host ready to confine?", _check_options),
    "plan": ("print a session's manifest", _plan_options),
    "run": ("run a command confined", _run_options),
    "explain": ("would a session see PATH, through which entry, or why not", _explain_options),
    "oci-bundle": ("write an OCI bundle that runs the session under runc", _bundle_options),
    "podman-args": (
        "write the bundle, print the `podman run` command that runs it",
        _bundle_options,
    ),
    "profiles": ("list the built-in profiles", None),
    "selftest": ("prove confinement on this host", _selftest_options),
}


def _parser(wanted: str | None = None) -> Parser:
    """The command line's parser. With wanted, the subcommand the arguments name, only its
    options are built: a launcher's `nsconfine run` does not pay ~2 ms for the others'."""
    from nsconfine._cli.argparser import Parser

    parser = Parser(
        prog="nsconfine",
        description="Confine a session with bubblewrap.",
        epilog="NSCONFINE_BWRAP=PATH selects the bwrap (default: bwrap on PATH).",
    )
    commands = parser.add_subparsers(dest="subcommand", required=True, parser_class=Parser)
    for name, (help_line, add_options) in _SUBCOMMANDS.items():
        if wanted is None or name == wanted:
            subcommand = commands.add_parser(name, help=help_line)
            if add_options is not None:
                add_options(subcommand)
    return parser


def _quick_flags(subcommand: str) -> tuple[Flags, Flags, bool] | None:
    """The flags of a subcommand the quick parser reads, those of them that exclude each other,
    and whether a command follows them; None for the others (argparse parses them)."""
    if subcommand == "check":
        return _CHECK_FLAGS, [], False
    if subcommand not in ("plan", "run"):
        return None
    session = [(o.flag, _session_flag(o)) for o in SESSION_OPTIONS if o.flag is not None]
    if subcommand == "plan":
        return [*session, *_PLAN_SHOWN_FLAGS, *_PLAN_FLAGS], _PLAN_SHOWN_FLAGS, False
    return [*session, *_RUN_FLAGS], [], True


def _quick_parse(argv: Sequence[str]) -> Arguments | None:
    """argv parsed as argparse parses it, for `check`, `plan` and `run` written plainly (each
    flag in full, each value a word of its own not starting with -, the command after the
    flags), without importing argparse (with gettext) or building its parser: ~2.5 ms of every
    `nsconfine run`. None for anything else (a help request, an abbreviation, --flag=VALUE, a
    former flag, a value argparse would refuse): argparse then parses it, and refuses it in its
    own words. Both read the same flag tables; tests/test_cli.py compares their results."""
    known = _quick_flags(argv[0]) if argv else None
    if known is None:
        return None
    flags, exclusive, takes_command = known
    arguments = Arguments()
    arguments.subcommand = argv[0]
    specs = {}
    for flag, spec in flags:
        dest = spec.get("dest") or flag[2:].replace("-", "_")
        specs[flag] = (dest, spec)
        default = spec.get("default")  # argparse's defaults: a switch's is its opposite
        if "default" not in spec and spec.get("action") in ("store_true", "store_false"):
            default = spec["action"] == "store_false"
        setattr(arguments, dest, list(default) if isinstance(default, list) else default)
    given = set()
    at = 1
    while at < len(argv) and argv[at].startswith("-") and argv[at] != "--":
        found = specs.get(argv[at])
        if found is None:
            return None
        dest, spec = found
        given.add(argv[at])
        action = spec.get("action")
        if action in ("store_true", "store_false"):
            setattr(arguments, dest, action == "store_true")
            at += 1
            continue
        if at + 1 == len(argv) or argv[at + 1].startswith("-"):
            return None  # no value, or one argparse may take for a flag
        value: object = argv[at + 1]
        if "type" in spec:
            try:
                value = spec["type"](value)
            except Exception:  # argparse says what is wrong with it
                return None
        if value not in spec.get("choices", (value,)):
            return None
        if action == "append":
            getattr(arguments, dest).append(value)
        else:
            setattr(arguments, dest, value)
        at += 2
    command = list(argv[at:])
    if command and not takes_command:
        return None
    if takes_command:
        arguments.command = command  # "--" and all: argparse.REMAINDER keeps it
    if any(spec.get("required") and flag not in given for flag, spec in flags):
        return None
    if len(given & {flag for flag, _ in exclusive}) > 1:
        return None
    return arguments


def _session(arguments: Arguments) -> Session:
    from nsconfine._session import Session

    given = {o.name: getattr(arguments, o.name) for o in SESSION_OPTIONS if o.flag is not None}
    return Session(**given)


def _shown_options(plan: Plan) -> list[str]:
    from nsconfine._plan.bwrap_args import bwrap_options

    hidden = {v.value for v in plan.env if not v.origin.shown}
    options = bwrap_options(plan)
    # A secret is only ever a --setenv value, which directly follows its name.
    return [
        "(hidden)" if i >= 2 and options[i - 2] == "--setenv" and value in hidden else value
        for i, value in enumerate(options)
    ]


def _check(arguments: Arguments) -> int:
    from nsconfine._preflight.checks import host_report

    report = host_report(fresh=arguments.fresh)
    if arguments.json:
        import json  # only for --json: the CLI's start-up is on every session's launch path

        print(json.dumps(report.to_json(), indent=2))
    else:
        for check in report.checks:
            # A detail names the host's own paths ($NSCONFINE_BWRAP, $PATH): an input too.
            print(f"{'ok' if check.ok else 'REFUSED':8} {check.name}: {printable(check.detail)}")
    if report.error is not None:
        if not arguments.json:
            print(f"nsconfine: {report.error}", file=sys.stderr)
        return report.error.exit_status
    return 0


def _plan(arguments: Arguments) -> int:
    if arguments.bundle is not None and arguments.format is None:
        raise UsageError("--bundle names the bundle --format oci or k8s shows: give --format")
    plan = _session(arguments).plan()
    if arguments.format is not None:
        from nsconfine._export.oci import print_export

        return print_export(plan, arguments.format, arguments.bundle or "nsconfine-bundle")
    if arguments.bwrap_args:
        import json

        print(json.dumps(_shown_options(plan), indent=2))
    elif arguments.json:
        sys.stdout.write(plan.manifest_json())
    else:
        sys.stdout.write(plan.manifest())
    return 0


def _run(arguments: Arguments) -> int:
    from nsconfine._cli.relay import (
        DrainLimit,
        StdioRelay,
        held_signals,
        kept_stdio_flags,
        run_session,
    )
    from nsconfine._gate import spawn
    from nsconfine._session import build_plan

    command = list(arguments.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise UsageError("no command given: nsconfine run SESSION -- CMD [ARG...]")
    plan = build_plan(_session(arguments), lint=False)  # spawn lints it
    refusals = None
    if plan.network == "proxy":  # a user sees why `npm install` failed
        from nsconfine._launch.egress import report_refusals

        # With --tty, once the session has ended: its screen is the terminal meanwhile.
        refusals = report_refusals(sys.stderr.fileno(), held=arguments.tty)
    # The signals from before the launch: none is lost while it builds. The caller's terminals
    # reach the session as pipes (see nsconfine/_cli/relay.py).
    with kept_stdio_flags(), held_signals() as signals:
        owner = (plan.user.uid, plan.user.gid) if plan.user.uid != os.geteuid() else None
        relay = StdioRelay(arguments.tty, owner)
        try:
            stdin, stdout, stderr = relay.given
            try:
                sandbox = spawn(
                    plan, command, stdin=stdin, stdout=stdout, stderr=stderr, tty=arguments.tty
                )
            except BaseException as failed:
                relay.launched()
                relay.drain(DrainLimit(signals))  # bwrap's own messages, before nsconfine's
                if not isinstance(failed, OSError) or isinstance(failed, NsconfineError):
                    raise  # (CredentialMissing is an OSError too)
                # the command itself could not start
                print(
                    f"nsconfine: exec-failed: {printable(command[0])} cannot be run in the "
                    f"sandbox: {failed.strerror}",
                    file=sys.stderr,
                )
                return EXEC_FAILED_STATUS
            relay.launched()
            status = run_session(sandbox, arguments.grace, signals, relay)
        finally:
            relay.close()
        # Still held: a Ctrl-C as the report is made (a session can make it take seconds)
        # would leave the user none of its warnings, and a SIGTERM, a git of it running.
        untrusted = sandbox.untrusted_config or []
    status = 128 - status if status < 0 else status
    lines = [] if refusals is None else refusals.held_lines()
    lines += _untrusted_config_warnings(untrusted)
    lines += [
        f"nsconfine: output-failed: the session's {'stdout' if fd == 1 else 'stderr'} could not "
        f"be written: {error.strerror or error}; what came after was dropped"
        for fd, error in sorted(relay.failed.items())
    ]
    if lines:
        _said("\n".join(lines))  # the session's status stands whatever stderr takes of them
    return 74 if relay.failed and status == 0 else status  # EX_IOERR, as a shell's own


# A session can make config files by the thousand: past these many, the ones nearest the
# workspace's top (which the host's tools read first), a repository's first at each depth (git
# runs what they say), are named, and the rest counted.
WARNINGS_SHOWN = 20


def _untrusted_config_warnings(paths: Sequence[str]) -> list[str]:
    """A line for each file the host runs or trusts that the session could write (a
    repository it made, say): the user should read it before the host's git does."""
    first = sorted(paths, key=lambda path: (path.count("/"), ".git" not in path.split("/"), path))
    lines = [
        f"nsconfine: warning: {printable(path)} could be written by the session, and the host "
        "runs or trusts what it holds: read it before running git, an agent or an editor there"
        for path in first[:WARNINGS_SHOWN]
    ]
    if len(paths) > WARNINGS_SHOWN:
        lines.append(
            f"nsconfine: warning: and {len(paths) - WARNINGS_SHOWN} more like them in the "
            "workspace: read them before running git, an agent or an editor there"
        )
    return lines


def _selftest(arguments: Arguments) -> int:
    from nsconfine._selftest.report import run_selftest

    if arguments.user == "":  # not "nobody", as no --user would be
        raise UsageError("--user is empty: name the account the stand-in sessions run as")
    return run_selftest(as_json=arguments.json, user=arguments.user)


def _profiles(_arguments: Arguments) -> int:
    from nsconfine._plan.profiles import built_in

    profiles = built_in()
    width = max(len(name) for name in profiles)
    for name, description in profiles.items():
        print(f"{name.ljust(width)}  {description}")
    return 0


def _bundle(arguments: Arguments) -> int:
    from nsconfine._export.oci import bundle_command

    command = arguments.command[1:] if arguments.command[:1] == ["--"] else arguments.command
    _refuse_unusable(arguments.directory, "DIR")
    plan = _session(arguments).plan()
    return bundle_command(plan, arguments.subcommand, arguments.directory, command)


def _explain(arguments: Arguments) -> int:
    from nsconfine._policy.explain import explain
    from nsconfine._session import profiles_showing

    _refuse_unusable(arguments.path, "PATH")
    session = _session(arguments)
    visible, lines = explain(
        session.plan(), arguments.path, lambda path: profiles_showing(path, session)
    )
    print("\n".join(lines))
    return 0 if visible else 1


def _refuse_unusable(path: str, metavar: str) -> None:
    """Refuse a path that is empty ("" would name the working directory) or too long."""
    if not path:
        raise UsageError(f"{metavar} is empty, which would name the working directory: give it")
    too_long = path_too_long(path)
    if too_long is not None:
        raise UsageError(f"{metavar} {too_long}")


_COMMANDS = {
    "check": _check,
    "plan": _plan,
    "run": _run,
    "explain": _explain,
    "profiles": _profiles,
    "selftest": _selftest,
    "oci-bundle": _bundle,
    "podman-args": _bundle,
}


_UTF_8 = ("utf-8", "utf8")


def _fill_closed_stdio() -> None:
    """/dev/null on each of fds 0-2 that is closed, as daemons do, with the Python stream
    Python left None for it (a refusal printed to a missing sys.stderr goes to stdout); and
    output that the locale's encoding cannot hold (the manifest's "…" in ISO-8859-1)
    escaped, never raised."""
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        try:
            os.fstat(fd)
        except OSError:
            opened = os.open(os.devnull, os.O_RDWR)  # the lowest free number: fd itself
            if opened != fd:
                os.dup2(opened, fd)
                os.close(opened)
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, "r" if fd == 0 else "w", closefd=False))  # noqa: SIM115
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper) and stream.encoding.lower() not in _UTF_8:
            stream.reconfigure(errors="backslashreplace")


def main(argv: Sequence[str]) -> int:
    """Run the CLI on argv (without the program name) and return the exit status."""
    # The CLI owns its process: a SIGCHLD its parent ignored (kept across exec) would have the
    # kernel discard the statuses of the sessions it waits for; and a stdio fd it was started
    # without would be taken by its own pipes (signals, a terminal), then read as its stdin.
    signal(SIGCHLD, SIG_DFL)
    _fill_closed_stdio()
    try:
        arguments = _parse(argv)
        status = 0 if arguments is None else _COMMANDS[arguments.subcommand](arguments)
        if sys.stdout is not None:  # None when started without an fd 1
            sys.stdout.flush()  # here, so that a reader gone away is met below, not at exit
        return status
    except NsconfineError as refused:
        # `2> /dev/full`: a refusal that is lost says so by its status, as any output that
        # fails (no traceback: it would go to the same dead stderr)
        return refused.exit_status if _said(f"nsconfine: {refused}") else 74  # EX_IOERR
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # stdout's reader went away (`nsconfine plan … | head -1`): end quietly, as a
        # pipeline's writer killed by SIGPIPE does
        _output_to_devnull()
        return 128 + 13  # SIGPIPE
    except OSError as error:  # every path a command meets is refused in its own words: this
        # is its output that could not be written (`> /dev/full`), or a file it could not use
        _output_to_devnull()
        if (
            error.filename is None
            and error.errno == errno.ENOENT
            and not working_directory_exists()
        ):
            line = (
                "io-error: the working directory was removed: run nsconfine from one that "
                "exists, or give absolute paths"
            )
        elif error.filename is None:
            line = f"output-failed: cannot write its output: {error.strerror or error}"
        else:
            line = f"io-error: {error.strerror or error} ({printable(str(error.filename))})"
        _said(f"nsconfine: {line}")
        return 74  # EX_IOERR


def _parse(argv: Sequence[str]) -> Arguments | None:
    """argv parsed; None if it asked for help, which argparse has printed."""
    arguments = _quick_parse(argv)
    if arguments is not None:
        return arguments
    wanted = argv[0] if argv and argv[0] in _SUBCOMMANDS else None
    try:
        return _parser(wanted).parse_args(list(argv), Arguments())
    except SystemExit:  # argparse exits only after a help (Parser.error raises UsageError):
        return None  # main flushes it, so that a help that cannot be written is exit 74


def _said(text: str) -> bool:
    """text, a line or several, on stderr now; False if stderr took no more (it then points
    at /dev/null, so that what stays in sys.stderr's buffer does not fail again at exit)."""
    try:
        print(text, file=sys.stderr, flush=True)
    except OSError:
        _output_to_devnull(2)
        return False
    return True


def _output_to_devnull(fd: int = 1) -> None:
    """fd (stdout, or stderr) to /dev/null, so that the interpreter's last flush of what could
    not be written does not fail again (with a threading import, an exit status of 120)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def console_main() -> NoReturn:
    """The `nsconfine` console script, and `python -m nsconfine`: main, then the process ends."""
    status = main(sys.argv[1:])
    # The interpreter's shutdown would tear down every module and object the imports made (~3
    # ms of a run): nothing of nsconfine's needs it (no finalizers, files closed where they are
    # written). Without a thread to wait for (every one of nsconfine's is a threading.Thread),
    # what a shutdown must do is run the atexit handlers (a proxy's close) and flush stdio; with
    # one, the collector's shutdown passes at least skip what exists now (gc.freeze).
    import gc

    gc.freeze()
    if "threading" not in sys.modules:
        import atexit

        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                if stream is not None:
                    stream.flush()
            except OSError:  # a reader gone away: as the interpreter's own last flush
                pass
        os._exit(status)
    sys.exit(status)
