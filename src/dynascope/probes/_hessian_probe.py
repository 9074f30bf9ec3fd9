"""Private base of the probes that take the training loss's Hessian on a held batch
(:class:`~dynascope.probes.Sharpness`, :class:`~dynascope.probes.HessianDensity`): which loss,
which batch, which parameters, as one ``loss_fn(params) -> scalar`` for the pure functions.

Glossary:
    held batch: ``batch`` given at construction, or else the first ``ctx.batch`` the probe sees,
                copied and kept in :meth:`HessianProbe.state_dict` (a resumed run measures the
                Hessian the uninterrupted one would).
    loss:       ``loss(output, batch)`` if given; else ``ctx.loss(model, batch)`` (the engine's
                training loss); else a default: cross-entropy (nats, mean) for integer targets
                ``y`` of the output's leading shape, or of shape ``[batch]`` against
                ``output[:, -1]`` for ``[batch, pos, d_out]`` outputs; mean squared error for
                float targets of the output's shape.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from dynascope.probes._hessian_ops import LossFn
from dynascope.probes.base import Probe, ProbeContext

__all__ = ["BatchLoss", "HessianProbe"]

BatchLoss = Callable[[Tensor, dict[str, Tensor]], Tensor]


class _ModelLoss(nn.Module):
    """``forward(batch) = loss(model, batch)`` (the loss of a ``(loss, metrics)`` pair), so that
    ``functional_call`` can swap the model's parameters (as ``model.<name>``)."""

    def __init__(self, model: nn.Module, loss: Callable[[nn.Module, dict[str, Tensor]], Any]):
        super().__init__()
        self.model = model
        self.loss = loss

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        out = self.loss(self.model, batch)
        return out[0] if isinstance(out, tuple) else out


class HessianProbe(Probe):
    """A probe of the loss Hessian on a held batch; subclasses call :meth:`loss_closure`.

    Args:
        loss: ``loss(output, batch) -> scalar``, or ``None`` (module docstring).
        batch: a held batch (name -> tensor, with ``input_key``) instead of the first
            ``ctx.batch``.
        include: parameter-name prefixes (e.g. ``["blocks.0."]``); ``None`` takes all.
        input_key: the batch entry passed as ``model(batch[input_key])``.
        seed: seeds the random vectors of every reading (the same at each reading).
    """

    def __init__(
        self,
        *,
        loss: BatchLoss | None,
        batch: dict[str, Tensor] | None,
        include: Sequence[str] | None,
        input_key: str,
        seed: int,
    ) -> None:
        self.loss = loss
        self.include = None if include is None else list(include)
        self.input_key = input_key
        self.seed = seed
        self.batch = None if batch is None else {n: t.detach().clone() for n, t in batch.items()}

    def state_dict(self) -> dict[str, Any]:
        """The held batch (empty before the first reading without ``batch=``)."""
        return {} if self.batch is None else {"batch": self.batch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the held batch."""
        if state:
            self.batch = dict(state["batch"])

    def _held_batch(self, ctx: ProbeContext) -> dict[str, Tensor]:
        if self.batch is None:
            if ctx.batch is None or self.input_key not in ctx.batch:
                got = "no batch" if ctx.batch is None else f"batch keys {sorted(ctx.batch)}"
                raise ValueError(
                    f"{self.name} needs a batch: pass batch= when constructing it, or a batch "
                    f"with key {self.input_key!r} to monitor.step(step, batch) (got {got})"
                )
            self.batch = {n: t.detach().clone() for n, t in ctx.batch.items()}
        return self.batch

    def _default_loss(self, output: Tensor, batch: dict[str, Tensor]) -> Tensor:
        if "y" not in batch:
            raise ValueError(
                f"{self.name} needs a loss: pass loss= or a batch with targets 'y' (got batch "
                f"keys {sorted(batch)})"
            )
        y = batch["y"]
        if not y.is_floating_point():
            if y.shape == output.shape[:-1]:
                return F.cross_entropy(output.reshape(-1, output.shape[-1]), y.reshape(-1))
            if output.ndim == 3 and y.ndim == 1 and y.shape[0] == output.shape[0]:
                return F.cross_entropy(output[:, -1], y)  # one answer per sequence, at the end
        elif y.shape == output.shape:
            return F.mse_loss(output, y)
        raise ValueError(
            f"{self.name}: no default loss for output {list(output.shape)} and targets y "
            f"{list(y.shape)} ({y.dtype}); pass loss=(output, batch) -> scalar"
        )

    def loss_closure(self, model: nn.Module, ctx: ProbeContext) -> tuple[LossFn, dict[str, Tensor]]:
        """``(loss_fn, params)``: the held batch's loss as a function of the chosen parameters
        (detached, name -> tensor), the others and the buffers fixed. Puts ``model`` in eval
        mode (dropout off); :meth:`Probe.__call__` restores the modes.

        Raises:
            ValueError: if ``include`` selects no parameter; if no batch is held and
                ``ctx.batch`` is ``None`` or lacks ``input_key``.
        """
        named = {name: p.detach() for name, p in model.named_parameters()}
        prefixes = self.include
        chosen = {
            name: p
            for name, p in named.items()
            if prefixes is None or any(name.startswith(prefix) for prefix in prefixes)
        }
        if not chosen:
            raise ValueError(f"include selects no parameter of the model (got {prefixes})")
        frozen = {name: p for name, p in named.items() if name not in chosen}
        buffers = dict(model.named_buffers())
        device = next(iter(chosen.values())).device
        batch = {n: t.to(device) for n, t in self._held_batch(ctx).items()}
        if self.loss is None and ctx.loss is not None:  # the engine's loss(model, batch)
            wrapper = _ModelLoss(model, ctx.loss)
            state = {f"model.{name}": t for name, t in {**frozen, **buffers}.items()}

            def loss_fn(params: dict[str, Tensor]) -> Tensor:
                named = {f"model.{name}": p for name, p in params.items()}
                return functional_call(wrapper, {**state, **named}, (batch,))

        else:
            loss_of = self.loss or self._default_loss

            def loss_fn(params: dict[str, Tensor]) -> Tensor:
                state = {**frozen, **buffers, **params}
                output = functional_call(model, state, (batch[self.input_key],))
                return loss_of(output, batch)

        model.eval()
        return loss_fn, chosen
