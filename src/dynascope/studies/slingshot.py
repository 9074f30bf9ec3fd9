"""Study ``slingshot`` (SYSTEMS.md S13): Adam's late norm-growth / loss-spike cycles.

Source: V. Thilak, E. Littwin, S. Zhai, O. Saremi, R. Paiss, J. Susskind, "The Slingshot
Mechanism: An Empirical Study of Adaptive Optimizers and the Grokking Phenomenon", NeurIPS 2022
workshop HITY, arXiv 2206.04817.

Finding: long after the training set is fit, adaptive optimizers enter repeating cycles: the
norm of the last layer grows fast, the training loss spikes, the norm levels off (their Fig. 1,
an FCN on 200 CIFAR-10 images). The cycles vanish with a larger Adam ε or with plain SGD.

Runs (S13 "FCN system"): FCN 64-256-256-10 (ReLU, PyTorch-default init) on 200 digits
(``Digits(patch_size=8, n_train=200)``, pixels / 16, the split's random 200 images rather than
S13's proposed 20 per class), full batch, mean cross-entropy, the other 1,597 images for
validation. Conditions, same init (same seed) and steps: Adam lr 1e-3, ε = 1e-8, no weight decay
(the slingshot run); Adam ε = 1e-4; SGD lr 0.1 (no momentum). ``train.batch_size = 1597`` makes
every training batch the whole training split and the single evaluation batch the whole
validation split (``Digits`` returns a split whole when the batch size reaches its size). Logged
every step: ``train.loss`` (``log_every = 1``) and ``last_layer.norm`` = ``||W_U||_F`` (probe
``last_layer_norm`` on an every-step schedule); ``val.accuracy`` every ``eval_every`` steps.

Detector: :func:`dynascope.probes.slingshot.detect_slingshots` on each run's
(``last_layer.norm``, ``train.loss``), armed at the first step whose training loss is below
``ln 2 / n_train``. The Trainer logs no training accuracy; a mean cross-entropy below
``ln 2 / n`` puts every example's loss below ``ln 2``, i.e. its correct-class probability above
1/2, which certifies 100 % training accuracy (S13 arms at >= 99 %; on the calibration runs the
certificate came 110 to 1,400 steps after the first 100 % step, see below).

Calibration (once, then frozen; never re-tuned to a verdict). The detector constants were set
from three calibration runs on a held-out seed (seed 1; the study's runs use seed 0), 40,000
steps each, a plain loop identical in data, model, init rule and optimizer to the Trainer runs,
before any fast run. (Disclosure: an exploratory 20,000-step loop on seed 0, run earlier to see
whether cycles occur at all on digits, spiked first at step 17,015; nothing was set from it.)

- Adam ε = 1e-8 showed one clear cycle: ``||W_U||`` drifted at ~1e-5/step (log N per step)
  while the loss fell to ~1e-8, then its trailing growth rate (w = 100) rose from 1e-4
  (step ~16,000) to 1.05e-3 at the spike (step 17,289: loss 1e-8 -> 11, train accuracy briefly
  73 %); ``||W_U||`` went 5.6 -> 9.96 and stayed flat (|g| < 1e-6/step) from step ~17,370; the
  loss recovered to 1e-5 within 500 steps, 1e-6 by ~19,500, and reached exact 0.0 (float32) at
  step 36,500. No second cycle by step 40,000. ε = 1e-4 and SGD: no spike step at all.
- k = 100 (S13's range [10, 100]): the spike was 9 orders of magnitude above its baseline, so
  k = 100 drops nothing; with k = 10 the slow recovery (loss within 10x of its pre-spike
  minimum only after ~3,300 steps) counted as spike and put the cycle's end at 20,616, 3,250
  steps after the norm levelled off; with k = 100 the end is 17,851.
- τ = 2e-4/step (S13 proposal 1e-3): the growth rate at the calibration spike was 1.05e-3, so
  τ = 1e-3 dated the growth onset 35 steps before the spike (norm ratio 1.03 for a 1.6x rise);
  2e-4, a fifth of the measured peak and 20x the fitted-phase drift, dates it at 16,443 (norm
  ratio 1.58). The count (1) was the same for τ in {1e-4, 2e-4, 5e-4, 1e-3}.
- τ' = 2e-4/step and w = 100 steps: the proposals, unchanged (the plateau's |g| is < 1e-6).
- Loss floor: losses are floored at the dtype's unit roundoff (:data:`LOSS_FLOOR`), since the
  calibration loss reached exact 0.0, after which any rounding blip would be a spike.
- Arming: the certificate ``loss < ln 2 / 200`` came at steps 177 / 203 / 1,846 (ε = 1e-8 /
  1e-4 / SGD), against first 100 % training accuracy at 65 / 74 / 422: irrelevant for spikes
  thousands of steps later.

Verdicts (thresholds are S13's proposals, frozen before the first fast run; the measured values
are reported whatever they are):

- s1: cycles of Adam ε = 1e-8 (median over seeds) >= 2 (S13: repeating cycles).
- s2: cycles of SGD lr 0.1 (max over seeds) <= 0.
- s3: cycles(ε = 1e-8) − cycles(ε = 1e-4) (median over seeds) > 0.
- g1 (only when grokking occurs, i.e. some ε = 1e-8 run reaches validation accuracy >= 0.95;
  S13 proposes it for the paper preset): the distance from that grok step to the nearest cycle
  onset, divided by the run's mean cycle length, is <= 1 (max over those runs); NaN, and failed,
  when a run grokked without any cycle.

Scale: S13 trains 50,000 steps; ``fast`` trains FAST_STEPS = 17,000 per run, fixed from measured
step time before any fast run: one Trainer step (forward, backward, optimizer, three scalar
rows, the norm probe) measured 3.66 / 2.62 / 2.44 ms of CPU time (ε = 1e-8 / 1e-4 / SGD, one
thread, 2,000 steps each, the first run including warm-up; the shared 2-core machine had load
average 8, so CPU time rather than wall time), mean 2.91 ms; start-up and analysis ~10 s of CPU;
so 17,000 = the largest multiple of 1,000 with 3 x steps x 2.91 ms + 10 s <= 0.9 x 180 s. The
claim is therefore measured at 17,000 steps in ``fast``: the calibration run's only cycle began
at step ~16,400 and spiked at 17,289, with no second cycle in the 22,700 steps after it, so
``fast`` sees at most one cycle and s1 (>= 2) cannot hold at that scale; ``paper`` runs S13's
50,000 steps (whether two cycles fit in 50,000 steps on digits is open: seed 1 had one by 40,000).

Measured (``fast``, seed 0; two timed CLI runs: 168 s and 150 s of CPU, 296 s and 264 s wall at
load average 7-9 and 5.5-6 on the shared 2 cores; the same values both times):
0 cycles in every run, so s1 = 0 (< 2, fails), s2 = 0 (holds), s3 = 0 (fails: not measurable).
The ε = 1e-8 run was inside a growth phase when it ended: ``||W_U||`` 5.32 -> 9.52 over steps
14,000-17,000, trailing growth 9.7e-4/step at the last step (τ = 2e-4), training loss 3.5e-8,
no spike yet; ε = 1e-4 and SGD end flat (growth 3.6e-6 and 2.7e-6/step). Validation accuracy
ends at 0.935 / 0.939 / 0.937 (ε = 1e-8 / 1e-4 / SGD): no run groks (>= 0.95), so no g1.

Grokking run (``paper`` only; S13 "Grokking system", its reduced variant): per seed one run
``grok_adam_s{k}`` (run seed as the FCN runs of seed k), built by :func:`_grokking_run`:
modular addition ``a + b (mod 53)`` (``ModularArithmetic``, Power et al. table, 2,809 equations),
``train_fraction = 0.5`` (``round(2809 / 2) = 1404`` train, 1,405 validation), ``split_seed = 0``
(numpy ``RandomState(0)``, as the reference; the split is the same for every seed); a causal
1-layer transformer, d_model 128, 4 heads (d_head 32), MLP width 512 (4 × d_model, as a standard
block; S13 does not fix it), LayerNorm, learned positions, no attention biases (dynascope's
default; choice), predicting at every position with the loss read at the last one (after ``=``);
Adam (no weight decay) β = (0.9, 0.98), ε = 1e-8, lr 1e-3, 10-step linear warmup then constant;
batch ``min(512, ceil(1404 / 2)) = 512`` drawn without replacement each step; 100,000 steps
(S13's max_steps); ``log_every = 1`` and the ``last_layer_norm`` probe (``||W_U||_F``) every
step; ``val.accuracy`` every 50 steps (choice: the grok step is then known to 50 steps, while a
detected cycle lasts more than w = 100 steps, its end needing a spike-free trailing window of w
steps, so the error in g1's ratio is below 0.5 and small for cycles of thousands of steps) on
``eval_batches = 4`` fixed validation batches of 512 (2,048 draws, with repeats, from the 1,405
equations: an estimate of the validation accuracy); checkpoint every 10,000 steps;
``device = cuda`` (the paper preset is a GPU preset; the FCN runs stay on the CPU). Not built:
p = 97, the other train fractions and operations of S13's paper list.

The same detector (frozen constants) reads the grokking run. Arming: ``train.loss`` is then the
mean cross-entropy of one batch of 512, so the certificate is ``loss < ln 2 / b`` with
``b = min(n_train, batch_size)`` examples per training-loss row (``log_every = 1``): every
example of that batch is right, a proxy for 100 % training accuracy (for the full-batch FCN runs
b = n_train, as before). Caveat: a minibatch loss fluctuates from batch to batch, while the spike
baseline is the running minimum; a fluctuation alone is no cycle (growth before, plateau after
are also required). The run's cycles are reported in the tables and its own figure
(``grokking.png``); it is excluded from s1–s3, which stay FCN-only (runs are told apart by their
task: ``modular_arithmetic`` is the grokking system).

g1 with grokking runs present (``paper``): measured on them, not on the FCN. The grok step is
the first evaluation with ``val.accuracy >= 0.95`` (S13); measured = max over the grokking runs
that grokked of |grok step − nearest onset| / mean cycle length (threshold 1, as above); NaN,
and failed, when such a run has no cycle, or when no grokking run grokked (then it is reported,
unlike the FCN-only g1, since the grokking system exists to measure it). Without grokking runs
(``smoke``, ``fast``), g1 is the FCN check described under Verdicts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from dynascope.config import RunConfig, validate_config
from dynascope.probes.slingshot import SlingshotCycle, detect_slingshots, grok_step, onset_distance
from dynascope.report import new_figure, save_figure
from dynascope.store import Run
from dynascope.studies.base import Analysis, RunSpec, Study, Verdict, one_intra_op_thread
from dynascope.tasks.modular_arithmetic import equations
from dynascope.train import run_training

__all__ = ["DetectorConfig", "SlingshotPreset", "STUDY", "analyze", "build_runs", "run_cycles"]

CLAIM = (
    "Long after fitting the training set, Adam (small ε) enters repeating slingshot cycles: the "
    "last layer's norm grows fast, the training loss spikes, the norm levels off; a larger ε or "
    "plain SGD removes them."
)
SOURCE = (
    "Thilak, Littwin, Zhai, Saremi, Paiss, Susskind, 'The Slingshot Mechanism: An Empirical Study "
    "of Adaptive Optimizers and the Grokking Phenomenon', NeurIPS 2022 workshop HITY, "
    "arXiv 2206.04817"
)

# Frozen thresholds (S13's proposals; see the module docstring).
S1_MIN_CYCLES = 2.0
S2_MAX_CYCLES = 0.0
S3_MIN_GAP = 0.0
G1_MAX_LENGTHS = 1.0
GROK_ACCURACY = 0.95

# Losses below the unit roundoff of the run's dtype are rounding noise, not a baseline: in float32
# a per-example cross-entropy below 2^-24 rounds to 0 (log-sum-exp of 1 + tiny), so the mean
# loss moves in steps of ~2^-24 / n_train and reaches exact 0 (measured: calibration run, step
# 36,500). Against a 0 baseline every later rounding blip would be a "spike" (l > k * 0).
LOSS_FLOOR = {"float32": 2.0**-24, "float64": 2.0**-53}

# Frozen detector constants (calibrated once; see the module docstring).
SPIKE_FACTOR = 100.0
GROWTH_RATE = 2e-4
PLATEAU_RATE = 2e-4
WINDOW = 100


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


class SlingshotPreset(BaseModel):
    """A preset: the base run (Adam at ``adam_eps``, the slingshot condition), the controls, seeds,
    and optionally S13's grokking run (``paper`` only; see the module docstring).

    The detector's constants are not part of a preset: ``analyze`` reads only the stores and
    applies the frozen :class:`DetectorConfig`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    base: RunConfig
    adam_eps: float = Field(1e-8, gt=0, description="ε of the slingshot run")
    control_eps: list[float] = Field(default_factory=lambda: [1e-4], description="larger ε")
    sgd_lr: float = Field(0.1, gt=0)
    seeds: int = Field(1, ge=1, description="seeds per condition (seed, seed + 1, ...)")
    grokking: RunConfig | None = Field(
        None, description="S13's grokking run (modular arithmetic), one per seed; None: none"
    )


