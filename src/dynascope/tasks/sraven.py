"""Symbolic Raven progressive matrices (sRAVEN): infer per-feature rules, complete the grid.

Glossary:
    F:          number of values a feature takes (``n_values``, 8); values ``0..F-1``.
    K:          features per panel (``n_features``, 4).
    grid:       3 x 3 panels (rows = 3 examples of the rules, columns = position in a row);
                panel ``(r, c)`` holds K feature values. The last panel (2, 2) is the answer.
    rules:      R = 8, one per feature, applied along every row (values mod F):
                0 constant (each row repeats one value); 1-4 progression +1, +2, -1, -2 (a row
                ``s, s+d, s+2d``); 5 addition (``a, b, a+b``); 6 subtraction (``a, b, a-b``);
                7 distribute-three (three distinct values shared by all rows, each row a
                permutation of them).
    task:       a multiset of K rules, one of ``combinations_with_replacement(range(8), K)``
                (330 for K = 4); ``int(n_tasks * frac_ood)`` of them (82 for K = 4), the first
                of a permutation seeded by ``split_seed``, are held out as ``"ood"``.
    permutation: per column ``c`` a permutation ``perm[c]`` of the K feature slots, the same in
                every row: panel ``(r, c)`` shows ``values[perm[c]]``. The learner must find
                which slots a rule links across a row.
    tokens:     8 context panels x K one-hot tokens (dim F), panel-major, then K zero query
                tokens: ``[batch, 9K, F]`` (36 x 8 for K = 4). Targets ``[batch, K]``: the answer
                panel's K values (in shown, permuted order).
    ambiguous:  rule detectors (constant, progression +-1/+-2, sum, difference,
                distribute-three) run on each feature's 8 context values under every choice of
                per-column permutations. ``mode="reference"`` (default, the reference code's
                ``check_is_ambiguous``, behind the paper's "under 0.5%"): some permutation lets
                *every* feature be fit by a rule whose answer differs from the shown one.
                ``mode="any_feature"`` (stricter test of uniqueness): some permutation lets every
                feature be fit and at least one fitting rule gives a different answer. Measured
                (K = 4, F = 8, 400 instances): ~28% under ``any_feature``, mostly coincidences
                such as addition = subtraction when the second value is 0 or F/2.

Deterministic from a ``torch.Generator``; the held-out split uses ``torch.randperm`` (sizes as
the reference; membership differs from the JAX permutation).

References:
    Schug, Kobayashi, Akram, Sacramento, Pascanu (2025), "Attention as a Hypernetwork",
    ICLR 2025, arXiv 2406.05816, sec. 4.2 and App. (sRAVEN); reference code
    ``hyla/data/raven.py`` (``SymbolicRavenGenerator``, ``check_is_ambiguous``).
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["RULES", "SRAVEN_SPLITS", "SymbolicRaven"]

RULES = (
    "constant",
    "progression+1",
    "progression+2",
    "progression-1",
    "progression-2",
    "addition",
    "subtraction",
    "distribute_three",
)
SRAVEN_SPLITS = ("train", "ood", "train_unpermuted", "ood_unpermuted")
_STEPS = (1, 2, -1, -2)


class SymbolicRaven:
    """sRAVEN generator with held-out rule combinations (see the module glossary).

    Args:
        n_features: K, ``>= 1``.
        n_values: F, ``>= 3`` (distribute-three needs three distinct values).
        frac_ood: fraction of rule multisets held out, in ``[0, 1)``.
        split_seed: seed of the held-out permutation.
        permute_features: apply the column-consistent feature permutations.
    Raises:
        ValueError: for out-of-range arguments or an empty split.
    References:
        Schug et al. (2025), arXiv 2406.05816, sec. 4.2; reference ``hyla/data/raven.py``.
    """

    def __init__(
        self,
        n_features: int = 4,
        n_values: int = 8,
        *,
        frac_ood: float = 0.25,
        split_seed: int = 0,
        permute_features: bool = True,
    ) -> None:
        if n_features < 1:
            raise ValueError(f"n_features must be >= 1 (got n_features={n_features})")
        if n_values < 3:
            raise ValueError(f"n_values must be >= 3 (got n_values={n_values})")
        if not 0.0 <= frac_ood < 1.0:
            raise ValueError(f"frac_ood must be in [0, 1) (got frac_ood={frac_ood})")
        self.n_features, self.n_values = n_features, n_values
        self.permute_features = permute_features
        combos = list(itertools.combinations_with_replacement(range(len(RULES)), n_features))
        self.tasks = torch.tensor(combos, dtype=torch.long)  # [n_tasks, K]
        n_ood = int(len(combos) * frac_ood)
        perm = torch.randperm(len(combos), generator=torch.Generator().manual_seed(split_seed))
        self.split_index = {"ood": perm[:n_ood], "train": perm[n_ood:]}
        if frac_ood > 0 and n_ood == 0:
            raise ValueError(f"frac_ood={frac_ood} holds out no rule combination")
        self.seq_len = 9 * n_features

    def counts(self) -> dict[str, int]:
        """Rule multisets per split and in all."""
        return {"all": len(self.tasks), **{k: len(v) for k, v in self.split_index.items()}}

    def _rule_rows(self, rules: Tensor, generator: torch.Generator) -> Tensor:
        """Values ``[batch, K, 3 rows, 3 cols]`` for rule ids ``rules`` ``[batch, K]``."""
        b, k = rules.shape
        n, dev = self.n_values, rules.device
        cols = torch.arange(3, device=dev)

        def randint(*shape: int) -> Tensor:
            return torch.randint(n, shape, generator=generator, device=dev)

        start = randint(b, k, 3, 1)
        grids = [start.expand(b, k, 3, 3)]  # constant
        grids += [(start + d * cols) % n for d in _STEPS]
        ab = randint(b, k, 3, 2)
        grids.append(torch.cat([ab, ab.sum(-1, keepdim=True) % n], -1))
        grids.append(torch.cat([ab, (ab[..., :1] - ab[..., 1:]) % n], -1))
        symbols = torch.rand(b, k, n, generator=generator, device=dev).argsort(-1)[..., :3]
        order = torch.rand(b, k, 3, 3, generator=generator, device=dev).argsort(-1)
        grids.append(torch.gather(symbols[:, :, None].expand(b, k, 3, 3), -1, order))
        stacked = torch.stack(grids, dim=2)  # [b, K, R, 3, 3]
        index = rules[:, :, None, None, None].expand(b, k, 1, 3, 3)
        return torch.gather(stacked, 2, index)[:, :, 0]

    def sample(self, split: str, batch_size: int, generator: torch.Generator) -> dict[str, Tensor]:
        """Draw ``batch_size`` instances of one split.

        Args:
            split: ``"train"``, ``"ood"``, or either with ``"_unpermuted"`` (no permutation).
            batch_size: ``>= 1``.
            generator: all randomness (tensors on ``generator.device``).
        Returns:
            ``x`` ``[batch, 9K, F]`` one-hot tokens with K zero query tokens; ``y`` ``[batch, K]``
            answer values; ``panels`` ``[batch, 9, K]`` shown values (panel-major); ``rules``
            ``[batch, K]`` rule ids (unpermuted slot order); ``perms`` ``[batch, 3, K]``.
        Raises:
            ValueError: for an unknown or empty split or ``batch_size < 1``.
        """
        if split not in SRAVEN_SPLITS:
            raise ValueError(f"split must be one of {SRAVEN_SPLITS} (got split={split!r})")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1 (got batch_size={batch_size!r})")
        pool = self.split_index[split.removesuffix("_unpermuted")]
        if len(pool) == 0:
            raise ValueError(f"split {split!r} is empty")
        dev, k = generator.device, self.n_features
        pick = pool.to(dev)[
            torch.randint(len(pool), (batch_size,), generator=generator, device=dev)
        ]
        rules = self.tasks.to(dev)[pick]
        # random slot order for the multiset, so a rule is not tied to a fixed slot
        slot = torch.rand(batch_size, k, generator=generator, device=dev).argsort(-1)
        rules = torch.gather(rules, 1, slot)
        values = self._rule_rows(rules, generator).permute(0, 2, 3, 1)  # [b, rows, cols, K]
        if self.permute_features and not split.endswith("_unpermuted"):
            perms = torch.rand(batch_size, 3, k, generator=generator, device=dev).argsort(-1)
        else:
            perms = torch.arange(k, device=dev).expand(batch_size, 3, k)
        shown = torch.gather(values, 3, perms[:, None].expand(-1, 3, -1, -1))
        panels = shown.reshape(batch_size, 9, k)
        onehot = F.one_hot(panels[:, :8].reshape(batch_size, 8 * k), self.n_values).float()
        x = torch.cat([onehot, torch.zeros(batch_size, k, self.n_values, device=dev)], dim=1)
        return {"x": x, "y": panels[:, 8], "panels": panels, "rules": rules, "perms": perms}

    # -- ambiguity --------------------------------------------------------------------------
    def _detect(self, seq: Tensor) -> tuple[Tensor, Tensor]:
        """Detectors on 8 context values ``[..., 8]``: fits and answers, each ``[..., 5]``."""
        n = self.n_values
        rows = seq[..., :6].reshape(*seq.shape[:-1], 2, 3)
        last = seq[..., 6:8]
        const_fit = (rows == rows[..., :1]).all(-1).all(-1) & (last[..., 0] == last[..., 1])
        const_ans = last[..., 0]
        diffs = torch.stack(
            [rows[..., 0, 1] - rows[..., 0, 0], rows[..., 0, 2] - rows[..., 0, 1],
             rows[..., 1, 1] - rows[..., 1, 0], rows[..., 1, 2] - rows[..., 1, 1],
             last[..., 1] - last[..., 0]], -1) % n  # fmt: skip
        step = diffs[..., 0]
        allowed = torch.tensor([d % n for d in _STEPS], device=seq.device)
        prog_fit = (diffs == step[..., None]).all(-1) & (step[..., None] == allowed).any(-1)
        prog_ans = (last[..., 1] + step) % n
        sum_fit = ((rows[..., 0] + rows[..., 1]) % n == rows[..., 2]).all(-1)
        sum_ans = (last[..., 0] + last[..., 1]) % n
        diff_fit = ((rows[..., 0] - rows[..., 1]) % n == rows[..., 2]).all(-1)
        diff_ans = (last[..., 0] - last[..., 1]) % n
        sorted_rows = rows.sort(-1).values
        same_set = (sorted_rows[..., 0, :] == sorted_rows[..., 1, :]).all(-1)
        distinct = (sorted_rows[..., 0, 1:] != sorted_rows[..., 0, :-1]).all(-1)
        in_set = last[..., :, None] == sorted_rows[..., 0, None, :]  # [..., 2, 3]
        dist_fit = same_set & distinct & in_set.any(-1).all(-1) & (last[..., 0] != last[..., 1])
        dist_ans = torch.gather(
            sorted_rows[..., 0, :], -1, (~in_set.any(-2)).long().argmax(-1, keepdim=True)
        )[..., 0]
        fits = torch.stack([const_fit, prog_fit, sum_fit, diff_fit, dist_fit], -1)
        answers = torch.stack([const_ans, prog_ans, sum_ans, diff_ans, dist_ans], -1)
        return fits, answers

    def check_is_ambiguous(self, panels: Tensor, mode: str = "reference") -> Tensor:
        """Flag instances with an alternative consistent completion (see the glossary).

        Enumerates all ``(K!)^3`` per-column permutations (K = 4: 13824), so keep batches small.

        Args:
            panels: ``[batch, 9, K]`` shown values.
            mode: ``"reference"`` (every feature has a differing fit) or ``"any_feature"``.
        Returns:
            bool ``[batch]``.
        Raises:
            ValueError: if ``panels`` is not ``[batch, 9, K]`` or ``mode`` is unknown.
        References:
            Reference code ``hyla/data/raven.py``, ``check_is_ambiguous``.
        """
        k = self.n_features
        if panels.ndim != 3 or panels.shape[1:] != (9, k):
            raise ValueError(f"panels must be [batch, 9, K={k}] (got {tuple(panels.shape)})")
        if mode not in ("reference", "any_feature"):
            raise ValueError(f"mode must be 'reference' or 'any_feature' (got mode={mode!r})")
        slot_perms = torch.tensor(list(itertools.permutations(range(k))), device=panels.device)
        grid = panels.reshape(-1, 3, 3, k)  # [b, rows, cols, K]
        flags = torch.zeros(len(panels), dtype=torch.bool, device=panels.device)
        for p in itertools.product(range(len(slot_perms)), repeat=3):
            perm = slot_perms[list(p)]  # [3 cols, K]
            undone = torch.gather(grid, 3, perm[None, None].expand(len(grid), 3, 3, k))
            seq = undone.reshape(-1, 9, k).transpose(1, 2)  # [b, K, 9]
            fits, answers = self._detect(seq[..., :8])
            differing = (fits & (answers != seq[..., 8:9])).any(-1)  # [b, K]
            if mode == "reference":
                flags |= differing.all(-1)
            else:
                flags |= fits.any(-1).all(-1) & differing.any(-1)
        return flags
