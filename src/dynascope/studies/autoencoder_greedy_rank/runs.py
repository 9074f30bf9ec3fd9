"""Runs of ``autoencoder-greedy-rank``: the run config and ``build`` for the engine, and the
probes that log S15's instruments (docs/studies/autoencoder-greedy-rank.md)."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from dynascope.monitor import LogSchedule
from dynascope.nn.autoencoder import LinearAutoencoder, depth_lr
from dynascope.probes.latent import latent_covariance_spectrum
from dynascope.probes.spectral import effective_rank, rank_at, stable_rank
from dynascope.tasks.low_rank import LowRankGaussian
from dynascope.train import EngineRunConfig, Parts, SeedStreams

from .theory import equal_time_lr

__all__ = [
    "MODE_CUTOFF",
    "RANK_TOL",
    "AutoencoderRun",
    "build_autoencoder",
    "reconstruction_loss",
    "step_size",
]

MODE_CUTOFF = 0.5  # sigma_i > 0.5: a learned mode (S15's proposal, kept)
RANK_TOL = 1e-2  # latent rank_{1e-2} (S15)


class AutoencoderRun(EngineRunConfig):
    """One linear-autoencoder run (S15): data, model and step; ``loop`` sets steps and dtype."""

    d_in: int = Field(32, ge=1)
    d_latent: int = Field(16, ge=1)
    variances: list[float] = Field(default_factory=lambda: [5.0, 4.0, 3.0, 2.0, 1.0])
    noise_std: float = Field(
        0.4, ge=0, description="isotropic noise std (0.4: a noise floor above rank_1e-2's cut)"
    )
    n_train: int = Field(2000, ge=2)
    n_heldout: int = Field(500, ge=2, description="codes for the latent covariance")
    n_stack: int = Field(0, ge=0, description="L, linear layers in the bottleneck")
    init: Literal["orthogonal", "default"] = "orthogonal"
    init_scale: float = Field(0.5, gt=0, description="s, singular value of each orthogonal layer")
    arm: Literal["greedy", "depth", "control", "quiet", "flat"] = Field(
        "greedy",
        description="the claims' arm: s from theory, one s for every depth, s = 1, r3's "
        "low-noise data or o's equal-variance data (the last two at the greedy s)",
    )
    optimizer: Literal["gd", "adam"] = "gd"
    lr: float = Field(0.05, gt=0, description="base step eta_0 (the step at L = 0)")
    lr_rule: Literal["equal_time", "depth", "constant"] = "equal_time"
    lr_scale: float | None = Field(
        None, gt=0, description="s the step rule assumes (None: init_scale); controls share it"
    )
    mode_time: float = Field(
        500.0, gt=0, description="equal_time: a unit-variance mode's rise time (theory steps)"
    )
    mode_points: int = Field(400, ge=1, description="log-spaced mode (gain, sigma) probes")
    log_points: int = Field(100, ge=1, description="log-spaced latent-spectrum measurements")


def step_size(config: AutoencoderRun) -> float:
    """The step used, capped at ``2 eta_0 / (L + 2)`` (half the stability edge at the learnt state).

    ``constant``: ``eta_0``. ``depth``: ``eta_0 / (L s^(2(L-1)))`` (S15's proposal).
    ``equal_time``: :func:`~.theory.equal_time_lr` with ``mode_time``: the step that makes a
    unit-variance mode rise at the same time at every depth and spectral prior. ``L = 0`` (no
    stack) always takes ``eta_0``. The rule reads ``lr_scale`` (default ``init_scale``), so a
    control at another ``s`` can share the judged arm's step.
    """
    if config.lr_rule == "constant" or config.n_stack == 0:
        return config.lr
    cap = 2.0 * config.lr / (config.n_stack + 2)
    s = config.init_scale if config.lr_scale is None else config.lr_scale
    if config.lr_rule == "depth":
        return depth_lr(config.lr, config.n_stack, s, lr_max=cap)
    return equal_time_lr(config.n_stack, s, config.mode_time, lr_max=cap)


def reconstruction_loss(P: torch.Tensor, second_moment: torch.Tensor) -> torch.Tensor:
    """Mean over samples of ``||x - x @ P||^2``, as ``tr((I - P)^T C (I - P))``.

    With ``C = X^T X / N`` this equals ``((X - X @ P) ** 2).sum(-1).mean()`` exactly: the loss
    and its gradient depend on the data only through ``C``, so a full-batch step costs a few
    ``d_in x d_in`` products whatever N is.

    Args:
        P: ``[d_in, d_in]`` end-to-end map (``x_hat = x @ P``).
        second_moment: ``C`` ``[d_in, d_in]``, symmetric PSD.
    Returns:
        Scalar loss (squared data units per sample).
    """
    R = torch.eye(P.shape[-1], dtype=P.dtype, device=P.device) - P
    return (R * (second_moment @ R)).sum()


def _loss(model: LinearAutoencoder, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return reconstruction_loss(model.end_to_end(), batch["second_moment"])


def build_autoencoder(config: AutoencoderRun, streams: SeedStreams) -> Parts:
    """The S15 run: data from stream ``task``, weights from stream ``model``, full-batch GD.

    Probes: on ``mode_points`` log-spaced steps (every step early on) the data-subspace map
    ``M_A = A^T P A`` ``[r, r]``
    (``modes.gain`` = its diagonal, ``modes.sigma`` = its singular values, ``modes.align`` =
    |right singular vectors| in PC coordinates) and ``sigma`` = the singular values of the whole
    ``P``; on ``log_points`` log-spaced steps the held-out latent covariance spectrum
    (``latent.*``), the held-out loss, the stable rank of the stack product's change since init
    and, for reference, the held-out data's own ``data.rank_1e-2``.
    """
    dtype = getattr(torch, config.loop.dtype)
    task = LowRankGaussian(d_in=config.d_in, variances=config.variances, noise_std=config.noise_std)
    g = streams.generator("task")
    A = task.mixing_matrix(g, dtype)  # [d_in, r], orthonormal columns
    x, x_heldout = task.sample(A, config.n_train, g), task.sample(A, config.n_heldout, g)
    model = LinearAutoencoder(
        d_in=config.d_in, d_latent=config.d_latent, n_stack=config.n_stack, init=config.init,
        init_scale=config.init_scale, generator=streams.generator("model"), dtype=dtype,
    )  # fmt: skip
    stack0 = model.stack_product().detach().clone()
    data_rank = rank_at(latent_covariance_spectrum(x_heldout), RANK_TOL)
    lr, opt = step_size(config), torch.optim.SGD if config.optimizer == "gd" else torch.optim.Adam

    @torch.no_grad()
    def modes(model: LinearAutoencoder, ctx: object) -> dict:
        P = model.end_to_end()
        M_A = A.mT.to(P) @ P @ A.to(P)  # [r, r]: how each data PC maps onto each data PC
        _, S_A, Vh = torch.linalg.svd(M_A)
        return {
            "modes.gain": torch.diagonal(M_A).float(),
            "modes.sigma": S_A.float(),
            "modes.align": Vh.abs().float(),  # row k: the k-th learned direction's PC weights
            "sigma": torch.linalg.svdvals(P)[: config.d_latent].float(),
        }

    @torch.no_grad()
    def latent(model: LinearAutoencoder, ctx: object) -> dict:
        xh = x_heldout.to(model.W_enc)
        z = model.encode(xh)  # [n_heldout, d_latent]
        spectrum = latent_covariance_spectrum(z)
        delta = torch.linalg.svdvals(model.stack_product() - stack0.to(z))
        return {
            "latent.spectrum": spectrum.float(),
            "latent.rank_1e-2": rank_at(spectrum, RANK_TOL),
            "latent.effective_rank": effective_rank(spectrum),
            "stack.delta_stable_rank": stable_rank(delta),
            "heldout.loss": (model.decode(z) - xh).square().sum(-1).mean(),
            "data.rank_1e-2": data_rank,
        }

    return Parts(
        model=model,
        data={"second_moment": x.mT @ x / config.n_train},
        loss=_loss,
        optimizer=lambda m: opt(m.parameters(), lr=lr),
        probes=[
            (modes, LogSchedule(config.loop.steps, config.mode_points)),
            (latent, LogSchedule(config.loop.steps, config.log_points)),
        ],
    )
