"""Study ``gated-rnn-attention`` (S6); notes: docs/studies/gated-rnn-attention.md."""

from .analysis import analyze as analyze
from .runs import ConstructionRun as ConstructionRun
from .runs import ICLRun as ICLRun
from .runs import TeacherStudentRun as TeacherStudentRun
from .study import STUDY as STUDY
from .study import GatedRNNAttentionPreset as GatedRNNAttentionPreset
from .study import build_runs as build_runs

__all__ = [
    "STUDY",
    "ConstructionRun",
    "GatedRNNAttentionPreset",
    "ICLRun",
    "TeacherStudentRun",
    "analyze",
    "build_runs",
]
