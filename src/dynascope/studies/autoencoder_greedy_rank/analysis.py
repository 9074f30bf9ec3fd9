"""Verdicts of ``autoencoder-greedy-rank`` on the verdict contract (claims, metrics, thresholds
and how they were fixed: docs/studies/autoencoder-greedy-rank.md)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dynascope.probes.spectral import effective_rank
from dynascope.store import Run
from dynascope.studies.base import Analysis
from dynascope.studies.verdict import Control, Precondition, Verdict, judge

from .figures import figures
from .runs import MODE_CUTOFF, RANK_TOL, AutoencoderRun

__all__ = [
    "GREEDY_DEPTHS",
    "ORDER_MIN",
    "OVERLAP_MAX",
    "analyze",
    "measure_run",
    "verdicts_from_runs",
]

GREEDY_DEPTHS = (2, 4, 8)
# r2: a greedy learner has the next singular value of the data-subspace map M_A at most
# OVERLAP_MAX when mode k's crosses 1/2. Non-greedy reference (each mode relaxes as
# 1 - exp(-c lambda_i t), no plateau): when mode k is at 1/2, mode k+1 is at
# 1 - 2^(-lambda_{k+1}/lambda_k) >= 1 - 2^(-1/2) = 0.293 for the variances (5, 4, 3, 2, 1);
# 0.25 lies below every such value. Fixed before any seed ran (issue 18's first pass).
OVERLAP_MAX = 0.25
# o: the fraction of PC pairs (i < j) whose gains cross 1/2 in order of variance. A random order
# gives 1/2 on average; 0.8 allows two adjacent swaps out of the 10 pairs (close variances 5:4,
# 4:3 are separated by ~25% in time, as much as the random init moves them). Fixed on the
# calibration seeds (10000) before seeds 0 and 1000 ran.
ORDER_MIN = 0.8
NAN = float("nan")


def _first_step(steps: np.ndarray, mask: np.ndarray) -> float:
    """The first step where ``mask`` holds (NaN if never)."""
    hits = np.flatnonzero(mask)
    return float(steps[hits[0]]) if hits.size else NAN


def _pairs_in_order(t: list[float], order: list[int]) -> float:
    """Fraction of pairs ``i < j`` (in ``order``'s ranking) with ``t[order[i]] < t[order[j]]``;
    a NaN time counts as out of order."""
    pairs = [(order[i], order[j]) for i in range(len(order)) for j in range(i + 1, len(order))]
    return sum(bool(t[a] < t[b]) for a, b in pairs) / len(pairs) if pairs else NAN


def measure_run(name: str, run: Run) -> dict[str, Any]:
    """What the verdicts need from one run (NaN where not measurable).

    ``t[k]``: first logged step with ``sigma_{k+1}(M_A) > 0.5`` (k+1 learnt modes, rotation
    invariant); ``overlap``: the largest ``sigma_{k+2}(M_A)`` at ``t[k]``; ``t_pc[k]``: first
    step with data PC k+1's gain ``a^T P a > 0.5``; ``in_order``: the fraction of PC pairs
    learnt in order of variance, ``shuffled``: the same against a random order of the PCs
    (drawn from the run's seed); ``rank_t5``: the held-out latent rank_1e-2 at the first
    latent measurement at or after ``t[r-1]``.
    """
    cfg = AutoencoderRun.model_validate(run.config)
    r = len(cfg.variances)
    row: dict[str, Any] = {
        "run": name, "L": cfg.n_stack, "init": cfg.init, "s": cfg.init_scale, "seed": cfg.seed,
        "arm": cfg.arm, "status": run.status, "r": r, "d_latent": cfg.d_latent,
        "steps": cfg.loop.steps,
    }  # fmt: skip
    keys = ("count_init", "count_final", "t_r", "overlap", "in_order", "shuffled", "rank_init")
    row.update(dict.fromkeys(keys, NAN), rank_t5=NAN, rank_final=NAN, erank_min=NAN)
    row.update(data_rank=NAN, t=[NAN] * r, t_pc=[NAN] * r, loss_final=NAN)
    try:
        steps, msig = run.tensors("modes.sigma")  # [T, r], descending
        _, gain = run.tensors("modes.gain")  # [T, r], along data PCs 1..r
        lat_steps, spectrum = run.tensors("latent.spectrum")
    except KeyError:
        return row
    counts = (msig > MODE_CUTOFF).sum(axis=1)
    t = [_first_step(steps, msig[:, k] > MODE_CUTOFF) for k in range(r)]
    at = [None if math.isnan(tk) else int(np.flatnonzero(steps == tk)[0]) for tk in t]
    overlaps = [float(msig[i, k + 1]) for k, i in enumerate(at[:-1]) if i is not None]
    t_pc = [_first_step(steps, gain[:, k] > MODE_CUTOFF) for k in range(r)]
    shuffled = [int(i) for i in np.random.default_rng(cfg.seed).permutation(r)]
    if shuffled == list(range(r)):
        shuffled = shuffled[::-1]
    ranks = (spectrum > RANK_TOL).sum(axis=1)
    after = np.flatnonzero(lat_steps >= t[-1]) if not math.isnan(t[-1]) else np.array([])
    erank = effective_rank(torch.as_tensor(spectrum, dtype=torch.float64)).numpy()
    later = lat_steps >= 1
    row.update(
        count_init=float(counts[0]),
        count_final=float(counts[-1]) if run.status == "finished" else NAN,
        t=t,
        t_r=t[-1],
        overlap=max(overlaps) if len(overlaps) == r - 1 else NAN,
        t_pc=t_pc,
        in_order=_pairs_in_order(t_pc, list(range(r))),
        shuffled=_pairs_in_order(t_pc, shuffled),
        rank_init=float(ranks[0]),
        rank_t5=float(ranks[after[0]]) if after.size else NAN,
        rank_final=float(ranks[-1]),
        erank_min=float(erank[later].min()) if later.any() else NAN,
        data_rank=float(run.last("data.rank_1e-2")),
        loss_final=float(run.last("train.loss")),
    )
    return row


def _arm(rows: list[dict], L: int, init: str, arm: str = "greedy") -> dict[int, dict]:
    """seed -> the run at depth L and init; orthogonal stacks (L > 0) of the given arm."""
    return {
        w["seed"]: w
        for w in rows
        if w["L"] == L and w["init"] == init and (L == 0 or init != "orthogonal" or w["arm"] == arm)
    }


def _per_seed(arms: list[dict[int, dict]], fn: Any) -> dict[int, float]:
    """seed -> fn(rows of that seed, one per arm); NaN if a seed misses an arm."""
    seeds = sorted(set().union(*arms)) if arms else []
    out = {}
    for seed in seeds:
        got = [a.get(seed) for a in arms]
        out[seed] = NAN if any(w is None for w in got) else float(fn(got))
    return out


def _learnt_all(arms: list[dict[int, dict]], r: int) -> Precondition:
    """Every run of the arms finished and learnt all r data modes (the budget covered the
    plateaus); measured: the fewest learnt modes."""
    rows = [w for a in arms for w in a.values()]
    fewest = min((w["count_final"] for w in rows), default=NAN)
    done = bool(rows) and all(w["status"] == "finished" for w in rows)
    return Precondition(
        f"every judged run finished with all {r} data modes learnt (σ_i(M_A) > {MODE_CUTOFF}): "
        "the budget covered the plateaus",
        done and bool(fewest >= r),
        fewest,
    )


def _max_rise(ws: list[dict]) -> float:
    mins = [w["erank_min"] for w in ws]
    return max(b - a for a, b in zip(mins, mins[1:]))


def _scales(arms: list[dict[int, dict]]) -> str:
    return "/".join(sorted({f"{w['s']:.3g}" for a in arms for w in a.values()})) or "n/a"


def verdicts_from_runs(runs: dict[str, Run]) -> tuple[list[Verdict], list[dict]]:
    """Verdicts r1, r2, o, r3, r4 and d, and one measured row per run."""
    rows = [measure_run(name, run) for name, run in sorted(runs.items())]
    rows.sort(key=lambda w: (w["init"] != "orthogonal", w["L"], w["s"], w["seed"]))
    r, d_latent = rows[0]["r"], rows[0]["d_latent"]
    depths = sorted({w["L"] for w in rows if w["init"] == "orthogonal" and w["L"] > 0})
    judged = [L for L in GREEDY_DEPTHS if L in depths] or depths
    greedy = [_arm(rows, L, "orthogonal") for L in judged]
    control = [_arm(rows, L, "orthogonal", "control") for L in judged]
    s_control = f"s = {_scales(control)} (the small-init spectral prior removed)"
    learnt = _learnt_all(greedy, r)
    depth_list = "{" + ", ".join(map(str, judged)) + "}"
    by_run = "; ".join

    def worst(key: str, fn: Any = max) -> Any:
        return lambda ws: fn(w[key] for w in ws)

    def rank_gap(ws: list[dict]) -> float:
        return max(abs(w["rank_t5"] - r) for w in ws)

    verdicts = [
        judge(
            claim=f"r1: with L in {depth_list} (orthogonal, small s from theory, equal-time step) "
            f"the latent code reaches the true rank {r} and no more (the noise floor not learnt)",
            metric=f"max over L of |held-out latent rank_1e-2 - {r}| at t_{r} (the first step "
            f"with {r} learnt data modes)",
            per_seed=_per_seed(greedy, rank_gap),
            threshold=0.0,
            direction="<=",
            precondition=learnt,
            control=Control(f"the same at {s_control}", per_seed=_per_seed(control, rank_gap)),
            rule="all_seeds",
            detail="latent rank_1e-2 at step 0 / t_5 / end: "
            + by_run(
                f"{w['run']} {w['rank_init']:g}/{w['rank_t5']:g}/{w['rank_final']:g}"
                for a in greedy
                for w in a.values()
            ),  # fmt: skip
        ),
        judge(
            claim=f"r2: with L in {depth_list} (small s) the data modes are learnt one at a time",
            metric=f"max over L and k of σ_(k+1)(M_A) at t_k, t_k = first step σ_k(M_A) > "
            f"{MODE_CUTOFF}",
            per_seed=_per_seed(greedy, worst("overlap")),
            threshold=OVERLAP_MAX,
            direction="<=",
            precondition=learnt,
            control=Control(
                f"the same at {s_control}", per_seed=_per_seed(control, worst("overlap"))
            ),
            detail=f"s by L: {_scales(greedy)}; t_k per run: "
            + by_run(f"{w['run']} {_fmt(w['t'])}" for a in greedy for w in a.values()),
        ),
        judge(
            claim=f"o: with L in {depth_list} (small s) the data modes are learnt in order of "
            "variance",
            metric="min over L of the fraction of PC pairs (i < j) whose gains a_kᵀPa_k cross "
            f"{MODE_CUTOFF} in order (t_i < t_j)",
            per_seed=_per_seed(greedy, worst("in_order", min)),
            threshold=ORDER_MIN,
            direction=">=",
            precondition=learnt,
            control=Control(
                "the same against a random order of the PCs (drawn from each run's seed)",
                per_seed=_per_seed(greedy, worst("shuffled", min)),
            ),
            detail="t per PC: "
            + by_run(f"{w['run']} {_fmt(w['t_pc'])}" for a in greedy for w in a.values()),
        ),
    ]
    zero = _arm(rows, 0, "orthogonal")
    deepest = _arm(rows, max(judged), "orthogonal") if judged else {}
    data_rank = float(np.nanmin([w["data_rank"] for w in zero.values()])) if zero else NAN
    verdicts.append(
        judge(
            claim="r3: without the linear stack (L = 0) the latent ends full rank",
            metric="final held-out latent rank_1e-2 at L = 0",
            per_seed=_per_seed([zero], lambda ws: ws[0]["rank_final"]),
            threshold=float(d_latent),
            direction=">=",
            precondition=Precondition(
                f"the held-out data itself has rank_1e-2 >= d_latent = {d_latent} (else no "
                "linear code can be full rank)",
                bool(data_rank >= d_latent),
                data_rank,
            ),
            control=Control(
                f"the same rank with the deepest stack (L = {max(judged, default=0)}, small s)",
                per_seed=_per_seed([deepest], lambda ws: ws[0]["rank_final"]),
            ),
        )
    )
    verdicts.append(_r4(rows, r))
    verdicts.append(_depth(rows, depths))
    return verdicts, rows


def _t_margin(ws: list[dict]) -> float:
    """t_r(test) - t_r(reference); a test run that never gets there counts ``steps + 1``."""
    test, ref = ws
    t_test = test["t_r"] if test["status"] == "finished" else NAN
    if test["status"] == "diverged" or (test["status"] == "finished" and math.isnan(t_test)):
        t_test = test["steps"] + 1  # never (or diverged): a lower bound
    return t_test - ref["t_r"]


def _r4(rows: list[dict], r: int) -> Verdict:
    defaults = [w for w in rows if w["init"] == "default" and w["L"] > 0]
    L = defaults[0]["L"] if defaults else 8
    test, ref = _arm(rows, L, "default"), _arm(rows, L, "orthogonal")
    t_ref = [w["t_r"] for w in ref.values()]
    reached = bool(t_ref) and not any(map(math.isnan, t_ref))
    return judge(
        claim=f"r4: L = {L} with default init learns the {r} data modes later than the "
        "orthogonal stack (small s, same step), or never, or diverges",
        metric=f"t_{r}(default) - t_{r}(orthogonal), steps (t_{r}: first step with {r} "
        "learned data modes; never: steps + 1)",
        per_seed=_per_seed([test, ref], _t_margin),
        threshold=1.0,
        direction=">=",
        precondition=Precondition(
            f"every orthogonal L = {L} run reaches {r} learned modes", reached, float(len(t_ref))
        ),
        control=Control(
            "the same difference at L = 0 (no stack: both inits give the same model)",
            per_seed=_per_seed([_arm(rows, 0, "default"), _arm(rows, 0, "orthogonal")], _t_margin),
        ),
    )


def _depth(rows: list[dict], depths: list[int]) -> Verdict:
    zero = _arm(rows, 0, "orthogonal")
    arms = [zero] + [_arm(rows, L, "orthogonal", "depth") for L in depths]
    controls = [zero] + [_arm(rows, L, "orthogonal", "control") for L in depths]
    n = len(depths) + (1 if zero else 0)
    return judge(
        claim=f"d: at one s ({_scales(arms[1:])}) deeper stacks learn more greedily: the latent "
        "code passes through lower effective rank",
        metric="max over consecutive depths of the rise in min_{t >= 1} latent effective rank",
        per_seed=_per_seed([a for a in arms if a], _max_rise),
        threshold=0.0,
        direction="<=",
        precondition=Precondition("at least 3 depths (L = 0 included)", n >= 3, float(n)),
        control=Control(
            f"the same at s = {_scales(controls[1:])}",
            per_seed=_per_seed([a for a in controls if a], _max_rise),
        ),
        detail="min_t erank by L (seed mean): "
        + ", ".join(
            f"L={L}: {np.nanmean([w['erank_min'] for w in a.values()]):.3f}"
            for L, a in zip([0, *depths], arms)
            if a
        ),
    )


def _fmt(values: list[float]) -> str:
    return "(" + ", ".join("never" if math.isnan(v) else f"{v:g}" for v in values) + ")"


def analyze(runs: dict[str, Run], out: Path) -> Analysis:
    """Verdicts r1, r2, o, r3, r4 and d from the stored runs; figures under ``out``."""
    verdicts, rows = verdicts_from_runs(runs)
    table = [
        {
            "run": w["run"],
            "L": w["L"],
            "init": w["init"],
            "s": w["s"],
            "status": w["status"],
            "final loss": w["loss_final"],
            "arm": w["arm"],
            "latent rank_1e-2 init/t_5/final": f"{w['rank_init']:g}/{w['rank_t5']:g}/"
            f"{w['rank_final']:g}",
            "latent erank (min)": w["erank_min"],
            "data modes init/final": f"{w['count_init']:g}/{w['count_final']:g}",
            "t_k (σ_k(M_A) > 0.5)": _fmt(w["t"]),
            "t per PC (gain > 0.5)": _fmt(w["t_pc"]),
            "PC pairs in order": w["in_order"],
            "overlap": w["overlap"],
        }  # fmt: skip
        for w in rows
    ]
    return Analysis(verdicts, figures(rows, runs, out), {"runs: learned modes and times": table})
