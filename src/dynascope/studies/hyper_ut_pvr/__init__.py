"""Study ``hyper-ut-pvr`` (S8); notes: docs/studies/hyper-ut-pvr.md."""

from .analysis import analyze as analyze
from .runs import DigitsRun as DigitsRun
from .runs import HopPVRRun as HopPVRRun
from .runs import VectorPVRRun as VectorPVRRun
from .study import STUDY as STUDY
from .study import HyperUTPresets as HyperUTPresets
from .study import build_runs as build_runs

__all__ = [
    "STUDY",
    "DigitsRun",
    "HopPVRRun",
    "HyperUTPresets",
    "VectorPVRRun",
    "analyze",
    "build_runs",
]
