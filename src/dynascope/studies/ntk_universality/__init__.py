"""Study ``ntk-universality`` (S17); notes: docs/studies/ntk-universality.md."""

from .analysis import ARCHITECTURES as ARCHITECTURES
from .analysis import analyze as analyze
from .runs import UniversalityRun as UniversalityRun
from .study import STUDY as STUDY
from .study import NTKUniversalityPreset as NTKUniversalityPreset
from .study import build_runs as build_runs

__all__ = [
    "ARCHITECTURES",
    "STUDY",
    "NTKUniversalityPreset",
    "UniversalityRun",
    "analyze",
    "build_runs",
]
