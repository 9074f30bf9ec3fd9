"""The hyperteacher (S5's meta-learning benchmark): few-shot classification tasks whose teacher
MLP's 2 hidden-to-hidden layers are generated from per-layer 1..K-hot choices of M experts; a
task is the product of the layers' choices; supports (:func:`hyperteacher_split`) hold out
combinations; targets are soft (softmax of z-scored logits at temperature 0.1).

Re-exported by :mod:`dynascope.tasks.modular_teacher`, whose k-hot masks it shares. Every draw
is deterministic from a ``torch.Generator``; tensors live on the generator's device.

References:
    Schug et al. (2024), "Discovering modular solutions that generalize compositionally",
    arXiv 2312.15001, sec. 5, Table 1; reference ``metax/data/dataset/teacher.py``.
"""

from __future__ import annotations

import itertools
import math

import torch
from torch import Tensor

from dynascope.nn.multitask_hypernet import trunc_normal

from ._masks import continuous_codes, k_hot_masks

# -- the hyperteacher: few-shot classification, experts chosen per generated layer ------------
HYPER_SUPPORTS = ("random", "non_compositional", "connected", "disconnected", "diagonal", "dense")


def _expert_masks(n_experts: int, num_hot: int) -> Tensor:
    """Every 1..num_hot-hot mask over the experts, ``[n, n_experts]`` (k = 1 first)."""
    return torch.cat([k_hot_masks(k, n_experts) for k in range(1, num_hot + 1)])


def _layer_products(per_layer: Tensor, n_layers: int) -> Tensor:
    """All layer-wise combinations of ``per_layer`` masks, ``[n^n_layers, n_layers, n_experts]``."""
    rows = itertools.product(range(len(per_layer)), repeat=n_layers)
    return torch.stack([per_layer[list(r)] for r in rows])


def _member(tasks: Tensor, table: Tensor) -> Tensor:
    """``[n]`` bool: which rows of ``tasks`` ``[n, L, M]`` appear in ``table`` ``[m, L, M]``."""
    return (tasks[:, None] == table[None]).all(-1).all(-1).any(-1)


