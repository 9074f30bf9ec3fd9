"""Empirical NTK by structured derivatives: ``Theta_W = sum_{p,p'} (a_p . a'_p') (g_p . g'_p')``.

For a weight W used in a linear map ``y = a W`` (``nn.Linear``, ``x @ W``, an einsum such as
dynascope's W_Q/W_K/W_V/W_O) the per-example gradient is ``dW = sum_p a_p (x) g_p`` (a: the
map's input at position p, g: the cotangent of its output), so the kernel needs only the inputs
a and the cotangents g, never ``dW`` (the per-example Jacobian). Biases and other additive
parameters contribute ``(sum_p g_p) . (sum_p' g'_p')``; embedding rows (``W_E[ids]``) have
one-hot inputs, so ``a_p . a'_p'`` is the test ``id_p == id'_p'``.

How the structure is found: ``model_fn`` runs once per block of examples under a
``TorchFunctionMode`` that follows every tensor derived from a parameter (scaled, transposed or
sliced) and records each use it understands (linear, embedding, additive), with the input a and
the output y; any other use of a parameter (LayerNorm, a fused concatenation, an unknown op)
sends that parameter to the fallback strategy. One batched backward pass per output dimension
(``d_out`` cotangents at once) gives every g. A second backward pass checks, per parameter, that
the gradient rebuilt from (a, g) equals autograd's (a random mix of the outputs): a parameter
that fails (a use the tracer did not see) also falls back. Examples sit on the first axis of
every activation and are independent (as for the other strategies).

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
    arXiv 2206.08720, section 3.3 (structured derivatives) and appendix on weight sharing.
"""

from __future__ import annotations

import math
import string
import weakref
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from dynascope.probes._kernels_entk import ModelFn, as_2d

_MATMUL = {"matmul", "__matmul__", "__rmatmul__", "mm"}
_SCALE = {"mul", "__mul__", "__rmul__", "multiply", "div", "__truediv__", "true_divide", "divide"}
_NEG = {"neg", "__neg__", "negative"}
_PERMUTE = {"transpose", "swapaxes", "swapdims", "t", "permute", "get:T", "get:mT"}
_ADD = {"add", "__add__", "__radd__", "sub", "__sub__", "__rsub__", "subtract"}


def _name(func) -> str:
    name = getattr(func, "__name__", "")
    if name == "__get__":  # a property such as Tensor.T
        return "get:" + getattr(getattr(func, "__self__", None), "__name__", "")
    return name


@dataclass(frozen=True)
class _Ref:
    """A tensor equal to ``scale * param[index...].permute(dims)``."""

    name: str
    scale: float
    dims: tuple[int, ...]
    index: tuple = ()  # slicing applied to the parameter first (tuples of slices)


@dataclass
class _Use:
    """One recorded use of a parameter: what to keep and how to lay out its cotangent."""

    kind: str  # "linear", "embedding" or "additive"
    signature: tuple  # uses of one parameter concatenate only with equal signatures
    y: Tensor  # the op's output; its cotangent is g
    canon_g: Callable[[Tensor], Tensor]  # [C, *y.shape] -> [S, n, P, C, O]
    a: Tensor | None = None  # linear: [S, n, P, K]; embedding: ids [n, P]
    versions: tuple = ()  # (tensor, version) pairs that must not change after recording
    index: tuple = ()  # the parameter's slicing before this use


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


