"""The probe contract: ``probe(model, ctx) -> dict[str, Tensor | float]``, and the probe registry.

A probe reads a model and returns named measurements, with keys like
``"L0.H3.qk.effective_rank"``. It must leave the model as it found it: it runs under
``torch.no_grad()``, restores every module's ``training`` flag, and forks the RNG so that the
training run draws the same random numbers whether or not a probe ran. Subclasses implement
:meth:`Probe.measure`; :meth:`Probe.__call__` wraps it in :func:`isolated`.

Probe classes are thin: the measurements themselves are pure functions on tensors
(``probes/spectral.py``, ``probes/norms.py``).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import Tensor, nn

__all__ = [
    "PROBES",
    "Probe",
    "ProbeContext",
    "isolated",
    "make_probe",
    "register_probe",
]


@dataclass
class ProbeContext:
    """What a probe may know besides the model.

    Attributes:
        step: the training step the measurement belongs to.
        batch: the current batch (name -> tensor), for probes that need inputs; ``None`` when
            the caller has none.
        loss: the training loss as the engine takes it, ``loss(model, batch) -> loss`` or
            ``(loss, metrics)`` (``dynascope.train.Parts.loss``), when the caller knows it, for
            probes of the loss landscape (:class:`~dynascope.probes.Sharpness`); else ``None``.
    """

    step: int
    batch: dict[str, Tensor] | None = None
    loss: Callable[[nn.Module, dict[str, Tensor]], Any] | None = None


def _rng_devices(model: nn.Module) -> tuple[str | None, list[int]]:
    """The accelerator type and indices that hold ``model``'s tensors (CPU is always forked)."""
    device_types: dict[str, set[int]] = {}
    for tensor in (*model.parameters(), *model.buffers()):
        device = tensor.device
        if device.type not in ("cpu", "meta") and device.index is not None:
            device_types.setdefault(device.type, set()).add(device.index)
    if not device_types:
        return None, []
    # A model spread over two accelerator types is not supported by fork_rng; fork the first.
    device_type, indices = next(iter(device_types.items()))
    return device_type, sorted(indices)


@contextmanager
def isolated(model: nn.Module) -> Iterator[None]:
    """Run the body the way a probe must: no autograd, model mode and RNG state restored.

    Inside the block gradients are off (``torch.no_grad()``), so no ``.grad`` changes. On exit,
    normally or by an exception, every submodule's ``training`` flag is restored (the body may
    call ``model.eval()``), and the CPU RNG and the RNG of each accelerator holding the model's
    tensors are reset to their state at entry (``torch.random.fork_rng``). Only the devices the
    model lives on are forked, so no other accelerator is initialised.

    Args:
        model: the model the body reads.
    """
    modes = [(module, module.training) for module in model.modules()]
    device_type, devices = _rng_devices(model)
    try:
        with torch.random.fork_rng(devices=devices, device_type=device_type), torch.no_grad():
            yield
    finally:
        for module, training in modes:
            module.training = training


class Probe(abc.ABC):
    """Base class of every probe: ``probe(model, ctx) -> dict[str, Tensor | float]``.

    Subclasses set ``name`` (done by :func:`register_probe`) and implement :meth:`measure`.
    Scalars are returned as python floats, whole arrays (spectra) as CPU tensors.

    A probe that keeps state between calls (a reference snapshot, the previous weights)
    overrides :meth:`state_dict` and :meth:`load_state_dict`, so that a checkpoint carries the
    state and a resumed run measures exactly what the uninterrupted run measured.
    """

    name: str = "probe"

    def __call__(self, model: nn.Module, ctx: ProbeContext) -> dict[str, Tensor | float]:
        """Measure ``model`` under :func:`isolated` (no grad; mode and RNG restored)."""
        with isolated(model):
            return self.measure(model, ctx)

    @abc.abstractmethod
    def measure(self, model: nn.Module, ctx: ProbeContext) -> dict[str, Tensor | float]:
        """Return the measurements of ``model`` at ``ctx.step``; called by ``__call__``."""

    def state_dict(self) -> dict[str, Any]:
        """The probe's state between calls: tensors, numbers, strings and containers of them
        (loadable with ``torch.load(weights_only=True)``). Stateless probes return ``{}``."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned.

        Raises:
            ValueError: if a stateless probe is handed a non-empty state.
        """
        if state:
            raise ValueError(f"probe {self.name!r} keeps no state (got keys {sorted(state)})")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


PROBES: dict[str, type[Probe]] = {}
"""Registry of probe classes by name, filled by :func:`register_probe`."""

P = TypeVar("P", bound=type[Probe])


def register_probe(name: str) -> Callable[[P], P]:
    """Class decorator: register a :class:`Probe` subclass under ``name`` and set its ``name``.

    Raises:
        ValueError: if ``name`` is already registered, or the class is not a Probe subclass.
    """

    def decorator(cls: P) -> P:
        if not (isinstance(cls, type) and issubclass(cls, Probe)):
            raise ValueError(f"register_probe needs a Probe subclass (got {cls!r})")
        if name in PROBES:
            raise ValueError(
                f"probe {name!r} is already registered (by {PROBES[name].__qualname__})"
            )
        cls.name = name
        PROBES[name] = cls
        return cls

    return decorator


def make_probe(name: str, **kwargs: Any) -> Probe:
    """Build the probe registered under ``name`` with keyword arguments ``kwargs``.

    Raises:
        ValueError: if ``name`` is not registered; the message lists the registered names.
    """
    if name not in PROBES:
        raise ValueError(f"unknown probe {name!r} (allowed: {', '.join(sorted(PROBES))})")
    return PROBES[name](**kwargs)
