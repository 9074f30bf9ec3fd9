"""The ``autoencoder-greedy-rank`` study: presets and runs (notes:
docs/studies/autoencoder-greedy-rank.md)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from dynascope.studies.base import RunSpec, Study
from dynascope.train import Loop

from .analysis import GREEDY_DEPTHS, analyze
from .protocol import PROTOCOL
from .runs import AutoencoderRun, build_autoencoder
from .theory import greedy_init_scale

__all__ = ["CLAIM", "SOURCE", "STUDY", "AutoencoderGreedyRankPreset", "build_runs", "greedy_scale"]

CLAIM = (
    "A stack of linear layers at an autoencoder's bottleneck makes the latent code be learnt "
    "greedily, one rank at a time, largest variance first, settling at the true latent rank."
)
SOURCE = (
    "Sun, Thilak, Littwin, Saremi, Susskind, 'Implicit Greedy Rank Learning in Autoencoders "
    "via Overparameterized Linear Networks', ICML 2021 workshop, arXiv 2107.01301"
)


class AutoencoderGreedyRankPreset(BaseModel):
    """A preset: the base run, the depths, how the greedy scale is chosen, seeds per arm."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base: AutoencoderRun
    depths: list[int] = Field(min_length=1, description="L of the orthogonal runs (0: no stack)")
    overlap_target: float = Field(
        0.05, gt=0, lt=0.5, description="theory's overlap that fixes each depth's s (judged arm)"
    )
    control_scale: float = Field(1.0, gt=0, description="s of the control stacks (no prior)")
    depth_scale: float = Field(0.5, gt=0, description="one s at every depth (claim d's arm)")
    control_depth: int = Field(8, ge=1, description="L of the default-init run (r4)")
    quiet_noise: float = Field(
        0.01, ge=0, description="noise std of r3's runs (S15's data: L = 0 and the deepest stack)"
    )
    flat_variance: float = Field(
        3.0, gt=0, description="o's control data: every signal variance set to this value"
    )
    seeds: int = Field(5, ge=1, description="independent seeds per configuration")


def greedy_scale(preset: AutoencoderGreedyRankPreset, n_stack: int) -> float:
    """The judged arm's s at depth L: the largest s whose balanced-stack theory predicts that the
    next mode is at most ``overlap_target`` when a mode is half learnt, for the data's closest
    pair of variances (:func:`~.theory.greedy_init_scale`)."""
    v = sorted(preset.base.variances, reverse=True)
    rho = max((b / a for a, b in zip(v, v[1:])), default=0.5)
    return greedy_init_scale(n_stack, rho, preset.overlap_target)


