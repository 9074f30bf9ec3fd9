"""Study ``randomized-algorithms`` (SYSTEMS.md S2): transformers learn randomized algorithms.

Source: J. von Oswald, S. Kobayashi, Y. Akram, A. Steger, "Learning Randomized Algorithms with
Transformers", ICLR 2025, arXiv 2408.10818.

Finding: a transformer given a random seed as an extra input and trained on the Lq objective
``((1/n) sum_i l_i^q)^(1/q)`` over inputs of the seed-averaged loss l_i (large q leans toward
the worst input) learns an algorithm whose answer depends on the seed and that solves every
input with non-zero probability; expected-loss training (q = 1) ignores the seed and fails
completely on some inputs; a majority vote over seeds then solves nearly all inputs.

Runs (each a store; ``analyze`` reads only them):

- main, associative recall with seed bits (:mod:`dynascope.tasks.seeded_recall`), linear
  attention of key size < N so the model cannot store every key: ``erm_random`` (A^E_R, q = 1,
  fresh seeds), ``lq_random`` (A^q_R, q = ``q_large``, fresh seeds), ``lq_fixed`` (A^q_{r0},
  q = ``q_large``, one fixed seed r0), optionally ``erm_fixed``; ``replicates`` training seeds
  each. Held-out set: ``eval_inputs`` inputs from a generator of its own (the same set for
  every run), ``eval_seeds`` = 30 evaluation seeds.
- paper only: N x q sweep and m sweep of A^q_R, cycle colouring C_10 for q in a grid, and the
  grid world trained with PGPE against the exact adversary.

Verdicts (thresholds are SYSTEMS.md S2's proposals, frozen before the first fast run and never
changed after; a failed claim is reported with its measured value). Values are means over
replicates.

- i: predictive variance V = mean_{i,b} Var_j sigmoid(logit_ijb) over the 30 eval seeds:
  V(A^E_R) <= 1e-3 and V(A^q_R) >= max(1e-3, 10 V(A^E_R)). Measured value: V(A^q_R).
- ii: p5 over inputs of per-input success: p5(A^q_R) - p5(A^q_{r0}) >= 0.05.
- iii: A^q_R's mean majority-vote success (30 seeds, plurality over the 2^b answers) minus its
  mean single-seed success >= 0.05.

Colouring and grid-world results are tables and figures (trends), not verdicts.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from dynascope.report import new_figure, save_figure
from dynascope.store import Run
from dynascope.studies._grid_world_run import GridWorldRunConfig, run_grid_world
from dynascope.studies._randomized_runs import (
    ColouringRunConfig,
    RecallRunConfig,
    run_colouring,
    run_recall,
)
from dynascope.studies.base import Analysis, RunSpec, Study, Verdict

__all__ = [
    "STUDY",
    "ColouringRunConfig",
    "GridWorldRunConfig",
    "RandomizedAlgorithmsPreset",
    "RecallRunConfig",
    "analyze",
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

# Frozen thresholds (SYSTEMS.md S2 proposals; see the module docstring).
I_ERM_VARIANCE_MAX = 1e-3
I_LQ_VARIANCE_MIN = 1e-3
I_RATIO_MIN = 10.0
II_P5_GAP = 0.05
III_VOTE_GAIN = 0.05

Model = Literal["erm_random", "lq_random", "lq_fixed", "erm_fixed"]
MAIN_MODELS: tuple[str, ...] = ("erm_random", "lq_random", "lq_fixed")


class RandomizedAlgorithmsPreset(BaseModel):
    """A preset: the recall base config and models, optional sweeps, colouring and grid world."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    recall: RecallRunConfig
    models: list[Model] = Field(default_factory=lambda: list(MAIN_MODELS), min_length=1)
    q_large: float = Field(32.0, ge=1, allow_inf_nan=False)
    replicates: int = Field(1, ge=1, description="training seeds per model")
    n_keys_sweep: list[int] = Field(default_factory=list, description="N values (A^q_R)")
    q_sweep: list[float] = Field(default_factory=list, description="q values of the N sweep")
    m_sweep: list[int] = Field(default_factory=list, description="m values at q = q_large")
    colouring: ColouringRunConfig | None = None
    colouring_qs: list[float] = Field(default_factory=list)
    grid_world: GridWorldRunConfig | None = None


