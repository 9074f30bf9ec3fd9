"""hyper-ut-pvr runs on the engine: one model (fixed-depth transformer, UT-ACT or Hyper-UT, or
for digits a ViT) trained on one task and seed per run; notes: docs/studies/hyper-ut-pvr.md.

Glossary:
    h:          hop count of hop-PVR; m: vector/visual PVR complexity (window of m + 1).
    agg:        the window aggregation (``sum``, ``min``, ``max``, ``median``, ``mode``).
    holdout:    k held-out window permutations; effective k ``min(k, (m + 1)! − 1)``.
    T:          ``act_max_steps``.
    ponder:     mean ``n + rem`` at the readout position (``global`` halting: the sequence's).
    layers:     mean layers used per example: ``n_layers`` for the ViT, the ponder for ACT.

Every run draws its training set once from stream ``train_set`` (so the three models of a seed
see the same examples), minibatches with replacement from stream ``data``, and its evaluation
sets from streams ``eval_h{h}`` (hop-PVR), ``eval_standard``/``eval_adversarial`` (vector
PVR) or ``val`` (visual PVR). The loss is the cross-entropy at the readout position plus, for
ACT models, the ponder cost ``act_loss_weight · mean(n + rem)`` (logged: ``train.ce``,
``train.ponder``). ACT's loop length depends on the data (``while any(hp < thr)``), which
``torch.func.vmap`` cannot batch over members, so ACT runs are lone runs; the fixed-depth
baseline's seeds train as one ensemble.

References:
    S. Abnar et al. (2023), arXiv 2310.08866 (Hyper-UT).
    C. Zhang, M. Raghu, J. Kleinberg, S. Bengio (2021), arXiv 2107.12580, Sec. 2 (PVR).
    M. Dehghani et al. (2019), arXiv 1807.03819 (Universal Transformer, ACT).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import Tensor, nn

from dynascope.nn import Transformer
from dynascope.nn.universal import ACTResult, HyperUT, UniversalTransformer
from dynascope.nn.vit import ViT
from dynascope.tasks.digits import Digits
from dynascope.tasks.digits_pvr import DigitsPVR
from dynascope.tasks.pvr import HopPVR, VectorPVR
from dynascope.train import EngineRunConfig, Parts, SeedStreams

__all__ = [
    "DIGITS_MODELS",
    "TOKEN_MODELS",
    "DigitsRun",
    "HopPVRRun",
    "TokenModelRun",
    "VectorPVRRun",
    "build_digits",
    "build_hop_pvr",
    "build_token_model",
    "build_vector_pvr",
    "effective_holdout",
    "forward_tokens",
]

TOKEN_MODELS = ("fixed", "ut_act", "hyper_ut")
DIGITS_MODELS = ("vit", "ut_act", "hyper_ut")
Agg = Literal["sum", "min", "max", "median", "mode"]
Batch = Mapping[str, Tensor]


class _ACTFields(EngineRunConfig):
    """Sizes and ACT settings shared by every run of S8."""

    d_model: int = Field(64, ge=2)
    n_heads: int = Field(4, ge=1)
    d_mlp: int = Field(128, ge=1)
    act_max_steps: int = Field(8, ge=1, description="T")
    halting: Literal["basic", "global"] = "global"
    act_epsilon: float = Field(0.01, gt=0, lt=1)
    act_loss_weight: float = Field(0.01, ge=0)
    n_banks: int = Field(4, ge=1, description="Hyper-UT's K")
    multiply_embedding_mode: Literal["sqrt_depth", "none"] = Field(
        "sqrt_depth", description="ACT token embedding: tensor2tensor's scale, or std 0.02"
    )
    batch_size: int = Field(64, ge=1)
    lr: float = Field(1e-3, gt=0, description="Adam")


class TokenModelRun(_ACTFields):
    """Fields shared by the hop- and vector-PVR runs (token inputs)."""

    model: Literal["fixed", "ut_act", "hyper_ut"]
    n_layers: int = Field(2, ge=1, description="fixed-depth baseline only")
    n_train: int = Field(20_000, ge=1)
    eval_size: int = Field(1000, ge=1)


class HopPVRRun(TokenModelRun):
    """One model trained on hop-PVR and evaluated per hop count."""

    length: int = Field(10, ge=2, le=10, description="L digits")
    train_hops: list[int] = Field(default_factory=lambda: [1, 2, 3, 4], min_length=1)
    eval_hops: list[int] = Field(default_factory=lambda: [1, 2, 3, 4, 5], min_length=2)
    shuffle_labels: bool = Field(
        False, description="u1's ablation: training labels permuted across examples"
    )


class VectorPVRRun(TokenModelRun):
    """One model trained on vector PVR (m, agg, holdout) and evaluated on both test sets."""

    complexity: int = Field(1, ge=0, le=9, description="m")
    agg: Agg = "sum"
    holdout: int = Field(1, ge=0, description="held-out window permutations (effective k)")


class DigitsRun(_ACTFields):
    """ViT, UT-ACT or Hyper-UT on patch tokens: digit classification (``task="digits"``) or the
    visual PVR on a grid of digit tiles (``task="visual_pvr"``, :class:`DigitsPVR`)."""

    model: Literal["vit", "ut_act", "hyper_ut"]
    task: Literal["digits", "visual_pvr"] = "digits"
    grid: Literal[2, 3] = Field(3, description="visual PVR: g × g tiles")
    complexity: int = Field(0, ge=0, le=7, description="visual PVR: m, at most g² − 2")
    agg: Agg = "sum"
    n_examples: int = Field(50_000, ge=1, description="visual PVR training examples")
    eval_size: int = Field(2000, ge=1, description="visual PVR validation examples")
    patch_size: Literal[1, 2, 4] = 2
    n_train: int = Field(1437, ge=10, le=1787, description="digits training images")
    split_seed: int = Field(0, ge=0, description="the digits train/val split")
    n_layers: int = Field(6, ge=1, description="ViT depth")

    @model_validator(mode="after")
    def _window_fits(self) -> DigitsRun:
        if self.complexity > self.grid**2 - 2:
            raise ValueError(
                f"complexity must be <= grid² − 2 = {self.grid**2 - 2} "
                f"(got complexity={self.complexity}, grid={self.grid})"
            )
        return self


def effective_holdout(holdout: int, m: int) -> int:
    """``min(holdout, (m + 1)! − 1)``: some window orderings must stay trainable."""
    return min(holdout, math.factorial(m + 1) - 1)


# -- models -------------------------------------------------------------------------------------
def build_token_model(cfg, d_vocab: int, d_out: int, n_ctx: int) -> nn.Module:
    """The fixed pre-LN transformer, UT-ACT or Hyper-UT for token inputs (``cfg.model``)."""
    if cfg.model == "fixed":
        return Transformer(
            n_layers=cfg.n_layers, d_model=cfg.d_model, n_heads=cfg.n_heads, d_mlp=cfg.d_mlp,
            d_vocab=d_vocab, d_out=d_out, n_ctx=n_ctx, is_causal=False,
        )  # fmt: skip
    common = dict(
        d_vocab=d_vocab, d_out=d_out, n_ctx=n_ctx, d_model=cfg.d_model, n_heads=cfg.n_heads,
        d_mlp=cfg.d_mlp, act_max_steps=cfg.act_max_steps, halting=cfg.halting,
        act_epsilon=cfg.act_epsilon, act_loss_weight=cfg.act_loss_weight,
        multiply_embedding_mode=cfg.multiply_embedding_mode,
    )  # fmt: skip
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
    """UT-ACT / Hyper-UT on patch vectors ``[batch, n_patches, d_in]``: ``[CLS, patches]``,
    patches embedded by ``x @ W_in + b_in``, the CLS embedding the core's ``embed`` of id 0."""

    def __init__(self, core: UniversalTransformer, d_in: int) -> None:
        super().__init__()
        self.core = core
        self.W_in = nn.Parameter(torch.randn(d_in, core.d_model) / math.sqrt(d_in))
        self.b_in = nn.Parameter(torch.zeros(core.d_model))

    def act(self, patches: Tensor) -> ACTResult:
        ids = torch.zeros(patches.shape[0], 1, dtype=torch.long, device=patches.device)
        cls = self.core.embed(ids)
        return self.core.act_state(torch.cat([cls, patches @ self.W_in + self.b_in], dim=1))


