"""Study ``gradual-rank`` (SYSTEMS.md S10): attention weights change by gradually rising rank.

Source: E. Abbe, E. Boix-Adserà, E. Littwin, S. Bengio, J. Susskind, "Transformers learn
through gradual rank increase", NeurIPS 2023, arXiv 2306.07042.

Finding: trained from a small initialisation α·θ0, a diagonal attention head learns in stages:
with time in units of log(1/α), long plateaus alternate with sharp loss drops, and each drop
switches on at most one more entry of w_Q⊙w_K and of w_V⊙w_O (the ranks of the diagonal
W_QK, W_OV) (Sec. 4, Fig. 2). In transformers trained with Adam from a standard init, the
per-head updates Δ_QK = W_QK(t) − W_QK(0) stay low-rank and their rank grows during training
(Fig. 4: stable rank per head).

Parts (``analyze`` reads only the stores):

(toy) The diagonal head of :mod:`dynascope.nn.diagonal_attention` regressed onto the teacher
    of :class:`~dynascope.tasks.DiagonalAttentionTeacher` (qk* = ov* = (2, 1, 0.5, 0, …); n = 8
    tokens, d = 8, N = 256 sequences, x ~ N(0, 1); MSE as the mean over N·n·d entries; no
    softmax temperature; θ0 ~ N(0, 1), shared by every α), full-batch GD in float64 with η =
    0.05, every α ∈ {1e-1, 1e-2, 1e-3} batched in one tensor, closed-form gradients
    (:func:`run_diagonal_toy`). Rescaled time τ = η·t / log(1/α). 8,000 steps (τ_end = 58 at α
    = 1e-3): in a 20,000-step prototype run (same sizes, another draw of x and θ0) every α had
    reached its last stage by τ ≈ 50 (α = 1e-3: loss 6e-10 from τ ≈ 50 on).
(vit) ViT-tiny on scikit-learn's digits (pixels/16, 4×4 patches: 4 tokens + CLS), 2 layers,
    d_model 32, 2 heads (d_head 16), d_mlp 64, Adam lr 1e-3, batch 128, the ``delta_spectrum``
    probe at 30 log-spaced steps (step 0 is the reference W(0)), run through the Trainer.

Verdicts (S10's proposals, frozen before the first run of this study, except the drop window,
which was re-read once from the prototype's curves as explained under t1; measured values are
reported whatever they are):

- t1: plateaus in loss vs τ at the smallest α (1e-3 in ``fast``) ≥ 3 (the study's verdict
  metric). Drop detector: index i is in a drop when the loss falls by ≥ 30% between τ_i and
  1.05·τ_i; a drop is a maximal run of such indices (extended to the end of its window,
  overlapping drops merged); plateaus are the k + 1 intervals around k drops. S10 proposes
  "≥ 30% within Δτ ≤ 0.05", which presumes stage times of order 1; τ's unit depends on the
  loss normalisation (an open detail), and with ours the stages sit at τ ≈ 12–31 and a drop
  spans Δτ ≈ 1–3. Measured once on the prototype run: within an absolute Δτ = 0.05 the largest
  fall is 22% (α = 1e-3), 15% (1e-2), 6% (1e-1), so the literal proposal finds no drop at any
  α (the fast run agrees: 0 drops at every α). We therefore read the window relative to τ
  (Δτ ≤ 0.05·τ, unit-free) and kept the 30% fall; the drops found with the literal window are
  reported in every t1 detail.
- t2: for every α ≤ 1e-2: between consecutive plateaus (counts read at each plateau's
  midpoint) the number of active entries #{i : |Δ(w_Q⊙w_K)_i| > 10α} (likewise w_V⊙w_O) rises
  by ≤ 1, and the count at the last step equals the teacher's (3). 10α is S10's proposal (≫ the
  α² scale of the initial products). Measured once (fast, seed 0), t2 does not hold: the
  count of w_V⊙w_O rises by 2 at the first stage. Each w_V⊙w_O entry rises ahead of its
  w_Q⊙w_K partner and passes 10α mid-plateau while still far from its final value
  (|Δ ov_2| = 0.14 at the second plateau's midpoint at α = 1e-3, 0.22 at α = 1e-2: shrinking
  like α^0.2, as the α → 0 limit asks, but slowly). Read with an α-independent threshold
  (past ½ of the entry's final |Δ|), both counts go 0 → 1 → 2 → 3; that reading is reported
  in the detail and the table, not gated, and the frozen threshold was not changed.
- t3: collapse in τ: for each drop k, |τ_k(α₂) − τ_k(α₁)| / τ_k(α₁) ≤ 0.2 for the two smallest
  α (α₁ < α₂; 1e-3 and 1e-2 in ``fast``), τ_k the steepest point of log-loss in drop k; the
  numbers of drops must agree. 0.2 is S10's proposal.
- v1-rise: in every layer the head-mean srank(Δ_QK) rises over the probe's log-points (step 0,
  where srank(0) := 0 by definition, excluded): Spearman ρ(step, srank) ≥ 0.8 (S10).
- v1-end: in every layer the head-mean srank(Δ_QK) at the last step ≤ d_head/4 (S10).
  srank(Δ_OV) is reported beside both.

Presets: ``smoke`` (seconds, plumbing only: toy n = d = 4, N = 32, α = 1e-2, 500 steps; ViT
d_model 16, 20 steps), ``fast`` (≤ 3 min on 2 cores; ViT step count fixed once from measured
step time, see :func:`fast`), ``paper`` (GPU: toy d = 16 with α down to 1e-4; ViT 6 layers,
d_model 192, 3 heads, 3 seeds).

Not built: the paper's ViT on CIFAR/ImageNet and GPT-2 on Wikitext-103, and the Fig. 3-style
perturbation of the weights mid-plateau.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from dynascope.config import RunConfig, validate_config
from dynascope.report import new_figure, save_figure
from dynascope.store import Run, RunStore
from dynascope.studies.base import Analysis, RunSpec, Study, Verdict, one_intra_op_thread
from dynascope.tasks.diagonal_teacher import DiagonalAttentionTeacher
from dynascope.train import run_training

__all__ = [
    "DiagonalToyConfig",
    "GradualRankPreset",
    "STUDY",
    "active_counts",
    "analyze",
    "build_runs",
    "find_drops",
    "plateaus",
    "rescaled_time",
    "run_diagonal_toy",
]

CLAIM = (
    "Trained from a small init, a diagonal attention head learns in stages (in time units of "
    "log(1/α)), each stage switching on at most one entry of W_QK and of W_OV; in a ViT trained "
    "with Adam the per-head update ΔW_QK stays low-rank and its stable rank rises."
)
SOURCE = (
    "Abbe, Boix-Adserà, Littwin, Bengio, Susskind, 'Transformers learn through gradual rank "
    "increase', NeurIPS 2023, arXiv 2306.07042"
)

# Frozen thresholds (see the module docstring for how each was set).
DROP_FALL = 0.3  # a drop: the loss falls by >= 30% ...
DROP_REL_WINDOW = 0.05  # ... between tau and (1 + 0.05) * tau
DROP_ABS_WINDOW = 0.05  # S10's literal window (absolute), reported beside t1
T1_MIN_PLATEAUS = 3
T2_ACTIVE_FACTOR = 10.0  # active: |Δ entry| > 10 α
T2_MAX_RISE = 1
T2_MAX_ALPHA = 1e-2
T3_REL_TOL = 0.2
V1_MIN_RHO = 0.8
V1_SRANK_FRACTION = 0.25  # srank(Δ_QK) at the end <= d_head / 4


class DiagonalToyConfig(BaseModel):
    """The diagonal-attention toy: teacher, sizes, init scales and gradient descent (float64)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["diagonal_toy"] = "diagonal_toy"
    seed: int = Field(0, ge=0, description="draws x, then θ0")
    n_ctx: int = Field(8, ge=1, description="tokens per sequence n")
    d_model: int = Field(8, ge=1, description="token width d")
    n_seq: int = Field(256, ge=1, description="sequences N (one full batch)")
    strengths: list[float] = Field(default_factory=lambda: [2.0, 1.0, 0.5])
    scale: float = Field(1.0, gt=0, description="score multiplier (1: no temperature)")
    alphas: list[float] = Field(default_factory=lambda: [1e-1, 1e-2, 1e-3])
    lr: float = Field(0.05, gt=0, description="GD step η")
    steps: int = Field(8000, ge=1)
    log_every: int = Field(1, ge=1, description="GD steps between logged rows")

    @field_validator("alphas")
    @classmethod
    def _alphas_in_unit_interval(cls, alphas: list[float]) -> list[float]:
        if not alphas or not all(0 < a < 1 for a in alphas):
            raise ValueError(f"alphas must be non-empty, each in (0, 1) (got {alphas})")
        if len(set(alphas)) != len(alphas):
            raise ValueError(f"alphas must be distinct (got {alphas})")
        return alphas


