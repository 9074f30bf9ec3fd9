"""gated-rnn-attention runs on the engine (notes: docs/studies/gated-rnn-attention.md).

Glossary:
    n_c:        construction size ``n_heads·d_head²`` (neurons the exact construction uses).
    nmse:       teacher–student loss ``mean((ŷ − y)²) / E[y²]``.
    mse:        in-context regression error at the query, ``mean((ŷ − y_q)²)``.
    ν_log:      a gated RNN neuron's recurrence parameter, ``λ = exp(−exp(ν_log))``.
    eval set:   sequences drawn from the run seed's stream ``eval``; every run of one seed
                sees the same eval set, so stored predictions compare element by element.

(a) ``build_construction``: a measurement run (one no-op step): the construction against
linear attention, and the same construction with λ = 1 − 10⁻³ (the control). (b)
``build_teacher_student``: a gated-RNN student of a linear-attention teacher, Adam on online
batches, ν_log at :func:`nu_learning_rate`. (c) ``build_icl``: a model trained on in-context
regression, or (``model = "gd"``) one GD step whose η* is fitted in one closed-form step.
Probes at step 0 and at the last step. ``gating=False`` (b, c) trains
:class:`UngatedLinearRNN` instead, the ablation control of g2, g2-falls and g4: the same
recurrence and budget with both multiplicative gates removed.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

from dynascope.monitor import EveryN
from dynascope.nn.attention import MultiHeadAttention
from dynascope.nn.capture import capture
from dynascope.nn.recurrent import (
    GatedLinearRNN,
    LRUNetwork,
    RNNBaseline,
    causal_linear_attention,
    construction_counts,
    gated_rnn_from_linear_attention,
)
from dynascope.probes.recurrent import (
    lambda_histogram,
    lambda_mass,
    linear_probe_r2,
    mid_lambda_mask,
    one_step_gd_prediction,
    optimal_gd_learning_rate,
    pruned_copy,
    query_gradient,
)
from dynascope.tasks.linear_attention_teacher import LinearAttentionTeacher
from dynascope.tasks.linear_regression import InContextLinearRegression
from dynascope.train import EngineRunConfig, Parts, SeedStreams, StepContext

HIST_BINS = 20
CONTROL_LAMBDA = 1 - 1e-3  # g1's control: a leaky accumulator instead of λ = 1
NU_TRAVEL_FRACTION = 0.1  # ν_log may cross its polarization distance in this share of steps


class ConstructionRun(EngineRunConfig):
    """Part (a): the construction against linear attention on random weights."""

    kind: Literal["construction"] = "construction"
    cases: list[tuple[int, int, int, int]] = Field(
        default_factory=lambda: [(4, 2, 2, 16), (5, 1, 3, 7), (6, 3, 2, 33)],
        min_length=1,
        description="(d_model, n_heads, d_head, n_ctx) per case",
    )
    batch_size: int = Field(8, ge=1)


class TeacherStudentRun(EngineRunConfig):
    """Part (b): one gated-RNN student of a linear-attention teacher."""

    kind: Literal["teacher_student"] = "teacher_student"
    d_model: int = Field(4, ge=1)
    n_heads: int = Field(1, ge=1)
    d_head: int = Field(4, ge=1)
    n_ctx: int = Field(12, ge=1)
    d_hidden: int = Field(32, ge=1, description="student neurons")
    lambda_kind: Literal["real", "complex"] = "real"
    use_gamma_norm: bool = False
    lr: float = Field(1e-3, gt=0, description="Adam step of every parameter but ν_log")
    nu_lr: float = Field(gt=0, description="Adam step of ν_log (nu_learning_rate)")
    batch_size: int = Field(64, ge=1)
    n_eval: int = Field(2048, ge=1, description="fresh sequences for the nmse")
    prune_delta: float = Field(0.05, gt=0, lt=0.5, description="δ of 'mid-range' |λ|")
    gating: bool = Field(True, description="False: UngatedLinearRNN (the ablation control)")


class ICLRun(EngineRunConfig):
    """Part (c): one model (or the GD reference) on in-context linear regression."""

    kind: Literal["icl"] = "icl"
    model: Literal["grnn", "lsa", "gd", "lru", "lstm", "gru"] = "grnn"
    d_x: int = Field(4, ge=1)
    n_points: int = Field(12, ge=1, description="context examples N")
    noise_std: float = Field(0.0, ge=0)
    d_hidden: int = Field(64, ge=1, description="GRNN neurons / LRU state / LSTM-GRU units")
    lambda_kind: Literal["real", "complex"] = "real"
    n_heads: int = Field(1, ge=1, description="LSA heads")
    d_head: int = Field(5, ge=1, description="LSA head width")
    d_model: int = Field(32, ge=1, description="LRU block width")
    n_layers: int = Field(1, ge=1, description="LRU blocks / LSTM-GRU layers")
    lr: float = Field(1e-3, gt=0)
    batch_size: int = Field(128, ge=1)
    n_eval: int = Field(10_000, ge=2, description="fresh sequences for MSE and agreement")
    n_grad: int = Field(1000, ge=1, description="eval sequences for ∂ŷ/∂x_q")
    n_fit: int = Field(50_000, ge=2, description="training sequences for GD's η*")
    prune_delta: float = Field(0.05, gt=0, lt=0.5)
    gating: bool = Field(True, description="grnn only; False: UngatedLinearRNN (ablation)")


class UngatedLinearRNN(GatedLinearRNN):
    """The gated RNN with both multiplicative gates removed: ``h_t = λ ⊙ h_{t−1} + x_t @ W_in_x``,
    ``y_t = (h_t @ W_out_h) @ D`` (real λ, no γ, no skip), ``[batch, pos, d_model]`` in and out.

    The ablation of g2, g2-falls and g4 (Zucchet et al. 2023, arXiv 2309.01775, Sec. 3: the
    gates form the products of keys, values and queries that linear attention needs): the
    same recurrence, init, widths and budget, but the output is linear in the inputs, so it
    cannot represent a linear-attention teacher or in-context regression. ``W_in_g`` and
    ``W_out_x`` are dropped (None).

    Raises:
        ValueError: as :class:`~dynascope.nn.recurrent.GatedLinearRNN`.
    """

    def __init__(self, d_model: int, d_hidden: int) -> None:
        super().__init__(d_model, d_hidden, lambda_kind="real")
        self.W_in_g, self.W_out_x = None, None

    def input_gate(self, x: Tensor) -> Tensor:
        """``x @ W_in_x`` ``[batch, pos, d_hidden]`` (no gate)."""
        return x @ self.W_in_x

    def readout(self, h: Tensor, x: Tensor) -> Tensor:
        """``(h @ W_out_h) @ D`` ``[batch, pos, d_model]`` (no gate)."""
        return (h @ self.W_out_h) @ self.D


def _rnn(d_model: int, d_hidden: int, gating: bool, **kwargs: Any) -> GatedLinearRNN:
    if gating:
        return GatedLinearRNN(d_model, d_hidden, **kwargs)
    return UngatedLinearRNN(d_model, d_hidden)


def nu_learning_rate(steps: int, delta: float = 0.05) -> float:
    """Adam learning rate of ν_log that lets λ polarize within ``steps``, from the parametrization.

    An Adam step moves a parameter by at most about its learning rate, whatever the gradient's
    scale. Under ``λ = exp(−exp(ν_log))`` a neuron at the median of the init (|λ| = ½,
    ``ν_log = log log 2``) must travel ``log log 2 − log(−log(1 − δ))`` (2.60 for δ = 0.05) to
    reach the polarized region |λ| ≥ 1 − δ (the shorter trip to |λ| ≤ δ is 1.46). The rate lets
    it cross that distance in ``NU_TRAVEL_FRACTION`` (10 %) of the steps: 8.7e-3 for 3k steps
    (the other parameters' 1e-3 would need 2.6k of them at full speed). λ stays in (0, 1) for
    every ν_log, so a larger step cannot make the recurrence unstable.
    """
    travel = math.log(math.log(2.0)) - math.log(-math.log(1.0 - delta))
    return travel / (NU_TRAVEL_FRACTION * steps)


# -- (a) the construction ------------------------------------------------------------------------
class _Nothing(nn.Module):
    """A measurement run trains nothing."""


def _no_update(model: nn.Module, batch: Any, ctx: StepContext) -> Tensor:
    return torch.zeros(())


class ConstructionProbe:
    """Per case and dtype: max |GRNN(x) − LSA(x)|, max |LSA|, max |parallel − loop|, and the
    control's max |GRNN_λ=1−1e-3(x) − LSA(x)|; sizes of the construction. Weights ~ N(0,
    1/d_model) and x ~ N(0, 1), float64 from the run's stream ``weights``, then cast."""

    def __init__(self, config: ConstructionRun, generator: torch.Generator) -> None:
        self.config, self.generator = config, generator

    def __call__(self, model: nn.Module, ctx: Any) -> dict[str, Tensor | float]:
        values: dict[str, Tensor | float] = {}
        g, f64 = self.generator, torch.float64
        for i, (d_model, n_heads, d_head, n_ctx) in enumerate(self.config.cases):
            std = 1.0 / math.sqrt(d_model)
            qkv = [torch.randn(n_heads, d_model, d_head, generator=g, dtype=f64) * std
                   for _ in range(3)]  # fmt: skip
            W_O = torch.randn(n_heads, d_head, d_model, generator=g, dtype=f64) * std
            x = torch.randn(self.config.batch_size, n_ctx, d_model, generator=g, dtype=f64)
            counts = construction_counts(d_model, n_heads, d_head)
            values.update({f"case{i}.{k}": float(v) for k, v in counts.items()})
            for dtype in (torch.float32, torch.float64):
                W, xd = [w.to(dtype) for w in (*qkv, W_O)], x.to(dtype)
                name = str(dtype).removeprefix("torch.")
                with torch.no_grad():
                    rnn = gated_rnn_from_linear_attention(*W)
                    reference = causal_linear_attention(xd, *W)
                    parallel = rnn(xd)
                    values[f"case{i}.{name}.max_abs_err"] = (parallel - reference).abs().max()
                    values[f"case{i}.{name}.max_abs_lsa"] = reference.abs().max()
                    gap = (parallel - rnn(xd, sequential=True)).abs().max()
                    values[f"case{i}.{name}.scan_gap"] = gap
                    rnn.nu_log.fill_(math.log(-math.log(CONTROL_LAMBDA)))
                    values[f"case{i}.{name}.control_abs_err"] = (rnn(xd) - reference).abs().max()
        return values


