"""Reported tables and figures of ``hyper-ut-pvr``'s paper-only runs (no verdicts).

Glossary: as :mod:`dynascope.studies._hyper_ut_paper` (m, agg, holdout, layers, T). Every
number is a mean over the seeds of the runs' last stored values; a value a run did not log
(e.g. the adversarial accuracy at holdout 0) is NaN, ``null`` in ``verdict.json``.

References:
    S. Abnar et al. (2023), arXiv 2310.08866 (ViT vs Hyper-UT, layers used).
    C. Zhang, M. Raghu, J. Kleinberg, S. Bengio (2021), arXiv 2107.12580 (vector and visual PVR).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dynascope.report import new_figure, save_figure
from dynascope.store import Run
from dynascope.studies._hyper_ut_paper import (
    DIGITS_MODELS,
    PAPER_LAYER_SAVING,
    TOKEN_MODELS,
    VectorPVRRunConfig,
)
from dynascope.studies._run_values import last_or_nan
from dynascope.tasks.pvr import AGGREGATIONS

__all__ = [
    "digits_figure",
    "digits_rows",
    "vector_figure",
    "vector_rows",
    "visual_figure",
    "visual_rows",
]


def _mean(runs: list[Run], key: str) -> float:
    return float(np.mean([last_or_nan(r, key) for r in runs])) if runs else float("nan")


def vector_rows(runs: dict[str, Run]) -> list[dict]:
    """One row per (m, agg): seed-mean standard and adversarial accuracy per model."""
    groups: dict[tuple[int, str], dict[str, list[Run]]] = {}
    for run in runs.values():
        cfg = VectorPVRRunConfig.model_validate(run.config)
        groups.setdefault((cfg.complexity, cfg.agg), {}).setdefault(cfg.model, []).append(run)
    rows = []
    for (m, agg), by_model in sorted(
        groups.items(), key=lambda kv: (kv[0][0], AGGREGATIONS.index(kv[0][1]))
    ):
        first = next(iter(by_model.values()))[0]
        row = {"m": m, "agg": agg, "holdout": first.config["holdout"]}
        row["majority"] = last_or_nan(first, "eval.standard.majority")
        for model in TOKEN_MODELS:
            group = by_model.get(model, [])
            row[f"{model}.standard"] = _mean(group, "eval.standard.accuracy")
            row[f"{model}.adversarial"] = _mean(group, "eval.adversarial.accuracy")
        for model in ("ut_act", "hyper_ut"):
            row[f"{model}.ponder"] = _mean(by_model.get(model, []), "eval.standard.ponder")
        rows.append(row)
    return rows


def digits_rows(runs: dict[str, Run]) -> list[dict]:
    """One row per model: seed-mean accuracy, mean layers, and the comparison with the ViT.

    The saving uses S8's ponder ``n + rem``, which counts a halt at step 1 as 2 (rem = 1);
    ``saving by n alone`` counts only the weighted block applications (NaN for the ViT).
    """
    by_model: dict[str, list[Run]] = {}
    for run in runs.values():
        by_model.setdefault(run.config["model"], []).append(run)
    vit_acc = _mean(by_model.get("vit", []), "eval.accuracy")
    vit_layers = _mean(by_model.get("vit", []), "eval.layers")
    rows = []
    for model in DIGITS_MODELS:
        group = by_model.get(model, [])
        if not group:
            continue
        acc, layers = _mean(group, "eval.accuracy"), _mean(group, "eval.layers")
        rows.append(
            {
                "model": model,
                "seeds": len(group),
                "accuracy": acc,
                "accuracy − ViT": acc - vit_acc,
                "mean layers": layers,
                "mean steps n": _mean(group, "eval.steps"),
                "at T": _mean(group, "eval.at_max"),
                "layer saving vs ViT": 1.0 - layers / vit_layers,
                "saving by n alone": 1.0 - _mean(group, "eval.steps") / vit_layers,
                "paper's saving": PAPER_LAYER_SAVING if model == "hyper_ut" else float("nan"),
            }
        )
    return rows


LABELS = {"fixed": "fixed depth", "ut_act": "UT-ACT", "hyper_ut": "Hyper-UT", "vit": "ViT"}


def vector_figure(rows: list[dict], figures: Path) -> Path:
    """One panel per aggregation: accuracy vs m, solid standard, dashed adversarial."""
    aggs = [a for a in AGGREGATIONS if any(r["agg"] == a for r in rows)]
    fig, axes = new_figure(len(aggs), width=3.4, title="vector PVR: accuracy vs m (holdout)")
    for ax, agg in zip(axes, aggs):
        sub = [r for r in rows if r["agg"] == agg]
        ms = [r["m"] for r in sub]
        for i, model in enumerate(TOKEN_MODELS):
            if all(np.isnan(r[f"{model}.standard"]) for r in sub):
                continue  # not in this sweep
            ax.plot(
                ms,
                [r[f"{model}.standard"] for r in sub],
                "o-",
                color=f"C{i}",
                label=f"{LABELS[model]}",
            )
            ax.plot(ms, [r[f"{model}.adversarial"] for r in sub], "x--", color=f"C{i}")
        ax.plot(ms, [r["majority"] for r in sub], "k:", label="majority class")
        ax.set(title=f"agg = {agg}", xlabel="m (window m + 1)", ylim=(0, 1.05), xticks=ms)
    axes[0].set_ylabel("accuracy")
    axes[0].plot([], [], "-", color="grey", label="standard test set")
    axes[0].plot([], [], "x--", color="grey", label="adversarial (held-out windows)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=6, fontsize=8)
    return save_figure(fig, figures / "vector_pvr.png")


def digits_figure(rows: list[dict], figures: Path) -> Path:
    """Accuracy and mean layers per example, one bar per model."""
    fig, (ax1, ax2) = new_figure(2, title="digits: ViT vs adaptive depth")
    names = [LABELS[r["model"]] for r in rows]
    colors = [f"C{DIGITS_MODELS.index(r['model'])}" for r in rows]
    ax1.bar_label(ax1.bar(names, [r["accuracy"] for r in rows], color=colors), fmt="%.3f")
    ax1.set(ylabel="validation accuracy", ylim=(0, 1.1))
    ax2.bar_label(ax2.bar(names, [r["mean layers"] for r in rows], color=colors), fmt="%.2f")
    ax2.set(ylabel="mean layers per example (ACT: n + rem)")
    return save_figure(fig, figures / "digits_compute.png")


def visual_rows(runs: dict[str, Run]) -> list[dict]:
    """One row per m: seed-mean accuracy and mean layers per model, and the majority class."""
    groups: dict[int, dict[str, list[Run]]] = {}
    for run in runs.values():
        groups.setdefault(run.config["complexity"], {}).setdefault(run.config["model"], [])
        groups[run.config["complexity"]][run.config["model"]].append(run)
    rows = []
    for m, by_model in sorted(groups.items()):
        first = next(iter(by_model.values()))[0]
        row = {"m": m, "agg": first.config["agg"], "majority": last_or_nan(first, "eval.majority")}
        for model in DIGITS_MODELS:
            row[f"{model}.accuracy"] = _mean(by_model.get(model, []), "eval.accuracy")
            row[f"{model}.layers"] = _mean(by_model.get(model, []), "eval.layers")
        rows.append(row)
    return rows


def visual_figure(rows: list[dict], figures: Path) -> Path:
    """Accuracy and mean layers per example vs m, one line per model."""
    fig, (ax1, ax2) = new_figure(2, title="visual PVR on digit tiles")
    ms = [r["m"] for r in rows]
    for i, model in enumerate(DIGITS_MODELS):
        if all(np.isnan(r[f"{model}.accuracy"]) for r in rows):
            continue  # not in this sweep
        ax1.plot(
            ms, [r[f"{model}.accuracy"] for r in rows], "o-", color=f"C{i}", label=LABELS[model]
        )
        ax2.plot(ms, [r[f"{model}.layers"] for r in rows], "o-", color=f"C{i}", label=LABELS[model])
    ax1.plot(ms, [r["majority"] for r in rows], "k:", label="majority class")
    ax1.set(xlabel="m (window m + 1)", ylabel="validation accuracy", ylim=(0, 1.05), xticks=ms)
    ax2.set(xlabel="m (window m + 1)", ylabel="mean layers per example (ACT: n + rem)", xticks=ms)
    ax1.legend(fontsize=7)
    return save_figure(fig, figures / "visual_pvr.png")
