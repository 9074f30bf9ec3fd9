"""Coordinate check: how big each module's activations are, per width and training step.

Glossary:
    width:      the width n of one model in the sweep.
    seed:       the run seed of one model (its initialisation).
    t:          step index 1..nsteps; the forward pass at ``t`` follows ``t - 1`` optimizer
                updates, so ``t = 1`` is at initialisation.
    module:     a named output: a submodule's output (forward hooks) or a name returned by the
                caller's ``forward``; ``"output"`` is the model's output.
    l1:         ``mean |x|`` over every entry of the module's output (float32), dimensionless.
    rel_change: ``||x_t - x_1||_F / ||x_1||_F``, the relative change since initialisation (NaN
                where ``x_1 = 0``, e.g. a zero-initialised readout).

Protocol (microsoft/mup ``coord_check.py`` with ``fix_data=True``): for each seed and width,
build the model and its optimizer; for t = 1..nsteps, forward the same batch recording each
module's output, then backward the loss and step. This module holds the measurement
(:class:`CoordProbe`, run by the engine's Monitor after each step, and the summaries); the
training around it is :func:`dynascope.train.coord_check` (the engine, seeds as ensembles).
Under muP every module's l1 stays flat in width at every t; under the standard
parametrization with Adam, logits and hidden activations grow roughly in proportion to width
after the first update.

Summaries per (module, t) over the seed means: ``width_ratio = l1(w_max) / l1(w_min)``,
``spread = max_w l1 / min_w l1`` and the least-squares slope of log l1 against log width.

References:
    G. Yang et al. (2022), "Tensor Programs V", arXiv 2203.03466, Sec. D.1 and Fig. 5
        (coordinate check).
    G. Yang, E. Littwin (2023), "Tensor Programs IVb", arXiv 2308.01814 (muP under Adam).
    microsoft/mup 1.0.0, ``mup/coord_check.py`` (``get_coord_data``, ``plot_coord_data``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

__all__ = [
    "CoordProbe",
    "CoordRecord",
    "coord_summary",
    "plot_coord_check",
    "records_from_rows",
]

Forward = Callable[[nn.Module, Tensor], tuple[Tensor, dict[str, Tensor]]]


@dataclass(frozen=True)
class CoordRecord:
    """One measurement: ``(width, seed, module, t)`` and its ``l1`` and ``rel_change``."""

    width: int
    seed: int
    module: str
    t: int
    l1: float
    rel_change: float


def _hooked_forward(model: nn.Module, x: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """Run ``model(x)``, catching every named submodule's tensor output with forward hooks."""
    caught: dict[str, Tensor] = {}
    handles = []
    for name, module in model.named_modules():
        if not name:
            continue

        def hook(_module: nn.Module, _args: Any, out: Any, name: str = name) -> None:
            if isinstance(out, Tensor):
                caught[name] = out.detach()

        handles.append(module.register_forward_hook(hook))
    try:
        output = model(x)
    finally:
        for handle in handles:
            handle.remove()
    return output, caught


class CoordProbe:
    """Each module's ``l1`` and ``rel_change`` on ``ctx.batch["x"]``: one coordinate-check row.

    The first call (the model at initialisation, ``t = 1``) keeps each module's activation as the
    reference of ``rel_change``; the probe's ``state_dict`` carries it through a checkpoint.

    Args:
        forward: ``(model, x) -> (output, {name: activation})``; default: ``model(x)`` with
            forward hooks on every named submodule. ``"output"`` is always recorded.
    Returns (per call):
        ``{"l1.<module>": float, "rel.<module>": float}`` (``rel`` is NaN where the reference is
        0, e.g. a zero-initialised readout).
    Raises:
        ValueError: if ``ctx.batch`` holds no ``"x"``.
    References:
        microsoft/mup ``coord_check.py``; Yang et al. (2022), arXiv 2203.03466, Sec. D.1.
    """

    def __init__(self, forward: Forward | None = None) -> None:
        self.forward = forward or _hooked_forward
        self.first: dict[str, Tensor] | None = None

    @torch.no_grad()
    def __call__(self, model: nn.Module, ctx: Any) -> dict[str, float]:
        batch = getattr(ctx, "batch", None)
        if not batch or "x" not in batch:
            raise ValueError("ctx.batch: the coordinate check needs a batch with key 'x'")
        output, acts = self.forward(model, batch["x"])
        acts = {**acts, "output": output}
        acts = {name: act.detach().float() for name, act in acts.items()}
        if self.first is None:
            self.first = {name: act.clone() for name, act in acts.items()}
        out: dict[str, float] = {}
        for name, act in acts.items():
            norm0 = self.first[name].norm()
            rel = (act - self.first[name]).norm() / norm0 if norm0 > 0 else float("nan")
            out[f"l1.{name}"] = float(act.abs().mean())
            out[f"rel.{name}"] = float(rel)
        return out

    def state_dict(self) -> dict[str, Any]:
        """The reference activations (``None`` before the first call)."""
        return {"first": self.first}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.first = state["first"]


