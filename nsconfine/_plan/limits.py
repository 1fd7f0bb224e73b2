"""A session's share of what its account and its host hold: the limits every plan carries.

One session must never take what the launcher and the other sessions need (a fork bomb, every
pty, every inotify instance of its account, a /tmp filled until the launcher is OOM-killed), so
every plan carries a value for each limit, with its reason, and every launch enforces them:

- processes: RLIMIT_NPROC, which the launcher's child sets once the session has a user
  namespace of its own: the kernel counts the session's processes and threads there, and its
  account keeps the rest (set before, it would cap the account's whole count instead);
- open_files: RLIMIT_NOFILE of the command and all it starts, set by the exec shim (bwrap keeps
  the launcher's: it holds an fd for every copied runner file);
- tmp and shm: the size of each writable tmpfs (/tmp and a fresh HOME; /dev/shm), whose pages
  belong to no process, so that no OOM killer and no memory limit of a process reaches them,
  and its number of files, one per page of that size (tmpfs_shape: an empty file takes no
  page, but ~1 KiB of the kernel's memory); bwrap's /dev, which has no size, is read-only;
  shm also bounds System V shared memory, in an
  IPC namespace of the session's own that the launcher's child makes, where semaphores and
  message queues (kernel memory no process is charged for) are held to the kernel's limits
  before 3.19 raised them (SYSV_SEMAPHORES, SYSV_MESSAGE_QUEUES), and which a session without
  user namespaces of its own cannot leave for one with the kernel's defaults;
- ptys: the max= of a devpts of the session's own, mounted by the launcher's child;
- inotify_instances and inotify_watches: the session's user namespace's own limits
  (/proc/sys/user/max_inotify_*), counted under its account's.

A session's memory as a whole takes a memory cgroup, which nsconfine does not make:
memory_note() says why it is not limited on this host.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from nsconfine._errors import UsageError
from nsconfine._record import Record

TYPE_CHECKING = False  # see nsconfine/_launch/stage.py
if TYPE_CHECKING:
    from typing import Any, Final

# kernel.sem and kernel.msgmni in the session's IPC namespace (csrc/reaper.c writes them):
# 128 semaphore sets of at most 250, 32,000 semaphores in all (~2 MiB), and 32 message queues
# of 16 KiB (or of 16,384 empty messages: ~36 MiB in all). The kernel's defaults (32,000 sets
# of 32,000; 32,000 queues) would let a session take 64 GiB of the host's memory.
SYSV_SEMAPHORES: Final = "250 32000 32 128"  # SEMMSL SEMMNS SEMOPM SEMMNI
SYSV_MESSAGE_QUEUES: Final = 32

KiB: Final = 1 << 10
MiB: Final = 1 << 20
GiB: Final = 1 << 30

# name -> (default, smallest, largest, whether it is a number of bytes, reason). The smallest
# values leave bwrap, its init and the shim room to start; the largest are the kernel's own (for
# the counts, a bound the reaper's argument parser and devpts's max= can both take).
LIMITS: Final[dict[str, tuple[int, int, int, bool, str]]] = {
    "processes": (
        1024, 16, 4_194_304, False,
        "processes and threads, counted in a user namespace of the session's own "
        "(RLIMIT_NPROC): a fork bomb stops there, and its account keeps the rest",
    ),
    "open_files": (
        1024, 16, 1_048_576, False,
        "open files of each process of the command (RLIMIT_NOFILE, at most the launcher's)",
    ),
    "tmp": (
        GiB, MiB, 1 << 62, True,
        "bytes each writable tmpfs holds (/tmp, a fresh HOME): their pages belong to no "
        "process, so no OOM killer or process limit would reach them",
    ),
    "shm": (
        64 * MiB, MiB, 1 << 62, True,
        "bytes /dev/shm holds (a tmpfs of its own; bwrap's /dev is read-only), and as many "
        "again of System V shared memory, in an IPC namespace of the session's own that also "
        "holds 128 semaphore sets of at most 250 and 32 message queues",
    ),
    "ptys": (
        16, 1, 65_536, False,
        "terminals, from a devpts of the session's own (max=): the host's are shared by every "
        "sandbox (kernel.pty.max less its reserve)",
    ),
    "inotify_instances": (
        16, 1, 1 << 30, False,
        "inotify instances, counted in the session's user namespace under its account's "
        "(user.max_inotify_instances)",
    ),
    "inotify_watches": (
        8192, 1, 1 << 30, False,
        "inotify watches, counted the same way (user.max_inotify_watches)",
    ),
}  # fmt: skip

_SIZE = r"(?P<number>[0-9]+)(?P<unit>[KMGT]?)(?:i?B)?\Z"  # compiled when a value is a text
_UNITS = {"": 1, "K": KiB, "M": MiB, "G": GiB, "T": 1 << 40}


class Limits(Record):
    """A session's share: one value for each of LIMITS (bytes for tmp and shm)."""

    FIELDS = tuple(LIMITS)
    __slots__ = FIELDS
    processes: int
    open_files: int
    tmp: int
    shm: int
    ptys: int
    inotify_instances: int
    inotify_watches: int

    def __init__(
        self,
        processes: int = LIMITS["processes"][0],
        open_files: int = LIMITS["open_files"][0],
        tmp: int = LIMITS["tmp"][0],
        shm: int = LIMITS["shm"][0],
        ptys: int = LIMITS["ptys"][0],
        inotify_instances: int = LIMITS["inotify_instances"][0],
        inotify_watches: int = LIMITS["inotify_watches"][0],
    ) -> None:
        values = {"processes": processes, "open_files": open_files, "tmp": tmp, "shm": shm,
                  "ptys": ptys, "inotify_instances": inotify_instances,
                  "inotify_watches": inotify_watches}  # fmt: skip
        self._set(**{name: _checked(name, value) for name, value in values.items()})

    @classmethod
    def parse(cls, given: Mapping[str, object] | Iterable[str | tuple[str, object]]) -> Limits:
        """Limits from a mapping, NAME=VALUE strings (--limit) or (name, value) pairs; the
        rest at their defaults. A size is bytes, or a number with K, M, G or T (binary)."""
        return cls(**{name: parse_value(name, value) for name, value in pairs(given)})

    def to_json(self) -> list[dict[str, Any]]:
        """The manifest form: each limit's name, value and reason, then memory's."""
        rows = [
            {"name": name, "value": getattr(self, name), "reason": LIMITS[name][4]}
            for name in LIMITS
        ]
        return [*rows, {"name": "memory", "value": None, "reason": memory_note()}]

    def sysv_shm_pages(self) -> int:
        """System V shared memory's bound (kernel.shmall): shm's bytes in pages, rounded up; at
        most 2**30 (4 TiB of 4 KiB pages, no less than unlimited), which the reaper's parser
        takes."""
        return min(_pages(self.shm), 2**30)

    def lines(self) -> list[str]:
        """The manifest's lines for these limits."""
        shown = [f"  {name}: {self.shown(name)}  {LIMITS[name][4]}" for name in LIMITS]
        return [*shown, f"  memory: not limited  {memory_note()}"]

    def shown(self, name: str) -> str:
        """A limit's value as a reader reads it (sizes in KiB, MiB or GiB)."""
        value: int = getattr(self, name)
        return size_text(value) if LIMITS[name][3] else f"{value:,}"