def build_construction(config: ConstructionRun, streams: SeedStreams) -> Parts:
    """A measurement: the probe at step 0, one no-op step."""
    probe = ConstructionProbe(config, streams.generator("weights"))
    return Parts(model=_Nothing(), data={}, step=_no_update, probes=[(probe, EveryN(2))])


# -- (b) teacher–student ----------------------------------------------------------------------
def _lambda_stats(lam: Tensor, delta: float) -> dict[str, Tensor | float]:
    mass = lambda_mass(lam.detach().cpu(), delta)
    return {
        "lambda.modulus": lam.detach().abs().double().cpu(),
        "lambda.hist": lambda_histogram(lam.detach().cpu(), HIST_BINS),
        **{f"lambda.{k}": v for k, v in mass.items()},
    }


class TeacherStudentProbe:
    """On the eval set: ``eval.nmse``; ``eval.nmse_pruned`` with the mid-range-λ neurons pruned
    (``pruned.count`` of them); ``eval.nmse_pruned_near1`` with the |λ| > 1 − δ neurons pruned
    instead (g3's control; ``pruned_near1.count``); the λ statistics."""

    def __init__(self, task: LinearAttentionTeacher, batch: dict[str, Tensor], delta: float):
        self.task, self.batch, self.delta = task, batch, delta

    @torch.no_grad()
    def __call__(self, model: GatedLinearRNN, ctx: Any) -> dict[str, Tensor | float]:
        x = self.batch["x"].to(next(model.parameters()))
        batch = {k: v.to(x) for k, v in self.batch.items()}
        lam = model.lambdas()
        mid = mid_lambda_mask(lam, self.delta)
        near1 = lam.abs() > 1 - self.delta
        return {
            "eval.nmse": self.task.loss(model(x), batch),
            "eval.nmse_pruned": self.task.loss(pruned_copy(model, mid)(x), batch),
            "eval.nmse_pruned_near1": self.task.loss(pruned_copy(model, near1)(x), batch),
            "pruned.count": float(mid.sum()),
            "pruned_near1.count": float(near1.sum()),
            **_lambda_stats(lam, self.delta),
        }