def _forward_patches(model: nn.Module, x: Tensor) -> tuple[Tensor, ACTResult | None]:
    if isinstance(model, _PatchACT):
        result = model.act(x)
        return model.core.readout(result), result
    return model(x), None


def _act_core(model: nn.Module) -> UniversalTransformer | None:
    core = model.core if isinstance(model, _PatchACT) else model
    return core if isinstance(core, UniversalTransformer) else None


# -- the pieces every build shares ---------------------------------------------------------------
def _sampler(data: Batch, batch_size: int) -> Callable[[torch.Generator], dict[str, Tensor]]:
    """Minibatches drawn with replacement from a fixed training set."""

    def draw(generator: torch.Generator) -> dict[str, Tensor]:
        idx = torch.randint(len(data["y"]), (batch_size,), generator=generator)
        return {"x": data["x"][idx], "y": data["y"][idx]}

    return draw


def _loss(forward: Callable) -> Callable[[nn.Module, Batch], tuple[Tensor, dict[str, Tensor]]]:
    """Cross-entropy at the readout plus the ponder cost for ACT models."""

    def loss(model: nn.Module, batch: Batch):
        logits, act = forward(model, batch["x"])
        ce = F.cross_entropy(logits, batch["y"])
        if act is None:
            return ce, {"ce": ce.detach()}
        ponder = act.ponder_cost()
        total = ce + _act_core(model).act_loss_weight * ponder
        return total, {"ce": ce.detach(), "ponder": ponder.detach()}

    return loss


