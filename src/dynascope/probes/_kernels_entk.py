"""Empirical NTK by torch.func: the Jacobian-contraction and the jvp/vjp strategies (private).

Glossary:
    n1, n2:  examples in ``x1`` and ``x2``.
    d_out:   outputs per example (``model_fn(params, x) -> [n, d_out]``).
    P:       number of parameters in ``params`` (the ones the kernel is taken over).
    J(x):    ``[n, d_out, P]``, the Jacobian of the outputs w.r.t. ``params``.
    Theta:   ``Theta(x, x')_{cc'} = sum_p J(x)_{cp} J(x')_{c'p}``.

Public wrappers and docstrings live in :mod:`dynascope.probes.kernels`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor
from torch.func import jacrev, jvp, vjp, vmap

ModelFn = Callable[[dict[str, Tensor], Tensor], Tensor]


@contextmanager
def quiet_functorch() -> Iterator[None]:
    """Silence two notes torch emits from inside ``torch.func`` that are not the caller's doing.

    - vmap falls back to a per-example loop for ops without a batching rule (e.g. the CPU SDPA
      backward): the result is exact, only slower.
    - the first forward-mode AD call imports torch's jvp decompositions, which build
      ``torch.jit.script`` functions and so warn that ``torch.jit.script`` is deprecated.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="There is a performance drop because")
        warnings.filterwarnings(
            "ignore", message=r"`torch.jit.script` is deprecated", category=DeprecationWarning
        )
        yield


def as_2d(out: Tensor) -> Tensor:
    """Outputs ``[n]`` become ``[n, 1]``; ``[n, d_out]`` stay; anything else is refused."""
    if out.ndim == 1:
        return out[:, None]
    if out.ndim != 2:
        raise ValueError(f"model_fn must return [n, d_out] or [n] (got shape {tuple(out.shape)})")
    return out


def _blocks(n: int, chunk: int | None) -> list[slice]:
    size = n if chunk is None else chunk
    return [slice(i, min(i + size, n)) for i in range(0, n, size)] or [slice(0, 0)]


def _jacobians(model_fn: ModelFn, params: dict[str, Tensor], x: Tensor, names: list[str]):
    """Per-example Jacobians ``{name: [n, d_out, *param.shape]}`` for the tensors ``names``.

    ``vmap`` over examples of ``jacrev`` of one example's outputs: each example costs
    ``d_out`` backward passes of a batch of one (a ``jacrev`` of the whole batch would push
    every basis vector back through all n examples, n times the work).
    """
    frozen = {k: v for k, v in params.items() if k not in names}

    def f_single(sub: dict[str, Tensor], x_i: Tensor) -> Tensor:
        return as_2d(model_fn({**frozen, **sub}, x_i.unsqueeze(0)))[0]  # [d_out]

    sub = {k: params[k] for k in names}
    return vmap(jacrev(f_single), in_dims=(None, 0))(sub, x)


def _contract(j1: dict[str, Tensor], j2: dict[str, Tensor], mode: str) -> Tensor:
    """Sum over parameters of Jacobian products, in the layout of ``mode``."""
    total = None
    for name in j1:
        a = j1[name].reshape(*j1[name].shape[:2], -1)  # [n1, d_out, p]; p = 1 for a scalar
        b = j2[name].reshape(*j2[name].shape[:2], -1)  # [n2, d_out, p]
        if mode == "full":
            part = torch.einsum("icp,jdp->ijcd", a, b)
        elif mode == "trace":
            part = torch.einsum("icp,jcp->ij", a, b)
        else:  # diagonal: paired examples
            part = torch.einsum("icp,icp->ic", a, b)
        total = part if total is None else total + part
    return total


