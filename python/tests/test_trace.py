"""The Python trace (SPEC §2.3): python_trace_{tid}_{timestamp}.csv per
thread, the known call tree, StartTime <= EndTime, on the dump's clock."""
import csv
import json
import os
import re
import textwrap

from conftest import run_plain, run_traced

TREE = """
import threading
import msmemscope

def leaf(n):
    return sum(range(n))

def mid():
    return leaf(10) + leaf(20)

def top():
    return mid()

def worker():
    top()

msmemscope.config(events="alloc,free,traceback")
msmemscope.start()
top()
t = threading.Thread(target=worker)
t.start(); t.join()
msmemscope.stop()
leaf(1)   # after stop(): not traced
print(t.native_id)
"""


def _read(path):
    with open(path, newline="") as f:
        r = csv.reader(f)
        assert next(r) == ["FuncInfo", "StartTime(ns)", "EndTime(ns)", "Thread Id", "Process Id"]
        return [(fi, int(a), int(b), int(tid), int(pid)) for fi, a, b, tid, pid in r]


def _check_tree(rows, prog, first):
    """top contains mid, which contains two leaf calls, all nested in time."""
    pat = re.compile(r"^(.*):(\d+)\((.*)\)$")
    mine = [(pat.match(fi).groups(), a, b) for fi, a, b, _, _ in rows if fi.startswith(prog)]
    by = {}
    for (f, line, fn), a, b in mine:
        assert a <= b
        by.setdefault(fn, []).append((int(line), a, b))
    assert len(by["top"]) == 1 and len(by["mid"]) == 1 and len(by["leaf"]) == 2, by
    assert by["top"][0][0] == first["top"] and by["leaf"][0][0] == first["leaf"]
    (_, ta, tb), (_, ma, mb) = by["top"][0], by["mid"][0]
    assert ta <= ma <= mb <= tb
    (_, l1a, l1b), (_, l2a, l2b) = sorted(by["leaf"], key=lambda x: x[1])
    assert ma <= l1a <= l1b <= l2a <= l2b <= mb


def _first_lines(script):
    out = {}
    for i, l in enumerate(textwrap.dedent(script).splitlines(), 1):
        m = re.match(r"def (\w+)\(", l)
        if m:
            out[m.group(1)] = i
    return out


def test_trace_call_tree_under_cli(tmp_path):
    run = run_traced(tmp_path, TREE).check()
    prog = str(tmp_path / "prog.py")
    first = _first_lines(TREE)
    files = run.traces()
    pid = int(os.path.basename(run.main_folder()).split("_")[1])
    worker_tid = int(run.stdout.split()[-1])
    tids = {int(os.path.basename(f).split("_")[2]) for f in files}
    assert tids == {pid, worker_tid}, files
    rows = run.rows()
    start = [int(r["Timestamp(ns)"]) for r in rows if r["Event Type"] == "START"][0]
    stop = [int(r["Timestamp(ns)"]) for r in rows if r["Event Type"] == "STOP"][-1]
    lo, hi = min(int(r["Timestamp(ns)"]) for r in rows), max(int(r["Timestamp(ns)"]) for r in rows)
    for f in files:
        trace = _read(f)
        tid = int(os.path.basename(f).split("_")[2])
        assert trace and all(t == tid and p == pid for _, _, _, t, p in trace)
        for _, a, b, _, _ in trace:
            assert lo <= start <= a <= b <= stop <= hi
        _check_tree(trace, prog, first)
        assert not [r for r in trace if "msmemscope" + os.sep in r[0]]
    # after stop(): leaf(1) is not in any trace
    main = _read([f for f in files if "_%d_" % pid in os.path.basename(f)][0])
    assert len([r for r in main if r[0].endswith("(leaf)")]) == 2


