"""Figures of the ``gated-rnn-attention`` study, drawn from stored runs only.

Glossary: n_c, the construction size ``n_heads·d_head²``; nmse, the teacher–student loss;
``teacher`` maps d_hidden -> runs (one per seed); ``icl`` lists, per seed, model -> run.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from matplotlib.ticker import MaxNLocator

from dynascope.report import add_colorbar, new_figure, save_figure
from dynascope.store import Run

__all__ = ["draw_figures", "last", "mean", "tensor"]


def last(run: Run | None, key: str) -> float:
    if run is None or run.status != "finished":
        return float("nan")
    try:
        return run.last(key)
    except KeyError:
        return float("nan")


def tensor(run: Run | None, key: str) -> np.ndarray | None:
    if run is None or run.status != "finished":
        return None
    try:
        return run.tensors(key)[1][-1]
    except KeyError:
        return None


def mean(values: list[float]) -> float:
    return (
        float(np.mean(values))
        if values and not any(math.isnan(v) for v in values)
        else float("nan")
    )


def draw_figures(
    teacher: dict[int, list[Run]],
    multiples: dict[int, float],
    icl: list[dict[str, Run]],
    n_c: int,
    figures: Path,
    g2_threshold: float,
) -> list[Path]:
    """λ histograms, loss vs hidden size, prediction agreement and the ICL GRNN's weights."""
    paths = []
    fig, (ax1, ax2) = new_figure(
        2, title="λ histogram of trained gated RNNs (|λ|, 20 bins of [0, 1])"
    )
    edges = np.linspace(0, 1, 21)
    for hidden in sorted(teacher):
        lam = tensor(teacher[hidden][0], "lambda.modulus")
        if lam is not None:
            ax1.hist(
                lam,
                bins=edges,
                histtype="step",
                lw=1.5,
                label=f"d_hidden={hidden} ({multiples[hidden]:g}·n_c)",
            )
    ax1.set(xlabel="|λ| (dotted: δ, 1 − δ)", ylabel="neurons", title="(b) teacher–student students")
    ax1.legend(loc="upper center")
    lam = tensor(icl[0].get("grnn"), "lambda.modulus") if icl else None
    if lam is not None:
        ax2.hist(lam, bins=edges, color="C3", alpha=0.7)
    for ax in (ax1, ax2):
        for x in (0.05, 0.95):
            ax.axvline(x, color="grey", ls=":", lw=1)
    ax2.set(xlabel="|λ|", ylabel="neurons", title="(c) in-context regression GRNN")
    paths.append(save_figure(fig, figures / "lambda_histogram.png"))

    fig, (ax1, ax2) = new_figure(2, title="(b) teacher–student: loss vs hidden size")
    hs = sorted(teacher)
    nmse = [mean([last(r, "eval.nmse") for r in teacher[h]]) for h in hs]
    pruned = [mean([last(r, "eval.nmse_pruned") for r in teacher[h]]) for h in hs]
    ax1.loglog(hs, nmse, "o-", label="trained")
    ax1.loglog(hs, pruned, "s--", label="mid-range λ pruned")
    ax1.axvline(n_c, color="grey", ls=":", lw=1, label=f"construction n_c = {n_c}")
    ax1.axhline(g2_threshold, color="C3", ls=":", lw=1, label=f"g2 threshold {g2_threshold:g}")
    ax1.set_xticks(hs, [str(h) for h in hs])
    ax1.minorticks_off()
    ax1.set(xlabel="d_hidden", ylabel="normalised MSE (fresh data)", title="final loss")
    ax1.legend()
    for h in hs:
        s = teacher[h][0].scalar("train.loss")
        ax2.semilogy(s.index, s.values, label=f"d_hidden={h}")
    ax2.set(xlabel="step", ylabel="train nmse", title="training curves (seed 0)")
    ax2.legend()
    paths.append(save_figure(fig, figures / "loss_vs_hidden.png"))

    fig, (ax1, ax2) = new_figure(
        2, title="(c) in-context regression: agreement of the GRNN's predictions"
    )
    runs = icl[0] if icl else {}
    p = tensor(runs.get("grnn"), "eval.pred")
    lim, cosines = None, {}
    refs = (("lsa", "C0", "linear attention"), ("gd", "C1", "one GD step (η*)"))
    for ref, color, name in refs:
        q = tensor(runs.get(ref), "eval.pred")
        if p is not None and q is not None:
            ax1.scatter(q[:2000], p[:2000], s=3, alpha=0.4, color=color, label=name)
            lim = max(lim or 0, float(np.abs(q[:2000]).max()))
        g, h = tensor(runs.get("grnn"), "eval.grad"), tensor(runs.get(ref), "eval.grad")
        if g is not None and h is not None:
            norms = np.linalg.norm(g, axis=-1) * np.linalg.norm(h, axis=-1)
            cosines[ref] = (g * h).sum(-1) / np.maximum(norms, 1e-12)
    lowest = min([0.5] + [float(np.floor(c.min() * 10) / 10) for c in cosines.values()])
    for ref, color, name in refs:
        if ref in cosines:  # bins zoom on [lowest, 1]: trained models sit near 1
            bins = np.linspace(lowest, 1, 41)
            ax2.hist(cosines[ref], bins=bins, histtype="step", lw=1.5, color=color, label=name)
    if lim:
        ax1.plot([-lim, lim], [-lim, lim], color="grey", ls=":", lw=1)
    ax1.set(
        xlabel="reference prediction ŷ_ref",
        ylabel="GRNN prediction ŷ",
        title="predictions (2000 sequences)",
    )
    ax1.legend(loc="upper left")
    ax2.set(
        xlabel="cos(∂ŷ_GRNN/∂x_q, ∂ŷ_ref/∂x_q)", ylabel="sequences", title="query-gradient cosine"
    )
    ax2.set_yscale("log")
    ax2.legend(loc="upper left")
    paths.append(save_figure(fig, figures / "prediction_agreement.png"))
    weights = _weights_figure(runs.get("grnn"), figures)
    return paths + ([weights] if weights else [])


