"""NVTX as mstx: the `nvtx` package's marks and ranges (what PyTorch users
annotate with) become MSTX rows under msmemscope, which the CLI makes NVTX's
injection library; a range named "step start" is a step."""
import pytest

from conftest import run_traced

SCRIPT = """
import nvtx
nvtx.mark("py mark")
for i in range(2):
    with nvtx.annotate("step start"):
        keep = bytearray(100000 + i)
rng = nvtx.start_range("manual")
nvtx.end_range(rng)
nvtx.push_range("pushed", domain="dom")
nvtx.pop_range(domain="dom")

@nvtx.annotate("decorated", color="blue")
def f():
    return 1

f()
print("ok")
"""


def test_nvtx_package_ranges_are_mstx_rows(tmp_path):
    pytest.importorskip("nvtx")
    run = run_traced(tmp_path, SCRIPT).check()
    rows = run.rows()
    got = [(r["Event Type"], r["Name"]) for r in rows if r["Event"] == "MSTX"]
    assert got == [("Mark", "py mark"), ("Range_start", "step start"), ("Range_end", "step start"),
                   ("Range_start", "step start"), ("Range_end", "step start"),
                   ("Range_start", "manual"), ("Range_end", "manual"), ("Range_start", "pushed"),
                   ("Range_end", "pushed"), ("Range_start", "decorated"), ("Range_end", "decorated")], got
    # ids pair each start with its end
    ids = [r["Attr"] for r in rows if r["Event"] == "MSTX" and r["Event Type"] != "Mark"]
    assert ids[0::2] == ids[1::2]
