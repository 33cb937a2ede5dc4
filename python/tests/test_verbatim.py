"""msMemScope's own Python workflows run verbatim: config(output=...) under
the CLI, import mstx, devices named but never seen, --log-level, arguments
checked by name, a missing script, and a PyTorch script traced by the CLI
without importing msmemscope."""
import glob
import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

import msmemscope
from conftest import PY, _env, attr, run_traced

TIMEOUT = 300
ROOT_WARNING = "warning: running as root"


def test_config_output_moves_the_capture(tmp_path):
    run = run_traced(tmp_path, """
        import msmemscope
        msmemscope.config(output="./chosen")
        msmemscope.start()
        x = bytearray(123457)
        msmemscope.stop()
    """, "--collect-mode=deferred").check()
    chosen = tmp_path / "chosen"
    caps = glob.glob(str(chosen / "msmemscope_*"))
    assert len(caps) == 1, os.listdir(tmp_path)
    assert glob.glob(str(chosen / "run_*.json")), "the manifest goes with the main program's files"
    # Nothing is left where the capture began (the CLI made that folder for the run).
    assert not os.path.exists(run.out), os.listdir(run.out)
    assert "results in %s" % chosen in run.stderr
    (dump,) = glob.glob(os.path.join(caps[0], "dump", "memscope_dump_*.csv"))
    with open(dump) as f:
        assert "size:123458," in f.read()  # bytearray(n) mallocs n + 1
    assert "cannot" not in run.stderr and "could not move" not in run.stderr


def test_config_output_twice_and_after_chdir(tmp_path):
    run = run_traced(tmp_path, """
        import os, msmemscope
        msmemscope.config(output="./first")
        msmemscope.config(output="./second")
        os.makedirs("sub")
        os.chdir("sub")
        msmemscope.config(call_stack="python:4")  # no output given: nothing moves
        x = bytearray(54321)
    """).check()
    caps = glob.glob(str(tmp_path / "second" / "msmemscope_*"))
    assert len(caps) == 1, run.stderr
    assert not glob.glob(str(tmp_path / "first" / "*")) and not glob.glob(str(tmp_path / "first" / ".*"))
    assert not os.path.exists(tmp_path / "sub" / "memscopeDumpResults")
    with open(os.path.join(caps[0], "spool", "process.json")) as f:
        assert json.load(f)["config"]["output"] == str(tmp_path / "second")
    assert any(attr(r).get("size") == "54322" for r in run.rows(glob.glob(os.path.join(caps[0], "dump", "*.csv"))[0]))


def test_import_mstx(tmp_path):
    run = run_traced(tmp_path, """
        import mstx
        mstx.mark("verbatim mark")
        rid = mstx.range_start("verbatim range")
        mstx.range_end(rid)
    """).check()
    names = [(r["Event Type"], r["Name"]) for r in run.rows() if r["Event"] == "MSTX"]
    assert ("Mark", "verbatim mark") in names
    assert ("Range_start", "verbatim range") in names and ("Range_end", "verbatim range") in names


def _warnings(stderr):
    return [l for l in stderr.splitlines() if "msmemscope: warning:" in l]


@pytest.mark.parametrize("opts,said", [
    (["--device=npu"], "--device=cuda: no cuda device was seen in this process, so no device memory was recorded (host-heap rows need --device=cpu)"),
    (["--device=cpu,cuda:1"], "--device=cpu,cuda:1: no cuda:1 device was seen in this process, so no device memory was recorded"),
    (["--level=kernel"], "--level=kernel: no kernel launch was seen"),
    ([], None),  # the default cpu,cuda on a CPU-only run says nothing
])
def test_device_named_but_never_seen(tmp_path, opts, said):
    run = run_traced(tmp_path, "x = bytearray(1000)\n", *opts).check()
    lines = [l for l in _warnings(run.stderr) if ROOT_WARNING not in l]
    if said is None:
        assert lines == [], lines
    else:
        assert len(lines) == 1 and said in lines[0], run.stderr


