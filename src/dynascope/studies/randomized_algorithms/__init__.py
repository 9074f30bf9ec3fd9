"""Study ``randomized-algorithms`` (SYSTEMS.md S2): transformers learn randomized algorithms.

von Oswald et al., "Learning Randomized Algorithms with Transformers", arXiv 2408.10818.
Design, thresholds and measured values: ``docs/studies/randomized-algorithms.md``.
"""

from .analysis import MAIN_MODELS, analyze, recall_loss_max
from .grid_world import GridWorldRun, PGPEStep, build_grid_world
from .runs import ColouringRun, RecallRun, build_colouring, build_recall
from .study import STUDY, RandomizedAlgorithmsPreset, build_runs, fast_with_colouring

__all__ = [
    "MAIN_MODELS",
    "STUDY",
    "ColouringRun",
    "GridWorldRun",
    "PGPEStep",
    "RandomizedAlgorithmsPreset",
    "RecallRun",
    "analyze",
    "build_colouring",
    "build_grid_world",
    "build_recall",
    "build_runs",
    "fast_with_colouring",
    "recall_loss_max",
]
