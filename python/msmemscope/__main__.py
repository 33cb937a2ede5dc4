"""``python -m msmemscope``: run a Python program traced, or the CLI.

    python -m msmemscope run [msmemscope options] script.py [args...]
    python -m msmemscope run [msmemscope options] -m module [args...]
    python -m msmemscope [CLI arguments]      # --help, --version, --input=..., --compare ...

``run`` starts ``msmemscope [options] -- <this interpreter> script.py args``
with the CLI shipped in the package, which preloads the library, so host-heap
events, C and Python stacks are all collected; it exits with the program's
exit code.
"""

from __future__ import annotations

import os
import sys
from typing import List, Optional, Sequence

from . import _lib

USAGE = """usage: python -m msmemscope run [msmemscope options] script.py [args...]
       python -m msmemscope run [msmemscope options] -m module [args...]
       python -m msmemscope [msmemscope CLI arguments]   (see --help)
"""


def _exec(argv: List[str]) -> int:
    try:
        cli = _lib.cli_path()
    except OSError as e:
        sys.stderr.write("msmemscope: %s\n" % e)
        return 1
    env = dict(os.environ)
    if "MSMEMSCOPE_LIB" not in env:
        try:
            env["MSMEMSCOPE_LIB"] = _lib.shipped_path()
        except OSError:
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(cli, [cli] + argv, env)
    return 1  # not reached


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") and len(argv) == 1:
        sys.stdout.write(USAGE)
        if not argv:
            return 2
        return _exec(["--help"])
    if argv[0] != "run":
        return _exec(argv)
    args = argv[1:]
    opts = []
    while args and args[0].startswith("-") and args[0] not in ("-m", "--"):
        opts.append(args.pop(0))
    if args and args[0] == "--":
        args.pop(0)
    if not args:
        sys.stderr.write(USAGE)
        return 2
    missing = _missing(args)
    if missing:
        if opts and "=" not in opts[-1]:
            missing += " (options of run take the --name=value form: %s=%s?)" % (opts[-1], args[0])
        sys.stderr.write("msmemscope: %s\n" % missing)
        return 2
    return _exec(opts + ["--", sys.executable] + args)


def _missing(args: List[str]) -> Optional[str]:
    """Why the program cannot run (checked before anything is traced, so a
    typo leaves no capture behind), or None."""
    if args[0] == "-m":
        if len(args) < 2:
            return "run -m: a module name is required"
        import importlib.util
        top = args[1].partition(".")[0]  # a dotted name's parent would be imported here
        try:
            found = importlib.util.find_spec(top)
        except (ImportError, ValueError) as e:
            return "run -m %s: %s" % (args[1], e)
        if found is None:
            return "run -m %s: no module named %r on this interpreter's path" % (args[1], top)
        return None
    if args[0].startswith("-"):
        return None  # interpreter options after --: python itself checks them
    script = args[0]
    if not os.path.exists(script):
        return "run %s: no such file" % script
    if os.path.isdir(script) and not os.path.exists(os.path.join(script, "__main__.py")):
        return "run %s: a folder without __main__.py" % script
    return None


def cli() -> None:
    """The ``msmemscope`` console script: the shipped CLI."""
    sys.exit(_exec(sys.argv[1:]))


if __name__ == "__main__":
    sys.exit(main())
