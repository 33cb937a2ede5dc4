"""The C API as the package binds it: one ctypes table that matches
include/msmemscope.h, one reply shape, every call refused in a forked child,
defaults and the version each read from their one place."""
import ctypes
import os
import re

import pytest

import msmemscope
from msmemscope import _lib
from msmemscope.analyzer import InefficientConfig

from conftest import REPO, run_plain

_C_TYPES = {"int": ctypes.c_int, "void": None, "uint64_t": ctypes.c_uint64, "char *": _lib._REPLY}


def _declared():
    """{name: (result type, argument count)} of every function the headers declare."""
    out = {}
    for h in ("include/msmemscope.h", "include/mstx/ms_tools_ext.h"):
        with open(os.path.join(REPO, h)) as f:
            text = re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)
        for m in re.finditer(r"^(char \*|int |void |uint64_t )(\w+)\(([^)]*)\);", text, re.M):
            args = m.group(3).strip()
            out[m.group(2)] = (m.group(1).strip(), 0 if args in ("", "void") else args.count(",") + 1)
    return out


def test_signatures_match_header():
    declared = _declared()
    assert sorted(declared) == sorted(_lib.SIGNATURES)
    for name, (res, nargs) in declared.items():
        args, restype = _lib.SIGNATURES[name]
        assert len(args) == nargs, name
        if name != "msmemscope_free_string":
            assert restype == _C_TYPES[res], name


def test_reply_errors_name_their_exception():
    assert msmemscope.list_analyzers() == ["leaks", "inefficient"]
    try:
        _lib.call("msmemscope_analyze", b"leaks", b"[]")
    except TypeError as e:
        assert "JSON object" in str(e)
    else:
        raise AssertionError("a bad kwargs document was accepted")


def test_defaults_from_the_registry():
    params = msmemscope.get_analyzer_config("inefficient")
    cfg = InefficientConfig(input_path="dump.csv")
    assert cfg.idle_threshold == params["idle_threshold"]["default"]
    assert cfg.mem_size == params["mem_size"]["default"]


def test_version_written_once():
    with open(os.path.join(REPO, "internal", "version", "VERSION")) as f:
        assert msmemscope.__version__ == f.read().strip()


FORK = """
import os
import msmemscope
from msmemscope import _lib
lib = _lib.get()
assert lib.msmemscope_get_config()  # the parent gets replies
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    out = [lib.msmemscope_get_mem_report(), lib.msmemscope_list_analyzers(), lib.msmemscope_dir(),
           lib.msmemscope_config(b"[]"), lib.msmemscope_start(), lib.msmemscope_standalone()]
    try:
        _lib.call("msmemscope_list_analyzers")
        out.append("call answered")
    except RuntimeError as e:
        out.append("forked child" in str(e))
    os.write(w, repr(out).encode())
    os._exit(0)
os.close(w)
os.waitpid(pid, 0)
print(os.read(r, 1000).decode())
"""


def test_forked_child_refused(tmp_path):
    run = run_plain(tmp_path, FORK, timeout=60).check()
    assert "[None, None, None, None, -1, -1, True]" in run.stdout


# Forking on purpose from a process the Go runtime made multi-threaded:
# CPython 3.12 on warns about it.
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_offline_functions_raise_in_forked_child(tmp_path):
    """Every function that asks the library for results raises a clear
    RuntimeError in a forked child (os.fork() here, in the test process),
    before the library is called: it would refuse anyway."""
    assert msmemscope.list_analyzers()  # the library is loaded in the parent
    dump = str(tmp_path / "dump.csv")
    calls = {
        "check_leaks": lambda: msmemscope.check_leaks(dump, mstx_info="x", start_index=0),
        "check_inefficient": lambda: msmemscope.check_inefficient(dump),
        "analyze": lambda: msmemscope.analyze("leaks", input_path=dump, mstx_info="x", start_index=0),
        "list_analyzers": msmemscope.list_analyzers,
        "get_analyzer_config": lambda: msmemscope.get_analyzer_config("leaks"),
        "get_mem_report": msmemscope.get_mem_report,
        "get_all_time_size": lambda: msmemscope.get_all_time_size(dump),
        "get_mem_report_with_time": lambda: msmemscope.get_mem_report_with_time(dump, 0),
    }
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            res = []
            for name, fn in calls.items():
                try:
                    fn()
                    res.append("%s: answered" % name)
                except RuntimeError as e:
                    want = "msmemscope: %s called in a forked child: call it from the parent, " \
                           "or start the child with spawn" % name
                    res.append("%s: %s" % (name, "ok" if str(e) == want else repr(str(e))))
                except BaseException as e:  # noqa: B902 - reported to the parent
                    res.append("%s: %r" % (name, e))
            os.write(w, "\n".join(res).encode())
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    with os.fdopen(r) as f:
        lines = f.read().splitlines()
    assert lines == ["%s: ok" % name for name in calls], lines
