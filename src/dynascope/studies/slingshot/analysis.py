"""Slingshot analysis: cycles per run (frozen detector), verdicts s1–s3, f64 and g1, each judged
through its spec in :mod:`.protocol` (statistic, threshold, preconditions, control).

Design, calibration of the detector and the preconditions: ``docs/studies/slingshot.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from dynascope.probes.slingshot import SlingshotCycle, detect_slingshots, grok_step, onset_distance
from dynascope.store import Run
from dynascope.studies.base import Analysis
from dynascope.studies.verdict import Precondition, Verdict
from dynascope.tasks.modular_arithmetic import equations

from .figures import GROK_ACCURACY, grokking_figure, run_figures
from .protocol import PROTOCOL
from .runs import NORM_KEY

__all__ = ["DetectorConfig", "analyze", "run_cycles"]

# Below the unit roundoff of the run's dtype a loss is rounding noise, not a baseline.
LOSS_FLOOR = {"float32": 2.0**-24, "float64": 2.0**-53}

# Frozen detector constants (calibrated once; docs/studies/slingshot.md, "Calibration").
SPIKE_FACTOR = 100.0
GROWTH_RATE = 5e-5
PLATEAU_RATE = 2e-4
WINDOW = 100

GROKKING_TASK = "modular_arithmetic"  # the task that marks a run as the grokking system


class DetectorConfig(BaseModel):
    """The slingshot detector's constants (:func:`detect_slingshots`), frozen after calibration.

    ``arm_loss_factor``: the detector arms at the first step with ``train.loss <
    arm_loss_factor * ln 2 / n_train`` (1 certifies 100 % training accuracy).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    spike_factor: float = Field(SPIKE_FACTOR, gt=1, description="k: spike if l_t > k min l_s")
    growth_rate: float = Field(GROWTH_RATE, gt=0, description="τ, 1/step")
    plateau_rate: float = Field(PLATEAU_RATE, gt=0, description="τ', 1/step")
    window: int = Field(WINDOW, ge=1, description="w, steps")
    arm_loss_factor: float = Field(1.0, gt=0, le=1, description="arming loss / (ln 2 / n_train)")


def _is_grokking(config: dict) -> bool:
    task = config.get("task")
    return isinstance(task, dict) and task.get("name") == GROKKING_TASK


def _examples_per_loss_row(config: dict) -> int:
    """``b``: training examples behind one ``train.loss`` row: ``n_train`` for the full-batch
    FCN; ``min(n_train, batch_size)`` for the grokking run."""
    if not _is_grokking(config):
        return int(config.get("n_train", 1))
    task = config["task"]
    n_train = round(len(equations(int(task["p"]), task["op"])) * task["train_fraction"])
    return max(1, min(n_train, int(config["train"]["batch_size"])))


def _dtype(config: dict) -> str:
    return config["loop"]["dtype"] if "loop" in config else config.get("dtype", "float32")


def _series(run: Run, key: str) -> tuple[np.ndarray, np.ndarray]:
    s = run.scalar(key)
    return s.index.to_numpy(dtype=np.int64), s.to_numpy(dtype=np.float64)


def run_cycles(
    run: Run, detector: DetectorConfig | None = None
) -> tuple[list[SlingshotCycle], dict[str, np.ndarray]]:
    """Slingshot cycles of one stored run, and the aligned series they were read from.

    Reads ``train.loss`` and ``||W_U||_F`` (``train.last_layer_norm`` of the FCN runs, or the
    ``last_layer.norm`` probe of the grokking run) at the steps where both were logged; arms
    at the first step with ``train.loss < arm_loss_factor * ln 2 / b`` (``b`` examples behind
    one loss row) and floors the loss at :data:`LOSS_FLOOR` of the run's dtype.

    Args:
        run: a stored run (``load_run``).
        detector: the detector constants; ``None`` for the frozen ones.
    Returns:
        ``(cycles, series)``, series ``{"steps", "norm", "loss"}``: ``[T]`` arrays (steps,
        ``||W_U||_F``, training loss in nats, unfloored); empty when the run logged neither key.
    """
    detector = detector or DetectorConfig()
    loss_steps, loss = _series(run, "train.loss")
    norm_key = "last_layer.norm" if _is_grokking(run.config) else NORM_KEY
    norm_steps, norm = _series(run, norm_key)
    steps, i_loss, i_norm = np.intersect1d(loss_steps, norm_steps, return_indices=True)
    series = {"steps": steps, "norm": norm[i_norm], "loss": loss[i_loss]}
    if steps.size < 2:
        return [], series
    n_examples = _examples_per_loss_row(run.config)
    armed = (series["loss"] < detector.arm_loss_factor * math.log(2) / n_examples).astype(float)
    cycles = detect_slingshots(
        steps,
        series["norm"],
        np.maximum(series["loss"], LOSS_FLOOR[_dtype(run.config)]),
        accuracy=armed,
        arm_accuracy=0.5,
        spike_factor=detector.spike_factor,
        growth_rate=detector.growth_rate,
        plateau_rate=detector.plateau_rate,
        window=detector.window,
    )
    return cycles, series


