"""Private helpers of :mod:`dynascope.probes.sharpness` and
:mod:`dynascope.probes.hessian_density`: Hessian-vector products by double backward, flat
vectors over a parameter dict, Gram-Schmidt against a basis, and a diagonal change of
coordinates (preconditioned Hessians).

Glossary:
    params:  ``dict[str, Tensor]``, one floating dtype and device; P = total entries.
    flat:    ``[P]`` (or ``[j, P]`` rows), the tensors of ``params`` concatenated in the dict's
             order, each in C order (``reshape(-1)``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

__all__ = [
    "LossFn",
    "check_int",
    "check_params",
    "flatten_init",
    "hvp_operator",
    "orthogonalize",
    "precondition",
    "unflatten",
]

LossFn = Callable[[dict[str, Tensor]], Tensor]


def check_int(name: str, value: Any, low: int) -> None:
    """ValueError naming ``name`` unless ``value`` is an integer (not a bool) >= ``low``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low} (got {name}={value!r})")


def check_params(params: dict[str, Tensor]) -> tuple[torch.dtype, torch.device]:
    """The one dtype and device of ``params``; ValueError if empty, not floating or mixed."""
    if not isinstance(params, dict) or not params:
        raise ValueError(f"params must be a non-empty dict of tensors (got {params!r:.60})")
    first = next(iter(params.values()))
    for name, p in params.items():
        if not isinstance(p, Tensor) or not p.is_floating_point():
            kind = p.dtype if isinstance(p, Tensor) else type(p).__name__
            raise ValueError(f"params[{name!r}] must be a floating tensor (got {kind})")
        if p.dtype != first.dtype or p.device != first.device:
            raise ValueError(
                f"params must share one dtype and device (got {p.dtype} on {p.device} for "
                f"{name!r}, {first.dtype} on {first.device} for the first)"
            )
    return first.dtype, first.device


def hvp_operator(
    loss_fn: LossFn, params: dict[str, Tensor]
) -> tuple[Callable[[Tensor], Tensor], Tensor]:
    """``(hvp, loss)``: ``hvp(v [P]) -> H v [P]`` from one forward and one graph-keeping backward.

    The forward runs under the math SDPA backend (twice differentiable) and a forked RNG (a
    ``loss_fn`` that draws random numbers leaves the global RNG alone; its draw is fixed for
    every product). Parameters whose gradient does not depend on any parameter contribute 0.
    """
    leaves = {name: p.detach().requires_grad_(True) for name, p in params.items()}
    device = next(iter(leaves.values())).device
    devices = [device.index or 0] if device.type not in ("cpu", "meta") else []
    device_type = device.type if devices else None
    with (
        torch.random.fork_rng(devices=devices, device_type=device_type or "cuda"),
        torch.enable_grad(),
        sdpa_kernel([SDPBackend.MATH]),
    ):
        loss = loss_fn(leaves)
        if not isinstance(loss, Tensor) or loss.numel() != 1:
            got = tuple(loss.shape) if isinstance(loss, Tensor) else type(loss).__name__
            raise ValueError(f"loss_fn must return a scalar tensor (got {got})")
        if not bool(torch.isfinite(loss.detach())):
            raise ValueError(f"loss_fn returned a non-finite loss ({float(loss.detach())})")
        inputs = list(leaves.values())
        if loss.requires_grad:
            grads = torch.autograd.grad(
                loss.reshape(()), inputs, create_graph=True, allow_unused=True
            )
        else:
            grads = (None,) * len(inputs)
    sizes = [p.numel() for p in inputs]
    live = [i for i, g in enumerate(grads) if g is not None and g.requires_grad]

    def hvp(v: Tensor) -> Tensor:
        if not live:
            return torch.zeros_like(v)
        chunks = v.split(sizes)
        with torch.enable_grad():
            products = torch.autograd.grad(
                [grads[i] for i in live],
                inputs,
                grad_outputs=[chunks[i].view_as(inputs[i]) for i in live],
                retain_graph=True,
                allow_unused=True,
            )
        return torch.cat(
            [
                torch.zeros(n, dtype=v.dtype, device=v.device) if h is None else h.reshape(-1)
                for h, n in zip(products, sizes)
            ]
        )

    return hvp, loss.detach().reshape(())


def flatten_init(
    init: dict[str, Tensor], params: dict[str, Tensor], dtype: torch.dtype, device: torch.device
) -> Tensor:
    """``[j, P]`` from ``init`` (name -> ``[j, *shape]`` or ``[*shape]``), checked."""
    if set(init) != set(params):
        raise ValueError(
            f"init must have the keys of params (missing {sorted(set(params) - set(init))}, "
            f"extra {sorted(set(init) - set(params))})"
        )
    rows = None
    parts = []
    for name, p in params.items():
        v = init[name]
        v = v.unsqueeze(0) if tuple(v.shape) == tuple(p.shape) else v
        if tuple(v.shape[1:]) != tuple(p.shape) or (rows is not None and v.shape[0] != rows):
            raise ValueError(
                f"init[{name!r}] must be [j, *{list(p.shape)}] with the same j for every "
                f"name (got {list(init[name].shape)})"
            )
        rows = v.shape[0]
        parts.append(v.detach().to(device=device, dtype=dtype).reshape(rows, -1))
    return torch.cat(parts, dim=1)


def unflatten(rows: Tensor, params: dict[str, Tensor]) -> dict[str, Tensor]:
    """name -> ``[j, *shape]`` from ``rows`` ``[j, P]``."""
    chunks = rows.split([p.numel() for p in params.values()], dim=1)
    return {
        name: chunk.reshape(rows.shape[0], *p.shape)
        for (name, p), chunk in zip(params.items(), chunks)
    }


def orthogonalize(w: Tensor, Q: Tensor) -> Tensor:
    """``w`` minus its projection on the rows of ``Q`` (orthonormal), twice (Kahan–Parlett)."""
    for _ in range(2):
        w = w - (Q @ w) @ Q
    return w


def precondition(
    loss_fn: LossFn, params: dict[str, Tensor], diag: dict[str, Tensor]
) -> tuple[LossFn, dict[str, Tensor]]:
    """``(δ ↦ loss_fn(θ + S δ), zeros)`` with ``S = diag^{-1/2}``: its Hessian at δ = 0 is
    ``S H S``, whose spectrum is that of ``diag⁻¹ H``. ValueError if ``diag`` lacks a key of
    ``params``, has another shape, or an entry that is not finite and > 0."""
    scale = {}
    for name, p in params.items():
        d = diag.get(name)
        if d is None or tuple(d.shape) != tuple(p.shape):
            got = None if d is None else list(d.shape)
            raise ValueError(
                f"preconditioner[{name!r}] must have shape {list(p.shape)} (got {got})"
            )
        if not bool((torch.isfinite(d) & (d > 0)).all()):
            raise ValueError(f"preconditioner[{name!r}] must be finite and > 0 everywhere")
        scale[name] = d.detach().to(dtype=p.dtype, device=p.device).rsqrt()
    theta = {name: p.detach() for name, p in params.items()}

    def rescaled(delta: dict[str, Tensor]) -> Tensor:
        return loss_fn({name: theta[name] + scale[name] * delta[name] for name in theta})

    return rescaled, {name: torch.zeros_like(p) for name, p in theta.items()}
