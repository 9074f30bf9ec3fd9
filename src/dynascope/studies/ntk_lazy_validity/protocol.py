"""The protocol of ``ntk-lazy-validity`` (SYSTEMS.md S11): each claim's statistic, threshold,
preconditions and ablation control, fixed before its evaluation seeds run
(:mod:`dynascope.studies.protocol`).

Proposed amendment (not made): n2's control is the same exponent on the early window
T in [0.01, 0.1] of the same runs, a regime contrast rather than an ablation; the uncentered
net cannot serve (its D does not fall with alpha, so the exponent p = c / -b is undefined).
A control that removes the cause of n2 at the same budget has not been designed yet.

Proposed amendment (not made: it would flip the seed-1000 verdicts, so it needs fresh seeds
first): the training bar ``FIT_MAX = 0.5`` sits inside the spread of what the centered nets
reach at T = 50, because it depends on the random kernel's small eigenvalues, not on whether
GD ran: calibration seeds 10000-10004 read 0.37-0.475 (worst per seed), evaluation seeds
0-4 at most 0.375, and seeds 1000-1004 0.30-0.512 (seed 1004: 0.512, so every claim read
inconclusive there). A bar that says "trained" without that spread would compare the net
with its own linear twin (e.g. ``||alpha h(T) - f*|| <= 1.1 ||alpha hbar(T) - f*||``, the twin
being GD on the same kernel) or ask for a fixed fraction of the twin's residual drop.
"""

from __future__ import annotations

from dynascope.studies.protocol import Amendment, ClaimSpec, Protocol

__all__ = ["EARLY", "FIT_MAX", "N1_ALPHAS", "ORACLE_MAX", "PROTOCOL"]

_PAPER = "Boix-Adserà & Littwin, TMLR 2023, arXiv 2305.13141"
N1_ALPHAS = (8.0, 16.0, 32.0, 64.0, 128.0)
EARLY = (0.01, 0.1)  # t << 1: D ~ t^2 / alpha (second order), p = 2 there (n2's control)
ORACLE_MAX = 1e-10
# ||alpha h(T) - f*|| / ||alpha h(0) - f*|| <= 0.5, every gated alpha, arm and seed: GD made
# progress on the targets. From calibration seeds 10000-10001 (centered 0.37-0.42: a kernel
# with small eigenvalues, N = 32 random targets are not fitted by T = 50; uncentered <= 0.11)
FIT_MAX = 0.5

_INSTRUMENT = (
    "every run finished, GD is stable (eta lambda_max(K) < 2) and the twin equals its closed "
    f"form f* - (I - eta K)^t (f* - alpha h(w0)) to {ORACLE_MAX:g}"
)
_FIT = (
    f"every arm the claim reads trained: GD at least halved its residual by T, ||alpha h(T) "
    f"- f*|| / ||alpha h(0) - f*|| <= {FIT_MAX:g} for every alpha in {{8..128}}, per arm and "
    "per seed (the targets are not fitted by T = 50 at this width; the claim is about the "
    "trajectory, not the fit)"
)
_UNCENTERED = (
    "the uncentered net h = g (h(w0) != 0, so alpha h(w0) and the initial residual grow with "
    "alpha: the cause of the 1/alpha, S11's h(w0) = 0, removed), same seeds, alphas, data, GD "
    "and T: the same slope of log D(alpha, T) vs log alpha"
)
_EARLY = (
    f"the same exponent fitted on the early window T in [{EARLY[0]:g}, {EARLY[1]:g}] of the "
    "same runs, where the gap is second order in t (D ~ t^2 / alpha, p = 2 derived; not an "
    "ablation: see the proposed amendment)"
)


def _claims(tag: str, centering: str) -> tuple[ClaimSpec, ClaimSpec]:
    return (
        ClaimSpec(
            id=f"n1{tag}",
            claim="the gap to the linearized twin falls at least like 1/alpha "
            f"(D(alpha, T) <= C T / alpha; {centering} centering)",
            statement="D(alpha, T) = sup_{t <= T} ||alpha h(w(t)) - alpha hbar(wbar(t))|| "
            "<= C T / alpha (Lip(Dh) and the initial residual in C)",
            citation=f"{_PAPER}, Theorem 1.1 / Sec. 3; SYSTEMS.md S11",
            metric="per seed, least-squares slope of log D(alpha, T) vs log alpha (T = 50 at fast, "
            "100 at full) over "
            "alpha in {8, 16, 32, 64, 128}",
            threshold=-0.9,
            direction="<=",
            threshold_source="theory: the bound's slope -1 with 0.1 tolerance (set in the "
            "2026-12-02 audit), fixed before the fast seeds ran",
            preconditions=(_INSTRUMENT, _FIT),
            control=_UNCENTERED,
        ),
        ClaimSpec(
            id=f"n2{tag}",
            claim="alpha = O(T) suffices: the alpha that keeps D below a tolerance grows at "
            f"most linearly in T ({centering} centering)",
            statement="alpha = O(T) suffices for the NTK approximation up to time T (the "
            "earlier analysis needed alpha = O(T^2)); the T / alpha rate is tight",
            citation=f"{_PAPER}, abstract and Sec. 3; SYSTEMS.md S11",
            metric="per seed, p in alpha*(T) ~ T^p from a joint fit log D = a + b log alpha + "
            "c log T over alpha in {8..128} and 20 log-spaced T in [1, T] (T = 50 at fast, 100 "
            "at full), p = c / -b",
            threshold=1.1,
            direction="<=",
            threshold_source="theory: the theorem's p = 1 with S11's 0.1 tolerance (the "
            "earlier bound gives 2); the window [1, 50] fixed before measuring (D ~ t^2 early)",
            preconditions=(_INSTRUMENT, "this centering's arm trained (the bar of n1)"),
            control=_EARLY,
        ),
    )


