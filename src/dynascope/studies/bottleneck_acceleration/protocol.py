"""The protocol of ``bottleneck-acceleration`` (S16): what decides each verdict, fixed before
the evaluation seeds run, and the log of changes made after results were seen
(:mod:`dynascope.studies.protocol`; notes: docs/studies/bottleneck-acceleration.md).

Arms per seed (``study.build_runs``): the analytic-NTK kernel GD (the all-wide net's
infinite-width limit), per width the all-wide net, and the bottleneck net (d = 4) with its
lazy twin (kernel GD with the bottleneck net's own eNTK at init, from its f_0). Every arm steps
at ``c N / λ_max(Θ_0)`` of its own kernel, c = 0.25.

Censoring: b1's claim arm, the bottleneck nets, is read by iteration and censored at
its budget: a run that never reaches the target counts budget + 1, a lower bound, which can
only make a ``<=`` claim look worse, never hold. Its control, the lazy twin, is kernel GD on
a fixed kernel, so its steps to the target are exact from the kernel's eigenbasis
(``runs.kernel_gd_steps_to_target``) and never censored: claim and control no longer read
the same budget-bound number. The detail of b1 lists the censored (seed, width) pairs.

``full`` (2026-12-07, sized on calibration seed 10000 before seeds 0 and 1000 ran at full):
fast's arms with the bottleneck nets and their lazy twins at 10k steps instead of 3k, so that
b1's claim arm is resolved, not censored. On seeds 10000-10004 every bottleneck run reached
MSE 1e-3 by step 7,368 (1,145-7,368; the kernel GD at 3,291-3,540), so 10k leaves a 1.36x
margin; the whole preset took 720 s wall, 685 s CPU on one core. No claim, metric,
threshold, precondition or control changed.

Proposed amendments (not made):

- b2's control (the all-wide nets) runs at other widths ({64, 128, 256} against
  {128, 256, 512}) and a shorter budget (1.2k against 10k steps at full) than the claim's
  arm; the same widths and budget would make it the same experiment without the bottleneck
  (at n = 512 the all-wide net costs ~40 ms a step on one core: ~7 min a seed at 10k steps).
  At these widths the all-wide middle layer moves as ~n^-0.35, so its spread over a 4x width
  range is ~1.6, close to b2's 1.5: on calibration seed 10000 (full) the control read 1.63
  [1.43, 1.82], so b2 is expected `inconclusive` at full unless the evaluation seeds separate
  it. A control that fails cleanly needs the n^-1/2 regime (spread 2), the same widths as b3.
- b3 needs widths where the all-wide net is near its lazy limit: ``paper``. Probe on
  calibration seeds 10000 and 10001 (all-wide nets, 1.2k steps): MSE / the limit's 0.58, 0.26
  at n = 256; 0.57, 0.44 at 512; 0.92, 0.97 at 1024 (within 2x only there). One seed at
  n = 1024 costs ~200 s of one core, so five (~1,000 s) do not fit ``full``'s ~12 minutes
  beside the other arms; the movement slope over n = 256-1024 was -0.37 / -0.42.
"""

from __future__ import annotations

from dynascope.studies.protocol import EDITORIAL_REWORDING, Amendment, ClaimSpec, Protocol

__all__ = ["B1_EDGE", "B2_FLOOR", "B3_LAZY", "FIT_MSE", "PROTOCOL", "VERDICT_D"]

B1_EDGE = 2.0  # GD stability: (lr/N) λ_max(Θ_t) < 2 along every bottleneck run
B2_FLOOR = 0.1  # b2's metric: every width moves by >= 0.1 (else the spread is inf)
B3_LAZY = 2.0  # b3: the widest all-wide net's MSE within this factor of its limit's
FIT_MSE = 0.1  # every net read trained: final train MSE <= 0.1 (var(y) ≈ 0.5)
VERDICT_D = 4  # the bottleneck width the claims read

_CITE = "Littwin et al. 2021, arXiv 2107.00364"
_FIT = f"every net run the claim reads finished with final train MSE <= {FIT_MSE:g}"

