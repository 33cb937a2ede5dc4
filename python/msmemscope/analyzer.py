"""The analyzer classes of msMemScope's offline API.

    from msmemscope.analyzer import LeaksAnalyzer, LeaksConfig
    LeaksAnalyzer().analyze(LeaksConfig(input_path="dump.csv", mstx_info="iter", start_index=0))

    from msmemscope.analyzer import InefficientAnalyzer, InefficientConfig
    InefficientAnalyzer().analyze(InefficientConfig(input_path="dump.db", mem_size=0,
        inefficient_type=["early_allocation", "late_deallocation", "temporary_idleness"],
        idle_threshold=100))

A config checks its values when it is made (TypeError or ValueError naming
the parameter); a parameter left None takes the library's default
(msmemscope.get_analyzer_config). The analysis itself runs in the Go
library, like msmemscope.check_leaks and msmemscope.check_inefficient, which
these classes call.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence, Union

from . import _lib, offline

__all__ = ["AnalysisConfig", "BaseAnalyzer", "LeaksConfig", "LeaksAnalyzer", "InefficientConfig",
           "InefficientAnalyzer"]

INEFFICIENT_TYPES = ("early_allocation", "late_deallocation", "temporary_idleness")


_int = _lib.int_arg


class AnalysisConfig:
    """What every analysis takes: the dump file to read."""

    def __init__(self, input_path: offline.PathLike):
        input_path = _lib.path_arg("input_path", input_path)
        self.input_path = input_path

    def kwargs(self) -> Dict[str, Any]:
        return dict(vars(self))

    def __repr__(self) -> str:
        return "%s(%s)" % (type(self).__name__, ", ".join("%s=%r" % kv for kv in vars(self).items()))


class BaseAnalyzer:
    """An analysis run over a config; analyze returns its result."""

    name: Optional[str] = None

    def analyze(self, config: AnalysisConfig) -> Any:
        raise NotImplementedError


class LeaksConfig(AnalysisConfig):
    """check_leaks' parameters: marks whose message is mstx_info, the
    start_index-th (from 0) being A; event_type narrows the blocks."""

    def __init__(self, input_path: offline.PathLike, mstx_info: str, start_index: int,
                 event_type: Optional[str] = None):
        super().__init__(input_path)
        if not isinstance(mstx_info, str):
            raise TypeError("mstx_info must be a str, got %s" % type(mstx_info).__name__)
        if not mstx_info.strip():
            raise ValueError("mstx_info must not be empty or blank")
        if _int("start_index", start_index) < 0:
            raise ValueError("start_index must be a non-negative integer, got %d" % start_index)
        if event_type is not None and not isinstance(event_type, str):
            raise TypeError("event_type must be a str or None, got %s" % type(event_type).__name__)
        self.mstx_info = mstx_info
        self.start_index = start_index
        self.event_type = event_type


class LeaksAnalyzer(BaseAnalyzer):
    """Leaks between mstx marks (msmemscope.check_leaks)."""

    name = "leaks"

    def analyze(self, config: AnalysisConfig) -> List[Dict[str, Any]]:
        if not isinstance(config, LeaksConfig):
            raise TypeError("LeaksAnalyzer.analyze needs a LeaksConfig, got %s" % type(config).__name__)
        return offline.analyze(self.name, **config.kwargs())


class InefficientConfig(AnalysisConfig):
    """check_inefficient's parameters."""

    def __init__(self, input_path: offline.PathLike, mem_size: Optional[int] = None,
                 inefficient_type: Union[str, Sequence[str], None] = None, idle_threshold: Optional[int] = None):
        super().__init__(input_path)
        if mem_size is None:
            mem_size = offline.default(InefficientAnalyzer.name, "mem_size")
        if idle_threshold is None:
            idle_threshold = offline.default(InefficientAnalyzer.name, "idle_threshold")
        if _int("mem_size", mem_size) < 0:
            raise ValueError("mem_size must be a non-negative integer, got %d" % mem_size)
        types: List[str]
        if inefficient_type is None:
            types = list(INEFFICIENT_TYPES)
        else:
            given = [inefficient_type] if isinstance(inefficient_type, str) else inefficient_type
            if not isinstance(given, (list, tuple)) or not given:
                raise ValueError("inefficient_type must be a non-empty list or a single type, among %s"
                                 % ", ".join(INEFFICIENT_TYPES))
            for t in given:
                if t not in INEFFICIENT_TYPES:
                    raise ValueError("invalid inefficient type %r: valid types are %s" % (t, ", ".join(INEFFICIENT_TYPES)))
            types = list(given)
        if _int("idle_threshold", idle_threshold) <= 0:
            raise ValueError("idle_threshold must be a positive integer, got %d" % idle_threshold)
        self.mem_size = mem_size
        self.inefficient_type = types
        self.idle_threshold = idle_threshold


class InefficientAnalyzer(BaseAnalyzer):
    """Inefficient memory (msmemscope.check_inefficient): results are added
    to the file's MALLOC rows."""

    name = "inefficient"

    def analyze(self, config: AnalysisConfig) -> Dict[str, Any]:
        if not isinstance(config, InefficientConfig):
            raise TypeError("InefficientAnalyzer.analyze needs an InefficientConfig, got %s" % type(config).__name__)
        return offline.analyze(self.name, **config.kwargs())
