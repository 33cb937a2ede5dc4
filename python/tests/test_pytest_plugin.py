"""The pytest plugin on a planted test file, run by pytest in a subprocess
(the installed package's pytest11 entry point): a test that passes and one
that fails each marker, the failure naming the planted allocator, the
report, the one re-execution with the library preloaded, and nothing at all
without --msmemscope."""
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import _env

PLANTED = '''
import os
import pytest

keep = []

def note_pid():
    with open(os.environ["PLANT_PIDS"], "a") as f:
        f.write("%d\\n" % os.getpid())

def grow_planted(n):
    return bytearray(n)

def hoard_planted(n):
    keep.append(bytearray(n))

@pytest.mark.limit_memory("24 MB")
def test_memory_within():
    note_pid()
    b = grow_planted(4 << 20)
    del b

@pytest.mark.limit_memory("24 MB")
def test_memory_over():
    b = grow_planted(40 << 20)
    del b

@pytest.mark.limit_leaks("1 MB")
def test_leaks_within():
    b = grow_planted(16 << 20)   # freed before the call ends: no leak
    del b

@pytest.mark.limit_leaks("1 MB")
def test_leaks_over():
    hoard_planted(3 << 20)
'''


def _pytest(tmp_path, *args, planted=PLANTED):
    p = tmp_path / "test_planted.py"
    p.write_text(textwrap.dedent(planted))
    env = _env()
    env["PLANT_PIDS"] = str(tmp_path / "pids.txt")
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:memray", "-p", "no:randomly",
           str(p)] + list(args)
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    pids = []
    if os.path.exists(env["PLANT_PIDS"]):
        pids = [int(x) for x in open(env["PLANT_PIDS"]).read().split()]
    return proc, pids


def _section(out, test):
    """The failure section of test in pytest's output."""
    head = "_ %s _" % test
    i = out.index(head)
    j = out.find("\n___", i + len(head))
    return out[i:j if j >= 0 else len(out)]


def test_markers_fail_with_their_sites_and_report(tmp_path):
    proc, pids = _pytest(tmp_path, "--msmemscope", "-rA")
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    assert "2 failed, 2 passed" in out, out
    for t in ("test_memory_within", "test_leaks_within"):
        assert "PASSED test_planted.py::%s" % t in out, out
    mem = _section(out, "test_memory_over")
    assert "Test was limited to 24.0MiB but its peak was 40.0MiB" in mem, mem
    assert "grow_planted:" in mem and "test_planted.py" in mem, mem
    leak = _section(out, "test_leaks_over")
    assert "Test was allowed to leak 1.0MiB but 3.0MiB allocated during its call is still alive" in leak, leak
    assert "hoard_planted:" in leak, leak
    assert "MEMORY PROBLEMS test_planted.py::test_memory_over" in out
    assert "MEMORY PROBLEMS test_planted.py::test_leaks_over" in out
    # The report: the largest peak first, its biggest allocator named.
    rep = out[out.index("MSMEMSCOPE REPORT"):]
    first = rep.index("Allocation results for test_planted.py::test_memory_over")
    assert first < rep.index("Allocation results for test_planted.py::test_leaks_within"), rep
    assert "- grow_planted:" in rep and "-> 40.0MiB" in rep, rep
    # Re-executed exactly once: the tests ran in one process, not pytest's first.
    assert len(pids) == 1, pids
    assert "msmemscope-pytest-" not in "".join(os.listdir(tmp_path))


def test_without_the_option_nothing_is_measured(tmp_path):
    proc, pids = _pytest(tmp_path, "--strict-markers")
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "4 passed" in out and "MSMEMSCOPE" not in out, out
    assert len(pids) == 1, pids
    assert not [d for d in os.listdir(tmp_path) if "memscope" in d.lower()], os.listdir(tmp_path)


