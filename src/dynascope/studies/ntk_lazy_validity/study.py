"""The ``ntk-lazy-validity`` study: presets and runs (notes: docs/studies/ntk-lazy-validity.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from dynascope.studies.base import RunSpec, Study
from dynascope.train import Loop

from .analysis import analyze
from .protocol import PROTOCOL
from .runs import LazyRun, build_lazy

__all__ = ["CLAIM", "SOURCE", "STUDY", "NTKLazyValidityPreset", "build_runs"]

CLAIM = (
    "An alpha-scaled model trained on the square loss stays within D(alpha, T) <= C T / alpha "
    "of its linearization: D falls at least like 1/alpha, and the alpha needed to keep D below a "
    "tolerance grows at most linearly in T (alpha = O(T) suffices, not O(T^2))."
)
SOURCE = (
    "Boix-Adserà & Littwin, 'Tight conditions for when the NTK approximation is valid', "
    "TMLR 2023, arXiv 2305.13141"
)


class NTKLazyValidityPreset(BaseModel):
    """A preset: the base run (its alphas), T, the centerings, the eta/2 check, seeds; every
    seed also trains the uncentered net (``centering = none``), n1's ablation control."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base: LazyRun
    horizon: float = Field(50.0, gt=0, description="T, in units of t = eta * step")
    centerings: list[Literal["antisymmetric", "offset"]] = Field(
        default_factory=lambda: ["antisymmetric", "offset"], min_length=1
    )
    eta_check_alpha: float | None = Field(None, description="alpha of the eta/2 run (None: none)")
    seeds: int = Field(5, ge=1, description="seeds per arm (fast and paper: >= 5)")


def _loop(steps: int) -> Loop:
    return Loop(steps=steps, log_every=min(100, steps), checkpoint_every=max(steps // 5, 1),
                dtype="float64")  # fmt: skip


ALPHAS = [4.0, 8.0, 16.0, 32.0, 64.0, 128.0]


def smoke() -> NTKLazyValidityPreset:
    """Seconds: width 16, N = 8, alpha in {8, 16, 32}, 100 steps (T = 1), 3 seeds."""
    base = LazyRun(loop=_loop(100), width=16, n_train=8, alphas=[8.0, 16.0, 32.0],
                   kernel_points=3)  # fmt: skip
    return NTKLazyValidityPreset(base=base, horizon=1.0, seeds=3)


def fast() -> NTKLazyValidityPreset:
    """S11's system: 6 alphas x 5,000 steps (T = 50) per centering and for the uncentered
    control, 5 seeds."""
    return NTKLazyValidityPreset(base=LazyRun(loop=_loop(5000), alphas=ALPHAS))


FULL_HORIZON = (
    100.0  # T at full: GD fits further past the fit bar (docs/studies/ntk-lazy-validity.md)
)


def full() -> NTKLazyValidityPreset:
    """fast's system trained twice as long, T = 100 (10,000 steps), so that every arm clears
    the fit bar with margin: 6 alphas per centering and the uncentered control, 5 seeds."""
    return NTKLazyValidityPreset(base=LazyRun(loop=_loop(5000), alphas=ALPHAS),
                                 horizon=FULL_HORIZON)  # fmt: skip


def paper() -> NTKLazyValidityPreset:
    """S11 at scale: width 1024, alpha up to 1024 on a x2 grid, T = 500, 5 seeds, and the
    gradient-flow check (eta/2, twice the steps, alpha = 32)."""
    base = LazyRun(loop=_loop(50_000), width=1024, kernel_points=30,
                   alphas=[4.0 * 2**k for k in range(9)])  # fmt: skip
    return NTKLazyValidityPreset(base=base, horizon=500.0, seeds=5, eta_check_alpha=32.0)


def build_runs(preset: NTKLazyValidityPreset, seed: int = 0) -> list[RunSpec]:
    """Per seed, one run per centering and one uncentered (``s{k}_none``, n1's control; all
    alphas batched, steps = T / eta); then the eta/2 run (first centering, alpha =
    ``eta_check_alpha``, 2 T / eta steps) when asked."""
    base = preset.base
    steps = int(round(preset.horizon / base.lr))
    specs = []
    for s in range(preset.seeds):
        for centering in (*preset.centerings, "none"):
            cfg = base.model_copy(update={"seed": base.seed + seed + s, "loop": _loop(steps),
                                          "centering": centering})  # fmt: skip
            specs.append(RunSpec(f"s{s}_{centering}", cfg, build_lazy))
    if preset.eta_check_alpha is not None:
        update = {
            "seed": base.seed + seed,
            "lr": base.lr / 2,
            "loop": _loop(2 * steps),
            "alphas": [preset.eta_check_alpha],
            "centering": preset.centerings[0],
        }
        specs.append(RunSpec("eta_half", base.model_copy(update=update), build_lazy))
    return specs


STUDY = Study(
    name="ntk-lazy-validity",
    claim=CLAIM,
    source=SOURCE,
    presets={"smoke": smoke, "fast": fast, "full": full, "paper": paper},
    build_runs=build_runs,
    analyze=analyze,
    protocol=PROTOCOL,
)
