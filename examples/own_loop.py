"""Instrument your own PyTorch training loop, then read the run into pandas.

A plain loop trains a small dynascope Transformer to copy its input; a ``ds.Monitor`` runs the
W_QK and W_OV spectrum probes on a log-spaced schedule and writes them to a crash-safe
``ds.RunStore``; ``ds.load_run`` reads the run back as a DataFrame with parsed ``layer``,
``head`` and ``metric`` columns. Prints the mean W_QK effective rank per probed step.

Run: ``python examples/own_loop.py [--steps 200] [--out runs/examples/own_loop]``
"""

from __future__ import annotations

import argparse

import torch

import dynascope as ds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--out", default="runs/examples/own_loop")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = ds.nn.Transformer(n_layers=2, d_model=32, n_heads=4, d_vocab=11, d_out=11, n_ctx=7)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    x = torch.randint(0, 11, (8, 7))
    with ds.RunStore(args.out) as store:
        probes = [ds.probes.QKSpectrum(), ds.probes.OVSpectrum()]
        monitor = ds.Monitor(model, probes, schedule=ds.LogSchedule(args.steps, 8), sink=store)
        monitor.step(0)  # the initialisation
        for step in range(1, args.steps + 1):
            loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
            monitor.step(step)  # the state after `step` updates
    print(f"final loss {loss.item():.4f}")

    s = ds.load_run(args.out).scalars  # step, key, value, layer, head, metric
    erank = s[s["metric"] == "qk.effective_rank"].groupby("step")["value"].mean()
    print("mean W_QK effective rank per step:")
    print(erank.to_string())
    print(f"run written to {args.out}")


if __name__ == "__main__":
    main()
