"""The protocol of ``modular-teacher-student`` (SYSTEMS.md S5): what decides claims s1 and s2,
fixed before the evaluation seeds of this version ran, and the amendment log.

The analysis judges each claim through its spec (``PROTOCOL.claim("s1").judge(...)``); the
threshold, direction and statistic live only here (``shared/DESIGN.md``, Protocol).

Proposed amendment (not made; it would change what a verdict reads and must be re-tested on
fresh seeds first): a monolithic-student ablation (the same Doomed − Blessed comparison with the
modular hypernetwork student replaced by the monolithic MLP) as a second control; it needs two
more ensembles and does not fit ``fast`` or ``full``.
"""

from __future__ import annotations

from dynascope.studies.protocol import Amendment, ClaimSpec, Protocol

__all__ = ["FIT_MAX", "PROTOCOL"]

FIT_MAX = 0.05  # every Blessed and Doomed run: relative loss on its training tasks, per run

_CITATION = (
    "Schug et al., 'Discovering modular solutions that generalize compositionally', ICLR 2024, "
    "arXiv 2312.15001, theory teacher-student (identification under connected support, "
    "Fig. 2C; reference run_theory.py); SYSTEMS.md S5"
)
_PRE = (
    f"every Blessed and Doomed run finished and fits its training tasks: relative loss on "
    f"'fit' tasks <= {FIT_MAX} with the evaluation inner loop, per run and per seed",
)

_S1 = ClaimSpec(
    id="s1",
    claim="a student trained under connected support (Blessed) generalises to tasks that "
    "combine modules of both components of the Doomed support; under disconnected support "
    "(Doomed) it does not",
    statement="a modular student identifies the teacher's modules and generalises to unseen "
    "module combinations when the training tasks have connected support, and not when the "
    "support is disconnected",
    citation=_CITATION,
    metric="per seed, relative loss Σ‖ŷ−y‖²/Σ‖y‖² on cross-component tasks, Doomed − Blessed "
    "(same seed: teacher, student init, evaluation tasks)",
    threshold=0.05,
    direction=">=",
    threshold_source="theory: the precondition's fit tolerance (a student that generalises "
    "misses cross tasks by no more than its training tasks), fixed before the first 3-seed "
    "run (2026-12-02, 69249ed)",
    preconditions=_PRE,
    control="the cross-component combination removed: the same Doomed − Blessed difference on "
    "within-component tasks, which both supports span (same runs, budget and statistic; it "
    "holds if Doomed simply fits worse)",
)

_S2 = ClaimSpec(
    id="s2",
    claim="the teacher's codes decode linearly from the student's inferred codes on "
    "cross-component tasks under connected support, clearly better than under disconnected "
    "support",
    statement="under connected support the student's inferred codes are a linear map of the "
    "teacher's (module identification up to a linear transformation)",
    citation=_CITATION,
    metric="per seed, ridge R² (map fit on training tasks, mean over teacher coordinates) on "
    "cross-component tasks, Blessed − Doomed",
    threshold=0.15,
    direction=">=",
    threshold_source="theory: SYSTEMS.md S5's proposed gap 0.15, frozen before the first fast "
    "run (2026-12-01)",
    preconditions=_PRE,
    control="the cross-component combination removed: the same Blessed − Doomed R² "
    "difference on within-component tasks (same runs, budget and statistic)",
)

