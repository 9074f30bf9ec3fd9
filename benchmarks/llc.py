"""Cost and accuracy of the LLC estimator (dynascope.probes.llc) on models with known λ.

Run by hand (not part of the test suite)::

    python benchmarks/llc.py [--seeds 0 1]

Each case is the one of tests/probes/test_llc.py, rebuilt here so the script stands alone
(n = 4096 noiseless samples in batches of 64, nβ = n / log n, float64):
(a) linear regression, d = 10, λ = 5; (b) y = a·b·x at ab = 1, λ = 1/2; (c) reduced-rank
regression M = N = H = 3, true rank 1, λ = 4 (Aoyagi & Watanabe 2005). For each case and seed:
``llc_calibrate`` (4 chains x 1000 draws per run) chooses ε and γ, then ``llc`` measures at
those settings with 8 chains x 1000 draws (burn-in 250 each). Printed per row: the calibrated
settings (as ε·nβ and γ/nβ), the runs calibration took, λ̂ and its standard error, the error
against λ, and the process CPU seconds and wall seconds of calibration and of the final run
(one intra-op thread). Results: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import math
import time
from functools import partial

import torch

from dynascope.probes import default_n_beta, llc, llc_calibrate

N, BATCH, F64 = 4096, 64, torch.float64


def _batches(x: torch.Tensor, y: torch.Tensor) -> list[dict[str, torch.Tensor]]:
    return [{"x": x[i : i + BATCH], "y": y[i : i + BATCH]} for i in range(0, N, BATCH)]


def linear(g: torch.Generator):
    x = torch.randn(N, 10, generator=g, dtype=F64)
    w0 = torch.randn(10, generator=g, dtype=F64)
    loss = lambda p, b: 0.5 * ((b["x"] @ p["w"] - b["y"]) ** 2).mean()  # noqa: E731
    return loss, {"w": w0}, _batches(x, x @ w0), 5.0


def product(g: torch.Generator):
    x = torch.randn(N, generator=g, dtype=F64)
    one = torch.tensor(1.0, dtype=F64)
    loss = lambda p, b: 0.5 * ((p["a"] * p["b"] * b["x"] - b["y"]) ** 2).mean()  # noqa: E731
    return loss, {"a": one, "b": one.clone()}, _batches(x, x), 0.5


def reduced_rank(g: torch.Generator):
    x = torch.randn(N, 3, generator=g, dtype=F64)
    A0, B0 = torch.zeros(3, 3, dtype=F64), torch.zeros(3, 3, dtype=F64)
    A0[:1] = torch.randn(1, 3, generator=g, dtype=F64)
    B0[:, :1] = torch.randn(3, 1, generator=g, dtype=F64)
    loss = lambda p, b: 0.5 * ((b["x"] @ (p["B"] @ p["A"]).T - b["y"]) ** 2).sum(-1).mean()  # noqa: E731
    return loss, {"A": A0, "B": B0}, _batches(x, x @ (B0 @ A0).T), 4.0


def _timed(fn):
    cpu, wall = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.process_time() - cpu, time.perf_counter() - wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    seeds = parser.parse_args().seeds
    torch.set_num_threads(1)
    n_beta = default_n_beta(N)
    print(f"n={N}, n_beta={n_beta:.1f}; final run 8 chains x 1000 draws (+250 burn-in)")
    print("case  seed  eps*nb  gamma/nb  runs  lambda  lambda_hat  stderr  error%  "
          "cal_cpu_s  cal_wall_s  run_cpu_s  run_wall_s")  # fmt: skip
    for name, build in [("a", linear), ("b", product), ("c", reduced_rank)]:
        for seed in seeds:
            loss, params, batches, known = build(torch.Generator().manual_seed(seed))
            cal, cal_cpu, cal_wall = _timed(
                partial(
                    llc_calibrate,
                    loss,
                    params,
                    batches,
                    n_beta=n_beta,
                    n_chains=4,
                    n_draws=1000,
                    seed=seed,
                )  # fmt: skip
            )
            result, cpu, wall = _timed(
                partial(
                    llc,
                    loss,
                    params,
                    batches,
                    n_beta=n_beta,
                    localization=cal.localization,
                    step_size=cal.step_size,
                    n_chains=8,
                    n_draws=1000,
                    seed=seed + 1,
                )  # fmt: skip
            )
            stderr = result.std / math.sqrt(8)
            error = 100 * (result.mean - known) / known
            print(
                f"{name:4s}  {seed:4d}  {cal.step_size * n_beta:6.4f}  "
                f"{cal.localization / n_beta:8.0e}  {len(cal.tried):4d}  {known:6.2f}  "
                f"{result.mean:10.3f}  {stderr:6.3f}  {error:+6.1f}  {cal_cpu:9.1f}  "
                f"{cal_wall:10.1f}  {cpu:9.1f}  {wall:10.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