PROTOCOL = Protocol(
    study="bottleneck-acceleration",
    claims=(
        ClaimSpec(
            id="b1",
            claim="the bottleneck net (d=4) reaches train MSE <= 1e-3 in at most half the "
            "steps of the all-wide net's infinite-width limit (kernel GD), each at the same "
            "step in units of its own kernel at init (lr = c N / λ_max(Θ0))",
            statement="one finite bottleneck makes training much faster than in the "
            "all-infinite network (implicit acceleration)",
            citation=f"{_CITE}, Sec. 4-5 (acceleration, deep linear analysis)",
            metric="per seed, max over n of steps(bottleneck) / steps(analytic-NTK kernel GD) "
            "to train MSE 1e-3; a bottleneck run that never gets there counts budget + 1 (a "
            "lower bound)",
            threshold=0.5,
            direction="<=",
            threshold_source="S16 (at least twice as fast)",
            preconditions=(
                "the kernel GD reaches the target in every seed; GD stable at init and along "
                "every bottleneck run ((lr/N) λ_max(Θ_t) < 2); every run finished",
                _FIT + " (bottleneck nets)",
            ),
            control="the same ratio for the bottleneck net's lazy twin (kernel GD with its own "
            "eNTK at init, the same c): feature learning removed; its steps are exact, never "
            "censored",
        ),
        ClaimSpec(
            id="b2",
            claim="the bottleneck codes move by Θ(1) at every width",
            statement="the bottleneck representation moves during training and learns "
            "data-dependent features, even as width -> infinity",
            citation=f"{_CITE}, Sec. 3 (feature learning at the bottleneck)",
            metric="per seed, max over n / min over n of ||Z_T - Z_0||_F / ||Z_0||_F (inf if "
            f"any < {B2_FLOOR:g})",
            threshold=1.5,
            direction="<=",
            threshold_source="S16's proposal (Θ(1): within a factor 1.5 over a 4x width range)",
            preconditions=(_FIT + " (bottleneck and all-wide nets)",),
            control="the same spread of the all-wide net's middle-layer preactivations H (no "
            "bottleneck; widths {64, 128, 256}, 1.2k steps)",
        ),
        ClaimSpec(
            id="b3",
            claim="the all-wide net's middle-layer features freeze as width^-1/2",
            statement="in the all-infinite (NTK) limit features do not move; a finite net's "
            "hidden layer moves as width^-1/2",
            citation=f"{_CITE}, Sec. 2 (the NTK limit)",
            metric="per seed, least-squares slope of log ||H_T - H_0||_F / ||H_0||_F vs log n",
            threshold=-0.4,
            direction="<=",
            threshold_source="theory -0.5 with 0.1 of slack (S16)",
            preconditions=(
                _FIT + " (bottleneck and all-wide nets)",
                f"the widest all-wide net is near its lazy limit: its final train MSE within "
                f"a factor {B3_LAZY:g} of the analytic-NTK kernel GD's at the same step, per "
                "seed",
            ),
            control="the same slope for the bottleneck codes Z (a bottleneck added: features "
            "keep moving)",
        ),
    ),
    seeds={"smoke": 3, "fast": 5, "full": 5, "paper": 5},
    calibration_seeds=(10000, 20000),
    presets={
        "smoke": "n in {32, 64} (all-wide {16, 256}), N = 32, 200 / 120 / 800 steps, 3 seeds: "
        "plumbing only (every verdict inconclusive)",
        "fast": "bottleneck n in {128, 256, 512} for 3k steps, all-wide n in {64, 128, 256} "
        "for 1.2k, kernel GD 5k, c = 0.25 (fixed on calibration seeds 10000-10002 and "
        "20000-20002 as the largest of 1, 1/2, 1/4 keeping every run off the edge of "
        "stability), 5 seeds",
        "full": "fast's arms with the bottleneck nets and their lazy twins at 10k steps (3k at "
        "fast): all-wide n in {64, 128, 256} for 1.2k, kernel GD 5k, c = 0.25, 5 seeds. Sized "
        "on calibration seeds 10000-10004 (full, before seeds 0 and 1000 ran at full): every "
        "bottleneck run reached MSE 1e-3 by step 7,368 (range 1,145-7,368; kernel GD 3,291-3,540), "
        "so no b1 value is censored and 10k leaves a 1.36x margin; 720 s wall, 685 s CPU on one "
        "core. The all-wide widths stay fast's: n = 512 would add ~210 s for 5 seeds, and the "
        "widest all-wide net (n = 256) was 1.1-6.7x faster than its limit there (b3's "
        "precondition: within 2x), so b3 is left to paper",
        "paper": "n in {256, 1024, 4096, 16384}, d in {1, 2, 4, 8}, 8k / 1.2k / 16k steps, 5 "
        "seeds (GPU)",
    },
    reproduces="none yet: at fast b1's bottleneck runs are censored at 3k steps and b3's "
    "all-wide nets are not lazy (needs paper's widths). Expected at full (calibration seed "
    "10000): b1 not held, resolved (1.52 [0.91, 2.13], no run censored: at the same step in "
    "kernel units the bottleneck net needs 1.0-2.2x the limit's steps, not <= 0.5x), its lazy "
    "twin not held (11.1); b2 inconclusive (1.27 [1.05, 1.49], but its control, the all-wide "
    "spread, 1.63 [1.43, 1.82], cannot be told from 1.5); b3 inconclusive (precondition: the "
    "n = 256 all-wide net's MSE 0.15-0.87 of its limit's)",
    registered="2026-12-07: converted to the interval contract after the fast "
    "verdicts at seeds 0 and 1000 (3 seeds, c = 0.25) had been seen: b1 not held (>= 0.830 / "
    ">= 0.828, censored; lazy twin the same censored value), b2 held (1.36 / 1.35), b3 "
    "inconclusive (not lazy)",
    amendments=(
        Amendment(
            date="2026-12-02",
            claims=("b1",),
            change="b1's reference: the finite all-wide net -> the analytic-NTK kernel GD (its "
            "infinite-width limit); control: the bottleneck's lazy twin (commit 450bd6c)",
            reason="the 2026-12-02 audit: the all-wide nets at n = 128-256 train 2.4x faster than "
            "their linearized twins (not lazy), so they are not the all-infinite network",
            seen="fast verdicts of commit d3d01b4 (2 of 3 held)",
        ),
        Amendment(
            date="2026-12-02",
            claims=("b3",),
            change="new precondition: the widest all-wide net's final MSE within 2x of the "
            "analytic-NTK kernel GD's (commit c939a91)",
            reason="the n^-1/2 law is a lazy-regime statement; the nets were measured not lazy",
            seen="seed 0 fast (commit 90ea9f6): b3 not held (-0.31, -0.39, -0.34)",
        ),
        Amendment(
            date="2026-12-02",
            claims=("b1", "b2", "b3"),
            change="every arm's lr 1.0 -> c N / λ_max(Θ_0) of its own kernel, c = 0.25 from "
            "calibration seeds; budgets 4k / 2k / 8k -> 3k / 1.2k / 5k steps; b1 precondition "
            "off the edge of stability (commit cfebe8a)",
            reason="equal lr mixed kernel scale with feature learning ((lr/N) λ_max 0.138 for "
            "the limit against 0.24-0.56 for the bottleneck nets)",
            seen="fast at seeds 0 and 1000, lr 1.0 (commit 50c070f): b1 not held 0.522 / held "
            "0.438, b2 held, b3 inconclusive",
        ),
        Amendment(
            date="2026-12-07",
            claims=("b1", "b2", "b3"),
            change="interval statuses over 5 seeds per arm at fast (3 before); fit "
            f"preconditions (final train MSE <= {FIT_MSE:g}) on every net read; b1's control, "
            "the lazy twin, read exactly from its kernel's eigenbasis instead of censored at "
            "the 3k-step budget",
            reason="claim and control both censored at 3k steps read the same "
            "number (0.83 = 0.83); every arm read must have trained",
            seen="fast verdicts at seeds 0 and 1000 (registered above)",
        ),
        EDITORIAL_REWORDING,
        Amendment(
            date="2026-12-07",
            claims=("b1", "b2", "b3"),
            change="new preset full: fast's arms and seeds per arm (5), the bottleneck nets and "
            "their lazy twins at 10k steps (3k at fast); no statement, metric, statistic, "
            "threshold, precondition or control changed",
            reason="at fast b1's claim arm was censored at 3k steps (10 of 15 and 7 of 15 "
            "(seed, width) pairs at seeds 0 and 1000), so its ratio was a lower bound; on "
            "calibration seeds 10000-10004 every bottleneck run reached the target by step "
            "7,368",
            seen="fast verdicts at seeds 0 and 1000 (b1 not held 0.84 [0.77, 0.92] / "
            "inconclusive 0.81 on the fit precondition, worst 0.109; b2 inconclusive 1.26 "
            "[0.96, 1.57] / 1.32 on the fit precondition; b3 inconclusive, not lazy, factor "
            "3.9 / 3.1) and the full calibration at seed 10000 (b1 1.52 [0.91, 2.13], b2 1.27 "
            "[1.05, 1.49] with control 1.63 [1.43, 1.82], b3 not lazy, factor 6.7)",
        ),
    ),
)