def _loop(steps: int) -> Loop:
    every = max(steps // 5, 1)
    return Loop(steps=steps, log_every=min(100, steps), checkpoint_every=every, dtype="float64")


def smoke() -> AutoencoderGreedyRankPreset:
    """Plumbing (seconds): N = 200, 1,000 steps, L in {0, 2}, 3 seeds (too few for a verdict:
    every claim reads inconclusive); the step is the stability cap (``mode_time`` 1), so L = 2
    learns the 5 modes within budget."""
    base = AutoencoderRun(
        loop=_loop(1000), n_train=200, n_heldout=100, log_points=20, mode_points=100, mode_time=1
    )
    return AutoencoderGreedyRankPreset(base=base, depths=[0, 2], control_depth=2, seeds=3)


def fast() -> AutoencoderGreedyRankPreset:
    """S15's CPU study: L in {0, 2, 4, 8} at s from theory, s = 0.5 and s = 1, L = 8 default, 5
    seeds, 8k steps; noise std 0.4 (data rank 32), equal-time step with ``mode_time`` 500."""
    return AutoencoderGreedyRankPreset(base=AutoencoderRun(loop=_loop(8000)), depths=[0, 2, 4, 8])


def full() -> AutoencoderGreedyRankPreset:
    """S15's evidence run: fast's arms (L in {0, 2, 4, 8}; s from theory, s = 0.5, s = 1; L = 8
    default) plus r3's noise-0.01 runs and o's equal-variance runs, 15 seeds, 9k steps.

    9k steps: 1.5x the slowest 5th-mode time of any fitted arm on calibration seed 10000
    (5.5k, an L = 8 s = 0.5 stack); 15 seeds narrow r4's interval (per-seed sd ~1k steps).
    """
    base = AutoencoderRun(loop=_loop(9000), log_points=200)
    return AutoencoderGreedyRankPreset(base=base, depths=[0, 2, 4, 8], seeds=15)


def paper() -> AutoencoderGreedyRankPreset:
    """S15's larger sweep: L in 0..16 at s from theory, s = 0.5 and s = 1, 5 seeds, 16k steps.

    S15's nonlinear autoencoder on ``load_digits`` is not part of this preset yet. L = 1 has no
    plateau (no s makes it greedy; it runs at the search's floor s = 1e-4).
    """
    base = AutoencoderRun(loop=_loop(16_000), log_points=200)
    return AutoencoderGreedyRankPreset(base=base, depths=list(range(17)), seeds=5)


def judged_depths(depths: list[int]) -> list[int]:
    """The depths r1, r2 and o judge: those of :data:`~.analysis.GREEDY_DEPTHS` present, else
    every ``L > 0``."""
    return [L for L in GREEDY_DEPTHS if L in depths] or [L for L in depths if L > 0]


def build_runs(preset: AutoencoderGreedyRankPreset, seed: int = 0) -> list[RunSpec]:
    """Per seed: L = 0; each L > 0 orthogonal at :func:`greedy_scale` (arm ``greedy``), at
    ``depth_scale`` (arm ``depth``) and at ``control_scale`` (arm ``control``), all at the
    greedy arm's step; default init at ``control_depth`` (same step); at the greedy s and step,
    r3's runs on data of noise std ``quiet_noise`` (arm ``quiet``: L = 0 and the deepest judged
    depth) and o's control on data whose signal variances all equal ``flat_variance`` (arm
    ``flat``, every judged depth). Runs of one depth train as one ensemble."""
    scales = {L: greedy_scale(preset, L) for L in {*preset.depths, preset.control_depth} if L}
    arms = {
        "orth": ("orthogonal", "greedy", None),
        f"orth_s{preset.depth_scale:g}": ("orthogonal", "depth", preset.depth_scale),
        f"orth_s{preset.control_scale:g}": ("orthogonal", "control", preset.control_scale),
        "orth_quiet": ("orthogonal", "quiet", None),
        "orth_flat": ("orthogonal", "flat", None),
    }
    data = {
        "quiet": {"noise_std": preset.quiet_noise},
        "flat": {"variances": [preset.flat_variance] * len(preset.base.variances)},
    }
    judged = judged_depths(preset.depths)
    specs = []
    for k in range(preset.seeds):
        base = preset.base.model_copy(update={"seed": preset.base.seed + seed + k})
        plan = [(L, tag) for L in preset.depths if L > 0 for tag in list(arms)[:3]]
        plan += [(0, "orth"), (preset.control_depth, "default")]
        plan += [(0, "orth_quiet"), (max(judged), "orth_quiet")]
        plan += [(L, "orth_flat") for L in judged]
        for L, tag in plan:
            init, arm, s = arms.get(tag, ("default", "greedy", 1.0))
            s_greedy = scales.get(L, 1.0)
            update = {
                "n_stack": L, "init": init, "arm": arm, "init_scale": s or s_greedy,
                "lr_scale": s_greedy, **data.get(arm, {}),
            }  # fmt: skip
            cfg = base.model_copy(update=update)
            specs.append(RunSpec(f"L{L}_{tag}_seed{k}", cfg, build_autoencoder, group=f"L{L}"))
    return specs


STUDY = Study(
    name="autoencoder-greedy-rank",
    claim=CLAIM,
    source=SOURCE,
    presets={"smoke": smoke, "fast": fast, "full": full, "paper": paper},
    build_runs=build_runs,
    analyze=analyze,
    protocol=PROTOCOL,
)
