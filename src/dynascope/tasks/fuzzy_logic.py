"""Fuzzy-logic regression in context, with held-out conjunctions (HYLA's compositional task).

Glossary:
    L:          number of variables (``n_variables``); x ~ U[0, 1]^L.
    term:       one of the 2^L full conjunctions; ``terms[t]`` is a 0/1 vector of length L,
                1 = the variable appears plain (literal x_i), 0 = negated (1 - x_i). Terms are
                numbered in ``itertools.product([0, 1], repeat=L)`` order.
    K:          number of terms of a task (``n_terms``); a task is a K-combination of terms.
    f(x):       ``max_{t in task} min_i (x_i if terms[t, i] else 1 - x_i)`` (Zadeh's OR/AND/NOT).
    n_ood_terms: ``int(2^L * frac_ood_conj)`` terms reserved: the last ones in term order.
    splits:     ``"train"`` and ``"test"`` split the ``C(2^L - n_ood_terms, K)`` combinations of
                seen terms (``"test"``: the first ``int(n_in_dist * frac_test)`` of a permutation
                drawn from ``split_seed``; ``"train"``: the rest); ``"ood"`` holds the
                ``C(n_ood_terms, K)`` combinations of reserved terms only. ``"ind"`` = train+test.
    seq_len:    tokens per sequence; token ``i`` is ``[x_i (L), y_i]``; the last token's y is
                zeroed and is the prediction target (``[batch]``).
    base_mse:   per-sequence variance of the targets over all ``seq_len`` positions (the R²
                baseline of the reference code).

Which split the paper reports: Table A1's "OOD R²" is the ``"test"`` split (unseen combinations
of seen terms); ``"ood"`` (unseen terms) fails for every model (paper Fig. A3C). With L = 4,
K = 2, frac_ood_conj = 0.25, frac_test = 0.7: 16 terms, 4 reserved, C(12, 2) = 66 in-distribution
combinations -> 46 test / 20 train; C(4, 2) = 6 ood.

The split permutation uses ``torch.randperm`` on a generator seeded with ``split_seed``, so the
test/train membership differs from the JAX reference (same sizes, same construction).

References:
    Schug, Kobayashi, Akram, Sacramento, Pascanu (2025), "Attention as a Hypernetwork",
    ICLR 2025, arXiv 2406.05816, sec. 4.1, App. (fuzzy logic), Table A1; reference code
    ``hyla/data/logic.py`` (``FuzzyLogicGenerator``), ``hyla/loss.py`` (R²).
"""

from __future__ import annotations

import itertools

import torch
from torch import Tensor

__all__ = ["FUZZY_SPLITS", "FuzzyLogic", "fuzzy_logic_r2", "zadeh"]

FUZZY_SPLITS = ("train", "test", "ood", "ind")


def zadeh(terms: Tensor, x: Tensor) -> Tensor:
    """Zadeh fuzzy DNF: ``max_t min_i (x_i if terms[..., t, i] else 1 - x_i)``.

    Args:
        terms: ``[batch, K, L]`` 0/1 (bool or numeric) literals of each task's terms.
        x: ``[batch, n, L]`` inputs in [0, 1].
    Returns:
        ``[batch, n]`` values in [0, 1].
    """
    lit = torch.where(terms[:, None].bool(), x[:, :, None], 1.0 - x[:, :, None])  # [b, n, K, L]
    return lit.amin(dim=-1).amax(dim=-1)


def fuzzy_logic_r2(prediction: Tensor, target: Tensor, base_mse: Tensor) -> Tensor:
    """Per-sequence ``1 - (pred - y)^2 / base_mse``, shape ``[batch]``.

    The reference ``FuzzyLogicLoss`` averages it over sequences for the reported R².

    Args:
        prediction, target, base_mse: ``[batch]``.
    Returns:
        ``[batch]`` R² per sequence (``-inf``/NaN where ``base_mse`` is 0).
    """
    return 1.0 - (prediction - target).square() / base_mse


