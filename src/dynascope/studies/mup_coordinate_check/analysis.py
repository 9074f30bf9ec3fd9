"""mup-coordinate-check verdicts: c1 (SP's logits grow with width) and c2 (muP stays flat),
judged per seed (docs/studies/mup-coordinate-check.md); c3 and the extras as tables."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np

from dynascope.probes.coordcheck import CoordRecord, coord_summary
from dynascope.store import Run
from dynascope.studies.base import Analysis, Verdict
from dynascope.studies.verdict import Precondition

from . import figures
from .protocol import GATED_MODULES, MIN_WIDTH_SPAN, PROTOCOL

__all__ = ["GATED_MODULES", "analyze", "coord_tables", "fit_per_seed", "load_records", "sweeps"]

# Thresholds, directions and statistics live in .protocol (PROTOCOL); c2 reads these steps.
C2_STEPS = (2, 3)
BASE_WIDTH = 64  # the fit bar is read here, where SP's and muP's learning rates agree

_NAME = re.compile(r"^(?P<sweep>.+)_w(?P<width>\d+)_(?:s|lr)\d+$")


def sweeps(runs: dict[str, Run]) -> dict[str, list[Run]]:
    """The runs of each sweep (``coord_standard_adam``, ...), by run name."""
    out: dict[str, list[Run]] = {}
    for name, run in sorted(runs.items()):
        match = _NAME.match(name)
        if match:
            out.setdefault(match["sweep"], []).append(run)
    return out


def load_records(runs: list[Run]) -> list[CoordRecord]:
    """:class:`CoordRecord` rows (``t = step + 1``) from a coordinate-check sweep's runs."""
    records = []
    for run in runs:
        width, seed = int(run.config["width"]), int(run.config["seed"])
        for step, group in run.scalars.groupby("step"):
            values = dict(zip(group["key"], group["value"].astype(float)))
            for key, l1 in values.items():
                if key.startswith("l1."):
                    rel = values.get(f"rel.{key[3:]}", math.nan)
                    records.append(CoordRecord(width, seed, key[3:], int(step) + 1, l1, rel))
    return records


def coord_tables(
    runs: list[Run], stat: str = "l1"
) -> tuple[list[int], list[int], dict[tuple[str, int], np.ndarray]]:
    """Seeds, widths and ``{(module, t): stat [n_seeds, n_widths]}`` (NaN where missing)."""
    records = load_records(runs)
    seeds = sorted({r.seed for r in records})
    widths = sorted({r.width for r in records})
    row, col = {s: i for i, s in enumerate(seeds)}, {w: j for j, w in enumerate(widths)}
    tables: dict[tuple[str, int], np.ndarray] = {}
    for r in records:
        table = tables.setdefault((r.module, r.t), np.full((len(seeds), len(widths)), np.nan))
        table[row[r.seed], col[r.width]] = getattr(r, stat)
    return seeds, widths, tables


def _growth_per_seed(runs: list[Run], t: int) -> dict[int, float]:
    """Per seed: ``l1(logits, t, w_max) / l1(logits, t, w_min)`` (NaN where unmeasurable)."""
    seeds, _, tables = coord_tables(runs)
    table = tables.get(("logits", t))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = table[:, -1] / table[:, 0] if table is not None else np.full(len(seeds), np.nan)
    return {s: float(r) if np.isfinite(r) else math.nan for s, r in zip(seeds, ratio)}


def fit_per_seed(runs: list[Run]) -> dict[int, bool]:
    """Per seed of one arm: every width's run finished with a finite ``train.loss`` at every
    logged step, and at the base width (:data:`BASE_WIDTH`, else the narrowest) the last logged
    loss is below the first (the update lowered the loss on the fixed batch).

    Args:
        runs: the arm's coordinate-check runs (every width and seed).
    Returns:
        seed -> whether that seed's runs meet the bar.
    """
    by_seed: dict[int, dict[int, Run]] = {}
    for run in runs:
        by_seed.setdefault(int(run.config["seed"]), {})[int(run.config["width"])] = run
    out = {}
    for seed, by_width in by_seed.items():
        ok = True
        for run in by_width.values():
            loss = (
                run.scalar("train.loss").to_numpy(dtype=float) if run.status == "finished" else []
            )
            ok = ok and len(loss) >= 1 and bool(np.all(np.isfinite(loss)))
        base = by_width.get(BASE_WIDTH, by_width[min(by_width)])
        loss = base.scalar("train.loss").to_numpy(dtype=float) if ok else np.array([])
        out[seed] = bool(ok and len(loss) >= 2 and loss[-1] < loss[0])
    return out


def _worst_spread_per_seed(runs: list[Run], steps: list[int]) -> tuple[dict[int, float], list]:
    """Per seed: the worst ``max_w l1 / min_w l1`` over the gated modules and ``steps``.

    A module whose l1 is 0 or not finite at some width makes that seed's value NaN. Also
    returns, per seed, where the worst spread sits (``module@t``).
    """
    seeds, _, tables = coord_tables(runs)
    worst = {s: -math.inf for s in seeds}
    where = {s: "" for s in seeds}
    for module in GATED_MODULES:
        for t in steps:
            table = tables.get((module, t))
            for i, s in enumerate(seeds):
                row = table[i] if table is not None else np.array([np.nan])
                spread = row.max() / row.min() if np.all(np.isfinite(row) & (row > 0)) else np.nan
                if not np.isfinite(spread):
                    worst[s], where[s] = math.nan, f"{module}@t={t} unmeasurable"
                elif spread > worst[s]:
                    worst[s], where[s] = float(spread), f"{module}@t={t}"
    return worst, [f"seed {s}: {where[s]}" for s in seeds]


