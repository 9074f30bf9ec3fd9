"""The ``paper`` preset's extra runs of ``hyper-ut-pvr``: the vector-PVR sweep, the digits
compute comparison (ViT vs UT-ACT vs Hyper-UT) and the visual PVR on digit tiles; their configs
and runners (tables and figures: :mod:`dynascope.studies._hyper_ut_tables`).

Glossary:
    m:          vector-PVR complexity (window of m + 1 digits), see :mod:`dynascope.tasks.pvr`.
    agg:        the window aggregation (``sum``, ``min``, ``max``, ``median``, ``mode``).
    holdout:    k held-out window permutations; the effective k of a run is
                ``min(k, (m + 1)! − 1)``, stored in its config.
    standard:   the ``val`` split (no holdout shift); ``adversarial``: windows that are exactly
                the held-out permutations (:meth:`VectorPVR.adversarial_batch`).
    patch_size: patches are ``patch_size × patch_size`` (``(8 / patch_size)²`` tokens per tile).
    T:          ``act_max_steps``; for the compute comparison S8's ``2 · n_layers`` of the ViT.
    layers:     mean layers used per example: ``n_layers`` for the ViT; ``n + rem`` at the CLS
                (readout) position for the ACT models (S8's ponder statistic; with ``global``
                halting it is the sequence's). ``steps`` is the mean n alone.

Run names: ``vec_{model}_m{m}_{agg}_s{k}`` (vector PVR), ``digits_{model}_s{k}`` and
``vpvr_{model}_m{m}_s{k}`` (visual PVR, :class:`dynascope.tasks.digits_pvr.DigitsPVR`); the
hop-PVR runs keep ``{model}_s{k}``. Analysis of these runs is reported, not gated: S8's pass
criteria (u1-u3) are on hop-PVR only, and S8 states the paper's "over 70% fewer layers than
ViT" as a finding, not as a threshold of this study, so the table shows the measured layer
saving beside the paper's 70% for reference.

Digits (and visual PVR) through the ACT models: each image is ``[CLS, patch_1 .. patch_n]``;
patches are embedded by a learned linear map (``W_in, b_in``: ``[d_in, d_model]``,
``[d_model]``), the CLS embedding is the core model's ``W_E[0]`` (``d_vocab = 1``), and the
core runs :meth:`UniversalTransformer.act_state` with the readout at position 0 (the CLS).

References:
    S. Abnar et al. (2023), arXiv 2310.08866 (Hyper-UT; image classification vs ViT, layers).
    C. Zhang, M. Raghu, J. Kleinberg, S. Bengio (2021), arXiv 2107.12580, Sec. 2 (vector PVR,
        holdout, adversarial test).
    A. Dosovitskiy et al. (2021), arXiv 2010.11929 (ViT).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import Tensor, nn

from dynascope.nn import Transformer
from dynascope.nn.universal import ACTResult, HyperUT, UniversalTransformer
from dynascope.nn.vit import ViT
from dynascope.store import RunStore
from dynascope.studies.base import one_intra_op_thread
from dynascope.tasks.digits import Digits
from dynascope.tasks.digits_pvr import DigitsPVR
from dynascope.tasks.pvr import AGGREGATIONS, VectorPVR

__all__ = [
    "DigitsComparison",
    "DigitsRunConfig",
    "VectorPVRRunConfig",
    "VectorSweep",
    "VisualPVRSweep",
    "run_digits",
    "run_vector_pvr",
]

TOKEN_MODELS = ("fixed", "ut_act", "hyper_ut")
DIGITS_MODELS = ("vit", "ut_act", "hyper_ut")
PAPER_LAYER_SAVING = 0.70  # S8: "on average over 70% fewer layers" than ViT (reference only)
Agg = Literal["sum", "min", "max", "median", "mode"]


class TokenModelRunConfig(BaseModel):
    """Model, optimisation and data-size fields shared by every PVR run of S8 (hop and vector):
    the fixed-depth baseline, UT-ACT and Hyper-UT sizes, ACT settings, and training budget."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    d_model: int = Field(64, ge=2)
    n_heads: int = Field(4, ge=1)
    d_mlp: int = Field(128, ge=1)
    n_layers: int = Field(2, ge=1, description="fixed-depth baseline only")
    act_max_steps: int = Field(8, ge=1)
    halting: Literal["basic", "global"] = "global"
    act_epsilon: float = Field(0.01, gt=0, lt=1)
    act_loss_weight: float = Field(0.01, ge=0)
    n_banks: int = Field(4, ge=1)
    n_train: int = Field(20_000, ge=1)
    batch_size: int = Field(64, ge=1)
    steps: int = Field(1500, ge=1)
    lr: float = Field(1e-3, gt=0)
    eval_size: int = Field(1000, ge=1)
    log_every: int = Field(25, ge=1)
    seed: int = Field(0, ge=0)
    data_seed: int = Field(0, ge=0)


