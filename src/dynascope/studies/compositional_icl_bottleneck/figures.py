"""Figure of ``compositional-icl-bottleneck``: R² curves and OOD R² / z decodability by run."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dynascope.report import new_figure, note_below_axis, save_figure
from dynascope.store import Run

__all__ = ["figures"]

R2_FLOOR = -0.5  # the R² axes' lower limit (an untrained model sits far below it)


def figures(runs: dict[str, Run], rows: list[dict], out: Path) -> list[Path]:
    """``ood_r2_and_probe.png`` under ``out``."""
    fig, (ax1, ax2) = new_figure(2, title="Compositional in-context regression (M = 6 modules)")
    colours: dict[str, str] = {}  # one colour per model kind and training split
    labelled: set[str] = set()  # one legend entry per (kind, split), one line per seed
    for name, run in sorted(runs.items()):
        kind = name.split("_")[0] + (" unstructured" if "_unstructured_" in name else "")
        colour = colours.setdefault(kind, f"C{len(colours)}")
        for split, style in (("id", "-"), ("ood", "--")):
            s = run.scalar(f"{split}.r2")
            if not len(s):
                continue
            key = f"{kind} {split}"
            label = "_nolegend_" if key in labelled else key
            labelled.add(key)
            ax1.plot(s.index, s.values, style, color=colour, marker="o", ms=3, lw=1, label=label)
    title = "ID (solid), OOD (dashed) R²; a line per seed"
    ax1.set(xlabel="step", ylabel="R² (query)", title=title)
    ax1.set_ylim(R2_FLOOR, 1.05)
    note_below_axis(ax1, "step 0")
    ax1.legend(fontsize=7, loc="upper left")
    x = np.arange(len(rows))
    ax2.bar(x - 0.2, [r["ood.r2"] for r in rows], 0.4, label="OOD R²")
    probe = [r["probe.ood.r2_best_layer"] for r in rows]
    ax2.bar(x + 0.2, probe, 0.4, label="latent probe R² (OOD, best layer)")
    ax2.set_xticks(x, [r["run"] for r in rows], rotation=30, fontsize=6)
    ax2.axhline(0, color="grey", lw=0.8)
    ax2.set_ylim(R2_FLOOR, 1.05)
    ax2.set(title="OOD R² and z decodability by run", ylabel="R²")
    ax2.legend(fontsize=7)
    return [save_figure(fig, out / "ood_r2_and_probe.png")]
