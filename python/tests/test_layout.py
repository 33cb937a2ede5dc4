"""The CPython layouts libmemscope/pylayout.h holds for the Python stacks,
checked against the running interpreter's own headers (internal ones
included): every offset, and the str state bitfield's bit positions."""
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest

from conftest import REPO

SUPPORTED = [(3, 10), (3, 11), (3, 12), (3, 13)]


def test_pylayout_matches_headers(tmp_path):
    if sys.version_info[:2] not in SUPPORTED:
        pytest.skip("no layout for Python %d.%d (Python stacks are off there)" % sys.version_info[:2])
    if sysconfig.get_config_var("Py_GIL_DISABLED") or hasattr(sys, "gettotalrefcount"):
        pytest.skip("the layouts are the default build's (not free-threaded, not debug)")
    inc = sysconfig.get_paths()["include"]
    src = os.path.join(REPO, "libmemscope", "pylayout.h")
    if not os.path.exists(os.path.join(inc, "internal", "pycore_code.h")) or not shutil.which("gcc"):
        pytest.skip("no Python headers or no C compiler")
    if not os.path.exists(src):
        pytest.skip("no source tree")
    check = os.path.join(os.path.dirname(__file__), "layout_check.c")
    exe = str(tmp_path / "layout_check")
    subprocess.run(["gcc", "-I", inc, "-I", os.path.dirname(src), "-o", exe, check], check=True)
    out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout
    assert out.strip() != "missing", "pylayout.h has no entry for Python %d.%d" % sys.version_info[:2]
    rows = [line.split() for line in out.splitlines()]
    assert len(rows) >= 30, out
    wrong = ["%s: pylayout.h says %s, the headers %s" % (k, got, want) for k, got, want in rows if got != want]
    assert not wrong, "Python %d.%d: %s" % (sys.version_info[:2] + ("; ".join(wrong),))
