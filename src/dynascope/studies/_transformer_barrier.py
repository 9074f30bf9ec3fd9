"""Loss barrier between two transformers trained from different seeds, before and after
matching (issue 20, item 3): a self-contained run of the ``permuted-initialisations`` study.

Glossary:
    pair k:     nets a and b, :class:`dynascope.nn.Transformer` trained by the engine
                (:class:`dynascope.train.Trainer`) on associative recall from seeds
                ``2 (seed + k)`` and ``2 (seed + k) + 1`` (init and batches).
    alpha:      ``theta(alpha) = alpha theta_a + (1 - alpha) theta_b'`` over every parameter
                (embeddings, LayerNorms, attention, MLP, unembedding); ``b'`` is b unpermuted
                (``vanilla``) or aligned to a by :func:`dynascope.probes.match_transformers`
                (``activation`` or ``weight``).
    loss:       the task's loss (cross-entropy at the last position, nats) on ``n_eval``
                held-out sequences; ``error`` is 1 - accuracy.
    barrier:    :func:`dynascope.probes.loss_barrier` of the loss (nats) or error along the path.

The matching reads ``n_match`` other sequences; ``apply_permutation`` checks every aligned
copy on them. Reported in the study's tables (:func:`barrier_tables`), not gated.

References:
    Frankle, Dziugaite, Roy, Carbin (2020), arXiv 1912.05671, Sec. 2 (barrier).
    Ainsworth, Hayase, Srinivasa (2023), arXiv 2209.04836 (matching before interpolating).
    Verma, Elbayad (2024), arXiv 2403.00986 (transformer permutations).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn
from torch.func import functional_call

from dynascope.config import RunConfig
from dynascope.probes import apply_permutation, loss_barrier, match_transformers
from dynascope.probes.permutation import interpolate_parameters
from dynascope.store import Run, RunStore
from dynascope.studies._run_values import last_or_nan
from dynascope.studies.base import one_intra_op_thread
from dynascope.tasks.base import Task
from dynascope.train import Trainer

__all__ = ["TransformerBarrierConfig", "barrier_tables", "run_transformer_barrier", "split_runs"]

GROUP = "transformer"
METHODS = ("vanilla", "activation", "weight")


class TransformerBarrierConfig(BaseModel):
    """One seed pair: two recall transformers, trained, matched both ways, interpolated."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    group: Literal["transformer"] = GROUP
    seed: int = Field(0, ge=0, description="pair index; nets use 2*seed and 2*seed + 1")
    n_keys: int = Field(4, ge=1)
    n_values: int = Field(4, ge=1)
    n_pairs: int = Field(2, ge=1, description="key-value pairs per sequence (P)")
    n_layers: int = Field(2, ge=1)
    d_model: int = Field(32, ge=1)
    n_heads: int = Field(2, ge=1)
    d_mlp: int = Field(64, ge=0)
    lr: float = Field(3e-3, gt=0)
    steps: int = Field(1500, ge=1)
    batch_size: int = Field(128, ge=1)
    n_match: int = Field(512, ge=1, description="sequences the matching reads")
    n_eval: int = Field(2048, ge=1, description="held-out sequences along the path")
    n_alphas: int = Field(11, ge=3)

    def run_config(self, seed: int) -> RunConfig:
        """The engine's config of one net."""
        return RunConfig.model_validate(
            {
                "name": f"recall_seed{seed}",
                "seed": seed,
                "model": {
                    "name": "transformer",
                    "n_layers": self.n_layers,
                    "d_model": self.d_model,
                    "n_heads": self.n_heads,
                    "d_mlp": self.d_mlp,
                },
                "task": {
                    "name": "associative_recall",
                    "n_keys": self.n_keys,
                    "n_values": self.n_values,
                    "n_pairs": self.n_pairs,
                },
                "optimizer": {"name": "adamw", "lr": self.lr},
                "train": {
                    "steps": self.steps,
                    "batch_size": self.batch_size,
                    "eval_every": self.steps,
                    "checkpoint_every": self.steps,
                    "log_every": max(1, self.steps // 10),
                },
                "monitor": {"probes": []},
            }
        )


def _train(config: TransformerBarrierConfig, seed: int) -> Trainer:
    with tempfile.TemporaryDirectory() as scratch:  # the nets' own stores are not kept
        trainer = Trainer(config.run_config(seed), Path(scratch) / "run")
        result = trainer.run()
    if result.status != "finished":
        raise RuntimeError(f"net of seed {seed} ended {result.status} at step {result.step}")
    return trainer


def run_transformer_barrier(
    config: TransformerBarrierConfig, run_dir: Path, progress: bool = False
) -> None:
    """Train pair ``config.seed``, match, interpolate; write the barriers to ``run_dir``."""
    del progress
    with one_intra_op_thread(), RunStore(Path(run_dir)) as store:
        store.truncate_after(-1)
        store.write_config(config.model_dump(mode="json"))
        store.set_status(0, "running")
        values = measure_pair(config)
        store.log(config.steps, values)
        store.set_status(config.steps, "finished")


def measure_pair(config: TransformerBarrierConfig) -> dict[str, torch.Tensor]:
    """Barriers of one seed pair (module glossary); keys ``barrier.{method}.{loss,error}``,
    ``path.{method}.loss`` ``[n_alpha]``, ``net{a,b}.accuracy``, ``path.alphas``."""
    trainers = [_train(config, 2 * config.seed + i) for i in range(2)]
    return pair_barriers(config, trainers[0].task, trainers[0].model, trainers[1].model)


def pair_barriers(
    config: TransformerBarrierConfig, task: Task, model_a: nn.Module, model_b: nn.Module
) -> dict[str, torch.Tensor]:
    """The measurements of :func:`measure_pair` on two given (trained) nets."""
    model_a, model_b = model_a.eval(), model_b.eval()
    gen = torch.Generator().manual_seed(10_000 + config.seed)  # shared by both nets
    x_match = task.batch("val", config.n_match, gen)["x"]
    batch = task.batch("val", config.n_eval, gen)
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
        row = {"run": name, "seeds": f"{2 * run.config['seed']}, {2 * run.config['seed'] + 1}"}
        row["accuracy a / b"] = (
            f"{last_or_nan(run, 'neta.accuracy'):.3f} / {last_or_nan(run, 'netb.accuracy'):.3f}"
        )
        for method in METHODS:
            row[f"NLL barrier {method} (nats)"] = last_or_nan(run, f"barrier.{method}.loss")
        for method in METHODS:
            row[f"error barrier {method}"] = last_or_nan(run, f"barrier.{method}.error")
        rows.append(row)
    return {"transformers on associative recall: barrier before/after matching": rows}
