"""Attention entropy: how spread out each query's attention is, and when it collapses.

Glossary (dimensions and symbols, TransformerLens names):
    batch:      leading dims of a pattern (``*batch``: any number, often one ``[batch]``).
    n_heads:    attention heads; query_pos, key_pos: positions on the two sides of a pattern.
    pattern:    ``A: [*batch, n_heads, query_pos, key_pos]``, row ``A_i`` the distribution of
                query ``i`` over keys (softmax output: non-negative, sums to 1 over valid keys).
    mask:       bool keys-valid mask, broadcastable to the pattern; True = query ``i`` may attend
                to key ``j``. Covers causal masks (``j <= i``) and key padding.
    T_i:        number of valid keys of query ``i`` (``key_pos``, or ``i + 1`` under a causal mask).
    H_i:        ``Ent(A_i) = -sum_j A_ij log A_ij`` over valid keys, in nats, ``0 log 0 = 0``;
                ``0 <= H_i <= log T_i`` (uniform row: ``log T_i``; one-hot row: 0).
    H_i / log T_i: normalised entropy in ``[0, 1]``.

Reductions (S12): per head = mean over batch and valid queries; per layer = mean over heads;
global = mean over layers and heads (equal to the mean over batch x heads x queries, the value the
reference code logs, because every head sees the same valid queries); min over heads.

Undefined cases, chosen here:
    * A query with no valid key (fully masked row) has entropy NaN and normalised entropy NaN;
      reductions skip it. Entries at invalid keys are ignored (they may hold anything, even NaN).
    * A query with exactly one valid key has entropy 0 (defined: its row is one-hot) but
      normalised entropy NaN (``0 / log 1``): a forced one-hot row says nothing about collapse,
      so normalised reductions skip it (e.g. query 0 under a causal mask).

Pure functions are batched over leading dims and do no ``.item()`` or device moves beyond input
validation; :class:`AttentionEntropy` is the thin probe.

References:
    Zhai et al. (2023), "Stabilizing Transformer Training by Preventing Attention Entropy
    Collapse", ICML, arXiv 2303.06296, sec. 3 (attention entropy ``Ent(A_i)``, collapse as
    entropy near 0); reference code apple/ml-sigma-reparam, ``speech/speech_transformer.py``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from dynascope.adapters import attention_views, capture_patterns
from dynascope.probes.base import Probe, ProbeContext, register_probe

from ._entropy import _check_mask
from ._entropy import attention_entropy as attention_entropy
from ._entropy import normalized_attention_entropy as normalized_attention_entropy

__all__ = [
    "COLLAPSE_THRESHOLD_NATS",
    "AttentionEntropy",
    "attention_entropy",
    "entropy_collapsed",
    "head_entropy",
    "normalized_attention_entropy",
]

COLLAPSE_THRESHOLD_NATS = 0.1
"""Default collapse threshold, nats. Entropy bounds the min-entropy from above
(``-log max_j A_ij <= H_i``), so ``H_i < 0.1`` forces the largest weight above ``exp(-0.1) ~
0.905``: the row is nearly one-hot, which is S12's collapse ("entropy near 0")."""


def head_entropy(
    pattern: Tensor,
    mask: Tensor | None = None,
    query_mask: Tensor | None = None,
    *,
    normalized: bool = False,
    eps: float = 0.0,
) -> Tensor:
    """Per-head entropy: mean of :func:`attention_entropy` over batch and valid queries.

    A query counts if ``query_mask`` marks it (all do without one) and its value is defined
    (not NaN: see :func:`attention_entropy` and :func:`normalized_attention_entropy`).

    Args:
        pattern, mask, eps: as :func:`attention_entropy`.
        query_mask: optional bool mask broadcastable to ``[*batch, n_heads, query_pos]``, True =
            the query counts (e.g. padding queries False: ``key_padding_mask[:, None, :]``).
        normalized: average :func:`normalized_attention_entropy` instead of nats.
    Returns:
        ``[n_heads]``: nats, or dimensionless if ``normalized``; NaN for a head with no counted
        query.
    Raises:
        ValueError: as :func:`attention_entropy`; if ``query_mask`` is not bool or not
            broadcastable.
    References:
        Zhai et al. (2023), arXiv 2303.06296; reductions as in apple/ml-sigma-reparam.
    """
    if normalized:
        values = normalized_attention_entropy(pattern, mask, eps=eps)
    else:
        values = attention_entropy(pattern, mask, eps=eps)
    counted = ~values.isnan()
    if query_mask is not None:
        _check_mask(query_mask, values.shape, "query_mask")
        counted = counted & query_mask.to(values.device)
    dims = tuple(range(values.ndim - 2)) + (values.ndim - 1,)  # all but the head dim
    total = torch.where(counted, values, 0.0).sum(dim=dims)
    n = counted.sum(dim=dims)
    return torch.where(n > 0, total / n.clamp(min=1), math.nan)