def _model_config(base: RecallRunConfig, model: str, q_large: float, seed: int):
    q = 1.0 if model.startswith("erm") else q_large
    random = model.endswith("random")
    update = {"q": q, "random_seeds": random, "seed": seed}
    if not random:
        update["m_seeds"] = 1  # m copies of one fixed seed give the same loss
    return base.model_copy(update=update)


def build_runs(preset: RandomizedAlgorithmsPreset, seed: int = 0) -> list[RunSpec]:
    """Main recall models x replicates, then the paper's sweeps, colouring and grid world."""
    base = preset.recall
    specs: list[RunSpec] = []
    for k in range(preset.replicates):
        s = base.seed + 100 * seed + k
        for model in preset.models:
            cfg = _model_config(base, model, preset.q_large, s)
            specs.append(RunSpec(f"recall_{model}_s{k}", cfg, run_recall))
        for n in preset.n_keys_sweep:
            for q in preset.q_sweep:
                cfg = base.model_copy(update={"n_keys": n, "q": q, "random_seeds": True, "seed": s})
                specs.append(RunSpec(f"sweep_N{n}_q{q:g}_s{k}", cfg, run_recall))
        for m in preset.m_sweep:
            cfg = _model_config(base, "lq_random", preset.q_large, s)
            cfg = cfg.model_copy(update={"m_seeds": m})
            specs.append(RunSpec(f"msweep_m{m}_s{k}", cfg, run_recall))
        if preset.colouring is not None:
            for q in preset.colouring_qs:
                cfg = preset.colouring.model_copy(
                    update={"q": q, "seed": preset.colouring.seed + s}
                )
                specs.append(RunSpec(f"colour_q{q:g}_s{k}", cfg, run_colouring))
        if preset.grid_world is not None:
            cfg = preset.grid_world.model_copy(update={"seed": preset.grid_world.seed + s})
            specs.append(RunSpec(f"grid_s{k}", cfg, run_grid_world))
    return specs


# -- presets ----------------------------------------------------------------------------------
def smoke() -> RandomizedAlgorithmsPreset:
    """Plumbing only (seconds): N = 6, key size 2, m = 4, batch 32, 50 steps, 3 runs."""
    recall = RecallRunConfig(
        n_keys=6,
        key_size=2,
        d_model=8,
        m_seeds=4,
        batch_size=32,
        steps=50,
        warmup_steps=10,
        eval_inputs=256,
        log_every=10,
    )
    return RandomizedAlgorithmsPreset(recall=recall)


def fast() -> RandomizedAlgorithmsPreset:
    """≤ 3 minutes on 2 CPU cores: N = 12, key size 4, m = 8, batch 128, 2000 steps, 3 runs.

    d_model 32 >= d_in = N + b + d_r = 27, so the input embedding is no bottleneck (the
    reference code embeds into 40). A first calibration at d_model 16 (the paper's token size
    15) and 2500 steps left the embedding narrower than the token; it was changed once, before
    the verdict runs, and not tuned after. The step count was fixed from the measured step time
    (23 ms of CPU per step on one thread at d_model 32): three runs plus evaluation take about
    2.5 minutes of CPU.
    """
    recall = RecallRunConfig(
        n_keys=12,
        key_size=4,
        d_model=32,
        m_seeds=8,
        batch_size=128,
        steps=2000,
        warmup_steps=200,
        eval_inputs=2048,
    )
    return RandomizedAlgorithmsPreset(recall=recall)


def fast_with_colouring() -> RandomizedAlgorithmsPreset:
    """Opt-in (outside the fast budget): fast + the C_10 trend at 20k steps, q in {1, 3, 10}.

    Measured 2026-12-01 on one thread: 28 ms of CPU per step plus about 1 minute for the
    evaluation on all 181,440 cycles x 10 seeds, so about 10 CPU minutes per q (31 for three).
    A 2000-step probe of this config gave proper colourings 0.982 (single seed) / 0.982
    (more than half of the seeds) at q = 1 and 0.939 / 0.995 at q = 10.

    Use from Python: ``STUDY.build_runs(fast_with_colouring(), 0)`` then run the specs, or
    ``dataclasses.replace(STUDY, presets={..., "fast": fast_with_colouring})``.
    """
    colouring = ColouringRunConfig(
        n_vertices=10,
        m_seeds=10,
        batch_size=64,
        steps=20_000,
        lr=1e-3,
        final_lr=1e-4,
        warmup_steps=1000,
        adam_eps=1e-3,
        weight_decay=0.1,
        eval_seeds=10,
    )
    return fast().model_copy(update={"colouring": colouring, "colouring_qs": [1.0, 3.0, 10.0]})


