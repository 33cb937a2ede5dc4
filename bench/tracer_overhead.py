"""Overhead of the Python trace per hook, on call-heavy workloads.

    python bench/tracer_overhead.py [reps]

Runs with the interpreter it is started by (msmemscope installed in it):
each workload bare, under the sys.setprofile hook and (3.12+) under the
sys.monitoring hook, the three interleaved rep after rep so that drift on a
shared machine hits them alike. Prints the best and the median of the
traced run (start() to the workload's end) and of stop() (pairing the events
and writing the files), and the traced run over the bare one.
"""
from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List, Tuple

import msmemscope
from msmemscope import tracer


def fib(n: int) -> int:
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def small(x: int) -> int:
    return x + 1


def loop(n: int) -> int:
    s = 0
    for _ in range(n):
        s = small(s)
    return s


WORK: Dict[str, Callable[[], int]] = {
    "fib(22)": lambda: fib(22),  # 57k calls, recursion
    "loop(200k)": lambda: loop(200000),  # 200k calls of a small function
}


def once(work: Callable[[], int], hook: str) -> Tuple[float, float]:
    if hook == "bare":
        t = time.perf_counter()
        work()
        return time.perf_counter() - t, 0.0
    tracer._backend = hook
    t = time.perf_counter()
    tracer.start()
    work()
    t1 = time.perf_counter()
    tracer.stop()
    return t1 - t, time.perf_counter() - t1


def main() -> None:
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    if len(sys.argv) > 2:  # the child: writes its capture into the parent's folder
        msmemscope.config(output=sys.argv[2])
        _measure(reps)
        return
    # The capture is converted when the measuring process exits, so a child
    # measures and this process removes what it wrote (hundreds of MB).
    out = tempfile.mkdtemp(prefix="tracer_bench_")
    try:
        subprocess.run([sys.executable, __file__, str(reps), out], check=True)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _measure(reps: int) -> None:
    hooks = ["bare", "setprofile"]
    if hasattr(sys, "monitoring") and hasattr(tracer, "_backend"):  # older tracers: setprofile only
        hooks.append("monitoring")
    print("CPython %s, %d reps, seconds: best / median" % (sys.version.split()[0], reps))
    for name, work in WORK.items():
        runs: Dict[str, List[float]] = {h: [] for h in hooks}
        stops: Dict[str, List[float]] = {h: [] for h in hooks}
        once(work, "bare")  # warm up
        for _ in range(reps):
            for h in hooks:
                r, s = once(work, h)
                runs[h].append(r)
                stops[h].append(s)
        bare = min(runs["bare"])
        for h in hooks:
            best, med = min(runs[h]), statistics.median(runs[h])
            line = "  %-10s %-10s run %.4f / %.4f  x%.1f" % (name, h, best, med, best / bare)
            if h != "bare":
                line += "   stop %.4f / %.4f" % (min(stops[h]), statistics.median(stops[h]))
            print(line)


if __name__ == "__main__":
    main()
