"""The ``fisher-kernel-low-rank`` study: presets and runs (notes:
docs/studies/fisher-kernel-low-rank.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from dynascope.studies.base import RunSpec, Study
from dynascope.train import Loop

from .analysis import analyze
from .protocol import PROTOCOL, SEEDS
from .runs import FisherKernelRun, build_fisher

__all__ = ["CLAIM", "FULL_STEPS", "SOURCE", "STUDY", "FisherKernelPreset", "build_runs"]

CLAIM = (
    "The Neural Fisher Kernel of a trained classifier is close to low-rank: its top 32 "
    "directions, computed matrix-free by randomized SVD, hold the kernel's top energy and give "
    "embeddings as good for linear probing as the penultimate layer."
)
SOURCE = (
    "Zhang, Zhai, Littwin, Susskind, 'Learning Representation from Neural Fisher Kernel with "
    "Low-rank Approximation', ICLR 2022, arXiv 2202.01944"
)


class FisherKernelPreset(BaseModel):
    """A preset: the base run, the embedding ranks k, the models, the seeds per arm (each
    (model, k) trains a task arm and a shuffled-label arm, the ablation of f1/f3)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base: FisherKernelRun
    ks: list[int] = Field(min_length=1)
    models: list[Literal["mlp", "cnn"]] = Field(default_factory=lambda: ["mlp"], min_length=1)
    seeds: int = Field(3, ge=1)


def _loop(steps: int, device: str = "cpu") -> Loop:
    return Loop(steps=steps, log_every=50, checkpoint_every=max(steps // 4, 1), device=device)


def smoke() -> FisherKernelPreset:
    """MLP 64-16-16-10, N = 50, k = 4, oversampling 4, 50 steps, 3 seeds per arm (seconds;
    plumbing only: too few seeds for a verdict)."""
    base = FisherKernelRun(loop=_loop(50), hidden=[16, 16], n_scored=50, k=4, oversampling=4)
    return FisherKernelPreset(base=base, ks=[4], seeds=SEEDS["smoke"])


def fast() -> FisherKernelPreset:
    """S14's CPU system: 64-64-64-10, N = 500, k = 32, 2,000 Adam steps, 5 seeds per arm
    (task labels; shuffled labels)."""
    return FisherKernelPreset(base=FisherKernelRun(loop=_loop(2000)), ks=[32], seeds=SEEDS["fast"])


FULL_STEPS = 10_000  # both arms; the shuffled arm memorises by ~2.8k (calibration seed 10000)


def full() -> FisherKernelPreset:
    """S14's CPU system (fast's 64-64-64-10, N = 500, k = 32) at 10,000 Adam steps, 8 seeds per
    arm: a budget at which the shuffled-label arm memorises its labels, so f1 and f3 are judged
    against a trained ablation."""
    base = FisherKernelRun(loop=_loop(FULL_STEPS))
    return FisherKernelPreset(base=base, ks=[32], seeds=SEEDS["full"])


def paper() -> FisherKernelPreset:
    """GPU: every training point scored, k in {16, 32, 64, 128}, MLP 256-256 and the CNN."""
    base = FisherKernelRun(loop=_loop(10_000, "cuda"), hidden=[256, 256], n_scored=1297,
                           chunk_size=256)  # fmt: skip
    return FisherKernelPreset(
        base=base, ks=[16, 32, 64, 128], models=["mlp", "cnn"], seeds=SEEDS["paper"]
    )


def build_runs(preset: FisherKernelPreset, seed: int = 0) -> list[RunSpec]:
    """Per model and k, a task arm and a shuffled-label arm (the ablation), each one ensemble
    over the seeds (run seeds ``seed + s``; member s of both arms has the same init). Names:
    ``nfk_{model}_k{k}_seed{s}`` and ``nfk_{model}_k{k}_shuffled_seed{s}``."""
    specs = []
    for model in preset.models:
        for k in preset.ks:
            for shuffled in (False, True):
                arm = f"{model}_k{k}" + ("_shuffled" if shuffled else "")
                for s in range(preset.seeds):
                    update = {"model": model, "k": k, "seed": preset.base.seed + seed + s,
                              "shuffle_labels": shuffled}  # fmt: skip
                    cfg = preset.base.model_copy(update=update)
                    specs.append(RunSpec(f"nfk_{arm}_seed{s}", cfg, build_fisher, arm))
    return specs


STUDY = Study(
    name="fisher-kernel-low-rank",
    claim=CLAIM,
    source=SOURCE,
    presets={"smoke": smoke, "fast": fast, "full": full, "paper": paper},
    build_runs=build_runs,
    analyze=analyze,
    protocol=PROTOCOL,
)
