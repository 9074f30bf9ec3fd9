"""Study ``weight-decay-low-rank`` (SYSTEMS.md S1): weight decay makes W_QK and W_OV low-rank.

Source: S. Kobayashi, Y. Akram, J. von Oswald, "Weight decay induces low-rank attention layers",
NeurIPS 2024, arXiv 2410.23819.

Finding: L2 on the factors A, B of a product ABᵀ acts, after a transient, as a nuclear-norm
penalty on the product: gradient flow balances the factors as e^{-2λt}
(d/dt (AᵀA − BᵀB) = −2λ(AᵀA − BᵀB)), balanced factors have ½(‖A‖²+‖B‖²) = ‖ABᵀ‖_*, and the
product's singular values end soft-thresholded. Each head holds two such products
(W_QK = W_Q W_Kᵀ, W_OV = W_V W_O), so weight decay lowers their rank.

Parts (each a set of runs; ``analyze`` reads only their stores):

(a) 5×5 toy ``‖ABᵀ − D‖² + (λ/2)(‖A‖²+‖B‖²)``, D = diag(0.2, …, 1.0), full-batch plain GD in
    float64, every λ batched in one tensor (same initial A, B for all λ, drawn independently
    N(0, 0.3²) so balancedness starts non-zero), η = 0.05, 1000 steps.
    Discrete theory (ours, exact): with X = ∇_A, Y = ∇_B of the penalised loss and
    M = AᵀA − BᵀB, one GD step gives M' = (1 − 2ηλ)M + η²(XᵀX − YᵀY) (expand A' = A − ηX,
    B' = B − ηY and use the gradient-flow identity XᵀA + AᵀX − YᵀB − BᵀY = 2λM). Near a
    minimum the last term is second order, so the log-slope per step tends to log(1 − 2ηλ)
    = −2ηλ(1 + ηλ + …), the gradient-flow rate −2λ per unit time up to O(ηλ). SYSTEMS.md's
    "(1 − ηλ)² per step" omits the −η²λ² term. With data_scale·‖·‖², the end point is
    σ_i = max(d_i − cλ, 0), c = 1/(2·data_scale) (c = ½ here).
(b) attention-only 2-layer transformer on associative recall, λ_attn ∈ {0, 0.01, 0.1, 1} on
    W_Q, W_K, W_V, W_O (AdamW, decoupled), λ_other = 0.01 on the other matrices.
(c) byte-level LM on the Python standard library's sources: uniform decay (λ on all matrices)
    vs decay decoupled away from attention (λ_attn = 0), λ = 1, lr 3e-3 (lr·λ·steps ≥ 1).

Verdicts (thresholds are SYSTEMS.md's proposals, frozen before the first fast run; the
measured values are reported whatever they are):

- a1: fit window for λ > 0: the steps after the loss transient (from the first step whose
  relative loss change is < 1e-6) while b_t/b_0 > 1e-12. SYSTEMS.md proposes a floor of 1e-8;
  measured once on the fast grid, b_t/b_0 is already below 1e-8 when the loss settles for
  λ ≥ 0.4, and float64 rounding of AᵀA − BᵀB sits near 1e-16·‖A‖², so 1e-12 keeps a clean
  window. Least-squares slope r̂ of log b_t (NaN, and a failed claim, with < 10 points);
  passes if max over λ of |r̂/(−2ηλ) − 1| ≤ 0.1 (the gradient-flow rate; the discrete rate
  log(1 − 2ηλ) is reported beside it). For λ = 0, b_T/b_0 ≥ 0.5 (gradient flow conserves it;
  GD drifts by O(η²)).
- a2: max over λ > 0 of gap/L2-term at the last step ≤ 1e-4.
- a3: max |σ_i(T) − max(d_i − cλ, 0)| over all (i, λ) with |d_i − cλ| ≥ 0.05 ≤ 1e-3
  (main and fine λ grids); marginal modes (|d_i − cλ| < 0.05) converge sublinearly and are
  reported, not gated.
- b: head-mean rank_{1e-2} of W_QK and of W_OV at the last step non-increasing along
  λ_attn = 0 → 0.01 → 0.1 → 1 (each step may rise by ≤ 0.5), and rank(λ=1) ≤ rank(λ=0) − 2.
  Effective rank and validation accuracy are reported; if λ = 1 sits at chance the verdict
  detail says the drop co-occurs with collapse.
- c: mean validation loss (nats/byte) of uniform − decoupled > 0; ranks reported per condition.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator
from pydantic import BaseModel, ConfigDict, Field

from dynascope.config import RunConfig, validate_config
from dynascope.probes.spectral import balancedness, factor_singular_values, l2_nuclear_gap, l2_term
from dynascope.report import new_figure, save_figure
from dynascope.store import Run, RunStore
from dynascope.studies.base import Analysis, RunSpec, Study, Verdict
from dynascope.tasks import MatrixFactorization
from dynascope.train import run_training

__all__ = ["ToyConfig", "WeightDecayLowRankPreset", "run_factor_toy", "STUDY"]

CLAIM = (
    "Weight decay on the factors of W_QK = W_Q W_K^T and W_OV = W_V W_O acts as a nuclear-norm "
    "penalty on the products and lowers their rank; decaying attention less helps language "
    "modelling."
)
SOURCE = (
    "Kobayashi, Akram, von Oswald, 'Weight decay induces low-rank attention layers', "
    "NeurIPS 2024, arXiv 2410.23819"
)

# Frozen thresholds (see the module docstring for how each was set).
A1_RATE_TOL = 0.1
A1_SETTLED = 1e-6
A1_FLOOR = 1e-12
A1_ZERO_LAMBDA_KEEP = 0.5
A2_GAP_REL = 1e-4
A3_SIGMA_TOL = 1e-3
A3_MARGIN = 0.05
B_RISE_TOL = 0.5
B_DROP = 2.0
C_LOSS_GAP = 0.0


class ToyConfig(BaseModel):
    """Part (a): the 5×5 matrix-factorization toy under full-batch GD (float64)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["factor_toy"] = "factor_toy"
    seed: int = Field(0, ge=0)
    steps: int = Field(1000, ge=1)
    lr: float = Field(0.05, gt=0, description="GD step η")
    lambdas: list[float] = Field(default_factory=lambda: [0.0, 0.1, 0.2, 0.4, 0.8])
    fine_lambdas: int = Field(41, ge=0, description="extra λ grid in [0, 1] for the σ–λ figure")
    init_std: float = Field(0.3, gt=0)
    data_scale: float = Field(1.0, gt=0, description="data term data_scale·‖ABᵀ − D‖²")


