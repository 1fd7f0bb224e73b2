"""A Ctrl-C during a launch: held until the launch is whole, then the launch is undone and the
KeyboardInterrupt raised.

A launch opens ~70 fds, makes mount points in the workspace, starts a reaper and hands each
over from one owner to the next; a KeyboardInterrupt is raised between any two bytecodes of
the main thread, and at many of them it left a reaper, fds or a stub behind (the handlers that
cover each step cannot cover the steps between them, nor the loops that close fds). So, in the
main thread and under Python's own SIGINT handler (which raises KeyboardInterrupt), a launch
runs with a handler that only notes the signal; once the launch has ended either way, a launch
that succeeded is ended (the caller never gets its handle) and the KeyboardInterrupt is
raised, as if it had landed at the call. A wait that may last (bwrap's report and build)
looks at the note as it waits, and stops where its own handler cleans up
(stop_if_interrupted), so that a Ctrl-C at a hung launch is not held for its whole timeout.
Another handler (the caller's own, asyncio's) is left as it is, and so is a launch in another
thread, where no KeyboardInterrupt is raised.

What is left: a Ctrl-C in the instant after the handler is given back, as the call returns,
loses the handle (as it would a subprocess.Popen's); the session runs on until it ends, and a
later launch reaps it (nsconfine._launch.sandbox._abandoned).
"""

from __future__ import annotations

# signal's own C module: signal.signal and getsignal make an enum of each handler and number
# they pass, three times per launch (~7 of the ~8 us a held launch cost with them), and
# importing signal imports enum (~1-2 ms of every command line's start).
import _signal  # type: ignore[import-not-found]
from _signal import SIGINT, default_int_handler
from _thread import get_ident, interrupt_main, start_new_thread
from collections.abc import Callable
from types import FrameType

# How often a long wait looks for a held Ctrl-C (the signal's handler only notes it).
WAIT_TICK_SECONDS = 0.05

_noted = 0  # the Ctrl-Cs noted while held: only the handler changes it, never reset
_held: tuple[int, int] | None = None  # the holding thread (the main one), and _noted then


def _note(number: int, frame: FrameType | None) -> None:
    global _noted
    _noted += 1


def stop_if_interrupted() -> None:
    """Raise KeyboardInterrupt if a Ctrl-C came during the held launch: for a wait that may
    last, at a point where its own handler ends what it holds (in the held launch's thread
    alone: another thread's launch goes on)."""
    held = _held
    if held is not None and held[0] == get_ident() and _noted != held[1]:
        raise KeyboardInterrupt


NOT_HELD = -1


def hold_ctrl_c() -> int:
    """Only note a Ctrl-C from now on (in the main thread, under Python's own handler); what
    give_ctrl_c_back takes: the count of Ctrl-Cs noted so far, or NOT_HELD."""
    if _signal.getsignal(SIGINT) is not default_int_handler:
        return NOT_HELD
    since = _noted
    try:
        _signal.signal(SIGINT, _note)
    except ValueError:  # not the main thread, where no KeyboardInterrupt is raised
        return NOT_HELD
    return since


def give_ctrl_c_back(since: int, *, deliver: bool) -> None:
    """Python's handler again, after hold_ctrl_c() returned since; if a Ctrl-C came meanwhile
    and deliver, it reaches the main thread again a few milliseconds later, from a thread of
    its own: raised here, in a fork's hook, os.fork would only report it as ignored."""
    if since == NOT_HELD:
        return
    _signal.signal(SIGINT, default_int_handler)
    if deliver and _noted != since:
        start_new_thread(_interrupt_main_soon, ())


def _interrupt_main_soon() -> None:
    import time

    time.sleep(0.005)  # (the fork's hooks have returned by then)
    interrupt_main()


class CtrlCHeld:
    """`with CtrlCHeld() as held:` runs the block with a Ctrl-C held; held.undo(f) names what
    ends what the block made, run once, before the KeyboardInterrupt, if a Ctrl-C came."""

    __slots__ = ("_since", "_undo")

    def __init__(self) -> None:
        self._since: int | None = None  # _noted as it began holding (None: it does not)
        self._undo: Callable[[], object] | None = None

    def undo(self, end: Callable[[], object]) -> None:
        self._undo = end

    def __enter__(self) -> CtrlCHeld:
        global _held
        # (Not when another holds it already: this launch is part of that one.)
        since = hold_ctrl_c()
        if since != NOT_HELD:
            self._since = since
            _held = (get_ident(), since)
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Undo the launch and raise KeyboardInterrupt if a Ctrl-C came (over any error the
        launch raised); give SIGINT its handler back."""
        global _held
        if self._since is None:
            return
        came = _noted != self._since
        try:
            if came:
                self._end()  # (while a second Ctrl-C is still held)
        finally:
            _held = None
            try:
                _signal.signal(SIGINT, default_int_handler)
                came = _noted != self._since
            except KeyboardInterrupt:  # one came as the handler went back
                came = True
        if came:
            self._end()
            raise KeyboardInterrupt

    def _end(self) -> None:
        undo, self._undo = self._undo, None
        if undo is not None:
            undo()
