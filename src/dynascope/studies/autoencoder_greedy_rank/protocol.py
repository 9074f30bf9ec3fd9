"""The protocol of ``autoencoder-greedy-rank`` (S15): what decides each verdict, fixed before
the evaluation seeds run, and the log of changes made after results were seen
(:mod:`dynascope.studies.protocol`; notes: docs/studies/autoencoder-greedy-rank.md).

Arms (per seed, ``study.build_runs``): L = 0; for L in {2, 4, 8} the ``greedy`` arm
(orthogonal, per-depth s from balanced-stack theory), the ``depth`` arm (s = 0.5) and the
``control`` arm (s = 1: the small-init spectral prior removed), all at the greedy arm's step;
a default-init L = 8 stack; at the greedy s and step, r3's ``quiet`` runs (L = 0 and L = 8 on
S15's data, noise std 0.01) and o's ``flat`` runs (L = 2, 4, 8 on data whose 5 signal
variances are all 3). Every arm a claim reads must have learnt all 5 data modes
(σ_i(M_A) > 0.5) by the end: that is the fit bar, per arm and per seed.

The amendments of 2026-12-07 made the changes proposed after the fast verdicts (r3 at noise
0.01, r1 at the end of training) and gave o and d controls that can fail; they are judged at
``full`` on seeds 0 and 1000 and on no other evaluation seed.
"""

from __future__ import annotations

from dynascope.studies.protocol import EDITORIAL_REWORDING, Amendment, ClaimSpec, Protocol

__all__ = ["PROTOCOL"]

_CITE = "Sun et al. 2021, arXiv 2107.01301, §3-4 and Fig. 1-2 (linear AEs on synthetic data)"
_FIT = (
    "every run of every arm the claim reads finished with all 5 data modes learnt "
    "(σ_i(M_A) > 0.5 at the last step), per seed"
)
_S1 = (
    "the same metric on the s = 1 orthogonal stacks at the same depths, step and budget "
    "(the small-init spectral prior removed)"
)