def test_tracer_api_alone(tmp_path):
    script = """
import msmemscope
from msmemscope import tracer
def leaf(n):
    return n
def mid():
    return leaf(1) + leaf(2)
def top():
    return mid()
msmemscope.config(output="./out")
tracer.start()
top()
files = tracer.stop()
print("\\n".join(files))
"""
    run = run_plain(tmp_path, script).check()
    (f,) = run.stdout.split()
    assert os.path.basename(os.path.dirname(f)) == "dump" and "/out/msmemscope_" in f
    _check_tree(_read(f), str(tmp_path / "prog.py"), _first_lines(script))


# --- the hooks: sys.monitoring on 3.12+, sys.setprofile before (and on demand)

import json
import sys

import pytest

MONITORING = sys.version_info >= (3, 12)
HOOKS = ["monitoring", "setprofile"] if MONITORING else ["setprofile"]

PATTERN = """
import json, sys
import msmemscope
from msmemscope import tracer

def gen(n):
    for i in range(n):
        yield i

def boom(d):
    if d == 0:
        raise ValueError("x")
    boom(d - 1)

def catch():
    try:
        boom(2)
    except ValueError:
        pass

def thrown():
    try:
        yield 1
    except KeyError:
        yield 2

def closed():
    try:
        yield 1
    finally:
        leaf()

def sub():
    yield 1
    return 2

def deleg():
    r = yield from sub()
    return r

async def coro():
    return leaf()

def leaf():
    return 1

def outer():
    leaf()
    return tracer.stop()

msmemscope.config(output="./out")
tracer._backend = "HOOK"
tracer.start()
EXTRA
list(gen(3))
catch()
g = thrown(); next(g); g.throw(KeyError)
files = outer()
print(json.dumps(files))
"""

# Rows per function of PATTERN's fixed part: a generator's row per
# resumption, a frame left by an exception ends its row, and outer (open
# when tracing stops) ends at the stop.
COUNTS = {"gen": 4, "boom": 3, "catch": 1, "thrown": 2, "outer": 1, "leaf": 1}

# Generators closed while suspended, yield from, a coroutine driven by
# hand: compared between the hooks only (counts differ between versions).
EXTRA = """
c = closed(); next(c); c.close()
list(deleg())
try:
    coro().send(None)
except StopIteration:
    pass
"""


def _pattern(tmp_path, hook, extra=""):
    script = PATTERN.replace("HOOK", hook).replace("EXTRA", extra)
    run = run_plain(tmp_path, script).check()
    (f,) = json.loads(run.stdout.splitlines()[-1])
    return _read(f), str(tmp_path / "prog.py")


def _mine(rows, prog):
    pat = re.compile(r"^(.*):(\d+)\((.*)\)$")
    return [(pat.match(fi).group(3), a, b) for fi, a, b, _, _ in rows if fi.startswith(prog + ":")]


@pytest.mark.parametrize("hook", HOOKS)
def test_trace_rows_of_a_known_pattern(tmp_path, hook):
    rows, prog = _pattern(tmp_path, hook)
    mine = _mine(rows, prog)
    counts = {}
    for fn, a, b in mine:
        assert a <= b
        counts[fn] = counts.get(fn, 0) + 1
    assert counts == COUNTS, mine
    # the exception unwinds boom(0), boom(1), boom(2) in that order, inside catch
    booms = [(a, b) for fn, a, b in mine if fn == "boom"]
    (ca, cb), = [(a, b) for fn, a, b in mine if fn == "catch"]
    assert [a for a, _ in booms] == sorted((a for a, _ in booms), reverse=True)
    assert all(ca <= a <= b <= cb for a, b in booms)
    # gen's four rows follow each other; outer is last and ends at the stop
    gens = [(a, b) for fn, a, b in mine if fn == "gen"]
    assert all(b1 <= a2 for (_, b1), (a2, _) in zip(gens, gens[1:]))
    assert mine[-1][0] == "outer" and mine[-1][2] == max(b for _, _, b, _, _ in rows)


