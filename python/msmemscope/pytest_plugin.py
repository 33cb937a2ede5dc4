"""The msmemscope pytest plugin: memory per test, and limits that fail tests.

Registered through the package's ``pytest11`` entry point, so it is there
once msmemscope is pip-installed::

    pytest --msmemscope                      # a report of the largest allocators per test

    @pytest.mark.limit_memory("24 MB")       # fails when the call's peak exceeds 24 MiB
    @pytest.mark.limit_leaks("1 MB")         # fails when more than 1 MiB allocated in the call outlives it

Sizes are a number and a unit, B, KB, MB, GB or TB, in powers of 1024
(pytest-memray's units). Each test's call (the test function, not its
fixtures) is one measurement window of the library
(``msmemscope_window_begin``/``_end``): its peak is the highest sum of live
bytes of the blocks allocated during the call, its leaks the bytes of those
blocks still live when the call returns; blocks allocated before the call
and freed in it count for nothing. Host-heap events (malloc family,
anonymous mmap) need libmemscope.so preloaded: when it is not, the plugin
runs the same pytest command once more with it preloaded (a child process)
and exits with the child's status. The child's capture goes to a temporary
folder ``msmemscope-pytest-*`` (removed at the end) or to
``--msmemscope-dir``; the child writes no dump at exit. Processes the tests
start are not traced. Without ``--msmemscope`` the plugin only registers
its markers: nothing is collected and the markers are inert.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import Any, Dict, Generator, List, Optional, Tuple

import pytest

MARKERS = {
    "limit_memory": "limit_memory(limit): fail the test when the peak of the live bytes it allocated "
                    "during its call exceeds limit (e.g. \"24 MB\"; units B, KB, MB, GB, TB in powers "
                    "of 1024); active with --msmemscope",
    "limit_leaks": "limit_leaks(limit): fail the test when the bytes it allocated during its call and "
                   "still live when the call ends exceed limit (e.g. \"1 MB\"); active with --msmemscope",
}

# Set in the child the plugin starts with the library preloaded: its value is
# the capture folder; a second re-execution is never tried.
ENV_CHILD = "MSMEMSCOPE_PYTEST_CHILD"

_UNITS = {"B": 1, "KB": 1024, "MB": 1024 ** 2, "GB": 1024 ** 3, "TB": 1024 ** 4}
_PYTEST_FRAME = re.compile(r"[/\\](_pytest|pluggy)[/\\]")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]+)\s*$")


def parse_size(marker: str, value: Any) -> int:
    """Bytes of a marker's limit: a number and a unit (B, KB, MB, GB, TB,
    any case, powers of 1024), or an int of bytes. A bad value raises
    ValueError naming the marker, the value and the rule."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    m = _SIZE.match(value) if isinstance(value, str) else None
    if m is None or m.group(2).upper() not in _UNITS:
        raise ValueError('%s(%r): a limit is a number and a unit, one of B, KB, MB, GB, TB (powers of '
                         '1024), e.g. "24 MB"' % (marker, value))
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def sizeof_fmt(n: float) -> str:
    """n bytes in binary units, as pytest-memray prints them: 1.5MiB."""
    for unit in ("", "Ki", "Mi", "Gi", "Ti"):
        if abs(n) < 1024.0:
            return "%3.1f%sB" % (n, unit)
        n /= 1024.0
    return "%.1fPiB" % n


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("msmemscope", "memory per test (msmemscope)")
    group.addoption("--msmemscope", action="store_true", default=False,
                    help="measure each test's memory (peak and leaks by site), report the largest "
                         "and enforce limit_memory / limit_leaks markers")
    group.addoption("--msmemscope-most", type=int, default=5, metavar="N",
                    help="tests shown in the report, largest peak first (0: all; default 5)")
    group.addoption("--msmemscope-top", type=int, default=5, metavar="N",
                    help="sites shown per test and per failure (default 5)")
    group.addoption("--msmemscope-dir", default=None, metavar="DIR",
                    help="keep the capture in DIR (default: a temporary folder, removed at the end)")


