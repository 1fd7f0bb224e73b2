"""The `nsconfine` command: argument parsing and the `run` relay."""

TYPE_CHECKING = False  # see nsconfine/_launch/stage.py
if TYPE_CHECKING:
    from typing import NoReturn


def console_main() -> "NoReturn":
    """The `nsconfine` console script and `python -m nsconfine`: nsconfine._cli.main's, with
    a ^C while it loads (its imports are most of a short run) or ends ending it as main's own
    does, with status 130 and no traceback."""
    try:
        from nsconfine._cli.main import console_main as run

        run()
    except KeyboardInterrupt:
        raise SystemExit(130) from None
