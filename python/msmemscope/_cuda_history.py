"""PyTorch's CUDA tensor blocks, from its caching allocator's own history.

The caching allocator makes no driver call per tensor: it hands out pieces
of the segments it holds (those are the HAL rows). What it hands out is in
its history (``torch.cuda.memory._record_memory_history``, read back with
``_snapshot()``). While the PyTorch collection is on, msmemscope keeps that
history recording (without stack traces, its cheap setting), reads it at
start, at every ``step()``, every 4,096 operator launches and at ``stop()``,
and appends what it read to ``spool/cuda_history.bin``; the conversion
merges those entries into the rows by time, as PTA MALLOC/FREE rows on
their device, and marks the HAL blocks that are PyTorch's segments
(spool/cudahist.go).

* Sizes are the sizes asked for (the history's, and the state's
  ``requested_size``), as a CPU tensor's block is: their sum is
  ``memory_stats()["requested_bytes.all.current"]`` (which PyTorch lowers
  later for a block another stream still used); ``memory_allocated()``
  counts the allocator's rounded blocks.
* A history msmemscope turned on is cleared after each read, so it never
  grows past a read's entries. One the program turns on (before or after
  msmemscope did) is the program's: msmemscope reads it only at ``stop()``
  (each read converts the whole history), never clears it, and takes its
  own back if the program turns it off.
* Each read compares the history with the allocator's state in the same
  snapshot: a block the history missed (entries lost between a read and its
  clearing, or dropped by a ring's ``max_entries``) gets its MALLOC or FREE
  at the read's time, so the live bytes always match the allocator's.
* Blocks alive when the history first started were allocated before
  collection: like host blocks allocated before ``start()``, they make no
  rows. Blocks of an earlier ``start()``...``stop()`` keep their rows: one
  freed in between gets its FREE at the next ``start()``.
* ``backend:cudaMallocAsync`` keeps no history; each of its blocks is a
  driver ``cuMemAllocAsync`` block, and a mark in the file makes those PTA
  blocks.

msmemscope never starts CUDA itself (that would break DataLoader workers
forked later): the history starts at ``start()`` if CUDA is up, else at the
program's first CUDA call (``torch.cuda._lazy_call``), and never in a
forked child.

File: an 8-byte magic, then 40-byte little-endian entries: action (u8),
device ordinal (u8), 6 bytes of padding, the time as CLOCK_MONOTONIC ns
(u64), address, size and stream (u64 each).
"""

from __future__ import annotations

import functools
import os
import struct
import threading
import time
import warnings
from typing import Any, Dict, List, Optional, Set, Tuple

from . import _lib

MAGIC = b"MSCUDAH1"
FILE = "cuda_history.bin"
ENTRY = struct.Struct("<BB6xQQQQ")

A_ALLOC, A_FREE, A_SEG_ALLOC, A_SEG_FREE, A_SEG_MAP, A_SEG_UNMAP, A_ASYNC = 1, 2, 3, 4, 5, 6, 7
# The caching allocator's actions; memory_allocated() drops a block at its
# free_requested ("free" before PyTorch 2.1), not at free_completed.
_ACTIONS = {"alloc": A_ALLOC, "free_requested": A_FREE, "free": A_FREE, "segment_alloc": A_SEG_ALLOC,
            "segment_free": A_SEG_FREE, "segment_map": A_SEG_MAP, "segment_unmap": A_SEG_UNMAP}
MAX_ENTRIES = 1 << 20  # of a history msmemscope turned on (~0.2 GB at most): reads come far sooner
READ_EVERY = 4096  # operator launches between reads of msmemscope's history

# Tensor blocks the rows hold, across start()/stop(): (device, address) ->
# requested size, or None for a block allocated before collection.
_live: Dict[Tuple[int, int], Optional[int]] = {}


