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
from dynascope.studies.verdict import Precondition, Verdict

from .figures import figures
from .protocol import PROTOCOL
from .runs import MODE_CUTOFF, RANK_TOL, AutoencoderRun

__all__ = [
    "GREEDY_DEPTHS",
    "analyze",
    "measure_run",
    "verdicts_from_runs",
]

GREEDY_DEPTHS = (2, 4, 8)  # the judged depths (r1, r2, o)
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
    learnt in order of variance; ``rank_t5``: the held-out latent rank_1e-2 at the first
    latent measurement at or after ``t[r-1]``.
    """
    cfg = AutoencoderRun.model_validate(run.config)
    r = len(cfg.variances)
    row: dict[str, Any] = {
        "run": name, "L": cfg.n_stack, "init": cfg.init, "s": cfg.init_scale, "seed": cfg.seed,
        "arm": cfg.arm, "noise": cfg.noise_std, "status": run.status, "r": r,
        "d_latent": cfg.d_latent, "steps": cfg.loop.steps,
    }  # fmt: skip
    keys = ("count_init", "count_final", "t_r", "overlap", "in_order", "rank_init")
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
        rank_init=float(ranks[0]),
        rank_t5=float(ranks[after[0]]) if after.size else NAN,
        rank_final=float(ranks[-1]),
        erank_min=float(erank[later].min()) if later.any() else NAN,
        data_rank=float(run.last("data.rank_1e-2")),
        loss_final=float(run.last("train.loss")),
    )
    return row


def _arm(rows: list[dict], L: int, init: str, arm: str = "greedy") -> dict[int, dict]:
    """seed -> the run at depth L and init; orthogonal runs (L = 0 included) of the given arm."""
    return {
        w["seed"]: w
        for w in rows
        if w["L"] == L and w["init"] == init and (init != "orthogonal" or w["arm"] == arm)
    }


def _per_seed(arms: list[dict[int, dict]], fn: Any) -> dict[int, float]:
    """seed -> fn(rows of that seed, one per arm); NaN if a seed misses an arm."""
    seeds = sorted(set().union(*arms)) if arms else []
    out = {}
    for seed in seeds:
        got = [a.get(seed) for a in arms]
        out[seed] = NAN if any(w is None for w in got) else float(fn(got))
    return out


def _learnt_all(arms: list[dict[int, dict]], r: int, what: str) -> Precondition:
    """Every run of the arms finished and learnt all r data modes (the fit bar, per arm and
    per seed); measured: the fewest learnt modes."""
    rows = [w for a in arms for w in a.values()]
    fewest = min((w["count_final"] for w in rows), default=NAN)
    done = bool(rows) and all(w["status"] == "finished" for w in rows)
    return Precondition(
        f"every run of {what} finished with all {r} data modes learnt (σ_i(M_A) > "
        f"{MODE_CUTOFF} at the last step), per seed",
        done and bool(fewest >= r),
        fewest,
    )


def _both(*pres: Precondition) -> Precondition:
    """All of ``pres`` met; measured: the first's."""
    return Precondition("; ".join(p.text for p in pres), all(p.met for p in pres), pres[0].measured)


def _max_rise(ws: list[dict]) -> float:
    mins = [w["erank_min"] for w in ws]
    return max(b - a for a, b in zip(mins, mins[1:]))


def _scales(arms: list[dict[int, dict]]) -> str:
    return "/".join(sorted({f"{w['s']:.3g}" for a in arms for w in a.values()})) or "n/a"


def verdicts_from_runs(runs: dict[str, Run]) -> tuple[list[Verdict], list[dict]]:
    """Verdicts r1, r2, o, r3, r4 and d (thresholds, statistics and controls: ``PROTOCOL``),
    and one measured row per run."""
    rows = [measure_run(name, run) for name, run in sorted(runs.items())]
    rows.sort(key=lambda w: (w["init"] != "orthogonal", w["L"], w["s"], w["seed"]))
    r = rows[0]["r"]
    depths = sorted({w["L"] for w in rows if w["init"] == "orthogonal" and w["L"] > 0})
    judged = [L for L in GREEDY_DEPTHS if L in depths] or depths
    greedy = [_arm(rows, L, "orthogonal") for L in judged]
    control = [_arm(rows, L, "orthogonal", "control") for L in judged]
    flat = [_arm(rows, L, "orthogonal", "flat") for L in judged]
    learnt = _learnt_all(greedy + control, r, "the greedy and s = 1 stacks")
    by_run = "; ".join

    def worst(key: str, fn: Any = max) -> Any:
        return lambda ws: fn(w[key] for w in ws)

    def rank_gap(ws: list[dict]) -> float:
        return max(abs(w["rank_final"] - r) for w in ws)

    verdicts = [
        PROTOCOL.claim("r1").judge(
            _per_seed(greedy, rank_gap),
            precondition=learnt,
            control=_per_seed(control, rank_gap),
            detail=f"s by L: {_scales(greedy)} (control {_scales(control)}); latent rank_1e-2 "
            "at step 0 / t_5 / end: "
            + by_run(
                f"{w['run']} {w['rank_init']:g}/{w['rank_t5']:g}/{w['rank_final']:g}"
                for a in greedy
                for w in a.values()
            ),  # fmt: skip
        ),
        PROTOCOL.claim("r2").judge(
            _per_seed(greedy, worst("overlap")),
            precondition=learnt,
            control=_per_seed(control, worst("overlap")),
            detail=f"s by L: {_scales(greedy)}; t_k per run: "
            + by_run(f"{w['run']} {_fmt(w['t'])}" for a in greedy for w in a.values()),
        ),
        PROTOCOL.claim("o").judge(
            _per_seed(greedy, worst("in_order", min)),
            precondition=_both(learnt, _learnt_all(flat, r, "the equal-variance stacks")),
            control=_per_seed(flat, worst("in_order", min)),
            detail="t per PC: "
            + by_run(f"{w['run']} {_fmt(w['t_pc'])}" for a in greedy for w in a.values()),
        ),
    ]
    verdicts.append(_r3(rows, judged, r))
    verdicts.append(_r4(rows, r))
    verdicts.append(_depth(rows, depths, r))
    return verdicts, rows


