"""randomized-algorithms' grid-world runs on the engine: a policy trained by PGPE against the
exact adversary, in a custom step (:class:`PGPEStep`); re-exported by :mod:`.runs`.

Glossary and the other two tasks: :mod:`.runs`; the task :mod:`dynascope.tasks.grid_world`,
the estimator :mod:`dynascope.optim.es`. Notes: docs/studies/randomized-algorithms.md.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field
from torch import Tensor, nn
from torch.func import functional_call

from dynascope.monitor import EveryN
from dynascope.optim.es import PGPE, vectorize, worst_case
from dynascope.tasks.grid_world import GridWorld
from dynascope.train import EngineRunConfig, Parts, SeedStreams, StepContext

from .runs import _masked_transformer


# -- grid world (task C): PGPE against the exact adversary -------------------------------------
class GridWorldRun(EngineRunConfig):
    """One PGPE-trained grid-world agent (SYSTEMS.md S2 task C); a loop step is a generation."""

    kind: Literal["grid_world"] = "grid_world"
    size: int = Field(5, ge=2)
    steps_per_episode: int = Field(25, ge=1)
    d_seed: int = Field(8, ge=1, description="Gaussian seed width")
    m_seeds: int = Field(10, ge=1)
    d_model: int = Field(80, ge=1)
    n_heads: int = Field(4, ge=1)
    d_head: int = Field(10, ge=1)
    d_mlp: int = Field(160, ge=0)
    n_layers: int = Field(2, ge=1)
    population: int = Field(300, ge=2)
    center_lr: float = Field(0.01, gt=0)
    std_lr: float = Field(0.01, gt=0)
    init_std: float = Field(0.03, gt=0)
    chunk_size: int | None = Field(None, ge=1, description="population members per vmap chunk")
    eval_seeds: int = Field(30, ge=1)


def _returns(model, params, env: GridWorld, seeds: Tensor) -> Tensor:
    """Returns ``[n_treasures, m]`` of one parameter set on every (treasure, seed) pair."""
    treasures = env.treasures(seeds.device)
    n, m = treasures.shape[0], seeds.shape[0]
    rows_t = treasures.repeat_interleave(m)  # treasure-major
    rows_s = seeds.repeat(n, 1)

    def policy(tokens):
        t = tokens.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool, device=tokens.device).tril()
        mask = causal.expand(tokens.shape[0], t, t)
        return functional_call(model, params, (tokens,), {"attn_mask": mask})

    return env.rollout(policy, rows_t, rows_s).reshape(n, m)


class PGPEStep:
    """One PGPE generation: m fresh Gaussian seeds (shared by the population: common random
    numbers), each member's loss ``max_treasure mean_seed (−return)`` (q = ∞, all treasure
    cells enumerated), then the centre (the model's parameters) and per-parameter std update.
    Returns the population's mean loss, metric ``best_loss``. The strategy is built at the
    first step (on the model's device); its std and optimizer state travel in checkpoints.
    Each generation's noise comes from a generator on the model's device seeded by one draw
    of the run's ``step`` stream (checkpointed by the engine)."""

    def __init__(self, config: GridWorldRun, env: GridWorld) -> None:
        self.config, self.env = config, env
        self.es: PGPE | None = None
        self._pending: dict | None = None

    def _strategy(self, model: nn.Module, generator: torch.Generator) -> PGPE:
        if self.es is None:  # the generator is replaced each step
            c = self.config
            self.es = PGPE(
                model,
                population=c.population,
                center_lr=c.center_lr,
                std_lr=c.std_lr,
                init_std=c.init_std,
                generator=generator,
            )
            if self._pending is not None:
                self._load(self._pending)
        self.es.generator = generator
        return self.es

    def __call__(self, model: nn.Module, batch: Any, ctx: StepContext) -> tuple[Tensor, dict]:
        dev = next(model.parameters()).device
        # this generation's noise on the model's device, from one draw of the run's step stream
        draw = int(torch.randint(2**62, (1,), generator=ctx.generator))
        g = SeedStreams(draw).generator("generation", device=dev)
        es = self._strategy(model, g)
        seeds = torch.randn(self.config.m_seeds, self.config.d_seed, generator=g, device=dev)
        objective = worst_case(lambda p: -_returns(model, p, self.env, seeds))
        losses = es.step(vectorize(objective, chunk_size=self.config.chunk_size))
        return losses.mean(), {"best_loss": losses.min()}

    def state_dict(self) -> dict:
        if self.es is None:
            return self._pending or {}
        return {"std": dict(self.es.std), "optimizer": self.es.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if self.es is None:
            self._pending = state
        else:
            self._load(state)

    def _load(self, state: dict) -> None:
        if not state:
            return
        for name, std in state["std"].items():
            self.es.std[name].copy_(std)
        self.es.optimizer.load_state_dict(state["optimizer"])


def build_grid_world(config: GridWorldRun, streams: SeedStreams) -> Parts:
    """The policy (a softmax transformer without positions under a causal ``attn_mask``, which
    takes the explicit softmax, with vmap batching rules), the PGPE step, and a probe every
    ``loop.log_every`` generations: the centre's ``eval.worst_return`` / ``eval.mean_return``
    on ``eval_seeds`` seeds from stream ``eval`` (at the end also ``eval.per_treasure_return``
    ``[treasures]``, the seed-averaged return per treasure cell)."""
    env = GridWorld(size=config.size, steps_per_episode=config.steps_per_episode)
    d_in = env.d_obs + config.d_seed
    model = _masked_transformer(config, d_in=d_in, d_out=env.n_actions, n_ctx=env.n_steps)
    eval_seeds = torch.randn(config.eval_seeds, config.d_seed, generator=streams.generator("eval"))

    def returns(m: nn.Module, ctx: Any) -> dict[str, Tensor]:
        params = {k: v.detach() for k, v in m.named_parameters()}
        with torch.no_grad():
            r = _returns(m, params, env, eval_seeds.to(next(m.parameters()).device)).cpu()
        row = {"eval.worst_return": r.mean(dim=1).min(), "eval.mean_return": r.mean()}
        if ctx.step == config.loop.steps:
            row["eval.per_treasure_return"] = r.mean(dim=1)
        return row

    schedule = EveryN(config.loop.log_every, also=[config.loop.steps])
    return Parts(model=model, data={}, step=PGPEStep(config, env), probes=[(returns, schedule)])
