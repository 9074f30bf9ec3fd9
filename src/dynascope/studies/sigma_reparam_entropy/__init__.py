"""Study ``sigma-reparam-entropy`` (SYSTEMS.md S12): σReparam prevents attention entropy collapse.

Zhai et al., "Stabilizing Transformer Training by Preventing Attention Entropy Collapse", arXiv
2303.06296. Design, thresholds and measured values: ``docs/studies/sigma-reparam-entropy.md``.
"""

from .analysis import analyze
from .runs import UnitCheckRun, build_units
from .study import FAST_STEPS, STUDY, SigmaReparamEntropyPreset, build_runs

__all__ = [
    "FAST_STEPS",
    "STUDY",
    "SigmaReparamEntropyPreset",
    "UnitCheckRun",
    "analyze",
    "build_runs",
    "build_units",
]
