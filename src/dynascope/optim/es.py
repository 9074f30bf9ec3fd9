"""Evolution strategies: OpenAI-ES (antithetic) and PGPE, vectorized over the population.

Glossary:
    theta     the centre: a dict ``name -> Tensor`` (a model's parameters, updated in place).
    P         ``population``, number of perturbed members per generation (even when antithetic).
    h         ``P / 2``, number of antithetic pairs ``theta + e_k``, ``theta - e_k``.
    sigma     perturbation scale: a float (OpenAI-ES) or a per-parameter tensor (PGPE).
    eps_k     standard-normal noise, one tensor per parameter, ``[P or h, *shape]``.
    L         the objective to minimise: batched params ``{name: [P, *shape]}`` -> ``[P]``.

A population is a dict of stacked parameter tensors ``[P, *shape]``; ``vectorize`` turns a
single-member objective ``f(params) -> scalar`` (usually ``functional_call(model, params, x)``
followed by a loss) into a population objective with ``torch.func.vmap``, so P members run as
one batched forward pass. Any model and any scalar objective work, differentiable or not
(argmax, rollouts). ``worst_case`` builds the q = inf objective ``max_i mean_j L_ij`` against an
exact adversary: the member's loss is computed on every candidate input (enumerated, not
sampled) and the worst is kept.

OpenAI-ES (Salimans et al. 2017) estimates the gradient of the smoothed loss
``E_eps L(theta + sigma eps)``; with antithetic pairs::

    g = (1 / (2 sigma h)) sum_k (L(theta + sigma eps_k) - L(theta - sigma eps_k)) eps_k

(without pairs: ``g = (1/(sigma P)) sum_k (L_k - mean L) eps_k``). With
``fitness_shaping="centered_ranks"`` the losses are first replaced by their ranks scaled to
[-0.5, 0.5] (invariant to monotone transforms; the estimate is then a direction, not a
gradient). ``g`` is handed to a torch optimizer (Adam or SGD) as the centre's ``.grad``.

PGPE (Sehnke et al. 2010) keeps a per-parameter std ``sigma`` and samples ``e_k ~ N(0, sigma^2)``
in symmetric pairs. With fitness ``f = -L`` (shaped), baseline ``b = mean f``::

    grad_theta = (1/h) sum_k e_k (f+_k - f-_k) / 2                      (ascent direction)
    grad_sigma = (1/h) sum_k ((f+_k + f-_k)/2 - b) (e_k^2 - sigma^2) / sigma

The centre follows ``-grad_theta`` with its optimizer (learning rate ``center_lr``); the std
takes an ascent step ``sigma += std_lr * grad_sigma``, clipped to a relative change of at most
``max_std_change`` per generation (as evotorch's ``stdev_max_change``) and to ``>= min_std``.

References:
    Salimans, Ho, Chen, Sidor, Sutskever (2017), "Evolution Strategies as a Scalable
        Alternative to Reinforcement Learning", arXiv 1703.03864, Algorithm 1, sec. 2.2
        (antithetic sampling, centered ranks).
    Sehnke, Osendorfer, Rückstieß, Graves, Peters, Schmidhuber (2010), "Parameter-exploring
        policy gradients", Neural Networks 23(4), sec. 2.3-2.4 (symmetric sampling).
    von Oswald et al. (2025), "Learning Randomized Algorithms with Transformers", ICLR,
        arXiv 2408.10818, sec. 5 (PGPE on the grid world against an exact adversary).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Literal

import torch
from torch import Tensor, nn
from torch.func import vmap

__all__ = ["OpenAIES", "PGPE", "centered_ranks", "vectorize", "worst_case"]

ParamDict = dict[str, Tensor]
Shaping = Literal["centered_ranks", "none"]
_SHAPINGS = ("centered_ranks", "none")
_OPTIMIZERS = ("adam", "sgd")


def vectorize(
    objective: Callable[[ParamDict], Tensor], *, chunk_size: int | None = None
) -> Callable[[ParamDict], Tensor]:
    """Population objective ``{name: [P, *shape]} -> [P]`` from ``objective(params) -> scalar``.

    Args:
        objective: loss of one member; typically ``loss(functional_call(model, params, x))``.
            It must not branch on tensor values (it runs under ``torch.func.vmap``).
        chunk_size: members evaluated per vmap chunk (``None``: all at once) to bound memory.
    Returns:
        A function mapping a stacked population to its losses ``[P]``.
    """
    return vmap(objective, chunk_size=chunk_size)


def worst_case(per_input_losses: Callable[[ParamDict], Tensor]) -> Callable[[ParamDict], Tensor]:
    """The q = inf objective ``max_i mean_j L_ij`` against an exact (enumerating) adversary.

    Args:
        per_input_losses: ``params -> [n_inputs, m_seeds]`` (or ``[n_inputs]``) losses of one
            member on **every** input the adversary may choose.
    Returns:
        ``params -> scalar``, the worst input's seed-averaged loss (equal to
        :func:`dynascope.optim.lq.lq_loss` at ``q = inf``, written without its input checks so
        that it runs under vmap).
    References:
        von Oswald et al. (2025), arXiv 2408.10818, eq. (5) with q = inf.
    """

    def objective(params: ParamDict) -> Tensor:
        losses = per_input_losses(params)
        per_input = losses.mean(dim=-1) if losses.ndim == 2 else losses
        return per_input.max()

    return objective


def centered_ranks(values: Tensor) -> Tensor:
    """Ranks of ``values`` ``[P]`` scaled to [-0.5, 0.5] (ties broken by position).

    Returns:
        ``[P]``: the smallest value maps to -0.5, the largest to 0.5; ``P = 1`` gives 0.
    References:
        Salimans et al. (2017), arXiv 1703.03864, sec. 2.2 (fitness shaping).
    """
    n = values.shape[0]
    ranks = torch.empty_like(values)
    ranks[values.argsort()] = torch.arange(n, dtype=values.dtype, device=values.device)
    return ranks / max(n - 1, 1) - 0.5


def _leaves(params: nn.Module | Mapping[str, Tensor]) -> dict[str, nn.Parameter]:
    if isinstance(params, nn.Module):
        leaves = {k: p for k, p in params.named_parameters() if p.requires_grad}
    else:
        leaves = {
            k: v if isinstance(v, nn.Parameter) else nn.Parameter(v.detach().clone())
            for k, v in params.items()
        }
    if not leaves:
        raise ValueError("params must hold at least one trainable tensor (got none)")
    return leaves


def _check(name: str, value: object, *, integer: bool = False, minimum: float = 0.0) -> None:
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or not value > minimum:
        what = "an int" if integer else "a number"
        raise ValueError(f"{name} must be {what} > {minimum:g} (got {name}={value!r})")


def _optimizer(kind: str, params: list[nn.Parameter], lr: float, weight_decay: float):
    if kind not in _OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {_OPTIMIZERS} (got optimizer={kind!r})")
    if kind == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    return torch.optim.SGD(params, lr=lr, weight_decay=weight_decay)


class _Strategy(ABC):
    """Shared plumbing: centre leaves, optimizer, generator, shaping, ``step``."""

    def __init__(self, params, population, lr, optimizer, weight_decay, shaping, generator, pairs):
        _check("population", population, integer=True)
        if pairs and population % 2:
            raise ValueError(
                f"population must be even with antithetic pairs (got population={population})"
            )
        _check("lr", lr)
        if shaping not in _SHAPINGS:
            raise ValueError(f"fitness_shaping must be one of {_SHAPINGS} (got {shaping!r})")
        self.center = _leaves(params)
        self.population = population
        self.fitness_shaping = shaping
        self.generator = generator
        self.optimizer = _optimizer(optimizer, list(self.center.values()), lr, weight_decay)
        self._noise: ParamDict | None = None

    def _randn(self, shape: tuple[int, ...], like: Tensor) -> Tensor:
        return torch.randn(shape, generator=self.generator, dtype=like.dtype, device=like.device)

    def _shape(self, losses: Tensor) -> Tensor:
        if losses.shape != (self.population,):
            raise ValueError(
                f"losses must have shape [population={self.population}] (got {list(losses.shape)})"
            )
        losses = losses.detach()
        if self.fitness_shaping == "centered_ranks":
            return centered_ranks(losses)
        return losses

    def _apply(self, descent: ParamDict) -> None:
        for name, p in self.center.items():
            p.grad = descent[name].to(p.dtype)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._noise = None

    @abstractmethod
    def ask(self) -> ParamDict:
        """Draw the next population ``{name: [P, *shape]}``."""

    @abstractmethod
    def tell(self, losses: Tensor) -> None:
        """Update from the losses ``[P]`` of the last :meth:`ask`'s population."""

    def step(self, objective: Callable[[ParamDict], Tensor]) -> Tensor:
        """One generation: ``losses = objective(ask())``, then ``tell(losses)``; returns ``[P]``."""
        with torch.no_grad():
            losses = objective(self.ask())
        self.tell(losses)
        return losses