class _Tracer(TorchFunctionMode):
    """Follow parameters (and tensors derived from them) through one forward; record uses."""

    def __init__(self, params: dict[str, Tensor], x: Tensor) -> None:
        super().__init__()
        self.n = x.shape[0]
        self.refs: dict[int, tuple[weakref.ref, _Ref]] = {}
        self.tainted: dict[int, weakref.ref] = {id(x): weakref.ref(x)}  # derived from x
        self.activation_bytes = 0  # every tensor the forward computes from x (an upper bound)
        for name, p in params.items():
            self.refs[id(p)] = (weakref.ref(p), _Ref(name, 1.0, tuple(range(p.ndim))))
        self.shapes = {name: tuple(p.shape) for name, p in params.items()}
        self.uses: dict[str, list[_Use]] = defaultdict(list)
        self.bad: dict[str, str] = {}

    def ref(self, t) -> _Ref | None:
        hit = self.refs.get(id(t)) if isinstance(t, Tensor) else None
        return hit[1] if hit is not None and hit[0]() is t else None

    def is_tainted(self, t) -> bool:
        hit = self.tainted.get(id(t)) if isinstance(t, Tensor) else None
        return hit is not None and hit() is t

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        flat = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, Tensor)]
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, Tensor)]
        if any(self.is_tainted(t) for t in flat):
            for t in outs:
                if self.ref(t) is None and not self.is_tainted(t):
                    self.tainted[id(t)] = weakref.ref(t)
                    self.activation_bytes += t.numel() * t.element_size()
        tracked = [(t, r) for t in flat if (r := self.ref(t)) is not None]
        if not tracked or not outs:
            return out
        name = _name(func)
        x_in = args[0] if args else kwargs.get("input")
        # F.linear(x, W, b) with W and b both parameters: two separate uses.
        separate = name == "linear" and len(tracked) == 2 and self.ref(x_in) is None
        if len(tracked) > 1 and not separate:
            for _, r in tracked:
                self.bad.setdefault(r.name, f"used with another parameter in {name}")
            return out
        for t, r in tracked:
            if not (len(outs) == 1 and outs[0] is t):  # identity ops (contiguous, to)
                reason = self._interpret(name, func, args, kwargs, out, t, r)
                if reason is not None:
                    self.bad.setdefault(r.name, reason)
        return out

    def _derive(self, out, ref: _Ref) -> None:
        self.refs[id(out)] = (weakref.ref(out), ref)

    def _interpret(self, name, func, args, kwargs, out, t, r: _Ref) -> str | None:
        """Record a use or a derived tensor; return a reason when the use is not understood."""
        if not isinstance(out, Tensor):
            return f"{name} returns several tensors"
        if name in _NEG:
            self._derive(out, _Ref(r.name, -r.scale, r.dims, r.index))
            return None
        if name in _SCALE:
            other = args[1] if args[0] is t else args[0]
            if kwargs or (
                name in ("div", "__truediv__", "true_divide", "divide") and args[0] is not t
            ):
                return f"{name} with this argument layout"
            scalar = _scalar(other, self)
            if scalar is None:
                return f"{name} by a non-constant or non-scalar factor"
            scale = (
                1.0 / scalar if name in ("div", "__truediv__", "true_divide", "divide") else scalar
            )
            self._derive(out, _Ref(r.name, r.scale * scale, r.dims, r.index))
            return None
        if name in _PERMUTE:
            perm = _permutation(name, args, kwargs, t.ndim)
            if perm is None:
                return f"{name} with these arguments"
            self._derive(out, _Ref(r.name, r.scale, tuple(r.dims[d] for d in perm), r.index))
            return None
        if name == "__getitem__" and args[0] is t:
            index = args[1]
            if (
                isinstance(index, Tensor)
                and not index.is_floating_point()
                and index.dtype != torch.bool
            ):
                return self._embedding(r, index, out, padding_idx=None)
            view = _slice_view(r, index, t.ndim)
            if view is None:
                return "indexed other than by token ids, slices or None"
            self._derive(out, view)
            return None
        if name == "unsqueeze" and len(args) == 2 and not kwargs:
            dims = list(r.dims)
            dims.insert(int(args[1]) % (t.ndim + 1), None)
            self._derive(out, _Ref(r.name, r.scale, tuple(dims), r.index))
            return None
        if name == "embedding":
            weight = args[1] if len(args) > 1 else kwargs.get("weight")
            ids = args[0] if args else kwargs.get("input")
            extra = dict(
                zip(("padding_idx", "max_norm", "norm_type", "scale_grad_by_freq"), args[2:])
            )
            extra.update({k: v for k, v in kwargs.items() if k not in ("input", "weight")})
            if (
                weight is not t
                or extra.get("max_norm") is not None
                or extra.get("scale_grad_by_freq")
            ):
                return "embedding with max_norm or scale_grad_by_freq"
            return self._embedding(r, ids, out, extra.get("padding_idx"))
        if name in _MATMUL:
            left, right = (args[1], args[0]) if name == "__rmatmul__" else (args[0], args[1])
            if right is not t or t.ndim != 2 or not isinstance(left, Tensor) or left.ndim < 2:
                return "matmul other than input @ (2-d weight)"
            letters = string.ascii_letters[: left.ndim - 1]
            return self._linear(r, left, t, out, letters + "Y", "YZ", letters + "Z")
        if name == "linear":
            x_in = args[0] if args else kwargs.get("input")
            weight = args[1] if len(args) > 1 else kwargs.get("weight")
            if t is weight and t.ndim == 2 and isinstance(x_in, Tensor) and x_in.ndim >= 2:
                letters = string.ascii_letters[: x_in.ndim - 1]
                return self._linear(r, x_in, t, out, letters + "Y", "ZY", letters + "Z")
            if t is not weight and isinstance(x_in, Tensor):  # the bias
                return self._additive(r, t, out, x_in)
            return "linear with this argument layout"
        if name == "einsum":
            return self._einsum(r, args, t, out)
        if name in _ADD:
            if "alpha" in kwargs or len(args) != 2 or not isinstance(args[0], Tensor):
                return f"{name} with alpha or this argument layout"
            other = args[1] if args[0] is t else args[0]
            negated = (name in ("sub", "__sub__", "subtract") and args[1] is t) or (
                name == "__rsub__" and args[0] is t
            )
            ref = _Ref(r.name, -r.scale, r.dims, r.index) if negated else r
            return self._additive(ref, t, out, other)
        return f"used by {name}"

    def _batched(self, a, y) -> bool:
        return (
            isinstance(a, Tensor)
            and self.is_tainted(a)
            and a.ndim >= 1
            and y.ndim >= 1
            and a.shape[0] == self.n
            and y.shape[0] == self.n
        )

    def _record(self, r: _Ref, use: _Use) -> None:
        self.uses[r.name].append(use)

    def _embedding(self, r: _Ref, ids, out: Tensor, padding_idx) -> str | None:
        if r.dims != (0, 1) or r.index or not self._batched(ids, out) or out.ndim != ids.ndim + 1:
            return "embedding of a transformed weight or without a batch axis"
        rows = self.shapes[r.name][0]
        n, scale = self.n, r.scale
        ids = ids.reshape(n, -1)
        mask = None
        if padding_idx is not None:  # F.embedding gives the padding row no gradient
            mask = ids != (padding_idx if padding_idx >= 0 else padding_idx + rows)

        def canon_g(gy: Tensor) -> Tensor:  # [C, n, *pos, d] -> [1, n, P, C, d]
            g = scale * gy.reshape(gy.shape[0], n, -1, gy.shape[-1]).permute(1, 2, 0, 3)
            if mask is not None:
                g = g * mask[:, :, None, None]
            return g.unsqueeze(0)

        use = _Use("embedding", ("embedding",), out, canon_g, ids, ((ids, ids._version),))
        self._record(r, use)
        return None

    def _additive(self, r: _Ref, t: Tensor, out: Tensor, other) -> str | None:
        if not self._batched(other, out) or t.ndim > out.ndim:
            return "added to a tensor without a batch axis"
        lead = out.ndim - t.ndim  # out axis lead + k is the view's axis k
        if lead == 0 and t.shape[0] != 1:
            return "added along the batch axis"
        k0 = 1 if lead == 0 else 0  # a size-1 leading view axis broadcasts over examples
        summed = [
            d for d in range(1, out.ndim) if d < lead or (t.shape[d - lead] == 1 != out.shape[d])
        ]
        mapped = sorted(
            (k for k in range(k0, t.ndim) if r.dims[k] is not None), key=lambda k: r.dims[k]
        )
        rest = [k for k in range(k0, t.ndim) if k not in mapped]
        sizes = t.shape[k0:]
        perm = [1, 0, *[k - k0 + 2 for k in (*mapped, *rest)]]
        n, scale = self.n, r.scale

        def canon_g(gy: Tensor) -> Tensor:  # [C, n, ...] -> [1, n, 1, C, O]
            g = gy.sum(dim=[d + 1 for d in summed], keepdim=True) if summed else gy
            g = g.reshape(g.shape[0], n, *sizes).permute(*perm)
            return scale * g.reshape(1, n, 1, gy.shape[0], -1)

        signature = ("additive", _index_key(r.index))
        self._record(r, _Use("additive", signature, out, canon_g, index=r.index))
        return None

    def _einsum(self, r: _Ref, args, t: Tensor, out: Tensor) -> str | None:
        eq, *ops = args
        if len(ops) == 1 and isinstance(ops[0], (list, tuple)):
            ops = list(ops[0])
        if not isinstance(eq, str) or len(ops) != 2:
            return "einsum other than of two operands"
        spec = _parse_einsum(eq, [o.ndim for o in ops])
        if spec is None:
            return "einsum with repeated indices"
        (l0, l1), ly = spec
        if ops[1] is t:
            return self._linear(r, ops[0], t, out, l0, l1, ly)
        return self._linear(r, ops[1], t, out, l1, l0, ly)

    def _linear(self, r: _Ref, a: Tensor, t: Tensor, y: Tensor, la: str, lw: str, ly: str):
        """``y[ly] = sum a[la] * t[lw]`` (einsum notation); t = ``scale * W[index].permute``."""
        if not self._batched(a, y):
            return "input without a batch axis on its first dimension"
        b = la[0]
        if ly[0] != b or b in lw or la.count(b) != 1 or ly.count(b) != 1:
            return "the batch axis is not the first axis of input and output"
        if any(c not in la and c not in ly for c in lw) or None in r.dims:
            return "a weight axis summed without the input, or an inserted axis"
        pdim = {c: r.dims[k] for k, c in enumerate(lw)}  # weight letter -> parameter axis
        S = sorted((c for c in lw if c in la and c in ly), key=pdim.get)
        K = sorted((c for c in lw if c in la and c not in ly), key=pdim.get)
        O = sorted((c for c in lw if c in ly and c not in la), key=pdim.get)
        Pos = [c for c in la[1:] if c in ly and c not in lw]
        R = [c for c in la if c not in lw and c not in ly]
        size = dict(zip(la, a.shape)) | dict(zip(ly, y.shape))
        n, scale = self.n, r.scale
        s_size = math.prod(size[c] for c in S)
        a_kept = a.detach()
        if R:
            a_kept = a_kept.sum(dim=[la.index(c) for c in R])
            la = "".join(c for c in la if c not in R)
        a_c = a_kept.permute(*[la.index(c) for c in (*S, b, *Pos, *K)])
        a_c = scale * a_c.reshape(s_size, n, math.prod(size[c] for c in Pos), -1)
        perm_y = [ly.index(c) + 1 for c in (*S, b, *Pos)] + [0] + [ly.index(c) + 1 for c in O]

        o_size = math.prod(size[c] for c in O)

        def canon_g(gy: Tensor) -> Tensor:  # [C, *y.shape] -> [S, n, P, C, O]
            return gy.permute(*perm_y).reshape(s_size, n, -1, gy.shape[0], o_size)

        signature = ("linear", tuple(pdim[c] for c in S), tuple(pdim[c] for c in K),
                     tuple(pdim[c] for c in O), _index_key(r.index))  # fmt: skip
        use = _Use("linear", signature, y, canon_g, a_c, ((a, a._version),), r.index)
        self._record(r, use)
        return None


