"""Figure of ``compositional-icl-bottleneck``: R² curves and OOD R² / z decodability by run."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dynascope.report import new_figure, save_figure
from dynascope.store import Run

__all__ = ["figures"]


def figures(runs: dict[str, Run], rows: list[dict], out: Path) -> list[Path]:
    """``ood_r2_and_probe.png`` under ``out``."""
    fig, (ax1, ax2) = new_figure(2, title="Compositional in-context regression (M = 6 modules)")
    for name, run in sorted(runs.items()):
        for split, style in (("id", "-"), ("ood", "--")):
            s = run.scalar(f"{split}.r2")
            if len(s):
                ax1.plot(s.index, s.values, style, marker="o", label=f"{name} {split}")
    ax1.set(xlabel="step", ylabel="R² (query)", title="ID (solid) and OOD (dashed) R²")
    ax1.set_ylim(-0.5, 1.05)
    ax1.legend(fontsize=6)
    x = np.arange(len(rows))
    ax2.bar(x - 0.2, [r["ood.r2"] for r in rows], 0.4, label="OOD R²")
    probe = [r["probe.ood.r2_best_layer"] for r in rows]
    ax2.bar(x + 0.2, probe, 0.4, label="latent probe R² (OOD, best layer)")
    ax2.set_xticks(x, [r["run"] for r in rows], rotation=30, fontsize=6)
    ax2.axhline(0, color="grey", lw=0.8)
    ax2.set_ylim(-0.5, 1.05)
    ax2.set(title="OOD R² and z decodability by run", ylabel="R²")
    ax2.legend(fontsize=7)
    return [save_figure(fig, out / "ood_r2_and_probe.png")]
