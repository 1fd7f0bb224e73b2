"""A fork of the launcher waits until no launch holds fds it has yet to hand on or close.

A launch opens pipes, sockets, the mount-point records' lock and the holds of the stubs it
makes, and gives each to the sandbox or closes it a few milliseconds later. A process forked
meanwhile by another thread (a multiprocessing worker, `os.fork()` in a server) inherits every
one of them and holds it as long as it lives: a session's stdout then never reaches EOF, the
launch waits for its child's exec report, and every launch of the account waits for the
records' lock (attacker's passes, stop 39: 6 to 29 s, a worker's life). So each launch, and each
end of one, is a window in which `os.fork()` waits (os.register_at_fork); launches from many
threads share the windows, and a fork that waits holds new windows back, so that it is not
starved by launches that overlap. A fork from a thread inside a window (none of nsconfine's:
its spawns are C's clone) goes ahead, as it must not wait for itself.

The guard is the three _thread locks below, not threading's (whose import costs each command
line); the child gets fresh ones, as it has no launch of its parent's. In the main thread a
window is opened and closed only with a Ctrl-C held (nsconfine._interrupts: spawn, Pool's
launches and inline staging, a session's end): a KeyboardInterrupt between taking the lock and
counting itself in would leave the window open for good, and every later launch and fork
waiting. (Other threads get no KeyboardInterrupt.)
"""

from __future__ import annotations

import os
from _thread import allocate_lock, get_ident

from nsconfine._interrupts import give_ctrl_c_back, hold_ctrl_c

_counts = allocate_lock()  # guards _inside
_gate = allocate_lock()  # held by a fork that waits: new windows wait behind it
_no_window = allocate_lock()  # held while any window is open (by the first to open one)
_inside: dict[int, int] = {}  # thread -> how deep in windows it is


class LaunchWindow:
    """`with LaunchWindow():` a stretch in which a fork of this process waits."""

    __slots__ = ()

    def __enter__(self) -> None:
        me = get_ident()
        if me not in _inside:  # (nested: the fork already waits for the outer one)
            with _gate:
                pass
        with _counts:
            if not _inside:
                _no_window.acquire()
            _inside[me] = _inside.get(me, 0) + 1

    def __exit__(self, *exc_info: object) -> None:
        me = get_ident()
        with _counts:
            depth = _inside.pop(me) - 1
            if depth:
                _inside[me] = depth
            elif not _inside:
                _no_window.release()


_took: set[int] = set()  # the threads whose fork waits took the locks (others were inside)
# A fork waits this long at most for the windows open, then goes ahead as it would without the
# guard: the guard may cost a fork its wait, never the process its next launch or fork.
FORK_WAIT_SECONDS = 5.0
_held_ctrl_c: dict[int, int] = {}  # thread -> Ctrl-Cs noted before its fork's wait (main only)


def _before_fork() -> None:
    me = get_ident()
    # (Not a blocking wait: a fork from a signal handler that interrupted this very thread
    # inside the guard would wait for itself.)
    if not _counts.acquire(timeout=FORK_WAIT_SECONDS):
        return
    try:
        inside = me in _inside
    finally:
        _counts.release()
    if inside:
        return
    # os.fork ignores what a hook raises and forks all the same: a Ctrl-C that cut the wait
    # short left the gate taken for good. So a Ctrl-C is only noted while it waits, and given
    # back to the parent once it has forked.
    _held_ctrl_c[me] = hold_ctrl_c()
    if not _gate.acquire(timeout=FORK_WAIT_SECONDS):
        return
    if not _no_window.acquire(timeout=FORK_WAIT_SECONDS):
        _gate.release()
        return
    _took.add(me)


def _after_fork_in_parent() -> None:
    me = get_ident()
    if me in _took:
        _took.discard(me)
        _no_window.release()
        _gate.release()
    if me in _held_ctrl_c:
        give_ctrl_c_back(_held_ctrl_c.pop(me), deliver=True)


def _after_fork_in_child() -> None:
    global _counts, _gate, _no_window
    _counts, _gate, _no_window = allocate_lock(), allocate_lock(), allocate_lock()
    _inside.clear()
    _took.clear()
    held = _held_ctrl_c.pop(get_ident(), None)
    _held_ctrl_c.clear()
    if held is not None:
        give_ctrl_c_back(held, deliver=False)  # the parent's Ctrl-C, given back there


os.register_at_fork(
    before=_before_fork,
    after_in_parent=_after_fork_in_parent,
    after_in_child=_after_fork_in_child,
)
