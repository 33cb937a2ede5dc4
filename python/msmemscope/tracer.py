"""The Python trace: one row per Python function call.

``msmemscope.tracer.start()`` / ``stop()`` trace on their own;
``events`` containing ``traceback`` traces every collected range
(``msmemscope.start()`` to ``stop()``, and from import in immediate mode
under the CLI).

Every entry into a Python frame starts a row and the frame's exit ends it,
so a generator gives one row per resumption (up to its next yield), and a
frame left by an exception ends its row there. Times are on the dump's
clock (``time.monotonic_ns()`` is CLOCK_MONOTONIC). Events go to per-thread
buffers, one per ``threading.get_native_id()``, and become rows when
tracing stops (and at exit, and every 32 Ki events of a thread): one
``python_trace_{tid}_{timestamp}.csv`` per thread in the capture's dump
folder. Calls still open when tracing stops end at the stop time; frames
already open when it starts are not rows.

Two hooks give the same rows:

- CPython 3.12 and later: ``sys.monitoring`` (PY_START, PY_RESUME and
  PY_THROW begin a call; PY_RETURN, PY_YIELD and PY_UNWIND end it), under
  the first free tool id, PROFILER_ID when free. It is process-wide: every
  thread is traced, threads already running when tracing starts included
  (from their next call). Stopping unregisters the callbacks and frees the
  tool id. When tool ids 0-5 are all in use, a RuntimeWarning says so and
  the trace falls back to ``sys.setprofile``.
- CPython 3.10 and 3.11 (and that fallback): ``sys.setprofile`` on the
  thread that starts tracing and ``threading.setprofile`` for threads
  started afterwards; threads already running are not traced (these
  versions offer no way to hook them).
"""

from __future__ import annotations

import array
import os
import sys
import threading
import time
import warnings
from types import CodeType, FrameType
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import _lib

__all__ = ["start", "stop", "is_tracing"]

_mono = time.monotonic_ns
_PKG = os.path.dirname(os.path.abspath(__file__)) + os.sep
# A thread's events go into two buffers, msmemscope's own memory
# (msmemscope_own): a list of the calls' code objects (None: a return) and an
# array of their times. The hooks create no Python object and allocate
# nothing, so that nothing of the trace is charged to the program's frames
# (a list of tuples grew with every call, at the traced function's line).
# A buffer starts small and doubles when full, up to _SLOTS events; full at
# that size, its rows go to the thread's file. Tracing stops: they go, and
# the buffers too.
_FIRST_SLOTS = 1 << 10  # a thread's first buffers (16 KiB)
_SLOTS = 1 << 15  # their most (512 KiB)

_lock = threading.RLock()
_on = False
_by_api = False  # tracer.start() was called (not just a collected range)
_threads: List[_Thread] = []  # every _Thread of this trace session
_session = 0

# sys.monitoring where it is there (3.12+): it measured cheaper than
# sys.setprofile on 3.12 and 3.13 (bench/tracer_overhead.py). Tests set
# "setprofile" to compare the two.
_mon: Any = getattr(sys, "monitoring", None)
_backend = "monitoring" if _mon is not None else "setprofile"
_tool: Optional[int] = None  # the sys.monitoring tool id of the running trace

Profiler = Callable[[FrameType, str, Any], None]


_owned = _lib.owned  # msmemscope's own work: no rows


class _Thread:
    __slots__ = ("tid", "codes", "times", "n", "stack", "path", "fd", "closed")

    def __init__(self) -> None:
        self.tid = threading.get_native_id()
        with _owned():
            self.codes: List[Optional[CodeType]] = [None] * _FIRST_SLOTS
            self.times = array.array("q", bytes(8 * _FIRST_SLOTS))
            _ends.reaper = _Reaper(self)
        self.n = 0  # events buffered
        self.stack: List[Tuple[CodeType, int]] = []  # calls open at the last flush
        self.path: Optional[str] = None
        self.fd: Optional[int] = None
        self.closed = False


class _Reaper:
    """Kept in a thread-local: when the thread ends, its _Thread is queued
    for _sweep, which writes its rows and lets its buffers go (a program
    that starts a thread for each request would keep them all until
    tracing stops). Nothing more runs here: at the thread's end, code of
    the library's would be traced into a buffer of its own."""
    __slots__ = ("th",)

    def __init__(self, th: _Thread) -> None:
        self.th = th

    def __del__(self) -> None:
        _ended.append(self.th)


