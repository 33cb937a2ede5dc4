"""Helpers: run a script traced (``python -m msmemscope run``) or alone, in
a fresh folder, and read what it wrote.

The tests exercise the installed package (``pip install .`` into the
Makefile's virtual environment): scripts run with this interpreter, from a
temporary folder, so the source tree is not on their path.
"""
import csv
import glob
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

PY = sys.executable
REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def _env():
    env = dict(os.environ)
    for k in ("PYTHONPATH", "LD_PRELOAD", "MSMEMSCOPE_CONFIG", "MSMEMSCOPE_RUN_ID", "MSMEMSCOPE_HOOK"):
        env.pop(k, None)
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Run:
    def __init__(self, proc, out):
        self.proc, self.out = proc, out
        self.stdout, self.stderr, self.rc = proc.stdout, proc.stderr, proc.returncode

    def folders(self):
        return sorted(glob.glob(os.path.join(self.out, "msmemscope_*")))

    def main_folder(self):
        mans = glob.glob(os.path.join(self.out, "run_*.json"))
        if mans:
            with open(mans[0]) as f:
                man = json.load(f)
            for p in man["processes"]:
                if p.get("main"):
                    return p["folder"]
        fs = self.folders()
        assert len(fs) == 1, fs
        return fs[0]

    def dumps(self, folder=None):
        return sorted(glob.glob(os.path.join(folder or self.main_folder(), "dump", "memscope_dump_*.csv")))

    def rows(self, path=None):
        path = path or self.dumps()[-1]
        with open(path, newline="") as f:
            return list(csv.DictReader(f))

    def traces(self, folder=None):
        return sorted(glob.glob(os.path.join(folder or self.main_folder(), "dump", "python_trace_*.csv")))

    def check(self):
        assert self.rc == 0, "exit %d\nstdout:\n%s\nstderr:\n%s" % (self.rc, self.stdout[-4000:], self.stderr[-4000:])
        return self


def _write(tmp_path, script):
    p = tmp_path / "prog.py"
    p.write_text(textwrap.dedent(script))
    return p


def run_traced(tmp_path, script, *opts, args=(), timeout=300):
    """Runs script under ``python -m msmemscope run [opts]``."""
    p = _write(tmp_path, script)
    out = tmp_path / "out"
    cmd = [PY, "-m", "msmemscope", "run", "--output=%s" % out] + list(opts) + [str(p)] + list(args)
    proc = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=timeout)
    return Run(proc, str(out))


def run_plain(tmp_path, script, timeout=300):
    """Runs script with the interpreter alone (no CLI, nothing preloaded)."""
    p = _write(tmp_path, script)
    proc = subprocess.run([PY, str(p)], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=timeout)
    return Run(proc, str(tmp_path / "out"))


def attr(row):
    """The Attr column as a dict."""
    s = row["Attr"].strip("{}")
    out = {}
    for kv in s.split(","):
        if kv:
            k, _, v = kv.partition(":")
            out[k] = v
    return out


def line_of(script, marker):
    """The 1-based line of the dedented script that holds marker."""
    for i, l in enumerate(textwrap.dedent(script).splitlines(), 1):
        if marker in l:
            return i
    raise AssertionError(marker)


def malloc_of_size(rows, size):
    return [r for r in rows if r["Event"] == "MALLOC" and attr(r).get("size") == str(size)]


@pytest.fixture
def torch_available():
    try:
        import importlib.util
        if importlib.util.find_spec("torch") is None:
            pytest.skip("torch is not installed")
    except ImportError:
        pytest.skip("torch is not installed")


FRAME = re.compile(r"^(.*):(\d+)\((.*)\)$")


def frames(stack):
    """Python stack column -> [(file, line, function)], innermost first."""
    if stack == "N/A":
        return []
    out = []
    for f in stack.split(";"):
        m = FRAME.match(f)
        assert m, f
        out.append((m.group(1), int(m.group(2)), m.group(3)))
    return out