def paper() -> RandomizedAlgorithmsPreset:
    """The paper's scale (GPU): N = 20, key size 5, m = 30, q = 100, batch 512, 10k steps,
    5 seeds; N sweep 8..20 x q in {1, 16, 32, 100}; m sweep at q = 100; C_10 at 300k steps
    for q in {1, 2, 3, 5, 10}; grid world with PGPE (population 300)."""
    recall = RecallRunConfig(
        n_keys=20,
        key_size=5,
        d_model=40,
        m_seeds=30,
        batch_size=512,
        steps=10_000,
        warmup_steps=333,
        lr=3e-3,
        final_lr=3e-4,
        eval_inputs=4096,
        device="cuda",
    )
    colouring = ColouringRunConfig(
        n_vertices=10,
        m_seeds=10,
        batch_size=256,
        steps=300_000,
        lr=1e-3,
        final_lr=1e-4,
        warmup_steps=1000,
        adam_eps=1e-3,
        weight_decay=0.1,
        q=10.0,
        eval_seeds=10,
        device="cuda",
    )
    return RandomizedAlgorithmsPreset(
        recall=recall,
        models=["erm_random", "lq_random", "lq_fixed", "erm_fixed"],
        q_large=100.0,
        replicates=5,
        n_keys_sweep=[8, 10, 12, 14, 16, 18, 20],
        q_sweep=[1.0, 16.0, 32.0, 100.0],
        m_sweep=[1, 2, 4, 8, 16],
        colouring=colouring,
        colouring_qs=[1.0, 2.0, 3.0, 5.0, 10.0],
        grid_world=GridWorldRunConfig(generations=10_000, chunk_size=50, device="cuda"),
    )


# -- analysis ---------------------------------------------------------------------------------
_EVAL_KEYS = (
    "eval.mean_success",
    "eval.p5_success",
    "eval.min_success",
    "eval.majority_success",
    "eval.sampled_success",
    "eval.majority_sampled_success",
    "eval.predictive_variance",
)


def _last(run: Run, key: str) -> float:
    try:
        return run.last(key)
    except KeyError:
        return float("nan")


def _row(name: str, run: Run) -> dict:
    cfg = run.config
    row = {"run": name, "status": run.status, "q": cfg.get("q"), "m": cfg.get("m_seeds")}
    row.update({k.removeprefix("eval."): _last(run, k) for k in _EVAL_KEYS})
    try:  # fraction of held-out inputs that no evaluation seed solves
        success = run.tensors("eval.per_input_success")[1][-1]
        row["never_solved"] = float(np.mean(success == 0.0))
    except KeyError:
        row["never_solved"] = float("nan")
    return row


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else float("nan")


def _main_table(runs: dict[str, Run]) -> tuple[dict[str, dict], list[dict]]:
    per_model: dict[str, list[dict]] = {}
    rows = []
    for name, run in sorted(runs.items()):
        if not name.startswith("recall_"):
            continue
        model = name.removeprefix("recall_").rsplit("_s", 1)[0]
        row = _row(name, run) | {"model": model}
        rows.append(row)
        per_model.setdefault(model, []).append(row)
    means = {
        model: {k: _mean([r[k] for r in group]) for k in group[0] if isinstance(group[0][k], float)}
        for model, group in per_model.items()
    }
    return means, rows


