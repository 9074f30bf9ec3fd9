"""The protocol of ``sigma-reparam-entropy`` (S12): claims, statistics, thresholds,
preconditions, ablation controls, seeds and presets, and the amendment log
(``shared/DESIGN.md``, Protocol).

Proposed amendments (not made; each needs a fresh, pre-registered test on new seeds):

- S12's 1.5k steps as a `full` preset, so that the control-LR baseline and σReparam
  both fit (>= 0.90) before e1/e2 are judged; fast's 150 steps cannot (calibration seeds
  10000-10001: the control-LR baseline at 0.76 / 0.87, σReparam at 0.52 / 0.42), so at fast
  every e-claim reads inconclusive through its fit precondition. Measured 2026-12-07 on
  calibration seed 10000 (docs page, "`full` on one CPU core"): not reachable on one core
  in 20 minutes (~2.6 s per step of the 15 runs: 1.5k steps ~64 min; the baseline fits at
  400 steps, σReparam at 300), and σReparam's entropy falls to 0.33-0.46·log T once it fits.
"""

from __future__ import annotations

from dynascope.studies.protocol import EDITORIAL_REWORDING, Amendment, ClaimSpec, Protocol

__all__ = [
    "COLLAPSE_FRACTION",
    "DIVERGED_RATIO",
    "FIT_ACCURACY",
    "OSCILLATION_RATIO",
    "PROTOCOL",
    "SEEDS",
    "TAIL_FRACTION",
]

FIT_ACCURACY = 0.90  # S12's bar for "trains" (test accuracy >= 90 %), per arm and per seed
COLLAPSE_FRACTION = 0.2  # final global entropy < 0.2·log T: collapsed (also fixes LR*)
OSCILLATION_RATIO = 2.0  # tail mean train loss > 2x its minimum: unstable
TAIL_FRACTION = 0.1  # the tail: the last 10 % of the steps
DIVERGED_RATIO = 1e6  # the instability ratio of a run whose loss is non-finite
SEEDS = {"smoke": 3, "fast": 5, "paper": 5}

_PAPER = "Zhai, Likhomanenko, Littwin, Busbridge, Ramapuram, Zhang, Gu, Susskind, ICML 2023, "
_PAPER += "arXiv 2303.06296"
_CONTROL_FITS = (
    f"the baseline at the control LR (the smallest swept LR) reaches val accuracy >= "
    f"{FIT_ACCURACY:g} in every seed (the budget suffices to fit the task)"
)
_STAR = (
    "LR* exists: a swept LR above the control LR where the baseline's final entropy "
    "interval lies <= 0.2·log T"
)
_FINITE = "every seed of the baseline at the LR read has a finite final loss and entropy"

