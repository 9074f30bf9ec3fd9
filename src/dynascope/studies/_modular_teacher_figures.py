"""Figures of ``modular-teacher-student`` (see that module): identification (alignment, R²,
relative loss by h/M), meta-training loss, over-parameterisation sweep, hyperteacher accuracy.

Every function reads rows computed from the run stores and writes one PNG.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.ticker import SymmetricalLogLocator

from dynascope.report import new_figure, save_figure
from dynascope.store import Run
from dynascope.studies._hyperteacher_run import PAPER_OOD_ACCURACY
from dynascope.studies._modular_teacher_run import ModularStudentConfig
from dynascope.tasks.modular_teacher import eval_keys

__all__ = ["hyper_figure", "mean_over_seeds", "study_figures"]


def mean_over_seeds(rows: list[dict], task_set: str, field: str) -> float:
    """Mean of ``field`` over the rows of ``task_set`` (NaN when there are none)."""
    values = [r[field] for r in rows if r["task_set"] == task_set]
    return float(np.mean(values)) if values else float("nan")


def study_figures(
    main: list[dict],
    rows: list[dict],
    runs: dict[str, Run],
    figures: Path,
    s1_align: float,
    s2_r2: float,
) -> list[Path]:
    """``identification.png``, ``train_loss.png``, and ``overparameterisation.png`` when
    sweep runs are present; returns their paths."""
    sets = list(dict.fromkeys(r["task_set"] for r in main))
    M = ModularStudentConfig.model_validate(next(iter(runs.values())).config).n_modules
    keys = eval_keys(M)
    hs = np.arange(1, M + 1) / M
    paths = []
    fig, (ax1, ax2, ax3) = new_figure(3, width=4.6, title="modular teacher–student: identification")
    x = np.arange(len(sets))
    for k, (field, label) in enumerate((("align_mean", "mean"), ("align_min", "min"))):
        ax1.bar(
            x + (k - 0.5) * 0.38,
            [mean_over_seeds(main, s, field) for s in sets],
            0.38,
            label=label,
        )
    ax1.axhline(s1_align, color="grey", ls=":", lw=1, label=f"s1 bar: Blessed mean ≥ {s1_align:g}")
    ax1.set_xticks(x, [s.replace("+", "+\n") for s in sets], fontsize=8 if len(sets) < 4 else 6)
    if len(sets) > 3:  # the paper preset's ten task sets
        ax1.tick_params(axis="x", labelrotation=60)
    ax1.set(ylabel="module alignment (signed cos)", title="module alignment", ylim=(-0.1, 1.35))
    ax1.legend(loc="upper center", ncol=3, fontsize=7)
    # R² is unbounded below: a symlog axis (linear on [-1, 1], log beyond) shows every value
    # without clipping; task sets differ in colour, marker and line style so coinciding curves
    # stay visible.
    markers, styles = "osD^vP*Xh<", ("-", "--", "-.", ":")
    for i, s in enumerate(sets):
        style = dict(
            color=f"C{i % 10}",
            marker=markers[i % len(markers)],
            ls=styles[i % len(styles)],
            mfc="none" if i % 2 else None,
            ms=7 - 2 * (i % 2),
            label=s,
        )
        r2 = [mean_over_seeds(main, s, f"r2.{k}") for k in keys]
        ax2.plot(hs, r2, **style)
        rel = [mean_over_seeds(main, s, f"relative_loss.{k}") for k in keys]
        ax3.semilogy(hs, rel, **style)
    ax2.axhline(s2_r2, color="grey", ls=":", lw=1, label=f"s2 bar: Blessed R² ≥ {s2_r2:g}")
    ax2.set_yscale("symlog", linthresh=1.0, linscale=2.0)
    ax2.set_ylim(top=1.2)
    lowest = ax2.get_ylim()[0]
    ticks = [1.0, 0.5, 0.0, -0.5, -1.0]
    while ticks[-1] > lowest and len(ticks) < 12:
        ticks.append(ticks[-1] * 10)  # -10, -100, ... down past the lowest value drawn
    ax2.set_ylim(bottom=1.5 * ticks[-1])  # room for markers on the last tick
    ax2.set_yticks(ticks, [f"{t:g}" for t in ticks])
    ax2.yaxis.set_minor_locator(SymmetricalLogLocator(linthresh=1.0, base=10, subs=range(2, 10)))
    ax2.set(
        xlabel="fraction of modules per task (h/M)",
        ylabel="R² (mean over modules; symlog)",
        title="code decodability (F fit on train)",
    )
    ax2.legend(fontsize=7, loc="lower left")
    ax3.set(
        xlabel="fraction of modules per task (h/M)",
        ylabel=r"$\|\hat{y} - y\|^2 / \|y\|^2$",
        title="relative loss on eval tasks",
    )
    ax3.legend(fontsize=7, loc="best")
    paths.append(save_figure(fig, figures / "identification.png"))

    fig, (ax,) = new_figure(
        1, width=6.5, title="meta-training loss (task-set runs; seeds share a colour)"
    )
    colours = {s: f"C{i % 10}" for i, s in enumerate(sets)}
    labelled = set()
    for r in main:
        loss = runs[r["run"]].scalar("outer.loss")
        if len(loss):
            label = None if r["task_set"] in labelled else r["task_set"]
            labelled.add(r["task_set"])
            ax.semilogy(loss.index, loss.values, color=colours[r["task_set"]], label=label)
    ax.set(xlabel="outer step", ylabel="0.5·mean((ŷ − y)²), window mean")
    if labelled:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    paths.append(save_figure(fig, figures / "train_loss.png"))

    sweep = [r for r in rows if r["run"].startswith("sweep_") and r["weight_decay"] == 0]
    if sweep:
        fig, (ax,) = new_figure(1, width=5.5, title="over-parameterisation (Blessed)")
        for c in sorted({r["code_factor"] for r in sweep}):
            pts = sorted(
                (r["hidden_factor"], r["align_mean"]) for r in sweep if r["code_factor"] == c
            )
            ax.plot(*zip(*pts), "o-", label=f"code ×{c:g}")
        ax.set_xscale("log", base=2)
        ax.set(xlabel="student hidden width / teacher's", ylabel="module alignment (mean)")
        ax.legend()
        paths.append(save_figure(fig, figures / "overparameterisation.png"))
    return paths


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
