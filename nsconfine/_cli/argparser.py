"""argparse as the CLI uses it: its help's width, a malformed command line as a usage refusal,
and a former flag refused naming the one it is now. Imported only when argparse parses (a help
request, an error, a subcommand the quick parser does not read: nsconfine._cli.main)."""

from __future__ import annotations

import argparse
import os
import sys

from nsconfine._errors import UsageError
from nsconfine._text import is_decimal

TYPE_CHECKING = False  # see nsconfine/_launch/stage.py
if TYPE_CHECKING:
    from typing import Any, NoReturn

    from _typeshed import SupportsWrite


class HelpFormatter(argparse.HelpFormatter):
    # argparse asks shutil for the terminal's width each time it makes a formatter (every
    # add_argument does); importing shutil costs a run ~4 ms, os answers the same question.
    def __init__(self, prog: str) -> None:
        columns = os.environ.get("COLUMNS", "")
        try:
            # (a width of 6 digits or more is none a terminal has, nor int() may read)
            width = (
                int(columns)
                if is_decimal(columns) and len(columns) < 6
                else os.get_terminal_size(1).columns
            )
        except OSError:  # not a terminal
            width = 80
        super().__init__(prog, width=max(width - 2, 20))


class Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")

    def _print_message(self, message: str, file: SupportsWrite[str] | None = None) -> None:
        # argparse drops an OSError writing the help, then exits 0: a help that cannot be
        # written (`> /dev/full`) is output that failed, exit 74 (nsconfine._cli.main)
        if message:
            (file or sys.stderr).write(message)


class Renamed(argparse.Action):
    """A flag an option had before: refused, naming the flag it has now."""

    def __init__(self, option_strings: list[str], dest: str, now: str, **kwargs: Any) -> None:
        super().__init__(option_strings, argparse.SUPPRESS, nargs="?", help=argparse.SUPPRESS)
        self.now = now

    def __call__(self, parser: Any, namespace: Any, values: Any, option: str | None = None) -> None:
        parser.error(f"{option} is now {self.now}")
