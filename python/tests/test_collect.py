"""Real runs under ``python -m msmemscope run`` (the CLI preloads the
library) and alone: ranges, deferred mode, steps, Python stacks, owners,
the files stop() writes without the CLI."""
import json
import os

import pytest

from conftest import REPO, attr, frames, line_of, malloc_of_size, run_plain, run_traced

RANGES = """
import msmemscope
keep = []
def alloc(n):
    keep.append(bytearray(n))   # kept alive: no FREE anywhere
alloc(111111)
msmemscope.start()
alloc(222222)
msmemscope.stop()
alloc(333333)
msmemscope.start()
alloc(444444)
msmemscope.stop()
alloc(555555)
"""


@pytest.fixture(scope="module")
def deferred_run(tmp_path_factory):
    return run_traced(tmp_path_factory.mktemp("ranges"), RANGES, "--collect-mode=deferred").check()


def _ranges(rows):
    starts = [int(r["Timestamp(ns)"]) for r in rows if r["Event"] == "SYSTEM" and r["Event Type"] == "START"]
    stops = [int(r["Timestamp(ns)"]) for r in rows if r["Event"] == "SYSTEM" and r["Event Type"] == "STOP"]
    return list(zip(starts, stops))


def test_two_ranges_only_inside(deferred_run):
    rows = deferred_run.rows()
    ranges = _ranges(rows)
    assert len(ranges) == 2, ranges
    # bytearray(n) asks for n+1 bytes.
    assert malloc_of_size(rows, 222223) and malloc_of_size(rows, 444445)
    for n in (111112, 333334, 555556):
        assert not malloc_of_size(rows, n), n
    mem = [r for r in rows if r["Event"] in ("MALLOC", "FREE")]
    assert mem
    inside = set()  # allocation ids of MALLOC rows in a range
    for r in mem:
        t = int(r["Timestamp(ns)"])
        if any(a <= t <= b for a, b in ranges):
            if r["Event"] == "MALLOC":
                inside.add(attr(r)["allocation_id"])
            continue
        # Outside the ranges, only the FREE of a block allocated inside one
        # (its pair: else the block would read as alive at exit).
        assert r["Event"] == "FREE" and attr(r)["allocation_id"] in inside, (r, ranges)


def test_deferred_collects_nothing_before_start(deferred_run):
    rows = deferred_run.rows()
    first = next(i for i, r in enumerate(rows) if r["Event"] == "SYSTEM" and r["Event Type"] == "START")
    assert not [r for r in rows[:first] if r["Event"] in ("MALLOC", "FREE")]
    # The interpreter's start-up allocated thousands of blocks: none is a row.
    assert len([r for r in rows if r["Event"] == "MALLOC"]) < 5000


STEPS = """
import msmemscope
{config}
keep = []
for i in range(1, 4):
    keep.append(bytearray(100000 + i))   # marker of step i
    msmemscope.step()
"""


def test_steps_numbering(tmp_path):
    run = run_traced(tmp_path, STEPS.format(config="")).check()
    rows = run.rows()
    step_rows = [i for i, r in enumerate(rows) if r["Event"] == "SYSTEM" and r["Event Type"] == "STEP"]
    assert len(step_rows) == 3
    bounds = [-1] + step_rows
    for i in range(1, 4):
        (m,) = [j for j, r in enumerate(rows) if r["Event"] == "MALLOC" and attr(r)["size"] == str(100001 + i)]
        assert bounds[i - 1] < m < bounds[i], "marker %d is in step %d" % (i, i)


def test_steps_filter_from_python(tmp_path):
    run = run_traced(tmp_path, STEPS.format(config='msmemscope.config(steps="2")')).check()
    rows = run.rows()
    assert malloc_of_size(rows, 100003)
    assert not malloc_of_size(rows, 100002) and not malloc_of_size(rows, 100004)
    # Only step 2's rows (and SYSTEM rows) are written.
    step_rows = [i for i, r in enumerate(rows) if r["Event"] == "SYSTEM" and r["Event Type"] == "STEP"]
    assert len(step_rows) == 3
    non_system = [i for i, r in enumerate(rows) if r["Event"] != "SYSTEM"]
    assert all(step_rows[0] < i < step_rows[1] for i in non_system)
    with open(os.path.join(run.main_folder(), "config.json")) as f:
        assert json.load(f)["config"]["steps"] == [2]


