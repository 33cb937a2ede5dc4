"""PyTorch's CUDA tensor blocks as PTA rows, and decompose's device lines,
without a GPU: a stand-in of PyTorch's caching allocator (its history and
its state, as torch.cuda.memory._snapshot() gives them) over the stand-in
CUDA driver the Go tests build (tests/progs/cuda/standin_cuda.c). The real
allocator is checked by make gpu-check on a GPU."""
import csv
import glob
import json
import os
import subprocess

import pytest

from conftest import REPO, attr, run_traced

# The program: PyTorch (CPU build) with its CUDA allocator replaced by a
# stand-in whose segments come from the stand-in driver.
HARNESS = r'''
import ctypes, json, os, sys, time, torch, msmemscope
from msmemscope import torch_hooks
from msmemscope._records import R_OP_START, R_OP_END, R_TAG

cu = ctypes.CDLL("libcuda.so.1")
ctx = ctypes.c_void_p()
assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0 and cu.cuCtxSetCurrent(ctx) == 0  # device SNAPSHOT rows


def drv(size, stream=None):
    p = ctypes.c_uint64()
    rc = cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(size)) if stream is None else \
        cu.cuMemAllocAsync(ctypes.byref(p), ctypes.c_size_t(size), ctypes.c_void_p(stream))
    assert rc == 0
    return p.value


# The history's clock behind the records' (as PyTorch's TSC-converted one
# can be): its entries come before the calls that made them.
SKEW_US = int(os.environ.get("SKEW_US", "0"))


class Allocator:
    """The caching allocator as its history and snapshot show it."""
    def __init__(self):
        self.trace, self.segs, self.recording, self.max = [], [], False, sys.maxsize
        self.calls = []

    def entry(self, action, addr, size):
        if self.recording:
            self.trace.append({"action": action, "addr": addr, "size": size, "stream": 0,
                               "time_us": time.time_ns() // 1000 - SKEW_US})
            del self.trace[:-self.max]  # a ring of max entries
        time.sleep(0.002)

    def segment(self, size):
        a = drv(size)
        self.entry("segment_alloc", a, size)
        self.segs.append([a, size, {}])
        return a

    def alloc(self, seg, off, size):
        for s in self.segs:
            if s[0] == seg:
                s[2][seg + off] = size
        self.entry("alloc", seg + off, size)
        return seg + off

    def free(self, addr):
        for s in self.segs:
            size = s[2].pop(addr, None)
            if size is not None:
                self.entry("free_requested", addr, size)
                self.entry("free_completed", addr, size)

    def snapshot(self):
        segs = [{"device": 0, "address": a, "total_size": n, "stream": 0,
                 # blocks are rounded; the history's sizes are the ones asked for
                 "blocks": [{"address": b, "size": z + 512, "requested_size": z, "state": "active_allocated"}
                            for b, z in sorted(bl.items())]}
                for a, n, bl in self.segs]
        self.entry("snapshot", 0, 0)
        return {"segments": segs, "device_traces": [list(self.trace)]}

    def record(self, enabled, context, stacks, max_entries, clear_history, *rest):  # torch._C's, as PyTorch calls it
        self.calls.append((enabled, clear_history))
        self.recording, self.max = enabled is not None, max_entries
        if clear_history or not self.recording:
            self.trace = []


A = Allocator()
torch.cuda.get_allocator_backend = lambda: os.environ.get("BACKEND", "native")
queued = []  # torch.cuda._lazy_call's: run by the program's first CUDA call (LAZY=1)
torch.cuda._lazy_call = lambda f, **kw: queued.append(f) if os.environ.get("LAZY") == "1" else f()


def cuda_init():
    os.environ["LAZY"] = "0"
    for f in queued:
        f()
torch._C._cuda_isHistoryEnabled = lambda: A.recording
torch._C._cuda_record_memory_history = A.record  # under PyTorch's own _record_memory_history
torch.cuda.memory._snapshot = A.snapshot
KiB, MiB = 1024, 1024 * 1024

'''

