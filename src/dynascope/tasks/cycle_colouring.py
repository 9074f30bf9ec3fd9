"""3-colouring of random cycles C_n with neighbour-only attention (von Oswald et al. 2025, Table 2).

Glossary:
    n           ``n_vertices``; vertices are labelled 0..n-1 and token v is vertex v.
    C           ``n_colours`` (3).
    perm        ``[batch, n]``: a uniformly random order of the vertices; the cycle's edges are
                ``(perm[k], perm[k+1 mod n])``, k = 0..n-1 (n edges).
    edges       ``[batch, n, 2]`` int64 vertex pairs.
    attn_mask   bool ``[batch, n, n]``: vertex u attends to its two cycle neighbours (and to
                itself when ``self_loops``).
    x           ``[batch, n, n]`` float: token v is one-hot(v) (identical for every cycle; the
                graph enters only through the mask). The seed is appended per vertex by
                :class:`dynascope.nn.random_inputs.RandomInputs` (``[m, n, d_r]``).
    P(C(u)=c)   the model's colour distribution of vertex u: softmax of its C output logits.

Loss of one (cycle, seed) (the paper's upper bound on the probability of an invalid colouring,
by the union bound over edges, with the vertices' colours drawn independently)::

    L = sum_{(u, v) in E} sum_c P(C(u)=c) P(C(v)=c)

Success of one (cycle, seed): the argmax colouring has no monochromatic edge.

:func:`all_cycles` enumerates every cycle on n labelled vertices once ((n-1)!/2 of them,
181,440 for n = 10) for exhaustive evaluation.

References:
    von Oswald, Kobayashi, Akram, Steger (2025), "Learning Randomized Algorithms with
    Transformers", ICLR, arXiv 2408.10818, sec. 4.2 and Table 2.
"""

from __future__ import annotations

import itertools

import torch
from torch import Tensor

from .base import _check_int

__all__ = ["CycleColouring", "all_cycles", "conflicts", "expected_conflicts"]


def expected_conflicts(logits: Tensor, edges: Tensor) -> Tensor:
    """Expected number of monochromatic edges under independent per-vertex colour draws.

    Args:
        logits: ``[..., n, C]`` colour logits per vertex.
        edges: int64 ``[..., n_edges, 2]`` vertex pairs; its leading axes broadcast with the
            logits' (e.g. ``[batch, 1, n, 2]`` against ``[batch, m, n, C]``).
    Returns:
        ``[...]``: ``sum_{(u,v)} sum_c p_u(c) p_v(c)``, in ``[0, n_edges]``.
    References:
        von Oswald et al. (2025), arXiv 2408.10818, sec. 4.2.
    """
    p = logits.softmax(dim=-1)
    shape = torch.broadcast_shapes(p.shape[:-2], edges.shape[:-2])
    p = p.expand(*shape, *p.shape[-2:])
    edges = edges.expand(*shape, *edges.shape[-2:])
    C = p.shape[-1]
    pu = p.gather(-2, edges[..., 0:1].expand(*edges.shape[:-1], C))  # [..., n_edges, C]
    pv = p.gather(-2, edges[..., 1:2].expand(*edges.shape[:-1], C))
    return (pu * pv).sum(dim=(-1, -2))


def conflicts(colours: Tensor, edges: Tensor) -> Tensor:
    """Number of monochromatic edges of a colouring.

    Args:
        colours: int64 ``[..., n]``.
        edges: int64 ``[..., n_edges, 2]``, broadcasting with ``colours``' leading axes.
    Returns:
        int64 ``[...]``.
    """
    shape = torch.broadcast_shapes(colours.shape[:-1], edges.shape[:-2])
    colours = colours.expand(*shape, colours.shape[-1])
    edges = edges.expand(*shape, *edges.shape[-2:])
    cu = colours.gather(-1, edges[..., 0])
    cv = colours.gather(-1, edges[..., 1])
    return (cu == cv).long().sum(dim=-1)