def _adam(lr: float) -> Callable[[nn.Module], torch.optim.Optimizer]:
    return lambda model: torch.optim.Adam(model.parameters(), lr=lr)


def _measure(model: nn.Module, forward: Callable, batch: Batch, prefix: str) -> dict[str, Tensor]:
    """``{prefix}.accuracy``, ``.majority`` and for ACT models ``.ponder`` (mean n + rem at
    the readout), ``.steps`` (mean n), ``.at_max`` (fraction with n >= T), ``.halt_at_1``
    (fraction with n = 1); Hyper-UT ``.mix_entropy`` (nats)."""
    device = next(model.parameters()).device
    x, y = batch["x"].to(device), batch["y"].to(device)
    logits, act = forward(model, x)
    out = {
        f"{prefix}.accuracy": (logits.argmax(-1) == y).float().mean(),
        f"{prefix}.majority": torch.bincount(y).max() / len(y),
    }
    core = _act_core(model)
    if act is not None and core is not None:
        n = act.n_updates[:, core.readout_pos]
        out[f"{prefix}.ponder"] = (n + act.remainders[:, core.readout_pos]).mean()
        out[f"{prefix}.steps"] = n.mean()
        out[f"{prefix}.at_max"] = (n >= core.act_max_steps).float().mean()
        out[f"{prefix}.halt_at_1"] = (n <= 1).float().mean()
        if isinstance(core, HyperUT):
            out[f"{prefix}.mix_entropy"] = core.last_mix_entropy.mean()
    return out