def records_from_rows(
    rows: Sequence[tuple[int, int, int, dict[str, float]]],
) -> list[CoordRecord]:
    """:class:`CoordRecord` rows from ``(width, seed, t, CoordProbe output)`` tuples."""
    records = []
    for width, seed, t, values in rows:
        for key, value in values.items():
            if key.startswith("l1."):
                module = key[3:]
                rel = values.get(f"rel.{module}", float("nan"))
                records.append(CoordRecord(int(width), int(seed), module, int(t), value, rel))
    return records


def _seed_means(
    records: Sequence[CoordRecord], stat: str
) -> dict[tuple[str, int], dict[int, float]]:
    """``{(module, t): {width: mean over seeds of stat}}``."""
    sums: dict[tuple[str, int, int], list[float]] = {}
    for r in records:
        sums.setdefault((r.module, r.t, r.width), []).append(getattr(r, stat))
    out: dict[tuple[str, int], dict[int, float]] = {}
    for (module, t, width), values in sorted(sums.items()):
        out.setdefault((module, t), {})[width] = float(np.mean(values))
    return out


def coord_summary(records: Sequence[CoordRecord], stat: str = "l1") -> list[dict[str, Any]]:
    """Per (module, t): width ratio, spread and log-log slope of ``stat`` (seed means) vs width.

    Args:
        records: from :func:`coord_check`.
        stat: ``"l1"`` or ``"rel_change"``.
    Returns:
        Rows ``{"module", "t", "width_ratio", "spread", "slope"}``: ``width_ratio = s(w_max) /
        s(w_min)``; ``spread = max_w s / min_w s``; ``slope`` of ``log s`` vs ``log w`` (least
        squares). NaN where any seed mean is 0 or NaN (e.g. a zero-initialised readout at t = 1).
    Raises:
        ValueError: for an unknown ``stat``.
    """
    if stat not in ("l1", "rel_change"):
        raise ValueError(f"stat must be 'l1' or 'rel_change' (got stat={stat!r})")
    rows = []
    for (module, t), by_width in _seed_means(records, stat).items():
        widths = np.array(sorted(by_width), dtype=np.float64)
        values = np.array([by_width[int(w)] for w in widths])
        nan = float("nan")
        ok = bool(np.all(values > 0)) and bool(np.all(np.isfinite(values)))
        slope = nan
        if ok and len(widths) > 1:
            slope = float(np.polyfit(np.log(widths), np.log(values), 1)[0])
        rows.append(
            {
                "module": module,
                "t": t,
                "width_ratio": float(values[-1] / values[0]) if ok else nan,
                "spread": float(values.max() / values.min()) if ok else nan,
                "slope": slope,
            }
        )
    return rows


def plot_coord_check(
    records: Sequence[CoordRecord],
    axes: Sequence[Any] | None = None,
    *,
    stat: str = "l1",
    modules: Sequence[str] | None = None,
    title: str | None = None,
) -> Any:
    """The familiar coordinate-check figure: one panel per step t, ``stat`` vs width (log-log).

    One line per module (seed means, with min/max over seeds as a band).

    Args:
        records: from :func:`coord_check`.
        axes: one matplotlib Axes per step (``nsteps`` of them); default: a new figure.
        stat: ``"l1"`` or ``"rel_change"``.
        modules: which modules to draw (default: all, in order of first appearance).
        title: figure title (only with a new figure).
    Returns:
        The matplotlib Figure.
    Raises:
        ValueError: if ``axes`` is given with fewer entries than steps, or for an unknown stat.
    """
    import matplotlib.pyplot as plt

    if stat not in ("l1", "rel_change"):
        raise ValueError(f"stat must be 'l1' or 'rel_change' (got stat={stat!r})")
    steps = sorted({r.t for r in records})
    names = list(modules) if modules is not None else list(dict.fromkeys(r.module for r in records))
    if axes is None:
        fig, grid = plt.subplots(
            1, len(steps), figsize=(3.6 * len(steps), 3.2), squeeze=False, layout="constrained"
        )
        axes = list(grid.flat)
        if title:
            fig.suptitle(title)
    elif len(axes) < len(steps):
        raise ValueError(f"axes must hold one panel per step (got {len(axes)} for {len(steps)})")
    fig = axes[0].figure
    colors = plt.get_cmap("viridis")(np.linspace(0, 0.9, max(len(names), 1)))
    for ax, t in zip(axes, steps):
        for color, name in zip(colors, names):
            rows = [r for r in records if r.module == name and r.t == t]
            widths = sorted({r.width for r in rows})
            per = [[getattr(r, stat) for r in rows if r.width == w] for w in widths]
            mean = np.array([np.mean(v) for v in per])
            if not np.any(mean > 0):
                continue
            ax.plot(widths, mean, "o-", ms=3, color=color, label=name)
            ax.fill_between(
                widths, [min(v) for v in per], [max(v) for v in per], color=color, alpha=0.2
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set(xlabel="width", ylabel=stat, title=f"t = {t}")
    handles, labels = axes[-1].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="outside right upper")
    return fig
