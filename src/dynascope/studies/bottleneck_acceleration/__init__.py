"""Study ``bottleneck-acceleration`` (S16): one finite bottleneck in a wide NTK net learns
features and trains faster than the all-wide limit (notes:
docs/studies/bottleneck-acceleration.md)."""

from .analysis import add_lazy_ratios, analyze, measure_run, verdicts_from_rows
from .runs import BottleneckRun, KernelGD, build_bottleneck, make_data, make_net
from .study import STUDY, BottleneckPreset, build_runs

__all__ = [
    "STUDY",
    "BottleneckPreset",
    "BottleneckRun",
    "KernelGD",
    "add_lazy_ratios",
    "analyze",
    "build_bottleneck",
    "build_runs",
    "make_data",
    "make_net",
    "measure_run",
    "verdicts_from_rows",
]