@pytest.mark.skipif(not MONITORING, reason="sys.monitoring is 3.12+")
def test_trace_hooks_give_the_same_rows(tmp_path):
    got = {}
    for hook in HOOKS:
        (tmp_path / hook).mkdir()
        rows, prog = _pattern(tmp_path / hook, hook, EXTRA)
        # every row, stdlib's included, in file order, the script's path made alike
        got[hook] = [fi.replace(prog, "PROG") for fi, _, _, _, _ in rows]
    assert got["monitoring"] == got["setprofile"]
    assert any(fi.endswith("(closed)") for fi in got["monitoring"])


THREAD_BEFORE = """
import json, threading
import msmemscope
from msmemscope import tracer

def leaf():
    return 1

def work():
    return leaf()

ready, go = threading.Event(), threading.Event()

def worker():
    ready.set()
    go.wait()
    work()

t = threading.Thread(target=worker)
t.start()
ready.wait()
msmemscope.config(output="./out")
tracer._backend = "HOOK"
tracer.start()
go.set()
t.join()
files = tracer.stop()
print(t.native_id)
print(json.dumps(files))
"""


@pytest.mark.parametrize("hook", HOOKS)
def test_trace_thread_running_before_start(tmp_path, hook):
    run = run_plain(tmp_path, THREAD_BEFORE.replace("HOOK", hook)).check()
    tid, files = run.stdout.splitlines()[-2:]
    theirs = [f for f in json.loads(files) if "_%s_" % tid in os.path.basename(f)]
    if hook == "setprofile":  # it cannot hook a thread already running
        assert theirs == []
        return
    (f,) = theirs
    mine = _mine(_read(f), str(tmp_path / "prog.py"))
    # worker and go.wait() were open at the start: only work and leaf are rows
    assert [fn for fn, _, _ in mine] == ["leaf", "work"]
    (la, lb), (wa, wb) = [(a, b) for _, a, b in mine]
    assert wa <= la <= lb <= wb


MONITOR_CLEAN = """
import sys, warnings
import msmemscope
from msmemscope import tracer

M = sys.monitoring
E = M.events
OURS = (E.PY_START, E.PY_RESUME, E.PY_THROW, E.PY_RETURN, E.PY_YIELD, E.PY_UNWIND)

def leaf():
    return 1

def untouched(tool, name, cb):
    # a tool of someone else's: name, events and callbacks as they were
    assert M.get_tool(tool) == name
    assert M.get_events(tool) == E.PY_START
    assert M.register_callback(tool, E.PY_START, cb) is cb

def cb(code, offset):
    pass

msmemscope.config(output="./out")
for _ in range(2):
    tracer.start()
    assert M.get_tool(M.PROFILER_ID) == "msmemscope" and sys.getprofile() is None
    leaf()
    assert len(tracer.stop()) == 1
    assert all(M.get_tool(i) is None for i in range(6))
    for i in range(6):
        M.use_tool_id(i, "probe")
        assert M.get_events(i) == 0
        assert all(M.register_callback(i, e, None) is None for e in OURS)
        M.free_tool_id(i)

# PROFILER_ID taken (cProfile takes it): another id, the owner's left alone
M.use_tool_id(M.PROFILER_ID, "other")
M.register_callback(M.PROFILER_ID, E.PY_START, cb)
M.set_events(M.PROFILER_ID, E.PY_START)
tracer.start()
taken = [i for i in range(6) if M.get_tool(i) == "msmemscope"]
assert len(taken) == 1 and taken[0] != M.PROFILER_ID, taken
leaf()
assert len(tracer.stop()) == 1
assert all(M.get_tool(i) is None for i in range(6) if i != M.PROFILER_ID)
untouched(M.PROFILER_ID, "other", cb)

# every id taken: a warning, and the trace falls back to setprofile
for i in range(6):
    if i != M.PROFILER_ID:
        M.use_tool_id(i, "other")
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    tracer.start()
assert sys.getprofile() is not None
assert any("tool ids 0-5 are all in use" in str(x.message) for x in w), w
leaf()
files = tracer.stop()
assert len(files) == 1 and "(leaf)" in open(files[0]).read()
assert sys.getprofile() is None and all(M.get_tool(i) == "other" for i in range(6))
untouched(M.PROFILER_ID, "other", cb)
print("ok")
"""