PROTOCOL = Protocol(
    study="sigma-reparam-entropy",
    claims=(
        ClaimSpec(
            id="e1-collapse",
            claim="the baseline's attention entropy collapses at a high LR (Adam, no warmup)",
            statement="Without σReparam, a high learning rate drives the attention entropy of "
            "every head to ≈ 0 (entropy collapse)",
            citation=f"{_PAPER}, sec. 3 and Fig. 1; shared/systems/S12 e1",
            metric="baseline final global entropy / log T at the largest swept LR, per seed",
            threshold=COLLAPSE_FRACTION,
            direction="<=",
            threshold_source="theory: S12's proposal 0.2·log T, frozen before any run",
            preconditions=(_CONTROL_FITS, _FINITE + " (the largest LR)"),
            control="the baseline at the control LR (the high LR removed), the same entropy",
        ),
        ClaimSpec(
            id="e1-instability",
            claim="at LR* the baseline's loss is unstable (diverges or oscillates)",
            statement="Entropy collapse coincides with unstable training: oscillating loss or "
            "divergence",
            citation=f"{_PAPER}, sec. 3; shared/systems/S12 e1",
            metric="baseline train-loss mean over the last 10 % of steps / its minimum at LR*, "
            "per seed, capped at 1e6 (a non-finite loss counts 1e6)",
            threshold=OSCILLATION_RATIO,
            direction=">=",
            threshold_source="theory: S12's proposal (2x), frozen before any run",
            preconditions=(_STAR, _CONTROL_FITS),
            control="the baseline at the control LR (the high LR removed), the same ratio",
        ),
        ClaimSpec(
            id="e2-entropy",
            claim="at LR*, σReparam keeps the attention entropy above 0.5·log T",
            statement="σReparam prevents entropy collapse: the model trains at that learning "
            "rate with its entropy kept",
            citation=f"{_PAPER}, sec. 4 (σReparam, eq. 3); shared/systems/S12 e2",
            metric="σReparam min over logged steps of global entropy / log T at LR*, per seed",
            threshold=0.5,
            direction=">=",
            threshold_source="theory: S12's proposal 0.5·log T, frozen before any run",
            preconditions=(
                _STAR,
                f"σReparam at LR* trains: val accuracy >= {FIT_ACCURACY:g} in every seed (an "
                "attention that learnt nothing keeps a high entropy)",
                _CONTROL_FITS,
            ),
            control="the baseline at LR* (σReparam removed; same init, LR and steps), its min "
            "entropy",
        ),
        ClaimSpec(
            id="e2-accuracy",
            claim="at LR*, σReparam trains to validation accuracy >= 0.9",
            statement="With σReparam a LayerNorm-free ViT trains to competitive accuracy "
            "without warmup at a learning rate where the baseline collapses",
            citation=f"{_PAPER}, sec. 5 (ViT); shared/systems/S12 e2",
            metric="σReparam last validation accuracy at LR*, per seed",
            threshold=FIT_ACCURACY,
            direction=">=",
            threshold_source="theory: S12's 90 %, frozen before any run",
            preconditions=(_STAR, _CONTROL_FITS),
            control="the baseline at LR* (σReparam removed), its val accuracy",
        ),
        ClaimSpec(
            id="u1",
            claim="σReparam nn.Linear equals the plain Linear at init (γ = σ₀)",
            statement="σReparam with γ initialised to σ(W₀) leaves the initial function unchanged",
            citation=f"{_PAPER}, sec. 4; apple/ml-sigma-reparam vision/layers.py",
            metric="max |SN(x) − Linear(x)| at init, float32, per seed",
            threshold=1e-6,
            direction="<=",
            threshold_source="theory: S12's unit check (float32 rounding of outputs ~1)",
            preconditions=("every unit-check run finished",),
            kind="identity",
        ),
        ClaimSpec(
            id="u2",
            claim="the running σ tracks ‖W‖₂ under slow drift",
            statement="One power iteration per step with a persistent u tracks the spectral norm",
            citation=f"{_PAPER}, sec. 4; apple/ml-sigma-reparam vision/layers.py",
            metric="|σ_running / ‖W‖₂ − 1| after 50 drift steps, per seed",
            threshold=0.01,
            direction="<=",
            threshold_source="theory: S12's unit check (1 %)",
            preconditions=("every unit-check run finished",),
            kind="identity",
        ),
    ),
    seeds=SEEDS,
    calibration_seeds=(10000, 10001, 10002),
    presets={
        "smoke": "2 layers, d_model 16, LRs {1e-3, 3e-2}, 20 steps, 3 seeds: plumbing only",
        "fast": "S12's ViT (4 layers, d_model 64, 4 heads) on digits, LN-free baseline at LRs "
        "{1e-3, 3e-2} and σReparam at 3e-2, 5 seeds each, 150 steps (from measured CPU time, "
        "84 ms/step); 5 unit-check runs. Too short to fit (>= 0.90): a demo whose e-claims "
        "read inconclusive through their fit preconditions",
        "paper": "DeiT-tiny-shaped ViT (12 layers, d_model 192, 3 heads), LRs {1e-3, 2e-3, "
        "3e-3, 1e-2, 3e-2}, 3000 steps, 5 seeds (GPU; not run)",
    },
    reproduces="paper (3000 steps, GPU; not run); fast cannot fit the task in 150 steps",
    registered="2026-12-07: fixed after the earlier contract's fast verdicts at seeds 0-2 and "
    "1000-1002 had been seen (e1-collapse held 0.085 / 0.095, e1-instability held, "
    "e2-entropy held 0.931 / 0.930 while σReparam's val accuracy was 0.10-0.45, e2-accuracy "
    "inconclusive, u1 held, u2 held / not held); this version adds fit preconditions on every "
    "arm read, u1/u2 as identities, LR* by interval and 5 seeds",
    amendments=(
        Amendment(
            date="2026-12-01",
            claims=("e1-collapse", "e1-instability", "e2-entropy", "e2-accuracy"),
            change="fast 300 -> 200 steps on one thread (commit 71618a9).",
            reason="cost: 300 steps took 517 s as users run it (commit 71618a9).",
            seen="fast at seed 0, 300 steps: e1 not held (the baseline's entropy collapsed, "
            "its loss stayed stable), e2 not held (σReparam val accuracy 0.73).",
        ),
        Amendment(
            date="2026-12-02",
            claims=("e1-collapse", "e1-instability", "e2-entropy", "e2-accuracy"),
            change="e1 split into e1-collapse and e1-instability, judged apart; e2 read at LR* "
            "without the instability half; fast LRs {1e-3, 3e-2} x 3 seeds at 150 steps "
            "(commit 7d6c9c4).",
            reason="the issue-18 audit measured a collapse with a stable loss (0.078·log T at "
            "lr 3e-2, 600 steps); the old e1 needed both and said 'no collapse', which was "
            "wrong; 150 steps from measured CPU time (commit 7d6c9c4).",
            seen="fast at seed 0 (300 and 200 steps): e1 and e2 not held.",
        ),
        Amendment(
            date="2026-12-02",
            claims=("e1-collapse", "e1-instability", "e2-entropy", "e2-accuracy"),
            change="the baseline became the LN-free ViT (was S12's pre-LN ViT); e2 split into "
            "e2-entropy and e2-accuracy (precondition: the control-LR baseline fits); LR* only "
            "above the control LR; σReparam runs only above it (commit c8d1439).",
            reason="the paper's collapse-prone settings are post-LN or no LN without warmup, "
            "and the LN-free baseline differs from σReparam only by σReparam; checked on "
            "calibration seeds 10000-10001 (commit c8d1439).",
            seen="fast at seeds 0-2 with the pre-LN baseline (commit 9bbbf05): e1-collapse not "
            "held (0.276, 0.255, 0.149), e1-instability and e2 inconclusive (no LR*).",
        ),
        Amendment(
            date="2026-12-07",
            claims=("e1-collapse", "e1-instability", "e2-entropy", "e2-accuracy", "u1", "u2"),
            change="evidence contract: 95 % Student-t intervals over 5 seeds per arm (was the "
            "mean and 2/3 of 3 seeds); LR* by the interval of the final entropy; fit "
            "preconditions on every arm read (σReparam >= 0.90 for e2-entropy; the control-LR "
            "baseline >= 0.90 in every seed for every e-claim; finite loss on the collapsed "
            "arm); u1 and u2 become identities (implementation checks, no control).",
            reason="e2-entropy held while σReparam's val accuracy was 0.10-0.25 "
            "(chance 0.10): an attention that learnt nothing keeps a high entropy.",
            seen="the earlier contract's fast verdicts at seeds 0-2 and 1000-1002 (above).",
        ),
        EDITORIAL_REWORDING,
    ),
)
