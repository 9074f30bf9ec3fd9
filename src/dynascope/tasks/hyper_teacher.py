"""Modular hypernetwork teacher: tasks combine a few shared weight modules through a latent code.

Glossary (S3 variant, arXiv 2407.12275 App. C.1):
    M:          number of modules (``n_modules``, 6).
    d_x:        input width (16); ``x ~ U(-sqrt 3, sqrt 3)^d_x`` (zero mean, unit variance).
    d_hidden:   teacher hidden width h (16).
    theta:      ``[M, d_hidden, d_x]`` modules, entries TruncNormal(0, 1/sqrt M) cut at +-2 std.
    a:          ``[d_hidden]`` readout, TruncNormal(0, 1/sqrt h) cut at +-2 std.
    z:          ``[M]`` latent code; ``W(z) = sum_m z_m theta_m``, ``W <- W / ||W||_2`` (operator
                norm), ``y = a^T GELU(W(z) x)`` (scalar, o = 1).
    mask:       ``{0, 1}^M`` support of z. Alg. 1: ``e ~ Exp(1)^M``, ``e <- e * mask``,
                ``e <- e / ||e||_1``, ``z = 0.5 (e + mask)``: non-zero entries in [0.5, 1], so
                distinct masks give disjoint z.
    supports:   named sets of training masks (Table 1), all 2-hot, as strings of M bits:
                ``connected`` (ring), ``disconnected`` (two triangles), ``connected+`` (ring +
                distance-2 pairs, the default); ``ood``: the opposite pairs 100100, 010010,
                001001, unseen under all three.
    N:          context pairs per sequence (``n_context``, default 32).
    unstructured control: each sequence gets a freshly drawn teacher (its own modules and
                readout) and z from a random 2-hot mask: no modules shared across tasks.

Sequences: ``context`` ``[batch, N, d_x + 1]`` pairs ``(x_i, y_i)``; ``x_query`` ``[batch, d_x]``;
``y_query`` ``[batch]``; ``z`` ``[batch, M]``. Models assemble their own query token: the
vanilla transformer appends ``(x_query, 0)``, the hypernetwork transformer ``(0, 0)``.

Extending to the S5 variant (arXiv 2312.15001): add a support to :data:`SUPPORTS` (one-hots +
ring, random holdout, non-compositional) and a target head; masks, Alg. 1 and the teacher
draw are shared.

References:
    Kobayashi, Schug, Akram, Redhardt, von Oswald, Pascanu, Lajoie, Sacramento (2024), "When can
    transformers compositionally generalize in-context?", arXiv 2407.12275, App. C.1, Alg. 1,
    Table 1.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["SUPPORTS", "HyperTeacher", "latents_from_masks", "masks_of"]

SUPPORTS: dict[str, tuple[str, ...]] = {
    "connected": ("110000", "011000", "001100", "000110", "000011", "100001"),
    "disconnected": ("110000", "011000", "101000", "000110", "000011", "000101"),
    "connected+": (
        "110000",
        "011000",
        "001100",
        "000110",
        "000011",
        "100001",
        "101000",
        "010100",
        "001010",
        "000101",
        "100010",
        "010001",
    ),
    "ood": ("100100", "010010", "001001"),
}
HYPER_SPLITS = ("train", "ood", "unstructured")


def masks_of(support: str) -> Tensor:
    """The masks of a named support, ``[n_masks, M]`` float 0/1.

    Raises:
        ValueError: for an unknown support name.
    """
    if support not in SUPPORTS:
        raise ValueError(f"support must be one of {tuple(SUPPORTS)} (got support={support!r})")
    return torch.tensor([[float(c) for c in m] for m in SUPPORTS[support]])


def latents_from_masks(masks: Tensor, generator: torch.Generator) -> Tensor:
    """Alg. 1: ``z = 0.5 (e ⊙ m / ||e ⊙ m||_1 + m)``, ``e ~ Exp(1)``, one z per mask row.

    Args:
        masks: ``[batch, M]`` 0/1, each row with at least one 1.
        generator: randomness; ``z`` lives on ``masks.device``.
    Returns:
        ``[batch, M]``; entries 0 off the mask, in [0.5, 1] on it.
    Raises:
        ValueError: if a mask row is all zero.
    """
    if (masks.sum(-1) == 0).any():
        raise ValueError("masks: every row needs at least one active module")
    u = torch.rand(masks.shape, generator=generator, device=masks.device)
    e = -torch.log1p(-u) * masks  # Exp(1) by inversion
    e = e / e.sum(-1, keepdim=True)
    return 0.5 * (e + masks)


def _trunc_normal(shape: tuple[int, ...], std: float, generator: torch.Generator) -> Tensor:
    out = torch.empty(shape, device=generator.device)
    return torch.nn.init.trunc_normal_(out, 0.0, std, -2 * std, 2 * std, generator=generator)


class HyperTeacher:
    """S3 linear-hypernetwork teacher with named training supports (see the module glossary).

    Args:
        n_modules: M (the named supports need M = 6).
        d_x: input width.
        d_hidden: teacher hidden width.
        n_context: N context pairs per sequence.
        support: training support name (``"connected+"`` default).
        teacher_seed: seed of the teacher's modules and readout (drawn once, on CPU).
    Raises:
        ValueError: for non-positive sizes, an unknown support, or masks whose width is not M.
    References:
        Kobayashi et al. (2024), arXiv 2407.12275, App. C.1.
    """

    def __init__(
        self,
        n_modules: int = 6,
        d_x: int = 16,
        d_hidden: int = 16,
        n_context: int = 32,
        *,
        support: str = "connected+",
        teacher_seed: int = 0,
    ) -> None:
        for name, value in (
            ("n_modules", n_modules),
            ("d_x", d_x),
            ("d_hidden", d_hidden),
            ("n_context", n_context),
        ):
            if value < 1:
                raise ValueError(f"{name} must be >= 1 (got {name}={value})")
        self.train_masks = masks_of(support)
        if self.train_masks.shape[1] != n_modules:
            raise ValueError(
                f"support {support!r} has masks of width {self.train_masks.shape[1]}, "
                f"not n_modules={n_modules}"
            )
        self.n_modules, self.d_x, self.d_hidden, self.n_context = (
            n_modules,
            d_x,
            d_hidden,
            n_context,
        )
        self.support = support
        self.ood_masks = masks_of("ood")
        g = torch.Generator().manual_seed(teacher_seed)
        self.theta = _trunc_normal((n_modules, d_hidden, d_x), 1 / math.sqrt(n_modules), g)
        self.a = _trunc_normal((d_hidden,), 1 / math.sqrt(d_hidden), g)

    @staticmethod
    def apply(theta: Tensor, a: Tensor, z: Tensor, x: Tensor) -> Tensor:
        """``y = a^T GELU(W(z) x)``, ``W(z) = sum_m z_m theta_m / ||.||_2``.

        Args:
            theta: ``[M, d_hidden, d_x]`` or per-sequence ``[batch, M, d_hidden, d_x]``.
            a: ``[d_hidden]`` or ``[batch, d_hidden]``.
            z: ``[batch, M]``; x: ``[batch, n, d_x]``.
        Returns:
            ``[batch, n]``.
        """
        eq = "bm,mhd->bhd" if theta.ndim == 3 else "bm,bmhd->bhd"
        W = torch.einsum(eq, z, theta)
        W = W / torch.linalg.matrix_norm(W, ord=2)[:, None, None]
        hidden = F.gelu(torch.einsum("bhd,bnd->bnh", W, x))
        a = a.expand(z.shape[0], -1) if a.ndim == 1 else a
        return torch.einsum("bnh,bh->bn", hidden, a)

    def sample(self, split: str, batch_size: int, generator: torch.Generator) -> dict[str, Tensor]:
        """Draw sequences of one split.

        Args:
            split: ``"train"`` (training support), ``"ood"`` (opposite pairs) or
                ``"unstructured"`` (fresh teacher per sequence, random 2-hot mask).
            batch_size: ``>= 1``.
            generator: all randomness (tensors on ``generator.device``).
        Returns:
            ``context`` ``[batch, N, d_x + 1]``, ``x_query`` ``[batch, d_x]``, ``y_query``
            ``[batch]``, ``z`` ``[batch, M]``, ``mask_index`` ``[batch]`` (row of the split's
            masks; -1 for unstructured).
        Raises:
            ValueError: for an unknown split or ``batch_size < 1``.
        """
        if split not in HYPER_SPLITS:
            raise ValueError(f"split must be one of {HYPER_SPLITS} (got split={split!r})")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1 (got batch_size={batch_size!r})")
        dev = generator.device
        theta, a = self.theta.to(dev), self.a.to(dev)
        if split == "unstructured":
            scores = torch.rand(batch_size, self.n_modules, generator=generator, device=dev)
            top2 = scores.topk(2, dim=-1).indices
            masks = torch.zeros(batch_size, self.n_modules, device=dev).scatter_(1, top2, 1.0)
            index = torch.full((batch_size,), -1, device=dev)
            shape = (batch_size, self.n_modules, self.d_hidden, self.d_x)
            theta = _trunc_normal(shape, 1 / math.sqrt(self.n_modules), generator)
            a = _trunc_normal((batch_size, self.d_hidden), 1 / math.sqrt(self.d_hidden), generator)
        else:
            table = (self.train_masks if split == "train" else self.ood_masks).to(dev)
            index = torch.randint(len(table), (batch_size,), generator=generator, device=dev)
            masks = table[index]
        z = latents_from_masks(masks, generator)
        x = (
            torch.rand(batch_size, self.n_context + 1, self.d_x, generator=generator, device=dev)
            * 2
            - 1
        ) * math.sqrt(3)
        y = self.apply(theta, a, z, x)
        context = torch.cat([x[:, :-1], y[:, :-1, None]], dim=-1)
        return {
            "context": context,
            "x_query": x[:, -1],
            "y_query": y[:, -1],
            "z": z,
            "mask_index": index,
        }
