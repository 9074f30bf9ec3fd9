"""Figure of ``ntk-lazy-validity``: D(alpha, t) per centering and alpha * D(alpha, T) vs alpha."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dynascope.report import new_figure, save_figure
from dynascope.store import Run

__all__ = ["figures"]


def figures(main: dict[str, Run], rows: list[dict], T: float, out: Path) -> list[Path]:
    """D(alpha, t) for the first seed of each centering (dotted: 1/alpha guides through the
    smallest alpha's D), and alpha * D(alpha, T) vs alpha."""
    centerings = list(dict.fromkeys(r.config["centering"] for r in main.values()))
    fig, axes = new_figure(
        len(centerings) + 1, title="S11: distance D(α, t) to the linearized twin"
    )
    seed0 = min(r.config["seed"] for r in main.values())
    for ax, centering in zip(axes, centerings):
        run = next(r for r in main.values()
                   if r.config["centering"] == centering and r.config["seed"] == seed0)  # fmt: skip
        steps, D = run.tensors("D")
        t, D = steps * run.config["lr"], D.reshape(len(steps), -1)
        for j, alpha in enumerate(run.config["alphas"]):
            keep = (t > 0) & (D[:, j] > 0)
            if keep.any():
                ax.loglog(t[keep], D[keep, j], label=f"α={alpha:g}")
        ax.set(xlabel="time t = η·step", ylabel="D(α, t) = sup ‖αh − αh̄‖₂",
               title=f"{centering} centering")  # fmt: skip
        ax.legend(fontsize=7, ncol=2)
    ax = axes[-1]
    for centering, marker in zip(centerings, "os"):
        sel = [r for r in rows if r["centering"] == centering and r["seed"] == seed0]
        a = np.array([r["alpha"] for r in sel])
        ax.loglog(a, [r["D(T)"] for r in sel], marker + "-", label=f"D(α, T), {centering}")
        if len(a):
            ax.loglog(a, sel[0]["D(T)"] * a[0] / a, ":", color="grey", lw=1)
    ax.set(xlabel="α", ylabel="D(α, T)", title=f"T = {T:g} (dotted: ∝ 1/α, the bound's slope)")
    ax.legend(fontsize=7)
    return [save_figure(fig, out / "lazy_validity.png")]
