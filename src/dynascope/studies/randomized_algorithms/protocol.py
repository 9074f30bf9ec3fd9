"""The protocol of ``randomized-algorithms`` (SYSTEMS.md S2): what decides claims i-iii, fixed
before the evaluation seeds of this version ran, and the amendment log.

The analysis judges each claim through its spec (``PROTOCOL.claim("ii").judge(...)``); the
threshold, direction and statistic live only here (``shared/DESIGN.md``, Protocol). The
"recall learned" bar is :func:`~dynascope.studies.randomized_algorithms.analysis.
recall_loss_max`, ``(1 − k/(2N))·b·ln 2`` (theory: the task's capacity arithmetic).

Arms (recall, one ensemble each): ``erm_random`` A^E_R (q = 1, fresh seeds), ``lq_random``
A^q_R (q = ``q_large``, m fresh seeds per step), ``lq_fixed`` A^q_r0 (q = ``q_large``, one
fixed seed), and the ablation ``lq_m1`` A^q_R with m = 1: q = ``q_large`` and fresh seeds,
but one seed per step, so the per-input loss is not averaged over seeds and the Lq objective
gives randomizing no advantage (the paper's Fig. 3C m sweep starts at m = 1).

``full`` (2026-12-07) is ``fast``'s task and arms at 4000 steps, sized on calibration seeds so
that every run fits (amendment log).
"""

from __future__ import annotations

from dynascope.studies.protocol import Amendment, ClaimSpec, Protocol

__all__ = ["I_ERM_VARIANCE_MAX", "I_LQ_VARIANCE_MIN", "I_RATIO_MIN", "PROTOCOL"]

I_ERM_VARIANCE_MAX = 1e-3  # reported in i's detail (S2 also asks V(A^E_R) <= 1e-3)
I_LQ_VARIANCE_MIN = 1e-3  # i's floor in the ratio; the "seed is used" bar of ii and iii
I_RATIO_MIN = 10.0  # i: V(A^q_R) >= 10 V(A^E_R)

_CITATION = (
    "von Oswald, Kobayashi, Akram, Steger, 'Learning Randomized Algorithms with Transformers', "
    "ICLR 2025, arXiv 2408.10818"
)
_LEARNED = (
    "recall learned: every run of every arm the claim and its control read has final training "
    "loss (seed-averaged, nats) <= (1 − k/(2N))·b·ln 2, per run"
)
_USED = f"the seed is used: V(A^q_R) >= {I_LQ_VARIANCE_MIN:g} on every seed"

_I = ClaimSpec(
    id="i",
    claim="q = 1 ignores the seed (V ≈ 0); large q uses it (V > 0)",
    statement="expected-loss training (q = 1) collapses to a deterministic model (zero "
    "predictive variance across seeds); above q ≈ 16 the model's output depends on the seed",
    citation=_CITATION + ", Fig. 2 (predictive variance vs q); SYSTEMS.md S2",
    metric=f"per seed, V(A^q_R) / max({I_LQ_VARIANCE_MIN:g}, {I_RATIO_MIN:g}·V(A^E_R)), V = "
    "mean over inputs and bits of Var over 30 eval seeds of σ(logit)",
    threshold=1.0,
    direction=">=",
    threshold_source="theory: SYSTEMS.md S2's proposal V(A^q_R) >= max(1e-3, 10·V(A^E_R)), "
    "frozen before the first fast run",
    preconditions=(_LEARNED + " (A^E_R, A^q_R, A^q_R m = 1)",),
    control="seed averaging removed: A^q_R trained with m = 1 (one seed per step, same q, "
    "steps and batch) in A^q_R's place, V(A^q_R m=1) / max(1e-3, 10·V(A^E_R))",
)
_II = ClaimSpec(
    id="ii",
    claim="the randomized Lq model's worst case beats the deterministic Lq model's",
    statement="at N = 20 the deterministic model's worst-case success goes to 0 while A^q_R "
    "solves every input with non-zero probability",
    citation=_CITATION + ", Task A results (the '95th percentile' worst case); SYSTEMS.md S2",
    metric="per seed, p5 over held-out inputs of per-input success (30 eval seeds): "
    "p5(A^q_R) − p5(A^q_r0)",
    threshold=0.05,
    direction=">=",
    threshold_source="theory: SYSTEMS.md S2's proposal, frozen before the first fast run",
    preconditions=(_LEARNED + " (A^q_R, A^q_r0, A^q_R m = 1)", _USED),
    control="seed averaging removed: A^q_R with m = 1 in A^q_R's place, p5(A^q_R m=1) − "
    "p5(A^q_r0), same budget (it holds if the m = 1 model randomizes anyway)",
)
_III = ClaimSpec(
    id="iii",
    claim="a majority vote over seeds beats a single seed (A^q_R)",
    statement="a majority vote over seeds of A^q_R gets virtually every input right",
    citation=_CITATION + ", Task A results (A^q_R-majority); SYSTEMS.md S2",
    metric="per seed, A^q_R's mean majority-vote success (30 eval seeds, plurality over the "
    "2^b answers) − its mean single-seed success",
    threshold=0.05,
    direction=">=",
    threshold_source="theory: SYSTEMS.md S2's proposal, frozen before the first fast run",
    preconditions=(_LEARNED + " (A^q_R, A^E_R)", _USED),
    control="large q removed: the same vote gain of A^E_R (q = 1, random seeds, same budget; "
    "it holds if expected-loss training also randomizes)",
)