def _scalar(v, tracer: _Tracer) -> float | None:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if isinstance(v, Tensor) and v.ndim == 0 and tracer.ref(v) is None and not tracer.is_tainted(v):
        if not v.requires_grad and not v.is_complex():
            return float(v)
    return None


def _permutation(name: str, args, kwargs, ndim: int) -> tuple[int, ...] | None:
    if kwargs:
        return None
    dims = list(range(ndim))
    if name in ("t", "get:T") and ndim <= 2:
        return tuple(reversed(dims))
    if name == "get:mT" and ndim >= 2:
        dims[-1], dims[-2] = dims[-2], dims[-1]
        return tuple(dims)
    if name in ("transpose", "swapaxes", "swapdims") and len(args) == 3:
        i, j = (int(d) % ndim for d in args[1:])
        dims[i], dims[j] = dims[j], dims[i]
        return tuple(dims)
    if name == "permute":
        perm = args[1] if len(args) == 2 and isinstance(args[1], (list, tuple)) else args[1:]
        return tuple(int(d) % ndim for d in perm) if len(perm) == ndim else None
    return None


def _slice_view(r: _Ref, index, ndim: int) -> _Ref | None:
    """The view ``param[slices and None]`` (axes kept, size-1 axes inserted), or None."""
    items = index if isinstance(index, tuple) else (index,)
    if r.dims != tuple(range(ndim)) or not all(
        i is None or (isinstance(i, slice) and i.step in (None, 1)) for i in items
    ):
        return None
    slices = tuple(i for i in items if i is not None)
    if len(slices) > ndim:
        return None
    dims, axis = [], 0
    for i in items:
        dims.append(None if i is None else axis)
        axis += i is not None
    dims += range(axis, ndim)
    trivial = all(s == slice(None) for s in slices)
    return _Ref(r.name, r.scale, tuple(dims), r.index if trivial else r.index + (slices,))


