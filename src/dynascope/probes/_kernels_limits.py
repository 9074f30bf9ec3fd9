"""Infinite-width and linearized references for the empirical NTK: the analytic ReLU NNGP and
NTK (arc-cosine recursions), the linearized model (jvp) and gradient descent with a fixed
kernel. Public names are re-exported by :mod:`dynascope.probes.kernels` (glossary there).
"""

from __future__ import annotations

from typing import Literal

from torch import Tensor
from torch.func import jvp

from dynascope.probes._kernels_analytic import kernel_gd, relu_kernels
from dynascope.probes._kernels_entk import ModelFn, quiet_functorch


def nngp_relu(
    x1: Tensor, x2: Tensor | None = None, depth: int = 1, W_std: float = 1.0, b_std: float = 0.0
) -> Tensor:
    """Infinite-width NNGP kernel of the NTK-parametrized ReLU MLP's output (arc-cosine).

    ``Sigma^1 = sigma_w^2 x x'^T / d_in + sigma_b^2``; per hidden layer
    ``Sigma^{l+1} = sigma_w^2 V_ReLU(Sigma^l) + sigma_b^2`` with, for ``c = Sigma_12 /
    sqrt(Sigma_11 Sigma_22)`` clamped to ``[-1, 1]`` (NTK4A clamps to ``1 - 1e-10``, which
    shifts the diagonal by ~2e-6 relative; no gradient is taken here) and ``theta = arccos c``,
    ``V_ReLU(Sigma)_12 = sqrt(Sigma_11 Sigma_22) / (2 pi) (sin theta + (pi - theta) c)``.

    Args:
        x1: ``[n1, d_in]``. x2: ``[n2, d_in]`` or ``None`` (= x1).
        depth: L >= 1 hidden ReLU layers (``d_in -> n (x L) -> 1``).
        W_std, b_std: sigma_w > 0, sigma_b >= 0 of :class:`dynascope.nn.mlp.MLP`.
    Returns:
        ``Sigma^{L+1}`` ``[n1, n2]``, the covariance of the scalar output (output units^2).
        A zero input has zero variance; its correlation is taken as 0.
    Raises:
        ValueError: bad shapes, ``depth < 1``, ``W_std <= 0`` or ``b_std < 0``.
    References:
        Cho & Saul (2009), "Kernel Methods for Deep Learning", NeurIPS (arc-cosine kernel, n=1);
        Lee et al. (2018), "Deep Neural Networks as Gaussian Processes", ICLR, arXiv 1711.00165,
        eq. (11); thegregyang/NTK4A ``utils.py`` (``VReLU``).
    """
    return relu_kernels(x1, x2, depth, W_std, b_std)[0]


def analytic_ntk_relu(
    x1: Tensor, x2: Tensor | None = None, depth: int = 1, W_std: float = 1.0, b_std: float = 0.0
) -> Tensor:
    """Infinite-width NTK of the NTK-parametrized ReLU MLP (arc-cosine recursion, S17).

    ``Theta^1 = Sigma^1``; per hidden layer ``Theta^{l+1} = Sigma^{l+1} + sigma_w^2
    V_Step(Sigma^l) * Theta^l`` with ``V_Step(Sigma)_12 = (pi - theta) / (2 pi)`` (see
    :func:`nngp_relu`). Depth 1, sigma_b = 0: ``Theta(x, x') = |x||x'| / (2 pi d_in) (sin theta
    + (pi - theta) cos theta) + (pi - theta) / (2 pi) x.x' / d_in``.

    Args:
        x1: ``[n1, d_in]``. x2: ``[n2, d_in]`` or ``None`` (= x1).
        depth: L >= 1 hidden ReLU layers.
        W_std, b_std: sigma_w > 0, sigma_b >= 0 (NTK-parametrized biases ``sigma_b * beta``).
    Returns:
        ``Theta`` ``[n1, n2]``, the limit of :func:`empirical_ntk` (``trace`` mode, scalar output)
        of :class:`dynascope.nn.mlp.MLP` with ``parametrization="ntk"`` as width -> infinity.
    Raises:
        ValueError: bad shapes, ``depth < 1``, ``W_std <= 0`` or ``b_std < 0``.
    References:
        Jacot et al. (2018), arXiv 1806.07572, Theorem 1; Arora et al. (2019), "On Exact
        Computation with an Infinitely Wide Neural Net", arXiv 1904.11955, eq. (5)-(6).
    """
    return relu_kernels(x1, x2, depth, W_std, b_std)[1]


