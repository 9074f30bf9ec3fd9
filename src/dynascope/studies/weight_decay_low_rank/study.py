"""Study ``weight-decay-low-rank`` (SYSTEMS.md S1): weight decay makes W_QK and W_OV low-rank.

Notes (system, theory, verdicts, calibration): docs/studies/weight-decay-low-rank.md.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from dynascope.config import RunConfig, validate_config
from dynascope.studies.base import RunSpec, Study
from dynascope.train import Loop, build_registry

from .analysis import analyze
from .protocol import PROTOCOL
from .runs import ToyRun, build_toy

__all__ = ["CLAIM", "STUDY", "WeightDecayLowRankPreset", "build_runs"]

CLAIM = (
    "Weight decay on the factors of W_QK = W_Q W_K^T and W_OV = W_V W_O acts as a nuclear-norm "
    "penalty on the products and lowers their rank; decaying attention less helps language "
    "modelling."
)
SOURCE = (
    "Kobayashi, Akram, von Oswald, 'Weight decay induces low-rank attention layers', "
    "NeurIPS 2024, arXiv 2410.23819"
)


class WeightDecayLowRankPreset(BaseModel):
    """A preset: the toy run, the recall base run and its λ_attn, the LM base run and its λ;
    every arm runs ``seeds`` seeds (one ensemble per arm)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    toy: ToyRun
    recall: RunConfig
    recall_lambda: float = Field(gt=0, description="λ_attn of the decayed arm (the other: 0)")
    lm: RunConfig
    lm_lambda: float = Field(gt=0)
    seeds: int = Field(3, ge=1)