def hyperteacher_split(
    n_experts: int,
    num_hot: int,
    n_layers: int,
    support: str,
    *,
    frac_ood: float = 0.25,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """In-distribution and OOD tasks of the hyperteacher, each ``[n, n_layers, n_experts]``.

    A task picks, for every generated layer, a 1..num_hot-hot set of experts. Supports:
    ``random`` (a ``frac_ood`` share of all tasks held out, permuted by ``generator``);
    ``non_compositional`` (tasks using the last expert in the last layer held out);
    ``connected`` (per layer: one-hots, pairs (i, i+1) and (i, i+2) mod M) and
    ``disconnected`` (every layer 1-hot, or every layer 2-hot, all inside one half of the
    experts) — both need num_hot = 2 and an even M > 4, and hold out what neither contains;
    ``diagonal`` (per layer: one-hots and sliding windows (i, ..., i+K-1) mod M); ``dense``
    (num_hot = M: in distribution only the all-experts task).

    Raises:
        ValueError: for an unknown support, sizes the support cannot use, or an empty split.
    References:
        Schug et al. (2024), arXiv 2312.15001, sec. 5; reference ``metax/data/dataset/teacher.py``.
    """
    if support not in HYPER_SUPPORTS:
        raise ValueError(f"support must be one of {HYPER_SUPPORTS} (got support={support!r})")
    if not 1 <= num_hot <= n_experts:
        raise ValueError(f"num_hot must be in [1, n_experts={n_experts}] (got num_hot={num_hot})")
    all_tasks = _layer_products(_expert_masks(n_experts, num_hot), n_layers)
    if support == "random":
        order = torch.randperm(len(all_tasks), generator=generator)
        n_ood = int(len(all_tasks) * frac_ood)
        ood = torch.zeros(len(all_tasks), dtype=torch.bool)
        ood[order[len(all_tasks) - n_ood :]] = True
    elif support == "non_compositional":
        ood = all_tasks[:, -1, -1] == 1
    elif support in ("connected", "disconnected"):
        if num_hot != 2 or n_experts <= 4 or n_experts % 2:
            raise ValueError(
                f"support {support!r} needs num_hot=2 and an even n_experts > 4 "
                f"(got num_hot={num_hot}, n_experts={n_experts})"
            )
        i = torch.arange(n_experts)
        per_layer = torch.cat(
            [
                k_hot_masks(1, n_experts),
                _pairs(i, (i + 1) % n_experts, n_experts),
                _pairs(i, (i + 2) % n_experts, n_experts),
            ]
        )
        connected = _member(all_tasks, _layer_products(per_layer, n_layers))
        hot = all_tasks.sum(-1)
        half = n_experts // 2
        one_half = (all_tasks[..., half:] == 0).all(-1).all(-1) | (all_tasks[..., :half] == 0).all(
            -1
        ).all(-1)
        disconnected = ((hot == 1).all(-1) | (hot == 2).all(-1)) & one_half
        ood = ~(connected | disconnected)
        if support == "disconnected":
            all_tasks, ood = all_tasks[disconnected | ood], ood[disconnected | ood]
        else:
            all_tasks, ood = all_tasks[connected | ood], ood[connected | ood]
    elif support == "diagonal":
        window = (torch.arange(num_hot)[None, :] + torch.arange(n_experts)[:, None]) % n_experts
        per_layer = torch.cat([_pairs_k(window, n_experts), k_hot_masks(1, n_experts)])
        ood = ~_member(all_tasks, _layer_products(per_layer, n_layers))
    else:  # dense
        if num_hot != n_experts:
            raise ValueError(f"support 'dense' needs num_hot = n_experts (got {num_hot})")
        ood = all_tasks.sum((-2, -1)) != n_experts * n_layers
    train, held_out = all_tasks[~ood], all_tasks[ood]
    if not len(train) or not len(held_out):
        raise ValueError(f"support {support!r} leaves an empty split with these sizes")
    return train, held_out


def _pairs(a: Tensor, b: Tensor, n: int) -> Tensor:
    return _pairs_k(torch.stack([a, b], -1), n)


def _pairs_k(index: Tensor, n: int) -> Tensor:
    """k-hot rows from index rows ``[m, k]`` (repeated indices collapse)."""
    return torch.zeros(len(index), n).scatter_(1, index, 1.0)


class FewShotHyperteacher:
    """S5's hyperteacher: few-shot soft-target classification from a modular teacher MLP.

    Teacher: ``h_1 = relu(x @ W_in / sqrt(n_input))`` (fixed input layer); ``n_hidden_layers``
    − 1 generated layers ``h ← relu(h @ W_l(e) / sqrt(n_hidden))``; logits ``h @ W_out /
    sqrt(n_hidden)``; no biases. Generated weights are linear in the task embedding ``e``
    ``[n_layers_gen, n_experts]``: without chunking (the reference default) one linear map of
    the flattened embedding to all generated weights; with chunking one expert bank shared by
    the layers, applied to each layer's row. All weights TruncNormal(0, scale) at ±2 scale.
    Targets: each logit z-scored over 1000 reference inputs (per task), softmax(· / T).
    The 1/sqrt(fan_in) scaling stands for the reference's "reparametrized" linear layers
    (unverified, S5 open details).

    Args:
        n_input, n_output, n_hidden, n_hidden_layers: teacher sizes (S5: 16, 8, 32, 3).
        n_experts, num_hot: M experts, 1..K-hot per generated layer (S5: 4, 2).
        support, frac_ood: :func:`hyperteacher_split`.
        chunking, continuous: shared expert bank; continuous embedding weights
            (``(0.5 w + 0.5) ⊙ mask`` as :func:`continuous_codes`).
        temperature, scale: softmax temperature (0.1) and weight std (1.0).
        seed: seed of the weights, the random split and the reference inputs.
    Raises:
        ValueError: for ``n_hidden_layers < 2`` or as :func:`hyperteacher_split`.
    References:
        Schug et al. (2024), arXiv 2312.15001, sec. 5, Table 1; reference
        ``metax/data/dataset/teacher.py`` and ``configs/hyperteacher.py``.
    """

    def __init__(
        self,
        *,
        n_input: int = 16,
        n_output: int = 8,
        n_hidden: int = 32,
        n_hidden_layers: int = 3,
        n_experts: int = 4,
        num_hot: int = 2,
        support: str = "random",
        frac_ood: float = 0.25,
        chunking: bool = False,
        continuous: bool = False,
        temperature: float = 0.1,
        scale: float = 1.0,
        seed: int = 0,
    ) -> None:
        if n_hidden_layers < 2:
            raise ValueError(
                f"n_hidden_layers must be >= 2 (got n_hidden_layers={n_hidden_layers})"
            )
        g = torch.Generator().manual_seed(seed)
        self.n_layers = n_hidden_layers - 1  # generated layers
        self.n_input, self.n_hidden, self.n_experts = n_input, n_hidden, n_experts
        self.continuous, self.chunking, self.temperature = continuous, chunking, temperature
        self.train_tasks, self.ood_tasks = hyperteacher_split(
            n_experts, num_hot, self.n_layers, support, frac_ood=frac_ood, generator=g
        )
        P = n_hidden * n_hidden
        rows, cols = (n_experts, P) if chunking else (self.n_layers * n_experts, self.n_layers * P)
        self.theta = trunc_normal((rows, cols), scale, g)
        self.W_in = trunc_normal((n_input, n_hidden), scale, g)
        self.W_out = trunc_normal((n_hidden, n_output), scale, g)
        self.reference_x = 2 * torch.rand(1000, n_input, generator=g) - 1

    def logits(self, embedding: Tensor, x: Tensor) -> Tensor:
        """Raw teacher outputs ``[tasks, n, n_output]`` for ``embedding`` ``[tasks, L, M]``."""
        tasks, d = embedding.shape[0], self.n_hidden
        theta = self.theta.to(x.device)
        if self.chunking:
            W = (embedding @ theta).view(tasks, self.n_layers, d, d)
        else:
            W = (embedding.reshape(tasks, -1) @ theta).view(tasks, self.n_layers, d, d)
        h = torch.relu(x @ self.W_in.to(x.device) / math.sqrt(self.n_input))
        for layer in range(self.n_layers):
            h = torch.relu(torch.bmm(h, W[:, layer]) / math.sqrt(d))
        return h @ self.W_out.to(x.device) / math.sqrt(d)

    def sample(
        self, split: str, n_tasks: int, n_shots: int, generator: torch.Generator
    ) -> dict[str, Tensor]:
        """Draw tasks of ``split`` (``"train"`` or ``"ood"``) with ``n_shots`` inputs each.

        Returns:
            ``x`` ``[tasks, shots, n_input]`` ~ U(−1, 1); ``y`` soft targets ``[tasks, shots,
            n_output]`` (rows sum to 1); ``hard`` ``[tasks, shots]`` argmax; ``embedding``
            ``[tasks, L, M]``; ``task_id`` ``[tasks]`` (row of the split's task table).
        Raises:
            ValueError: for an unknown split or ``n_tasks``, ``n_shots`` < 1.
        """
        if split not in ("train", "ood"):
            raise ValueError(f"split must be 'train' or 'ood' (got split={split!r})")
        if n_tasks < 1 or n_shots < 1:
            raise ValueError(f"n_tasks and n_shots must be >= 1 (got {n_tasks}, {n_shots})")
        dev = generator.device
        table = (self.train_tasks if split == "train" else self.ood_tasks).to(dev)
        task_id = torch.randint(len(table), (n_tasks,), generator=generator, device=dev)
        embedding = table[task_id]
        if self.continuous:
            flat = embedding.reshape(-1, self.n_experts)
            embedding = continuous_codes(flat, generator).view(embedding.shape)
        x = 2 * torch.rand(n_tasks, n_shots, self.n_input, generator=generator, device=dev) - 1
        ref = self.logits(embedding, self.reference_x.to(dev).expand(n_tasks, -1, -1))
        z = (self.logits(embedding, x) - ref.mean(1, keepdim=True)) / ref.std(1, keepdim=True)
        y = torch.softmax(z / self.temperature, dim=-1)
        return {"x": x, "y": y, "hard": y.argmax(-1), "embedding": embedding, "task_id": task_id}
