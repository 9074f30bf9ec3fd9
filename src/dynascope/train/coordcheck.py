"""The coordinate check as engine runs: for each width, ``nseeds`` models trained as one ensemble
on a fixed batch, measured by :class:`~dynascope.probes.coordcheck.CoordProbe` at every step.

Step convention: the probe at engine step ``s`` (``s`` updates done) is the coordinate check's
``t = s + 1`` (``t = 1`` at initialisation), as in microsoft/mup's ``coord_check.py``.

References:
    G. Yang et al. (2022), "Tensor Programs V", arXiv 2203.03466, Sec. D.1.
    microsoft/mup 1.0.0, ``mup/coord_check.py``.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from dynascope.monitor import EveryN
from dynascope.probes.base import ProbeContext
from dynascope.probes.coordcheck import CoordProbe, CoordRecord, Forward, records_from_rows
from dynascope.store import load_run

from .engine import Engine, Loop, Member, Parts
from .seeding import SeedStreams, seed_everything

__all__ = ["coord_check"]


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
    """Record each module's mean |activation| for every width, seed and step, on the engine.

    Args:
        model_factory: ``width -> model``; called after the engine seeded the run's ``init``
            stream (:mod:`dynascope.train.seeding`) from the seed.
        widths: the widths to sweep (positive ints).
        batch: ``(x, y)``, reused at every step (``fix_data``).
        loss_fn: ``(model(x), y) -> scalar loss``.
        make_optimizer: ``(model, width) -> optimizer``, elementwise (SGD, Adam, AdamW, sign
            steps; use :func:`dynascope.nn.parametrization.parameter_groups` for muP rates).
        nsteps: forward passes per model (>= 1); ``nsteps - 1`` updates happen in between.
        nseeds: number of seeds (>= 1): ``seed_offset .. seed_offset + nseeds - 1``, trained as
            one ensemble per width.
        forward: optional ``(model, x) -> (output, {name: activation})`` (``output`` must be
            ``model(x)``); default: forward hooks on every named submodule.
        seed_offset: the first seed.
    Returns:
        ``CoordRecord`` rows, ``len(widths) * nseeds * nsteps * n_modules`` of them.
    Raises:
        ValueError: if ``widths`` is empty or holds a non-positive entry, or ``nsteps`` or
            ``nseeds`` is below 1.
    """
    if not widths or any(int(w) != w or w < 1 for w in widths):
        raise ValueError(f"widths must be a non-empty list of positive ints (got {list(widths)})")
    if nsteps < 1:
        raise ValueError(f"nsteps must be >= 1 (got nsteps={nsteps})")
    if nseeds < 1:
        raise ValueError(f"nseeds must be >= 1 (got nseeds={nseeds})")
    x, y = batch
    seeds = list(range(seed_offset, seed_offset + nseeds))
    rows = []
    for width in (int(w) for w in widths):
        if nsteps == 1:  # nothing to train: measure the initialisation only
            for seed in seeds:
                seed_everything(SeedStreams(seed)("init"))
                values = CoordProbe(forward)(
                    model_factory(width), ProbeContext(step=0, batch={"x": x})
                )
                rows.append((width, seed, 1, values))
            continue

        def build(streams: SeedStreams, width: int = width) -> Parts:
            model = model_factory(width)
            return Parts(
                model=model,
                data={"x": x, "y": y},
                loss=lambda m, b: loss_fn(m(b["x"]), b["y"]),
                optimizer=lambda m: make_optimizer(m, width),
                probes=[(CoordProbe(forward), EveryN(1))],
                probe_batch={"x": x},
            )

        with tempfile.TemporaryDirectory() as tmp:
            members = [Member(Path(tmp) / f"s{seed}", seed, {"seed": seed}) for seed in seeds]
            Engine(members, build, Loop(steps=nsteps - 1, dtype=_dtype(x))).run()
            for member in members:
                for t, values in _probe_rows(member.run_dir):
                    rows.append((width, member.seed, t, values))
    return records_from_rows(rows)


def _dtype(x: Tensor) -> str:
    return "float64" if x.dtype == torch.float64 else "float32"


def _probe_rows(run_dir: Path) -> list[tuple[int, dict[str, float]]]:
    """``(t, {key: value})`` per probed step of one run (``t = step + 1``)."""
    scalars = load_run(run_dir).scalars
    scalars = scalars[scalars["key"].str.match(r"^(l1|rel)\.")]
    return [
        (int(step) + 1, dict(zip(group["key"], group["value"].astype(float))))
        for step, group in scalars.groupby("step")
    ]