def entk_jacobian(
    model_fn: ModelFn,
    params: dict[str, Tensor],
    x1: Tensor,
    x2: Tensor,
    mode: str,
    chunk_size: int | None,
) -> Tensor:
    """Jacobian strategy; ``chunk_size`` blocks the examples and takes one parameter tensor at a
    time."""
    name_groups = [list(params)] if chunk_size is None else [[k] for k in params]
    if mode == "diagonal":
        rows = []
        for s in _blocks(x1.shape[0], chunk_size):
            block = None
            for names in name_groups:
                j1 = _jacobians(model_fn, params, x1[s], names)
                j2 = j1 if x2 is x1 else _jacobians(model_fn, params, x2[s], names)
                part = _contract(j1, j2, mode)
                block = part if block is None else block + part
            rows.append(block)
        return torch.cat(rows, 0)
    rows = []
    blocks2 = _blocks(x2.shape[0], chunk_size)
    for s1 in _blocks(x1.shape[0], chunk_size):
        cols: list[Tensor | None] = [None] * len(blocks2)
        for names in name_groups:  # J(x1 block) once per tensor; J(x2 blocks) recomputed
            j1 = _jacobians(model_fn, params, x1[s1], names)
            for b, s2 in enumerate(blocks2):
                same = x2 is x1 and s1 == s2
                j2 = j1 if same else _jacobians(model_fn, params, x2[s2], names)
                part = _contract(j1, j2, mode)
                cols[b] = part if cols[b] is None else cols[b] + part
        rows.append(torch.cat(cols, 1))
    return torch.cat(rows, 0)


def _ntk_jvp_vjp_block(
    model_fn: ModelFn, params: dict[str, Tensor], x1: Tensor, x2: Tensor, chunk_size: int | None
) -> Tensor:
    """``Theta(x1, x2)`` ``[n1, n2, d_out, d_out]`` without any Jacobian of x2 in memory.

    For each example i of x1 and output c: ``v = J(x1_i)^T e_c`` by one vjp through that example
    (a parameter-shaped tensor), then ``J(x2) v`` by one jvp through x2; vmapped over the
    examples of x1 in chunks of ``chunk_size`` (all at once when ``None``).
    """

    def f2(p: dict[str, Tensor]) -> Tensor:
        return as_2d(model_fn(p, x2))

    probe = as_2d(model_fn(params, x1[:1]))  # [1, d_out]: the output's width and dtype
    eye = torch.eye(probe.shape[1], dtype=probe.dtype, device=probe.device)

    def row(x_i: Tensor) -> Tensor:  # [d_out, n2, d_out]
        _, vjp_fn = vjp(lambda p: as_2d(model_fn(p, x_i.unsqueeze(0)))[0], params)

        def col(e: Tensor) -> Tensor:
            (tangent,) = vjp_fn(e)
            return jvp(f2, (params,), (tangent,))[1]  # [n2, d_out]

        return vmap(col)(eye)

    rows = vmap(row, chunk_size=chunk_size)(x1)  # [n1, d_out, n2, d_out]
    return rows.permute(0, 2, 1, 3)


def entk_jvp_vjp(
    model_fn: ModelFn,
    params: dict[str, Tensor],
    x1: Tensor,
    x2: Tensor,
    mode: str,
    chunk_size: int | None,
) -> Tensor:
    """jvp/vjp strategy; ``chunk_size`` blocks examples and bounds the vmapped basis chunk."""
    if mode == "diagonal":
        rows = []
        for i in range(x1.shape[0]):  # one example pair at a time: the d_out x d_out diagonal
            block = _ntk_jvp_vjp_block(model_fn, params, x1[i : i + 1], x2[i : i + 1], chunk_size)
            rows.append(torch.diagonal(block[0, 0]))
        return torch.stack(rows, 0)
    rows = []
    for s1 in _blocks(x1.shape[0], chunk_size):
        cols = []
        for s2 in _blocks(x2.shape[0], chunk_size):
            block = _ntk_jvp_vjp_block(model_fn, params, x1[s1], x2[s2], chunk_size)
            if mode == "trace":
                block = torch.diagonal(block, dim1=2, dim2=3).sum(-1)
            cols.append(block)
        rows.append(torch.cat(cols, 1))
    return torch.cat(rows, 0)