PROG = HARNESS + r'''
USER = os.environ.get("USER_HISTORY") == "1"
if USER:  # the program records the history itself: msmemscope reads it, and leaves it as it is
    torch.cuda.memory._record_memory_history("all", max_entries=1000)
seg0 = A.segment(2 * MiB)
b0 = A.alloc(seg0, 0, 64 * KiB)  # before start(): no rows
msmemscope.config(events="alloc,free,launch,access", analysis="decompose")
msmemscope.start()
assert A.recording, "the history was not turned on"
seg1 = A.segment(4 * MiB)
w = A.alloc(seg1, 0, MiB)
torch_hooks._emit(R_TAG, w, "weight")
g = A.alloc(seg1, MiB, 512 * KiB)
torch_hooks._emit(R_TAG, g, "gradient")
torch_hooks._emit(R_OP_START, 1, "aten::fake")
a = A.alloc(seg1, MiB + 512 * KiB, 256 * KiB)
torch_hooks._emit(R_OP_END, 1, "aten::fake\nW %x %x %d float32 [65536] ND" % (a, a, 256 * KiB))
msmemscope.step()
A.free(g)
A.free(b0)
other = drv(3 * MiB)  # another library's memory
A.recording = False   # entries the history misses: the state mends them
x = A.alloc(seg1, 2 * MiB, 128 * KiB)
A.free(a)
A.recording = True
p = drv(MiB, stream=0)  # cudaMallocAsync's block: the storage names the driver's block
torch_hooks._emit(R_OP_START, 2, "aten::fake2")
torch_hooks._emit(R_OP_END, 2, "aten::fake2\nW %x %x %d float32 [262144] ND" % (p, p, MiB))
assert cu.cuMemFreeAsync(ctypes.c_uint64(p), ctypes.c_void_p(0)) == 0
msmemscope.stop()
if USER:
    assert A.recording and A.calls == [("all", False)], A.calls  # never cleared, never turned off
    assert A.trace[0]["action"] == "segment_alloc" and A.trace[0]["addr"] == seg0, A.trace[0]
else:
    assert not A.recording, "the history msmemscope turned on was left on"
    assert A.calls[-1] == (None, False) and all(c[1] for c in A.calls[:-1]), A.calls  # cleared at each read
print(json.dumps({"seg0": seg0, "seg1": seg1, "w": w, "g": g, "a": a, "x": x, "p": p, "b0": b0, "other": other}))
'''

KiB, MiB = 1024, 1024 * 1024


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    d = tmp_path_factory.mktemp("cuda")
    src = os.path.join(REPO, "tests", "progs", "cuda", "standin_cuda.c")
    subprocess.run(["gcc", "-O0", "-shared", "-fPIC", "-o", str(d / "libcuda.so.1"), src, "-Wl,-soname,libcuda.so.1"],
                   check=True)
    return str(d)


@pytest.fixture(scope="module", params=["msmemscope's history", "the program's history"])
def run(standin, tmp_path_factory, request):
    pytest.importorskip("torch")
    mp = pytest.MonkeyPatch()
    mp.setenv("LD_LIBRARY_PATH", standin)
    mp.setenv("USER_HISTORY", "1" if request.param == "the program's history" else "0")
    mp.setenv("SKEW_US", "50" if request.param == "the program's history" else "0")
    try:
        r = run_traced(tmp_path_factory.mktemp("tensors"), PROG, "--collect-mode=deferred").check()
    finally:
        mp.undo()
    return r, json.loads(r.stdout.strip().splitlines()[-1]), r.rows()


def test_tensor_blocks_are_pta_rows_on_their_device(run):
    r, at, rows = run
    pta = [x for x in rows if x["Event Type"] == "PTA"]
    mallocs = {int(x["Ptr"], 16): x for x in pta if x["Event"] == "MALLOC"}
    frees = {int(x["Ptr"], 16): x for x in pta if x["Event"] == "FREE"}
    assert set(mallocs) == {at["w"], at["g"], at["a"], at["x"], at["p"]}
    assert set(frees) == {at["g"], at["a"], at["p"]}
    assert all(x["Device Id"] == "0" for x in pta)
    want = {"w": (MiB, "PTA@weight"), "g": (512 * KiB, "PTA@gradient"), "a": (256 * KiB, "PTA@aten"),
            "x": (128 * KiB, "PTA"), "p": (MiB, "PTA")}
    for k, (size, owner) in want.items():
        a = attr(mallocs[at[k]])
        assert (int(a["size"]), a["owner"]) == (size, owner), k
        assert attr(frees[at[k]])["allocation_id"] == a["allocation_id"] if at[k] in frees else True
    # the cudaMallocAsync block keeps the driver's kind
    assert attr(mallocs[at["p"]])["kind"] == "device"
    # blocks of before start() make no row, nor their FREE
    assert at["b0"] not in mallocs and at["b0"] not in frees
    # the ACCESS rows name the tensor blocks
    acc = [x for x in rows if x["Event"] == "ACCESS"]
    ids = {attr(x).get("allocation_id") for x in acc}
    assert attr(mallocs[at["a"]])["allocation_id"] in ids and attr(mallocs[at["p"]])["allocation_id"] in ids
    # rows stay in time order
    ts = [int(x["Timestamp(ns)"]) for x in rows]
    assert ts == sorted(ts)