def _verdicts(means: dict[str, dict]) -> list[Verdict]:
    nan = float("nan")
    erm = means.get("erm_random", {})
    lq = means.get("lq_random", {})
    fixed = means.get("lq_fixed", {})
    v_erm = erm.get("predictive_variance", nan)
    v_lq = lq.get("predictive_variance", nan)
    need = max(I_LQ_VARIANCE_MIN, I_RATIO_MIN * v_erm) if not math.isnan(v_erm) else nan
    i_pass = bool(v_erm <= I_ERM_VARIANCE_MAX and v_lq >= need)
    p5_gap = lq.get("p5_success", nan) - fixed.get("p5_success", nan)
    vote_gain = lq.get("majority_success", nan) - lq.get("mean_success", nan)
    return [
        Verdict(
            "i: q = 1 ignores the seed (V ≈ 0); large q uses it (V > 0)",
            "predictive variance V(A^q_R) = mean_{i,b} Var_seeds σ(logit); needs V(A^E_R) ≤ "
            f"{I_ERM_VARIANCE_MAX:g}",
            v_lq,
            need,
            i_pass,
            f"V(A^q_R) >= max({I_LQ_VARIANCE_MIN:g}, {I_RATIO_MIN:g}·V(A^E_R)) and "
            f"V(A^E_R) = {v_erm:.3g} <= {I_ERM_VARIANCE_MAX:g}",
        ),
        Verdict(
            "ii: the randomized Lq model's worst case beats the deterministic Lq model's",
            "p5 over inputs of per-input success: p5(A^q_R) − p5(A^q_r0)",
            p5_gap,
            II_P5_GAP,
            bool(p5_gap >= II_P5_GAP),
            f"measured >= threshold; p5(A^q_R) = {lq.get('p5_success', nan):.3f}, "
            f"p5(A^q_r0) = {fixed.get('p5_success', nan):.3f}",
        ),
        Verdict(
            "iii: a majority vote over seeds beats a single seed (A^q_R)",
            "mean majority-vote success − mean single-seed success (30 eval seeds)",
            vote_gain,
            III_VOTE_GAIN,
            bool(vote_gain >= III_VOTE_GAIN),
            f"measured >= threshold; majority {lq.get('majority_success', nan):.3f}, "
            f"single seed {lq.get('mean_success', nan):.3f}",
        ),
    ]


def analyze(runs: dict[str, Run], figures: Path) -> Analysis:
    """Verdicts i-iii from the main recall runs; tables and figures for every part present."""
    means, rows = _main_table(runs)
    tables = {"recall: evaluation per run (held-out set, 30 seeds)": rows}
    figs = _main_figures(runs, rows, figures)
    sweep = [
        _row(n, r) | {"N": r.config["n_keys"]}
        for n, r in sorted(runs.items())
        if n.startswith("sweep_")
    ]
    msweep = [_row(n, r) for n, r in sorted(runs.items()) if n.startswith("msweep_")]
    colour = [_row(n, r) for n, r in sorted(runs.items()) if n.startswith("colour_")]
    if sweep:
        tables["recall: N x q sweep (A^q_R)"] = sweep
    if msweep:
        tables["recall: m sweep (A^q_R)"] = msweep
    if colour:
        tables["cycle colouring C_n: success per q (all cycles)"] = colour
    if sweep or msweep or colour:
        figs.append(_sweep_figure(sweep, msweep, colour, figures))
    grid = {n: r for n, r in runs.items() if n.startswith("grid_")}
    if grid:
        tables["grid world (PGPE, exact adversary)"] = [
            {
                "run": n,
                "status": r.status,
                "worst_return": _last(r, "eval.worst_return"),
                "mean_return": _last(r, "eval.mean_return"),
            }
            for n, r in sorted(grid.items())
        ]
        figs.append(_grid_figure(grid, figures))
    return Analysis(_verdicts(means), figs, tables)


_COLOURS = {"erm_random": "C0", "lq_random": "C3", "lq_fixed": "C2", "erm_fixed": "C7"}
_LABELS = {
    "erm_random": "A^E_R (q=1, random r)",
    "lq_random": "A^q_R (Lq, random r)",
    "lq_fixed": "A^q_r0 (Lq, fixed r0)",
    "erm_fixed": "A^E_r0 (q=1, fixed r0)",
}


