"""PyTorch collection on real torch runs (SPEC §2.1, §4.2, §5.3, §5.4, §5.5):
operator launches, ACCESS sides, PTA blocks, decompose owners, watch and
inefficient memory, with exact figures."""
import csv
import glob
import json
import os

import pytest

from conftest import REPO, attr, line_of, run_traced

TIMEOUT = 300


def _csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _analysis(run, prefix):
    (p,) = glob.glob(os.path.join(run.main_folder(), "analysis", prefix + "_*.csv"))
    return _csv(p)


MLP = """
import json, torch, msmemscope
torch.manual_seed(0)
msmemscope.config(events="alloc,free,launch,access", analysis="decompose")
msmemscope.start()
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 32))
opt = torch.optim.Adam(model.parameters())
x = torch.randn(16, 64)
msmemscope.mstx.mark("step begins")
loss = model(x).sum()
msmemscope.mstx.mark("backward")
loss.backward()
msmemscope.mstx.mark("optimizer")
grads = sum(p.grad.untyped_storage().nbytes() for p in model.parameters())
opt.step()
opt.zero_grad()
msmemscope.step()
msmemscope.stop()
state = [v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
print(json.dumps({
    "params": sum(p.untyped_storage().nbytes() for p in model.parameters()),
    "grads": grads,
    "state": sum(v.untyped_storage().nbytes() for v in state),
    "state_n": len(state),
    "ptrs": {n: p.untyped_storage().data_ptr() for n, p in model.named_parameters()},
    "x": x.untyped_storage().data_ptr(),
}))
"""


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    pytest.importorskip("torch")
    tmp = tmp_path_factory.mktemp("mlp")
    run = run_traced(tmp, MLP, "--collect-mode=deferred", timeout=TIMEOUT).check()
    return run, json.loads(run.stdout.strip().splitlines()[-1]), run.rows()


def test_decompose_exact_bytes(mlp):
    run, info, rows = mlp
    cats = {r["Name"]: r for r in _analysis(run, "decompose") if r["Kind"] == "category"}
    params = 64 * 128 * 4 + 128 * 4 + 128 * 32 * 4 + 32 * 4
    assert info["params"] == params
    assert int(cats["weight"]["Peak(byte)"]) == params
    assert int(cats["weight"]["End(byte)"]) == params
    assert int(cats["gradient"]["Peak(byte)"]) == info["grads"] == params
    assert int(cats["gradient"]["End(byte)"]) == 0          # zero_grad() set them to None
    # Adam: exp_avg and exp_avg_sq per parameter (params bytes each) and a
    # float32 step per parameter.
    assert info["state_n"] == 12
    assert int(cats["optimizer_state"]["Peak(byte)"]) == info["state"] == 2 * params + 4 * 4
    # Saved for backward, apart from parameters: the input x (addmm's mat1)
    # and the ReLU's output (relu's result, the second addmm's mat1).
    assert int(cats["activation"]["Peak(byte)"]) == 16 * 64 * 4 + 16 * 128 * 4
    assert int(cats["activation"]["End(byte)"]) == 16 * 64 * 4  # x is still alive
    assert "decompose (peak / end bytes per owner)" in run.stderr


def test_pta_blocks_and_owners(mlp):
    run, info, rows = mlp
    pta = {int(r["Ptr"], 16): r for r in rows if r["Event"] == "MALLOC" and r["Event Type"] == "PTA"}
    sizes = {"0.weight": 64 * 128 * 4, "0.bias": 128 * 4, "2.weight": 128 * 32 * 4, "2.bias": 32 * 4}
    for name, ptr in info["ptrs"].items():
        a = attr(pta[ptr])
        assert a["size"] == str(sizes[name]), name   # posix_memalign(size == nbytes)
        assert a["owner"] == "PTA@weight"
        assert int(a["used"]) > 0 and a["total"] == a["used"]
    assert attr(pta[info["x"]])["owner"] == "PTA@activation"
    # Every PTA block is freed as PTA, and the pool figures stay consistent.
    frees = [r for r in rows if r["Event"] == "FREE" and r["Event Type"] == "PTA"]
    assert frees and all(int(attr(r)["used"]) >= 0 for r in frees)


