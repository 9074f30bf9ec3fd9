"""The spectral density of the loss Hessian, by stochastic Lanczos quadrature (SLQ).

Glossary:
    H:        the ``[P, P]`` loss Hessian at ``params`` (never formed; Hessian-vector products
              from :mod:`dynascope.probes.sharpness`'s double backward).
    λ_1..λ_P: H's eigenvalues, unit eigenvectors u_k. The spectral density is the measure
              ``φ = (1/P) Σ_k δ_{λ_k}`` (each eigenvalue weighs 1/P).
    z:        a probe vector, Rademacher (entries ±1, uniform) scaled to unit norm:
              ``E[(u_kᵀ z)²] = 1/P`` for every k, so ``E[Σ_k (u_kᵀ z)² δ_{λ_k}] = φ``.
    m:        Lanczos steps per probe (``lanczos_steps``, clamped to P); each is one
              Hessian-vector product. Fewer when the Krylov space of z is invariant (then the
              quadrature of that probe is exact).
    nodes θ, weights τ: per probe, the Ritz values of the m×m Lanczos tridiagonal T and the
              squared first components of its unit eigenvectors; ``Σ_i τ_i δ_{θ_i}`` is the
              m-point Gauss quadrature of z's spectral measure (exact on polynomials of degree
              ≤ 2m − 1). Over ``n_probes`` probes the weights are divided by ``n_probes``, so
              all weights sum to 1.
    σ:        the Gaussian kernel's bandwidth, in eigenvalue units; the smoothed density is
              ``φ_σ(t) = Σ_i τ_i g_σ(t − θ_i)``, ``g_σ(x) = exp(−x²/2σ²)/(σ√(2π))``.

The Lanczos basis is kept in float64 and every vector is reorthogonalized against all earlier
ones (twice), so no ghost copies of converged eigenvalues appear; the Hessian-vector products
run in the parameters' dtype. Probes come from a private generator seeded by ``seed``.

References:
    Ghorbani, Krishnan & Xiao (2019), "An Investigation into Neural Net Optimization via Hessian
    Eigenvalue Density", ICML, arXiv 1901.10159 (§3 and Appendix: SLQ for network Hessians,
    Gaussian smoothing). Lin, Saad & Yang (2016), "Approximating Spectral Densities of Large
    Matrices", SIAM Review 58(1) (§3.2: the Lanczos spectroscopic method). Golub & Meurant
    (2010), "Matrices, Moments and Quadrature with Applications", Princeton (Ch. 6: Gauss
    quadrature from Lanczos). Ubaru, Chen & Saad (2017), "Fast Estimation of tr(f(A)) via
    Stochastic Lanczos Quadrature", SIAM J. Matrix Anal. Appl. 38(4).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn

from dynascope.probes._hessian_ops import LossFn, check_int, check_params, hvp_operator
from dynascope.probes._hessian_probe import BatchLoss, HessianProbe
from dynascope.probes._lanczos import gauss_quadrature, lanczos_tridiagonal
from dynascope.probes.base import ProbeContext, register_probe

__all__ = [
    "HessianDensity",
    "SpectralQuadrature",
    "hessian_density",
    "hessian_quadrature",
    "spectral_density",
]

_GRID_POINTS = 512
"""Points of the default grid of :func:`spectral_density`."""
_DEFAULT_SIGMA = 0.01
"""Default bandwidth as a fraction of the nodes' range (or of their size when all are equal)."""
_PAD = 5.0
"""The default grid extends this many bandwidths past the extreme nodes (mass lost < 3e-7)."""


class SpectralQuadrature(NamedTuple):
    """The result of :func:`hessian_quadrature`: a discrete measure approximating H's spectrum.

    Attributes:
        nodes: ``[N]`` float64 Ritz values, probe by probe (ascending within each probe), in
            H's units (loss units per parameter unit squared); ``N = steps.sum()``.
        weights: ``[N]`` float64 Gauss weights divided by the number of probes: non-negative,
            summing to 1 (each probe's to ``1/n_probes``).
        steps: ``[n_probes]`` int64, the Lanczos steps each probe took (its number of nodes).
    """

    nodes: Tensor
    weights: Tensor
    steps: Tensor


