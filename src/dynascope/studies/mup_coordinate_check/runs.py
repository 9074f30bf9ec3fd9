"""mup-coordinate-check runs on the engine: one MLP of one width and seed per run; a width's
seeds train as one ensemble. Coordinate-check runs make ``nsteps - 1`` updates on one fixed
batch and probe every step (:class:`~dynascope.probes.coordcheck.CoordProbe`); learning-rate
transfer runs (``paper``) train on minibatches and evaluate the training split at the end.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor

from dynascope.monitor import EveryN
from dynascope.nn.mlp import MLP
from dynascope.nn.parametrization import parameter_groups
from dynascope.probes.coordcheck import CoordProbe
from dynascope.tasks import Digits
from dynascope.train import EngineRunConfig, Parts, SeedStreams

__all__ = ["CoordRun", "build_coord", "build_lr_transfer", "digits", "forward"]

OptimizerName = Literal["adam", "adamw", "sgd", "signsgd"]


class CoordRun(EngineRunConfig):
    """One MLP of one width and seed (``loop.steps`` updates)."""

    kind: Literal["coord", "lr_transfer"] = "coord"
    parametrization: Literal["standard", "ntk", "mup"]
    optimizer: OptimizerName = "adam"
    width: int = Field(ge=1, description="hidden width")
    base_width: int = Field(64, ge=1, description="muP/NTK base width w0 (m = width / w0)")
    depth: int = Field(2, ge=1, description="hidden layers")
    batch_size: int = Field(128, ge=1)
    lr: float = Field(1e-2, gt=0, description="learning rate at the base width")
    eps_scaling: Literal["none", "width"] = "none"
    readout_init: Literal["zero", "default"] = "zero"


def digits() -> tuple[Tensor, Tensor]:
    """Training split of digits as ``[n, 64]`` standardised floats and ``[n]`` labels."""
    task = Digits(patch_size=8)
    whole = task.batch("train", task.split_size("train"), torch.Generator())  # in split order
    x, y = whole["x"].reshape(-1, 64).float(), whole["y"]
    mean, std = x.mean(0), x.std(0)
    return torch.where(std > 0, (x - mean) / std.clamp_min(1e-12), torch.zeros_like(x)), y


def _model(config: CoordRun, width: int) -> MLP:
    return MLP(
        64,
        width,
        10,
        depth=config.depth,
        parametrization=config.parametrization,
        base_width=config.base_width,
        readout_init=config.readout_init,
    )


def forward(model: MLP, x: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """Output and named activations W1, relu1, ..., logits of an :class:`MLP`."""
    z = model.preactivations(x)
    acts: dict[str, Tensor] = {}
    for i, zi in enumerate(z[:-1]):
        acts[f"W{i + 1}"] = zi
        acts[f"relu{i + 1}"] = F.relu(zi)
    acts["logits"] = z[-1]
    return z[-1], acts


class SignSGD(torch.optim.Optimizer):
    """``θ ← θ − lr · sign(∂L/∂θ)`` per parameter group (Adam's first step, ε → 0)."""

    def __init__(self, params, lr: float) -> None:  # noqa: ANN001 - torch's signature
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN001, ANN201 - torch's signature
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad.sign(), alpha=-group["lr"])


def _optimizer(config: CoordRun, model: MLP) -> torch.optim.Optimizer:
    state = torch.random.get_rng_state()  # the base model only supplies shapes: leave the RNG
    base = _model(config, config.base_width).to(next(model.parameters()))
    torch.random.set_rng_state(state)
    kind = "sgd" if config.optimizer == "sgd" else "adam"
    groups = parameter_groups(
        model, base, lr=config.lr, parametrization=config.parametrization, optimizer=kind
    )
    if config.optimizer == "sgd":
        return torch.optim.SGD(groups)
    if config.optimizer == "signsgd":
        return SignSGD(groups, lr=config.lr)
    for group in groups:
        group["eps"] = 1e-8
        if config.eps_scaling == "width" and group["role"] == "hidden":
            group["eps"] = 1e-8 / group["width_mult"]
    return (torch.optim.AdamW if config.optimizer == "adamw" else torch.optim.Adam)(groups)


def _cross_entropy(model: MLP, batch: dict[str, Tensor]) -> Tensor:
    return F.cross_entropy(model(batch["x"]), batch["y"])


def build_coord(config: CoordRun, streams: SeedStreams) -> Parts:
    """A coordinate-check member: one fixed batch (stream ``batch``), probed every step."""
    x, y = digits()
    index = torch.randperm(len(y), generator=streams.generator("batch"))[: config.batch_size]
    batch = {"x": x[index], "y": y[index]}
    return Parts(
        model=_model(config, config.width),
        data=batch,
        loss=_cross_entropy,
        optimizer=lambda m: _optimizer(config, m),
        probes=[(CoordProbe(forward), EveryN(1))],
        probe_batch={"x": batch["x"]},
    )


def build_lr_transfer(config: CoordRun, streams: SeedStreams) -> Parts:
    """A learning-rate transfer member: minibatches of the training split; at the end, the mean
    cross-entropy over the whole training split (``eval.train_loss``, nats)."""
    del streams
    x, y = digits()

    def data(generator: torch.Generator) -> dict[str, Tensor]:
        index = torch.randint(len(y), (config.batch_size,), generator=generator)
        return {"x": x[index], "y": y[index]}

    def evaluate(model: MLP) -> dict[str, float]:
        return {"eval.train_loss": float(F.cross_entropy(model(x.to(next(model.parameters()))), y))}

    return Parts(
        model=_model(config, config.width),
        data=data,
        loss=_cross_entropy,
        optimizer=lambda m: _optimizer(config, m),
        evaluate=evaluate,
    )
