"""Claims of ``compositional-icl-bottleneck`` under the verdict contract.

Thresholds, statistics, bars and controls: :mod:`~dynascope.studies.
compositional_icl_bottleneck.protocol`. Per run seed (runs ``{model}_{support}_s{i}``; the
ablation arm ``{model}_unstructured_s{i}``, trained on the unstructured split):

- 1: R²_OOD(hyper) − R²_OOD(vanilla) on Connected+. Control: the same gap of the two
  unstructured models.
- 1b: min over the two models of the best-layer ridge R² of z (query token, OOD). Control:
  the same probe and minimum on the unstructured models.
- 2: R²_OOD(hyper, Connected) − R²_OOD(hyper, Disconnected). Control: the same gap of the
  vanilla model. Judged only where the preset has both supports (``paper``).

Precondition of every claim: every run the claim and its control read finished with ID R²
(its own training distribution) >= ``protocol.ID_FIT``, per run.
"""

from __future__ import annotations

import math
from pathlib import Path

from dynascope.store import Run
from dynascope.studies._run_values import last_or_nan
from dynascope.studies.base import Analysis
from dynascope.studies.compositional_icl_bottleneck.figures import figures as make_figures
from dynascope.studies.compositional_icl_bottleneck.protocol import ID_FIT, PROTOCOL
from dynascope.studies.verdict import Precondition

__all__ = ["analyze"]


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
    nan = float("nan")

    def arm(model: str, tag: str) -> dict[int, dict]:
        """Replicate index -> row of ``{model}_{tag}_s{i}`` (tag: a support or unstructured)."""
        return {
            r["index"]: r
            for r in rows
            if r["model"] == model
            and (r["train_split"] == "unstructured" if tag == "unstructured" else
                 r["train_split"] == "train" and r["support"] == tag)
        }  # fmt: skip

    index = sorted({r["index"] for r in rows if r["train_split"] == "train"})

    def val(key: str, model: str, tag: str) -> dict[int, float]:
        got = arm(model, tag)
        return {i: got[i][key] if i in got else nan for i in index}

    def by_seed(values: dict[int, float], model: str, tag: str) -> dict[int, float]:
        """Replicate index -> run seed of ``model``'s run on ``tag`` (the index if missing)."""
        got = arm(model, tag)
        return {int(got[i]["seed"]) if i in got else i: v for i, v in values.items()}

    def diff(a: dict[int, float], b: dict[int, float]) -> dict[int, float]:
        return {i: a[i] - b[i] for i in index}

    def fit(arms: list[tuple[str, str]]) -> Precondition:
        """Every run of ``arms`` (one per replicate) finished with ID R² >= ID_FIT."""
        values = []
        for model, tag in arms:
            got = arm(model, tag)
            values += [
                got[i]["id.r2"] if i in got and got[i]["status"] == "finished" else nan
                for i in index
            ]
        low = min(values) if values and all(math.isfinite(v) for v in values) else nan
        names = ", ".join(f"{m}/{t}" for m, t in arms)
        return Precondition(
            f"every run of {names} finished with ID R² (own training distribution) >= "
            f"{ID_FIT}, per run (measured: the worst run; NaN: a run unfinished or missing)",
            met=bool(index) and bool(low >= ID_FIT),
            measured=low,
        )

    cp, un = "connected+", "unstructured"
    c1 = [("hyper", cp), ("vanilla", cp), ("hyper", un), ("vanilla", un)]
    v1 = PROTOCOL.claim("1").judge(
        by_seed(diff(val("ood.r2", "hyper", cp), val("ood.r2", "vanilla", cp)), "hyper", cp),
        precondition=fit(c1),
        control=by_seed(
            diff(val("ood.r2", "hyper", un), val("ood.r2", "vanilla", un)), "hyper", un
        ),
    )
    key = "probe.ood.r2_best_layer"
    low = lambda tag: {  # noqa: E731
        i: min(val(key, "hyper", tag)[i], val(key, "vanilla", tag)[i]) for i in index
    }
    v1b = PROTOCOL.claim("1b").judge(
        by_seed(low(cp), "hyper", cp),
        precondition=fit(c1),
        control=by_seed(low(un), "hyper", un),
    )
    verdicts = [v1, v1b]
    tables: dict[str, list[dict]] = {"per run": rows}
    supports = {r["support"] for r in rows if r["train_split"] == "train"}
    claim2 = "2: " + PROTOCOL.claim("2").claim
    if {"connected", "disconnected"} <= supports:
        gap = lambda m: diff(  # noqa: E731
            val("ood.r2", m, "connected"), val("ood.r2", m, "disconnected")
        )
        verdicts.append(
            PROTOCOL.claim("2").judge(
                by_seed(gap("hyper"), "hyper", "connected"),
                precondition=fit(
                    [(m, s) for m in ("hyper", "vanilla") for s in ("connected", "disconnected")]
                ),
                control=by_seed(gap("vanilla"), "vanilla", "connected"),
            )
        )
    else:
        reason = "not run in this preset (paper only: decided once from the measured step time)"
        tables["not run"] = [{"claim": claim2, "reason": reason}]
    return Analysis(verdicts, make_figures(runs, rows, figures), tables)