PROTOCOL = Protocol(
    study="modular-teacher-student",
    claims=(_S1, _S2),
    seeds={"smoke": 3, "fast": 5, "full": 5, "paper": 5},
    calibration_seeds=(10000,),
    presets={
        "smoke": "n_hidden 8, 20 outer × 5 inner steps, 3 seeds: plumbing only, verdicts "
        "inconclusive (fewer than 5 seeds)",
        "fast": "reference sizes, 750 outer steps (fixed from the measured cost of a K = 6 "
        "ensemble step before any verdict was read), training inner loop 50 × 2e-2, "
        "evaluation inner loop 200 × 2e-2; 5 seeds × {Blessed, Doomed} as one K = 10 "
        "ensemble (3 seeds until 2026-12-07). A demo: the fit bar needs ~2k-6k outer steps",
        "full": "fast's sizes (inner loops 50 × 2e-2 training, 200 × 2e-2 evaluation; 64 "
        "support, 64 query inputs) with meta-batch 8 (fast: 32) and 6,000 outer steps (cosine "
        "over them); 5 seeds × {Blessed, Doomed} as one K = 10 ensemble. Sized on calibration "
        "base seed 10000 (runs 10000-10004) for the fit precondition: meta-batch 16 × 3,000 "
        "steps left 2 of 10 runs above it (worst fit 0.069; 914 s wall, 819 CPU s with three "
        "evaluations); meta-batch 8 × 6,000 steps fit 9 of 10 runs (0.011-0.024) and one "
        "Blessed run (seed 10001) missed it (0.058: its training loss rose from 0.049 at step "
        "3,300 to 0.14, not diagnosed; 962 s wall, 902 CPU s with two evaluations). Meta-batch 8 "
        "because the training "
        "curve per outer step was the same at 16 as at 32 (relative loss 0.16-0.20 at step 500 "
        "against 0.18 at fast): outer steps, not tasks per step (12 distinct training tasks), "
        "limit the fit, and a step at 8 costs ~0.15 s against ~0.24 s at 16 (K = 10, one thread)",
        "paper": "the reference configuration (GPU): 60k outer steps, inner 300 × 3e-3, every "
        "task set × 5 seeds (the reference has 3), sweep, monolithic baseline, hyperteacher "
        "table",
    },
    reproduces="none on CPU: full (~15 min on one core) read s1 and s2 not held at seed 0 "
    "with every run fit, and inconclusive at seed 1000, where 6 of 10 runs lost their fit "
    "late in training (worst relative loss 0.20); fast cannot meet the fit precondition "
    "(relative loss 0.22-0.32 at 750 outer steps against 0.05); paper (GPU; never run)",
    registered="2026-12-07: fixed after the earlier contract's fast verdicts at seeds 0 and "
    "1000 were seen (s1 and s2 inconclusive at both: worst fit 0.280 / 0.224 > 0.05; s1 per "
    "seed 0.0025, 0.0015, 0.0097 and −0.0166, 0.0009, −0.0024; s2 0.0010, 0.0017, 0.0035 and "
    "−0.0326, 0.0084, 0.0034; controls not held). This version: 5 seeds per arm at fast and "
    "paper. Calibration seeds: base 10000 sized full (amendment of 2026-12-07)",
    amendments=(
        Amendment(
            date="2026-12-02",
            claims=("s1", "s2"),
            change="s1's metric from module alignment (align_B >= 0.9 and align_B − align_D "
            ">= 0.15) to the cross-component relative loss, Doomed − Blessed >= 0.05; s2's R² "
            "from the mean over eval keys h = 2..6 to cross-component tasks (R²_B >= 0.9 "
            "dropped); the guard (training-loss ratio <= 2, 'undertrained') became the fit "
            "precondition (relative loss <= 0.05 per run); within-component controls added; "
            "1 -> 3 seeds; fast 2,000 -> 750 outer steps (commit 69249ed)",
            reason="the fit audit: per-unit alignment cannot separate the supports by "
            "construction (a student built to fit every Doomed task while failing across the "
            "triangles aligns as well); the h = 6 key is ill-posed (z_m in (0.5, 0.6)); 750 "
            "steps from the measured K = 6 ensemble step cost",
            seen="fast at base seed 0 (2026-12-01): align 0.749 vs 0.734 (s1 failed), R² "
            "−0.34 vs −1.04 (s2 failed), guard held; a 6,000-step diagnostic at seed 0",
        ),
        Amendment(
            date="2026-12-07",
            claims=("s1", "s2"),
            change="5 seeds per arm at fast and paper (were 3); statuses from a 95 % "
            "Student-t interval",
            reason="intervals need >= 5 seeds",
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
            change="new preset full: fast's sizes with meta-batch 8 and 6,000 outer steps, 5 "
            "seeds per arm (sizes and calibration in presets['full']); no statement, metric, "
            "statistic, threshold, precondition or control changed",
            reason="fast cannot meet the fit precondition (relative loss <= 0.05 per run); the "
            "step count and meta-batch were sized on calibration base seed 10000 for that bar",
            seen="fast verdicts at seeds 0 and 1000: s1 and s2 inconclusive at both (worst fit "
            "0.280 / 0.319; s1 0.0016 [-0.0046, 0.0079] / -0.0019 [-0.0126, 0.0089], s2 0.0019 "
            "[-0.0043, 0.0080] / -0.0176 [-0.0467, 0.0115]; controls not held)",
        ),
        Amendment(
            date="2026-12-07",
            claims=("*",),
            change="editorial: presets['full'] said meta-batch 16 × 3,000 steps left 3 of 10 "
            "calibration runs above the fit bar; the stored runs show 2 (0.069, 0.059; 3 at "
            "step 2,250); no size, seed, statement, metric, threshold, precondition or control "
            "changed",
            reason="a miscount in the text, found after the full evaluation runs had started "
            "under the earlier wording (commit 070d35c)",
            seen="calibration runs at base seed 10000 only; no full verdict had been read",
        ),
        Amendment(
            date="2026-12-07",
            claims=("*",),
            change="reproduces: from what full was expected to read ('full ..., where 9 of 10 "
            "calibration runs met the fit precondition') to what it read; no size, seed, "
            "statement, metric, threshold, precondition or control changed.",
            reason="the expectation was written before the evaluation runs; the field now "
            "states their result, so that `study list` does not name full as reproducing.",
            seen="the full verdicts at seeds 0 (s1, s2 not held, every run fit) and 1000 (s1, "
            "s2 inconclusive: 6 of 10 runs above the fit bar, worst 0.200)",
        ),
    ),
)
