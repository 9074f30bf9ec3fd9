"""Slingshot analysis: verdicts s1–s3, f64 and g1 from the runs' cycles (:mod:`.measure`), each
judged through its spec in :mod:`.protocol` (statistic, threshold, preconditions, control).

Design, calibration of the detector and the preconditions: ``docs/studies/slingshot.md``.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from dynascope.probes.slingshot import onset_distance
from dynascope.store import Run
from dynascope.studies.base import Analysis
from dynascope.studies.verdict import Precondition, Verdict

from .figures import grokking_figure, run_figures
from .measure import GROK_ACCURACY, DetectorConfig, Measured
from .protocol import PROTOCOL

__all__ = ["analyze"]


def _two_thirds(flags: list[bool]) -> bool:
    return bool(flags) and 3 * sum(flags) >= 2 * len(flags)


def analyze(
    runs: dict[str, Run], figures: Path, detector: DetectorConfig | None = None
) -> Analysis:
    """Verdicts s1–s3 from the float32 FCN runs, f64 from the float64 ones (when present), g1
    from the grokking runs (or a smallest-ε FCN run that groks).

    Runs are told apart by their configs (task, optimizer, ε or lr, dtype, seed), not by their
    names: the slingshot condition is the float32 Adam run with the smallest ε, the ε control
    the one with the largest. Each claim is judged over the seeds by
    :func:`~dynascope.studies.verdict.judge`, with its precondition and negative control
    (docs/studies/slingshot.md, "Verdicts").

    Args:
        runs: run name -> stored run.
        figures: where the figures go.
        detector: the detector constants; ``None`` for the frozen ones.
    Returns:
        The verdicts, the figures and two tables (per run; per detected cycle).
    """
    detector = detector or DetectorConfig()
    everything = [Measured.read(name, run, detector) for name, run in sorted(runs.items())]
    fcn = [m for m in everything if m.system == "fcn"]
    measured = [m for m in fcn if m.dtype == "float32"]
    wide = [m for m in fcn if m.dtype == "float64"]
    grokking = [m for m in everything if m.system == "grokking"]
    adam_values = sorted({m.value for m in measured if m.optimizer == "adam"})
    small = adam_values[0] if adam_values else math.nan
    large = adam_values[-1] if len(adam_values) > 1 else math.nan

    def arm(optimizer: str, value: float | None = None, pool=measured) -> dict[int, Measured]:
        return {
            m.seed: m
            for m in pool
            if m.optimizer == optimizer and (value is None or math.isclose(m.value, value))
        }

    slingshot, control, sgd = arm("adam", small), arm("adam", large), arm("sgd")
    counts = {s: float(len(m.cycles)) for s, m in slingshot.items()}
    control_counts = {s: float(len(m.cycles)) for s, m in control.items()}
    sgd_counts = {s: float(len(m.cycles)) for s, m in sgd.items()}
    cycled = _two_thirds([c >= 1 for c in counts.values()])
    roomy = [m.room_for_second for m in slingshot.values()]
    n_cycled = sum(c >= 1 for c in counts.values())
    names = {"slingshot": slingshot, "ε control": control, "SGD": sgd}

    def precondition(
        arms: tuple[str, ...],
        also: tuple[str, bool, float] | None,
        extra: dict[str, dict[int, Measured]] | None = None,
    ) -> Precondition:
        """Every seed of every named arm fitted its training set, and ``also`` (text, met,
        measured) when given; the text names the arms and seeds that missed."""
        pools = {**{a: names[a] for a in arms}, **(extra or {})}
        missing = [f"{a} seed {s}" for a, pool in pools.items() for s, m in pool.items()
                   if not m.fitted]  # fmt: skip
        empty = [a for a, pool in pools.items() if not pool]
        text = (
            f"every seed of the {', '.join(pools)} arm(s) fits its training set (loss < ln 2 / n)"
        )
        met, measured = not missing and not empty, math.nan
        if also is not None:
            text += "; " + also[0]
            met, measured = met and also[1], also[2]
        if missing:
            text += f" [not fitted: {', '.join(missing)}]"
        if empty:
            text += f" [no runs: {', '.join(empty)}]"
        return Precondition(text, met=met, measured=measured)

    cycles_text = (
        "the slingshot condition shows >= 1 cycle in >= 2/3 of its seeds (else there is "
        "nothing for SGD or a larger ε to remove)"
    )
    growth = "; ".join(
        f"{m.name}: spikes {', '.join(str(c.spike_step) for c in m.cycles) or '-'}, final "
        f"growth {m.final_growth(detector.window):.2g}/step"
        for m in slingshot.values()
    )
    room = (
        ">= 2/3 of the seeds have a first cycle and, after its end, at least as many steps as "
        "it took to start (room for a second cycle)",
        _two_thirds(roomy),
        float(sum(roomy)),
    )
    verdicts = [
        PROTOCOL.claim("s1").judge(
            counts,
            precondition=precondition(("slingshot", "ε control"), room),
            control=control_counts,
            detail=f"ε = {small:g} against ε = {large:g}; τ = {detector.growth_rate:g}/step; "
            f"{growth}",
        ),
        PROTOCOL.claim("s2").judge(
            sgd_counts,
            precondition=precondition(("SGD", "slingshot"), (cycles_text, cycled, float(n_cycled))),
            control=counts,
            detail=f"control: Adam ε = {small:g}",
        ),
        PROTOCOL.claim("s3").judge(
            {s: counts[s] - control_counts[s] for s in counts if s in control_counts},
            precondition=precondition(
                ("slingshot", "ε control", "SGD"), (cycles_text, cycled, float(n_cycled))
            ),
            control={
                s: sgd_counts[s] - control_counts[s] for s in sgd_counts if s in control_counts
            },
            detail=f"cycles(ε = {small:g}) − cycles(ε = {large:g})",
        ),
    ]
    if wide:
        wide_arm = arm("adam", small, wide)
        wide_counts = {s: float(len(m.cycles)) for s, m in wide_arm.items()}
        verdicts.append(
            PROTOCOL.claim("f64").judge(
                wide_counts,
                precondition=precondition(
                    ("SGD",), (cycles_text, cycled, float(n_cycled)), extra={"float64": wide_arm}
                ),
                control=sgd_counts,
                detail=f"Adam ε = {small:g} in float64",
            )
        )
    if grokking:
        grok_eps = sorted({m.value for m in grokking})
        treated = {m.seed: m for m in grokking if m.value == grok_eps[0]}
        ablated = {m.seed: m for m in grokking if len(grok_eps) > 1 and m.value == grok_eps[-1]}
        system = "grokking system: modular addition, transformer, Adam"
        verdicts.append(_g1(treated, ablated, system, grok_eps[-1]))
    elif any(m.grok is not None for m in slingshot.values()):
        verdicts.append(_g1(slingshot, control, "FCN runs that grokked", large))
    shown = measured + wide + grokking
    tables = {
        "runs: cycles, final values, grok step": [
            m.row(runs[m.name].status, detector.window) for m in shown
        ]
    }
    cycle_rows = [row for m in shown for row in m.cycle_rows()]
    if cycle_rows:
        tables["detected cycles"] = cycle_rows
    paths = run_figures(measured + wide, figures) if measured else []
    if grokking:
        paths.append(grokking_figure(grokking, figures))
    return Analysis(verdicts, paths, tables)


def _censored_grok(m: Measured) -> int:
    """The grok step, or the run's last step when it never grokked (censored at the budget: the
    earliest it could still grok)."""
    if m.grok is not None:
        return m.grok
    return int(m.series["steps"][-1]) if m.series["steps"].size else 0


def _g1(
    treated: dict[int, Measured], ablated: dict[int, Measured], system: str, ablation_eps: float
) -> Verdict:
    """g1 per seed whose treated run grokked: |grok step − nearest onset| / mean cycle length
    (NaN: no cycle), arXiv 2206.04817 sec. 5. Control (ablation): the same seed's run at the
    larger ε (cycles removed), its grok step (censored at its last step when it never grokked)
    read against the treated run's onsets and mean cycle length."""
    grokked = {s: m for s, m in sorted(treated.items()) if m.grok is not None}
    per_seed = {s: m.grok_ratio for s, m in grokked.items()}
    control = {
        s: onset_distance(_censored_grok(ablated[s]), m.cycles)
        / float(np.mean([c.length for c in m.cycles]))
        if m.cycles and s in ablated
        else math.nan
        for s, m in grokked.items()
    }
    per_run = "; ".join(
        f"{m.name}: grok step {m.grok if m.grok is not None else '-'}, {len(m.cycles)} cycles "
        f"(onsets {', '.join(str(c.start_step) for c in m.cycles) or '-'})"
        for m in [*treated.values(), *ablated.values()]
    )
    unfit = [m.name for m in [*grokked.values(), *ablated.values()] if not m.fitted]
    missing = [s for s in grokked if s not in ablated]
    text = (
        f"the treated runs grok (validation accuracy reaches {GROK_ACCURACY}); every run read "
        f"(treated and ε = {ablation_eps:g}) fits its training set"
    )
    if unfit:
        text += f" [not fitted: {', '.join(unfit)}]"
    if missing:
        text += f" [no ε = {ablation_eps:g} run for seeds {missing}]"
    return PROTOCOL.claim("g1").judge(
        per_seed,
        precondition=Precondition(
            text, met=bool(grokked) and not unfit and not missing, measured=float(len(grokked))
        ),
        control=control,
        detail=f"{system}; {len(grokked)} of {len(treated)} run(s) grokked; {per_run}",
    )
