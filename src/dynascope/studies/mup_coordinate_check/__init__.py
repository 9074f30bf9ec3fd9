"""Study ``mup-coordinate-check`` (S9); notes: docs/studies/mup-coordinate-check.md."""

from .analysis import load_records as load_records
from .runs import CoordRun as CoordRun
from .study import STUDY as STUDY
from .study import CoordSweep as CoordSweep
from .study import MupCoordCheckPreset as MupCoordCheckPreset
from .study import build_runs as build_runs

__all__ = ["STUDY", "CoordRun", "CoordSweep", "MupCoordCheckPreset", "build_runs", "load_records"]