def _active(snap: Dict[str, Any], devices: Optional[Set[int]]) -> Dict[Tuple[int, int], int]:
    """The blocks a snapshot holds allocated: (device, address) -> the size asked for."""
    out = {}
    for seg in snap.get("segments", []):
        dev = seg.get("device", 0)
        if devices is not None and dev not in devices:
            continue
        addr = seg.get("address", 0)
        for b in seg.get("blocks", []):
            a = b.get("address", addr)
            if b.get("state") == "active_allocated":
                out[(dev, a)] = b.get("requested_size", b.get("size", 0))
            addr = a + b.get("size", 0)
    return out


def _clock_offset() -> int:
    """CLOCK_REALTIME minus CLOCK_MONOTONIC, in ns: the Unix time read
    between two monotonic reads, at their middle, in the tightest of three
    tries (a thread switched out between reads would skew it)."""
    best = (1 << 62, 0)
    for _ in range(3):
        m0 = time.monotonic_ns()
        rt = time.time_ns()
        m1 = time.monotonic_ns()
        if m1 - m0 < best[0]:
            best = (m1 - m0, rt - (m0 + m1) // 2)
    return best[1]


class History:
    """One start()...stop()'s reading of the caching allocator's history."""

    def __init__(self, torch: Any, devices: Optional[Set[int]], path: Any, owned: Any) -> None:
        self.torch = torch
        self.devices = devices  # CUDA ordinals to keep; None: every one
        self.path = path  # () -> the file to append to, or None
        self.owned = owned  # () -> a context in which the thread's work is msmemscope's own
        self.on = False  # the history is recording and read
        self.closed = False
        self.mine = False  # msmemscope turned it on (and clears it)
        self.pid = os.getpid()  # a forked child reads nothing (its copy of the allocator is not the run's)
        # Reads come from the program's thread, autograd's device threads
        # (launched) and the program's own calls: one at a time.
        self.lock = threading.RLock()
        self.ours = False  # msmemscope's own call of _record_memory_history is under way
        self.wrapped: List[Tuple[str, Any]] = []  # (torch._C's name, its function), while wrapped
        # Per device, the time of the last entry read and how many read had
        # it: a ring (max_entries) drops old entries, so a place in it is
        # not an index.
        self.seen: Dict[int, Tuple[int, int]] = {}
        # Blocks the last read mended from the state, with its time: their
        # entries, older, may come in the next read (a program's history).
        self.mended: Dict[Tuple[int, int], int] = {}

    def begin(self) -> None:
        cuda = self.torch.cuda
        try:
            backend = cuda.get_allocator_backend()
        except Exception:
            return
        if backend == "cudaMallocAsync":  # no history: each driver block is a tensor's
            self._append(ENTRY.pack(A_ASYNC, 0, time.monotonic_ns(), 0, 0, 0))
            return
        if backend != "native":
            return
        try:
            cuda._lazy_call(self._start)
        except Exception:
            return

    def _here(self) -> bool:
        return os.getpid() == self.pid and self.on and not self.closed

    def _start(self) -> None:
        # Run by the program's first CUDA call, inside PyTorch's lazy init:
        # nothing may escape it (it would fail that call).
        try:
            if _lib.in_child() or os.getpid() != self.pid or self.closed or self.on:
                return
            with self.lock, self.owned():
                try:
                    self._begin_now()
                except BaseException:
                    if self.mine:  # not left recording with no one to read it
                        self._record(None)
                    self.mine = False
                    self._unwrap()
                    raise
        except Exception as e:
            try:
                warnings.warn("msmemscope: PyTorch's CUDA allocator history is unavailable (%s): CUDA "
                              "tensor blocks make no PTA rows" % e, RuntimeWarning, stacklevel=2)
            except Exception:  # warnings made errors
                pass

    def _record(self, enabled: Optional[str], clear: bool = True) -> None:
        """msmemscope's own setting of the history (enabled None: off)."""
        rec = self.torch.cuda.memory._record_memory_history
        self.ours = True
        try:
            if enabled is None:
                rec(None)
                return
            try:
                rec(enabled, context=None, stacks="python", max_entries=MAX_ENTRIES, clear_history=clear)
            except TypeError:  # a PyTorch without clear_history: the entries' times tell the new ones
                rec(enabled, context=None, stacks="python", max_entries=MAX_ENTRIES)
        finally:
            self.ours = False

    def _begin_now(self) -> None:
        torch = self.torch
        try:
            user = bool(torch._C._cuda_isHistoryEnabled())
        except Exception:
            user = False
        if not user:
            self._record("all")
            self.mine = True
        self._wrap()
        snap = torch.cuda.memory._snapshot()
        mono = time.monotonic_ns()
        active = _active(snap, self.devices)
        out = []
        for k in list(_live):
            size = _live[k]
            if size is not None and active.get(k) != size:  # freed (or replaced) while collection was off
                out.append(ENTRY.pack(A_FREE, k[0], mono, k[1], size, 0))
                self.mended[k] = mono
            if k not in active or size != active[k]:
                del _live[k]
        for k in active:
            if k not in _live:  # allocated before this start(): no rows
                _live[k] = None
        for d, trace in enumerate(snap.get("device_traces", [])):
            self._new(d, trace)  # already in the state: read as seen
        if out:
            self._append(b"".join(out))
        self.on = True

    def _wrap(self) -> None:
        """Notices the program setting the history itself, by whatever name
        it calls (torch.cuda.memory looks torch._C's functions up at each
        call): its history is the program's from then on; turned off, it
        gives way to msmemscope's again."""
        C, hist = self.torch._C, self
        for name, enabled_at in (("_cuda_record_memory_history", 10), ("_cuda_record_memory_history_legacy", 11)):
            orig = getattr(C, name, None)
            if orig is None or getattr(orig, "_msmemscope_orig", None) is not None:
                continue

            def wrapper(*args: Any, _orig: Any = orig, _cuda_at: int = enabled_at, **kwargs: Any) -> Any:
                if hist.ours or not hist._here():
                    return _orig(*args, **kwargs)
                with hist.lock:
                    with hist.owned():
                        hist._read()  # what was recorded under the settings before
                    r = _orig(*args, **kwargs)
                    # record_cuda (PyTorch 2.15's last argument): False leaves the device's history alone
                    cuda = kwargs.get("record_cuda", args[_cuda_at - 1] if len(args) == _cuda_at else True)
                    if cuda:
                        enabled = args[0] if args else kwargs.get("enabled")
                        if not enabled:  # the program turned it off: msmemscope keeps its own
                            with hist.owned():
                                hist._record("all")
                            hist.mine = True
                        else:
                            hist.mine = False
                    return r

            wrapper._msmemscope_orig = orig  # type: ignore[attr-defined]
            functools.update_wrapper(wrapper, orig)
            setattr(C, name, wrapper)
            self.wrapped.append((name, orig))

    def _unwrap(self) -> None:
        C = self.torch._C
        for name, orig in self.wrapped:
            if getattr(getattr(C, name, None), "_msmemscope_orig", None) is orig:
                setattr(C, name, orig)
        self.wrapped = []

    def launched(self, n: int) -> None:
        """After operator launch n: msmemscope's history is read every
        READ_EVERY launches, so that it stays small without step()."""
        if n % READ_EVERY == 0 and self.mine and self._here() and self.lock.acquire(blocking=False):
            try:
                self._read()
            finally:
                self.lock.release()

    def step(self) -> None:
        if not self.mine:
            return  # the program's history: read at stop() only (a read converts all of it)
        self.read()

    def read(self) -> None:
        """Appends the entries since the last read to the file."""
        with self.lock:
            self._read()

    def _read(self) -> None:
        if not self._here():
            return
        torch = self.torch
        try:
            snap = torch.cuda.memory._snapshot()
        except Exception:
            return
        if self.mine:
            try:
                self._record("all")
            except Exception:
                pass
        mono = time.monotonic_ns()
        # History times are Unix microseconds, the start of the microsecond
        # an event happened in: its end keeps it after the driver call (a
        # segment's HAL MALLOC) that came before it.
        off = _clock_offset() - 999
        out: List[bytes] = []
        pack = ENTRY.pack
        live, mended = _live, self.mended
        self.mended = {}
        for dev, trace in enumerate(snap.get("device_traces", [])):
            new = self._new(dev, trace)
            if self.devices is not None and dev not in self.devices:
                continue
            for e in new:
                a = _ACTIONS.get(e.get("action"))
                if a is None:
                    continue
                addr, size = e.get("addr", 0), e.get("size", 0)
                ns = max(0, e.get("time_us", 0) * 1000 - off)
                if mended and a <= A_FREE and ns <= mended.get((dev, addr), -1):
                    continue  # the state showed it already
                if a == A_ALLOC:
                    old = live.get((dev, addr))
                    if old is not None:  # its free was missed: it ended before this
                        out.append(pack(A_FREE, dev, ns, addr, old, 0))
                    live[(dev, addr)] = size
                elif a == A_FREE:
                    if (dev, addr) not in live or live.pop((dev, addr)) is None:
                        continue  # allocated before collection: no rows
                out.append(pack(a, dev, ns, addr, size, e.get("stream", 0)))
        # What the history missed, from the state now.
        active = _active(snap, self.devices)
        for k in [k for k, size in live.items() if active.get(k, -1) != size and size is not None or k not in active]:
            size = live.pop(k)
            if size is not None:  # freed, or freed and its address reused at another size
                out.append(pack(A_FREE, k[0], mono, k[1], size, 0))
                self.mended[k] = mono
        for k, size in active.items():
            if k not in live:
                live[k] = size
                out.append(pack(A_ALLOC, k[0], mono, k[1], size, 0))
                self.mended[k] = mono
        if out:
            self._append(b"".join(out))

    def _new(self, dev: int, trace: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
        """The entries of trace not read before (its times never decrease)."""
        last, n = self.seen.get(dev, (-1, 0))
        i = len(trace)
        while i > 0 and trace[i - 1].get("time_us", 0) > last:
            i -= 1
        j = i  # trace[i:] is newer; trace[j:i] has time last
        while j > 0 and trace[j - 1].get("time_us", 0) == last:
            j -= 1
        if i - j > n:  # the first n of time last were read
            i = j + n
        new = trace[i:]
        if new:
            t = new[-1].get("time_us", 0)
            k = sum(1 for e in new if e.get("time_us", 0) == t)
            self.seen[dev] = (t, k + (n if t == last else 0))
        return new

    def _append(self, data: bytes) -> None:
        path = self.path()
        if not path:
            return
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            new = not os.path.exists(path)
            with open(path, "ab") as f:
                f.write(MAGIC + data if new else data)
        except OSError as e:
            warnings.warn("msmemscope: cannot write %s: %s" % (path, e), RuntimeWarning, stacklevel=2)

    def close(self) -> None:
        """The last read; a history msmemscope turned on is turned off."""
        with self.lock:
            self._read()
            if self._here():
                self._unwrap()
                if self.mine:
                    try:
                        self._record(None)
                    except Exception:
                        pass
            self.closed = True
            self.on = False


def wanted(cfg: Dict[str, Any]) -> Tuple[bool, Optional[Set[int]]]:
    """Whether the configuration records CUDA tensor blocks, and on which
    ordinals (None: every one). Not with rotating logs: each log stands
    alone, and the history spans the run."""
    if cfg.get("log_mode") == "rotate":
        return False, None
    devs = cfg.get("devices") or ["cpu", "cuda"]
    ords: Set[int] = set()
    for d in devs:
        if d == "cuda":
            return True, None
        if d.startswith("cuda:"):
            try:
                ords.add(int(d[5:]))
            except ValueError:
                pass
    return bool(ords), ords or None