def _launches(rows, lo, hi):
    return {r["Name"] for r in rows[lo:hi] if r["Event"] == "OP_LAUNCH" and r["Event Type"] == "ATEN_START"}


def test_launches_of_a_training_step(mlp):
    run, info, rows = mlp
    marks = {r["Name"]: i for i, r in enumerate(rows) if r["Event"] == "MSTX"}
    fwd = _launches(rows, marks["step begins"], marks["backward"])
    bwd = _launches(rows, marks["backward"], marks["optimizer"])
    optim = _launches(rows, marks["optimizer"], len(rows))
    assert {"aten::t", "aten::addmm", "aten::relu", "aten::sum"} <= fwd, fwd
    assert {"aten::ones_like", "aten::expand", "aten::mm", "aten::threshold_backward", "aten::sum"} <= bwd, bwd
    assert {"aten::lerp_", "aten::addcmul_", "aten::sqrt", "aten::div", "aten::addcdiv_", "aten::add_"} <= optim, optim
    starts = [r for r in rows if r["Event"] == "OP_LAUNCH" and r["Event Type"] == "ATEN_START"]
    ends = [r for r in rows if r["Event"] == "OP_LAUNCH" and r["Event Type"] == "ATEN_END"]
    assert len(starts) == len(ends) > 50
    snaps = [r for r in rows if r["Event"] == "SNAPSHOT"]
    assert len(snaps) == 3  # start, step, stop
    assert all(int(attr(r)["rss"]) > 0 and int(attr(r)["heap"]) > 0 for r in snaps)


def test_addmm_access_sides(mlp):
    run, info, rows = mlp
    aid = {int(r["Ptr"], 16): attr(r)["allocation_id"] for r in rows if r["Event"] == "MALLOC"}
    i = next(i for i, r in enumerate(rows) if r["Event"] == "OP_LAUNCH" and r["Name"] == "aten::addmm")
    j = next(j for j in range(i + 1, len(rows)) if rows[j]["Event"] == "OP_LAUNCH" and rows[j]["Name"] == "aten::addmm")
    acc = [r for r in rows[i:j + 1] if r["Event"] == "ACCESS"]
    reads = [attr(r) for r in acc if r["Event Type"] == "READ"]
    writes = [attr(r) for r in acc if r["Event Type"] == "WRITE"]
    assert [(a["shape"], a["size"]) for a in reads] == [("[128]", "512"), ("[16x64]", "4096"), ("[64x128]", "32768")]
    assert [a["allocation_id"] for a in reads] == [aid[info["ptrs"]["0.bias"]], aid[info["x"]], aid[info["ptrs"]["0.weight"]]]
    assert reads[2]["format"] == "strided"   # weight.t(): a view, resolved to the weight's block
    assert all(a["dtype"] == "float32" and a["type"] == "PTA" for a in reads + writes)
    assert [(a["shape"], a["format"]) for a in writes] == [("[16x128]", "ND")]
    assert all(r["Name"] == "aten::addmm" for r in acc)


WATCH = """
import torch, msmemscope
msmemscope.config(events="alloc,free,launch", watch="aten::mul:out0,aten::sum,full-content")
msmemscope.start()
a = torch.ones(1024)
other = torch.zeros(64)
msmemscope.watch(other, "other")
w = torch.mul(a, 2)            # start: its output is watched
v = w.view(32, 32)[3]          # a view into the watched block
b = a + 1
v.add_(5)                      # the stomp
c = b * 3
s = c.sum()                    # end
msmemscope.stop()
"""


