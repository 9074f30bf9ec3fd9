"""Grid-world runner of the ``randomized-algorithms`` study: PGPE against an exact adversary.

Glossary: P population, m seeds per generation, 24 treasure cells (the adversary's options),
see :mod:`dynascope.tasks.grid_world` and :mod:`dynascope.optim.es`.

Per generation: m fresh Gaussian seeds (shared by the whole population: common random numbers),
every member plays every (treasure, seed) pair, its loss is ``max_treasure mean_seed
(-return)`` (q = inf, the adversary enumerates all 24 cells), and PGPE updates the centre and
the per-parameter std. Logged every ``log_every`` generations: ``train.best_loss``,
``train.mean_loss`` (over the population) and the centre's ``eval.worst_return`` /
``eval.mean_return`` on ``eval_seeds`` fixed seeds; at the end also the tensor
``eval.per_treasure_return`` ``[24]`` (seed-averaged return per treasure cell).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch.func import functional_call

from dynascope.nn.masked_transformer import MaskedTransformer
from dynascope.optim.es import PGPE, vectorize, worst_case
from dynascope.store import RunStore
from dynascope.studies.base import one_intra_op_thread
from dynascope.tasks.grid_world import GridWorld

__all__ = ["GridWorldRunConfig", "run_grid_world"]


class GridWorldRunConfig(BaseModel):
    """One PGPE-trained grid-world agent (SYSTEMS.md S2 task C)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["grid_world"] = "grid_world"
    seed: int = Field(0, ge=0)
    size: int = Field(5, ge=2)
    steps_per_episode: int = Field(25, ge=1)
    d_seed: int = Field(8, ge=1, description="Gaussian seed width")
    m_seeds: int = Field(10, ge=1)
    d_model: int = Field(80, ge=1)
    n_heads: int = Field(4, ge=1)
    key_size: int = Field(10, ge=1)
    d_mlp: int = Field(160, ge=0)
    n_layers: int = Field(2, ge=1)
    population: int = Field(300, ge=2)
    center_lr: float = Field(0.01, gt=0)
    std_lr: float = Field(0.01, gt=0)
    init_std: float = Field(0.03, gt=0)
    generations: int = Field(10_000, ge=1)
    chunk_size: int | None = Field(None, ge=1, description="population members per vmap chunk")
    eval_seeds: int = Field(30, ge=1)
    log_every: int = Field(10, ge=1)
    device: str = "cpu"


def _policy_model(cfg: GridWorldRunConfig, env: GridWorld) -> MaskedTransformer:
    """Causal softmax transformer without positional embeddings.

    :class:`MaskedTransformer` with a causal ``attn_mask`` rather than :class:`Transformer`:
    its explicit softmax path has vmap batching rules, while the fused CPU attention kernel
    falls back to a per-member loop under ``torch.func.vmap``.
    """
    return MaskedTransformer(
        n_layers=cfg.n_layers,
        d_model=cfg.d_model,
        n_heads=cfg.n_heads,
        d_head=cfg.key_size,
        d_mlp=cfg.d_mlp,
        d_in=env.d_obs + cfg.d_seed,
        d_out=env.n_actions,
    )


def _returns(model, params, env: GridWorld, seeds: torch.Tensor) -> torch.Tensor:
    """Returns ``[n_treasures, m]`` of one parameter set on every (treasure, seed) pair."""
    treasures = env.treasures(seeds.device)
    n, m = treasures.shape[0], seeds.shape[0]
    rows_t = treasures.repeat_interleave(m)  # treasure-major
    rows_s = seeds.repeat(n, 1)

    def policy(tokens):
        t = tokens.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool, device=tokens.device).tril()
        return functional_call(model, params, (tokens, causal.expand(tokens.shape[0], t, t)))

    return env.rollout(policy, rows_t, rows_s).reshape(n, m)


def run_grid_world(
    config: GridWorldRunConfig, run_dir: Path, progress: bool = False, device: str | None = None
) -> None:
    """Train one agent with PGPE against the exact adversary (see the module docstring)."""
    del progress
    if device is not None:
        config = config.model_copy(update={"device": device})
    dev = torch.device(config.device)
    torch.manual_seed(config.seed)
    env = GridWorld(size=config.size, steps_per_episode=config.steps_per_episode)
    with one_intra_op_thread(), RunStore(run_dir) as store:
        model = _policy_model(config, env).to(dev)
        g = torch.Generator(device=dev).manual_seed(config.seed)
        eval_seeds = torch.randn(
            config.eval_seeds,
            config.d_seed,
            generator=torch.Generator(device=dev).manual_seed(config.seed + 7_919),
            device=dev,
        )
        es = PGPE(
            model,
            population=config.population,
            center_lr=config.center_lr,
            std_lr=config.std_lr,
            init_std=config.init_std,
            generator=g,
        )
        store.truncate_after(-1)
        store.write_config(config.model_dump(mode="json"))
        store.set_status(0, "running")
        for gen in range(config.generations):
            seeds = torch.randn(config.m_seeds, config.d_seed, generator=g, device=dev)
            objective = worst_case(lambda p, s=seeds: -_returns(model, p, env, s))
            losses = es.step(vectorize(objective, chunk_size=config.chunk_size))
            last = gen == config.generations - 1
            if gen % config.log_every == 0 or last:
                with torch.no_grad():
                    centre = {k: v.detach() for k, v in es.center.items()}
                    returns = _returns(model, centre, env, eval_seeds)  # [24, eval_seeds]
                row = {
                    "train.best_loss": losses.min(),
                    "train.mean_loss": losses.mean(),
                    "eval.worst_return": returns.mean(dim=1).min(),
                    "eval.mean_return": returns.mean(),
                }
                if last:
                    row["eval.per_treasure_return"] = returns.mean(dim=1)
                store.log(gen + 1, row)
        store.set_status(config.generations, "finished")
