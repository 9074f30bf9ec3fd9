"""Study ``permuted-initialisations`` (SYSTEMS.md S7): permuted random inits perform above chance.

Notes (system, instruments, verdicts, calibration, measurements):
docs/studies/permuted-initialisations.md.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from dynascope.studies.base import RunSpec, Study
from dynascope.train import Loop

from .analysis import analyze
from .protocol import PROTOCOL
from .runs import PermutedInitRun, build_permuted_inits
from .transformer import TransformerBarrierRun, build_transformer_pair

__all__ = ["CLAIM", "STUDY", "PermutedInitialisationsPreset", "build_runs"]

CLAIM = (
    "Permuting one net's hidden units to match another's (activation matching after training) "
    "and applying that permutation to the random initialisations makes the average of the two "
    "inits classify above chance, while the unpermuted average stays at chance; the permuted "
    "trained nets have a lower loss barrier."
)
SOURCE = (
    "Benzing, Schug, Meier, von Oswald, Akram, Zucchet, Aitchison, Steger, 'Random "
    "initialisations performing above chance and how to find them', OPT 2022, arXiv 2209.07509"
)


class OptimizerChoice(BaseModel):
    """An optimizer setting for the CNN runs (S7: AdamW 1e-3; SGD lr 0.01 and 0.03)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    optimizer: Literal["adamw", "sgd"] = "adamw"
    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(0.01, ge=0)


