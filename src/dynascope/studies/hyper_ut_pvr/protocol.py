"""The protocol of ``hyper-ut-pvr`` (S8): what decides each verdict, fixed before the evaluation
seeds of this contract ran (``dynascope.studies.protocol``).

Controls are ablations at the same budget and judged with the same statistic:

- u1 (UT-ACT ponders longer on more hops): UT-ACT trained on labels shuffled across the
  training set (``ut_act_shuffled_s{k}``): the same inputs, hop tokens and steps, but no label
  asks for h hops, so the cause of pondering longer is removed. It could hold if ponder
  tracked the hop token whatever the labels.
- u2 (the ACT models fit every trained hop count): the fixed-depth 2-layer baseline
  (``fixed_s{k}``, the baseline architecture, no adaptive depth), the same worst trained-h
  accuracy. It replaces the untrained models (accuracy ≡ 0: a control that could not hold).
- u3 (Hyper-UT generalises to the untrained h better than UT-ACT): the same standardised gap
  at the largest trained h, where an advantage in generalisation beyond the trained hops cannot
  show; it can hold if Hyper-UT simply fits better.

No ``full`` preset: ``fast`` cannot meet the fit preconditions, and neither can 20 minutes on
one core. Calibration seed 20000 (2026-12-07): UT-ACT's worst trained-h accuracy was 0.83 after
5000 steps (118.7 CPU-s), and 5 seeds of the four arms cost ~0.81 CPU-s per step, so 20 minutes
buy ~1,500 steps (worst trained h <= 0.65 there). ``paper`` (GPU) carries u1-u3; numbers in
docs/studies/hyper-ut-pvr.md.
"""

from __future__ import annotations

from dynascope.studies.protocol import EDITORIAL_REWORDING, Amendment, ClaimSpec, Protocol

__all__ = ["FIT_ACCURACY", "PROTOCOL", "U1_RHO", "U3_Z"]

U1_RHO = 0.8  # S8's proposal, frozen before the first run
FIT_ACCURACY = 0.9  # S8's proposal (u2's threshold and the fit precondition of u1 and u3)
U3_Z = 3.0  # u3: the gap must exceed three binomial standard errors of the difference

_CITATION = "Abnar et al. (2023), arXiv 2310.08866"
_UT_FIT = f"UT-ACT fits the trained hops: worst trained-h accuracy >= {FIT_ACCURACY} in every seed"

