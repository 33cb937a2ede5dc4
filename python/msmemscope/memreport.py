"""Where memory is now, and the peak timeline of a capture (SPEC §7).

``get_mem_report()`` asks the running process: live bytes per allocation
site (the innermost Python frame when Python stacks are on, else the
allocator's caller in C, known even without stacks), largest first, summing
to ``total_size``. ``get_all_time_size`` and ``get_mem_report_with_time``
read a finished capture (a capture folder, or an output folder holding one),
rotating logs included, which are parsed in parallel.
"""

import ctypes
import json

from . import _lib

_declared = False


def _fns():
    global _declared
    lib = _lib.get()
    if not _declared:
        c_char_p, c_int = ctypes.c_char_p, ctypes.c_int
        lib.msmemscope_get_mem_report.argtypes = [c_char_p, c_int]
        lib.msmemscope_get_mem_report.restype = c_int
        lib.msmemscope_get_all_time_size.argtypes = [c_char_p, c_int, c_char_p, c_int]
        lib.msmemscope_get_all_time_size.restype = c_int
        lib.msmemscope_get_mem_report_with_time.argtypes = [c_char_p, ctypes.c_longlong, c_int, c_char_p, c_int]
        lib.msmemscope_get_mem_report_with_time.restype = c_int
        _declared = True
    return lib


def _json(fn, *args):
    n = 1 << 16
    while True:
        buf = ctypes.create_string_buffer(n)
        k = fn(*args, buf, n)
        if k < 0:
            raise ValueError(buf.value.decode("utf-8", "replace"))
        if k < n:
            return json.loads(buf.value.decode())
        n = k + 1  # the library keeps the same result for this retry


def get_mem_report():
    """{"total_size": N, "mem_report": [{"site", "function", "size", "count"}, ...]}
    for the live blocks of this process now."""
    if _lib.in_child():
        return {"total_size": 0, "mem_report": []}
    return _json(_fns().msmemscope_get_mem_report)


def get_all_time_size(input_path, interval_ms=100):
    """[[t_ms, max_live_bytes], ...]: the local maximum of live bytes in each
    interval of the capture at input_path."""
    return _json(_fns().msmemscope_get_all_time_size, str(input_path).encode(), int(interval_ms))


def get_mem_report_with_time(input_path, t_ms, interval_ms=100):
    """The per-site report at the maximum of the interval holding t_ms."""
    return _json(_fns().msmemscope_get_mem_report_with_time, str(input_path).encode(), int(t_ms), int(interval_ms))
