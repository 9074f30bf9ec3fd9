"""Study ``randomized-algorithms`` (SYSTEMS.md S2): transformers learn randomized algorithms.

von Oswald, Kobayashi, Akram, Steger, "Learning Randomized Algorithms with Transformers",
ICLR 2025, arXiv 2408.10818. Runs, presets, how thresholds and preconditions were fixed and
measured values: docs/studies/randomized-algorithms.md.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from dynascope.studies.base import RunSpec, Study
from dynascope.train import Loop, LRSchedule

from .analysis import MAIN_MODELS, analyze
from .grid_world import GridWorldRun, build_grid_world
from .protocol import PROTOCOL
from .runs import ColouringRun, RecallRun, build_colouring, build_recall

__all__ = [
    "CLAIM",
    "FULL_STEPS",
    "STUDY",
    "RandomizedAlgorithmsPreset",
    "build_runs",
    "fast_with_colouring",
]

CLAIM = (
    "With a random seed input and a large-q Lq objective a transformer learns a randomized "
    "algorithm (seed-dependent answers, better worst case than a deterministic model, majority "
    "vote above single-seed success); at q = 1 it ignores the seed."
)
SOURCE = (
    "von Oswald, Kobayashi, Akram, Steger, 'Learning Randomized Algorithms with Transformers', "
    "ICLR 2025, arXiv 2408.10818"
)

# lq_m1: A^q_R with m = 1 seed per step (the ablation control of claims i and ii; protocol)
Model = Literal["erm_random", "lq_random", "lq_fixed", "erm_fixed", "lq_m1"]


class RandomizedAlgorithmsPreset(BaseModel):
    """A preset: the recall base config and models, optional sweeps, colouring and grid world.

    Run seeds: replicate k of ``--seed s`` trains with seed ``s + k`` (every part).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    recall: RecallRun
    models: list[Model] = Field(default_factory=lambda: list(MAIN_MODELS), min_length=1)
    q_large: float = Field(32.0, ge=1, allow_inf_nan=False)
    replicates: int = Field(3, ge=1, description="training seeds per model")
    n_keys_sweep: list[int] = Field(default_factory=list, description="N values (A^q_R)")
    q_sweep: list[float] = Field(default_factory=list, description="q values of the N sweep")
    m_sweep: list[int] = Field(default_factory=list, description="m values at q = q_large")
    colouring: ColouringRun | None = None
    colouring_qs: list[float] = Field(default_factory=list)
    colouring_replicates: int | None = Field(None, ge=1, description="None: every replicate")
    grid_world: GridWorldRun | None = None


def _model_config(base: RecallRun, model: str, q_large: float, seed: int) -> RecallRun:
    """The recall config of ``model``: q = 1 for ``erm_*`` else ``q_large``; fresh seeds for
    ``*_random`` and ``lq_m1``; m = 1 for fixed seeds (m copies of one seed give the same loss)
    and for ``lq_m1`` (the ablation: one fresh seed per step, no averaging over seeds)."""
    q = 1.0 if model.startswith("erm") else q_large
    random = model.endswith("random") or model == "lq_m1"
    update = {"q": q, "random_seeds": random, "seed": seed}
    if not random or model == "lq_m1":
        update["m_seeds"] = 1
    return base.model_copy(update=update)


def build_runs(preset: RandomizedAlgorithmsPreset, seed: int = 0) -> list[RunSpec]:
    """Main recall models, then the paper's sweeps, colouring and grid world; the replicates of
    one configuration (training seeds ``seed + k``) form one ensemble group."""
    base = preset.recall
    seeds = [seed + k for k in range(preset.replicates)]
    recall, colour, grid = (
        build_recall,
        build_colouring,
        build_grid_world,
    )
    specs: list[RunSpec] = []
    for model in preset.models:
        for k, s in enumerate(seeds):
            cfg = _model_config(base, model, preset.q_large, s)
            specs.append(RunSpec(f"recall_{model}_s{k}", cfg, recall, group=f"recall_{model}"))
    for n in preset.n_keys_sweep:
        for q in preset.q_sweep:
            for k, s in enumerate(seeds):
                cfg = base.model_copy(update={"n_keys": n, "q": q, "random_seeds": True, "seed": s})
                specs.append(RunSpec(f"sweep_N{n}_q{q:g}_s{k}", cfg, recall, group=f"N{n}q{q:g}"))
    for m in preset.m_sweep:
        for k, s in enumerate(seeds):
            cfg = _model_config(base, "lq_random", preset.q_large, s)
            cfg = cfg.model_copy(update={"m_seeds": m})
            specs.append(RunSpec(f"msweep_m{m}_s{k}", cfg, recall, group=f"m{m}"))
    if preset.colouring is not None:
        n_colour = preset.colouring_replicates or preset.replicates
        n = preset.colouring.n_vertices
        for q in preset.colouring_qs:
            for k, s in enumerate(seeds[:n_colour]):
                cfg = preset.colouring.model_copy(update={"q": q, "seed": s})
                name = f"colour_n{n}_q{q:g}_s{k}"
                specs.append(RunSpec(name, cfg, colour, group=f"colour_q{q:g}"))
    if preset.grid_world is not None:  # PGPE is a custom step: lone runs
        for k, s in enumerate(seeds):
            cfg = preset.grid_world.model_copy(update={"seed": s})
            specs.append(RunSpec(f"grid_s{k}", cfg, grid))
    return specs