def _index_key(index: tuple) -> tuple:
    return tuple(
        tuple((s.start, s.stop, s.step) for s in (i if isinstance(i, tuple) else (i,)))
        for i in index
    )


def _parse_einsum(eq: str, ndims: list[int]):
    """``((letters of operand 0, of operand 1), output letters)``, ellipses expanded."""
    eq = eq.replace(" ", "")
    lhs, _, rhs = eq.partition("->")
    parts = lhs.split(",")
    free = [c for c in string.ascii_letters if c not in eq]
    n_ell = max(
        (nd - len(p.replace("...", "")) for p, nd in zip(parts, ndims) if "..." in p), default=0
    )
    ell = "".join(free[:n_ell])
    ops = []
    for p, nd in zip(parts, ndims):
        if "..." in p:
            k = nd - len(p.replace("...", ""))
            p = p.replace("...", ell[n_ell - k :])
        if len(set(p)) != len(p) or len(p) != nd:
            return None
        ops.append(p)
    if "->" in eq:
        out = rhs.replace("...", ell)
    else:
        counts = defaultdict(int)
        for p in ops:
            for c in p:
                counts[c] += 1
        out = ell + "".join(sorted(c for c, k in counts.items() if k == 1 and c not in ell))
    if len(set(out)) != len(out):
        return None
    return (ops[0], ops[1]), out


