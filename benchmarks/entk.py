"""Empirical NTK cost: each strategy of ``dynascope.probes.empirical_ntk`` against a naive loop.

Run by hand (not part of the test suite)::

    python benchmarks/entk.py compare [--n 256] [--repeats 3] [--threads 1]
    python benchmarks/entk.py capacity [--threads 1]
    python benchmarks/entk.py nt [--runs 3] [--repeats 5] [--implementations 1,2,3]
        [--nt-python /work/venv-nt/bin/python]

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
(c) ``nt``: side by side with neural-tangents (run by hand, outside CI; needs a separate venv,
    see docs/benchmarks.md). The MLP ``32 -> 512 -> 512 -> 10`` (same class, no bias, NTK
    parametrization, float32) on 128 inputs; its weights and inputs are saved to an ``.npz``
    that both sides load, so they compute the same function. dynascope:
    ``empirical_ntk(strategy="structured")``, full ``[128, 128, 10, 10]`` and trace
    ``[128, 128]`` kernels, one intra-op thread; neural-tangents: ``empirical_ntk_fn`` with
    ``implementation`` 1, 2 and/or 3 (``benchmarks/entk_neural_tangents.py``, run by the venv's
    python, one XLA thread), after a compile call. Each side runs in its own fresh process,
    alternating, ``--runs`` times; each reports the median of ``--repeats`` calls. Reported:
    both times per run, the ratio dynascope / neural-tangents' fastest implementation, and the
    median ratio over runs; the kernels are checked against each other (relative max
    difference; neural-tangents' trace is an average over outputs and is multiplied by 10).
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


NT_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "entk_neural_tangents.py")


def _nt_weights(path: str) -> None:
    """Save the MLP 32-512-512-10 (seed 0) and 128 inputs for both sides."""
    import numpy as np

    from dynascope.nn.mlp import MLP

    g = torch.Generator().manual_seed(0)
    model = MLP(32, 512, 10, depth=2, parametrization="ntk", generator=g)
    x = torch.randn(128, 32, generator=g)
    arrays = {k: v.detach().numpy() for k, v in model.named_parameters()}
    np.savez(path, x=x.numpy(), **arrays)


def _dynascope_child(path: str, repeats: int) -> None:
    """Time the structured eNTK on the saved weights (one thread); print a JSON line."""
    import numpy as np

    from dynascope.nn.mlp import MLP
    from dynascope.probes.kernels import empirical_ntk, empirical_ntk_memory, model_function

    torch.set_num_threads(1)
    data = np.load(path)
    model = MLP(32, 512, 10, depth=2, parametrization="ntk")
    with torch.no_grad():
        for k, p in model.named_parameters():
            p.copy_(torch.from_numpy(data[k]))
    x = torch.from_numpy(data["x"])
    fn, params = model_function(model)
    estimate = empirical_ntk_memory(fn, params, x, mode="full")["structured"]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times, kernels = {}, {}
    for mode in ("full", "trace"):
        empirical_ntk(fn, params, x, mode=mode, strategy="structured")  # warm-up
        if mode == "full":  # peak growth of the first full call (KiB on Linux)
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        walls, cpus = [], []
        for _ in range(repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            K = empirical_ntk(fn, params, x, mode=mode, strategy="structured")
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
        times[mode] = statistics.median(walls)
        times[mode + "/cpu"] = statistics.median(cpus)
        kernels[mode] = K.numpy()
    np.savez(path.replace(".npz", ".dyn.npz"), **kernels)
    memory = {"estimate_mib": estimate / 2**20, "peak_growth_mib": peak / 1024}
    print(json.dumps({"times": times, "memory": memory}))


def neural_tangents(runs: int, repeats: int, implementations: str, nt_python: str) -> None:
    import tempfile

    import numpy as np

    _header(1)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "mlp.npz")
        _nt_weights(path)
        rows = []
        for run in range(runs):
            cmd = [sys.executable, __file__, "dyn-child", path, str(repeats)]
            dyn = json.loads(
                subprocess.run(cmd, check=True, capture_output=True, text=True)
                .stdout.strip()
                .splitlines()[-1]
            )
            env = {**os.environ, "OMP_NUM_THREADS": "1", "NT_IMPLEMENTATIONS": implementations}
            out = subprocess.run(
                [nt_python, NT_SCRIPT, path, str(repeats)],
                check=True,
                capture_output=True,
                text=True,
                env=env,
            ).stdout
            nt = json.loads(out.strip().splitlines()[-1])
            rows.append((dyn["times"], nt["times"]))
            mem = dyn["memory"]
            print(
                f"run {run + 1}: load avg {os.getloadavg()[0]:.1f}; jax {nt['jax']}, "
                f"neural-tangents {nt['neural_tangents']}; structured full: memory estimate "
                f"{mem['estimate_mib']:.1f} MiB, peak growth {mem['peak_growth_mib']:.1f} MiB"
            )
        ours = np.load(path.replace(".npz", ".dyn.npz"))
        theirs = np.load(path.replace(".npz", ".nt.npz"))
        for mode in ("full", "trace"):
            ref = ours[mode]
            for key in theirs.files:
                if key.endswith(mode):
                    err = np.abs(theirs[key] - ref).max() / np.abs(ref).max()
                    print(
                        f"values {mode}: neural-tangents implementation {key[0]} vs dynascope: "
                        f"relative max difference {err:.1e}"
                    )
    impls = implementations.split(",")
    print("seconds per call (median of repeats), wall / CPU")
    print(
        f"{'mode':<7}{'run':>4}{'dynascope':>18}"
        + "".join(f"{'nt impl ' + i:>18}" for i in impls)
        + f"{'ratio wall':>12}{'ratio CPU':>11}"
    )
    for mode in ("full", "trace"):
        ratios, cpu_ratios = [], []
        for run, (dyn, nt) in enumerate(rows):
            best = min(impls, key=lambda i: nt[f"{i}/{mode}"])
            ratios.append(dyn[mode] / nt[f"{best}/{mode}"])
            cpu_ratios.append(dyn[mode + "/cpu"] / nt[f"{best}/{mode}/cpu"])
            cells = [
                f"{d[0]:.4f} / {d[1]:.4f}"
                for d in [(dyn[mode], dyn[mode + "/cpu"])]
                + [(nt[f"{i}/{mode}"], nt[f"{i}/{mode}/cpu"]) for i in impls]
            ]
            print(
                f"{mode:<7}{run + 1:>4}"
                + "".join(f"{c:>18}" for c in cells)
                + f"{ratios[-1]:>12.2f}{cpu_ratios[-1]:>11.2f}"
            )
        print(
            f"{mode}: median ratio dynascope / neural-tangents fastest: wall "
            f"{statistics.median(ratios):.2f}, CPU {statistics.median(cpu_ratios):.2f}"
        )
    print(f"load avg after: {os.getloadavg()[0]:.1f}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        _child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "dyn-child":
        _dynascope_child(sys.argv[2], int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["compare", "capacity", "nt"])
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--implementations", default="1,2,3")
    parser.add_argument("--nt-python", default="/work/venv-nt/bin/python")
    args = parser.parse_args()
    if args.what == "compare":
        compare(args.n, args.repeats, args.threads)
    elif args.what == "nt":
        neural_tangents(args.runs, args.repeats, args.implementations, args.nt_python)
    else:
        capacity(args.threads)


if __name__ == "__main__":
    main()
