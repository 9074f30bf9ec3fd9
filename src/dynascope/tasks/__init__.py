"""Data generators, one file per task family; every batch is deterministic from a Generator."""

from .associative_recall import AssociativeRecall as AssociativeRecall
from .base import Task as Task
from .char_lm import CharLM as CharLM
from .diagonal_teacher import DiagonalAttentionTeacher as DiagonalAttentionTeacher
from .digits import Digits as Digits
from .linear_regression import InContextLinearRegression as InContextLinearRegression
from .matrix_factorization import MatrixFactorization as MatrixFactorization
from .modular_arithmetic import ModularArithmetic as ModularArithmetic

__all__ = [
    "AssociativeRecall",
    "CharLM",
    "DiagonalAttentionTeacher",
    "Digits",
    "InContextLinearRegression",
    "MatrixFactorization",
    "ModularArithmetic",
    "Task",
]
