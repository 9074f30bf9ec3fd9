"""σReparam figures: entropy and loss over steps per LR, the LR sweep, σ(W_QK) over steps."""

from __future__ import annotations

from pathlib import Path

from dynascope.report import new_figure, save_figure
from dynascope.store import Run

__all__ = ["GLOBAL", "METHODS", "MIN_HEAD", "sweep_figures"]

GLOBAL = "attn.mean.entropy_normalized"
MIN_HEAD = "attn.min.entropy_normalized"
METHODS = ("baseline", "sigma")


def _series(run: Run, key: str):
    return run.scalar(key).dropna()


_STYLE = {"baseline": ("-", "tab:red"), "sigma": ("--", "tab:blue")}
_LABEL = {"baseline": "baseline (no σReparam)", "sigma": "σReparam"}


def sweep_figures(
    runs: list[Run], rows: list[dict], figures: Path, collapse: float, keep: float
) -> list[Path]:
    """Three figures; ``collapse`` and ``keep`` (fractions of log T) drawn as guides."""
    lrs = sorted({r["lr"] for r in rows})
    paths = []
    fig, axes = new_figure(len(lrs), 2, width=3.4, title="attention entropy and loss per LR")
    for j, lr in enumerate(lrs):
        top, bottom = axes[j], axes[len(lrs) + j]
        for run, row in zip(runs, rows):
            if row["lr"] != lr:
                continue
            ls, color = _STYLE[row["method"]]
            first = row["seed"] == min(r["seed"] for r in rows)
            label = _LABEL[row["method"]] if first else None
            h = _series(run, GLOBAL)
            top.plot(h.index, h.values, ls=ls, color=color, label=label)
            hmin = _series(run, MIN_HEAD)
            top.plot(hmin.index, hmin.values, ls=ls, color=color, lw=0.7, alpha=0.5)
            loss = run.scalar("train.loss")
            bottom.plot(loss.index, loss.values, ls=ls, color=color, label=label)
            if row["diverged_at"] is not None:
                for ax in (top, bottom):
                    ax.axvline(row["diverged_at"], color=color, ls=":", lw=1)
        top.axhline(collapse, color="grey", ls=":", lw=1)
        top.axhline(keep, color="grey", ls="-.", lw=1)
        top.set(title=f"lr = {lr:g}", xlabel="step", ylim=(-0.03, 1.05))
        bottom.set(xlabel="step", yscale="log", ylabel="train loss (nats)")
        top.set_ylabel("entropy / log T (thin: min head)")
        top.legend(loc="best")  # each panel names the arms it shows
    paths.append(save_figure(fig, figures / "entropy_loss_over_steps.png"))

    fig, (ax1, ax2, ax3) = new_figure(3, title="LR sweep (x: diverged)")
    for method in METHODS:
        ls, color = _STYLE[method]
        group = sorted((r for r in rows if r["method"] == method), key=lambda r: r["lr"])
        x = [r["lr"] for r in group]
        for ax, key in (
            (ax1, "val.accuracy"),
            (ax2, "train.loss_final"),
            (ax3, "final_entropy/logT"),
        ):
            ax.plot(x, [r[key] for r in group], "o", ls=ls, color=color, label=_LABEL[method])
            bad = [r for r in group if r["status"] == "diverged"]
            ax.plot([r["lr"] for r in bad], [r[key] for r in bad], "x", color=color, ms=10)
    for ax in (ax1, ax2, ax3):
        ax.set_xscale("log")
        ax.set_xlabel("learning rate (Adam)")
    ax1.set(ylabel="validation accuracy (last eval)", ylim=(0, 1.02))
    ax2.set(ylabel="final train loss (nats)", yscale="log")
    ax3.set(ylabel="final global entropy / log T", ylim=(-0.03, 1.05))
    ax3.axhline(collapse, color="grey", ls=":", lw=1)
    ax1.legend(loc="best")
    paths.append(save_figure(fig, figures / "lr_sweep.png"))

    fig, axes = new_figure(len(lrs), width=3.4, title="max over heads of σ(W_QK)")
    for j, lr in enumerate(lrs):
        for run, row in zip(runs, rows):
            if row["lr"] != lr:
                continue
            try:
                steps, s = run.tensors("qk.singular_values")  # [n, n_layers, n_heads, d_head]
            except KeyError:
                continue
            ls, color = _STYLE[row["method"]]
            top = s.reshape(len(steps), -1, s.shape[-1])[..., 0].max(axis=1)
            axes[j].plot(steps, top, ls=ls, color=color, label=_LABEL[row["method"]])
        axes[j].set(title=f"lr = {lr:g}", xlabel="step", yscale="log", ylabel="σ_max(W_Q W_Kᵀ)")
    if axes[0].get_legend_handles_labels()[0]:  # runs without the qk_spectrum probe draw none
        axes[0].legend(loc="upper left")
    paths.append(save_figure(fig, figures / "qk_sigma_over_steps.png"))
    return paths
