"""PyTorch collection: ACCESS, OP_LAUNCH, PTA and SNAPSHOT rows, watch, owners.

While collection is on (``msmemscope.start()`` with torch imported, or
``enable()``), this module keeps, on the thread that started it:

* a ``TorchDispatchMode`` that records every aten operator the dispatcher
  runs (forward, backward and optimizer operators) as an ATEN_START /
  ATEN_END pair, with one line per tensor argument: READ for inputs at the
  start, WRITE for outputs and arguments the schema marks as written at the
  end. Each line names the tensor's storage address, so the capture tells
  tensor blocks (PTA) from other heap blocks and finds the block an ACCESS
  touches (views resolve to their base storage);
* owner tags for decompose: ``weight`` (parameters of modules that run and
  of optimizers that step), ``gradient`` (their ``.grad`` before the step),
  ``optimizer_state`` (every tensor in the optimizer's state, Adam's
  ``step`` included), ``activation`` (tensors saved for backward). Blocks
  made inside an operator and not tagged otherwise are ``aten``;
* SNAPSHOT rows at start, stop and every ``step()``;
* the watch of ``config(watch=...)``: after every launch between ``start``
  and ``end`` the watched blocks are hashed (64-bit, in the library), or
  dumped with ``full-content``, and a change is reported with the launch
  that made it.

Everything is sent to the library as records (msmemscope_torch_event); the
rows are made when the files are written (spool/torch.go).
"""

from __future__ import annotations

import ctypes
import itertools
import os
import re
import sys
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import _lib
from . import _cuda_history
from ._records import R_OP_START, R_OP_END, R_SNAPSHOT, R_WATCH, R_TAG


_owned = _lib.owned  # msmemscope's own work: no rows


__all__ = ["enable", "disable", "enabled", "watch", "tag", "snapshot"]

_state: Optional[_State] = None  # while enabled
# Hooks disabled from another thread than theirs: a thread's dispatch mode and
# saved-tensor hooks can be left only on it, so they stay in, passing
# everything through, until that thread enables or disables again.
_stale: List[_State] = []
_launches = itertools.count(1)
_glock = threading.Lock()
_global_hooks: Optional[List[Any]] = None  # handles of the global module/optimizer hooks
_explicit_watch: List[Tuple[str, Any]] = []  # [(name, tensor)] from watch()


def _fn() -> Callable[[int, int, bytes, int], int]:
    return _lib.get().msmemscope_torch_event


def _emit(kind: int, a: int, text: str) -> None:
    b = text.encode("utf-8", "replace")
    _fn()(kind, a, b, len(b))


def _storage_ptr(t: Any) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except Exception:  # sparse, meta, wrapper subclasses: no plain storage
        return 0


def tag(tensor: Any, category: str) -> None:
    """Tags the block of a tensor with an owner category (weight, gradient,
    optimizer_state, activation); the highest-ranked category wins."""
    p = _storage_ptr(tensor)
    if p:
        _emit(R_TAG, p, category)


# ---- host and device snapshots ----
_mallinfo2: Any = None  # mallinfo2, or False where libc has none


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def _heap_bytes() -> Optional[int]:
    global _mallinfo2
    if _mallinfo2 is None:
        try:
            f = ctypes.CDLL(None).mallinfo2
            f.restype = _MallInfo2
            _mallinfo2 = f
        except (AttributeError, OSError):
            _mallinfo2 = False
    if not _mallinfo2:
        return None
    mi = _mallinfo2()
    return mi.uordblks + mi.hblkhd  # in use from the arenas, plus mmapped chunks


