"""The binding to libmemscope.so: the one copy already mapped in the process.

A process traced by the CLI (or ``python -m msmemscope run``) has the library
preloaded; ``ctypes.CDLL`` on the same path returns the same handle, so there
is one Go runtime and one capture. Otherwise the copy shipped in the package
is loaded with dlopen: its API works, but it interposes nothing, so host-heap
events need preloading.

Functions that enter Go are never called in a forked child (a child of a
multi-threaded Go process cannot run Go code); the C shims (mstx, step,
start/stop, describe) are safe there and do nothing.
"""

import ctypes
import json
import os
import threading

_PKG = os.path.dirname(os.path.abspath(__file__))
_REPO_BUILD = os.path.normpath(os.path.join(_PKG, "..", "..", "build"))

_lock = threading.RLock()
_lib = None
_path = None
_preloaded = False
_pid = None
_child = False


def _after_fork_in_child():
    global _child
    _child = True


os.register_at_fork(after_in_child=_after_fork_in_child)


def in_child():
    """True in a process forked from the one that loaded the library."""
    return _child or (_pid is not None and os.getpid() != _pid)


def mapped_path():
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


def shipped_path():
    """The library shipped in the package (or $MSMEMSCOPE_LIB, or the build
    folder of a source checkout)."""
    cands = [os.environ.get("MSMEMSCOPE_LIB"), os.path.join(_PKG, "lib", "libmemscope.so"),
             os.path.join(_REPO_BUILD, "lib", "libmemscope.so")]
    for p in cands:
        if p and os.path.isfile(p):
            return os.path.abspath(p)
    raise OSError("libmemscope.so not found: install msmemscope with pip, or set MSMEMSCOPE_LIB")


def cli_path():
    """The msmemscope command shipped in the package (or $MSMEMSCOPE_CLI, or
    the build folder of a source checkout)."""
    cands = [os.environ.get("MSMEMSCOPE_CLI"), os.path.join(_PKG, "bin", "msmemscope"),
             os.path.join(_REPO_BUILD, "bin", "msmemscope")]
    for p in cands:
        if p and os.path.isfile(p) and os.access(p, os.X_OK):
            return os.path.abspath(p)
    raise OSError("the msmemscope command was not found: install msmemscope with pip, or set MSMEMSCOPE_CLI")


def _declare(lib):
    c_char_p, c_int, c_void_p, c_uint64 = ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64
    sigs = {
        "msmemscope_config": ([c_char_p, c_char_p, c_int], c_int),
        "msmemscope_py_begin": ([c_char_p, c_int], c_int),
        "msmemscope_py_start": ([c_char_p, c_int], c_int),
        "msmemscope_py_stop": ([c_char_p, c_int], c_int),
        "msmemscope_dir": ([c_char_p, c_int], c_int),
        "msmemscope_get_config": ([c_char_p, c_int], c_int),
        "msmemscope_interposed": ([], c_int),
        "msmemscope_standalone": ([], c_int),
        "msmemscope_start": ([], c_int),
        "msmemscope_stop": ([], c_int),
        "msmemscope_step": ([], c_int),
        "msmemscope_describe": ([c_uint64, c_char_p], c_int),
        "msmemscope_describe_push": ([c_char_p], c_int),
        "msmemscope_describe_pop": ([], c_int),
        "msmemscope_python_package": ([c_char_p], c_int),
        "mstxMarkA": ([c_char_p, c_void_p], None),
        "mstxRangeStartA": ([c_char_p, c_void_p], c_uint64),
        "mstxRangeEnd": ([c_uint64], None),
    }
    for name, (args, res) in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = res


def get():
    """The library, loaded on first use."""
    global _lib, _path, _preloaded, _pid
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
        lib.msmemscope_python_package((_PKG + os.sep).encode())
        _lib = lib
        return lib


def preloaded():
    get()
    return _preloaded


def _call_err(fn, *args):
    buf = ctypes.create_string_buffer(4096)
    rc = fn(*args, buf, len(buf))
    return rc, buf.value.decode("utf-8", "replace")


def configure(pairs):
    """Applies [(name, value)] with the library's rules; ValueError on a
    violation (the CLI's rule text, Python's option names)."""
    if in_child():
        return
    lib = get()
    rc, err = _call_err(lib.msmemscope_config, json.dumps(pairs).encode())
    if rc != 0:
        raise ValueError(err)


def effective_config():
    lib = get()
    if in_child():
        return {}
    n = 1 << 14
    while True:
        buf = ctypes.create_string_buffer(n)
        k = lib.msmemscope_get_config(buf, n)
        if k < n:
            return json.loads(buf.value.decode())
        n = k + 1


def begin():
    if in_child():
        return
    rc, err = _call_err(get().msmemscope_py_begin)
    if rc != 0:
        raise RuntimeError("msmemscope: " + err)


def start():
    if in_child():
        return
    rc, err = _call_err(get().msmemscope_py_start)
    if rc != 0:
        raise RuntimeError("msmemscope: " + err)


def stop():
    """Switches collection off; without the CLI, writes the files and
    returns the dump's path (else None)."""
    lib = get()
    if in_child():
        lib.msmemscope_stop()
        return None
    rc, out = _call_err(lib.msmemscope_py_stop)
    if rc != 0:
        raise RuntimeError("msmemscope: " + out)
    return out or None


def capture_dir():
    if in_child():
        return None
    buf = ctypes.create_string_buffer(8192)
    get().msmemscope_dir(buf, len(buf))
    return buf.value.decode() or None


def standalone():
    return bool(get().msmemscope_standalone()) if not in_child() else False