def pairs(
    given: Mapping[str, object] | Iterable[str | tuple[str, object]], option: str = "--limit"
) -> list[tuple[str, Any]]:
    """given as (name, value) pairs, in order: from a mapping, NAME=VALUE strings (as option
    takes them on the command line) or pairs."""
    found: list[tuple[str, Any]] = []
    for item in given.items() if isinstance(given, Mapping) else given:
        if isinstance(item, str):
            name, equals, value = item.partition("=")
            if not equals:
                raise UsageError(f"{option} {item!r}: give NAME=VALUE")
            found.append((name, value))
        else:
            found.append((item[0], item[1]))
    return found


def parse_value(name: str, value: object) -> int:
    """The value of limit name, from an int or its text; UsageError if it is not one."""
    if name == "memory":
        raise UsageError(f"memory cannot be limited: {memory_note()}")
    if name not in LIMITS:
        raise UsageError(f"{name!r} is not a limit: the limits are {', '.join(LIMITS)}")
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise UsageError(f"limit {name}: {value!r} is not a number")
    if isinstance(value, int):
        return _checked(name, value)
    import re  # here: a launch with no limit given as a text does without it

    # ASCII: a case-blind match otherwise takes U+212A, KELVIN SIGN, for a 'k'.
    found = re.match(_SIZE, value.strip(), re.IGNORECASE | re.ASCII)
    if found is None or (found["unit"] and not LIMITS[name][3]):
        unit = "bytes, or a number with K, M, G or T" if LIMITS[name][3] else "a whole number"
        raise UsageError(f"limit {name}: {value!r} is not {unit}")
    if len(found["number"]) > 20:  # past every limit (and, past 4,300 digits, what int() reads)
        raise _out_of_range(name, value[:24] + "…")
    return _checked(name, int(found["number"]) * _UNITS[found["unit"].upper()])


