"""Study ``slingshot`` (S13): presets and runs. Notes: ``docs/studies/slingshot.md``."""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

from dynascope.config import RunConfig, validate_config
from dynascope.studies.base import RunSpec, Study
from dynascope.tasks.modular_arithmetic import equations
from dynascope.train import Loop, build_registry

from .analysis import analyze
from .protocol import PROTOCOL, SEEDS
from .runs import FcnRun, build

__all__ = [
    "CLAIM",
    "FAST_STEPS",
    "FULL_STEPS",
    "GROK_STEPS",
    "SOURCE",
    "STUDY",
    "SlingshotPreset",
    "build_runs",
]

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


class SlingshotPreset(BaseModel):
    """A preset: the FCN (``hidden``, ``n_train``), the loop, the conditions and the seeds.

    Each condition's seeds train as one ensemble (one ``group``; ``ensemble_size`` splits it
    into several, so that ``--executor process`` can spread a condition over cores): Adam at
    ``adam_eps`` (the slingshot condition), Adam at each ``control_eps``, SGD at ``sgd_lr``;
    with ``float64`` the slingshot condition again in float64 (is a cycle a float32
    artefact?). ``grokking``: S13's grokking run, one per seed (``paper``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    loop: Loop
    hidden: tuple[int, ...] = (64, 64)
    n_train: int = Field(200, ge=10)
    adam_eps: float = Field(1e-8, gt=0, description="ε of the slingshot run")
    control_eps: list[float] = Field(default_factory=lambda: [1e-4], description="larger ε")
    sgd_lr: float = Field(0.1, gt=0)
    seeds: int = Field(SEEDS["fast"], ge=1, description="seeds per condition (seed, seed + 1, ...)")
    float64: bool = Field(False, description="also the slingshot condition in float64")
    ensemble_size: int | None = Field(
        None,
        ge=1,
        description="most seeds per ensemble (a condition's seeds split in order); "
        "None: one ensemble per condition",
    )
    grokking: RunConfig | None = Field(
        None, description="S13's grokking run (modular arithmetic), one per seed; None: none"
    )


def _loop(steps: int, eval_every: int) -> Loop:
    # log_every 10: train.loss and ||W_U|| are 10-step means (a spike of one step at ~10 nats
    # over a ~1e-8 baseline stays ~1e8x above it); a checkpoint mid-way, at most 10k apart
    return Loop(
        steps=steps,
        log_every=10,
        eval_every=eval_every,
        checkpoint_every=min(steps // 2, 10_000),
        keep_checkpoints=1,
    )


def smoke() -> SlingshotPreset:
    """Plumbing only (seconds): FCN 64-32-32-10 on 50 digits, 500 steps, 3 seeds (too few
    for a verdict: inconclusive)."""
    return SlingshotPreset(loop=_loop(500, 50), hidden=(32, 32), n_train=50, seeds=SEEDS["smoke"])


# Fixed before seeds 0-2 and 1000-1002 ran at this length (docs/studies/slingshot.md, "fast at
# 50k steps"): the calibration seeds' (10000-10002) second spikes came at 43.8-44.2k steps;
# 44.2k + 10 % rounds up to 50k; on an idle 2-core machine the 18k-step preset took 60 s, so
# 50k steps cost ~150 s.
FAST_STEPS = 50_000


def fast() -> SlingshotPreset:
    """FCN 64-64-64-10, 3 conditions x 5 seeds, FAST_STEPS (room for two cycles on the
    calibration seeds); ~215 s expected on 2 idle CPU cores (protocol: over the 3-minute goal)."""
    return SlingshotPreset(loop=_loop(FAST_STEPS, 500), seeds=SEEDS["fast"])


# full, sized on calibration seeds 20000-20009 before any evaluation seed ran at it
# (docs/studies/slingshot.md, "`full`"): their second cycles ended by 45.1k steps, and 2 of
# 10 never had one by 70k, so the budget is S13's 60k (33 % over 45.1k) and s1's rate needs
# seeds: at a rate of 0.8, 24 seeds hold its Wilson interval above 0.5 with probability 0.91.
# Ensembles of 12: six equal tasks for two workers (K = 24 costs ~9.3 ms CPU a step).
FULL_STEPS = 60_000


def full() -> SlingshotPreset:
    """fast's FCN and conditions for 60,000 steps, 24 seeds per condition in ensembles of 12;
    meant for `--executor process --workers 2` (two cores)."""
    return SlingshotPreset(loop=_loop(FULL_STEPS, 500), seeds=SEEDS["full"], ensemble_size=12)


GROK_STEPS = 100_000  # S13: max_steps 1e5


def _grokking_run(steps: int = GROK_STEPS) -> RunConfig:
    """S13's reduced grokking variant: a + b mod 53, half the equations, a 1-layer transformer,
    Adam β = (0.9, 0.98) without weight decay (every choice: docs/studies/slingshot.md)."""
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
    """S13's FCN (64-256-256-10) for 60k steps, 5 seeds, an ε sweep, the float64 control; and
    the grokking run (g1, on the GPU)."""
    return SlingshotPreset(
        loop=_loop(60_000, 100),
        hidden=(256, 256),
        control_eps=[1e-6, 1e-5, 1e-4],
        float64=True,
        grokking=_grokking_run(),
        seeds=SEEDS["paper"],
    )


def _condition_name(optimizer: str, value: float, k: int, dtype: str = "float32") -> str:
    """``adam_eps1e-08_s0``: optimizer, ε or lr, and the seed's index ``k`` (not its value, so
    ``--seed`` moves the values and keeps the names); ``_f64`` for a float64 run."""
    key = "eps" if optimizer == "adam" else "lr"
    suffix = "_f64" if dtype == "float64" else ""
    return f"{optimizer}_{key}{value:g}{suffix}_s{k}"


def build_runs(preset: SlingshotPreset, seed: int = 0) -> list[RunSpec]:
    """Per condition, one ensemble of ``preset.seeds`` members (run seeds ``seed + k``; with
    ``ensemble_size``, ensembles of that many, groups ``{condition}_e{i}``); every condition's
    member k has the same init. With ``preset.grokking``, per seed the grokking
    run at ``adam_eps`` (``grok_adam_s{k}``) and its ablation at the largest control ε
    (``grok_adam_eps{ε:g}_s{k}``, g1's control: cycles removed, same init and data)."""
    conditions = [("adam", eps, "float32") for eps in (preset.adam_eps, *preset.control_eps)]
    conditions.append(("sgd", preset.sgd_lr, "float32"))
    if preset.float64:
        conditions.append(("adam", preset.adam_eps, "float64"))
    specs, size = [], preset.ensemble_size
    for optimizer, value, dtype in conditions:
        loop = preset.loop.model_copy(update={"dtype": dtype})
        condition = _condition_name(optimizer, value, 0, dtype).removesuffix("_s0")
        for k in range(preset.seeds):
            group = condition if size is None else f"{condition}_e{k // size}"
            config = FcnRun(
                seed=seed + k,
                loop=loop,
                hidden=preset.hidden,
                n_train=preset.n_train,
                optimizer=optimizer,
                **({"eps": value} if optimizer == "adam" else {"lr": value}),
            )
            specs.append(RunSpec(_condition_name(optimizer, value, k, dtype), config, build, group))
    if preset.grokking is not None:
        ablation = max(preset.control_eps, default=None)
        for eps, prefix in (
            (preset.adam_eps, "grok_adam"),
            (ablation, f"grok_adam_eps{ablation:g}"),
        ):
            if eps is None:
                continue
            for k in range(preset.seeds):
                name = f"{prefix}_s{k}"
                overrides = [f"name={name}", f"seed={seed + k}", f"optimizer.eps={eps}"]
                grok = validate_config(preset.grokking.model_dump(mode="json"), overrides)
                specs.append(RunSpec(name, grok, build_registry))
    return specs


STUDY = Study(
    name="slingshot",
    claim=CLAIM,
    source=SOURCE,
    presets={"smoke": smoke, "fast": fast, "full": full, "paper": paper},
    build_runs=build_runs,
    analyze=analyze,
    protocol=PROTOCOL,
)
