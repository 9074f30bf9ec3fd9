"""Study ``permuted-initialisations`` (S7); notes: docs/studies/permuted-initialisations.md."""

from .analysis import analyze as analyze
from .runs import PermutedInitRun as PermutedInitRun
from .study import STUDY as STUDY
from .study import PermutedInitialisationsPreset as PermutedInitialisationsPreset
from .study import build_runs as build_runs
from .transformer import TransformerBarrierRun as TransformerBarrierRun

__all__ = [
    "STUDY",
    "PermutedInitRun",
    "PermutedInitialisationsPreset",
    "TransformerBarrierRun",
    "analyze",
    "build_runs",
]