class GradualRankPreset(BaseModel):
    """A preset: the toy config and the ViT run config (``vit_seeds`` runs of it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    toy: DiagonalToyConfig
    vit: RunConfig
    vit_seeds: int = Field(1, ge=1)


def run_diagonal_toy(config: DiagonalToyConfig, run_dir: Path, *, progress: bool = False) -> None:
    """Train the diagonal head for every α at once (batched, full-batch GD, float64).

    Logged every ``log_every`` steps and at the last step (tensors over the α grid): ``loss``
    ``[n_alpha]`` (the MSE at that step's weights), ``qk`` and ``ov`` ``[n_alpha, d_model]``
    (``w_Q⊙w_K``, ``w_V⊙w_O``); at step 0 also ``alphas`` ``[n_alpha]`` and ``teacher``
    ``[d_model]`` (qk* = ov*). Runs torch on one intra-op thread (restored afterwards): the
    kernels are tiny, and a second thread was measured to slow them 10× on a loaded machine.

    Raises:
        ValueError: as :class:`~dynascope.tasks.DiagonalAttentionTeacher` (e.g. more strengths
            than ``d_model``).
    """
    del progress
    teacher = DiagonalAttentionTeacher(
        n_ctx=config.n_ctx,
        d_model=config.d_model,
        n_seq=config.n_seq,
        strengths=config.strengths,
        scale=config.scale,
        seed=config.seed,
    )
    alphas = torch.tensor(config.alphas, dtype=torch.float64)
    generator = torch.Generator().manual_seed(config.seed + 1)
    w = teacher.init_weights(alphas, generator)  # [n_alpha, 4, d_model]
    with RunStore(run_dir) as store, one_intra_op_thread():
        store.truncate_after(-1)  # a re-run replaces the directory's rows
        store.write_config(config.model_dump(mode="json"))
        store.set_status(0, "running")
        store.log(0, {"alphas": alphas, "teacher": teacher.teacher})
        for step in range(config.steps + 1):
            loss, grad = teacher.loss_and_gradients(w)
            if step % config.log_every == 0 or step == config.steps:
                if not bool(torch.isfinite(loss).all()):
                    store.event(step, "diverged", "loss is not finite")
                    store.set_status(step, "diverged")
                    return
                row = {"loss": loss, "qk": w[:, 0] * w[:, 1], "ov": w[:, 2] * w[:, 3]}
                store.log(step, row)
            if step < config.steps:
                w = w - config.lr * grad
        store.set_status(config.steps, "finished")


def _train_runner(
    config: RunConfig,
    run_dir: Path,
    *,
    progress: bool = False,
    device: str | None = None,
    resume: bool = False,
) -> None:
    """The Trainer on one intra-op thread: the ViT is tiny (5 tokens, d_model 32), and with two
    threads on a loaded 2-core machine a step was measured at 180 ms against 10 ms on one."""
    if device is not None:  # --device: the run's own default otherwise
        config = config.model_copy(update={"device": device})
    if config.device != "cpu":
        run_training(config, run_dir, progress=progress, resume=resume)
        return
    with one_intra_op_thread():
        run_training(config, run_dir, progress=progress, resume=resume)


# -- presets ----------------------------------------------------------------------------------
def _vit_run(
    *, n_layers: int, d_model: int, n_heads: int, steps: int, points: int = 30
) -> RunConfig:
    return validate_config(
        {
            "name": "vit",
            "model": {
                "name": "vit",
                "n_layers": n_layers,
                "d_model": d_model,
                "n_heads": n_heads,
                "d_mlp": 2 * d_model,
                "pooling": "cls",
            },
            "task": {"name": "digits", "patch_size": 4},
            "optimizer": {"name": "adam", "lr": 1e-3},
            "train": {
                "steps": steps,
                "batch_size": 128,
                "log_every": max(1, min(50, steps // 10)),
                "eval_every": max(1, steps // 5),
                "eval_batches": 3,
                "checkpoint_every": steps,
            },
            "monitor": {"probes": ["delta_spectrum"], "schedule": "log", "points": points},
        }
    )


def smoke() -> GradualRankPreset:
    """Plumbing only (seconds): toy n = d = 4, N = 32, α = 1e-2, 500 steps; ViT d_model 16."""
    return GradualRankPreset(
        toy=DiagonalToyConfig(n_ctx=4, d_model=4, n_seq=32, alphas=[1e-2], steps=500),
        vit=_vit_run(n_layers=2, d_model=16, n_heads=2, steps=20, points=8),
    )


# ViT steps for ``fast``, fixed once from a measured step time (not from any verdict): 6.9 ms of
# CPU per step (1 thread; digits batch 128, delta_spectrum at 30 log-points, eval every 1/5;
# measured on the shared 2-core machine at load average ≈ 10, where the wall time was 16 ms per
# step). A budget of ≈ 60 s of ViT training on free cores gives 8,000 steps; the toy takes
# ≈ 10 s of CPU, so ``fast`` stays well under 3 minutes on 2 free cores.
VIT_FAST_STEPS = 8000


def fast() -> GradualRankPreset:
    """≤ 3 minutes on 2 CPU cores: the toy as specified (8,000 GD steps) and the ViT
    (:data:`VIT_FAST_STEPS` Adam steps, fixed from a measured step time)."""
    return GradualRankPreset(
        toy=DiagonalToyConfig(),
        vit=_vit_run(n_layers=2, d_model=32, n_heads=2, steps=VIT_FAST_STEPS),
    )


def paper() -> GradualRankPreset:
    """Closer to the paper (GPU): toy d = 16 with α down to 1e-4; ViT 6 layers, d_model 192,
    3 heads (d_head 64), 3 seeds. Not run yet: the toy's 20,000 steps (τ_end = 109 at α =
    1e-4) and the ViT's steps are guesses, and the paper's App. B hyperparameters are not
    verified here.
    """
    vit = _vit_run(n_layers=6, d_model=192, n_heads=3, steps=20_000, points=40)
    vit = validate_config(vit.model_dump(mode="json"), ["device=cuda"])
    return GradualRankPreset(
        toy=DiagonalToyConfig(d_model=16, alphas=[1e-1, 1e-2, 1e-3, 1e-4], steps=20_000),
        vit=vit,
        vit_seeds=3,
    )


def build_runs(preset: GradualRankPreset, seed: int = 0) -> list[RunSpec]:
    """The toy run (every α in one run) and ``vit_seeds`` ViT runs (``vit_s0``, ``vit_s1``…)."""
    toy = preset.toy.model_copy(update={"seed": preset.toy.seed + seed})
    specs = [RunSpec("toy", toy, run_diagonal_toy)]
    base = preset.vit.model_dump(mode="json")
    for k in range(preset.vit_seeds):
        name = f"vit_s{k}"
        cfg = validate_config(base, [f"name={name}", f"seed={preset.vit.seed + seed + k}"])
        specs.append(RunSpec(name, cfg, _train_runner))
    return specs


# -- analysis: the toy ------------------------------------------------------------------------
def rescaled_time(steps: np.ndarray, lr: float, alpha: float) -> np.ndarray:
    """τ = η·t / log(1/α): gradient-flow time in units of log(1/α).

    Args:
        steps: ``[n]`` GD steps t.
        lr: step size η.
        alpha: init scale in (0, 1).
    Returns:
        ``[n]`` float64, dimensionless.
    Raises:
        ValueError: if ``alpha`` is not in (0, 1).
    References:
        Abbe et al. (2023), arXiv 2306.07042, Sec. 4 and Fig. 2 (time rescaled by log(1/α)).
    """
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1) (got alpha={alpha})")
    return lr * np.asarray(steps, dtype=np.float64) / math.log(1.0 / alpha)


def find_drops(
    tau: np.ndarray,
    loss: np.ndarray,
    *,
    fall: float = DROP_FALL,
    rel_window: float | None = DROP_REL_WINDOW,
    abs_window: float | None = None,
) -> list[tuple[int, int, int]]:
    """Sharp loss drops: runs of indices where the loss falls by ≥ ``fall`` within a window.

    Index ``i`` is flagged when ``loss[j] <= (1 − fall)·loss[i]`` for ``j`` the last index with
    ``tau[j] <= tau[i]·(1 + rel_window)`` (or ``tau[i] + abs_window``). A drop runs from the
    first to the last ``j`` of a run of consecutive flagged indices; drops that overlap merge.

    Args:
        tau: ``[n]`` rescaled times, increasing.
        loss: ``[n]`` losses (> 0).
        fall: fractional fall that makes a drop, in (0, 1).
        rel_window: window relative to τ (exclusive with ``abs_window``).
        abs_window: absolute window in τ units.
    Returns:
        ``(start, end, steepest)`` indices per drop, in order; ``steepest`` is where log-loss
        falls fastest per unit τ inside the drop.
    Raises:
        ValueError: if not exactly one of ``rel_window``, ``abs_window`` is given, or ``tau``
            and ``loss`` differ in length.
    """
    if (rel_window is None) == (abs_window is None):
        raise ValueError("give exactly one of rel_window, abs_window (got both or neither)")
    tau, loss = np.asarray(tau, dtype=np.float64), np.asarray(loss, dtype=np.float64)
    if tau.shape != loss.shape or tau.ndim != 1:
        raise ValueError(f"tau and loss must be 1-d of one length (got {tau.shape}, {loss.shape})")
    if len(tau) < 2:
        return []
    limit = tau * (1 + rel_window) if rel_window is not None else tau + abs_window
    j = np.searchsorted(tau, limit, side="right") - 1  # last index inside each window
    flagged = (j > np.arange(len(tau))) & (loss[j] <= (1 - fall) * loss)
    drops: list[list[int]] = []
    i = 0
    while i < len(tau):
        if not flagged[i]:
            i += 1
            continue
        k = i
        while k + 1 < len(tau) and flagged[k + 1]:
            k += 1
        start, end = i, int(j[k])
        if drops and start <= drops[-1][1]:
            drops[-1][1] = max(drops[-1][1], end)
        else:
            drops.append([start, end])
        i = k + 1
    log_loss = np.log(np.maximum(loss, 1e-300))
    slope = np.diff(log_loss) / np.maximum(np.diff(tau), 1e-300)  # slope[i]: i -> i + 1
    out = []
    for start, end in drops:
        steepest = start + int(np.argmin(slope[start:end])) if end > start else start
        out.append((start, end, steepest))
    return out


def plateaus(n: int, drops: list[tuple[int, int, int]]) -> list[tuple[int, int]]:
    """Index intervals ``(first, last)`` around the drops of a length-``n`` trace: before the
    first drop, between drops, after the last; an empty one (a drop that runs to the end of
    the trace) is left out, so there are ``len(drops) + 1`` or ``len(drops)`` of them."""
    edges = [0]
    for start, end, _ in drops:
        edges += [start, end]
    edges.append(n - 1)
    spans = [(edges[2 * k], edges[2 * k + 1]) for k in range(len(edges) // 2)]
    return [(a, b) for a, b in spans if b > a]


def active_counts(values: np.ndarray, alpha: float, factor: float = T2_ACTIVE_FACTOR) -> np.ndarray:
    """Active entries ``#{i : |values[t, i] − values[0, i]| > factor·α}`` per logged step.

    Args:
        values: ``[n_steps, d_model]`` a diagonal (``w_Q⊙w_K`` or ``w_V⊙w_O``) over time; row 0
            is the initialisation.
        alpha: init scale.
        factor: threshold in units of α (S10: 10, ≫ the α² scale of the initial products).
    Returns:
        ``[n_steps]`` int counts (the rank of the diagonal Δ above the threshold).
    """
    return (np.abs(values - values[:1]) > factor * alpha).sum(axis=-1)


def switch_on_index(
    values: np.ndarray, alpha: float, factor: float = T2_ACTIVE_FACTOR
) -> list[int]:
    """For each entry active at the end (``|Δ| > factor·α``), the first logged index where its
    ``|Δ|`` reaches half of its final value (a reading of "switches on" that does not depend on
    α; reported beside t2, not gated).

    Args:
        values: ``[n_steps, d_model]`` a diagonal over time, row 0 the initialisation.
        alpha: init scale.
        factor: activity threshold in units of α.
    Returns:
        Indices, sorted ascending (one per entry active at the end).
    """
    delta = np.abs(values - values[:1])
    final = delta[-1]
    out = [
        int(np.argmax(delta[:, i] >= final[i] / 2)) for i in np.flatnonzero(final > factor * alpha)
    ]
    return sorted(out)


def _toy_traces(run: Run) -> tuple[DiagonalToyConfig, np.ndarray, dict[str, np.ndarray]]:
    """Config, logged steps ``[n]`` and traces ``loss [n, n_alpha]``, ``qk``/``ov`` ``[n,
    n_alpha, d_model]`` (a one-element tensor is stored as a scalar: one α gives scalar rows)."""
    cfg = DiagonalToyConfig.model_validate(run.config)
    n_alpha = len(cfg.alphas)
    traces = {}
    for key in ("loss", "qk", "ov"):
        try:
            steps, values = run.tensors(key)
        except KeyError:
            series = run.scalar(key)
            steps, values = series.index.to_numpy(), series.to_numpy(dtype=np.float64)
        traces[key] = values.reshape(len(steps), n_alpha, -1).astype(np.float64)
    traces["loss"] = traces["loss"][..., 0]
    return cfg, steps, traces


def _analyze_toy(run: Run, figures: Path) -> tuple[list[Verdict], list[Path], list[dict]]:
    cfg, steps, tr = _toy_traces(run)
    alphas = list(cfg.alphas)
    n_teacher = sum(c != 0 for c in cfg.strengths)
    per_alpha = {}
    rows = []
    for j, alpha in enumerate(alphas):
        tau = rescaled_time(steps, cfg.lr, alpha)
        loss = tr["loss"][:, j]
        drops = find_drops(tau, loss)
        literal = find_drops(tau, loss, rel_window=None, abs_window=DROP_ABS_WINDOW)
        spans = plateaus(len(tau), drops)
        counts = {p: active_counts(tr[p][:, j], alpha) for p in ("qk", "ov")}
        mids = [int(np.searchsorted(tau, (tau[a] + tau[b]) / 2)) for a, b in spans]
        at_mid = {p: [int(counts[p][m]) for m in mids] for p in counts}
        rises = {p: [b - a for a, b in zip(v, v[1:])] for p, v in at_mid.items()}
        on = {p: switch_on_index(tr[p][:, j], alpha) for p in ("qk", "ov")}
        half_mid = {p: [sum(i <= m for i in on[p]) for m in mids] for p in on}
        per_alpha[alpha] = {
            "tau": tau,
            "drops": drops,
            "spans": spans,
            "counts": counts,
            "drop_tau": [float(tau[s]) for _, _, s in drops],
        }
        rows.append(
            {
                "alpha": alpha,
                "drops": len(drops),
                "plateaus": len(spans),
                "drop_tau (steepest)": ", ".join(f"{tau[s]:.2f}" for _, _, s in drops),
                "drops with |Δτ| ≤ 0.05 (S10 literal)": len(literal),
                "qk active at plateaus": " → ".join(map(str, at_mid["qk"])),
                "ov active at plateaus": " → ".join(map(str, at_mid["ov"])),
                "max rise": max((r for v in rises.values() for r in v), default=0),
                "qk switch-on τ (½ final)": ", ".join(f"{tau[i]:.2f}" for i in on["qk"]),
                "ov switch-on τ (½ final)": ", ".join(f"{tau[i]:.2f}" for i in on["ov"]),
                "qk on (½ final) at plateaus": " → ".join(map(str, half_mid["qk"])),
                "ov on (½ final) at plateaus": " → ".join(map(str, half_mid["ov"])),
                "qk active at end": int(counts["qk"][-1]),
                "ov active at end": int(counts["ov"][-1]),
                "final loss": float(loss[-1]),
                "tau_end": float(tau[-1]),
            }
        )
    smallest = min(alphas)
    small = per_alpha[smallest]
    row_small = next(r for r in rows if r["alpha"] == smallest)
    n_plateaus = len(small["spans"])
    verdicts = [
        Verdict(
            f"t1: the loss vs τ is stagewise at α = {smallest:g} (plateaus between sharp drops)",
            "plateaus in loss vs τ = η t / log(1/α) (drop: ≥ 30% fall between τ and 1.05 τ)",
            float(n_plateaus),
            float(T1_MIN_PLATEAUS),
            bool(n_plateaus >= T1_MIN_PLATEAUS),
            f"measured >= threshold; drops at τ = {row_small['drop_tau (steepest)'] or 'none'}; "
            f"S10's literal window (≥ 30% within Δτ ≤ {DROP_ABS_WINDOW}) finds "
            f"{row_small['drops with |Δτ| ≤ 0.05 (S10 literal)']} drops",
        )
    ]
    # t2
    gated = [r for r in rows if r["alpha"] <= T2_MAX_ALPHA * (1 + 1e-9)]
    if gated:
        worst = max(r["max rise"] for r in gated)
        finals = [(r["alpha"], r["qk active at end"], r["ov active at end"]) for r in gated]
        final_ok = all(q == n_teacher and o == n_teacher for _, q, o in finals)
        t2_pass = bool(worst <= T2_MAX_RISE and final_ok)
        notes = "; ".join(
            f"α={r['alpha']:g}: qk {r['qk active at plateaus']}, ov {r['ov active at plateaus']} "
            f"(not gated: entries past ½ their final |Δ|: qk {r['qk on (½ final) at plateaus']}, "
            f"ov {r['ov on (½ final) at plateaus']})"
            for r in gated
        )
    else:
        worst, t2_pass, notes = float("nan"), False, "no α ≤ 1e-2 in this preset"
        finals = []
    verdicts.append(
        Verdict(
            "t2: each stage switches on at most one entry of w_Q⊙w_K and of w_V⊙w_O; all "
            f"{n_teacher} teacher entries are on at the end (α ≤ {T2_MAX_ALPHA:g})",
            f"max rise of #{{i : |Δ entry_i| > {T2_ACTIVE_FACTOR:g}α}} between consecutive "
            "plateaus (counts at plateau midpoints)",
            float(worst),
            float(T2_MAX_RISE),
            t2_pass,
            f"measured <= threshold and final counts = {n_teacher}; {notes}; final (qk, ov): "
            + ", ".join(f"α={a:g}: ({q}, {o})" for a, q, o in finals),
        )
    )
    # t3
    if len(alphas) >= 2:
        a1, a2 = sorted(alphas)[:2]
        t_1, t_2 = per_alpha[a1]["drop_tau"], per_alpha[a2]["drop_tau"]
        n = min(len(t_1), len(t_2))
        rel = [abs(t_2[k] - t_1[k]) / t_1[k] for k in range(n)]
        worst3 = max(rel) if rel else float("nan")
        t3_pass = bool(rel and len(t_1) == len(t_2) and worst3 <= T3_REL_TOL)
        detail = (
            f"measured <= threshold and equal drop counts; τ_k(α={a1:g}) = "
            + ", ".join(f"{t:.2f}" for t in t_1)
            + f"; τ_k(α={a2:g}) = "
            + ", ".join(f"{t:.2f}" for t in t_2)
        )
        name = f"|τ_k({a2:g}) − τ_k({a1:g})| / τ_k({a1:g})"
    else:
        worst3, t3_pass, detail, name = float("nan"), False, "needs two α", "n/a"
    verdicts.append(
        Verdict(
            "t3: stage times collapse in rescaled time τ as α → 0",
            f"max over drops k of {name}",
            float(worst3),
            T3_REL_TOL,
            t3_pass,
            detail,
        )
    )
    figs = _toy_figures(cfg, alphas, tr, per_alpha, figures)
    return verdicts, figs, rows


def _toy_figures(cfg, alphas, tr, per_alpha, figures: Path) -> list[Path]:
    paths = []
    fig, (ax1, ax2) = new_figure(
        2, width=5.2, height=3.6, title="toy: diagonal attention head in rescaled time"
    )
    for j, alpha in enumerate(alphas):
        info = per_alpha[alpha]
        tau = info["tau"]
        (line,) = ax1.semilogy(tau, tr["loss"][:, j], label=f"α={alpha:g}")
        for start, end, steepest in info["drops"]:
            ax1.axvline(tau[steepest], color=line.get_color(), ls=":", lw=1)
            if alpha == min(alphas):
                ax1.axvspan(tau[start], tau[end], color=line.get_color(), alpha=0.12, lw=0)
        ax2.step(
            tau, info["counts"]["qk"], where="post", color=line.get_color(), label=f"α={alpha:g}"
        )
        ax2.step(tau, info["counts"]["ov"], where="post", color=line.get_color(), ls="--")
    tau_max = max(per_alpha[min(alphas)]["tau"][-1], 1e-9)
    ax1.set(
        xlabel="τ = η t / log(1/α)",
        ylabel="MSE",
        xlim=(0, tau_max),
        title="loss (dotted: drop centres; shaded: drops at min α)",
    )
    ax1.legend()
    ax2.set(
        xlabel="τ",
        ylabel="active entries",
        xlim=(0, tau_max),
        title=f"active: |Δ entry| > {T2_ACTIVE_FACTOR:g}α (solid qk, dashed ov)",
    )
    ax2.legend(ncol=2, loc="lower right")
    paths.append(save_figure(fig, figures / "toy_loss.png"))

    fig, axes = new_figure(len(alphas), 2, width=3.6, height=2.8, title="toy: entries over τ")
    n_teacher = sum(c != 0 for c in cfg.strengths)
    for j, alpha in enumerate(alphas):
        info = per_alpha[alpha]
        for row, product in enumerate(("qk", "ov")):
            ax = axes[row * len(alphas) + j]
            values = tr[product][:, j]
            for i in range(values.shape[1]):
                style = {"lw": 1.5} if i < n_teacher else {"color": "grey", "lw": 0.8, "alpha": 0.6}
                label = f"entry {i + 1}" if i < n_teacher else "_other"
                if i == n_teacher:
                    label = "entries without a teacher component"
                ax.plot(info["tau"], values[:, i], label=label, **style)
            for _, _, steepest in info["drops"]:
                ax.axvline(info["tau"][steepest], color="k", ls=":", lw=0.8)
            ax.set(
                xlabel="τ",
                ylabel=f"w_{'Q⊙w_K' if product == 'qk' else 'V⊙w_O'} entries",
                title=f"{product}, α={alpha:g}",
                xlim=(0, tau_max),
            )
    axes[0].legend(fontsize=7)  # the same colour per entry in every panel
    paths.append(save_figure(fig, figures / "toy_entries.png"))
    return paths


# -- analysis: the ViT ------------------------------------------------------------------------
def _d_head(run: Run) -> int:
    model = run.config["model"]
    return int(model.get("d_head") or model["d_model"] // model["n_heads"])


def _layer_series(run: Run, product: str) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per layer: (steps, head-mean srank) of ``product`` (``dqk``/``dov``), step 0 dropped."""
    out = {}
    for layer in range(int(run.config["model"]["n_layers"])):
        series = run.scalar(f"L{layer}.{product}.mean.stable_rank")
        series = series[series.index > 0]
        out[layer] = (series.index.to_numpy(), series.to_numpy(dtype=np.float64))
    return out


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    from scipy.stats import spearmanr

    if len(x) < 3 or np.ptp(y) == 0 or not np.isfinite(y).all():
        return float("nan")
    return float(spearmanr(x, y).statistic)


