"""Claim s4 of ``hyla-fuzzy-logic`` under the verdict contract (notes: the study's docs page).

s4: per seed, test R²(``hyla_s{i}``) − test R²(``linear_s{i}``), judged by the protocol
(:mod:`~dynascope.studies.hyla_fuzzy_logic.protocol`: threshold, statistic, bars).
Precondition: every run the claim and its control read (HYLA, linear, linear twins) finished
with ID ("train" combinations) R² >= ``protocol.ID_FIT``, per run. Control (ablation, HYLA
removed): the linear twins, test R²(``linear_twin_s{i}``) − test R²(``linear_s{i}``): linear
attention in HYLA's place at the same budget, so the gap is seed noise unless linear attention
itself generalizes better from seed to seed.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from dynascope.store import Run
from dynascope.studies._run_values import last_or_nan
from dynascope.studies.base import Analysis
from dynascope.studies.hyla_fuzzy_logic.figures import figures as make_figures
from dynascope.studies.hyla_fuzzy_logic.protocol import ID_FIT, PROTOCOL
from dynascope.studies.hyla_fuzzy_logic.runs import EVAL_SPLITS
from dynascope.studies.hyla_fuzzy_logic.sraven import analyze_sraven
from dynascope.studies.verdict import Precondition

__all__ = ["CONTROL_SEED_OFFSET", "PAPER_TABLE_A1", "analyze"]

CONTROL_SEED_OFFSET = 100  # the linear twins' seeds: base + 100 + i

# Schug et al., ICLR 2025, arXiv 2406.05816, Table A1 (fuzzy logic), "OOD R²" (our test split):
# kind -> (mean, std) over 3 seeds at 50k steps × 128, d_model 128, T5 bias.
PAPER_TABLE_A1 = {"hyla": (0.8113, 0.0777), "linear": (0.5989, 0.0522)}


def _row(name: str, run: Run) -> dict:
    n_layers = int(run.config.get("n_layers", 0))
    row = {
        "run": name,
        "attention": run.config["attention"],
        "seed": run.config["seed"],
        "status": run.status,
    }
    for split in EVAL_SPLITS:
        row[f"{split}.r2"] = last_or_nan(run, f"{split}.r2")
    for tag in ("id", "test"):
        for metric in ("r2", "f1"):
            vals = [last_or_nan(run, f"probe.{tag}.L{i}.{metric}") for i in range(n_layers)]
            finite = [v for v in vals if math.isfinite(v)]
            row[f"probe.{tag}.{metric}_best_layer"] = max(finite) if finite else float("nan")
    row["train.loss"] = last_or_nan(run, "train.loss")
    return row


def _summary(rows: list[dict]) -> list[dict]:
    out = []
    for group in sorted({r["group"] for r in rows}):
        sel = [r for r in rows if r["group"] == group]
        entry = {"group": group, "seeds": len(sel)}
        for key in (
            "train.r2",
            "test.r2",
            "ood.r2",
            "probe.id.r2_best_layer",
            "probe.test.r2_best_layer",
        ):
            vals = np.array([r[key] for r in sel], dtype=float)
            entry[f"{key}.mean"] = float(np.mean(vals))
            entry[f"{key}.std"] = float(np.std(vals, ddof=1)) if len(vals) > 1 else float("nan")
        out.append(entry)
    return out


def _table_a1(by: dict[str, dict]) -> list[dict]:
    """Per kind: test R² (the paper's "OOD R²") here, seed mean ± std, next to Table A1's."""
    nan = float("nan")
    return [
        {
            "attention": kind,
            "test.r2 here (mean)": by.get(kind, {}).get("test.r2.mean", nan),
            "test.r2 here (std)": by.get(kind, {}).get("test.r2.std", nan),
            "seeds here": by.get(kind, {}).get("seeds", 0),
            "paper OOD R² (mean)": mean,
            "paper OOD R² (std)": std,
            "paper seeds": 3,
        }
        for kind, (mean, std) in PAPER_TABLE_A1.items()
    ]


def _a1_text(a1: list[dict]) -> str:
    """The Table A1 comparison in one line (``_table_a1``'s rows: HYLA, then linear)."""
    here = " vs ".join(
        f"{r['attention']} {r['test.r2 here (mean)']:.3f} ± {r['test.r2 here (std)']:.3f}"
        for r in a1
    )
    paper = " vs ".join(
        f"{r['paper OOD R² (mean)']:.3f} ± {r['paper OOD R² (std)']:.3f}" for r in a1
    )
    return (
        f"test R² (Table A1's 'OOD R²'), seed mean ± std: {here} here; paper {paper} (3 seeds, "
        f"50k steps × 128, d_model 128)"
    )


def analyze(runs: dict[str, Run], figures: Path) -> Analysis:
    """Claim s4 (module docstring), s4-sraven if run; tables per run and per group; figures."""
    sraven_runs = {n: r for n, r in runs.items() if "n_features" in r.config}
    fuzzy = {n: r for n, r in runs.items() if n not in sraven_runs}
    rows = []
    for name, run in sorted(fuzzy.items()):
        row = _row(name, run)
        row["group"] = name.rsplit("_s", 1)[0]
        rows.append(row)
    by_run = {(r["group"], int(r["run"].rsplit("_s", 1)[1])): r for r in rows}
    index = sorted(i for g, i in by_run if g == "hyla")

    def gap(first: str, second: str) -> dict[int, float]:
        """The first group's run seed -> its test R² minus the second group's (same index i)."""
        nan, out = float("nan"), {}
        for i in index:
            a, b = by_run.get((first, i)), by_run.get((second, i))
            key = int(a["seed"]) if a is not None else i
            out[key] = (a["test.r2"] if a else nan) - (b["test.r2"] if b else nan)
        return out

    summary = _summary(rows)
    by = {e["group"]: e for e in summary}
    fit = {k: by.get(k, {}).get("train.r2.mean", float("nan")) for k in ("hyla", "linear")}
    read = [r for r in rows if r["group"] in ("hyla", "linear", "linear_twin")]
    per_run = [r["train.r2"] if r["status"] == "finished" else float("nan") for r in read]
    worst = min(per_run) if per_run and all(math.isfinite(v) for v in per_run) else float("nan")
    groups = {r["group"] for r in read}
    a1 = _table_a1(by)
    verdict = PROTOCOL.claim("s4").judge(
        gap("hyla", "linear"),
        precondition=Precondition(
            f"every HYLA, linear and linear-twin run finished with ID (train-combination) R² >= "
            f"{ID_FIT}, per run (measured: the worst run; NaN: a run unfinished or missing)",
            met=bool(groups == {"hyla", "linear", "linear_twin"} and worst >= ID_FIT),
            measured=worst,
        ),
        control=gap("linear_twin", "linear"),
        detail=f"{_a1_text(a1)}; ID R² HYLA {fit['hyla']:.3f}, linear {fit['linear']:.3f}",
    )
    tables = {
        "per run": rows,
        "per group (seed mean ± std)": summary,
        "Table A1 side by side (test R², the paper's 'OOD R²')": a1,
    }
    verdicts = [verdict]
    sraven_verdict, sraven_rows = analyze_sraven(sraven_runs)
    if sraven_verdict is not None:
        verdicts.append(sraven_verdict)
        tables["sRAVEN per run"] = sraven_rows
    return Analysis(verdicts, make_figures(fuzzy, summary, figures), tables)
