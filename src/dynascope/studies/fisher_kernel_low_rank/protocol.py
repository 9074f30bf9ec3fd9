"""The protocol of ``fisher-kernel-low-rank`` (S14): claims, statistics, thresholds,
preconditions, ablation controls, seeds and presets, and the amendment log
(``shared/DESIGN.md``, Protocol).

The shuffled-label arm's fit bar (training loss <= ln 10 / 2, fixed from theory) is not met at
fast's 2,000 steps (calibration seeds 10000-10004: 1.24-1.41 nats), so f1 and f3 read
inconclusive at fast. The `full` preset (added 2026-12-07, amendment below) gives both arms
10,000 steps, at which the shuffled arm memorises its labels (calibration seed 10000: final loss
0.03-0.08 over 8 seeds). f1 keeps its definition and threshold: S14's CPU system is far below
the paper's scale (convnets on CIFAR-10), and no CPU preset reaches it (docs: "full").

Proposed amendment (not made; it needs a fresh, pre-registered test on new seeds): judge f1 on
the CNN as well at `paper` (the analysis reads the MLP runs only). On calibration seed 10000 the
CNN's f1 was 0.937 after 10,000 steps (its parameters are shared across positions, so almost
none has a tiny diagonal Fisher: 0.6 % below 1e-3 of the mean, against 23 % for the MLP).
"""

from __future__ import annotations

import math

from dynascope.studies.protocol import EDITORIAL_REWORDING, Amendment, ClaimSpec, Protocol

__all__ = ["FIT_ACCURACY", "FIT_LOSS", "PROTOCOL", "SEEDS"]

FIT_ACCURACY = 0.9  # the classifier trained on the true labels learnt the task (test accuracy)
# the classifier trained on shuffled labels learnt its labels: final training cross-entropy at
# most half the chance loss ln 10 (theory: chance is ln 10 = 2.30 nats; not calibrated)
FIT_LOSS = math.log(10) / 2
SEEDS = {"smoke": 3, "fast": 5, "full": 8, "paper": 5}

_TRAINED = (
    f"every seed of the task arm (true labels) finished with test accuracy >= {FIT_ACCURACY:g}"
)
_SHUFFLED = (
    "every seed of the shuffled-label arm finished with final training cross-entropy (on its "
    f"shuffled labels) <= ln 10 / 2 = {FIT_LOSS:.3f} nats"
)