def _signatures_agree(uses: list[_Use]) -> bool:
    return len({(u.kind, u.signature) for u in uses}) == 1


def _cotangents(out: Tensor, ys: list[Tensor]) -> list[Tensor]:
    """``d f_c / d y`` for every output c at once: ``[C, *y.shape]`` per y (zeros if unused)."""
    n, C = out.shape
    if not out.requires_grad or not ys:
        return [torch.zeros(C, *y.shape, dtype=y.dtype, device=y.device) for y in ys]
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
    return [
        torch.zeros(C, *y.shape, dtype=y.dtype, device=y.device) if g is None else g
        for g, y in zip(grads, ys)
    ]


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
        tracer = _Tracer(leaves, x)
        with tracer:
            out = as_2d(model_fn(leaves, x))
        n, C = out.shape
        if n != x.shape[0]:
            raise ValueError(f"model_fn must return one row per example (got {n} for {x.shape[0]})")
        feats = Features(n=n, d_out=C, activation_bytes=tracer.activation_bytes)
        candidates: dict[str, list[_Use]] = {}
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
        # Check: the gradient rebuilt from (a, g) for a random mix of outputs equals autograd's.
        gen = torch.Generator(device=out.device).manual_seed(0)
        mix = torch.randn(C, generator=gen, dtype=out.dtype, device=out.device)
        names = list(pieces)
        grads = [None] * len(names)
        if names and out.requires_grad:
            grads = torch.autograd.grad(
                (out * mix).sum(), [leaves[k] for k in names], allow_unused=True
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
        rebuilt, bound = _rebuilt_gradient(kind, a, g, mix, tuple(params[name].shape))
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
        elif set(f.kind) != plan:
            raise RuntimeError(
                "structured eNTK: a block of examples uses the parameters differently from the "
                f"first one ({sorted(plan ^ set(f.kind))}); use strategy='jacobian'"
            )
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