def entropy_collapsed(entropy: Tensor, threshold: float = COLLAPSE_THRESHOLD_NATS) -> Tensor:
    """Collapse flag ``entropy < threshold``; NaN (undefined) is not collapsed.

    Args:
        entropy: any shape, nats (e.g. :func:`head_entropy`'s ``[n_heads]``).
        threshold: nats, ``>= 0``. The default 0.1 means "nearly one-hot": ``H < 0.1`` forces
            the largest attention weight above ``exp(-0.1) ~ 0.905``. For the S12 study's
            criterion (global entropy ``< 0.2 log T``), pass normalised entropy and 0.2.
    Returns:
        Bool tensor of ``entropy``'s shape.
    Raises:
        ValueError: if ``threshold`` is negative or not finite.
    References:
        Zhai et al. (2023), arXiv 2303.06296 (entropy collapse: entropy near 0).
    """
    if not (math.isfinite(threshold) and threshold >= 0):
        raise ValueError(f"threshold must be finite and >= 0 (got threshold={threshold})")
    return entropy < threshold


def _layer_masks(
    pattern: Tensor, is_causal: bool, key_padding_mask: Tensor | None
) -> tuple[Tensor | None, Tensor | None]:
    """(keys-valid mask ``[batch|1, 1, query_pos, key_pos]``, query mask ``[batch, 1, q]``)."""
    query_pos, key_pos = pattern.shape[-2:]
    mask = None
    if is_causal:  # query i sees keys j <= i + (key_pos - query_pos) (cached keys come first)
        ones = torch.ones(query_pos, key_pos, dtype=torch.bool, device=pattern.device)
        mask = ones.tril(diagonal=key_pos - query_pos)[None, None]
    query_mask = None
    if key_padding_mask is not None:
        keep = key_padding_mask.to(pattern.device)
        mask = keep[:, None, None, :] if mask is None else mask & keep[:, None, None, :]
        if query_pos == key_pos:  # self-attention: padding positions are not real queries
            query_mask = keep[:, None, :]
    return mask, query_mask


