"""PyTorch's CUDA tensor blocks, from its caching allocator's own history.

The caching allocator makes no driver call per tensor: it hands out pieces
of the segments it holds (those are the HAL rows). What it hands out is in
its history (``torch.cuda.memory._record_memory_history``, read back with
``_snapshot()``). While the PyTorch collection is on, msmemscope keeps that
history recording (without stack traces, its cheap setting), reads it at
start, at every ``step()`` and at ``stop()``, and appends what it read to
``spool/cuda_history.bin``; the conversion merges those entries into the
rows by time, as PTA MALLOC/FREE rows on their device, and marks the HAL
blocks that are PyTorch's segments (spool/cudahist.go).

* A history the user turned on is left as it is, and read from where the
  last read stopped; one msmemscope turned on is cleared after each read,
  so it never grows past a step's entries.
* Each read compares the history with the allocator's state in the same
  snapshot: a block the history missed (entries lost while it was cleared,
  or dropped by a user's ``max_entries``) gets its MALLOC or FREE at the
  read's time, so the live bytes always match the allocator's.
* Blocks alive when the history started were allocated before collection:
  like host blocks allocated before ``start()``, they make no rows.
* ``backend:cudaMallocAsync`` keeps no history; its blocks are the driver's
  own ``cuMemAllocAsync`` blocks, made PTA blocks by the storages that name
  them, as host blocks are on the CPU.

msmemscope never starts CUDA itself (that would break DataLoader workers
forked later): the history starts when the program's first CUDA call does
(``torch.cuda._lazy_call``).

File: an 8-byte magic, then 40-byte little-endian entries: action (u8),
device ordinal (u8), 6 bytes of padding, the time as CLOCK_MONOTONIC ns
(u64), address, size and stream (u64 each).
"""

from __future__ import annotations

import os
import struct
import time
import warnings
from typing import Any, Dict, List, Optional, Set, Tuple

MAGIC = b"MSCUDAH1"
FILE = "cuda_history.bin"
ENTRY = struct.Struct("<BB6xQQQQ")

A_ALLOC, A_FREE, A_SEG_ALLOC, A_SEG_FREE, A_SEG_MAP, A_SEG_UNMAP = 1, 2, 3, 4, 5, 6
# The caching allocator's actions; memory_allocated() drops a block at its
# free_requested ("free" before PyTorch 2.1), not at free_completed.
_ACTIONS = {"alloc": A_ALLOC, "free_requested": A_FREE, "free": A_FREE, "segment_alloc": A_SEG_ALLOC,
            "segment_free": A_SEG_FREE, "segment_map": A_SEG_MAP, "segment_unmap": A_SEG_UNMAP}
MAX_ENTRIES = 1 << 22  # of a history msmemscope turned on: far more than a step makes


def _record(torch: Any, clear: bool) -> None:
    rec = torch.cuda.memory._record_memory_history
    try:
        rec("all", context=None, stacks="python", max_entries=MAX_ENTRIES, clear_history=clear)
    except TypeError:  # a PyTorch without clear_history: the entries' times tell the new ones
        rec("all", context=None, stacks="python", max_entries=MAX_ENTRIES)


def _active(snap: Dict[str, Any], devices: Optional[Set[int]]) -> Dict[Tuple[int, int], int]:
    """The blocks a snapshot holds allocated: (device, address) -> size."""
    out = {}
    for seg in snap.get("segments", []):
        dev = seg.get("device", 0)
        if devices is not None and dev not in devices:
            continue
        addr = seg.get("address", 0)
        for b in seg.get("blocks", []):
            a = b.get("address", addr)
            if b.get("state") == "active_allocated":
                out[(dev, a)] = b.get("size", 0)
            addr = a + b.get("size", 0)
    return out


class History:
    """One process's reading of the caching allocator's history."""

    def __init__(self, torch: Any, devices: Optional[Set[int]], path: Any, owned: Any) -> None:
        self.torch = torch
        self.owned = owned  # () -> a context in which the thread's work is msmemscope's own
        self.devices = devices  # CUDA ordinals to keep; None: every one
        self.path = path  # () -> the file to append to, or None
        self.on = False  # the history is recording and read
        self.closed = False
        self.mine = False  # msmemscope turned it on (and clears it)
        # Per device, the time of the last entry read and how many read
        # had it: a user's ring (max_entries) drops old entries, so a place
        # in it is not an index.
        self.seen: Dict[int, Tuple[int, int]] = {}
        self.live: Dict[Tuple[int, int], Optional[int]] = {}  # blocks the rows hold (None: before collection)

    def begin(self) -> None:
        cuda = self.torch.cuda
        try:
            if cuda.get_allocator_backend() != "native":
                return  # cudaMallocAsync: the driver's blocks are the tensors'
            cuda._lazy_call(self._start)
        except Exception:
            return

    def _start(self) -> None:
        # (Run by the program's first CUDA call, inside PyTorch's lazy init.)
        with self.owned():
            self._begin_now()

    def _begin_now(self) -> None:
        if self.closed or self.on:
            return
        torch = self.torch
        try:
            user = bool(torch._C._cuda_isHistoryEnabled())
        except Exception:
            user = False
        try:
            if not user:
                _record(torch, True)
                self.mine = True
            snap = torch.cuda.memory._snapshot()
        except Exception as e:  # an allocator or a PyTorch without history
            warnings.warn("msmemscope: PyTorch's CUDA allocator history is unavailable (%s): CUDA tensor "
                          "blocks make no PTA rows" % e, RuntimeWarning, stacklevel=2)
            return
        self.on = True
        self.live = {k: None for k in _active(snap, self.devices)}
        for d, trace in enumerate(snap.get("device_traces", [])):
            self._new(d, trace)  # already in the state: read as seen

    def read(self) -> None:
        """Appends the entries since the last read to the file."""
        if not self.on:
            return
        torch = self.torch
        try:
            snap = torch.cuda.memory._snapshot()
        except Exception:
            return
        if self.mine:
            try:
                _record(torch, True)
            except Exception:
                pass
        mono = time.monotonic_ns()
        off = time.time_ns() - mono  # history times are Unix microseconds
        out: List[bytes] = []
        pack = ENTRY.pack
        live = self.live
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
        for k in [k for k in live if k not in active]:
            size = live.pop(k)
            if size is not None:
                out.append(pack(A_FREE, k[0], mono, k[1], size, 0))
        for k, size in active.items():
            if k not in live:
                live[k] = size
                out.append(pack(A_ALLOC, k[0], mono, k[1], size, 0))
        if out:
            self._append(b"".join(out))

    def _new(self, dev: int, trace: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
        """The entries of trace not read before (its times never decrease)."""
        last, n = self.seen.get(dev, (-1, 0))
        i = len(trace)
        while i > 0 and trace[i - 1].get("time_us", 0) > last:
            i -= 1
        j = i  # trace[i:] is newer; before it, entries of time last
        while j > 0 and trace[j - 1].get("time_us", 0) == last:
            j -= 1
        i = min(i, j + n) if i - j >= n else i  # the first n of time last were read
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
        self.read()
        self.closed = True
        if self.on and self.mine:
            try:
                self.torch.cuda.memory._record_memory_history(None)
            except Exception:
                pass
        self.on = False


def wanted(cfg: Dict[str, Any]) -> Tuple[bool, Optional[Set[int]]]:
    """Whether the configuration records CUDA memory, and which ordinals
    (None: every one)."""
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
