"""mup-coordinate-check figures: the coordinate checks, c3's feature change, lr transfer."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from dynascope.probes.coordcheck import CoordRecord, plot_coord_check
from dynascope.report import new_figure, save_figure
from dynascope.store import Run

__all__ = ["c3_figure", "coord_figures", "transfer_figure", "transfer_points"]


def coord_figures(
    records: dict[str, list[CoordRecord]], modules: Sequence[str], figures: Path
) -> list[Path]:
    """One coordinate-check figure per parametrization (``coord_<name>_adam.png``)."""
    paths = []
    for name, rows in records.items():
        fig = plot_coord_check(
            rows,
            modules=modules,
            title=f"coordinate check, {name} + Adam: mean |activation| vs width",
        )
        paths.append(save_figure(fig, figures / f"coord_{name}_adam.png"))
    return paths


def c3_figure(rows: list[dict], figures: Path) -> Path:
    """c3: the hidden preactivation's relative change at the last step vs width (log-log)."""
    fig, axes = new_figure(1, title="c3: hidden-feature change after training (SignSGD)")
    for row in rows:
        widths = sorted(int(k.rsplit("_w", 1)[1]) for k in row if k.startswith("rel_change_w"))
        axes[0].loglog(
            widths,
            [row[f"rel_change_w{w}"] for w in widths],
            "o-",
            label=f"{row['parametrization']} (slope {row['slope_vs_width']:.2f})",
        )
    axes[0].set(xlabel="width", ylabel="||h_t − h_1|| / ||h_1||")
    axes[0].legend()
    return save_figure(fig, figures / "c3_feature_change.png")


def transfer_points(runs: list[Run]) -> dict[int, list[tuple[float, float]]]:
    """``{width: [(Adam lr, final eval.train_loss), ...]}`` of one parametrization's transfer
    runs, in run order; NaN for a run that did not finish or logged no loss."""
    by_width: dict[int, list[tuple[float, float]]] = {}
    for run in runs:
        loss = run.scalar("eval.train_loss")
        value = float(loss.iloc[-1]) if run.status == "finished" and len(loss) else math.nan
        by_width.setdefault(int(run.config["width"]), []).append((run.config["lr"], value))
    return by_width


def transfer_figure(groups: dict[str, list[Run]], figures: Path) -> Path:
    """Learning-rate transfer: final training loss vs Adam lr, one line per width."""
    fig, axes = new_figure(len(groups), title="learning-rate transfer (Adam): final train loss")
    for ax, runs in zip(axes, groups.values()):
        for width, points in sorted(transfer_points(runs).items()):
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], "o-", ms=3, label=f"w={width}")
        ax.set_xscale("log")
        ax.set(xlabel="Adam lr (base width)", ylabel="final train loss (nats)")
        ax.set_title(runs[0].config["parametrization"])
        ax.legend(fontsize=7)
    return save_figure(fig, figures / "lr_transfer.png")