def _loop(steps: int, warmup: int, final_lr_frac: float, log_every: int = 25, **kw) -> Loop:
    """Linear warm-up, then cosine to ``final_lr_frac`` of the rate; gradients clipped to 1."""
    schedule = LRSchedule(kind="cosine", warmup_steps=warmup, final_lr_frac=final_lr_frac)
    return Loop(steps=steps, log_every=log_every, schedule=schedule, grad_clip=1.0, **kw)


# -- presets ----------------------------------------------------------------------------------
def smoke() -> RandomizedAlgorithmsPreset:
    """Plumbing only (seconds): recall N = 6, d_head 2, m = 4, batch 32, 50 steps, 3 seeds;
    colouring C_5 (all 12 cycles), tiny model, 20 steps, q in {1, 10}, 1 seed."""
    recall = RecallRun(
        n_keys=6,
        d_head=2,
        d_model=8,
        m_seeds=4,
        batch_size=32,
        eval_inputs=256,
        loop=_loop(50, 10, 0.1, log_every=10, checkpoint_every=10),
    )
    colouring = ColouringRun(
        n_vertices=5,
        d_model=8,
        d_head=4,
        d_mlp=8,
        m_seeds=2,
        batch_size=8,
        eval_seeds=4,
        loop=_loop(20, 2, 0.1, log_every=5, checkpoint_every=5),
    )
    return RandomizedAlgorithmsPreset(
        recall=recall, colouring=colouring, colouring_qs=[1.0, 10.0], colouring_replicates=1
    )


# The colouring arm of ``fast`` (and, at C_10, of ``fast_with_colouring``): the paper's Table 2
# model and optimiser (2 blocks, 1 head, key 16, token 16; AdamW eps 1e-3, weight decay 0.1,
# lr 1e-3 -> 1e-4, m = 10 seeds of one U[0,1] number per vertex) at batch 64 and CPU step counts.
_COLOURING_ARM = {"m_seeds": 10, "batch_size": 64, "lr": 1e-3, "adam_eps": 1e-3}


def _colouring_arm(n: int, steps: int, warmup: int, eval_seeds: int) -> ColouringRun:
    return ColouringRun(
        n_vertices=n,
        eval_seeds=eval_seeds,
        weight_decay=0.1,
        loop=_loop(steps, warmup, 0.1),
        **_COLOURING_ARM,
    )


def fast() -> RandomizedAlgorithmsPreset:
    """≤ 3 minutes on 2 CPU cores: recall N = 8, d_head 4, m = 8, batch 64, 1500 steps;
    4 arms (A^E_R, A^q_R, A^q_r0 and the ablation A^q_R m = 1) × 5 seeds (one K = 5 ensemble
    per arm; 3 arms × 3 seeds until 2026-12-07, protocol). No colouring arm (reported, not
    gated; it is opt-in: :func:`fast_with_colouring`). Why N = 8 and these sizes (the fit audit:
    recall was not learned at N = 12), the calibration seeds and the measured times: notes
    page."""
    recall = RecallRun(
        n_keys=8,
        d_head=4,
        d_model=32,
        m_seeds=8,
        batch_size=64,
        eval_inputs=2048,
        loop=_loop(1500, 150, 0.1),
    )
    return RandomizedAlgorithmsPreset(recall=recall, replicates=PROTOCOL.seeds["fast"])


