"""Study ``sigma-reparam-entropy`` (S12): presets and runs. Notes:
``docs/studies/sigma-reparam-entropy.md``."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from dynascope.config import RunConfig, validate_config
from dynascope.studies.base import RunSpec, Study
from dynascope.train import Loop, build_registry

from .analysis import METHODS, analyze
from .protocol import PROTOCOL, SEEDS
from .runs import UnitCheckRun, build_units

__all__ = ["CLAIM", "FAST_STEPS", "SOURCE", "STUDY", "SigmaReparamEntropyPreset", "build_runs"]

CLAIM = (
    "Without σReparam a LayerNorm-free ViT trained with Adam and no warmup collapses its "
    "attention entropy and destabilizes at a high learning rate; with σReparam the entropy stays "
    "high and the model trains at that learning rate."
)
SOURCE = (
    "Zhai, Likhomanenko, Littwin, Busbridge, Ramapuram, Zhang, Gu, Susskind, 'Stabilizing "
    "Transformer Training by Preventing Attention Entropy Collapse', ICML 2023, arXiv 2303.06296"
)


class SigmaReparamEntropyPreset(BaseModel):
    """A preset: the unit checks, the baseline run config, the LR sweep and the seeds.

    The baseline trains at every LR of ``lrs``; σReparam at every LR but the smallest (the
    control LR, where no claim reads σReparam).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    units: UnitCheckRun = UnitCheckRun(loop=Loop(steps=50, log_every=1, checkpoint_every=25))
    base: RunConfig
    lrs: list[float] = Field(min_length=2, description="ascending; lrs[0] is the control LR")
    seeds: int = Field(SEEDS["fast"], ge=1, description="runs per (variant, LR), seeds seed + k")
    baseline_ln: bool = Field(
        False,
        description="the baseline's pre-LN (True: S12's pre-LN ViT); default the LN-free ViT, the "
        "paper's collapse-prone setting and σReparam's architecture less σReparam",
    )


def _vit_run(
    *,
    n_layers: int,
    d_model: int,
    n_heads: int,
    d_mlp: int,
    steps: int,
    batch_size: int = 128,
    device: str = "cpu",
) -> RunConfig:
    return validate_config(
        {
            "name": "vit",
            "device": device,
            "model": {
                "name": "vit",
                "n_layers": n_layers,
                "d_model": d_model,
                "n_heads": n_heads,
                "d_mlp": d_mlp,
                "pooling": "mean",
                "use_ln": False,
            },
            "task": {"name": "digits", "patch_size": 2},
            "optimizer": {"name": "adam", "lr": 1e-3, "warmup_steps": 0},
            "train": {
                "steps": steps,
                "batch_size": batch_size,
                "log_every": max(1, steps // 60),
                "eval_every": max(1, steps // 5),
                "eval_batches": 3,
                "checkpoint_every": steps,
                "keep_checkpoints": 1,
            },
            "monitor": {
                "probes": ["attention_entropy", "qk_spectrum"],
                "schedule": "every",
                "every": max(1, steps // 25),
            },
        }
    )


def smoke() -> SigmaReparamEntropyPreset:
    """Plumbing only (seconds): 2 layers, d_model 16, 2 LRs, 20 steps, 3 seeds, unit checks."""
    return SigmaReparamEntropyPreset(
        base=_vit_run(n_layers=2, d_model=16, n_heads=4, d_mlp=64, steps=20, batch_size=64),
        lrs=[1e-3, 3e-2],
        seeds=SEEDS["smoke"],
    )


FAST_STEPS = 150  # from measured CPU time only (docs/studies/sigma-reparam-entropy.md)


def fast() -> SigmaReparamEntropyPreset:
    """≤ 3 minutes on 2 CPU cores: S12's ViT, LN-free baseline at LRs {1e-3, 3e-2} and
    σReparam at 3e-2, × 5 seeds, FAST_STEPS steps (too few to fit: the e-claims read
    inconclusive through their fit preconditions)."""
    return SigmaReparamEntropyPreset(
        base=_vit_run(n_layers=4, d_model=64, n_heads=4, d_mlp=256, steps=FAST_STEPS),
        lrs=[1e-3, 3e-2],
        seeds=SEEDS["fast"],
    )


def paper() -> SigmaReparamEntropyPreset:
    """GPU: DeiT-tiny-shaped ViT (12 layers, d_model 192, 3 heads), 3000 steps, 5 seeds."""
    return SigmaReparamEntropyPreset(
        base=_vit_run(n_layers=12, d_model=192, n_heads=3, d_mlp=768, steps=3000, device="cuda"),
        lrs=[1e-3, 2e-3, 3e-3, 1e-2, 3e-2],
        seeds=SEEDS["paper"],
    )


def build_runs(preset: SigmaReparamEntropyPreset, seed: int = 0) -> list[RunSpec]:
    """The unit checks per seed, then per LR and seed the baseline and (above the control LR)
    the σReparam run (same seed: the same init). Names: ``u_unit_checks_s{k}``,
    ``{baseline|sigma}_lr{lr:g}_s{k}``."""
    specs = []
    for k in range(preset.seeds):
        units = preset.units.model_copy(update={"seed": preset.units.seed + seed + k})
        specs.append(RunSpec(f"u_unit_checks_s{k}", units, build_units))
    base = preset.base.model_dump(mode="json")
    control_lr = min(preset.lrs)
    for lr in preset.lrs:
        for k in range(preset.seeds):
            for method in METHODS:
                if method == "sigma" and lr == control_lr:
                    continue
                name = f"{method}_lr{lr:g}_s{k}"
                overrides = [f"name={name}", f"seed={preset.base.seed + seed + k}"]
                overrides.append(f"optimizer.lr={lr}")
                if method == "sigma":
                    overrides += ["model.sigma_reparam=true", "model.use_ln=false"]
                else:
                    overrides.append(f"model.use_ln={str(preset.baseline_ln).lower()}")
                specs.append(RunSpec(name, validate_config(base, overrides), build_registry))
    return specs


STUDY = Study(
    name="sigma-reparam-entropy",
    claim=CLAIM,
    source=SOURCE,
    presets={"smoke": smoke, "fast": fast, "paper": paper},
    build_runs=build_runs,
    analyze=analyze,
    protocol=PROTOCOL,
)