PROTOCOL = Protocol(
    study="ntk-lazy-validity",
    claims=(*_claims("", "antisymmetric"), *_claims("-offset", "offset")),
    seeds={"smoke": 3, "fast": 5, "full": 5, "paper": 5},
    calibration_seeds=(10_000, 20_000),
    presets={
        "smoke": "width 16, N = 8, alpha in {8, 16, 32}, 100 steps (T = 1), 3 seeds: plumbing",
        "fast": "S11's system: width 256, d = 5, N = 32, alpha in {4..128}, eta = 1e-2, "
        "T = 50 (5,000 steps), float64; antisymmetric, offset and the uncentered control, "
        "5 seeds",
        "full": "fast's system and arms at T = 100 (10,000 steps), 5 seeds: twice fast's T so "
        "that every arm clears the fit bar with margin (calibration seeds 20000-20004: worst "
        "ratio 0.322 against 0.5; fast's T = 50 read 0.37-0.475 on 10000-10004 and 0.512 on "
        "seed 1004); 692 s on one core (the other busy)",
        "paper": "width 1024, alpha up to 1024 on a x2 grid, T = 500, 5 seeds, the eta/2 "
        "gradient-flow check",
    },
    reproduces="`full` (every arm clears the fit bar with margin at T = 100; at `fast`, T = 50, "
    "the bar sits inside the seeds' spread, so a seed set can read inconclusive)",
    registered="2026-12-07, after the earlier contract's fast verdicts at seeds 0 and 1000 "
    "were published (n1, n2, n1-offset, n2-offset held at both: n1 -1.99 / -1.96, n1-offset "
    "-1.00 / -1.02, n2 0.75 / 0.80, n2-offset 0.82 / 0.92; movement controls ~0, early "
    "controls 1.4-2.0) and calibration seeds 10000-10001 chose the training bar (they read "
    "n1 -1.98 / -1.96, n1-offset -0.94 / -1.02, n2 0.88 / 0.93, n2-offset 1.19 / 0.91, the "
    "uncentered control's slope +0.88 / +0.86). This version replaces "
    "n1's and n1-offset's control (the slope of the function's own movement, O(1) by design) "
    "by the uncentered net, adds the fit of every arm to the preconditions, and raises fast "
    "from 3 to 5 seeds",
    amendments=(
        Amendment(
            date="2026-12-01",
            claims=("n1-offset", "n2-offset"),
            change="the offset centering added as a second gated arm (commit d3d01b4)",
            reason="the antisymmetric D fell like 1/alpha^2 (its second-order term cancels), "
            "so the flatness test of alpha D could not pass for it; S11 asks for both "
            "centerings to be offered",
            seen="the first smoke run at seed 0 (antisymmetric D ~ 1/alpha^2)",
        ),
        Amendment(
            date="2026-12-02",
            claims=("n1", "n2", "n1-offset", "n2-offset"),
            change="n1: max/min of alpha D(alpha, 50) <= 2 -> slope of log D vs log alpha "
            "<= -0.9; n2: max over alpha of the slope of log D vs log T on [1, 50] <= 1.1 -> "
            "the joint-fit exponent p of alpha*(T) ~ T^p <= 1.1; the oracle claim n0 became a "
            "precondition; 1 -> 3 seeds; the eta/2 check moved to paper (commit 2266c38)",
            reason="the theorem is an upper bound: a D that falls faster than 1/alpha agrees "
            "with it, and a two-sided flatness test fails the better-behaved model (the 2026-12-02 "
            "audit)",
            seen="fast seed 0: antisymmetric n1 ratio 15.6 and n2 slopes 1.54-1.56 (both "
            "failed); offset n1 ratio 1.22 and n2 slopes 0.83-0.93 (held)",
        ),
        Amendment(
            date="2026-12-07",
            claims=("n1", "n1-offset"),
            change="control: the slope of sup ||alpha h(t) - alpha h(0)|| (O(1) at every alpha "
            "by design) -> the uncentered net's D slope (a new arm, 5 seeds)",
            reason="a control must be the cause removed and able to hold",
            seen="every earlier verdict at seeds 0 and 1000 (all held)",
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
            claims=("n1", "n2", "n1-offset", "n2-offset"),
            change="a `full` preset: fast's system, arms, alphas, thresholds, bar and controls "
            "at T = 100 (10,000 steps), 5 seeds; n1 reads D at the preset's T and n2 fits "
            "over [1, T]; calibration seeds 20000-20004 added",
            reason="fast's fit bar (GD halves the residual by T = 50) sits inside the seeds' "
            "spread (calibration 0.37-0.475, seed 1004 0.512), so a seed set can read "
            "inconclusive for the kernel's small eigenvalues, not for a failure to train; at "
            "T = 100 calibration seeds 20000-20004 read a worst ratio of 0.322 (n1 -1.98, "
            "n1-offset -1.09, n2 0.63, n2-offset 0.61; controls 0.86, 1.40, 1.96, not held)",
            seen="the fast verdicts at seeds 0 (every claim held) and 1000 (every claim "
            "inconclusive through the fit bar, 0.512); no full result at seeds 0 or 1000",
        ),
    ),
)
