"""Forked children (SPEC §4.5): a DataLoader with fork workers and a
multiprocessing Pool run to the end under tracing, with Python stacks on;
the children are not traced and are counted."""
import json
import os

from conftest import run_traced

TIMEOUT = 240

DATALOADER = """
import torch
from torch.utils.data import DataLoader, Dataset
import msmemscope

class Squares(Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        msmemscope.mstx.mark("item")          # a C shim: safe in the child
        return torch.full((256,), float(i * i))

def main():
    msmemscope.start()  # deferred: torch's import (a million rows with stacks) is not the subject
    dl = DataLoader(Squares(), batch_size=8, num_workers=2, multiprocessing_context="fork")
    total = 0.0
    for epoch in range(2):
        for b in dl:
            total += float(b.sum())
            msmemscope.step()
    print("total", total)
    msmemscope.stop()  # nor are the interpreter's frees at exit

if __name__ == "__main__":
    main()
"""


def test_dataloader_fork_workers(tmp_path, torch_available):
    run = run_traced(tmp_path, DATALOADER, "--call-stack=python:16", "--collect-mode=deferred", timeout=TIMEOUT).check()
    want = 2 * 256 * sum(i * i for i in range(64))
    assert "total %.1f" % want in run.stdout
    with open(os.path.join(run.main_folder(), "config.json")) as f:
        assert json.load(f)["forked_children_untraced"] >= 4  # 2 workers x 2 epochs
    rows = run.rows()
    assert len([r for r in rows if r["Event Type"] == "STEP"]) == 16


POOL = """
import multiprocessing as mp
import msmemscope

def work(n):
    return sum(bytearray(n))

if __name__ == "__main__":
    msmemscope.config(call_stack="python:16")
    with mp.get_context("fork").Pool(2) as pool:
        print("sum", sum(pool.map(work, [1000 + i for i in range(50)])))
    msmemscope.mstx.mark("done")
"""


def test_multiprocessing_pool(tmp_path):
    run = run_traced(tmp_path, POOL, timeout=TIMEOUT).check()
    assert "sum 0" in run.stdout
    rows = run.rows()
    assert [r for r in rows if r["Event"] == "MSTX" and r["Name"] == "done"]
    with open(os.path.join(run.main_folder(), "config.json")) as f:
        assert json.load(f)["forked_children_untraced"] >= 2


FORKED_BEFORE_IMPORT = """
import os, sys
pid = os.fork()
if pid == 0:
    # Forked from the traced process before msmemscope was imported: the
    # library refuses every call here, and the package says so as after a
    # later fork (config/start/stop do nothing; a data call raises).
    import msmemscope
    msmemscope.config(call_stack="python:4")
    msmemscope.start()
    msmemscope.stop()
    try:
        msmemscope.get_mem_report()
        print("child: report")
    except RuntimeError as e:
        print("child: refused:", "forked child" in str(e))
    sys.stdout.flush()
    os._exit(0)
os.waitpid(pid, 0)
import msmemscope
msmemscope.config(call_stack="python:4")
print("parent: report", "mem_report" in msmemscope.get_mem_report())
"""


def test_child_forked_before_the_import(tmp_path):
    run = run_traced(tmp_path, FORKED_BEFORE_IMPORT, timeout=TIMEOUT).check()
    assert "child: refused: True" in run.stdout, run.stdout + run.stderr
    assert "MemoryError" not in run.stderr, run.stderr
    assert "parent: report True" in run.stdout, run.stdout


FORKSERVER = """
import multiprocessing as mp
import msmemscope

msmemscope.config(call_stack="python:4")  # at top level: the workers import this module too

def work(n):
    return len(bytearray(n))

if __name__ == "__main__":
    with mp.get_context("forkserver").Pool(2) as pool:
        print("sum", sum(pool.map(work, range(100))))
"""


def test_forkserver_pool(tmp_path):
    # The workers (forked by the server, itself traced) import the main
    # module, whose config() must not fail there: they used to die and be
    # made again for ever.
    run = run_traced(tmp_path, FORKSERVER, timeout=120).check()
    assert "sum %d" % sum(range(100)) in run.stdout, run.stdout + run.stderr[-2000:]
