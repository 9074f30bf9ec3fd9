"""The protocol of ``gated-rnn-attention`` (S6): what decides each verdict, fixed before the
evaluation seeds of this contract ran (``dynascope.studies.protocol``).

g1 and g1-f32 check the implementation (the construction equals linear attention to
rounding): kind ``identity``, no control; the leaky-accumulator construction (λ = 1 − 1e-3)
is still measured and reported in their detail.

The findings' controls are ablations at the same budget, judged with the same statistic:

- g2, g2-falls, g4-lsa, g4-gd: the **ungated** linear RNN (:class:`.runs.UngatedLinearRNN`:
  the same diagonal recurrence, widths, init, optimizer and steps, both multiplicative gates
  removed), trained as the gated one is (``b_ungated_h{n}_s{i}``, ``c_icl_grnn_ungated_s{i}``).
  They replace the untrained students (step 0), which could not hold by construction.
  The ungated RNN's output is linear in its inputs, so it cannot form the products
  attention needs: if it met the claim's bar, the bar would not measure the gating.
- g3: the same student with its |λ| > 1 − δ neurons pruned instead of the mid-range ones.

Preconditions cover every arm a claim reads, per seed: g2/g2-falls every gated and ungated
student finished and the ungated one trained (its nmse fell below its step-0 value); g3 the
2·n_c student fits (nmse <= g2's bar in every seed); g4 the references (LSA, GD) and the
gated RNN fit (MSE <= 0.5 × the zero predictor's in every seed) and the ungated RNN trained.

Proposed amendments (not made): none. g4-gd's threshold is S6's and stays.
`full` (amendment of 2026-12-08): the teacher's T 12 -> 48, since g3's pruning cost depends on
the sequence length (calibration seeds 10000-10002, 3k steps: 0.9-1.6e-2 at T = 12,
2.7e-4-2.2e-3 at T = 48), and 10k ICL steps (the gated RNN's ICL loss was still falling at 5k);
checked on calibration seeds 20000-20004 before seeds 0 and 1000 ran at it (every claim held,
g3 1.5e-3, g4-gd 1.025 [1.01, 1.04]; 514 s wall on 2 workers).
"""

from __future__ import annotations

from dynascope.studies.protocol import EDITORIAL_REWORDING, Amendment, ClaimSpec, Protocol

__all__ = ["FIT_FRACTION", "PROTOCOL"]

FIT_FRACTION = 0.5  # g4: a model fits when its MSE <= this × the zero predictor's
_CITATION = "Zucchet et al. (2023), arXiv 2309.01775"
_UNGATED = (
    "the ungated linear RNN (both multiplicative gates removed; same recurrence, widths, "
    "init, optimizer and steps)"
)
_G2_NMSE = 1e-2
_RATIO = 1.05
_G4_PRE = (
    f"every ICL run finished; LSA, one GD step (η*) and the gated RNN fit: MSE <= {FIT_FRACTION} "
    "× the zero predictor's mean(y_q²), per arm and per seed",
    "the ungated RNN trained: its MSE at the last step below its step-0 MSE, in every seed",
)
_B_PRE = (
    "every gated and ungated student run finished",
    "the ungated students trained: nmse at the last step below the step-0 nmse, per size and seed",
)

