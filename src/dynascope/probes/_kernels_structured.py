"""Empirical NTK by structured derivatives: ``Theta_W = sum_{p,p'} (a_p . a'_p') (g_p . g'_p')``.

For a weight W used in a linear map ``y = a W`` (``nn.Linear``, ``x @ W``, an einsum such as
dynascope's W_Q/W_K/W_V/W_O) the per-example gradient is ``dW = sum_p a_p (x) g_p`` (a: the
map's input at position p, g: the cotangent of its output), so the kernel needs only the inputs
a and the cotangents g, never ``dW`` (the per-example Jacobian). Biases and other additive
parameters contribute ``(sum_p g_p) . (sum_p' g'_p')``; embedding rows (``W_E[ids]``) have
one-hot inputs, so ``a_p . a'_p'`` is the test ``id_p == id'_p'``.

How the structure is found: ``model_fn`` runs once per block of examples under a
``TorchFunctionMode`` (:mod:`dynascope.probes._kernels_trace`) that follows every tensor derived
from a parameter (scaled, transposed or sliced) and records each use it understands (linear,
embedding, additive), with the input a and the output y; any other use of a parameter
(LayerNorm, a fused concatenation, an unknown op) sends that parameter to the fallback strategy.
One batched backward pass (``d_out`` cotangents at once) gives every g. A plain forward and
backward pass on the block's first 4 examples checks, per parameter, that the gradient rebuilt
from (a, g) equals autograd's (for a random mix of the outputs and a random weight per example,
to 1e4 machine epsilons of the largest gradient): a parameter that fails (a use the tracer did
not see, a custom backward, an activation whose first axis is not the examples') also falls
back. Examples must be independent (as for the other strategies).

Glossary:
    n:         examples in a block; C: ``d_out``, outputs per example (the model's outputs
               flattened).
    P, Q:      positions of a use (weight sharing: a token model applies W at every position).
    S:         weight axes shared by the map's input and output (e.g. a per-head weight
               applied to per-head activations); K: weight axes contracted with the input;
               O: weight axes that index the output. ``W ~ [S, K, O]``.
    a:         ``[S, n, P, K]`` inputs of a linear use; ids: ``[n, P]`` token ids of an embedding.
    g:         ``[S, n, P, C, O]`` cotangents, ``g[s, i, p, c] = d f_c(x_i) / d y[i, p, s]``.

Public wrapper and docstring: :func:`dynascope.probes.kernels.empirical_ntk`.

References:
    Novak, Sohl-Dickstein & Schoenholz (2022), "Fast Finite Width Neural Tangent Kernel", ICML,
    arXiv 2206.08720, section 3.3 (structured derivatives).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from dynascope.probes._kernels_entk import ModelFn, as_2d
from dynascope.probes._kernels_trace import Tracer, Use

_CHECK_EXAMPLES = 4  # examples the gradient check runs on


@dataclass
class Features:
    """The structured pieces of one block of examples (per parameter), and what fell back."""

    n: int
    d_out: int
    kind: dict[str, str] = field(default_factory=dict)
    a: dict[str, Tensor | None] = field(default_factory=dict)
    g: dict[str, Tensor] = field(default_factory=dict)
    fallback: dict[str, str] = field(default_factory=dict)  # name -> reason
    activation_bytes: int = 0  # bytes of the tensors the forward computed from the block


def _signatures_agree(uses: list[Use]) -> bool:
    return len({(u.kind, u.signature) for u in uses}) == 1


def _cotangents(out: Tensor, ys: list[Tensor]) -> list[Tensor]:
    """``d f_c / d y`` for every output c at once: ``[C, *y.shape]`` per y (zeros if unused)."""
    n, C = out.shape
    if not ys:
        return []
    live = [y for y in ys if y.requires_grad]  # a use under no_grad has no cotangent
    if not out.requires_grad or len(live) < len(ys):
        if live and out.requires_grad:
            got = iter(_cotangents(out, live))
            return [next(got) if y.requires_grad else _zeros(C, y) for y in ys]
        return [_zeros(C, y) for y in ys]
    basis = torch.eye(C, dtype=out.dtype, device=out.device)[:, None, :].expand(C, n, C)
    try:
        grads = torch.autograd.grad(
            out, ys, basis, retain_graph=True, is_grads_batched=True, allow_unused=True
        )
    except RuntimeError:  # an op without a batching rule for its backward: one pass per output
        per_c = [
            torch.autograd.grad(out, ys, basis[c], retain_graph=True, allow_unused=True)
            for c in range(C)
        ]
        grads = [
            None if per_c[0][k] is None else torch.stack([row[k] for row in per_c])
            for k in range(len(ys))
        ]
    return [_zeros(C, y) if g is None else g for g, y in zip(grads, ys)]


def _zeros(C: int, y: Tensor) -> Tensor:
    return torch.zeros(C, *y.shape, dtype=y.dtype, device=y.device)


def _rebuilt_gradient(kind: str, a, g: Tensor, mix: Tensor, shape) -> tuple[Tensor, Tensor]:
    """``sum_i sum_c mix_c dW_{i,c}`` from the structured pieces, in the canonical layout, and
    ``||a||_F ||g mix||_F``, a bound on its norm (the scale of its round-off)."""
    gm = torch.matmul(mix, g)  # [S, n, P, O]
    bound = torch.linalg.vector_norm(gm)
    if kind == "linear":
        return torch.einsum("snpk,snpo->sko", a, gm), bound * torch.linalg.vector_norm(a)
    if kind == "embedding":
        rows = torch.zeros(shape, dtype=g.dtype, device=g.device)
        return rows.index_add_(0, a.reshape(-1), gm.reshape(-1, shape[1])), bound
    return gm.sum(dim=(0, 1, 2)), bound  # additive


def _canonical_gradient(kind: str, grad: Tensor, index: tuple, signature) -> tuple[Tensor, Tensor]:
    """autograd's gradient in the canonical layout, and its part outside the sliced view."""
    view = grad
    for idx in index:
        view = view[idx]
    outside = grad.square().sum() - view.square().sum()
    if kind == "linear":
        _, S, K, O, _ = signature
        size = view.shape
        view = view.permute(*S, *K, *O).reshape(
            math.prod(size[d] for d in S), math.prod(size[d] for d in K), -1
        )
    elif kind == "additive":
        view = view.reshape(-1)
    return view, outside


