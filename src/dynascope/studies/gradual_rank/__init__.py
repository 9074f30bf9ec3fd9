"""Study ``gradual-rank`` (SYSTEMS.md S10): attention weights change by gradually rising rank.

Abbe et al., "Transformers learn through gradual rank increase", arXiv 2306.07042. Design,
thresholds and measured values: ``docs/studies/gradual-rank.md``.
"""

from .analysis import analyze
from .runs import ToyRun, build_toy
from .stages import (
    active_counts,
    find_drops,
    midpoint_rise,
    plateaus,
    rescaled_time,
    switch_on_index,
    switched_on,
)
from .study import (
    SGD_LR,
    SGD_MOMENTUM,
    STUDY,
    TOY_FULL_SEEDS,
    VIT_FAST_STEPS,
    VIT_FULL_SEEDS,
    GradualRankPreset,
    build_runs,
)

__all__ = [
    "SGD_LR",
    "SGD_MOMENTUM",
    "STUDY",
    "TOY_FULL_SEEDS",
    "VIT_FAST_STEPS",
    "VIT_FULL_SEEDS",
    "GradualRankPreset",
    "ToyRun",
    "active_counts",
    "analyze",
    "build_runs",
    "build_toy",
    "find_drops",
    "midpoint_rise",
    "plateaus",
    "rescaled_time",
    "switch_on_index",
    "switched_on",
]
