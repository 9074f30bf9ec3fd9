"""Loss barrier between two transformers trained from different inits, before and after
matching: the ``transformer`` runs of ``permuted-initialisations``.

Glossary:
    pair:       nets a and b, :class:`dynascope.nn.Transformer` built one after the other from
                the run's ``init`` stream and trained side by side on the engine (one
                :class:`~dynascope.studies.permuted_initialisations.runs.NetGroup`, the loss
                the sum of the two task losses, so each net trains as if alone) on associative
                recall, each with its own batches from the ``data`` stream.
    alpha:      ``theta(alpha) = alpha theta_a + (1 - alpha) theta_b'`` over every parameter
                (embeddings, LayerNorms, attention, MLP, unembedding); ``b'`` is b unpermuted
                (``vanilla``) or aligned to a by :func:`dynascope.probes.match_transformers`
                (``activation`` or ``weight``).
    loss:       the task's loss (cross-entropy at the last position, nats) on ``n_eval``
                held-out sequences; ``error`` is 1 - accuracy.
    barrier:    :func:`dynascope.probes.loss_barrier` of the loss (nats) or error along the path.

The matching reads ``n_match`` other sequences (both from the run's ``eval`` stream);
``apply_permutation`` checks every aligned copy on them. Reported in the study's tables
(:func:`barrier_tables`), not gated.

References:
    Frankle, Dziugaite, Roy, Carbin (2020), arXiv 1912.05671, Sec. 2 (barrier).
    Ainsworth, Hayase, Srinivasa (2023), arXiv 2209.04836 (matching before interpolating).
    Verma, Elbayad (2024), arXiv 2403.00986 (transformer permutations).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field
from torch import Tensor, nn
from torch.func import functional_call

from dynascope.config import (
    AssociativeRecallConfig,
    TransformerConfig,
    build_model,
    build_task,
)
from dynascope.monitor import EveryN
from dynascope.probes import apply_permutation, loss_barrier, match_transformers
from dynascope.probes.permutation import interpolate_parameters
from dynascope.store import Run
from dynascope.studies._run_values import last_or_nan
from dynascope.tasks.base import Task
from dynascope.train import EngineRunConfig, Parts, SeedStreams

from .runs import NetGroup

__all__ = [
    "TransformerBarrierRun",
    "barrier_tables",
    "build_transformer_pair",
    "pair_barriers",
    "split_runs",
]

GROUP = "transformer"
METHODS = ("vanilla", "activation", "weight")


class TransformerBarrierRun(EngineRunConfig):
    """One pair: two recall transformers, trained, matched both ways, interpolated."""

    group: Literal["transformer"] = GROUP
    n_keys: int = Field(4, ge=1)
    n_values: int = Field(4, ge=1)
    n_pairs: int = Field(2, ge=1, description="key-value pairs per sequence (P)")
    n_layers: int = Field(2, ge=1)
    d_model: int = Field(32, ge=1)
    n_heads: int = Field(2, ge=1)
    d_mlp: int = Field(64, ge=0)
    lr: float = Field(3e-3, gt=0, description="AdamW, no weight decay (the registry default)")
    batch_size: int = Field(128, ge=1)
    n_match: int = Field(512, ge=1, description="sequences the matching reads")
    n_eval: int = Field(2048, ge=1, description="held-out sequences along the path")
    n_alphas: int = Field(11, ge=3)

    def task_config(self) -> AssociativeRecallConfig:
        """The registry's associative-recall task."""
        return AssociativeRecallConfig(
            n_keys=self.n_keys, n_values=self.n_values, n_pairs=self.n_pairs
        )

    def net_config(self) -> TransformerConfig:
        """The registry's transformer of one net."""
        return TransformerConfig(
            n_layers=self.n_layers, d_model=self.d_model, n_heads=self.n_heads, d_mlp=self.d_mlp
        )


def _pair_loss(task: Task, model: NetGroup, batch: dict[str, Tensor]) -> tuple[Tensor, dict]:
    losses = []
    for net, x, y in zip(model.nets, batch["x"].unbind(0), batch["y"].unbind(0), strict=True):
        losses.append(task.loss(net(x), {"x": x, "y": y}))
    return torch.stack(losses).sum(), {f"net{i}.loss": loss for i, loss in enumerate(losses)}


