"""``import mstx``: msMemScope's mstx marking API under its own name.

The same functions as :mod:`msmemscope.mstx` (one implementation)::

    import mstx
    mstx.mark("checkpoint")
    rid = mstx.range_start("step start")
    ...
    mstx.range_end(rid)
"""

from msmemscope.mstx import mark, range_end, range_start

__all__ = ["mark", "range_start", "range_end"]
