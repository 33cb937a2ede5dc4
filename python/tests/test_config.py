"""msmemscope.config(): the CLI's rules through the library, ValueError with
the rule's text, all-or-none, "" switches an item off."""
import subprocess

import pytest

import msmemscope
from msmemscope import _lib

from conftest import PY, _env

# (option, value, the offending value shown, rule) — the texts of
# config/parse.go, one case per rule.
CASES = [
    ("device", "gpu", "gpu", "must be cpu, cuda, cuda:{id} or npu:{id} with id in [0,31]"),
    ("device", "cuda:32", "cuda:32", "must be cpu, cuda, cuda:{id} or npu:{id} with id in [0,31]"),
    ("device", "", "", "must not be empty: give cpu, cuda, cuda:{id} or npu:{id} with id in [0,31]"),
    ("device", "cpu,,cuda", "cpu,,cuda", "empty item in the comma-separated list"),
    ("level", "2", "2", "must be op (or 0) or kernel (or 1)"),
    ("events", "alloc,oom", "oom", "must be one of alloc, free, launch, access, traceback"),
    ("call_stack", "java:3", "java:3", "must be python[:depth] or c[:depth], comma-separated"),
    ("call_stack", "python:1001", "python:1001", "depth must be an integer in [0,1000]"),
    ("call_stack", "python,python:3", "python,python:3", "python given twice"),
    ("call_stack", "c:1,c", "c:1,c", "c given twice"),
    ("collect_mode", "lazy", "lazy", "must be immediate or deferred"),
    ("analysis", "leaks,speed", "speed", "must be one of leaks, inefficient, decompose"),
    ("steps", "0", "0", "step ids must be integers in [1,2147483647]"),
    ("steps", "1,2,3,4,5,6", "1,2,3,4,5,6", "at most 5 step ids"),
    ("steps", "2,2", "2,2", "step id 2 given twice"),
    ("watch", "a,b,c", "a,b,c", "must be [start[:out{id}],]end[,full-content]"),
    ("watch", "full-content", "full-content", "end is required: [start[:out{id}],]end[,full-content]"),
    ("watch", "aten::add:out0", "aten::add:out0", "out{id} requires start: [start[:out{id}],]end[,full-content]"),
    ("watch", "a,b:out1", "a,b:out1", "out{id} applies to start only: [start[:out{id}],]end[,full-content]"),
    ("watch", "a,full-content,b", "a,full-content,b", "full-content must come last: [start[:out{id}],]end[,full-content]"),
    ("watch", "a#0,b", "a#0", "N in #N must be an integer in [1,2147483647]"),
    ("watch", "a:out70000,b", "a:out70000", "id in out{id} must be an integer in [0,65535]"),
    ("watch", "a:out1#2,b", "a:out1#2", "#N goes before out{id}: start[#N][:out{id}]"),
    ("watch", "#3", "#3", "operator name must not be empty"),
    ("data_format", "xml", "xml", "must be csv or db"),
    ("output", "", "", "must not be empty"),
    ("output", "x" * 4097, "x" * 64 + "...", "must be at most 4096 bytes"),
    ("output", "-x", "-x", "must not begin with '-' (another option taken as its value? a folder so named: ./-name)"),
    ("output", "  ", "  ", "must not be blank"),
    ("output", "a\nb", "a\\nb", "must not contain NUL or newline characters"),
    ("log_level", "debug", "debug", "must be info, warn or error"),
    ("log_mode", "ring", "ring", "must be full or rotate"),
    ("log_files", "0", "0", "must be an integer in [1,1000]"),
    ("log_file_mb", "10241", "10241", "must be an integer in [1,10240]"),
]


@pytest.mark.parametrize("name,value,shown,rule", CASES, ids=["%s=%.20r" % (c[0], c[1]) for c in CASES])
def test_rule(name, value, shown, rule):
    with pytest.raises(ValueError) as e:
        msmemscope.config(**{name: value})
    assert str(e.value) == 'invalid value "%s" for %s: %s' % (shown, name, rule)


def test_log_files_without_rotate_warns():
    # As the CLI: a bound that does not apply is said, not silently ignored.
    msmemscope.config(log_mode="full")
    with pytest.warns(RuntimeWarning, match=r"^msmemscope: log_files and log_file_mb apply with log_mode='rotate' only: log_mode is 'full'"):
        msmemscope.config(log_files=3, log_file_mb=4)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        msmemscope.config(log_mode="rotate", log_files=3)  # applies: no warning
        msmemscope.config(log_mode="full", log_level="error", log_file_mb=5)  # error level: silent
        msmemscope.config(log_level="warn")
        msmemscope.config(log_mode="full")


def test_output_none_is_named():
    with pytest.raises(ValueError, match=r"^invalid value None for output: must not be empty$"):
        msmemscope.config(output=None)


def test_unknown_option():
    with pytest.raises(ValueError, match='unknown option "colour"'):
        msmemscope.config(colour="red")


def test_all_or_none_and_off():
    msmemscope.config(steps="1,3", call_stack="python:5,c:7", analysis="leaks")
    cfg = _lib.effective_config()
    assert cfg["steps"] == [1, 3] and cfg["python_stack_depth"] == 5 and cfg["c_stack_depth"] == 7
    with pytest.raises(ValueError):
        msmemscope.config(steps="2", level="bogus")  # the good item is not applied either
    assert _lib.effective_config()["steps"] == [1, 3]
    msmemscope.config(steps="", call_stack=None, analysis="", events="")
    cfg = _lib.effective_config()
    assert cfg["steps"] is None or cfg["steps"] == []
    assert cfg["python_stack_depth"] == 0 and cfg["c_stack_depth"] == 0 and not cfg["python_stack"]
    assert cfg["analysis"] == []
    assert not any(cfg["events"].values())
    # Implications are the CLI's: leaks needs alloc and free.
    with pytest.warns(RuntimeWarning, match="log_files applies with log_mode='rotate' only"):
        msmemscope.config(analysis="leaks", events=["launch"], log_files=3)
    cfg = _lib.effective_config()
    assert cfg["events"]["alloc"] and cfg["events"]["free"] and cfg["events"]["launch"]
    assert cfg["log_files"] == 3
    with pytest.raises(ValueError, match="bool"):
        msmemscope.config(steps=True)


def test_import_is_cheap():
    code = ("import sys, time; t=time.perf_counter(); import msmemscope; d=time.perf_counter()-t\n"
            "assert 'torch' not in sys.modules and 'numpy' not in sys.modules\n"
            "assert msmemscope._lib._lib is None, 'library bound at import without preloading'\n"
            "print(d)")
    out = subprocess.run([PY, "-c", code], env=_env(), capture_output=True, text=True, check=True, cwd="/")
    assert float(out.stdout) < 0.2
