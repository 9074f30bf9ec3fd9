"""The protocol of ``compositional-icl-bottleneck`` (SYSTEMS.md S3): what decides claims 1, 1b
and 2, fixed before the evaluation seeds of this version ran, and the amendment log.

The analysis judges each claim through its spec (``PROTOCOL.claim("1").judge(...)``); the
threshold, direction and statistic live only here (``shared/DESIGN.md``, Protocol).

The ablation arm of claims 1 and 1b is the paper's unstructured control: both models trained
on the ``unstructured`` split (every sequence a freshly drawn teacher, its own modules and a
random 2-hot mask), same sizes, steps and seeds, so the compositional structure shared across
tasks is removed; they are evaluated on the structured teacher's unseen combinations (OOD)
and probed for its z like the claim's runs.

Proposed amendments (not made; each would change what a verdict reads and must be re-tested
on fresh seeds first):

- the smallest configuration (d_model, layers, steps) where both models reach ID
  R² >= 0.9 on calibration seeds; a ``full`` preset if it fits 20 minutes.
- SYSTEMS.md S3 also asks |R²_ID(hyper) − R²_ID(vanilla)| <= 0.1 for claim 1; the per-run ID
  bar of 0.9 implies it (both in [0.9, 1]), so it is not a separate test.
"""

from __future__ import annotations

from dynascope.studies.protocol import Amendment, ClaimSpec, Protocol

__all__ = ["ID_FIT", "PROTOCOL"]

ID_FIT = 0.9  # every run a claim reads: R² on its own training distribution, per run

_CITATION = (
    "Kobayashi, Schug, Akram, Redhardt, von Oswald, Pascanu, Lajoie, Sacramento, 'When can "
    "transformers compositionally generalize in-context?', ICML 2024 NGSM workshop, arXiv "
    "2407.12275"
)
_FIT = (
    f"every run the claim and its control read finished with ID R² (on its own training "
    f"distribution) >= {ID_FIT}, per run"
)

_C1 = ClaimSpec(
    id="1",
    claim="on Connected+ the hypernetwork transformer beats the vanilla one OOD",
    statement="a transformer that infers a low-dimensional latent and generates an MLP's "
    "weights with a linear hypernetwork generalizes to unseen module combinations where a "
    "plain transformer, fitting the training combinations as well, does not",
    citation=_CITATION + ", Table 3 (Connected+); SYSTEMS.md S3",
    metric="per seed, R²_OOD(hyper) − R²_OOD(vanilla), Connected+",
    threshold=0.2,
    direction=">=",
    threshold_source="theory: SYSTEMS.md S3's proposal, frozen before the first fast run",
    preconditions=(_FIT + " (hyper and vanilla on Connected+, both unstructured arms)",),
    control="compositional structure removed: both models trained on the unstructured split "
    "(same sizes, steps, seeds), R²_OOD(hyper) − R²_OOD(vanilla) on the structured teacher's "
    "unseen combinations (it holds if the hypernetwork is simply the better in-context "
    "learner)",
)
_C1B = ClaimSpec(
    id="1b",
    claim="z is linearly decodable on OOD tasks from both models' residual streams",
    statement="the latent code z is linearly decodable from the vanilla transformer's "
    "residual stream on OOD tasks, so its failure is not a failure to infer z",
    citation=_CITATION + ", latent-code probe; SYSTEMS.md S3",
    metric="per seed, min over the two models of the best-layer ridge R² of z from the query "
    "token (fit on training combinations, R² on OOD)",
    threshold=0.5,
    direction=">=",
    threshold_source="theory: SYSTEMS.md S3's proposal, frozen before the first fast run",
    preconditions=(_FIT + " (hyper and vanilla on Connected+, both unstructured arms)",),
    control="compositional structure removed: the same probe and minimum on the two models "
    "trained on the unstructured split (it holds if any model that regresses in context "
    "encodes z linearly, learnt modules or not)",
)
_C2 = ClaimSpec(
    id="2",
    claim="disconnected support hurts the hypernetwork transformer OOD, not the vanilla one",
    statement="the hypernetwork transformer generalizes compositionally only if the training "
    "combinations connect all modules",
    citation=_CITATION + ", Table 3 (Connected vs Disconnected); SYSTEMS.md S3",
    metric="per seed, R²_OOD(hyper, Connected) − R²_OOD(hyper, Disconnected)",
    threshold=0.2,
    direction=">=",
    threshold_source="theory: SYSTEMS.md S3's proposal, frozen before the first fast run",
    preconditions=(_FIT + " (hyper and vanilla on Connected and on Disconnected)",),
    control="the hypernetwork removed: the same support gap of the vanilla model (the "
    "baseline architecture, same runs' budget)",
)

