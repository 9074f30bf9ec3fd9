"""Study ``hyla-fuzzy-logic`` (SYSTEMS.md S4): HYLA generalizes to unseen term combinations.

Source: S. Schug, S. Kobayashi, Y. Akram, J. Sacramento, R. Pascanu, "Attention as a
Hypernetwork", ICLR 2025, arXiv 2406.05816.

Finding: read per (query, key) pair, multi-head attention is a hypernetwork whose latent code is
the vector of head scores. HYLA (RMS-normalise the scores over heads, ReLU between the generated
value and output maps) generalizes better than linear attention to unseen combinations of known
fuzzy-logic terms (paper Table A1, "OOD R²": HYLA 81.13±7.77 vs linear 59.89±5.22, 3 seeds).

Task (:class:`dynascope.tasks.fuzzy_logic.FuzzyLogic`): L = 4 variables, K = 2 terms, seq 32,
frac_ood_conj 0.25, frac_test 0.7 -> 20 train / 46 "test" / 6 "ood" combinations. The paper's
"OOD R²" is the "test" split; "ood" (unseen terms) is reported, expected low for all models.

Model (:class:`dynascope.nn.hypernet_transformer.SequenceTransformer`): Dense embedding of
``[x, y]`` tokens, pre-LN blocks (mixer + GELU MLP), final LN, Dense readout at the last
position; T5 relative position bias in every layer (unidirectional, n_buckets = max_distance =
128 as the reference ``configs/logic.py``, so every distance below 64 has its own bucket;
SYSTEMS.md's "max distance = seq_len" is the sRAVEN config; N(0, 1/n_heads) init); no causal
mask; biases on W_Q..W_O; total qk = v width 16 over 8 heads (d_head = 2 = HYLA's generated
hidden width). RMSHead eps 1e-6. AdamW, linear warm-up
0 -> lr, cosine to 0.1 lr; no decay on 1-D parameters; MSE on the last position.

Metrics (the probe also logs logistic-regression F1 per term, the paper's probe, reported only):
R² per sequence ``1 - (ŷ - y)² / base_mse`` (base_mse = per-sequence target variance)
averaged over sequences (the reference code's aggregation); evaluated on fixed eval sets per
split. Latent probe: per layer, the H-vector a_{h,q,q} of the last query on itself (after the
normalisation), sequences with one fixed query x (reference ``valid_fixed_query``); ridge
(alpha 1) to the K-hot term vector, fit on train-split tasks, R² on other train-split
sequences ("probe.id") and on "test"-split tasks ("probe.test"); constant columns skipped.

Verdict (gated): seed-mean "test" R²(HYLA) − seed-mean "test" R²(linear) >= 0.05. Threshold:
SYSTEMS.md's proposal, frozen before any fast run (the paper's gap is 0.21 with 0.05-0.08 seed
spread, hence 3 seeds and seed means); never tuned. Step counts of ``fast`` were fixed once from
the measured step time (see ``fast()``), not from outcomes. CPU runs are short of the paper's
50k steps: the ID ("train") R² is reported so undertraining is visible, and the verdict
detail says "undertrained" when neither model reaches ID R² 0.5 (a reporting guard; it does
not change ``passed``).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from dynascope.nn.attention import AttentionKind
from dynascope.nn.capture import capture_patterns
from dynascope.nn.hypernet_transformer import SequenceTransformer
from dynascope.probes.latent_code import attention_latent_code, logistic_f1, ridge_r2
from dynascope.report import new_figure, save_figure
from dynascope.store import Run
from dynascope.studies._hyla_sraven import SRavenRunConfig, analyze_sraven, run_sraven
from dynascope.studies._run_values import last_or_nan
from dynascope.studies._sequence_training import (
    MixerTransformerConfig,
    mixer_transformer,
    open_run,
    train_steps,
)
from dynascope.studies.base import Analysis, RunSpec, Study, Verdict
from dynascope.tasks.fuzzy_logic import FuzzyLogic, fuzzy_logic_r2

__all__ = ["FuzzyRunConfig", "HylaFuzzyLogicPreset", "STUDY", "run_fuzzy_logic"]

CLAIM = (
    "HYLA (attention as a nonlinear hypernetwork with head-normalised scores) generalizes to "
    "unseen combinations of known fuzzy-logic terms better than linear attention."
)
SOURCE = (
    "Schug, Kobayashi, Akram, Sacramento, Pascanu, 'Attention as a Hypernetwork', ICLR 2025, "
    "arXiv 2406.05816"
)

GAP_THRESHOLD = 0.05  # SYSTEMS.md S4 proposal, frozen before the first fast run
# Reporting guard only (does not change ``passed``): below this ID R² both models are flagged
# undertrained in the verdict detail.
UNDERTRAINED_ID_R2 = 0.5

EVAL_SPLITS = ("train", "test", "ood")


class FuzzyRunConfig(MixerTransformerConfig):
    """One training run: a mixer on fuzzy-logic regression."""

    n_variables: int = Field(4, ge=1, description="L")
    n_terms: int = Field(2, ge=1, description="K")
    seq_len: int = Field(32, ge=2)
    frac_ood_conj: float = Field(0.25, ge=0, lt=1)
    frac_test: float = Field(0.7, gt=0, lt=1)
    split_seed: int = Field(0, ge=0, description="seed of the fixed test/train permutation")
    relative_position_buckets: int = Field(
        128, ge=2, description="T5 buckets = max distance (reference configs/logic.py: 128)"
    )
    eval_sequences: int = Field(2048, ge=2)
    probe_sequences: int = Field(1024, ge=4)


class HylaFuzzyLogicPreset(BaseModel):
    """A preset: the base run, the mixers and the seeds; optionally sRAVEN runs (paper)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base: FuzzyRunConfig
    mixers: list[AttentionKind]
    seeds: list[int]
    sraven: SRavenRunConfig | None = None
    sraven_mixers: list[AttentionKind] = Field(default_factory=list)