def build_teacher_student(config: TeacherStudentRun, streams: SeedStreams) -> Parts:
    """The student on online teacher batches (stream ``data``); eval set from stream ``eval``."""
    task = LinearAttentionTeacher(d_model=config.d_model, n_heads=config.n_heads,
                                  d_head=config.d_head, n_ctx=config.n_ctx,
                                  seed=streams("teacher"))  # fmt: skip
    model = _rnn(config.d_model, config.d_hidden, config.gating, lambda_kind=config.lambda_kind,
                 use_gamma_norm=config.use_gamma_norm)  # fmt: skip

    def optimizer(m: GatedLinearRNN) -> torch.optim.Optimizer:
        rest = [p for n, p in m.named_parameters() if n != "nu_log"]
        groups = [{"params": rest, "lr": config.lr}, {"params": [m.nu_log], "lr": config.nu_lr}]
        return torch.optim.Adam(groups)

    eval_batch = task.batch("val", config.n_eval, streams.generator("eval"))
    return Parts(
        model=model,
        data=lambda g: task.batch("train", config.batch_size, g),
        loss=lambda m, b: task.loss(m(b["x"]), b),
        optimizer=optimizer,
        probes=[
            (TeacherStudentProbe(task, eval_batch, config.prune_delta), EveryN(config.loop.steps))
        ],  # fmt: skip
    )


