"""Study ``weight-decay-low-rank`` (S1); notes: docs/studies/weight-decay-low-rank.md."""

from .runs import ToyRun as ToyRun
from .study import STUDY as STUDY
from .study import WeightDecayLowRankPreset as WeightDecayLowRankPreset
from .study import build_runs as build_runs

__all__ = ["STUDY", "ToyRun", "WeightDecayLowRankPreset", "build_runs"]