def _verdicts(sp: list[Run], mup: list[Run]) -> tuple[list[Verdict], list[dict]]:
    sp_rows = {(r["module"], r["t"]): r for r in coord_summary(load_records(sp))}
    mup_rows = {(r["module"], r["t"]): r for r in coord_summary(load_records(mup))}
    last_t = max(t for _, t in sp_rows)
    _, widths, _ = coord_tables(sp)
    span = widths[-1] / widths[0]
    steps = [t for t in C2_STEPS if t <= last_t]
    fit = {**{("standard", s): v for s, v in fit_per_seed(sp).items()},
           **{("mup", s): v for s, v in fit_per_seed(mup).items()}}  # fmt: skip
    fit_ok = bool(fit) and all(fit.values())
    failed = ", ".join(f"{arm} seed {s}" for (arm, s), ok in fit.items() if not ok)
    precondition = Precondition(
        "; ".join(PROTOCOL.claim("c1").preconditions)
        + f" (measured: w_max / w_min; {'fit failed: ' + failed if failed else 'every arm fit'})",
        met=fit_ok and span >= MIN_WIDTH_SPAN and last_t >= 2,
        measured=span,
    )
    c2_sp, _ = _worst_spread_per_seed(sp, steps)
    c2_mup, where = _worst_spread_per_seed(mup, steps)
    verdicts = [
        PROTOCOL.claim("c1").judge(
            _growth_per_seed(sp, last_t),
            precondition=precondition,
            control=_growth_per_seed(mup, last_t),
            detail=f"{last_t - 1} update(s); l1(logits, t={last_t}, w={widths[-1]}) / "
            f"l1(logits, t={last_t}, w={widths[0]}); width ratio {span:g}",
        ),
        PROTOCOL.claim("c2").judge(
            c2_mup,
            precondition=precondition,
            control=c2_sp,
            detail=f"t in {tuple(steps)}; worst at " + "; ".join(where),
        ),
    ]
    rows = []
    for name, table in (("standard", sp_rows), ("mup", mup_rows)):
        for (module, _t), row in sorted(table.items()):
            if module in GATED_MODULES:
                rows.append({"parametrization": name, **row})
    return verdicts, rows


def _c3_rows(groups: dict[str, list[Run]]) -> list[dict]:
    rows = []
    for runs in groups.values():
        config = runs[0].config
        records = [r for r in load_records(runs) if r.module == "W1"]
        last = max(r.t for r in records)
        summary = {(r["module"], r["t"]): r for r in coord_summary(records, "rel_change")}
        widths = sorted({r.width for r in records})
        by_width = {
            w: np.mean([r.rel_change for r in records if r.width == w and r.t == last])
            for w in widths
        }
        rows.append(
            {
                "parametrization": config["parametrization"],
                "optimizer": config["optimizer"],
                "updates": last - 1,
                "slope_vs_width": summary[("W1", last)]["slope"],
                "expected_slope": -0.5 if config["parametrization"] == "ntk" else 0.0,
                **{f"rel_change_w{w}": float(v) for w, v in by_width.items()},
            }
        )
    return rows


def _transfer_rows(groups: dict[str, list[Run]]) -> list[dict]:
    rows = []
    for runs in groups.values():
        for width, points in sorted(figures.transfer_points(runs).items()):
            finite = [p for p in points if math.isfinite(p[1])]
            best = min(finite, key=lambda p: p[1]) if finite else (math.nan, math.nan)
            rows.append(
                {
                    "parametrization": runs[0].config["parametrization"],
                    "width": width,
                    "best_lr": float(best[0]),
                    "best_loss": float(best[1]),
                }
            )
    return rows


def analyze(runs: dict[str, Run], figures_dir: Path) -> Analysis:
    """Verdicts c1 (SP grows) and c2 (muP flat); c3 and the extras reported in tables."""
    groups = sweeps(runs)
    sp, mup = groups["coord_standard_adam"], groups["coord_mup_adam"]
    verdicts, rows = _verdicts(sp, mup)
    c3 = {k: v for k, v in groups.items() if k.endswith("_c3")}
    transfer = {k: v for k, v in groups.items() if k.startswith("lr_transfer")}
    extras = [
        {"run": key, **row}
        for key, group in groups.items()
        if key not in ("coord_standard_adam", "coord_mup_adam")
        and key not in c3
        and key not in transfer
        for row in coord_summary(load_records(group))
        if row["module"] in GATED_MODULES
    ]
    paths = figures.coord_figures(
        {"standard": load_records(sp), "mup": load_records(mup)}, GATED_MODULES, figures_dir
    )
    c3_rows = _c3_rows(c3)
    if c3_rows:
        paths.append(figures.c3_figure(c3_rows, figures_dir))
    tables = {"coordinate check summary (Adam, gated modules)": rows}
    tables["c3 (reported, not gated): relative hidden change vs width"] = c3_rows
    if extras:
        tables["extra coordinate checks (paper)"] = extras
    if transfer:
        paths.append(figures.transfer_figure(transfer, figures_dir))
        tables["learning-rate transfer: best Adam lr per width"] = _transfer_rows(transfer)
    return Analysis(verdicts, paths, tables)
