"""The protocol of ``hyla-fuzzy-logic`` (SYSTEMS.md S4): what decides claims s4 and s4-sraven,
fixed before the evaluation seeds of this version ran, and the amendment log.

The analysis judges each claim through its spec (``PROTOCOL.claim("s4").judge(...)``); the
threshold, direction and statistic live only here (``shared/DESIGN.md``, Protocol).

Proposed amendments (not made: each would change what a verdict reads; to be re-tested on
fresh seeds before it is adopted):

- none yet. A ``full`` preset (the sample count where every HYLA, linear and twin run meets ID
  R² >= 0.5, 5 seeds per arm, <= 20 min on one core) was sized on calibration seeds 10000-10002
  (2026-12-07, notes page) and not added: at 307k samples a run (2,400 steps × 128, lr 1e-3)
  linear runs read ID R² 0.414 and 0.485, and the 15 runs would cost ~2,610 s on one core; lr
  3e-3 or batch 64 fit no faster per sample.
"""

from __future__ import annotations

from dynascope.studies.protocol import EDITORIAL_REWORDING, Amendment, ClaimSpec, Protocol

__all__ = ["ID_FIT", "PROTOCOL", "SRAVEN_FIT"]

ID_FIT = 0.5  # every fuzzy-logic run's ID (train-combination) R², per run
SRAVEN_FIT = 0.5  # every sRAVEN run's training accuracy, per run

_S4 = ClaimSpec(
    id="s4",
    claim="HYLA beats linear attention on unseen combinations of seen terms (test split)",
    statement="HYLA generalizes better than linear attention to unseen combinations of known "
    "fuzzy-logic terms: 'OOD R²' 81.13 ± 7.77 vs 59.89 ± 5.22 over 3 seeds",
    citation="Schug et al., 'Attention as a Hypernetwork', ICLR 2025, arXiv 2406.05816, "
    "Table A1 (fuzzy logic); SYSTEMS.md S4",
    metric="per seed i, test R²(hyla_s{i}) − test R²(linear_s{i}) (R² per sequence, averaged "
    "over the test split's sequences)",
    threshold=0.05,
    direction=">=",
    threshold_source="theory: SYSTEMS.md S4's proposal (a quarter of the paper's 0.21 gap, "
    "above its 0.05-0.08 seed spread), frozen before the first fast run (2026-12-01)",
    preconditions=(
        f"every run the claim and its control read (hyla_s{{i}}, linear_s{{i}}, "
        f"linear_twin_s{{i}}) finished with ID (train-combination) R² >= {ID_FIT}, per run",
    ),
    control="HYLA removed: linear twins (linear attention, seeds + 100) in HYLA's place, "
    "test R²(linear_twin_s{i}) − test R²(linear_s{i}), same budget and statistic",
)

_SRAVEN = ClaimSpec(
    id="s4-sraven",
    claim="HYLA's OOD accuracy on sRAVEN exceeds linear and softmax attention",
    statement="on symbolic Raven (sRAVEN) HYLA's OOD accuracy exceeds linear and softmax "
    "attention (0.691 vs 0.563 and 0.566)",
    citation="Schug et al., ICLR 2025, arXiv 2406.05816, Section 5 (sRAVEN); SYSTEMS.md S4",
    metric="per seed, OOD acc(HYLA) − max(OOD acc(linear), OOD acc(softmax))",
    threshold=0.0,
    direction=">=",
    threshold_source="theory: the claim's ordering (HYLA above both), no margin",
    preconditions=(
        f"every sRAVEN run (HYLA, linear, softmax) finished with training accuracy >= "
        f"{SRAVEN_FIT}, per run",
    ),
    control="HYLA removed: linear attention in HYLA's place, OOD acc(linear) − max(OOD "
    "acc(HYLA), OOD acc(softmax)), same runs and statistic (it holds if linear is the best "
    "kind)",
)

