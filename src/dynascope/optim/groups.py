"""Parameter groups by role, with a separate weight decay per group, decoupled or as an L2 penalty.

Roles (every trainable parameter gets exactly one):

- ``attention``: the per-head matrices W_Q, W_K, W_V, W_O of every attention layer that
  :func:`dynascope.adapters.attention_views` finds (attention biases are ``vectors``);
- ``matrices``: every other parameter with two or more dimensions (MLP weights, embeddings,
  unembedding);
- ``vectors``: parameters with fewer than two dimensions (biases, LayerNorm gains).

Two ways to apply a weight decay λ to a group, which differ under Adam:

- ``mode="decoupled"``: AdamW's decoupled decay, θ ← θ − lr·λ·θ each step, outside the
  adaptive preconditioner (Loshchilov & Hutter 2019, arXiv 1711.05101);
- ``mode="l2"``: the penalty (λ/2)‖θ‖² is added to the loss, so its gradient λθ passes through
  Adam's preconditioner. This is the objective that the theory of Kobayashi et al. (2024,
  arXiv 2410.23819, Sec. 3) covers: L2 on the factors of W_QK, W_OV acts as a nuclear-norm
  penalty on the products.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

import torch
from torch import Tensor, nn

from dynascope.adapters import attention_views

__all__ = ["ROLES", "build_optimizer", "l2_penalty", "parameter_groups", "parameter_roles"]

ROLES = ("attention", "matrices", "vectors")
Role = Literal["attention", "matrices", "vectors"]


def _attention_ids(model: nn.Module) -> tuple[set[int], set[int]]:
    """ids of the attention matrices W_Q, W_K, W_V, W_O and of the attention biases."""
    try:
        views = attention_views(model)
    except ValueError:  # a model without attention: every matrix is a "matrices" parameter
        return set(), set()
    matrices = {id(t) for v in views for t in (v.W_Q, v.W_K, v.W_V, v.W_O)}
    biases = {id(t) for v in views for t in (v.b_Q, v.b_K, v.b_V, v.b_O) if t is not None}
    # Other layouts (torch MHA's in_proj_weight, GPT-2's fused c_attn, Llama's q_proj...) give
    # views that are slices or copies of the module's parameters: the module's own parameters
    # are the attention weights then (matrices: 2-D and up; biases: 1-D).
    for v in views:
        if v.module is None:
            continue
        for param in v.module.parameters():
            if id(param) in biases or id(param) in matrices:
                continue
            (matrices if param.ndim >= 2 else biases).add(id(param))
    return matrices, biases


def parameter_roles(model: nn.Module) -> Iterator[tuple[str, nn.Parameter, Role]]:
    """Yield ``(name, parameter, role)`` for every trainable parameter of ``model``."""
    attention_ids, bias_ids = _attention_ids(model)
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if id(param) in attention_ids:
            yield name, param, "attention"
        elif id(param) in bias_ids:  # b_Q, b_K, b_V are [n_heads, d_head] but are biases
            yield name, param, "vectors"
        elif param.ndim >= 2:
            yield name, param, "matrices"
        else:
            yield name, param, "vectors"


def parameter_groups(model: nn.Module, weight_decay: dict[str, float]) -> list[dict]:
    """torch optimizer parameter groups, one per non-empty role, each with its weight decay.

    Args:
        model: the model.
        weight_decay: λ per role; roles not given get 0.
    Returns:
        ``[{"params": [...], "names": [...], "role": role, "weight_decay": λ}, ...]``.
    Raises:
        ValueError: for an unknown role or a negative λ.
    """
    for role, lam in weight_decay.items():
        if role not in ROLES:
            raise ValueError(f"weight_decay role must be one of {', '.join(ROLES)} (got {role!r})")
        if lam < 0:
            raise ValueError(f"weight_decay.{role} must be >= 0 (got {lam})")
    groups: dict[str, dict] = {}
    for name, param, role in parameter_roles(model):
        group = groups.setdefault(
            role,
            {"params": [], "names": [], "role": role, "weight_decay": weight_decay.get(role, 0.0)},
        )
        group["params"].append(param)
        group["names"].append(name)
    return [groups[r] for r in ROLES if r in groups]


def l2_penalty(groups: list[dict]) -> Tensor:
    """Σ_groups (λ_g / 2) Σ_{θ in g} ‖θ‖_F², the explicit L2 penalty of ``mode="l2"``.

    ``groups`` are :func:`parameter_groups` output; the stored λ is read from ``"l2"`` (set by
    :func:`build_optimizer`, whose optimizer groups then carry ``weight_decay=0``).
    """
    total = None
    for group in groups:
        lam = group.get("l2", 0.0)
        if lam == 0.0:
            continue
        term = 0.5 * lam * sum(p.square().sum() for p in group["params"])
        total = term if total is None else total + term
    if total is None:
        return torch.zeros(())
    return total


def build_optimizer(
    model: nn.Module,
    *,
    name: Literal["adamw", "adam", "sgd"],
    lr: float,
    weight_decay: dict[str, float],
    mode: Literal["decoupled", "l2"] = "decoupled",
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    momentum: float = 0.0,
) -> tuple[torch.optim.Optimizer, list[dict]]:
    """Build an optimizer over role groups.

    ``mode="decoupled"`` with ``name="adam"`` or ``"adamw"`` gives ``torch.optim.AdamW`` with
    per-group decay; with ``"sgd"``, SGD's own ``weight_decay`` (for plain SGD decoupled decay and
    L2 coincide up to the lr factor convention: θ ← θ − lr(∇L + λθ)). ``mode="l2"`` sets every
    group's optimizer decay to 0 and stores λ in the group under ``"l2"``; add
    :func:`l2_penalty` of the returned groups to the loss.

    Returns:
        ``(optimizer, groups)``: the optimizer's own ``param_groups`` list (so the L2 penalty
        always reads the live groups).
    Raises:
        ValueError: for an unknown optimizer name or mode, lr <= 0, or a bad weight decay.
    """
    if lr <= 0:
        raise ValueError(f"optimizer.lr must be > 0 (got {lr})")
    if mode not in ("decoupled", "l2"):
        raise ValueError(f"optimizer.mode must be one of decoupled, l2 (got {mode!r})")
    groups = parameter_groups(model, weight_decay)
    if mode == "l2":
        for group in groups:
            group["l2"], group["weight_decay"] = group["weight_decay"], 0.0
    if name in ("adam", "adamw"):
        optimizer: torch.optim.Optimizer = torch.optim.AdamW(
            groups, lr=lr, betas=betas, eps=eps, weight_decay=0.0
        )
    elif name == "sgd":
        optimizer = torch.optim.SGD(groups, lr=lr, momentum=momentum, weight_decay=0.0)
    else:
        raise ValueError(f"optimizer.name must be one of adamw, adam, sgd (got {name!r})")
    return optimizer, optimizer.param_groups
