"""Figures of ``bottleneck-acceleration``: training MSE of every arm, movement vs width."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dynascope.report import new_figure, save_figure
from dynascope.store import Run

__all__ = ["figures"]

_STYLE = {"bottleneck": "-", "bottleneck_lazy": ":", "wide": "--", "kernel": "-"}


def figures(rows: list[dict], runs: dict[str, Run], out: Path) -> list[Path]:
    """Train MSE vs step (first seed, d = 4) and end-of-run movement vs width (seed mean)."""
    seed0 = min(r["seed"] for r in rows)
    fig, (ax, ax2) = new_figure(2, title="training under full-batch GD, and feature movement")
    for r in rows:
        if r["seed"] != seed0 or r["d"] != 4 and r["net"].startswith("bottleneck"):
            continue
        try:
            mse = runs[r["run"]].scalar("train.mse")
        except KeyError:
            continue
        label = "kernel GD (analytic NTK)" if r["net"] == "kernel" else f"{r['net']} n={r['n']}"
        color = "k" if r["net"] == "kernel" else None
        ax.semilogy(mse.index, mse.values, _STYLE[r["net"]], color=color, lw=1, label=label)
    ax.axhline(1e-3, color="grey", ls=":", lw=1)
    ax.set_xscale("log")
    ax.set(xlabel="step", ylabel="train MSE", title="dotted grey: target 1e-3")
    ax.legend(fontsize=6, ncol=2)
    for net, marker in (("bottleneck", "o-"), ("wide", "s--")):
        sel = [r for r in rows if r["net"] == net and (net == "wide" or r["d"] == 4)]
        ns = sorted({r["n"] for r in sel})
        vals = [np.nanmean([r["movement"] for r in sel if r["n"] == n]) for n in ns]
        label = "bottleneck codes Z" if net == "bottleneck" else "all-wide middle layer H"
        ax2.loglog(ns, vals, marker, label=label)
        if net == "wide" and ns:
            ax2.loglog(ns, vals[0] * (np.array(ns) / ns[0]) ** -0.5, ":", color="grey",
                       label="∝ width^-1/2")  # fmt: skip
    ax2.set(xlabel="width n", ylabel="‖A_T − A_0‖_F / ‖A_0‖_F", title="movement at the end")
    ax2.legend(fontsize=7)
    return [save_figure(fig, out / "training_and_movement.png")]
