"""Data generators, one file per task family; every batch is deterministic from a Generator."""

from .associative_recall import AssociativeRecall as AssociativeRecall
from .base import Task as Task
from .char_lm import CharLM as CharLM
from .cycle_colouring import CycleColouring as CycleColouring
from .diagonal_teacher import DiagonalAttentionTeacher as DiagonalAttentionTeacher
from .digits import Digits as Digits
from .digits_pvr import DigitsPVR as DigitsPVR
from .few_shot_hyperteacher import FewShotHyperteacher as FewShotHyperteacher
from .fuzzy_logic import FuzzyLogic as FuzzyLogic
from .grid_world import GridWorld as GridWorld
from .hyper_teacher import HyperTeacher as HyperTeacher
from .linear_attention_teacher import LinearAttentionTeacher as LinearAttentionTeacher
from .linear_regression import InContextLinearRegression as InContextLinearRegression
from .matrix_factorization import MatrixFactorization as MatrixFactorization
from .modular_arithmetic import ModularArithmetic as ModularArithmetic
from .modular_teacher import ModularTeacher as ModularTeacher
from .pvr import HopPVR as HopPVR
from .pvr import VectorPVR as VectorPVR
from .seeded_recall import SeededRecall as SeededRecall
from .sraven import SymbolicRaven as SymbolicRaven

__all__ = [
    "AssociativeRecall",
    "CharLM",
    "CycleColouring",
    "DiagonalAttentionTeacher",
    "Digits",
    "DigitsPVR",
    "FuzzyLogic",
    "HyperTeacher",
    "GridWorld",
    "HopPVR",
    "InContextLinearRegression",
    "LinearAttentionTeacher",
    "MatrixFactorization",
    "ModularArithmetic",
    "ModularTeacher",
    "FewShotHyperteacher",
    "SeededRecall",
    "SymbolicRaven",
    "Task",
    "VectorPVR",
]
