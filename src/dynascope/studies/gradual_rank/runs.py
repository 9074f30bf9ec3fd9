"""Gradual-rank runs: the diagonal-attention toy (closed-form GD as an engine step) and the ViT."""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field, field_validator
from torch import Tensor, nn

from dynascope.monitor import EveryN
from dynascope.tasks.diagonal_teacher import DiagonalAttentionTeacher
from dynascope.train import EngineRunConfig, Parts, SeedStreams, StepContext

__all__ = ["ToyRun", "build_toy"]


class ToyRun(EngineRunConfig):
    """The diagonal-attention toy: teacher, sizes, init scales and the GD step (run in the
    loop's dtype, float64 in every preset). Every α trains at once, batched in one tensor."""

    n_ctx: int = Field(8, ge=1, description="tokens per sequence n")
    d_model: int = Field(8, ge=1, description="token width d")
    n_seq: int = Field(256, ge=1, description="sequences N (one full batch)")
    strengths: list[float] = Field(default_factory=lambda: [2.0, 1.0, 0.5])
    scale: float = Field(1.0, gt=0, description="score multiplier (1: no temperature)")
    alphas: list[float] = Field(
        default_factory=lambda: [1.0, 1e-1, 1e-2, 1e-3],
        description="init scales in (0, 1]; α = 1 (θ(0) = θ0) is t1's large-init control",
    )
    lr: float = Field(0.05, gt=0, description="GD step η")

    @field_validator("alphas")
    @classmethod
    def _alphas_in_unit_interval(cls, alphas: list[float]) -> list[float]:
        if not alphas or not all(0 < a <= 1 for a in alphas):
            raise ValueError(f"alphas must be non-empty, each in (0, 1] (got {alphas})")
        if len(set(alphas)) != len(alphas):
            raise ValueError(f"alphas must be distinct (got {alphas})")
        return alphas


class _DiagonalHeads(nn.Module):
    """``w [n_alpha, 4, d_model]`` (w_Q, w_K, w_V, w_O per α), updated by :class:`_GDStep`."""

    def __init__(self, w: Tensor) -> None:
        super().__init__()
        self.w = nn.Parameter(w, requires_grad=False)


class _GDStep:
    """Full-batch GD with the teacher's closed-form gradient: ``w <- w − η·factor·∇L(w)``;
    returns the mean over α of the loss before the update.

    :meth:`loss_at` (the probe's loss at step t) keeps the gradient it computes with it, and
    the update from step t uses it instead of computing the same loss and gradient again (the
    probe runs every step in every preset: one forward pass per step saved, same numbers).
    """

    def __init__(self, teacher: DiagonalAttentionTeacher, lr: float) -> None:
        self.teacher, self.lr = teacher, lr
        self._kept: tuple[int, Tensor, Tensor] | None = None  # (step, L(w), ∇L(w)) at that step

    def loss_at(self, w: Tensor, step: int) -> Tensor:
        """``L(w)`` ``[n_alpha]`` at ``step``; its gradient is kept for the next update."""
        loss, grad = self.teacher.loss_and_gradients(w)
        self._kept = (step, loss, grad)
        return loss

    def __call__(self, model: nn.Module, batch: Any, ctx: StepContext) -> Tensor:
        kept, self._kept = self._kept, None
        if kept is not None and kept[0] == ctx.step - 1:  # the probe saw these weights
            loss, grad = kept[1], kept[2]
        else:
            loss, grad = self.teacher.loss_and_gradients(model.w.data)
        model.w.data.sub_(self.lr * ctx.lr_factor * grad)
        return loss.mean()


def build_toy(config: ToyRun, streams: SeedStreams) -> Parts:
    """The toy's parts: x and the teacher from stream ``teacher``, θ0 from stream ``theta0``.

    Probe (every ``loop.log_every`` steps, step 0 included; tensors over the α grid): ``loss``
    ``[n_alpha]`` (the MSE at that step's weights), ``qk`` and ``ov`` ``[n_alpha, d_model]``
    (``w_Q⊙w_K``, ``w_V⊙w_O``); at step 0 also ``alphas`` and ``teacher`` (qk* = ov*).
    """
    dtype = getattr(torch, config.loop.dtype)
    teacher = DiagonalAttentionTeacher(
        n_ctx=config.n_ctx,
        d_model=config.d_model,
        n_seq=config.n_seq,
        strengths=config.strengths,
        scale=config.scale,
        seed=streams("teacher"),
        dtype=dtype,
    )
    alphas = torch.tensor(config.alphas, dtype=dtype)
    model = _DiagonalHeads(teacher.init_weights(alphas, streams.generator("theta0")))

    step = _GDStep(teacher, config.lr)

    def trace(m: nn.Module, ctx: Any) -> dict[str, Tensor]:
        w = m.w.detach()
        row = {"loss": step.loss_at(w, ctx.step), "qk": w[:, 0] * w[:, 1], "ov": w[:, 2] * w[:, 3]}
        if ctx.step == 0:
            row.update(alphas=alphas, teacher=teacher.teacher)
        return row

    schedule = EveryN(config.loop.log_every, also=[0, config.loop.steps])
    return Parts(model=model, data={}, step=step, probes=[(trace, schedule)])