FULL_STEPS = 4000  # recall steps at full (10 % warm-up): calibration, protocol presets["full"]


def full() -> RandomizedAlgorithmsPreset:
    """About 14 minutes on one CPU core: fast's task and arms (recall N = 8, d_head 4, m = 8,
    batch 64, q 32; A^E_R, A^q_R, A^q_r0 and A^q_R m = 1 × 5 seeds, one ensemble per arm)
    trained 4000 steps (400 warm-up, cosine to 0.1).

    Sized on calibration seeds so that every run ends below the 2.599-nat "recall learned"
    bound (at fast's 1500 steps 4 and 2 runs of the evaluation seed sets 0 and 1000 did not:
    worst 3.00 and 2.86, A^q_r0 and A^q_R m = 1 runs on plateaus). At 3000 steps every run of
    base seed 10000 fit (all four arms, worst 1.47, A^E_R; 637 s wall, 612 CPU s) but one
    A^q_R m = 1 run of base seed 20000 stayed on its plateau (2.79); at 4000 steps that run
    ends at 2.37 and the A^q_r0 and A^q_R m = 1 runs of base seed 30000 at worst 1.00. Cost:
    the seed-10000 run's per-arm seconds × 4/3, about 850 s. Numbers: protocol, notes page.
    """
    recall = fast().recall.model_copy(update={"loop": _loop(FULL_STEPS, FULL_STEPS // 10, 0.1)})
    return RandomizedAlgorithmsPreset(recall=recall, replicates=PROTOCOL.seeds["full"])


def fast_with_colouring() -> RandomizedAlgorithmsPreset:
    """Opt-in (outside the fast budget): fast plus C_10 colouring at 20k steps, q in {1, 3, 10}
    (SYSTEMS.md S2: "C_10 at <= 20k steps (trend only) ... opt-in config"), 1 seed.

    Use from Python: ``STUDY.build_runs(fast_with_colouring(), 0)`` then run the specs, or
    ``dataclasses.replace(STUDY, presets={..., "fast": fast_with_colouring})``.
    """
    colouring = _colouring_arm(10, 20_000, 1000, 10)
    return fast().model_copy(
        update={"colouring": colouring, "colouring_qs": [1.0, 3.0, 10.0], "colouring_replicates": 1}
    )


def paper() -> RandomizedAlgorithmsPreset:
    """The paper's scale (GPU, ``--device cuda``): N = 20, d_head 5, m = 30, q = 100, batch 512,
    10k steps, 5 seeds; N sweep 8..20 x q in {1, 16, 32, 100}; m sweep at q = 100; C_10 at 300k
    steps for q in {1, 2, 3, 5, 10}; grid world with PGPE (population 300, 10k generations)."""
    recall = RecallRun(
        n_keys=20,
        d_head=5,
        d_model=40,
        m_seeds=30,
        batch_size=512,
        lr=3e-3,
        eval_inputs=4096,
        loop=_loop(10_000, 333, 0.1, log_every=100, device="cuda"),
    )
    colouring = ColouringRun(
        n_vertices=10,
        m_seeds=10,
        batch_size=256,
        lr=1e-3,
        adam_eps=1e-3,
        weight_decay=0.1,
        q=10.0,
        eval_seeds=10,
        loop=_loop(300_000, 1000, 0.1, log_every=500, checkpoint_every=10_000, device="cuda"),
    )
    grid = GridWorldRun(
        chunk_size=50, loop=Loop(steps=10_000, log_every=10, threads=None, device="cuda")
    )
    return RandomizedAlgorithmsPreset(
        recall=recall,
        models=["erm_random", "lq_random", "lq_fixed", "erm_fixed", "lq_m1"],
        q_large=100.0,
        replicates=PROTOCOL.seeds["paper"],
        n_keys_sweep=[8, 10, 12, 14, 16, 18, 20],
        q_sweep=[1.0, 16.0, 32.0, 100.0],
        m_sweep=[1, 2, 4, 8, 16],
        colouring=colouring,
        colouring_qs=[1.0, 2.0, 3.0, 5.0, 10.0],
        grid_world=grid,
    )


STUDY = Study(
    name="randomized-algorithms",
    claim=CLAIM,
    source=SOURCE,
    presets={"smoke": smoke, "fast": fast, "full": full, "paper": paper},
    build_runs=build_runs,
    analyze=analyze,
    protocol=PROTOCOL,
)
