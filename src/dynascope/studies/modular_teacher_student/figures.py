"""Figures of ``modular-teacher-student``: per-seed cross/within-component loss and R² by task
set, the training tasks' relative loss against outer steps, hyperteacher accuracy."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dynascope.report import new_figure, save_figure
from dynascope.store import Run
from dynascope.studies._run_values import last_or_nan

from .hyperteacher import PAPER_OOD_ACCURACY, HyperteacherRunConfig

__all__ = ["hyper_figure", "hyper_rows", "study_figures"]


def study_figures(main: list[dict], runs: dict[str, Run], figures: Path) -> list[Path]:
    """``identification.png``: per-seed relative loss and decoding R² by task split (bars: seed
    means), and the query-set relative loss of the training tasks against outer steps; returns
    its path."""
    sets = list(dict.fromkeys(r["task_set"] for r in main))
    fig, axes = new_figure(3, width=4.2, title="modular teacher–student (dots: seeds)")
    for ax, (keys, label, title) in zip(
        axes[:2],
        (
            (
                ("fit.relative_loss", "cross.relative_loss", "within.relative_loss"),
                "relative loss",
                "student's loss by task split (lower: better)",
            ),
            (("cross.r2", "within.r2"), "decoding R²", "teacher codes decoded from the student"),
        ),
    ):
        for k, key in enumerate(keys):
            for i, name in enumerate(sets):
                vals = [r[key] for r in main if r["task_set"] == name]
                x = k * (len(sets) + 1) + i
                finite = [v for v in vals if np.isfinite(v)]
                ax.bar(
                    x,
                    np.mean(finite) if finite else np.nan,
                    color=f"C{i}",
                    label=name if k == 0 else None,
                )
                ax.plot([x] * len(vals), vals, "k.", ms=4)
        ax.set_xticks(
            [k * (len(sets) + 1) + (len(sets) - 1) / 2 for k in range(len(keys))],
            [key.split(".")[0] for key in keys],
        )
        ax.set(ylabel=label, title=title)
    ax = axes[2]
    for run in runs.values():
        series = run.scalar("train.relative_loss") if not run.scalars.empty else None
        if series is None or series.empty:
            continue
        i = sets.index(run.config["task_set"]) if run.config["task_set"] in sets else 0
        ax.plot(series.index, series.to_numpy(), color=f"C{i}", lw=1)
    ax.set(xlabel="outer step", ylabel="query relative loss (train tasks)", yscale="log")
    ax.set_title("training, one line per seed")
    handles = [ax.plot([], [], color=f"C{i}", lw=4, label=name)[0] for i, name in enumerate(sets)]
    ax.legend(handles=handles, fontsize=7, loc="upper right")
    return [save_figure(fig, figures / "identification.png")]


def hyper_rows(runs: dict[str, Run]) -> list[dict]:
    """One row per hyperteacher run: learner, (M, K), train/OOD accuracy and the paper's."""
    rows = []
    for name, run in runs.items():
        cfg = HyperteacherRunConfig.model_validate(run.config)
        rows.append(
            {
                "run": name,
                "status": run.status,
                "learner": cfg.learner,
                "M": cfg.n_experts,
                "K": cfg.num_hot,
                "train_accuracy_%": 100 * last_or_nan(run, "train.accuracy"),
                "ood_accuracy_%": 100 * last_or_nan(run, "ood.accuracy"),
                "paper_ood_accuracy_%": PAPER_OOD_ACCURACY.get(
                    (cfg.learner, cfg.n_experts, cfg.num_hot), float("nan")
                ),
            }
        )
    return rows


def hyper_figure(rows: list[dict], figures: Path) -> Path:
    """``hyperteacher_ood_accuracy.png``: OOD accuracy per learner and (M, K); the paper's
    values drawn as ticks."""
    grid = sorted({(r["M"], r["K"]) for r in rows})
    learners = sorted({r["learner"] for r in rows})
    fig, (ax,) = new_figure(1, width=7.0, title="hyperteacher: OOD accuracy (mean over seeds)")
    x = np.arange(len(grid))
    width = 0.8 / len(learners)
    for i, learner in enumerate(learners):
        mine = [
            np.nanmean([r["ood_accuracy_%"] for r in rows if r["learner"] == learner
                        and (r["M"], r["K"]) == mk] or [np.nan])
            for mk in grid
        ]  # fmt: skip
        paper = [PAPER_OOD_ACCURACY.get((learner, *mk), np.nan) for mk in grid]
        pos = x + (i - (len(learners) - 1) / 2) * width
        ax.bar(pos, mine, width, color=f"C{i}", label=learner)
        ax.plot(pos, paper, "k_", markersize=12, label="paper" if i == 0 else None)
    ax.set_xticks(x, [f"M{m}K{k}" for m, k in grid])
    ax.set(ylabel="OOD accuracy (%)", ylim=(0, 100))
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save_figure(fig, figures / "hyperteacher_ood_accuracy.png")
