"""S5 theory teacher: each task's network is a sparse linear combination of M weight modules.

Glossary:
    M:          number of teacher modules (``n_modules``, 6).
    n_input:    input width (16); ``x ~ U(-sqrt 3, sqrt 3)^n_input`` (zero mean, unit variance).
    n_hidden:   teacher hidden width (16); ``n_output``: output width (4).
    z:          ``[tasks, M]`` task code; the teacher is a :class:`~dynascope.nn.MultitaskHypernet`
                ``y = relu(x @ reshape(z @ theta) / sqrt(n_input)) @ W_head``.
    task set:   training tasks as lists of module indices, written as in the reference sweeps:
                ``"0,1;1,2"`` = tasks {0, 1} and {1, 2}; ``"0,0"`` = one-hot 0 (repeated indices
                collapse). A task's mask is its k-hot vector; its training code is discrete,
                ``mask / ||mask||_2``.
    family:     the training codes whose support lies inside one task's mask S; it *spans* S
                when those codes span ``R^S``. A discrete family with no sub-tasks is one ray,
                so a mask of size >= 2 spans only together with enough smaller tasks (the
                one-hots).
    connected support: every module lies in a spanning family, and the graph whose nodes are
                modules and whose edges join modules of a common spanning family is connected.
                Blessed task sets have it, Doomed ones do not (:func:`support_structure`).
    eval keys:  ``eval_{h/M:.3f}`` for h = 1..M: masks drawn uniformly from all C(M, h) h-hot
                masks, codes continuous: ``e ~ Exp(1)^M ⊙ mask``, ``w = e / (sum e + 1)``,
                ``z = (0.5 w + 0.5) ⊙ mask`` (non-zero entries in (0.5, 1)).

The hyperteacher (:class:`FewShotHyperteacher`, :func:`hyperteacher_split`) lives in
:mod:`dynascope.tasks.few_shot_hyperteacher` and is re-exported here.

Every draw is deterministic from a ``torch.Generator``; tensors live on the generator's device.

References:
    Schug et al. (2024), "Discovering modular solutions that generalize compositionally",
    arXiv 2312.15001, sec. 3, Fig. 2; reference ``run_theory.py`` (``SparseData``,
    ``UniformData``) and ``sweeps/theory/overlap_discrete.yml`` (the task sets).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from dynascope.nn.multitask_hypernet import MultitaskHypernet

from ._masks import continuous_codes as continuous_codes
from ._masks import k_hot_masks as k_hot_masks
from .few_shot_hyperteacher import HYPER_SUPPORTS as HYPER_SUPPORTS
from .few_shot_hyperteacher import FewShotHyperteacher as FewShotHyperteacher
from .few_shot_hyperteacher import hyperteacher_split as hyperteacher_split

__all__ = [
    "BLESSED",
    "DOOMED",
    "HYPER_SUPPORTS",
    "TASK_SETS",
    "FewShotHyperteacher",
    "ModularTeacher",
    "SupportStructure",
    "continuous_codes",
    "eval_keys",
    "hyperteacher_split",
    "k_hot_masks",
    "masks_of",
    "parse_task_set",
    "support_structure",
]

_ONE_HOTS = "0;1;2;3;4;5"
TASK_SETS: dict[str, str] = {
    # Doomed (S05): no connected support.
    "one_hots": _ONE_HOTS,
    "ring": "0,1;1,2;2,3;3,4;4,5;5,0",
    "one_hots+two_triangles": _ONE_HOTS + ";0,1;1,2;2,0;3,4;4,5;5,3",
    "two_triples": "0,1,2;3,4,5",
    "triple_ring": "0,1,2;1,2,3;2,3,4;3,4,5;4,5,0;5,0,1",
    "all": "0,1,2,3,4,5",
    # Blessed (S05): one-hots plus tasks that connect every module.
    "one_hots+ring": _ONE_HOTS + ";0,1;1,2;2,3;3,4;4,5;5,0",
    "one_hots+triples": _ONE_HOTS + ";0,1,2;2,3,4;4,5,0",
    "one_hots+triple_mix": _ONE_HOTS + ";0,1,2;1,2,4;2,3,4;3,4,5;4,5,0;5,0,1",
    "one_hots+all": _ONE_HOTS + ";0,1,2,3,4,5",
}
DOOMED = ("one_hots", "ring", "one_hots+two_triangles", "two_triples", "triple_ring", "all")
BLESSED = ("one_hots+ring", "one_hots+triples", "one_hots+triple_mix", "one_hots+all")


def parse_task_set(spec: str) -> list[tuple[int, ...]]:
    """``"0,1;1,2"`` -> ``[(0, 1), (1, 2)]``: each task's sorted, de-duplicated module indices.

    Raises:
        ValueError: if a task is empty or an index is not a non-negative integer.
    """
    tasks = []
    for part in spec.split(";"):
        try:
            idx = sorted({int(s) for s in part.split(",")})
        except ValueError:
            raise ValueError(f"task set: {part!r} is not a list of module indices") from None
        if any(i < 0 for i in idx):
            raise ValueError(f"task set: module indices must be >= 0 (got {part!r})")
        tasks.append(tuple(idx))
    return tasks


def masks_of(task_set: str, n_modules: int = 6) -> Tensor:
    """Training masks ``[n_tasks, M]`` (0/1, float32) of a named task set or a raw spec.

    Args:
        task_set: a key of :data:`TASK_SETS` or a spec like ``"0,1;1,2"``.
        n_modules: M.
    Raises:
        ValueError: for an unparsable spec or an index ``>= n_modules``.
    """
    spec = TASK_SETS.get(task_set, task_set)
    tasks = parse_task_set(spec)
    if max(max(t) for t in tasks) >= n_modules:
        raise ValueError(f"task set {task_set!r} uses a module index >= n_modules={n_modules}")
    masks = torch.zeros(len(tasks), n_modules)
    for row, task in enumerate(tasks):
        masks[row, list(task)] = 1.0
    return masks


def eval_keys(n_modules: int) -> list[str]:
    """``["eval_0.167", ..., "eval_1.000"]`` for M = 6 (the reference's ``eval_{h/M:.3f}``)."""
    return [f"eval_{h / n_modules:.3f}" for h in range(1, n_modules + 1)]


class SupportStructure:
    """What a set of training codes identifies (see the glossary's "connected support").

    Attributes:
        spanning: masks (tuples of module indices) whose family spans ``R^S``.
        components: connected components of the module graph (spanning families only),
            as sorted tuples; modules in no spanning family are singletons.
        compositional: every module lies in some spanning family.
        connected: ``compositional`` and one component.
    """

    def __init__(self, codes: Tensor, tol: float = 1e-6) -> None:
        codes = codes.double()
        n_modules = codes.shape[1]
        support = codes.abs() > tol
        masks = sorted({tuple(int(i) for i in row.nonzero().flatten()) for row in support})
        masks = [m for m in masks if m]
        self.spanning = []
        for mask in masks:
            inside = ~support[:, [i for i in range(n_modules) if i not in mask]].any(-1)
            family = codes[inside][:, list(mask)]
            if torch.linalg.matrix_rank(family, atol=tol).item() == len(mask):
                self.spanning.append(mask)
        parent = list(range(n_modules))

        def root(i: int) -> int:
            while parent[i] != i:
                i = parent[i]
            return i

        for mask in self.spanning:
            for i in mask[1:]:
                parent[root(i)] = root(mask[0])
        groups: dict[int, list[int]] = {}
        for i in range(n_modules):
            groups.setdefault(root(i), []).append(i)
        self.components = sorted(tuple(g) for g in groups.values())
        covered = {i for mask in self.spanning for i in mask}
        self.compositional = len(covered) == n_modules
        self.connected = self.compositional and len(self.components) == 1


def support_structure(codes: Tensor, tol: float = 1e-6) -> SupportStructure:
    """Spanning families, components and connectedness of training codes ``[n, M]``.

    For discrete task sets pass ``masks / ||masks||`` (every code of the set); for continuous
    codes pass enough draws per mask to span.

    Raises:
        ValueError: if ``codes`` is not 2-D or has non-finite entries.
    References:
        Schug et al. (2024), arXiv 2312.15001, sec. 3.2 (compositional and connected support).
    """
    if codes.ndim != 2 or not codes.isfinite().all():
        raise ValueError(f"codes must be a finite [n, M] tensor (got shape {tuple(codes.shape)})")
    return SupportStructure(codes, tol)


class ModularTeacher:
    """The S5 teacher: a fixed :class:`MultitaskHypernet`, a training task set and eval keys.

    Args:
        task_set: a key of :data:`TASK_SETS` or a raw spec (``"0,1;1,2"``).
        n_input, n_hidden, n_output, n_modules, n_hidden_layers: teacher sizes (S5: 16, 16,
            4, 6, 1).
        teacher_seed: seed of the teacher's weights (drawn on the CPU, then moved).
        device: where the teacher and all draws live.
    Raises:
        ValueError: for a bad task set or sizes.
    References:
        Schug et al. (2024), arXiv 2312.15001, sec. 3; reference ``run_theory.py``.
    """

    def __init__(
        self,
        task_set: str = "one_hots+ring",
        *,
        n_input: int = 16,
        n_hidden: int = 16,
        n_output: int = 4,
        n_modules: int = 6,
        n_hidden_layers: int = 1,
        teacher_seed: int = 0,
        device: str | torch.device = "cpu",
    ) -> None:
        self.task_set = task_set
        self.train_masks = masks_of(task_set, n_modules).to(device)
        self.n_input, self.n_modules = n_input, n_modules
        g = torch.Generator().manual_seed(teacher_seed)
        self.network = MultitaskHypernet(
            n_input, n_hidden, n_output, n_modules, n_hidden_layers, generator=g
        ).to(device)
        self.network.requires_grad_(False)
        self.keys = ["train", *eval_keys(n_modules)]

    def sample_codes(self, key: str, n_tasks: int, generator: torch.Generator) -> Tensor:
        """Codes ``[n_tasks, M]`` of one key: ``"train"`` (a uniform task of the set, discrete
        code ``mask / ||mask||``) or ``eval_{h/M:.3f}`` (uniform h-hot mask, continuous code).

        Raises:
            ValueError: for an unknown key or ``n_tasks < 1``.
        """
        if key not in self.keys:
            raise ValueError(f"key must be one of {self.keys} (got key={key!r})")
        if n_tasks < 1:
            raise ValueError(f"n_tasks must be >= 1 (got n_tasks={n_tasks})")
        dev = generator.device
        if key == "train":
            table = self.train_masks.to(dev)
            pick = torch.randint(len(table), (n_tasks,), generator=generator, device=dev)
            masks = table[pick]
            return masks / masks.norm(dim=-1, keepdim=True)
        h = self.keys.index(key)
        table = k_hot_masks(h, self.n_modules).to(dev)
        pick = torch.randint(len(table), (n_tasks,), generator=generator, device=dev)
        return continuous_codes(table[pick], generator)

    def sample_x(self, n_tasks: int, batch: int, generator: torch.Generator) -> Tensor:
        """Inputs ``[n_tasks, batch, n_input]``, ``x ~ U(-sqrt 3, sqrt 3)``."""
        dev = generator.device
        u = torch.rand(n_tasks, batch, self.n_input, generator=generator, device=dev)
        return (2 * u - 1) * math.sqrt(3)

    def __call__(self, x: Tensor, z: Tensor) -> Tensor:
        """Teacher outputs ``[tasks, batch, n_output]`` (no gradient)."""
        with torch.no_grad():
            return self.network(x, z)