def _train_runner(
    config: RunConfig,
    run_dir: Path,
    *,
    progress: bool = False,
    device: str | None = None,
    resume: bool = False,
) -> None:
    """Train one run on one intra-op thread (restored afterwards).

    The FCN's matrices (at most 200 x 256 x 256 per product) are too small for intra-op
    parallelism: with two threads on a busy 2-core machine, the smoke run's backward pass was
    measured 10x slower than with one (thread hand-offs wait on a descheduled thread).
    """
    if device is not None:  # --device: the run's own default otherwise
        config = config.model_copy(update={"device": device})
    with one_intra_op_thread():
        run_training(config, run_dir, progress=progress, resume=resume)


# -- presets ----------------------------------------------------------------------------------
def _fcn_run(hidden: list[int], n_train: int, steps: int, eval_every: int) -> RunConfig:
    return validate_config(
        {
            "name": "slingshot",
            "model": {"name": "fcn", "hidden": hidden, "activation": "relu"},
            "task": {"name": "digits", "patch_size": 8, "n_train": n_train},
            "optimizer": {"name": "adam", "lr": 1e-3, "eps": 1e-8},
            "train": {
                "steps": steps,
                "batch_size": 1797 - n_train,  # >= both splits: full-batch train, whole val
                "log_every": 1,
                "eval_every": eval_every,
                "eval_batches": 1,
                "checkpoint_every": steps,
                "keep_checkpoints": 1,
            },
            "monitor": {"probes": ["last_layer_norm"], "schedule": "every", "every": 1},
        }
    )


