"""The binding to libmemscope.so: the one copy already mapped in the process.

A process traced by the CLI (or ``python -m msmemscope run``) has the library
preloaded; ``ctypes.CDLL`` on the same path returns the same handle, so there
is one Go runtime and one capture. Otherwise the copy shipped in the package
is loaded with dlopen: its API works, but it interposes nothing, so host-heap
events need preloading.

Every C function's signature is declared here (SIGNATURES), and every data
call goes through call(). The library refuses every call in a forked child
(a child of a multi-threaded Go process cannot run Go code): status calls
return -1 there and data calls NULL, which call() turns into RuntimeError.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import operator
import os
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple, Type

_PKG = os.path.dirname(os.path.abspath(__file__))
_REPO_BUILD = os.path.normpath(os.path.join(_PKG, "..", "..", "build"))

_lock = threading.RLock()
_lib: Optional[ctypes.CDLL] = None
_path: Optional[str] = None
_preloaded = False
_pid: Optional[int] = None
_child = False


def _after_fork_in_child() -> None:
    global _child
    _child = True


os.register_at_fork(after_in_child=_after_fork_in_child)


def in_child() -> bool:
    """True in a process forked from the one that loaded the library (or
    from one the CLI traced, forked before msmemscope was imported: the
    preloaded library knows)."""
    if not _child and _pid is None and mapped_path():
        get()
    return _child or (_pid is not None and os.getpid() != _pid)


def mapped_path() -> Optional[str]:
    """The path of a libmemscope.so mapped in this process, or None."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                i = line.find("/")
                if i < 0:
                    continue
                p = line[i:].rstrip("\n")
                if os.path.basename(p) == "libmemscope.so":
                    return p
    except OSError:
        pass
    return None


def version() -> str:
    """The version, written once in internal/version/VERSION (Go embeds it;
    setup.py ships it in the package)."""
    for p in (os.path.join(_PKG, "VERSION"), os.path.join(_PKG, "..", "..", "internal", "version", "VERSION")):
        try:
            with open(p) as f:
                return f.read().strip()
        except OSError:
            pass
    return "unknown"


def shipped_path() -> str:
    """The library shipped in the package (or $MSMEMSCOPE_LIB, or the build
    folder of a source checkout)."""
    cands = [os.environ.get("MSMEMSCOPE_LIB"), os.path.join(_PKG, "lib", "libmemscope.so"),
             os.path.join(_REPO_BUILD, "lib", "libmemscope.so")]
    for p in cands:
        if p and os.path.isfile(p):
            return os.path.abspath(p)
    raise OSError("libmemscope.so not found: install msmemscope with pip, or set MSMEMSCOPE_LIB")


def cli_path() -> str:
    """The msmemscope command shipped in the package (or $MSMEMSCOPE_CLI, or
    the build folder of a source checkout)."""
    cands = [os.environ.get("MSMEMSCOPE_CLI"), os.path.join(_PKG, "bin", "msmemscope"),
             os.path.join(_REPO_BUILD, "bin", "msmemscope")]
    for p in cands:
        if p and os.path.isfile(p) and os.access(p, os.X_OK):
            return os.path.abspath(p)
    raise OSError("the msmemscope command was not found: install msmemscope with pip, or set MSMEMSCOPE_CLI")


