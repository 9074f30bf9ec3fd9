"""weight-decay-low-rank figures: (a) the toy's balance, gap and singular values, (b) recall
ranks per arm over seeds and one seed's spectra, (c) the LM arms' losses and ranks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from dynascope.report import new_figure, save_figure
from dynascope.store import Run

__all__ = ["lm_figure", "recall_figures", "toy_figures"]


def toy_figures(lambdas, bal, gap, l2, sigma, lam_cat, sig_cat, d, c, eta, figures: Path):
    """The toy figures of one seed (arrays from its store; ``figures`` the folder)."""
    t = np.arange(bal.shape[0])
    paths = []
    fig, (ax1, ax2) = new_figure(2, title="(a) 5×5 toy: factor balance and the L2–nuclear gap")
    for j, lam in enumerate(lambdas):
        (line,) = ax1.semilogy(t, np.maximum(bal[:, j], 1e-300), label=f"λ={lam:g}")
        if lam > 0:
            ax1.semilogy(t, bal[0, j] * np.exp(-2 * eta * lam * t), ls=":", color=line.get_color())
        rel = np.where(l2[:, j] > 0, gap[:, j] / np.where(l2[:, j] > 0, l2[:, j], 1), 0)
        ax2.semilogy(t, np.maximum(rel, 1e-16), label=f"λ={lam:g}", color=line.get_color())
    ax1.set(
        xlabel="GD step t",
        ylabel="‖AᵀA − BᵀB‖_F",
        ylim=(1e-16, 1e6),
        title="balancedness (dotted: b₀·exp(−2ηλt))",
    )
    ax2.set(
        xlabel="GD step t",
        ylabel="gap / L2 term",
        ylim=(1e-16, 10),
        title="(½‖A‖²+½‖B‖² − ‖ABᵀ‖_*) / L2",
    )
    handles, labels = ax1.get_legend_handles_labels()  # one legend, below: it hid λ = 0's gap
    fig.legend(handles, labels, loc="outside lower center", ncol=len(labels))
    paths.append(save_figure(fig, figures / "a_balance_gap.png"))

    fig, (ax1, ax2) = new_figure(2, height=3.8, title="(a) singular values of ABᵀ")
    order = np.argsort(lam_cat)
    grid = np.linspace(0, lam_cat.max(), 200)
    for i, di in enumerate(d):
        (line,) = ax1.plot(grid, np.maximum(di - c * grid, 0), ls=":", lw=1, color=f"C{i}")
        ax1.plot(
            lam_cat[order],
            sig_cat[order, len(d) - 1 - i],
            ".",
            color=line.get_color(),
            label=f"d={di:g}",
        )
    ax1.set(xlabel="weight decay λ", ylabel="σ_i(ABᵀ) at the last step", title="last step")
    ax1.set_ylim(-0.03, 1.1)
    j = int(np.argmin(np.abs(lambdas - 0.4)))
    for i, di in enumerate(d):  # the colour of d_i on the left; sigma is descending, d ascending
        ax2.plot(t, sigma[:, j, len(d) - 1 - i], color=f"C{i}")
        ax2.axhline(max(di - c * lambdas[j], 0.0), ls=":", lw=1, color=f"C{i}")
    ax2.set(xlabel="GD step t", ylabel="σ_i(ABᵀ)", title=f"over training, λ = {lambdas[j]:g}")
    ax2.set_ylim(-0.03, 1.1)
    handles, labels = ax1.get_legend_handles_labels()
    handles.append(Line2D([], [], ls=":", color="0.3"))
    labels.append("max(d_i − cλ, 0)")
    fig.legend(
        handles,
        labels,
        loc="outside lower center",
        ncol=len(labels),
        title=f"colour: target singular value d_i; dotted: prediction, c = 1/(2·data_scale) "
        f"= {c:g}",
    )
    paths.append(save_figure(fig, figures / "a_singular_values.png"))
    return paths


_ARM_STYLES = (("-", "o", 3.0), ("--", "s", 2.0), ("-.", "^", 1.5), (":", "D", 1.5))


def recall_figures(rows: list[dict], spectra: list[tuple[str, Run]], figures: Path) -> list[Path]:
    """Head-mean ranks per arm (every seed a dot, the mean a bar) and the spectra of every head
    of the first seed per arm (``spectra``: (arm label, run))."""
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    fig, axes = new_figure(2, title="(b) associative recall: head-mean rank per arm (dots: seeds)")
    x = np.arange(len(arms))
    for ax, which in zip(axes, ("qk", "ov")):
        for key, offset, marker, label in (
            (f"{which}.rank_1e-2", -0.15, "o", "rank at 1e-2"),
            (f"{which}.effective_rank", 0.15, "s", "effective rank"),
        ):
            values = [[r[key] for r in rows if r["arm"] == arm] for arm in arms]
            colour = "C0" if marker == "o" else "C1"
            ax.bar(x + offset, [np.mean(v) for v in values], 0.3, color=colour, alpha=0.35,
                   label=f"{label} (mean)")  # fmt: skip
            for i, v in enumerate(values):
                ax.plot(np.full(len(v), x[i] + offset), v, marker, color=colour, ms=5)
        ax.set_xticks(x, arms, fontsize=8)
        ax.set(ylabel="mean over layers and heads", title=f"W_{which.upper()}")
        ax.set_ylim(0, 1.35 * max(ax.get_ylim()[1], 1e-12))  # headroom: the legend sits above
        ax.legend(fontsize=8, loc="upper center", ncol=2)
    paths = [save_figure(fig, figures / "b_rank_per_arm.png")]

    fig, axes = new_figure(
        2,
        title=r"(b) singular values per head ($\sigma_i / \sigma_1$), last step, first seed"
        r" (values below $10^{-7}$ drawn at $10^{-7}$)",
    )
    # Curves of arms can coincide: each arm gets its own line style, marker and width (widest
    # drawn first) so that none hides another.
    for ax, which in zip(axes, ("qk", "ov")):
        for k, (label, run) in enumerate(spectra):
            try:
                s = run.tensors(f"{which}.singular_values")[1][-1]  # [n_layers, n_heads, d_head]
            except KeyError:
                continue
            s = s.reshape(-1, s.shape[-1])
            rel = s / np.maximum(s[:, :1], 1e-30)
            ls, marker, lw = _ARM_STYLES[k % len(_ARM_STYLES)]
            index = np.arange(1, s.shape[1] + 1)
            for h, row in enumerate(rel):
                ax.semilogy(
                    index, np.maximum(row, 1e-7), color=f"C{k % 10}", ls=ls, lw=lw, marker=marker,
                    ms=4, mfc="none" if k % 2 else None, alpha=0.85 if h == 0 else 0.45,
                    label=label if h == 0 else None,
                )  # fmt: skip
        ax.axhline(1e-2, color="k", ls=(0, (1, 3)), lw=0.8, label="rank cutoff $10^{-2}$")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set(
            xlabel="singular-value index $i$",
            ylabel=r"$\sigma_i / \sigma_1$",
            title=rf"$W_{{{which.upper()}}}$ (every head)",
            ylim=(1e-7, 2),
        )
    handles, labels = axes[0].get_legend_handles_labels()  # one legend, below the panels
    fig.legend(handles, labels, loc="outside lower center", ncol=len(labels), fontsize=8)
    paths.append(save_figure(fig, figures / "b_spectra.png"))
    return paths


def lm_figure(arms: dict[str, list[Run]], rows: list[dict], figures: Path) -> Path:
    """Validation loss over training per condition (one line per seed) and head-mean ranks."""
    fig, (ax1, ax2) = new_figure(2, title="(c) byte-level LM: weight decay per condition")
    late = []
    for c, (condition, runs) in enumerate(arms.items()):
        for k, run in enumerate(runs):
            val = run.scalar("val.loss")
            ax1.plot(val.index, val.values, "o-", color=f"C{c}", alpha=0.8, ms=4,
                     label=f"{condition} ({len(runs)} seeds)" if k == 0 else None)  # fmt: skip
            late += [v for step, v in val.items() if len(val) > 1 and step >= val.index[1]]
    title = "validation loss"
    if late:  # zoom past the first evaluation, where the conditions differ
        ax1.set_ylim(min(late) - 0.05, max(late) + 0.05)
        title += " (step 0 above the axis)"
    ax1.set(xlabel="step", ylabel="validation loss (nats/byte)", title=title)
    ax1.legend()
    width = 0.8 / len(arms)
    for k, condition in enumerate(arms):
        mine = [r for r in rows if r["condition"] == condition]
        for j, which in enumerate(("qk", "ov")):
            v = [r[f"{which}.rank_1e-2"] for r in mine]
            x = j + (k - (len(arms) - 1) / 2) * width
            ax2.bar(x, np.mean(v), width, color=f"C{k}", label=condition if j == 0 else None)
            ax2.plot(np.full(len(v), x), v, "k.", ms=5)
    ax2.set_xticks(np.arange(2), ["W_QK rank", "W_OV rank"])
    ax2.set(ylabel="head-mean rank at 1e-2 (dots: seeds)", title="attention ranks at the last step")
    top = max((max(r["qk.rank_1e-2"], r["ov.rank_1e-2"]) for r in rows), default=1.0)
    ax2.set_ylim(0, 1.3 * (top if np.isfinite(top) and top > 0 else 1.0))
    ax2.legend(loc="upper center", ncol=2)
    return save_figure(fig, figures / "c_lm.png")