def smoke() -> SlingshotPreset:
    """Plumbing only (seconds): FCN 64-32-32-10 on 50 digits, 500 steps, the 3 optimizers."""
    return SlingshotPreset(base=_fcn_run([32, 32], n_train=50, steps=500, eval_every=50))


# Fixed from measured step time before any fast run (see "Scale" in the module docstring).
FAST_STEPS = 17_000


def fast() -> SlingshotPreset:
    """<= 3 minutes on 2 CPU cores: the 3 FCN runs, FAST_STEPS steps each (S13: 50k)."""
    return SlingshotPreset(base=_fcn_run([256, 256], n_train=200, steps=FAST_STEPS, eval_every=100))


GROK_STEPS = 100_000  # S13: max_steps 1e5


def _grokking_run(steps: int = GROK_STEPS) -> RunConfig:
    """S13's reduced grokking variant: a + b mod 53, half the equations, a 1-layer transformer,
    Adam β = (0.9, 0.98) without weight decay (every choice: see the module docstring)."""
    p, train_fraction = 53, 0.5
    n_train = round(len(equations(p, "+")) * train_fraction)  # 1404
    return validate_config(
        {
            "name": "grok",
            "device": "cuda",
            "model": {
                "name": "transformer",
                "n_layers": 1,
                "d_model": 128,
                "n_heads": 4,
                "d_mlp": 512,
                "is_causal": True,
            },
            "task": {
                "name": "modular_arithmetic",
                "p": p,
                "op": "+",
                "train_fraction": train_fraction,
                "split_seed": 0,
            },
            "optimizer": {
                "name": "adam",
                "lr": 1e-3,
                "betas": [0.9, 0.98],
                "eps": 1e-8,
                "warmup_steps": 10,
                "lr_schedule": "constant",
            },
            "train": {
                "steps": steps,
                "batch_size": min(512, math.ceil(n_train / 2)),
                "log_every": 1,
                "eval_every": 50,
                "eval_batches": 4,
                "checkpoint_every": 10_000,
                "keep_checkpoints": 1,
            },
            "monitor": {"probes": ["last_layer_norm"], "schedule": "every", "every": 1},
        }
    )


