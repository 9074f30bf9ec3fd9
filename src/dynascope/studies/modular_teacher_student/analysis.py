"""modular-teacher-student verdicts from the stored runs. Claims, thresholds, statistics, the
fit bar and the controls: :mod:`~dynascope.studies.modular_teacher_student.protocol`; notes:
the study's docs page."""

from __future__ import annotations

import math
from pathlib import Path

from dynascope.store import Run
from dynascope.studies._run_values import last_or_nan
from dynascope.studies.base import Analysis
from dynascope.studies.verdict import Precondition, Verdict

from .figures import hyper_figure, hyper_rows, study_figures
from .protocol import FIT_MAX, PROTOCOL
from .runs import TeacherStudentRun

__all__ = ["BLESSED_SET", "DOOMED_SET", "analyze", "run_row"]

BLESSED_SET = "one_hots+ring"
DOOMED_SET = "one_hots+two_triangles"
COLUMNS = (
    "fit.relative_loss",
    "cross.relative_loss",
    "within.relative_loss",
    "cross.r2",
    "within.r2",
    "align",
)


def run_row(run: Run) -> dict:
    """One run's config, status and final instruments (NaN for what it did not log)."""
    cfg = TeacherStudentRun.model_validate(run.config)
    row = {"run": run.name, "task_set": cfg.task_set, "seed": cfg.seed, "status": run.status}
    row["train.relative_loss"] = last_or_nan(run, "train.relative_loss")
    return row | {k: last_or_nan(run, k) for k in COLUMNS}


def _paired(rows: list[dict], key: str, sign: float) -> dict[int, float]:
    """seed -> sign·(Doomed − Blessed) of ``key`` for the seeds that have both runs."""
    by = {(r["task_set"], r["seed"]): r[key] for r in rows}
    seeds = sorted({s for (_, s) in by})
    return {
        s: sign * (by.get((DOOMED_SET, s), math.nan) - by.get((BLESSED_SET, s), math.nan))
        for s in seeds
    }


def verdicts(rows: list[dict]) -> list[Verdict]:
    """s1 (cross-component OOD loss) and s2 (cross-component decodability); their control is the
    same metric on within-component tasks; precondition: every run fits its training tasks."""
    main = [r for r in rows if r["task_set"] in (BLESSED_SET, DOOMED_SET)]
    fits = [r["fit.relative_loss"] if r["status"] == "finished" else math.nan for r in main]
    worst = max(fits, default=math.nan) if all(math.isfinite(f) for f in fits) else math.nan
    pre = Precondition(
        f"every Blessed and Doomed run finished and fits its training tasks: relative loss <= "
        f"{FIT_MAX}, per run (measured: the worst run; NaN: a run unfinished or not measured)",
        bool(worst <= FIT_MAX),
        worst,
    )
    fit_note = "; ".join(
        f"{r['task_set']} seed {r['seed']}: fit {r['fit.relative_loss']:.3g}" for r in main
    )
    s1 = PROTOCOL.claim("s1").judge(
        _paired(main, "cross.relative_loss", 1.0),
        precondition=pre,
        control=_paired(main, "within.relative_loss", 1.0),
        detail=fit_note,
    )
    s2 = PROTOCOL.claim("s2").judge(
        _paired(main, "cross.r2", -1.0),
        precondition=pre,
        control=_paired(main, "within.r2", -1.0),
        detail=fit_note,
    )
    return [s1, s2]


def analyze(runs: dict[str, Run], figures: Path) -> Analysis:
    """Verdicts s1, s2, a table of every run, figures; hyperteacher runs (``hyper_*``, paper
    preset) give a table and a figure, no verdict."""
    hyper = {name: run for name, run in runs.items() if name.startswith("hyper_")}
    rows = [run_row(run) for name, run in runs.items() if name not in hyper]
    main = [r for r in rows if not r["run"].startswith(("sweep_", "monolithic_"))]
    figs = study_figures(main, {n: r for n, r in runs.items() if n not in hyper}, figures)
    tables = {"runs: fit, cross/within-component loss and R², module alignment": rows}
    if hyper:
        tables["hyperteacher: OOD accuracy by learner and (M, K)"] = h_rows = hyper_rows(hyper)
        figs.append(hyper_figure(h_rows, figures))
    return Analysis(verdicts(main), figs, tables)
