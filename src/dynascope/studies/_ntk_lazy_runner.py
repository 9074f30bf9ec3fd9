"""Runner of ``ntk-lazy-validity`` (S11): the alpha-scaled net and its linearized twin (private).

Glossary:
    N:        training inputs; d_in: input width; m: hidden width; P: parameters of h.
    g(w; x):  ``v^T tanh(W x / sqrt(d_in)) / sqrt(m)`` (:class:`dynascope.nn.mlp.MLP`, NTK
              parametrization, depth 1, no bias).
    h(w):     ``[N]`` outputs on the training inputs, ``h(w0) = 0`` by centering.
    hbar(w):  the linearized twin ``h(w0) + Dh(w0)(w - w0)`` (:func:`dynascope.probes.linearize`).
    alpha:    the output scale; objective ``L(w) = ||alpha h(w) - f*||^2 / (2 alpha^2)``.
    t:        time ``eta * step``.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.func import vjp

from dynascope.monitor import LogSchedule
from dynascope.nn.mlp import MLP
from dynascope.probes.kernels import empirical_ntk, linearize, ntk_relative_change
from dynascope.store import RunStore
from dynascope.studies.base import one_intra_op_thread

__all__ = ["build_h", "run_lazy", "two_layer"]

_ACTIVATIONS = {"tanh": torch.tanh, "relu": F.relu, "gelu": F.gelu}


def two_layer(w: dict[str, Tensor], x: Tensor, activation: str, scale: float = 1.0) -> Tensor:
    """S11's net ``g(x) = v^T phi(W x / sqrt(d)) / sqrt(m)`` (times ``scale``), ``[n, 1]``.

    ``w = {"W": [d, m], "v": [m, 1]}``: the same function as :class:`dynascope.nn.mlp.MLP`
    (``depth=1, parametrization="ntk"``, no bias) with ``layers.0.weight = W`` and
    ``layers.1.weight = v`` (a test checks it). Written out, with the constant applied as a
    product with a ``[1, 1]`` matrix, for speed: at these sizes a step is Python dispatch, and
    under ``torch.func.jvp`` a tensor-times-Python-scalar was measured at ~1.5 ms (it goes
    through torch's Python decompositions) against ~0.2 ms for a matmul.
    """
    phi = _ACTIVATIONS[activation]
    d, m = w["W"].shape[-2:]  # W may carry a leading alpha axis [A, d, m]
    c = torch.full((1, 1), scale / math.sqrt(m), dtype=x.dtype, device=x.device)
    return (phi((x / math.sqrt(d)) @ w["W"]) @ w["v"]) @ c


def build_h(config, generator: torch.Generator, dtype: torch.dtype, device: torch.device):
    """``(h_fn, w0)``: ``h_fn(w, x) -> [n, 1]`` with ``h(w0) = 0`` on every input.

    Weights as :class:`dynascope.nn.mlp.MLP` draws them (NTK parametrization: N(0, 1)).
    ``antisymmetric``: two copies with identical initial weights, ``h = (g(w_a) - g(w_b)) /
    sqrt(2)``, both trained. ``offset``: ``h = g(w) - g(w0; x)`` with ``g(w0)`` frozen.
    """
    net = MLP(config.d_in, config.width, 1, depth=1, parametrization="ntk",
              activation=config.activation, generator=generator, dtype=dtype)  # fmt: skip
    base = {
        "W": net.layers[0].weight.detach().to(device),
        "v": net.layers[1].weight.detach().to(device),
    }
    act = config.activation
    if config.centering == "antisymmetric":
        w0 = {"a.W": base["W"].clone(), "a.v": base["v"].clone(),
              "b.W": base["W"].clone(), "b.v": base["v"].clone()}  # fmt: skip
        r = 1 / math.sqrt(2.0)

        def h_fn(w: dict[str, Tensor], x: Tensor) -> Tensor:
            ga = two_layer({"W": w["a.W"], "v": w["a.v"]}, x, act, r)
            gb = two_layer({"W": w["b.W"], "v": w["b.v"]}, x, act, r)
            return ga - gb

        return h_fn, w0

    def h_offset(w: dict[str, Tensor], x: Tensor) -> Tensor:
        return two_layer(w, x, act) - two_layer(base, x, act)

    return h_offset, {k: v.clone() for k, v in base.items()}


def _data(config, generator: torch.Generator, dtype, device):
    x = torch.randn(config.n_train, config.d_in, generator=generator, dtype=dtype)
    f_star = config.target_std * torch.randn(config.n_train, generator=generator, dtype=dtype)
    return x.to(device), f_star.to(device)


def run_lazy(config, run_dir: Path, progress: bool = False, device: str = "cpu") -> None:
    """Train ``alpha h`` and ``alpha hbar`` by GD from w0, every alpha of ``config.alphas`` at
    once (a leading alpha axis on every weight: the same w0, data and step for each), and log
    the S11 instruments.

    Logged as ``[A]`` tensors (A = len(alphas)) every ``log_every`` steps, at 200 log-spaced
    steps and at the last step (the sups are taken over every step): ``D`` (running sup of
    ``||alpha h - alpha hbar||_2``), ``gap`` (that norm now), ``residual`` ``||alpha h - f*||``,
    ``residual_lin``, ``param_dist`` ``||w - w0||``, ``param_dist_lin``, ``oracle_error``
    (running sup of ``max_i |alpha hbar_t - (f* - (I - eta K)^t f*)|_i``, K = Dh Dh^T from the
    eNTK). On a log schedule: ``ntk.relative_change`` ``[A]`` of h's eNTK on the training
    inputs. Step 0: ``alphas``, ``lr``, ``lr_lambda_max`` (``eta lambda_max(K)``, < 2 for
    stable GD; the same for every alpha).
    """
    del progress
    dev = torch.device(device)
    dtype = getattr(torch, config.dtype)
    with one_intra_op_thread():
        generator = torch.Generator().manual_seed(config.seed)
        x, f_star = _data(config, generator, dtype, dev)
        h_fn, w0 = build_h(config, generator, dtype, dev)
        alphas = torch.tensor(config.alphas, dtype=dtype, device=dev)  # [A]
        A, eta = len(alphas), config.lr
        K0 = empirical_ntk(h_fn, w0, x)[:, :, 0, 0]  # [N, N], shared by every alpha
        step_matrix = torch.eye(len(x), dtype=dtype, device=dev) - eta * K0
        lam_max = float(torch.linalg.eigvalsh(K0)[-1])
        w0b = {k: v.expand(A, *v.shape).clone() for k, v in w0.items()}  # [A, ...]
        h_lin = linearize(h_fn, w0b)
        _, vjp_at_w0 = vjp(lambda w: h_fn(w, x)[..., 0], w0b)  # Dh(w0)^T r, reused every step
        schedule = LogSchedule(config.steps, config.kernel_points)
        dense = LogSchedule(config.steps, 200)
        w = {k: v.clone().requires_grad_(True) for k, v in w0b.items()}
        wbar = {k: v.clone() for k, v in w0b.items()}
        closed = torch.zeros_like(f_star)  # alpha hbar_0 = 0; the closed form is alpha-free
        d_sup = torch.zeros(A, dtype=dtype, device=dev)
        oracle_sup = torch.zeros_like(d_sup)
        scale = alphas[:, None]
        with RunStore(run_dir) as store:
            store.truncate_after(-1)
            store.write_config(config.model_dump(mode="json"))
            store.set_status(0, "running")
            store.log(0, {"alphas": alphas.cpu(), "lr": eta, "lr_lambda_max": eta * lam_max})
            for step in range(config.steps + 1):
                out = scale * h_fn(w, x)[..., 0]  # [A, N]
                with torch.no_grad():
                    out_lin = scale * h_lin(wbar, x)[..., 0]
                    r_lin = out_lin - f_star
                    gap = torch.linalg.vector_norm(out.detach() - out_lin, dim=-1)
                    d_sup = torch.maximum(d_sup, gap)
                    oracle_sup = torch.maximum(oracle_sup, (out_lin - closed).abs().amax(-1))
                r = out - f_star
                due = step % config.log_every == 0 or dense.due(step) or step == config.steps
                finite = bool(torch.isfinite(r).all() and torch.isfinite(r_lin).all())
                if due or not finite:
                    values = {
                        "D": d_sup, "gap": gap,
                        "residual": torch.linalg.vector_norm(r.detach(), dim=-1),
                        "residual_lin": torch.linalg.vector_norm(r_lin, dim=-1),
                        "param_dist": _dist(w, w0b), "param_dist_lin": _dist(wbar, w0b),
                        "oracle_error": oracle_sup,
                    }  # fmt: skip
                    if schedule.due(step):
                        values["ntk.relative_change"] = _kernel_change(h_fn, w, x, K0)
                    store.log(step, {k: v.cpu() for k, v in values.items()})
                if not finite:
                    store.event(step, "diverged", "non-finite output")
                    store.set_status(step, "diverged")
                    return
                if step == config.steps:
                    break
                # L = sum_alpha ||alpha h - f*||^2 / (2 alpha^2): grad = Dh^T (alpha h - f*) / alpha
                loss = 0.5 * ((r / scale) ** 2).sum()
                grads = torch.autograd.grad(loss, list(w.values()))
                with torch.no_grad():
                    w = {k: (v - eta * gk).requires_grad_(True)
                         for (k, v), gk in zip(w.items(), grads)}  # fmt: skip
                    (g_lin,) = vjp_at_w0(r_lin / scale)
                    wbar = {k: wbar[k] - eta * g_lin[k] for k in wbar}
                    closed = f_star - step_matrix @ (f_star - closed)
            store.set_status(config.steps, "finished")


def _dist(w: dict[str, Tensor], w0: dict[str, Tensor]) -> Tensor:
    """``||w - w0||`` per alpha ``[A]`` (every non-leading axis summed)."""
    total = sum(((w[k].detach() - w0[k]) ** 2).flatten(1).sum(1) for k in w0)
    return torch.sqrt(total)


def _kernel_change(h_fn, w: dict[str, Tensor], x: Tensor, K0: Tensor) -> Tensor:
    """Relative eNTK change ``[A]`` of each alpha's weights against ``K0``."""
    A = next(iter(w.values())).shape[0]
    out = []
    for i in range(A):
        wi = {k: v[i].detach() for k, v in w.items()}
        out.append(ntk_relative_change(empirical_ntk(h_fn, wi, x)[:, :, 0, 0], K0))
    return torch.stack(out)