# The C API (include/msmemscope.h), every function's ctypes signature in
# one table. A status call returns an int (0, or -1 in a forked child). A
# data call returns a reply: JSON from malloc, {"ok": true, "result": ...}
# or {"ok": false, "type": "ValueError", "error": "..."}, NULL in a forked
# child; it is typed c_void_p so that call() can free it.
_c = ctypes
_REPLY = _c.c_void_p
SIGNATURES: Dict[str, Tuple[List[Any], Any]] = {
    # collection and owner tags (C shims: refused in a forked child)
    "msmemscope_start": ([], _c.c_int),
    "msmemscope_stop": ([], _c.c_int),
    "msmemscope_step": ([], _c.c_int),
    "msmemscope_describe": ([_c.c_uint64, _c.c_char_p], _c.c_int),
    "msmemscope_describe_push": ([_c.c_char_p], _c.c_int),
    "msmemscope_describe_pop": ([], _c.c_int),
    "msmemscope_python_package": ([_c.c_char_p], _c.c_int),
    "msmemscope_torch_event": ([_c.c_uint16, _c.c_uint64, _c.c_char_p, _c.c_uint32], _c.c_int),
    "msmemscope_own": ([_c.c_int], _c.c_int),
    "msmemscope_torch_op": ([_c.c_int, _c.c_int, _c.c_char_p, _c.c_int], _c.c_int),
    "msmemscope_in_child": ([], _c.c_int),
    "msmemscope_hash64": ([_c.c_void_p, _c.c_size_t], _c.c_uint64),
    "msmemscope_interposed": ([], _c.c_int),
    "msmemscope_standalone": ([], _c.c_int),
    "msmemscope_exit_files": ([_c.c_int], _c.c_int),
    "mstxMarkA": ([_c.c_char_p, _c.c_void_p], None),
    "mstxRangeStartA": ([_c.c_char_p, _c.c_void_p], _c.c_uint64),
    "mstxRangeEnd": ([_c.c_uint64], None),
    # data calls: a reply
    "msmemscope_config": ([_c.c_char_p], _REPLY),
    "msmemscope_get_config": ([], _REPLY),
    "msmemscope_py_begin": ([], _REPLY),
    "msmemscope_py_start": ([], _REPLY),
    "msmemscope_py_stop": ([], _REPLY),
    "msmemscope_dir": ([], _REPLY),
    "msmemscope_get_mem_report": ([], _REPLY),
    "msmemscope_get_all_time_size": ([_c.c_char_p, _c.c_int], _REPLY),
    "msmemscope_get_mem_report_with_time": ([_c.c_char_p, _c.c_longlong, _c.c_int], _REPLY),
    "msmemscope_export": ([_c.c_char_p, _c.c_char_p, _c.c_char_p], _REPLY),
    "msmemscope_window_begin": ([], _REPLY),
    "msmemscope_window_end": ([_c.c_int], _REPLY),
    "msmemscope_list_analyzers": ([], _REPLY),
    "msmemscope_analyzer_config": ([_c.c_char_p], _REPLY),
    "msmemscope_analyze": ([_c.c_char_p, _c.c_char_p], _REPLY),
    "msmemscope_free_string": ([_c.c_void_p], None),
}


def _declare(lib: ctypes.CDLL) -> None:
    for name, (args, res) in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = res


def get() -> ctypes.CDLL:
    """The library, loaded on first use."""
    global _lib, _path, _preloaded, _pid, _child
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        path = mapped_path()
        if path:
            lib = ctypes.CDLL(path)
            _preloaded = True
        else:
            path = shipped_path()
            # Loaded late, the library records only what the API asks for:
            # nothing before start() (and it interposes nothing anyway).
            old = os.environ.get("MSMEMSCOPE_HOOK")
            os.environ["MSMEMSCOPE_HOOK"] = "heap=0,cstack=0,deferred=1"
            try:
                lib = ctypes.CDLL(path)
            finally:
                if old is None:
                    os.environ.pop("MSMEMSCOPE_HOOK", None)
                else:
                    os.environ["MSMEMSCOPE_HOOK"] = old
        _declare(lib)
        _path, _pid = path, os.getpid()
        if _preloaded and lib.msmemscope_in_child():
            # Forked from a traced process before msmemscope was imported:
            # the library refuses every call here, as after a later fork.
            _child = True
            _lib = lib
            return lib
        lib.msmemscope_python_package((_PKG + os.sep).encode())
        _lib = lib
        return lib


def untyped(name: str) -> Any:
    """A function of the library called without argument types: ctypes then
    passes ints as C ints and bytes as char pointers, in ~0.6 µs where a
    typed call takes ~1.5 µs (the operator hooks make four a call). Only for
    functions whose arguments are all int or char * (msmemscope_own,
    msmemscope_torch_op), with ints that fit an int and bytes, never str
    (a str would go as a wchar_t *)."""
    return get()[name]


