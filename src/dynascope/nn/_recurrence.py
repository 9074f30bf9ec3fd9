"""Checks and the ring initialisation of the diagonal recurrence, shared by the gated linear
RNN (:mod:`dynascope.nn.recurrent`, glossary there) and the LRU (:mod:`._lru`)."""

from __future__ import annotations

import torch
from torch import Tensor


def _positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int (got {name}={value!r})")


def _check_x(x: Tensor, d_model: int) -> None:
    if x.ndim != 3 or x.shape[-1] != d_model:
        raise ValueError(f"x must have shape [batch, pos, d_model={d_model}] (got {list(x.shape)})")


def _init_nu_theta(d_hidden: int, r_min: float, r_max: float, max_phase: float, kind: str):
    """LRU ring init: |λ|² ~ U[r_min², r_max²] (complex), |λ| ~ U[r_min, r_max] (real)."""
    if not 0.0 <= r_min < r_max <= 1.0:
        raise ValueError(f"need 0 <= r_min < r_max <= 1 (got r_min={r_min}, r_max={r_max})")
    u = torch.rand(d_hidden).clamp(1e-4, 1 - 1e-4)
    if kind == "complex":
        modulus = torch.sqrt(u * (r_max**2 - r_min**2) + r_min**2)
    else:
        modulus = r_min + u * (r_max - r_min)
    modulus = modulus.clamp(1e-4, 1 - 1e-4)  # ν_log finite: 0 < λ < 1 at init
    nu_log = torch.log(-torch.log(modulus))
    theta_log = torch.log(max_phase * torch.rand(d_hidden).clamp_min(1e-4))
    return nu_log, theta_log, torch.log(torch.sqrt(1 - modulus**2))
