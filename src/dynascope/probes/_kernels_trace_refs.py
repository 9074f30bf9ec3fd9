"""What the structured-eNTK tracer (:mod:`._kernels_trace`, private) knows of a tensor derived
from a parameter (:class:`_Ref`: a scaled, permuted, sliced view of it), and how it reads the
arguments of the ops that derive one: the axis permutation of a transpose or permute, the view
a slice takes, and the operands of a two-operand einsum.
"""

from __future__ import annotations

import string
from collections import defaultdict
from dataclasses import dataclass


@dataclass(frozen=True)
class _Ref:
    """A tensor equal to ``scale * param[index...].permute(dims)``."""

    name: str
    scale: float
    dims: tuple[int, ...]
    index: tuple = ()  # slicing applied to the parameter first (tuples of slices)


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
