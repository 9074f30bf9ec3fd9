"""Private helpers of :mod:`dynascope.probes.fisher`: flat parameter vectors and chunked
Jacobian products of a batched scalar score, all through ``torch.func``.

Glossary:
    params:   ``dict[str, Tensor]``, the model's parameters (any shapes); P = total entries.
    x:        inputs, a Tensor ``[N, ...]`` or a tuple of Tensors sharing the leading N.
    score_fn: ``score_fn(params, x) -> [N]``, one scalar score per example.
    J:        ``[N, P]``, ``J[i, p] = d score(x_i) / d theta_p`` (never formed except by
              :func:`score_jacobian`, the exact path and test oracle).

Flattening follows the dict's insertion order, each tensor in C order (``reshape(-1)``).

``torch.func.jvp`` loads its decomposition table on first use, and in torch 2.13 that module
calls ``torch.jit.script``, which warns ``DeprecationWarning`` (an error under the test
suite's ``filterwarnings = error``). The table is loaded here once with that one warning
silenced; nothing else is filtered.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor
from torch.utils._pytree import tree_flatten, tree_map

with warnings.catch_warnings():
    warnings.filterwarnings(
        "ignore", message=r"`torch.jit.script` is deprecated", category=DeprecationWarning
    )
    import torch._decomp.decompositions_for_jvp  # noqa: F401  (see the module docstring)

ScoreFn = Callable[[dict[str, Tensor], Any], Tensor]


def flatten(tree: dict[str, Tensor]) -> Tensor:
    """Concatenate the dict's tensors (C order, insertion order) into ``[P]``."""
    return torch.cat([t.reshape(-1) for t in tree.values()])


def flatten_rows(tree: dict[str, Tensor], n: int) -> Tensor:
    """Per-row flattening of a dict of ``[n, *shape]`` tensors into ``[n, P]``."""
    return torch.cat([t.reshape(n, -1) for t in tree.values()], dim=1)


def unflatten(vec: Tensor, like: dict[str, Tensor]) -> dict[str, Tensor]:
    """Inverse of :func:`flatten`: ``[P]`` back into tensors shaped like ``like``."""
    out, start = {}, 0
    for name, t in like.items():
        out[name] = vec[start : start + t.numel()].reshape(t.shape)
        start += t.numel()
    return out


def n_params(params: dict[str, Tensor]) -> int:
    return sum(t.numel() for t in params.values())


def n_examples(x: Any) -> int:
    """Leading size N of a Tensor or tuple of Tensors.

    Raises:
        ValueError: if ``x`` holds no tensor, a 0-d tensor, or tensors of different N.
    """
    leaves = [t for t in tree_flatten(x)[0] if isinstance(t, Tensor)]
    if not leaves or any(t.ndim == 0 for t in leaves):
        raise ValueError("x must be a Tensor [N, ...] or a tuple of such Tensors (got none)")
    sizes = {t.shape[0] for t in leaves}
    if len(sizes) != 1:
        raise ValueError(f"x: every tensor must share the leading size N (got {sorted(sizes)})")
    return leaves[0].shape[0]


def chunks(x: Any, chunk_size: int | None) -> Iterator[tuple[slice, Any]]:
    """``(rows, x[rows])`` over consecutive row blocks of at most ``chunk_size`` (all if None)."""
    n = n_examples(x)
    size = n if chunk_size is None else chunk_size
    for start in range(0, n, size):
        rows = slice(start, min(start + size, n))
        yield rows, tree_map(lambda t, r=rows: t[r] if isinstance(t, Tensor) else t, x)


def _single(score_fn: ScoreFn) -> Callable[[dict[str, Tensor], Any], Tensor]:
    """The score of one example (no leading dim) as a 0-d tensor, for ``vmap(grad(...))``."""

    def one(params: dict[str, Tensor], xi: Any) -> Tensor:
        batched = tree_map(lambda t: t.unsqueeze(0) if isinstance(t, Tensor) else t, xi)
        return score_fn(params, batched).reshape(())

    return one


def score_jacobian(score_fn: ScoreFn, params: dict[str, Tensor], x: Any, chunk_size: int | None):
    """Explicit ``J`` ``[N, P]`` by ``vmap(grad)`` over examples, chunked over examples."""
    per_example = torch.func.vmap(torch.func.grad(_single(score_fn)), in_dims=(None, 0))
    rows = []
    for sl, xc in chunks(x, chunk_size):
        rows.append(flatten_rows(per_example(params, xc), sl.stop - sl.start))
    return torch.cat(rows)


def squared_centred_grads(
    score_fn: ScoreFn, params: dict[str, Tensor], x: Any, mean: Tensor, chunk_size: int | None
) -> Tensor:
    """``sum_i (J[i] - mean)^2`` ``[P]``, accumulated chunk by chunk (P floats of state)."""
    per_example = torch.func.vmap(torch.func.grad(_single(score_fn)), in_dims=(None, 0))
    total = torch.zeros_like(mean)
    for sl, xc in chunks(x, chunk_size):
        g = flatten_rows(per_example(params, xc), sl.stop - sl.start)
        total = total + (g - mean).square().sum(dim=0)
    return total


def jvp_columns(
    score_fn: ScoreFn, params: dict[str, Tensor], x: Any, W: Tensor, chunk_size: int | None
) -> Tensor:
    """``J @ W`` ``[N, m]`` for ``W`` ``[P, m]``: one forward-mode JVP per column (vmapped)."""
    out = []
    for _, xc in chunks(x, chunk_size):

        def one(w: Tensor, xc: Any = xc) -> Tensor:
            tangent = unflatten(w, params)
            return torch.func.jvp(lambda p: score_fn(p, xc), (params,), (tangent,))[1]

        out.append(torch.func.vmap(one, in_dims=1, out_dims=1)(W))
    return torch.cat(out)


def vjp_columns(
    score_fn: ScoreFn, params: dict[str, Tensor], x: Any, U: Tensor, chunk_size: int | None
) -> Tensor:
    """``J^T @ U`` ``[P, m]`` for ``U`` ``[N, m]``: one reverse pass, vmapped over columns."""
    total = None
    for sl, xc in chunks(x, chunk_size):
        _, pullback = torch.func.vjp(lambda p, xc=xc: score_fn(p, xc), params)

        def one(u: Tensor, pullback: Callable = pullback) -> Tensor:
            return flatten(pullback(u)[0])

        part = torch.func.vmap(one, in_dims=1, out_dims=1)(U[sl])
        total = part if total is None else total + part
    return total