def snapshot() -> None:
    """Records a SNAPSHOT row: host rss and heap; torch.cuda stats when CUDA
    is present."""
    if _lib.in_child():
        return
    st = _state
    if st is not None and st.history is not None:
        with _owned():
            st.history.step()  # the CUDA tensor blocks since the last snapshot
    attrs = []
    try:
        with open("/proc/self/statm") as f:
            attrs.append("rss:%d" % (int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")))
    except (OSError, ValueError, IndexError):
        pass
    h = _heap_bytes()
    if h is not None:
        attrs.append("heap:%d" % h)
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                free, total = torch.cuda.mem_get_info()
                st = torch.cuda.memory_stats()
                reserved, allocated = st.get("reserved_bytes.all.current", 0), st.get("allocated_bytes.all.current", 0)
                attrs += ["total_mem:%d" % total, "free_mem:%d" % free, "reserved:%d" % reserved,
                          "peak_reserved:%d" % st.get("reserved_bytes.all.peak", 0), "allocated:%d" % allocated,
                          "peak_allocated:%d" % st.get("allocated_bytes.all.peak", 0),
                          "device_utilization:%.4f" % ((total - free) / total if total else 0),
                          "pt_utilization:%.4f" % (allocated / reserved if reserved else 0)]
        except Exception:
            pass
    _emit(R_SNAPSHOT, 0, ",".join(attrs))


# ---- operator descriptions ----
_DTYPES: Dict[Any, str] = {}


def _dtype(dt: Any) -> str:
    s = _DTYPES.get(dt)
    if s is None:
        s = _DTYPES[dt] = str(dt).replace("torch.", "")
    return s


def _format(t: Any, torch: Any) -> str:
    if t.is_contiguous():
        return "ND"
    if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last):
        return "NHWC"
    if t.dim() == 5 and t.is_contiguous(memory_format=torch.channels_last_3d):
        return "NDHWC"
    return "strided"


class _Op:
    """What the recorder needs of an operator, computed once."""
    __slots__ = ("name", "written_pos", "written_kw", "out_tag", "call")

    def __init__(self, func: Any) -> None:
        s = func._schema
        # The C++ callable OpOverload.__call__ would call: what the operator
        # allocates then has the caller's Python stack, not a frame of
        # torch/_ops.py that only the mode adds. An operator with a Python
        # dispatcher keeps __call__.
        c = getattr(func, "_op", None)
        self.call = c if c is not None and getattr(func, "_pyobj_dispatcher", None) is None else func
        self.name = s.name if "::" in s.name else "aten::" + s.name
        # Factories that leave memory unwritten: their output is a tensor
        # block (PTA) but not an ACCESS.
        self.out_tag = "N" if self.name.startswith(("aten::empty", "aten::new_empty")) else "W"
        self.written_pos: List[int] = []
        self.written_kw: List[str] = []
        for i, a in enumerate(s.arguments):
            if a.alias_info is not None and a.alias_info.is_write:
                if a.kwarg_only:
                    self.written_kw.append(a.name)
                else:
                    self.written_pos.append(i)
                    self.written_kw.append(a.name)


def _tensors(x: Any, Tensor: type, out: List[Any]) -> List[Any]:
    if isinstance(x, Tensor):
        out.append(x)
    elif isinstance(x, (list, tuple)):
        for y in x:
            if isinstance(y, Tensor):
                out.append(y)
    return out


class _State:
    def __init__(self, cfg: Dict[str, Any]) -> None:
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        self.torch = torch
        self.thread = threading.current_thread()  # (not its ident: one may be reused once it ends)
        ev = cfg.get("events", {})
        self.access = bool(ev.get("access"))
        self.ops: Dict[Any, _Op] = {}
        self.watch_cfg = cfg.get("watch") or None
        self.watch = _Watch(self.watch_cfg) if self.watch_cfg else None
        self.history: Optional[_cuda_history.History] = None
        cuda, ordinals = _cuda_history.wanted(cfg)
        if cuda and ev.get("alloc", True):
            with _owned():
                self.history = _cuda_history.History(torch, ordinals, _history_file, _owned)
                self.history.begin()
        state = self
        Tensor = torch.Tensor
        fmt = _format
        emit = _fn()
        ops = self.ops

        def line(tag: str, t: Any) -> Optional[str]:
            try:
                sp = t.untyped_storage().data_ptr()
            except Exception:
                return None
            if not state.access:
                # Without ACCESS rows a line only names the storage (a
                # tensor block, an operator's input or output): "N", seen,
                # makes no ACCESS row, and the tensor's other fields are
                # not read. (config() may turn access on meanwhile.)
                return "N %x 0 0 - [] -" % sp
            return "%s %x %x %d %s [%s] %s" % (tag, sp, t.data_ptr(), t.numel() * t.element_size(), _dtype(t.dtype),
                                              "x".join(map(str, t.shape)), fmt(t, torch))

        def lines(tag: str, ts: List[Any]) -> List[str]:
            out = []
            for t in ts:
                ln = line(tag, t)
                if ln:
                    out.append(ln)
            return out

        # The hot calls without ctypes' argument types (_lib.untyped): own(on)
        # and op_emit(kind, n, text, len), the record then own(0).
        own, op_emit_int = _lib.untyped("msmemscope_own"), _lib.untyped("msmemscope_torch_op")

        def op_emit(kind: int, n: int, text: bytes, size: int) -> None:
            if n < 0x80000000:
                op_emit_int(kind, n, text, size)
            else:  # past a C int: the typed call, a uint64
                emit(kind, n, text, size)
                own(0)

        class Mode(TorchDispatchMode):
            # What the hook allocates itself is msmemscope's own (tracked,
            # no rows); only the operator's call is the program's. (own()
            # by hand, not _owned(): a context manager per operator costs.)
            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                if _state is not state:  # disabled from another thread (_stale)
                    return func(*args, **(kwargs or {}))
                own(1)
                try:
                    kwargs = kwargs or {}
                    op = ops.get(func)
                    if op is None:
                        op = ops[func] = _Op(func)
                    n = next(_launches)
                    ins: List[Any] = []
                    for a in args:
                        _tensors(a, Tensor, ins)
                    for a in kwargs.values():
                        _tensors(a, Tensor, ins)
                    text = "\n".join([op.name] + lines("R", ins)).encode()
                    op_emit(R_OP_START, n, text, len(text))  # and own(0)
                except BaseException:  # (own(0) once more after op_emit: harmless, own stays >= 0)
                    own(0)
                    raise
                out = op.call(*args, **kwargs)
                own(1)
                try:
                    outs = _tensors(out, Tensor, [])
                    if op.written_kw:
                        muts: List[Any] = []
                        for i in op.written_pos:
                            if i < len(args):
                                _tensors(args[i], Tensor, muts)
                        for k in op.written_kw:
                            if k in kwargs:
                                _tensors(kwargs[k], Tensor, muts)
                        # an in-place operator returns self: one WRITE
                        outs += [t for t in muts if not any(t is o for o in outs)]
                    text = "\n".join([op.name] + lines(op.out_tag, outs)).encode()
                    op_emit(R_OP_END, n, text, len(text))  # and own(0)
                except BaseException:
                    own(0)
                    raise
                watch = state.watch  # (read once: config() on another thread may replace it)
                if watch is not None or state.history is not None and n % _cuda_history.READ_EVERY == 0:
                    own(1)
                    try:
                        if watch is not None:
                            watch.after(n, op.name, outs)
                        if state.history is not None:
                            state.history.launched(n)
                    finally:
                        own(0)
                return out

        with _owned():
            self.mode = Mode()
            # torch wraps a mode's __torch_dispatch__ so that its first call
            # imports torch._dynamo: some 900 modules and half a million
            # blocks, which would be the program's first operator's rows.
            # Imported here they are msmemscope's own.
            if getattr(Mode.__torch_dispatch__, "__wrapped__", None) is not None:
                try:
                    import torch._dynamo  # noqa: F401
                except Exception:
                    pass

        def pack(t: Any) -> Any:
            if _state is not state:
                return t
            own(1)
            try:
                p = t.untyped_storage().data_ptr()
                if p:
                    emit(R_TAG, p, b"activation", 10)
            except Exception:
                pass
            finally:
                own(0)
            return t

        with _owned():
            self.saved = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)

    # Entering and leaving the hooks is msmemscope's own work too (torch's
    # mode stack and saved-tensor hooks allocate).
    def enter(self) -> None:
        with _owned():
            self.saved.__enter__()
            self.mode.__enter__()

    def exit(self) -> None:
        with _owned():
            try:
                self.mode.__exit__(None, None, None)
            finally:
                self.saved.__exit__(None, None, None)
            if self.watch is not None:
                self.watch.finish()


