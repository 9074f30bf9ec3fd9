"""Task inference: fit one code per task, for many tasks at once, with batched Adam (S5).

Glossary:
    tasks:      leading axis; every task has its own code and its own Adam state.
    M_hat:      code width of the student.
    code:       ``[tasks, M_hat]``; ``code_0`` is shared (``[M_hat]``) or per task.
    loss_fn:    ``loss_fn(code, step) -> [tasks]``: each task's own loss at inner step
                ``step`` (it draws that step's inputs itself, so every step can see fresh x).
    grad_fn:    alternatively ``grad_fn(code, step) -> [tasks, M_hat]``, each task's gradient
                computed by hand (first order only; e.g.
                :meth:`~dynascope.nn.multitask_hypernet.MultitaskHypernet.code_gradient`).

Because task ``t``'s loss depends only on ``code[t]``, the gradient of ``sum_t loss_t`` with
respect to ``code`` holds every task's own gradient in its row; Adam is elementwise, so one
Adam over the ``[tasks, M_hat]`` tensor is exactly one independent Adam per task.

Adam (Kingma & Ba 2015, arXiv 1412.6980, Alg. 1; optax ``adam`` and ``torch.optim.Adam``):
``m ← β1 m + (1 − β1) g``, ``v ← β2 v + (1 − β2) g²``,
``code ← code − lr · (m / (1 − β1^t)) / (sqrt(v / (1 − β2^t)) + eps)``.

First order (default; S5's reference setting): every step works on detached tensors, and the
returned code is detached, so the outer loss sees the code as a constant. Second order: the
updates stay in the autograd graph (``create_graph=True``), so the outer gradient flows through
all inner steps to the model's parameters (MAML-style; memory grows with ``steps``).

References:
    Schug et al. (2024), "Discovering modular solutions that generalize compositionally",
    arXiv 2312.15001, sec. 3 (task inference by gradient descent on the code); reference
    ``run_theory.py`` (``infer_task``: optax Adam, first order by default).
    Finn, Abbeel, Levine (2017), "Model-Agnostic Meta-Learning", arXiv 1703.03400 (second order).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["fit_codes"]


def fit_codes(
    loss_fn: Callable[[Tensor, int], Tensor] | None,
    code_0: Tensor,
    n_tasks: int,
    *,
    steps: int,
    lr: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    second_order: bool = False,
    grad_fn: Callable[[Tensor, int], Tensor] | None = None,
) -> Tensor:
    """Run ``steps`` batched Adam steps on the codes of ``n_tasks`` tasks.

    Args:
        loss_fn: ``loss_fn(code [tasks, M_hat], step) -> [tasks]`` per-task losses
            (differentiated by autograd), or ``None`` when ``grad_fn`` is given.
        code_0: initial code, ``[M_hat]`` (shared by all tasks, S5's "constant" init) or
            ``[tasks, M_hat]``.
        n_tasks: number of tasks.
        steps: inner steps, ``>= 0`` (0 returns the initial codes).
        lr: Adam step size, ``> 0``.
        betas: Adam's ``(β1, β2)``, each in ``[0, 1)``.
        eps: Adam's denominator guard, ``> 0``.
        second_order: keep the inner updates differentiable (see the module docstring).
        grad_fn: ``grad_fn(code, step) -> [tasks, M_hat]`` hand-written per-task gradients,
            used instead of ``loss_fn`` (first order only).
    Returns:
        ``[tasks, M_hat]`` fitted codes; detached unless ``second_order``.
    Raises:
        ValueError: for ``steps < 0``, ``lr <= 0``, ``eps <= 0``, betas outside ``[0, 1)``,
            ``n_tasks < 1``, a ``code_0`` that is not ``[M_hat]`` or ``[n_tasks, M_hat]``, a
            ``loss_fn`` that does not return ``[tasks]``, not exactly one of ``loss_fn`` and
            ``grad_fn``, or ``grad_fn`` with ``second_order``.
    References:
        Kingma & Ba (2015), arXiv 1412.6980, Alg. 1; Schug et al. (2024), arXiv 2312.15001.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be an int >= 0 (got steps={steps!r})")
    if not lr > 0 or not eps > 0:
        raise ValueError(f"lr and eps must be > 0 (got lr={lr}, eps={eps})")
    if not all(0 <= b < 1 for b in betas):
        raise ValueError(f"betas must lie in [0, 1) (got betas={betas})")
    if (loss_fn is None) == (grad_fn is None):
        raise ValueError("give exactly one of loss_fn and grad_fn")
    if grad_fn is not None and second_order:
        raise ValueError("second_order needs loss_fn (autograd), not grad_fn")
    if n_tasks < 1:
        raise ValueError(f"n_tasks must be >= 1 (got n_tasks={n_tasks})")
    if code_0.ndim == 1:
        code = code_0.expand(n_tasks, -1).clone()
    elif code_0.ndim == 2 and code_0.shape[0] == n_tasks:
        code = code_0.clone()
    else:
        raise ValueError(
            f"code_0 must be [M_hat] or [n_tasks={n_tasks}, M_hat] (got {tuple(code_0.shape)})"
        )
    if not second_order:
        code = code.detach()
    b1, b2 = betas
    m = torch.zeros_like(code)
    v = torch.zeros_like(code)
    for t in range(1, steps + 1):
        if grad_fn is not None:
            g = grad_fn(code, t - 1)
        else:
            g = _autograd_step(loss_fn, code, t - 1, n_tasks, second_order)
            if not second_order:
                code = code.detach()
        step_size, root_bc2 = lr / (1 - b1**t), math.sqrt(1 - b2**t)
        if second_order:  # out of place: the updates stay in the graph
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * g * g
            # sqrt'(0) is infinite: a coordinate whose gradient is exactly 0 (a dead ReLU)
            # would turn the meta-gradient into NaN; flooring v at 1e-38 changes the step by
            # < 1e-11 relative (sqrt(1e-38) = 1e-19 against eps = 1e-8) and keeps it finite.
            code = code - step_size * m / (v.clamp_min(1e-38).sqrt() / root_bc2 + eps)
        else:  # the same arithmetic in place, fewer kernel launches
            with torch.no_grad():
                m.mul_(b1).add_(g, alpha=1 - b1)
                v.mul_(b2).add_(g * g, alpha=1 - b2)  # addcmul_ has no vmap rule
                code = code.addcdiv(m, (v.sqrt() / root_bc2).add_(eps), value=-step_size)
    return code if second_order else code.detach()


def _autograd_step(
    loss_fn: Callable[[Tensor, int], Tensor],
    code: Tensor,
    step: int,
    n_tasks: int,
    second_order: bool,
) -> Tensor:
    if not code.requires_grad:
        code = code.requires_grad_(True)
    with torch.enable_grad():
        losses = loss_fn(code, step)
        if losses.shape != (n_tasks,):
            raise ValueError(f"loss_fn must return [tasks={n_tasks}] (got {tuple(losses.shape)})")
        (g,) = torch.autograd.grad(losses.sum(), code, create_graph=second_order)
    return g