def _eval_sets(task: FuzzyLogic, config: FuzzyRunConfig, device: torch.device) -> dict:
    gen = torch.Generator().manual_seed(10_000 + config.seed)
    sets = {s: task.sample(s, config.eval_sequences, gen) for s in EVAL_SPLITS}
    # Probe sets: one fixed query x shared by every sequence (reference "valid_fixed_query").
    query = torch.rand(1, task.n_variables, generator=gen)
    for name, split in (("probe_fit", "train"), ("probe_id", "train"), ("probe_test", "test")):
        batch = task.sample(split, config.probe_sequences, gen)
        batch["x"][:, -1, :-1] = query
        sets[name] = batch
    return {k: {n: t.to(device) for n, t in v.items()} for k, v in sets.items()}


def run_fuzzy_logic(
    config: FuzzyRunConfig, run_dir: Path, *, progress: bool = False, device: str | None = None
) -> None:
    """Train one mixer; log ``train.loss``, ``{split}.r2``/``.mse`` and probe R² per layer."""
    del progress
    dev = torch.device(device or config.device)
    task = FuzzyLogic(
        config.n_variables,
        config.n_terms,
        config.seq_len,
        frac_ood_conj=config.frac_ood_conj,
        frac_test=config.frac_test,
        split_seed=config.split_seed,
    )
    with open_run(config, run_dir) as store:
        model = mixer_transformer(config, task.d_in, 1, config.relative_position_buckets).to(dev)
        evals = _eval_sets(task, config, dev)
        gen = torch.Generator(device=dev).manual_seed(config.seed)

        def loss_fn() -> torch.Tensor:
            batch = task.sample("train", config.batch_size, gen)
            pred = model(batch["x"])[:, -1, 0]
            return (pred - batch["y"]).square().mean()

        finished = train_steps(
            store,
            model,
            config,
            loss_fn,
            lambda: _evaluate(model, evals),
            final_lr_frac=config.final_lr_frac,
        )
        if finished:
            store.log(config.steps, _probe(model, evals))
            store.set_status(config.steps, "finished")


@torch.no_grad()
def _evaluate(model: SequenceTransformer, evals: dict) -> dict[str, torch.Tensor]:
    model.eval()
    out = {}
    for split in EVAL_SPLITS:
        b = evals[split]
        pred = model(b["x"])[:, -1, 0]
        out[f"{split}.r2"] = fuzzy_logic_r2(pred, b["y"], b["base_mse"]).mean()
        out[f"{split}.r2_ratio"] = 1 - (pred - b["y"]).square().mean() / b["base_mse"].mean()
        out[f"{split}.mse"] = (pred - b["y"]).square().mean()
    model.train()
    return out