def paper() -> SlingshotPreset:
    """S13's scale for the FCN: 50k steps, 3 seeds, an ε sweep; and the grokking run (g1).

    The FCN is tiny (launch-bound on a GPU), so it stays on the CPU: 15 runs of 50k steps. The
    grokking run (S13's reduced variant, one per seed, :func:`_grokking_run`) runs on the GPU,
    100,000 steps each; not run yet, so its step time is unmeasured.
    """
    return SlingshotPreset(
        base=_fcn_run([256, 256], n_train=200, steps=50_000, eval_every=100),
        control_eps=[1e-6, 1e-5, 1e-4],
        seeds=3,
        grokking=_grokking_run(),
    )


def _condition_name(optimizer: str, value: float, k: int) -> str:
    """``adam_eps1e-08_s0``: optimizer, ε or lr, and the seed's index ``k`` (not its value, so
    ``--seed`` moves the values and keeps the names)."""
    key = "eps" if optimizer == "adam" else "lr"
    return f"{optimizer}_{key}{value:g}_s{k}"


def build_runs(preset: SlingshotPreset, seed: int = 0) -> list[RunSpec]:
    """Per seed: Adam at ``adam_eps``, Adam at each ``control_eps``, SGD at ``sgd_lr``; and,
    when ``preset.grokking`` is set, the grokking run ``grok_adam_s{k}``.

    Every FCN run of one seed has the same init (the same run seed) and the same steps. The k-th
    seed's runs have run seed ``base.seed + seed + k`` and names ending in ``_s{k}``; the
    grokking run of seed k has the same run seed (its own model, task and steps).
    """
    base = preset.base.model_dump(mode="json")
    specs = []
    for k in range(preset.seeds):
        run_seed = preset.base.seed + seed + k
        conditions = [("adam", eps) for eps in (preset.adam_eps, *preset.control_eps)]
        conditions.append(("sgd", preset.sgd_lr))
        for optimizer, value in conditions:
            name = _condition_name(optimizer, value, k)
            overrides = [f"name={name}", f"seed={run_seed}", f"optimizer.name={optimizer}"]
            if optimizer == "adam":
                overrides.append(f"optimizer.eps={value}")
            else:
                overrides.append(f"optimizer.lr={value}")
            specs.append(RunSpec(name, validate_config(base, overrides), _train_runner))
        if preset.grokking is not None:
            name = f"grok_adam_s{k}"
            grok = validate_config(
                preset.grokking.model_dump(mode="json"), [f"name={name}", f"seed={run_seed}"]
            )
            specs.append(RunSpec(name, grok, _train_runner))
    return specs