def pytest_configure(config: pytest.Config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", "%s: %s" % (name, text))
    if not config.getoption("msmemscope"):
        return
    for opt in ("msmemscope_most", "msmemscope_top"):
        if config.getoption(opt) < 0:
            raise pytest.UsageError("--%s=%d: must be 0 or more" % (opt.replace("_", "-"), config.getoption(opt)))
    from . import _lib

    if _lib.mapped_path() is None:
        _reexec(config)  # does not return
    _lib.get().msmemscope_exit_files(0)
    _untrace_children()
    config.pluginmanager.register(Plugin(config), "msmemscope-measure")


def _untrace_children() -> None:
    """Processes the tests start are not traced: the child's own preload
    variables are put back as they were before the plugin set them."""
    old = os.environ.pop("MSMEMSCOPE_PYTEST_OLD_PRELOAD", None)
    if old:
        os.environ["LD_PRELOAD"] = old
    else:
        os.environ.pop("LD_PRELOAD", None)
    for k in ("MSMEMSCOPE_CONFIG", "MSMEMSCOPE_HOOK"):
        os.environ.pop(k, None)


def _reexec(config: pytest.Config) -> None:
    """Runs this pytest command again with libmemscope.so preloaded, waits
    for it, removes its temporary capture folder and exits with its status."""
    from . import _lib

    if os.environ.get(ENV_CHILD):
        raise pytest.UsageError("--msmemscope: libmemscope.so is not mapped in the re-executed pytest "
                                "(LD_PRELOAD=%r): is the interpreter statically linked?"
                                % os.environ.get("LD_PRELOAD", ""))
    argv = list(getattr(sys, "orig_argv", []))
    if not argv or list(config.invocation_params.args) != sys.argv[1:]:
        raise pytest.UsageError("--msmemscope: pytest was started from inside a program (pytest.main), "
                                "which cannot be re-executed with libmemscope.so preloaded: run pytest "
                                "as a command, or under `python -m msmemscope run -m pytest`")
    keep = config.getoption("msmemscope_dir")
    if keep:
        root = os.path.abspath(keep)
        os.makedirs(root, exist_ok=True)
    else:
        root = tempfile.mkdtemp(prefix="msmemscope-pytest-")
    env = dict(os.environ)
    lib = _lib.shipped_path()
    old = env.get("LD_PRELOAD", "")
    env["LD_PRELOAD"] = lib + (":" + old if old else "")
    if old:
        env["MSMEMSCOPE_PYTEST_OLD_PRELOAD"] = old
    # The child's capture: the host heap with Python stacks (the sites),
    # no analyses, into root.
    env["MSMEMSCOPE_CONFIG"] = ('{"devices": ["cpu"], "events": {"alloc": true, "free": true}, '
                                '"python_stack": true, "python_stack_depth": 16, "analysis": [], '
                                '"output": %s}' % _json_str(root))
    env["MSMEMSCOPE_HOOK"] = "heap=1,cstack=0,deferred=0,rotate=0"
    env[ENV_CHILD] = root
    sys.stdout.flush()
    sys.stderr.flush()
    old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)  # the child gets it too, and ends
    try:
        rc = subprocess.call([sys.executable] + argv[1:], env=env)
    finally:
        signal.signal(signal.SIGINT, old_int)
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc if rc >= 0 else 128 - rc)


def _json_str(s: str) -> str:
    import json

    return json.dumps(s)