@torch.no_grad()
def _probe(model: SequenceTransformer, evals: dict) -> dict[str, torch.Tensor]:
    """Ridge R² and logistic F1 of the K-hot terms from each layer's code a_{h,q,q}."""
    model.eval()
    codes = {}
    for name in ("probe_fit", "probe_id", "probe_test"):
        with capture_patterns(model) as patterns:
            model(evals[name]["x"])
        codes[name] = [
            attention_latent_code(patterns[f"blocks.{i}.attn"]) for i in range(len(model.blocks))
        ]
    model.train()
    out = {}
    for i in range(len(model.blocks)):
        for tag in ("id", "test"):
            _, r2 = ridge_r2(
                codes["probe_fit"][i],
                evals["probe_fit"]["latent"],
                codes[f"probe_{tag}"][i],
                evals[f"probe_{tag}"]["latent"],
                alpha=1.0,
            )
            out[f"probe.{tag}.L{i}.r2"] = r2
            _, f1 = logistic_f1(
                codes["probe_fit"][i],
                evals["probe_fit"]["latent"],
                codes[f"probe_{tag}"][i],
                evals[f"probe_{tag}"]["latent"],
            )
            out[f"probe.{tag}.L{i}.f1"] = f1
    return out


# -- presets ----------------------------------------------------------------------------------
# Fixed once from the measured step time (one thread, batch 64, seq 32: ~0.05 s/step HYLA,
# ~0.035 s/step linear on a busy 2-core machine) so 6 runs fit ~180 s; never from outcomes.
FAST_STEPS = 500


def smoke() -> HylaFuzzyLogicPreset:
    """Plumbing only: L 3, K 2, seq 8, d_model 16, 2 heads, 1 layer, 30 steps, 1 seed."""
    base = FuzzyRunConfig(
        n_variables=3,
        n_terms=2,
        seq_len=8,
        d_model=16,
        n_layers=1,
        n_heads=2,
        qk_width=4,
        d_mlp=32,
        batch_size=16,
        steps=30,
        warmup_steps=5,
        log_every=5,
        eval_every=15,
        eval_sequences=64,
        probe_sequences=64,
    )
    return HylaFuzzyLogicPreset(base=base, mixers=["hyla", "linear"], seeds=[0])


def fast() -> HylaFuzzyLogicPreset:
    """HYLA and linear × 3 seeds at SYSTEMS.md's fast sizes (d_model 64, 8 heads, 2 layers).

    Steps fixed once from the measured CPU step time (one thread, batch 64, seq 32; see
    FAST_STEPS) so the 6 runs fit ≤ 180 s of CPU time; measured 2026-12-01: 112-118 s CPU.
    """
    base = FuzzyRunConfig(
        d_model=64,
        n_layers=2,
        n_heads=8,
        qk_width=16,
        d_mlp=128,
        batch_size=64,
        steps=FAST_STEPS,
        warmup_steps=50,
        eval_every=FAST_STEPS // 2,
        eval_sequences=1024,
        probe_sequences=512,
    )
    return HylaFuzzyLogicPreset(base=base, mixers=["hyla", "linear"], seeds=[0, 1, 2])


def paper() -> HylaFuzzyLogicPreset:
    """Table A1: all 7 mixers × 3 seeds, d_model 128, mlp 256, batch 128, 50k·128 tasks (GPU);
    sRAVEN (K 4, F 8, 4 layers, 16 heads, qk = v = 64, 20M instances) for HYLA, linear and
    softmax × 3 seeds.
    """
    base = FuzzyRunConfig(
        d_model=128,
        n_layers=2,
        n_heads=8,
        qk_width=16,
        d_mlp=256,
        batch_size=128,
        steps=50_000,
        warmup_steps=100,
        log_every=100,
        eval_every=2500,
        eval_sequences=16_384,
        probe_sequences=4096,
        device="cuda",
    )
    return HylaFuzzyLogicPreset(
        base=base,
        mixers=[
            "softmax",
            "linear",
            "hyla",
            "linear_rms_head",
            "hyla_no_rms_head",
            "hyla_mlp_linear",
            "softmax_hyla",
        ],
        seeds=[0, 1, 2],
        sraven=SRavenRunConfig(device="cuda"),
        sraven_mixers=["hyla", "linear", "softmax"],
    )


