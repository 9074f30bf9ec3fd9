"""Matching one :class:`dynascope.nn.Transformer` to another: the permutation of
:mod:`._transformer_permutation` (glossary there) that best aligns net b with net a, and the
interpolation between two nets' parameters.

``match_transformers`` by method:
    * ``"activation"``: the residual stream read at every block's input, every MLP's input and
      the final LayerNorm's input (rows ``batch x pos x points``), MLP hidden units after the
      activation, and per head the queries and keys together (``qk``) and the values
      (``ov``), all on the probe batch; cosine similarities (:func:`activation_similarity`).
      Heads: for every head pair ``(g, g')`` the best ``qk`` and ``ov`` assignments, then an
      assignment of heads maximising the summed scores.
    * ``"weight"``: Git Re-Basin coordinate descent: each group (residual, then per block the
      heads with their ``qk``/``ov``, the MLP) maximises ``sum <W^a, P W^b>`` over every weight
      touching it, the other groups held at their current permutation; sweeps until none
      changes.

References:
    Ainsworth, Hayase, Srinivasa (2023), "Git Re-Basin", ICLR, arXiv 2209.04836, Sec. 3.2.
    Verma, Elbayad (2024), "Merging Text Transformer Models from Different Initializations",
    arXiv 2403.00986, Sec. 3. Benzing et al. (2022), arXiv 2209.07509, Sec. 2 (activation
    matching).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from ._assignment import activation_similarity, match_units
from ._transformer_permutation import (
    _ACTIVATIONS,
    TransformerPermutation,
    _layout,
    permute_transformer_state,
)


def _match_heads(s_qk: Tensor, s_ov: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Nested assignment from per-pair similarities ``[n_heads, n_heads, d_head, d_head]``:
    per head pair the best ``qk`` and ``ov`` assignments, then heads by their summed scores."""
    n_heads, d_head = s_qk.shape[0], s_qk.shape[-1]
    rows = torch.arange(d_head)
    inner_qk = torch.empty(n_heads, n_heads, d_head, dtype=torch.int64)
    inner_ov = torch.empty_like(inner_qk)
    score = torch.zeros(n_heads, n_heads, dtype=torch.float64)
    for g in range(n_heads):
        for g2 in range(n_heads):
            for inner, s in ((inner_qk, s_qk), (inner_ov, s_ov)):
                inner[g, g2] = match_units(s[g, g2])
                score[g, g2] += s[g, g2][rows, inner[g, g2]].sum()
    heads = match_units(score)
    pick = torch.arange(n_heads)
    return heads, inner_qk[pick, heads], inner_ov[pick, heads]


def _record(model: nn.Module, x: Tensor) -> dict[str, list[Tensor]]:
    """Residual-stream rows, per-block q/k/v ``[rows, n_heads, d_head]`` and MLP hidden rows."""
    blocks = _layout(model)
    acts: dict[str, list[Tensor]] = {"residual": [], "q": [], "k": [], "v": [], "mlp": []}

    def stream(module: nn.Module, args: tuple) -> None:
        acts["residual"].append(args[0].reshape(-1, args[0].shape[-1]))

    def attention(module: nn.Module, args: tuple) -> None:
        h = args[0].reshape(-1, args[0].shape[-1])  # [rows, d_model]
        for key, W, b in (
            ("q", module.W_Q, module.b_Q),
            ("k", module.W_K, module.b_K),
            ("v", module.W_V, module.b_V),
        ):
            out = torch.einsum("rm,hmd->rhd", h, W)
            acts[key].append(out if b is None else out + b)

    def mlp(module: nn.Module, args: tuple) -> None:
        h = args[0].reshape(-1, args[0].shape[-1])
        acts["mlp"].append(_ACTIVATIONS[module.activation](h @ module.W_in + module.b_in))

    handles = [model.ln_final.register_forward_pre_hook(stream)]
    for block in blocks:
        handles.append(block.register_forward_pre_hook(stream))
        handles.append(block.attn.register_forward_pre_hook(attention))
        if block.mlp is not None:
            handles.append(block.ln2.register_forward_pre_hook(stream))
            handles.append(block.mlp.register_forward_pre_hook(mlp))
    was_training = [m.training for m in model.modules()]
    model.eval()
    try:
        with torch.no_grad():
            model(x)
    finally:
        for handle in handles:
            handle.remove()
        for module, training in zip(model.modules(), was_training):
            module.training = training
    return acts


