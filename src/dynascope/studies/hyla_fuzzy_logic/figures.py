"""Figures of ``hyla-fuzzy-logic``: learning curves against samples seen, R² by split, probe."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from dynascope.report import new_figure, note_below_axis, save_figure
from dynascope.store import Run
from dynascope.studies.hyla_fuzzy_logic.runs import EVAL_SPLITS

__all__ = ["figures"]


def figures(runs: dict[str, Run], summary: list[dict], out: Path) -> list[Path]:
    """``learning_curves.png``, ``r2_by_split.png`` and ``latent_probe.png`` under ``out``."""
    fig, (ax1, ax2) = new_figure(2, title="HYLA vs linear attention on fuzzy logic: R² by samples")
    colors: dict[str, str] = {}
    for name, run in sorted(runs.items()):
        group = name.rsplit("_s", 1)[0]
        samples = int(run.config.get("batch_size", 1))
        first = group not in colors
        for ax, split in ((ax1, "train"), (ax2, "test")):
            s = run.scalar(f"{split}.r2")
            kw = {"label": group} if first else {"color": colors[group]}
            (line,) = ax.plot(s.index * samples, s.values, marker="o", alpha=0.7, **kw)
            colors.setdefault(group, line.get_color())
    for ax, title in ((ax1, "ID (training combinations)"), (ax2, "test (unseen combinations)")):
        ax.set(xlabel="samples seen (per run)", ylabel="R²", title=title)
        ax.set_ylim(-0.5, 1.0)
        ax.axhline(0, color="grey", lw=0.8)
        note_below_axis(ax, "step 0")
        ax.legend()
    paths = [save_figure(fig, out / "learning_curves.png")]

    fig, (ax,) = new_figure(1, title="R² by split (seed mean ± std)")
    x = np.arange(len(EVAL_SPLITS))
    width = 0.8 / max(1, len(summary))
    for j, e in enumerate(summary):
        ax.bar(
            x + (j - (len(summary) - 1) / 2) * width,
            [e[f"{s}.r2.mean"] for s in EVAL_SPLITS],
            width,
            yerr=[e[f"{s}.r2.std"] if math.isfinite(e[f"{s}.r2.std"]) else 0 for s in EVAL_SPLITS],
            label=e["group"],
            color=colors.get(e["group"]),
        )
    ax.set_xticks(x, ["train\n(ID)", "test\n(paper's OOD R²)", "ood\n(unseen terms)"])
    ax.axhline(0, color="grey", lw=0.8)
    finite = [e[f"{s}.r2.mean"] for e in summary for s in EVAL_SPLITS]
    lo = min([0.0] + [v for v in finite if math.isfinite(v)])
    ax.set_ylim(max(lo - 0.1, -1.0), 1.05)
    ax.set(ylabel="R²")
    ax.legend()
    paths.append(save_figure(fig, out / "r2_by_split.png"))

    fig, (ax,) = new_figure(1, title="latent code a_{h,q,q} of the last query → K-hot terms")
    for j, e in enumerate(summary):
        vals = [e["probe.id.r2_best_layer.mean"], e["probe.test.r2_best_layer.mean"]]
        ax.bar(np.arange(2) + (j - (len(summary) - 1) / 2) * width, vals, width,
               label=e["group"], color=colors.get(e["group"]))  # fmt: skip
    ax.set_xticks(np.arange(2), ["train tasks", "test tasks"])
    ax.set(ylabel="ridge R² (best layer, seed mean)")
    ax.axhline(0, color="grey", lw=0.8)
    ax.legend()
    paths.append(save_figure(fig, out / "latent_probe.png"))
    return paths
