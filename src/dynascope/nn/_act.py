"""Adaptive computation time (ACT) for a shared block applied up to T times, exactly as
tensor2tensor's ``universal_transformer_act`` (the loop and its oracle are in
:mod:`dynascope.nn.universal`'s docstring, with the glossary; re-exported there), and the
sinusoidal timing signal added at each step.

References:
    M. Dehghani, S. Gouws, O. Vinyals, J. Uszkoreit, Ł. Kaiser (2019), "Universal
        Transformers", ICLR, arXiv 1807.03819, Sec. 2.2 (ACT).
    A. Graves (2016), "Adaptive Computation Time for Recurrent Neural Networks",
        arXiv 1603.08983, eq. (5)-(12).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


def timing_signal(length: int, d_model: int) -> Tensor:
    """Sinusoidal signal ``[length, d_model]``: sin in the first half, cos in the second.

    Timescales ``10^4^(i / (d_model/2 − 1))`` as tensor2tensor's ``get_timing_signal_1d``.
    """
    half = d_model // 2
    scales = torch.exp(-math.log(1e4) * torch.arange(half) / max(half - 1, 1))
    angles = torch.arange(length, dtype=torch.float32)[:, None] * scales[None]
    signal = torch.cat([angles.sin(), angles.cos()], dim=1)
    return F.pad(signal, (0, d_model % 2))


@dataclass
class ACTResult:
    """What :func:`adaptive_computation_time` returns.

    Attributes:
        output: ``[batch, pos, d_model]`` the halting-weighted state (``prev``).
        n_updates: ``[batch, pos]`` n, the number of steps that counted.
        remainders: ``[batch, pos]`` rem.
        halting_probability: ``[batch, pos]`` hp at the end (1 for halted positions).
        weights: ``[steps, batch, pos]`` w_t of every step taken.
        steps: number of loop iterations (the largest n).
    """

    output: Tensor
    n_updates: Tensor
    remainders: Tensor
    halting_probability: Tensor
    weights: Tensor
    steps: int

    def ponder_cost(self) -> Tensor:
        """``mean(n + rem)`` over batch and positions (multiply by ``act_loss_weight``)."""
        return (self.n_updates + self.remainders).mean()


def adaptive_computation_time(
    state: Tensor,
    transform: Callable[[Tensor, int], Tensor],
    halting: Callable[[Tensor], Tensor],
    *,
    max_steps: int,
    epsilon: float = 0.01,
    signal: Callable[[Tensor, int], Tensor] | None = None,
    force_halt_at_max: bool = False,
    accumulated: bool = False,
) -> ACTResult:
    """tensor2tensor's ACT loop (see the module docstring) around any step function.

    Args:
        state: ``[batch, pos, d_model]`` the initial state.
        transform: ``(state, step) -> new state`` (the shared block).
        halting: ``state -> p`` ``[batch, pos]`` in [0, 1].
        max_steps: T >= 1.
        epsilon: thr = 1 − epsilon, in (0, 1).
        signal: ``(state, step) -> state`` applied before halting (timing signals); identity if
            None.
        force_halt_at_max: give still-running positions their remainder at step T.
        accumulated: ``prev += transformed·w`` instead of the interpolation.
    Returns:
        :class:`ACTResult`.
    Raises:
        ValueError: if ``max_steps < 1`` or ``epsilon`` is not in (0, 1).
    References:
        Dehghani et al. (2019), arXiv 1807.03819; tensor2tensor ``universal_transformer_act``.
    """
    if max_steps < 1:
        raise ValueError(f"max_steps must be >= 1 (got max_steps={max_steps})")
    if not 0 < epsilon < 1:
        raise ValueError(f"epsilon must be in (0, 1) (got epsilon={epsilon})")
    thr = 1.0 - epsilon
    shape = state.shape[:2]
    hp = state.new_zeros(shape)
    rem = state.new_zeros(shape)
    n = state.new_zeros(shape)
    prev = torch.zeros_like(state)
    weights = []
    step = 0
    while bool(((hp < thr) & (n < max_steps)).any()):
        if signal is not None:
            state = signal(state, step)
        p = halting(state)
        running = (hp < 1.0).to(state.dtype)
        last = (n + 1 >= max_steps) if force_halt_at_max else torch.zeros_like(hp, dtype=torch.bool)
        over = (hp + p * running > thr) | last
        new_halted = over.to(state.dtype) * running
        running = (~over).to(state.dtype) * running
        hp = hp + p * running
        rem = rem + new_halted * (1.0 - hp)
        hp = hp + new_halted * rem
        n = n + running + new_halted
        w = p * running + new_halted * rem
        transformed = transform(state, step)
        if accumulated:
            prev = prev + transformed * w[..., None]
        else:
            prev = transformed * w[..., None] + prev * (1.0 - w[..., None])
        state = transformed
        weights.append(w)
        step += 1
    return ACTResult(prev, n, rem, hp, torch.stack(weights), step)
