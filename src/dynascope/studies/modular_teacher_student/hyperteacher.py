"""Hyperteacher runs of ``modular-teacher-student`` (paper preset): meta-learners on few-shot
soft-target classification, OOD accuracy per learner and (M experts, K hot).

Glossary: M = ``n_experts``, K = ``num_hot`` (:class:`dynascope.tasks.few_shot_hyperteacher.
FewShotHyperteacher`); learners :class:`dynascope.nn.meta_learners.MetaLearner`.

On the engine: each step's batch holds ``meta_batch`` training tasks with ``shots_support +
shots_query`` inputs; the loss adapts each task's vector on the support shots (second order by
default) and returns the query loss (AdamW, the loop's gradient clipping). A probe at the last
step evaluates ``eval_tasks`` tasks of the ``train`` and the ``ood`` split, adapted the same way
(first order): accuracy = argmax of the logits vs the hard target on the query shots. Streams:
``teacher`` (the hyperteacher's weights and split), ``learner`` (the learner's init), ``data``
(training tasks), ``eval``. The inner loop differentiates inside the loss, so these runs train
alone (no ensembles).

Stored: ``train.loss`` and ``train.query_accuracy`` (window means over ``log_every`` steps),
``{train,ood}.loss`` and ``{train,ood}.accuracy`` at the last step. Learner defaults follow
the reference ``configs/hyperteacher.py`` (:data:`LEARNER_DEFAULTS`); hnet_linear's embedding
width is 4·M (the reference's ``ratio_templates_experts = 4``; its exact use is unverified),
and its ``hnet_deepmlp`` (nonlinear hypernetwork) is not built.

CPU plumbing check (2026-12-01, the runner before the engine port, M4K2 random support, width
128, 300 outer steps, 16 tasks × 64 + 64 shots; not a preset): train / OOD accuracy 43 / 37 %
(hnet_linear), 34 / 32 % (ANIL, 20 inner steps), 38 / 35 % (MAML); chance 12.5 %. All three
learn; nothing here is a verdict.

References:
    Schug et al. (2024), arXiv 2312.15001, sec. 5, Table 1; reference ``configs/hyperteacher.py``,
    ``metax/data/dataset/teacher.py``.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field
from torch import Tensor

from dynascope.nn.meta_learners import MetaLearner, soft_cross_entropy
from dynascope.tasks.few_shot_hyperteacher import FewShotHyperteacher
from dynascope.train import EngineRunConfig, Loop, Parts, SeedStreams

__all__ = [
    "LEARNER_DEFAULTS",
    "PAPER_OOD_ACCURACY",
    "HyperteacherRunConfig",
    "build_hyperteacher",
    "hyperteacher_config",
]

# Reference ``configs/hyperteacher.py``: base width, inner steps and lr, outer lr, wd, clip.
LEARNER_DEFAULTS: dict[str, dict[str, float | int]] = {
    "hnet_linear": {"d_mlp": 128, "inner_steps": 10, "inner_lr": 0.3, "outer_lr": 1e-3,
                    "weight_decay": 1e-2, "clip": 1.0},
    "anil": {"d_mlp": 512, "inner_steps": 100, "inner_lr": 0.03, "outer_lr": 1e-3,
             "weight_decay": 1e-4, "clip": 2.0},
    "learned_init": {"d_mlp": 384, "inner_steps": 10, "inner_lr": 0.01, "outer_lr": 1e-3,
                     "weight_decay": 1e-4, "clip": 2.0},
}  # fmt: skip
# S5 / paper Table 1: OOD accuracy (%) by learner and (M, K).
PAPER_OOD_ACCURACY: dict[tuple[str, int, int], float] = {
    **dict(zip([("anil", 4, 1), ("anil", 4, 2), ("anil", 8, 1), ("anil", 8, 2), ("anil", 8, 4),
                ("anil", 8, 8)], [46.5, 60.8, 55.8, 59.8, 60.6, 61.5])),
    **dict(zip([("learned_init", 4, 1), ("learned_init", 4, 2), ("learned_init", 8, 1),
                ("learned_init", 8, 2), ("learned_init", 8, 4), ("learned_init", 8, 8)],
               [20.5, 55.4, 47.4, 60.6, 62.8, 64.1])),
    **dict(zip([("hnet_linear", 4, 1), ("hnet_linear", 4, 2), ("hnet_linear", 8, 1),
                ("hnet_linear", 8, 2), ("hnet_linear", 8, 4), ("hnet_linear", 8, 8)],
               [20.4, 76.4, 26.7, 87.5, 93.5, 91.7])),
}  # fmt: skip


class HyperteacherRunConfig(EngineRunConfig):
    """One meta-learner on one hyperteacher (defaults: the reference, hnet_linear); the loop
    holds the outer steps, the gradient clipping and the device."""

    kind: Literal["hyperteacher"] = "hyperteacher"
    learner: Literal["hnet_linear", "anil", "learned_init"] = "hnet_linear"
    n_experts: int = Field(4, ge=1)
    num_hot: int = Field(2, ge=1)
    support: Literal["random", "non_compositional", "connected", "disconnected", "diagonal",
                     "dense"] = "random"  # fmt: skip
    frac_ood: float = Field(0.25, gt=0, lt=1)
    chunking: bool = False
    continuous: bool = False
    d_mlp: int = Field(128, ge=1, description="base MLP hidden width")
    n_hidden_layers: int = Field(3, ge=1)
    inner_steps: int = Field(10, ge=0)
    inner_lr: float = Field(0.3, gt=0)
    second_order: bool = True
    outer_lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(1e-2, ge=0)
    meta_batch: int = Field(128, ge=1)
    shots_support: int = Field(256, ge=1)
    shots_query: int = Field(256, ge=1)
    eval_tasks: int = Field(512, ge=1)


def hyperteacher_config(
    learner: str, n_experts: int, num_hot: int, seed: int, steps: int = 200_000, **update: Any
) -> HyperteacherRunConfig:
    """A learner's reference config (:data:`LEARNER_DEFAULTS`; its ``clip`` becomes the loop's
    gradient clipping) at (M, K) = (``n_experts``, ``num_hot``), ``steps`` outer steps.

    Raises:
        KeyError: for a learner without defaults.
        pydantic.ValidationError: for an invalid combined config.
    """
    defaults = dict(LEARNER_DEFAULTS[learner])
    loop = Loop(steps=steps, log_every=min(1000, steps), grad_clip=float(defaults.pop("clip")))
    fields = defaults | {"learner": learner, "n_experts": n_experts, "num_hot": num_hot}
    return HyperteacherRunConfig.model_validate(fields | {"seed": seed, "loop": loop} | update)


def _episode(learner: MetaLearner, cfg: HyperteacherRunConfig, batch, second_order: bool):
    """Query loss and accuracy after adapting on the support shots of ``batch``."""
    s = cfg.shots_support
    v = learner.adapt(
        batch["x"][:, :s], batch["y"][:, :s], steps=cfg.inner_steps, lr=cfg.inner_lr,
        second_order=second_order,
    )  # fmt: skip
    logits = learner(batch["x"][:, s:], v)
    loss = soft_cross_entropy(logits, batch["y"][:, s:]).mean()
    return loss, (logits.argmax(-1) == batch["hard"][:, s:]).float().mean()


def build_hyperteacher(config: HyperteacherRunConfig, streams: SeedStreams) -> Parts:
    """The hyperteacher (stream ``teacher``), the learner (stream ``learner``), training tasks
    from the ``data`` stream, AdamW on the adapted query loss, the evaluation at the end."""
    cfg = config
    teacher = FewShotHyperteacher(
        n_experts=cfg.n_experts,
        num_hot=cfg.num_hot,
        support=cfg.support,
        frac_ood=cfg.frac_ood,
        chunking=cfg.chunking,
        continuous=cfg.continuous,
        seed=streams("teacher"),
    )
    learner = MetaLearner(
        cfg.learner, 16, 8, cfg.d_mlp, cfg.n_hidden_layers,
        d_embedding=4 * cfg.n_experts, generator=streams.generator("learner"),
    )  # fmt: skip
    shots = cfg.shots_support + cfg.shots_query

    def data(g: torch.Generator) -> dict[str, Tensor]:
        batch = teacher.sample("train", cfg.meta_batch, shots, g)
        return {k: batch[k] for k in ("x", "y", "hard")}

    def loss(model: MetaLearner, batch: dict[str, Tensor]) -> tuple[Tensor, dict]:
        value, accuracy = _episode(model, cfg, batch, cfg.second_order)
        return value, {"query_accuracy": accuracy}

    def optimizer(model: MetaLearner) -> torch.optim.Optimizer:
        return torch.optim.AdamW(model.parameters(), lr=cfg.outer_lr, weight_decay=cfg.weight_decay)

    def evaluation(model: MetaLearner, ctx: Any) -> dict[str, float]:
        """Mean query loss and accuracy over ``eval_tasks`` tasks of each split (chunked)."""
        g, dev = streams.generator("eval"), next(model.parameters()).device
        out = {}
        for split in ("train", "ood"):
            loss_sum = acc_sum = 0.0
            for start in range(0, cfg.eval_tasks, cfg.meta_batch):
                n = min(cfg.meta_batch, cfg.eval_tasks - start)
                batch = {k: v.to(dev) for k, v in teacher.sample(split, n, shots, g).items()}
                with torch.no_grad():  # the inner loop turns gradients on for its own steps
                    value, acc = _episode(model, cfg, batch, False)
                loss_sum += float(value) * n
                acc_sum += float(acc) * n
            out[f"{split}.loss"] = loss_sum / cfg.eval_tasks
            out[f"{split}.accuracy"] = acc_sum / cfg.eval_tasks
        return out

    return Parts(
        model=learner,
        data=data,
        loss=loss,
        optimizer=optimizer,
        probes=[(evaluation, _AtEnd(cfg.loop.steps))],
    )


class _AtEnd:
    """A probe schedule due at the last step only."""

    def __init__(self, step: int) -> None:
        self.step = step

    def due(self, step: int) -> bool:
        return step == self.step