def test_device_npu_in_python_config_is_said_at_stop(tmp_path):
    # The seeds' own example, without the CLI: stop() writes the files and says it.
    run = subprocess.run([PY, "-c", "import msmemscope\nmsmemscope.config(device='npu', output='o')\n"
                          "msmemscope.start()\nmsmemscope.stop()\n"],
                         cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert run.returncode == 0, run.stderr
    lines = [l for l in _warnings(run.stderr) if "no cuda device was seen" in l]
    assert len(lines) == 1, run.stderr


@pytest.mark.parametrize("level", ["info", "warn", "error"])
def test_log_level_filters_own_messages(tmp_path, level):
    run = run_traced(tmp_path, "x = bytearray(1000)\n", "--device=cpu,npu:0", "--log-level=" + level).check()
    warned = [l for l in _warnings(run.stderr) if "no cuda:0 device" in l]
    assert len(warned) == (0 if level == "error" else 1), run.stderr
    if os.geteuid() == 0:
        assert (ROOT_WARNING in run.stderr) == (level != "error")
    infos = [l for l in run.stderr.splitlines() if l.startswith("msmemscope: tracing ")]
    assert len(infos) == (1 if level == "info" else 0), run.stderr
    assert "traced process(es); results in" in run.stderr  # the answer prints at every level


def test_run_missing_script_exits_2_and_leaves_nothing(tmp_path):
    for args in (["nonexist.py"], ["-m", "no_such_module_here"]):
        p = subprocess.run([PY, "-m", "msmemscope", "run", "--output=out"] + args, cwd=tmp_path, env=_env(),
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 2, p
        assert p.stderr.count("\n") == 1 and args[-1] in p.stderr, p.stderr
        assert os.listdir(tmp_path) == [], os.listdir(tmp_path)


def _raises(exc, fn, *words):
    with pytest.raises(exc) as e:
        fn()
    for w in words:
        assert w in str(e.value), str(e.value)


def test_arguments_named_in_errors(tmp_path):
    csv = tmp_path / "dump.csv"
    csv.write_text("ID,Event,Event Type,Name,Timestamp(ns),Process Id,Thread Id,Device Id,Ptr,Attr,"
                   "Call Stack(Python),Call Stack(C)\n")
    _raises(TypeError, lambda: msmemscope.check_leaks(123, "iter", 0), "input_path", "str", "int 123")
    _raises(ValueError, lambda: msmemscope.check_leaks(str(csv), "iter", 0, event_type="BANANA"),
            "event_type", "BANANA", "HOST, MMAP, PTA, HAL")
    _raises(TypeError, lambda: msmemscope.check_leaks(str(csv), "iter", "0"), "start_index", "an int")
    _raises(TypeError, lambda: msmemscope.get_mem_report_with_time(str(csv), "x"), "t_ms", "int", "'x'")
    _raises(ValueError, lambda: msmemscope.get_mem_report_with_time(str(csv), -1), "t_ms", ">= 0")
    _raises(ValueError, lambda: msmemscope.get_all_time_size(str(csv), 0), "interval_ms", "[1, 2147483647]")
    _raises(TypeError, lambda: msmemscope.get_all_time_size(42), "input_path", "int")
    _raises(TypeError, lambda: msmemscope.mstx.range_end("abc"), "range_id", "int", "'abc'")
    _raises(TypeError, lambda: msmemscope.mstx.mark(7), "message", "str", "int 7")
    missing = str(tmp_path / "nope")
    _raises(FileNotFoundError, lambda: msmemscope.get_mem_report_with_time(missing, 0), missing)
    _raises(FileNotFoundError, lambda: msmemscope.get_all_time_size(missing), missing)
    _raises(FileNotFoundError, lambda: msmemscope.check_leaks(missing, "iter", 0), missing)


def test_check_leaks_says_ranges_are_not_marks(tmp_path):
    run = run_traced(tmp_path, """
        import mstx
        for i in range(3):
            mstx.range_end(mstx.range_start("step start"))
    """).check()
    with pytest.raises(ValueError) as e:
        msmemscope.check_leaks(run.dumps()[-1], "step start", 0)
    assert "found 0 MSTX marks" in str(e.value) and "3 ranges opened with that message" in str(e.value)


def test_public_names_documented():
    for name in msmemscope.__all__:
        obj = getattr(msmemscope, name)
        doc = getattr(obj, "__doc__", None) or ""
        assert doc.strip(), name
        # Standalone: no pointer to a file outside the project (a relative path upward).
        assert not re.search(r"\.\./\w", doc) and ".md" not in doc.replace("README.md", ""), name
    for name in ("check_leaks", "check_inefficient", "analyze", "list_analyzers", "get_analyzer_config",
                 "get_mem_report", "get_mem_report_with_time", "get_all_time_size"):
        assert name in msmemscope.__all__
    pkg = os.path.dirname(msmemscope.__file__)
    assert os.path.exists(os.path.join(pkg, "py.typed"))
    assert os.path.exists(os.path.join(pkg, "_startup", "sitecustomize.py"))


# ---- a PyTorch script traced by the CLI, unchanged ----

TRAIN = """
import sys, torch
{extra_import}
torch.manual_seed(0)
model = torch.nn.Linear(64, 32)
opt = torch.optim.Adam(model.parameters())
{start}
for i in range(2):
    loss = model(torch.randn(16, 64)).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
print("imported msmemscope:", "msmemscope" in sys.modules, model.weight.untyped_storage().data_ptr())
"""


def _train(tmp_path, *opts, calls_start=False):
    script = TRAIN.format(extra_import="import msmemscope" if calls_start else "",
                          start="msmemscope.start()" if calls_start else "")
    run = run_traced(tmp_path, script, *opts, timeout=TIMEOUT).check()
    ptr = int(run.stdout.split()[-1])
    return run, ptr, run.rows()


@pytest.fixture(scope="module")
def unmodified(tmp_path_factory):
    pytest.importorskip("torch")
    return _train(tmp_path_factory.mktemp("unmodified"), "--events=alloc,free,launch", "--analysis=decompose")


def test_cli_sees_pytorch_without_import(unmodified):
    run, ptr, rows = unmodified
    launches = [r for r in rows if r["Event"] == "OP_LAUNCH" and r["Event Type"] == "ATEN_START"]
    names = {r["Name"] for r in launches}
    assert {"aten::addmm", "aten::sum", "aten::mm"} <= names, names
    pta = {int(r["Ptr"], 16): r for r in rows if r["Event"] == "MALLOC" and r["Event Type"] == "PTA"}
    assert ptr in pta and attr(pta[ptr])["owner"] == "PTA@weight"
    assert (glob.glob(os.path.join(run.main_folder(), "analysis", "decompose_*.csv")))
    assert "decompose (peak / end bytes per owner)" in run.stderr


def test_cli_with_script_calling_start(tmp_path, unmodified):
    _, _, plain_rows = unmodified
    run, ptr, rows = _train(tmp_path, "--events=alloc,free,launch", "--analysis=decompose", calls_start=True)
    count = lambda rs: sum(1 for r in rs if r["Event"] == "OP_LAUNCH" and r["Event Type"] == "ATEN_START")
    # The hooks installed once (at import), not twice: the same launches.
    assert count(rows) == count(plain_rows) > 0
    pta = {int(r["Ptr"], 16) for r in rows if r["Event"] == "MALLOC" and r["Event Type"] == "PTA"}
    assert ptr in pta


def test_tensor_blocks_are_pta_with_alloc_free_only(tmp_path):
    pytest.importorskip("torch")
    run, ptr, rows = _train(tmp_path, "--events=alloc,free", "--analysis=")
    pta = {int(r["Ptr"], 16) for r in rows if r["Event"] == "MALLOC" and r["Event Type"] == "PTA"}
    assert ptr in pta
    assert not [r for r in rows if r["Event"] in ("OP_LAUNCH", "ACCESS")]


def test_user_sitecustomize_still_runs_and_isolated_mode_is_said(tmp_path):
    site = tmp_path / "usersite"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nos.environ['USER_SITECUSTOMIZE_RAN'] = '1'\n")
    env = _env()
    env["PYTHONPATH"] = str(site)
    prog = tmp_path / "p.py"
    prog.write_text("import os, sys\nprint(os.environ.get('USER_SITECUSTOMIZE_RAN'), "
                    "any(p.endswith('_startup') for p in sys.path))\n")
    cli = msmemscope._lib.cli_path()
    p = subprocess.run([cli, "--output=o", PY, str(prog)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["1", "False"], p.stdout  # the user's ran; the hook's folder is off sys.path
    assert "startup hook did not load" not in p.stderr
    # A user sitecustomize that fails is reported as Python would, once.
    (site / "sitecustomize.py").write_text("raise RuntimeError('user site broke')\n")
    p = subprocess.run([cli, "--output=o3", PY, str(prog)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert p.returncode == 0 and p.stderr.count("Error in sitecustomize") == 1, p.stderr
    assert "user site broke" in p.stderr and "KeyError" not in p.stderr
    # Without torch, -I is not worth a word (system tools run with -Es).
    p = subprocess.run([cli, "--output=o2", PY, "-I", str(prog)], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=TIMEOUT)
    assert p.returncode == 0 and "startup hook did not load" not in p.stderr, p.stderr
    if importlib.util.find_spec("torch") is None:
        return
    tprog = tmp_path / "t.py"
    tprog.write_text("import torch\n")
    p = subprocess.run([cli, "--output=o4", "--events=alloc,free", "--analysis=", PY, "-I", str(tprog)],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert p.returncode == 0, p.stderr
    said = [l for l in p.stderr.splitlines() if "startup hook did not load" in l]
    assert len(said) == 1 and "-I" in said[0], p.stderr


def test_device_npu_in_a_traced_script_invents_no_leak(tmp_path):
    # The capture began with the host heap on (the CLI's default); the
    # script's config(device="npu") stops its recording, so frees after
    # that are unseen: no exit leak may be reported from them.
    run = run_traced(tmp_path, """
        import msmemscope
        msmemscope.config(device="npu")
        junk = [bytearray(5000) for _ in range(100)]
        del junk
    """).check()
    assert "exit leaks not known: the host heap stopped being recorded during the run" in run.stderr, run.stderr
    assert "definitely lost" not in run.stderr and "alive at exit" not in run.stderr, run.stderr
    (leaks,) = glob.glob(os.path.join(run.main_folder(), "analysis", "leaks_*.csv"))
    with open(leaks) as f:
        assert len(f.read().splitlines()) == 1  # the header: no leak listed