PYSTACK = """
import msmemscope
msmemscope.config(call_stack="python:10")

def make_block():
    return bytearray(1 << 20)   # the block

def caller():
    return make_block()         # the call

b = caller()
"""


def test_python_stack_of_bytearray(tmp_path):
    run = run_traced(tmp_path, PYSTACK).check()
    rows = malloc_of_size(run.rows(), (1 << 20) + 1)
    assert len(rows) == 1, rows
    fr = frames(rows[0]["Call Stack(Python)"])
    prog = str(tmp_path / "prog.py")
    assert fr[0] == (prog, line_of(PYSTACK, "# the block"), "make_block"), fr
    assert fr[1] == (prog, line_of(PYSTACK, "# the call"), "caller"), fr
    assert fr[2][2] == "<module>"
    assert len(fr) == 3  # msmemscope's own frames and nothing else
    assert rows[0]["Call Stack(C)"] == "N/A"


# Frames of each kind the interpreter has: a method, a generator, a lambda
# called from C (map; 3.12 on puts an entry shim frame under it), a call
# spread over lines, a thread, a name that is not ASCII. Beside each
# allocation the script prints the stack as Python sees it (f_lineno through
# f_back): the row must say the same.
with open(os.path.join(REPO, "tests", "progs", "pystack_kinds.py"), encoding="utf-8") as _f:
    PYSTACK_KINDS = _f.read()  # shared with tests/pystack_test.go


def test_python_stacks_of_each_frame_kind(tmp_path):
    run = run_traced(tmp_path, PYSTACK_KINDS, "--call-stack=python:16").check()
    oracle = {}
    for line in run.stdout.splitlines():
        if line.startswith("STACK "):
            _, size, stack = line.split(" ", 2)
            oracle[int(size)] = stack
    prog = str(tmp_path / "prog.py")
    at = lambda marker, fn: (prog, line_of(PYSTACK_KINDS, marker), fn)
    block = at("# the block", "make_block")
    want_top = {
        1000002: [block, at("# the method", "method")],
        1000003: [block, at("# the gen", "gen")],
        1000004: [block, at("# the map", "<lambda>"), at("# the map", "via_c")],
        1000005: [block, at("# the multi", "multi")],
        1000006: [block, at("# the thread", "th")],
        1000007: [block, at("# the names", "Ωmega")],
    }
    rows = run.rows()
    for size, top in want_top.items():
        assert frames(oracle[size])[:len(top)] == top, (size, oracle[size])
        got = malloc_of_size(rows, size)
        assert len(got) == 1, (size, got)
        assert got[0]["Call Stack(Python)"] == oracle[size], size


TORCH = """
import torch, msmemscope
msmemscope.start()  # deferred: torch's import, millions of blocks, makes no row

def make_tensor():
    # 64 MiB: past any cache; torch's binding releases the GIL around it
    return torch.empty(64 << 20, dtype=torch.uint8)   # the tensor

t = make_tensor()
print(t.untyped_storage().data_ptr())
msmemscope.stop()  # the interpreter's frees of torch's blocks at exit: half a million rows
"""


def test_python_stack_of_torch_empty(tmp_path, torch_available):
    run = run_traced(tmp_path, TORCH, "--call-stack=python:8,c:4", "--collect-mode=deferred").check()
    ptr = int(run.stdout.split()[-1])
    rows = malloc_of_size(run.rows(), 64 << 20)
    (row,) = [r for r in rows if int(r["Ptr"], 16) == ptr]
    fr = frames(row["Call Stack(Python)"])
    assert fr[0] == (str(tmp_path / "prog.py"), line_of(TORCH, "# the tensor"), "make_tensor"), fr
    assert row["Call Stack(C)"] != "N/A"