@pytest.mark.parametrize("first", [1, 2**32 - 3], ids=["launches from 1", "launches past 2**32"])
def test_watch_finds_the_stomp(tmp_path, torch_available, first):
    # (launch numbers past a C int take the hooks' typed call)
    prog = WATCH.replace("import torch, msmemscope\n", "import itertools, torch, msmemscope\n"
                         "msmemscope.torch_hooks._launches = itertools.count(%d)\n" % first)
    run = run_traced(tmp_path, prog, "--collect-mode=deferred", timeout=TIMEOUT).check()
    rows = run.rows()
    rep = _analysis(run, "watch")
    changed = [r for r in rep if r["Status"] == "changed"]
    assert [(r["Operator"], r["Tensor"]) for r in changed] == [("aten::add_", "aten::mul:out0")]
    assert int(changed[0]["Launch"]) == first + 6  # ones, zeros, mul, view, select, add, add_
    byid = {r["ID"]: r for r in rows}
    row = byid[changed[0]["Row ID"]]
    assert (row["Event"], row["Event Type"], row["Name"]) == ("OP_LAUNCH", "ATEN_START", "aten::add_")
    assert [(r["Status"], r["Tensor"]) for r in rep if r["Status"] == "unchanged"] == [("unchanged", "other")]
    assert "aten::add_ (launch %s, row %s) changed aten::mul:out0" % (changed[0]["Launch"], changed[0]["Row ID"]) in run.stderr
    # full-content: the block after every launch in the window
    dumps = glob.glob(os.path.join(run.main_folder(), "watch_dump", "*_aten__mul_out0.bin"))
    assert len(dumps) == 7   # mul, view, select, add, add_, mul, sum
    import numpy as np
    after = np.fromfile(os.path.join(run.main_folder(), "watch_dump", "%s_aten__mul_out0.bin" % changed[0]["Launch"]), dtype=np.float32)
    want = np.full(1024, 2.0, dtype=np.float32)
    want[96:128] += 5
    assert (after == want).all()


INEFF = """
import torch, msmemscope
msmemscope.config(events="alloc,free,launch,access", analysis="inefficient")
msmemscope.start()
with torch.no_grad():
    # early allocation: allocated, then another block is freed, then first use
    early = torch.empty(1 << 16)
    tmp = torch.ones(1000)
    del tmp
    early.fill_(1.0)
    del early
    # late deallocation: last use, then another block is allocated, then freed
    late = torch.ones(1 << 15)
    late.mul_(2)
    z = torch.zeros(3000)
    z.add_(1)
    del z
    del late
    # temporary idleness: 3000+ launches between two uses
    idle = torch.ones(1 << 14)
    s = torch.zeros(1)
    for i in range(3002):
        s.add_(1)
    idle.mul_(2)
    del idle
    del s
msmemscope.stop()
"""


def test_inefficient_planted(tmp_path, torch_available):
    run = run_traced(tmp_path, INEFF, "--collect-mode=deferred", timeout=TIMEOUT).check()
    rows = run.rows()
    flagged = {int(attr(r)["size"]): attr(r)["inefficient"] for r in rows if r["Event"] == "MALLOC" and "inefficient" in attr(r)}
    assert flagged == {(1 << 16) * 4: "early_allocation", (1 << 15) * 4: "late_deallocation",
                       (1 << 14) * 4: "temporary_idleness"}, flagged
    assert all(r["Event Type"] == "PTA" for r in rows if r["Event"] == "MALLOC" and "inefficient" in attr(r))


def _example_run(tmp_path, events, *opts):
    with open(os.path.join(REPO, "examples", "train_mlp.py")) as f:
        script = f.read()
    run = run_traced(tmp_path, script, "--collect-mode=deferred", "--call-stack=python:16",
                     "--events=" + events, *opts, timeout=TIMEOUT).check()
    with open(os.path.join(run.main_folder(), "config.json")) as f:
        cfg = json.load(f)
    return run, cfg