class WeightDecayLowRankPreset(BaseModel):
    """A preset: the toy config, the recall base run and λ grid, the LM base run and λ."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    toy: ToyConfig
    recall: RunConfig
    recall_lambdas: list[float]
    lm: RunConfig
    lm_lambda: float = Field(gt=0)


def run_factor_toy(config: ToyConfig, run_dir: Path, *, progress: bool = False) -> None:
    """Train the toy for every λ at once (batched) and log per-step tensors over λ.

    Logged (tensors over the λ grid ``[n_lambda]`` unless noted): ``balancedness``,
    ``l2_term``, ``gap``, ``loss`` every step; ``sigma`` ``[n_lambda, 5]`` every step;
    ``lambdas`` at step 0; ``fine.lambdas`` and ``fine.sigma`` ``[n_fine, 5]`` at the last step.
    """
    del progress
    task = MatrixFactorization(data_scale=config.data_scale)
    lambdas = torch.tensor(config.lambdas, dtype=torch.float64)
    fine = torch.linspace(0.0, 1.0, config.fine_lambdas, dtype=torch.float64)
    all_lambdas = torch.cat([lambdas, fine])
    generator = torch.Generator().manual_seed(config.seed)
    A0, B0 = task.init_factors(1, generator, std=config.init_std)
    A = A0.expand(len(all_lambdas), -1, -1).clone()
    B = B0.expand(len(all_lambdas), -1, -1).clone()
    n = len(lambdas)
    with RunStore(run_dir) as store:
        store.truncate_after(-1)  # a re-run replaces the directory's rows
        store.write_config(config.model_dump(mode="json"))
        store.set_status(0, "running")
        store.log(0, {"lambdas": lambdas})
        for step in range(config.steps + 1):
            if step > 0:
                A, B = task.gradient_step(A, B, all_lambdas, config.lr)
            store.log(
                step,
                {
                    "balancedness": balancedness(A[:n], B[:n]),
                    "l2_term": l2_term(A[:n], B[:n]),
                    "gap": l2_nuclear_gap(A[:n], B[:n]),
                    "loss": task.loss(A[:n], B[:n], lambdas),
                    "sigma": factor_singular_values(A[:n], B[:n]),
                },
            )
        if config.fine_lambdas:
            store.log(
                config.steps,
                {
                    "fine.lambdas": fine,
                    "fine.sigma": factor_singular_values(A[n:], B[n:]),
                },
            )
        store.set_status(config.steps, "finished")


def _train_runner(
    config: RunConfig,
    run_dir: Path,
    *,
    progress: bool = False,
    device: str | None = None,
    resume: bool = False,
) -> None:
    if device is not None:  # --device: the run's own default otherwise
        config = config.model_copy(update={"device": device})
    run_training(config, run_dir, progress=progress, resume=resume)


# -- presets ----------------------------------------------------------------------------------
def _recall_run(d_model: int, steps: int, batch_size: int) -> RunConfig:
    return validate_config(
        {
            "name": "recall",
            "model": {
                "name": "transformer",
                "n_layers": 2,
                "d_model": d_model,
                "n_heads": 2,
                "d_mlp": 0,
                "use_ln": False,
                "positional": "learned",
            },
            "task": {"name": "associative_recall", "n_keys": 16, "n_values": 16, "n_pairs": 8},
            "optimizer": {
                "name": "adamw",
                "lr": 3e-3,
                "weight_decay": {"attention": 0.0, "matrices": 0.01, "vectors": 0.0},
            },
            "train": {
                "steps": steps,
                "batch_size": batch_size,
                "eval_every": max(1, steps // 4),
                "eval_batches": 8,
                "checkpoint_every": steps,
                "log_every": 10,
            },
            "monitor": {"probes": ["qk_spectrum", "ov_spectrum"], "schedule": "log", "points": 25},
        }
    )


def _lm_run(
    d_model: int, n_heads: int, n_ctx: int, steps: int, batch_size: int, text: str | None = None
) -> RunConfig:
    return validate_config(
        {
            "name": "lm",
            "model": {
                "name": "transformer",
                "n_layers": 2,
                "d_model": d_model,
                "n_heads": n_heads,
                "d_mlp": 4 * d_model,
                "use_ln": True,
            },
            "task": {"name": "char_lm", "n_ctx": n_ctx, "text": text},
            "optimizer": {"name": "adamw", "lr": 3e-3},
            "train": {
                "steps": steps,
                "batch_size": batch_size,
                "eval_every": max(1, steps // 4),
                "eval_batches": 16,
                "checkpoint_every": steps,
                "log_every": 10,
            },
            "monitor": {"probes": ["qk_spectrum", "ov_spectrum"], "schedule": "log", "points": 10},
        }
    )


_SMOKE_TEXT = (
    "def add(a, b):\n    return a + b\n\n\nclass Point:\n    def __init__(self, x, y):\n"
    "        self.x = x\n        self.y = y\n" * 20
)


def smoke() -> WeightDecayLowRankPreset:
    """Plumbing only: seconds."""
    return WeightDecayLowRankPreset(
        toy=ToyConfig(steps=50, lambdas=[0.0, 0.4], fine_lambdas=5),
        recall=_recall_run(d_model=16, steps=30, batch_size=32),
        recall_lambdas=[0.0, 1.0],
        lm=_lm_run(d_model=16, n_heads=2, n_ctx=16, steps=20, batch_size=8, text=_SMOKE_TEXT),
        lm_lambda=1.0,
    )


def fast() -> WeightDecayLowRankPreset:
    """≤ 3 minutes on 2 CPU cores. Step counts were fixed from measured step times."""
    return WeightDecayLowRankPreset(
        toy=ToyConfig(),
        recall=_recall_run(d_model=32, steps=3000, batch_size=128),
        recall_lambdas=[0.0, 0.01, 0.1, 1.0],
        lm=_lm_run(d_model=64, n_heads=4, n_ctx=64, steps=1000, batch_size=32),
        lm_lambda=1.0,
    )


def paper() -> WeightDecayLowRankPreset:
    """Closer to the paper's scale (GPU): longer recall training, a 10-layer d_model 512 LM.

    One seed per preset run; use ``--seed`` for more.
    """
    lm = _lm_run(d_model=512, n_heads=8, n_ctx=256, steps=20_000, batch_size=64)
    lm = validate_config(
        lm.model_dump(mode="json"),
        [
            "model.n_layers=10",
            "device=cuda",
            "optimizer.warmup_steps=500",
            "optimizer.lr_schedule=cosine",
            "optimizer.lr=0.001",
        ],
    )
    return WeightDecayLowRankPreset(
        toy=ToyConfig(),
        recall=_recall_run(d_model=32, steps=10_000, batch_size=128),
        recall_lambdas=[0.0, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0],
        lm=lm,
        lm_lambda=0.1,
    )


def build_runs(preset: WeightDecayLowRankPreset, seed: int = 0) -> list[RunSpec]:
    """The toy run, one recall run per λ_attn, and the two LM conditions."""
    toy = preset.toy.model_copy(update={"seed": preset.toy.seed + seed})
    specs = [RunSpec("a_toy", toy, run_factor_toy)]
    base = preset.recall.model_dump(mode="json")
    for lam in preset.recall_lambdas:
        name = f"b_recall_wd{lam:g}"
        cfg = validate_config(
            base,
            [
                f"name={name}",
                f"seed={preset.recall.seed + seed}",
                f"optimizer.weight_decay.attention={lam}",
            ],
        )
        specs.append(RunSpec(name, cfg, _train_runner))
    lm_base = preset.lm.model_dump(mode="json")
    lam = preset.lm_lambda
    for condition, attention in (("uniform", lam), ("decoupled", 0.0)):
        name = f"c_lm_{condition}"
        cfg = validate_config(
            lm_base,
            [
                f"name={name}",
                f"seed={preset.lm.seed + seed}",
                f"optimizer.weight_decay.attention={attention}",
                f"optimizer.weight_decay.matrices={lam}",
            ],
        )
        specs.append(RunSpec(name, cfg, _train_runner))
    return specs


# -- analysis ---------------------------------------------------------------------------------
def _settled_step(loss: np.ndarray, tol: float) -> int:
    """First step t whose relative loss change |ℓ_t − ℓ_{t−1}| / |ℓ_t| is below ``tol``."""
    rel = np.abs(np.diff(loss)) / np.maximum(np.abs(loss[1:]), 1e-300)
    below = np.flatnonzero(rel < tol)
    return int(below[0]) + 1 if below.size else len(loss)


def _fit_log_slope(b: np.ndarray, start: int, floor: float) -> float:
    """Least-squares slope of log b_t for t >= start, floor < b_t/b_0 < 1 (NaN: < 10 points)."""
    t = np.arange(len(b))
    rel = b / b[0]
    keep = (t >= start) & (rel > floor) & (rel < 1.0)
    if keep.sum() < 10:
        return float("nan")
    slope, _ = np.polyfit(t[keep], np.log(b[keep]), 1)
    return float(slope)


def _analyze_toy(run: Run, figures: Path) -> tuple[list[Verdict], list[Path], list[dict]]:
    cfg = ToyConfig.model_validate(run.config)
    lambdas = run.tensors("lambdas")[1][0]
    _, bal = run.tensors("balancedness")  # [T+1, n]
    _, gap = run.tensors("gap")
    _, l2 = run.tensors("l2_term")
    _, loss = run.tensors("loss")
    _, sigma = run.tensors("sigma")  # [T+1, n, 5]
    d = np.asarray(MatrixFactorization(data_scale=cfg.data_scale).diag, dtype=np.float64)
    c = 1.0 / (2.0 * cfg.data_scale)
    eta = cfg.lr
    rows, ratios = [], []
    for j, lam in enumerate(lambdas):
        settled = _settled_step(loss[:, j], A1_SETTLED)
        slope = _fit_log_slope(bal[:, j], settled, A1_FLOOR) if lam > 0 else float("nan")
        theory = -2 * eta * lam
        discrete = math.log(1 - 2 * eta * lam) if 0 < 2 * eta * lam < 1 else float("nan")
        ratio = slope / theory if lam > 0 else float("nan")
        if lam > 0:
            ratios.append(ratio)
        rows.append(
            {
                "lambda": float(lam),
                "loss_settled_step": settled,
                "fitted_log_slope": slope,
                "theory_-2ηλ": float(theory),
                "discrete_log(1-2ηλ)": discrete,
                "ratio": float(ratio),
                "balancedness_T/0": float(bal[-1, j] / bal[0, j]),
                "gap_rel_T": float(gap[-1, j] / l2[-1, j]) if l2[-1, j] > 0 else 0.0,
            }
        )
    positive = lambdas > 0
    worst_rate = max((abs(r - 1) for r in ratios), default=float("nan"))
    if any(math.isnan(r) for r in ratios):
        worst_rate = float("nan")
    keep0 = [float(bal[-1, j] / bal[0, j]) for j in np.flatnonzero(~positive)]
    a1_pass = (
        (not math.isnan(worst_rate))
        and worst_rate <= A1_RATE_TOL
        and all(k >= A1_ZERO_LAMBDA_KEEP for k in keep0)
    )
    gap_rel = np.where(l2[-1] > 0, gap[-1] / np.where(l2[-1] > 0, l2[-1], 1.0), 0.0)
    worst_gap = float(gap_rel[positive].max()) if positive.any() else float("nan")

    # a3 over main and fine grids
    sig_all = [sigma[-1]]
    lam_all = [lambdas]
    try:
        lam_all.append(run.tensors("fine.lambdas")[1][-1])
        sig_all.append(run.tensors("fine.sigma")[1][-1])
    except KeyError:
        pass
    lam_cat = np.concatenate(lam_all)
    sig_cat = np.concatenate(sig_all)  # [m, 5] descending
    pred = np.maximum(d[None, :] - c * lam_cat[:, None], 0.0)[:, ::-1]  # descending like sigma
    margin = np.abs(d[None, :] - c * lam_cat[:, None])[:, ::-1]
    err = np.abs(sig_cat - pred)
    gated = margin >= A3_MARGIN
    worst_sigma = float(err[gated].max()) if gated.any() else float("nan")
    marginal = float(err[~gated].max()) if (~gated).any() else 0.0

    verdicts = [
        Verdict(
            "a1: balancedness decays at rate 2λ per unit time (log-slope −2ηλ per GD step); "
            "conserved at λ = 0",
            "max over λ>0 of |fitted slope / (−2ηλ) − 1|",
            worst_rate,
            A1_RATE_TOL,
            a1_pass,
            f"measured <= threshold; λ=0 keeps b_T/b_0 = {', '.join(f'{k:.3f}' for k in keep0)} "
            f"(needs >= {A1_ZERO_LAMBDA_KEEP})",
        ),
        Verdict(
            "a2: the L2–nuclear gap closes (½(‖A‖²+‖B‖²) → ‖ABᵀ‖_*)",
            "max over λ>0 of gap / L2 term at the last step",
            worst_gap,
            A2_GAP_REL,
            bool(worst_gap <= A2_GAP_REL),
            "measured <= threshold",
        ),
        Verdict(
            "a3: singular values end soft-thresholded, σ_i = max(d_i − cλ, 0)",
            f"max |σ_i − max(d_i − {c:g}λ, 0)| over modes with |d_i − cλ| ≥ {A3_MARGIN}",
            worst_sigma,
            A3_SIGMA_TOL,
            bool(worst_sigma <= A3_SIGMA_TOL),
            f"measured <= threshold; marginal modes (not gated) reach {marginal:.3g}",
        ),
    ]
    figs = _toy_figures(lambdas, bal, gap, l2, sigma, lam_cat, sig_cat, d, c, eta, figures)
    return verdicts, figs, rows


def _toy_figures(lambdas, bal, gap, l2, sigma, lam_cat, sig_cat, d, c, eta, figures: Path):
    t = np.arange(bal.shape[0])
    paths = []
    fig, (ax1, ax2) = new_figure(2, title="(a) 5×5 toy: factor balance and the L2–nuclear gap")
    for j, lam in enumerate(lambdas):
        (line,) = ax1.semilogy(t, np.maximum(bal[:, j], 1e-300), label=f"λ={lam:g}")
        if lam > 0:
            ax1.semilogy(t, bal[0, j] * np.exp(-2 * eta * lam * t), ls=":", color=line.get_color())
        rel = np.where(l2[:, j] > 0, gap[:, j] / np.where(l2[:, j] > 0, l2[:, j], 1), 0)
        ax2.semilogy(t, np.maximum(rel, 1e-16), label=f"λ={lam:g}", color=line.get_color())
    ax1.set(
        xlabel="GD step t",
        ylabel="‖AᵀA − BᵀB‖_F",
        ylim=(1e-16, 1e6),
        title="balancedness (dotted: b₀·exp(−2ηλt))",
    )
    ax2.set(
        xlabel="GD step t",
        ylabel="gap / L2 term",
        ylim=(1e-16, 10),
        title="(½‖A‖²+½‖B‖² − ‖ABᵀ‖_*) / L2",
    )
    ax1.legend(loc="upper right", ncol=3)
    ax2.legend(loc="upper right", ncol=3)
    paths.append(save_figure(fig, figures / "a_balance_gap.png"))

    fig, (ax1, ax2) = new_figure(2, height=3.8, title="(a) singular values of ABᵀ")
    order = np.argsort(lam_cat)
    grid = np.linspace(0, lam_cat.max(), 200)
    for i, di in enumerate(d):
        (line,) = ax1.plot(grid, np.maximum(di - c * grid, 0), ls=":", lw=1, color=f"C{i}")
        ax1.plot(
            lam_cat[order],
            sig_cat[order, len(d) - 1 - i],
            ".",
            color=line.get_color(),
            label=f"d={di:g}",
        )
    ax1.set(xlabel="weight decay λ", ylabel="σ_i(ABᵀ) at the last step", title="last step")
    ax1.set_ylim(-0.03, 1.1)
    j = int(np.argmin(np.abs(lambdas - 0.4)))
    for i, di in enumerate(d):  # the colour of d_i on the left; sigma is descending, d ascending
        ax2.plot(t, sigma[:, j, len(d) - 1 - i], color=f"C{i}")
        ax2.axhline(max(di - c * lambdas[j], 0.0), ls=":", lw=1, color=f"C{i}")
    ax2.set(xlabel="GD step t", ylabel="σ_i(ABᵀ)", title=f"over training, λ = {lambdas[j]:g}")
    ax2.set_ylim(-0.03, 1.1)
    handles, labels = ax1.get_legend_handles_labels()
    handles.append(Line2D([], [], ls=":", color="0.3"))
    labels.append("max(d_i − cλ, 0)")
    fig.legend(
        handles,
        labels,
        loc="outside lower center",
        ncol=len(labels),
        title=f"colour: target singular value d_i; dotted: prediction, c = 1/(2·data_scale) "
        f"= {c:g}",
    )
    paths.append(save_figure(fig, figures / "a_singular_values.png"))
    return paths


def _final(run: Run, key: str) -> float:
    try:
        return run.last(key)
    except KeyError:
        return float("nan")


def _analyze_recall(runs: list[tuple[float, Run]], figures: Path):
    rows = []
    for lam, run in runs:
        rows.append(
            {
                "lambda_attn": lam,
                "status": run.status,
                "qk.rank_1e-2": _final(run, "qk.mean.rank_1e-2"),
                "ov.rank_1e-2": _final(run, "ov.mean.rank_1e-2"),
                "qk.effective_rank": _final(run, "qk.mean.effective_rank"),
                "ov.effective_rank": _final(run, "ov.mean.effective_rank"),
                "val.accuracy": _final(run, "val.accuracy"),
                "val.loss": _final(run, "val.loss"),
            }
        )
    verdicts = []
    chance = 1.0 / 16
    for which in ("qk", "ov"):
        ranks = [r[f"{which}.rank_1e-2"] for r in rows]
        rises = [b - a for a, b in zip(ranks, ranks[1:])]
        drop = ranks[0] - ranks[-1] if ranks else float("nan")
        monotone = all(r <= B_RISE_TOL for r in rises) and not any(math.isnan(x) for x in ranks)
        passed = bool(monotone and drop >= B_DROP)
        listed = ", ".join(f"{x:.2f}" for x in ranks)
        notes = f"ranks {listed}; largest rise {max(rises, default=0):.2f} (≤ {B_RISE_TOL})"
        last_acc = rows[-1]["val.accuracy"] if rows else float("nan")
        notes += (
            f"; val accuracy {rows[0]['val.accuracy']:.3f} at λ={rows[0]['lambda_attn']:g}, "
            f"{last_acc:.3f} at λ={rows[-1]['lambda_attn']:g} (chance {chance:.3f})"
        )
        if last_acc <= chance * 1.5:
            notes += (
                f"; λ={rows[-1]['lambda_attn']:g} is near chance (acc {last_acc:.3f}): "
                "the rank drop co-occurs with collapse"
            )
        verdicts.append(
            Verdict(
                f"b-{which}: head-mean rank of W_{which.upper()} falls as λ_attn grows (recall)",
                "rank_1e-2(λ=0) − rank_1e-2(λ=max), with rank non-increasing along λ",
                drop,
                B_DROP,
                passed,
                "measured >= threshold; " + notes,
            )
        )
    figs = []
    fig, axes = new_figure(2, title="(b) associative recall: head-mean rank vs λ_attn")
    x = np.array([r["lambda_attn"] for r in rows])
    for ax, which in zip(axes, ("qk", "ov")):
        ax.plot(x, [r[f"{which}.rank_1e-2"] for r in rows], "o-", label="rank at 1e-2")
        ax.plot(x, [r[f"{which}.effective_rank"] for r in rows], "s--", label="effective rank")
        ax.set_xscale("symlog", linthresh=0.01)
        ax.set(
            xlabel="λ_attn (AdamW)", ylabel="mean over layers and heads", title=f"W_{which.upper()}"
        )
        ax.legend()
    figs.append(save_figure(fig, figures / "b_rank_vs_lambda.png"))

    fig, axes = new_figure(
        2, title=r"(b) singular values per head at the last step ($\sigma_i / \sigma_1$)"
    )
    # Curves of neighbouring λ_attn can coincide: each λ_attn gets its own line style, marker
    # and width (widest drawn first) so that none hides another.
    styles = (("-", "o", 3.0), ("--", "s", 2.0), ("-.", "^", 1.5), (":", "D", 1.5))
    for ax, which in zip(axes, ("qk", "ov")):
        for k, (lam, run) in enumerate(runs):
            try:
                s = run.tensors(f"{which}.singular_values")[1][-1]  # [n_layers, n_heads, d_head]
            except KeyError:
                continue
            s = s.reshape(-1, s.shape[-1])
            rel = s / np.maximum(s[:, :1], 1e-30)
            ls, marker, lw = styles[k % len(styles)]
            index = np.arange(1, s.shape[1] + 1)
            for h, row in enumerate(rel):
                ax.semilogy(
                    index, row, color=f"C{k % 10}", ls=ls, lw=lw, marker=marker, ms=4,
                    mfc="none" if k % 2 else None, alpha=0.85 if h == 0 else 0.45,
                    label=rf"$\lambda_{{\mathrm{{attn}}}}$={lam:g}" if h == 0 else None,
                )  # fmt: skip
        ax.axhline(1e-2, color="k", ls=(0, (1, 3)), lw=0.8, label="rank cutoff $10^{-2}$")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set(
            xlabel="singular-value index $i$",
            ylabel=r"$\sigma_i / \sigma_1$",
            title=rf"$W_{{{which.upper()}}}$ (every head)",
            ylim=(1e-6, 2),
        )
        ax.legend(fontsize=8)
    figs.append(save_figure(fig, figures / "b_spectra.png"))
    return verdicts, figs, rows


def _analyze_lm(uniform: Run, decoupled: Run, figures: Path):
    rows = []
    for condition, run in (("uniform", uniform), ("decoupled", decoupled)):
        rows.append(
            {
                "condition": condition,
                "status": run.status,
                "val.loss": _final(run, "val.loss"),
                "perplexity": math.exp(_final(run, "val.loss")),
                "qk.rank_1e-2": _final(run, "qk.mean.rank_1e-2"),
                "ov.rank_1e-2": _final(run, "ov.mean.rank_1e-2"),
                "qk.effective_rank": _final(run, "qk.mean.effective_rank"),
                "ov.effective_rank": _final(run, "ov.mean.effective_rank"),
            }
        )
    diff = rows[0]["val.loss"] - rows[1]["val.loss"]
    verdict = Verdict(
        "c: decaying attention less (decoupled) lowers the LM's validation loss",
        "val loss(uniform) − val loss(decoupled), nats/byte",
        diff,
        C_LOSS_GAP,
        bool(diff > C_LOSS_GAP),
        "measured > threshold; one seed per condition (use --seed for more)",
    )
    fig, (ax1, ax2) = new_figure(2, title="(c) byte-level LM: uniform vs decoupled weight decay")
    for condition, run in (("uniform", uniform), ("decoupled", decoupled)):
        val = run.scalar("val.loss")
        train = run.scalar("train.loss")
        (line,) = ax1.plot(val.index, val.values, "o-", label=f"{condition} (val)")
        ax1.plot(train.index, train.values, alpha=0.4, color=line.get_color())
    val_steps = uniform.scalar("val.loss").index
    if len(val_steps) > 1:  # zoom past the first evaluation, where the conditions differ
        late = [
            v
            for run in (uniform, decoupled)
            for key in ("val.loss", "train.loss")
            for step, v in run.scalar(key).items()
            if step >= val_steps[1]
        ]
        ax1.set_ylim(min(late) - 0.05, max(late) + 0.05)
    ax1.set(xlabel="step", ylabel="loss (nats/byte)", title="train (faint) and validation loss")
    ax1.legend()
    width = 0.35
    labels = ["W_QK rank", "W_OV rank"]
    for k, row in enumerate(rows):
        ax2.bar(
            np.arange(2) + (k - 0.5) * width,
            [row["qk.rank_1e-2"], row["ov.rank_1e-2"]],
            width,
            label=row["condition"],
        )
    ax2.set_xticks(np.arange(2), labels)
    ax2.set(ylabel="head-mean rank at 1e-2", title="attention ranks at the last step")
    ax2.set_ylim(0, 1.3 * max(max(r["qk.rank_1e-2"], r["ov.rank_1e-2"]) for r in rows))
    ax2.legend(loc="upper center", ncol=2)
    return [verdict], [save_figure(fig, figures / "c_lm.png")], rows


def analyze(runs: dict[str, Run], figures: Path) -> Analysis:
    """Verdicts a1–a3, b (W_QK and W_OV), c from the stored runs; figures under ``figures``."""
    verdicts: list[Verdict] = []
    figs: list[Path] = []
    tables: dict[str, list[dict]] = {}
    v, f, rows = _analyze_toy(runs["a_toy"], figures)
    verdicts += v
    figs += f
    tables["(a) toy: balancedness rates and gaps per λ"] = rows
    recall = sorted(
        (
            (float(r.config["optimizer"]["weight_decay"]["attention"]), r)
            for name, r in runs.items()
            if name.startswith("b_recall")
        ),
        key=lambda pair: pair[0],
    )
    v, f, rows = _analyze_recall(recall, figures)
    verdicts += v
    figs += f
    tables["(b) recall: ranks and accuracy per λ_attn"] = rows
    v, f, rows = _analyze_lm(runs["c_lm_uniform"], runs["c_lm_decoupled"], figures)
    verdicts += v
    figs += f
    tables["(c) LM: validation loss and ranks per condition"] = rows
    return Analysis(verdicts, figs, tables)


STUDY = Study(
    name="weight-decay-low-rank",
    claim=CLAIM,
    source=SOURCE,
    presets={"smoke": smoke, "fast": fast, "paper": paper},
    build_runs=build_runs,
    analyze=analyze,
)