def _analyze_vit(runs: list[Run], figures: Path) -> tuple[list[Verdict], list[Path], list[dict]]:
    rows = []
    for run in runs:
        d_head = _d_head(run)
        for product in ("dqk", "dov"):
            for layer, (steps, srank) in _layer_series(run, product).items():
                rows.append(
                    {
                        "run": run.name,
                        "status": run.status,
                        "product": product,
                        "layer": layer,
                        "spearman_rho": _spearman(steps, srank),
                        "srank_end": float(srank[-1]) if len(srank) else float("nan"),
                        "srank_max": float(srank.max()) if len(srank) else float("nan"),
                        "d_head": d_head,
                        "val.accuracy": _final(run, "val.accuracy"),
                    }
                )
    qk = [r for r in rows if r["product"] == "dqk"]
    ov = [r for r in rows if r["product"] == "dov"]
    rhos = [r["spearman_rho"] for r in qk]
    worst_rho = float("nan") if not rhos or any(math.isnan(x) for x in rhos) else min(rhos)
    ends = [r["srank_end"] / r["d_head"] for r in qk]
    worst_end = float("nan") if not ends or any(math.isnan(x) for x in ends) else max(ends)

    def listing(items, key):
        return ", ".join(f"{r['run']} L{r['layer']}: {r[key]:.3g}" for r in items)

    acc = ", ".join(f"{run.name}: {_final(run, 'val.accuracy'):.3f}" for run in runs)
    verdicts = [
        Verdict(
            "v1-rise: in every layer of the ViT the head-mean stable rank of ΔW_QK rises over "
            "training",
            "min over layers of Spearman ρ(step, head-mean srank(Δ_QK)) over the log-points",
            worst_rho,
            V1_MIN_RHO,
            bool(worst_rho >= V1_MIN_RHO),
            f"measured >= threshold; ρ per layer: {listing(qk, 'spearman_rho')}; Δ_OV (not "
            f"gated): {listing(ov, 'spearman_rho')}; val accuracy {acc}",
        ),
        Verdict(
            "v1-end: ΔW_QK stays low-rank: head-mean srank(Δ_QK) at the last step ≤ d_head/4 "
            "in every layer",
            "max over layers of srank(Δ_QK)_end / d_head",
            worst_end,
            V1_SRANK_FRACTION,
            bool(worst_end <= V1_SRANK_FRACTION),
            f"measured <= threshold; srank(Δ_QK) at the end: {listing(qk, 'srank_end')} "
            f"(d_head {qk[0]['d_head'] if qk else '?'}); srank(Δ_OV): {listing(ov, 'srank_end')}",
        ),
    ]
    return verdicts, _vit_figures(runs, figures), rows