def _activation_matching(model_a, model_b, x, center: bool) -> TransformerPermutation:
    acts_a, acts_b = _record(model_a, x), _record(model_b, x)

    def sim(a: Tensor, b: Tensor) -> Tensor:
        return activation_similarity(a, b, center=center)

    residual = match_units(sim(torch.cat(acts_a["residual"]), torch.cat(acts_b["residual"])))
    heads, qk, ov = [], [], []
    for i in range(len(acts_a["q"])):
        qa = torch.cat([acts_a["q"][i], acts_a["k"][i]])  # [2 rows, n_heads, d_head]
        qb = torch.cat([acts_b["q"][i], acts_b["k"][i]])
        va, vb = acts_a["v"][i], acts_b["v"][i]
        n_heads = qa.shape[1]
        s_qk = torch.stack(
            [
                torch.stack([sim(qa[:, g], qb[:, g2]) for g2 in range(n_heads)])
                for g in range(n_heads)
            ]
        )
        s_ov = torch.stack(
            [
                torch.stack([sim(va[:, g], vb[:, g2]) for g2 in range(n_heads)])
                for g in range(n_heads)
            ]
        )
        h, q, o = _match_heads(s_qk, s_ov)
        heads.append(h), qk.append(q), ov.append(o)
    mlp_a, mlp_b = iter(acts_a["mlp"]), iter(acts_b["mlp"])
    mlp = tuple(
        None if block.mlp is None else match_units(sim(next(mlp_a), next(mlp_b)))
        for block in model_a.blocks
    )
    return TransformerPermutation(residual, tuple(heads), tuple(qk), tuple(ov), mlp, probe=x)


def _rows(w: Tensor, axis: int) -> Tensor:
    return w.movedim(axis, 0).reshape(w.shape[axis], -1).to(torch.float64)


_RESIDUAL_AXIS = {"W_E": 1, "W_in": 1, "W_pos": 1, "W_U": 0}


def _residual_axis(name: str) -> int | None:
    parts = name.split(".")
    if name in _RESIDUAL_AXIS:
        return _RESIDUAL_AXIS[name]
    if len(parts) > 1 and parts[-2].startswith("ln"):
        return 0
    leaf = parts[-1]
    if parts[0] == "blocks" and parts[2] == "attn":
        return {"W_Q": 1, "W_K": 1, "W_V": 1, "W_O": 2, "b_O": 0}.get(leaf)
    if parts[0] == "blocks" and parts[2] == "mlp":
        return {"W_in": 0, "W_out": 1, "b_out": 0}.get(leaf)
    return None


def _residual_step(state_a: dict, b: dict) -> Tensor:
    """Assignment of the residual stream from every weight that reads or writes it."""
    s = 0.0
    for name, w in state_a.items():
        axis = _residual_axis(name)
        if axis is not None:
            s = s + _rows(w, axis) @ _rows(b[name], axis).mT
    return match_units(s)


def _mlp_step(state_a: dict, b: dict, i: int) -> Tensor:
    """Assignment of block ``i``'s MLP units from ``W_in`` columns, ``b_in``, ``W_out`` rows."""
    pre = f"blocks.{i}.mlp."
    s = sum(
        _rows(state_a[pre + n], ax) @ _rows(b[pre + n], ax).mT
        for n, ax in (("W_in", 1), ("b_in", 0), ("W_out", 0))
    )
    return match_units(s)


def _attention_step(state_a: dict, b: dict, i: int) -> tuple[Tensor, Tensor, Tensor]:
    """Heads, ``qk`` and ``ov`` of block ``i`` from per-head-pair inner products of
    ``W_Q, W_K, b_Q, b_K`` (d_head columns) and ``W_V, b_V, W_O`` (d_head rows of ``W_O``)."""
    pre = f"blocks.{i}.attn."

    def pair(n: str, spec: str) -> Tensor:
        return torch.einsum(spec, state_a[pre + n].double(), b[pre + n].double())

    s_qk = pair("W_Q", "gmc,hmd->ghcd") + pair("W_K", "gmc,hmd->ghcd")
    s_ov = pair("W_V", "gmc,hmd->ghcd") + pair("W_O", "gcm,hdm->ghcd")
    if pre + "b_Q" in state_a:
        s_qk = s_qk + pair("b_Q", "gc,hd->ghcd") + pair("b_K", "gc,hd->ghcd")
        s_ov = s_ov + pair("b_V", "gc,hd->ghcd")
    return _match_heads(s_qk, s_ov)