def hessian_quadrature(
    loss_fn: LossFn,
    params: dict[str, Tensor],
    *,
    n_probes: int = 10,
    lanczos_steps: int = 90,
    seed: int = 0,
) -> SpectralQuadrature:
    """Stochastic Lanczos quadrature of the Hessian's eigenvalue distribution: nodes and weights.

    For each of ``n_probes`` Rademacher vectors ``z`` (unit norm), ``m = min(lanczos_steps, P)``
    steps of Lanczos on H from ``z`` (float64 basis, full reorthogonalization) give a
    tridiagonal ``T``; its eigenvalues ``θ_i`` and the squared first components ``τ_i`` of its
    unit eigenvectors form the Gauss quadrature of ``Σ_k (u_kᵀ z)² δ_{λ_k}``, whose expectation
    is the spectral density ``(1/P) Σ_k δ_{λ_k}``. Averaging the probes' quadratures gives
    the returned measure: for any ``f``, ``Σ_i w_i f(θ_i)`` estimates ``(1/P) tr f(H)``
    (exactly in expectation for polynomials of degree ≤ 2m − 1). Cost: ``n_probes · m``
    Hessian-vector products; memory ``m · P`` float64 numbers.

    Args:
        loss_fn: ``loss_fn(params) -> scalar tensor``, twice differentiable, as
            :func:`~dynascope.probes.hessian_top_eigenvalues`.
        params: name -> tensor, one floating dtype and device; not modified, no ``.grad``.
        n_probes: random probe vectors (>= 1); Ghorbani et al. use 10.
        lanczos_steps: Lanczos steps per probe (>= 1; more than P is clamped to P, which makes
            each probe's quadrature exact); Ghorbani et al. use 90.
        seed: seeds the private generator of the probes.
    Returns:
        :class:`SpectralQuadrature` ``(nodes [N], weights [N], steps [n_probes])``, float64.
    Raises:
        ValueError: if ``params`` is empty, not floating, or mixes dtypes or devices; if
            ``n_probes`` or ``lanczos_steps`` is not an integer >= 1; if ``loss_fn`` returns
            no scalar or a non-finite loss (NaN); if a Hessian-vector product is not finite.
    References:
        Ghorbani, Krishnan & Xiao (2019), ICML, arXiv 1901.10159, §3; Lin, Saad & Yang (2016),
        SIAM Review 58(1), §3.2.
    """
    dtype, device = check_params(params)
    check_int("n_probes", n_probes, 1)
    check_int("lanczos_steps", lanczos_steps, 1)
    n_params = sum(p.numel() for p in params.values())
    generator = torch.Generator().manual_seed(seed)
    hvp, _ = hvp_operator(loss_fn, params)

    def matvec(q: Tensor) -> Tensor:
        product = hvp(q.to(dtype)).double()
        if not bool(torch.isfinite(product).all()):
            raise ValueError("a Hessian-vector product is not finite")
        return product

    # a residual below this, relative to ‖H‖'s running estimate, is rounding: the Krylov space
    # is invariant (the same scale as hessian_top_eigenvalues's)
    rel_tol = math.sqrt(n_params) * torch.finfo(dtype).eps
    nodes, weights, steps = [], [], []
    for _ in range(n_probes):
        z = torch.randint(0, 2, (n_params,), generator=generator).double().mul_(2).sub_(1)
        alpha, beta = lanczos_tridiagonal(matvec, z.to(device), lanczos_steps, rel_tol=rel_tol)
        theta, tau = gauss_quadrature(alpha, beta)
        nodes.append(theta)
        weights.append(tau / n_probes)
        steps.append(theta.numel())
    return SpectralQuadrature(
        nodes=torch.cat(nodes), weights=torch.cat(weights), steps=torch.tensor(steps)
    )


