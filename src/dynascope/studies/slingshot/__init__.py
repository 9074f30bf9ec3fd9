"""Study ``slingshot`` (SYSTEMS.md S13): Adam's late norm-growth / loss-spike cycles.

Thilak et al., "The Slingshot Mechanism", arXiv 2206.04817. Design, calibration and measured
values: ``docs/studies/slingshot.md``.
"""

from .analysis import analyze
from .measure import DetectorConfig, run_cycles
from .runs import FcnRun, build
from .study import FAST_STEPS, GROK_STEPS, STUDY, SlingshotPreset, build_runs

__all__ = [
    "FAST_STEPS",
    "GROK_STEPS",
    "STUDY",
    "DetectorConfig",
    "FcnRun",
    "SlingshotPreset",
    "analyze",
    "build",
    "build_runs",
    "run_cycles",
]
