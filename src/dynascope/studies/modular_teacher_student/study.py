"""Study ``modular-teacher-student`` (SYSTEMS.md S5): a modular student identifies a modular
teacher under connected task support, and generalises across its components; not under
disconnected support.

Notes (system, claims, how thresholds were fixed, measured values):
docs/studies/modular-teacher-student.md.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from dynascope.studies.base import RunSpec, Study
from dynascope.tasks.modular_teacher import TASK_SETS
from dynascope.train import Loop, LRSchedule

from .analysis import BLESSED_SET, DOOMED_SET, analyze
from .hyperteacher import (
    LEARNER_DEFAULTS,
    build_hyperteacher,
    hyperteacher_config,
)
from .protocol import PROTOCOL
from .runs import TeacherStudentRun, build_student

__all__ = ["CLAIM", "STUDY", "ModularTeacherStudentPreset", "SweepPoint", "build_runs"]

CLAIM = (
    "A modular hypernetwork student identifies a modular teacher's modules (up to a linear map "
    "of codes) and generalises to unseen combinations when the training tasks have connected "
    "support, and not when it is disconnected."
)
SOURCE = (
    "Schug, Kobayashi, Akram, Wołczyk, Proca, von Oswald, Pascanu, Sacramento, Steger, "
    "'Discovering modular solutions that generalize compositionally', ICLR 2024, arXiv 2312.15001"
)
HYPER_GRID = ((4, 1), (4, 2), (8, 1), (8, 2), (8, 4), (8, 8))  # (M experts, K hot), Table 1


class SweepPoint(BaseModel):
    """One extra run on the Blessed task set: student over-parameterisation and weight decay."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hidden_factor: float = Field(gt=0)
    code_factor: float = Field(gt=0)
    weight_decay: float = Field(0.0, ge=0)


