"""Claims of ``compositional-icl-bottleneck`` under the verdict contract.

Thresholds are SYSTEMS.md S3's proposals, frozen before the first fast run; ``ID_FIT`` is
issue 19's precondition (both models fit the training combinations), fixed before any run of
this version. Per seed i (runs ``{model}_{support}_s{i}``):

- 1: R²_OOD(hyper) − R²_OOD(vanilla) >= 0.2 on Connected+. Control: the same gap on the ID
  split (a fitting advantage, not a generalization one, must not pass).
- 1b: min over the two models of the best-layer ridge R² of z (query token, OOD) >= 0.5.
  Control: the same probe on the untrained models (step 0).
- 2: R²_OOD(hyper, Connected) − R²_OOD(hyper, Disconnected) >= 0.2. Control: the same gap
  of the vanilla model. Judged only where the preset has both supports (``paper``).

Precondition of every claim: its runs finished and every model in it reaches a seed-mean ID
R² >= ``ID_FIT`` on each support it uses.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from dynascope.store import Run
from dynascope.studies._run_values import last_or_nan
from dynascope.studies.base import Analysis
from dynascope.studies.compositional_icl_bottleneck.figures import figures as make_figures
from dynascope.studies.verdict import Control, Precondition, judge

__all__ = ["C1B_PROBE", "C1_OOD_GAP", "C2_HYPER_GAP", "ID_FIT", "analyze"]

C1_OOD_GAP = 0.2
C1B_PROBE = 0.5
C2_HYPER_GAP = 0.2
ID_FIT = 0.9


def _first_or_nan(run: Run, key: str) -> float:
    s = run.scalar(key)
    return float(s.iloc[0]) if len(s) else float("nan")


def _row(name: str, run: Run) -> dict:
    cfg = run.config
    layers = range(int(cfg["n_layers"]))
    probes = [last_or_nan(run, f"probe.ood.L{i}.r2") for i in layers]
    probes0 = [_first_or_nan(run, f"probe.ood.L{i}.r2") for i in layers]
    best = lambda v: max([p for p in v if math.isfinite(p)], default=float("nan"))  # noqa: E731
    return {
        "run": name,
        "index": int(name.rsplit("_s", 1)[1]),
        "model": cfg["model"],
        "support": cfg["support"],
        "train_split": cfg["train_split"],
        "seed": cfg["seed"],
        "status": run.status,
        "id.r2": last_or_nan(run, "id.r2"),
        "ood.r2": last_or_nan(run, "ood.r2"),
        "probe.ood.r2_last_layer": probes[-1] if probes else float("nan"),
        "probe.ood.r2_best_layer": best(probes),
        "probe.ood.r2_best_layer_init": best(probes0),
    }


def analyze(runs: dict[str, Run], figures: Path) -> Analysis:
    """Claims 1, 1b and (where run) 2; tables; one figure."""
    rows = [_row(n, r) for n, r in sorted(runs.items())]
    structured = [r for r in rows if r["train_split"] == "train"]
    index = sorted({r["index"] for r in structured})

    def val(key: str, model: str, support: str) -> dict[int, float]:
        got = {
            r["index"]: r[key] for r in structured if (r["model"], r["support"]) == (model, support)
        }
        return {i: got.get(i, float("nan")) for i in index}

    def diff(a: dict[int, float], b: dict[int, float]) -> dict[int, float]:
        return {i: a[i] - b[i] for i in index}

    def fit(pairs: list[tuple[str, str]]) -> Precondition:
        sel = [r for r in structured if (r["model"], r["support"]) in pairs]
        means = [float(np.mean([r["id.r2"] for r in sel if (r["model"], r["support"]) == p]))
                 for p in pairs if any((r["model"], r["support"]) == p for r in sel)]  # fmt: skip
        low = min(means, default=float("nan"))
        done = bool(sel) and all(r["status"] == "finished" for r in sel)
        names = ", ".join(f"{m}/{s}" for m, s in pairs)
        return Precondition(
            f"runs finished and seed-mean ID R² >= {ID_FIT} for {names}",
            met=done and len(means) == len(pairs) and low >= ID_FIT,
            measured=low,
        )

    cp = "connected+"
    c1 = [("hyper", cp), ("vanilla", cp)]
    v1 = judge(
        claim="1: on Connected+ the hypernetwork transformer beats the vanilla one OOD",
        metric="per seed, R²_OOD(hyper) − R²_OOD(vanilla), Connected+",
        per_seed=diff(val("ood.r2", "hyper", cp), val("ood.r2", "vanilla", cp)),
        threshold=C1_OOD_GAP,
        direction=">=",
        precondition=fit(c1),
        control=Control(
            "the same gap on the ID split: R²_ID(hyper) − R²_ID(vanilla)",
            per_seed=diff(val("id.r2", "hyper", cp), val("id.r2", "vanilla", cp)),
        ),
    )
    key, key0 = "probe.ood.r2_best_layer", "probe.ood.r2_best_layer_init"
    low = lambda k: {  # noqa: E731
        i: min(val(k, "hyper", cp)[i], val(k, "vanilla", cp)[i]) for i in index
    }
    v1b = judge(
        claim="1b: z is linearly decodable on OOD tasks from both models' residual streams",
        metric="per seed, min over models of the best-layer ridge R² (z from the query), OOD",
        per_seed=low(key),
        threshold=C1B_PROBE,
        direction=">=",
        precondition=fit(c1),
        control=Control("the same probe on the untrained models (step 0)", per_seed=low(key0)),
    )
    verdicts = [v1, v1b]
    tables: dict[str, list[dict]] = {"per run": rows}
    supports = {r["support"] for r in structured}
    claim2 = "2: disconnected support hurts the hypernetwork transformer OOD, not the vanilla one"
    if {"connected", "disconnected"} <= supports:
        gap = lambda m: diff(  # noqa: E731
            val("ood.r2", m, "connected"), val("ood.r2", m, "disconnected")
        )
        verdicts.append(
            judge(
                claim=claim2,
                metric="per seed, R²_OOD(hyper, Connected) − R²_OOD(hyper, Disconnected)",
                per_seed=gap("hyper"),
                threshold=C2_HYPER_GAP,
                direction=">=",
                precondition=fit(
                    [(m, s) for m in ("hyper", "vanilla") for s in ("connected", "disconnected")]
                ),
                control=Control("the same gap of the vanilla model", per_seed=gap("vanilla")),
            )
        )
    else:
        reason = "not run in this preset (paper only: decided once from the measured step time)"
        tables["not run"] = [{"claim": claim2, "reason": reason}]
    return Analysis(verdicts, make_figures(runs, rows, figures), tables)
