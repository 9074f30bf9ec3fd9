"""The engine (:mod:`.engine`): THE training loop, for lone runs and ensembles, with
seeding streams (:mod:`.seeding`), one learning-rate schedule (:mod:`.schedule`), stacked
ensembles (:mod:`.ensemble`), and the :class:`Trainer` for registry run configs (:mod:`.trainer`).
"""

from .coordcheck import coord_check as coord_check
from .engine import Engine as Engine
from .engine import Loop as Loop
from .engine import Member as Member
from .engine import Parts as Parts
from .engine import StepContext as StepContext
from .engine import TrainResult as TrainResult
from .schedule import LRSchedule as LRSchedule
from .schedule import lr_factor as lr_factor
from .seeding import SeedStreams as SeedStreams
from .seeding import stream_seed as stream_seed
from .trainer import Trainer as Trainer
from .trainer import run_training as run_training

__all__ = [
    "Engine",
    "LRSchedule",
    "Loop",
    "Member",
    "Parts",
    "SeedStreams",
    "StepContext",
    "TrainResult",
    "Trainer",
    "lr_factor",
    "run_training",
    "coord_check",
    "stream_seed",
]