@contextlib.contextmanager
def owned() -> Any:
    """msmemscope's own work on this thread (the trace's, the operator
    hooks'): what it allocates is tracked and makes no rows
    (msmemscope_own)."""
    own = untyped("msmemscope_own")
    own(1)
    try:
        yield
    finally:
        own(0)


def preloaded() -> bool:
    get()
    return _preloaded


# The exception each reply "type" becomes.
_EXCEPTIONS: Dict[str, Type[Exception]] = {
    "TypeError": TypeError,
    "ValueError": ValueError,
    "FileNotFoundError": FileNotFoundError,
    "IsADirectoryError": IsADirectoryError,
    "PermissionError": PermissionError,
    "RuntimeError": RuntimeError,
}


def refuse_in_child(what: str) -> None:
    """Raises RuntimeError in a process forked from the one that loaded the
    library: the library refuses every call there (its Go runtime did not
    survive the fork), so what asks for its results must say so."""
    if in_child():
        raise RuntimeError("msmemscope: %s called in a forked child: call it from the parent, "
                           "or start the child with spawn" % what)


def call(name: str, *args: Any) -> Dict[str, Any]:
    """Calls data call name of the C API and decodes its reply: {"ok": True,
    "result": ..., "text"?: ...}; an error reply raises the exception it
    names. Refused in a forked child (RuntimeError, refuse_in_child)."""
    refuse_in_child(name)
    lib = get()
    p = getattr(lib, name)(*args)
    if not p:
        refuse_in_child(name)  # forked while the call was made
        raise MemoryError("msmemscope: %s: out of memory" % name)
    # Reading the reply is msmemscope's own work (a measurement window
    # just opened must not count it): tracked, no rows.
    lib.msmemscope_own(1)
    try:
        reply = json.loads(ctypes.string_at(p).decode("utf-8", "replace"))
    finally:
        lib.msmemscope_free_string(p)
        lib.msmemscope_own(0)
    if not reply.get("ok"):
        exc = _EXCEPTIONS.get(reply.get("type", ""), RuntimeError)
        raise exc(reply.get("error", "msmemscope: unknown error"))
    return reply


def int_arg(name: str, v: Any) -> int:
    """v, checked to be an int (not a bool): TypeError naming the argument,
    the value and the rule."""
    if not isinstance(v, bool):
        try:
            return operator.index(v)  # ints and int-like (numpy integers), not floats
        except TypeError:
            pass
    raise TypeError("%s must be an int, got %s %.40r" % (name, type(v).__name__, v))


def path_arg(name: str, v: Any) -> str:
    """v, checked to be a non-empty str or os.PathLike; returned as a str."""
    if not isinstance(v, (str, os.PathLike)):
        raise TypeError("%s must be a str or a path, got %s %.40r" % (name, type(v).__name__, v))
    p = os.fspath(v)
    if not isinstance(p, str):
        raise TypeError("%s must be a str path, got %s %.40r" % (name, type(p).__name__, p))
    if not p:
        raise ValueError("%s must not be empty" % name)
    return p


def configure(pairs: Sequence[Sequence[str]]) -> None:
    """Applies [(name, value)] with the library's rules; ValueError on a
    violation (the CLI's rule text, Python's option names)."""
    if in_child():
        return
    call("msmemscope_config", json.dumps(pairs).encode())


def effective_config() -> Dict[str, Any]:
    get()
    if in_child():
        return {}
    return call("msmemscope_get_config")["result"]


def begin() -> None:
    if in_child():
        return
    call("msmemscope_py_begin")


def start() -> None:
    if in_child():
        return
    call("msmemscope_py_start")


def stop() -> Optional[str]:
    """Switches collection off; without the CLI, writes the files and
    returns the dump's path (else None)."""
    lib = get()
    if in_child():
        lib.msmemscope_stop()
        return None
    return call("msmemscope_py_stop")["result"]


def capture_dir() -> Optional[str]:
    if in_child():
        return None
    return call("msmemscope_dir")["result"]


def standalone() -> bool:
    return get().msmemscope_standalone() == 1 if not in_child() else False