class Plugin:
    """The part registered with --msmemscope in a process with the library
    preloaded: one measurement window per test call."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.top: int = config.getoption("msmemscope_top")
        self.results: Dict[str, Dict[str, Any]] = {}

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        for m in item.iter_markers():
            if m.name in MARKERS:
                if len(m.args) != 1 or m.kwargs:
                    raise ValueError("%s%r: takes one limit, e.g. %s(\"24 MB\")" % (m.name, m.args, m.name))
                parse_size(m.name, m.args[0])

    @pytest.hookimpl(hookwrapper=True, trylast=True)  # the innermost wrapper: closest to the test
    def pytest_pyfunc_call(self, pyfuncitem: pytest.Function) -> Generator[None, Any, None]:
        from . import _lib

        _lib.call("msmemscope_window_begin")
        try:
            yield
        finally:
            self.results[pyfuncitem.nodeid] = _lib.call("msmemscope_window_end", self.top)["result"]

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
        outcome = yield
        report = outcome.get_result()
        res = self.results.get(item.nodeid)
        if call.when != "call" or report.outcome != "passed" or res is None:
            return
        problems: List[str] = []
        for m in item.iter_markers():
            if m.name == "limit_memory":
                limit = parse_size(m.name, m.args[0])
                if res["peak_bytes"] > limit:
                    problems.append(self._failure(
                        "Test was limited to %s but its peak was %s" % (sizeof_fmt(limit), sizeof_fmt(res["peak_bytes"])),
                        "Top sites at the peak", res["peak_sites"]))
            elif m.name == "limit_leaks":
                limit = parse_size(m.name, m.args[0])
                if res["leaked_bytes"] > limit:
                    problems.append(self._failure(
                        "Test was allowed to leak %s but %s allocated during its call is still alive (%d block%s)"
                        % (sizeof_fmt(limit), sizeof_fmt(res["leaked_bytes"]), res["leaked_blocks"],
                           "" if res["leaked_blocks"] == 1 else "s"),
                        "Top sites of the leaked bytes", res["leak_sites"]))
        if problems:
            report.outcome = "failed"
            report.longrepr = "\n\n".join(problems)
            report.sections.append(("msmemscope", "memory limits exceeded"))

    def _failure(self, head: str, title: str, sites: List[Dict[str, Any]]) -> str:
        lines = [head, title + ":"]
        for s in sites[: self.top]:
            lines.append("    - %s in %d block%s allocated here:" % (sizeof_fmt(s["size"]), s["count"],
                                                                    "" if s["count"] == 1 else "s"))
            # pytest's and pluggy's frames below the test say nothing.
            stack = [f for f in s["stack"] if not _PYTEST_FRAME.search(f)] or s["stack"] or [
                "%s(%s)" % (s["site"], s["function"] or "???")]
            for fr in stack[:5]:
                lines.append("        " + _frame(fr))
        return "\n".join(lines)

    @pytest.hookimpl(hookwrapper=True, trylast=True)
    def pytest_report_teststatus(self, report: pytest.TestReport) -> Generator[None, Any, None]:
        outcome = yield
        if report.when == "call" and report.outcome == "failed" and any(
                name == "msmemscope" for name, _ in report.sections):
            outcome.force_result(("failed", "M", "MEMORY PROBLEMS"))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        tr = terminalreporter
        tr.write_line("")
        tr.write_sep("=", "MSMEMSCOPE REPORT")
        most = self.config.getoption("msmemscope_most")
        ranked: List[Tuple[str, Dict[str, Any]]] = sorted(self.results.items(), key=lambda kv: -kv[1]["peak_bytes"])
        if most:
            ranked = ranked[:most]
        for nodeid, r in ranked:
            tr.write_line("Allocation results for %s at the high watermark" % nodeid)
            tr.write_line("")
            tr.write_line("\t Peak memory: %s" % sizeof_fmt(r["peak_bytes"]))
            tr.write_line("\t Allocations: %d (%s in all)" % (r["allocations"], sizeof_fmt(r["allocated_bytes"])))
            tr.write_line("\t Still live when the call ended: %s" % sizeof_fmt(r["leaked_bytes"]))
            tr.write_line("\t Biggest allocating functions:")
            for s in r["peak_sites"]:
                tr.write_line("\t\t- %s:%s -> %s" % (s["function"] or "???", s["site"], sizeof_fmt(s["size"])))
            tr.write_line("")
        keep = self.config.getoption("msmemscope_dir")
        if keep:
            tr.write_line("The capture is in %s" % os.path.abspath(keep))


def _frame(fr: str) -> str:
    """A stack frame "file:line(function)" as "function:file:line"."""
    m = re.match(r"^(.*)\((.*)\)$", fr)
    return "%s:%s" % (m.group(2), m.group(1)) if m else fr
