"""Training pieces shared by the sequence-model studies (S3 ``compositional-icl-bottleneck``,
S4 ``hyla-fuzzy-logic`` and its sRAVEN part): run configs, optimizer, schedule, loop.

Glossary:
    step:           1-based optimizer step; ``steps`` is the total.
    warmup:         linear warm-up steps, lr factor ``step / warmup`` (0 at step 0).
    final:          lr factor at the end of the cosine (``final_lr_frac``; 0 for S3).
    lr factor:      multiplier of the base ``lr`` (dimensionless), as in ``LambdaLR``.
    1-D parameters: biases, LayerNorm/RMS gains and the like; AdamW never decays them.
    mixer:          the attention kind of every layer
                    (:data:`dynascope.nn.attention.AttentionKind`).
    qk_width:       total query/key/value width ``n_heads * d_head``.

Every runner opens its store with :func:`open_run`, builds the optimizer with
:func:`adamw_warmup_cosine` and trains with :func:`train_steps`
(S4 builds its model with :func:`mixer_transformer`); what differs per study (data,
model, loss, evaluation, probes) is passed in.

References:
    Schug et al. (2025), "Attention as a Hypernetwork", arXiv 2406.05816, App. (AdamW, linear
        warm-up then cosine to 0.1 lr, no decay on 1-D parameters).
    Kobayashi et al. (2024), "When can transformers compositionally generalize in-context?",
        arXiv 2407.12275, App. C.3 (AdamW, warm-up then cosine to 0, grad-clip 1).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from dynascope.nn.attention import AttentionKind
from dynascope.nn.hypernet_transformer import SequenceTransformer
from dynascope.store import RunStore
from dynascope.studies.base import one_intra_op_thread

__all__ = [
    "MixerTransformerConfig",
    "SequenceTrainingConfig",
    "adamw_warmup_cosine",
    "mixer_transformer",
    "open_run",
    "train_steps",
    "warmup_cosine",
]


class SequenceTrainingConfig(BaseModel):
    """Seed, batch, optimizer and logging fields of one run (subclasses add task and model)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = Field(0, ge=0)
    batch_size: int = Field(128, ge=1)
    steps: int = Field(1000, ge=1)
    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(0.1, ge=0, description="AdamW decay of >= 2-D parameters")
    warmup_steps: int = Field(100, ge=0)
    log_every: int = Field(25, ge=1, description="steps between train.loss logs")
    eval_every: int = Field(250, ge=1, description="steps between evaluations (and the last)")
    device: str = "cpu"


class MixerTransformerConfig(SequenceTrainingConfig):
    """A :class:`~dynascope.nn.SequenceTransformer` with one mixer, cosine to ``final_lr_frac``.

    Raises:
        ValueError: if ``n_heads`` does not divide ``qk_width``.
    """

    mixer: AttentionKind = "hyla"
    d_model: int = Field(64, ge=1)
    n_layers: int = Field(2, ge=1)
    n_heads: int = Field(8, ge=1)
    qk_width: int = Field(16, ge=1, description="total q/k/v width n_heads * d_head")
    d_mlp: int = Field(128, ge=1)
    final_lr_frac: float = Field(0.1, ge=0, le=1, description="cosine ends at this × lr")

    @model_validator(mode="after")
    def _heads_divide_width(self):
        if self.qk_width % self.n_heads:
            raise ValueError(
                "n_heads must divide qk_width "
                f"(got qk_width={self.qk_width}, n_heads={self.n_heads})"
            )
        return self