def test_segments_are_pytorchs_hal_blocks(run):
    r, at, rows = run
    hal = {int(x["Ptr"], 16): attr(x)["owner"] for x in rows if x["Event"] == "MALLOC" and x["Event Type"] == "HAL"}
    assert hal == {at["seg1"]: "HAL@pytorch", at["other"]: "HAL"}  # seg0: allocated before start()


def test_decompose_device_lines(run):
    r, at, rows = run
    (path,) = glob.glob(os.path.join(r.main_folder(), "analysis", "decompose_*.csv"))
    with open(path, newline="") as f:
        dev = {x["Name"]: (int(x["Peak(byte)"]), int(x["End(byte)"])) for x in csv.DictReader(f) if x["Kind"] == "cuda:0"}
    w, g, a, x, p = MiB, 512 * KiB, 256 * KiB, 128 * KiB, MiB
    assert dev["weight"] == (w, w)
    assert dev["gradient"] == (g, 0)
    assert dev["aten"] == (a, 0)
    assert dev["requested"] == (max(w + g + a, w + a + p), w + x)
    assert dev["reserved"] == (4 * MiB, 4 * MiB)
    assert dev["cached_free"] == (4 * MiB, 4 * MiB - w - x)
    assert dev["outside_pytorch"] == (3 * MiB, 3 * MiB)
    sites = [k for k in dev if k.startswith("outside_pytorch at ")]
    assert len(sites) == 1 and dev[sites[0]] == (3 * MiB, 3 * MiB), sites  # where it was allocated
    # cuMemGetInfo's used bytes beyond the driver blocks the rows hold:
    # the segment allocated before start()
    assert dev["context_inferred"][1] == 2 * MiB
    assert "cuda:0:" in r.stderr and "cached_free" in r.stderr


def test_history_mends_what_a_ring_dropped(tmp_path):
    """A program's history kept in a ring of 3 entries drops most of them
    between reads: the file still replays to the allocator's live blocks,
    with no FREE of a block it never allocated and no block allocated twice."""
    import contextlib
    import struct
    import types
    from msmemscope import _cuda_history as ch
    ch._live.clear()  # (the process's tensor blocks: another test's are not this one's)

    class Mem:
        def __init__(self):
            self.trace, self.blocks, self.t = [], {}, 1000

        def op(self, action, addr, size):
            self.t += 1
            if action == "alloc":
                self.blocks[addr] = size
            else:
                del self.blocks[addr]
            self.trace = (self.trace + [{"action": action, "addr": addr, "size": size, "time_us": self.t}])[-3:]

        def snapshot(self):
            return {"segments": [{"device": 0, "address": 0x1000, "blocks": [
                {"address": a, "size": z, "state": "active_allocated"} for a, z in sorted(self.blocks.items())]}],
                "device_traces": [list(self.trace)]}

    m = Mem()
    cuda = types.SimpleNamespace(get_allocator_backend=lambda: "native", _lazy_call=lambda f: f(),
                                 memory=types.SimpleNamespace(_snapshot=m.snapshot, _record_memory_history=None))
    torch = types.SimpleNamespace(cuda=cuda, _C=types.SimpleNamespace(_cuda_isHistoryEnabled=lambda: True))
    path = tmp_path / "spool" / ch.FILE
    m.op("alloc", 0x1000, 512)  # before: no rows
    h = ch.History(torch, None, lambda: str(path), contextlib.nullcontext)
    h.begin()
    assert h.on and not h.mine
    for i in range(1, 11):
        m.op("alloc", 0x1000 + i * 512, 512)
    for i in (0, 2, 4, 6):
        m.op("free_requested", 0x1000 + i * 512, 512)
    h.read()
    m.op("alloc", 0x1000 + 4 * 512, 1024)  # an address reused
    m.op("free_requested", 0x1000 + 9 * 512, 512)
    h.pid, size = -1, path.stat().st_size  # as in a forked child: its copy of the allocator is not read
    h.read()
    assert path.stat().st_size == size
    h.pid = os.getpid()
    h.close()
    data = path.read_bytes()
    assert data.startswith(ch.MAGIC)
    live = {}
    for off in range(len(ch.MAGIC), len(data), ch.ENTRY.size):
        a, dev, ns, addr, size, stream = ch.ENTRY.unpack_from(data, off)
        if a == ch.A_ALLOC:
            assert addr not in live, hex(addr)
            live[addr] = size
        elif a == ch.A_FREE:
            assert live.pop(addr) == size, hex(addr)
    want = {a: z for a, z in m.blocks.items() if a != 0x1000}
    assert live == want