PROTOCOL = Protocol(
    study="compositional-icl-bottleneck",
    claims=(_C1, _C1B, _C2),
    seeds={"smoke": 3, "fast": 5, "paper": 5},
    calibration_seeds=(),
    presets={
        "smoke": "N 8, d_model 16, 1 layer, 30 steps, 3 seeds, with the unstructured arms: "
        "plumbing only, inconclusive (fewer than 5 seeds)",
        "fast": "Connected+ × {vanilla, hyper} plus the unstructured ablation × {vanilla, "
        "hyper}, 5 seeds each (four K = 5 ensembles), N 16, d_model 32, 4 heads, 2 layers, "
        "batch 64, 800 steps (1000 and 3 seeds, no ablation arms, until 2026-12-07; cut to "
        "fit the 180 s budget with 4 × 5 runs, from the measured cost). Claim 2 is "
        "paper-only. A demo: ID R² 0.29-0.58 at 1000 steps against 0.9",
        "paper": "Table 3 sizes (vanilla d_model 128, hyper 64), 100k steps, batch 128, all "
        "three supports and the unstructured arms, 5 seeds (the paper has 3), 16,000-sequence "
        "evaluations (GPU)",
    },
    reproduces="paper (GPU; never run); no CPU configuration measured yet reaches ID R² >= 0.9",
    registered="2026-12-07: fixed after the earlier contract's fast verdicts at seeds 0 and "
    "1000 were seen (1 and 1b inconclusive at both: seed-mean ID R² 0.42-0.53 < 0.9; claim 1 "
    "per seed 0.013, −0.065, 0.036 and −0.145, 0.025, −0.005; 1b ≈ −0.03 per seed at both, "
    "its untrained-model control the same). This version: 5 seeds, unstructured ablation arms "
    "as the controls of 1 and 1b, the ID bar per run. Calibration seeds: none has been run; "
    "base 10000 is reserved for the issue-29 scan",
    amendments=(
        Amendment(
            date="2026-12-02",
            claims=("1", "1b"),
            change="per-seed contract over 3 seeds (was 1); precondition seed-mean ID R² >= "
            "0.9 for both models; controls: the ID-split gap (1), the untrained models' probe "
            "(1b); SYSTEMS.md's |ΔR²_ID| <= 0.1 part of claim 1 became the ID-gap control "
            "(commit c84f929)",
            reason="the fit audit: models that do not fit the training combinations say nothing "
            "about compositional generalization",
            seen="fast at base seed 0 (2026-12-01, 09d6eba): claim 1 −0.035, 1b −0.012, both "
            "failed",
        ),
        Amendment(
            date="2026-12-07",
            claims=("1", "1b", "2"),
            change="5 seeds per arm (were 3); statuses from a 95 % Student-t interval; the "
            "controls of 1 (ID gap: not an ablation) and 1b (untrained models: cannot hold) "
            "replaced by the unstructured-training ablation; the ID bar per run (was: seed "
            "mean per model) and on the control arms; fast 1000 -> 800 steps to fit 4 × 5 runs "
            "in the budget",
            reason="intervals need >= 5 seeds; 1b's control cannot hold by "
            "construction; every arm a claim reads must have trained",
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
    ),
)