def mixer_transformer(
    config: MixerTransformerConfig, d_in: int, d_out: int, relative_position_buckets: int
) -> SequenceTransformer:
    """The config's :class:`~dynascope.nn.SequenceTransformer` (``d_head = qk_width / n_heads``).

    Args:
        config: mixer and sizes (``d_model``, ``n_layers``, ``n_heads``, ``qk_width``,
            ``d_mlp``).
        d_in: width of an input token.
        d_out: width of the readout at every position.
        relative_position_buckets: T5 buckets (= max distance) of the position bias.

    Returns:
        The model on the CPU, initialised from torch's global RNG.
    """
    return SequenceTransformer(
        d_in,
        d_out,
        d_model=config.d_model,
        n_layers=config.n_layers,
        n_heads=config.n_heads,
        d_head=max(1, config.qk_width // config.n_heads),
        d_mlp=config.d_mlp,
        attention=config.mixer,
        relative_position_buckets=relative_position_buckets,
    )


def warmup_cosine(step: int, warmup: int, total: int, final: float = 0.0) -> float:
    """Lr factor: linear warm-up ``step / warmup``, then cosine from 1 to ``final`` at ``total``.

    Args:
        step: the scheduler's step count (0 before the first optimizer step).
        warmup: warm-up steps (0: no warm-up).
        total: total steps; the factor stays at ``final`` after it.
        final: the factor at the end of the cosine, in [0, 1].

    Returns:
        The factor (dimensionless) that multiplies the base lr.
    """
    if warmup and step < warmup:
        return step / warmup
    t = (step - warmup) / max(1, total - warmup)
    return final + (1 - final) * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))


def adamw_warmup_cosine(
    model: torch.nn.Module, config: SequenceTrainingConfig, final_lr_frac: float = 0.0
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW decaying only >= 2-D parameters, and its :func:`warmup_cosine` schedule.

    Args:
        model: the model whose parameters are optimized.
        config: ``lr``, ``weight_decay``, ``warmup_steps`` and ``steps``.
        final_lr_frac: the lr factor at the end of the cosine.

    Returns:
        ``(optimizer, scheduler)``; call ``scheduler.step()`` after every optimizer step.
    """
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": config.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=config.lr,
    )
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: warmup_cosine(s, config.warmup_steps, config.steps, final_lr_frac)
    )
    return opt, sched


@contextmanager
def open_run(config: SequenceTrainingConfig, run_dir: Path) -> Iterator[RunStore]:
    """One intra-op thread and a fresh store at ``run_dir`` (config written, status "running"),
    with torch's global RNG seeded from ``config.seed`` (model init draws from it).

    Yields:
        The open :class:`~dynascope.store.RunStore`; it is closed on exit.
    """
    with one_intra_op_thread(), RunStore(run_dir) as store:
        store.truncate_after(-1)
        store.write_config(config.model_dump(mode="json"))
        store.set_status(0, "running")
        torch.manual_seed(config.seed)
        yield store


def train_steps(
    store: RunStore,
    model: torch.nn.Module,
    config: SequenceTrainingConfig,
    loss_fn: Callable[[], torch.Tensor],
    evaluate: Callable[[], dict[str, torch.Tensor]],
    *,
    final_lr_frac: float = 0.0,
    grad_clip: float | None = None,
) -> bool:
    """Train ``config.steps`` steps; log ``train.loss`` every ``log_every`` steps and
    ``evaluate()`` every ``eval_every`` steps and at the last step.

    Args:
        store: the run's open store.
        model: the model (on its device, in train mode).
        config: the schedule and logging fields.
        loss_fn: draws the next batch and returns its scalar loss (``[]``), with grad.
        evaluate: returns the metrics to log (scalars ``[]``); must leave ``model`` in train
            mode.
        final_lr_frac: the lr factor at the end of the cosine (:func:`warmup_cosine`).
        grad_clip: max global grad norm (``clip_grad_norm_``), or None for no clipping.

    Returns:
        True if all steps ran; False if a loss was not finite (status set to "diverged" at
        that step, nothing after it logged).
    """
    opt, sched = adamw_warmup_cosine(model, config, final_lr_frac)
    for step in range(1, config.steps + 1):
        loss = loss_fn()
        if not torch.isfinite(loss):
            store.set_status(step, "diverged")
            return False
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        opt.step()
        sched.step()
        if step % config.log_every == 0:
            store.log(step, {"train.loss": loss.detach()})
        if step % config.eval_every == 0 or step == config.steps:
            store.log(step, evaluate())
    return True