def _recall_run(d_model: int, steps: int, batch_size: int, lr: float = 3e-3) -> RunConfig:
    return validate_config(
        {
            "name": "recall",
            "model": {"name": "transformer", "n_layers": 2, "d_model": d_model, "n_heads": 2,
                      "d_mlp": 0, "use_ln": False, "positional": "learned"},
            "task": {"name": "associative_recall", "n_keys": 16, "n_values": 16, "n_pairs": 8},
            "optimizer": {"name": "adamw", "lr": lr,
                          "weight_decay": {"attention": 0.0, "matrices": 0.01, "vectors": 0.0}},
            "train": {"steps": steps, "batch_size": batch_size, "eval_every": max(1, steps // 4),
                      "eval_batches": 8, "checkpoint_every": steps, "log_every": 10},
            "monitor": {"probes": ["qk_spectrum", "ov_spectrum"], "schedule": "log", "points": 25},
        }
    )  # fmt: skip


def _lm_run(
    d_model: int, n_heads: int, n_ctx: int, steps: int, batch_size: int, text: str | None = None
) -> RunConfig:
    return validate_config(
        {
            "name": "lm",
            "model": {"name": "transformer", "n_layers": 2, "d_model": d_model,
                      "n_heads": n_heads, "d_mlp": 4 * d_model, "use_ln": True},
            "task": {"name": "char_lm", "n_ctx": n_ctx, "text": text},
            "optimizer": {"name": "adamw", "lr": 3e-3},
            "train": {"steps": steps, "batch_size": batch_size, "eval_every": max(1, steps // 4),
                      "eval_batches": 16, "checkpoint_every": steps, "log_every": 10},
            "monitor": {"probes": ["qk_spectrum", "ov_spectrum"], "schedule": "log", "points": 10},
        }
    )  # fmt: skip


_SMOKE_TEXT = (
    "def add(a, b):\n    return a + b\n\n\nclass Point:\n    def __init__(self, x, y):\n"
    "        self.x = x\n        self.y = y\n" * 20
)


def _toy(steps: int = 1000, **fields) -> ToyRun:
    return ToyRun(loop=Loop(steps=steps, dtype="float64", checkpoint_every=steps), **fields)


def smoke() -> WeightDecayLowRankPreset:
    """Plumbing only: seconds."""
    return WeightDecayLowRankPreset(
        toy=_toy(50, lambdas=[0.0, 0.4], fine_lambdas=5),
        recall=_recall_run(d_model=16, steps=30, batch_size=32),
        recall_lambda=1.0,
        lm=_lm_run(d_model=16, n_heads=2, n_ctx=16, steps=20, batch_size=8, text=_SMOKE_TEXT),
        lm_lambda=1.0,
    )


def fast() -> WeightDecayLowRankPreset:
    """5 seeds per arm: toy (factor and product penalty), 3 recall arms (1000 steps, batch 64,
    lr 1e-2), 3 LM arms (600 steps, batch 16, n_ctx 32); sizes chosen on calibration seeds
    10000 and 20000 for cost and for learning recall (docs/studies/weight-decay-low-rank.md)."""
    return WeightDecayLowRankPreset(
        toy=_toy(),
        recall=_recall_run(d_model=32, steps=1000, batch_size=64, lr=1e-2),
        recall_lambda=1.0,
        lm=_lm_run(d_model=64, n_heads=4, n_ctx=32, steps=600, batch_size=16),
        lm_lambda=1.0,
        seeds=5,
    )


def paper() -> WeightDecayLowRankPreset:
    """Closer to the paper's scale (GPU): longer recall training, a 10-layer d_model 512 LM,
    5 seeds per arm."""
    lm = _lm_run(d_model=512, n_heads=8, n_ctx=256, steps=20_000, batch_size=64)
    lm = validate_config(
        lm.model_dump(mode="json"),
        ["model.n_layers=10", "device=cuda", "optimizer.warmup_steps=500",
         "optimizer.lr_schedule=cosine", "optimizer.lr=0.001"],
    )  # fmt: skip
    return WeightDecayLowRankPreset(
        toy=_toy(),
        recall=_recall_run(d_model=32, steps=10_000, batch_size=128),
        recall_lambda=1.0,
        lm=lm,
        lm_lambda=0.1,
        seeds=5,
    )


def _arm(base: RunConfig, name: str, overrides: list[str], seeds: list[int]) -> list[RunSpec]:
    """One ensemble of ``seeds`` runs of ``base`` with ``overrides`` (group ``name``)."""
    return [
        RunSpec(f"{name}_s{k}", validate_config(base.model_dump(mode="json"),
                [f"name={name}", f"seed={s}", *overrides]), build_registry, group=name)
        for k, s in enumerate(seeds)
    ]  # fmt: skip


def build_runs(preset: WeightDecayLowRankPreset, seed: int = 0) -> list[RunSpec]:
    """Toy runs (one per seed) with λ on the factors and, the ablation, on the product; recall
    arms λ_attn = 0, λ_attn = λ and the control (λ_attn = 0, decay λ on the other matrices); LM
    arms uniform (λ everywhere), decoupled (λ_attn = 0) and the control (λ_other = 0). Seeds
    ``seed + k``, k < ``preset.seeds``; one ensemble per arm."""
    seeds = [seed + k for k in range(preset.seeds)]
    toy = [
        RunSpec(f"a_{arm}_s{k}", preset.toy.model_copy(update={"seed": s, "penalty": penalty}),
                build_toy)
        for arm, penalty in (("toy", "factors"), ("product", "product"))
        for k, s in enumerate(seeds)
    ]  # fmt: skip
    lam = preset.recall_lambda
    recall = (
        _arm(preset.recall, "b_recall_wd0", ["optimizer.weight_decay.attention=0.0"], seeds)
        + _arm(preset.recall, f"b_recall_wd{lam:g}", [f"optimizer.weight_decay.attention={lam}"],
               seeds)
        + _arm(preset.recall, "b_recall_control",
               ["optimizer.weight_decay.attention=0.0", f"optimizer.weight_decay.matrices={lam}"],
               seeds)
    )  # fmt: skip
    lam = preset.lm_lambda
    lm = [
        spec
        for condition, attention, other in (("uniform", lam, lam), ("decoupled", 0.0, lam),
                                            ("control", lam, 0.0))
        for spec in _arm(
            preset.lm,
            f"c_lm_{condition}",
            [f"optimizer.weight_decay.attention={attention}",
             f"optimizer.weight_decay.matrices={other}"],
            seeds,
        )
    ]  # fmt: skip
    return toy + recall + lm


STUDY = Study(
    name="weight-decay-low-rank",
    claim=CLAIM,
    source=SOURCE,
    presets={"smoke": smoke, "fast": fast, "paper": paper},
    build_runs=build_runs,
    analyze=analyze,
    protocol=PROTOCOL,
)