@pytest.mark.skipif(not MONITORING, reason="sys.monitoring is 3.12+")
def test_trace_monitoring_leaves_nothing_registered(tmp_path):
    run = run_plain(tmp_path, MONITOR_CLEAN).check()
    assert run.stdout.split()[-1] == "ok"


FLUSHES = """
import json
import msmemscope
from msmemscope import tracer

def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)

msmemscope.config(output="./out")
tracer._backend = "HOOK"
tracer._FLUSH_EVENTS = 64  # many flushes, with calls open across each
tracer.start()
fib(12)
print(json.dumps(tracer.stop()))
"""


@pytest.mark.parametrize("hook", HOOKS)
def test_trace_rows_whole_across_flushes(tmp_path, hook):
    run = run_plain(tmp_path, FLUSHES.replace("HOOK", hook)).check()
    (f,) = json.loads(run.stdout.splitlines()[-1])
    mine = _mine(_read(f), str(tmp_path / "prog.py"))
    assert len(mine) == 465 and all(fn == "fib" and a <= b for fn, a, b in mine)  # fib(12) makes 465 calls
    # the outermost call is the last to end and spans every other
    a0, b0 = mine[-1][1:]
    assert all(a0 <= a <= b <= b0 for _, a, b in mine)


CALLS = """
import json
import msmemscope

msmemscope.config(events="alloc,free,traceback")
msmemscope.start()

def f(i):
    return i

for i in range(200_000):
    f(i)                                      # the loop
print("REPORT", json.dumps(msmemscope.get_mem_report()))
msmemscope.stop()
"""


def test_trace_is_not_charged_to_the_program(tmp_path):
    # The trace's buffers grew with every call (a list of tuples): ~400 k
    # HOST rows and 28 MB live at the loop's line, of a loop that allocates
    # nothing. They are msmemscope's own now. (With sys.setprofile, 3.10
    # and 3.11, CPython may malloc a frame object it makes for the hook: a
    # few blocks of its own.)
    run = run_traced(tmp_path, CALLS, "--collect-mode=deferred").check()
    rows = [r for r in run.rows() if r["Event Type"] == "HOST"]
    assert len(rows) < 20, rows[:5]
    rep = next(l for l in run.stdout.splitlines() if l.startswith("REPORT "))
    assert json.loads(rep.split(" ", 1)[1])["total_size"] < 16 << 10, rep[:300]
    traced = []
    for p in run.traces():
        traced += [r for r in _read(p) if r[0].endswith("(f)")]
    assert len(traced) == 200_000


SHORT_THREADS = """
import threading
import msmemscope
from msmemscope import tracer

def f():
    return 1

def work():
    f()

msmemscope.config(events="alloc,free,traceback")
msmemscope.start()
for i in range(200):
    t = threading.Thread(target=work)
    t.start()
    t.join()
held = sum(len(th.codes) for th in tracer._threads if th.codes and th.tid != threading.get_native_id())
msmemscope.stop()
print("HELD", held)
"""


def test_ended_threads_let_their_buffers_go(tmp_path):
    # A thread's buffers are written and let go when it ends (a thread per
    # request kept 512 KiB each until tracing stopped), and none of the
    # library's own calls at a thread's end is traced.
    run = run_traced(tmp_path, SHORT_THREADS, "--collect-mode=deferred").check()
    held = int(next(l for l in run.stdout.splitlines() if l.startswith("HELD ")).split()[1])
    assert held <= 1 << 10, held  # (the last thread's, if not yet swept: one buffer's first size)
    rows = []
    for p in run.traces():
        rows += _read(p)
    assert sum(1 for r in rows if r[0].endswith("(work)")) == 200
    assert not [r for r in rows if os.sep + "msmemscope" + os.sep in r[0]]
    assert len(run.traces()) == 201