def spectral_density(
    nodes: Tensor,
    weights: Tensor,
    *,
    grid: Tensor | None = None,
    sigma: float | None = None,
) -> tuple[Tensor, Tensor]:
    """A discrete spectral measure smoothed by a Gaussian kernel: ``(grid, density)``.

    ``density(t) = Σ_i w_i g_σ(t − θ_i) / Z`` with ``g_σ`` the normal density of standard
    deviation σ, and ``Z`` its trapezoid integral over ``grid``: the density integrates to 1 on
    the grid (trapezoid rule), so mass that the kernel puts outside a user's grid is dropped
    and the rest renormalized. The default grid has 512 points from ``min θ − 5σ`` to
    ``max θ + 5σ``; the default σ is 1% of ``max θ − min θ`` (1% of ``max |θ|``, or 0.01, when
    all nodes are equal).

    Args:
        nodes: ``[N]`` eigenvalue nodes θ (e.g. :attr:`SpectralQuadrature.nodes`).
        weights: ``[N]`` non-negative weights, not all zero (they are normalized to sum 1).
        grid: ``[G]`` increasing evaluation points, G >= 2, in the nodes' units.
        sigma: bandwidth > 0, in the nodes' units.
    Returns:
        ``(grid [G], density [G])``, float64 on the CPU; density in 1 / (the nodes' unit).
    Raises:
        ValueError: if ``nodes`` and ``weights`` are not 1-D of one length >= 1, or not
            finite; if a weight is negative or all are zero; if ``grid`` is not 1-D, finite,
            strictly increasing with >= 2 points; if ``sigma`` is not finite and > 0; if the
            grid holds none of the density (every point beyond ~38σ of every node).
    References:
        Ghorbani, Krishnan & Xiao (2019), arXiv 1901.10159, §3 (Gaussian smoothing of the
        quadrature); Lin, Saad & Yang (2016), SIAM Review 58(1), §2.1.
    """
    nodes = torch.as_tensor(nodes).detach().double().cpu()
    weights = torch.as_tensor(weights).detach().double().cpu()
    if nodes.ndim != 1 or nodes.shape != weights.shape or nodes.numel() == 0:
        raise ValueError(
            f"nodes and weights must be 1-D of one length >= 1 (got {list(nodes.shape)} and "
            f"{list(weights.shape)})"
        )
    if not bool(torch.isfinite(nodes).all() and torch.isfinite(weights).all()):
        raise ValueError("nodes and weights must be finite")
    if bool((weights < 0).any()) or not bool(weights.sum() > 0):
        raise ValueError("weights must be >= 0 with a positive sum")
    if sigma is None:
        span = float(nodes.max() - nodes.min())
        sigma = _DEFAULT_SIGMA * (span or float(nodes.abs().max()) or 1.0)
    if isinstance(sigma, bool) or not isinstance(sigma, int | float) or not 0 < sigma < math.inf:
        raise ValueError(f"sigma must be a finite number > 0 (got sigma={sigma!r})")
    if grid is None:
        low, high = float(nodes.min()) - _PAD * sigma, float(nodes.max()) + _PAD * sigma
        grid = torch.linspace(low, high, _GRID_POINTS, dtype=torch.float64)
    grid = torch.as_tensor(grid).detach().double().cpu()
    if grid.ndim != 1 or grid.numel() < 2 or not bool(torch.isfinite(grid).all()):
        raise ValueError(f"grid must be 1-D and finite with >= 2 points (got {list(grid.shape)})")
    if not bool((grid.diff() > 0).all()):
        raise ValueError("grid must be strictly increasing")
    z = (grid[:, None] - nodes[None, :]) / sigma  # [G, N]
    kernel = torch.exp(-0.5 * z**2) / (sigma * math.sqrt(2 * math.pi))
    density = kernel @ (weights / weights.sum())
    mass = torch.trapezoid(density, grid)
    if not bool(mass > 0):
        raise ValueError(
            f"the grid [{float(grid[0]):g}, {float(grid[-1]):g}] holds none of the density"
        )
    return grid, density / mass


def hessian_density(
    loss_fn: LossFn,
    params: dict[str, Tensor],
    *,
    n_probes: int = 10,
    lanczos_steps: int = 90,
    seed: int = 0,
    grid: Tensor | None = None,
    sigma: float | None = None,
) -> tuple[Tensor, Tensor]:
    """The Hessian's smoothed eigenvalue density by stochastic Lanczos quadrature.

    :func:`hessian_quadrature` then :func:`spectral_density`: ``(grid, density)`` with the
    density integrating to 1 on the grid (trapezoid rule). Call the two yourself to keep the
    raw nodes and weights (``SpectralQuadrature``) or to smooth one quadrature several ways.

    Args:
        loss_fn, params, n_probes, lanczos_steps, seed: as :func:`hessian_quadrature`.
        grid, sigma: as :func:`spectral_density` (defaults: 512 points, σ = 1% of the range).
    Returns:
        ``(grid [G], density [G])``, float64 on the CPU, density in 1 / (H's unit).
    Raises:
        ValueError: as :func:`hessian_quadrature` (a NaN loss included) and
            :func:`spectral_density`.
    References:
        Ghorbani, Krishnan & Xiao (2019), "An Investigation into Neural Net Optimization via
        Hessian Eigenvalue Density", ICML, arXiv 1901.10159, §3.
    """
    quadrature = hessian_quadrature(
        loss_fn, params, n_probes=n_probes, lanczos_steps=lanczos_steps, seed=seed
    )
    return spectral_density(quadrature.nodes, quadrature.weights, grid=grid, sigma=sigma)