class OpenAIES(_Strategy):
    """OpenAI evolution strategy with a fixed isotropic ``sigma`` and optional antithetic pairs.

    Args:
        params: a module (its trainable parameters are the centre, updated in place) or a dict
            ``name -> Tensor`` (copied into new leaves, see ``center``).
        population: members per generation, even when ``antithetic``.
        sigma: perturbation std (units of the parameters), ``> 0``.
        lr: learning rate of the centre's optimizer, ``> 0``.
        antithetic: sample pairs ``theta +- sigma eps``.
        optimizer: ``"adam"`` (as Salimans et al.) or ``"sgd"``.
        weight_decay: the optimizer's weight decay (L2 coefficient), ``>= 0``.
        fitness_shaping: ``"centered_ranks"`` or ``"none"`` (raw losses: an unbiased gradient
            estimate of the smoothed loss).
        generator: source of the noise (``None``: torch's global generator).
    Raises:
        ValueError: for a non-positive or non-int ``population``, an odd ``population`` with
            ``antithetic``, a non-positive ``sigma`` or ``lr``, an unknown ``optimizer`` or
            ``fitness_shaping``, or ``params`` without trainable tensors.
    References:
        Salimans et al. (2017), arXiv 1703.03864, Algorithm 1 and sec. 2.2.
    """

    def __init__(
        self,
        params: nn.Module | Mapping[str, Tensor],
        *,
        population: int,
        sigma: float,
        lr: float,
        antithetic: bool = True,
        optimizer: Literal["adam", "sgd"] = "adam",
        weight_decay: float = 0.0,
        fitness_shaping: Shaping = "centered_ranks",
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__(
            params, population, lr, optimizer, weight_decay, fitness_shaping, generator, antithetic
        )
        _check("sigma", sigma)
        self.sigma = float(sigma)
        self.antithetic = antithetic

    def ask(self) -> ParamDict:
        """Draw the population: ``{name: [P, *shape]}``, pairs ``theta + s e_k, theta - s e_k``."""
        n = self.population // 2 if self.antithetic else self.population
        self._noise = {k: self._randn((n, *p.shape), p) for k, p in self.center.items()}
        out = {}
        for k, p in self.center.items():
            eps = self._noise[k]
            signed = torch.cat([eps, -eps]) if self.antithetic else eps
            out[k] = p.detach()[None] + self.sigma * signed
        return out

    def gradient(self, losses: Tensor) -> ParamDict:
        """Estimate of the gradient of the (smoothed) loss from the last ``ask``'s ``losses [P]``.

        Raises:
            ValueError: if ``ask`` was not called first, or ``losses`` is not ``[P]``.
        """
        if self._noise is None:
            raise ValueError("ask() must be called before gradient()/tell() (no population drawn)")
        f = self._shape(losses)
        if self.antithetic:
            h = self.population // 2
            weights = (f[:h] - f[h:]) / (2 * self.sigma * h)  # [h]
        else:
            weights = (f - f.mean()) / (self.sigma * self.population)  # [P]
        return {k: torch.tensordot(weights, eps, dims=1) for k, eps in self._noise.items()}

    def tell(self, losses: Tensor) -> None:
        """Update the centre from the losses ``[P]`` of the last ``ask``'s population."""
        self._apply(self.gradient(losses))


class PGPE(_Strategy):
    """Parameter-exploring policy gradients: symmetric sampling, learned per-parameter std.

    Args:
        params: a module or a dict ``name -> Tensor`` (see :class:`OpenAIES`).
        population: members per generation, even (symmetric pairs).
        center_lr: learning rate of the centre's optimizer, ``> 0``.
        std_lr: step size of the std's ascent step, ``> 0``.
        init_std: initial per-parameter std, ``> 0``.
        optimizer: ``"adam"`` or ``"sgd"`` for the centre.
        max_std_change: largest relative change of each std per generation, ``> 0``.
        min_std: floor of the std, ``> 0``.
        fitness_shaping: ``"centered_ranks"`` or ``"none"``.
        generator: source of the noise.
    Raises:
        ValueError: for a bad ``population`` (non-positive, non-int, odd), a non-positive
            ``center_lr``, ``std_lr``, ``init_std``, ``max_std_change`` or ``min_std``, an
            unknown ``optimizer`` or ``fitness_shaping``, or ``params`` without tensors.
    References:
        Sehnke et al. (2010), "Parameter-exploring policy gradients", Neural Networks 23(4),
        sec. 2.3-2.4; von Oswald et al. (2025), arXiv 2408.10818, sec. 5.
    """

    def __init__(
        self,
        params: nn.Module | Mapping[str, Tensor],
        *,
        population: int,
        center_lr: float,
        std_lr: float,
        init_std: float,
        optimizer: Literal["adam", "sgd"] = "adam",
        max_std_change: float = 0.2,
        min_std: float = 1e-6,
        fitness_shaping: Shaping = "centered_ranks",
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__(
            params, population, center_lr, optimizer, 0.0, fitness_shaping, generator, True
        )
        for name, value in (
            ("std_lr", std_lr),
            ("init_std", init_std),
            ("max_std_change", max_std_change),
            ("min_std", min_std),
        ):
            _check(name, value)
        self.std_lr = float(std_lr)
        self.max_std_change = float(max_std_change)
        self.min_std = float(min_std)
        self.std = {k: torch.full_like(p.detach(), float(init_std)) for k, p in self.center.items()}

    def ask(self) -> ParamDict:
        """Draw ``h`` symmetric pairs ``theta + e_k, theta - e_k``, ``e_k ~ N(0, std^2)``."""
        h = self.population // 2
        self._noise = {
            k: self._randn((h, *p.shape), p) * self.std[k][None] for k, p in self.center.items()
        }
        return {
            k: p.detach()[None] + torch.cat([self._noise[k], -self._noise[k]])
            for k, p in self.center.items()
        }

    def tell(self, losses: Tensor) -> None:
        """Update the centre and the std from the losses ``[P]`` of the last ``ask``.

        Raises:
            ValueError: if ``ask`` was not called first, or ``losses`` is not ``[P]``.
        """
        if self._noise is None:
            raise ValueError("ask() must be called before tell() (no population drawn)")
        fitness = -self._shape(losses)
        h = self.population // 2
        plus, minus = fitness[:h], fitness[h:]
        diff = (plus - minus) / 2  # [h]
        excess = (plus + minus) / 2 - fitness.mean()  # [h]
        descent, std_grads = {}, {}
        for k, e in self._noise.items():
            s = self.std[k]
            descent[k] = -torch.tensordot(diff, e, dims=1) / h
            std_grads[k] = torch.tensordot(excess, (e.square() - s.square()[None]), dims=1) / (
                h * s
            )
        for k, g in std_grads.items():
            s = self.std[k]
            new = s + self.std_lr * g
            new = torch.minimum(
                torch.maximum(new, s * (1 - self.max_std_change)), s * (1 + self.max_std_change)
            )
            self.std[k] = new.clamp_min(self.min_std)
        self._apply(descent)