PROTOCOL = Protocol(
    study="fisher-kernel-low-rank",
    claims=(
        ClaimSpec(
            id="f1",
            claim="the trained NFK is low-rank: its top k eigenvalues hold >= 0.9 of tr K",
            statement="In practice the Neural Fisher Kernel's Gram matrix is close to low-rank, "
            "so a few top directions give compact representations",
            citation="Zhang, Zhai, Littwin, Susskind, ICLR 2022, arXiv 2202.01944, sec. 3 "
            "(low-rank approximation); shared/systems/S14 f1",
            metric="sum_{i<=k} lambda_i(K) / tr K at k = 32, exact eigenvalues, K = Phi Phi^T "
            "with the diagonal Fisher estimated on the training split, per seed",
            threshold=0.9,
            direction=">=",
            threshold_source="theory: S14's proposal (0.9), frozen before the first fast run",
            preconditions=(_TRAINED, _SHUFFLED),
            control="the same classifier, budget and NFK trained on shuffled training labels "
            "(what the network learnt about the task removed), the same top-k fraction",
        ),
        ClaimSpec(
            id="f2",
            claim="the matrix-free randomized SVD captures the exact top-k energy",
            statement="The top singular directions are computed without forming the kernel, "
            "by a randomized SVD from JVPs and VJPs",
            citation="arXiv 2202.01944, sec. 3 (efficient algorithm); Halko, Martinsson & "
            "Tropp (2011), arXiv 0909.4061",
            metric="sum of the randomized sigma_i^2 / sum of the exact top-k eigenvalues (Ky "
            "Fan energy captured), per seed",
            threshold=0.99,
            direction=">=",
            threshold_source="theory: S14's 0.99 (stated for the subspace cosine, kept for the "
            "captured energy; see the amendment of 2026-12-02)",
            preconditions=(_TRAINED,),
            kind="identity",
        ),
        ClaimSpec(
            id="f3",
            claim="linear probes on the k-d NFK embedding are within 2 points of the "
            "penultimate layer's",
            statement="NFK embeddings of supervised models are competitive for linear probing",
            citation="arXiv 2202.01944, sec. 4 (linear probing); shared/systems/S14 f3",
            metric="probe accuracy(NFK-32 of the task classifier) - probe accuracy(penultimate "
            "layer of the task classifier), test split, true labels, per seed",
            threshold=-0.02,
            direction=">=",
            threshold_source="theory: S14's proposal (2 points), frozen before the first fast run",
            preconditions=(_TRAINED, _SHUFFLED),
            control="the NFK-32 embedding of the shuffled-label classifier (same budget) in "
            "place of the task classifier's, probed with the true labels against the same "
            "yardstick (the task classifier's penultimate layer)",
        ),
    ),
    seeds=SEEDS,
    calibration_seeds=(10000,),
    presets={
        "smoke": "MLP 64-16-16-10, N = 50, k = 4, 50 steps, 3 seeds per arm: plumbing only "
        "(inconclusive by its seed count)",
        "fast": "S14's CPU system: MLP 64-64-64-10, N = 500, k = 32, 2,000 Adam steps, 5 seeds "
        "per arm (task labels; shuffled labels), each arm one ensemble; step count from "
        "measured time (2026-12-01), seeds from the contract's minimum",
        "full": "fast's system (MLP 64-64-64-10, N = 500, k = 32, the same run config) at "
        "10,000 Adam steps in both arms, 8 seeds per arm, each arm one ensemble. Steps: on "
        "calibration seed 10000 (1 seed per arm, 20,000 steps) the shuffled arm's training loss "
        "crossed ln 10 / 2 at ~2.8k steps (0.15 at 8k, 0.054 at 10k); at the full preset on "
        "calibration base seed 10000 (8 seeds per arm) its final loss was 0.029-0.079 (bar "
        "1.151) and the task arm's test accuracy 0.972-0.978, 323 s wall / 257 CPU s on the "
        "shared 2-core machine. Seeds: 8 (>= 5) because they fit the time budget; nothing was "
        "sized on a claim's value",
        "paper": "GPU: every training point scored, k in {16, 32, 64, 128}, MLP 256-256 and the "
        "CNN, 5 seeds per arm (not run)",
    },
    reproduces="none at CPU scale: at full (calibration seeds 10000-10007) f1 reads not held "
    "(0.835, interval [0.831, 0.838] < 0.9) with f2 and f3 held; expected the same at seeds 0 "
    "and 1000. The paper's scale (convnets on CIFAR-10, tens of thousands of points) is out of "
    "CPU reach; on calibration seed 10000 a wider MLP (64-256-256-10: 0.831) or all 1,297 "
    "points scored (0.799) did not raise f1, while the CNN (65k parameters, a convnet like the "
    "paper's) reached 0.937, at ~16 CPU min per run: too slow for full",
    registered="2026-12-07: fixed after the earlier contract's fast verdicts at seeds 0-2 and "
    "1000-1002 had been seen (f1 not held 0.836 / 0.835, f2 held 0.998 / 0.997, f3 held "
    "+0.003 / 0.000); this version adds the shuffled-label ablation, fit preconditions on both "
    "arms, f2 as an identity and 5 seeds",
    amendments=(
        Amendment(
            date="2026-12-02",
            claims=("f2",),
            change="f2's metric: the mean cosine of the principal angles between the exact and "
            "randomized top-k subspaces (>= 0.99) replaced by the captured top-k energy "
            "(>= 0.99) (commit 29da3dc).",
            reason="the angles are ill-posed on a near-flat spectrum around k (lambda_32 / "
            "lambda_42 ~ 1.4): a rotation inside the near-degenerate band moves them without "
            "changing the approximation (commit 29da3dc, docs 'f2's metric').",
            seen="fast at seed 0 (2026-12-01, commit d3d01b4): f2 = 0.986 failed the cosine "
            "threshold, captured energy 0.998; f1 0.830 failed.",
        ),
        Amendment(
            date="2026-12-02",
            claims=("f1", "f2", "f3"),
            change="the diagonal Fisher and the centring mean estimated on the whole training "
            "split (1,297 points) instead of the 500 scored points; 1 seed -> 3 seeds as one "
            "ensemble; the step-0 (untrained) kernel as the controls (commit 29da3dc).",
            reason="I = E_{x~p_theta}[U U^T] is a population expectation; estimating it on the "
            "scored set makes rare parameters' D_jj tiny and flattens K by construction "
            "(commit 29da3dc).",
            seen="fast at seed 0 (commit d3d01b4): f1 0.830 not held, f2 0.986 not held, f3 held.",
        ),
        Amendment(
            date="2026-12-07",
            claims=("f1", "f2", "f3"),
            change="evidence contract: 95 % Student-t intervals over 5 seeds per arm (was the "
            "mean and 2/3 of 3 seeds); f1's and f3's untrained / random / shuffled-probe "
            "controls replaced by a shuffled-label classifier at the same budget (new arm); f2 "
            "becomes an identity (implementation check; its random-directions control could "
            "not hold by construction); fit preconditions on both arms.",
            reason="replace controls that cannot fail (f2, f3); fit preconditions on every "
            "arm a claim reads.",
            seen="the earlier contract's fast verdicts at seeds 0-2 and 1000-1002 (f1 not held, "
            "f2 held, f3 held).",
        ),
        EDITORIAL_REWORDING,
        Amendment(
            date="2026-12-07",
            claims=("f1", "f2", "f3"),
            change="a `full` preset: fast's system and run config at 10,000 Adam steps (both "
            "arms), 8 seeds per arm; no claim, metric, statistic, threshold, precondition or "
            "control changed",
            reason="at fast's 2,000 steps the shuffled-label arm does not memorise its labels "
            "(its precondition fails, f1 and f3 read inconclusive); the step budget was sized "
            "on calibration seeds 10000-10007 so that it does, with margin (final loss <= 0.08 "
            "against the 1.151 bar)",
            seen="fast at seeds 0 and 1000: f1 inconclusive (0.836 [0.835, 0.838] and 0.835 "
            "[0.830, 0.841]; shuffled-arm loss 1.45 / 1.44 > 1.151), f2 held (0.998 / 0.998), "
            "f3 inconclusive (+0.002 / +0.001, same precondition)",
        ),
    ),
)
