"""Permutation symmetries of a :class:`dynascope.nn.Transformer`, and their matching.

Glossary (TransformerLens layout, see :mod:`dynascope.nn.transformer`):
    residual r:  ``int64 [d_model]``, one permutation of the residual stream shared by every
                 read and write of it: ``W_E``/``W_in`` and ``W_pos`` columns, LayerNorm gains
                 and biases (LayerNorm is equivariant to a stream permutation only with them
                 permuted too: its mean and variance are permutation-invariant), the
                 ``d_model`` axis of ``W_Q, W_K, W_V`` (rows) and ``W_O`` (columns), ``b_O``,
                 the MLP's ``W_in`` rows, ``W_out`` columns and ``b_out``, and ``W_U`` rows.
    heads[l]:    ``int64 [n_heads]``: head ``heads[l][g]`` of net b lands at head ``g``.
    qk[l]:       ``int64 [n_heads, d_head]``: within the head landing at ``g``, query/key unit
                 ``qk[l][g, j]`` lands at ``j`` (shared by ``W_Q``, ``W_K``, ``b_Q``, ``b_K``:
                 the scores ``q . k`` sum over it).
    ov[l]:       ``int64 [n_heads, d_head]``: the same for value units (``W_V``, ``b_V`` and
                 ``W_O``'s rows: ``z @ W_O`` sums over it).
    mlp[l]:      ``int64 [d_mlp]`` hidden units of block ``l``'s MLP (``None``: attention-only).

Applying ``P`` to net b (``perm[j]`` is the unit of b that lands at ``j``, as the chains)::

    W_E <- W_E[:, r]   W_pos <- W_pos[:, r]   ln.weight <- ln.weight[r]   ln.bias <- ln.bias[r]
    W_Q[g, i, j] <- W_Q[heads[g], r[i], qk[g, j]]      (W_K, b_Q, b_K alike)
    W_V[g, i, j] <- W_V[heads[g], r[i], ov[g, j]]      W_O[g, j, i] <- W_O[heads[g], ov[g, j], r[i]]
    mlp.W_in <- W_in[r][:, m]   b_in <- b_in[m]   W_out <- W_out[m][:, r]   b_out, b_O <- [r]
    W_U <- W_U[r]

leaves the function unchanged (softmax and linear attention; elementwise MLP activation).

Matching b to a: :mod:`._transformer_matching`.

References:
    Ainsworth, Hayase, Srinivasa (2023), "Git Re-Basin", ICLR, arXiv 2209.04836, Sec. 3.2 and
    App. (transformer permutation specification).
    Verma, Elbayad (2024), "Merging Text Transformer Models from Different Initializations",
    arXiv 2403.00986, Sec. 3 (residual, multi-head and per-head permutations).
    Benzing et al. (2022), arXiv 2209.07509, Sec. 2 (activation matching).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dynascope.nn.transformer import Transformer

from ._assignment import invert_permutation
from ._permutation_chain import check_same_function, probe_batch

_ATTENTION = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")
_MLP = ("W_in", "b_in", "W_out", "b_out")
_ACTIVATIONS = {"gelu": F.gelu, "relu": F.relu}  # the MLP's (unit-wise) activations


@dataclass(frozen=True, eq=False)
class TransformerPermutation:
    """A symmetry of a :class:`dynascope.nn.Transformer` (module glossary for each field).

    Attributes:
        residual: ``[d_model]``.
        heads: per block ``[n_heads]``.
        qk: per block ``[n_heads, d_head]``.
        ov: per block ``[n_heads, d_head]``.
        mlp: per block ``[d_mlp]``, or ``None`` for an attention-only block.
        probe: inputs the matching read (``apply_permutation`` checks the copy on them).
    """

    residual: Tensor
    heads: tuple[Tensor, ...]
    qk: tuple[Tensor, ...]
    ov: tuple[Tensor, ...]
    mlp: tuple[Tensor | None, ...]
    probe: Tensor | None = None

    @classmethod
    def identity(cls, model: nn.Module) -> TransformerPermutation:
        """The permutation that moves nothing, sized for ``model``."""
        blocks = _layout(model)
        n_heads, d_head = blocks[0].attn.n_heads, blocks[0].attn.d_head
        return cls(
            residual=torch.arange(model.d_model),
            heads=tuple(torch.arange(n_heads) for _ in blocks),
            qk=tuple(torch.arange(d_head).repeat(n_heads, 1) for _ in blocks),
            ov=tuple(torch.arange(d_head).repeat(n_heads, 1) for _ in blocks),
            mlp=tuple(None if b.mlp is None else torch.arange(b.mlp.d_mlp) for b in blocks),
        )

    @classmethod
    def random(cls, model: nn.Module, generator: torch.Generator) -> TransformerPermutation:
        """Every group drawn uniformly from ``generator`` (tests, null models)."""
        ident = cls.identity(model)

        def draw(p: Tensor) -> Tensor:
            return torch.stack([torch.randperm(p.shape[-1], generator=generator) for _ in p])

        return cls(
            residual=torch.randperm(len(ident.residual), generator=generator),
            heads=tuple(torch.randperm(len(h), generator=generator) for h in ident.heads),
            qk=tuple(draw(q) for q in ident.qk),
            ov=tuple(draw(o) for o in ident.ov),
            mlp=tuple(
                None if m is None else torch.randperm(len(m), generator=generator)
                for m in ident.mlp
            ),
        )

    def then(self, other: TransformerPermutation) -> TransformerPermutation:
        """``other`` applied after ``self``: ``apply(apply(b, self), other) == apply(b,
        self.then(other))``."""
        heads = tuple(h[o] for h, o in zip(self.heads, other.heads))
        qk = tuple(q[oh].gather(1, oq) for q, oh, oq in zip(self.qk, other.heads, other.qk))
        ov = tuple(v[oh].gather(1, ov) for v, oh, ov in zip(self.ov, other.heads, other.ov))
        mlp = tuple(None if m is None else m[o] for m, o in zip(self.mlp, other.mlp))
        return TransformerPermutation(self.residual[other.residual], heads, qk, ov, mlp)

    def inverse(self) -> TransformerPermutation:
        """``P^-1``: ``apply(apply(b, P), P.inverse())`` is ``b``."""
        heads = tuple(invert_permutation(h) for h in self.heads)
        qk = tuple(
            torch.stack([invert_permutation(p) for p in q[hi]]) for q, hi in zip(self.qk, heads)
        )
        ov = tuple(
            torch.stack([invert_permutation(p) for p in v[hi]]) for v, hi in zip(self.ov, heads)
        )
        mlp = tuple(None if m is None else invert_permutation(m) for m in self.mlp)
        return TransformerPermutation(invert_permutation(self.residual), heads, qk, ov, mlp)

    def equals(self, other: TransformerPermutation) -> bool:
        """Every group equal (``probe`` ignored)."""
        pairs = [(self.residual, other.residual)]
        pairs += list(zip(self.heads + self.qk + self.ov, other.heads + other.qk + other.ov))
        same_mlp = all(
            (m is None and n is None) or (m is not None and n is not None and torch.equal(m, n))
            for m, n in zip(self.mlp, other.mlp)
        )
        return same_mlp and all(torch.equal(p, q) for p, q in pairs)


def _layout(model: nn.Module) -> list[nn.Module]:
    """The blocks of a supported Transformer; raises a one-line error otherwise."""
    if not isinstance(model, Transformer):
        raise ValueError(f"model must be a dynascope.nn.Transformer (got {type(model).__name__})")
    expected = {"W_E", "W_in", "W_pos", "W_U", "b_U", "ln_final.weight", "ln_final.bias"}
    for i, block in enumerate(model.blocks):
        attn = block.attn
        if attn.attention not in ("softmax", "linear") or attn.relative_position is not None:
            raise ValueError(
                f"blocks.{i}.attn: attention must be 'softmax' or 'linear' without relative "
                f"positions (got attention={attn.attention!r})"
            )
        if block.mlp is not None and block.mlp.activation not in _ACTIVATIONS:
            raise ValueError(f"blocks.{i}.mlp: activation {block.mlp.activation!r} unsupported")
        expected |= {f"blocks.{i}.attn.{n}" for n in _ATTENTION}
        expected |= {f"blocks.{i}.mlp.{n}" for n in _MLP}
        expected |= {f"blocks.{i}.{ln}.{n}" for ln in ("ln1", "ln2") for n in ("weight", "bias")}
    for name, _ in model.named_parameters():
        if name not in expected:
            raise ValueError(
                f"parameter {name!r} is not part of the Transformer layout permutations know "
                "(a reparametrisation such as sigma_reparam is not supported)"
            )
    if any(True for _ in model.buffers()):
        raise ValueError("model must hold no buffers (got at least one)")
    return list(model.blocks)


def _check_group(name: str, perm: object, shape: tuple[int, ...]) -> Tensor:
    p = torch.as_tensor(perm).to(device="cpu", dtype=torch.int64)
    ok = tuple(p.shape) == shape and torch.equal(
        p.sort(-1).values, torch.arange(shape[-1]).expand(shape)
    )
    if not ok:
        raise ValueError(
            f"{name} must be {'rows of ' if len(shape) > 1 else ''}a permutation of "
            f"range({shape[-1]}) with shape {shape} (got shape {tuple(p.shape)})"
        )
    return p


def check_transformer_permutation(
    model: nn.Module, perm: TransformerPermutation
) -> TransformerPermutation:
    """``perm`` validated against ``model``'s sizes, as int64 CPU tensors.

    Raises:
        ValueError: if the model's layout is unsupported or a group has the wrong size or is
            not a permutation (the message names the group, e.g. ``perm.qk[1]``).
    """
    blocks = _layout(model)
    n = len(blocks)
    for field in ("heads", "qk", "ov", "mlp"):
        count = len(getattr(perm, field))
        if count != n:
            raise ValueError(f"perm.{field} must hold one entry per block ({n}) (got {count})")
    heads, qk, ov, mlp = [], [], [], []
    for i, block in enumerate(blocks):
        h, d = block.attn.n_heads, block.attn.d_head
        heads.append(_check_group(f"perm.heads[{i}]", perm.heads[i], (h,)))
        qk.append(_check_group(f"perm.qk[{i}]", perm.qk[i], (h, d)))
        ov.append(_check_group(f"perm.ov[{i}]", perm.ov[i], (h, d)))
        if (block.mlp is None) != (perm.mlp[i] is None):
            raise ValueError(
                f"perm.mlp[{i}] must be None exactly for an attention-only block "
                f"(block has {'no ' if block.mlp is None else ''}MLP)"
            )
        mlp.append(
            None
            if block.mlp is None
            else _check_group(f"perm.mlp[{i}]", perm.mlp[i], (block.mlp.d_mlp,))
        )
    residual = _check_group("perm.residual", perm.residual, (model.d_model,))
    return TransformerPermutation(
        residual, tuple(heads), tuple(qk), tuple(ov), tuple(mlp), perm.probe
    )


def _per_head(w: Tensor, heads: Tensor, inner: Tensor, axis: int) -> Tensor:
    """``w[heads]`` with its ``d_head`` axis ``axis`` permuted per head by ``inner``
    ``[n_heads, d_head]``."""
    w = w[heads.to(w.device)]
    shape = [1] * w.ndim
    shape[0], shape[axis] = w.shape[0], w.shape[axis]
    return w.gather(axis, inner.to(w.device).reshape(shape).expand(w.shape))


def permute_transformer_state(
    state: dict[str, Tensor], perm: TransformerPermutation
) -> dict[str, Tensor]:
    """``state`` (a Transformer's named parameters) permuted by ``perm`` (module glossary).

    Pure: new tensors, ``state`` unchanged. ``perm`` is trusted (see
    :func:`check_transformer_permutation`).
    """
    return {name: _permute_one(name, w, perm).clone() for name, w in state.items()}


def _permute_one(name: str, w: Tensor, perm: TransformerPermutation) -> Tensor:
    r = perm.residual.to(w.device)
    parts = name.split(".")
    leaf = parts[-1]
    if name in ("W_E", "W_in", "W_pos"):
        return w[:, r]
    if name == "W_U" or (len(parts) > 1 and parts[-2].startswith("ln")):
        return w[r]
    if parts[0] != "blocks":
        return w  # b_U
    i = int(parts[1])
    if parts[2] == "mlp":
        m = perm.mlp[i].to(w.device)
        if leaf == "W_in":
            return w[r][:, m]
        if leaf == "W_out":
            return w[m][:, r]
        return w[m] if leaf == "b_in" else w[r]  # b_out
    h = perm.heads[i]
    inner = perm.qk[i] if leaf in ("W_Q", "W_K", "b_Q", "b_K") else perm.ov[i]
    if leaf in ("W_Q", "W_K", "W_V"):
        return _per_head(w[:, r], h, inner, 2)
    if leaf == "W_O":
        return _per_head(w[:, :, r], h, inner, 1)
    if leaf == "b_O":
        return w[r]
    return _per_head(w, h, inner, 1)  # b_Q, b_K, b_V: [n_heads, d_head]


def apply_transformer_permutation(
    model: nn.Module, perm: TransformerPermutation, x: Tensor | None = None
) -> nn.Module:
    """A deep copy of ``model`` permuted by ``perm``, checked to compute the same function on
    the probe batch (``x``, else ``perm.probe``).

    Raises:
        ValueError: as :func:`check_transformer_permutation`,
            :func:`dynascope.probes.permutation.check_same_function`, or if there is no probe.
    """
    x = probe_batch(perm, x)
    perm = check_transformer_permutation(model, perm)
    state = permute_transformer_state(dict(model.named_parameters()), perm)
    new = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in new.named_parameters():
            p.copy_(state[name])
    check_same_function(model, new, x)
    return new


__all__: Sequence[str] = [
    "TransformerPermutation",
    "apply_transformer_permutation",
    "check_transformer_permutation",
    "permute_transformer_state",
]