def _r3(rows: list[dict], judged: list[int], r: int) -> Verdict:
    zero = _arm(rows, 0, "orthogonal", "quiet")
    deepest = _arm(rows, max(judged), "orthogonal", "quiet") if judged else {}
    data_rank = [w["data_rank"] for w in zero.values()]
    return PROTOCOL.claim("r3").judge(
        _per_seed([zero], lambda ws: ws[0]["rank_final"]),
        precondition=_learnt_all([zero, deepest], r, "L = 0 and the deepest greedy stack"),
        control=_per_seed([deepest], lambda ws: ws[0]["rank_final"]),
        detail=f"noise std {_scales_of(zero, 'noise')}; held-out data rank_1e-2 "
        f"{_fmt(sorted(set(data_rank)))}; latent rank_1e-2 at step 0 / end, L = 0: "
        + ", ".join(f"{w['rank_init']:g}/{w['rank_final']:g}" for w in zero.values())
        + f"; L = {max(judged) if judged else 'n/a'}: "
        + ", ".join(f"{w['rank_init']:g}/{w['rank_final']:g}" for w in deepest.values()),
    )


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
    ablation = _arm(rows, L, "orthogonal", "control")
    return PROTOCOL.claim("r4").judge(
        _per_seed([test, ref], _t_margin),
        precondition=_learnt_all([ref, ablation], r, f"the L = {L} greedy and s = 1 stacks"),
        control=_per_seed([ablation, ref], _t_margin),
        detail=f"t_{r} per seed (default / greedy / s = 1): "
        + "; ".join(
            f"{s}: {_fmt([test[s]['t_r'], ref[s]['t_r'], ablation[s]['t_r']])}"
            for s in sorted(set(test) & set(ref) & set(ablation))
        ),
    )


def _greedy_share(ws: list[dict]) -> float:
    """How far the deepest stack's dip goes from L = 0's (0) to one mode at a time (1):
    ``(e_0 - e_L) / (e_0 - 1)`` with ``e`` = ``min_(t >= 1)`` latent effective rank; ``ws`` is
    L = 0 first, the deepest stack last."""
    e0, eL = ws[0]["erank_min"], ws[-1]["erank_min"]
    return (e0 - eL) / (e0 - 1.0) if e0 > 1.0 else NAN


def _depth(rows: list[dict], depths: list[int], r: int) -> Verdict:
    zero = _arm(rows, 0, "orthogonal")
    arms = [zero] + [_arm(rows, L, "orthogonal", "depth") for L in depths]
    controls = [zero] + [_arm(rows, L, "orthogonal", "control") for L in depths]
    n = len(depths) + (1 if zero else 0)
    return PROTOCOL.claim("d").judge(
        _per_seed([a for a in arms if a], _greedy_share),
        precondition=_both(
            Precondition("at least 3 depths (L = 0 included)", n >= 3, float(n)),
            _learnt_all(arms + controls[1:], r, "L = 0, the s = 0.5 and the s = 1 stacks"),
        ),
        control=_per_seed([a for a in controls if a], _greedy_share),
        detail=f"s = {_scales(arms[1:])}, control s = {_scales(controls[1:])}; min_t erank "
        "by L (seed mean, s = 0.5 | s = 1): "
        + ", ".join(
            f"L={L}: {_mean(a, 'erank_min'):.3f} | {_mean(c, 'erank_min'):.3f}"
            for L, a, c in zip([0, *depths], arms, controls)
            if a
        ),
    )


def _mean(arm: dict[int, dict], key: str) -> float:
    values = [w[key] for w in arm.values()]
    return float(np.nanmean(values)) if values else NAN


def _scales_of(arm: dict[int, dict], key: str) -> str:
    return "/".join(sorted({f"{w[key]:g}" for w in arm.values()})) or "n/a"


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