@dataclass
class Measured:
    """One run as the analysis sees it."""

    name: str
    system: str  # "grokking" (modular arithmetic task) or "fcn"
    optimizer: str  # "adam" or "sgd"
    value: float  # ε for Adam, lr for SGD
    dtype: str
    seed: int
    cycles: list[SlingshotCycle]
    series: dict[str, np.ndarray]
    val_steps: np.ndarray
    val_acc: np.ndarray
    grok: int | None
    fitted: bool  # the training loss fell below the arming certificate (100 % train accuracy)

    @classmethod
    def read(cls, name: str, run: Run, detector: DetectorConfig) -> Measured:
        config = run.config
        if _is_grokking(config):
            optimizer, value = "adam", float(config["optimizer"]["eps"])
        else:
            optimizer = config["optimizer"]
            value = float(config["eps"] if optimizer == "adam" else config["lr"])
        cycles, series = run_cycles(run, detector)
        val_steps, val_acc = _series(run, "val.accuracy")
        grok = grok_step(val_steps, val_acc, threshold=GROK_ACCURACY) if val_steps.size else None
        bar = detector.arm_loss_factor * math.log(2) / _examples_per_loss_row(config)
        fitted = bool(series["loss"].size and (series["loss"] < bar).any())
        return cls(
            name=name,
            system="grokking" if _is_grokking(config) else "fcn",
            optimizer=optimizer,
            value=value,
            dtype=_dtype(config),
            seed=int(config["seed"]),
            cycles=cycles,
            series=series,
            val_steps=val_steps,
            val_acc=val_acc,
            grok=grok,
            fitted=fitted,
        )

    @property
    def grok_ratio(self) -> float:
        """|grok step − nearest onset| / mean cycle length; NaN without grok step or cycle."""
        if self.grok is None or not self.cycles:
            return math.nan
        mean_length = float(np.mean([c.length for c in self.cycles]))
        return onset_distance(self.grok, self.cycles) / mean_length

    @property
    def room_for_second(self) -> bool:
        """Whether the run lasted, after its first cycle's end, at least as long as the first
        cycle took to start: room for a second cycle of the same period (False: no cycle)."""
        if not self.cycles:
            return False
        first, last = self.cycles[0], int(self.series["steps"][-1])
        return last - first.end_step >= first.start_step

    def val_at(self, step: int, *, after: bool) -> float:
        """Validation accuracy at the last evaluation <= step (the first >= step if ``after``)."""
        if after:
            k = int(np.searchsorted(self.val_steps, step, side="left"))
            return float(self.val_acc[k]) if k < self.val_steps.size else math.nan
        k = int(np.searchsorted(self.val_steps, step, side="right")) - 1
        return float(self.val_acc[k]) if k >= 0 else math.nan

    def final_growth(self, window: int) -> float:
        """Trailing growth rate of log ||W_U|| over the last ``window`` steps (1/step); NaN if
        the run is shorter. Shows a growth phase still under way when the run ends."""
        steps, norm = self.series["steps"], self.series["norm"]
        k = int(np.searchsorted(steps, steps[-1] - window, side="right")) - 1 if steps.size else -1
        if k < 0:
            return math.nan
        return float(math.log(norm[-1] / norm[k]) / (steps[-1] - steps[k]))

    def row(self, status: str | None, window: int) -> dict:
        last = {k: float(v[-1]) if v.size else math.nan for k, v in self.series.items()}
        return {
            "run": self.name,
            "system": self.system,
            "dtype": self.dtype,
            "status": status,
            "fits training set": self.fitted,
            "cycles": len(self.cycles),
            "onsets": ", ".join(str(c.start_step) for c in self.cycles) or "-",
            "spikes": ", ".join(str(c.spike_step) for c in self.cycles) or "-",
            "final train loss": last["loss"],
            "final ‖W_U‖": last["norm"],
            "final growth of log ‖W_U‖ (1/step)": self.final_growth(window),
            "final val acc": float(self.val_acc[-1]) if self.val_acc.size else math.nan,
            "grok step": self.grok if self.grok is not None else "-",
            "grok→onset / length": self.grok_ratio,
        }

    def cycle_rows(self) -> list[dict]:
        return [
            {
                "run": self.name,
                "start": c.start_step,
                "spike": c.spike_step,
                "end": c.end_step,
                "‖W_U‖ start": c.norm_start,
                "‖W_U‖ spike": c.norm_spike,
                "‖W_U‖ end": c.norm_end,
                "norm ratio": c.norm_ratio,
                "loss spike ×": c.spike_magnitude,
                "val acc before": self.val_at(c.start_step, after=False),
                "val acc after": self.val_at(c.end_step, after=True),
            }
            for c in self.cycles
        ]


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
