"""Run configs and runners of the ``randomized-algorithms`` study (recall, cycle colouring).

Glossary: N keys, b value bits, d_r seed width, m training seeds, q the Lq exponent; see
:mod:`dynascope.tasks.seeded_recall`, :mod:`dynascope.tasks.cycle_colouring`,
:mod:`dynascope.optim.lq` and :mod:`dynascope.probes.randomized`.

Both runners train with Adam on ``lq_loss(per_seed_loss [batch, m], q)``: a fresh batch and,
for randomized models, m fresh seeds (shared across the batch) every step; a fixed-seed model
uses one constant seed r0 (drawn once from the run's generator) for training and evaluation.
Learning rate: linear warm-up 0 -> ``lr`` over ``warmup_steps``, then cosine to ``final_lr``
(the reference code's shape). Gradients are clipped to global norm ``grad_clip``.
At the end each model is evaluated on a held-out set drawn from its own generator
(``eval_data_seed``, the same for every run, so all models see the same inputs) with
``eval_seeds`` seeds from a third generator.

Logged scalars: ``train.loss`` (Lq), ``train.mean_loss`` (q = 1), ``train.success`` every
``log_every`` steps; at the last step ``eval.mean_success``, ``eval.p5_success``,
``eval.min_success``, ``eval.majority_success``, ``eval.sampled_success``,
``eval.majority_sampled_success`` and (recall) ``eval.predictive_variance``; tensor
``eval.per_input_success`` ``[eval_inputs]``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from dynascope.nn import Transformer
from dynascope.nn.masked_transformer import MaskedTransformer
from dynascope.nn.random_inputs import RandomInputs, draw_seeds
from dynascope.optim.lq import lq_loss
from dynascope.probes.randomized import (
    bits_to_int,
    majority_vote,
    per_input_success,
    predictive_variance,
    sample_bits,
    success_percentile,
)
from dynascope.store import RunStore
from dynascope.studies.base import one_intra_op_thread
from dynascope.tasks.cycle_colouring import CycleColouring, all_cycles
from dynascope.tasks.seeded_recall import SeededRecall

__all__ = ["ColouringRunConfig", "RecallRunConfig", "run_colouring", "run_recall"]


class _Train(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = Field(0, ge=0)
    q: float = Field(32.0, ge=1, allow_inf_nan=False, description="Lq exponent (1 = ERM)")
    random_seeds: bool = Field(True, description="fresh seeds each step (False: one fixed r0)")
    m_seeds: int = Field(8, ge=1, description="training seeds per step, shared across the batch")
    batch_size: int = Field(128, ge=1)
    steps: int = Field(3000, ge=1)
    lr: float = Field(3e-3, gt=0)
    final_lr: float = Field(3e-4, ge=0)
    warmup_steps: int = Field(333, ge=0)
    beta2: float = Field(0.95, gt=0, lt=1)
    adam_eps: float = Field(1e-5, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    eval_inputs: int = Field(2048, ge=1)
    eval_seeds: int = Field(30, ge=1)
    eval_data_seed: int = Field(1_000_003, ge=0, description="held-out set generator seed")
    log_every: int = Field(25, ge=1)
    device: str = "cpu"


class RecallRunConfig(_Train):
    """One associative-recall model (SYSTEMS.md S2 task A)."""

    kind: Literal["recall"] = "recall"
    n_keys: int = Field(12, ge=1)
    n_value_bits: int = Field(5, ge=1)
    d_seed: int = Field(10, ge=1, description="seed bits appended to every token")
    key_size: int = Field(4, ge=1, description="d_head of the linear attention (capacity)")
    d_model: int = Field(32, ge=1)
    n_layers: int = Field(2, ge=1)


class ColouringRunConfig(_Train):
    """One cycle-colouring model (SYSTEMS.md S2 task B)."""

    kind: Literal["colouring"] = "colouring"
    n_vertices: int = Field(10, ge=3)
    d_seed: int = Field(1, ge=1, description="U[0,1] numbers per vertex")
    seed_per_vertex: bool = Field(True, description="each vertex draws its own r (else shared)")
    d_model: int = Field(16, ge=1)
    key_size: int = Field(16, ge=1)
    n_heads: int = Field(1, ge=1)
    d_mlp: int = Field(64, ge=0)
    n_layers: int = Field(2, ge=1)
    eval_all_cycles: bool = Field(True, description="evaluate on every cycle (else eval_inputs)")


def _lr_at(step: int, cfg: _Train) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(cfg.steps - cfg.warmup_steps, 1)
    t = min((step - cfg.warmup_steps) / span, 1.0)
    return cfg.final_lr + 0.5 * (cfg.lr - cfg.final_lr) * (1 + math.cos(math.pi * t))


def recall_model(cfg: RecallRunConfig) -> RandomInputs:
    """Linear-attention transformer (no MLP, no LayerNorm, causal, no positions) + seed wrapper.

    ``W_O`` of every block is scaled by ``1/(2 sqrt(n_layers))`` after the default init (the
    reference code's pre-skip scaling).
    """
    task = SeededRecall(n_keys=cfg.n_keys, n_value_bits=cfg.n_value_bits)
    net = Transformer(
        n_layers=cfg.n_layers,
        d_model=cfg.d_model,
        n_heads=1,
        d_head=cfg.key_size,
        d_mlp=0,
        d_in=task.d_in + cfg.d_seed,
        d_out=task.d_out,
        n_ctx=task.n_ctx,
        positional="none",
        attention="linear",
        is_causal=True,
        use_ln=False,
    )
    with torch.no_grad():
        for block in net.blocks:
            block.attn.W_O.mul_(1.0 / (2.0 * math.sqrt(cfg.n_layers)))
    return RandomInputs(net, cfg.d_seed)


def colouring_model(cfg: ColouringRunConfig) -> RandomInputs:
    """Neighbour-masked softmax transformer + per-vertex (or shared) seed wrapper."""
    net = MaskedTransformer(
        n_layers=cfg.n_layers,
        d_model=cfg.d_model,
        n_heads=cfg.n_heads,
        d_head=cfg.key_size,
        d_mlp=cfg.d_mlp,
        d_in=cfg.n_vertices + cfg.d_seed,
        d_out=3,
    )
    return RandomInputs(net, cfg.d_seed)


def _seeds(cfg, m: int, generator: torch.Generator, r0: torch.Tensor, kind: str, pos):
    if not cfg.random_seeds:
        return r0[None].expand(m, *r0.shape)
    return draw_seeds(m, cfg.d_seed, kind=kind, generator=generator, pos=pos)


def _train(cfg, run_dir: Path, task, wrapper, seed_kind: str, pos, eval_batch, forward):
    device = torch.device(cfg.device)
    g = torch.Generator(device=device).manual_seed(cfg.seed)
    r0 = draw_seeds(1, cfg.d_seed, kind=seed_kind, generator=g, pos=pos)[0]
    opt = torch.optim.AdamW(
        wrapper.parameters(),
        lr=cfg.lr,
        betas=(0.9, cfg.beta2),
        eps=cfg.adam_eps,
        weight_decay=cfg.weight_decay,
    )
    with RunStore(run_dir) as store:
        store.truncate_after(-1)
        store.write_config(cfg.model_dump(mode="json"))
        store.set_status(0, "running")
        for step in range(cfg.steps):
            for group in opt.param_groups:
                group["lr"] = _lr_at(step, cfg)
            batch = task.batch(cfg.batch_size, g)
            seeds = _seeds(cfg, cfg.m_seeds, g, r0, seed_kind, pos)
            out = forward(wrapper, batch, seeds)  # [batch, m, pos, d_out]
            losses = task.per_seed_loss(out, batch)  # [batch, m]
            loss = lq_loss(losses, cfg.q)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(wrapper.parameters(), cfg.grad_clip)
            opt.step()
            if step % cfg.log_every == 0 or step == cfg.steps - 1:
                store.log(
                    step + 1,
                    {
                        "train.loss": loss.detach(),
                        "train.mean_loss": losses.detach().mean(),
                        "train.success": task.correct(out.detach(), batch).float().mean(),
                    },
                )
            if not torch.isfinite(loss):
                store.event(step + 1, "diverged", f"loss={float(loss)}")
                store.set_status(step + 1, "diverged")
                return
        eval_g = torch.Generator(device=device).manual_seed(cfg.seed + 7_919)
        seeds = _seeds(cfg, cfg.eval_seeds, eval_g, r0, seed_kind, pos)
        with torch.no_grad():
            store.log(cfg.steps, _evaluate(task, wrapper, eval_batch, seeds, forward, eval_g))
        store.set_status(cfg.steps, "finished")


def _evaluate(task, wrapper, batch, seeds, forward, generator) -> dict[str, torch.Tensor]:
    """Success statistics over inputs x seeds; chunks of inputs bound the memory."""
    n = next(iter(batch.values())).shape[0]
    correct, answers, sampled_ok, sampled, variances = [], [], [], [], []
    chunk = max(1, 65_536 // seeds.shape[0])
    bits = isinstance(task, SeededRecall)
    for start in range(0, n, chunk):
        part = {k: v[start : start + chunk] for k, v in batch.items()}
        out = forward(wrapper, part, seeds)  # [chunk, m, pos, d_out]
        correct.append(task.correct(out, part))
        if bits:
            logits = out[:, :, -1]  # [chunk, m, b]
            answers.append(bits_to_int(logits > 0))
            draws = sample_bits(logits, generator)
            sampled.append(bits_to_int(draws))
            sampled_ok.append((draws == part["y"][:, None].long()).all(dim=-1))
            variances.append(predictive_variance(logits) * len(logits))
        else:
            probs = out.softmax(dim=-1)  # [chunk, m, n, C]
            draws = torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, generator=generator)
            colours = draws.reshape(probs.shape[:-1])  # [chunk, m, n], one sampled colouring
            # one-hot "logits" whose argmax is the sampled colour, scored like argmax answers
            onehot = torch.nn.functional.one_hot(colours, probs.shape[-1]).float()
            sampled_ok.append(task.correct(onehot, part))
    correct_t = torch.cat(correct)
    success = per_input_success(correct_t)
    sampled_success = per_input_success(torch.cat(sampled_ok))
    result = {
        "eval.mean_success": success.mean(),
        "eval.p5_success": success_percentile(success, 5.0),
        "eval.min_success": success.min(),
        "eval.sampled_success": sampled_success.mean(),
        "eval.per_input_success": success,
    }
    if bits:
        truth = bits_to_int(batch["y"])
        result["eval.majority_success"] = (
            (majority_vote(torch.cat(answers), 2**task.n_value_bits) == truth).float().mean()
        )
        result["eval.majority_sampled_success"] = (
            (majority_vote(torch.cat(sampled), 2**task.n_value_bits) == truth).float().mean()
        )
        result["eval.predictive_variance"] = torch.stack(variances).sum() / n
    else:  # a colouring succeeds under vote when more than half of the seeds colour properly
        result["eval.majority_success"] = (success > 0.5).float().mean()
        result["eval.majority_sampled_success"] = (sampled_success > 0.5).float().mean()
    return result


def _recall_forward(wrapper, batch, seeds):
    return wrapper(batch["x"], seeds)


def _colouring_forward(wrapper, batch, seeds):
    return wrapper(batch["x"], seeds, attn_mask=batch["attn_mask"])


def run_recall(
    config: RecallRunConfig, run_dir: Path, progress: bool = False, device: str | None = None
) -> None:
    """Train and evaluate one recall model (see the module docstring)."""
    del progress
    if device is not None:
        config = config.model_copy(update={"device": device})
    torch.manual_seed(config.seed)
    task = SeededRecall(n_keys=config.n_keys, n_value_bits=config.n_value_bits)
    with one_intra_op_thread():
        wrapper = recall_model(config).to(torch.device(config.device))
        eval_g = torch.Generator(device=config.device).manual_seed(config.eval_data_seed)
        eval_batch = task.batch(config.eval_inputs, eval_g)
        eval_batch = {k: v for k, v in eval_batch.items() if k != "query_index"}
        _train(config, run_dir, task, wrapper, "bits", None, eval_batch, _recall_forward)


def run_colouring(
    config: ColouringRunConfig, run_dir: Path, progress: bool = False, device: str | None = None
) -> None:
    """Train and evaluate one cycle-colouring model (see the module docstring).

    Evaluation: every cycle on ``n_vertices`` labelled vertices when ``eval_all_cycles`` (and
    n <= 11), else ``eval_inputs`` random cycles. "Majority" for colourings: the fraction of
    cycles coloured properly by more than half of the seeds (a vote over whole colourings is
    ill-defined when different seeds pick different valid colourings).
    """
    del progress
    if device is not None:
        config = config.model_copy(update={"device": device})
    torch.manual_seed(config.seed)
    task = CycleColouring(n_vertices=config.n_vertices)
    pos = config.n_vertices if config.seed_per_vertex else None
    with one_intra_op_thread():
        dev = torch.device(config.device)
        wrapper = colouring_model(config).to(dev)
        if config.eval_all_cycles and config.n_vertices <= 11:
            eval_batch = task.from_orders(all_cycles(config.n_vertices).to(dev))
        else:
            eval_g = torch.Generator(device=dev).manual_seed(config.eval_data_seed)
            eval_batch = task.batch(config.eval_inputs, eval_g)
        _train(config, run_dir, task, wrapper, "uniform", pos, eval_batch, _colouring_forward)
