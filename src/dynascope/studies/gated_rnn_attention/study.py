"""Study ``gated-rnn-attention`` (SYSTEMS.md S6): gated linear RNNs can be, and become, attention.

Notes (parts, choices, verdicts, calibration, measurements): docs/studies/gated-rnn-attention.md.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from dynascope.studies.base import RunSpec, Study
from dynascope.train import Loop

from .analysis import analyze
from .protocol import PROTOCOL
from .runs import (
    ConstructionRun,
    ICLRun,
    TeacherStudentRun,
    build_construction,
    build_icl,
    build_teacher_student,
    nu_learning_rate,
)

__all__ = [
    "CLAIM",
    "STUDY",
    "ConstructionSetup",
    "GatedRNNAttentionPreset",
    "ICLSetup",
    "TeacherSetup",
    "build_runs",
    "construction_size",
]

CLAIM = (
    "A gated linear RNN implements causal linear self-attention exactly, and trained by gradient "
    "descent it finds that solution: students of a linear-attention teacher keep only λ ≈ 0 / 1 "
    "neurons, and on in-context regression it predicts like linear attention and one GD step."
)
SOURCE = (
    "Zucchet, Kobayashi, Akram, von Oswald, Larcher, Steger, Sacramento, 'Gated recurrent neural "
    "networks discover attention', arXiv 2309.01775"
)

_FROZEN = ConfigDict(extra="forbid", frozen=True)
_RUN_ONLY = {"seed", "loop", "kind"}


class ConstructionSetup(BaseModel):
    """Part (a) of a preset: :class:`~.runs.ConstructionRun` without seed and loop."""

    model_config = _FROZEN
    cases: list[tuple[int, int, int, int]] = Field(
        default_factory=lambda: [(4, 2, 2, 16), (5, 1, 3, 7), (6, 3, 2, 33)], min_length=1
    )
    batch_size: int = Field(8, ge=1)


class TeacherSetup(BaseModel):
    """Part (b) of a preset: the student runs' fields, steps and logging."""

    model_config = _FROZEN
    d_model: int = Field(4, ge=1)
    n_heads: int = Field(1, ge=1)
    d_head: int = Field(4, ge=1)
    n_ctx: int = Field(12, ge=1)
    lambda_kind: Literal["real", "complex"] = "real"
    use_gamma_norm: bool = False
    lr: float = Field(1e-3, gt=0)
    batch_size: int = Field(64, ge=1)
    steps: int = Field(3000, ge=1)
    log_every: int = Field(50, ge=1)
    n_eval: int = Field(2048, ge=1)
    prune_delta: float = Field(0.05, gt=0, lt=0.5)


class ICLSetup(BaseModel):
    """Part (c) of a preset: the ICL runs' fields, steps and logging."""

    model_config = _FROZEN
    d_x: int = Field(4, ge=1)
    n_points: int = Field(12, ge=1)
    noise_std: float = Field(0.0, ge=0)
    d_hidden: int = Field(64, ge=1)
    lambda_kind: Literal["real", "complex"] = "real"
    n_heads: int = Field(1, ge=1)
    d_head: int = Field(5, ge=1)
    d_model: int = Field(32, ge=1)
    n_layers: int = Field(1, ge=1)
    lr: float = Field(1e-3, gt=0)
    batch_size: int = Field(128, ge=1)
    steps: int = Field(5000, ge=1)
    log_every: int = Field(50, ge=1)
    n_eval: int = Field(10_000, ge=2)
    n_grad: int = Field(1000, ge=1)
    n_fit: int = Field(50_000, ge=2)
    prune_delta: float = Field(0.05, gt=0, lt=0.5)


class GatedRNNAttentionPreset(BaseModel):
    """A preset: the construction check, the teacher–student sweep, the ICL runs, seeds."""

    model_config = _FROZEN

    construction: ConstructionSetup = ConstructionSetup()
    teacher: TeacherSetup = TeacherSetup()
    hidden_multiples: list[float] = Field(default_factory=lambda: [0.5, 1.0, 2.0], min_length=1)
    icl: ICLSetup = ICLSetup()
    icl_models: list[Literal["grnn", "lsa", "gd", "lru", "lstm", "gru"]] = Field(
        default_factory=lambda: ["grnn", "lsa", "gd"], min_length=1
    )
    seeds: int = Field(5, ge=1)


def smoke() -> GatedRNNAttentionPreset:
    """Plumbing (seconds): the S6 smoke sizes, 20 steps, 3 seeds."""
    return GatedRNNAttentionPreset(
        construction=ConstructionSetup(cases=[(4, 2, 2, 16)], batch_size=2),
        teacher=TeacherSetup(d_model=3, d_head=2, n_ctx=4, steps=20, log_every=5, n_eval=64),
        icl=ICLSetup(
            d_x=2,
            n_points=4,
            d_hidden=4,
            d_head=3,
            steps=20,
            log_every=5,
            n_eval=200,
            n_grad=20,
            n_fit=500,
        ),  # fmt: skip
        seeds=3,
    )