def _checked(name: str, value: int) -> int:
    _, smallest, largest, _, _ = LIMITS[name]
    if isinstance(value, bool) or not isinstance(value, int) or not smallest <= value <= largest:
        raise _out_of_range(name, value)
    return value


def _out_of_range(name: str, value: object) -> UsageError:
    _, smallest, largest, is_size, _ = LIMITS[name]
    low, high = (size_text(smallest), size_text(largest)) if is_size else (smallest, largest)
    return UsageError(f"limit {name}: {value!r} is not between {low} and {high}")


def size_text(value: int) -> str:
    """A size as a reader reads it: 1 GiB, 64 MiB, 4096 bytes."""
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if value >= size and value % size == 0:
            return f"{value // size:,} {unit}"
    return f"{value:,} bytes"


def tmpfs_shape(capacity: int) -> tuple[int, int]:
    """A writable tmpfs of capacity bytes as mounted: its size in KiB, of whole pages (as the
    kernel rounds it), and the files it holds (nr_inodes, its root among them): one per page,
    so that empty files, which take no page (~1.3 KiB of the kernel's memory each), and the
    extended attributes that draw on the same count (~2 KiB each), hold no more than about
    half its size again."""
    pages = _pages(capacity)
    return pages * _page_size() // KiB, pages


def _pages(size: int) -> int:
    """size bytes in the kernel's pages, rounded up (as tmpfs's size= and shmall count)."""
    return -(-size // _page_size())


def _page_size() -> int:
    import os

    return os.sysconf("SC_PAGE_SIZE")


_memory_note: str | None = None


def memory_note() -> str:
    """Why a session's memory is not limited on this host, and what limits it instead (asked
    once: a launcher does not move between cgroups)."""
    global _memory_note
    if _memory_note is None:
        _memory_note = _memory_reason() + (
            "; its files are bounded by the sized tmpfs (tmp, shm), and the launcher can run in "
            "a memory-limited unit (systemd's MemoryMax=), which its sessions share"
        )
    return _memory_note


def _memory_reason() -> str:
    import os

    try:
        with open("/proc/self/cgroup") as file:
            lines = file.read().splitlines()
    except OSError:
        return "nsconfine makes no memory cgroup, and this host shows the launcher none"
    own = next((line[3:] for line in lines if line.startswith("0::")), None)
    on_v1 = any("memory" in line.split(":")[1].split(",") for line in lines if ":" in line)
    for mount in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
        controllers = os.path.join(mount, (own or "/").lstrip("/"), "cgroup.controllers")
        try:
            with open(controllers) as file:
                available = file.read().split()
        except OSError:
            continue
        if "memory" in available and os.access(os.path.dirname(controllers), os.W_OK):
            return (
                f"nsconfine makes no memory cgroup of a session's own (the launcher's cgroup "
                f"{own} delegates the memory controller)"
            )
        break
    if on_v1:
        return (
            "this host's memory controller is on cgroup v1, which nsconfine never changes, and "
            "no cgroup v2 with it is delegated to the launcher"
        )
    return f"no cgroup with the memory controller is delegated to the launcher (cgroup {own})"