def _history_file() -> Optional[str]:
    d = _lib.capture_dir()
    return os.path.join(d, "spool", _cuda_history.FILE) if d else None


# ---- watch ----
_NTH = re.compile(r"^(.*)#(\d+)$")


def _name_nth(s: Optional[str]) -> Tuple[Optional[str], int]:
    m = _NTH.match(s or "")
    if m:
        return m.group(1), int(m.group(2))
    return s, 1


def _base(name: str) -> str:
    return name.split(".", 1)[0] if name.count("::") == 1 else name


def _host_storage(t: Any) -> Any:
    """The tensor's block, readable here: a device's is copied to the host
    (its address is not one the CPU can read)."""
    st = t.untyped_storage()
    return st if st.device.type == "cpu" else st.cpu()


class _Watch:
    def __init__(self, w: Dict[str, Any]) -> None:
        self.start, self.start_nth = _name_nth(w.get("start"))
        self.end, self.end_nth = _name_nth(w.get("end"))
        self.out = w.get("start_out", -1)
        self.full = bool(w.get("full_content"))
        self.seen_start = self.seen_end = 0
        self.on = False
        self.done = False
        self.watched: List[List[Any]] = []  # [name, tensor, hash, changed]
        self.dir: Optional[str] = None

    def _hash(self, t: Any) -> int:
        st = _host_storage(t)
        return _lib.get().msmemscope_hash64(st.data_ptr(), st.nbytes())

    def _dump(self, n: int, name: str, t: Any) -> None:
        # Asked each time: config(output=...) may have moved the capture.
        self.dir = os.path.join(_lib.capture_dir() or ".", "watch_dump")
        os.makedirs(self.dir, mode=0o750, exist_ok=True)
        st = _host_storage(t)
        data = ctypes.string_at(st.data_ptr(), st.nbytes())
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
        fd = os.open(os.path.join(self.dir, "%d_%s.bin" % (n, safe)), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
        with os.fdopen(fd, "wb") as f:
            f.write(data)

    def _begin(self, n: int, opname: str, outs: List[Any]) -> None:
        self.on = True
        if self.start:
            sel = outs if self.out < 0 else outs[self.out:self.out + 1]
            for i, t in enumerate(sel):
                self.watched.append(["%s:out%d" % (self.start, i if self.out < 0 else self.out), t, 0, False])
        for name, t in _explicit_watch:  # for this window only
            self.watched.append([name, t, 0, False])
        _explicit_watch.clear()
        for w in self.watched:
            w[2] = self._hash(w[1])
            _emit(R_WATCH, n, "watch %s %016x %016x" % (w[0], w[2], w[2]))
            if self.full:
                self._dump(n, w[0], w[1])

    def after(self, n: int, opname: str, outs: List[Any]) -> None:
        if self.done:
            return
        base = _base(opname)
        if not self.on:
            if self.start:
                if base == self.start or opname == self.start:
                    self.seen_start += 1
                    if self.seen_start == self.start_nth:
                        self._begin(n, opname, outs)
                return
            self._begin(n, opname, outs)
        else:
            for w in self.watched:
                h = self._hash(w[1])
                if h != w[2]:
                    _emit(R_WATCH, n, "changed %s %016x %016x" % (w[0], w[2], h))
                    w[2], w[3] = h, True
                if self.full:
                    self._dump(n, w[0], w[1])
        if base == self.end or opname == self.end:
            self.seen_end += 1
            if self.seen_end >= self.end_nth:
                self.finish(n)

    def finish(self, n: int = 0) -> None:
        if self.done:
            return
        self.done = True
        for w in self.watched:
            if not w[3]:
                _emit(R_WATCH, n, "unchanged %s %016x %016x" % (w[0], w[2], w[2]))
        self.watched = []


def watch(tensor: Any, name: Optional[str] = None) -> None:
    """Adds a tensor to the watched memory of the next watch
    window (config(watch=...)): its block is hashed after every launch of
    that window; a later window watches it again only if given again."""
    name = name or "tensor%d" % len(_explicit_watch)
    if any(c in name for c in ",{}\n "):
        raise ValueError("watch name must not contain spaces, ',', '{' or '}': %r" % name)
    _explicit_watch.append((name, tensor))


# ---- global hooks: parameters, gradients, optimizer state ----
def _install_global_hooks() -> None:
    global _global_hooks
    if _global_hooks is not None:
        return
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    def on_module(module: Any, inputs: Any) -> None:
        if _state is not None and threading.current_thread() is _state.thread:
            for p in module.parameters(recurse=False):
                tag(p, "weight")

    def pre_step(opt: Any, args: Any, kwargs: Any) -> None:
        if _state is None:
            return
        for g in opt.param_groups:
            for p in g["params"]:
                tag(p, "weight")
                if p.grad is not None:
                    tag(p.grad, "gradient")

    def post_step(opt: Any, args: Any, kwargs: Any) -> None:
        if _state is None:
            return
        for st in opt.state.values():
            for v in st.values():
                if isinstance(v, torch.Tensor):
                    tag(v, "optimizer_state")

    _global_hooks = [torch.nn.modules.module.register_module_forward_pre_hook(on_module),
                     register_optimizer_step_pre_hook(pre_step), register_optimizer_step_post_hook(post_step)]


def enabled() -> bool:
    return _state is not None


def reconfigured(cfg: Dict[str, Any]) -> None:
    """config() changed the options: the hooks now on follow access and
    watch (a new watch starts over; the one it replaces ends as stop() ends
    it). Under the CLI the hooks start as torch is imported, before the
    script's config(watch=...) comes."""
    st = _state
    if st is None:
        return
    st.access = bool(cfg.get("events", {}).get("access"))
    w = cfg.get("watch") or None
    if w != st.watch_cfg:
        old = st.watch
        st.watch_cfg = w
        st.watch = _Watch(w) if w else None
        if old is not None:
            with _owned():
                old.finish()


def enable(cfg: Optional[Dict[str, Any]] = None) -> None:
    """Starts the PyTorch collection on this thread (start() does this when
    torch is imported and level=op)."""
    global _state
    with _glock:
        if _state is not None or _lib.in_child():
            return
        _leave_stale()
        if cfg is None:
            cfg = _lib.effective_config()
        _skip_glue_frames()
        _install_global_hooks()
        st = _State(cfg)
        st.enter()
        _state = st
    snapshot()


# torch's files whose frames only the mode puts on a stack: the wrappers of
# __torch_dispatch__, the mode machinery, OpOverload.__call__. Left out of
# Python stacks like msmemscope's own package, so an allocation inside an
# operator keeps the stack of the code that called it.
_GLUE = (("_compile.py",), ("_dynamo", "eval_frame.py"), ("utils", "_python_dispatch.py"), ("_ops.py",))


def _skip_glue_frames() -> None:
    torch = sys.modules.get("torch")
    if torch is None or not getattr(torch, "__file__", None):
        return
    root = os.path.dirname(os.path.abspath(torch.__file__))
    for parts in _GLUE:
        _lib.get().msmemscope_python_package(os.path.join(root, *parts).encode())


def disable() -> None:
    """Stops the PyTorch collection (stop() does this)."""
    global _state
    with _glock:
        st, _state = _state, None
    if st is None:
        return
    snapshot()
    if st.history is not None:
        with _owned():
            st.history.close()
    if st.thread is threading.current_thread():
        st.exit()
    else:
        if st.watch is not None:  # its findings belong to this stop's files
            st.watch.finish()
        with _glock:
            _stale.append(st)
    with _glock:
        _leave_stale()


def _leave_stale() -> None:
    """Takes this thread's stale hooks out, the latest first (its modes are
    a stack), and forgets those of threads that ended (their modes ended
    with them). Called holding _glock."""
    me = threading.current_thread()
    for st in list(reversed(_stale)):
        if st.thread is me:
            _stale.remove(st)
            try:
                st.exit()
            except Exception:
                pass  # (torch's mode stack is not as the hooks left it: nothing more to take out)
        elif not st.thread.is_alive():
            _stale.remove(st)


def wanted(cfg: Dict[str, Any]) -> bool:
    """Whether the configuration asks for the PyTorch collection."""
    if "torch" not in sys.modules or cfg.get("level", "op") != "op":
        return False
    ev = cfg.get("events", {})
    # alloc alone needs it too: only the dispatcher names tensor storages,
    # which makes their blocks PTA rather than HOST rows.
    return bool(ev.get("alloc") or ev.get("launch") or ev.get("access") or cfg.get("watch")
                or "decompose" in (cfg.get("analysis") or []) or "inefficient" in (cfg.get("analysis") or []))