def features(model_fn: ModelFn, params: dict[str, Tensor], x: Tensor) -> Features:
    """Trace ``model_fn`` on the block ``x``; the structured pieces of every parameter it can."""
    with torch.enable_grad():
        leaves = {k: v.detach().requires_grad_(True) for k, v in params.items()}
        tracer = Tracer(leaves, x)
        with tracer:
            out = as_2d(model_fn(leaves, x))
        n, C = out.shape
        if n != x.shape[0]:
            raise ValueError(f"model_fn must return one row per example (got {n} for {x.shape[0]})")
        feats = Features(n=n, d_out=C, activation_bytes=tracer.activation_bytes)
        candidates: dict[str, list[Use]] = {}
        for name in params:
            uses = tracer.uses.get(name, [])
            if name in tracer.bad:
                feats.fallback[name] = tracer.bad[name]
            elif uses and not _signatures_agree(uses):
                feats.fallback[name] = "uses with different weight layouts"
            elif any(t._version != v for u in uses for t, v in u.versions):
                feats.fallback[name] = "an input of its use was modified in place"
            else:
                candidates[name] = uses
        ys = list({id(u.y): u.y for uses in candidates.values() for u in uses}.values())
        cot = dict(zip([id(y) for y in ys], _cotangents(out, ys)))
        pieces = {}
        for name, uses in candidates.items():
            if not uses:
                pieces[name] = ("unused", None, None)
                continue
            kind = uses[0].kind
            gs = [u.canon_g(cot[id(u.y)]) for u in uses]
            if kind == "additive":
                pieces[name] = (kind, None, torch.stack(gs).sum(0))
            else:
                dim_a = 1 if kind == "embedding" else 2
                a = torch.cat([u.a for u in uses], dim=dim_a)
                pieces[name] = (kind, a, torch.cat(gs, dim=2))
        # Check, on the first few examples (examples are independent): the gradient rebuilt
        # from (a, g) for a random mix of outputs equals autograd's through a plain forward.
        # Each example has its own random weight, so pieces taken along an axis that is not
        # the examples' (a sequence-first layout with as many positions as examples) fail.
        m = min(n, _CHECK_EXAMPLES)
        gen = torch.Generator(device=out.device).manual_seed(0)
        mix = torch.randn(C, generator=gen, dtype=out.dtype, device=out.device)
        weight = torch.randn(m, generator=gen, dtype=out.dtype, device=out.device)
        names = list(pieces)
        grads = [None] * len(names)
        if names:
            out_m = as_2d(model_fn(leaves, x[:m]))
            if out_m.requires_grad:
                grads = torch.autograd.grad(
                    (out_m * mix).sum(1) @ weight, [leaves[k] for k in names], allow_unused=True
                )
    # Round-off is judged against the largest gradient: a parameter whose true gradient is 0
    # (b_K under softmax) rebuilds it only to round-off of the others' size.
    tol = 1e4 * torch.finfo(out.dtype).eps
    checks = {}
    for name, grad in zip(names, grads):
        kind, a, g = pieces[name]
        grad = torch.zeros_like(leaves[name]) if grad is None else grad
        if kind == "unused":
            checks[name] = (torch.linalg.vector_norm(grad), torch.zeros(()), torch.zeros(()))
            continue
        use = candidates[name][0]
        ref, outside = _canonical_gradient(kind, grad, use.index, use.signature)
        a_m = None if a is None else a[:m] if kind == "embedding" else a[:, :m]
        g_m = g[:, :m] * weight[:, None, None, None]
        rebuilt, bound = _rebuilt_gradient(kind, a_m, g_m, mix, tuple(params[name].shape))
        if rebuilt.numel() != ref.numel():
            feats.fallback[name] = "its gradient is not rebuilt from the recorded uses"
            continue
        err = torch.linalg.vector_norm(rebuilt.reshape(ref.shape) - ref)
        checks[name] = (err, outside.clamp(min=0).sqrt(), torch.linalg.vector_norm(ref) + bound)
    floor = max((float(c[2]) for c in checks.values()), default=0.0)
    for name, (err, outside, scale) in checks.items():
        if err > tol * (scale + floor) or outside > tol * (scale + floor):
            feats.fallback[name] = "its gradient is not rebuilt from the recorded uses"
            continue
        kind, a, g = pieces[name]
        feats.kind[name], feats.a[name], feats.g[name] = kind, a, g
    return feats


