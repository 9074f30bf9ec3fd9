"""Runs of ``compositional-icl-bottleneck`` on the engine: the run config and its ``build``.

One run trains the vanilla or the hypernetwork transformer on one support of the hyperteacher
(:class:`~dynascope.tasks.hyper_teacher.HyperTeacher`), MSE on the query; evaluation logs
``{id,ood}.r2`` (``id``: the run's own training distribution; ``ood``: the teacher's unseen
combinations, for unstructured runs too, the ablation control); a probe at step 0 and the last
step logs the ridge R² of z from the query token after each layer, ``probe.ood.L{i}.r2``
(notes: the study's docs page).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, model_validator

from dynascope.monitor import EveryN
from dynascope.nn.capture import capture
from dynascope.nn.hypernet_transformer import HypernetTransformer, SequenceTransformer
from dynascope.probes.latent_code import ridge_r2
from dynascope.studies._sequence_training import SequenceRunConfig, adamw_matrices
from dynascope.tasks.hyper_teacher import HyperTeacher
from dynascope.train import Parts, SeedStreams

__all__ = ["CompositionalRunConfig", "build_compositional", "query_r2"]


class CompositionalRunConfig(SequenceRunConfig):
    """One run: a model trained on one support (AdamW on matrices; the loop clips and decays).

    Raises:
        ValueError: if ``n_heads`` does not divide ``d_model``.
    """

    model: Literal["vanilla", "hyper"] = "hyper"
    support: Literal["connected", "disconnected", "connected+"] = "connected+"
    train_split: Literal["train", "unstructured"] = "train"
    teacher_seed: int = Field(0, ge=0)
    n_context: int = Field(32, ge=1, description="N context pairs")
    d_model: int = Field(64, ge=1)
    n_layers: int = Field(2, ge=1)
    n_heads: int = Field(4, ge=1)
    d_latent: int = Field(6, ge=1)
    d_hidden: int = Field(32, ge=1, description="generated MLP hidden width")
    relative_position_buckets: int | None = Field(
        None, ge=2, description="T5 buckets = max distance; None means n_context + 1"
    )
    weight_decay: float = Field(0.0, ge=0, description="AdamW decay of >= 2-D parameters")
    eval_sequences: int = Field(4000, ge=8)

    @model_validator(mode="after")
    def _heads_divide_width(self):
        if self.d_model % self.n_heads:
            raise ValueError(
                f"n_heads must divide d_model (got d_model={self.d_model}, n_heads={self.n_heads})"
            )
        return self


def _model(config: CompositionalRunConfig) -> torch.nn.Module:
    common = dict(
        d_model=config.d_model,
        n_layers=config.n_layers,
        n_heads=config.n_heads,
        d_mlp=4 * config.d_model,
        attention="softmax",
        relative_position_buckets=config.relative_position_buckets or config.n_context + 1,
    )
    if config.model == "vanilla":
        return SequenceTransformer(17, 1, **common)
    return HypernetTransformer(17, 16, d_latent=config.d_latent, d_hidden=config.d_hidden, **common)


def _predict(model: torch.nn.Module, kind: str, batch: dict) -> torch.Tensor:
    """``[batch]`` predictions; the vanilla model reads ``(x_query, 0)`` as its last token, the
    hypernetwork one reads ``(0, 0)`` and gets ``x_query`` in its generated MLP."""
    ctx, xq = batch["context"], batch["x_query"]
    if kind == "vanilla":
        query = torch.cat([xq, torch.zeros_like(xq[:, :1])], dim=-1)[:, None]
        return model(torch.cat([ctx, query], dim=1))[:, -1, 0]
    tokens = torch.cat([ctx, torch.zeros_like(ctx[:, :1])], dim=1)
    return model(tokens, xq)[:, 0]


def query_r2(pred: torch.Tensor, batch: dict) -> torch.Tensor:
    """R² = 1 − MSE(y, ŷ) / MSE(y, mean of the context targets), a ratio of means, ``[]``."""
    y = batch["y_query"]
    base = (y - batch["context"][:, :, -1].mean(dim=1)).square().mean()
    return 1 - (pred - y).square().mean() / base


def build_compositional(config: CompositionalRunConfig, streams: SeedStreams) -> Parts:
    """Model, training batches (stream ``data``), evaluation and the z probe of one run."""
    teacher = HyperTeacher(
        n_context=config.n_context, support=config.support, teacher_seed=config.teacher_seed
    )
    model, kind = _model(config), config.model
    gen = streams.generator("eval")
    evals = {"id": teacher.sample(config.train_split, config.eval_sequences, gen)}
    evals["ood"] = teacher.sample("ood", config.eval_sequences, gen)
    if config.train_split == "unstructured":  # the ablation: probe fit on the teacher's tasks
        evals["fit"] = teacher.sample("train", config.eval_sequences, gen)
    probe = lambda m, ctx: _probe(m, config, _on(evals, m))  # noqa: E731
    probes = [(probe, EveryN(config.loop.steps))]

    def loss(m: torch.nn.Module, batch: dict) -> torch.Tensor:
        return (_predict(m, kind, batch) - batch["y_query"]).square().mean()

    def evaluate(m: torch.nn.Module) -> dict[str, torch.Tensor]:
        return {f"{n}.r2": query_r2(_predict(m, kind, b), b) for n, b in _on(evals, m).items()}

    return Parts(
        model=model,
        data=lambda g: teacher.sample(config.train_split, config.batch_size, g),
        loss=loss,
        optimizer=adamw_matrices(config),
        evaluate=evaluate,
        probes=probes,
    )


def _on(evals: dict, model: torch.nn.Module) -> dict:
    p = next(model.parameters())
    return {
        k: {n: t.to(p.device, p.dtype) if t.is_floating_point() else t for n, t in v.items()}
        for k, v in evals.items()
    }


@torch.no_grad()
def _probe(model, config: CompositionalRunConfig, evals: dict) -> dict[str, torch.Tensor]:
    """Ridge (alpha 1) from the query token's residual after each layer to z; OOD R².

    The ridge is fit on the teacher's training combinations: the ``id`` set of a structured
    run, the ``fit`` set (the same teacher's ``train`` split) of an unstructured one, whose
    ``id`` set has fresh modules per sequence and so no shared meaning of z.
    """
    prefix = "" if config.model == "vanilla" else "encoder."
    names = [f"{prefix}blocks.{i}.hook_resid_post" for i in range(config.n_layers)]
    evals = {"id": evals.get("fit", evals["id"]), "ood": evals["ood"]}
    feats = {}
    for split in ("id", "ood"):
        with capture(model, names) as cache:
            _predict(model, config.model, evals[split])
        feats[split] = [cache[n][:, -1] for n in names]
    out = {}
    for i in range(config.n_layers):
        _, r2 = ridge_r2(
            feats["id"][i], evals["id"]["z"], feats["ood"][i], evals["ood"]["z"], alpha=1.0
        )
        out[f"probe.ood.L{i}.r2"] = r2
    return out