def test_hooks_record_nothing_of_their_own(tmp_path_factory):
    """The operator hooks' own work (their Python code, torch's mode stack
    and saved-tensor hooks they enter) makes no row: no HOST row has a frame
    of the msmemscope package or of torch's dispatch-mode machinery, and
    what they allocated is counted as msmemscope_own, not written."""
    pytest.importorskip("torch")
    on, on_cfg = _example_run(tmp_path_factory.mktemp("on"), "alloc,free,launch,access")
    # (--level=kernel: no operator hooks; alloc alone installs them, for PTA)
    off, off_cfg = _example_run(tmp_path_factory.mktemp("off"), "alloc,free", "--level=kernel")
    pkg = os.sep + "msmemscope" + os.sep
    host = {}
    for name, run in (("on", on), ("off", off)):
        rows = run.rows()
        host[name] = [r for r in rows if r["Event Type"] == "HOST"]
        ours = [r for r in host[name] if pkg in r["Call Stack(Python)"] or "_python_dispatch.py" in r["Call Stack(Python)"]]
        assert not ours, "%s: %d HOST rows with msmemscope's or torch's dispatch-mode frames, e.g. %s" % (
            name, len(ours), ours[0]["Call Stack(Python)"][:300])
    launches = sum(1 for r in on.rows() if r["Event"] == "OP_LAUNCH" and r["Event Type"] == "ATEN_START")
    assert launches > 100
    # (without the hooks, msmemscope_own counts the loader's records of the
    # unwinder msmemscope loads: the hooks add theirs)
    own_on = on_cfg["events_not_written"].get("msmemscope_own", 0)
    own_off = off_cfg["events_not_written"].get("msmemscope_own", 0)
    assert own_on > own_off + launches, (on_cfg["events_not_written"], off_cfg["events_not_written"])
    # The figure the README gives: the steps after the first (the first
    # imports what torch loads lazily, which the hooks had imported before
    # start()), HOST rows with the hooks against without.
    def after_first_step(run):
        rows = run.rows()
        first = next(i for i, r in enumerate(rows) if r["Event"] == "SYSTEM" and r["Event Type"] == "STEP")
        stop = next(i for i, r in enumerate(rows) if r["Event"] == "SYSTEM" and r["Event Type"] == "STOP")
        return rows[first:stop]
    w_on, w_off = after_first_step(on), after_first_step(off)
    h_on = sum(1 for r in w_on if r["Event Type"] == "HOST")
    h_off = sum(1 for r in w_off if r["Event Type"] == "HOST")
    n = sum(1 for r in w_on if r["Event"] == "OP_LAUNCH" and r["Event Type"] == "ATEN_START")
    assert n > 100 and h_off > 0
    print("HOST rows after the first step: hooks on %d, off %d: %+d for %d launches (%.1f a launch)" % (
        h_on, h_off, h_on - h_off, n, (h_on - h_off) / n))


BEFORE_START = """
import torch, msmemscope
msmemscope.config(collect_mode="deferred")
a = torch.ones(4)          # before start(): the hooks are in, collection is off
msmemscope.start()
c = a + 1
msmemscope.stop()
d = a * 3
"""


def test_no_launch_rows_while_collection_is_off(tmp_path, torch_available):
    run = run_traced(tmp_path, BEFORE_START, "--events=alloc,free,launch", timeout=TIMEOUT).check()
    on, ops = False, []
    for r in run.rows():
        if r["Event"] == "SYSTEM" and r["Event Type"] in ("START", "STOP"):
            on = r["Event Type"] == "START"
        elif r["Event"] == "OP_LAUNCH":
            ops.append((on, r["Event Type"], r["Name"]))
    assert ops == [(True, "ATEN_START", "aten::add"), (True, "ATEN_END", "aten::add")], ops


ACCESS_LATER = """
import torch, msmemscope
msmemscope.config(collect_mode="deferred")
a = torch.ones(4)          # the hooks are in since torch's import, without access
msmemscope.config(events="alloc,free,launch,access")
msmemscope.start()
c = a + 1
msmemscope.stop()
"""