# -- analysis ---------------------------------------------------------------------------------
GROKKING_TASK = "modular_arithmetic"  # the task that marks a run as the grokking system


def _examples_per_loss_row(config: dict) -> int:
    """``b``: training examples behind one ``train.loss`` row (``log_every = 1``): the smaller of
    the training split (``n_train``; for modular arithmetic ``round(N · train_fraction)``) and
    ``train.batch_size``; 1 when the task's training size is not known from its config."""
    task = config["task"]
    if "n_train" in task:
        n_train = int(task["n_train"])
    elif task.get("name") == GROKKING_TASK:
        n_train = round(len(equations(int(task["p"]), task["op"])) * task["train_fraction"])
    else:
        return 1
    return max(1, min(n_train, int(config.get("train", {}).get("batch_size", n_train))))


def _series(run: Run, key: str) -> tuple[np.ndarray, np.ndarray]:
    s = run.scalar(key)
    return s.index.to_numpy(dtype=np.int64), s.to_numpy(dtype=np.float64)


def run_cycles(
    run: Run, detector: DetectorConfig | None = None
) -> tuple[list[SlingshotCycle], dict[str, np.ndarray]]:
    """Slingshot cycles of one stored run, and the aligned series they were read from.

    Uses the steps (>= 1) where both ``train.loss`` and ``last_layer.norm`` were logged; the
    detector arms at the first step with ``train.loss < arm_loss_factor * ln 2 / b``, ``b`` the
    examples behind one loss row (``min(n_train, batch_size)``, from the run's config: the whole
    training set for the full-batch FCN, one minibatch for the grokking run) and sees the loss
    floored at :data:`LOSS_FLOOR` of the run's dtype (below it the loss is rounding noise; see
    the module docstring).

    Args:
        run: a stored run (``load_run``).
        detector: the detector constants; ``None`` for the frozen ones.
    Returns:
        ``(cycles, series)``, series ``{"steps", "norm", "loss"}``: ``[T]`` arrays (steps,
        ``||W_U||_F``, training loss in nats, unfloored); empty when the run logged neither key.
    """
    detector = detector or DetectorConfig()
    loss_steps, loss = _series(run, "train.loss")
    norm_steps, norm = _series(run, "last_layer.norm")
    steps, i_loss, i_norm = np.intersect1d(loss_steps, norm_steps, return_indices=True)
    series = {"steps": steps, "norm": norm[i_norm], "loss": loss[i_loss]}
    if steps.size < 2:
        return [], series
    n_examples = _examples_per_loss_row(run.config)
    armed = (series["loss"] < detector.arm_loss_factor * math.log(2) / n_examples).astype(float)
    floor = LOSS_FLOOR[run.config.get("dtype", "float32")]
    cycles = detect_slingshots(
        steps,
        series["norm"],
        np.maximum(series["loss"], floor),
        accuracy=armed,
        arm_accuracy=0.5,
        spike_factor=detector.spike_factor,
        growth_rate=detector.growth_rate,
        plateau_rate=detector.plateau_rate,
        window=detector.window,
    )
    return cycles, series