PROTOCOL = Protocol(
    study="hyla-fuzzy-logic",
    claims=(_S4, _SRAVEN),
    seeds={"smoke": 3, "fast": 5, "paper": 5},
    calibration_seeds=(10_000,),
    presets={
        "smoke": "L 3, K 2, seq 8, d_model 16, 1 layer, 30 steps, 3 seeds: plumbing only, its "
        "verdicts read inconclusive (fewer than 5 seeds)",
        "fast": "d_model 64, 8 heads of d_head 2, 2 layers, batch 128, no position bias, 300 "
        "steps (38k samples a run; steps fixed from the measured cost per sample, 2026-12-02), "
        "HYLA, linear and linear twins × 5 seeds (one ensemble per kind; 3 seeds until "
        "2026-12-07). A demo: the learning curves (notes page) put ID R² >= 0.5 at ~192k "
        "samples a run, so the precondition is expected to fail",
        "paper": "Table A1: 7 attention kinds × 5 seeds, d_model 128, 50k steps × 128, T5 bias "
        "128 buckets; sRAVEN for HYLA, linear, softmax × 5 seeds (GPU; 3 seeds until "
        "2026-12-07, the paper's count, raised so that its verdicts can be conclusive)",
    },
    reproduces="paper (GPU; never run); no CPU preset meets the ID-fit precondition: at 307k "
    "samples a run 2 of 3 linear calibration runs (base 10000) stay below ID R² 0.5, and a "
    "5-seed run of that size costs ~43 min on one core (notes page)",
    registered="2026-12-07: fixed after the earlier contract's fast verdicts at seeds 0 and "
    "1000 were seen (s4 inconclusive at both: min seed-mean ID R² 0.033 / 0.055 < 0.5; per-seed "
    "gaps 0.057, 0.050, 0.071 and −0.155, −0.010, −0.063; twin controls not held) and the "
    "plain-loop learning curves of seeds 0-2. This version: 5 seeds per arm at fast, the "
    "ID-fit precondition per run (was: per kind, seed mean) and on the twins too. Calibration "
    "seeds: none has been run; base 10000 is reserved for sizing a full preset",
    amendments=(
        Amendment(
            date="2026-12-01",
            claims=("s4",),
            change="fast: T5 position bias buckets 32 -> 128 (commit 09d6eba)",
            reason="the reference configs/logic.py uses 128 buckets (stated in 09d6eba)",
            seen="a fast run with 32 buckets that read a gap of −0.09 (base seed 0)",
        ),
        Amendment(
            date="2026-12-02",
            claims=("s4",),
            change="the reporting guard 'undertrained' (ID R² < 0.5, did not change the "
            "verdict) became a precondition (seed-mean ID R² >= 0.5 for both kinds); the "
            "statistic went from the seed-mean gap to the per-seed contract; a linear-twin "
            "control was added; fast became batch 128, 300 steps, no position bias (commits "
            "3fe3345, c84f929)",
            reason="the fit audit: a gap between models that do not fit the training combinations "
            "measures fitting speed, not compositional generalization",
            seen="fast at base seed 0 (2026-12-01, 09d6eba): seed-mean gap 0.052 >= 0.05 "
            "(passed) with ID R² below 0.5; the fit audit: ID R² 0.14-0.28",
        ),
        Amendment(
            date="2026-12-07",
            claims=("s4", "s4-sraven"),
            change="5 seeds per arm at fast and paper (were 3); statuses from a 95 % interval; "
            "the fit precondition per run (was: seed mean per kind) and on the control's twins",
            reason="intervals need >= 5 seeds; every arm a claim reads must have trained, per seed",
            seen="fast at base seeds 0 and 1000 (s4 inconclusive at both, see registered)",
        ),
        EDITORIAL_REWORDING,
        Amendment(
            date="2026-12-07",
            claims=("s4",),
            change="reproduces: from 'learning curves: ~192k samples a run' to the calibration "
            "result (307k samples leave 2 of 3 linear runs below ID R² 0.5; ~43 min on one "
            "core); calibration seeds: base 10000 recorded. No claim, metric, threshold or "
            "preset changed.",
            reason="the learning curves were read on evaluation seeds 0-2; a full preset was "
            "sized on calibration seeds 10000-10002 and found not to fit 20 min on one core.",
            seen="fast at base seeds 0 and 1000 (see registered); no full run at evaluation seeds",
        ),
    ),
)