def _input_gram(kind: str, a1, a2, mode: str, dtype) -> Tensor | None:
    """``a . a'`` per position pair: ``[S, n1, P, n2, Q]`` (``[S, n, P, Q]`` paired in diagonal
    mode); token-id equality for embeddings; ``None`` (all ones) for additive parameters."""
    if kind == "additive":
        return None
    if kind == "embedding":
        if mode == "diagonal":
            return (a1[:, :, None] == a2[:, None, :]).to(dtype)[None]
        eq = a1.reshape(-1, 1) == a2.reshape(1, -1)
        return eq.to(dtype).view(1, *a1.shape, *a2.shape)
    if mode == "diagonal":
        return torch.einsum("sipk,siqk->sipq", a1, a2)
    S, n1, P, K = a1.shape
    _, n2, Q, _ = a2.shape
    return torch.bmm(a1.reshape(S, n1 * P, K), a2.reshape(S, n2 * Q, K).mT).view(S, n1, P, n2, Q)


def _add_kernel(acc: Tensor, kind: str, a1, a2, g1: Tensor, g2: Tensor, mode: str) -> None:
    """``acc += Theta_W`` for one parameter from its structured pieces, in place; ``acc`` is
    ``[n1, C, n2, C]`` (full), ``[n1, n2]`` (trace) or ``[n1, C]`` (diagonal)."""
    A = _input_gram(kind, a1, a2, mode, g1.dtype)
    S, n1, P, C, O = g1.shape
    _, n2, Q, _, _ = g2.shape
    for s in range(S):
        if mode == "diagonal":
            H = torch.einsum("ipco,iqco->ipqc", g1[s], g2[s])
            acc += H.sum((1, 2)) if A is None else torch.einsum("ipqc,ipq->ic", H, A[s])
        elif mode == "trace":
            H = (g1[s].reshape(n1 * P, C * O) @ g2[s].reshape(n2 * Q, C * O).mT).view(n1, P, n2, Q)
            acc += H.sum((1, 3)) if A is None else torch.einsum("ipjq,ipjq->ij", H, A[s])
        elif A is None or (P == 1 and Q == 1):  # [n1 C, O] @ [O, n2 C], times a . a'
            G1, G2 = g1[s].reshape(n1 * C, O), g2[s].reshape(n2 * C, O)
            if A is None:
                acc.view(n1 * C, n2 * C).addmm_(G1, G2.mT)
            else:
                acc.addcmul_((G1 @ G2.mT).view(n1, C, n2, C), A[s].view(n1, 1, n2, 1))
        else:
            H = g1[s].reshape(n1 * P * C, O) @ g2[s].reshape(n2 * Q * C, O).mT
            acc += torch.einsum("ipcjqd,ipjq->icjd", H.view(n1, P, C, n2, Q, C), A[s])


def _take(f: Features, rows: slice) -> Features:
    """The features of the examples ``rows`` of a block."""
    part = Features(n=len(range(*rows.indices(f.n))), d_out=f.d_out, kind=f.kind)
    for name, kind in f.kind.items():
        if kind == "unused":
            continue
        a = f.a[name]
        part.a[name] = None if a is None else (a[rows] if kind == "embedding" else a[:, rows])
        part.g[name] = f.g[name][:, rows]
    return part


