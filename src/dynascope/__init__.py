"""dynascope: instruments and re-runnable studies for the science of training dynamics.

import dynascope as ds
views = ds.attention_views(model)
s_qk = ds.probes.qk_singular_values(views)      # [n_layers, n_heads, d_head]
ds.inspect(model, x)                            # one DataFrame row per layer and head
ds.studies.get("weight-decay-low-rank").run(preset="fast", out="out/")

The public names below are imported on first use (PEP 562 ``__getattr__``), so that
``import dynascope`` and the ``dynascope`` command start without importing torch.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0.dev0"

# public name -> (module relative to this package, attribute or None for the module itself)
_LAZY: dict[str, tuple[str, str | None]] = {
    "nn": (".nn", None),
    "probes": (".probes", None),
    "studies": (".studies", None),
    "tasks": (".tasks", None),
    "AttentionView": (".adapters", "AttentionView"),
    "attention_views": (".adapters", "attention_views"),
    "capture_patterns": (".adapters", "capture_patterns"),
    "RunConfig": (".config", "RunConfig"),
    "load_config": (".config", "load_config"),
    "inspect": (".inspection", "inspect"),
    "inspect_layers": (".inspection", "inspect_layers"),
    "EveryN": (".monitor", "EveryN"),
    "LogSchedule": (".monitor", "LogSchedule"),
    "Monitor": (".monitor", "Monitor"),
    "capture": (".nn", "capture"),
    "RunStore": (".store", "RunStore"),
    "load_run": (".store", "load_run"),
    "load_study": (".store", "load_study"),
    "Trainer": (".train", "Trainer"),
}
__all__ = [*_LAZY, "__version__"]

if TYPE_CHECKING:  # static analysers and IDEs see the eager imports
    from . import nn as nn
    from . import probes as probes
    from . import studies as studies
    from . import tasks as tasks
    from .adapters import AttentionView as AttentionView
    from .adapters import attention_views as attention_views
    from .adapters import capture_patterns as capture_patterns
    from .config import RunConfig as RunConfig
    from .config import load_config as load_config
    from .inspection import inspect as inspect
    from .inspection import inspect_layers as inspect_layers
    from .monitor import EveryN as EveryN
    from .monitor import LogSchedule as LogSchedule
    from .monitor import Monitor as Monitor
    from .nn import capture as capture
    from .store import RunStore as RunStore
    from .store import load_run as load_run
    from .store import load_study as load_study
    from .train import Trainer as Trainer


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}"):
            return importlib.import_module(f".{name}", __name__)  # ds.config, ds.store, ...
        raise AttributeError(f"module 'dynascope' has no attribute {name!r}")
    module_name, attribute = _LAZY[name]
    module = importlib.import_module(module_name, __name__)
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