def _final(run: Run, key: str) -> float:
    try:
        return run.last(key)
    except KeyError:
        return float("nan")


def _vit_figures(runs: list[Run], figures: Path) -> list[Path]:
    paths = []
    fig, axes = new_figure(2, title="ViT on digits: stable rank of ΔW per layer (head mean ± std)")
    for ax, product, label in zip(axes, ("dqk", "dov"), ("Δ_QK", "Δ_OV")):
        for run in runs:
            n_layers = int(run.config["model"]["n_layers"])
            for layer in range(n_layers):
                mean = run.scalar(f"L{layer}.{product}.mean.stable_rank")
                std = run.scalar(f"L{layer}.{product}.std.stable_rank")
                mean, std = mean[mean.index > 0], std[std.index > 0]
                (line,) = ax.plot(mean.index, mean.values, "o-", ms=3, label=f"{run.name} L{layer}")
                ax.fill_between(
                    mean.index,
                    mean.values - std.values,
                    mean.values + std.values,
                    color=line.get_color(),
                    alpha=0.15,
                    lw=0,
                )
        if runs:
            ax.axhline(V1_SRANK_FRACTION * _d_head(runs[0]), color="grey", ls=":", lw=1)
        ax.set_xscale("log")
        ax.set(xlabel="step", ylabel=f"srank({label})", title=f"{label} (dotted: d_head/4)")
        ax.legend()
    paths.append(save_figure(fig, figures / "vit_srank.png"))

    if runs:
        run = runs[0]
        fig, axes = new_figure(
            2, title=f"{run.name}: spectrum of Δ_QK (head 0, s_i/s_1) over steps"
        )
        try:
            steps, s = run.tensors("dqk.normalized_singular_values")  # [n, L, H, 2 d_head]
        except KeyError:
            steps, s = np.array([]), np.zeros((0, 1, 1, 1))
        keep = [k for k, t in enumerate(steps) if t > 0]
        chosen = keep[:: max(1, len(keep) // 6)] + keep[-1:] if keep else []
        for layer, ax in enumerate(axes[: s.shape[1]]):
            for k in dict.fromkeys(chosen):
                ax.semilogy(
                    np.arange(1, s.shape[-1] + 1),
                    np.maximum(s[k, layer, 0], 1e-8),
                    label=f"step {steps[k]}",
                )
            ax.set(xlabel="index i", ylabel="s_i / s_1", title=f"L{layer}", ylim=(1e-4, 1.5))
            if chosen:
                ax.legend(ncol=2)
        paths.append(save_figure(fig, figures / "vit_delta_spectra.png"))
    return paths


def analyze(runs: dict[str, Run], figures: Path) -> Analysis:
    """Verdicts t1–t3 (toy) and v1-rise, v1-end (ViT) from the stored runs; figures."""
    verdicts, figs, rows = _analyze_toy(runs["toy"], figures)
    tables = {"toy: stages per α": rows}
    vit_runs = [runs[name] for name in sorted(runs) if name.startswith("vit")]
    v, f, vit_rows = _analyze_vit(vit_runs, figures)
    tables["ViT: stable rank of ΔW per layer"] = vit_rows
    return Analysis(verdicts + v, figs + f, tables)


STUDY = Study(
    name="gradual-rank",
    claim=CLAIM,
    source=SOURCE,
    presets={"smoke": smoke, "fast": fast, "paper": paper},
    build_runs=build_runs,
    analyze=analyze,
)
