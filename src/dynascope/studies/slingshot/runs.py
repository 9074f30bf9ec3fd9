"""Slingshot runs: the FCN on 200 digits (full batch) on the engine, and S13's grokking run."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

from dynascope.nn.fcn import FCN
from dynascope.tasks.digits import N_DIGITS, Digits
from dynascope.train import EngineRunConfig, Parts, SeedStreams

__all__ = ["FcnRun", "build"]

NORM_KEY = "train.last_layer_norm"  # ||W_U||_F, logged by the loss as a step metric


class FcnRun(EngineRunConfig):
    """One FCN run: ``64 -> hidden... -> 10`` (ReLU, PyTorch-default init) trained full batch
    on ``n_train`` digits (``Digits(patch_size=8)``, split seed 0) with mean cross-entropy."""

    hidden: tuple[int, ...] = Field((64, 64), description="hidden widths")
    n_train: int = Field(200, ge=10, le=N_DIGITS - 10)
    optimizer: Literal["adam", "sgd"] = "adam"
    lr: float = Field(1e-3, gt=0)
    eps: float = Field(1e-8, gt=0, description="Adam's ε (ignored by SGD)")


def _loss(model: nn.Module, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
    """Mean cross-entropy (nats) and ``last_layer_norm`` = ``||W_U||_F`` before the update."""
    loss = F.cross_entropy(model(batch["x"]), batch["y"])
    return loss, {"last_layer_norm": model.W_U.detach().norm()}


def build(config: FcnRun, streams: SeedStreams) -> Parts:
    """The FCN run's parts: full-batch training split, the other digits for ``val.*``.

    Module-level and picklable: ``benchmarks/ensembles.py`` trains it as lone runs and as one
    K-member ensemble (``run_members(build, [FcnRun(...), ...], dirs)``).
    """
    task = Digits(patch_size=8, n_train=config.n_train)
    unused = torch.Generator()  # a batch as large as its split is the whole split, in order
    train = task.batch("train", N_DIGITS, unused)
    val = task.batch("val", N_DIGITS, unused)
    model = FCN(64, list(config.hidden), 10)

    def optimizer(m: nn.Module) -> torch.optim.Optimizer:
        if config.optimizer == "sgd":
            return torch.optim.SGD(m.parameters(), lr=config.lr)
        return torch.optim.Adam(m.parameters(), lr=config.lr, eps=config.eps)

    def evaluate(m: nn.Module) -> dict[str, float]:
        x, y = (val[k].to(next(m.parameters())) if k == "x" else val[k] for k in ("x", "y"))
        logits = m(x)
        return {
            "val.loss": float(F.cross_entropy(logits, y)),
            "val.accuracy": float((logits.argmax(-1) == y).double().mean()),
        }

    return Parts(model=model, data=train, loss=_loss, optimizer=optimizer, evaluate=evaluate)
