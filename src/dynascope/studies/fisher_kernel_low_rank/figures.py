"""Figure of ``fisher-kernel-low-rank``: NFK eigenvalue decay, trained vs untrained."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dynascope.report import new_figure, save_figure
from dynascope.store import Run

__all__ = ["figures"]


def figures(rows: list[dict], runs: dict[str, Run], out: Path) -> list[Path]:
    """Normalised and cumulative eigenvalues of K (first seed of each run kind), step 0 dashed."""
    fig, (ax1, ax2) = new_figure(2, title="NFK eigenvalue decay (exact K = Φ Φᵀ on the scored set)")
    seed0 = min(r["seed"] for r in rows)
    for r in rows:
        if r["seed"] != seed0:
            continue
        try:
            steps, evals = runs[r["run"]].tensors("nfk.eigenvalues")
        except KeyError:
            continue
        for row, ls, when in ((evals[-1], "-", "trained"), (evals[0], "--", "step 0")):
            e = row / row.sum()
            i = np.arange(1, len(e) + 1)
            label = f"{r['model']} k={r['k']}, {when}"
            ax1.loglog(i, np.maximum(e, 1e-16), ls, lw=1.2, label=label)
            ax2.semilogx(i, np.cumsum(e), ls, lw=1.2, label=label)
        for ax in (ax1, ax2):
            ax.axvline(r["k"], color="grey", ls=":", lw=1)
    ax2.axhline(0.9, color="tab:red", ls="--", lw=1, label="f1 threshold 0.9")
    ax1.set(xlabel="index i", ylabel="λ_i / tr K", title="normalised eigenvalues")
    ax2.set(xlabel="index i", ylabel="Σ_{j≤i} λ_j / tr K", title="cumulative", ylim=(0, 1.02))
    ax1.legend(fontsize=7)
    ax2.legend(fontsize=7, loc="lower right")
    return [save_figure(fig, out / "eigenvalue_decay.png")]
