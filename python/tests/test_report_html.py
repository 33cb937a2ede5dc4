"""The HTML report (--export=html) of the bundled torch training example,
checked against the capture's own rows, and opened in headless Chromium: no
script error, one marker per step, the owners named."""
import glob
import json
import os
import re
import shutil
import subprocess

import pytest

from conftest import REPO, attr, run_traced

TIMEOUT = 600


def _report_data(path):
    with open(path, encoding="utf-8") as f:
        page = f.read()
    assert len(page) < 20 << 20
    m = re.search(r'<script type="application/json" id="msmemscope-data">(.*?)</script>', page, re.S)
    assert m, "no inlined data"
    return json.loads(m.group(1))


def _live_figures(rows):
    """Peak and end of the live bytes the rows show (HOST and the CPU's PTA
    blocks: one memory, PTA blocks being HOST blocks retyped), and the live
    PTA bytes at the end."""
    live, total, peak = {}, 0, 0
    for r in rows:
        if r["Event"] not in ("MALLOC", "FREE"):
            continue
        a = attr(r)
        aid, size = a["allocation_id"], int(a["size"])
        if r["Event"] == "MALLOC":
            if aid in live:
                total -= live.pop(aid)[1]
            live[aid] = (r["Event Type"], size)
            total += size
            peak = max(peak, total)
        elif aid in live:
            total -= live.pop(aid)[1]
    pta_end = sum(s for t, s in live.values() if t == "PTA")
    return peak, total, pta_end


def _chromium(page, shot):
    exe = shutil.which("chromium")
    if not exe:
        pytest.skip("chromium is not installed (make test installs it)")
    common = [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
              "--log-level=0", "--no-first-run", "--user-data-dir=" + os.path.join(os.path.dirname(shot), "profile")]
    dom = subprocess.run(common + ["--dump-dom", "file://" + page], capture_output=True, text=True, timeout=120)
    shots = subprocess.run(common + ["--window-size=1280,2600", "--screenshot=" + shot, "file://" + page],
                           capture_output=True, text=True, timeout=120)
    for p in (dom, shots):
        assert p.returncode == 0, p.stderr[-2000:]
        console = [l for l in p.stderr.splitlines() if ":CONSOLE" in l]
        assert not console, console
    assert os.path.getsize(shot) > 10000
    return dom.stdout


def test_torch_example_report(tmp_path):
    pytest.importorskip("torch")
    with open(os.path.join(REPO, "examples", "train_mlp.py")) as f:
        script = f.read()
    run = run_traced(tmp_path, script, "--collect-mode=deferred", "--events=alloc,free,launch,access",
                     "--analysis=decompose,inefficient", "--export=html", timeout=TIMEOUT).check()
    (page,) = glob.glob(os.path.join(run.main_folder(), "export", "report_*.html"))
    assert "export written to " + page in run.stderr
    data = _report_data(page)
    (p,) = data["processes"]
    rows = run.rows()
    peak, end, pta_end = _live_figures(rows)
    mem = p["views"][0]
    assert (mem["peak"], mem["end"]) == (peak, end)
    types = {t["name"]: t for t in p["types"]}
    assert types["PTA"]["view"] == 0 and types["PTA"]["end"] == pta_end
    steps = sum(1 for r in rows if r["Event"] == "SYSTEM" and r["Event Type"] == "STEP")
    if steps == 0:
        steps = sum(1 for r in rows if r["Event Type"] == "Range_start" and r["Name"] == "step start")
    assert steps > 0 and len(p["steps"]) == steps
    owners = {o["name"].split("@")[-1] for o in p["owners"] if o["type"] == "PTA"}
    assert {"weight", "gradient", "optimizer_state", "activation"} <= owners, owners
    cats = {c["name"] for c in p["decompose"]["categories"]}
    assert {"weight", "gradient", "optimizer_state", "activation"} <= cats
    assert p["inefficient"], "the inefficient analysis's blocks are in the report"

    # The same from Python, offline on the dump: the same figures.
    import msmemscope
    (again,) = msmemscope.export(run.dumps()[-1], formats="html", output=str(tmp_path / "offline"))
    q = _report_data(again)["processes"][0]
    assert q["views"][0]["peak"] == peak and q["pid"] == p["pid"] and len(q["steps"]) == steps

    out = os.path.join(REPO, "build", "test-output", "html")
    os.makedirs(out, exist_ok=True)
    dom = _chromium(page, os.path.join(out, "train_mlp.png"))
    assert dom.count('class="step-marker"') == steps
    assert "optimizer_state" in re.sub(r"(?s)<(script|style).*?</(script|style)>", " ", dom)
    assert 'id="peakflame-%d"' % p["pid"] in dom and "fl-cell" in dom
