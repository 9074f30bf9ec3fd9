"""Coordinate check: how big each module's activations are, per width and training step.

Glossary:
    width:      the width n of one model in the sweep (what ``model_factory(width)`` builds).
    seed:       ``torch.manual_seed(seed)`` before building each model (``nseeds`` seeds).
    t:          step index 1..nsteps; the forward pass at ``t`` follows ``t - 1`` optimizer
                updates, so ``t = 1`` is at initialisation.
    module:     a named output: a submodule's output (forward hooks) or a name returned by the
                caller's ``forward``; ``"output"`` is the model's output.
    l1:         ``mean |x|`` over every entry of the module's output (float32), dimensionless.
    rel_change: ``||x_t - x_1||_F / ||x_1||_F``, the relative change since initialisation (NaN
                where ``x_1 = 0``, e.g. a zero-initialised readout).

Protocol (microsoft/mup ``coord_check.py`` with ``fix_data=True``): for each seed and width,
build the model and its optimizer; for t = 1..nsteps, forward the same batch recording each
module's output, then backward the loss and step. Under muP every module's l1 stays flat in
width at every t; under the standard parametrization with Adam, logits and hidden activations
grow roughly in proportion to width after the first update.

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

__all__ = ["CoordRecord", "coord_check", "coord_summary", "plot_coord_check"]

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


def coord_check(
    model_factory: Callable[[int], nn.Module],
    widths: Sequence[int],
    batch: tuple[Tensor, Tensor],
    *,
    loss_fn: Callable[[Tensor, Tensor], Tensor],
    make_optimizer: Callable[[nn.Module, int], torch.optim.Optimizer],
    nsteps: int = 3,
    nseeds: int = 3,
    forward: Forward | None = None,
    seed_offset: int = 0,
) -> list[CoordRecord]:
    """Record each module's mean |activation| for every width, seed and step.

    Args:
        model_factory: ``width -> model``; called after ``torch.manual_seed(seed)``.
        widths: the widths to sweep (positive ints).
        batch: ``(x, y)``, reused at every step (``fix_data``).
        loss_fn: ``(output, y) -> scalar loss``.
        make_optimizer: ``(model, width) -> optimizer`` (use
            :func:`dynascope.nn.parametrization.parameter_groups` for muP learning rates).
        nsteps: forward passes per model (>= 1); ``nsteps - 1`` updates happen in between.
        nseeds: number of seeds (>= 1): ``seed_offset .. seed_offset + nseeds - 1``.
        forward: optional ``(model, x) -> (output, {name: activation})``; default: ``model(x)``
            with forward hooks on every named submodule. ``"output"`` is always recorded.
        seed_offset: the first seed.
    Returns:
        ``CoordRecord`` rows, ``len(widths) * nseeds * nsteps * n_modules`` of them.
    Raises:
        ValueError: if ``widths`` is empty or holds a non-positive entry, or ``nsteps`` or
            ``nseeds`` is below 1.
    References:
        microsoft/mup ``coord_check.py``; Yang et al. (2022), arXiv 2203.03466, Sec. D.1.
    """
    if not widths or any(int(w) != w or w < 1 for w in widths):
        raise ValueError(f"widths must be a non-empty list of positive ints (got {list(widths)})")
    if nsteps < 1:
        raise ValueError(f"nsteps must be >= 1 (got nsteps={nsteps})")
    if nseeds < 1:
        raise ValueError(f"nseeds must be >= 1 (got nseeds={nseeds})")
    run_forward = forward or _hooked_forward
    x, y = batch
    records: list[CoordRecord] = []
    for seed in range(seed_offset, seed_offset + nseeds):
        for width in widths:
            torch.manual_seed(seed)
            model = model_factory(int(width))
            optimizer = make_optimizer(model, int(width))
            first: dict[str, Tensor] = {}
            for t in range(1, nsteps + 1):
                output, acts = run_forward(model, x)
                acts = {**acts, "output": output.detach()}
                for name, act in acts.items():
                    act = act.detach().float()
                    if t == 1:
                        first[name] = act
                    norm0 = first[name].norm()
                    rel = (act - first[name]).norm() / norm0 if norm0 > 0 else float("nan")
                    records.append(
                        CoordRecord(int(width), seed, name, t, float(act.abs().mean()), float(rel))
                    )
                if t < nsteps:
                    optimizer.zero_grad(set_to_none=True)
                    loss_fn(output, y).backward()
                    optimizer.step()
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
