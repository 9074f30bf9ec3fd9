"""Linear autoencoder with an L-layer linear sub-network at the bottleneck (IRMAE / S15).

Glossary (dimensions and symbols; everything right-multiplies, ``x @ W``):
    batch:      number of samples in a batch.
    d_in:       width of the data ``x`` ``[batch, d_in]`` (32 in S15).
    d_latent:   width of the bottleneck (16 in S15).
    n_stack:    L, the number of bias-free ``d_latent x d_latent`` layers between encoder and
                decoder; ``n_stack = 0`` is a plain two-layer linear autoencoder.
    W_enc:      ``[d_in, d_latent]`` encoder.
    W_stack:    ``[n_stack, d_latent, d_latent]``, layers ``W_1 .. W_L`` applied in order.
    W_dec:      ``[d_latent, d_in]`` decoder.
    z:          latent code, the output of the stack (the decoder's input) ``[batch, d_latent]``.
    P:          end-to-end map ``W_enc @ W_1 @ ... @ W_L @ W_dec`` ``[d_in, d_in]``, so that
                ``x_hat = x @ P``. Papers write ``M = W_dec W_L ... W_1 W_enc = P^T`` (column
                vectors); the singular values are the same.
    s:          ``init_scale``, the singular value of every stack layer at orthogonal init.

Forward::

    h = x @ W_enc
    z = h @ W_1 @ ... @ W_L            # the linear sub-network (IRMAE's "MLP")
    x_hat = z @ W_dec

Initialisation. The encoder and decoder always get PyTorch's ``nn.Linear`` default
(``kaiming_uniform_(a=sqrt(5))`` on the ``[out, in]`` weight, i.e. ``U(-1/sqrt(fan_in),
1/sqrt(fan_in))``), as in IRMAE, whose encoder and decoder are default-initialised networks.
``init`` chooses the stack's initialisation: ``"orthogonal"`` gives ``W_l = s * Q_l`` with
``Q_l`` a Haar-random orthogonal matrix (a balanced stack: every layer's singular values are
``s``), ``"default"`` gives each stack layer the ``nn.Linear`` default (IRMAE's reference code).
All layers are bias-free: S15's data is zero-mean, so ``P`` is then the whole model.

References:
    Sun, Thilak, Littwin, Saremi & Susskind (2021), "Implicit Greedy Rank Learning in
    Autoencoders via Overparameterized Linear Networks", ICML workshop, arXiv 2107.01301.
    Jing, Zbontar & LeCun (2020), "Implicit Rank-Minimizing Autoencoder", NeurIPS,
    arXiv 2010.00679 (reference code facebookresearch/irmae, ``model.py``).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor, nn

__all__ = ["LinearAutoencoder", "StackInit", "depth_lr"]

StackInit = Literal["orthogonal", "default"]
_INITS = ("orthogonal", "default")


def _check_positive_int(name: str, value: int, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum} (got {name}={value!r})")


def _linear_default(
    d_from: int, d_to: int, generator: torch.Generator | None, dtype: torch.dtype
) -> Tensor:
    """``[d_from, d_to]``: the transpose of an ``nn.Linear(d_from, d_to)`` default weight."""
    weight = torch.empty(d_to, d_from, dtype=dtype)  # nn.Linear layout [out, in]
    nn.init.kaiming_uniform_(weight, a=math.sqrt(5), generator=generator)
    return weight.T.contiguous()


def depth_lr(
    lr: float, n_stack: int, init_scale: float = 1.0, lr_max: float | None = None
) -> float:
    """Depth-adjusted GD step ``eta_L = eta_0 / (L * s^(2(L-1)))``, capped at ``lr_max``.

    For a balanced stack each mode of the end-to-end map follows, under gradient flow,
    ``d sigma_i / dt ~ eta L sigma_i^(2 - 2/L) (lambda_i - sigma_i)``; at init the stack
    contributes a factor ``L s^(2(L-1))``, which this rule cancels. For ``s < 1`` the factor
    only holds at init (the effective step grows as the modes grow), hence the cap. ``L = 0``
    (no stack) keeps ``eta_0``.

    Args:
        lr: base step ``eta_0`` (> 0).
        n_stack: L, the number of stack layers (>= 0).
        init_scale: s, the stack layers' singular value at init (> 0).
        lr_max: upper bound on the returned step; ``None`` for no cap.
    Returns:
        The step ``eta_L``.
    Raises:
        ValueError: if ``lr`` or ``init_scale`` is not a finite number > 0, ``n_stack < 0``, or
            ``lr_max`` is given and not > 0.
    References:
        Sun et al. (2021), arXiv 2107.01301 (depth-aware learning-rate adjustment; the exact
        rule is not stated in the paper, this is S15's proposal).
    """
    for name, value in (("lr", lr), ("init_scale", init_scale)):
        if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a finite number > 0 (got {name}={value!r})")
    _check_positive_int("n_stack", n_stack, minimum=0)
    if lr_max is not None and not lr_max > 0:
        raise ValueError(f"lr_max must be > 0 or None (got lr_max={lr_max!r})")
    eta = lr if n_stack == 0 else lr / (n_stack * init_scale ** (2 * (n_stack - 1)))
    return eta if lr_max is None else min(eta, lr_max)


class LinearAutoencoder(nn.Module):
    """``x_hat = x @ W_enc @ W_1 @ ... @ W_L @ W_dec`` (see the module glossary).

    Args:
        d_in: data width (>= 1).
        d_latent: bottleneck width (>= 1).
        n_stack: L, stack layers between encoder and decoder (>= 0).
        init: ``"orthogonal"`` (``W_l = s Q_l``) or ``"default"`` (``nn.Linear`` init) for the
            stack; the encoder and decoder always get the ``nn.Linear`` default.
        init_scale: s, each orthogonal stack layer's singular value (> 0); unused for
            ``init="default"``.
        generator: source of the initial weights (drawn in the order encoder, decoder, stack,
            so runs that share a seed share their encoder and decoder whatever ``n_stack``).
        dtype: parameter dtype.
    Raises:
        ValueError: for a size below its minimum, an unknown ``init``, or ``init_scale`` not a
            finite number > 0.
    References:
        Sun et al. (2021), arXiv 2107.01301; Jing et al. (2020), arXiv 2010.00679.
    """

    def __init__(
        self,
        *,
        d_in: int = 32,
        d_latent: int = 16,
        n_stack: int = 0,
        init: StackInit = "orthogonal",
        init_scale: float = 1.0,
        generator: torch.Generator | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        _check_positive_int("d_in", d_in, minimum=1)
        _check_positive_int("d_latent", d_latent, minimum=1)
        _check_positive_int("n_stack", n_stack, minimum=0)
        if init not in _INITS:
            raise ValueError(f"init must be one of {', '.join(_INITS)} (got {init!r})")
        if not (isinstance(init_scale, int | float) and math.isfinite(init_scale)) or not (
            init_scale > 0
        ):
            raise ValueError(f"init_scale must be a finite number > 0 (got {init_scale!r})")
        self.d_in, self.d_latent, self.n_stack = d_in, d_latent, n_stack
        self.init, self.init_scale = init, float(init_scale)
        self.W_enc = nn.Parameter(_linear_default(d_in, d_latent, generator, dtype))
        self.W_dec = nn.Parameter(_linear_default(d_latent, d_in, generator, dtype))
        layers = []
        for _ in range(n_stack):
            if init == "orthogonal":
                q = torch.empty(d_latent, d_latent, dtype=dtype)
                nn.init.orthogonal_(q, generator=generator)
                layers.append(self.init_scale * q)
            else:
                layers.append(_linear_default(d_latent, d_latent, generator, dtype))
        stack = torch.stack(layers) if layers else torch.empty(0, d_latent, d_latent, dtype=dtype)
        self.W_stack = nn.Parameter(stack)  # [n_stack, d_latent, d_latent]

    def encode(self, x: Tensor) -> Tensor:
        """Latent code ``z = x @ W_enc @ W_1 @ ... @ W_L``: ``[..., d_in] -> [..., d_latent]``."""
        z = x @ self.W_enc
        for layer in self.W_stack:
            z = z @ layer
        return z

    def decode(self, z: Tensor) -> Tensor:
        """``z @ W_dec``: ``[..., d_latent] -> [..., d_in]``."""
        return z @ self.W_dec

    def forward(self, x: Tensor) -> Tensor:
        """Reconstruction ``x_hat`` ``[..., d_in]`` of ``x`` ``[..., d_in]``."""
        return self.decode(self.encode(x))

    def stack_product(self) -> Tensor:
        """``W_1 @ ... @ W_L`` ``[d_latent, d_latent]`` (the identity when ``n_stack = 0``)."""
        out = torch.eye(self.d_latent, dtype=self.W_enc.dtype, device=self.W_enc.device)
        for layer in self.W_stack:
            out = out @ layer
        return out

    def end_to_end(self) -> Tensor:
        """``P = W_enc @ W_1 @ ... @ W_L @ W_dec`` ``[d_in, d_in]``: ``x_hat = x @ P``."""
        return self.W_enc @ self.stack_product() @ self.W_dec

    def extra_repr(self) -> str:
        return (
            f"d_in={self.d_in}, d_latent={self.d_latent}, n_stack={self.n_stack}, "
            f"init={self.init!r}, init_scale={self.init_scale:g}"
        )