def test_capture_kept_in_the_named_folder(tmp_path):
    keep = tmp_path / "cap"
    proc, _ = _pytest(tmp_path, "--msmemscope", "--msmemscope-dir=%s" % keep, "-k", "within")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "The capture is in %s" % keep in proc.stdout
    folders = [d for d in os.listdir(keep) if d.startswith("msmemscope_")]
    assert len(folders) == 1, folders
    # No dump is written at exit: the spool is a scratch capture.
    assert not os.path.isdir(os.path.join(keep, folders[0], "dump")), os.listdir(os.path.join(keep, folders[0]))


@pytest.mark.parametrize("limit", ['"24 XB"', '"lots"', '-3'])
def test_a_bad_limit_names_marker_value_and_rule(tmp_path, limit):
    planted = "import pytest\n\n@pytest.mark.limit_memory(%s)\ndef test_x():\n    pass\n" % limit
    proc, _ = _pytest(tmp_path, "--msmemscope", planted=planted)
    assert proc.returncode == 1, proc.stdout
    assert "limit_memory(%s)" % limit.replace('"', "'") in proc.stdout, proc.stdout
    assert "one of B, KB, MB, GB, TB (powers of 1024)" in proc.stdout, proc.stdout


def test_units_are_powers_of_1024():
    from msmemscope.pytest_plugin import parse_size

    assert parse_size("limit_memory", "24 MB") == 24 << 20
    assert parse_size("limit_memory", "1.5kb") == 1536
    assert parse_size("limit_memory", "2GB") == 2 << 30
    assert parse_size("limit_leaks", "10 B") == 10
    with pytest.raises(ValueError, match=r"limit_leaks\('1 MiB'\)"):
        parse_size("limit_leaks", "1 MiB")


CROSS_THREAD = '''
import queue, threading
import pytest

def handoff_planted(q, n, size):
    for _ in range(n):
        q.put(bytearray(size))
    q.put(None)

@pytest.mark.limit_leaks("1 MB")
def test_blocks_freed_by_another_thread():
    q = queue.Queue(maxsize=4)
    def drop():
        while q.get() is not None:
            pass  # the block's last reference dies here, on this thread
    t = threading.Thread(target=drop)
    t.start()
    handoff_planted(q, 200, 256 << 10)   # 50 MiB made here, freed there
    t.join()

kept = []

@pytest.mark.limit_leaks("1 MB")
def test_blocks_kept_by_another_thread():
    t = threading.Thread(target=lambda: kept.append([bytearray(1 << 20) for _ in range(3)]))
    t.start()
    t.join()
'''


def test_threads_freeing_each_others_blocks(tmp_path):
    # Freed on another thread: no leak, run after run; kept: the 3 MiB found.
    for _ in range(3):
        proc, _ = _pytest(tmp_path, "--msmemscope", "-rA", planted=CROSS_THREAD)
        out = proc.stdout
        assert "PASSED test_planted.py::test_blocks_freed_by_another_thread" in out, out
        assert "3.0MiB allocated during its call is still alive" in _section(out, "test_blocks_kept_by_another_thread")


PEAK_ACROSS_THREADS = "import threading\nimport pytest\n" + "".join('''
@pytest.mark.limit_memory("10 MB")
def test_peak_across_threads_%d():
    made = []
    a = threading.Thread(target=lambda: made.extend(bytearray(100000) for _ in range(200)))
    a.start()
    a.join()
    def drop():
        while made:
            made.pop()  # the last reference: freed on this thread
    b = threading.Thread(target=drop)
    b.start()
    b.join()
''' % i for i in range(4))


def test_peak_of_blocks_freed_by_a_later_thread(tmp_path):
    # 200 blocks of 100,001 bytes live together, whichever thread's chunks
    # the drain wrote first: each test's peak is 19.1 MiB (it was read as
    # one block's when the freeing thread's chunk came first).
    proc, _ = _pytest(tmp_path, "--msmemscope", "-rA", planted=PEAK_ACROSS_THREADS)
    out = proc.stdout
    assert "4 failed" in out, out
    for i in range(4):
        sec = _section(out, "test_peak_across_threads_%d" % i)
        assert "Test was limited to 10.0MiB but its peak was 19.1MiB" in sec, sec