# CUDA starts after start(); the program turns on its own history midway;
# stop() and start() again with a block freed in between.
LATER = HARNESS + r'''
os.environ["LAZY"] = "1"
from torch.cuda.memory import _record_memory_history as program_records  # a name taken before msmemscope starts
msmemscope.config(events="alloc,free", analysis="decompose")
msmemscope.start()
assert not A.recording and len(queued) == 1, "msmemscope started the history before CUDA"
cuda_init()  # the program's first CUDA call
assert A.recording
seg = A.segment(4 * MiB)
w = A.alloc(seg, 0, MiB)


class Prop(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("handles", ctypes.c_int), ("loc_type", ctypes.c_int), ("loc_id", ctypes.c_int),
                ("win32", ctypes.c_void_p), ("flags", ctypes.c_ubyte * 8)]


# an expandable segment: physical memory (cuMemCreate) mapped into a reserved range
h, va = ctypes.c_uint64(), ctypes.c_uint64()
assert cu.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(2 * MiB), ctypes.byref(Prop(1, 0, 1, 0)), ctypes.c_ulonglong(0)) == 0
assert cu.cuMemAddressReserve(ctypes.byref(va), ctypes.c_size_t(8 * MiB), ctypes.c_size_t(0), ctypes.c_uint64(0),
                              ctypes.c_ulonglong(0)) == 0
assert cu.cuMemMap(va, ctypes.c_size_t(2 * MiB), ctypes.c_size_t(0), h, ctypes.c_ulonglong(0)) == 0
A.entry("segment_map", va.value, 2 * MiB)
A.segs.append([va.value, 2 * MiB, {}])
t = A.alloc(va.value, 0, MiB)
msmemscope.step()
assert A.calls[-1] == ("all", True)  # msmemscope's: cleared at each read
program_records("all", max_entries=1000)  # the program's own, from now on
g = A.alloc(seg, MiB, 512 * KiB)
msmemscope.step()
assert A.calls[-1] == ("all", False) and A.trace, A.calls  # the program's: not cleared
msmemscope.stop()
assert A.recording and A.calls[-1] == ("all", False), A.calls  # left on
A.free(w)  # while collection is off
msmemscope.start()
x = A.alloc(seg, 0, 256 * KiB)  # w's address again
msmemscope.stop()
assert A.recording and A.calls[-1] == ("all", False), A.calls
print(json.dumps({"w": w, "g": g, "x": x, "t": t, "seg": seg, "handle": h.value}))
'''

# PyTorch's cudaMallocAsync backend: no history; its blocks are the driver's.
ASYNC = HARNESS + r'''
os.environ["BACKEND"] = "cudaMallocAsync"
msmemscope.config(events="alloc,free", analysis="decompose")
msmemscope.start()
p = drv(MiB, stream=0)
q = drv(2 * MiB)  # another library's
msmemscope.stop()
assert not A.calls, "msmemscope asked cudaMallocAsync for a history"
print(json.dumps({"p": p, "q": q}))
'''


def _traced(standin, tmp_path, prog):
    mp = pytest.MonkeyPatch()
    mp.setenv("LD_LIBRARY_PATH", standin)
    try:
        r = run_traced(tmp_path, prog, "--collect-mode=deferred").check()
    finally:
        mp.undo()
    return r, json.loads(r.stdout.strip().splitlines()[-1]), r.rows()


def _blocks(rows, typ):
    out = {}
    for x in rows:
        if x["Event Type"] == typ and x["Event"] in ("MALLOC", "FREE"):
            out.setdefault(int(x["Ptr"], 16), []).append((x["Event"], int(attr(x)["size"])))
    return out