class PermutedInitialisationsPreset(BaseModel):
    """A preset: shared run settings and the grid of architectures."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base: PermutedInitRun
    pair_hidden: list[list[int]] = Field(min_length=1, description="gated MLP architectures")
    n_pairs: int = Field(3, ge=1, description="seed pairs per gated architecture (one ensemble)")
    widths: list[int] = Field(default_factory=list, description="width sweep (1 pair each)")
    width_depths: list[int] = Field(default_factory=lambda: [1])
    nway_hidden: list[int] | None = None
    nway_nets: int = Field(10, ge=3)
    cnn_archs: list[str] = Field(default_factory=list)
    cnn_optimizers: list[OptimizerChoice] = Field(default_factory=lambda: [OptimizerChoice()])
    cnn_pairs: int = Field(1, ge=1)
    transformer_pairs: int = Field(0, ge=0, description="recall transformers: barrier runs")
    transformer: TransformerBarrierRun = Field(
        default_factory=lambda: TransformerBarrierRun(loop=_loop(1500, 150))
    )


def _loop(steps: int, log_every: int = 10) -> Loop:
    return Loop(steps=steps, log_every=min(log_every, steps), checkpoint_every=max(1, steps // 2))


# -- presets ----------------------------------------------------------------------------------
def smoke() -> PermutedInitialisationsPreset:
    """Plumbing only (seconds): width 32, 200 training images, 2 updates, 3 seed pairs (the
    verdicts' 3 seeds), one tiny recall-transformer pair."""
    base = PermutedInitRun(hidden=[32], n_train=200, match_steps=[1], loop=_loop(2, 1))
    tiny = TransformerBarrierRun(
        d_model=8, n_heads=2, d_mlp=6, batch_size=16, n_match=32, n_eval=64, n_alphas=3,
        loop=_loop(4, 1),
    )  # fmt: skip
    return PermutedInitialisationsPreset(
        base=base,
        pair_hidden=[[32]],
        n_pairs=3,
        widths=[16],
        nway_hidden=[32],
        nway_nets=3,
        cnn_archs=["4-avg-8"],
        transformer_pairs=1,
        transformer=tiny,
    )


def fast() -> PermutedInitialisationsPreset:
    """S7's fast grid (≤ 3 min on 2 CPU cores): MLP 64-1024-10 and 64-512-512-10 x 5 seed pairs,
    130 updates, T in {10, 50, 100, end}; widths {32, 128, 512, 2048}; 10-way; one CNN
    32-32-avg-64-64 pair; 3 recall-transformer pairs."""
    return PermutedInitialisationsPreset(
        base=PermutedInitRun(match_steps=[10, 50, 100], loop=_loop(130)),
        pair_hidden=[[1024], [512, 512]],
        n_pairs=5,
        widths=[32, 128, 512, 2048],
        nway_hidden=[1024],
        nway_nets=10,
        cnn_archs=["32-32-avg-64-64"],
        transformer_pairs=3,
    )


def paper() -> PermutedInitialisationsPreset:
    """S7's paper grid on digits (GPU): widths 32-8192 at depths 1/2/4, both CNN families with
    k in {32..256}, AdamW and SGD (lr 0.01, 0.03), 10-way averages, 3,000 updates (the paper's
    5 epochs of 60k images); 5 seed pairs per gated architecture."""
    base = PermutedInitRun(match_steps=[10, 50, 100, 500], loop=_loop(3000, 50))
    cnns = [f"{k}-{k}-avg-{2 * k}-{2 * k}" for k in (32, 64, 128, 256)]
    cnns += [f"{k}-avg-{2 * k}-avg-{4 * k}" for k in (32, 64, 128, 256)]
    return PermutedInitialisationsPreset(
        base=base,
        pair_hidden=[[1024], [512, 512], [2048, 2048]],
        n_pairs=5,
        widths=[32, 128, 512, 2048, 8192],
        width_depths=[1, 2, 4],
        nway_hidden=[2048, 2048],
        nway_nets=10,
        cnn_archs=cnns,
        cnn_optimizers=[
            OptimizerChoice(),
            OptimizerChoice(optimizer="sgd", lr=0.01, weight_decay=1e-4),
            OptimizerChoice(optimizer="sgd", lr=0.03, weight_decay=1e-4),
        ],
        transformer_pairs=3,
    )


def _hidden_tag(hidden: list[int]) -> str:
    return "x".join(map(str, hidden))


def build_runs(preset: PermutedInitialisationsPreset, seed: int = 0) -> list[RunSpec]:
    """Gated MLP pairs (an architecture's seed pairs are one ensemble), the width sweep, the
    n-way run, the CNN runs and the transformer pairs (one ensemble); run ``..._p{k}`` has seed
    ``base.seed + seed + k``."""
    base = preset.base
    s0 = base.seed + seed
    specs = []

    def add(name: str, ensemble: str | None = None, **update) -> None:
        config = PermutedInitRun.model_validate({**base.model_dump(), **update})
        specs.append(RunSpec(name, config, build_permuted_inits, group=ensemble))

    for hidden in preset.pair_hidden:
        tag = f"pair_mlp_{_hidden_tag(hidden)}"
        for k in range(preset.n_pairs):
            add(f"{tag}_p{k}", tag, group="pairs", hidden=hidden, seed=s0 + k)
    for depth in preset.width_depths:
        for width in preset.widths:
            name, hidden = f"width_mlp_{width}_d{depth}", [width] * depth
            add(name, group="width", hidden=hidden, seed=s0, match_steps=[])
    if preset.nway_hidden:
        add(
            f"nway_mlp_{_hidden_tag(preset.nway_hidden)}",
            group="nway",
            hidden=preset.nway_hidden,
            n_nets=preset.nway_nets,
            seed=s0,
            match_steps=[],
            weight_matching=False,
        )
    for arch in preset.cnn_archs:
        for choice in preset.cnn_optimizers:
            for k in range(preset.cnn_pairs):
                add(
                    f"cnn_{arch}_{choice.optimizer}{choice.lr:g}_p{k}",
                    group="cnn",
                    model="cnn",
                    arch=arch,
                    seed=s0 + k,
                    match_steps=[],
                    **choice.model_dump(),
                )
    for k in range(preset.transformer_pairs):  # barrier of matched transformers
        config = preset.transformer.model_copy(update={"seed": preset.transformer.seed + s0 + k})
        specs.append(
            RunSpec(f"transformer_recall_p{k}", config, build_transformer_pair, group="transformer")
        )
    return specs


STUDY = Study(
    name="permuted-initialisations",
    claim=CLAIM,
    source=SOURCE,
    presets={"smoke": smoke, "fast": fast, "paper": paper},
    build_runs=build_runs,
    analyze=analyze,
    protocol=PROTOCOL,
)
