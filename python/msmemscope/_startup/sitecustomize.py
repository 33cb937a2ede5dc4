"""msmemscope's Python startup hook.

The msmemscope CLI puts this folder first on PYTHONPATH of the program it
traces, so that a Python program gets what the options ask for without
importing msmemscope itself:

* when the program imports torch, the PyTorch collection (operators, tensor
  blocks as PTA rows, owners, watch) starts as if the script had called
  ``msmemscope.start()`` at that moment (in deferred mode it waits for the
  script's own ``start()``, as without the hook);
* with ``--events=traceback`` in immediate mode the Python trace starts now.

It then runs the ``sitecustomize`` the interpreter would have run without it
(the next one on ``sys.path``), and takes this folder off ``sys.path``.
Nothing else is imported until torch is: a program without torch pays for
this file only.
"""

import os
import sys


def _run_next_sitecustomize(here):
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    ours = sys.modules.pop("sitecustomize", None)
    try:
        import sitecustomize  # noqa: F401  (the user's or the distribution's)
    except ImportError as e:
        if getattr(e, "name", "sitecustomize") != "sitecustomize":
            _report_error()
    except Exception:
        _report_error()
    finally:
        # The import system takes this module back out of sys.modules
        # when this file ends: it must be there (the user's, if it loaded).
        if "sitecustomize" not in sys.modules and ours is not None:
            sys.modules["sitecustomize"] = ours


def _report_error():
    # As site.py words a failing sitecustomize.
    if sys.flags.verbose:
        sys.excepthook(*sys.exc_info())
    else:
        exc = sys.exc_info()[1]
        sys.stderr.write("Error in sitecustomize; set PYTHONVERBOSE for traceback:\n%s: %s\n"
                         % (type(exc).__name__, exc))


def _package():
    """msmemscope: the one already imported, else the copy this hook ships
    with (the CLI's own, loaded from its folder without putting that
    folder's neighbours on sys.path)."""
    m = sys.modules.get("msmemscope")
    if m is not None:
        return m
    import importlib.util
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location("msmemscope", os.path.join(pkg, "__init__.py"),
                                                  submodule_search_locations=[pkg])
    m = importlib.util.module_from_spec(spec)
    sys.modules["msmemscope"] = m
    try:
        spec.loader.exec_module(m)
    except BaseException:
        sys.modules.pop("msmemscope", None)
        raise
    return m


def _warn(text):
    if '"log_level":"error"' not in os.environ.get("MSMEMSCOPE_CONFIG", "").replace(" ", ""):
        sys.stderr.write(text)


def _torch_imported():
    try:
        _package()._startup_torch()
    except Exception as e:  # the program must run on whatever happens here
        _warn("msmemscope: warning: the PyTorch collection could not start: %s: %s\n"
                         % (type(e).__name__, e))


class _TorchWatch:
    """A meta path finder that lets the real finders find torch, then runs
    _torch_imported once torch's module has executed."""

    def __init__(self):
        self.busy = False

    def find_spec(self, name, path=None, target=None):
        if name != "torch" or self.busy:
            return None
        import importlib.util
        self.busy = True
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self.busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module):
            run(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            _torch_imported()

        loader.exec_module = exec_module
        return spec


def _install():
    here = os.path.dirname(os.path.abspath(__file__))
    _run_next_sitecustomize(here)
    if os.environ.get("MSMEMSCOPE_PY_STARTUP") != here or "libmemscope" not in os.environ.get("LD_PRELOAD", ""):
        return  # not a process the CLI traces (or a copy of the path found elsewhere)
    if '"traceback":true' in os.environ.get("MSMEMSCOPE_CONFIG", "").replace(" ", ""):
        try:
            _package()  # importing it starts the trace (msmemscope._auto)
        except Exception as e:
            _warn("msmemscope: warning: the Python trace could not start: %s: %s\n"
                             % (type(e).__name__, e))
    if "torch" in sys.modules:
        _torch_imported()
    else:
        sys.meta_path.insert(0, _TorchWatch())


# No annotations here: any interpreter the CLI runs reads this file (a
# Python 2 one too, which only gets the user's sitecustomize).
if sys.version_info[0] >= 3:
    _install()
else:
    _run_next_sitecustomize(os.path.dirname(os.path.abspath(__file__)))
