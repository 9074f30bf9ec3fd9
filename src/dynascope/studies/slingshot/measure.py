"""Slingshot measurements of one stored run: the frozen detector (:class:`DetectorConfig`), its
cycles (:func:`run_cycles`) and everything the verdicts and figures read (:class:`Measured`).

Design, calibration of the detector: ``docs/studies/slingshot.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from dynascope.probes.slingshot import SlingshotCycle, detect_slingshots, grok_step, onset_distance
from dynascope.store import Run
from dynascope.tasks.modular_arithmetic import equations

from .runs import NORM_KEY

__all__ = ["GROK_ACCURACY", "DetectorConfig", "Measured", "run_cycles"]

GROK_ACCURACY = 0.95  # S13: the grok step is the first evaluation at >= this accuracy

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