def test_access_asked_once_the_hooks_are_in(tmp_path, torch_available):
    """The hooks put in at torch's import follow a later config(): with
    access asked before start(), the operator's tensors are ACCESS rows."""
    run = run_traced(tmp_path, ACCESS_LATER, "--events=alloc,free,launch", timeout=TIMEOUT).check()
    acc = [(r["Event Type"], r["Name"], attr(r)["shape"], attr(r)["size"]) for r in run.rows() if r["Event"] == "ACCESS"]
    assert ("READ", "aten::add", "[4]", "16") in acc and ("WRITE", "aten::add", "[4]", "16") in acc, acc


STOP_ELSEWHERE = """
import threading, torch, msmemscope
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
msmemscope.config(events="alloc,free,launch")
msmemscope.start()
torch.ones(4).sum()
t = threading.Thread(target=msmemscope.stop)  # the hooks are the main thread's
t.start()
t.join()
torch.ones(2)                                 # collection off: no rows
msmemscope.start()
torch.ones(4).sum()
msmemscope.stop()
print("modes left:", len(_get_current_dispatch_mode_stack()))
"""


def test_stop_from_another_thread(tmp_path, torch_available):
    """stop() from another thread than the hooks': the next start() records
    each operator once, and the last stop() leaves no mode in."""
    run = run_traced(tmp_path, STOP_ELSEWHERE, "--collect-mode=deferred", timeout=TIMEOUT).check()
    ops = [(r["Event Type"], r["Name"]) for r in run.rows() if r["Event"] == "OP_LAUNCH"]
    pair = [("ATEN_START", "aten::ones"), ("ATEN_END", "aten::ones"), ("ATEN_START", "aten::sum"), ("ATEN_END", "aten::sum")]
    assert ops == pair + pair, ops
    assert "modes left: 0" in run.stdout


WATCH_TWICE = """
import torch, msmemscope
msmemscope.config(events="alloc,free,launch", watch="aten::mul:out0,aten::sum")
a, other = torch.ones(8), torch.zeros(4)
msmemscope.watch(other, "other")  # the next window's
for _ in range(2):
    msmemscope.start()
    s = torch.mul(a, 2).sum()
    msmemscope.stop()
"""


@pytest.mark.parametrize("where", ["immediate", "after start"])
def test_watch_configured_while_the_hooks_run(tmp_path, torch_available, where):
    # In immediate mode the hooks start as torch is imported, before the
    # script's config(watch=...); or config() comes after start(): the
    # watch was ignored.
    prog, opts = WATCH, []
    if where == "after start":
        prog = WATCH.replace('msmemscope.config(events="alloc,free,launch", watch=', 'msmemscope.config(events="alloc,free,launch")\n'
                             'msmemscope.start()\nmsmemscope.config(watch=').replace("\nmsmemscope.start()\na = ", "\na = ")
        opts = ["--collect-mode=deferred"]
    run = run_traced(tmp_path, prog, *opts, timeout=TIMEOUT).check()
    changed = [(r["Operator"], r["Tensor"]) for r in _analysis(run, "watch") if r["Status"] == "changed"]
    assert changed == [("aten::add_", "aten::mul:out0")], changed


def test_watch_given_tensor_is_the_next_windows(tmp_path, torch_available):
    run = run_traced(tmp_path, WATCH_TWICE, "--collect-mode=deferred", timeout=TIMEOUT).check()
    rep = [(r["Status"], r["Tensor"]) for r in _analysis(run, "watch")]
    assert rep.count(("unchanged", "other")) == 1 and rep.count(("unchanged", "aten::mul:out0")) == 2, rep


TWO_RANGES = """
import torch, msmemscope
m = torch.nn.Linear(8, 8)
for ev in ("alloc,free,launch,access", "alloc,free"):
    msmemscope.config(events=ev)
    msmemscope.start()
    m(torch.randn(2, 8)).sum().backward()
    msmemscope.stop()
"""