# -- (c) in-context regression -------------------------------------------------------------------
class GDStep(nn.Module):
    """One GD step from w = 0 on the context, ``ŷ = η·(1/N) Σ_i y_i (x_i·x_q)``; η a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("eta", torch.zeros((), dtype=torch.float64))

    def forward(self, x: Tensor) -> Tensor:
        return one_step_gd_prediction(x, self.eta.to(x))


class FitEta:
    """The closed-form step: η* = argmin of the query MSE on ``n_fit`` fresh sequences."""

    def __init__(self, task: InContextLinearRegression, n_fit: int) -> None:
        self.task, self.n_fit = task, n_fit

    def __call__(self, model: GDStep, batch: Any, ctx: StepContext) -> Tensor:
        fit = self.task.batch("train", self.n_fit, ctx.generator)
        model.eta.fill_(float(optimal_gd_learning_rate(fit["x"], fit["y"])))
        return F.mse_loss(model(fit["x"]), fit["y"])


def _icl_model(config: ICLRun) -> nn.Module:
    d_in = config.d_x + 1
    if config.model == "grnn":
        return _rnn(d_in, config.d_hidden, config.gating, lambda_kind=config.lambda_kind)
    if config.model == "lsa":
        return MultiHeadAttention(d_in, config.n_heads, config.d_head, attention="linear",
                                  is_causal=True)  # fmt: skip
    if config.model == "lru":
        return LRUNetwork(d_in, config.d_model, config.d_hidden, config.n_layers, 1)
    return RNNBaseline(config.model, d_in, config.d_hidden, 1, config.n_layers)


def predictor(model: nn.Module) -> Callable[[Tensor], Tensor]:
    """``x -> ŷ``: the GD step's prediction, or the last coordinate of a model's output at the
    query (the label slot), as in von Oswald et al. (2023)."""
    if isinstance(model, GDStep):
        return model
    return lambda x: model(x)[:, -1, -1]


class ICLProbe:
    """On the eval set: ``eval.mse``, ``eval.y_power`` (``mean(y_q²)``, the zero predictor's
    MSE), ``eval.pred`` and ``eval.y`` ``[n_eval]``, ``eval.grad`` ``[n_grad, d_x]``
    (∂ŷ/∂x_q); ``gd.eta`` for GD; for the GRNN also the λ statistics, ``eval.mse_pruned`` and
    ``probe.r2`` ``[d_x]`` (linear probe from the query's state to Σ_i y_i x_i) and its weights."""

    def __init__(self, config: ICLRun, batch: dict[str, Tensor]) -> None:
        self.config, self.batch = config, batch

    def __call__(self, model: nn.Module, ctx: Any) -> dict[str, Tensor | float]:
        dtype = next(itertools.chain(model.parameters(), model.buffers())).dtype
        x, y = self.batch["x"].to(dtype), self.batch["y"].to(dtype)
        predict = predictor(model)
        with torch.no_grad():
            pred = predict(x)
        values: dict[str, Tensor | float] = {
            "eval.mse": F.mse_loss(pred, y),
            "eval.y_power": (y**2).mean(),
            "eval.pred": pred.cpu(),
            "eval.y": y.cpu(),
            "eval.grad": query_gradient(predict, x[: self.config.n_grad]).cpu(),
        }
        if isinstance(model, GDStep):
            values["gd.eta"] = float(model.eta)
        if isinstance(model, GatedLinearRNN):
            values.update(self._grnn(model, x, y))
        return values

    @torch.no_grad()
    def _grnn(self, model: GatedLinearRNN, x: Tensor, y: Tensor) -> dict[str, Tensor | float]:
        lam = model.lambdas()
        mask = mid_lambda_mask(lam, self.config.prune_delta)
        values: dict[str, Tensor | float] = {
            "eval.mse_pruned": F.mse_loss(predictor(pruned_copy(model, mask))(x), y),
            "pruned.count": float(mask.sum()),
            **_lambda_stats(lam, self.config.prune_delta),
        }
        with capture(model, ["hook_hidden"]) as cache:
            model(x)
        state = cache["hook_hidden"][:, -1]  # [n_eval, d_hidden], at the query
        target = torch.einsum("bi,bid->bd", x[:, :-1, -1], x[:, :-1, :-1])
        values["probe.r2"] = linear_probe_r2(state, target).cpu()
        for name in ("W_in_x", "W_in_g", "W_out_x"):  # for the block-structure figure
            if getattr(model, name) is not None:  # the ungated ablation has no gate weights
                values[f"weights.{name}"] = getattr(model, name).detach().cpu()
        values["weights.W_out_h_norm"] = model.W_out_h.detach().norm(dim=1).cpu()
        return values


def build_icl(config: ICLRun, streams: SeedStreams) -> Parts:
    """A trained model (Adam on online batches) or the GD step (η* in one closed-form step)."""
    task = InContextLinearRegression(d_x=config.d_x, n_points=config.n_points,
                                     noise_std=config.noise_std)  # fmt: skip
    eval_batch = task.batch("val", config.n_eval, streams.generator("eval"))
    probe = (ICLProbe(config, eval_batch), EveryN(config.loop.steps))
    if config.model == "gd":
        return Parts(model=GDStep(), data={}, step=FitEta(task, config.n_fit), probes=[probe])
    return Parts(
        model=_icl_model(config),
        data=lambda g: task.batch("train", config.batch_size, g),
        loss=lambda m, b: F.mse_loss(predictor(m)(b["x"]), b["y"]),
        optimizer=lambda m: torch.optim.Adam(m.parameters(), lr=config.lr),
        probes=[probe],
    )
