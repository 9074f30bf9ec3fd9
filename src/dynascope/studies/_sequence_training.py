"""What the sequence-model studies (S3 ``compositional-icl-bottleneck``, S4
``hyla-fuzzy-logic`` and its sRAVEN part) share on the engine: the batch/optimizer fields of a
run config and the AdamW that decays only matrices.

The engine (:mod:`dynascope.train`) owns the loop, the seeding, the schedule (``loop.schedule``:
warm-up then cosine), clipping (``loop.grad_clip``), checkpoints and the store; a study's
``build`` hands it the model, the data and ``optimizer=adamw_matrices(config)``.

Glossary:
    1-D parameters: biases, LayerNorm/RMS gains and the like; AdamW never decays them.

References:
    Schug et al. (2025), "Attention as a Hypernetwork", arXiv 2406.05816, App. (AdamW, linear
        warm-up then cosine to 0.1 lr, no decay on 1-D parameters).
    Kobayashi et al. (2024), "When can transformers compositionally generalize in-context?",
        arXiv 2407.12275, App. C.3 (AdamW, warm-up then cosine to 0, grad-clip 1).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from pydantic import Field

from dynascope.train import EngineRunConfig

__all__ = ["SequenceRunConfig", "adamw_matrices"]


class SequenceRunConfig(EngineRunConfig):
    """Seed and loop (the base), batch and optimizer fields; subclasses add task and model."""

    batch_size: int = Field(128, ge=1)
    lr: float = Field(1e-3, gt=0, description="AdamW base rate (the schedule multiplies it)")
    weight_decay: float = Field(0.1, ge=0, description="AdamW decay of >= 2-D parameters")


def _adamw(lr: float, weight_decay: float, model: torch.nn.Module) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    return torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=lr,
    )


def adamw_matrices(config: SequenceRunConfig) -> Callable[[torch.nn.Module], torch.optim.AdamW]:
    """``optimizer(model)``: AdamW at ``config.lr``, decaying only the >= 2-D parameters.

    Returns:
        A picklable builder for :attr:`dynascope.train.Parts.optimizer` (two groups: matrices
        with ``config.weight_decay``, 1-D parameters without decay).
    """
    return functools.partial(_adamw, config.lr, config.weight_decay)
