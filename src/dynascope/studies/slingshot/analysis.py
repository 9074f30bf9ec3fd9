"""Slingshot analysis: cycles per run (frozen detector), verdicts s1–s3, f64 and g1.

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
from dynascope.studies.verdict import Control, Precondition, Verdict, judge
from dynascope.tasks.modular_arithmetic import equations

from .figures import GROK_ACCURACY, grokking_figure, run_figures
from .runs import NORM_KEY

__all__ = ["DetectorConfig", "analyze", "run_cycles"]

# Frozen thresholds (S13's proposals; docs/studies/slingshot.md).
S1_MIN_CYCLES = 2.0
S2_MAX_CYCLES = 0.0
S3_MIN_GAP = 1.0  # cycle counts are integers: a gap > 0 is a gap >= 1
G1_MAX_LENGTHS = 1.0
F64_MIN_CYCLES = 1.0

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
    cycles_pre = Precondition(
        "the slingshot condition shows >= 1 cycle in >= 2/3 of its seeds (else there is "
        "nothing for SGD or a larger ε to remove)",
        met=cycled,
        measured=float(n_cycled),
    )
    growth = "; ".join(
        f"{m.name}: spikes {', '.join(str(c.spike_step) for c in m.cycles) or '-'}, final "
        f"growth {m.final_growth(detector.window):.2g}/step"
        for m in slingshot.values()
    )
    verdicts = [
        judge(
            claim=f"s1: Adam ε = {small:g} enters repeating slingshot cycles after fitting the "
            "training set",
            metric="detected cycles of the smallest-ε Adam run, per seed",
            per_seed=counts,
            threshold=S1_MIN_CYCLES,
            direction=">=",
            precondition=Precondition(
                ">= 2/3 of the seeds have a first cycle and, after its end, at least as many "
                "steps as it took to start (room for a second cycle)",
                met=_two_thirds(roomy),
                measured=float(sum(roomy)),
            ),
            control=Control(f"Adam ε = {large:g}, the same count", per_seed=control_counts),
            detail=f"τ = {detector.growth_rate:g}/step; {growth}",
        ),
        judge(
            claim="s2: plain SGD shows no slingshot cycle",
            metric="detected cycles of the SGD run, per seed",
            per_seed=sgd_counts,
            threshold=S2_MAX_CYCLES,
            direction="<=",
            precondition=cycles_pre,
            control=Control(f"Adam ε = {small:g} (the slingshot condition)", per_seed=counts),
        ),
        judge(
            claim=f"s3: a larger Adam ε ({large:g}) gives fewer cycles",
            metric=f"cycles(ε = {small:g}) − cycles(ε = {large:g}), per seed",
            per_seed={s: counts[s] - control_counts[s] for s in counts if s in control_counts},
            threshold=S3_MIN_GAP,
            direction=">=",
            precondition=cycles_pre,
            control=Control(
                f"cycles(SGD) − cycles(ε = {large:g}): two arms without the mechanism",
                per_seed={
                    s: sgd_counts[s] - control_counts[s] for s in sgd_counts if s in control_counts
                },
            ),
        ),
    ]
    if wide:
        wide_counts = {s: float(len(m.cycles)) for s, m in arm("adam", small, wide).items()}
        verdicts.append(
            judge(
                claim="f64: the slingshot condition cycles in float64 too (not a float32 artefact)",
                metric=f"detected cycles of Adam ε = {small:g} in float64, per seed",
                per_seed=wide_counts,
                threshold=F64_MIN_CYCLES,
                direction=">=",
                precondition=cycles_pre,
                control=Control("SGD (float32), the same count", per_seed=sgd_counts),
            )
        )
    if grokking:
        verdicts.append(_g1(grokking, "grokking system: modular addition, transformer, Adam"))
    else:
        grokked = [m for m in slingshot.values() if m.grok is not None]
        if grokked:
            verdicts.append(_g1(grokked, "FCN runs that grokked"))
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


def _g1(runs: list[Measured], system: str) -> Verdict:
    """g1 per run that grokked: |grok step − nearest onset| / mean cycle length (NaN: no
    cycle); control: the same ratio for step 0 (an event unrelated to any cycle)."""
    grokked = [m for m in runs if m.grok is not None]
    per_seed = {m.seed: m.grok_ratio for m in grokked}
    control = {
        m.seed: onset_distance(0, m.cycles) / float(np.mean([c.length for c in m.cycles]))
        if m.cycles
        else math.nan
        for m in grokked
    }
    per_run = "; ".join(
        f"{m.name}: grok step {m.grok if m.grok is not None else '-'}, {len(m.cycles)} cycles "
        f"(onsets {', '.join(str(c.start_step) for c in m.cycles) or '-'})"
        for m in runs
    )
    return judge(
        claim=f"g1: grokking (val accuracy >= {GROK_ACCURACY}) happens within one cycle length "
        f"of a cycle onset ({system})",
        metric="|grok step − nearest onset| / mean cycle length, per run that grokked",
        per_seed=per_seed,
        threshold=G1_MAX_LENGTHS,
        direction="<=",
        precondition=Precondition(
            "the runs grok (validation accuracy reaches the threshold)",
            met=bool(grokked),
            measured=float(len(grokked)),
        ),
        control=Control("step 0 in place of the grok step", per_seed=control),
        detail=f"{len(grokked)} of {len(runs)} run(s) grokked; {per_run}",
    )
