"""The protocol of ``gradual-rank`` (SYSTEMS.md S10): each claim's statistic, threshold,
preconditions and ablation control, fixed before its evaluation seeds run
(:mod:`dynascope.studies.protocol`).

Proposed amendments (not made; each needs calibration seeds >= 10000 first, then fresh
evaluation seeds):

- t3's control reads the same runs in raw steps instead of τ (a change of time unit, not an
  ablation); a candidate is the α = 1 arm's stage times, which has no drops to compare.
- v1-rise's and v1-end's SGD control shows the same low, rising rank as Adam at fast (v1-end:
  0.156 vs 0.200 of d_head). The paper's theory predicts incremental low-rank learning for
  gradient flow itself, so SGD does not remove the mechanism, only the optimizer the paper's
  experiments used; a control that removes the small-init cause (the ViT at a large init
  scale, lazy) needs calibration seeds first. Not adopted on 2026-12-07.
- t1 reads a mean of integer plateau counts against 3: every seed measured so far reads >= 3
  (fast, calibration seeds 10000-10009 and full), yet the t-interval straddles 3 whenever
  some seeds read 4 (calibration: 3.1 [2.87, 3.33]); the per-seed claim is a rate (the
  fraction of seeds with >= 3 plateaus, Wilson interval), whose rate threshold would be
  chosen after these values were seen. Not adopted on 2026-12-07.
- t2 reads a mean of integer counts >= 1 against 1, so it holds only when every seed reads 1;
  a rate statistic (the fraction of seeds with rise <= 1, Wilson interval) would state the
  paper's "at most one" per seed, but its threshold would be chosen after seeds 0-2 read
  1, 1, 2, so it is not adopted.
"""

from __future__ import annotations

from dynascope.studies.protocol import Amendment, ClaimSpec, Protocol

__all__ = ["PROTOCOL", "TOY_FIT", "V1_MIN_ACCURACY"]

_PAPER = "Abbe, Boix-Adserà, Littwin, Bengio, Susskind, NeurIPS 2023, arXiv 2306.07042"
# every α a toy claim reads: final loss <= 1e-2 × initial loss, per seed; set before any toy
# run of this version, checked on calibration seed 10000 (α <= 0.1 reach <= 3.4e-5; α = 1: 0.37)
TOY_FIT = 1e-2
V1_MIN_ACCURACY = 0.8  # every ViT: val accuracy (chance 0.1); fixed before any ViT ran
_ALPHA_ONE = (
    "the standard init α = 1 (θ(0) = θ0: the products start at the teacher's scale, the "
    "small-init cause removed), trained in the same batched run (same teacher, θ0, GD and "
    "steps)"
)
_TOY_FIT = (
    "every α the claim reads fits the teacher on every seed: final loss <= "
    f"{TOY_FIT:g} × initial loss; the control α = 1 is read only on the seeds where it fits "
    "(the same bar) and fits on >= 5 seeds"
)
_T3_FIT = (
    f"the two α the claim reads fit the teacher on every seed: final loss <= {TOY_FIT:g} × "
    "initial loss"
)
_VIT_FIT = (
    "every ViT, the Adam arm and the SGD control, finished and learnt digits on every seed: "
    f"val accuracy >= {V1_MIN_ACCURACY:g} (chance 0.1)"
)
_SGD = (
    "the same ViT, seeds and steps trained by SGD with heavy-ball momentum 0.9 instead of Adam "
    "(the finding is stated for Adam; SGD's step 0.1 chosen for fit alone on calibration seed "
    "10000)"
)

