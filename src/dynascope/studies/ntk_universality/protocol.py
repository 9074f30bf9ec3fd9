"""The protocol of ``ntk-universality`` (S17): what decides each verdict, fixed before the
evaluation seeds run, and the log of changes made after results were seen
(:mod:`dynascope.studies.protocol`; notes: docs/studies/ntk-universality.md).

Arms (``study.build_runs``): every architecture x width x seed in NTK parametrization (the
claims) and the same nets, same data and weight draw, in muP (output x n^-1/2, GD step x n:
the ablation; ``runs`` glossary). Each claim's control is its own metric's slope on the muP
arm: the same experiment with the cause of kernel behaviour, the NTK scaling, removed.

Proposed amendments (not made: they could flip a verdict, so each must be fixed
on calibration seeds and re-tested on fresh seeds):

- u2-mlp: its per-seed slopes spread widely (-0.33 to -1.19 at seeds 0-4), so the interval at
  5 seeds may straddle -0.4. More seeds, or widths up to 1024, would narrow it.
"""

from __future__ import annotations

from dynascope.studies.protocol import EDITORIAL_REWORDING, Amendment, ClaimSpec, Protocol

__all__ = ["FIT_MAX", "KGD_STABLE", "MIN_WIDTH_SPAN", "PROTOCOL"]

FIT_MAX = 0.5  # every run's final train MSE at most half its initial MSE
KGD_STABLE = 2.0  # kernel-GD stability: (eta / N) lambda_max(Theta_0) < 2 in every run
MIN_WIDTH_SPAN = 4.0  # w_max / w_min (a slope of -0.4 is then a factor >= 1.7)

_CITE = "Yang & Littwin 2021, arXiv 2105.03703, Thm. 2.2 and Sec. 2 (NTK universality)"
_STATEMENT = (
    "any architecture expressible as a Tensor Program, in NTK parametrization and trained by "
    "SGD, follows kernel GD with the fixed infinite-width NTK as width -> infinity"
)
_PRE = (
    f"every run of the architecture, NTK and muP, every width and seed, finished and fit its "
    f"targets (final / initial train MSE <= {FIT_MAX:g})",
    f"kernel GD stable at init in every run ((eta/N) lambda_max(Theta_0) < {KGD_STABLE:g})",
    f"widths span w_max / w_min >= {MIN_WIDTH_SPAN:g}",
)
_ARCH = {"mlp": "MLP", "rnn": "Elman RNN", "attention": "attention net"}
_WHAT = {
    "u1": ("sup_t relative eNTK change", "sup over steps {0, 1, 3, 10, 30, 100, 200} of "
           "||Theta_t - Theta_0||_F / ||Theta_0||_F"),
    "u2": ("sup_t ||f_t - f_t^kGD||_2", "sup_t ||f_t - f_t^kGD||_2 on the N training outputs, "
           "the kernel-GD twin with the net's own Theta_0 from its f_0"),
}  # fmt: skip


def _claim(tag: str, arch: str) -> ClaimSpec:
    short, metric = _WHAT[tag]
    return ClaimSpec(
        id=f"{tag}-{arch}",
        claim=f"{short} shrinks with width at least like width^-0.4",
        statement=_STATEMENT + f" ({_ARCH[arch]})",
        citation=_CITE,
        metric=f"per seed, least-squares slope of log({metric}) vs log(width)",
        threshold=-0.4,
        direction="<=",
        threshold_source="theory, before the first run: -0.5 (Theta_0's fluctuation) with "
        "0.1 of slack (S17)",
        preconditions=_PRE,
        control="the same slope for the same nets (same data, weights, widths and steps) in "
        "muP, the NTK net with its output x n^-1/2 and its GD step x n: the same kernel-GD "
        "speed at init, but features move by Theta(1), so the kernel regime is removed",
    )


