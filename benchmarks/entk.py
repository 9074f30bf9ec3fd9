"""Empirical NTK cost: each strategy of ``dynascope.probes.empirical_ntk`` against a naive loop.

Run by hand (not part of the test suite)::

    python benchmarks/entk.py compare [--n 256] [--repeats 3] [--threads 1]
    python benchmarks/entk.py capacity [--threads 1]

Results and how to read them: docs/benchmarks.md (section "eNTK").

Model: the MLP ``32 -> 512 -> 512 -> 1`` (:class:`dynascope.nn.mlp.MLP`, depth 2, NTK
parametrization, ReLU, no bias; three weight layers, P = 278,528), float32, on N inputs
x ~ N(0, I_32). Scalar output, so ``full``, ``trace`` and the Gram agree; the benchmark asks for
``trace`` (``[N, N]``).

(a) ``compare``: wall and CPU time (median of ``--repeats``) and peak memory of
    - ``naive``: a Python loop of N ``torch.autograd.grad`` calls (one per example), the
      per-example gradients stacked into J ``[N, P]``, then ``J @ J.T``;
    - ``jacobian``: ``empirical_ntk(..., strategy="jacobian")`` (vmap'd jacrev, all at once);
    - ``jacobian+chunk``: the same with ``chunk_size=64`` (examples in blocks of 64, one
      parameter tensor at a time);
    - ``jvp_vjp+chunk``: ``strategy="jvp_vjp", chunk_size=64``.
    Every result is checked against the naive kernel (max abs difference / max |K| <= 1e-5,
    float32 round-off over P terms). Ratio: naive time / variant time.
    Peak memory: each variant runs in a fresh subprocess; the number is the growth of the
    process's peak resident set (``resource.getrusage(...).ru_maxrss``) during the call, i.e.
    torch's CPU allocations included (``tracemalloc`` does not see them).
(b) ``capacity``: peak-memory growth of ``jacobian+chunk`` at N = 128, 256, 512. The chunked
    strategy holds one block's Jacobian (64 examples x one parameter tensor) plus the
    ``[N, N]`` kernel (4 N^2 bytes in float32), so peak = a + 4 N^2 bytes with a independent of
    N; the script checks that the measured peaks minus the kernel stay flat, takes a as their
    maximum, and solves a + 4 N^2 B = 8 GiB. An extrapolation from the memory model (running
    N = 46k would take days on a CPU: the cost grows like N^2 / chunk Jacobian blocks).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

import torch

VARIANTS = {
    "naive": None,
    "jacobian": {"strategy": "jacobian", "chunk_size": None},
    "jacobian+chunk": {"strategy": "jacobian", "chunk_size": 64},
    "jvp_vjp+chunk": {"strategy": "jvp_vjp", "chunk_size": 64},
}


def _model_and_data(n: int):
    from dynascope.nn.mlp import MLP

    g = torch.Generator().manual_seed(0)
    model = MLP(32, 512, 1, depth=2, parametrization="ntk", generator=g)
    x = torch.randn(n, 32, generator=g)
    return model, x


def _naive(model, x) -> torch.Tensor:
    params = list(model.parameters())
    rows = []
    for i in range(x.shape[0]):
        out = model(x[i : i + 1])[0, 0]
        grads = torch.autograd.grad(out, params)
        rows.append(torch.cat([g.reshape(-1) for g in grads]))
    J = torch.stack(rows)  # [N, P]
    return J @ J.T


def _kernel(variant: str, model, x) -> torch.Tensor:
    if variant == "naive":
        return _naive(model, x)
    from dynascope.probes.kernels import empirical_ntk, model_function

    fn, params = model_function(model)
    return empirical_ntk(fn, params, x, mode="trace", **VARIANTS[variant])


def _child(variant: str, n: int, threads: int, repeats: int) -> None:
    """Run one variant in this (fresh) process; print a JSON line of its measurements."""
    torch.set_num_threads(threads)
    model, x = _model_and_data(n)
    _kernel(variant, model, x[:4])  # warm-up (imports, first-call costs) on 4 examples
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    walls, cpus = [], []
    K = None
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        K = _kernel(variant, model, x)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before  # KiB on Linux
    ref = _naive(model, x) if variant != "naive" and n <= 512 else K
    err = float((K - ref).abs().max() / ref.abs().max())
    print(json.dumps({"variant": variant, "n": n, "wall_s": statistics.median(walls),
                      "cpu_s": statistics.median(cpus), "peak_growth_mib": peak / 1024,
                      "rel_err_vs_naive": err}))  # fmt: skip


def _spawn(variant: str, n: int, threads: int, repeats: int) -> dict:
    cmd = [sys.executable, __file__, "child", variant, str(n), str(threads), str(repeats)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _header(threads: int) -> None:
    print(f"python {platform.python_version()}, torch {torch.__version__}, threads {threads}, "
          f"cpus {os.cpu_count()}, load avg {os.getloadavg()[0]:.1f}")  # fmt: skip


def compare(n: int, repeats: int, threads: int) -> None:
    _header(threads)
    results = {v: _spawn(v, n, threads, repeats) for v in VARIANTS}
    base = results["naive"]
    print(f"(a) N = {n}, P = 278,528, median of {repeats}")
    print(f"{'variant':<16}{'wall s':>9}{'cpu s':>9}{'wall ratio':>12}{'cpu ratio':>11}"
          f"{'peak MiB':>10}{'rel err':>10}")  # fmt: skip
    for v, r in results.items():
        print(f"{v:<16}{r['wall_s']:>9.3f}{r['cpu_s']:>9.3f}{base['wall_s'] / r['wall_s']:>12.2f}"
              f"{base['cpu_s'] / r['cpu_s']:>11.2f}{r['peak_growth_mib']:>10.1f}"
              f"{r['rel_err_vs_naive']:>10.1e}")  # fmt: skip
    print(f"load avg after: {os.getloadavg()[0]:.1f}")


def capacity(threads: int) -> None:
    _header(threads)
    ns = [128, 256, 512]
    peaks = [_spawn("jacobian+chunk", n, threads, 1)["peak_growth_mib"] for n in ns]
    kernel = [4 * n * n / 2**20 for n in ns]  # trace-mode float32 kernel, MiB
    rest = [p - k for p, k in zip(peaks, kernel)]
    listed = ", ".join(f"{n}: {p:.1f} (kernel {k:.2f})" for n, p, k in zip(ns, peaks, kernel))
    print(f"(b) jacobian+chunk (chunk 64): peak growth MiB at N = {listed}")
    a = max(rest)  # the N-independent part: one chunk's Jacobian and temporaries
    n_max = ((8 * 1024 - a) * 2**20 / 4) ** 0.5
    print(f"(b) N-independent part (max over N): {a:.1f} MiB; model peak = {a:.1f} MiB + 4 N^2 B")
    print(f"(b) largest N within 8 GiB by that model (trace mode, float32): {n_max:,.0f}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        _child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["compare", "capacity"])
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if args.what == "compare":
        compare(args.n, args.repeats, args.threads)
    else:
        capacity(args.threads)


if __name__ == "__main__":
    main()
