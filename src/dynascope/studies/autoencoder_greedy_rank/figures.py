"""Figures of ``autoencoder-greedy-rank``: latent rank over training, gains along data PCs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np

from dynascope.report import new_figure, save_figure
from dynascope.store import Run

from .runs import MODE_CUTOFF, RANK_TOL

__all__ = ["figures"]


def _label(w: dict[str, Any]) -> str:
    data = {"quiet": f" noise {w['noise']:g}", "flat": " equal variances"}.get(w["arm"], "")
    return (
        f"L={w['L']} {w['init']}"
        + (f" s={w['s']:.3g}" if w["L"] > 0 and w["init"] != "default" else "")
        + data
    )


_STYLE = {
    "greedy": "-", "depth": "--", "control": ":", "default": "-.", "quiet": (0, (1, 3)),
    "flat": (0, (5, 1, 1, 1)),
}  # fmt: skip


def _kind(w: dict[str, Any]) -> str:
    return "default" if w["init"] == "default" else w.get("arm", "greedy")


def figures(rows: list[dict], runs: dict[str, Run], out: Path) -> list[Path]:
    """Latent rank/effective rank vs step; per-PC gains and σ(M_A) of the greedy and control
    stacks; for the first seed's runs."""
    first = min(w["seed"] for w in rows)
    rows = [w for w in rows if w["seed"] == first]
    paths = []
    fig, (ax1, ax2) = new_figure(2, title="latent covariance rank over training (held-out codes)")
    # colour: depth L; line style: the arm (12 runs would repeat the 10-colour cycle)
    depths = sorted({w["L"] for w in rows})
    colour = {L: plt.get_cmap("viridis")(i / max(1, len(depths) - 1)) for i, L in enumerate(depths)}
    for w in rows:
        try:
            rank = runs[w["run"]].scalar("latent.rank_1e-2")
            erank = runs[w["run"]].scalar("latent.effective_rank")
        except KeyError:
            continue
        style = {"color": colour[w["L"]], "ls": _STYLE.get(_kind(w), "-")}
        ax1.plot(rank.index + 1, rank.values, drawstyle="steps-post", label=_label(w), **style)
        ax2.plot(erank.index + 1, erank.values, **style)
    for ax in (ax1, ax2):
        ax.axhline(rows[0]["r"], color="k", ls=":", lw=1)
        ax.set_xscale("log")
        ax.set_xlabel("step + 1")
    ax1.set(ylabel=f"rank at {RANK_TOL:g} (λ_i / λ_1)", title="rank_1e-2")
    ax2.set(ylabel="effective rank", title="effective rank (dotted: true rank)")
    # outside the axes: 16 runs' labels would hide the curves
    ax2.legend(*ax1.get_legend_handles_labels(), fontsize=6, loc="upper left",
               bbox_to_anchor=(1.02, 1.0))  # fmt: skip
    fig.set_figwidth(fig.get_figwidth() * 1.35)
    paths.append(save_figure(fig, out / "latent_rank.png"))

    shown = [
        w
        for w in rows
        if w["L"] > 0 and w["init"] == "orthogonal" and w["arm"] in ("greedy", "control")
    ]
    if shown:
        title = "gain a_kᵀ P a_k along data PC k (solid), σ_k(M_A) (dashed)"
        fig, axes = new_figure(len(shown), width=3.0, title=title)
        for ax, w in zip(np.atleast_1d(axes), shown):
            try:
                steps, gain = runs[w["run"]].tensors("modes.gain")
            except KeyError:
                continue
            _, sigma = runs[w["run"]].tensors("modes.sigma")
            for k in range(gain.shape[1]):
                (line,) = ax.semilogx(steps + 1, gain[:, k], label=f"PC{k + 1}")
                ax.semilogx(steps + 1, sigma[:, k], color=line.get_color(), ls="--", lw=0.8)
            ax.axhline(MODE_CUTOFF, color="k", ls=":", lw=1)
            ax.set(title=_label(w), xlabel="step + 1", ylabel="gain")
        np.atleast_1d(axes)[0].legend(fontsize=6)
        paths.append(save_figure(fig, out / "direction_gains.png"))
    return paths
