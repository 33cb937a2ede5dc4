"""Owner tags: ``msmemscope.describe``.

Three forms:

* ``with msmemscope.describe(owner="loader"): ...`` — blocks this thread
  allocates inside get the tag (the dump writes HOST rows' owner as
  ``HOST@loader``);
* ``@msmemscope.describe(owner="loader")`` on a function — the same, for
  each call;
* ``msmemscope.describe(obj_or_address, owner="kv_cache")`` — tags the block
  at that address (a tensor's storage, a NumPy array's data, a writable
  buffer, or an int address). Recorded in the capture as a DESCRIBE record
  (address, owner) for the decompose analysis to apply.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any, Callable, Optional, TypeVar, cast

from . import _lib

__all__ = ["describe", "address_of"]

F = TypeVar("F", bound=Callable[..., Any])


def address_of(obj: Any) -> int:
    """The address of the memory block behind obj."""
    if isinstance(obj, bool):
        raise TypeError("describe() needs an object with memory or an int address, not bool")
    if isinstance(obj, int):
        if obj <= 0:
            raise ValueError("address must be positive")
        return obj
    st = getattr(obj, "untyped_storage", None)
    if callable(st):  # torch.Tensor
        return int(st().data_ptr())
    dp = getattr(obj, "data_ptr", None)
    if callable(dp):
        return int(dp())
    ai = getattr(obj, "__array_interface__", None)
    if isinstance(ai, dict) and "data" in ai:
        return int(ai["data"][0])
    try:
        mv = memoryview(obj)
    except TypeError:
        raise TypeError("describe() cannot find the memory of a %s object" % type(obj).__name__) from None
    with mv:
        if mv.readonly:
            raise TypeError("describe() cannot find the memory of a read-only %s" % type(obj).__name__)
        return ctypes.addressof(ctypes.c_char.from_buffer(mv))


def _owner(owner: Any) -> bytes:
    if not isinstance(owner, str) or not owner:
        raise ValueError("owner must be a non-empty str")
    if any(c in owner for c in ",{}\n\r"):
        raise ValueError('owner must not contain ",", "{", "}" or line breaks: %r' % owner)
    return owner.encode("utf-8")


class describe:
    """Tags memory with an owner: a context manager, a decorator, or
    ``describe(obj_or_address, owner=...)`` (see the module's doc)."""

    __slots__ = ("owner", "_b")

    def __init__(self, obj: Any = None, owner: Optional[str] = None):
        if owner is None and isinstance(obj, str):
            obj, owner = None, obj  # describe("loader") as a scope
        self._b = _owner(owner)
        self.owner = owner
        if obj is not None:
            _lib.get().msmemscope_describe(address_of(obj), self._b)

    def __enter__(self) -> "describe":
        _lib.get().msmemscope_describe_push(self._b)
        return self

    def __exit__(self, *exc: object) -> None:
        _lib.get().msmemscope_describe_pop()

    def __call__(self, fn: F) -> F:
        b = self._b
        lib = _lib.get()

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            lib.msmemscope_describe_push(b)
            try:
                return fn(*args, **kwargs)
            finally:
                lib.msmemscope_describe_pop()
        return cast(F, wrapper)
