"""Record: the immutable value type of nsconfine's plan model.

The records were dataclasses; but dataclasses imports inspect and compiles every class when it
is imported, about 20 ms of each launcher's start-up. A record instead lists its fields in
`FIELDS`, sets them once in its own `__init__`, and gets equality, hashing, repr and `replace`
from here.
"""

from __future__ import annotations

TYPE_CHECKING = False  # see nsconfine/_launch/stage.py
if TYPE_CHECKING:
    from typing import Any, ClassVar, Self


class Record:
    """An immutable value: equal, hashed and shown by the attributes named in FIELDS."""

    __slots__ = ()
    FIELDS: ClassVar[tuple[str, ...]] = ()
    HIDDEN: ClassVar[frozenset[str]] = frozenset()  # fields repr must not show (secrets)

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self.FIELDS)

    def _set(self, **values: Any) -> None:
        """Set fields once, from __init__."""
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def _fields(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.FIELDS}

    def replace(self, **changes: Any) -> Self:
        """A copy with some fields changed (through __init__, so it is checked again)."""
        return type(self)(**{**self._fields(), **changes})

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, Record)
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        shown = ", ".join(
            f"{name}={getattr(self, name)!r}" for name in self.FIELDS if name not in self.HIDDEN
        )
        return f"{type(self).__name__}({shown})"

    def __reduce__(self) -> tuple[Any, ...]:
        """Copied, deep-copied and pickled as its fields, rebuilt through __init__ (so checked
        again), as replace() makes one."""
        return (_rebuilt, (type(self), self._fields()))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")


def _rebuilt(kind: type[Record], values: dict[str, Any]) -> Record:
    return kind(**values)