DESCRIBE = """
import msmemscope
keep = []
with msmemscope.describe(owner="loader"):
    keep.append(bytearray(777777))

@msmemscope.describe(owner="model")
def build():
    keep.append(bytearray(888888))
build()
keep.append(bytearray(999999))
msmemscope.describe(keep[-1], owner="cache")
msmemscope.describe(12345, owner="raw")
"""


def test_describe_scopes(tmp_path):
    rows = run_traced(tmp_path, DESCRIBE).check().rows()
    assert attr(malloc_of_size(rows, 777778)[0])["owner"] == "HOST@loader"
    assert attr(malloc_of_size(rows, 888889)[0])["owner"] == "HOST@model"
    assert attr(malloc_of_size(rows, 1000000)[0])["owner"] == "HOST"


STANDALONE = """
import warnings, msmemscope
warnings.simplefilter("always")
msmemscope.config(output="./out")
msmemscope.start()
msmemscope.mstx.mark("one")
p1 = msmemscope.stop()
msmemscope.start()
msmemscope.mstx.mark("two")
p2 = msmemscope.stop()
print(p1); print(p2)
msmemscope.start()
msmemscope.mstx.mark("three")   # left open: written at exit
"""


def test_standalone_stop_writes_files(tmp_path):
    run = run_plain(tmp_path, STANDALONE).check()
    p1, p2 = run.stdout.split()
    assert p1 != p2 and os.path.isfile(p1) and os.path.isfile(p2)
    assert run.stderr.count("need libmemscope.so preloaded") == 1
    d = run.main_folder()
    dumps = run.dumps(d)
    assert len(dumps) == 3, dumps   # two stops, then the exit for the open range
    names = lambda rows: [r["Name"] for r in rows if r["Event"] == "MSTX"]
    assert names(run.rows(p1)) == ["one"]
    assert names(run.rows(p2)) == ["one", "two"]
    (at_exit,) = [x for x in dumps if x not in (p1, p2)]
    assert names(run.rows(at_exit)) == ["one", "two", "three"]
    assert os.path.isfile(os.path.join(d, "config.json"))
    assert not os.path.exists(tmp_path / "memscopeDumpResults")


def test_run_forwards_exit_code_and_module(tmp_path):
    (tmp_path / "modx.py").write_text("import sys\nprint('ran as', __name__)\nsys.exit(3)\n")
    run = run_traced(tmp_path, "import sys; sys.exit(5)\n")
    assert run.rc == 5
    import subprocess
    from conftest import PY, _env
    proc = subprocess.run([PY, "-m", "msmemscope", "run", "--output=%s" % (tmp_path / "o2"), "-m", "modx"],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3 and "ran as __main__" in proc.stdout


def test_standalone_stop_with_rotating_logs(tmp_path):
    script = STANDALONE.replace('output="./out"', 'output="./out", log_mode="rotate", log_files=2, log_file_mb=1')
    run = run_plain(tmp_path, script).check()
    p1, p2 = run.stdout.split()
    kinds = [(r["Event Type"], r["Name"]) for r in run.rows(p2)]
    assert kinds == [("START", "N/A"), ("Mark", "one"), ("STOP", "N/A"),
                     ("START", "N/A"), ("Mark", "two"), ("STOP", "N/A")], kinds


CTYPES_LIBC = """
import ctypes
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
keep = libc.malloc(123457)
gone = libc.malloc(234567)
libc.free(gone)
"""


def test_libc_functions_taken_from_its_handle(tmp_path):
    # ctypes.CDLL("libc.so.6").malloc is dlsym on libc's own handle, which
    # bypasses a preloaded library: msmemscope hands out its own functions
    # there too, so the blocks are recorded (and their FREE pairs).
    run = run_traced(tmp_path, CTYPES_LIBC).check()
    rows = run.rows()
    sizes = [(r["Event"], attr(r)["size"]) for r in rows if r["Event"] in ("MALLOC", "FREE") and attr(r).get("size") in ("123457", "234567")]
    assert sorted(sizes) == [("FREE", "234567"), ("MALLOC", "123457"), ("MALLOC", "234567")], sizes