def linearize(model_fn: ModelFn, params0: dict[str, Tensor]) -> ModelFn:
    """The linearized model ``f_lin(theta, x) = f(theta0, x) + J(theta0, x) (theta - theta0)``.

    Evaluated by one ``torch.func.jvp`` per call (primal and tangent together), never by an
    explicit Jacobian. Differentiable in ``theta`` (reverse mode through the jvp), so it trains
    like the model: gradient descent on it is gradient descent on the linearized twin.

    Args:
        model_fn: ``model_fn(params, x) -> [n, d_out]``.
        params0: theta0, parameter tensors by name (detached copies are kept).
    Returns:
        ``f_lin(params, x)`` with ``params`` holding the same names and shapes as ``params0``.
    Raises:
        ValueError: (call) if ``params`` does not have ``params0``'s names.
    References:
        Lee et al. (2019), arXiv 1902.06720, eq. (6); Chizat, Oyallon & Bach (2019), "On Lazy
        Training in Differentiable Programming", NeurIPS, arXiv 1812.07956.
    """
    theta0 = {k: v.detach().clone() for k, v in params0.items()}

    def f_lin(params: dict[str, Tensor], x: Tensor) -> Tensor:
        if set(params) != set(theta0):
            raise ValueError(
                f"params must have the names of params0 {sorted(theta0)} (got {sorted(params)})"
            )
        delta = {k: params[k] - theta0[k] for k in theta0}
        with quiet_functorch():
            out0, tangent = jvp(lambda p: model_fn(p, x), (theta0,), (delta,))
        return out0 + tangent

    return f_lin


def kernel_gd_predictions(
    K_test_train: Tensor | None,
    K_train: Tensor,
    y: Tensor,
    lr: float,
    steps: int,
    *,
    f0_train: Tensor | None = None,
    f0_test: Tensor | None = None,
    loss: Literal["mean", "sum"] = "mean",
) -> tuple[Tensor, Tensor | None]:
    """Kernel gradient descent with a fixed kernel: the function-space twin of a network's GD.

    With the mean square loss ``(1/2N) sum_i |f(x_i) - y_i|^2`` (``loss="mean"``):
    ``f_{t+1}(X) = f_t(X) - (lr/N) Theta(X, X) (f_t(X) - y)`` and at test inputs
    ``f_{t+1}(X') = f_t(X') - (lr/N) Theta(X', X) (f_t(X) - y)``; ``loss="sum"`` drops the 1/N.

    Args:
        K_test_train: ``[M, N]`` or ``[M, N, d_out, d_out]``, or ``None`` (train only).
        K_train: ``[N, N]`` (applied to every output, ``Theta (x) I``) or ``[N, N, d_out, d_out]``.
        y: targets ``[N]`` or ``[N, d_out]``.
        lr: step size > 0. steps: number of steps >= 0.
        f0_train: ``f_0(X)`` (default zeros), shaped like ``y``. f0_test: ``f_0(X')``
            ``[M, d_out]`` (default zeros).
        loss: ``"mean"`` or ``"sum"``.
    Returns:
        ``(f_train [steps + 1, N, d_out], f_test [steps + 1, M, d_out] or None)``, step 0 first.
    Raises:
        ValueError: bad shapes, ``lr <= 0``, ``steps < 0`` or an unknown ``loss``.
    References:
        Jacot et al. (2018), arXiv 1806.07572, section 4 (kernel gradient); Yang & Littwin
        (2021), arXiv 2105.03703, eq. (1).
    """
    return kernel_gd(K_test_train, K_train, y, lr, steps, f0_train, f0_test, loss)
