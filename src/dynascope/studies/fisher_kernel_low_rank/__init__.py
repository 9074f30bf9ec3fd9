"""Study ``fisher-kernel-low-rank`` (S14): the Neural Fisher Kernel of a trained classifier is
close to low-rank (notes: docs/studies/fisher-kernel-low-rank.md)."""

from .analysis import analyze, measure_run, verdicts_from_rows
from .runs import FisherKernelRun, build_fisher, measure_nfk, probe_accuracy
from .study import STUDY, FisherKernelPreset, build_runs

__all__ = [
    "STUDY",
    "FisherKernelPreset",
    "FisherKernelRun",
    "analyze",
    "build_fisher",
    "build_runs",
    "measure_nfk",
    "measure_run",
    "probe_accuracy",
    "verdicts_from_rows",
]
