"""Runner of ``ntk-universality`` (S17): one architecture at one width and seed (private).

Glossary:
    N:       training inputs; d_in: input (token) width; pos: tokens per sequence (RNN,
             attention); n: width.
    f_t:     ``[N]`` the net's outputs on the training inputs after t GD steps.
    Theta_0: the net's empirical NTK on the training inputs at init ``[N, N]``; Theta_ring: the
             analytic infinite-width NTK (MLP only).
    kGD:     kernel gradient descent ``f <- f - (eta / N) Theta (f - y)`` from the net's f_0.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import Tensor, nn

from dynascope.nn.kernel_nets import ElmanRNN, KernelAttentionNet
from dynascope.nn.mlp import MLP
from dynascope.probes.kernels import (
    analytic_ntk_relu,
    empirical_ntk,
    kernel_gd_predictions,
    model_function,
    ntk_relative_change,
)
from dynascope.store import RunStore
from dynascope.studies.base import one_intra_op_thread

__all__ = ["build_model", "make_data", "run_universality"]


def make_data(config, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """``(x, y)``: inputs on the sphere of radius sqrt(d_in) (per token for sequences),
    ``[N, d_in]`` (MLP) or ``[N, pos, d_in]``, and targets ``y ~ N(0, 1)`` ``[N]``.

    Drawn from ``data_seed`` alone, so every architecture and width of a seed sees the same data.
    """
    g = torch.Generator().manual_seed(config.data_seed)
    shape = (config.n_train, config.d_in) if config.arch == "mlp" else (
        config.n_train, config.pos, config.d_in)  # fmt: skip
    z = torch.randn(*shape, generator=g, dtype=torch.float64)
    x = math.sqrt(config.d_in) * z / torch.linalg.vector_norm(z, dim=-1, keepdim=True)
    y = torch.randn(config.n_train, generator=g, dtype=torch.float64)
    return x.to(dtype), y.to(dtype)


def build_model(config, dtype: torch.dtype) -> nn.Module:
    """The NTK-parametrized net of ``config.arch`` at ``config.width`` (weights from ``seed``)."""
    g = torch.Generator().manual_seed(config.seed)
    if config.arch == "mlp":
        return MLP(config.d_in, config.width, 1, depth=config.mlp_depth, parametrization="ntk",
                   activation="relu", generator=g, dtype=dtype)  # fmt: skip
    if config.arch == "rnn":
        return ElmanRNN(config.d_in, config.width, 1, parametrization="ntk",
                        activation=config.rnn_activation, generator=g, dtype=dtype)  # fmt: skip
    return KernelAttentionNet(config.d_in, config.width, 1, parametrization="ntk",
                              logit_scale=config.logit_scale, generator=g, dtype=dtype)  # fmt: skip


def run_universality(config, run_dir: Path, progress: bool = False, device: str = "cpu") -> None:
    """Train one net by full-batch GD on ``(1/2N) sum (f - y)^2`` and log S17's instruments.

    Logged: ``f`` ``[N]`` every step; ``ntk.relative_change`` (``||Theta_t - Theta_0||_F /
    ||Theta_0||_F``) and ``ntk.trace`` at ``kernel_steps``; at the last step ``kgd.deviation``
    (``sup_t ||f_t - f_t^kGD||_2`` with the empirical Theta_0) and ``kgd.gap`` per step; for the
    MLP also ``kgd_analytic.deviation`` (Theta_ring twin) and ``ntk.init_deviation``
    (``||Theta_0 - Theta_ring||_F / ||Theta_ring||_F``). Step 0: ``lr_lambda_max_over_N``
    (``(eta / N) lambda_max(Theta_0)``; kernel GD is stable below 2).
    """
    del progress
    dtype = getattr(torch, config.dtype)
    dev = torch.device(device)
    with one_intra_op_thread():
        x, y = (t.to(dev) for t in make_data(config, dtype))
        model = build_model(config, dtype).to(dev)
        N, eta = config.n_train, config.lr
        chunk = config.n_train  # eNTK one parameter tensor at a time: peak N * largest tensor

        def kernel() -> Tensor:
            fn, params = model_function(model)
            return empirical_ntk(fn, params, x, mode="trace", chunk_size=chunk)

        K0 = kernel()
        optimizer = torch.optim.SGD(model.parameters(), lr=eta)
        fs = []
        with RunStore(run_dir) as store:
            store.truncate_after(-1)
            store.write_config(config.model_dump(mode="json"))
            store.set_status(0, "running")
            lam = float(torch.linalg.eigvalsh(K0.double())[-1])
            store.log(0, {"lr_lambda_max_over_N": eta * lam / N})
            for step in range(config.steps + 1):
                f = model(x)[:, 0]  # [N]
                fs.append(f.detach())
                values: dict[str, Tensor | float] = {"f": f.detach().cpu()}
                if step in config.kernel_steps:
                    K = K0 if step == 0 else kernel()
                    values["ntk.relative_change"] = float(ntk_relative_change(K, K0))
                    values["ntk.trace"] = float(torch.trace(K))
                if not bool(torch.isfinite(f).all()):
                    store.log(step, values)
                    store.event(step, "diverged", "non-finite output")
                    store.set_status(step, "diverged")
                    return
                store.log(step, values)
                if step == config.steps:
                    break
                optimizer.zero_grad(set_to_none=True)
                (0.5 * ((f - y) ** 2).mean()).backward()
                optimizer.step()
            traj = torch.stack(fs)  # [steps + 1, N]
            summary = _twins(config, x, y, traj, K0)
            for step, gap in enumerate(summary.pop("kgd.gap")):
                store.log(step, {"kgd.gap": gap})
            store.log(config.steps, summary)
            store.set_status(config.steps, "finished")


def _twins(config, x: Tensor, y: Tensor, traj: Tensor, K0: Tensor) -> dict:
    """Kernel-GD twins from the net's f_0: deviations from the net's trajectory ``traj``."""
    f_kgd, _ = kernel_gd_predictions(None, K0.double(), y.double(), config.lr, config.steps,
                                     f0_train=traj[0].double())  # fmt: skip
    gaps = torch.linalg.vector_norm(traj.double() - f_kgd[..., 0], dim=-1)  # [steps + 1]
    out = {"kgd.gap": gaps.tolist(), "kgd.deviation": float(gaps.max())}
    if config.arch == "mlp":
        K_ring = analytic_ntk_relu(x.double(), depth=config.mlp_depth)
        f_ring, _ = kernel_gd_predictions(None, K_ring, y.double(), config.lr, config.steps,
                                          f0_train=traj[0].double())  # fmt: skip
        out["kgd_analytic.deviation"] = float(
            torch.linalg.vector_norm(traj.double() - f_ring[..., 0], dim=-1).max()
        )
        out["ntk.init_deviation"] = float(ntk_relative_change(K0.double(), K_ring))
    return out
