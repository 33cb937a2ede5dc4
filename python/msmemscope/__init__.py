"""msmemscope: memory profiling of the host heap, PyTorch and CUDA.

Quick start::

    import msmemscope
    msmemscope.config(call_stack="python:10", events="alloc,free,traceback")
    msmemscope.start(); train(); msmemscope.stop()

Host-heap events need libmemscope.so preloaded: run the program under the
CLI (``msmemscope python train.py``) or ``python -m msmemscope run
train.py``. See python/README.md.

Importing costs little: the library is bound on first use (at import only
when it is preloaded), and nothing beyond the standard library is needed.
"""

from __future__ import annotations

import atexit
import json
import os
import warnings
from typing import Any, Dict, Optional

from . import _lib, mstx, torch_hooks, tracer
from ._describe import describe
from .torch_hooks import watch

__all__ = [
    "config", "start", "stop", "step", "tracer", "mstx", "describe", "watch", "__version__",
    # where memory is now, and the peak timeline of a finished capture
    "get_mem_report", "get_all_time_size", "get_mem_report_with_time",
    # offline analyses of a dump
    "list_analyzers", "get_analyzer_config", "analyze", "check_leaks", "check_inefficient", "export", "analyzer",
]
__version__ = _lib.version()

_cfg = None  # type: Optional[Dict[str, Any]]  # the effective configuration, as the library has it
_warned_heap = False
_started = False  # between start() and stop()


def _value(name: str, v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        raise ValueError("invalid value %r for %s: a bool is not a value of this option" % (v, name))
    if isinstance(v, int):
        return str(v)
    if isinstance(v, (list, tuple, set, frozenset)):
        return ",".join(_value(name, x) for x in v)
    if isinstance(v, (str, os.PathLike)):
        return os.fspath(v)
    raise ValueError("invalid value %r for %s: expected a str" % (v, name))


def _config() -> Dict[str, Any]:
    global _cfg
    if _cfg is None:
        _cfg = _lib.effective_config()
    return _cfg


def config(**items: Any) -> None:
    """Sets options by the CLI's names (underscores for dashes): device,
    level, events, call_stack, collect_mode, analysis, steps, watch,
    data_format, output, log_level, log_mode, log_files, log_file_mb,
    export.

    Every value is checked with the CLI's rules, all or none: a violation
    raises ValueError naming the option, the value and the rule. "" (or
    None) switches an item off. May be called before start() and between
    ranges. output given once the capture has begun (under the CLI) moves
    the capture folder there, whole, so its files are written there.
    """
    global _cfg
    if "output" in items and items["output"] is None:  # (None switches an item off: output has none)
        raise ValueError("invalid value None for output: must not be empty")
    pairs = [[k, _value(k, v)] for k, v in items.items()]
    _lib.configure(pairs)
    _cfg = None
    cfg = _config()
    _warn_log_files(items, cfg)
    torch_hooks.reconfigured(cfg)
    if tracer.is_tracing() and not tracer._by_api and not _traceback(cfg):
        tracer._end()


def _warn_log_files(items: Dict[str, Any], cfg: Dict[str, Any]) -> None:
    # The CLI says the same of --log-files/--log-file-mb without rotate:
    # a value that is silently ignored looks like a bound that holds.
    given = [k for k in ("log_files", "log_file_mb") if items.get(k) not in (None, "")]
    if not given or cfg.get("log_mode") == "rotate" or cfg.get("log_level") == "error":
        return
    warnings.warn(
        "msmemscope: %s %s with log_mode='rotate' only: log_mode is %r, which keeps one whole spool"
        % (" and ".join(given), "apply" if len(given) > 1 else "applies", cfg.get("log_mode")),
        RuntimeWarning, stacklevel=3)


def _traceback(cfg: Dict[str, Any]) -> bool:
    return bool(cfg.get("events", {}).get("traceback"))


def _warn_heap(cfg: Dict[str, Any]) -> None:
    global _warned_heap
    if _warned_heap or _lib.preloaded() or cfg.get("log_level") == "error":
        return
    if "cpu" in (cfg.get("devices") or []) and cfg.get("events", {}).get("alloc"):
        _warned_heap = True
        warnings.warn(
            "msmemscope: host-heap events need libmemscope.so preloaded: run the program under the "
            "msmemscope CLI or with `python -m msmemscope run script.py`. Collecting the rest.",
            RuntimeWarning, stacklevel=3)


def start() -> None:
    """Switches collection on (SYSTEM START); with events containing
    traceback, the Python trace runs until stop()."""
    global _started
    cfg = _config()
    _warn_heap(cfg)
    _lib.start()
    _started = True
    if _traceback(cfg) and not _lib.in_child():
        tracer._range_start()
    if torch_hooks.wanted(cfg):
        torch_hooks.enable(cfg)


def stop() -> Optional[str]:
    """Switches collection off (SYSTEM STOP). Without the CLI, writes the
    files (dump, config.json, reports) from everything captured so far (new files on each
    call) and returns the dump's path; under the CLI returns None (the CLI
    writes them when the program ends)."""
    global _started
    _started = False
    tracer._range_stop()
    torch_hooks.disable()
    return _lib.stop()


def step() -> None:
    """Ends the current step and starts the next."""
    _lib.get().msmemscope_step()
    if torch_hooks.enabled():
        torch_hooks.snapshot()


def _at_exit() -> None:
    # Before the library's own exit work (it converts an open range when
    # no CLI owns the capture): the trace files must be written first.
    if tracer.is_tracing():
        tracer._end()


atexit.register(_at_exit)


def _auto() -> None:
    """Under the CLI: bind now, and in immediate mode with traceback start
    the Python trace at once."""
    if "libmemscope" not in os.environ.get("LD_PRELOAD", ""):
        return
    try:
        _lib.get()
    except OSError:
        return
    if not _lib.preloaded():
        return
    try:
        env = json.loads(os.environ.get("MSMEMSCOPE_CONFIG", "{}"))
    except ValueError:
        return
    if env.get("collect_mode", "immediate") == "immediate" and env.get("events", {}).get("traceback"):
        tracer._range_start()


_auto()


def _startup_torch() -> None:
    """The CLI's startup hook calls this once the traced program has imported
    torch: the PyTorch collection starts as if the program had called
    start() now (in deferred mode only once it has)."""
    if not _lib.preloaded() or _lib.in_child():
        return
    import threading
    if threading.current_thread() is not threading.main_thread():
        return  # the hooks follow one thread: the script's own start() chooses then
    cfg = _config()
    if cfg.get("collect_mode") == "deferred" and not _started:
        return
    if torch_hooks.wanted(cfg) and not torch_hooks.enabled():
        torch_hooks.enable(cfg)
        atexit.register(torch_hooks.disable)

from .memreport import get_all_time_size, get_mem_report, get_mem_report_with_time  # noqa: E402
from .offline import list_analyzers, get_analyzer_config, analyze, check_leaks, check_inefficient, export  # noqa: E402
from . import analyzer  # noqa: E402
