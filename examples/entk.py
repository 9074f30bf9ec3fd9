"""Empirical NTK (eNTK) of a small MLP and of dynascope's Transformer, strategy by strategy.

``dynascope.probes.empirical_ntk`` computes ``Theta(x, x')_{cc'}`` exactly by three strategies
(``structured``, ``jacobian``, ``jvp_vjp``); ``empirical_ntk_memory`` estimates each one's peak
memory before computing anything. For each model this prints, per strategy, the estimated
peak (MiB), the wall time, and the largest difference from the ``jacobian`` kernel (the
strategies agree to float rounding). Writes ``entk.csv`` to ``--out``.

Run: ``python examples/entk.py [--n 16] [--out runs/examples/entk]``
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import torch

import dynascope as ds
from dynascope.probes import empirical_ntk, empirical_ntk_memory, model_function

STRATEGIES = ("structured", "jacobian", "jvp_vjp")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=16, help="inputs per kernel")
    parser.add_argument("--out", default="runs/examples/entk")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(0)
    mlp = torch.nn.Sequential(
        torch.nn.Linear(8, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
        torch.nn.Linear(64, 3),
    )  # fmt: skip
    transformer = ds.nn.Transformer(n_layers=1, d_model=16, n_heads=2, d_vocab=7, d_out=7, n_ctx=5)
    cases = {
        "mlp": (mlp, torch.randn(args.n, 8)),
        # the Transformer's output [n, n_ctx, d_out] is flattened to [n, n_ctx * d_out]
        "transformer": (transformer, torch.randint(0, 7, (args.n, 5))),
    }
    rows = []
    for name, (model, x) in cases.items():
        model_fn, params = model_function(model)
        memory = empirical_ntk_memory(model_fn, params, x)
        kernels, seconds = {}, {}
        for strategy in STRATEGIES:
            empirical_ntk(model_fn, params, x[:2], strategy=strategy)  # warm-up, not timed
            start = time.perf_counter()
            kernels[strategy] = empirical_ntk(model_fn, params, x, strategy=strategy)
            seconds[strategy] = time.perf_counter() - start
        reference = kernels["jacobian"]
        n_params = sum(p.numel() for p in params.values())
        print(f"{name}: {n_params} parameters, kernel {tuple(reference.shape)}")
        for strategy in STRATEGIES:
            diff = (kernels[strategy] - reference).abs().max().item()
            scale = reference.abs().max().item()
            mib = memory[strategy] / 2**20
            print(
                f"  {strategy:>10}: est. peak {mib:8.2f} MiB, {seconds[strategy]:7.3f} s, "
                f"max |diff| vs jacobian {diff:.2e} (kernel max {scale:.3g})"
            )
            rows.append([name, strategy, memory[strategy], seconds[strategy], diff, scale])
    with open(out / "entk.csv", "w", newline="") as f:
        csv.writer(f).writerows(
            [["model", "strategy", "est_bytes", "seconds", "max_diff", "kernel_max"], *rows]
        )
    print(f"table written to {out / 'entk.csv'}")


if __name__ == "__main__":
    main()
