"""Data generators, one file per task family; every batch is deterministic from a Generator."""

from .associative_recall import AssociativeRecall as AssociativeRecall
from .base import Task as Task
from .char_lm import CharLM as CharLM
from .linear_regression import InContextLinearRegression as InContextLinearRegression
from .matrix_factorization import MatrixFactorization as MatrixFactorization

__all__ = [
    "AssociativeRecall",
    "CharLM",
    "InContextLinearRegression",
    "MatrixFactorization",
    "Task",
]