# -- builds --------------------------------------------------------------------------------------
def build_hop_pvr(config: HopPVRRun, streams: SeedStreams) -> Parts:
    """Hop-PVR: train on ``train_hops``; evaluate ``eval.h{h}.*`` for every ``eval_hops``.

    With ``shuffle_labels`` (u1's ablation) the training labels are permuted across the
    training set (stream ``shuffle``): the inputs, hop tokens and budget are unchanged, but no
    label asks for h hops. The evaluation sets keep their true labels."""
    task = HopPVR(
        length=config.length, train_hops=tuple(config.train_hops), max_hops=max(config.eval_hops)
    )
    train = task.batch("train", config.n_train, streams.generator("train_set"))
    if config.shuffle_labels:  # the hop count no longer says how much to compute
        order = torch.randperm(len(train["y"]), generator=streams.generator("shuffle"))
        train = {**train, "y": train["y"][order]}
    evals = {
        f"h{h}": task.batch_for_hops(h, config.eval_size, streams.generator(f"eval_h{h}"))
        for h in config.eval_hops
    }
    return _token_parts(config, task, train, evals)


def _token_parts(config: Any, task: Any, train: Any, sets: dict[str, Any]) -> Parts:
    """A token model's parts: minibatches of ``train``, evaluation ``eval.{name}.*`` on each of
    ``sets`` (name -> batch)."""

    def evaluate(model: nn.Module) -> dict[str, Tensor]:
        out: dict[str, Tensor] = {}
        for name, batch in sets.items():
            out |= _measure(model, forward_tokens, batch, f"eval.{name}")
        return out

    return Parts(
        model=build_token_model(config, task.d_vocab, task.d_out, task.n_ctx),
        data=_sampler(train, config.batch_size),
        loss=_loss(forward_tokens),
        optimizer=_adam(config.lr),
        evaluate=evaluate,
    )


def build_vector_pvr(config: VectorPVRRun, streams: SeedStreams) -> Parts:
    """Vector PVR with holdout: ``eval.standard.*`` and, with ``holdout > 0``,
    ``eval.adversarial.*`` (windows that are exactly the held-out permutations)."""
    task = VectorPVR(complexity=config.complexity, agg=config.agg, holdout=config.holdout)
    train = task.batch("train", config.n_train, streams.generator("train_set"))
    sets = {"standard": task.batch("val", config.eval_size, streams.generator("eval_standard"))}
    if config.holdout > 0:
        gen = streams.generator("eval_adversarial")
        sets["adversarial"] = task.adversarial_batch(config.eval_size, gen)
    return _token_parts(config, task, train, sets)


def build_digits(config: DigitsRun, streams: SeedStreams) -> Parts:
    """Digits (all training images; validation images) or visual PVR (``n_examples`` and
    ``eval_size`` examples): ``eval.accuracy``, ``eval.majority``, ``eval.layers`` (the ViT's
    ``n_layers``; ACT: the ponder) and the ACT statistics."""
    if config.task == "digits":
        task = Digits(
            patch_size=config.patch_size, n_train=config.n_train, split_seed=config.split_seed
        )
        train = task.batch("train", task.split_size("train"), streams.generator("train_set"))
        val = task.batch("val", task.split_size("val"), streams.generator("val"))
    else:
        task = DigitsPVR(
            grid=config.grid, complexity=config.complexity, agg=config.agg,
            patch_size=config.patch_size, n_train=config.n_train, split_seed=config.split_seed,
        )  # fmt: skip
        train = task.batch("train", config.n_examples, streams.generator("train_set"))
        val = task.batch("val", config.eval_size, streams.generator("val"))
    if config.model == "vit":
        model: nn.Module = ViT(
            n_layers=config.n_layers, d_model=config.d_model, n_heads=config.n_heads,
            d_mlp=config.d_mlp, d_in=task.d_in, n_patches=task.n_ctx, d_out=task.d_out,
        )  # fmt: skip
    else:
        model = _PatchACT(build_token_model(config, 1, task.d_out, task.n_ctx + 1), task.d_in)

    def evaluate(model: nn.Module) -> dict[str, Tensor | float]:
        out: dict[str, Tensor | float] = dict(_measure(model, _forward_patches, val, "eval"))
        out["eval.layers"] = out.get("eval.ponder", float(config.n_layers))
        return out

    return Parts(
        model=model,
        data=_sampler(train, config.batch_size),
        loss=_loss(_forward_patches),
        optimizer=_adam(config.lr),
        evaluate=evaluate,
    )