@dataclass
class _Measured:
    """One run as the analysis sees it."""

    name: str
    system: str  # "grokking" (modular arithmetic task) or "fcn" (every other run)
    optimizer: str  # "adam" (adam or adamw) or "sgd"
    value: float  # ε for Adam, lr for SGD
    seed: int
    cycles: list[SlingshotCycle]
    series: dict[str, np.ndarray]
    val_steps: np.ndarray
    val_acc: np.ndarray
    grok: int | None

    @classmethod
    def read(cls, name: str, run: Run, detector: DetectorConfig) -> _Measured:
        opt = run.config["optimizer"]
        is_adam = opt["name"] in ("adam", "adamw")
        cycles, series = run_cycles(run, detector)
        val_steps, val_acc = _series(run, "val.accuracy")
        grok = grok_step(val_steps, val_acc, threshold=GROK_ACCURACY) if val_steps.size else None
        return cls(
            name=name,
            system="grokking" if run.config["task"].get("name") == GROKKING_TASK else "fcn",
            optimizer="adam" if is_adam else opt["name"],
            value=float(opt["eps"] if is_adam else opt["lr"]),
            seed=int(run.config["seed"]),
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
            "status": status,
            "cycles": len(self.cycles),
            "onsets": ", ".join(str(c.start_step) for c in self.cycles) or "-",
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


def _median(values: list[float]) -> float:
    return float(np.median(values)) if values else math.nan


def analyze(
    runs: dict[str, Run], figures: Path, detector: DetectorConfig | None = None
) -> Analysis:
    """Verdicts s1–s3 from the FCN runs; g1 from the grokking runs when there are any, else
    when a smallest-ε FCN Adam run groks.

    Runs are told apart by their task (``modular_arithmetic``: the grokking system; every other
    run is an FCN run), not by their names. FCN runs are grouped by (optimizer, ε or lr, seed)
    read from their configs: the slingshot condition is the Adam run with the smallest ε, the
    control the one with the largest. Every run, grokking ones included, goes through the same
    detector and into the tables.

    Args:
        runs: run name -> stored run.
        figures: where the figures go.
        detector: the detector constants; ``None`` for the frozen ones.
    Returns:
        The verdicts, two figures (three with grokking runs) and two tables (per run; per
        detected cycle).
    """
    detector = detector or DetectorConfig()
    everything = [_Measured.read(name, run, detector) for name, run in sorted(runs.items())]
    measured = [m for m in everything if m.system == "fcn"]
    grokking = [m for m in everything if m.system == "grokking"]
    adam_values = sorted({m.value for m in measured if m.optimizer == "adam"})
    small = adam_values[0] if adam_values else math.nan
    large = adam_values[-1] if len(adam_values) > 1 else math.nan

    def counts(optimizer: str, value: float | None = None) -> dict[int, int]:
        return {
            m.seed: len(m.cycles)
            for m in measured
            if m.optimizer == optimizer and (value is None or math.isclose(m.value, value))
        }

    smallest, largest, sgd = counts("adam", small), counts("adam", large), counts("sgd")
    s1 = _median(list(smallest.values()))
    s2 = float(max(sgd.values())) if sgd else math.nan
    s3 = _median([smallest[s] - largest[s] for s in smallest if s in largest])
    listed = "; ".join(
        f"{m.name}: {len(m.cycles)} (final growth {m.final_growth(detector.window):.2g}/step)"
        for m in measured
    )
    verdicts = [
        Verdict(
            f"s1: Adam ε = {small:g} enters repeating slingshot cycles after fitting the "
            "training set",
            "detected cycles of the smallest-ε Adam run (median over seeds)",
            s1,
            S1_MIN_CYCLES,
            bool(s1 >= S1_MIN_CYCLES),
            f"measured >= threshold; cycles per run (and the trailing growth rate of log ‖W_U‖ "
            f"at the last step, τ = {detector.growth_rate:g}): {listed}",
        ),
        Verdict(
            "s2: plain SGD shows no slingshot cycle",
            "detected cycles of the SGD run (max over seeds)",
            s2,
            S2_MAX_CYCLES,
            bool(s2 <= S2_MAX_CYCLES),
            "measured <= threshold",
        ),
        Verdict(
            f"s3: a larger Adam ε ({large:g}) gives fewer cycles",
            f"cycles(ε = {small:g}) − cycles(ε = {large:g}) (median over seeds)",
            s3,
            S3_MIN_GAP,
            bool(s3 > S3_MIN_GAP),
            "measured > threshold"
            + ("; no cycle in either condition: not measurable at this scale" if not s1 else ""),
        ),
    ]
    if grokking:  # the grokking system: g1 is measured on it, grokked or not
        verdicts.append(_g1_grokking(grokking))
        grokked = []
    else:
        grokked = [
            m
            for m in measured
            if m.optimizer == "adam" and math.isclose(m.value, small) and m.grok is not None
        ]
    if grokked:  # FCN only: g1 is checked when grokking occurs
        ratios = [m.grok_ratio for m in grokked]
        g1 = math.nan if any(math.isnan(r) for r in ratios) else max(ratios)
        verdicts.append(
            Verdict(
                f"g1: grokking (val accuracy >= {GROK_ACCURACY}) happens within one cycle length "
                "of a cycle onset",
                "max over grokking smallest-ε runs of |grok step − nearest onset| / mean cycle "
                "length (NaN: a run grokked without a cycle)",
                g1,
                G1_MAX_LENGTHS,
                bool(g1 <= G1_MAX_LENGTHS),
                f"measured <= threshold; {len(grokked)} run(s) grokked",
            )
        )
    run_rows = [m.row(runs[m.name].status, detector.window) for m in measured + grokking]
    tables = {"runs: cycles, final values, grok step": run_rows}
    cycle_rows = [row for m in measured + grokking for row in m.cycle_rows()]
    if cycle_rows:
        tables["detected cycles"] = cycle_rows
    paths = _figures(measured, figures) if measured else []
    if grokking:
        paths.append(_grokking_figure(grokking, figures))
    return Analysis(verdicts, paths, tables)


def _g1_grokking(grokking: list[_Measured]) -> Verdict:
    """g1 on the grokking runs: max over those that grokked of |grok step − nearest onset| /
    mean cycle length; NaN (failed) if one grokked without a cycle or none grokked."""
    grokked = [m for m in grokking if m.grok is not None]
    ratios = [m.grok_ratio for m in grokked]
    g1 = math.nan if not ratios or any(math.isnan(r) for r in ratios) else max(ratios)
    per_run = "; ".join(
        f"{m.name}: grok step {m.grok if m.grok is not None else '-'}, "
        f"{len(m.cycles)} cycles (onsets {', '.join(str(c.start_step) for c in m.cycles) or '-'})"
        f", ratio {m.grok_ratio:.3g}"
        for m in grokking
    )
    if not grokked:
        note = "no grokking run reached it: not measurable"
    else:
        note = f"{len(grokked)} of {len(grokking)} grokking run(s) grokked"
    return Verdict(
        f"g1: grokking (val accuracy >= {GROK_ACCURACY}) happens within one cycle length of a "
        "cycle onset (grokking system: modular addition, transformer, Adam)",
        "max over the grokking runs that grokked of |grok step − nearest onset| / mean cycle "
        "length (NaN: a run grokked without a cycle, or none grokked)",
        g1,
        G1_MAX_LENGTHS,
        bool(g1 <= G1_MAX_LENGTHS),
        f"measured <= threshold; {note}; {per_run}",
    )


def _figures(measured: list[_Measured], figures: Path) -> list[Path]:
    """Norm and loss per run (cycles shaded, spikes dotted); validation accuracy (first seed)."""
    seed0 = min((m.seed for m in measured), default=0)  # FCN runs only
    shown = sorted(  # Adam by ascending ε, then SGD
        (m for m in measured if m.seed == seed0), key=lambda m: (m.optimizer != "adam", m.value)
    )
    ncols = max(1, len(shown))
    fig, axes = new_figure(
        ncols,
        2,
        width=3.6,
        height=2.8,
        title=f"last-layer norm and training loss (seed {seed0}); shaded: detected cycles, "
        "dotted: spike",
    )
    for j, m in enumerate(shown):
        top, bottom = axes[j], axes[ncols + j]
        top.plot(m.series["steps"], m.series["norm"], lw=0.8)
        bottom.semilogy(m.series["steps"], np.maximum(m.series["loss"], 1e-12), lw=0.6)
        for ax in (top, bottom):
            for c in m.cycles:
                ax.axvspan(c.start_step, c.end_step, color="tab:orange", alpha=0.25, lw=0)
                ax.axvline(c.spike_step, color="tab:red", ls=":", lw=0.8)
        top.set(title=f"{m.name} ({len(m.cycles)} cycles)", xlabel="step", ylabel="‖W_U‖_F")
        bottom.set(xlabel="step", ylabel="train loss (nats, floor 1e-12)")
    paths = [save_figure(fig, figures / "norm_loss.png")]

    fig, (ax,) = new_figure(1, width=5.0, height=3.2, title=f"validation accuracy (seed {seed0})")
    for m in shown:
        (line,) = ax.plot(m.val_steps, m.val_acc, lw=1, label=m.name)
        for c in m.cycles:
            ax.axvline(c.start_step, color=line.get_color(), ls="--", lw=0.8)
    ax.axhline(GROK_ACCURACY, color="grey", ls=":", lw=1)
    ax.set(xlabel="step", ylabel="val accuracy", title="dashed: cycle onsets; dotted: 0.95")
    ax.legend()
    paths.append(save_figure(fig, figures / "val_accuracy.png"))
    return paths


def _grokking_figure(grokking: list[_Measured], figures: Path) -> Path:
    """Per grokking run: norm, training loss, validation accuracy; cycles shaded, spikes dotted,
    the grok step a dashed green line."""
    ncols = len(grokking)
    fig, axes = new_figure(
        ncols,
        3,
        width=4.4,
        height=2.6,
        title="grokking system: ‖W_U‖, train loss, val acc\n"
        "shaded: cycles, dotted: spike, dashed: grok",
    )
    for j, m in enumerate(grokking):
        top, middle, bottom = axes[j], axes[ncols + j], axes[2 * ncols + j]
        top.plot(m.series["steps"], m.series["norm"], lw=0.8)
        middle.semilogy(m.series["steps"], np.maximum(m.series["loss"], 1e-12), lw=0.6)
        bottom.plot(m.val_steps, m.val_acc, lw=1)
        bottom.axhline(GROK_ACCURACY, color="grey", ls=":", lw=1)
        for ax in (top, middle, bottom):
            for c in m.cycles:
                ax.axvspan(c.start_step, c.end_step, color="tab:orange", alpha=0.25, lw=0)
                ax.axvline(c.spike_step, color="tab:red", ls=":", lw=0.8)
            if m.grok is not None:
                ax.axvline(m.grok, color="tab:green", ls="--", lw=1)
        grok = m.grok if m.grok is not None else "-"
        top.set(title=f"{m.name} ({len(m.cycles)} cycles, grok {grok})", ylabel="‖W_U‖_F")
        middle.set(ylabel="train loss (nats, floor 1e-12)")
        bottom.set(xlabel="step", ylabel="val accuracy")
    return save_figure(fig, figures / "grokking.png")


STUDY = Study(
    name="slingshot",
    claim=CLAIM,
    source=SOURCE,
    presets={"smoke": smoke, "fast": fast, "paper": paper},
    build_runs=build_runs,
    analyze=analyze,
)
