"""Figures of ``permuted-initialisations``: interpolation paths, barriers by architecture,
n-way averages and accuracy vs the step of the matching."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dynascope.report import new_figure, save_figure
from dynascope.store import Run

__all__ = ["CHANCE", "barrier_figure", "label_of", "nway_t_figure", "path_figure"]

CHANCE = 0.10  # 10 balanced classes
METHODS = ("vanilla", "activation", "weight")


def label_of(config: dict) -> str:
    """A run's architecture: ``MLP 64-1024-10`` or ``CNN 32-32-avg-64-64``."""
    if config["model"] == "cnn":
        return f"CNN {config['arch']}"
    return "MLP " + "-".join(map(str, [64, *config["hidden"], 10]))


def _tensor(run: Run, key: str) -> np.ndarray | None:
    try:
        return run.tensors(key)[1][-1]
    except KeyError:
        return None


def _mean(rows: list[dict], key: str) -> float:
    values = [r[key] for r in rows]
    return float(np.mean(values)) if values else float("nan")


def _first_of_eachlabel_of(runs: dict[str, Run], finished: dict) -> dict[str, Run]:
    chosen: dict[str, Run] = {}
    ordered = sorted(runs.items(), key=lambda kv: (kv[1].config["group"] == "cnn", kv[0]))
    for name, run in ordered:
        if name in finished and run.config["group"] in ("pairs", "cnn"):
            chosen.setdefault(label_of(run.config), run)
    return chosen


def path_figure(runs: dict[str, Run], finished: dict, figures: Path) -> Path:
    chosen = _first_of_eachlabel_of(runs, finished)
    fig, axes = new_figure(
        max(1, len(chosen)), title="Test accuracy along θ(α) = α θ_0 + (1−α) θ_1"
    )
    styles = {
        "vanilla": ("tab:grey", "o"),
        "activation": ("tab:blue", "s"),
        "weight": ("tab:orange", "^"),
    }
    for ax, (label, run) in zip(axes, chosen.items()):
        alphas = _tensor(run, "path.alphas")
        for method, (color, marker) in styles.items():
            acc = _tensor(run, f"path.{method}.accuracy")
            if acc is not None:
                ax.plot(alphas, acc, marker=marker, color=color, label=f"trained, {method}")
            init = _tensor(run, f"init_path.{method}.accuracy")
            if init is not None:
                ax.plot(
                    alphas,
                    init,
                    ls="--",
                    marker=marker,
                    mfc="none",
                    color=color,
                    label=f"init, {method}",
                )
        ax.axhline(CHANCE, color="k", ls=":", lw=1, label="chance")
        ax.set(
            xlabel="α (0: net 1, 1: net 0)",
            ylabel="test accuracy",
            ylim=(0, 1.02),
            title=f"{label} (seed pair {run.config['seed']})",
        )
    if chosen:
        axes[0].legend(loc="center left", fontsize=7)
    return save_figure(fig, figures / "interpolation_accuracy.png")


def barrier_figure(
    rows: list[dict], hidden: list[int], finished: dict, figures: Path, p1_threshold: float
) -> Path:
    labels: dict[str, list[dict]] = {}
    order = {"pairs": 0, "width": 1, "cnn": 2}
    widths = {r["run"]: runs_hidden for r, runs_hidden in zip(rows, hidden)}
    for row in sorted(rows, key=lambda r: (order.get(r["group"], 3), widths[r["run"]])):
        if row["run"] in finished and row["group"] != "nway":
            tag = row["label"].replace("MLP ", "").replace("CNN ", "CNN\n")
            labels.setdefault(tag, []).append(row)
    fig, (ax1, ax2) = new_figure(2, width=6.0, title="Barriers and init averages by architecture")
    x = np.arange(len(labels))
    width = 0.27
    for k, method in enumerate(METHODS):
        barrier = [_mean(group, f"barrier.{method}.loss") for group in labels.values()]
        init = [_mean(group, f"init_avg.{method}.accuracy") for group in labels.values()]
        ax1.bar(x + (k - 1) * width, barrier, width, label=method)
        ax2.bar(x + (k - 1) * width, init, width, label=method)
    for ax in (ax1, ax2):
        ax.set_xticks(x, list(labels), rotation=45, ha="right", fontsize=7)
        ax.legend(fontsize=7)
    ax1.set(ylabel="NLL barrier (nats)", title="trained nets: loss barrier (mean over pairs)")
    ax2.axhline(CHANCE, color="k", ls=":", lw=1)
    ax2.axhline(p1_threshold, color="tab:red", ls="--", lw=1)
    ax2.set(
        ylabel="test accuracy",
        ylim=(0, 1),
        title="average of the two inits (dotted: chance; dashed: p1 threshold)",
    )
    return save_figure(fig, figures / "barrier_by_architecture.png")


def nway_t_figure(by_t: list[dict], nway: list[dict], figures: Path) -> Path:
    fig, (ax1, ax2) = new_figure(2, title="Permuted-init averages: more nets, earlier matchings")
    if nway:
        m = [r["m nets"] for r in nway]
        ax1.plot(m, [r["permuted accuracy"] for r in nway], "s-", label="permuted")
        ax1.plot(
            m, [r["unpermuted accuracy"] for r in nway], "o-", color="tab:grey", label="unpermuted"
        )
        ax1.legend()
    ax1.axhline(CHANCE, color="k", ls=":", lw=1)
    ax1.set(
        xlabel="nets averaged m",
        ylabel="test accuracy",
        ylim=(0, 1),
        title=f"n-way ({nway[0]['run'] if nway else 'none'})",
    )
    for label in dict.fromkeys(r["label"] for r in by_t):
        points = sorted((r["T"], r["accuracy"]) for r in by_t if r["label"] == label)
        steps = sorted({t for t, _ in points})
        means = [np.mean([a for t, a in points if t == s]) for s in steps]
        ax2.plot(steps, means, "o-", label=label)
    ax2.axhline(CHANCE, color="k", ls=":", lw=1)
    ax2.set(
        xlabel="update T at which π is found",
        ylabel="test accuracy",
        ylim=(0, 1),
        title="permuted-init average vs T (mean over pairs)",
    )
    if by_t:
        ax2.legend(fontsize=7)
    return save_figure(fig, figures / "nway_and_T.png")