def build_runs(preset: HylaFuzzyLogicPreset, seed: int = 0) -> list[RunSpec]:
    """One run per (mixer, seed); sRAVEN runs ``sraven_{mixer}_s{seed}`` if the preset has them."""
    specs = [
        RunSpec(
            f"{mixer}_s{s}",
            preset.base.model_copy(update={"mixer": mixer, "seed": s + seed}),
            run_fuzzy_logic,
        )
        for mixer in preset.mixers
        for s in preset.seeds
    ]
    if preset.sraven is not None:
        specs += [
            RunSpec(
                f"sraven_{mixer}_s{s}",
                preset.sraven.model_copy(update={"mixer": mixer, "seed": s + seed}),
                run_sraven,
            )
            for mixer in preset.sraven_mixers
            for s in preset.seeds
        ]
    return specs


# -- analysis ---------------------------------------------------------------------------------
def analyze(runs: dict[str, Run], figures: Path) -> Analysis:
    """Seed-mean "test" R² gap HYLA − linear (+ the sRAVEN ordering if run); tables; figures."""
    sraven_runs = {n: r for n, r in runs.items() if "n_features" in r.config}
    runs = {n: r for n, r in runs.items() if n not in sraven_runs}
    rows = []
    for name, run in sorted(runs.items()):
        n_layers = int(run.config.get("n_layers", 0))
        row = {
            "run": name,
            "mixer": run.config["mixer"],
            "seed": run.config["seed"],
            "status": run.status,
        }
        for split in EVAL_SPLITS:
            row[f"{split}.r2"] = last_or_nan(run, f"{split}.r2")
        for tag in ("id", "test"):
            for metric in ("r2", "f1"):
                vals = [last_or_nan(run, f"probe.{tag}.L{i}.{metric}") for i in range(n_layers)]
                finite = [v for v in vals if math.isfinite(v)]
                row[f"probe.{tag}.{metric}_best_layer"] = max(finite) if finite else float("nan")
        row["train.loss"] = last_or_nan(run, "train.loss")
        rows.append(row)
    mixers = sorted({r["mixer"] for r in rows})
    summary = []
    for m in mixers:
        sel = [r for r in rows if r["mixer"] == m]
        entry = {"mixer": m, "seeds": len(sel)}
        for key in (
            "train.r2",
            "test.r2",
            "ood.r2",
            "probe.id.r2_best_layer",
            "probe.test.r2_best_layer",
            "probe.id.f1_best_layer",
            "probe.test.f1_best_layer",
        ):
            vals = np.array([r[key] for r in sel], dtype=float)
            entry[f"{key}.mean"] = float(np.mean(vals)) if len(vals) else float("nan")
            entry[f"{key}.std"] = float(np.std(vals)) if len(vals) else float("nan")
        summary.append(entry)
    by = {e["mixer"]: e for e in summary}
    hyla = by.get("hyla", {}).get("test.r2.mean", float("nan"))
    linear = by.get("linear", {}).get("test.r2.mean", float("nan"))
    gap = hyla - linear
    n_seeds = min(by.get("hyla", {}).get("seeds", 0), by.get("linear", {}).get("seeds", 0))
    detail = (
        f"measured >= threshold; seed-mean test R² HYLA {hyla:.3f}, linear {linear:.3f} over "
        f"{n_seeds} seed(s); ID (train-combination) R² HYLA "
        f"{by.get('hyla', {}).get('train.r2.mean', float('nan')):.3f}, linear "
        f"{by.get('linear', {}).get('train.r2.mean', float('nan')):.3f}; seed std of test R² "
        f"HYLA {by.get('hyla', {}).get('test.r2.std', float('nan')):.3f}, linear "
        f"{by.get('linear', {}).get('test.r2.std', float('nan')):.3f}; paper gap 0.21 at 50k steps"
    )
    id_best = max(by.get(m, {}).get("train.r2.mean", float("nan")) for m in ("hyla", "linear"))
    if not id_best >= UNDERTRAINED_ID_R2:
        detail += (
            f"; both models undertrained (ID R² < {UNDERTRAINED_ID_R2}): the gap is a "
            "comparison of barely trained models, not of converged ones"
        )
    verdict = Verdict(
        "s4: HYLA beats linear attention on unseen combinations of seen terms (test split)",
        "seed-mean test R²(HYLA) − seed-mean test R²(linear)",
        gap,
        GAP_THRESHOLD,
        bool(gap >= GAP_THRESHOLD),
        detail,
    )
    tables = {"per run": rows, "per mixer (seed mean ± std)": summary}
    sraven_verdict, sraven_rows = analyze_sraven(sraven_runs)
    verdicts = [verdict]
    if sraven_verdict is not None:
        verdicts.append(sraven_verdict)
        tables["sRAVEN per run"] = sraven_rows
    return Analysis(verdicts, _figures(runs, summary, figures), tables)


