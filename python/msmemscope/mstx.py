"""mstx marks and ranges, recorded as MSTX rows of the dump.

A range whose message is exactly ``"step start"`` delimits a step
in a process that never calls ``msmemscope.step()``.
"""

from __future__ import annotations

from typing import Any

from . import _lib

__all__ = ["mark", "range_start", "range_end"]


def _msg(message: str) -> bytes:
    if not isinstance(message, str):
        raise TypeError("message must be a str, got %s %.40r" % (type(message).__name__, message))
    return message.encode("utf-8", "replace")


def mark(message: str, stream: Any = None) -> None:
    """Records an instantaneous mark (``stream`` is accepted for
    compatibility and ignored)."""
    _lib.get().mstxMarkA(_msg(message), None)


def range_start(message: str, stream: Any = None) -> int:
    """Opens a range; returns its id for ``range_end`` (0 in a forked child)."""
    return int(_lib.get().mstxRangeStartA(_msg(message), None))


def range_end(range_id: int) -> None:
    """Closes the range ``range_start`` returned."""
    rid = _lib.int_arg("range_id", range_id)
    if not 0 <= rid < 1 << 64:
        raise ValueError("range_id must be an id range_start returned, in [0, 2**64), got %d" % rid)
    _lib.get().mstxRangeEnd(rid)