def _weight_matching(model_a, model_b, max_sweeps: int) -> TransformerPermutation:
    """Coordinate descent (module glossary); a group's step is kept only if it raises
    ``sum <W^a, P W^b>``."""
    blocks = _layout(model_a)
    state_a = {n: p.detach() for n, p in model_a.named_parameters()}
    state_b = {n: p.detach() for n, p in model_b.named_parameters()}
    identity = TransformerPermutation.identity(model_a)
    current = identity
    groups = [("residual", None)] + [
        (kind, i)
        for i, block in enumerate(blocks)
        for kind in ("attn", "mlp")
        if kind == "attn" or block.mlp is not None
    ]
    for _ in range(max_sweeps):
        changed = False
        for kind, i in groups:
            b = permute_transformer_state(state_b, current)  # b in a's current frame
            if kind == "residual":
                step = _replace(identity, residual=_residual_step(state_a, b))
            elif kind == "mlp":
                step = _replace(identity, mlp=_set(identity.mlp, i, _mlp_step(state_a, b, i)))
            else:
                h, q, o = _attention_step(state_a, b, i)
                step = _replace(
                    identity,
                    heads=_set(identity.heads, i, h),
                    qk=_set(identity.qk, i, q),
                    ov=_set(identity.ov, i, o),
                )
            if step.equals(identity):
                continue
            new = current.then(step)
            if _objective(state_a, state_b, new) > _objective(state_a, state_b, current):
                current, changed = new, True
        if not changed:
            break
    return current


def _replace(perm: TransformerPermutation, **fields) -> TransformerPermutation:
    values = {f: getattr(perm, f) for f in ("residual", "heads", "qk", "ov", "mlp", "probe")}
    values.update(fields)
    return TransformerPermutation(**values)


def _set(items: tuple, i: int, value: object) -> tuple:
    return items[:i] + (value,) + items[i + 1 :]


def _objective(state_a: dict, state_b: dict, perm: TransformerPermutation) -> float:
    b = permute_transformer_state(state_b, perm)
    return float(sum((state_a[n].double() * b[n].double()).sum() for n in state_a))


def match_transformers(
    model_a: nn.Module,
    model_b: nn.Module,
    x: Tensor,
    *,
    method: Literal["activation", "weight"] = "activation",
    center: bool = False,
    max_sweeps: int = 100,
) -> TransformerPermutation:
    """The permutation of ``model_b`` that aligns it to ``model_a`` (module glossary).

    Finds the residual-stream permutation, per block the head permutation, the ``d_head``
    permutation within each head (one shared by ``W_Q``/``W_K``, one by ``W_V``/``W_O``) and
    the MLP's hidden units. ``apply_permutation(model_b, perm)`` gives b aligned to a and
    checks that it computes b's function on ``x``.

    Args:
        model_a, model_b: :class:`dynascope.nn.Transformer` of the same configuration
            (softmax or linear attention, with or without biases, LayerNorms, MLPs).
        x: probe batch the nets read (token ids ``[batch, pos]`` or vectors ``[batch, pos,
            d_in]``): the activations matched (``"activation"``), and the inputs
            ``apply_permutation`` checks the aligned copy on (both methods).
        method: ``"activation"`` (cosine similarity of activations) or ``"weight"`` (Git
            Re-Basin coordinate descent).
        center: Pearson correlations instead of uncentred cosines (activation method).
        max_sweeps: sweep cap of the weight method (>= 1).
    Returns:
        :class:`TransformerPermutation` with ``probe=x``.
    Raises:
        ValueError: if ``method`` is unknown, ``max_sweeps < 1``, a model is not a supported
            Transformer (:func:`check_transformer_permutation`) or the two differ in shape.
    References:
        Ainsworth et al. (2023), arXiv 2209.04836, Sec. 3.2; Verma & Elbayad (2024), arXiv
        2403.00986, Sec. 3; Benzing et al. (2022), arXiv 2209.07509, Sec. 2.
    """
    if method not in ("activation", "weight"):
        raise ValueError(f"method must be 'activation' or 'weight' (got method={method!r})")
    if max_sweeps < 1:
        raise ValueError(f"max_sweeps must be >= 1 (got {max_sweeps})")
    _layout(model_a)
    _layout(model_b)
    shapes_a = {n: p.shape for n, p in model_a.named_parameters()}
    if shapes_a != {n: p.shape for n, p in model_b.named_parameters()}:
        raise ValueError("model_a and model_b must have the same parameter names and shapes")
    if method == "activation":
        return _activation_matching(model_a, model_b, x, center)
    return _replace(_weight_matching(model_a, model_b, max_sweeps), probe=x)


def interpolate_parameters(
    model_a: nn.Module, model_b: nn.Module, alpha: float
) -> dict[str, Tensor]:
    """``alpha * theta_a + (1 - alpha) * theta_b`` for every named parameter (any two models
    with the same parameter names and shapes), for :func:`torch.func.functional_call`.

    Raises:
        ValueError: if the names or shapes differ.
    """
    pa, pb = dict(model_a.named_parameters()), dict(model_b.named_parameters())
    if {n: p.shape for n, p in pa.items()} != {n: p.shape for n, p in pb.items()}:
        raise ValueError("model_a and model_b must have the same parameter names and shapes")
    return {n: alpha * pa[n].detach() + (1.0 - alpha) * pb[n].detach() for n in pa}
