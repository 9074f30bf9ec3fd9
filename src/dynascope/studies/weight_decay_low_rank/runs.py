r"""weight-decay-low-rank runs on the engine.

- (a) the 5×5 toy: :class:`ToyRun`, :func:`build_toy`. Every λ of the grid is one slice of a
  batched pair of factors ``A, B: [n_lambda, 5, 5]`` trained by full-batch GD in float64 (a
  custom step, :class:`ToyGDStep`); one run per seed (its initial A, B).
- (b), (c) the recall and LM transformers: registry :class:`~dynascope.config.RunConfig`\ s
  trained by :func:`dynascope.train.build_registry`; the seeds of one condition train as one
  ensemble.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from dynascope.monitor import EveryN
from dynascope.probes.spectral import balancedness, factor_singular_values, l2_nuclear_gap, l2_term
from dynascope.tasks import MatrixFactorization
from dynascope.train import EngineRunConfig, Parts, SeedStreams, StepContext

__all__ = ["ToyGDStep", "ToyRun", "build_toy"]


class ToyRun(EngineRunConfig):
    """Part (a): the 5×5 factorization toy, one initial A, B (the seed), every λ batched.

    ``loop.steps`` GD steps of size ``lr`` (``loop.dtype`` should be ``float64``).
    """

    kind: str = Field("factor_toy", pattern="^factor_toy$")
    lr: float = Field(0.05, gt=0, description="GD step η")
    lambdas: list[float] = Field(default_factory=lambda: [0.0, 0.1, 0.2, 0.4, 0.8])
    fine_lambdas: int = Field(41, ge=0, description="extra λ grid in [0, 1] for the σ–λ figure")
    init_std: float = Field(0.3, gt=0)
    data_scale: float = Field(1.0, gt=0, description="data term data_scale·‖ABᵀ − D‖²")
    penalty: Literal["factors", "product"] = Field(
        "factors", description="λ on the factors (the claim) or on the product (the ablation)"
    )


class FactorPairs(nn.Module):
    """Factors ``A, B: [n_lambda, 5, 5]`` (one pair per λ), the product ``A Bᵀ``."""

    def __init__(self, A: Tensor, B: Tensor) -> None:
        super().__init__()
        self.A = nn.Parameter(A)
        self.B = nn.Parameter(B)


class ToyGDStep:
    """One full-batch GD step on every λ's pair at once (``MatrixFactorization.gradient_step``);
    returns the mean over the main λ grid of the penalised loss."""

    def __init__(self, task: MatrixFactorization, lambdas: Tensor, lr: float, n_main: int):
        self.task, self.lambdas, self.lr, self.n_main = task, lambdas, lr, n_main

    def __call__(self, model: FactorPairs, batch, ctx: StepContext) -> Tensor:
        lambdas = self.lambdas.to(model.A)
        with torch.no_grad():
            A, B = self.task.gradient_step(model.A, model.B, lambdas, self.lr * ctx.lr_factor)
            model.A.copy_(A)
            model.B.copy_(B)
            n = self.n_main
            return self.task.loss(model.A[:n], model.B[:n], lambdas[:n]).mean()


def build_toy(config: ToyRun, streams: SeedStreams) -> Parts:
    """The toy's factors (stream ``factors``: A, B ~ N(0, init_std²) independently, the same
    for every λ), its GD step, and probes: every step the main grid's ``balancedness``,
    ``l2_term``, ``gap``, ``loss`` ``[n_lambda]`` and ``sigma`` ``[n_lambda, 5]``; ``lambdas``
    at step 0; ``fine.lambdas``, ``fine.sigma`` at step 0 and the last step."""
    task = MatrixFactorization(data_scale=config.data_scale, penalty=config.penalty)
    lambdas = torch.tensor(config.lambdas, dtype=torch.float64)
    fine = torch.linspace(0.0, 1.0, config.fine_lambdas, dtype=torch.float64)
    every = torch.cat([lambdas, fine])
    A0, B0 = task.init_factors(1, streams.generator("factors"), std=config.init_std)
    model = FactorPairs(
        A0.expand(len(every), -1, -1).clone(), B0.expand(len(every), -1, -1).clone()
    )
    n = len(lambdas)

    def main_grid(m: FactorPairs, ctx) -> dict[str, Tensor]:
        A, B = m.A.detach()[:n], m.B.detach()[:n]
        row = {"balancedness": balancedness(A, B), "l2_term": l2_term(A, B),
               "gap": l2_nuclear_gap(A, B), "loss": task.loss(A, B, lambdas.to(A)),
               "sigma": factor_singular_values(A, B)}  # fmt: skip
        return row | ({"lambdas": lambdas} if ctx.step == 0 else {})

    def fine_grid(m: FactorPairs, ctx) -> dict[str, Tensor]:
        return {"fine.lambdas": fine, "fine.sigma": factor_singular_values(m.A[n:], m.B[n:])}

    probes = [(main_grid, EveryN(1))]
    if config.fine_lambdas:
        probes.append((fine_grid, EveryN(config.loop.steps)))
    return Parts(model=model, data={}, step=ToyGDStep(task, every, config.lr, n), probes=probes)
