"""Peak-memory estimates of the eNTK strategies, from one traced example (private).

An estimate, not a measurement: it counts the large tensors each strategy holds at once
(Jacobians, tangents, cotangents, the Gram pieces of the structured strategy, the kernel) and,
for the activations, every tensor the forward computes from one example (an upper bound on what
autograd saves), times the copies each strategy batches. ``benchmarks/entk.py`` compares it with
measured peaks (docs/benchmarks.md, section "eNTK").

Glossary: e bytes per element; C = d_out; b1, b2 examples per block (``chunk_size`` or all);
act = bytes the forward computes per example; P = parameters in the kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from dynascope.probes._kernels_entk import ModelFn
from dynascope.probes._kernels_structured import features

STRATEGIES = ("structured", "jacobian", "jvp_vjp")


@dataclass
class Summary:
    """What the estimates need, read from one traced example."""

    itemsize: int
    d_out: int
    activation_bytes: int  # per example
    numel: dict[str, int]  # parameter sizes
    structured: dict[str, tuple[int, int, int]]  # name -> (positions P, S, per-example g size)


def summarize(model_fn: ModelFn, params: dict[str, Tensor], x: Tensor) -> Summary:
    """Trace one example of ``x`` (the structured strategy's features) and keep the sizes."""
    f = features(model_fn, params, x[:1])
    first = next(iter(params.values()))
    structured = {}
    for name, kind in f.kind.items():
        if kind != "unused":
            g = f.g[name]  # [S, 1, P, C, O]
            structured[name] = (g.shape[2], g.shape[0], g.numel())
        else:
            structured[name] = (0, 0, 0)
    return Summary(
        itemsize=first.element_size(),
        d_out=f.d_out,
        activation_bytes=f.activation_bytes,
        numel={k: v.numel() for k, v in params.items()},
        structured=structured,
    )


def _kernel_bytes(s: Summary, n1: int, n2: int, mode: str) -> int:
    C = s.d_out
    return s.itemsize * {"full": n1 * n2 * C * C, "trace": n1 * n2, "diagonal": n1 * C}[mode]


def _jacobian(s: Summary, names: list[str], b1: int, b2: int, same: bool, chunked: bool) -> int:
    if not names:
        return 0
    C, e = s.d_out, s.itemsize
    width = max(s.numel[k] for k in names) if chunked else sum(s.numel[k] for k in names)
    jac = (b1 + (0 if same else b2)) * C * width * e  # J of both blocks
    return jac + max(b1, b2) * C * s.activation_bytes  # d_out cotangents per activation


def estimate(
    s: Summary, n1: int, n2: int, same: bool, mode: str, strategy: str, chunk: int | None
) -> int:
    """Estimated peak bytes of ``strategy`` (beyond the model and inputs)."""
    b1 = n1 if chunk is None else min(chunk, n1)
    b2 = n2 if chunk is None else min(chunk, n2)
    if mode == "diagonal":  # paired blocks
        b2 = b1
    C, e, act = s.d_out, s.itemsize, s.activation_bytes
    out = _kernel_bytes(s, n1, n2, mode)
    if strategy == "jacobian":
        return out + _jacobian(s, list(s.numel), b1, b2, same, chunk is not None)
    if strategy == "jvp_vjp":
        rows = b1 if mode != "diagonal" else 1
        P = sum(s.numel.values())
        return out + rows * C * P * e + rows * C * b2 * act
    blocks = b1 + (0 if same else b2)
    part = blocks * (1 + C) * act  # forward of each block and its d_out cotangents
    part += blocks * e * sum(g for _, _, g in s.structured.values())  # the kept g
    temp = 0
    for P, _, _ in s.structured.values():  # positions of the first and second block coincide
        if mode == "full":
            temp = max(temp, (b1 * P * C) * (b2 * P * C) * e + b1 * P * b2 * P * e)
        elif mode == "trace":
            temp = max(temp, 2 * b1 * P * b2 * P * e)
        else:
            temp = max(temp, b1 * P * P * (C + 1) * e)
    rest = [k for k in s.numel if k not in s.structured]
    return out + max(part + temp, _jacobian(s, rest, b1, b2, same, chunk is not None))
