"""Linear interpolation between two networks: loss, accuracy and the barrier along the path.

Glossary:
    alpha:    interpolation coefficient; ``theta(alpha) = alpha * theta_a + (1 - alpha) *
              theta_b`` (``alpha = 1`` is net a, ``alpha = 0`` net b; S7's convention).
    n_alpha:  points on the path (S7: 11, ``alpha in {0, 0.1, .., 1}``).
    loss:     mean cross-entropy (NLL) in nats per example.
    beta:     inverse temperature; the tempered NLL is ``NLL(beta * logits)`` with ``beta``
              chosen on a grid (S7: one scalar per evaluation, ``10^[-1, 2]``, 100 points, as
              the reference code's ``test_stats``).
    barrier:  ``max_alpha [l(theta(alpha)) - (alpha l(theta_a) + (1 - alpha) l(theta_b))]``;
              0 for a linearly connected pair, never negative (the end points give 0).

References:
    Frankle, Dziugaite, Roy, Carbin (2020), "Linear mode connectivity and the lottery ticket
    hypothesis", ICML, arXiv 1912.05671, Sec. 2 (instability = barrier).
    Benzing et al. (2022), arXiv 2209.07509, Sec. 2 (barrier definition, temperature-tuned NLL).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._permutation_chain import combine_params, layer_params, load_params
from .base import isolated

DEFAULT_ALPHAS = tuple(i / 10 for i in range(11))


def loss_barrier(alphas: Tensor, losses: Tensor) -> Tensor:
    """Barrier ``max_i [losses_i - (alphas_i * l(1) + (1 - alphas_i) * l(0))]``.

    Args:
        alphas: ``[n_alpha]``, must contain 0 and 1 (the end points).
        losses: ``[..., n_alpha]`` any loss (NLL in nats, or error = 1 - accuracy).
    Returns:
        ``[...]`` barrier in the loss's units; NaN if a value on the path is NaN.
    Raises:
        ValueError: if ``alphas`` is not 1-D, lacks 0 or 1, or does not match ``losses``.
    """
    alphas = torch.as_tensor(alphas, dtype=torch.float64)
    if alphas.ndim != 1 or losses.shape[-1:] != alphas.shape:
        raise ValueError(
            f"alphas must be [n_alpha] matching losses' last dim (got alphas "
            f"{tuple(alphas.shape)}, losses {tuple(losses.shape)})"
        )
    ends = [(alphas == v).nonzero().flatten() for v in (0.0, 1.0)]
    if any(e.numel() == 0 for e in ends):
        raise ValueError(f"alphas must contain 0 and 1 (got {alphas.tolist()})")
    values = losses.to(torch.float64)
    at_b, at_a = values[..., ends[0][0]], values[..., ends[1][0]]
    chord = alphas * at_a[..., None] + (1 - alphas) * at_b[..., None]  # [..., n_alpha]
    gap = values - chord
    return torch.where(gap.isnan().any(-1), torch.nan, gap.amax(-1))


def tune_temperature(logits: Tensor, y: Tensor, grid: Tensor | None = None) -> Tensor:
    """Inverse temperature ``beta`` on ``grid`` minimising ``NLL(beta * logits, y)``.

    Args:
        logits: ``[batch, d_out]``.
        y: ``[batch]`` labels.
        grid: candidate ``beta`` values ``[n]`` (default ``10^linspace(-1, 2, 100)``).
    Returns:
        Scalar ``beta`` (float64). Ties go to the smallest grid value.
    Raises:
        ValueError: if ``logits`` is not ``[batch, d_out]`` matching ``y``.
    """
    if logits.ndim != 2 or y.shape != logits.shape[:1]:
        raise ValueError(
            f"logits must be [batch, d_out] and y [batch] (got {tuple(logits.shape)}, "
            f"{tuple(y.shape)})"
        )
    if grid is None:
        grid = 10.0 ** torch.linspace(-1.0, 2.0, 100, dtype=torch.float64)
    grid = grid.to(device=logits.device, dtype=torch.float64)
    logits = logits.to(torch.float64)
    scaled = grid[:, None, None] * logits  # [n, batch, d_out]
    target = logits.gather(-1, y[:, None]).squeeze(-1)  # [batch]
    nll = (torch.logsumexp(scaled, -1) - grid[:, None] * target).mean(-1)  # [n]
    return grid[torch.argmin(nll)]


@dataclass(frozen=True)
class InterpolationPath:
    """Measurements along ``theta(alpha)``; every field ``[n_alpha]`` (float64, CPU).

    Attributes:
        alphas: the coefficients.
        loss: NLL (nats) on the evaluation set.
        accuracy: fraction correct.
        loss_tempered: NLL after scaling the logits by a tuned ``beta`` (one per point).
    """

    alphas: Tensor
    loss: Tensor
    accuracy: Tensor
    loss_tempered: Tensor

    @property
    def barrier(self) -> Tensor:
        """NLL barrier (nats), :func:`loss_barrier`."""
        return loss_barrier(self.alphas, self.loss)

    @property
    def tempered_barrier(self) -> Tensor:
        """Barrier of the temperature-tuned NLL (nats)."""
        return loss_barrier(self.alphas, self.loss_tempered)

    @property
    def error_barrier(self) -> Tensor:
        """Barrier of the error ``1 - accuracy`` (fraction)."""
        return loss_barrier(self.alphas, 1.0 - self.accuracy)


def _logits(model: nn.Module, x: Tensor, batch_size: int | None) -> Tensor:
    if batch_size is None:
        return model(x)
    return torch.cat([model(chunk) for chunk in x.split(batch_size)])


def evaluate(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    *,
    tune: tuple[Tensor, Tensor] | None = None,
    batch_size: int | None = None,
) -> dict[str, Tensor]:
    """Loss, accuracy and tempered loss of ``model`` on ``(x, y)``, without gradients.

    The model runs in eval mode (dropout off, batch-norm running statistics), so the numbers
    are those of the deterministic network; every submodule's mode and the RNG state are
    restored afterwards (:func:`dynascope.probes.base.isolated`).

    Args:
        model: a classifier returning logits ``[batch, d_out]``.
        x: inputs ``[batch, ...]``; y: labels ``[batch]``.
        tune: ``(x_tune, y_tune)`` on which ``beta`` is chosen (default: ``(x, y)`` itself,
            the reference code's choice).
        batch_size: evaluate in chunks of this size (``None``: one pass).
    Returns:
        ``{"loss", "accuracy", "loss_tempered", "beta"}``, float64 scalars on CPU.
    """
    with isolated(model):
        model.eval()
        logits = _logits(model, x, batch_size).to(torch.float64)
        tune_logits, tune_y = (
            (logits, y)
            if tune is None
            else (
                _logits(model, tune[0], batch_size).to(torch.float64),
                tune[1],
            )
        )
        beta = tune_temperature(tune_logits, tune_y)
        return {
            "loss": F.cross_entropy(logits, y).cpu(),
            "accuracy": (logits.argmax(-1) == y).double().mean().cpu(),
            "loss_tempered": F.cross_entropy(beta * logits, y).cpu(),
            "beta": beta.cpu(),
        }


def interpolate(
    model_a: nn.Module,
    model_b: nn.Module,
    x: Tensor,
    y: Tensor,
    alphas: Sequence[float] = DEFAULT_ALPHAS,
    *,
    tune: tuple[Tensor, Tensor] | None = None,
    batch_size: int | None = None,
) -> InterpolationPath:
    """Evaluate ``theta(alpha) = alpha * theta_a + (1 - alpha) * theta_b`` for each alpha.

    Align the nets first (``apply_permutation(model_b, activation_matching(...))``) to measure
    the barrier after matching. Neither model is modified (nor its mode); every point is
    evaluated in eval mode (:func:`evaluate`).

    Args:
        model_a, model_b: chains of the same architecture (:func:`permutable_layers`).
        x, y: evaluation inputs ``[batch, ...]`` and labels ``[batch]``.
        alphas: coefficients; must contain 0 and 1 for the barriers.
        tune: set on which each point's inverse temperature is tuned (default ``(x, y)``).
        batch_size: evaluation chunk size (``None``: one pass).
    Returns:
        :class:`InterpolationPath`.
    Raises:
        ValueError: if the architectures differ (:func:`combine_params`) or a model is not a
            chain.
    References:
        Benzing et al. (2022), arXiv 2209.07509, Sec. 2; Frankle et al. (2020), arXiv 1912.05671.
    """
    params_a, params_b = layer_params(model_a), layer_params(model_b)
    rows = []
    for alpha in alphas:
        net = load_params(model_a, combine_params([params_a, params_b], [alpha, 1.0 - alpha]))
        rows.append(evaluate(net, x, y, tune=tune, batch_size=batch_size))
    stack = {key: torch.stack([r[key] for r in rows]) for key in ("loss", "accuracy")}
    return InterpolationPath(
        alphas=torch.tensor(list(alphas), dtype=torch.float64),
        loss=stack["loss"],
        accuracy=stack["accuracy"],
        loss_tempered=torch.stack([r["loss_tempered"] for r in rows]),
    )
