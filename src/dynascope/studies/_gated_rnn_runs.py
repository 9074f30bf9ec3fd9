"""Configs and runners of the ``gated-rnn-attention`` study (see that module's docstring).

Glossary:
    n_c:        construction size ``n_heads·d_head²`` (neurons the exact construction uses).
    nmse:       teacher–student loss ``mean((ŷ − y)²) / E[y²]``.
    mse:        in-context regression error at the query, ``mean((ŷ − y_q)²)``.
    eval set:   sequences drawn from ``torch.Generator(device).manual_seed(EVAL_SEED + seed)``;
                every run of one study seed sees the same eval set, so their stored predictions
                can be compared element by element.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor, nn

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
from dynascope.store import RunStore
from dynascope.studies.base import one_intra_op_thread
from dynascope.tasks.linear_attention_teacher import LinearAttentionTeacher
from dynascope.tasks.linear_regression import InContextLinearRegression

EVAL_SEED = 10_000
HIST_BINS = 20

_FROZEN = ConfigDict(extra="forbid", frozen=True)


class ConstructionConfig(BaseModel):
    """Part (a): the construction against linear attention on random weights."""

    model_config = _FROZEN

    kind: Literal["construction"] = "construction"
    seed: int = Field(0, ge=0)
    cases: list[tuple[int, int, int, int]] = Field(
        default_factory=lambda: [(4, 2, 2, 16), (5, 1, 3, 7), (6, 3, 2, 33)],
        min_length=1,
        description="(d_model, n_heads, d_head, n_ctx) per case",
    )
    batch_size: int = Field(8, ge=1)


class TeacherStudentConfig(BaseModel):
    """Part (b): one gated-RNN student of a linear-attention teacher."""

    model_config = _FROZEN

    kind: Literal["teacher_student"] = "teacher_student"
    seed: int = Field(0, ge=0, description="teacher weights, student init and data")
    d_model: int = Field(4, ge=1)
    n_heads: int = Field(1, ge=1)
    d_head: int = Field(4, ge=1)
    n_ctx: int = Field(12, ge=1)
    d_hidden: int = Field(32, ge=1, description="student neurons")
    lambda_kind: Literal["real", "complex"] = "real"
    use_gamma_norm: bool = False
    lr: float = Field(1e-3, gt=0, description="Adam step")
    batch_size: int = Field(64, ge=1)
    steps: int = Field(3000, ge=1)
    log_every: int = Field(50, ge=1)
    n_eval: int = Field(2048, ge=1, description="fresh sequences for the final nmse")
    prune_delta: float = Field(0.05, gt=0, lt=0.5, description="δ of 'mid-range' |λ|")


class ICLConfig(BaseModel):
    """Part (c): one model (or the GD reference) on in-context linear regression."""

    model_config = _FROZEN

    kind: Literal["icl"] = "icl"
    seed: int = Field(0, ge=0)
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
    steps: int = Field(5000, ge=0)
    log_every: int = Field(50, ge=1)
    n_eval: int = Field(10_000, ge=2, description="fresh sequences for MSE and agreement")
    n_grad: int = Field(1000, ge=1, description="eval sequences for ∂ŷ/∂x_q")
    n_fit: int = Field(50_000, ge=2, description="training sequences for GD's η*")
    prune_delta: float = Field(0.05, gt=0, lt=0.5)


def _store(run_dir: Path, config: BaseModel) -> RunStore:
    store = RunStore(run_dir)
    store.truncate_after(-1)  # a re-run replaces the directory's rows
    store.write_config(config.model_dump(mode="json"))
    store.set_status(0, "running")
    return store


def run_construction(
    config: ConstructionConfig, run_dir: Path, progress: bool = False, device: str = "cpu"
) -> None:
    """For each case and dtype: max |GRNN(x) − LSA(x)|, max |parallel − sequential|, counts.

    Weights ~ N(0, 1/d_model) and x ~ N(0, 1), drawn in float64 from the run seed and cast;
    logged at step 0 as ``case{i}.{float32,float64}.max_abs_err`` (also ``.max_abs_lsa``,
    ``.scan_gap``) and ``case{i}.neurons``, ``.rnn_parameters``, ``.attention_parameters``.
    """
    del progress
    dev = torch.device(device)
    generator = torch.Generator().manual_seed(config.seed)
    with one_intra_op_thread(), _store(run_dir, config) as store:
        for i, (d_model, n_heads, d_head, n_ctx) in enumerate(config.cases):
            std = 1.0 / math.sqrt(d_model)
            qkv = [
                torch.randn(n_heads, d_model, d_head, generator=generator, dtype=torch.float64)
                * std
                for _ in range(3)
            ]
            W_O = (
                torch.randn(n_heads, d_head, d_model, generator=generator, dtype=torch.float64)
                * std
            )
            x = torch.randn(
                config.batch_size, n_ctx, d_model, generator=generator, dtype=torch.float64
            )
            values = {
                f"case{i}.{k}": float(v)
                for k, v in construction_counts(d_model, n_heads, d_head).items()
            }
            for dtype in (torch.float32, torch.float64):
                W = [w.to(dev, dtype) for w in (*qkv, W_O)]
                xd = x.to(dev, dtype)
                with torch.no_grad():
                    rnn = gated_rnn_from_linear_attention(*W)
                    reference = causal_linear_attention(xd, *W)
                    parallel = rnn(xd)
                    sequential = rnn(xd, sequential=True)
                name = str(dtype).removeprefix("torch.")
                values[f"case{i}.{name}.max_abs_err"] = (parallel - reference).abs().max()
                values[f"case{i}.{name}.max_abs_lsa"] = reference.abs().max()
                values[f"case{i}.{name}.scan_gap"] = (parallel - sequential).abs().max()
            store.log(0, values)
        store.set_status(0, "finished")


def _seeded(seed: int, build):
    """Build a module with the global RNG seeded, leaving the caller's RNG state as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def _diverged(store: RunStore, step: int, loss: Tensor) -> bool:
    if torch.isfinite(loss):
        return False
    store.event(step, "diverged", f"non-finite loss {float(loss)}")
    store.set_status(step, "diverged")
    return True


