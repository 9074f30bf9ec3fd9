"""Find how each parameter enters a forward pass: the tracer of the structured eNTK (private).

``model_fn`` runs under a ``TorchFunctionMode`` that follows every tensor derived from a
parameter (scaled by a constant, negated, transposed, sliced, given size-1 axes) and every
tensor computed from the inputs x. Each use of a parameter it understands is recorded with what
the structured kernel needs:

- linear: ``y = a W`` by ``x @ W``, ``F.linear``, ``torch.matmul`` or a two-operand einsum
  (dynascope's W_Q/W_K/W_V/W_O), with the input a; weight axes are split into S (shared with
  a and y), K (contracted with a) and O (indexing y); the other axes of a and y besides the
  first (examples) are positions P;
- embedding: ``W[ids]`` or ``F.embedding`` (a padding row gets no gradient), with the ids;
- additive: ``y = h + b`` (a bias, a positional embedding ``W_pos[:pos]``).

Any other use (LayerNorm, ``torch.cat`` of weights, an in-place op, two parameters in one op
other than ``F.linear``'s weight and bias, an input without the example axis first) marks the
parameter for the fallback, with a reason. Tensors are followed by ``id`` with weak references,
so nothing is kept alive beyond the forward.
"""

from __future__ import annotations

import math
import string
import weakref
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from ._kernels_trace_refs import _index_key, _parse_einsum, _permutation, _Ref, _slice_view

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


@dataclass
class Use:
    """One recorded use of a parameter: what to keep and how to lay out its cotangent."""

    kind: str  # "linear", "embedding" or "additive"
    signature: tuple  # uses of one parameter concatenate only with equal signatures
    y: Tensor  # the op's output; its cotangent is g
    canon_g: Callable[[Tensor], Tensor]  # [C, *y.shape] -> [S, n, P, C, O]
    a: Tensor | None = None  # linear: [S, n, P, K]; embedding: ids [n, P]
    versions: tuple = ()  # (tensor, version) pairs that must not change after recording
    index: tuple = ()  # the parameter's slicing before this use


class Tracer(TorchFunctionMode):
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
        self.uses: dict[str, list[Use]] = defaultdict(list)
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
        if name == "addmm":  # addmm(b, x, W): GPT-2's Conv1D
            x_in = args[1] if len(args) > 1 else kwargs.get("mat1")
        separate = name in ("linear", "addmm") and len(tracked) == 2 and self.ref(x_in) is None
        if len(tracked) > 1 and not separate:
            for _, r in tracked:
                self.bad.setdefault(r.name, f"used with another parameter in {name}")
            return out
        in_place = name.endswith("_") and not name.startswith("__") or name.startswith("__i")
        for t, r in tracked:
            if in_place:
                self.bad.setdefault(r.name, f"modified in place by {name}")
            elif not (len(outs) == 1 and outs[0] is t):  # identity ops (contiguous, to)
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
        if name == "addmm":
            if kwargs or len(args) != 3 or not isinstance(args[1], Tensor) or args[1].ndim != 2:
                return "addmm with beta, alpha or this argument layout"
            if t is args[2] and t.ndim == 2:
                return self._linear(r, args[1], t, out, "bk", "ko", "bo")
            if t is args[0]:
                return self._additive(r, t, out, args[1])
            return "addmm with the parameter as the input"
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

    def _batched(self, a, y, flat: bool = True) -> bool:
        """a (computed from x) and y lead with the examples: ``n``, or with ``flat``
        ``n * k`` (examples and positions flattened example-major, as ``x.view(-1, d)``)."""
        if not (isinstance(a, Tensor) and self.is_tainted(a) and a.ndim >= 1 and y.ndim >= 1):
            return False
        lead = a.shape[0]
        ok = lead == self.n or (flat and lead > 0 and lead % self.n == 0)
        return ok and y.shape[0] == lead

    def _record(self, r: _Ref, use: Use) -> None:
        self.uses[r.name].append(use)

    def _embedding(self, r: _Ref, ids, out: Tensor, padding_idx) -> str | None:
        if (
            r.dims != (0, 1)
            or r.index
            or not self._batched(ids, out, flat=False)
            or out.ndim != ids.ndim + 1
        ):
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

        use = Use("embedding", ("embedding",), out, canon_g, ids, ((ids, ids._version),))
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

        def canon_g(gy: Tensor) -> Tensor:  # [C, n (* k), ...] -> [1, n, 1, C, O]
            g = gy.sum(dim=[d + 1 for d in summed], keepdim=True) if summed else gy
            g = g.reshape(g.shape[0], n, -1, *sizes).sum(2).permute(*perm)
            return scale * g.reshape(1, n, 1, gy.shape[0], -1)

        signature = ("additive", _index_key(r.index))
        self._record(r, Use("additive", signature, out, canon_g, index=r.index))
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
        a_c = scale * a_c.reshape(s_size, n, -1, math.prod(size[c] for c in K))  # P absorbs a
        # flattened leading axis n * k
        perm_y = [ly.index(c) + 1 for c in (*S, b, *Pos)] + [0] + [ly.index(c) + 1 for c in O]

        o_size = math.prod(size[c] for c in O)

        def canon_g(gy: Tensor) -> Tensor:  # [C, *y.shape] -> [S, n, P, C, O]
            return gy.permute(*perm_y).reshape(s_size, n, -1, gy.shape[0], o_size)

        signature = ("linear", tuple(pdim[c] for c in S), tuple(pdim[c] for c in K),
                     tuple(pdim[c] for c in O), _index_key(r.index))  # fmt: skip
        use = Use("linear", signature, y, canon_g, a_c, ((a, a._version),), r.index)
        self._record(r, use)
        return None


def _scalar(v, tracer: Tracer) -> float | None:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if isinstance(v, Tensor) and v.ndim == 0 and tracer.ref(v) is None and not tracer.is_tainted(v):
        if not v.requires_grad and not v.is_complex():
            return float(v)
    return None