@register_probe("attention_entropy")
class AttentionEntropy(Probe):
    """Per-head attention entropy on a held batch, and the count of collapsed heads.

    One forward pass, in eval mode (dropout off), under the probe isolation (no grad; mode and
    RNG restored), with every layer's pattern captured by
    :func:`dynascope.adapters.capture_patterns`. The inputs are held so that every step measures
    the same batch: ``x`` given here, or else ``ctx.batch["x"]`` (and
    ``ctx.batch["key_padding_mask"]`` if present) copied on the first call and reused after.
    They move to the model's device only if they are elsewhere.

    Masks: a layer whose module has ``is_causal`` True (dynascope's attention, Hugging Face's
    GPT-2 and Llama-style layers) gives query ``i`` the keys ``0..i``; ``key_padding_mask``
    (bool ``[batch, pos]``, True = real token, dynascope's convention, passed as
    ``model(x, key_padding_mask=...)``) hides padding keys and drops padding queries from the
    means. A mask the probe cannot see (one passed at call time, e.g. to
    ``torch.nn.MultiheadAttention``) leaves the entropy unchanged, since masked weights are 0,
    but ``entropy_normalized`` then divides by ``log key_pos``. Layer ``l`` is the position in
    :func:`dynascope.adapters.attention_views` (as :class:`~dynascope.probes.QKSpectrum`);
    attention layers without a captured pattern are skipped.

    Keys (entropy in nats, ``entropy_normalized`` = mean of ``H_i / log T_i``):
        ``L{l}.H{h}.attn.entropy``, ``L{l}.H{h}.attn.entropy_normalized`` (if ``per_head``);
        ``L{l}.attn.mean.entropy``, ``L{l}.attn.mean.entropy_normalized`` (mean over heads);
        ``attn.mean.entropy``, ``attn.mean.entropy_normalized`` (over layers and heads);
        ``attn.min.entropy``, ``attn.min.entropy_normalized`` (min over layers and heads);
        ``attn.collapsed_heads``: heads with ``L{l}.H{h}.attn.entropy < collapse_threshold``.
    All values are floats. A layer whose pattern is non-finite at valid keys (a diverging run)
    gives NaN for its keys, and so for the means and mins, instead of raising.

    Args:
        x: held inputs (``model(x)``), or ``None`` to take ``ctx.batch["x"]`` on first use.
        key_padding_mask: held padding mask passed as ``model(x, key_padding_mask=...)``; needs
            ``x``.
        collapse_threshold: nats; default :data:`COLLAPSE_THRESHOLD_NATS` (see
            :func:`entropy_collapsed`).
        per_head: also emit the ``L{l}.H{h}.*`` keys.
        eps: as :func:`attention_entropy` (``1e-6`` reproduces the reference code).
    Raises:
        ValueError: (construction) if ``collapse_threshold`` or ``eps`` is negative or not
            finite, or ``key_padding_mask`` is given without ``x``. (call) if no inputs are held
            and ``ctx.batch`` has no ``"x"``; if a captured layer has no attention view; if a
            layer is not softmax attention (``kind`` other than ``"softmax"``); as
            :func:`attention_entropy` for a pattern that is not a distribution.
    References:
        Zhai et al. (2023), "Stabilizing Transformer Training by Preventing Attention Entropy
        Collapse", ICML, arXiv 2303.06296.
    """

    def __init__(
        self,
        *,
        x: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        collapse_threshold: float = COLLAPSE_THRESHOLD_NATS,
        per_head: bool = True,
        eps: float = 0.0,
    ) -> None:
        if not (math.isfinite(collapse_threshold) and collapse_threshold >= 0):
            raise ValueError(
                f"collapse_threshold must be finite and >= 0 (got {collapse_threshold})"
            )
        if not (math.isfinite(eps) and eps >= 0):
            raise ValueError(f"eps must be finite and >= 0 (got eps={eps})")
        if key_padding_mask is not None and x is None:
            raise ValueError("key_padding_mask needs x (got key_padding_mask without x)")
        self.x = None if x is None else x.detach().clone()
        self.key_padding_mask = None if key_padding_mask is None else key_padding_mask.clone()
        self.collapse_threshold = float(collapse_threshold)
        self.per_head = per_head
        self.eps = float(eps)

    def _held_inputs(self, ctx: ProbeContext) -> tuple[Tensor, Tensor | None]:
        if self.x is None:
            if ctx.batch is None or "x" not in ctx.batch:
                got = "no batch" if ctx.batch is None else f"batch keys {sorted(ctx.batch)}"
                raise ValueError(
                    "attention_entropy needs inputs: pass x= when constructing it, or a batch "
                    f"with key 'x' to monitor.step(step, batch) (got {got})"
                )
            self.x = ctx.batch["x"].detach().clone()
            padding = ctx.batch.get("key_padding_mask")
            self.key_padding_mask = None if padding is None else padding.detach().clone()
        return self.x, self.key_padding_mask

    def measure(self, model: nn.Module, ctx: ProbeContext) -> dict[str, Tensor | float]:
        x, key_padding_mask = self._held_inputs(ctx)
        param = next(model.parameters(), None)
        if param is not None and x.device != param.device:
            x = x.to(param.device)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.to(param.device)
        layer_of = {view.name: i for i, view in enumerate(attention_views(model))}
        modules = dict(model.named_modules())
        model.eval()
        with capture_patterns(model) as patterns:
            if key_padding_mask is None:
                model(x)
            else:
                model(x, key_padding_mask=key_padding_mask)
        unknown = sorted(set(patterns) - set(layer_of))
        if unknown:
            raise ValueError(
                f"captured patterns of {unknown} have no attention view "
                f"(views: {sorted(layer_of)}); register an adapter for them"
            )
        layers: list[tuple[int, Tensor, Tensor]] = []
        for name in sorted(patterns, key=layer_of.__getitem__):
            module = modules[name]
            attention = getattr(module, "attention", "softmax")
            if attention != "softmax":
                raise ValueError(
                    f"attention_entropy needs softmax attention ({name} has {attention=})"
                )
            layers.append((layer_of[name], *self._heads(patterns[name], module, key_padding_mask)))
        return self._keys(layers)

    def _heads(
        self, pattern: Tensor, module: nn.Module, key_padding_mask: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """``([n_heads] entropy, [n_heads] normalised)`` of one layer, NaN if non-finite."""
        mask, query_mask = _layer_masks(
            pattern, bool(getattr(module, "is_causal", False)), key_padding_mask
        )
        valid = pattern if mask is None else torch.where(mask, pattern, 0.0)
        if not bool(torch.isfinite(valid).all()):
            nan = torch.full(pattern.shape[-3:-2], math.nan, dtype=torch.float64)
            return nan, nan
        entropy = head_entropy(pattern, mask, query_mask, eps=self.eps)
        normalized = head_entropy(pattern, mask, query_mask, normalized=True, eps=self.eps)
        return entropy.double(), normalized.double()

    def _keys(self, layers: list[tuple[int, Tensor, Tensor]]) -> dict[str, Tensor | float]:
        out: dict[str, Tensor | float] = {}
        if not layers:
            return out
        entropy = torch.cat([e.cpu() for _, e, _ in layers])  # [total heads], float64
        normalized = torch.cat([n.cpu() for _, _, n in layers])
        out["attn.mean.entropy"] = entropy.mean().item()
        out["attn.mean.entropy_normalized"] = normalized.mean().item()
        out["attn.min.entropy"] = entropy.min().item()
        out["attn.min.entropy_normalized"] = normalized.min().item()
        collapsed = entropy_collapsed(entropy, self.collapse_threshold)
        out["attn.collapsed_heads"] = float(collapsed.sum())
        for layer, layer_entropy, layer_normalized in layers:
            out[f"L{layer}.attn.mean.entropy"] = layer_entropy.mean().item()
            out[f"L{layer}.attn.mean.entropy_normalized"] = layer_normalized.mean().item()
            if self.per_head:
                for head, (h, h_norm) in enumerate(
                    zip(layer_entropy.tolist(), layer_normalized.tolist())
                ):
                    out[f"L{layer}.H{head}.attn.entropy"] = h
                    out[f"L{layer}.H{head}.attn.entropy_normalized"] = h_norm
        return out