def _lambda_stats(lam: Tensor, delta: float) -> dict[str, Tensor | float]:
    mass = lambda_mass(lam.detach().cpu(), delta)
    return {
        "lambda.modulus": lam.detach().abs().double().cpu(),
        "lambda.hist": lambda_histogram(lam.detach().cpu(), HIST_BINS),
        **{f"lambda.{k}": v for k, v in mass.items()},
    }


def run_teacher_student(
    config: TeacherStudentConfig, run_dir: Path, progress: bool = False, device: str = "cpu"
) -> None:
    """Train a :class:`GatedLinearRNN` on the teacher's outputs (Adam, online data).

    Logs ``train.nmse`` every ``log_every`` steps; at the last step ``eval.nmse``,
    ``eval.nmse_pruned`` (mid-range-λ neurons pruned), ``pruned.count`` and the λ statistics
    (``lambda.modulus`` ``[d_hidden]``, ``lambda.hist`` ``[20]``, ``lambda.near_0`` ...).
    """
    del progress
    dev = torch.device(device)
    with one_intra_op_thread(), _store(run_dir, config) as store:
        task = LinearAttentionTeacher(
            d_model=config.d_model,
            n_heads=config.n_heads,
            d_head=config.d_head,
            n_ctx=config.n_ctx,
            seed=config.seed,
        )
        model = _seeded(
            config.seed,
            lambda: GatedLinearRNN(
                config.d_model,
                config.d_hidden,
                lambda_kind=config.lambda_kind,
                use_gamma_norm=config.use_gamma_norm,
            ),
        ).to(dev)
        optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
        generator = torch.Generator(dev).manual_seed(config.seed)
        for step in range(1, config.steps + 1):
            batch = task.batch("train", config.batch_size, generator)
            loss = task.loss(model(batch["x"]), batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if step % config.log_every == 0 or step == config.steps:
                if _diverged(store, step, loss.detach()):
                    return
                store.log(step, {"train.nmse": loss.detach()})
        eval_batch = task.batch(
            "val", config.n_eval, torch.Generator(dev).manual_seed(EVAL_SEED + config.seed)
        )
        with torch.no_grad():
            lam = model.lambdas()
            mask = mid_lambda_mask(lam, config.prune_delta)
            pruned = pruned_copy(model, mask)
            store.log(
                config.steps,
                {
                    "eval.nmse": task.loss(model(eval_batch["x"]), eval_batch),
                    "eval.nmse_pruned": task.loss(pruned(eval_batch["x"]), eval_batch),
                    "pruned.count": float(mask.sum()),
                    **_lambda_stats(lam, config.prune_delta),
                },
            )
        store.set_status(config.steps, "finished")


def _icl_model(config: ICLConfig) -> nn.Module:
    d_in = config.d_x + 1
    if config.model == "grnn":
        return GatedLinearRNN(d_in, config.d_hidden, lambda_kind=config.lambda_kind)
    if config.model == "lsa":
        return MultiHeadAttention(
            d_in, config.n_heads, config.d_head, kind="linear", is_causal=True
        )
    if config.model == "lru":
        return LRUNetwork(d_in, config.d_model, config.d_hidden, config.n_layers, 1)
    return RNNBaseline(config.model, d_in, config.d_hidden, 1, config.n_layers)


def _predict(model: nn.Module) -> Callable[[Tensor], Tensor]:
    return lambda x: model(x)[:, -1, -1]  # last coordinate of the output at the query


def run_icl(config: ICLConfig, run_dir: Path, progress: bool = False, device: str = "cpu") -> None:
    """Train one model on in-context linear regression, or fit GD's η* (``model="gd"``).

    Logs ``train.mse`` every ``log_every`` steps (trained models) and, at the last step,
    ``eval.mse``, ``eval.pred`` ``[n_eval]``, ``eval.grad`` ``[n_grad, d_x]`` (∂ŷ/∂x_q);
    ``gd.eta`` for GD; for the GRNN also the λ statistics, ``eval.mse_pruned`` and
    ``probe.r2`` ``[d_x]`` (linear probe from the query's state to Σ_i y_i x_i).
    """
    del progress
    dev = torch.device(device)
    task = InContextLinearRegression(
        d_x=config.d_x, n_points=config.n_points, noise_std=config.noise_std
    )
    generator = torch.Generator(dev).manual_seed(config.seed)
    with one_intra_op_thread(), _store(run_dir, config) as store:
        eval_batch = task.batch(
            "val", config.n_eval, torch.Generator(dev).manual_seed(EVAL_SEED + config.seed)
        )
        x_eval, y_eval = eval_batch["x"], eval_batch["y"]
        x_grad = x_eval[: config.n_grad]
        if config.model == "gd":
            fit = task.batch("train", config.n_fit, generator)
            eta = optimal_gd_learning_rate(fit["x"], fit["y"])
            pred = one_step_gd_prediction(x_eval, eta)
            grad = query_gradient(lambda x: one_step_gd_prediction(x, eta), x_grad)
            values = {
                "gd.eta": eta,
                "eval.mse": F.mse_loss(pred, y_eval),
                "eval.pred": pred.cpu(),
                "eval.grad": grad.cpu(),
            }
            store.log(0, values)
            store.set_status(0, "finished")
            return
        model = _seeded(config.seed, lambda: _icl_model(config)).to(dev)
        predict = _predict(model)
        optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
        for step in range(1, config.steps + 1):
            batch = task.batch("train", config.batch_size, generator)
            loss = F.mse_loss(predict(batch["x"]), batch["y"])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if step % config.log_every == 0 or step == config.steps:
                if _diverged(store, step, loss.detach()):
                    return
                store.log(step, {"train.mse": loss.detach()})
        with torch.no_grad():
            pred = predict(x_eval)
        values = {
            "eval.mse": F.mse_loss(pred, y_eval),
            "eval.pred": pred.cpu(),
            "eval.grad": query_gradient(predict, x_grad).cpu(),
        }
        if isinstance(model, GatedLinearRNN):
            with torch.no_grad():
                lam = model.lambdas()
                mask = mid_lambda_mask(lam, config.prune_delta)
                values["eval.mse_pruned"] = F.mse_loss(
                    _predict(pruned_copy(model, mask))(x_eval), y_eval
                )
                values["pruned.count"] = float(mask.sum())
                values.update(_lambda_stats(lam, config.prune_delta))
                with capture(model, ["hook_hidden"]) as cache:
                    model(x_eval)
                state = cache["hook_hidden"][:, -1]  # [n_eval, d_hidden], at the query
                target = torch.einsum("bi,bid->bd", x_eval[:, :-1, -1], x_eval[:, :-1, :-1])
                values["probe.r2"] = linear_probe_r2(state, target).cpu()
                for name in ("W_in_x", "W_in_g", "W_out_x"):  # for the block-structure figure
                    values[f"weights.{name}"] = getattr(model, name).detach().cpu()
                values["weights.W_out_h_norm"] = model.W_out_h.detach().norm(dim=1).cpu()
        store.log(config.steps, values)
        store.set_status(config.steps, "finished")