def _figures(runs: dict[str, Run], summary: list[dict], figures: Path) -> list[Path]:
    fig, (ax1, ax2) = new_figure(2, title="HYLA vs linear attention on fuzzy logic (L4, K2)")
    colors = {}
    for _, run in sorted(runs.items()):
        mixer = run.config["mixer"]
        loss = run.scalar("train.loss")
        kw = {"color": colors[mixer]} if mixer in colors else {"label": mixer}
        (line,) = ax1.semilogy(loss.index, loss.values, alpha=0.7, **kw)
        colors.setdefault(mixer, line.get_color())
    ax1.set(xlabel="step", ylabel="train MSE (last position)", title="training loss (each seed)")
    ax1.legend()
    x = np.arange(len(EVAL_SPLITS))
    width = 0.8 / max(1, len(summary))
    for j, e in enumerate(summary):
        means = [e[f"{s}.r2.mean"] for s in EVAL_SPLITS]
        stds = [e[f"{s}.r2.std"] for s in EVAL_SPLITS]
        ax2.bar(
            x + (j - (len(summary) - 1) / 2) * width,
            means,
            width,
            yerr=stds,
            label=e["mixer"],
            color=colors.get(e["mixer"]),
        )
    ax2.set_xticks(x, ["train\n(ID)", "test\n(paper's OOD R²)", "ood\n(unseen terms)"])
    ax2.axhline(0, color="grey", lw=0.8)
    lo = min(
        [0.0]
        + [
            e[f"{s}.r2.mean"]
            for e in summary
            for s in EVAL_SPLITS
            if math.isfinite(e[f"{s}.r2.mean"])
        ]
    )
    ax2.set_ylim(max(lo - 0.1, -1.0), 1.05)
    ax2.set(ylabel="R² (seed mean ± std)", title="R² by split")
    ax2.legend()
    paths = [save_figure(fig, figures / "r2_by_split.png")]

    fig, axes = new_figure(2, title="latent code a_{h,q,q} of the last query → K-hot terms")
    for ax, metric, name in zip(axes, ("r2", "f1"), ("ridge R²", "logistic F1")):
        for j, e in enumerate(summary):
            vals = [
                e[f"probe.id.{metric}_best_layer.mean"],
                e[f"probe.test.{metric}_best_layer.mean"],
            ]
            ax.bar(
                np.arange(2) + (j - (len(summary) - 1) / 2) * width,
                vals,
                width,
                label=e["mixer"],
                color=colors.get(e["mixer"]),
            )
        ax.set_xticks(np.arange(2), ["train tasks", "test tasks"])
        ax.set(ylabel=f"{name} (best layer, seed mean)", title=name)
        ax.axhline(0, color="grey", lw=0.8)
        ax.legend()
    paths.append(save_figure(fig, figures / "latent_probe.png"))
    return paths


STUDY = Study(
    name="hyla-fuzzy-logic",
    claim=CLAIM,
    source=SOURCE,
    presets={"smoke": smoke, "fast": fast, "paper": paper},
    build_runs=build_runs,
    analyze=analyze,
)
