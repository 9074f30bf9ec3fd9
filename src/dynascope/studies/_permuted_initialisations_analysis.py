"""Analysis of ``permuted-initialisations``: verdicts p1-p3, tables and figures from the stores.

Glossary: a run's ``label`` is its architecture (``MLP 64-1024-10``, ``CNN 32-32-avg-64-64``);
``vanilla``, ``activation``, ``weight`` are the matchings (none, activation, weight) of net 1
to net 0; ``init_avg`` is the average of the two random initialisations under a matching;
``midpoint`` is θ(0.5) of the trained nets. Thresholds: see the study module's docstring.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dynascope.report import new_figure, save_figure
from dynascope.store import Run
from dynascope.studies._run_values import last_or_nan
from dynascope.studies._transformer_barrier import barrier_tables, split_runs
from dynascope.studies.base import Analysis, Verdict

__all__ = ["CHANCE", "P1_MIN_ACCURACY", "P2_MAX_ACCURACY", "P3_MIN_GAIN", "analyze"]

CHANCE = 0.10
P1_MIN_ACCURACY = 0.30  # S7's proposal, frozen before the first fast run
P2_MAX_ACCURACY = 0.20  # S7's proposal, frozen before the first fast run
P3_MIN_GAIN = 0.0  # orderings (S7): permuted ≥ vanilla at the midpoint, barrier ≤ vanilla
METHODS = ("vanilla", "activation", "weight")


def _tensor(run: Run, key: str) -> np.ndarray | None:
    try:
        return run.tensors(key)[1][-1]
    except KeyError:
        return None


def _label(config: dict) -> str:
    if config["model"] == "cnn":
        return f"CNN {config['arch']}"
    return "MLP " + "-".join(map(str, [64, *config["hidden"], 10]))


def _row(name: str, run: Run) -> dict:
    row = {
        "run": name,
        "label": _label(run.config),
        "group": run.config["group"],
        "status": run.status,
        "net0.test.accuracy": last_or_nan(run, "net0.test.accuracy"),
        "net1.test.accuracy": last_or_nan(run, "net1.test.accuracy"),
        "net0.init.accuracy": last_or_nan(run, "net0.init.accuracy"),
    }
    for method in METHODS:
        row[f"midpoint.{method}.accuracy"] = last_or_nan(run, f"midpoint.{method}.accuracy")
        row[f"barrier.{method}.loss"] = last_or_nan(run, f"barrier.{method}.loss")
        row[f"barrier.{method}.loss_tempered"] = last_or_nan(run, f"barrier.{method}.loss_tempered")
        row[f"barrier.{method}.error"] = last_or_nan(run, f"barrier.{method}.error")
        row[f"init_avg.{method}.accuracy"] = last_or_nan(run, f"init_avg.{method}.accuracy")
    row["match.agreement"] = last_or_nan(run, "match.agreement")
    return row


def _mean(rows: list[dict], key: str) -> float:
    values = [r[key] for r in rows]
    return float(np.mean(values)) if values else float("nan")


def _verdicts(label: str, rows: list[dict]) -> list[Verdict]:
    n = len(rows)
    p1 = _mean(rows, "init_avg.activation.accuracy")
    p2 = _mean(rows, "init_avg.vanilla.accuracy")
    d_acc = _mean(rows, "midpoint.activation.accuracy") - _mean(rows, "midpoint.vanilla.accuracy")
    d_bar = _mean(rows, "barrier.vanilla.loss") - _mean(rows, "barrier.activation.loss")
    p3 = bool(d_acc >= P3_MIN_GAIN and d_bar >= P3_MIN_GAIN)
    return [
        Verdict(
            f"p1 ({label}): the average of the two permuted random inits beats chance",
            f"test accuracy of ½(θ_0(0) + π_T θ_1(0)), π_T by activation matching of the "
            f"trained nets, mean over {n} seed pairs",
            p1,
            P1_MIN_ACCURACY,
            bool(p1 >= P1_MIN_ACCURACY),
            f"measured >= threshold; chance {CHANCE}; weight matching's π gives "
            f"{_mean(rows, 'init_avg.weight.accuracy'):.3f}",
        ),
        Verdict(
            f"p2 ({label}): the unpermuted init average stays near chance",
            f"test accuracy of ½(θ_0(0) + θ_1(0)), mean over {n} seed pairs",
            p2,
            P2_MAX_ACCURACY,
            bool(p2 <= P2_MAX_ACCURACY),
            f"measured <= threshold; one init alone: {_mean(rows, 'net0.init.accuracy'):.3f}",
        ),
        Verdict(
            f"p3 ({label}): matching lowers the barrier between the trained nets",
            f"mean NLL barrier vanilla − activation-matched (nats), {n} seed pairs; also "
            "midpoint accuracy activation-matched − vanilla ≥ 0",
            d_bar,
            P3_MIN_GAIN,
            p3,
            f"both >= threshold; midpoint accuracy gain {d_acc:+.3f}; barriers vanilla "
            f"{_mean(rows, 'barrier.vanilla.loss'):.3f}, matched "
            f"{_mean(rows, 'barrier.activation.loss'):.3f} nats; single nets "
            f"{_mean(rows, 'net0.test.accuracy'):.3f}",
        ),
    ]


def analyze(runs: dict[str, Run], figures: Path) -> Analysis:
    """Verdicts p1-p3 per gated MLP architecture; tables and figures (see the study module)."""
    runs, transformer_runs = split_runs(runs)
    rows = [_row(name, run) for name, run in sorted(runs.items())]
    finished = {r["run"]: r for r in rows if r["status"] == "finished"}
    pairs: dict[str, list[dict]] = {}
    for name, run in sorted(runs.items()):
        if run.config["group"] == "pairs":
            pairs.setdefault(_label(run.config), [])
            if name in finished:
                pairs[_label(run.config)].append(finished[name])
    verdicts = [v for label, group in pairs.items() for v in _verdicts(label, group)]
    tables = {"runs: trained nets, midpoints, barriers, init averages": rows}
    tables["self-checks on net 0 (permutation invariance, self-matching, self-barrier)"] = [
        {
            "run": name,
            "max |f(x) − f_perm(x)|": last_or_nan(run, "check.permuted_max_abs_diff"),
            "self-match recovered (activation)": last_or_nan(run, "check.self_match.activation"),
            "self-match recovered (weight)": last_or_nan(run, "check.self_match.weight"),
            "dead units": last_or_nan(run, "check.dead_units"),
            "self barrier (nats)": last_or_nan(run, "check.self_barrier"),
        }
        for name, run in sorted(runs.items())
    ]
    by_t = _accuracy_vs_t(runs, finished)
    if by_t:
        tables["permuted-init average accuracy vs the step T of the matching"] = by_t
    nway = _nway_rows(runs, finished)
    if nway:
        tables["n-way averages of inits (matched to net 0 at the end)"] = nway
    tables.update(barrier_tables(transformer_runs))
    figs = [
        _path_figure(runs, finished, figures),
        _barrier_figure(
            rows, [r.config["hidden"][0] for _, r in sorted(runs.items())], finished, figures
        ),
        _nway_t_figure(by_t, nway, figures),
    ]
    return Analysis(verdicts, figs, tables)


def _accuracy_vs_t(runs: dict[str, Run], finished: dict) -> list[dict]:
    out = []
    for name, run in sorted(runs.items()):
        if name not in finished or run.config["group"] != "pairs":
            continue
        series = run.scalar("init_avg.activation_at_T.accuracy")
        for step, value in series.items():
            out.append(
                {"run": name, "label": _label(run.config), "T": int(step), "accuracy": value}
            )
    return out


def _nway_rows(runs: dict[str, Run], finished: dict) -> list[dict]:
    out = []
    for name, run in sorted(runs.items()):
        m = _tensor(run, "nway.m") if name in finished else None
        if m is None:
            continue
        vanilla, matched = (
            _tensor(run, "nway.vanilla.accuracy"),
            _tensor(run, "nway.activation.accuracy"),
        )
        for k, value in enumerate(m):
            out.append(
                {
                    "run": name,
                    "m nets": int(value),
                    "unpermuted accuracy": float(vanilla[k]),
                    "permuted accuracy": float(matched[k]),
                }
            )
    return out


def _first_of_each_label(runs: dict[str, Run], finished: dict) -> dict[str, Run]:
    chosen: dict[str, Run] = {}
    ordered = sorted(runs.items(), key=lambda kv: (kv[1].config["group"] == "cnn", kv[0]))
    for name, run in ordered:
        if name in finished and run.config["group"] in ("pairs", "cnn"):
            chosen.setdefault(_label(run.config), run)
    return chosen


def _path_figure(runs: dict[str, Run], finished: dict, figures: Path) -> Path:
    chosen = _first_of_each_label(runs, finished)
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


def _barrier_figure(rows: list[dict], hidden: list[int], finished: dict, figures: Path) -> Path:
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
    ax2.axhline(P1_MIN_ACCURACY, color="tab:red", ls="--", lw=1)
    ax2.set(
        ylabel="test accuracy",
        ylim=(0, 1),
        title="average of the two inits (dotted: chance; dashed: p1 threshold)",
    )
    return save_figure(fig, figures / "barrier_by_architecture.png")


def _nway_t_figure(by_t: list[dict], nway: list[dict], figures: Path) -> Path:
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