PROTOCOL = Protocol(
    study="ntk-universality",
    claims=tuple(_claim(t, a) for t in ("u1", "u2") for a in ("mlp", "rnn", "attention")),
    seeds={"smoke": 3, "fast": 5, "full": 8, "paper": 10},
    calibration_seeds=(10000, 20000, 30000, 40000),
    presets={
        "smoke": "widths {16, 64}, N = 4, 10 steps, 3 seeds: plumbing only (every verdict "
        "inconclusive)",
        "fast": "widths {64, 128, 256, 512} x 5 seeds x {NTK, muP}, N = 16, 200 steps; width "
        "1024 left to paper for the time budget before any verdict was seen",
        "full": "{NTK, muP} x 200 steps, N = 16, lr 0.5: MLP widths {64, ..., 1024} x 24 seeds, "
        "RNN and attention widths {64, ..., 512} x 8 seeds, attention tokens d_in = 32. Sized "
        "on calibration seeds 30000-30009 (10 seeds, MLP to width 1024, attention with "
        "1/sqrt(n) logits): u2-mlp's per-seed slopes over 64-1024 had mean -0.56, sd 0.25 "
        "(-0.47 over 128-1024), so 24 seeds give ~85 % power for an interval below -0.4 "
        "(22 for 80 %, 28 for 90 %); u1-mlp, u1/u2-rnn means -0.86 to -0.93, sd 0.12-0.22 "
        "(5 seeds suffice; 8 taken); ~880 s of one loaded core estimated from that run's "
        "per-run seconds (MLP 20 s, RNN 17 s, attention 27 s per seed, both arms). Attention: "
        "with 1/n logits Theta_0 at width 512 has rank d_in (8 eigenvalues above 1e-3 "
        "lambda_max, the rest ~1e-4; seeds 20000-20002), so at d_in = 8 < N = 16 kernel GD "
        "cannot fit below ~0.5-0.6 of the initial MSE; d_in = 32 > N lets it. 1/sqrt(n) logits "
        "(full rank) were tried on seeds 30000-30009 and left no kernel regime (u1 slope "
        "-0.22, u2 -0.07), so 1/n stays. d_in = 32 on seeds 40000-40009 (attention only, 10 "
        "seeds, 236 s): worst fit 0.25 (NTK), u1 -0.87 [-0.95, -0.78], u2 -0.89 [-1.05, "
        "-0.74], muP controls +0.02 and -0.00",
        "paper": "widths 64..8192, 10 seeds, float64 (GPU)",
    },
    reproduces="full (all six claims held at seeds 0 and 1000, muP controls not held; u2-mlp "
    "-0.56 against -0.4 is the marginal one); fast for the MLP and the RNN only: attention's "
    "NTK nets at d_in = 8 do not fit (u1/u2-attention inconclusive there)",
    registered="2026-12-07: converted to the interval contract after the verdicts "
    "at seeds 0 and 1000 (5 seeds each) had been seen: all six held at both under the mean + "
    "2/3-of-seeds rule, u2-mlp with 4 of 5 seeds passing (3 of 5 at a fresh "
    "seed set); calibration seed 10000 was run for the muP arm and the fit bar only",
    amendments=(
        Amendment(
            date="2026-12-02",
            claims=("u1-mlp", "u1-rnn", "u1-attention", "u2-mlp", "u2-rnn", "u2-attention"),
            change="fast 3 -> 5 seeds; slopes judged per seed (mean and 2/3 of seeds) instead "
            "of the slope of the seed means; the claim's wording 'like width^-1/2' -> 'at "
            "least like width^-0.4' (threshold unchanged) (commit 623e10d)",
            reason="the 2026-12-02 audit: 3 seeds of the MLP's u2 moved its slope from -0.41 "
            "(seeds 0-2) to -0.75 (seeds 3-5)",
            seen="fast verdicts of commit d3d01b4 at seeds 0-2 (6 of 6 held; u2-mlp slope "
            "of seed means -0.41)",
        ),
        Amendment(
            date="2026-12-07",
            claims=("u1-mlp", "u1-rnn", "u1-attention", "u2-mlp", "u2-rnn", "u2-attention"),
            change="every control (the slope of sup_t ||f_t - f_0||, the distance to the "
            "untrained twin, O(1) by design) -> the same claim's slope on a muP arm (new runs, "
            "same data and weights); fit precondition on every run of both arms; interval "
            "status over the 5 per-seed slopes (was mean + 2/3 of seeds)",
            reason="a control must be an ablation that could hold",
            seen="fast verdicts at seeds 0 and 1000 (registered above)",
        ),
        EDITORIAL_REWORDING,
        Amendment(
            date="2026-12-07",
            claims=("*",),
            change="new preset full (seeds per arm 8, MLP 24; MLP widths to 1024; sizes in "
            "presets['full']); no statement, metric, statistic, threshold, precondition or "
            "control changed",
            reason="u2-mlp's interval straddled -0.4 at fast (5 seeds); the seed count "
            "and width range were chosen on calibration seeds 30000-30009 to exclude it",
            seen="fast verdicts at seeds 0 and 1000 (u2-mlp inconclusive at both: -0.75 "
            "[-1.21, -0.30] and -0.59 [-0.84, -0.35]; u1/u2-attention inconclusive on the fit "
            "precondition, worst fit 0.69 and 0.71)",
        ),
        Amendment(
            date="2026-12-07",
            claims=("u1-attention", "u2-attention"),
            change="at full only, the attention net's tokens have width d_in = 32 (was 8; "
            "fast and smoke keep 8); logits keep 1/n",
            reason="with 1/n logits the attention eNTK at width is a linear kernel on the mean "
            "token, rank d_in (measured on calibration seeds 20000-20002, width 512: 8 "
            "eigenvalues above 1e-3 lambda_max, the rest ~1e-4), so 16 random targets cannot "
            "be fit below ~0.5-0.6 of their MSE at d_in = 8 and the fit precondition fails by "
            "construction as width grows; 1/sqrt(n) logits, the other option, left no kernel "
            "regime on calibration seeds 30000-30009 (u1 slope -0.22, u2 -0.07)",
            seen="fast verdicts at seeds 0 and 1000 (attention worst fit 0.69 and 0.71, so "
            "u1/u2-attention inconclusive; slopes -1.07/-1.01 and -0.98/-0.95)",
        ),
        Amendment(
            date="2026-12-07",
            claims=("*",),
            change="reproduces: from the calibration numbers and what full was expected to "
            "read to what it read; no size, seed, statement, metric, threshold, precondition "
            "or control changed.",
            reason="the field states which preset reproduces the finding; `study list` reads "
            "its opening clause, which still said fast.",
            seen="the full verdicts at seeds 0 and 1000 (all six held, controls not held)",
        ),
    ),
)
