"""The protocol of ``permuted-initialisations`` (S7): what decides each verdict, fixed before
the evaluation seeds of this contract ran (``dynascope.studies.protocol``).

Claims are per gated MLP architecture: p1-p3 for each of the preset's ``pair_hidden``; the
claim id names the architecture (``p1 (MLP 64-1024-10)``), so the protocol lists every
architecture any preset gates (:data:`ARCHITECTURES`).

Every control is an ablation on the same trained pairs at the same budget: the matched
permutation π replaced by a uniformly random one (p1, p3), or the permutation applied to the
unpermuted average (p2, the cause of "near chance" removed). Each could hold: a random π
beats chance only if any alignment will do; the matched-permuted average stays at chance for
the CNN (notes page). The precondition on every claim is the fit of both end points of every
pair, per seed (the only arm the claims read: the random π and the unpermuted average are
measurements on the same trained nets).

Proposed amendments (not made; they would need fresh seeds): none.
"""

from __future__ import annotations

from dynascope.studies.protocol import EDITORIAL_REWORDING, Amendment, ClaimSpec, Protocol

__all__ = ["ARCHITECTURES", "P1_MIN_ACCURACY", "P2_MAX_ACCURACY", "P3_MAX_RATIO", "PROTOCOL",
           "TRAINED_MIN_ACCURACY"]  # fmt: skip

P1_MIN_ACCURACY = 0.30  # S7's proposal, frozen before the first fast run (session 1)
P2_MAX_ACCURACY = 0.20  # S7's proposal, frozen before the first fast run (session 1)
P3_MAX_RATIO = 0.5  # matched / vanilla NLL barrier: matching removes at least half (theory)
TRAINED_MIN_ACCURACY = 0.85  # precondition: both end points of every pair trained

# the gated MLPs of every preset (smoke, fast, paper): ``label_of`` of their configs
ARCHITECTURES = ("MLP 64-32-10", "MLP 64-1024-10", "MLP 64-512-512-10", "MLP 64-2048-2048-10")
_CITATION = "Benzing et al. (2022), arXiv 2209.07509"
_TRAINED = (
    f"both trained nets of every seed pair reach test accuracy >= {TRAINED_MIN_ACCURACY} "
    "(per pair, per net)"
)


def _claims(label: str) -> tuple[ClaimSpec, ...]:
    return (
        ClaimSpec(
            id=f"p1 ({label})",
            claim="the average of the two permuted random inits beats chance",
            statement="permuting one network's initialisation with the permutation that aligns "
            "the two trained networks makes the average of the two random initialisations "
            "perform above chance",
            citation=f"{_CITATION}, Sec. 3, Fig. 1",
            metric="per seed pair, test accuracy of ½(θ_0(0) + π θ_1(0)), π by activation "
            "matching of the trained nets",
            threshold=P1_MIN_ACCURACY,
            direction=">=",
            threshold_source="S7's proposal (chance 0.10), frozen in session 1 before the first "
            "fast run; no calibration seeds",
            preconditions=(_TRAINED,),
            control="a uniformly random permutation π instead of the matched one, the same "
            "trained pairs",
        ),
        ClaimSpec(
            id=f"p2 ({label})",
            claim="the unpermuted init average stays near chance",
            statement="the average of the two unpermuted random initialisations performs at chance",
            citation=f"{_CITATION}, Sec. 3, Fig. 1",
            metric="per seed pair, test accuracy of ½(θ_0(0) + θ_1(0))",
            threshold=P2_MAX_ACCURACY,
            direction="<=",
            threshold_source="S7's proposal (chance 0.10), frozen in session 1 before the first "
            "fast run; no calibration seeds",
            preconditions=(_TRAINED,),
            control="the inits averaged after the matched permutation (the misalignment "
            "removed), the same pairs",
        ),
        ClaimSpec(
            id=f"p3 ({label})",
            claim="matching removes most of the loss barrier between the trained nets",
            statement="after matching, the loss barrier along the linear path between the two "
            "trained networks is (close to) zero",
            citation=f"{_CITATION}, Sec. 3, Fig. 2",
            metric="per seed pair, NLL barrier activation-matched / vanilla",
            threshold=P3_MAX_RATIO,
            direction="<=",
            threshold_source="theory: 'matching removes at least half of the barrier' (the paper: "
            "≈ 0 for wide MLPs); fixed 2026-12-02 before seeds 0..2 of the contract version ran",
            preconditions=(_TRAINED, "the vanilla NLL barrier > 0 in every pair"),
            control="net 1 permuted uniformly at random instead of matched (the same ratio)",
        ),
    )


PROTOCOL = Protocol(
    study="permuted-initialisations",
    claims=tuple(c for label in ARCHITECTURES for c in _claims(label)),
    seeds={"smoke": 3, "fast": 5, "paper": 5},
    calibration_seeds=(10_000,),
    presets={
        "smoke": "width 32, 200 images, 2 updates, 3 pairs: plumbing, verdicts inconclusive",
        "fast": "S7's fast grid (MLP 64-1024-10 and 64-512-512-10, 130 updates, 5 seed pairs "
        "per architecture as one ensemble); 130 updates from S7's CPU budget, not outcomes",
        "paper": "S7's paper grid on digits (3,000 updates, widths 32-8192, CNNs, SGD)",
    },
    reproduces="fast (both end points reach >= 0.96 test accuracy at seeds 0 and 1000 with "
    "3 pairs; ~2-3 CPU minutes with 5 pairs)",
    registered="2026-12-07: seen before this version: the earlier contract's fast verdicts at "
    "base seeds 0 and 1000 with 3 pairs (all six held, every control not held; p1 of "
    "64-1024-10 had one pair at 0.19). Thresholds unchanged; pairs 3 -> 5 per architecture at "
    "fast; statuses now from 95 % intervals. Calibration seed 10000 was not run for this "
    "version.",
    amendments=(
        Amendment(
            date="2026-12-02",
            claims=("*",),
            change="p3 changed from an ordering (matched barrier <= vanilla and midpoint "
            "accuracy matched >= vanilla, threshold 0) to the ratio matched / vanilla NLL "
            "barrier <= 0.5; controls became random permutations; the 0.85 fit precondition "
            "was added (commit 680247e).",
            reason="under per-seed judging with a random-permutation control, a difference with "
            "threshold 0 makes the control (exchangeable with the unmatched pair) hold in "
            "about half of 3-seed draws; the paper states a barrier near 0 (notes page).",
            seen="the legacy runner's fast result at seed 0 (commit 9813641: 6 of 6 claims, "
            "barriers 0.34 -> 0.03 and 0.78 -> 0.04 nats, permuted-init average 0.40/0.41)",
        ),
        Amendment(
            date="2026-12-07",
            claims=("*",),
            change="fast: 3 -> 5 seed pairs per architecture; statuses from 95 % Student-t "
            "intervals instead of 'the mean passes and 2 of 3 seeds pass'.",
            reason="the evidence contract: >= 5 evaluation seeds and interval statuses for "
            "every study.",
            seen="the earlier contract's fast verdicts at seeds 0 and 1000 (all held)",
        ),
        EDITORIAL_REWORDING,
    ),
)