class FuzzyLogic:
    """In-context fuzzy-logic regression with held-out term combinations (see module glossary).

    Args:
        n_variables: L, ``>= 1``.
        n_terms: K, ``>= 1``.
        seq_len: tokens per sequence, ``>= 2``.
        frac_ood_conj: fraction of the 2^L terms reserved for ``"ood"``, in ``[0, 1)``.
        frac_test: fraction of in-distribution combinations in ``"test"``, in ``(0, 1)``.
        split_seed: seed of the fixed test/train permutation.
    Attributes:
        terms: ``[2^L, L]`` int64 table of all conjunctions.
        combos: dict split -> ``[n_combos, K]`` int64 term indices.
    Raises:
        ValueError: if an argument is out of range, or a split would be empty (``"ood"`` needs
            ``n_ood_terms >= K`` when ``frac_ood_conj > 0``).
    References:
        Schug et al. (2025), arXiv 2406.05816, sec. 4.1; reference ``hyla/data/logic.py``.
    """

    def __init__(
        self,
        n_variables: int,
        n_terms: int,
        seq_len: int,
        *,
        frac_ood_conj: float = 0.25,
        frac_test: float = 0.7,
        split_seed: int = 0,
    ) -> None:
        if n_variables < 1:
            raise ValueError(f"n_variables must be >= 1 (got n_variables={n_variables})")
        if n_terms < 1:
            raise ValueError(f"n_terms must be >= 1 (got n_terms={n_terms})")
        if seq_len < 2:
            raise ValueError(f"seq_len must be >= 2 (got seq_len={seq_len})")
        if not 0.0 <= frac_ood_conj < 1.0:
            raise ValueError(f"frac_ood_conj must be in [0, 1) (got frac_ood_conj={frac_ood_conj})")
        if not 0.0 < frac_test < 1.0:
            raise ValueError(f"frac_test must be in (0, 1) (got frac_test={frac_test})")
        self.n_variables, self.n_terms, self.seq_len = n_variables, n_terms, seq_len
        self.frac_ood_conj, self.frac_test, self.split_seed = frac_ood_conj, frac_test, split_seed
        self.d_in = n_variables + 1
        self.terms = torch.tensor(list(itertools.product([0, 1], repeat=n_variables)))
        n_all = len(self.terms)
        self.n_ood_terms = int(n_all * frac_ood_conj)
        n_seen = n_all - self.n_ood_terms
        in_dist = torch.tensor(
            list(itertools.combinations(range(n_seen), n_terms)), dtype=torch.long
        )
        ood = torch.tensor(
            list(itertools.combinations(range(n_seen, n_all), n_terms)), dtype=torch.long
        )
        n_test = int(len(in_dist) * frac_test)
        perm = torch.randperm(len(in_dist), generator=torch.Generator().manual_seed(split_seed))
        shuffled = in_dist[perm] if len(in_dist) else in_dist
        self.combos = {
            "test": shuffled[:n_test],
            "train": shuffled[n_test:],
            "ood": ood.reshape(-1, n_terms),
            "ind": in_dist.reshape(-1, n_terms),
        }
        if len(self.combos["train"]) == 0 or len(self.combos["test"]) == 0:
            raise ValueError(
                f"frac_test={frac_test} leaves an empty train or test split of "
                f"{len(in_dist)} in-distribution combinations (n_variables={n_variables}, "
                f"n_terms={n_terms})"
            )
        if frac_ood_conj > 0 and len(self.combos["ood"]) == 0:
            raise ValueError(
                f"frac_ood_conj={frac_ood_conj} reserves {self.n_ood_terms} terms, fewer than "
                f"n_terms={n_terms}: the ood split is empty"
            )

    def sample(self, split: str, batch_size: int, generator: torch.Generator) -> dict[str, Tensor]:
        """Draw ``batch_size`` tasks (uniform over the split's combinations, with replacement).

        Args:
            split: ``"train"``, ``"test"``, ``"ood"`` or ``"ind"``.
            batch_size: ``>= 1``.
            generator: all randomness; tensors live on ``generator.device``.
        Returns:
            ``x`` ``[batch, seq_len, L + 1]`` tokens (last y zeroed), ``y`` ``[batch]`` the last
            target, ``base_mse`` ``[batch]``, ``terms`` ``[batch, K]`` term indices, ``latent``
            ``[batch, 2^L]`` K-hot term vector (probe target).
        Raises:
            ValueError: for an unknown or empty split, or ``batch_size < 1``.
        """
        if split not in FUZZY_SPLITS:
            raise ValueError(f"split must be one of {FUZZY_SPLITS} (got split={split!r})")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1 (got batch_size={batch_size!r})")
        combos = self.combos[split]
        if len(combos) == 0:
            raise ValueError(f"split {split!r} is empty (frac_ood_conj={self.frac_ood_conj})")
        device = generator.device
        pick = torch.randint(len(combos), (batch_size,), generator=generator, device=device)
        term_idx = combos.to(device)[pick]  # [batch, K]
        x = torch.rand(
            batch_size, self.seq_len, self.n_variables, generator=generator, device=device
        )
        targets = zadeh(self.terms.to(device)[term_idx], x)  # [batch, seq_len]
        base_mse = (targets - targets.mean(dim=1, keepdim=True)).square().mean(dim=1)
        tokens = torch.cat([x, targets[..., None]], dim=-1)
        tokens[:, -1, -1] = 0.0
        latent = torch.zeros(batch_size, len(self.terms), device=device)
        latent.scatter_(1, term_idx, 1.0)
        return {
            "x": tokens,
            "y": targets[:, -1],
            "base_mse": base_mse,
            "terms": term_idx,
            "latent": latent,
        }

    def counts(self) -> dict[str, int]:
        """Number of combinations per split, plus ``terms`` (2^L) and ``ood_terms``."""
        out = {k: len(v) for k, v in self.combos.items()}
        out.update(terms=len(self.terms), ood_terms=self.n_ood_terms)
        return out