class ModularTeacherStudentPreset(BaseModel):
    """A preset: the base run (its ``seed`` is replaced per run), the seeds, extra task sets
    (besides Blessed and Doomed), the over-parameterisation / weight-decay sweep, the
    monolithic baseline and the hyperteacher table."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base: TeacherStudentRun
    seeds: int = Field(3, ge=1, description="seeds per task set (run seeds seed + i)")
    extra_task_sets: list[str] = Field(default_factory=list)
    sweep: list[SweepPoint] = Field(default_factory=list)
    monolithic_baseline: bool = False
    hyperteacher: bool = Field(False, description="add the hyperteacher table's runs")

    @model_validator(mode="after")
    def _known(self) -> ModularTeacherStudentPreset:
        for name in self.extra_task_sets:
            if name not in TASK_SETS:
                raise ValueError(f"task set must be one of {sorted(TASK_SETS)} (got {name!r})")
        return self


def _tag(name: str) -> str:
    return name.replace("+", "_plus_")


def _loop(steps: int, log_every: int) -> Loop:
    # the reference's optax cosine_decay_schedule(lr, steps, alpha=1e-3)
    schedule = LRSchedule(kind="cosine", final_lr_frac=1e-3)
    return Loop(steps=steps, log_every=log_every, schedule=schedule)


def smoke() -> ModularTeacherStudentPreset:
    """Plumbing only: n_hidden 8, 20 outer × 5 inner steps, meta-batch 4, batch 16, 3 seeds."""
    base = TeacherStudentRun(
        n_hidden=8,
        inner_steps=5,
        inner_lr=1e-2,
        inner_batch=16,
        inner_fresh_x=False,
        meta_batch=4,
        batch=16,
        eval_inner_steps=5,
        eval_inner_lr=1e-2,
        eval_tasks=16,
        eval_support=16,
        eval_batch=16,
        loop=_loop(20, 5),
    )
    return ModularTeacherStudentPreset(base=base)


def fast() -> ModularTeacherStudentPreset:
    """5 seeds (the protocol's count) × {Blessed, Doomed} as one K = 10 ensemble; a demo (the
    fit precondition needs ~2k-6k outer steps); 750 outer steps (fixed from the
    measured step time, notes page); training inner loop 50 Adam steps × 2e-2 on 64 support
    inputs; evaluation inner loop 200 × 2e-2 (an exact copy of the teacher reaches R² 0.997
    with it, against 0.02-0.22 with the training loop's 50 steps)."""
    base = TeacherStudentRun(
        inner_steps=50,
        inner_lr=2e-2,
        inner_batch=64,
        inner_fresh_x=False,
        meta_batch=32,
        batch=64,
        eval_inner_steps=200,
        eval_inner_lr=2e-2,
        eval_tasks=256,
        eval_support=64,
        eval_batch=256,
        eval_keys=False,
        loop=_loop(750, 25),
    )
    return ModularTeacherStudentPreset(base=base, seeds=PROTOCOL.seeds["fast"])


def full() -> ModularTeacherStudentPreset:
    """5 seeds × {Blessed, Doomed} as one K = 10 ensemble, 6,000 outer steps at meta-batch 8,
    fast's inner loops and input counts otherwise; sized on calibration seeds 10000-10004 for
    the fit precondition (protocol and notes page)."""
    fast_base = fast().base
    base = fast_base.model_copy(update={"meta_batch": 8, "loop": _loop(6000, 100)})
    return ModularTeacherStudentPreset(base=base, seeds=PROTOCOL.seeds["full"])


def paper() -> ModularTeacherStudentPreset:
    """The reference configuration (GPU, ``--device cuda``): every task set × 5 seeds (100-104
    with ``--seed 100``), 60k outer steps, 300 inner Adam steps × 3e-3 on fresh 256 inputs;
    an over-parameterisation sweep past ×8 hidden / ×2 code, weight decay {1e-4, 1e-3}, the
    monolithic baseline; the hyperteacher table (hnet_linear / anil / learned_init at (M, K)
    in {(4,1), (4,2), (8,1), (8,2), (8,4), (8,8)}, 200k steps; its own build)."""
    others = [n for n in TASK_SETS if n not in (BLESSED_SET, DOOMED_SET)]
    sweep = [SweepPoint(hidden_factor=h, code_factor=c) for h in (1, 4, 8, 16) for c in (1, 2, 4)]
    sweep += [SweepPoint(hidden_factor=2, code_factor=2, weight_decay=w) for w in (1e-4, 1e-3)]
    return ModularTeacherStudentPreset(
        base=TeacherStudentRun(loop=_loop(60_000, 100)),
        extra_task_sets=others,
        sweep=sweep,
        monolithic_baseline=True,
        hyperteacher=True,
        seeds=PROTOCOL.seeds["paper"],
    )


def build_runs(preset: ModularTeacherStudentPreset, seed: int = 0) -> list[RunSpec]:
    """Runs ``<task set>_s<i>`` (run seed ``seed + i``): every task set and seed of the
    hypernetwork student is one ensemble (group ``main``); each sweep point's seeds one group;
    the monolithic baseline (autograd inner loop) and the hyperteacher runs alone.

    Raises:
        pydantic.ValidationError: if a combined run config is invalid.
    """

    def config(**update: object) -> TeacherStudentRun:
        return TeacherStudentRun.model_validate(preset.base.model_dump() | update)

    specs = []
    for i in range(preset.seeds):
        s = seed + i
        for name in (BLESSED_SET, DOOMED_SET, *preset.extra_task_sets):
            cfg = config(task_set=name, seed=s)
            specs.append(RunSpec(f"{_tag(name)}_s{i}", cfg, build_student, group="main"))
        for p in preset.sweep:
            tag = f"h{p.hidden_factor:g}_c{p.code_factor:g}_wd{p.weight_decay:g}"
            cfg = config(task_set=BLESSED_SET, seed=s, **p.model_dump())
            specs.append(RunSpec(f"sweep_{tag}_s{i}", cfg, build_student, group=f"sweep_{tag}"))
        if preset.monolithic_baseline:
            cfg = config(task_set=BLESSED_SET, seed=s, student="monolithic")
            specs.append(RunSpec(f"monolithic_{_tag(BLESSED_SET)}_s{i}", cfg, build_student))
        if preset.hyperteacher:
            for learner in LEARNER_DEFAULTS:
                for M, K in HYPER_GRID:
                    cfg = hyperteacher_config(learner, M, K, s)
                    name = f"hyper_{learner}_M{M}K{K}_s{i}"
                    specs.append(RunSpec(name, cfg, build_hyperteacher))
    return specs


STUDY = Study(
    name="modular-teacher-student",
    claim=CLAIM,
    source=SOURCE,
    presets={"smoke": smoke, "fast": fast, "full": full, "paper": paper},
    build_runs=build_runs,
    analyze=analyze,
    protocol=PROTOCOL,
)
