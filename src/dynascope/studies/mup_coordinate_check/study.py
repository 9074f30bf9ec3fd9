"""Study ``mup-coordinate-check`` (SYSTEMS.md S9): under muP activations stay Θ(1) with width.

Notes (system, verdicts, calibration): docs/studies/mup-coordinate-check.md.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from dynascope.studies.base import RunSpec, Study
from dynascope.train import Loop

from .analysis import analyze
from .protocol import PROTOCOL
from .runs import CoordRun, OptimizerName, build_coord, build_lr_transfer

__all__ = ["STUDY", "CLAIM", "CoordSweep", "MupCoordCheckPreset", "build_runs", "sweep_name"]

CLAIM = (
    "Under muP, each layer's activations stay Θ(1) as the width grows when training with Adam; "
    "under the standard parametrization the logits grow roughly ∝ width."
)
SOURCE = (
    "Yang & Littwin, 'Tensor Programs IVb: Adaptive Optimization in the Infinite-Width Limit', "
    "arXiv 2308.01814; microsoft/mup"
)


class CoordSweep(BaseModel):
    """One coordinate check (or learning-rate sweep) over widths and seeds: its runs are one
    :class:`~.runs.CoordRun` per width and seed (per width and lr for ``lr_transfer``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["coord", "lr_transfer"] = "coord"
    parametrization: Literal["standard", "ntk", "mup"]
    optimizer: OptimizerName = "adam"
    widths: list[int] = Field(min_length=2, description="hidden widths, ascending")
    base_width: int = Field(64, ge=1, description="muP/NTK base width w0 (m = w / w0)")
    depth: int = Field(2, ge=1, description="hidden layers")
    nseeds: int = Field(3, ge=1)
    nsteps: int = Field(3, ge=2, description="forward passes; nsteps - 1 updates")
    batch_size: int = Field(128, ge=1)
    lr: float = Field(1e-2, gt=0, description="learning rate at the base width")
    eps_scaling: Literal["none", "width"] = "none"
    readout_init: Literal["zero", "default"] = "zero"
    lrs: list[float] = Field(default_factory=list, description="lr_transfer: the lr grid")
    train_steps: int = Field(1, ge=1, description="lr_transfer: minibatch steps per (w, lr)")


class MupCoordCheckPreset(BaseModel):
    """A preset: the gated Adam checks, c3's SignSGD checks, extras (paper only)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sp: CoordSweep
    mup: CoordSweep
    c3: list[CoordSweep]
    extras: list[CoordSweep] = Field(default_factory=list)


def _pair(**common) -> tuple[CoordSweep, CoordSweep]:
    return (
        CoordSweep(parametrization="standard", **common),
        CoordSweep(parametrization="mup", **common),
    )


def _c3(widths: list[int], nseeds: int, batch_size: int, nsteps: int) -> list[CoordSweep]:
    common = dict(
        optimizer="signsgd",
        widths=widths,
        depth=1,
        nseeds=nseeds,
        nsteps=nsteps,
        batch_size=batch_size,
        lr=1e-2,
    )
    return [
        CoordSweep(parametrization="ntk", **common),
        CoordSweep(parametrization="mup", **common),
    ]


def smoke() -> MupCoordCheckPreset:
    """Seconds: widths {32, 256} (the 8x span the verdicts presuppose), 3 seeds, batch 16."""
    sp, mup = _pair(widths=[32, 256], nseeds=3, nsteps=3, batch_size=16)
    return MupCoordCheckPreset(sp=sp, mup=mup, c3=_c3([32, 256], 3, 16, 3))


def fast() -> MupCoordCheckPreset:
    """S09's fast preset: widths 64..2048, 5 seeds, 3 steps, Adam lr 1e-2, batch 128."""
    widths = [64, 128, 256, 512, 1024, 2048]
    sp, mup = _pair(widths=widths, nseeds=5, nsteps=3, batch_size=128)
    return MupCoordCheckPreset(sp=sp, mup=mup, c3=_c3(widths, 5, 128, 11))


def paper() -> MupCoordCheckPreset:
    """Widths 2^7..2^13, 5 seeds; SGD/AdamW checks, ε scaling, learning-rate transfer."""
    widths = [2**k for k in range(7, 14)]
    common = dict(widths=widths, nseeds=5, nsteps=3, batch_size=128)
    sp, mup = _pair(**common)
    extras = [
        *_pair(**{**common, "optimizer": "sgd", "lr": 0.1}),
        *_pair(**{**common, "optimizer": "adamw"}),
        CoordSweep(parametrization="mup", eps_scaling="width", **common),
    ]
    lrs = [10.0**k for k in np.arange(-4.0, -0.49, 0.5)]
    for parametrization in ("standard", "mup"):
        extras.append(
            CoordSweep(
                kind="lr_transfer",
                parametrization=parametrization,
                widths=[64, 128, 256, 512, 1024, 2048],
                nseeds=1,
                lrs=[float(lr) for lr in lrs],
                train_steps=500,
                batch_size=64,
            )
        )
    return MupCoordCheckPreset(sp=sp, mup=mup, c3=_c3(widths, 5, 128, 11), extras=extras)


def sweep_name(sweep: CoordSweep) -> str:
    """``coord_standard_adam``, ``coord_mup_signsgd_c3``, ``lr_transfer_mup_adam``, ..."""
    name = f"{sweep.kind}_{sweep.parametrization}_{sweep.optimizer}"
    name += "_eps-width" if sweep.eps_scaling == "width" else ""
    return name + ("_c3" if sweep.optimizer == "signsgd" else "")


def _member(sweep: CoordSweep, width: int, seed: int, lr: float, steps: int) -> CoordRun:
    fields = sweep.model_dump(exclude={"widths", "nseeds", "nsteps", "lrs", "train_steps", "lr"})
    loop = Loop(steps=steps, log_every=1, eval_every=steps)
    return CoordRun(**fields, width=width, seed=seed, lr=lr, loop=loop)


def build_runs(preset: MupCoordCheckPreset, seed: int = 0) -> list[RunSpec]:
    """One run per (sweep, width, seed); a width's seeds (a transfer sweep's lrs) are one group.

    Names: ``<sweep>_w<width>_s<i>`` (run seed ``seed + i``); ``<sweep>_w<width>_lr<i>`` for
    learning-rate transfer.
    """
    specs = []
    for sweep in (preset.sp, preset.mup, *preset.c3, *preset.extras):
        name = sweep_name(sweep)
        for width in sweep.widths:
            group = f"{name}_w{width}"
            if sweep.kind == "lr_transfer":
                for i, lr in enumerate(sweep.lrs):
                    config = _member(sweep, width, seed, lr, sweep.train_steps)
                    specs.append(RunSpec(f"{group}_lr{i}", config, build_lr_transfer, group=group))
                continue
            for i in range(sweep.nseeds):
                config = _member(sweep, width, seed + i, sweep.lr, sweep.nsteps - 1)
                specs.append(RunSpec(f"{group}_s{i}", config, build_coord, group=group))
    return specs


STUDY = Study(
    name="mup-coordinate-check",
    claim=CLAIM,
    source=SOURCE,
    presets={"smoke": smoke, "fast": fast, "paper": paper},
    build_runs=build_runs,
    analyze=analyze,
    protocol=PROTOCOL,
)
