"""Study ``modular-teacher-student`` (S5); notes: docs/studies/modular-teacher-student.md."""

from .analysis import analyze as analyze
from .runs import TeacherStudentRun as TeacherStudentRun
from .study import STUDY as STUDY
from .study import ModularTeacherStudentPreset as ModularTeacherStudentPreset
from .study import build_runs as build_runs

__all__ = ["STUDY", "ModularTeacherStudentPreset", "TeacherStudentRun", "analyze", "build_runs"]
