"""Few-shot meta-learners for the hyperteacher: each adapts one vector per task (S5).

Glossary:
    tasks, shots: leading axes; ``x`` ``[tasks, shots, n_input]``, logits ``[tasks, shots,
                n_output]``, soft targets ``y`` of the same shape (rows sum to 1).
    base MLP:   ``n_hidden_layers`` hidden layers of width ``d_mlp`` and a readout, each
                ``h ← relu(h @ W / sqrt(fan_in) + b)`` (no ReLU on the readout); its weights and
                biases flattened into one vector of ``P`` entries, layer by layer (W then b).
    v:          ``[tasks, D]`` the task vector the inner loop adapts, from the shared
                meta-learned initial vector ``v_0`` ``[D]``:

    | learner          | v (per task)                      | meta-learned (outer loop)        |
    |------------------|-----------------------------------|----------------------------------|
    | ``learned_init`` | all base parameters (MAML), D = P | v_0 (the initialisation)         |
    | ``anil``         | readout W, b only                 | the body and v_0 (readout init)  |
    | ``hnet_linear``  | an embedding, D = d_embedding     | v_0 and Θ [D, P]: params = v @ Θ |

Adaptation is :func:`dynascope.nn.inner_loop.fit_codes` (batched Adam, second order by
default here, as the reference's ``first_order=False``) on the soft-target cross-entropy
``−Σ_c y_c log softmax(logits)_c`` averaged over the support shots. The reference adapts with
AdamW (weight decay not given for the inner loop); we use Adam. Initialisation: weights N(0, 1)
(the 1/sqrt(fan_in) is in the forward pass), biases 0, Θ ~ N(0, 1/D), v_0 of hnet_linear N(0, 1).

References:
    Schug et al. (2024), "Discovering modular solutions that generalize compositionally",
    arXiv 2312.15001, sec. 5 and App. (ANIL, MAML baselines; linear hypernetwork);
    reference ``configs/hyperteacher.py``.
    Finn, Abbeel, Levine (2017), "Model-Agnostic Meta-Learning", arXiv 1703.03400.
    Raghu, Raghu, Bengio, Vinyals (2020), "Rapid Learning or Feature Reuse? (ANIL)",
    arXiv 1909.09157.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor, nn

from dynascope.nn.inner_loop import fit_codes

__all__ = ["MetaLearner", "batched_mlp", "mlp_shapes", "soft_cross_entropy"]

Learner = Literal["learned_init", "anil", "hnet_linear"]


def mlp_shapes(
    n_input: int, d_mlp: int, n_hidden_layers: int, n_output: int
) -> list[tuple[int, int]]:
    """``(fan_in, fan_out)`` of every layer of the base MLP, readout last."""
    fans = [n_input] + [d_mlp] * n_hidden_layers
    return [(a, b) for a, b in zip(fans, fans[1:] + [n_output])]


def _size(shapes: list[tuple[int, int]]) -> int:
    return sum(a * b + b for a, b in shapes)


def batched_mlp(flat: Tensor, shapes: list[tuple[int, int]], x: Tensor) -> Tensor:
    """Run one base MLP per task: ``flat`` ``[tasks, P]``, ``x`` ``[tasks, shots, n_input]``.

    Returns:
        ``[tasks, shots, n_output]`` logits.
    Raises:
        ValueError: if ``flat`` does not hold ``P`` entries per task or ``x`` does not fit.
    """
    if flat.ndim != 2 or flat.shape[1] != _size(shapes):
        raise ValueError(f"flat must be [tasks, P={_size(shapes)}] (got {tuple(flat.shape)})")
    if x.ndim != 3 or x.shape[0] != flat.shape[0] or x.shape[2] != shapes[0][0]:
        raise ValueError(
            f"x must be [tasks={flat.shape[0]}, shots, n_input={shapes[0][0]}] "
            f"(got {tuple(x.shape)})"
        )
    h, offset = x, 0
    for i, (a, b) in enumerate(shapes):
        W = flat[:, offset : offset + a * b].view(-1, a, b)
        bias = flat[:, offset + a * b : offset + a * b + b]
        offset += a * b + b
        h = torch.bmm(h, W) / math.sqrt(a) + bias[:, None, :]
        if i < len(shapes) - 1:
            h = torch.relu(h)
    return h


def soft_cross_entropy(logits: Tensor, y: Tensor) -> Tensor:
    """Per-task ``mean_shots(−Σ_c y_c log softmax(logits)_c)``, ``[tasks]``."""
    return -(y * torch.log_softmax(logits, dim=-1)).sum(-1).mean(-1)


def _init_flat(shapes: list[tuple[int, int]], generator: torch.Generator | None) -> Tensor:
    parts = []
    for a, b in shapes:
        parts += [torch.randn(a * b, generator=generator), torch.zeros(b)]
    return torch.cat(parts)


class MetaLearner(nn.Module):
    """A meta-learner that adapts one vector per task (see the module glossary's table).

    Args:
        kind: ``"learned_init"`` (MAML), ``"anil"`` or ``"hnet_linear"``.
        n_input, n_output: task sizes; d_mlp, n_hidden_layers: base MLP (S5: 3 hidden
            layers of 384 / 512 / 128).
        d_embedding: hnet_linear's embedding width D (ignored otherwise).
        generator: CPU generator for the initialisation.
    Raises:
        ValueError: for an unknown kind or a size < 1.
    References:
        Schug et al. (2024), arXiv 2312.15001, sec. 5; Finn et al. (2017); Raghu et al. (2020).
    """

    def __init__(
        self,
        kind: Learner,
        n_input: int,
        n_output: int,
        d_mlp: int,
        n_hidden_layers: int = 3,
        *,
        d_embedding: int = 16,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        if kind not in ("learned_init", "anil", "hnet_linear"):
            raise ValueError(f"kind must be learned_init, anil or hnet_linear (got {kind!r})")
        for name, value in (
            ("n_input", n_input),
            ("n_output", n_output),
            ("d_mlp", d_mlp),
            ("n_hidden_layers", n_hidden_layers),
            ("d_embedding", d_embedding),
        ):
            if value < 1:
                raise ValueError(f"{name} must be >= 1 (got {name}={value})")
        self.kind = kind
        self.shapes = mlp_shapes(n_input, d_mlp, n_hidden_layers, n_output)
        flat = _init_flat(self.shapes, generator)
        n_head = _size(self.shapes[-1:])
        if kind == "learned_init":
            self.v_0 = nn.Parameter(flat)
        elif kind == "anil":
            self.body = nn.Parameter(flat[:-n_head])
            self.v_0 = nn.Parameter(flat[-n_head:])
        else:
            self.v_0 = nn.Parameter(torch.randn(d_embedding, generator=generator))
            theta = torch.randn(d_embedding, len(flat), generator=generator) / math.sqrt(
                d_embedding
            )
            self.theta = nn.Parameter(theta)

    def task_params(self, v: Tensor) -> Tensor:
        """Base MLP parameters per task, ``[tasks, P]``, from task vectors ``v`` ``[tasks, D]``."""
        if self.kind == "learned_init":
            return v
        if self.kind == "anil":
            return torch.cat([self.body.expand(v.shape[0], -1), v], dim=-1)
        return v @ self.theta

    def forward(self, x: Tensor, v: Tensor) -> Tensor:
        """Logits ``[tasks, shots, n_output]`` for inputs ``x`` and task vectors ``v``."""
        return batched_mlp(self.task_params(v), self.shapes, x)

    def adapt(
        self, x: Tensor, y: Tensor, *, steps: int, lr: float, second_order: bool = True
    ) -> Tensor:
        """Fit each task's vector on its support set (``x``, soft targets ``y``), from ``v_0``.

        Returns:
            ``[tasks, D]``. Second order: differentiable through every inner step. First
            order: ``v = v_T + (v_0 − stop_grad(v_0))``, so ``∂v/∂v_0 = I`` (first-order MAML,
            Finn et al. 2017 sec. 5.2) and no gradient flows through the inner steps.
        Raises:
            ValueError: as :func:`dynascope.nn.inner_loop.fit_codes`.
        """
        v = fit_codes(
            lambda v, step: soft_cross_entropy(self(x, v), y),
            self.v_0,
            x.shape[0],
            steps=steps,
            lr=lr,
            second_order=second_order,
        )
        return v if second_order else v + (self.v_0 - self.v_0.detach())
