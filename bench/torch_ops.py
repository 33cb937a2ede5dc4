"""The operator hooks' cost per operator: a loop of small CPU operators
(an add and an in-place mul of 16 floats) bare, under an empty
TorchDispatchMode (what any Python dispatch mode costs), and under
msmemscope.start() with events=alloc,free,launch (the default) and with
access, in one process, each repetition running every mode in turn.
Prints a markdown table: median µs per operator and µs added over bare
(medians of the per-repetition differences).

    python bench/torch_ops.py [OUTPUT_DIR] [REPS]

(without OUTPUT_DIR, the captures go to a temporary folder, removed after)
"""
import shutil
import statistics
import sys
import tempfile
import time
import warnings

import torch
import torch._dynamo  # noqa: F401  (a mode's first call imports it: not timed)
from torch.utils._python_dispatch import TorchDispatchMode

import msmemscope

warnings.simplefilter("ignore")  # (no preload: host-heap events are not collected)
given = sys.argv[1] if len(sys.argv) > 1 else ""
out = given or tempfile.mkdtemp()
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 7
N = 20000
a, b = torch.ones(16), torch.ones(16)


class Empty(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def loop() -> float:
    t = time.perf_counter()
    for _ in range(N):
        c = a + b
        c.mul_(2)
    return (time.perf_counter() - t) / (2 * N) * 1e6


def hooks(events: str) -> float:
    msmemscope.config(events=events, output=out)
    msmemscope.start()
    try:
        return loop()
    finally:
        msmemscope.stop()


modes = {"empty TorchDispatchMode": None, "msmemscope events=alloc,free,launch": "alloc,free,launch",
         "msmemscope events=alloc,free,launch,access": "alloc,free,launch,access"}
times = {k: [] for k in ["bare", *modes]}
added = {k: [] for k in modes}
loop()
for _ in range(reps):
    bare = loop()
    times["bare"].append(bare)
    for name, ev in modes.items():
        if ev is None:
            with Empty():
                t = loop()
        else:
            t = hooks(ev)
        times[name].append(t)
        added[name].append(t - bare)

print("%d repetitions of %d operators per mode, 1 process, torch %s, CPython %s" %
      (reps, 2 * N, torch.__version__, sys.version.split()[0]))
print()
print("| mode | µs per operator (median) | µs added over bare (median, range) |")
print("|---|---|---|")
print("| bare | %.2f | 0 |" % statistics.median(times["bare"]))
for name in modes:
    d = added[name]
    print("| %s | %.2f | %.2f (%.2f–%.2f) |" % (name, statistics.median(times[name]), statistics.median(d), min(d), max(d)))
if not given:
    shutil.rmtree(out, ignore_errors=True)