def _pair_kernel(f1: Features, f2: Features, mode: str) -> Tensor:
    """Sum over the structured parameters, in ``_add_kernel``'s layout."""
    n1, n2, C = f1.n, f2.n, f1.d_out
    shape = {"full": (n1, C, n2, C), "trace": (n1, n2), "diagonal": (n1, C)}[mode]
    dtype = next((g.dtype for g in f1.g.values()), torch.get_default_dtype())
    device = next((g.device for g in f1.g.values()), None)
    acc = torch.zeros(shape, dtype=dtype, device=device)
    for name, kind in f1.kind.items():
        if kind != "unused":
            _add_kernel(acc, kind, f1.a[name], f2.a[name], f1.g[name], f2.g[name], mode)
    return acc


def structured_kernel(f1: Features, f2: Features, mode: str) -> Tensor:
    """``Theta(x1 block, x2 block)`` summed over the structured parameters of ``f1``.

    With ``f2 is f1`` (one set of inputs) the kernel is symmetric: the examples are cut into
    up to 4 groups and only the group pairs on and above the diagonal are computed (10 of 16).
    """
    n, C = f1.n, f1.d_out
    groups = 4 if n >= 64 else 2 if n >= 16 else 1
    if f2 is not f1 or mode == "diagonal" or groups == 1:
        acc = _pair_kernel(f1, f2, mode)
        return acc.permute(0, 2, 1, 3).contiguous() if mode == "full" else acc
    cuts = [slice(k * n // groups, (k + 1) * n // groups) for k in range(groups)]
    parts = [_take(f1, c) for c in cuts]
    shape = (n, n, C, C) if mode == "full" else (n, n)
    dtype = next((g.dtype for g in f1.g.values()), torch.get_default_dtype())
    out = torch.empty(shape, dtype=dtype, device=next((g.device for g in f1.g.values()), None))
    for u in range(groups):
        for v in range(u, groups):
            acc = _pair_kernel(parts[u], parts[v], mode)
            block = acc.permute(0, 2, 1, 3) if mode == "full" else acc
            out[cuts[u], cuts[v]] = block
            if u != v:
                out[cuts[v], cuts[u]] = block.transpose(0, 1).mT if mode == "full" else block.T
    return out


def _blocks(n: int, chunk: int | None) -> list[slice]:
    size = n if chunk is None else chunk
    return [slice(i, min(i + size, n)) for i in range(0, n, size)] or [slice(0, 0)]


def entk_structured(
    model_fn: ModelFn,
    params: dict[str, Tensor],
    x1: Tensor,
    x2: Tensor,
    mode: str,
    chunk_size: int | None,
    fallback: Callable[..., Tensor],
) -> Tensor:
    """Structured strategy; the parameters it cannot structure go to ``fallback`` (same call
    signature as :func:`dynascope.probes._kernels_entk.entk_jacobian`), over that subset only.

    Raises:
        RuntimeError: if a later block of examples uses the parameters differently from the
            first block (data-dependent control flow); use another strategy then.
    """
    plan: set[str] | None = None

    def block(x: Tensor) -> Features:
        nonlocal plan
        f = features(model_fn, params, x)
        if plan is None:
            plan = set(f.kind)
        elif not plan <= set(f.kind):
            raise RuntimeError(
                "structured eNTK: a block of examples uses the parameters differently from the "
                f"first one ({sorted(plan - set(f.kind))}); use strategy='jacobian'"
            )
        # A block of one example passes checks that larger ones fail (one example is its own
        # batch axis whatever the layout): what the first block left out stays out.
        f.kind = {k: v for k, v in f.kind.items() if k in plan}
        return f

    if mode == "diagonal":
        rows = []
        for s in _blocks(x1.shape[0], chunk_size):
            f1 = block(x1[s])
            f2 = f1 if x2 is x1 else block(x2[s])
            rows.append(structured_kernel(f1, f2, mode))
        kernel = torch.cat(rows, 0)
    else:
        rows = []
        blocks2 = _blocks(x2.shape[0], chunk_size)
        for s1 in _blocks(x1.shape[0], chunk_size):
            f1 = block(x1[s1])
            cols = []
            for s2 in blocks2:
                f2 = f1 if x2 is x1 and s1 == s2 else block(x2[s2])
                cols.append(structured_kernel(f1, f2, mode))
            rows.append(torch.cat(cols, 1))
        kernel = torch.cat(rows, 0)
    rest = {k: v for k, v in params.items() if k not in (plan or set())}
    if rest:
        fixed = {k: v for k, v in params.items() if k not in rest}

        def rest_fn(sub: dict[str, Tensor], x: Tensor) -> Tensor:
            return model_fn({**fixed, **sub}, x)

        kernel = kernel + fallback(rest_fn, rest, x1, x2, mode, chunk_size)
    return kernel


def structure(model_fn: ModelFn, params: dict[str, Tensor], x: Tensor) -> dict[str, str]:
    """How each parameter enters the structured strategy on the examples ``x``."""
    f = features(model_fn, params, x)
    return {k: f.kind[k] if k in f.kind else f"fallback ({f.fallback[k]})" for k in params}
