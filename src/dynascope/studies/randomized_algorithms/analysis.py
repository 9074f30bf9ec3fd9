"""randomized-algorithms analysis: verdicts i-iii from the main recall runs (verdict contract),
tables and figures of the sweeps, the colouring arm and the grid world.

Thresholds, statistics, bars and controls: :mod:`~dynascope.studies.randomized_algorithms.
protocol`; how they were fixed: docs/studies/randomized-algorithms.md.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from dynascope.store import Run
from dynascope.studies._run_values import last_or_nan
from dynascope.studies.base import Analysis
from dynascope.studies.verdict import Precondition, Verdict

from .figures import colouring_figure, grid_figure, main_figures, sweep_figure
from .protocol import I_ERM_VARIANCE_MAX, I_LQ_VARIANCE_MIN, I_RATIO_MIN, PROTOCOL

__all__ = ["MAIN_MODELS", "analyze", "recall_loss_max"]

# The recall arms of fast: the three models of S2 and the m = 1 ablation (protocol).
MAIN_MODELS: tuple[str, ...] = ("erm_random", "lq_random", "lq_fixed", "lq_m1")
NAMES = {"erm_random": "A^E_R", "lq_random": "A^q_R", "lq_fixed": "A^q_r0", "lq_m1": "A^q_R m=1"}


_EVAL_KEYS = (
    "eval.mean_success",
    "eval.p5_success",
    "eval.min_success",
    "eval.majority_success",
    "eval.sampled_success",
    "eval.majority_sampled_success",
    "eval.predictive_variance",
)


def _row(name: str, run: Run) -> dict:
    cfg = run.config
    row = {"run": name, "status": run.status, "q": cfg.get("q"), "m": cfg.get("m_seeds")}
    row.update({k.removeprefix("eval."): last_or_nan(run, k) for k in _EVAL_KEYS})
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
        model, replicate = name.removeprefix("recall_").rsplit("_s", 1)
        cfg = run.config
        row = _row(name, run) | {
            "model": model,
            "seed": int(cfg.get("seed", replicate)),  # the run's seed (base seed + replicate)
            "train_loss": last_or_nan(run, "train.mean_loss"),
            "recall_loss_max": recall_loss_max(
                int(cfg["n_keys"]), int(cfg["d_head"]), int(cfg["n_value_bits"])
            ),
        }
        rows.append(row)
        per_model.setdefault(model, []).append(row)
    means = {
        model: {k: _mean([r[k] for r in group]) for k in group[0] if isinstance(group[0][k], float)}
        for model, group in per_model.items()
    }
    return means, rows


def recall_loss_max(n_keys: int, d_head: int, n_value_bits: int) -> float:
    """The "recall learned" bound on a model's training loss (nats, sum over value bits).

    Chance is ``b·ln 2``; a model storing ``k`` of the ``N`` associations (k = ``d_head``, the
    linear attention's key size and capacity) lowers it by ``k/N`` of chance; recall counts as
    learned when at least half of that reduction is reached: ``(1 − k/(2N))·b·ln 2``.
    """
    return (1 - min(1.0, d_head / n_keys) / 2) * n_value_bits * math.log(2)


def _per_seed(rows: list[dict], model: str, key: str) -> dict[int, float]:
    return {r["seed"]: r[key] for r in rows if r["model"] == model}


def _verdicts(rows: list[dict]) -> list[Verdict]:
    """i-iii per run seed (base seed + replicate), judged by the protocol: preconditions per
    claim on every arm it and its control read, ablation controls (protocol module)."""
    nan = float("nan")
    seeds = sorted({r["seed"] for r in rows})
    bound = next((r["recall_loss_max"] for r in rows), nan)

    def learned(models: tuple[str, ...]) -> Precondition:
        """Every run of ``models`` (one per seed) ends at training loss <= the bound."""
        losses = [_per_seed(rows, m, "train_loss").get(s, nan) for m in models for s in seeds]
        worst = max(losses) if losses and all(math.isfinite(x) for x in losses) else nan
        arms = ", ".join(NAMES.get(m, m) for m in models)
        return Precondition(
            f"recall learned: every run of {arms} ends at training loss (seed-averaged) <= "
            f"(1 - k/(2N))·b·ln 2 = {bound:.3f} nats, per run (measured: the worst run; NaN: "
            "a run missing)",
            bool(worst <= bound),
            worst,
        )

    v_erm = _per_seed(rows, "erm_random", "predictive_variance")
    v_lq = _per_seed(rows, "lq_random", "predictive_variance")
    v_m1 = _per_seed(rows, "lq_m1", "predictive_variance")
    lq = min((v_lq.get(s, nan) for s in seeds), default=nan)

    def used(models: tuple[str, ...]) -> Precondition:
        fit = learned(models)
        seed_used = bool(lq >= I_LQ_VARIANCE_MIN)
        return Precondition(
            fit.text + f"; and the seed is used: V(A^q_R) >= {I_LQ_VARIANCE_MIN:g} on every "
            f"seed (smallest V {lq:.4g}; measured: the part that failed, else the smallest V)",
            bool(fit.met and seed_used),
            fit.measured if not fit.met else lq,
        )

    def ratio(v: float, other: float) -> float:
        return v / max(I_LQ_VARIANCE_MIN, I_RATIO_MIN * other)

    p5 = {m: _per_seed(rows, m, "p5_success") for m in MAIN_MODELS}
    gain = {
        m: {s: r["majority_success"] - r["mean_success"] for s, r in _by_seed(rows, m).items()}
        for m in MAIN_MODELS
    }
    i = PROTOCOL.claim("i").judge(
        {s: ratio(v_lq.get(s, nan), v_erm.get(s, nan)) for s in seeds},
        precondition=learned(("erm_random", "lq_random", "lq_m1")),
        control={s: ratio(v_m1.get(s, nan), v_erm.get(s, nan)) for s in seeds},
        detail=f"V(A^E_R) per seed {[round(v_erm.get(s, nan), 6) for s in seeds]} (S2 also "
        f"asks <= {I_ERM_VARIANCE_MAX:g}); V(A^q_R m=1) per seed "
        f"{[round(v_m1.get(s, nan), 6) for s in seeds]}",
    )
    ii = PROTOCOL.claim("ii").judge(
        {s: p5["lq_random"].get(s, nan) - p5["lq_fixed"].get(s, nan) for s in seeds},
        precondition=used(("lq_random", "lq_fixed", "lq_m1")),
        control={s: p5["lq_m1"].get(s, nan) - p5["lq_fixed"].get(s, nan) for s in seeds},
    )
    iii = PROTOCOL.claim("iii").judge(
        {s: gain["lq_random"].get(s, nan) for s in seeds},
        precondition=used(("lq_random", "erm_random")),
        control={s: gain["erm_random"].get(s, nan) for s in seeds},
    )
    return [i, ii, iii]


def _by_seed(rows: list[dict], model: str) -> dict[int, dict]:
    return {r["seed"]: r for r in rows if r["model"] == model}


_COLOUR_KEYS = {
    "single_seed": "eval.mean_success",
    "majority": "eval.majority_success",
    "sampled": "eval.sampled_success",
    "p5": "eval.p5_success",
    "min": "eval.min_success",
}


def _colouring_tables(runs: dict[str, Run]) -> tuple[list[dict], list[dict]]:
    """Per (n, q): means over replicates of the colouring rates; per n: largest minus smallest q.

    ``single_seed``: mean over cycles and seeds of "the argmax colouring is proper";
    ``majority``: fraction of cycles coloured properly by more than half of the evaluation
    seeds; ``never_solved``: fraction of cycles that no evaluation seed colours properly.
    """
    groups: dict[tuple[int, float], list[tuple[str, Run]]] = {}
    for name, run in sorted(runs.items()):
        if name.startswith("colour_"):
            key = (int(run.config["n_vertices"]), float(run.config["q"]))
            groups.setdefault(key, []).append((name, run))
    per_q = []
    for (n, q), group in sorted(groups.items()):
        row: dict = {"n": n, "q": q, "runs": ", ".join(name for name, _ in group)}
        row["status"] = ", ".join(sorted({str(run.status) for _, run in group}))
        row["steps"] = _steps(group[0][1].config)
        row["eval_seeds"] = int(group[0][1].config["eval_seeds"])
        for col, key in _COLOUR_KEYS.items():
            row[col] = _mean([last_or_nan(run, key) for _, run in group])
        row["never_solved"] = _mean([_row(name, run)["never_solved"] for name, run in group])
        row["cycles"] = _n_inputs(group[0][1])
        per_q.append(row)
    trend = []
    for n in sorted({r["n"] for r in per_q}):
        rows = sorted((r for r in per_q if r["n"] == n), key=lambda r: r["q"])
        if len(rows) < 2:
            continue
        low, high = rows[0], rows[-1]
        trend.append(
            {"n": n, "q_low": low["q"], "q_high": high["q"]}
            | {
                f"delta_{col}": high[col] - low[col]
                for col in ("single_seed", "majority", "min", "never_solved")
            }
        )
    return per_q, trend


def _steps(config: dict) -> int:
    """A run's steps: the engine loop's (``loop.steps``) or a flat ``steps`` field."""
    return int(config["loop"]["steps"] if "loop" in config else config["steps"])


def _n_inputs(run: Run) -> int:
    try:
        return int(run.tensors("eval.per_input_success")[1][-1].shape[0])
    except KeyError:
        return 0


def analyze(runs: dict[str, Run], figures: Path) -> Analysis:
    """Verdicts i-iii from the main recall runs; tables and figures for every part present.

    The colouring arm is reported (tables ``cycle colouring ...`` and ``colouring_trend.png``),
    not gated: SYSTEMS.md S2 states its result (majority vote nears 100% as q grows; clear
    advantage for q > 3) without a threshold.
    """
    means, rows = _main_table(runs)
    tables = {"recall: evaluation per run (held-out set, 30 seeds)": rows}
    figs = main_figures(runs, rows, figures, I_ERM_VARIANCE_MAX)
    sweep = [
        _row(n, r) | {"N": r.config["n_keys"]}
        for n, r in sorted(runs.items())
        if n.startswith("sweep_")
    ]
    msweep = [_row(n, r) for n, r in sorted(runs.items()) if n.startswith("msweep_")]
    if sweep:
        tables["recall: N x q sweep (A^q_R)"] = sweep
    if msweep:
        tables["recall: m sweep (A^q_R)"] = msweep
    if sweep or msweep:
        figs.append(sweep_figure(sweep, msweep, figures))
    per_q, trend = _colouring_tables(runs)
    if per_q:
        tables[
            "cycle colouring C_n per q, all cycles (reported, not gated): proper-colouring rate "
            "of one seed and of a majority (> half of the eval seeds)"
        ] = per_q
        if trend:
            tables["cycle colouring trend: largest q minus smallest q (reported, not gated)"] = (
                trend
            )
        colour_runs = {n: r for n, r in runs.items() if n.startswith("colour_")}
        figs.append(colouring_figure(colour_runs, per_q, figures))
    grid = {n: r for n, r in runs.items() if n.startswith("grid_")}
    if grid:
        tables["grid world (PGPE, exact adversary)"] = [
            {
                "run": n,
                "status": r.status,
                "worst_return": last_or_nan(r, "eval.worst_return"),
                "mean_return": last_or_nan(r, "eval.mean_return"),
            }
            for n, r in sorted(grid.items())
        ]
        figs.append(grid_figure(grid, figures))
    return Analysis(_verdicts(rows), figs, tables)
