"""Where memory is now, and the peak timeline of a capture.

``get_mem_report()`` asks the running process: live bytes per allocation
site (the innermost Python frame when Python stacks are on, else the
allocator's caller in C, known even without stacks), largest first, summing
to ``total_size``. ``get_all_time_size`` and ``get_mem_report_with_time``
read a finished capture (a capture folder, or an output folder holding one),
rotating logs included, which are parsed in parallel.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Union

from . import _lib

MemReport = Dict[str, Any]


def get_mem_report() -> MemReport:
    """{"total_size": N, "mem_report": [{"site", "function", "size", "count"}, ...]}
    for the live blocks of this process now."""
    _lib.refuse_in_child("get_mem_report")
    return _lib.call("msmemscope_get_mem_report")["result"]


def get_all_time_size(input_path: Union[str, os.PathLike], interval_ms: int = 100) -> List[List[int]]:
    """[[t_ms, max_live_bytes], ...]: the local maximum of live bytes in each
    interval of the capture at input_path."""
    _lib.refuse_in_child("get_all_time_size")
    path = _lib.path_arg("input_path", input_path)
    interval = _positive("interval_ms", interval_ms)
    return _lib.call("msmemscope_get_all_time_size", path.encode(), interval)["result"]


def get_mem_report_with_time(input_path: Union[str, os.PathLike], t_ms: int, interval_ms: int = 100) -> MemReport:
    """The per-site report at the maximum of the interval holding t_ms."""
    _lib.refuse_in_child("get_mem_report_with_time")
    path = _lib.path_arg("input_path", input_path)
    t = _lib.int_arg("t_ms", t_ms)
    if not 0 <= t < 1 << 63:
        raise ValueError("t_ms must be a time in ms from the capture's start (>= 0), got %d" % t)
    interval = _positive("interval_ms", interval_ms)
    return _lib.call("msmemscope_get_mem_report_with_time", path.encode(), t, interval)["result"]


def _positive(name: str, v: Any) -> int:
    n = _lib.int_arg(name, v)
    if not 0 < n < 1 << 31:
        raise ValueError("%s must be an int in [1, 2147483647] (milliseconds), got %d" % (name, n))
    return n