PROTOCOL = Protocol(
    study="hyper-ut-pvr",
    claims=(
        ClaimSpec(
            id="u1",
            claim="UT-ACT ponders longer on more hops",
            statement="adaptive-depth models use more computation (layers) on inputs that need "
            "more steps of reasoning",
            citation=f"{_CITATION}, Sec. 4 (hop / pointer-value retrieval)",
            metric="per seed, Spearman ρ(h, UT-ACT's mean n + rem at the readout) over the "
            "evaluated h",
            threshold=U1_RHO,
            direction=">=",
            threshold_source="S8's proposal, frozen before any run; no calibration",
            preconditions=(_UT_FIT, "the shuffled-label UT-ACT finished"),
            control="UT-ACT trained on labels shuffled across the training set (same inputs, "
            "hop tokens and steps), the same ρ",
        ),
        ClaimSpec(
            id="u2",
            claim="UT-ACT and Hyper-UT fit every trained hop count",
            statement="UT-ACT and Hyper-UT learn the task at the complexities they are trained on",
            citation=f"{_CITATION}, Sec. 4",
            metric="per seed, min accuracy over the trained h and both ACT models",
            threshold=FIT_ACCURACY,
            direction=">=",
            threshold_source="S8's proposal, frozen before any run; no calibration",
            preconditions=("every ACT run and the fixed-depth baseline finished",),
            control="the fixed-depth 2-layer transformer (no adaptive depth), same data and "
            "steps, the same worst trained-h accuracy",
        ),
        ClaimSpec(
            id="u3",
            claim="Hyper-UT generalises to the untrained, largest h better than UT-ACT",
            statement="Hyper-UT generalises to higher task complexity than trained on better "
            "than UT-ACT",
            citation=f"{_CITATION}, Sec. 4, Fig. 3",
            metric="per seed, (acc(Hyper-UT, h_max) − acc(UT-ACT, h_max)) / SE, h_max the "
            "largest evaluated (untrained) h, SE = sqrt(2·¼ / eval_size) the binomial "
            "standard error of a difference of two accuracies at p = ½",
            threshold=U3_Z,
            direction=">=",
            threshold_source="theory: three standard errors of the difference (fixed before any "
            "seed of the contract version ran)",
            preconditions=(
                f"UT-ACT and Hyper-UT fit the trained hops: worst trained-h accuracy >= "
                f"{FIT_ACCURACY} per arm, in every seed",
            ),
            control="the same standardised gap at the largest trained h",
        ),
    ),
    seeds={"smoke": 3, "fast": 5, "paper": 5},
    calibration_seeds=(10_000, 20_000),
    presets={
        "smoke": "L = 4, h 1-2 (eval 1-3), d_model 16, 20 steps, 3 seeds: plumbing only",
        "fast": "L = 5, train h 1-3, eval h 1-4, S8's sizes, 300 steps, 5 seeds, 1000 eval "
        "examples per h; steps from the measured CPU step time within ~180 CPU-s, not from "
        "outcomes. The ACT models do not fit at this budget: a demo whose preconditions fail",
        "paper": "S8's proposal on GPU: L = 10, train h <= 4, eval h <= 5, d_model 256, T = 12, "
        "50k steps, 5 seeds; plus vector PVR, digits and visual PVR (reported)",
    },
    reproduces="paper (GPU): calibration seed 10000 at 3k steps fit the trained hops with "
    "Hyper-UT and not UT-ACT (h = 3: 0.73), and seed 20000 at 5k steps not either (h = 3: "
    "0.83); CPU: none (fast's fit preconditions fail; a full that fits would cost > 68 min on "
    "one core)",
    registered="2026-12-07: seen before this version: the earlier contract's fast verdicts at "
    "base seeds 0 and 1000 with 3 seeds and 500 steps (u1 inconclusive, u2 not held at "
    "0.42-0.46, u3 inconclusive; controls not held), and calibration seed 10000 at 3k steps. "
    "Controls of u1 and u2 replaced by ablations, u3's gap expressed in standard errors "
    "(equivalent to δ = 3·SE), fit preconditions per seed and per arm.",
    amendments=(
        Amendment(
            date="2026-12-02",
            claims=("u1", "u2", "u3"),
            change="task and claims redesigned (commit 273c99f): hop-PVR with L = 5, "
            "train h 1-3, eval h 1-4, tensor2tensor embedding scale; u3's threshold from "
            "'gap >= 0' to three binomial standard errors; fit preconditions on u1 and u3; "
            "claim texts rewritten (commit 80aab11).",
            reason="at the audit's single seed the gap was 0.016 with a standard error of about "
            "0.02 (a tie passes 'gap >= 0'); the ACT models halted after one step at the old "
            "CPU scale (notes page).",
            seen="the legacy study's fast result at seed 0 (commit 6e0664d: 1 of 3 claims, both "
            "ACT models halt after one step)",
        ),
        Amendment(
            date="2026-12-07",
            claims=("u1", "u2", "u3"),
            change="fast: 3 -> 5 seeds and 500 -> 300 steps (the shuffled-label UT-ACT arm "
            "added for u1's control; the budget kept at ~180 CPU-s); controls of u1 and u2 "
            "from untrained models to ablations; u3's metric from the gap (threshold δ = "
            "3·SE) to the gap in SE units (threshold 3), the same verdict at every eval size; "
            "the fit precondition per seed (was: 2/3 of the seeds); statuses from 95 % "
            "intervals.",
            reason="the evidence contract: >= 5 seeds, controls that can fail, fit "
            "preconditions on every arm per seed. The step cut keeps fast within budget; at "
            "500 steps the fit preconditions already failed (u2 0.42-0.46 against 0.9), so no "
            "status could flip to held.",
            seen="the earlier contract's fast verdicts at seeds 0 and 1000",
        ),
        EDITORIAL_REWORDING,
        Amendment(
            date="2026-12-07",
            claims=("u1", "u2", "u3"),
            change="calibration seeds: base 20000 recorded next to 10000; reproduces: the 5k-step "
            "UT-ACT curve and the cost of a full preset added. No claim, metric, threshold or "
            "preset changed.",
            reason="a full preset was sized on calibration seed 20000 (notes page) and found not "
            "to fit 20 min on one core.",
            seen="the fast verdicts at seeds 0 and 1000 (see registered); no full run at "
            "evaluation seeds",
        ),
    ),
)