_ended: List[_Thread] = []  # threads that ended, their buffers still held


def _sweep() -> None:
    """Writes the rows of threads that ended and lets their buffers go
    (under _lock, as msmemscope's own)."""
    while _ended:
        th = _ended.pop()
        if th.closed:
            continue
        _flush(th, _mono())  # (calls still open end with the thread)
        _close(th)


_ends = threading.local()


def _full(th: _Thread) -> bool:
    """th's buffers are full: they double, or their rows go to its file.
    False once th is closed (tracing stopped): the event is dropped."""
    with _lock, _owned():
        if th.closed:
            return False
        n = len(th.codes)
        if n < _SLOTS:
            th.codes.extend([None] * n)
            th.times.extend(array.array("q", bytes(8 * n)))
        else:
            _flush(th)
        return not th.closed


def _put(th: _Thread, code: Optional[CodeType]) -> None:
    """Buffers a call of code (None: a return) now: the hooks' one step."""
    i = th.n
    try:
        th.codes[i] = code
    except IndexError:
        if not _full(th):
            return
        i = th.n
        th.codes[i] = code
    th.times[i] = _mono()
    th.n = i + 1


def _make_profiler(th: _Thread, session: int) -> Profiler:
    def prof(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            if not _on or _session != session:
                sys.setprofile(None)
                return
            code = frame.f_code
        elif event == "return":
            code = None
        else:
            return
        _put(th, code)
    return prof


def _thread_bootstrap(frame: FrameType, event: str, arg: Any) -> None:
    # threading.setprofile hands this to each new thread: give it its own
    # buffers, then trace its first call.
    with _lock:
        if not _on:
            sys.setprofile(None)
            return
        with _owned():
            _sweep()
            th = _Thread()
            _threads.append(th)
            prof = _make_profiler(th, _session)
    sys.setprofile(prof)
    prof(frame, event, arg)


_CALLS = ("PY_START", "PY_RESUME")  # (code, offset)
_THROWS = ("PY_THROW",)  # (code, offset, exception): a call too, as setprofile has it
_RETURNS = ("PY_RETURN", "PY_YIELD", "PY_UNWIND")  # (code, offset, value or exception)


def _take_tool() -> Optional[int]:
    """Claims a free sys.monitoring tool id: PROFILER_ID first, then the ids
    no convention gives an owner, the debugger's last."""
    m = _mon
    for tool in (m.PROFILER_ID, 3, 4, m.OPTIMIZER_ID, m.COVERAGE_ID, m.DEBUGGER_ID):
        if m.get_tool(tool) is None:
            try:
                m.use_tool_id(tool, "msmemscope")
            except ValueError:  # taken meanwhile
                continue
            return tool
    return None


def _monitor(tool: int) -> None:
    """Registers the callbacks on tool: each thread gets its _Thread at its
    first event."""
    m = _mon
    # New each session, and a thread's entry goes with the thread (thread
    # idents are reused).
    tl = threading.local()

    def new_thread() -> _Thread:
        with _lock, _owned():
            _sweep()
            th = _Thread()
            _threads.append(th)
            tl.th = th
        return th

    def add(code: Optional[CodeType]) -> None:
        try:
            th = tl.th
        except AttributeError:
            # A thread's first event. (A return has no call open here; the
            # library's own code at a thread's end, once its thread-local
            # is gone, gets no buffer.)
            if code is None or code.co_filename.startswith(_PKG):
                return
            th = new_thread()
        _put(th, code)

    def on_call(code: CodeType, offset: int) -> None:
        add(code)

    def on_throw(code: CodeType, offset: int, exc: BaseException) -> None:
        add(code)

    def on_return(code: CodeType, offset: int, value: object) -> None:
        add(None)

    mask = 0
    for names, fn in ((_CALLS, on_call), (_THROWS, on_throw), (_RETURNS, on_return)):
        for name in names:
            ev = getattr(m.events, name)
            m.register_callback(tool, ev, fn)
            mask |= ev
    m.set_events(tool, mask)


def _unmonitor(tool: int) -> None:
    # free_tool_id alone leaves events and callbacks in place before 3.14.
    m = _mon
    m.set_events(tool, 0)
    for name in _CALLS + _THROWS + _RETURNS:
        m.register_callback(tool, getattr(m.events, name), None)
    m.free_tool_id(tool)


def is_tracing() -> bool:
    return _on


def _begin() -> None:
    global _on, _session, _threads, _tool
    with _lock, _owned():
        if _on:
            return
        _session += 1
        _threads = []
        tool = None
        if _backend == "monitoring" and _mon is not None:
            tool = _take_tool()
            if tool is None:
                warnings.warn(
                    "msmemscope: sys.monitoring tool ids 0-5 are all in use: the Python trace falls back "
                    "to sys.setprofile (this thread and threads started after it only)",
                    RuntimeWarning, stacklevel=3)
        _on = True
        if tool is not None:
            _tool = tool
            _monitor(tool)
            return
        th = _Thread()
        _threads.append(th)
        threading.setprofile(_thread_bootstrap)
        sys.setprofile(_make_profiler(th, _session))


def _end() -> List[str]:
    """Stops tracing and writes every thread's rows; returns the files."""
    global _on, _tool
    with _lock, _owned():
        if not _on:
            return []
        now = _mono()
        if _tool is not None:
            _unmonitor(_tool)
            _tool = None
        else:
            sys.setprofile(None)
            threading.setprofile(None)
        _on = False
        _sweep()
        files = []
        for th in _threads:
            _flush(th, now)  # calls still open end now
            _close(th)
            if th.path:
                files.append(th.path)
        return files


_info: Dict[CodeType, str] = {}  # FuncInfo per code, "" for msmemscope's own


def _funcinfo(code: CodeType) -> str:
    s = _info.get(code)
    if s is None:
        if code.co_filename.startswith(_PKG):
            s = ""
        else:
            s = "%s:%d(%s)" % (code.co_filename, code.co_firstlineno, code.co_name)
            if any(c in s for c in ',"\n\r'):
                s = '"' + s.replace('"', '""') + '"'
        _info[code] = s
    return s


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


def _lines(th: _Thread, end: Optional[int]) -> List[str]:
    """Pairs th's buffered events into CSV rows, in the order of their ends;
    a return with no open call is a frame open before tracing began. With
    end, calls still open end then."""
    n, codes, times = th.n, th.codes, th.times
    th.n = 0
    stack, out = th.stack, []
    push, pop, add, info = stack.append, stack.pop, out.append, _info.get
    tail = ",%d,%d\n" % (th.tid, os.getpid())
    # One loop pairs and formats: a third faster than two.
    for i in range(n):
        code = codes[i]
        if code is not None:
            push((code, times[i]))
        elif stack:
            code, t0 = pop()
            fi = info(code)
            if fi is None:
                fi = _funcinfo(code)
            if fi:
                add("%s,%d,%d%s" % (fi, t0, times[i], tail))
    while end is not None and stack:
        code, t0 = pop()
        fi = _funcinfo(code)
        if fi:
            add("%s,%d,%d%s" % (fi, t0, end, tail))
    codes[:n] = [None] * n  # (the code objects are not kept alive by the trace)
    return out


def _close(th: _Thread) -> None:
    """Ends th's trace: its buffers let go (a hook still running finds them
    full), its file closed."""
    th.closed = True
    th.codes, th.times = [], array.array("q")
    if th.fd is not None:
        os.close(th.fd)
        th.fd = None


def _flush(th: _Thread, end: Optional[int] = None) -> None:
    """Writes th's rows so far to its file; with end, calls still open end
    then."""
    with _lock, _owned():  # (a hook's flush against _end's)
        if th.closed:
            th.n = 0
            return
        out = _lines(th, end)
        if not out:
            return
        try:
            if th.fd is None:
                got = _trace_file(th.tid)
                if got is None:
                    return
                th.path, th.fd = got
                os.write(th.fd, b"FuncInfo,StartTime(ns),EndTime(ns),Thread Id,Process Id\n")
            os.write(th.fd, "".join(out).encode("utf-8", "replace"))
        except OSError as e:
            # (from a hook, in the program's code: said, never raised there)
            th.closed = True
            th.codes, th.times = [], array.array("q")
            warnings.warn("msmemscope: the Python trace of thread %d stops: %s" % (th.tid, e), RuntimeWarning, stacklevel=2)


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