class VectorPVRRunConfig(TokenModelRunConfig):
    """One model trained on vector PVR (m, agg, holdout) and evaluated on both test sets."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: Literal["fixed", "ut_act", "hyper_ut"]
    complexity: int = Field(1, ge=0, le=9, description="m")
    agg: Agg = "sum"
    holdout: int = Field(1, ge=0, description="held-out window permutations (effective k)")


class DigitsRunConfig(BaseModel):
    """ViT, UT-ACT or Hyper-UT on patch tokens: digit classification (``task="digits"``) or the
    visual PVR on a grid of digit tiles (``task="visual_pvr"``, :class:`DigitsPVR`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: Literal["vit", "ut_act", "hyper_ut"]
    task: Literal["digits", "visual_pvr"] = "digits"
    grid: Literal[2, 3] = Field(3, description="visual PVR: g × g tiles")
    complexity: int = Field(0, ge=0, le=7, description="visual PVR: m, at most g² − 2")
    agg: Agg = "sum"
    n_examples: int = Field(50_000, ge=1, description="visual PVR training examples")
    eval_size: int = Field(2000, ge=1, description="visual PVR validation examples")
    patch_size: Literal[1, 2, 4] = 2
    n_train: int = Field(1437, ge=10, le=1787)
    d_model: int = Field(64, ge=2)
    n_heads: int = Field(4, ge=1)
    d_mlp: int = Field(128, ge=1)
    n_layers: int = Field(6, ge=1, description="ViT depth")
    act_max_steps: int = Field(12, ge=1, description="T; S8: 2 · n_layers")
    halting: Literal["basic", "global"] = "global"
    act_epsilon: float = Field(0.01, gt=0, lt=1)
    act_loss_weight: float = Field(0.01, ge=0)
    n_banks: int = Field(4, ge=1)
    batch_size: int = Field(128, ge=1)
    steps: int = Field(3000, ge=1)
    lr: float = Field(1e-3, gt=0)
    log_every: int = Field(25, ge=1)
    seed: int = Field(0, ge=0)
    split_seed: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _window_fits(self) -> DigitsRunConfig:
        if self.complexity > self.grid**2 - 2:
            raise ValueError(
                f"complexity must be <= grid² − 2 = {self.grid**2 - 2} "
                f"(got complexity={self.complexity}, grid={self.grid})"
            )
        return self


class VectorSweep(BaseModel):
    """The vector-PVR grid: every model × m × aggregation (× the preset's seeds)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base: VectorPVRRunConfig
    complexities: list[int] = Field(default_factory=lambda: [1, 2, 3, 4], min_length=1)
    aggregations: list[Agg] = Field(default_factory=lambda: list(AGGREGATIONS), min_length=1)
    models: list[Literal["fixed", "ut_act", "hyper_ut"]] = Field(
        default_factory=lambda: list(TOKEN_MODELS), min_length=1
    )


class DigitsComparison(BaseModel):
    """The compute comparison on digits: one run per model (× the preset's seeds)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base: DigitsRunConfig
    models: list[Literal["vit", "ut_act", "hyper_ut"]] = Field(
        default_factory=lambda: list(DIGITS_MODELS), min_length=1
    )


class VisualPVRSweep(BaseModel):
    """The visual PVR on digit tiles: every model × m (× the preset's seeds)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base: DigitsRunConfig
    complexities: list[int] = Field(default_factory=lambda: [0, 1, 2], min_length=1)
    models: list[Literal["vit", "ut_act", "hyper_ut"]] = Field(
        default_factory=lambda: list(DIGITS_MODELS), min_length=1
    )


def effective_holdout(holdout: int, m: int) -> int:
    """``min(holdout, (m + 1)! − 1)``: some window orderings must stay trainable."""
    return min(holdout, math.factorial(m + 1) - 1)


# -- models and the shared training loop ---------------------------------------------------------
def build_token_model(cfg, d_vocab: int, d_out: int, n_ctx: int) -> nn.Module:
    """The fixed pre-LN transformer, UT-ACT or Hyper-UT for token inputs (``cfg.model``)."""
    if cfg.model == "fixed":
        return Transformer(
            n_layers=cfg.n_layers,
            d_model=cfg.d_model,
            n_heads=cfg.n_heads,
            d_mlp=cfg.d_mlp,
            d_vocab=d_vocab,
            d_out=d_out,
            n_ctx=n_ctx,
            is_causal=False,
        )
    common = dict(
        d_vocab=d_vocab,
        d_out=d_out,
        n_ctx=n_ctx,
        d_model=cfg.d_model,
        n_heads=cfg.n_heads,
        d_mlp=cfg.d_mlp,
        act_max_steps=cfg.act_max_steps,
        halting=cfg.halting,
        act_epsilon=cfg.act_epsilon,
        act_loss_weight=cfg.act_loss_weight,
    )
    if cfg.model == "hyper_ut":
        return HyperUT(n_banks=cfg.n_banks, **common)
    return UniversalTransformer(**common)


def forward_tokens(model: nn.Module, x: Tensor) -> tuple[Tensor, ACTResult | None]:
    """Logits ``[batch, d_out]`` read at position 0 and the ACT result (None if fixed depth)."""
    if isinstance(model, UniversalTransformer):
        result = model.act(x)
        return model.readout(result), result
    return model(x)[:, 0], None


class _PatchACT(nn.Module):
    """UT-ACT / Hyper-UT on patch vectors ``[batch, n_patches, d_in]`` (module docstring)."""

    def __init__(self, core: UniversalTransformer, d_in: int) -> None:
        super().__init__()
        self.core = core
        self.W_in = nn.Parameter(torch.randn(d_in, core.d_model) / math.sqrt(d_in))
        self.b_in = nn.Parameter(torch.zeros(core.d_model))

    def act(self, patches: Tensor) -> ACTResult:
        cls = self.core.W_E[0].expand(patches.shape[0], 1, -1)
        return self.core.act_state(torch.cat([cls, patches @ self.W_in + self.b_in], dim=1))


def _forward_patches(model: nn.Module, x: Tensor) -> tuple[Tensor, ACTResult | None]:
    if isinstance(model, _PatchACT):
        result = model.act(x)
        return model.core.readout(result), result
    return model(x), None


def fit(
    model: nn.Module,
    forward: Callable[[nn.Module, Tensor], tuple[Tensor, ACTResult | None]],
    x_all: Tensor,
    y_all: Tensor,
    config,
    store: RunStore,
) -> bool:
    """Adam on minibatches drawn with replacement from ``x_all``; False if the loss diverged.

    Logs ``train.loss`` (and ``train.ponder`` = mean n + rem for ACT models) every
    ``log_every`` steps; the ponder cost ``act_loss_weight · mean(n + rem)`` joins the loss.
    """
    opt = torch.optim.Adam(model.parameters(), lr=config.lr)
    gen = torch.Generator().manual_seed(config.seed + 1)
    n = x_all.shape[0]
    for step in range(1, config.steps + 1):
        idx = torch.randint(n, (config.batch_size,), generator=gen).to(x_all.device)
        logits, act = forward(model, x_all[idx])
        loss = torch.nn.functional.cross_entropy(logits, y_all[idx])
        total = loss if act is None else loss + config.act_loss_weight * act.ponder_cost()
        opt.zero_grad(set_to_none=True)
        total.backward()
        opt.step()
        if step % config.log_every == 0 or step == config.steps:
            values = {"train.loss": loss.detach()}
            if act is not None:
                values["train.ponder"] = act.ponder_cost().detach()
            store.log(step, values)
            if not math.isfinite(float(loss.detach())):
                store.event(step, "diverged", f"train.loss={float(loss.detach())}")
                store.set_status(step, "diverged")
                return False
    return True


def _ponder(values: dict, prefix: str, act: ACTResult | None, model: nn.Module, T: int) -> None:
    """``{prefix}.ponder`` (mean n + rem at the readout), ``.steps`` (mean n), ``.at_max``."""
    if act is None:
        return
    core = model.core if isinstance(model, _PatchACT) else model
    n = act.n_updates[:, core.readout_pos]
    values[f"{prefix}.ponder"] = (n + act.remainders[:, core.readout_pos]).mean()
    values[f"{prefix}.steps"] = n.mean()
    values[f"{prefix}.at_max"] = (n >= T).float().mean()
    if isinstance(core, HyperUT):
        values[f"{prefix}.mix_entropy"] = core.last_mix_entropy.mean()


# -- runners -------------------------------------------------------------------------------------
def run_vector_pvr(
    config: VectorPVRRunConfig, run_dir: Path, progress: bool = False, device: str = "cpu"
) -> None:
    """Train on vector PVR (holdout applied); evaluate the standard and adversarial sets.

    Logged at the last step: ``eval.standard.accuracy``, ``eval.standard.majority`` (majority
    class of that set), and with ``holdout > 0`` ``eval.adversarial.accuracy`` and
    ``.majority``; ACT models also ``eval.{set}.ponder``, ``.steps``, ``.at_max`` (Hyper-UT
    ``.mix_entropy``). Eval sets: ``eval_size`` examples from generators seeded 20,000 and
    20,001.
    """
    del progress
    dev = torch.device(device)
    task = VectorPVR(complexity=config.complexity, agg=config.agg, holdout=config.holdout)
    with one_intra_op_thread(), RunStore(run_dir) as store:
        store.truncate_after(-1)
        store.write_config(config.model_dump(mode="json"))
        store.set_status(0, "running")
        data = task.batch("train", config.n_train, torch.Generator().manual_seed(config.data_seed))
        torch.manual_seed(config.seed)
        model = build_token_model(config, task.d_vocab, task.d_out, task.n_ctx).to(dev)
        if not fit(model, forward_tokens, data["x"].to(dev), data["y"].to(dev), config, store):
            return
        model.eval()
        sets = {
            "standard": task.batch("val", config.eval_size, torch.Generator().manual_seed(20_000))
        }
        if config.holdout > 0:
            sets["adversarial"] = task.adversarial_batch(
                config.eval_size, torch.Generator().manual_seed(20_001)
            )
        values = {}
        with torch.no_grad():
            for name, batch in sets.items():
                x, y = batch["x"].to(dev), batch["y"].to(dev)
                logits, act = forward_tokens(model, x)
                values[f"eval.{name}.accuracy"] = (logits.argmax(-1) == y).float().mean()
                values[f"eval.{name}.majority"] = torch.bincount(y).max() / len(y)
                _ponder(values, f"eval.{name}", act, model, config.act_max_steps)
        store.log(config.steps, values)
        store.set_status(config.steps, "finished")


def _digits_model(config: DigitsRunConfig, task: Digits | DigitsPVR) -> nn.Module:
    if config.model == "vit":
        return ViT(
            n_layers=config.n_layers,
            d_model=config.d_model,
            n_heads=config.n_heads,
            d_mlp=config.d_mlp,
            d_in=task.d_in,
            n_patches=task.n_ctx,
            d_out=task.d_out,
        )
    core = build_token_model(config, 1, task.d_out, task.n_ctx + 1)
    return _PatchACT(core, task.d_in)


def run_digits(
    config: DigitsRunConfig, run_dir: Path, progress: bool = False, device: str = "cpu"
) -> None:
    """Train a classifier on patch tokens; log validation accuracy and layers used.

    ``task="digits"``: the Digits split (all training images, the validation images);
    ``"visual_pvr"``: ``n_examples`` training and ``eval_size`` validation examples of
    :class:`DigitsPVR` (generators seeded ``split_seed`` and 30,000), tiles from the same split.
    Logged at the last step: ``eval.accuracy``, ``eval.majority`` (majority class of the
    validation labels), ``eval.layers`` (mean layers per example: ``n_layers`` for the ViT,
    ``n + rem`` at the CLS position for ACT models) and for ACT models ``eval.ponder``
    (= layers), ``eval.steps``, ``eval.at_max`` (Hyper-UT ``eval.mix_entropy``).
    """
    del progress
    dev = torch.device(device)
    if config.task == "digits":
        task = Digits(
            patch_size=config.patch_size, n_train=config.n_train, split_seed=config.split_seed
        )
        train = task.batch("train", task.split_size("train"), torch.Generator())
        val = task.batch("val", task.split_size("val"), torch.Generator())
    else:
        task = DigitsPVR(
            grid=config.grid,
            complexity=config.complexity,
            agg=config.agg,
            patch_size=config.patch_size,
            n_train=config.n_train,
            split_seed=config.split_seed,
        )
        gen = torch.Generator().manual_seed(config.split_seed)
        train = task.batch("train", config.n_examples, gen)
        val = task.batch("val", config.eval_size, torch.Generator().manual_seed(30_000))
    with one_intra_op_thread(), RunStore(run_dir) as store:
        store.truncate_after(-1)
        store.write_config(config.model_dump(mode="json"))
        store.set_status(0, "running")
        torch.manual_seed(config.seed)
        model = _digits_model(config, task).to(dev)
        if not fit(model, _forward_patches, train["x"].to(dev), train["y"].to(dev), config, store):
            return
        model.eval()
        values = {}
        with torch.no_grad():
            x, y = val["x"].to(dev), val["y"].to(dev)
            logits, act = _forward_patches(model, x)
            values["eval.accuracy"] = (logits.argmax(-1) == y).float().mean()
            values["eval.majority"] = torch.bincount(y).max() / len(y)
            _ponder(values, "eval", act, model, config.act_max_steps)
            values["eval.layers"] = values["eval.ponder"] if act is not None else config.n_layers
        store.log(config.steps, values)
        store.set_status(config.steps, "finished")