def build_transformer_pair(config: TransformerBarrierRun, streams: SeedStreams) -> Parts:
    """Two transformers (global ``init`` RNG, seeded by the engine) trained side by side by
    AdamW; :func:`pair_barriers` at the last step."""
    task = build_task(config.task_config())
    model = NetGroup([build_model(config.net_config(), task) for _ in range(2)])

    def data(generator: torch.Generator) -> dict[str, Tensor]:
        batches = [task.batch("train", config.batch_size, generator) for _ in range(2)]
        return {key: torch.stack([b[key] for b in batches]) for key in ("x", "y")}

    def probe(group: NetGroup, ctx: Any) -> dict[str, Tensor]:
        if ctx.step != config.loop.steps:
            return {}
        return pair_barriers(config, task, *group.nets, streams.generator("eval"))

    return Parts(
        model=model,
        data=data,
        loss=lambda m, batch: _pair_loss(task, m, batch),
        optimizer=lambda m: torch.optim.AdamW(m.parameters(), lr=config.lr, weight_decay=0.0),
        probes=[(probe, EveryN(config.loop.steps))],
    )


def pair_barriers(
    config: TransformerBarrierRun,
    task: Task,
    model_a: nn.Module,
    model_b: nn.Module,
    generator: torch.Generator,
) -> dict[str, torch.Tensor]:
    """Barriers of one trained pair (module glossary); keys ``barrier.{method}.{loss,error}``,
    ``path.{method}.loss`` ``[n_alpha]``, ``net{a,b}.accuracy``, ``path.alphas``.

    ``generator`` draws the matching's and the path's held-out sequences (one set for both
    nets). Eval mode is set on both nets and restored afterwards.
    """
    modes = [model_a.training, model_b.training]
    try:
        return _pair_barriers(config, task, model_a.eval(), model_b.eval(), generator)
    finally:
        model_a.train(modes[0])
        model_b.train(modes[1])


def _pair_barriers(config, task, model_a, model_b, gen) -> dict[str, torch.Tensor]:
    device = next(model_a.parameters()).device
    x_match = task.batch("val", config.n_match, gen)["x"].to(device)
    batch = {k: v.to(device) for k, v in task.batch("val", config.n_eval, gen).items()}
    alphas = torch.linspace(0.0, 1.0, config.n_alphas, dtype=torch.float64)
    values: dict[str, torch.Tensor] = {"path.alphas": alphas}
    aligned = {"vanilla": model_b}
    for method in ("activation", "weight"):
        perm = match_transformers(model_a, model_b, x_match, method=method)
        aligned[method] = apply_permutation(model_b, perm)  # raises if not the same function
    with torch.no_grad():
        for name, net in (("a", model_a), ("b", model_b)):
            values[f"net{name}.accuracy"] = task.metrics(net(batch["x"]), batch)["accuracy"]
        for method in METHODS:
            loss, error = [], []
            for alpha in alphas.tolist():
                params = interpolate_parameters(model_a, aligned[method], alpha)
                output = functional_call(model_a, params, (batch["x"],))
                loss.append(task.loss(output, batch).double())
                error.append(1.0 - task.metrics(output, batch)["accuracy"].double())
            loss, error = torch.stack(loss), torch.stack(error)
            values[f"path.{method}.loss"] = loss
            values[f"barrier.{method}.loss"] = loss_barrier(alphas, loss)
            values[f"barrier.{method}.error"] = loss_barrier(alphas, error)
    return values


def split_runs(runs: dict[str, Run]) -> tuple[dict[str, Run], dict[str, Run]]:
    """``(other runs, transformer-barrier runs)`` of a study's runs."""
    mine = {n: r for n, r in runs.items() if r.config.get("group") == GROUP}
    return {n: r for n, r in runs.items() if n not in mine}, mine


def barrier_tables(runs: dict[str, Run]) -> dict[str, list[dict]]:
    """One table, a row per seed pair: accuracies and barriers before/after matching."""
    if not runs:
        return {}
    rows = []
    for name, run in sorted(runs.items()):
        row = {"run": name, "seed": run.config["seed"]}
        row["accuracy a / b"] = (
            f"{last_or_nan(run, 'neta.accuracy'):.3f} / {last_or_nan(run, 'netb.accuracy'):.3f}"
        )
        for method in METHODS:
            row[f"NLL barrier {method} (nats)"] = last_or_nan(run, f"barrier.{method}.loss")
        for method in METHODS:
            row[f"error barrier {method}"] = last_or_nan(run, f"barrier.{method}.error")
        rows.append(row)
    return {"transformers on associative recall: barrier before/after matching": rows}
