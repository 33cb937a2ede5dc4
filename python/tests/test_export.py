"""msmemscope.export: a capture in other tools' formats (pprof's heap
profile), into the capture's export folder or output/export."""
import gzip
import json
import os
import pickle

import pytest

import msmemscope
from conftest import attr, run_traced

SCRIPT = """
keep = []
def hog():
    for _ in range(20):
        keep.append(bytearray(300000))
hog()
print("ok")
"""


def test_export_pprof_of_a_capture(tmp_path):
    run = run_traced(tmp_path, SCRIPT, "--call-stack=python:8").check()
    folder = run.main_folder()
    (path,) = msmemscope.export(folder, "pprof")
    assert os.path.dirname(path) == os.path.join(folder, "export") and path.endswith(".pb.gz")
    with gzip.open(path) as f:
        data = f.read()
    # the profile's string table names the sample types and the function
    for s in (b"alloc_space", b"inuse_space", b"hog", b"owner", b"step"):
        assert s in data, s
    (again,) = msmemscope.export(run.dumps()[-1], ["pprof"], output=tmp_path / "elsewhere")
    assert again.startswith(str(tmp_path / "elsewhere" / "export")) and again != path
    # (a capture with no tensor: its memory_viz snapshot is empty, said as
    # the CLI says it; it was written without a word)
    with pytest.warns(RuntimeWarning, match="snapshot is empty"):
        both = msmemscope.export(folder)  # every format: pprof, perfetto and memory_viz last
    assert [os.path.basename(p).split("_")[0] for p in both][-3:] == ["profile", "trace", "memory"]
    with open(both[-2]) as f:
        events = json.load(f)["traceEvents"]
    assert any(e["ph"] == "C" and e["name"] == "live bytes by type" and e["args"].get("HOST", 0) >= 20 * 300000
               for e in events)


VIZ = """
import torch, msmemscope
msmemscope.config(events="alloc,free")
early = torch.ones(3000)    # allocated before start()
msmemscope.start()
keep = []
def make():
    for i in range(6):
        keep.append(torch.ones(1000 * (i + 1)))
    tmp = torch.zeros(5000)
    del tmp
make()
del early
del keep[::2]
msmemscope.stop()
print("ok")
"""


def test_export_memory_viz(tmp_path, torch_available):
    """memory_viz: PyTorch's snapshot pickle, which torch.cuda._memory_viz
    reads, with the capture's PTA blocks (CPU tensors: the host is device 0,
    each block its own segment)."""
    from torch.cuda import _memory_viz
    run = run_traced(tmp_path, VIZ, "--collect-mode=deferred", "--call-stack=python:8").check()
    # What the PTA rows say: the bytes allocated (a block freed in the
    # capture but allocated before it counts too), and those alive at the end.
    allocated, live = 0, {}
    for r in run.rows():
        if r["Event Type"] != "PTA" or r["Event"] not in ("MALLOC", "FREE"):
            continue
        a = attr(r)
        if r["Event"] == "MALLOC":
            allocated += int(a["size"])
            live[a["allocation_id"]] = int(a["size"])
        elif live.pop(a["allocation_id"], None) is None:
            allocated += int(a["size"])
    assert live and allocated > sum(live.values())
    (path,) = msmemscope.export(run.main_folder(), ["memory_viz"])
    assert os.path.basename(path).startswith("memory_viz_") and path.endswith(".pickle")
    with open(path, "rb") as f:
        data = pickle.load(f)
    assert len(data["device_traces"]) == 1 and all(s["device"] == 0 for s in data["segments"])
    out = _memory_viz.trace(data)
    assert out.startswith("Device 0")
    assert "total_allocated" in _memory_viz.segsum(data)
    entries = data["device_traces"][0]
    allocs = [e for e in entries if e["action"] == "alloc"]
    assert sum(e["size"] for e in allocs) == allocated
    blocks = [b for s in data["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
    assert sorted(b["size"] for b in blocks) == sorted(live.values())
    assert [e["time_us"] for e in entries] == sorted(e["time_us"] for e in entries)
    assert any(f["name"] == "make" and f["filename"].endswith("prog.py") for e in allocs for f in e["frames"])


def test_export_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        msmemscope.export(tmp_path / "missing.csv")
    with pytest.raises(ValueError, match="unknown export format \"svg\": the formats are .*pprof, perfetto, memory_viz"):
        msmemscope.export(tmp_path, "svg")
    with pytest.raises(TypeError, match="formats: each format must be a str"):
        msmemscope.export(tmp_path, [3])
    with pytest.raises(TypeError, match="^formats: a str, a list of str or None, got int$"):
        msmemscope.export(tmp_path, 5)
