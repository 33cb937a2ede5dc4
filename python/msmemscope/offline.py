"""Offline analysis of msmemscope dumps, mirroring msMemScope's API.

The analyses run in the Go library (the same code the CLI runs), streaming
the file: memory grows with the live blocks, not with the file's size. Inputs
are the ``memscope_dump_*.csv`` or ``.db`` files msmemscope writes.

    import msmemscope
    msmemscope.list_analyzers()                  # ["leaks", "inefficient"]
    msmemscope.get_analyzer_config("leaks")      # parameters, types, defaults
    leaks = msmemscope.check_leaks("dump.csv", mstx_info="iter", start_index=0)
    summary = msmemscope.check_inefficient("dump.db", mem_size=0)
    msmemscope.analyze("inefficient", input_path="dump.csv", idle_threshold=100)

``check_leaks`` prints its report and returns the leaked blocks (a list of
dicts). ``check_inefficient`` adds its results to the MALLOC rows of the file
(``inefficient`` in Attr; a CSV is rewritten atomically, a DB updated in one
transaction; results already there are kept and never repeated), prints a
summary and returns it as a dict.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from typing import Any, Dict, List, Optional, Sequence, Union

from . import _lib

__all__ = ["list_analyzers", "get_analyzer_config", "analyze", "check_leaks", "check_inefficient", "export"]

PathLike = Union[str, os.PathLike]


def _jsonable(name: str, v: Any) -> Any:
    if isinstance(v, os.PathLike):
        return os.fspath(v)
    if isinstance(v, (list, tuple)):
        return [_jsonable(name, x) for x in v]
    if v is None or isinstance(v, (str, int, float, bool)):
        return v
    raise TypeError("%s: unsupported value %r of type %s" % (name, v, type(v).__name__))


def list_analyzers() -> List[str]:
    """The analyses available offline: ["leaks", "inefficient"]."""
    _lib.refuse_in_child("list_analyzers")
    return _lib.call("msmemscope_list_analyzers")["result"]


def get_analyzer_config(analyzer_type: str) -> Dict[str, Dict[str, Any]]:
    """The parameters of an analysis, in order: {name: {"type", "required",
    "default", "description"}}."""
    _lib.refuse_in_child("get_analyzer_config")
    if not isinstance(analyzer_type, str):
        raise TypeError("analyzer_type must be a str, got %s" % type(analyzer_type).__name__)
    res = _lib.call("msmemscope_analyzer_config", analyzer_type.encode())["result"]
    return {name: res["params"][name] for name in res["order"]}


def default(analyzer_type: str, param: str) -> Any:
    """The default of an analysis' parameter, as the library's registry has it."""
    return get_analyzer_config(analyzer_type)[param]["default"]


def _run(analyzer_type: str, kwargs: Dict[str, Any], quiet: bool = False) -> Any:
    if not isinstance(analyzer_type, str):
        raise TypeError("analyzer_type must be a str, got %s" % type(analyzer_type).__name__)
    args = {k: _jsonable(k, v) for k, v in kwargs.items()}
    reply = _lib.call("msmemscope_analyze", analyzer_type.encode(), json.dumps(args).encode())
    if not quiet and reply.get("text"):
        sys.stdout.write(reply["text"])
        sys.stdout.flush()
    return reply["result"]


def analyze(analyzer_type: str, **kwargs: Any) -> Any:
    """Runs an analysis by name with its parameters as keyword arguments
    (see get_analyzer_config): "leaks" returns check_leaks' list of blocks,
    "inefficient" check_inefficient's summary."""
    _lib.refuse_in_child("analyze")
    res = _run(analyzer_type, kwargs)
    if analyzer_type == "leaks":
        return res["leaks"]
    return res


def check_leaks(input_path: PathLike, mstx_info: str, start_index: int,
                event_type: Optional[str] = None) -> List[Dict[str, Any]]:
    """Leaks between mstx marks: among the marks whose message
    is mstx_info, the start_index-th (from 0) is A and the next two are B and
    C; blocks allocated between A and B and not freed before C are leaks.
    event_type (e.g. "HAL", "PTA", "HOST") narrows the blocks looked at.
    Prints the report and returns the leaked blocks: dicts with id (the
    MALLOC row), allocation_id, ptr, size, event_type, device, pid, tid,
    timestamp, owner, python_stack, c_stack."""
    _lib.refuse_in_child("check_leaks")
    return analyze("leaks", input_path=input_path, mstx_info=mstx_info, start_index=start_index,
                   event_type=event_type)


def check_inefficient(input_path: PathLike, mem_size: Optional[int] = None,
                      inefficient_type: Union[str, Sequence[str], None] = None,
                      idle_threshold: Optional[int] = None) -> Dict[str, Any]:
    """Inefficient memory: early_allocation, late_deallocation,
    temporary_idleness of PTA and HAL blocks of at least mem_size bytes.
    mem_size and idle_threshold left None take the library's defaults
    (get_analyzer_config("inefficient")).
    The results are added to the file's MALLOC rows. Prints a summary and
    returns it: {"summary": {type: {"blocks", "bytes", "api_span"}},
    "results_added", "file_rewritten", "blocks" (the largest, at most
    1000), "blocks_total", ...}."""
    _lib.refuse_in_child("check_inefficient")
    kwargs: Dict[str, Any] = {"input_path": input_path, "inefficient_type": inefficient_type}
    if mem_size is not None:
        kwargs["mem_size"] = mem_size
    if idle_threshold is not None:
        kwargs["idle_threshold"] = idle_threshold
    return analyze("inefficient", **kwargs)


def export(input_path: PathLike, formats: Optional[Union[str, Sequence[str]]] = None,
           output: Optional[PathLike] = None) -> List[str]:
    """Writes a capture or dump in other tools' formats and returns the paths
    written: "html" (report_{stamp}.html: one self-contained page with
    memory over time, flame graphs at the peak and of the leaks, top sites,
    leaks, inefficient blocks and owners), "pprof" (a heap profile for ``go tool pprof``:
    alloc_objects, alloc_space, inuse_objects, inuse_space, labelled by
    device, owner, step and leak kind), "perfetto" (a Chrome JSON trace
    that ui.perfetto.dev opens: live bytes per type and owner as counters,
    operators as slices, kernels and marks as instants, mstx ranges as
    async slices) and "memory_viz" (memory_viz_{stamp}.pickle: PyTorch's
    memory snapshot, of the PTA blocks and HAL segments, that
    pytorch.org/memory_viz opens and torch.cuda._memory_viz reads; load it
    with pickle.load). input_path: a capture or output
    folder, a dump CSV or DB. formats: a name, a list of names, or None for
    every format. The files go into output/export, or, without output, into
    the capture's export folder."""
    _lib.refuse_in_child("export")
    if isinstance(formats, str):
        formats = [formats]
    if formats is not None and not isinstance(formats, (list, tuple, set, frozenset)):
        raise TypeError("formats: a str, a list of str or None, got %s" % type(formats).__name__)
    names = list(formats or [])
    for f in names:
        if not isinstance(f, str):
            raise TypeError("formats: each format must be a str, got %s" % type(f).__name__)
    out = _lib.path_arg("output", output).encode() if output is not None else b""
    res = _lib.call("msmemscope_export", _lib.path_arg("input_path", input_path).encode(), ",".join(names).encode(), out)
    for note in (res.get("text") or "").splitlines():  # what a file lacks, as the CLI says it
        warnings.warn("msmemscope: " + note, RuntimeWarning, stacklevel=2)
    return res["result"]