@register_probe("hessian_density")
class HessianDensity(HessianProbe):
    """The loss Hessian's eigenvalue density on a held batch, by stochastic Lanczos quadrature.

    Reads the Hessian like :class:`~dynascope.probes.Sharpness` (same held batch, loss,
    ``include``, eval mode; the batch is kept in :meth:`state_dict`) and runs
    :func:`hessian_quadrature` (``n_probes · lanczos_steps`` Hessian-vector products).

    Keys: ``hessian_density.negative_mass`` (the weight on nodes below ``−zero_tol · max|θ|``:
    the estimated fraction of eigenvalues that are clearly negative) and
    ``hessian_density.zero_mass`` (the weight on nodes within ``zero_tol · max|θ|`` of 0: the
    near-null bulk, whose signs SLQ cannot resolve, since one node there stands for a whole
    cluster of eigenvalues; on an MLP at initialization its nodes sat at −1e-4 of the top
    eigenvalue with 73% of the weight),
    ``hessian_density.top_node`` and ``hessian_density.bottom_node`` (the extreme Ritz values:
    close to λ_max and λ_min, which Lanczos finds first), and as CPU tensors
    ``hessian_density.nodes`` and ``hessian_density.weights`` (``[N]``, the raw quadrature),
    ``hessian_density.grid`` and ``hessian_density.density`` (``[512]``, the density smoothed
    with ``sigma``, integrating to 1 on the grid; :func:`spectral_density`).

    Args:
        loss: ``loss(output, batch) -> scalar``, or ``None`` (as :class:`Sharpness`).
        batch: a held batch instead of the first ``ctx.batch``.
        n_probes: Rademacher probes per reading (>= 1). One is cheap and, for large P, already
            close to the mean (each eigenvalue's weight ``(u_kᵀ z)²`` has relative standard
            deviation at most √2, and P of them average out); Ghorbani et al. use 10 probes of
            90 steps.
        lanczos_steps: Lanczos steps per probe (>= 1): the density's resolution.
        sigma: the smoothing bandwidth in eigenvalue units; ``None``: 1% of the nodes' range.
        zero_tol: nodes within ``zero_tol · max|θ|`` of 0 count as zero (in [0, 1)).
        include: parameter-name prefixes; ``None`` takes all.
        input_key: the batch entry passed as ``model(batch[input_key])``.
        seed: seeds the probes (the same at every reading).
    Raises:
        ValueError: (construction) if ``n_probes``, ``lanczos_steps`` or ``sigma`` is out of
            range, or ``zero_tol`` outside [0, 1). (call) as :class:`Sharpness` (no batch,
            ``include`` selecting nothing) and :func:`hessian_quadrature` (a NaN loss).
    References:
        Ghorbani, Krishnan & Xiao (2019), arXiv 1901.10159.
    """

    def __init__(
        self,
        *,
        loss: BatchLoss | None = None,
        batch: dict[str, Tensor] | None = None,
        n_probes: int = 1,
        lanczos_steps: int = 20,
        sigma: float | None = None,
        zero_tol: float = 1e-3,
        include: Sequence[str] | None = None,
        input_key: str = "x",
        seed: int = 0,
    ) -> None:
        check_int("n_probes", n_probes, 1)
        check_int("lanczos_steps", lanczos_steps, 1)
        if sigma is not None and not (
            isinstance(sigma, int | float) and not isinstance(sigma, bool) and 0 < sigma < math.inf
        ):
            raise ValueError(f"sigma must be a finite number > 0 or None (got sigma={sigma!r})")
        if not (isinstance(zero_tol, int | float) and 0 <= zero_tol < 1):
            raise ValueError(f"zero_tol must be in [0, 1) (got zero_tol={zero_tol!r})")
        super().__init__(loss=loss, batch=batch, include=include, input_key=input_key, seed=seed)
        self.n_probes, self.lanczos_steps, self.sigma = n_probes, lanczos_steps, sigma
        self.zero_tol = float(zero_tol)

    def measure(self, model: nn.Module, ctx: ProbeContext) -> dict[str, Tensor | float]:
        loss_fn, params = self.loss_closure(model, ctx)
        quadrature = hessian_quadrature(
            loss_fn,
            params,
            n_probes=self.n_probes,
            lanczos_steps=self.lanczos_steps,
            seed=self.seed,
        )
        nodes, weights = quadrature.nodes, quadrature.weights
        grid, density = spectral_density(nodes, weights, sigma=self.sigma)
        floor = self.zero_tol * float(nodes.abs().max())
        return {
            "hessian_density.negative_mass": float(weights[nodes < -floor].sum()),
            "hessian_density.zero_mass": float(weights[nodes.abs() <= floor].sum()),
            "hessian_density.top_node": float(nodes.max()),
            "hessian_density.bottom_node": float(nodes.min()),
            "hessian_density.nodes": nodes,
            "hessian_density.weights": weights,
            "hessian_density.grid": grid,
            "hessian_density.density": density,
        }
