"""Report for one run directory: loss curves, probe summaries over time, ``report.html``."""

from __future__ import annotations

import os
from pathlib import Path

from matplotlib.ticker import MaxNLocator

from dynascope.report.figures import new_figure, save_figure
from dynascope.report.html import write_run_report
from dynascope.store import load_run

__all__ = ["report_run"]


_UNITS = {"entropy": "nats"}  # metric name fragment -> unit; ranks and ratios have none


def _ylabel(metric: str) -> str:
    """Axis label of a probe metric: its name with spaces, and its unit where it has one."""
    label = metric.replace("_", " ")
    unit = next((u for fragment, u in _UNITS.items() if fragment in metric), None)
    return f"{label} ({unit})" if unit else label


def report_run(run_dir: str | os.PathLike[str]) -> Path:
    """Draw ``figures/loss.png`` and ``figures/probes.png`` (when probes ran) and write
    ``report.html`` in ``run_dir``.

    Raises:
        FileNotFoundError: if ``run_dir`` is not a run directory.
    """
    run = load_run(run_dir)
    figures_dir = Path(run_dir) / "figures"
    paths = []
    keys = set(run.scalars["key"])
    loss_keys = [k for k in ("train.loss", "val.loss") if k in keys]
    if loss_keys:
        fig, (ax,) = new_figure(title=f"{run.name}: loss")
        for key in loss_keys:
            series = run.scalar(key)
            ax.plot(
                series.index, series.values, label=key, marker="o" if key == "val.loss" else None
            )
        ax.set(xlabel="step", ylabel="loss")
        ax.legend()
        paths.append(save_figure(fig, figures_dir / "loss.png"))
    mean_keys = sorted(k for k in keys if ".mean." in k)
    if mean_keys:
        metrics = sorted({k.split(".mean.", 1)[1] for k in mean_keys})
        ncols = min(4, len(metrics))  # a grid, not one long row, however many probes ran
        nrows = -(-len(metrics) // ncols)
        fig, axes = new_figure(
            ncols, nrows, title=f"{run.name}: probes (mean over layers and heads)", width=3.2
        )
        # one colour and line style per prefix ("qk", "L0.dqk") in every panel; the styles
        # differ too, so curves that coincide (qk and ov ranks) both stay visible
        prefixes = sorted({k.split(".mean.", 1)[0] for k in mean_keys})
        styles = {
            prefix: {"color": f"C{i % 10}", "ls": ("-", "--", ":", "-.")[i % 4]}
            for i, prefix in enumerate(prefixes)
        }
        for ax, metric in zip(axes, metrics):
            for key in mean_keys:
                if key.endswith(".mean." + metric):
                    series = run.scalar(key)
                    label = key.split(".mean.", 1)[0]
                    ax.plot(series.index, series.values, marker=".", label=label, **styles[label])
            ax.set_xscale("symlog", linthresh=1)
            ax.set(xlabel="step (symlog)", ylabel=_ylabel(metric), title=metric)
            if metric.startswith("rank"):  # counts: integer ticks
                ax.yaxis.set_major_locator(MaxNLocator(integer=True))
            ax.legend(fontsize="small", title="mean of")
        for ax in axes[len(metrics) :]:
            ax.set_visible(False)
        paths.append(save_figure(fig, figures_dir / "probes.png"))
    summary = []
    if not run.scalars.empty:
        last = run.scalars.groupby("key").tail(1).sort_values("key")
        summary = [
            {"key": k, "step": int(s), "value": float(v)}
            for k, s, v in zip(last["key"], last["step"], last["value"])
            if not (k.startswith("L") and ".H" in k)
        ]
    return write_run_report(run, paths, Path(run_dir) / "report.html", summary)
