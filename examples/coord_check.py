"""Coordinate check: standard parametrization (SP) against muP, on the engine.

For each width, an MLP 16 -> w -> w -> 10 takes a few Adam steps on one fixed random batch;
``dynascope.train.coord_check`` records each module's mean |activation| per width, seed and
step, and ``dynascope.probes.coordcheck.coord_summary`` reduces it to the growth ratio
``s(w_max) / s(w_min)`` of the logits. Under SP the logits grow with width after training
starts; under muP (``parameter_groups`` per-parameter learning rates, the readout initialised
at zero as ``MLP`` does by default) they do not. Also writes ``coord_check_standard.png``
and ``coord_check_mup.png`` to ``--out``.

Run: ``python examples/coord_check.py [--widths 32 64 128 256] [--steps 3] [--out DIR]``
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from dynascope.nn.mlp import MLP
from dynascope.nn.parametrization import parameter_groups
from dynascope.probes.coordcheck import coord_summary, plot_coord_check
from dynascope.train import coord_check

BASE_WIDTH = 32


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[32, 64, 128, 256])
    parser.add_argument("--steps", type=int, default=3, help="forward passes (steps - 1 updates)")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--out", default="runs/examples/coord_check")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    g = torch.Generator().manual_seed(0)
    batch = (torch.randn(64, 16, generator=g), torch.randint(0, 10, (64,), generator=g))
    for parametrization in ("standard", "mup"):

        def model(width: int, p: str = parametrization) -> MLP:
            return MLP(16, width, 10, depth=2, parametrization=p, base_width=BASE_WIDTH)

        def optimizer(m: MLP, width: int, p: str = parametrization) -> torch.optim.Optimizer:
            state = torch.random.get_rng_state()  # the base model only supplies shapes
            base = model(BASE_WIDTH)
            torch.random.set_rng_state(state)
            return torch.optim.Adam(parameter_groups(m, base, lr=1e-2, parametrization=p))

        records = coord_check(
            model, args.widths, batch, loss_fn=F.cross_entropy, make_optimizer=optimizer,
            nsteps=args.steps, nseeds=args.seeds,
        )  # fmt: skip
        rows = [r for r in coord_summary(records) if r["t"] == args.steps]
        logits = next(r for r in rows if r["module"] == "layers.2")  # the readout
        print(
            f"{parametrization:>8}: logits mean |activation| grows {logits['width_ratio']:.2f}x "
            f"from width {min(args.widths)} to {max(args.widths)} at t={args.steps} "
            f"(log-log slope {logits['slope']:.2f})"
        )
        fig = plot_coord_check(records, title=f"{parametrization}: mean |activation| vs width")
        fig.savefig(out / f"coord_check_{parametrization}.png")
        plt.close(fig)
    print(f"figures written to {out}")


if __name__ == "__main__":
    main()
