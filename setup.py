"""Builds libmemscope.so (go build -buildmode=c-shared ./capi) and the
msmemscope CLI (go build ./cmd/msmemscope) into the package:

    msmemscope/lib/libmemscope.so   the library the package binds to when it is
                                    not preloaded, and that the CLI preloads
    msmemscope/bin/msmemscope       the CLI (python -m msmemscope run ...)
    msmemscope/VERSION              the version (internal/version/VERSION)

Needs Go (>= the go.mod version) and a C compiler; $GO names the go command.
Metadata lives in pyproject.toml.
"""
import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = os.path.dirname(os.path.abspath(__file__))
os.makedirs(os.path.join(ROOT, "build", "pip"), exist_ok=True)


class BuildGo(build_py):
    def run(self):
        super().run()
        go = os.environ.get("GO") or shutil.which("go") or "/usr/local/go/bin/go"
        pkg = os.path.join(self.build_lib, "msmemscope")
        lib = os.path.join(pkg, "lib", "libmemscope.so")
        cli = os.path.join(pkg, "bin", "msmemscope")
        env = dict(os.environ, CGO_ENABLED="1")
        for args, out in ((["-buildmode=c-shared"], lib), ([], cli)):
            os.makedirs(os.path.dirname(out), exist_ok=True)
            target = "./capi" if args else "./cmd/msmemscope"
            self.announce("go build %s -o %s %s" % (" ".join(args), out, target), level=2)
            subprocess.check_call([go, "build"] + args + ["-o", os.path.abspath(out), target],
                                  cwd=ROOT, env=env)
        shutil.copyfile(os.path.join(ROOT, "internal", "version", "VERSION"), os.path.join(pkg, "VERSION"))
        header = os.path.join(pkg, "lib", "libmemscope.h")
        if os.path.exists(header):
            os.remove(header)


class BinaryDistribution(Distribution):
    """The wheel holds native code: platform-specific, not pure."""

    def has_ext_modules(self):
        return True


# Build trees go under build/pip, apart from the Makefile's build/lib and build/bin.
setup(cmdclass={"build_py": BuildGo}, distclass=BinaryDistribution,
      options={"build": {"build_base": "build/pip"}, "egg_info": {"egg_base": "build/pip"}})
