"""The Python trace: one row per Python function call.

``msmemscope.tracer.start()`` / ``stop()`` trace on their own;
``events`` containing ``traceback`` traces every collected range
(``msmemscope.start()`` to ``stop()``, and from import in immediate mode
under the CLI).

A ``sys.setprofile`` hook records (code, start, end) per call, on the
dump's clock (``time.monotonic_ns()`` is CLOCK_MONOTONIC), into per-thread
buffers; files are written when tracing stops (and at exit), one
``python_trace_{tid}_{timestamp}.csv`` per thread in the capture's dump
folder. The thread that starts the trace and every thread started after it
are traced (CPython 3.11 offers no way to hook threads already running).
Calls still open when tracing stops end at the stop time.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from types import CodeType, FrameType
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import _lib

__all__ = ["start", "stop", "is_tracing"]

_mono = time.monotonic_ns
_PKG = os.path.dirname(os.path.abspath(__file__)) + os.sep
_FLUSH_ROWS = 1 << 19  # rows a thread buffers before they go to its file

_lock = threading.RLock()
_on = False
_by_api = False  # tracer.start() was called (not just a collected range)
_threads: List[_Thread] = []  # every _Thread of this trace session
_session = 0

Row = Tuple[CodeType, int, int]  # (code, start ns, end ns) of one call
Profiler = Callable[[FrameType, str, Any], None]


class _Thread:
    __slots__ = ("tid", "rows", "stack", "path", "fd")

    def __init__(self) -> None:
        self.tid = threading.get_native_id()
        self.rows: List[Row] = []
        self.stack: List[Tuple[CodeType, int]] = []
        self.path: Optional[str] = None
        self.fd: Optional[int] = None


def _make_profiler(th: _Thread, session: int) -> Profiler:
    rows, stack = th.rows, th.stack
    push, pop, add = stack.append, stack.pop, rows.append
    mono = _mono

    def prof(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            if not _on or _session != session:
                sys.setprofile(None)
                return
            push((frame.f_code, mono()))
        elif event == "return":
            if stack:
                code, t0 = pop()
                add((code, t0, mono()))
                if len(rows) >= _FLUSH_ROWS:
                    _flush(th)
    return prof


def _thread_bootstrap(frame: FrameType, event: str, arg: Any) -> None:
    # threading.setprofile hands this to each new thread: give it its own
    # buffers, then trace its first call.
    with _lock:
        if not _on:
            sys.setprofile(None)
            return
        th = _Thread()
        _threads.append(th)
        prof = _make_profiler(th, _session)
    sys.setprofile(prof)
    prof(frame, event, arg)


def is_tracing() -> bool:
    return _on


def _begin() -> None:
    global _on, _session, _threads
    with _lock:
        if _on:
            return
        _session += 1
        _threads = []
        th = _Thread()
        _threads.append(th)
        _on = True
        threading.setprofile(_thread_bootstrap)
        sys.setprofile(_make_profiler(th, _session))


def _end() -> List[str]:
    """Stops tracing and writes every thread's rows; returns the files."""
    global _on
    with _lock:
        if not _on:
            return []
        now = _mono()
        sys.setprofile(None)
        threading.setprofile(None)
        _on = False
        files = []
        for th in _threads:
            # Calls still open end now.
            while th.stack:
                code, t0 = th.stack.pop()
                th.rows.append((code, t0, now))
            _flush(th)
            if th.fd is not None:
                os.close(th.fd)
                th.fd = None
            if th.path:
                files.append(th.path)
        return files


_info: Dict[CodeType, str] = {}


def _funcinfo(code: CodeType) -> str:
    s = _info.get(code)
    if s is None:
        s = "%s:%d(%s)" % (code.co_filename, code.co_firstlineno, code.co_name)
        if any(c in s for c in ',"\n\r'):
            s = '"' + s.replace('"', '""') + '"'
        _info[code] = s
    return s


def _own(code: CodeType) -> bool:
    return code.co_filename.startswith(_PKG)


def _trace_file(tid: int) -> Optional[Tuple[str, int]]:
    d = _lib.capture_dir()
    if not d:
        return None
    dump = os.path.join(d, "dump")
    os.makedirs(dump, mode=0o750, exist_ok=True)
    stamp = time.strftime("%Y%m%d%H%M%S")
    ms = "%03d" % (time.time_ns() // 1000000 % 1000)
    names = ["python_trace_%d_%s.csv" % (tid, stamp), "python_trace_%d_%s%s.csv" % (tid, stamp, ms)]
    names += ["python_trace_%d_%s%s_%d.csv" % (tid, stamp, ms, i) for i in range(1, 1000)]
    for n in names:
        p = os.path.join(dump, n)
        try:
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o640)
        except FileExistsError:
            continue
        return p, fd
    return None


def _flush(th: _Thread) -> None:
    rows, th.rows[:] = list(th.rows), []
    if not rows:
        return
    if th.fd is None:
        got = _trace_file(th.tid)
        if got is None:
            return
        th.path, th.fd = got
        os.write(th.fd, b"FuncInfo,StartTime(ns),EndTime(ns),Thread Id,Process Id\n")
    tail = ",%d,%d\n" % (th.tid, os.getpid())
    out = [
        "%s,%d,%d%s" % (_funcinfo(code), t0, t1, tail)
        for code, t0, t1 in rows if not _own(code)
    ]
    if out:
        os.write(th.fd, "".join(out).encode("utf-8", "replace"))


def start() -> None:
    """Starts the Python trace alone (no memory collection is switched on)."""
    global _by_api
    _lib.begin()
    _by_api = True
    _begin()


def stop() -> List[str]:
    """Stops the Python trace and writes its files; returns their paths."""
    global _by_api
    _by_api = False
    return _end()


# Used by msmemscope.start()/stop() when events contain traceback.
def _range_start() -> None:
    _lib.begin()
    _begin()


def _range_stop() -> List[str]:
    if _by_api:
        return []
    return _end()
