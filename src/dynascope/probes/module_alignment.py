"""Does a modular student identify its teacher's modules? Code decodability and alignment (S5).

Glossary:
    M, M_hat:   teacher and student code widths (numbers of modules).
    z:          ``[tasks, M]`` teacher codes; ``z_hat``: ``[tasks, M_hat]`` inferred student codes.
    F:          ``[M, M_hat]`` linear map of codes, ``z ≈ F z_hat`` (per teacher coordinate m,
                ridge regression of ``z[:, m]`` on ``z_hat`` with l2 0.01 and no intercept:
                ``F[m] = (Z_hatᵀ Z_hat + l2 I)⁻¹ Z_hatᵀ z[:, m]``).
    R²:         per teacher coordinate, ``1 − Σ(z − ẑ)² / Σ(z − mean z)²`` on held-out tasks
                (``ẑ = z_hat Fᵀ``); NaN where ``z[:, m]`` is constant on the held-out tasks.
    theta:      ``[M, n_input, n_hidden]`` teacher modules; ``theta_hat``:
                ``[M_hat, n_input, n_hidden_hat]`` student modules (first generated layer).
    theta_tilde: ``[M, n_input, n_hidden_hat]``, ``theta_tilde_m = Σ_j pinv(F)[j, m]
                theta_hat_j``: the student's modules expressed in the teacher's code basis.
    alignment:  ``A[m, o] = max_o' <u_m[:, o], ũ_m[:, o']>`` with ``u``, ``ũ`` each hidden
                unit's incoming vector normalised (signed cosine; ``absolute=True`` takes
                ``|cos|``). Variant ``"all"``: normalise each unit over (module, input) jointly
                and compare whole columns, ``A[o] = max_o' <u[:, :, o], ũ[:, :, o']>``.
                Hidden units may be permuted and positively rescaled (ReLU) without changing
                the function, so the per-unit maximum and normalisation make the score
                invariant to both; a student that identifies the modules scores ≈ 1.
    generated-weight alignment: per task, per-unit cosine of ``W(z) = z theta`` and
                ``Ŵ(z_hat) = z_hat theta_hat``; ``avr``: ``max_o'`` of the task-mean cosine
                (one fixed unit matching for all tasks), ``max``: task mean of ``max_o'``.

S5 (open detail, our choice): the headline numbers are the signed per-unit alignment with F
fit on the training tasks (mean over modules and units), as the reference code computes it;
the shorter ``min_i max_j |cos(Θ_i, Θ̂_j F)|`` that circulates corresponds to
``absolute=True`` with a min reduction.

All functions are pure, float64 internally, batched only where stated.

References:
    Schug et al. (2024), "Discovering modular solutions that generalize compositionally",
    arXiv 2312.15001, sec. 3, Fig. 2C; reference ``run_theory.py`` (``ridge_r2_score``,
    ``eval_templates``, ``eval_inference``) and ``metax/models/regression.py``
    (``RidgeRegression``: l2 0.01, no intercept, R² with the mean-centred total sum of squares;
    the reference solves it by 10 conjugate-gradient steps, we solve it exactly).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

__all__ = [
    "code_r2",
    "fit_code_map",
    "generated_weight_alignment",
    "module_alignment",
]


def _check_codes(z_hat: Tensor, z: Tensor, name: str) -> None:
    if z_hat.ndim != 2 or z.ndim != 2 or z_hat.shape[0] != z.shape[0]:
        raise ValueError(
            f"{name}: z_hat must be [tasks, M_hat] and z [tasks, M] with the same tasks "
            f"(got {tuple(z_hat.shape)} and {tuple(z.shape)})"
        )
    if not (z_hat.isfinite().all() and z.isfinite().all()):
        raise ValueError(f"{name}: z_hat and z must be finite")


def fit_code_map(z_hat: Tensor, z: Tensor, l2: float = 0.01) -> Tensor:
    """Ridge map of student to teacher codes, no intercept: ``F = Zᵀ Ẑ (ẐᵀẐ + l2 I)⁻¹``.

    Args:
        z_hat: ``[tasks, M_hat]`` student codes.
        z: ``[tasks, M]`` teacher codes.
        l2: ridge penalty on the sum of squares (``>= 0``; 0 = least squares, min-norm).
    Returns:
        ``F`` ``[M, M_hat]`` (float64) with ``z ≈ z_hat @ F.T``.
    Raises:
        ValueError: for mismatched shapes, non-finite codes or ``l2 < 0``.
    References:
        Reference ``metax/models/regression.py`` (``RidgeRegression``, ``intercept=False``).
    """
    _check_codes(z_hat, z, "fit_code_map")
    if not l2 >= 0:
        raise ValueError(f"l2 must be >= 0 (got l2={l2})")
    X, Y = z_hat.double(), z.double()
    if l2 == 0:
        return torch.linalg.lstsq(
            X, Y, driver="gelsd" if X.device.type == "cpu" else None
        ).solution.T
    gram = X.T @ X + l2 * torch.eye(X.shape[1], dtype=X.dtype, device=X.device)
    return torch.linalg.solve(gram, X.T @ Y).T


def code_r2(F: Tensor, z_hat: Tensor, z: Tensor) -> Tensor:
    """Held-out R² of each teacher coordinate under ``z ≈ z_hat Fᵀ``.

    Args:
        F: ``[M, M_hat]`` (e.g. :func:`fit_code_map` on training tasks).
        z_hat: ``[tasks, M_hat]``; z: ``[tasks, M]`` held-out tasks.
    Returns:
        ``[M]`` R² (can be negative); NaN for a coordinate constant on these tasks.
    Raises:
        ValueError: for mismatched shapes or non-finite codes.
    """
    _check_codes(z_hat, z, "code_r2")
    if F.shape != (z.shape[1], z_hat.shape[1]):
        raise ValueError(
            f"F must be [M={z.shape[1]}, M_hat={z_hat.shape[1]}] (got {tuple(F.shape)})"
        )
    y = z.double()
    res = (y - z_hat.double() @ F.double().T).square().sum(0)
    tot = (y - y.mean(0)).square().sum(0)
    r2 = 1.0 - res / tot
    return torch.where(tot > 1e-12 * y.shape[0], r2, torch.full_like(r2, float("nan")))


def _normalise(w: Tensor, dims: tuple[int, ...]) -> Tensor:
    return w / w.norm(dim=dims, keepdim=True).clamp_min(1e-300)


def module_alignment(
    theta: Tensor,
    theta_hat: Tensor,
    F: Tensor,
    *,
    variant: Literal["unit", "all"] = "unit",
    absolute: bool = False,
) -> Tensor:
    """Module alignment after mapping the student's modules to the teacher's code basis.

    Args:
        theta: ``[M, n_input, n_hidden]`` teacher modules.
        theta_hat: ``[M_hat, n_input, n_hidden_hat]`` student modules.
        F: ``[M, M_hat]`` code map (``z ≈ F z_hat``).
        variant: ``"unit"`` (per module and unit, S5's default) or ``"all"`` (per unit over
            all modules jointly).
        absolute: use ``|cos|`` instead of the signed cosine.
    Returns:
        ``[M, n_hidden]`` (``"unit"``) or ``[n_hidden]`` (``"all"``), in [-1, 1]; report
        mean, min and max.
    Raises:
        ValueError: if the shapes do not fit together, a tensor is non-finite, or the variant
            is unknown.
    References:
        Schug et al. (2024), arXiv 2312.15001, Fig. 2C; reference ``run_theory.py``
        (``eval_templates``: ``template_alignment``, ``template_alignment_all``).
    """
    if variant not in ("unit", "all"):
        raise ValueError(f"variant must be 'unit' or 'all' (got variant={variant!r})")
    if (
        theta.ndim != 3
        or theta_hat.ndim != 3
        or theta.shape[1] != theta_hat.shape[1]
        or F.shape != (theta.shape[0], theta_hat.shape[0])
    ):
        raise ValueError(
            "theta [M, n_input, n_hidden], theta_hat [M_hat, n_input, n_hidden_hat] and F "
            f"[M, M_hat] must fit (got {tuple(theta.shape)}, {tuple(theta_hat.shape)}, "
            f"{tuple(F.shape)})"
        )
    if not (theta.isfinite().all() and theta_hat.isfinite().all() and F.isfinite().all()):
        raise ValueError("module_alignment: theta, theta_hat and F must be finite")
    pinv = torch.linalg.pinv(F.double())  # [M_hat, M]
    tilde = torch.einsum("jm,jio->mio", pinv, theta_hat.double())
    if variant == "unit":
        cos = torch.einsum(
            "mio,miO->moO", _normalise(theta.double(), (1,)), _normalise(tilde, (1,))
        )
    else:
        cos = torch.einsum(
            "mio,miO->oO", _normalise(theta.double(), (0, 1)), _normalise(tilde, (0, 1))
        )
    return (cos.abs() if absolute else cos).amax(-1)


def generated_weight_alignment(
    theta: Tensor, theta_hat: Tensor, z: Tensor, z_hat: Tensor
) -> tuple[Tensor, Tensor]:
    """Per-unit cosine of the generated weights ``W(z)`` and ``Ŵ(z_hat)`` on the same tasks.

    Args:
        theta: ``[M, n_input, n_hidden]``; theta_hat: ``[M_hat, n_input, n_hidden_hat]``.
        z: ``[tasks, M]``; z_hat: ``[tasks, M_hat]`` (the same tasks, row by row).
    Returns:
        ``(avr [n_hidden], max [n_hidden])``: ``max_o'`` of the task-mean cosine, and the
        task mean of ``max_o'``; ``max >= avr``.
    Raises:
        ValueError: if the shapes do not fit together.
    References:
        Reference ``run_theory.py`` (``eval_inference``: ``generated_weight_*_alignment``).
    """
    if (
        theta.ndim != 3
        or theta_hat.ndim != 3
        or theta.shape[1] != theta_hat.shape[1]
        or z.shape[1:] != theta.shape[:1]
        or z_hat.shape[1:] != theta_hat.shape[:1]
    ):
        raise ValueError(
            f"theta {tuple(theta.shape)}, theta_hat {tuple(theta_hat.shape)}, z "
            f"{tuple(z.shape)} and z_hat {tuple(z_hat.shape)} do not fit together"
        )
    _check_codes(z_hat, z, "generated_weight_alignment")
    W = _normalise(torch.einsum("bm,mio->bio", z.double(), theta.double()), (1,))
    W_hat = _normalise(torch.einsum("bm,mio->bio", z_hat.double(), theta_hat.double()), (1,))
    cos = torch.einsum("bio,biO->boO", W, W_hat)
    return cos.mean(0).amax(-1), cos.amax(-1).mean(0)