def _main_figures(runs: dict[str, Run], rows: list[dict], figures: Path) -> list[Path]:
    if not rows:
        return []
    first = {}
    for row in rows:
        first.setdefault(row["model"], row["run"])
    fig, axes = new_figure(3, title="recall: per-input success over 30 seeds (held-out inputs)")
    bins = np.linspace(0, 1, 21)
    for ax, (model, name) in zip(axes, list(first.items())[:3], strict=False):
        try:
            s = runs[name].tensors("eval.per_input_success")[1][-1]
        except KeyError:
            continue
        ax.hist(s, bins=bins, color=_COLOURS.get(model, "C1"))
        ax.set(xlabel="per-input success", ylabel="inputs", title=_LABELS.get(model, model))
    paths = [save_figure(fig, figures / "recall_success_histograms.png")]

    fig, (ax1, ax2, ax3) = new_figure(3, title="recall: summary per model (mean over replicates)")
    models = list(first)
    metrics = ("mean_success", "p5_success", "majority_success", "sampled_success")
    width = 0.8 / len(models)
    for k, model in enumerate(models):
        vals = [_mean([r[m] for r in rows if r["model"] == model]) for m in metrics]
        ax1.bar(
            np.arange(len(metrics)) + (k - (len(models) - 1) / 2) * width,
            vals,
            width,
            color=_COLOURS.get(model, "C1"),
            label=_LABELS.get(model, model),
        )
        v = _mean([r["predictive_variance"] for r in rows if r["model"] == model])
        ax2.bar(k, max(v, 1e-12), color=_COLOURS.get(model, "C1"))
        ax2.annotate(f"{v:.2g}", (k, max(v, 1e-12)), ha="center", va="bottom", fontsize=8)
    ax1.set_xticks(np.arange(len(metrics)), ["mean", "p5", "majority", "sampled"])
    ax1.set(ylabel="success", ylim=(0, 1.15), title="success statistics")
    ax1.legend(loc="upper left", fontsize=7)
    ax2.set_yscale("log")
    ax2.axhline(I_ERM_VARIANCE_MAX, color="grey", ls=":", lw=1)
    ax2.set_xticks(np.arange(len(models)), [m.replace("_", "\n") for m in models])
    ax2.set(ylabel="V (log; bars floored at 1e-12)", title="predictive variance (dotted: 1e-3)")
    for model, name in first.items():
        curve = runs[name].scalar("train.success")
        ax3.plot(curve.index, curve.values, color=_COLOURS.get(model, "C1"), label=model)
    ax3.set(xlabel="step", ylabel="train success (batch)", title="training")
    paths.append(save_figure(fig, figures / "recall_summary.png"))
    return paths


def _sweep_figure(sweep: list[dict], msweep: list[dict], colour: list[dict], figures: Path) -> Path:
    fig, (ax1, ax2, ax3) = new_figure(3, title="sweeps (paper preset)")
    for n in sorted({r["N"] for r in sweep}):
        part = sorted((r for r in sweep if r["N"] == n), key=lambda r: r["q"])
        ax1.plot(
            [r["q"] for r in part], [r["predictive_variance"] for r in part], "o-", label=f"N={n}"
        )
    ax1.set(xscale="log", yscale="symlog", xlabel="q", ylabel="V", title="predictive variance vs q")
    ax1.legend(fontsize=6, ncol=2)
    ms = sorted(msweep, key=lambda r: r["m"])
    ax2.plot([r["m"] for r in ms], [r["p5_success"] for r in ms], "o", label="p5")
    ax2.plot([r["m"] for r in ms], [r["majority_success"] for r in ms], "s", label="majority")
    ax2.set(xscale="log", xlabel="training seeds m", ylabel="success", title="m sweep (q large)")
    ax2.legend()
    cs = sorted(colour, key=lambda r: r["q"])
    ax3.plot([r["q"] for r in cs], [r["mean_success"] for r in cs], "o", label="single seed")
    ax3.plot(
        [r["q"] for r in cs], [r["majority_success"] for r in cs], "s", label="> half of seeds"
    )
    ax3.set(xlabel="q", ylabel="proper colourings", title="C_n colouring vs q")
    ax3.legend()
    return save_figure(fig, figures / "sweeps.png")


def _grid_figure(grid: dict[str, Run], figures: Path) -> Path:
    fig, (ax,) = new_figure(1, title="grid world: PGPE against the exact adversary")
    for name, run in sorted(grid.items()):
        for key, ls in (("eval.worst_return", "-"), ("eval.mean_return", ":")):
            s = run.scalar(key)
            ax.plot(s.index, s.values, ls, label=f"{name} {key.removeprefix('eval.')}")
    ax.set(xlabel="generation", ylabel="return")
    ax.legend(fontsize=7)
    return save_figure(fig, figures / "grid_world.png")


STUDY = Study(
    name="randomized-algorithms",
    claim=CLAIM,
    source=SOURCE,
    presets={"smoke": smoke, "fast": fast, "paper": paper},
    build_runs=build_runs,
    analyze=analyze,
)
