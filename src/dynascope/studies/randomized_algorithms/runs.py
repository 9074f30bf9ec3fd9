"""randomized-algorithms runs on the engine: recall, cycle colouring (Adam on the Lq loss) and
the grid world (PGPE against the exact adversary, a custom step; :mod:`.grid_world`).

Glossary: N keys, b value bits, d_seed seed width, m training seeds, q the Lq exponent; see
:mod:`dynascope.tasks.seeded_recall`, :mod:`dynascope.tasks.cycle_colouring`,
:mod:`dynascope.tasks.grid_world`, :mod:`dynascope.optim.lq`, :mod:`dynascope.optim.es` and
:mod:`dynascope.probes.randomized`.

Recall and colouring: each step's batch carries fresh inputs and the m seeds (fresh for a
randomized model, shared across the batch; a fixed-seed model's one seed r0, drawn once from
stream ``r0``), and the loss is ``lq_loss(per_seed_loss [batch, m], q)``, a pure function of the
model and the batch, so the seeds of one arm train as one ensemble. Logged (window means):
``train.loss`` (Lq), ``train.mean_loss`` (q = 1), ``train.success``. At the last step a probe
evaluates the held-out set (from seed ``eval_data_seed``'s stream ``eval_inputs``: the same
inputs for every run) with ``eval_seeds`` seeds from the run's stream ``eval``:
``eval.mean_success``, ``eval.p5_success``, ``eval.min_success``, ``eval.majority_success``,
``eval.sampled_success``, ``eval.majority_sampled_success``, (recall)
``eval.predictive_variance`` and the tensor ``eval.per_input_success`` ``[inputs]``.
Notes: docs/studies/randomized-algorithms.md.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from dynascope.nn import Transformer
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
from dynascope.tasks.cycle_colouring import CycleColouring, all_cycles
from dynascope.tasks.seeded_recall import SeededRecall
from dynascope.train import EngineRunConfig, Parts, SeedStreams

if TYPE_CHECKING:
    from .grid_world import GridWorldRun

__all__ = [
    "ColouringRun",
    "RecallRun",
    "build_colouring",
    "build_recall",
    "colouring_model",
    "recall_model",
]


class _LqRun(EngineRunConfig):
    """What recall and colouring share: the Lq objective, the seeds, Adam and the evaluation."""

    q: float = Field(32.0, ge=1, allow_inf_nan=False, description="Lq exponent (1 = ERM)")
    random_seeds: bool = Field(True, description="fresh seeds each step (False: one fixed r0)")
    m_seeds: int = Field(8, ge=1, description="training seeds per step, shared across the batch")
    batch_size: int = Field(128, ge=1)
    lr: float = Field(3e-3, gt=0, description="base rate (the loop's schedule scales it)")
    beta2: float = Field(0.95, gt=0, lt=1)
    adam_eps: float = Field(1e-5, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    eval_inputs: int = Field(2048, ge=1)
    eval_seeds: int = Field(30, ge=1)
    eval_data_seed: int = Field(1_000_003, ge=0, description="held-out set's seed (every run)")


class RecallRun(_LqRun):
    """One associative-recall model (SYSTEMS.md S2 task A)."""

    kind: Literal["recall"] = "recall"
    n_keys: int = Field(12, ge=1)
    n_value_bits: int = Field(5, ge=1)
    d_seed: int = Field(10, ge=1, description="seed bits appended to every token")
    d_head: int = Field(4, ge=1, description="the linear attention's key size (capacity)")
    d_model: int = Field(32, ge=1)
    n_layers: int = Field(2, ge=1)


class ColouringRun(_LqRun):
    """One cycle-colouring model (SYSTEMS.md S2 task B)."""

    kind: Literal["colouring"] = "colouring"
    n_vertices: int = Field(10, ge=3)
    d_seed: int = Field(1, ge=1, description="U[0,1] numbers per vertex")
    seed_per_vertex: bool = Field(True, description="each vertex draws its own r (else shared)")
    d_model: int = Field(16, ge=1)
    d_head: int = Field(16, ge=1)
    n_heads: int = Field(1, ge=1)
    d_mlp: int = Field(64, ge=0)
    n_layers: int = Field(2, ge=1)
    eval_all_cycles: bool = Field(True, description="evaluate on every cycle (else eval_inputs)")


def recall_model(cfg: RecallRun) -> RandomInputs:
    """Linear-attention transformer (no MLP, no LayerNorm, causal, no positions) + seed wrapper.

    ``W_O`` of every block is scaled by ``1/(2 sqrt(n_layers))`` after the default init (the
    reference code's pre-skip scaling).
    """
    task = SeededRecall(n_keys=cfg.n_keys, n_value_bits=cfg.n_value_bits)
    net = Transformer(
        n_layers=cfg.n_layers,
        d_model=cfg.d_model,
        n_heads=1,
        d_head=cfg.d_head,
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


def _masked_transformer(
    cfg: ColouringRun | GridWorldRun, *, d_in: int, d_out: int, n_ctx: int
) -> Transformer:
    """A softmax :class:`Transformer` on vectors, without positions, read under an ``attn_mask``
    (no causal mask of its own), initialised in the order the study was validated with.

    The weights are drawn from torch's global RNG as ``W_in = randn(d_in, d_model) /
    sqrt(d_in)``, then every block's attention and MLP (their own ``reset_parameters``), then
    ``W_U = randn(d_model, d_out) / sqrt(d_model)``, ``b_U = 0``: the same distributions as
    :class:`Transformer`'s own initialisation, which draws ``W_in`` after the blocks; the order
    keeps every run of this study bitwise what it was when its protocol was fixed.
    """
    with torch.random.fork_rng(devices=[]):  # the construction's draws are replaced below
        net = Transformer(
            n_layers=cfg.n_layers,
            d_model=cfg.d_model,
            n_heads=cfg.n_heads,
            d_head=cfg.d_head,
            d_mlp=cfg.d_mlp,
            d_in=d_in,
            d_out=d_out,
            n_ctx=n_ctx,
            positional="none",
            is_causal=False,
        )
    with torch.no_grad():
        net.W_in.copy_(torch.randn(d_in, cfg.d_model) / math.sqrt(d_in))
        for block in net.blocks:
            block.attn.reset_parameters()
            if block.mlp is not None:
                block.mlp.reset_parameters()
        net.W_U.copy_(torch.randn(cfg.d_model, d_out) / math.sqrt(cfg.d_model))
    return net


def colouring_model(cfg: ColouringRun) -> RandomInputs:
    """Neighbour-masked softmax transformer + per-vertex (or shared) seed wrapper."""
    d_in = cfg.n_vertices + cfg.d_seed
    net = _masked_transformer(cfg, d_in=d_in, d_out=3, n_ctx=cfg.n_vertices)
    return RandomInputs(net, cfg.d_seed)


class _AtEnd:
    """A probe schedule due at the last step only."""

    def __init__(self, step: int) -> None:
        self.step = step

    def due(self, step: int) -> bool:
        return step == self.step


def _lq_parts(cfg: _LqRun, streams: SeedStreams, task, model, eval_batch, kind, pos) -> Parts:
    """Adam on the Lq loss, batches with their seeds, the evaluation probe at the end."""
    r0 = draw_seeds(1, cfg.d_seed, kind=kind, generator=streams.generator("r0"), pos=pos)

    def seeds(m: int, g: torch.Generator) -> Tensor:
        if not cfg.random_seeds:
            return r0.expand(m, *r0.shape[1:])
        return draw_seeds(m, cfg.d_seed, kind=kind, generator=g, pos=pos)

    def data(g: torch.Generator) -> dict[str, Tensor]:
        batch = {k: v for k, v in task.batch(cfg.batch_size, g).items() if k != "query_index"}
        return batch | {"seeds": seeds(cfg.m_seeds, g)}

    def loss(model: RandomInputs, batch: dict[str, Tensor]) -> tuple[Tensor, dict]:
        out = _forward(model, batch, batch["seeds"])  # [batch, m, pos, d_out]
        losses = task.per_seed_loss(out, batch)  # [batch, m]
        success = task.correct(out.detach(), batch).float().mean()
        metrics = {"mean_loss": losses.detach().mean(), "success": success}
        return lq_loss(losses, cfg.q, validate=False), metrics

    def optimizer(model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.AdamW(
            model.parameters(),
            lr=cfg.lr,
            betas=(0.9, cfg.beta2),
            eps=cfg.adam_eps,
            weight_decay=cfg.weight_decay,
        )

    def evaluation(model: RandomInputs, ctx: Any) -> dict[str, Tensor]:
        g = streams.generator("eval")
        with torch.no_grad():
            return _evaluate(task, model, eval_batch, seeds(cfg.eval_seeds, g), g)

    return Parts(
        model=model,
        data=data,
        loss=loss,
        optimizer=optimizer,
        probes=[(evaluation, _AtEnd(cfg.loop.steps))],
    )


def build_recall(config: RecallRun, streams: SeedStreams) -> Parts:
    """A recall model (weights from stream ``init``), its held-out set and Adam on Lq."""
    task = SeededRecall(n_keys=config.n_keys, n_value_bits=config.n_value_bits)
    held_out = SeedStreams(config.eval_data_seed).generator("eval_inputs")
    eval_batch = task.batch(config.eval_inputs, held_out)
    eval_batch = {k: v for k, v in eval_batch.items() if k != "query_index"}
    return _lq_parts(config, streams, task, recall_model(config), eval_batch, "bits", None)


def build_colouring(config: ColouringRun, streams: SeedStreams) -> Parts:
    """A colouring model; evaluated on every cycle of ``n_vertices`` labelled vertices when
    ``eval_all_cycles`` (and n <= 11), else on ``eval_inputs`` random cycles. "Majority" for
    colourings: the fraction of cycles coloured properly by more than half of the seeds."""
    task = CycleColouring(n_vertices=config.n_vertices)
    pos = config.n_vertices if config.seed_per_vertex else None
    if config.eval_all_cycles and config.n_vertices <= 11:
        eval_batch = task.from_orders(all_cycles(config.n_vertices))
    else:
        held_out = SeedStreams(config.eval_data_seed).generator("eval_inputs")
        eval_batch = task.batch(config.eval_inputs, held_out)
    return _lq_parts(config, streams, task, colouring_model(config), eval_batch, "uniform", pos)


def _forward(model: RandomInputs, batch: dict[str, Tensor], seeds: Tensor) -> Tensor:
    if "attn_mask" in batch:
        return model(batch["x"], seeds, attn_mask=batch["attn_mask"])
    return model(batch["x"], seeds)


def _evaluate(task, model, batch, seeds, generator) -> dict[str, Tensor]:
    """Success statistics over inputs x seeds; chunks of inputs bound the memory."""
    dev = next(model.parameters()).device
    batch = {k: v.to(dev) for k, v in batch.items()}
    seeds = seeds.to(dev)
    n = next(iter(batch.values())).shape[0]
    correct, answers, sampled_ok, sampled, variances = [], [], [], [], []
    chunk = max(1, 65_536 // seeds.shape[0])
    bits = isinstance(task, SeededRecall)
    for start in range(0, n, chunk):
        part = {k: v[start : start + chunk] for k, v in batch.items()}
        out = _forward(model, part, seeds).cpu()  # [chunk, m, pos, d_out]
        part = {k: v.cpu() for k, v in part.items()}
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
    success = per_input_success(torch.cat(correct))
    sampled_success = per_input_success(torch.cat(sampled_ok))
    result = {
        "eval.mean_success": success.mean(),
        "eval.p5_success": success_percentile(success, 5.0),
        "eval.min_success": success.min(),
        "eval.sampled_success": sampled_success.mean(),
        "eval.per_input_success": success,
    }
    if bits:
        truth = bits_to_int(batch["y"].cpu())
        n_answers = 2**task.n_value_bits
        result["eval.majority_success"] = (
            (majority_vote(torch.cat(answers), n_answers) == truth).float().mean()
        )
        result["eval.majority_sampled_success"] = (
            (majority_vote(torch.cat(sampled), n_answers) == truth).float().mean()
        )
        result["eval.predictive_variance"] = torch.stack(variances).sum() / n
    else:  # a colouring succeeds under vote when more than half of the seeds colour properly
        result["eval.majority_success"] = (success > 0.5).float().mean()
        result["eval.majority_sampled_success"] = (sampled_success > 0.5).float().mean()
    return result
