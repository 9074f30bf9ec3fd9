"""Study ``hyla-fuzzy-logic`` (SYSTEMS.md S4): HYLA generalizes to unseen term combinations.

Presets, runs and the Study object; the notes (task, model, metrics, verdict, measurements) are
``docs/studies/hyla-fuzzy-logic.md``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from dynascope.nn.attention import AttentionKind
from dynascope.studies.base import RunSpec, Study
from dynascope.studies.hyla_fuzzy_logic.analysis import CONTROL_SEED_OFFSET, analyze
from dynascope.studies.hyla_fuzzy_logic.protocol import PROTOCOL
from dynascope.studies.hyla_fuzzy_logic.runs import FuzzyRunConfig, build_fuzzy
from dynascope.studies.hyla_fuzzy_logic.sraven import SRavenRunConfig, build_sraven
from dynascope.train import Loop
from dynascope.train.schedule import LRSchedule

__all__ = ["CLAIM", "SOURCE", "STUDY", "HylaFuzzyLogicPreset", "build_runs"]

CLAIM = (
    "HYLA (attention as a nonlinear hypernetwork with head-normalised scores) generalizes to "
    "unseen combinations of known fuzzy-logic terms better than linear attention."
)
SOURCE = (
    "Schug, Kobayashi, Akram, Sacramento, Pascanu, 'Attention as a Hypernetwork', ICLR 2025, "
    "arXiv 2406.05816"
)


class HylaFuzzyLogicPreset(BaseModel):
    """A preset: the base run, the attention kinds, the seeds; optionally sRAVEN runs (paper).

    ``control`` adds a twin group of linear-attention runs (seeds + ``CONTROL_SEED_OFFSET``),
    the negative control of claim s4.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    base: FuzzyRunConfig
    attentions: list[AttentionKind]
    seeds: list[int]
    control: bool = True
    sraven: SRavenRunConfig | None = None
    sraven_attentions: list[AttentionKind] = Field(default_factory=list)


def _loop(steps: int, warmup: int, eval_every: int, **kw) -> Loop:
    schedule = LRSchedule(kind="cosine", warmup_steps=warmup, final_lr_frac=0.1)
    return Loop(steps=steps, eval_every=eval_every, schedule=schedule, **kw)


def smoke() -> HylaFuzzyLogicPreset:
    """Plumbing only: L 3, K 2, seq 8, d_model 16, 2 heads, 1 layer, 30 steps, 3 seeds."""
    base = FuzzyRunConfig(
        loop=_loop(30, 5, 15, log_every=5, checkpoint_every=10),
        n_variables=3,
        n_terms=2,
        seq_len=8,
        d_model=16,
        n_layers=1,
        n_heads=2,
        d_head=2,
        d_mlp=32,
        batch_size=16,
        eval_sequences=64,
        probe_sequences=64,
    )
    return HylaFuzzyLogicPreset(base=base, attentions=["hyla", "linear"], seeds=[0, 1, 2])


# Fixed once from the measured cost per sample (one thread, batch 128, seq 32, no position
# bias, busy 2-core machine: HYLA ~0.8 ms, linear ~0.35 ms a sample and member), so the 9 runs
# (3 HYLA, 3 linear, 3 linear twins) fit ~180 s of CPU (measured 2026-12-02: 198 s on a
# loaded shared machine, notes); never from outcomes.
FAST_STEPS = 300


def fast() -> HylaFuzzyLogicPreset:
    """HYLA, linear and the linear twins × 5 seeds (the protocol's count) at SYSTEMS.md's
    fast sizes (d_model 64, 8 heads of d_head 2, 2 layers), batch 128, no position bias (the
    readout position holds the query token; notes), AdamW 1e-3, wd 0.1, warm-up 30 then cosine
    to 0.1. A demo: the ID-fit precondition needs ~192k samples a run (notes page)."""
    base = FuzzyRunConfig(
        loop=_loop(FAST_STEPS, 30, FAST_STEPS // 2, log_every=25),
        batch_size=128,
        relative_position_buckets=None,
        eval_sequences=1024,
        probe_sequences=512,
    )
    seeds = list(range(PROTOCOL.seeds["fast"]))
    return HylaFuzzyLogicPreset(base=base, attentions=["hyla", "linear"], seeds=seeds)


def paper() -> HylaFuzzyLogicPreset:
    """Table A1: all 7 attention kinds × 5 seeds (the paper has 3; 5 for the interval), d_model
    128, mlp 256, batch 128, 50k steps, T5 bias 128 buckets (GPU); sRAVEN (K 4, F 8, 4 layers,
    16 heads of d_head 4, 20M instances) for HYLA, linear and softmax × 5 seeds."""
    base = FuzzyRunConfig(
        loop=_loop(50_000, 100, 2500, log_every=100, device="cuda"),
        d_model=128,
        d_mlp=256,
        batch_size=128,
        eval_sequences=16_384,
        probe_sequences=4096,
    )
    return HylaFuzzyLogicPreset(
        base=base,
        attentions=[
            "softmax",
            "linear",
            "hyla",
            "linear_rms_head",
            "hyla_no_rms_head",
            "hyla_mlp_linear",
            "softmax_hyla",
        ],
        seeds=list(range(PROTOCOL.seeds["paper"])),
        sraven=SRavenRunConfig(
            loop=_loop(156_250, 1000, 5000, log_every=100, device="cuda"), batch_size=128
        ),
        sraven_attentions=["hyla", "linear", "softmax"],
    )


def build_runs(preset: HylaFuzzyLogicPreset, seed: int = 0) -> list[RunSpec]:
    """``{attention}_s{i}`` per (attention, seed), one ensemble per attention kind; the linear
    twins ``linear_twin_s{i}`` (control) join the linear ensemble; sRAVEN runs if present."""
    fuzzy = build_fuzzy

    def spec(name: str, attention: str, run_seed: int, group: str) -> RunSpec:
        cfg = preset.base.model_copy(update={"attention": attention, "seed": run_seed})
        return RunSpec(name, cfg, fuzzy, group=group)

    specs = [spec(f"{a}_s{s}", a, seed + s, a) for a in preset.attentions for s in preset.seeds]
    if preset.control and "linear" in preset.attentions:
        specs += [
            spec(f"linear_twin_s{s}", "linear", seed + CONTROL_SEED_OFFSET + s, "linear")
            for s in preset.seeds
        ]
    if preset.sraven is not None:
        sraven = build_sraven
        specs += [
            RunSpec(
                f"sraven_{a}_s{s}",
                preset.sraven.model_copy(update={"attention": a, "seed": seed + s}),
                sraven,
                group=f"sraven_{a}",
            )
            for a in preset.sraven_attentions
            for s in preset.seeds
        ]
    return specs


STUDY = Study(
    name="hyla-fuzzy-logic",
    claim=CLAIM,
    source=SOURCE,
    presets={"smoke": smoke, "fast": fast, "paper": paper},
    build_runs=build_runs,
    analyze=analyze,
    protocol=PROTOCOL,
)