PROTOCOL = Protocol(
    study="autoencoder-greedy-rank",
    claims=(
        ClaimSpec(
            id="r1",
            claim="with L in {2, 4, 8} (orthogonal, small s from theory, equal-time step) the "
            "latent code reaches the true rank 5 and no more (the noise floor not learnt)",
            statement="linear AEs with an overparameterized linear stack settle at the true "
            "latent rank of synthetic data",
            citation=_CITE,
            metric="per seed, max over L of |held-out latent rank_1e-2 - 5| at the end of "
            "training (the last logged step), where S15 reads it",
            threshold=0.0,
            direction="<=",
            threshold_source="theory: the true rank is 5, so any gap fails (the old 'every "
            "seed' rule, as an interval: one seed off 0 makes the interval leave 0)",
            preconditions=(_FIT + " (greedy and s = 1 arms)",),
            control=_S1,
        ),
        ClaimSpec(
            id="r2",
            claim="with L in {2, 4, 8} (small s) the data modes are learnt one at a time",
            statement="the latent code is learnt greedily, one rank at a time",
            citation=_CITE,
            metric="per seed, max over L and k of σ_(k+1)(M_A) at t_k, t_k = first step with "
            "σ_k(M_A) > 0.5",
            threshold=0.25,
            direction="<=",
            threshold_source="theory, before any seed ran: without a plateau each mode relaxes "
            "as 1 - exp(-cλt), so the next mode is at 1 - 2^(-λ_(k+1)/λ_k) >= 0.293 for "
            "variances (5, 4, 3, 2, 1); 0.25 lies below",
            preconditions=(_FIT + " (greedy and s = 1 arms)",),
            control=_S1,
        ),
        ClaimSpec(
            id="o",
            claim="with L in {2, 4, 8} (small s) the data modes are learnt in order of variance",
            statement="largest-variance directions are learnt first",
            citation=_CITE,
            metric="per seed, min over L of the fraction of the 10 PC pairs (i < j) whose gains "
            "a_kᵀPa_k cross 0.5 in order (t_i < t_j)",
            threshold=0.8,
            direction=">=",
            threshold_source="calibration seed 10000 (commit 9047165): a random order gives "
            "0.5; 0.8 allows two adjacent swaps of close variances",
            preconditions=(_FIT + " (greedy, s = 1 and equal-variance arms)",),
            control="the same fraction on stacks at the same depths, s, step and budget whose "
            "data has every signal variance equal (3, the mean of 5..1): the cause of the "
            "order, the spread of variances, removed (PC k = column k of the mixing matrix)",
        ),
        ClaimSpec(
            id="r3",
            claim="without the linear stack (L = 0) the latent ends full rank",
            statement="without the stack the code is full rank (IRMAE's picture, from "
            "nonlinear AEs; S15 keeps it as a derived expectation)",
            citation="Jing, Zbontar & LeCun 2020, arXiv 2010.00679 (IRMAE) Fig. 3; S15 r3",
            metric="per seed, final held-out latent rank_1e-2 at L = 0 on S15's data "
            "(noise std 0.01: the data's own rank_1e-2 is 5, so a full-rank code must come "
            "from the model)",
            threshold=16.0,
            direction=">=",
            threshold_source="design: d_latent = 16 (full rank)",
            preconditions=(_FIT + " (L = 0 and the deepest greedy stack, noise std 0.01)",),
            control="the same final rank with the deepest greedy stack (L = 8, small s): the "
            "stack added back, same data (noise std 0.01), step and budget",
        ),
        ClaimSpec(
            id="r4",
            claim="L = 8 with default init learns the 5 data modes later than the orthogonal "
            "stack (small s, same step), or never, or diverges",
            statement="orthogonal init with a depth-aware step makes greedy learning reliable; "
            "the outcome depends on the stack's initial singular values",
            citation=_CITE,
            metric="per seed, t_5(default) - t_5(orthogonal greedy) at L = 8, steps (never or "
            "diverged: steps + 1)",
            threshold=1.0,
            direction=">=",
            threshold_source="design: one step later",
            preconditions=(
                "the L = 8 greedy and s = 1 orthogonal runs learnt all 5 data modes, per seed "
                "(the default-init arm needs no fit bar: never learning is part of the claim)",
            ),
            control="the same difference with the default-init stack replaced by an orthogonal "
            "stack at s = 1 (L = 8, same step and budget): another init, no spectral prior",
        ),
        ClaimSpec(
            id="d",
            claim="at one s (0.5) deeper stacks learn more greedily: the latent code passes "
            "through lower effective rank",
            statement="the outcome depends on the depth of the stack",
            citation=_CITE,
            metric="per seed, (e_0 - e_L) / (e_0 - 1) at the deepest L (8), e = min_(t >= 1) "
            "latent effective rank: the share of the way from L = 0's dip (0) to one mode at a "
            "time (effective rank 1, share 1) that the deepest stack goes",
            threshold=0.5,
            direction=">=",
            threshold_source="design: halfway between learning all modes together as L = 0 "
            "does (0) and one at a time (1)",
            preconditions=(
                "at least 3 depths (L = 0 included)",
                _FIT + " (L = 0, s = 0.5 and s = 1 arms)",
            ),
            control="the same at s = 1 for every depth (the small-init prior removed)",
        ),
    ),
    seeds={"smoke": 3, "fast": 5, "full": 15, "paper": 5},
    calibration_seeds=(10000, 20000),
    presets={
        "smoke": "N = 200, 1,000 steps, L in {0, 2}, 3 seeds: plumbing only (too few seeds, "
        "so every verdict is inconclusive)",
        "fast": "N = 2,000, 8k steps, L in {0, 2, 4, 8}, 5 seeds: 8k steps chosen on "
        "calibration seed 10000 (t_5 2.1k-4.2k; the noise floor rises ~5x later)",
        "full": "fast's design and arms, 9k steps, 15 seeds, 200 latent measurements: 9k = "
        "1.5x the slowest 5th-mode time of any arm with a fit bar on calibration seed 10000 "
        "(16k-step pass, 5 seeds: 5.5k at L = 8 s = 0.5; greedy 1.5k-4.1k, noise 0.01 "
        "2.1k-4.0k, equal variances 1.3k-2.1k, s = 1 < 100 steps), rounded up to 1k; 15 "
        "seeds for r4 (per-seed sd ~1k steps at calibration seed 10000 and at fast); "
        "328 s wall (316 s CPU) for 5 seeds x 16k steps at calibration seed 10000, so "
        "~9.5 min on one core by scaling (a second calibration at seed 20000 was queued "
        "and dropped: the shared CPU slots left no time for it)",
        "paper": "L in 0..16, 16k steps, 5 seeds (the nonlinear AE on load_digits not built)",
    },
    reproduces="full (expected from calibration seed 10000: r2, o, d held with "
    "their controls not held; r1 not held, the noise floor rising within ~1.5x of the 5th "
    "mode's time at noise 0.4; r3 not held, the L = 0 code at noise 0.01 ending at the data's "
    "rank 5; r4 uncertain, its mean ~0.5k-0.7k steps against a per-seed sd ~1k)",
    registered="2026-12-07: converted to the interval contract after the verdicts "
    "at seeds 0 and 1000 (3 seeds each, commit 9047165's design) had been seen: r1, r2, o, r3 "
    "held at both; r4 not held at 0, held at 1000; d held at 0, inconclusive at 1000. "
    "2026-12-07, later: the full preset and the amendments of that date registered after "
    "the fast verdicts at seeds 0 and 1000 (5 seeds) and calibration seed 10000 at a "
    "16k-step draft of full had been seen, before any full run at seeds 0 or 1000",
    amendments=(
        Amendment(
            date="2026-12-02",
            claims=("r1", "r2", "r3", "r4", "d"),
            change="judged spectral prior s = 1 -> 0.5 (s = 1 became the control), fast 5k -> "
            "10k steps, learnt modes counted as σ_i(AᵀPA) > 0.5 on the data subspace, claims "
            "restated per seed (commit 90de6dc)",
            reason="the 2026-12-02 audit: at s = 1 and init the learned-mode count was 4-5, so "
            "init could fake it; at 5k steps one L = 8 s = 0.5 seed sat on a plateau",
            seen="seed 0 fast verdicts of the first version (commit 3219c4d): r1, r2, r3, d "
            "not held, r4 held",
        ),
        Amendment(
            date="2026-12-02",
            claims=("r3", "r1"),
            change="data noise std 0.01 -> 0.4 (held-out data rank_1e-2 5 -> 32) (commit 9047165)",
            reason="at noise 0.01 the latent rank is 5 at step 0, so r1 could not fail and r3 "
            "could not hold; with the noise floor r3 follows from the data",
            seen="seeds 0 and 1000 (commits 085862a, 0eae760): r1 held (5, 5, 5), r3 "
            "inconclusive (data rank 5 < 16)",
        ),
        Amendment(
            date="2026-12-02",
            claims=("r1", "r2", "o", "d"),
            change="r1 reads the latent rank at t_5 instead of the final rank; r2 reads "
            "σ_(k+1)(M_A) at t_k on per-depth s from theory with an equal-time step instead "
            "of the diagonal gains at s = 0.5; new claim o (order of variance); d on the "
            "s = 0.5 arm; fast 8k steps (commit 9047165)",
            reason="r2's overlap at s = 0.5 was 0.38-0.56 at L = 2 (modes learnt within a "
            "few steps); diagonal gains mix modes while a direction rotates; final ranks "
            "5-8 on calibration seed 10000 as the noise floor rises",
            seen="seeds 0 and 1000: r2 not held (0.436, 0.476, 0.555 and 0.271, 0.611, "
            "0.669); calibration seed 10000 first pass",
        ),
        Amendment(
            date="2026-12-07",
            claims=("r1", "r2", "o", "r3", "r4", "d"),
            change="interval statuses over 5 seeds per arm at fast (3 before); fit "
            "preconditions on every arm read; r4's control L = 0 (t_5 difference ≡ 0) -> the "
            "L = 8 s = 1 orthogonal stack; o's control (the same runs against a random PC "
            "order, a null of the metric rather than an experiment) -> the s = 1 stacks; the "
            "L = 0 default-init run (read only by the old r4 control) dropped",
            reason="controls must be ablations that could hold; rates and means "
            "judged by intervals",
            seen="fast verdicts at seeds 0 and 1000 of commit 9047165 (registered above)",
        ),
        EDITORIAL_REWORDING,
        Amendment(
            date="2026-12-07",
            claims=("r1",),
            change="r1 reads the latent rank_1e-2 at the end of training (the last logged "
            "step) instead of at t_5 (the first step with 5 learnt modes)",
            reason="S15 reads the final rank: a code that settles at the true rank must still "
            "be there when training stops (proposed in this protocol's notes after the fast "
            "verdicts); the step budget comes from the fit bars, not from r1",
            seen="fast verdicts at seeds 0 and 1000: r1 held at both (0 at t_5, controls 2.4 "
            "and 2.2), with final ranks 6-7 at 8k steps in the detail; calibration seed "
            "10000 at 16k steps (final ranks 5-6 at 6k, 10-11 at 16k)",
        ),
        Amendment(
            date="2026-12-07",
            claims=("r3",),
            change="r3 reads new runs (arm quiet) on S15's data, noise std 0.01: L = 0 and, "
            "for the control, the deepest greedy stack, at the greedy s and step (added to "
            "every preset); the precondition 'held-out data rank_1e-2 >= 16' dropped (at "
            "noise 0.01 the data's rank is 5, so a full-rank code would have to come from "
            "the model: that is what r3 tests)",
            reason="at noise 0.4 r3 followed from the data (rank 32) whatever the model; S15 "
            "states r3 at noise 0.01 and keeps it as a derived expectation",
            seen="fast verdicts at seeds 0 and 1000: r3 held at both at noise 0.4 (16; "
            "controls 6.2 and 7.0); calibration seed 10000: L = 0 at noise 0.01 ends at 5",
        ),
        Amendment(
            date="2026-12-07",
            claims=("o",),
            change="o's control: the s = 1 stacks -> stacks at the same depths, s and step on "
            "data whose 5 signal variances all equal 3 (arm flat, added to every preset); "
            "the fit bar extends to those runs",
            reason="order of variance is the claim, so the ablation removes the spread of "
            "variances; s = 1 keeps it, and GD then also learns larger variances first (a "
            "control that cannot fail)",
            seen="fast verdicts at seeds 0 and 1000: o inconclusive at both (0.98 and 0.92; "
            "the s = 1 control held at 0.90 [0.81, 0.99] and was inconclusive at 0.84); "
            "calibration seed 10000: equal variances 0.42 [0.09, 0.75]",
        ),
        Amendment(
            date="2026-12-07",
            claims=("d",),
            change="d's metric: max over consecutive depths of the rise in min_t latent "
            "effective rank (<= 0) -> (e_0 - e_8) / (e_0 - 1) at the deepest stack (>= 0.5), "
            "the share of the way from L = 0's dip to one mode at a time; a first "
            "replacement, the fraction of depth pairs in order (>= 0.8), was dropped on "
            "calibration seed 10000 before any evaluation seed ran",
            reason="no depth effect gives a rise of ~0, on the old threshold, so the s = 1 "
            "control could never read not held; the pair order is met by s = 1 too (0.87 "
            "[0.69, 1.04] at calibration seed 10000: deeper s = 1 stacks dip slightly lower, "
            "3.3-4.1 against 4.3-4.8 at L = 0), while 'more greedily' is about how far the "
            "dip goes toward one mode at a time (s = 0.5: L = 8 reaches 1.00; s = 1: 0.25 of "
            "the way)",
            seen="fast verdicts at seeds 0 and 1000: d inconclusive at both (-0.24 [-0.52, "
            "0.036], -0.26 [-0.51, -0.001]; controls -0.09 and 0.001, inconclusive); "
            "calibration seed 10000: new metric 0.999 [0.999, 1.000], control 0.25 "
            "[0.13, 0.37]",
        ),
        Amendment(
            date="2026-12-07",
            claims=("*",),
            change="full preset added: fast's arms plus the quiet and flat runs, 9k steps, "
            "15 seeds per arm (sizes: presets['full'])",
            reason="the evidence tier: every claim judged on 15 seeds with its fit bars met",
            seen="fast verdicts at seeds 0 and 1000; calibration seed 10000 at a 16k-step "
            "draft of full (no full run at seeds 0 or 1000 before this entry)",
        ),
    ),
)