PROTOCOL = Protocol(
    study="gradual-rank",
    claims=(
        ClaimSpec(
            id="t1",
            claim="the loss vs τ is stagewise at the smallest α (plateaus between sharp drops)",
            statement="with time in units of log(1/α), learning from a small init is a "
            "sequence of long plateaus and sharp loss drops",
            citation=f"{_PAPER}, Sec. 4, Fig. 2",
            metric="per seed, plateaus in loss vs τ = η t / log(1/α) at α = 1e-3 (drop: >= 30 % "
            "fall between τ and 1.05 τ)",
            threshold=3.0,
            direction=">=",
            threshold_source="theory: S10's proposal (3 teacher entries switch on in stages)",
            preconditions=(_TOY_FIT,),
            control=f"{_ALPHA_ONE}: the same count on loss vs η t",
        ),
        ClaimSpec(
            id="t2",
            claim="between consecutive plateaus at most one more entry of w_Q⊙w_K and of "
            "w_V⊙w_O switches on; every teacher entry is on at the end (α <= 1e-2)",
            statement="each drop raises the rank of both product changes by at most one; "
            "SYSTEMS.md S10: between consecutive plateaus the active count rises by <= 1",
            citation=f"{_PAPER}, Sec. 4 (Theorem on stagewise learning), Fig. 2",
            metric="per seed, max over α in {1e-2, 1e-3} and both products of the rise, "
            "between consecutive plateau midpoints, of the teacher entries past ½ of their "
            "final |Δ| (first crossing); fewer than 2 plateaus: the entries that switch on at "
            "all; NaN when an end count |Δ| > 10α is not 3",
            threshold=1.0,
            direction="<=",
            threshold_source="theory: the theorem's 'at most one'",
            preconditions=(_TOY_FIT,),
            control=f"{_ALPHA_ONE}: the same rise (every teacher entry, same reading)",
        ),
        ClaimSpec(
            id="t3",
            claim="stage times collapse in rescaled time τ as α → 0",
            statement="the curves converge as α → 0 when time is measured in units of log(1/α)",
            citation=f"{_PAPER}, Sec. 4, Fig. 2",
            metric="per seed, max over drops k of |τ_k(1e-2) − τ_k(1e-3)| / τ_k(1e-3) (NaN: drop "
            "counts differ)",
            threshold=0.2,
            direction="<=",
            threshold_source="theory: S10's proposal",
            preconditions=(_T3_FIT,),
            control="the same drop times read in raw steps t instead of τ (see the proposed "
            "amendments: a change of unit, not an ablation)",
        ),
        ClaimSpec(
            id="v1-rise",
            claim="in every layer of the ViT the head-mean stable rank of ΔW_QK rises over "
            "training",
            statement="the rank of each head's update grows during training (Adam, standard init)",
            citation=f"{_PAPER}, Sec. 5, Fig. 4",
            metric="per seed, min over layers of Spearman ρ(step, head-mean srank(Δ_QK)) over "
            "the log-points (step 0 excluded)",
            threshold=0.8,
            direction=">=",
            threshold_source="theory: S10's proposal",
            preconditions=(_VIT_FIT,),
            control=f"{_SGD}: the same ρ",
        ),
        ClaimSpec(
            id="v1-end",
            claim="ΔW_QK stays low-rank: head-mean srank(Δ_QK) at the last step <= d_head/4 in "
            "every layer",
            statement="the updates ΔW_QK stay low-rank",
            citation=f"{_PAPER}, Sec. 5, Fig. 1 and 4",
            metric="per seed, max over layers of srank(Δ_QK)_end / d_head",
            threshold=0.25,
            direction="<=",
            threshold_source="theory: S10's proposal",
            preconditions=(_VIT_FIT,),
            control=f"{_SGD}: the same srank / d_head",
        ),
    ),
    seeds={"smoke": 1, "fast": 5, "full": 5, "paper": 5},
    calibration_seeds=(10_000, 10_001, 10_002, 10_003, 10_004, 10_005, 10_006, 10_007),
    presets={
        "smoke": "toy n = d = 4, N = 32, α = 1e-2, 500 steps; ViT d_model 16, 20 steps: "
        "plumbing only",
        "fast": "toy as S10 (n = d = 8, N = 256, α in {1, 1e-1, 1e-2, 1e-3}, 8,000 GD steps, "
        "float64), 5 seeds; ViT 2 layers, d_model 32, 2 heads, Adam 1e-3, 4,000 steps "
        "(fixed from the measured step time), 5 seeds trained as one ensemble, and its SGD control "
        "(momentum 0.9, step 0.1, 5 seeds, one ensemble)",
        "full": "fast's toy (8,000 GD steps, α in {1, 1e-1, 1e-2, 1e-3}) on 10 seeds, and "
        "fast's Adam ViT (4,000 steps) and its SGD control on 5 seeds each. Sized on "
        "calibration seeds: fast's 600 CPU s went 161 s to the 5 toy seeds and 216 + 212 s to "
        "the two 5-seed ViT ensembles (10.8 ms per member-step); on seeds 10000-10007 the "
        "α = 1 control fits on 6 of 8 (final / initial loss <= 3e-8 by 30k steps) and sits "
        "at a spurious stationary point on 10000 and 10005 (0.37, 0.21, unchanged from 2k to "
        "30k steps, w_Q⊙w_K's first entry ≈ −3.6 against +2), so more steps do not help and "
        "10 toy seeds give >= 5 fitting control seeds with ~98 % probability at that rate; "
        "small α fit by 8,000 steps (<= 2e-5). The ViT keeps 5 seeds per arm for the budget",
        "paper": "toy d = 16, α down to 1e-4, 20,000 steps; ViT 6 layers, d_model 192, 3 "
        "heads (GPU; not run yet)",
    },
    reproduces="t1 and t3 at `full` (held at seeds 0 and 1000: 3.5 [3.12, 3.88] plateaus; "
    "drop times equal in τ, 0.081 / 0.074); t2 inconclusive there (1.3 [0.95, 1.65] under the "
    "midpoint reading); v1-rise and v1-end inconclusive at fast and full: the SGD control also "
    "rises and stays low-rank, so Adam is not shown to be the cause",
    registered="2026-12-07, after the earlier contract's fast verdicts at seeds 0 and 1000 "
    "were published (t1, t2, t3, v1-rise, v1-end held at both, t2 under the across-drop "
    "reading) and after the midpoint reading had given t2 = 1, 1, 2 at seeds 0-2 and "
    "1000-1002. This version registers t2's midpoint reading (S10's statement), counts the "
    "teacher's entries, replaces t2's control (the first-to-last-drop count, ≡ 3 by design) "
    "by the α = 1 arm, adds every arm's fit to the toy's preconditions, and raises fast to "
    "5 toy and 5 ViT seeds. Calibration seed 10000 (toy only) read t2 = 2 at α = 1e-2 and "
    "1e-3 under this reading, 3 on the α = 1 control",
    amendments=(
        Amendment(
            date="2026-12-01",
            claims=("t1", "t2", "t3"),
            change="the drop window read relative to τ (a >= 30 % fall between τ and 1.05 τ) "
            "instead of S10's absolute Δτ <= 0.05 (commit 3219c4d)",
            reason="τ's unit depends on the loss normalisation; the literal window finds no "
            "drop at any α",
            seen="a 20,000-step prototype run (another draw; its seed not recorded); the "
            "notes say the window was re-read before the study's first run",
        ),
        Amendment(
            date="2026-12-02",
            claims=("t2",),
            change="switch-on: |Δ entry| > 10α → past ½ of the entry's final |Δ| (α-free), "
            "counts still read at plateau midpoints (commit 0bc79ee)",
            reason="the 2026-12-02 audit: a stray w_V⊙w_O entry crosses 10α mid-plateau (its "
            "magnitude scales like α^0.27), so the 10α count is not α-free",
            seen="the pre-engine fast seed 0: 10α reading not held (ov rises by 2), ½-final "
            "reading 0 → 1 → 2 → 3",
        ),
        Amendment(
            date="2026-12-02",
            claims=("t1",),
            change="control: α = 0.1 → the standard init α = 1, added to the α grid (commit "
            "d858074)",
            reason="α = 0.1 is still a small init (stages show there too); it did not remove "
            "the mechanism",
            seen="seeds 0-2 and 1000-1002: t1 inconclusive (control α = 0.1 held: 4, 2, 3 and "
            "3, 3, 3 plateaus); calibration seeds 10000-10002 run before 0-2 with α = 1",
        ),
        Amendment(
            date="2026-12-02",
            claims=("t2",),
            change="reading: the rise between plateau midpoints → the rise across each drop "
            "(start to end); control: the rise from the first drop's start to the last "
            "drop's end (commit d858074)",
            reason="the midpoint reading charged w_V⊙w_O entries that rise during a plateau "
            "to the next drop (calibration seeds 10000-10002: across-drop 1, 1, 1)",
            seen="seeds 0-2: midpoint reading 1, 1, 2 (not held); seeds 1000-1002: 1, 1, 2",
        ),
        Amendment(
            date="2026-12-02",
            claims=("v1-rise", "v1-end"),
            change="ViT: one seed at 8,000 steps (legacy verdicts) → 3 seeds at 4,000 steps "
            "on the contract; controls shuffled log-points and an isotropic Gaussian update; "
            "precondition val accuracy >= 0.8 (commit d858074)",
            reason="the contract's per-seed claims within the fast budget (step count from "
            "the measured 6.9 ms per step)",
            seen="the one-seed ViT verdicts of the earlier session at 8,000 steps",
        ),
        Amendment(
            date="2026-12-07",
            claims=("t2",),
            change="reading: back to the rise between plateau midpoints (S10's statement), "
            "counting the teacher's entries (½-final first crossing), with fewer than 2 "
            "plateaus read as one stage; control: the first-to-last-drop count (≡ 3 by "
            "design) → the same reading on the α = 1 arm",
            reason="the across-drop reading was adopted after seeds 0-2 "
            "read 1, 1, 2 under the midpoint reading; that result stands; a control must be "
            "able to hold",
            seen="every earlier verdict at seeds 0 and 1000; the midpoint reading 1, 1, 2 at "
            "seeds 0-2 and 1000-1002",
        ),
        Amendment(
            date="2026-12-07",
            claims=("*",),
            change="fast: toy 3 → 5 seeds, ViT 3 → 5 seeds trained as one engine ensemble "
            "(float32 rounding of the ViT differs from separate runs)",
            reason=">= 5 seeds per arm for interval statuses",
            seen="every earlier verdict at seeds 0 and 1000",
        ),
        Amendment(
            date="2026-12-07",
            claims=("v1-rise", "v1-end"),
            change="controls: the log-points in a random order (|ρ| = O(1/√n) by design) and "
            "an isotropic Gaussian update (srank ≈ d_model / (4 d_head) by design) → the same "
            "ViT trained by SGD (momentum 0.9, step 0.1), 5 seeds at fast's steps, read with "
            "the same statistic; the fit precondition covers both arms",
            reason="a control must be able to hold; SGD for Adam removes the "
            "optimizer the finding names. The step was chosen on calibration seed 10000 by "
            "val accuracy alone (0.03, 0.1, 0.3 tried), before any evaluation seed ran SGD",
            seen="every earlier v1 verdict at seeds 0 and 1000 (held at both under the old "
            "controls); no SGD result at an evaluation seed",
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
            claims=("t1", "t2", "t3"),
            change="t1's and t2's precondition and control: the α = 1 control is read only "
            "on the seeds where it fits the teacher (final loss <= 1e-2 × initial; elsewhere "
            "its per-seed value is NaN) and must fit on >= 5 seeds, instead of fitting on "
            "every seed; the claimed α still fit on every seed. t3's precondition text names "
            "the two α it reads (as the analysis always checked)",
            reason="on calibration seeds 10000-10007 (plain GD, 30k steps) α = 1 sits at a "
            "spurious stationary point on 2 of 8 seeds (final / initial loss 0.37 and 0.21, "
            "the same at 2k, 8k, 16k and 30k steps; w_Q⊙w_K's first entry ≈ −3.6 where the "
            "teacher has +2): the standard init's own failure mode, not too few steps, so "
            "'every seed fits' can fail at any budget. A control seed that did not train is "
            "no evidence and is left out, as the contract asks of every arm",
            seen="the fast verdicts at seeds 0 and 1000: t1 and t2 inconclusive by this "
            "precondition (worst ratio 0.343 and 0.312, from α = 1 on 2 of 5 seeds each; every "
            "α <= 0.1 <= 2e-5); their controls read not held (t1 1, 1.6; t2 3, 2.4)",
        ),
        Amendment(
            date="2026-12-07",
            claims=("*",),
            change="a `full` preset: fast's sizes with 10 toy seeds and 5 seeds per ViT arm",
            reason="t1 and t2 need >= 5 fitting α = 1 control seeds and t3 >= 5 seeds with "
            "equal drop counts at α = 1e-2 and 1e-3 (4 of 5 at seed 1000's fast run); the ViT "
            "arms cost 10.8 ms per member-step, so they keep 5 seeds within ~12 minutes",
            seen="every fast verdict at seeds 0 and 1000 (t3 held / inconclusive 4 of 5 "
            "finite; v1-rise straddling 0.8; v1-end's SGD control held)",
        ),
        Amendment(
            date="2026-12-07",
            claims=("*",),
            change="reproduces: from what full was expected to read (written before its "
            "evaluation runs) to what it read; no size, seed, statement, metric, threshold, "
            "precondition or control changed.",
            reason="the field states which preset reproduces which claims; `study list` reads "
            "its opening clause.",
            seen="the full verdicts at seeds 0 and 1000 (t1, t3 held; t2, v1-rise, v1-end "
            "inconclusive, as expected)",
        ),
    ),
)
