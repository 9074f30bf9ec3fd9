"""Adam (and AdamW) for a stack of K members (:mod:`.ensemble`, glossary there), with ε a
``[K]`` vector and otherwise torch's update, so that member k equals a lone
``torch.optim.Adam(eps=eps_k)`` run. Re-exported by :mod:`dynascope.train.ensemble`.

References:
    Kingma & Ba (2015), "Adam: A Method for Stochastic Optimization", arXiv 1412.6980,
    Algorithm 1 (in the form of ``torch.optim.Adam``: ε added to the bias-corrected
    ``sqrt(v_t)``); Loshchilov & Hutter (2019), arXiv 1711.05101 (decoupled weight decay).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor


def _scalar_dtype() -> torch.dtype:
    """The dtype of Adam's ``step`` counter, as torch.optim.Adam chooses it."""
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


class StackedAdam(torch.optim.Optimizer):
    """Adam (or AdamW) on stacked ``[K, ...]`` tensors, with one ε per member.

    Torch's Adam update (its single-tensor form, ``amsgrad=False``, ``maximize=False``),
    element by element, with ε a vector of K values broadcast over each tensor's member axis,
    so member k's slice moves exactly as under a lone ``torch.optim.Adam(eps=eps[k])``::

        t <- t + 1
        g <- g + λ θ                      (Adam's L2 term; AdamW: θ <- θ (1 - lr λ) instead)
        m <- m + (1 - β1) (g - m)         (lerp)
        v <- β2 v + (1 - β2) g²
        θ <- θ - lr / (1 - β1^t) · m / (sqrt(v) / sqrt(1 - β2^t) + ε_k)

    State (``step``, ``exp_avg``, ``exp_avg_sq``) is keyed as torch's, so member k's slice
    loads into a lone ``torch.optim.Adam``. A group's ``eps`` is the tuple of K values.

    Args:
        params: stacked tensors ``[K, ...]`` or parameter groups (dicts), as for Adam.
        lr: learning rate (shared; per-member rates are :class:`Stack`'s ``lr_scales``).
        betas: ``(β1, β2)``, each in ``[0, 1)``.
        eps: K values of ε, each > 0; member k's is ``eps[k]``.
        weight_decay: λ >= 0.
        decoupled_weight_decay: AdamW's decay (Loshchilov & Hutter) instead of an L2 term.
    Raises:
        ValueError: if ``lr``, ``betas``, ``eps`` or ``weight_decay`` is out of range, or a
            tensor's first axis is not ``len(eps)``.
    References:
        Kingma & Ba (2015), arXiv 1412.6980, Algorithm 1 (ε moved outside the bias
        correction as in ``torch.optim.Adam``); Loshchilov & Hutter (2019), arXiv 1711.05101.
    """

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: Sequence[float] = (1e-8,),
        weight_decay: float = 0.0,
        *,
        decoupled_weight_decay: bool = False,
    ) -> None:
        eps = tuple(float(e) for e in eps)
        if not lr >= 0:
            raise ValueError(f"lr must be >= 0 (got lr={lr!r})")
        if not all(0 <= b < 1 for b in betas):
            raise ValueError(f"betas must each lie in [0, 1) (got betas={betas!r})")
        if not eps or not all(math.isfinite(e) and e > 0 for e in eps):
            raise ValueError(f"eps must be K finite values > 0 (got eps={eps!r})")
        if not weight_decay >= 0:
            raise ValueError(f"weight_decay must be >= 0 (got weight_decay={weight_decay!r})")
        defaults = dict(
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            amsgrad=False,
            maximize=False,
            decoupled_weight_decay=decoupled_weight_decay,
        )
        super().__init__(params, defaults)
        for group in self.param_groups:
            group["eps"] = tuple(float(e) for e in group["eps"])
            for p in group["params"]:
                if p.dim() == 0 or p.shape[0] != len(group["eps"]):
                    raise ValueError(
                        f"params must be stacked [K, ...] with K = len(eps) = {len(group['eps'])}"
                        f" (got a tensor of shape {list(p.shape)})"
                    )

    def member_param_groups(self, k: int) -> list[dict]:
        """Member ``k``'s groups as a lone Adam's ``state_dict`` holds them (``eps[k]``)."""
        groups = self.state_dict()["param_groups"]
        return [{**g, "eps": g["eps"][k]} for g in groups]

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:  # type: ignore[override]
        """One Adam update of every stacked tensor with a gradient (class docstring)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, decay = group["lr"], group["weight_decay"]
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            for p in params:
                if not self.state[p]:
                    self.state[p]["step"] = torch.tensor(0.0, dtype=_scalar_dtype())
                    for key in ("exp_avg", "exp_avg_sq"):
                        self.state[p][key] = torch.zeros_like(
                            p, memory_format=torch.preserve_format
                        )
            states = [self.state[p] for p in params]
            grads = [p.grad for p in params]
            exp_avgs = [st["exp_avg"] for st in states]
            exp_avg_sqs = [st["exp_avg_sq"] for st in states]
            steps = [st["step"] for st in states]
            # the same per-tensor arithmetic as torch's single-tensor Adam, op by op over lists
            torch._foreach_add_(steps, 1)
            t = [s.item() for s in steps]
            if decay != 0:
                if group["decoupled_weight_decay"]:
                    torch._foreach_mul_(params, 1 - lr * decay)
                else:
                    grads = torch._foreach_add(grads, params, alpha=decay)
            torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
            torch._foreach_mul_(exp_avg_sqs, beta2)
            torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)
            eps = torch.tensor(group["eps"], dtype=params[0].dtype, device=params[0].device)
            member_eps = [eps.view(-1, *([1] * (p.dim() - 1))) for p in params]  # [K, 1, ...]
            denom = torch._foreach_sqrt(exp_avg_sqs)
            torch._foreach_div_(denom, [(1 - beta2**ti) ** 0.5 for ti in t])
            torch._foreach_add_(denom, member_eps)
            torch._foreach_addcdiv_(params, exp_avgs, denom, [-lr / (1 - beta1**ti) for ti in t])
        return loss
