"""The Python trace (SPEC §2.3): python_trace_{tid}_{timestamp}.csv per
thread, the known call tree, StartTime <= EndTime, on the dump's clock."""
import csv
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