PROTOCOL = Protocol(
    study="randomized-algorithms",
    claims=(_I, _II, _III),
    seeds={"smoke": 3, "fast": 5, "full": 5, "paper": 5},
    calibration_seeds=(10_000, 10_001, 10_002, 20_000, 30_000),
    presets={
        "smoke": "recall N 6, d_head 2, m 4, 50 steps, 3 replicates: plumbing only, "
        "inconclusive (fewer than 5 seeds)",
        "fast": "recall N 8, d_head 4, m 8, batch 64, 1500 steps (150 warm-up), q 32; arms "
        "A^E_R, A^q_R, A^q_r0 and the ablation A^q_R m = 1 × 5 replicates (one ensemble per "
        "arm; 3 replicates and no m = 1 arm until 2026-12-07). Sizes chosen on calibration "
        "seeds 10000-10002 (A^q_R train loss 1.99 / 1.21 / 1.22 against the 2.599-nat bound)",
        "full": "fast's task, arms and 5 replicates (recall N 8, d_head 4, m 8, batch 64, q 32) "
        "at 4000 steps (400 warm-up, cosine to 0.1), the step count at which every "
        "calibration run ends below the 2.599-nat bound (at fast's 1500 steps 4 and 2 runs of "
        "the evaluation seed sets 0 and 1000 did not: worst 3.00 and 2.86, A^q_r0 and A^q_R "
        "m = 1 runs on plateaus). 3000 steps: base seed 10000 (run seeds 10000-10004, all "
        "four arms; 637 s wall, 612 CPU s on one core) all fit, worst 1.468 (A^E_R; A^q_R "
        "1.131, A^q_r0 1.230, A^q_R m = 1 1.197), but at base seed 20000 one of five A^q_R "
        "m = 1 runs stayed on its plateau at 2.789 (A^q_r0 worst 1.208). 4000 steps: that "
        "run ends at 2.372 (the worst calibration run), the other four at <= 1.171; base "
        "seed 30000 (A^q_r0 and A^q_R m = 1) worst 1.004. Cost ~850 s of one core (the "
        "seed-10000 run's per-arm seconds x 4/3)",
        "paper": "N 20, d_head 5, m 30, q 100, batch 512, 10k steps, 5 replicates, the four "
        "paper arms plus A^q_R m = 1; sweeps, C_10 colouring, grid world (GPU)",
    },
    reproduces="paper (GPU; never run); at full every arm fits (worst 1.29 and 1.25 against "
    "2.599), i reads not held at seeds 0 and 1000, ii and iii inconclusive on 'the seed is "
    "used' (smallest V 5.7e-7 and 4.7e-6 against 1e-3)",
    registered="2026-12-07: fixed after the earlier contract's fast verdicts at seeds 0 and "
    "1000 were seen (i, ii, iii inconclusive at both: recall-learned failed on one run each, "
    "2.923 and 2.747 against 2.599; i per seed 0.19-0.64, ii 0 but one 0.033, iii 0.057-0.123 "
    "with A^E_R's gain 0.009). This version: 5 replicates, an m = 1 ablation arm for the "
    "controls of i and ii, the fit bar per claim on every arm it and its control read",
    amendments=(
        Amendment(
            date="2026-12-02",
            claims=("i", "ii", "iii"),
            change="claim i's test 'V(A^E_R) <= 1e-3 and V(A^q_R) >= max(1e-3, 10 V(A^E_R))' "
            "became the ratio alone (V(A^E_R) <= 1e-3 moved to the detail); per-seed "
            "judging over 3 replicates (was 1 run per arm); preconditions 'recall learned' "
            "(A^E_R only) and 'the seed is used'; controls added (commit b673584)",
            reason="the fit audit: iii passed on noise (V 1.6e-3) while recall was not learned",
            seen="fast at base seed 0 with one run per arm (2026-12-01); the fit audit "
            "(A^q_R train loss 2.98)",
        ),
        Amendment(
            date="2026-12-02",
            claims=("i", "ii", "iii"),
            change="'recall learned' covers every main model (A^E_R, A^q_R, A^q_r0), not "
            "A^E_R alone (commit c1c7bd5)",
            reason="the Lq model is the one the claims are about; a bar on A^E_R alone let "
            "an unfit A^q_R through",
            seen="fast replicate 0 at base seed 0: A^E_R 1.55, A^q_R 2.98, A^q_r0 2.52 "
            "against the 2.888 bound",
        ),
        Amendment(
            date="2026-12-02",
            claims=("i", "ii", "iii"),
            change="fast: recall N 12 -> 8, batch 128 -> 64, 2000 -> 1500 steps (warm-up "
            "200 -> 150), the C_8 colouring arm out of fast (opt-in); the bound follows "
            "(2.888 -> 2.599 nats) (commit 9b6aefa)",
            reason="the fit audit: A^q_R did not leave recall chance at N = 12; sizes chosen on "
            "calibration seeds 10000-10002",
            seen="fast replicate 0 at base seed 0 at N = 12 (A^q_R 2.98, inconclusive)",
        ),
        Amendment(
            date="2026-12-02",
            claims=("*",),
            change="run seeds base + k (were 100·base + k: the earlier --seed 1000 run "
            "trained seeds 100000-100002) (commit 6440cb8)",
            reason="--seed 100 trained the calibration seeds 10000-10002 (stated in 6440cb8)",
            seen="fast at base seeds 0 and 1000 (7294daf): every claim inconclusive",
        ),
        Amendment(
            date="2026-12-07",
            claims=("i", "ii", "iii"),
            change="5 replicates at fast (were 3); statuses from a 95 % Student-t interval; "
            "controls of i (roles swapped) and ii (A^E_R in A^q_R's place, ≡ 0 at fast) "
            "replaced by the m = 1 ablation arm; 'recall learned' per claim on every arm "
            "the claim and its control read, per run",
            reason="ii's control could not hold (p5 = 0 for every model at fast); "
            "intervals need >= 5 seeds",
            seen="fast at base seeds 0 and 1000 (inconclusive, see registered)",
        ),
        Amendment(
            date="2026-12-07",
            claims=("*",),
            change="editorial: the amendment log, registered text and threshold sources name "
            "the audits by date ('the fit audit', 'the 2026-12-02 audit') instead of internal "
            "tracker numbers, and the file was reformatted; no statement, statistic, threshold, "
            "step count, seed count, precondition or control changed",
            reason="user-facing text carries no internal issue numbers; the wording change moves "
            "the protocol's sha256, so it is logged here",
            seen="every fast verdict at seeds 0 and 1000 (docs/studies.md, "
            "docs/studies-seed1000.md), unchanged by this entry",
        ),
        Amendment(
            date="2026-12-07",
            claims=("*",),
            change="new preset full: fast's task, arms and 5 replicates at 4000 steps (400 "
            "warm-up; sizes in presets['full']); no statement, metric, statistic, threshold, "
            "precondition or control changed",
            reason="the 'recall learned' precondition failed at fast (4 and 2 runs of the "
            "seed sets 0 and 1000 above the bound); 4000 steps were chosen on calibration "
            "base seeds 10000, 20000 and 30000 as the step count at which every calibration "
            "run fits (3000 left one A^q_R m = 1 run at 2.79), within ~15 minutes of one core",
            seen="fast verdicts at seeds 0 and 1000 (i inconclusive / not held 0.37 [0.17, "
            "0.58]; ii inconclusive at both, worst fit 3.00 / 2.86 against 2.599; iii held "
            "0.081 [0.058, 0.104] / inconclusive 0.079 [0.023, 0.134]); the calibration runs "
            "at base seeds 10000, 20000 and 30000 (presets['full'], reproduces)",
        ),
        Amendment(
            date="2026-12-08",
            claims=("*",),
            change="logged explicitly: full's step count went 3000 -> 4000 during its "
            "calibration, before seeds 0 and 1000 ran at full; and reproduces: from what full "
            "was expected to read to what it read. No size, seed, statement, metric, "
            "threshold, precondition or control changed.",
            reason="every change to a step count is logged with what had been seen; "
            "reproduces states which preset reproduces the finding.",
            seen="at the 3000 -> 4000 change: fast at seeds 0 and 1000 and the calibration "
            "runs (base 10000, 20000, 30000); at the reproduces change: the full verdicts at "
            "seeds 0 and 1000 (i not held at both; ii, iii inconclusive at both)",
        ),
    ),
)