def fast() -> GatedRNNAttentionPreset:
    """S6's fast sizes (notes page), 5 seeds, with the ungated ablation arms."""
    return GatedRNNAttentionPreset()


# full's two changes from fast, sized on calibration seeds (docs/studies/gated-rnn-attention.md,
# "`full`"): the teacher's sequence length 12 -> 48 (g3's pruning cost falls with T) and the ICL
# runs' steps 5k -> 10k (the gated RNN's ICL loss was still falling at 5k).
FULL_N_CTX = 48
FULL_ICL_STEPS = 10_000


def full() -> GatedRNNAttentionPreset:
    """fast with the teacher's sequence length T = 48 (was 12) and 10,000 ICL steps (was 5,000),
    5 seeds; meant for `--executor process --workers 2` (two cores)."""
    return GatedRNNAttentionPreset(
        teacher=TeacherSetup(n_ctx=FULL_N_CTX), icl=ICLSetup(steps=FULL_ICL_STEPS), seeds=5
    )


def paper() -> GatedRNNAttentionPreset:
    """Proposed paper scale (GPU): d_x = N = 10, hidden sweep, LRU/LSTM/GRU, 5 seeds, 50k steps."""
    return GatedRNNAttentionPreset(
        construction=ConstructionSetup(cases=[(4, 2, 2, 16), (10, 1, 10, 10), (16, 4, 4, 64)]),
        teacher=TeacherSetup(d_model=8, n_heads=2, d_head=4, n_ctx=16, steps=50_000),
        hidden_multiples=[0.5, 1.0, 1.5, 2.0, 3.0, 4.0],
        icl=ICLSetup(
            d_x=10, n_points=10, d_hidden=256, d_head=11, steps=50_000, d_model=64, n_layers=2
        ),  # fmt: skip
        icl_models=["grnn", "lsa", "gd", "lru", "lstm", "gru"],
        seeds=5,
    )


def construction_size(d_head: int, n_heads: int) -> int:
    """n_c = n_heads·d_head², the neurons of the exact construction."""
    return n_heads * d_head**2


def build_runs(preset: GatedRNNAttentionPreset, seed: int = 0) -> list[RunSpec]:
    """``a_construction_s{i}``; ``b_teacher_h{d_hidden}_s{i}`` and the ungated ablation
    ``b_ungated_h{d_hidden}_s{i}`` per multiple; ``c_icl_{model}_s{i}`` per model and the
    ungated ablation ``c_icl_grnn_ungated_s{i}``. A (multiple | model | ablation)'s seeds are
    one ensemble (GD, LSTM, GRU and LRU run alone). Run seed ``seed + i``."""
    t, c = preset.teacher, preset.icl
    n_c = construction_size(t.d_head, t.n_heads)
    t_fields = t.model_dump(exclude={"steps", "log_every"})
    t_loop = Loop(steps=t.steps, log_every=t.log_every)
    c_fields = c.model_dump(exclude={"steps", "log_every"})
    specs = []
    for i in range(preset.seeds):
        config = ConstructionRun(
            seed=seed + i, loop=Loop(steps=1), **preset.construction.model_dump()
        )
        specs.append(RunSpec(f"a_construction_s{i}", config, build_construction))
    for gating, part in ((True, "teacher"), (False, "ungated")):
        for multiple in preset.hidden_multiples:
            hidden = max(1, round(multiple * n_c))
            group = f"b_{part}_h{hidden}"
            for i in range(preset.seeds):
                config = TeacherStudentRun(seed=seed + i, loop=t_loop, d_hidden=hidden,
                                           nu_lr=nu_learning_rate(t.steps, t.prune_delta),
                                           gating=gating, **t_fields)  # fmt: skip
                specs.append(RunSpec(f"{group}_s{i}", config, build_teacher_student, group=group))
    for model in preset.icl_models:
        group = f"c_icl_{model}"
        steps = 1 if model == "gd" else c.steps
        loop = Loop(steps=steps, log_every=min(c.log_every, steps))
        for i in range(preset.seeds):
            config = ICLRun(seed=seed + i, loop=loop, model=model, **c_fields)
            alone = model in ("gd", "lru", "lstm", "gru")
            specs.append(RunSpec(f"{group}_s{i}", config, build_icl,
                                 group=None if alone else group))  # fmt: skip
    loop = Loop(steps=c.steps, log_every=min(c.log_every, c.steps))
    for i in range(preset.seeds):  # the ablation of g4: the GRNN without its gates
        config = ICLRun(seed=seed + i, loop=loop, model="grnn", gating=False, **c_fields)
        specs.append(RunSpec(f"c_icl_grnn_ungated_s{i}", config, build_icl,
                             group="c_icl_grnn_ungated"))  # fmt: skip
    return specs


STUDY = Study(
    name="gated-rnn-attention",
    claim=CLAIM,
    source=SOURCE,
    presets={"smoke": smoke, "fast": fast, "full": full, "paper": paper},
    build_runs=build_runs,
    analyze=analyze,
    protocol=PROTOCOL,
)
