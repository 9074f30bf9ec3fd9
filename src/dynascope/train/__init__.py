"""The engine (:mod:`.engine`): THE training loop, for lone runs and ensembles, with
seeding streams (:mod:`.seeding`), one learning-rate schedule (:mod:`.schedule`), stacked
ensembles (:mod:`.ensemble`). Every run goes in through one door, :func:`run_members`
(:mod:`.runs`): a run config and a module-level ``build(config, streams) -> Parts``; a registry
run config's build is :func:`build_registry` (:mod:`.registry`), and :class:`Trainer` is a thin
call of the two.
"""

from .coordcheck import coord_check as coord_check
from .engine import Engine as Engine
from .engine import Loop as Loop
from .engine import Member as Member
from .engine import Parts as Parts
from .engine import StepContext as StepContext
from .engine import TrainResult as TrainResult
from .registry import build_registry as build_registry
from .registry import loop_of as loop_of
from .runs import RUNNER_FILE as RUNNER_FILE
from .runs import EngineRunConfig as EngineRunConfig
from .runs import load_run_config as load_run_config
from .runs import resume_run as resume_run
from .runs import run_members as run_members
from .schedule import LRSchedule as LRSchedule
from .schedule import lr_factor as lr_factor
from .seeding import SeedStreams as SeedStreams
from .seeding import stream_seed as stream_seed
from .trainer import Trainer as Trainer
from .trainer import run_training as run_training

__all__ = [
    "RUNNER_FILE",
    "Engine",
    "EngineRunConfig",
    "LRSchedule",
    "Loop",
    "Member",
    "Parts",
    "SeedStreams",
    "StepContext",
    "TrainResult",
    "Trainer",
    "build_registry",
    "load_run_config",
    "loop_of",
    "lr_factor",
    "resume_run",
    "run_members",
    "run_training",
    "coord_check",
    "stream_seed",
]