def test_history_across_stop_and_start_and_the_programs_own(standin, tmp_path):
    pytest.importorskip("torch")
    r, at, rows = _traced(standin, tmp_path, LATER)
    pta = _blocks(rows, "PTA")
    # w is freed while collection was off: its FREE comes at the next start();
    # x, at w's address, is a block of its own
    assert pta == {at["w"]: [("MALLOC", MiB), ("FREE", MiB), ("MALLOC", 256 * KiB)],
                   at["g"]: [("MALLOC", 512 * KiB)], at["t"]: [("MALLOC", MiB)]}
    # PyTorch's segments: the cuMemAlloc one, and the handle mapped into a range it maps
    hal = {int(x["Ptr"], 16): attr(x)["owner"] for x in rows if x["Event"] == "MALLOC" and x["Event Type"] == "HAL"}
    assert hal == {at["seg"]: "HAL@pytorch", at["handle"]: "HAL@pytorch"}
    (path,) = glob.glob(os.path.join(r.main_folder(), "analysis", "decompose_*.csv"))
    with open(path, newline="") as f:
        dev = {x["Name"]: (int(x["Peak(byte)"]), int(x["End(byte)"])) for x in csv.DictReader(f) if x["Kind"] == "cuda:0"}
    live = 512 * KiB + 256 * KiB + MiB  # g, x and t
    assert dev["requested"][1] == live
    assert dev["reserved"] == (6 * MiB, 6 * MiB)
    assert dev["cached_free"][1] == 6 * MiB - live  # t lies in the mapped range


def test_cudamallocasync_blocks_are_tensor_blocks(standin, tmp_path):
    pytest.importorskip("torch")
    r, at, rows = _traced(standin, tmp_path, ASYNC)
    assert _blocks(rows, "PTA") == {at["p"]: [("MALLOC", MiB)]}
    assert _blocks(rows, "HAL") == {at["q"]: [("MALLOC", 2 * MiB)]}
    (path,) = glob.glob(os.path.join(r.main_folder(), "analysis", "decompose_*.csv"))
    with open(path, newline="") as f:
        dev = {x["Name"]: (int(x["Peak(byte)"]), int(x["End(byte)"])) for x in csv.DictReader(f) if x["Kind"] == "cuda:0"}
    assert dev["requested"] == (MiB, MiB) and dev["outside_pytorch"] == (2 * MiB, 2 * MiB)
    assert "reserved" not in dev and "cached_free" not in dev  # the driver's pool keeps its own


def test_history_entries_the_state_showed_first(tmp_path):
    """PyTorch copies a device's history before its segments: a block
    allocated between the two is in the state and not yet in the history.
    The read mends it at its own time; its entry, older, comes in the next
    read (a program's history is never cleared) and must not make a second
    block."""
    import contextlib
    import types
    from msmemscope import _cuda_history as ch
    ch._live.clear()  # (the process's tensor blocks: another test's are not this one's)

    trace, blocks = [], {}
    hidden = []  # the entry the next snapshot's history copy missed

    def snapshot():
        t = [e for e in trace if e not in hidden]
        hidden.clear()
        return {"segments": [{"device": 0, "address": 0x1000, "blocks": [
            {"address": a, "size": z, "state": "active_allocated"} for a, z in sorted(blocks.items())]}],
            "device_traces": [t]}

    cuda = types.SimpleNamespace(get_allocator_backend=lambda: "native", _lazy_call=lambda f: f(),
                                 memory=types.SimpleNamespace(_snapshot=snapshot, _record_memory_history=None))
    torch = types.SimpleNamespace(cuda=cuda, _C=types.SimpleNamespace(_cuda_isHistoryEnabled=lambda: True))
    path = tmp_path / ch.FILE
    h = ch.History(torch, None, lambda: str(path), contextlib.nullcontext)
    h.begin()
    e = {"action": "alloc", "addr": 0x2000, "size": 512, "time_us": 1}
    trace.append(e)
    blocks[0x2000] = 512
    hidden.append(e)
    h.read()
    h.close()
    data = path.read_bytes()
    got = [ch.ENTRY.unpack_from(data, off)[0] for off in range(len(ch.MAGIC), len(data), ch.ENTRY.size)]
    assert got == [ch.A_ALLOC], got