def test_each_range_has_the_rows_it_asked_for(tmp_path, torch_available):
    """config() between ranges: the first range's launches and accesses
    stay, although the last configuration asks for neither."""
    run = run_traced(tmp_path, TWO_RANGES, "--collect-mode=deferred", timeout=TIMEOUT).check()
    rng, seen = 0, {1: set(), 2: set()}
    for r in run.rows():
        if r["Event"] == "SYSTEM" and r["Event Type"] == "START":
            rng += 1
        elif r["Event"] in ("OP_LAUNCH", "ACCESS"):
            seen[rng].add(r["Event"])
    assert seen == {1: {"OP_LAUNCH", "ACCESS"}, 2: set()}, seen


WATCH_THEN_NONE = """
import torch, msmemscope
msmemscope.config(events="alloc,free,launch", watch="aten::mul:out0,aten::sum")
msmemscope.start()
w = torch.mul(torch.ones(8), 2)
w.add_(1)                      # changes the watched block
s = w.sum()
msmemscope.stop()
msmemscope.config(watch=None)  # the next range watches nothing
msmemscope.start()
torch.ones(4).sum()
msmemscope.stop()
"""


def test_watch_report_of_an_earlier_range(tmp_path, torch_available):
    run = run_traced(tmp_path, WATCH_THEN_NONE, "--collect-mode=deferred", timeout=TIMEOUT).check()
    rep = [(r["Status"], r["Operator"], r["Tensor"]) for r in _analysis(run, "watch")]
    assert ("changed", "aten::add_", "aten::mul:out0") in rep, rep


THREAD_ENDED = """
import threading, torch, msmemscope
msmemscope.config(events="alloc,free,launch")
def first():
    msmemscope.start()            # the hooks are this thread's
    torch.ones(2).sum()
t = threading.Thread(target=first)
t.start()
t.join()
msmemscope.stop()                 # from another thread, after theirs ended
def second():                     # a new thread: perhaps the ended one's ident
    msmemscope.start()
    torch.ones(4).sum()
    msmemscope.stop()
t = threading.Thread(target=second)
t.start()
t.join()
"""


def test_hooks_of_an_ended_thread(tmp_path, torch_available):
    """Hooks stopped from another thread after theirs ended are forgotten,
    not taken out on a new thread that has the ended one's ident."""
    run = run_traced(tmp_path, THREAD_ENDED, "--collect-mode=deferred", timeout=TIMEOUT).check()
    assert "Exception in thread" not in run.stderr, run.stderr
    ops = [(r["Event Type"], r["Name"]) for r in run.rows() if r["Event"] == "OP_LAUNCH"]
    pair = [("ATEN_START", "aten::ones"), ("ATEN_END", "aten::ones"), ("ATEN_START", "aten::sum"), ("ATEN_END", "aten::sum")]
    assert ops == pair + pair, ops


SHORT_STACK = """
import msmemscope, torch
msmemscope.start()
def make():
    return torch.empty(1000, dtype=torch.float32)   # the tensor
kv = make()                                         # its caller
msmemscope.stop()
"""


@pytest.mark.parametrize("depth", [1, 2])
def test_short_python_stack_of_a_tensor(tmp_path, torch_available, depth):
    # The hooks' own frames (msmemscope's package, torch's dispatch mode)
    # are left out as the stack is taken: they used up a short depth, and
    # the PTA row had no frame at all.
    run = run_traced(tmp_path, SHORT_STACK, "--collect-mode=deferred", "--call-stack=python:%d" % depth,
                     timeout=TIMEOUT).check()
    pta = [r for r in run.rows() if r["Event"] == "MALLOC" and r["Event Type"] == "PTA" and attr(r)["size"] == "4000"]
    assert len(pta) == 1, pta
    want = ["prog.py:%d(make)" % line_of(SHORT_STACK, "# the tensor"),
            "prog.py:%d(<module>)" % line_of(SHORT_STACK, "# its caller")][:depth]
    got = [f.rsplit(os.sep, 1)[-1] for f in pta[0]["Call Stack(Python)"].split(";")]
    assert got == want, pta[0]["Call Stack(Python)"]
