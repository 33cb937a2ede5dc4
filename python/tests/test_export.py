"""msmemscope.export: a capture in other tools' formats (pprof's heap
profile), into the capture's export folder or output/export."""
import gzip
import json
import os

import pytest

import msmemscope
from conftest import run_traced

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
    both = msmemscope.export(folder)  # every format
    assert [os.path.basename(p).split("_")[0] for p in both] == ["profile", "trace"]
    with open(both[1]) as f:
        events = json.load(f)["traceEvents"]
    assert any(e["ph"] == "C" and e["name"] == "live bytes by type" and e["args"].get("HOST", 0) >= 20 * 300000
               for e in events)


def test_export_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        msmemscope.export(tmp_path / "missing.csv")
    with pytest.raises(ValueError, match="unknown export format \"svg\": the formats are pprof"):
        msmemscope.export(tmp_path, "svg")
    with pytest.raises(TypeError, match="formats: each format must be a str"):
        msmemscope.export(tmp_path, [3])
