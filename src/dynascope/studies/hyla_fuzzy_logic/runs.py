"""Runs of ``hyla-fuzzy-logic`` on the engine: the fuzzy-logic run config and its ``build``.

One run trains a :class:`~dynascope.nn.SequenceTransformer` with one attention kind on
fuzzy-logic regression (:class:`~dynascope.tasks.fuzzy_logic.FuzzyLogic`), MSE on the last
position; evaluation logs ``{train,test,ood}.r2`` (R² per sequence, averaged) and ``.mse``; a
probe at step 0 and the last step logs the latent-code probe ``probe.{id,test}.L{i}.{r2,f1}``
(notes: ``docs/studies/hyla-fuzzy-logic.md``).
"""

from __future__ import annotations

import torch
from pydantic import Field

from dynascope.monitor import EveryN
from dynascope.nn.attention import AttentionKind
from dynascope.nn.capture import capture_patterns
from dynascope.nn.hypernet_transformer import SequenceTransformer
from dynascope.probes.latent_code import attention_latent_code, logistic_f1, ridge_r2
from dynascope.studies._sequence_training import SequenceRunConfig, adamw_matrices
from dynascope.tasks.fuzzy_logic import FuzzyLogic, fuzzy_logic_r2
from dynascope.train import Parts, SeedStreams

__all__ = ["EVAL_SPLITS", "FuzzyRunConfig", "build_fuzzy", "sequence_transformer"]

EVAL_SPLITS = ("train", "test", "ood")


class ModelSizes(SequenceRunConfig):
    """The :class:`~dynascope.nn.SequenceTransformer` of a run (shared with sRAVEN runs)."""

    attention: AttentionKind = "hyla"
    d_model: int = Field(64, ge=1)
    n_layers: int = Field(2, ge=1)
    n_heads: int = Field(8, ge=1)
    d_head: int = Field(2, ge=1, description="per-head q/k/v width (HYLA's generated hidden)")
    d_mlp: int = Field(128, ge=1)
    relative_position_buckets: int | None = Field(
        128, ge=2, description="T5 buckets = max distance; None: no position information"
    )


def sequence_transformer(config: ModelSizes, d_in: int, d_out: int) -> SequenceTransformer:
    """The config's model (initialised from torch's global RNG, seeded by the engine)."""
    return SequenceTransformer(
        d_in,
        d_out,
        d_model=config.d_model,
        n_layers=config.n_layers,
        n_heads=config.n_heads,
        d_head=config.d_head,
        d_mlp=config.d_mlp,
        attention=config.attention,
        relative_position_buckets=config.relative_position_buckets,
    )


class FuzzyRunConfig(ModelSizes):
    """One run: an attention kind on fuzzy-logic regression (task fields: the task's names)."""

    n_variables: int = Field(4, ge=1, description="L")
    n_terms: int = Field(2, ge=1, description="K")
    seq_len: int = Field(32, ge=2)
    frac_ood_conj: float = Field(0.25, ge=0, lt=1)
    frac_test: float = Field(0.7, gt=0, lt=1)
    split_seed: int = Field(0, ge=0, description="seed of the fixed test/train permutation")
    eval_sequences: int = Field(2048, ge=2)
    probe_sequences: int = Field(1024, ge=4)


def _task(config: FuzzyRunConfig) -> FuzzyLogic:
    return FuzzyLogic(
        config.n_variables,
        config.n_terms,
        config.seq_len,
        frac_ood_conj=config.frac_ood_conj,
        frac_test=config.frac_test,
        split_seed=config.split_seed,
    )


def _eval_sets(task: FuzzyLogic, config: FuzzyRunConfig, gen: torch.Generator) -> dict:
    sets = {s: task.sample(s, config.eval_sequences, gen) for s in EVAL_SPLITS}
    # Probe sets: one fixed query x shared by every sequence (reference "valid_fixed_query").
    query = torch.rand(1, task.n_variables, generator=gen)
    for name, split in (("probe_fit", "train"), ("probe_id", "train"), ("probe_test", "test")):
        batch = task.sample(split, config.probe_sequences, gen)
        batch["x"][:, -1, :-1] = query
        sets[name] = batch
    return sets


def _last(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x, last_only=True)[:, -1, 0]  # the last block computes that query only


def _mse_last(model: torch.nn.Module, batch: dict) -> torch.Tensor:
    return (_last(model, batch["x"]) - batch["y"]).square().mean()


def build_fuzzy(config: FuzzyRunConfig, streams: SeedStreams) -> Parts:
    """Model, training batches (stream ``data``), evaluation and latent probe of one run."""
    task = _task(config)
    model = sequence_transformer(config, task.d_in, 1)
    evals = _eval_sets(task, config, streams.generator("eval"))

    def data(gen: torch.Generator) -> dict[str, torch.Tensor]:
        batch = task.sample("train", config.batch_size, gen)
        return {"x": batch["x"], "y": batch["y"]}

    return Parts(
        model=model,
        data=data,
        loss=_mse_last,
        optimizer=adamw_matrices(config),
        evaluate=lambda m: _evaluate(m, _on(evals, m)),
        probes=[(lambda m, ctx: _probe(m, _on(evals, m)), EveryN(config.loop.steps))],
    )


def _on(evals: dict, model: torch.nn.Module) -> dict:
    p = next(model.parameters())
    return {
        k: {n: t.to(p.device, p.dtype if t.is_floating_point() else t.dtype) for n, t in v.items()}
        for k, v in evals.items()
    }


def _evaluate(model: torch.nn.Module, evals: dict) -> dict[str, torch.Tensor]:
    out = {}
    for split in EVAL_SPLITS:
        b = evals[split]
        pred = _last(model, b["x"])
        out[f"{split}.r2"] = fuzzy_logic_r2(pred, b["y"], b["base_mse"]).mean()
        out[f"{split}.mse"] = (pred - b["y"]).square().mean()
    return out


@torch.no_grad()
def _probe(model: SequenceTransformer, evals: dict) -> dict[str, torch.Tensor]:
    """Ridge R² and logistic F1 of the K-hot terms from each layer's code a_{h,q,q}."""
    codes = {}
    for name in ("probe_fit", "probe_id", "probe_test"):
        with capture_patterns(model) as patterns:
            model(evals[name]["x"])
        codes[name] = [
            attention_latent_code(patterns[f"blocks.{i}.attn"]) for i in range(len(model.blocks))
        ]
    out = {}
    fit = evals["probe_fit"]["latent"]
    for i in range(len(model.blocks)):
        for tag in ("id", "test"):
            target = evals[f"probe_{tag}"]["latent"]
            code, other = codes["probe_fit"][i], codes[f"probe_{tag}"][i]
            _, r2 = ridge_r2(code, fit, other, target, alpha=1.0)
            _, f1 = logistic_f1(code, fit, other, target)
            out[f"probe.{tag}.L{i}.r2"] = r2
            out[f"probe.{tag}.L{i}.f1"] = f1
    return out
