"""SPEC §7 from Python: get_mem_report() during a run, and the timeline
functions over the capture it leaves."""
import json

import pytest

from conftest import line_of, run_traced

SCRIPT = """
import json, time
import msmemscope

keep = []

def grow():
    keep.append(bytearray(1 << 20))   # grow site

def scratch():
    return bytearray(3 << 20)          # scratch site

s = scratch()
for i in range(3):
    grow()
    time.sleep(0.2)
print("REPORT", json.dumps(msmemscope.get_mem_report()))
del s
time.sleep(0.2)
print("REPORT", json.dumps(msmemscope.get_mem_report()))
"""


def reports(run):
    return [json.loads(l.split(" ", 1)[1]) for l in run.stdout.splitlines() if l.startswith("REPORT ")]


def site(report, line):
    return [s for s in report["mem_report"] if s["site"].endswith("prog.py:%d" % line)]


def test_live_report_names_sites_with_exact_bytes(tmp_path):
    r = run_traced(tmp_path, SCRIPT, "--call-stack=python:4").check()
    first, second = reports(r)
    grow, scr = line_of(SCRIPT, "# grow site"), line_of(SCRIPT, "# scratch site")
    # A bytearray of n bytes is one malloc of n + 1 (its NUL).
    g, s = site(first, grow), site(first, scr)
    assert len(g) == 1 and g[0]["size"] == 3 * ((1 << 20) + 1) and g[0]["count"] == 3 and g[0]["function"] == "grow", first
    assert len(s) == 1 and s[0]["size"] == (3 << 20) + 1 and s[0]["function"] == "scratch", first
    assert sum(x["size"] for x in first["mem_report"]) == first["total_size"]
    assert first["mem_report"] == sorted(first["mem_report"], key=lambda x: -x["size"])
    # After del s the scratch site is gone, the grow site unchanged.
    assert site(second, scr) == [] and site(second, grow)[0]["size"] == 3 * ((1 << 20) + 1), second
    # The interpreter's own blocks may change between the reports (json's
    # encoder keeps a buffer from the first dumps() until exit with 3.11.7,
    # the capture shows its FREE at exit): the totals add up, site by site.
    assert sum(x["size"] for x in second["mem_report"]) == second["total_size"]
    others = lambda rep: sum(x["size"] for x in rep["mem_report"] if not x["site"].endswith(("prog.py:%d" % grow, "prog.py:%d" % scr)))
    assert second["total_size"] - others(second) == first["total_size"] - others(first) - ((3 << 20) + 1)


def test_timeline_functions_read_the_capture(tmp_path):
    import msmemscope
    r = run_traced(tmp_path, SCRIPT, "--call-stack=python:4").check()
    folder = r.main_folder()
    sizes = msmemscope.get_all_time_size(folder, interval_ms=100)
    assert sizes and all(len(p) == 2 for p in sizes)
    assert [p[0] for p in sizes] == [100 * i for i in range(len(sizes))]
    peak_t, peak = max(sizes, key=lambda p: p[1])
    rep = msmemscope.get_mem_report_with_time(folder, peak_t, interval_ms=100)
    assert rep["total_size"] == peak
    grow = line_of(SCRIPT, "# grow site")
    assert site(rep, grow)[0]["size"] == 3 * ((1 << 20) + 1)
    try:
        msmemscope.get_all_time_size(str(tmp_path / "nothing-here"))
    except FileNotFoundError as e:  # as check_leaks, and open()
        assert "nothing-here" in str(e)
    else:
        raise AssertionError("a missing capture was accepted")


HANDOFF = """
import json, os, queue, threading
import msmemscope

q = queue.Queue(maxsize=50)

def make(i):
    return bytearray(1000 + i % 5000)   # handed site

def produce():
    for i in range(20000):
        q.put(make(i))
    q.put(None)

def consume():
    while q.get() is not None:
        pass

for rnd in range(3):
    ts = [threading.Thread(target=produce), threading.Thread(target=consume)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    print("REPORT", json.dumps(msmemscope.get_mem_report()))
"""


def test_live_report_after_handoffs_between_threads(tmp_path, monkeypatch):
    # Every block a producer thread made, a consumer thread freed: none is
    # live once both have ended, whichever thread's chunks the drain wrote
    # first (with PYTHONMALLOC=malloc each bytearray is a malloc of its own;
    # the report counted dozens of them as live before its records were
    # merged in time order).
    monkeypatch.setenv("PYTHONMALLOC", "malloc")
    r = run_traced(tmp_path, HANDOFF, "--call-stack=python:4").check()
    reps = reports(r)
    handed = line_of(HANDOFF, "# handed site")
    assert len(reps) == 3
    for rep in reps:
        assert site(rep, handed) == [], rep["mem_report"][:3]


LAST_FREE = """
import json
import msmemscope
import numpy as np

msmemscope.start()
msmemscope.get_mem_report()          # (the first call opens the spool)
a = np.zeros(100_000, dtype=np.uint8)   # from the heap (under the mmap threshold)
print("REPORT", json.dumps(msmemscope.get_mem_report()))
del a
print("REPORT", json.dumps(msmemscope.get_mem_report()))
"""


def test_live_report_sees_the_callers_last_free(tmp_path):
    # The thread's last FREE waited unpublished for a second pair half: the
    # block read as live until the thread's next event. (No stacks: with
    # them a MALLOC takes the general path, which closes the half. numpy
    # allocates its data at a site of its own.)
    pytest.importorskip("numpy")
    r = run_traced(tmp_path, LAST_FREE, "--collect-mode=deferred").check()
    first, second = reports(r)
    big = [x for x in first["mem_report"] if x["size"] == 100_000 and x["count"] == 1]
    assert len(big) == 1, first
    assert [x for x in second["mem_report"] if x["site"] == big[0]["site"]] == [], second