def _weights_figure(run: Run | None, figures: Path) -> Path | None:
    """Input-gate weights of the ICL GRNN, neurons sorted by |λ| (the construction's blocks:
    a λ ≈ 1 neuron pairing the label coordinate y with the inputs x)."""
    lam = tensor(run, "lambda.modulus")
    tensors = [tensor(run, f"weights.{k}") for k in ("W_in_x", "W_in_g")]
    out_norm = tensor(run, "weights.W_out_h_norm")
    if lam is None or out_norm is None or any(t is None for t in tensors):
        return None
    order = np.argsort(-lam)
    fig, axes = new_figure(1, 3, width=10, height=2.5, title="(c) GRNN weights, neurons by |λ|")
    d_in = tensors[0].shape[0]
    labels = [f"$x_{{{j + 1}}}$" for j in range(d_in - 1)] + ["$y$"]
    xlabel = r"neuron index $n$ (sorted by $|\lambda_n|$, descending)"
    names = (r"W_{\mathrm{in},x}", r"W_{\mathrm{in},g}")
    for ax, W, name in zip(axes[:2], tensors, names):
        scale = float(np.abs(W).max()) or 1.0
        image = ax.imshow(W[:, order], aspect="auto", cmap="RdBu_r", vmin=-scale, vmax=scale)
        ax.set_yticks(range(d_in), labels)
        ax.set(xlabel=xlabel, ylabel=f"${name}$ row\n(input coordinate)")
        ax.grid(False)
        add_colorbar(fig, image, ax, f"${name}[i, n]$", pad=0.01)
    ax = axes[2]
    ax.plot(lam[order], "o-", ms=3, label=r"$|\lambda_n|$")
    ax.plot(
        out_norm[order] / max(float(out_norm.max()), 1e-12),
        "s",
        ms=3,
        label=r"$\|W_{\mathrm{out},h}[n, :]\|_2$ / its max over $n$",
    )
    ax.set(xlabel=xlabel, ylabel="value", ylim=(-0.05, 1.05))
    ax.legend(loc="lower left", ncol=2)
    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return save_figure(fig, figures / "icl_weights.png")
