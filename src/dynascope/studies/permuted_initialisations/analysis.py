"""Analysis of ``permuted-initialisations``: verdicts p1-p3 (the verdict contract), tables.

Glossary: a run's ``label`` is its architecture (``MLP 64-1024-10``, ``CNN 32-32-avg-64-64``);
``vanilla``, ``activation``, ``weight``, ``random`` are the permutations of net 1 (none,
activation matching, weight matching, uniformly random: the negative control); ``init_avg``
is the average of the two random initialisations under a permutation; ``midpoint`` is
θ(0.5) of the trained nets. A seed is a gated pair run's seed. Thresholds, preconditions,
controls and seeds: the study's protocol (``protocol.py``).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from dynascope.store import Run
from dynascope.studies._run_values import last_or_nan
from dynascope.studies.base import Analysis
from dynascope.studies.verdict import Precondition, Verdict

from .figures import CHANCE, barrier_figure, label_of, nway_t_figure, path_figure
from .protocol import PROTOCOL, TRAINED_MIN_ACCURACY
from .transformer import barrier_tables, split_runs

__all__ = ["CHANCE", "analyze"]

METHODS = ("vanilla", "activation", "weight", "random")


def _row(name: str, run: Run) -> dict:
    row = {
        "run": name,
        "label": label_of(run.config),
        "group": run.config["group"],
        "seed": run.config["seed"],
        "status": run.status,
        "net0.test.accuracy": last_or_nan(run, "net0.test.accuracy"),
        "net1.test.accuracy": last_or_nan(run, "net1.test.accuracy"),
        "net0.init.accuracy": last_or_nan(run, "net0.init.accuracy"),
    }
    for method in METHODS:
        row[f"midpoint.{method}.accuracy"] = last_or_nan(run, f"midpoint.{method}.accuracy")
        row[f"barrier.{method}.loss"] = last_or_nan(run, f"barrier.{method}.loss")
        row[f"barrier.{method}.loss_tempered"] = last_or_nan(run, f"barrier.{method}.loss_tempered")
        row[f"barrier.{method}.error"] = last_or_nan(run, f"barrier.{method}.error")
        row[f"init_avg.{method}.accuracy"] = last_or_nan(run, f"init_avg.{method}.accuracy")
    row["match.agreement"] = last_or_nan(run, "match.agreement")
    return row


def _mean(rows: list[dict], key: str) -> float:
    values = [r[key] for r in rows if math.isfinite(r[key])]
    return float(np.mean(values)) if values else float("nan")


def _ratio(row: dict, method: str) -> float:
    """``barrier(method) / barrier(vanilla)`` (NLL); NaN when the vanilla barrier is not > 0."""
    vanilla = row["barrier.vanilla.loss"]
    if not (math.isfinite(vanilla) and vanilla > 0):
        return float("nan")
    return row[f"barrier.{method}.loss"] / vanilla


def _trained(rows: list[dict]) -> Precondition:
    """Both end points of every pair reach ``TRAINED_MIN_ACCURACY`` test accuracy."""
    worst = min(
        (min(r["net0.test.accuracy"], r["net1.test.accuracy"]) for r in rows),
        default=float("nan"),
    )
    met = bool(rows) and all(r["status"] == "finished" for r in rows)
    met = met and math.isfinite(worst) and worst >= TRAINED_MIN_ACCURACY
    return Precondition(
        f"both trained nets of every pair reach test accuracy >= {TRAINED_MIN_ACCURACY} "
        "(per pair, per net; measured: the worst)",
        met,
        worst,
    )


def _verdicts(label: str, rows: list[dict]) -> list[Verdict]:
    """p1-p3 of one gated architecture from its pair rows (one per seed)."""
    by_seed = {int(r["seed"]): r for r in rows}

    def per_seed(key) -> dict[int, float]:
        return {s: float(key(r) if callable(key) else r[key]) for s, r in by_seed.items()}

    trained = _trained(rows)
    gain = _mean(rows, "midpoint.activation.accuracy") - _mean(rows, "midpoint.vanilla.accuracy")
    vanilla_barrier = _mean(rows, "barrier.vanilla.loss")
    p3_pre = Precondition(
        f"{trained.text}; and the vanilla NLL barrier > 0 in every pair (measured: its mean)",
        trained.met and all(r["barrier.vanilla.loss"] > 0 for r in rows),
        vanilla_barrier,
    )
    spec = lambda claim: PROTOCOL.claim(f"{claim} ({label})")  # noqa: E731
    return [
        spec("p1").judge(
            per_seed("init_avg.activation.accuracy"),
            precondition=trained,
            control=per_seed("init_avg.random.accuracy"),
            detail=f"chance {CHANCE}; weight matching's π gives "
            f"{_mean(rows, 'init_avg.weight.accuracy'):.3f}",
        ),
        spec("p2").judge(
            per_seed("init_avg.vanilla.accuracy"),
            precondition=trained,
            control=per_seed("init_avg.activation.accuracy"),
            detail=f"chance {CHANCE}; one init alone: {_mean(rows, 'net0.init.accuracy'):.3f}",
        ),
        spec("p3").judge(
            per_seed(lambda r: _ratio(r, "activation")),
            precondition=p3_pre,
            control=per_seed(lambda r: _ratio(r, "random")),
            detail=f"barriers vanilla {vanilla_barrier:.3f}, matched "
            f"{_mean(rows, 'barrier.activation.loss'):.3f}, random "
            f"{_mean(rows, 'barrier.random.loss'):.3f} nats; midpoint accuracy matched − "
            f"vanilla {gain:+.3f}; single nets {_mean(rows, 'net0.test.accuracy'):.3f}",
        ),
    ]


def analyze(runs: dict[str, Run], figures: Path) -> Analysis:
    """Verdicts p1-p3 per gated MLP architecture; tables and figures (notes page)."""
    runs, transformer_runs = split_runs(runs)
    rows = [_row(name, run) for name, run in sorted(runs.items())]
    finished = {r["run"]: r for r in rows if r["status"] == "finished"}
    pairs: dict[str, list[dict]] = {}
    for row in rows:
        if row["group"] == "pairs":
            pairs.setdefault(row["label"], []).append(row)
    verdicts = [v for label, group in pairs.items() for v in _verdicts(label, group)]
    tables = {"runs: trained nets, midpoints, barriers, init averages": rows}
    tables["self-checks on net 0 (permutation invariance, self-matching, self-barrier)"] = [
        {
            "run": name,
            "max |f(x) − f_perm(x)|": last_or_nan(run, "check.permuted_max_abs_diff"),
            "self-match recovered (activation)": last_or_nan(run, "check.self_match.activation"),
            "self-match recovered (weight)": last_or_nan(run, "check.self_match.weight"),
            "dead units": last_or_nan(run, "check.dead_units"),
            "self barrier (nats)": last_or_nan(run, "check.self_barrier"),
        }
        for name, run in sorted(runs.items())
    ]
    by_t = _accuracy_vs_t(runs, finished)
    if by_t:
        tables["permuted-init average accuracy vs the step T of the matching"] = by_t
    nway = _nway_rows(runs, finished)
    if nway:
        tables["n-way averages of inits (matched to net 0 at the end)"] = nway
    tables.update(barrier_tables(transformer_runs))
    hidden = [r.config["hidden"][0] for _, r in sorted(runs.items())]
    figs = [
        path_figure(runs, finished, figures),
        barrier_figure(rows, hidden, finished, figures, PROTOCOL.claims[0].threshold),
        nway_t_figure(by_t, nway, figures),
    ]
    return Analysis(verdicts, figs, tables)


def _tensor(run: Run, key: str) -> np.ndarray | None:
    try:
        return run.tensors(key)[1][-1]
    except KeyError:
        return None


def _accuracy_vs_t(runs: dict[str, Run], finished: dict) -> list[dict]:
    out = []
    for name, run in sorted(runs.items()):
        if name not in finished or run.config["group"] != "pairs":
            continue
        series = run.scalar("init_avg.activation_at_T.accuracy")
        for step, value in series.items():
            out.append(
                {"run": name, "label": label_of(run.config), "T": int(step), "accuracy": value}
            )
    return out


def _nway_rows(runs: dict[str, Run], finished: dict) -> list[dict]:
    out = []
    for name, run in sorted(runs.items()):
        m = _tensor(run, "nway.m") if name in finished else None
        if m is None:
            continue
        vanilla, matched = (
            _tensor(run, "nway.vanilla.accuracy"),
            _tensor(run, "nway.activation.accuracy"),
        )
        for k, value in enumerate(m):
            out.append(
                {
                    "run": name,
                    "m nets": int(value),
                    "unpermuted accuracy": float(vanilla[k]),
                    "permuted accuracy": float(matched[k]),
                }
            )
    return out