def all_cycles(n: int) -> Tensor:
    """Every cycle on n >= 3 labelled vertices once, as vertex orders ``[(n-1)!/2, n]``.

    Each cycle is written starting at vertex 0, in the direction whose second vertex is smaller
    than its last (rotations and reflections removed).

    Raises:
        ValueError: if ``n < 3`` or ``n > 11`` (the enumeration would exceed 1.8M cycles).
    """
    if isinstance(n, bool) or not isinstance(n, int) or not 3 <= n <= 11:
        raise ValueError(f"n must be an int in [3, 11] (got n={n!r})")
    rows = [(0, *p) for p in itertools.permutations(range(1, n)) if p[0] < p[-1]]
    return torch.tensor(rows, dtype=torch.long)


class CycleColouring:
    """Random cycles C_n to be 3-coloured by vertices that see only their neighbours.

    Args:
        n_vertices: n, ``>= 3``.
        n_colours: C, ``>= 2``.
        self_loops: whether a vertex also attends to itself.
    Raises:
        ValueError: if an argument is out of range.
    References:
        von Oswald et al. (2025), arXiv 2408.10818, sec. 4.2.
    """

    def __init__(self, *, n_vertices: int = 10, n_colours: int = 3, self_loops: bool = True):
        _check_int("n_vertices", n_vertices, 3)
        _check_int("n_colours", n_colours, 2)
        self.n_vertices = n_vertices
        self.n_colours = n_colours
        self.self_loops = self_loops
        self.d_in = n_vertices
        self.n_ctx = n_vertices
        self.d_out = n_colours

    def from_orders(self, perm: Tensor) -> dict[str, Tensor]:
        """The batch for given vertex orders ``perm [batch, n]`` (each row a permutation).

        Returns:
            ``x`` ``[batch, n, n]``, ``edges`` ``[batch, n, 2]``, ``attn_mask`` ``[batch, n, n]``.
        Raises:
            ValueError: if ``perm`` is not ``[batch, n]``.
        """
        n = self.n_vertices
        if perm.ndim != 2 or perm.shape[1] != n:
            raise ValueError(f"perm must be [batch, n={n}] (got {list(perm.shape)})")
        batch = perm.shape[0]
        edges = torch.stack([perm, perm.roll(-1, dims=1)], dim=-1)  # [batch, n, 2]
        mask = torch.zeros(batch, n, n, dtype=torch.bool, device=perm.device)
        rows = torch.arange(batch, device=perm.device)[:, None]
        mask[rows, edges[..., 0], edges[..., 1]] = True
        mask[rows, edges[..., 1], edges[..., 0]] = True
        if self.self_loops:
            mask |= torch.eye(n, dtype=torch.bool, device=perm.device)
        x = torch.eye(n, device=perm.device).expand(batch, n, n)
        return {"x": x, "edges": edges, "attn_mask": mask}

    def batch(self, batch_size: int, generator: torch.Generator) -> dict[str, Tensor]:
        """Draw ``batch_size`` cycles, vertex orders ``torch.rand([batch, n]).argsort(-1)``.

        Raises:
            ValueError: if ``batch_size`` is not an int >= 1.
        """
        _check_int("batch_size", batch_size, 1)
        u = torch.rand(batch_size, self.n_vertices, generator=generator, device=generator.device)
        return self.from_orders(u.argsort(dim=-1))

    def per_seed_loss(self, output: Tensor, batch: dict[str, Tensor]) -> Tensor:
        """Expected conflicts per (cycle, seed) of logits ``[batch, m, n, C]`` -> ``[batch, m]``.

        Raises:
            ValueError: if ``output`` is not ``[batch, m, n, C]``.
        """
        self._check(output, batch)
        return expected_conflicts(output, batch["edges"][:, None])

    def correct(self, output: Tensor, batch: dict[str, Tensor]) -> Tensor:
        """Bool ``[batch, m]``: the argmax colouring is proper.

        Raises:
            ValueError: if ``output`` is not ``[batch, m, n, C]``.
        """
        self._check(output, batch)
        return conflicts(output.argmax(dim=-1), batch["edges"][:, None]) == 0

    def _check(self, output: Tensor, batch: dict[str, Tensor]) -> None:
        b = batch["edges"].shape[0]
        if (
            output.ndim != 4
            or output.shape[0] != b
            or output.shape[2:]
            != (
                self.n_vertices,
                self.n_colours,
            )
        ):
            raise ValueError(
                f"output must be [batch={b}, m, n={self.n_vertices}, C={self.n_colours}] "
                f"(got {list(output.shape)})"
            )
