"""The protocol of ``weight-decay-low-rank`` (SYSTEMS.md S1): every claim's statistic,
threshold, preconditions and ablation control, fixed before its evaluation seeds run
(:mod:`dynascope.studies.protocol`)."""

from __future__ import annotations

import math

from dynascope.studies.protocol import Amendment, ClaimSpec, Protocol

__all__ = ["PROTOCOL"]

_PAPER = "Kobayashi, Akram, von Oswald, NeurIPS 2024, arXiv 2410.23819"
_PRODUCT = (
    "the same toy, seed and GD with λ put on the product, (λ/2)‖ABᵀ‖²_F, instead of the "
    "factors (the cause, decay on the factors, removed; the loss then depends on ABᵀ alone)"
)
LEARNED = 0.9  # recall val accuracy every recall arm must reach, per seed
LM_LEARNED = 0.6 * math.log(256)  # nats/byte, 60 % of a uniform byte model's loss

PROTOCOL = Protocol(
    study="weight-decay-low-rank",
    claims=(
        ClaimSpec(
            id="a1",
            claim="balancedness decays at rate 2λ per unit time (log-slope −2ηλ per GD step)",
            statement="gradient flow on L(ABᵀ) + (λ/2)(‖A‖² + ‖B‖²) gives d/dt(AᵀA − BᵀB) = "
            "−2λ(AᵀA − BᵀB): balancedness decays as e^{−2λt}",
            citation=f"{_PAPER}, Sec. 3 (balancedness lemma)",
            metric="per seed, max over λ > 0 of |fitted log-slope of ‖AᵀA − BᵀB‖_F / (−2ηλ) − 1|",
            threshold=0.1,
            direction="<=",
            threshold_source="theory: SYSTEMS.md's 10 % tolerance on the rate",
            preconditions=(
                "every seed's loss settles (relative change < 1e-6) before the last step for "
                "every λ > 0, and each fit keeps >= 10 points above b_t/b_0 = 1e-12",
            ),
            control=_PRODUCT + ": its fitted slope against each λ > 0's −2ηλ",
        ),
        ClaimSpec(
            id="a2",
            claim="the L2–nuclear gap closes (½(‖A‖²+‖B‖²) → ‖ABᵀ‖_*)",
            statement="for balanced factors the L2 term equals the nuclear norm; the penalised "
            "losses become equal exponentially fast",
            citation=f"{_PAPER}, Sec. 3 (theorem on L2 and nuclear-norm minima)",
            metric="per seed, max over λ > 0 of gap / L2 term at the last step",
            threshold=1e-4,
            direction="<=",
            threshold_source="theory: SYSTEMS.md's 1e-4 (float64 GD converges far below it)",
            preconditions=("as a1",),
            control=_PRODUCT + ": gap / L2 term at the last step",
        ),
        ClaimSpec(
            id="a3",
            claim="singular values end soft-thresholded, σ_i = max(d_i − cλ, 0)",
            statement="the nuclear-norm penalty soft-thresholds the singular values of the product",
            citation=f"{_PAPER}, Sec. 3 (toy)",
            metric="per seed, max |σ_i − max(d_i − cλ, 0)| over modes with |d_i − cλ| >= 0.05, "
            "main and fine λ grids",
            threshold=1e-3,
            direction="<=",
            threshold_source="theory: SYSTEMS.md's 1e-3; marginal modes converge sublinearly "
            "and are reported, not gated",
            preconditions=(
                "the λ grid crosses thresholds: some gated mode is predicted 0, some > 0",
            ),
            control=_PRODUCT + ": its σ_i against the same soft-threshold predictions "
            "(a product penalty shrinks, σ_i = d_i/(1 + cλ))",
        ),
        *(
            ClaimSpec(
                id=f"b-{which}",
                claim=f"weight decay on attention lowers the head-mean rank of "
                f"W_{which.upper()} (recall)",
                statement="weight decay lowers the rank of W_QK and W_OV, more as λ grows",
                citation=f"{_PAPER}, Sec. 4 (attention layers), Fig. on per-head rank vs λ",
                metric="per seed, head-mean rank_1e-2 at λ_attn = 0 minus at λ_attn = λ",
                threshold=2.0,
                direction=">=",
                threshold_source="theory: SYSTEMS.md's rank(λ) <= rank(0) − 2 (d_head = 16)",
                preconditions=(
                    f"every recall arm the claim reads (λ_attn = 0, λ_attn = λ, the control) "
                    f"learns recall: val accuracy >= {LEARNED} on every seed",
                ),
                control="decay moved off attention (λ_attn = 0, λ on the other matrices), "
                "same budget: the same rank drop",
            )
            for which in ("qk", "ov")
        ),
        ClaimSpec(
            id="c",
            claim="decaying attention less (decoupled) lowers the LM's validation loss",
            statement="decaying attention less than the rest improves perplexity",
            citation=f"{_PAPER}, Sec. 5 (language models, per-group decay)",
            metric="per seed, val loss(uniform) − val loss(decoupled) at the last step, nats/byte",
            threshold=0.005,
            direction=">=",
            threshold_source="SYSTEMS.md proposal (0.005 nats/byte, ~0.5 % perplexity)",
            preconditions=(
                f"every LM arm learns: val loss <= 0.6·ln 256 = {LM_LEARNED:.2f} nats/byte on "
                "every seed",
            ),
            control="the same lift of decay from the other matrices instead of attention "
            "(λ_attn = λ, λ_other = 0), same budget: val loss(uniform) − val loss(this arm)",
        ),
    ),
    seeds={"smoke": 3, "fast": 5, "paper": 5},
    calibration_seeds=(10_000, 20_000),
    presets={
        "smoke": "50 toy steps, 30 recall and 20 LM steps: plumbing only",
        "fast": "toy 1000 GD steps in float64; recall 1000 steps × batch 64 at lr 1e-2; LM "
        "600 steps × batch 16, n_ctx 32; sizes from calibration seeds 10000 and 20000 "
        "(cost and recall learned at λ_attn = 0)",
        "paper": "recall 10k steps × batch 128; a 10-layer d_model 512 LM on GPU",
    },
    reproduces="a1–a3 at `fast` (seconds); b needs every recall arm fit, which `fast` does "
    "not reach at λ_attn = 1 (val accuracy ≈ 0.22 at seeds 0 and 1000 under the earlier "
    "contract), so b is expected inconclusive there; c at `fast` (~3 min on 2 cores)",
    registered="2026-12-07, after the earlier contract's fast verdicts at seeds 0 and 1000 "
    "were published (a1–a3, b-qk, b-ov, c held at both); this version replaces the controls of "
    "a1–a3 (λ = 0 slice, fixed by design) and c (step-0 twins, ≡ 0) by ablations, adds the "
    "fit of every recall and LM arm to b's and c's preconditions, and raises fast to 5 seeds",
    amendments=(
        Amendment(
            date="2026-12-02",
            claims=("b-qk", "b-ov"),
            change="fast recall 2000 × 64 → 3000 × 128 steps (commit d3dc856)",
            reason="at 2000 × 64 recall was not learned at λ_attn = 0, so b's precondition "
            "failed; a precondition fix, not a claim fix",
            seen="seeds 0–2 head-mean rank_1e-2 at λ_attn = 0 / 1 / control: W_QK 15.5, 15.75, "
            "16 / 1.25, 1.5, 1.5 / 13, 12.75, 12.5; W_OV 16, 16, 16 / 5.75, 6.25, 6 / 16 ×3; "
            "val accuracy 0.48, 0.25, 0.23",
        ),
        Amendment(
            date="2026-12-02",
            claims=("b-qk", "b-ov", "c"),
            change="fast recall 1000 × 64 at lr 1e-2, LM n_ctx 32 × batch 16 (commit 8cd0b8b)",
            reason="cost (<= 180 s on 2 cores), chosen on calibration seeds 10000 and 20000",
            seen="the 3000 × 128 verdicts at seeds 0 and 1000 (b-qk, b-ov, c held); on the "
            "calibration seeds b-qk's control no longer held",
        ),
        Amendment(
            date="2026-12-07",
            claims=("a1", "a2", "a3", "c"),
            change="controls: the λ = 0 slice (a1 ≡ 1 and a3 by design) and c's step-0 twins "
            "(≡ 0) replaced by ablations: the product penalty (a1–a3) and decay lifted from "
            "the other matrices instead of attention (c)",
            reason="a control must be the cause removed and able to hold",
            seen="every earlier verdict at seeds 0 and 1000 (all held)",
        ),
        Amendment(
            date="2026-12-07",
            claims=("b-qk", "b-ov", "c"),
            change="preconditions: every arm the claim reads must fit, per seed (was: the "
            "λ_attn = 0 arm's mean accuracy, the decoupled LM's mean loss)",
            reason="b held while the λ_attn = 1 arm sat at accuracy ≈ 0.22",
            seen="every earlier verdict at seeds 0 and 1000 (b-qk, b-ov held)",
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