PROTOCOL = Protocol(
    study="gated-rnn-attention",
    claims=(
        ClaimSpec(
            id="g1",
            claim="the construction equals causal linear self-attention (float64)",
            statement="a gated linear RNN with λ = 1 accumulators implements causal linear "
            "self-attention exactly",
            citation=f"{_CITATION}, Sec. 3 (construction)",
            metric="per seed, max over cases of max|GRNN(x) − LSA(x)|, float64",
            threshold=1e-6,
            direction="<=",
            threshold_source="the issue's criterion (~1e-14 expected; room for longer sequences)",
            preconditions=("every construction run finished",),
            kind="identity",
        ),
        ClaimSpec(
            id="g1-f32",
            claim="the construction equals causal linear self-attention (float32)",
            statement="as g1, in float32",
            citation=f"{_CITATION}, Sec. 3",
            metric="per seed, max over cases of max|GRNN(x) − LSA(x)| / max|LSA(x)|, float32",
            threshold=1e-5,
            direction="<=",
            threshold_source="S6's 1e-5, made relative to max|LSA| (float32 rounding grows with "
            "the output's magnitude); see the amendment of 2026-12-01",
            preconditions=("every construction run finished",),
            kind="identity",
        ),
        ClaimSpec(
            id="g2",
            claim="the teacher–student loss is small at 2× the construction",
            statement="gated RNN students of a linear-attention teacher reach a small loss with "
            "about twice the construction's neurons",
            citation=f"{_CITATION}, Sec. 4.1",
            metric="per seed, nmse of the largest student on fresh sequences",
            threshold=_G2_NMSE,
            direction="<=",
            threshold_source="S6's proposal, frozen before the first fast run",
            preconditions=_B_PRE,
            control=_UNGATED + " at the same size, its nmse",
        ),
        ClaimSpec(
            id="g2-falls",
            claim="the teacher–student loss falls with hidden size",
            statement="the loss falls with the number of neurons up to ~2× the construction",
            citation=f"{_CITATION}, Sec. 4.1",
            metric="per seed, least-squares slope of log nmse vs log d_hidden over the sizes",
            threshold=-0.5,
            direction="<=",
            threshold_source="theory: a student with d_hidden >= n_c can represent the teacher "
            "and one with n_c/2 cannot; -0.5 asks for much less than that (fixed when g2 was "
            "split, before any run of this form)",
            preconditions=(*_B_PRE, "the sizes span >= 4×"),
            control=_UNGATED + " at the same sizes, the same slope",
        ),
        ClaimSpec(
            id="g3",
            claim="pruning the mid-range-λ neurons of the 2× student barely changes its loss",
            statement="trained students keep only λ ≈ 0 and λ ≈ 1 neurons that matter: pruning "
            "the others leaves the loss unchanged",
            citation=f"{_CITATION}, Sec. 4.1",
            metric="per seed, nmse after pruning 0.05 <= |λ| <= 0.95 − nmse before (absolute)",
            threshold=_G2_NMSE,
            direction="<=",
            threshold_source="g2's bar: pruning may cost at most what g2 calls a small nmse "
            "(see the amendment of 2026-12-02)",
            preconditions=(
                "every student run finished",
                f"the 2·n_c student fits its teacher: nmse <= {_G2_NMSE:g} in every seed",
            ),
            control="the same students with their |λ| > 0.95 neurons (the accumulators the "
            "construction uses) pruned instead",
        ),
        ClaimSpec(
            id="g4-lsa",
            claim="the trained gated RNN does in-context regression as well as trained linear "
            "attention",
            statement="on in-context linear regression the trained gated RNN predicts like "
            "trained linear attention",
            citation=f"{_CITATION}, Sec. 4.2",
            metric="per seed, MSE_GRNN / MSE_LSA on the seed's fresh sequences",
            threshold=_RATIO,
            direction="<=",
            threshold_source="S6's 'a few %' proposal, frozen before the first fast run",
            preconditions=_G4_PRE,
            control=_UNGATED + ", the same ratio",
        ),
        ClaimSpec(
            id="g4-gd",
            claim="the trained gated RNN does in-context regression as well as one GD step with η*",
            statement="the trained gated RNN implements one step of gradient descent",
            citation=f"{_CITATION}, Sec. 4.2",
            metric="per seed, MSE_GRNN / MSE_GD on the seed's fresh sequences",
            threshold=_RATIO,
            direction="<=",
            threshold_source="S6's 'a few %' proposal, frozen before the first fast run",
            preconditions=_G4_PRE,
            control=_UNGATED + ", the same ratio",
        ),
    ),
    seeds={"smoke": 3, "fast": 5, "full": 5, "paper": 5},
    calibration_seeds=(10_000, 10_001, 10_002),
    presets={
        "smoke": "S6's smoke sizes, 20 steps, 3 seeds: plumbing, verdicts inconclusive",
        "fast": "S6's fast sizes (teacher d 4, n_c 16, students 8/16/32, 3k steps; ICL d_x 4, "
        "N 12, 5k steps), 5 seeds, plus the ungated arms; steps from the measured step time, "
        "not outcomes",
        "full": "fast with the teacher's sequence length T = 48 (was 12) and 10,000 ICL steps "
        "(was 5,000), 5 seeds; run with --executor process --workers 2 (two cores)",
        "paper": "S6's proposal (GPU): d_x = N = 10, hidden sweep, LRU/LSTM/GRU, 5 seeds, 50k "
        "steps",
    },
    reproduces="full (every claim held at seeds 0 and 1000: g3 2.5e-3 and 1.2e-3, g4-gd "
    "1.029 and 1.027); fast for g1, g1-f32, g2, g2-falls",
    registered="2026-12-07: seen before this version: the earlier contract's fast verdicts at "
    "base seeds 0 and 1000 with 3 seeds (g1, g1-f32, g2, g2-falls, g4-lsa held at both; g3 not "
    "held at both; g4-gd not held at 0, held at 1000), and calibration seeds 10000-10002 "
    "trained to 8k steps for g3. This version makes g1/g1-f32 identities, replaces the "
    "untrained controls of g2, g2-falls, g4 by the ungated RNN, adds per-seed fit "
    "preconditions on every arm, and runs 5 seeds at fast.",
    amendments=(
        Amendment(
            date="2026-12-01",
            claims=("g1-f32",),
            change="the float32 check measured relative to max|LSA(x)| (threshold 1e-5 "
            "relative) instead of S6's absolute 1e-5 (commit cdf4984).",
            reason="float32 rounding grows with the output's magnitude (outputs reach ~100 at "
            "T = 33).",
            seen="the first measurement at seed 0: 1.3e-5 absolute, 1.7e-7 relative",
        ),
        Amendment(
            date="2026-12-02",
            claims=("g2", "g2-falls", "g3"),
            change="on the engine (first in commit a559913): g3 from the ratio "
            "nmse_pruned / nmse <= 1.10 to the absolute change <= 1e-2; ν_log's Adam rate "
            "from 1e-3 to nu_learning_rate(steps) = 8.7e-3; g2's 'strict fall' split into "
            "g2-falls (slope <= -0.5).",
            reason="the ratio divided two near-zero losses (6e-4 -> 0.11 read as 184×); at 1e-3 "
            "λ could not polarize within 3k steps (derived from the parametrization); a strict "
            "fall is not a per-seed number.",
            seen="the legacy study's fast seed 0 (commit cdf4984): g3 184 (fails, 81 % of |λ| "
            "mid-range), g2 6.0e-4, g4-lsa 1.038, g4-gd 1.045",
        ),
        Amendment(
            date="2026-12-07",
            claims=("g1", "g1-f32", "g2", "g2-falls", "g3", "g4-lsa", "g4-gd"),
            change="g1 and g1-f32 become identities (no control); the controls of g2, g2-falls, "
            "g4-lsa, g4-gd from the untrained model (step 0) to the trained ungated RNN; fit "
            "preconditions per arm and per seed (g3's was the seed mean); fast 3 -> 5 seeds; "
            "statuses from 95 % intervals.",
            reason="a control must be the cause removed and able to hold; >= 5 "
            "seeds; fit of every arm read.",
            seen="the earlier contract's fast verdicts at seeds 0 and 1000",
        ),
        EDITORIAL_REWORDING,
        Amendment(
            date="2026-12-08",
            claims=("g3", "g4-gd"),
            change="a `full` preset: fast with the teacher's T = 48 and 10,000 ICL steps, 5 "
            "seeds; claims, statistics, thresholds, preconditions and controls unchanged. "
            "Its sizes are checked on calibration seeds 20000-20004 before seeds 0 and 1000 "
            "run at it.",
            reason="g3: over a 12-token window a leaky neuron is a usable accumulator, so the "
            "student leans on mid-range λ; at T = 48 the calibration seeds 10000-10002 pruned "
            "at 2.7e-4-2.2e-3 (T = 12: 0.9-1.6e-2). g4-gd: the gated RNN's ICL loss was still "
            "falling at 5k steps in every fast seed, and its ratio sits on 1.05.",
            seen="fast at seeds 0 and 1000 (g3 not held; g4-gd 1.051 and 1.045 against 1.05) "
            "and the T sweep on calibration seeds 10000-10002",
        ),
        Amendment(
            date="2026-12-08",
            claims=("*",),
            change="reproduces: from 'fast for g1, g1-f32, g2, g2-falls, g4-lsa; g3 and g4-gd "
            "read as measured at fast' to what full read; no size, seed, statement, metric, "
            "threshold, precondition or control changed.",
            reason="the field states which preset reproduces the finding; `study list` reads "
            "its opening clause.",
            seen="the full verdicts at seeds 0 and 1000 (every claim held at both)",
        ),
    ),
)
