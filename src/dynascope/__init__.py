"""dynascope: instruments and re-runnable studies for the science of training dynamics.

import dynascope as ds
views = ds.attention_views(model)
s_qk = ds.probes.qk_singular_values(views)      # [n_layers, n_heads, d_head]
ds.studies.get("weight-decay-low-rank").run(preset="fast", out="out/")
"""

from . import nn as nn
from . import probes as probes
from . import studies as studies
from . import tasks as tasks
from .adapters import AttentionView as AttentionView
from .adapters import attention_views as attention_views
from .adapters import capture_patterns as capture_patterns
from .config import RunConfig as RunConfig
from .config import load_config as load_config
from .monitor import EveryN as EveryN
from .monitor import LogSchedule as LogSchedule
from .monitor import Monitor as Monitor
from .nn import capture as capture
from .store import RunStore as RunStore
from .store import load_run as load_run
from .store import load_study as load_study
from .train import Trainer as Trainer

__version__ = "0.1.0"
