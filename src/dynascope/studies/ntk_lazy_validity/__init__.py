"""Study ``ntk-lazy-validity`` (S11): the NTK approximation holds while alpha = O(T)
(notes: docs/studies/ntk-lazy-validity.md)."""

from .analysis import alpha_slope, analyze, growth_exponent
from .runs import LazyPair, LazyRun, LazyStep, build_h, build_lazy, two_layer
from .study import STUDY, NTKLazyValidityPreset, build_runs

__all__ = [
    "STUDY",
    "LazyPair",
    "LazyRun",
    "LazyStep",
    "NTKLazyValidityPreset",
    "alpha_slope",
    "analyze",
    "build_h",
    "build_lazy",
    "build_runs",
    "growth_exponent",
    "two_layer",
]
