"""Gradual-rank figures: the toy's loss and entries over τ, the ViT's stable ranks."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dynascope.report import new_figure, save_figure
from dynascope.store import Run

__all__ = ["toy_figures", "vit_figures"]


def toy_figures(cfg, alphas, tr, per_alpha, figures: Path, active_factor: float) -> list[Path]:
    """Loss and active counts over τ per α; every entry over τ (one seed's run)."""
    paths = []
    fig, (ax1, ax2) = new_figure(
        2, width=5.2, height=3.6, title="toy: diagonal attention head in rescaled time"
    )
    for j, alpha in enumerate(alphas):
        info = per_alpha[alpha]
        tau = info["tau"]
        (line,) = ax1.semilogy(tau, tr["loss"][:, j], label=f"α={alpha:g}")
        for start, end, steepest in info["drops"]:
            ax1.axvline(tau[steepest], color=line.get_color(), ls=":", lw=1)
            if alpha == min(alphas):
                ax1.axvspan(tau[start], tau[end], color=line.get_color(), alpha=0.12, lw=0)
        ax2.step(
            tau, info["counts"]["qk"], where="post", color=line.get_color(), label=f"α={alpha:g}"
        )
        ax2.step(tau, info["counts"]["ov"], where="post", color=line.get_color(), ls="--")
    tau_max = max(per_alpha[min(alphas)]["tau"][-1], 1e-9)
    ax1.set(
        xlabel="τ = η t / log(1/α)  (α = 1: η t)",
        ylabel="MSE",
        xlim=(0, tau_max),
        title="loss (dotted: drop centres; shaded: drops at min α)",
    )
    ax1.legend()
    ax2.set(
        xlabel="τ",
        ylabel="active entries",
        xlim=(0, tau_max),
        title=f"active: |Δ entry| > {active_factor:g}α (solid qk, dashed ov)",
    )
    ax2.legend(ncol=2, loc="lower right")
    paths.append(save_figure(fig, figures / "toy_loss.png"))

    fig, axes = new_figure(len(alphas), 2, width=3.6, height=2.8, title="toy: entries over τ")
    n_teacher = sum(c != 0 for c in cfg.strengths)
    for j, alpha in enumerate(alphas):
        info = per_alpha[alpha]
        for row, product in enumerate(("qk", "ov")):
            ax = axes[row * len(alphas) + j]
            values = tr[product][:, j]
            for i in range(values.shape[1]):
                style = {"lw": 1.5} if i < n_teacher else {"color": "grey", "lw": 0.8, "alpha": 0.6}
                label = f"entry {i + 1}" if i < n_teacher else "_other"
                if i == n_teacher:
                    label = "entries without a teacher component"
                ax.plot(info["tau"], values[:, i], label=label, **style)
            for _, _, steepest in info["drops"]:
                ax.axvline(info["tau"][steepest], color="k", ls=":", lw=0.8)
            ax.set(
                xlabel="τ",
                ylabel=f"w_{'Q⊙w_K' if product == 'qk' else 'V⊙w_O'} entries",
                title=f"{product}, α={alpha:g}",
                xlim=(0, tau_max),
            )
    axes[0].legend(fontsize=7)  # the same colour per entry in every panel
    paths.append(save_figure(fig, figures / "toy_entries.png"))
    return paths


def vit_figures(
    runs: list[Run], sgd_runs: list[Run], figures: Path, srank_limit: float
) -> list[Path]:
    """Head-mean srank of Δ_QK, Δ_OV per layer over steps, every seed: the Adam ViT (the
    claim's arm) and the SGD ViT (its control); the limit drawn dotted."""
    paths = []
    fig, axes = new_figure(2, title="ViT on digits: head-mean stable rank of ΔW, every seed")
    arms = (("Adam", runs, "tab:blue"), ("SGD (control)", sgd_runs, "tab:orange"))
    for ax, product, label in zip(axes, ("dqk", "dov"), ("Δ_QK", "Δ_OV")):
        for arm, arm_runs, color in arms:
            for i, run in enumerate(arm_runs):
                for layer in range(int(run.config["model"]["n_layers"])):
                    mean = run.scalar(f"L{layer}.{product}.mean.stable_rank")
                    mean = mean[mean.index > 0]
                    first = i == 0
                    ax.plot(
                        mean.index,
                        mean.values,
                        ("-", "--", ":", "-.")[layer % 4],
                        color=color,
                        lw=1,
                        alpha=0.7,
                        label=f"{arm} L{layer}" if first else None,
                    )
        if runs:
            ax.axhline(srank_limit, color="grey", ls=":", lw=1)
        ax.set_xscale("log")
        ax.set(xlabel="step", ylabel=f"srank({label})", title=f"{label} (dotted: d_head/4)")
        ax.legend()
    paths.append(save_figure(fig, figures / "vit_srank.png"))

    if runs:
        run = runs[0]
        fig, axes = new_figure(
            2, title=f"{run.name}: spectrum of Δ_QK (head 0, s_i/s_1) over steps"
        )
        try:
            steps, s = run.tensors("dqk.normalized_singular_values")  # [n, L, H, 2 d_head]
        except KeyError:
            steps, s = np.array([]), np.zeros((0, 1, 1, 1))
        keep = [k for k, t in enumerate(steps) if t > 0]
        chosen = keep[:: max(1, len(keep) // 6)] + keep[-1:] if keep else []
        for layer, ax in enumerate(axes[: s.shape[1]]):
            for k in dict.fromkeys(chosen):
                ax.semilogy(
                    np.arange(1, s.shape[-1] + 1),
                    np.maximum(s[k, layer, 0], 1e-8),
                    label=f"step {steps[k]}",
                )
            ax.set(xlabel="index i", ylabel="s_i / s_1", title=f"L{layer}", ylim=(1e-4, 1.5))
            if chosen:
                ax.legend(ncol=2)
        paths.append(save_figure(fig, figures / "vit_delta_spectra.png"))
    return paths
