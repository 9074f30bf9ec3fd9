"""Sharpness: the top eigenvalues and the trace of the loss Hessian, from Hessian-vector products.

Glossary:
    loss_fn:   ``loss_fn(params) -> scalar``, a function of a dict of parameter tensors (name ->
               tensor); :class:`Sharpness` builds one from a model, a batch and a loss.
    P:         number of parameters (the sum of ``params[name].numel()``); vectors below are
               flat ``[P]``, the tensors of ``params`` concatenated in the dict's order.
    H:         the ``[P, P]`` Hessian of ``loss_fn`` at ``params`` (never formed).
    Hv:        a Hessian-vector product, one double backward through the loss (reverse over
               reverse): the gradient graph is built once per call and reused for every ``Hv``.
    λ_1 ≥ λ_2 ≥ …: eigenvalues of H in **algebraic** order (largest first). Negative
               eigenvalues are never reported ahead of smaller positive ones: λ_max is the
               largest algebraic eigenvalue, the sharpness of the edge-of-stability literature
               (Cohen et al. 2021), which gradient descent with step size η keeps near ``2/η``.
    m:         basis vectors (one ``Hv`` each), at most ``iters`` and at most P.

Top eigenvalues come from block Lanczos with full reorthogonalization (every new vector is
orthogonalized twice against all earlier ones, so no ghost copies appear): the Ritz values of
``Qᵀ H Q`` over the Krylov basis ``Q`` approximate the extreme eigenvalues, and each Ritz pair's
residual ``‖H y − θ y‖`` is computed from the stored products ``H Q``. The trace comes from
Hutchinson's estimator with Rademacher probes, ``E[zᵀ H z] = tr H``. Both draw their random
vectors from a private ``torch.Generator`` seeded by ``seed``: a seeded call is bitwise
repeatable (on CPU, and on an accelerator whose backward is deterministic) and never touches
the global RNG.

Attention: ``F.scaled_dot_product_attention``'s fused CPU kernel has no double backward, so the
loss is evaluated with the math SDPA backend (``torch.nn.attention.sdpa_kernel``), which computes
the same function with ordinary ops. Hugging Face models with ``attn_implementation="sdpa"`` and
dynascope's attention both work this way.

References:
    Lanczos (1950), "An iteration method for the solution of the eigenvalue problem of linear
    differential and integral operators", J. Res. Natl. Bur. Stand. 45(4). Golub & Van Loan,
    "Matrix Computations" (4th ed.), §10.1 (Lanczos, full reorthogonalization) and §10.3
    (block Lanczos). Parlett, "The Symmetric Eigenvalue Problem" (1998), §13.
    Pearlmutter (1994), "Fast exact multiplication by the Hessian", Neural Computation 6(1).
    Hutchinson (1990), "A stochastic estimator of the trace of the influence matrix for
    Laplacian smoothing splines", Commun. Stat. Simul. Comput. 19(2).
    Cohen, Kaur, Li, Kolter & Talwalkar (2021), "Gradient Descent on Neural Networks Typically
    Occurs at the Edge of Stability", ICLR, arXiv 2103.00065 (sharpness = λ_max; threshold 2/η,
    §3; (2 + 2β)/η with heavy-ball momentum β, Appendix).
    Yao, Gholami, Keutzer & Mahoney (2020), "PyHessian: Neural Networks Through the Lens of the
    Hessian", arXiv 1912.07145 (power iteration and Hutchinson for networks).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from dynascope.probes._hessian_ops import (
    LossFn,
    check_int,
    check_params,
    flatten_init,
    hvp_operator,
    orthogonalize,
    precondition,
    unflatten,
)
from dynascope.probes._hessian_probe import BatchLoss, HessianProbe
from dynascope.probes.base import ProbeContext, register_probe
from dynascope.probes.edge_of_stability import (
    THRESHOLD_OPTIMIZERS,
    adam_preconditioner,
    stability_threshold,
)

__all__ = [
    "HessianEigen",
    "Sharpness",
    "hessian_top_eigenvalues",
    "hessian_trace",
    "preconditioned_sharpness",
]

_WARM_MIX = 0.1
"""Weight of the fresh random vector in a warm-started Lanczos start vector (see ``init``)."""


class HessianEigen(NamedTuple):
    """The result of :func:`hessian_top_eigenvalues`.

    Attributes:
        values: ``[k]`` the k largest (algebraic) Ritz values, descending, loss units per
            parameter unit squared.
        vectors: name -> ``[k, *params[name].shape]``; row i of every tensor, concatenated, is
            the unit Ritz vector of ``values[i]``. Pass it as ``init`` to warm-start a later call.
        residuals: ``[k]`` ``‖H y_i − θ_i y_i‖``; an eigenvalue of H lies within it of
            ``values[i]``.
        iterations: Hessian-vector products taken (the basis size ``m``), an int.
    """

    values: Tensor
    vectors: dict[str, Tensor]
    residuals: Tensor
    iterations: int


def hessian_top_eigenvalues(
    loss_fn: LossFn,
    params: dict[str, Tensor],
    *,
    k: int = 1,
    iters: int = 100,
    tol: float = 1e-5,
    seed: int = 0,
    init: dict[str, Tensor] | None = None,
    preconditioner: dict[str, Tensor] | None = None,
) -> HessianEigen:
    """The ``k`` largest (algebraic) eigenvalues of the loss Hessian, by block Lanczos.

    ``H = ∇²_θ loss_fn(θ)`` at ``θ = params``, used only through products ``H v`` (one double
    backward each). Block Lanczos with block size ``k`` and full reorthogonalization: the basis
    ``Q`` grows by the orthonormalized products ``H V`` of the newest block ``V`` (a Krylov space
    of ``k`` start vectors), and the Ritz pairs ``(θ, y)`` are those of ``Qᵀ H Q`` (Rayleigh–Ritz
    over the Krylov space, which for ``k = 1`` is what Lanczos's tridiagonal matrix gives). It
    stops once each of the top ``k`` Ritz pairs has residual ``‖H y − θ y‖ ≤ tol · max|θ|`` (an
    eigenvalue lies within the residual of each reported value), after ``iters`` products, or
    when the basis spans ``R^P`` (then the values are exact up to rounding). A block of ``k``
    vectors finds eigenvalues of multiplicity up to ``k``. When a product adds no new direction
    (an invariant subspace: a Hessian of low rank, or zero) the block continues from a fresh
    random vector orthogonal to the basis, so ``k`` may exceed the rank. The residual stop
    guarantees an eigenvalue within the residual of each reported value, not that no larger
    one was missed: an eigenvalue small next to ``‖H‖`` (1 beside −906) can be absent from the
    Krylov space when the stop comes; ``tol=0`` runs every product.

    Args:
        loss_fn: ``loss_fn(params) -> scalar tensor``, twice differentiable in ``params`` (it
            gets tensors that require grad; it should not detach them).
        params: name -> tensor, one floating dtype and device; the point where H is taken.
            Not modified, and no ``.grad`` is written.
        k: how many eigenvalues (>= 1, <= P); also the block size.
        iters: most Hessian-vector products (>= k). Memory: ``2 · min(iters, P) · P`` numbers
            of the params' dtype (the basis and its products).
        tol: relative residual tolerance (>= 0; 0 runs all ``iters`` products).
        seed: seeds the private generator of the random start block.
        init: warm start, name -> ``[j, *shape]`` (e.g. ``HessianEigen.vectors`` of an earlier
            call) or ``[*shape]``, ``j <= k``. Start vector i is row i plus a random unit vector
            of weight 0.1 (so no eigendirection is missed); rows ``j..k-1`` are random.
        preconditioner: name -> a positive diagonal ``D`` shaped like ``params[name]`` (e.g.
            Adam's, :func:`~dynascope.probes.adam_preconditioner`): then the eigenvalues are
            those of ``D⁻¹H``, taken as those of the symmetric ``S H S``, ``S = D^{-1/2}`` (the
            Hessian of ``δ ↦ loss_fn(θ + S δ)`` at δ = 0); ``vectors`` and ``init`` are
            eigenvectors ``y`` of ``S H S`` (``S y`` is the right eigenvector of ``D⁻¹H``).
    Returns:
        :class:`HessianEigen` ``(values [k], vectors, residuals [k], iterations)``, values in
        the params' dtype, descending.
    Raises:
        ValueError: if ``params`` is empty, not floating, or mixes dtypes or devices; if ``k``,
            ``iters`` or ``tol`` is out of range (``k > P``, ``iters < k``, ``tol < 0``); if
            ``loss_fn`` returns no scalar or a non-finite loss; if a Hessian-vector product is
            not finite; if ``init`` does not match ``params`` (keys, shapes, ``j <= k``) or is
            not finite; if ``preconditioner`` lacks a key, has another shape or an entry that is
            not finite and > 0.
    References:
        Golub & Van Loan, "Matrix Computations" (4th ed.), §10.1 and §10.3.6 (block Lanczos);
        Cohen et al. (2021), arXiv 2103.00065, §3 (largest algebraic eigenvalue as sharpness);
        Cohen et al. (2022), arXiv 2207.14484, §2 (preconditioned sharpness λ_max(P⁻¹H)).
    """
    dtype, device = check_params(params)
    if preconditioner is not None:
        loss_fn, params = precondition(loss_fn, params, preconditioner)
    check_int("k", k, 1)
    check_int("iters", iters, k)
    n_params = sum(p.numel() for p in params.values())
    if k > n_params:
        raise ValueError(f"k must be <= the number of parameters P={n_params} (got k={k})")
    if not (isinstance(tol, int | float) and math.isfinite(tol) and tol >= 0):
        raise ValueError(f"tol must be finite and >= 0 (got tol={tol!r})")
    generator = torch.Generator().manual_seed(seed)

    def random_vector() -> Tensor:
        draw = torch.randn(n_params, generator=generator, dtype=torch.float64)
        return (draw / draw.norm()).to(device=device, dtype=dtype)

    start = torch.stack([random_vector() for _ in range(k)])  # [k, P]
    if init is not None:
        guess = flatten_init(init, params, dtype, device)
        if guess.shape[0] > k or not bool(torch.isfinite(guess).all()):
            raise ValueError(f"init must hold at most k={k} finite vectors per name")
        norms = guess.norm(dim=1, keepdim=True)
        guess = torch.where(norms > 0, guess / norms.clamp_min(torch.finfo(dtype).tiny), 0.0)
        start[: guess.shape[0]] = guess + _WARM_MIX * start[: guess.shape[0]]

    hvp, _ = hvp_operator(loss_fn, params)
    capacity = min(iters, n_params)
    Q = torch.empty(capacity, n_params, dtype=dtype, device=device)  # orthonormal rows
    HQ = torch.empty_like(Q)  # H Q[i], row by row
    M = torch.empty(capacity, capacity, dtype=torch.float64)  # Q H Q^T
    m = 0
    scale = 0.0  # largest ||H q|| so far, a lower bound on ||H||
    eps = math.sqrt(n_params) * torch.finfo(dtype).eps
    block = start
    while True:
        # orthonormalize the new block against the basis, one vector at a time; a vector with
        # nothing new (an invariant subspace) is replaced by a fresh random one
        first = m
        for w in block:
            if m == capacity:
                break
            w = orthogonalize(w, Q[:m])
            if not bool(w.norm() > eps * max(scale, float(block.norm(dim=1).max()))):
                w = orthogonalize(random_vector(), Q[:m])
                if not bool(w.norm() > eps):
                    break  # the basis spans R^P
            Q[m] = w / w.norm()
            m += 1
        if m == first:
            break
        for i in range(first, m):
            HQ[i] = hvp(Q[i])
        if not bool(torch.isfinite(HQ[first:m]).all()):
            raise ValueError(f"a Hessian-vector product is not finite (product {first + 1})")
        scale = max(scale, float(HQ[first:m].norm(dim=1).max()))
        cross = (Q[:m] @ HQ[first:m].T).double()  # [m, new]
        M[:m, first:m] = cross
        M[first:m, :m] = cross.T
        sym = (M[:m, :m] + M[:m, :m].T) / 2
        theta, S = torch.linalg.eigh(sym)  # ascending
        top = torch.arange(m - 1, max(m - 1 - k, -1), -1)
        coef = S[:, top].T.to(dtype=dtype, device=device)  # [<=k, m]
        Y = coef @ Q[:m]
        HY = coef @ HQ[:m]
        residuals = (HY - theta[top, None].to(dtype=dtype, device=device) * Y).norm(dim=1)
        bound = tol * float(theta.abs().max())
        if m >= k and bool((residuals <= bound).all()):
            break
        if m == capacity:
            break
        block = HQ[first:m]
    return HessianEigen(
        values=theta[top].to(dtype=dtype, device=device),
        vectors=unflatten(Y.contiguous(), params),
        residuals=residuals,
        iterations=m,
    )


def hessian_trace(
    loss_fn: LossFn, params: dict[str, Tensor], *, n_samples: int = 100, seed: int = 0
) -> tuple[Tensor, Tensor]:
    """Hutchinson's estimate of ``tr H`` with Rademacher probes, and its standard error.

    ``tr H ≈ (1/n) Σ_i z_iᵀ H z_i`` with ``z_i`` uniform on ``{−1, +1}^P``; each sample is
    unbiased, with variance ``2 Σ_{a≠b} H_ab²`` (so a diagonal Hessian gives the exact trace and
    a standard error of 0). The standard error is the sample standard deviation over
    ``sqrt(n)``.

    Args:
        loss_fn: ``loss_fn(params) -> scalar tensor``, as :func:`hessian_top_eigenvalues`.
        params: name -> tensor, one floating dtype and device; not modified.
        n_samples: probes (>= 2, for a standard error); one Hessian-vector product each.
        seed: seeds the private generator of the probes.
    Returns:
        ``(estimate, stderr)``: 0-dim tensors in the params' dtype, loss units per parameter
        unit squared.
    Raises:
        ValueError: if ``params`` is empty, not floating or mixes dtypes or devices; if
            ``n_samples < 2``; if ``loss_fn`` returns no scalar or a non-finite loss.
    References:
        Hutchinson (1990), Commun. Stat. Simul. Comput. 19(2); Avron & Toledo (2011), "Randomized
        algorithms for estimating the trace of an implicit symmetric positive semi-definite
        matrix", J. ACM 58(2) (variance of the Rademacher estimator).
    """
    dtype, device = check_params(params)
    check_int("n_samples", n_samples, 2)
    n_params = sum(p.numel() for p in params.values())
    generator = torch.Generator().manual_seed(seed)
    hvp, _ = hvp_operator(loss_fn, params)
    samples = torch.empty(n_samples, dtype=torch.float64)
    for i in range(n_samples):
        z = torch.randint(0, 2, (n_params,), generator=generator).mul_(2).sub_(1)
        z = z.to(device=device, dtype=dtype)
        samples[i] = float(z @ hvp(z))
    estimate = samples.mean()
    stderr = samples.std(correction=1) / math.sqrt(n_samples)
    return estimate.to(dtype=dtype, device=device), stderr.to(dtype=dtype, device=device)


def preconditioned_sharpness(
    loss_fn: LossFn,
    params: dict[str, Tensor],
    optimizer: torch.optim.Optimizer,
    *,
    iters: int = 100,
    tol: float = 1e-5,
    seed: int = 0,
) -> float:
    """λ_max(P⁻¹H), Adam's preconditioned sharpness, with P from the optimizer's state now.

    ``P = diag(√v̂ + ε)``, ``v̂ = exp_avg_sq / (1 − β₂^t)`` (bias-corrected, as torch's
    Adam/AdamW divide their step; :func:`~dynascope.probes.adam_preconditioner`). P⁻¹H has the
    spectrum of the symmetric ``P^{-1/2} H P^{-1/2}``, whose largest eigenvalue Lanczos finds
    (:func:`hessian_top_eigenvalues` with ``preconditioner``). Adam with β₁ is stable while it
    is below ``(2 + 2β₁)/((1 − β₁)η)``, 38/η at β₁ = 0.9
    (:func:`~dynascope.probes.stability_threshold`).

    Args:
        loss_fn: ``loss_fn(params) -> scalar``, as :func:`hessian_top_eigenvalues`.
        params: name -> the optimizer's parameter tensors (the same objects), where H is taken.
        optimizer: ``torch.optim.Adam`` or ``AdamW`` after at least one step.
        iters, tol, seed: as :func:`hessian_top_eigenvalues`.
    Returns:
        λ_max(P⁻¹H), the unit of H's eigenvalues divided by P's (the gradient's) unit.
    Raises:
        ValueError: if the optimizer has no second-moment state (not Adam/AdamW: the message
            names it and what is supported; or no step taken yet); if a tensor of ``params``
            is not among its parameters; as :func:`hessian_top_eigenvalues`.
    References:
        Cohen et al. (2022), "Adaptive Gradient Methods at the Edge of Stability", arXiv
        2207.14484, §2–3.
    """
    diag = adam_preconditioner(optimizer, params)
    eigen = hessian_top_eigenvalues(
        loss_fn, params, iters=iters, tol=tol, seed=seed, preconditioner=diag
    )
    return float(eigen.values[0])


@register_probe("sharpness")
class Sharpness(HessianProbe):
    """Sharpness λ_max of the training loss on a held batch, against the optimizer's stability edge.

    At each reading the probe takes the Hessian of ``loss(model(x), batch)`` with respect to
    the model's parameters (or those under ``include``), in eval mode (dropout off; modes are
    restored), on a held batch: ``batch`` given here, or else ``ctx.batch`` copied at the first
    reading and kept in :meth:`state_dict` together with the last Ritz vectors, which
    warm-start the next reading (so a resumed run measures what the uninterrupted one would).
    Full-batch gradient descent with step size η is stable on a quadratic only while
    ``λ_max < 2/η``; on neural networks λ_max rises to about 2/η and hovers there (the edge
    of stability). With momentum and with Adam the edge moves
    (:func:`~dynascope.probes.stability_threshold`): Adam's bounds the preconditioned
    sharpness λ_max(P⁻¹H) (Cohen et al. 2022).

    The loss is ``loss(output, batch)`` if given, else ``ctx.loss(model, batch)`` (the engine
    passes its training loss, the task's for a config run), else a default: cross-entropy
    (nats, mean) for integer targets ``y`` of the output's leading shape, or of shape
    ``[batch]`` against ``output[:, -1]`` for ``[batch, pos, d_out]`` outputs; mean squared
    error for float targets of the output's shape. Give the loss you train with: λ_max scales
    with it (a sum over the batch is ``batch`` times a mean).

    Keys (floats): ``sharpness.lambda_max`` (λ_1), ``sharpness.lambda_{i}`` for ``i = 2..k``,
    ``sharpness.loss`` (the loss on the held batch), and with ``lr``: ``sharpness.two_over_lr``
    (2/η) and ``sharpness.lambda_max_lr`` (λ_max·η, 2 at the edge of plain gradient descent).
    With ``lr`` a float or a ``torch.optim.SGD``: ``sharpness.threshold`` (2/η; (2 + 2β)/η
    with heavy-ball momentum β, see :func:`~dynascope.probes.stability_threshold` for
    dampening and Nesterov) and ``sharpness.edge_ratio`` (λ_max / threshold, 1 at the edge).
    With ``torch.optim.Adam``/``AdamW``, once every chosen parameter it updates has a second
    moment (not before its first step): ``sharpness.preconditioned_lambda_max`` (λ_max(P⁻¹H)
    over the parameters with Adam state, :func:`preconditioned_sharpness`),
    ``sharpness.preconditioned_threshold`` ((2 + 2β₁)/((1 − β₁)η), 38/η at β₁ = 0.9) and
    ``sharpness.edge_ratio`` (their ratio). With ``trace_samples``: ``sharpness.trace`` and
    ``sharpness.trace_stderr`` (Hutchinson).

    Args:
        loss: ``loss(output, batch) -> scalar``, e.g. a dynascope task's ``task.loss``.
        lr: the step size η as a float, or the optimizer (its ``param_groups`` sharing one
            ``"lr"``, read at each reading, so schedules are followed; its class and momentum
            set the threshold).
        batch: a held batch (name -> tensor, with ``input_key``) instead of the first
            ``ctx.batch``.
        k: eigenvalues per reading (>= 1).
        iters: most Lanczos steps per reading, as :func:`hessian_top_eigenvalues` (the
            preconditioned sharpness takes as many again, from a cold start).
        tol: as :func:`hessian_top_eigenvalues`.
        trace_samples: Hutchinson probes per reading (0 = no trace, else >= 2).
        include: parameter-name prefixes (e.g. ``["blocks.0."]``); ``None`` takes all.
        input_key: the batch entry passed as ``model(batch[input_key])``.
        seed: seeds the random vectors of every reading (the same at each reading).
    Raises:
        ValueError: (construction) if ``k``, ``iters``, ``tol``, ``trace_samples`` or ``lr``
            is out of range. (call) if no batch is held and ``ctx.batch`` is ``None`` or lacks
            ``input_key``; if ``include`` selects no parameter; if the optimizer's groups have
            different learning rates (or momenta, betas); as :func:`hessian_top_eigenvalues`.
    References:
        Cohen et al. (2021), "Gradient Descent on Neural Networks Typically Occurs at the Edge
        of Stability", ICLR, arXiv 2103.00065. Cohen et al. (2022), "Adaptive Gradient
        Methods at the Edge of Stability", arXiv 2207.14484.
    """

    def __init__(
        self,
        *,
        loss: BatchLoss | None = None,
        lr: float | torch.optim.Optimizer | None = None,
        batch: dict[str, Tensor] | None = None,
        k: int = 1,
        iters: int = 20,
        tol: float = 1e-4,
        trace_samples: int = 0,
        include: Sequence[str] | None = None,
        input_key: str = "x",
        seed: int = 0,
    ) -> None:
        check_int("k", k, 1)
        check_int("iters", iters, k)
        if not (isinstance(tol, int | float) and math.isfinite(tol) and tol >= 0):
            raise ValueError(f"tol must be finite and >= 0 (got tol={tol!r})")
        if trace_samples != 0:
            check_int("trace_samples", trace_samples, 2)
        if lr is not None and not isinstance(lr, torch.optim.Optimizer):
            if isinstance(lr, bool) or not isinstance(lr, int | float) or not lr > 0:
                raise ValueError(f"lr must be a float > 0 or an optimizer (got lr={lr!r})")
        super().__init__(loss=loss, batch=batch, include=include, input_key=input_key, seed=seed)
        self.lr = lr
        self.k, self.iters, self.tol = k, iters, float(tol)
        self.trace_samples = trace_samples
        self.vectors: dict[str, Tensor] | None = None

    def state_dict(self) -> dict[str, Any]:
        """The held batch and the last Ritz vectors (empty before the first reading)."""
        if self.vectors is None or self.batch is None:
            return {}
        return {"batch": self.batch, "vectors": self.vectors}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the held batch and the warm-start vectors."""
        if state:
            self.batch, self.vectors = dict(state["batch"]), dict(state["vectors"])

    def _learning_rate(self) -> float | None:
        if not isinstance(self.lr, torch.optim.Optimizer):
            return self.lr
        rates = sorted({float(group["lr"]) for group in self.lr.param_groups})
        if len(rates) != 1:
            raise ValueError(
                f"sharpness: the optimizer's param_groups must share one lr for 2/lr (got {rates})"
            )
        return rates[0]

    def _edge(
        self, model: nn.Module, loss_fn: LossFn, chosen: dict[str, Tensor], lambda_max: float
    ) -> dict[str, Tensor | float]:
        """The threshold keys for a float lr, SGD, Adam or AdamW (class docstring)."""
        lr = self.lr
        known = not isinstance(lr, torch.optim.Optimizer) or isinstance(lr, THRESHOLD_OPTIMIZERS)
        if lr is None or not known:
            return {}
        edge = stability_threshold(lr)
        if not edge.preconditioned:
            ratio = lambda_max / edge.value
            return {"sharpness.threshold": edge.value, "sharpness.edge_ratio": ratio}
        named = dict(model.named_parameters())
        moving = {n: named[n] for n in chosen if "exp_avg_sq" in lr.state.get(named[n], {})}
        if not moving:
            return {}  # before Adam's first step there is no preconditioner
        value = preconditioned_sharpness(
            lambda sub: loss_fn({**chosen, **sub}),
            moving,
            lr,
            iters=self.iters,
            tol=self.tol,
            seed=self.seed,
        )
        return {
            "sharpness.preconditioned_lambda_max": value,
            "sharpness.preconditioned_threshold": edge.value,
            "sharpness.edge_ratio": value / edge.value,
        }

    def measure(self, model: nn.Module, ctx: ProbeContext) -> dict[str, Tensor | float]:
        lr = self._learning_rate()
        loss_fn, chosen = self.loss_closure(model, ctx)
        device = next(iter(chosen.values())).device
        init = self.vectors
        if init is not None:
            init = {name: v.to(device) for name, v in init.items()}
        eigen = hessian_top_eigenvalues(
            loss_fn, chosen, k=self.k, iters=self.iters, tol=self.tol, seed=self.seed, init=init
        )
        self.vectors = {name: v.detach().cpu() for name, v in eigen.vectors.items()}
        values = eigen.values.double().cpu()
        with torch.no_grad():
            loss_value = float(loss_fn(chosen))
        out: dict[str, Tensor | float] = {
            "sharpness.lambda_max": float(values[0]),
            "sharpness.loss": loss_value,
        }
        out.update({f"sharpness.lambda_{i + 1}": float(values[i]) for i in range(1, self.k)})
        if lr is not None:
            out["sharpness.two_over_lr"] = 2.0 / lr
            out["sharpness.lambda_max_lr"] = float(values[0]) * lr
        out.update(self._edge(model, loss_fn, chosen, float(values[0])))
        if self.trace_samples:
            trace, stderr = hessian_trace(
                loss_fn, chosen, n_samples=self.trace_samples, seed=self.seed
            )
            out["sharpness.trace"] = float(trace)
            out["sharpness.trace_stderr"] = float(stderr)
        return out
