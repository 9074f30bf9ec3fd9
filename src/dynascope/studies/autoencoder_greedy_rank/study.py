"""The ``autoencoder-greedy-rank`` study: presets and runs (notes:
docs/studies/autoencoder-greedy-rank.md)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from dynascope.studies.base import RunSpec, Study
from dynascope.studies.engine_runs import engine_runner
from dynascope.train import Loop

from .analysis import analyze
from .runs import AutoencoderRun, build_autoencoder

__all__ = ["CLAIM", "SOURCE", "STUDY", "AutoencoderGreedyRankPreset", "build_runs"]

CLAIM = (
    "A stack of linear layers at an autoencoder's bottleneck makes the latent code be learnt "
    "greedily, one rank at a time, largest variance first, settling at the true latent rank."
)
SOURCE = (
    "Sun, Thilak, Littwin, Saremi, Susskind, 'Implicit Greedy Rank Learning in Autoencoders "
    "via Overparameterized Linear Networks', ICML 2021 workshop, arXiv 2107.01301"
)


class AutoencoderGreedyRankPreset(BaseModel):
    """A preset: the base run, the depths, the greedy and control scales, seeds per arm."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base: AutoencoderRun
    depths: list[int] = Field(min_length=1, description="L of the orthogonal runs (0: no stack)")
    greedy_scale: float = Field(0.5, gt=0, description="s of the orthogonal stacks judged")
    control_scale: float = Field(1.0, gt=0, description="s of the control stacks (no prior)")
    control_depth: int = Field(8, ge=1, description="L of the default-init run (r4)")
    seeds: int = Field(3, ge=1, description="independent seeds per configuration")


def _loop(steps: int) -> Loop:
    every = max(steps // 5, 1)
    return Loop(steps=steps, log_every=min(100, steps), checkpoint_every=every, dtype="float64")


def smoke() -> AutoencoderGreedyRankPreset:
    """Plumbing only (seconds): N = 200, 200 steps, L in {0, 2}, 3 seeds."""
    base = AutoencoderRun(
        loop=_loop(200), n_train=200, n_heldout=100, log_points=20, mode_points=100
    )
    return AutoencoderGreedyRankPreset(base=base, depths=[0, 2], control_depth=2)


def fast() -> AutoencoderGreedyRankPreset:
    """S15's CPU study: L in {0, 2, 4, 8} at s = 0.5 and s = 1, L = 8 default, 3 seeds, 10k steps.

    10k steps, not S15's 5k: at 5k one L = 8, s = 0.5 run (seed 1) still sat on PC5's plateau
    (loss 0.955), so the runs had not settled; t_5 at L = 8 was 2.5k-4k steps.
    """
    return AutoencoderGreedyRankPreset(base=AutoencoderRun(loop=_loop(10_000)), depths=[0, 2, 4, 8])


def paper() -> AutoencoderGreedyRankPreset:
    """S15's larger sweep: L in 0..16 at s in {0.5, 1}, 5 seeds, 20k steps (CPU: 32 x 32 maps).

    S15's nonlinear autoencoder on ``load_digits`` is not part of this preset yet.
    """
    base = AutoencoderRun(loop=_loop(20_000), log_points=200)
    return AutoencoderGreedyRankPreset(base=base, depths=list(range(17)), seeds=5)


def build_runs(preset: AutoencoderGreedyRankPreset, seed: int = 0) -> list[RunSpec]:
    """Per seed: L = 0; each L > 0 orthogonal at ``greedy_scale`` and ``control_scale``; default
    init at L = 0 and ``control_depth``. Runs of one depth train as one ensemble."""
    runner = engine_runner(build_autoencoder)
    specs = []
    for k in range(preset.seeds):
        base = preset.base.model_copy(update={"seed": preset.base.seed + seed + k})
        scales = (preset.greedy_scale, preset.control_scale)
        arms = [(L, "orthogonal", s) for L in preset.depths if L > 0 for s in scales]
        arms += [(0, "orthogonal", preset.greedy_scale), (0, "default", 1.0)]
        arms += [(preset.control_depth, "default", 1.0)]
        for L, init, s in arms:
            tag = "default" if init == "default" else ("orth" if L == 0 else f"orth_s{s:g}")
            cfg = base.model_copy(update={"n_stack": L, "init": init, "init_scale": s})
            specs.append(RunSpec(f"L{L}_{tag}_seed{k}", cfg, runner, group=f"L{L}"))
    return specs


STUDY = Study(
    name="autoencoder-greedy-rank",
    claim=CLAIM,
    source=SOURCE,
    presets={"smoke": smoke, "fast": fast, "paper": paper},
    build_runs=build_runs,
    analyze=analyze,
)
