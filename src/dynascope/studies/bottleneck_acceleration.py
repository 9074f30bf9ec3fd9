"""Study ``bottleneck-acceleration`` (SYSTEMS.md S16): one finite bottleneck in a wide
NTK-parametrized net moves by O(1) and trains faster than the all-wide net, whose features
freeze as width^{-1/2}.

Source: E. Littwin, O. Saremi, S. Zhai, V. Thilak, H. Goh, J. Susskind, G. Yang, "Implicit
Acceleration and Feature Learning in Infinitely Wide Neural Networks with Bottlenecks",
arXiv 2107.00364 (2021). No public code.

System (S16 "Nets (CPU)", "Task"; :class:`dynascope.nn.mlp.MLP`, ``parametrization="ntk"``,
ReLU, all weights N(0, 1) with 1/sqrt(fan_in) multipliers, no biases):

- bottleneck 16 -> n -> d -> n -> 1, d = 4 (``depth=2, bottleneck=d, bottleneck_after=1``):
  ``z = W_2 phi(W_1 x / sqrt(16)) / sqrt(n)`` (no activation on z),
  ``F = v^T phi(W_3 z / sqrt(d)) / sqrt(n)``;
- all-wide 16 -> n -> n -> n -> 1 (``depth=3``).
- data: x ~ N(0, I_16), N = 256; ``y = sin(3 u^T x)``, u a unit vector drawn with the data
  (same data for every net and width of a seed; the weights use a separate stream).
- loss ``(1/2N) sum (F - y)^2``; full-batch GD, lr 1.0, 2,000 steps, float32.

Instruments (logged by :func:`run_bottleneck`):

- ``train.mse`` = ``(1/N) sum (F - y)^2`` every step (twice the loss); steps to MSE <= 1e-3
  are read from it (censored at the last step).
- ``movement`` = ``||A_T - A_0||_F / ||A_0||_F`` with A the layer-1 preactivations on the
  training set: the codes Z ``[N, d]`` of the bottleneck net, the middle hidden layer's
  preactivations H ``[N, n]`` of the all-wide net (S16's proposal). ``movement.layers``:
  the same ratio for every layer, on log-spaced steps.
- reported: relative eNTK change ``||Theta_T - Theta_0||_F / ||Theta_0||_F`` on the first
  ``n_kernel`` training points (:func:`dynascope.probes.kernels.empirical_ntk`); the latent
  covariance spectrum of Z at the end (S15); a coordinate check (mean |preactivation| per
  layer at steps 0 and T, S9); the stability number ``(lr / N) lambda_max(Theta_0)`` on all N
  points (by power iteration with JVP/VJP; kernel GD with the mean loss is stable below 2).
  A run whose loss turns non-finite stops with status ``diverged`` and is reported as such.

Verdicts (S16's b1-b3; thresholds are S16's proposals, frozen before the first fast run):

- b1: at every width, steps(bottleneck) <= 0.5 steps(all-wide); an all-wide run that never
  reaches 1e-3 counts as ``steps`` (its lower bound), so b1 then holds iff the bottleneck run
  gets there within half the steps (a diverged all-wide run counts the same). Verdict metric:
  the worst ratio over widths (threshold 0.5); a bottleneck run that never gets there, or
  diverges, gives ``inf`` (``null`` in verdict.json).
- b2: bottleneck movement Θ(1): max over n / min over n <= 1.5 and every value >= 0.1.
- b3: all-wide movement: least-squares log-log slope vs n <= -0.4 (theory -0.5).

Measured on the fast preset (seed 0, 2026-12-01; 55 s CPU): no run reaches MSE 1e-3 in
2,000 steps (b1 fails, measured inf); final MSE bottleneck vs all-wide 0.016 vs 0.0056
(n = 128), 0.0024 vs 0.011 (256), 0.0024 vs 0.021 (512). b2 holds (movement 0.67, 0.67, 0.72;
spread 1.08); b3 holds (0.31, 0.25, 0.17; slope -0.42). (lr/N) lambda_max(Theta_0) = 0.13-0.33.

With several seeds a width's steps are the median over seeds and its movement the mean; with
several bottleneck widths d (``paper``) the verdicts read d = 4.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from matplotlib.ticker import MaxNLocator, NullLocator
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch.func import functional_call

from dynascope.monitor import LogSchedule
from dynascope.nn.mlp import MLP
from dynascope.probes.kernels import empirical_ntk, model_function, ntk_relative_change
from dynascope.probes.latent import latent_covariance_spectrum
from dynascope.report import new_figure, save_figure
from dynascope.store import Run, RunStore
from dynascope.studies._run_values import last_or_nan
from dynascope.studies.base import Analysis, RunSpec, Study, Verdict, one_intra_op_thread

__all__ = ["BottleneckPreset", "BottleneckRunConfig", "STUDY", "analyze", "run_bottleneck"]

CLAIM = (
    "In a wide NTK-parametrized net, one finite bottleneck learns features (its codes move by "
    "O(1) at every width) and trains at least twice as fast as the all-wide net, whose hidden "
    "features freeze as width^-1/2."
)
SOURCE = (
    "Littwin, Saremi, Zhai, Thilak, Goh, Susskind, Yang, 'Implicit Acceleration and Feature "
    "Learning in Infinitely Wide Neural Networks with Bottlenecks', arXiv 2107.00364 (2021)"
)

# Frozen thresholds (S16's proposals; see the module docstring).
B1_RATIO = 0.5
B2_SPREAD = 1.5
B2_FLOOR = 0.1
B3_SLOPE = -0.4
VERDICT_D = 4
REPORTED_TARGET = 1e-2  # a looser target, tabulated only (never gated)


class BottleneckRunConfig(BaseModel):
    """One run: a bottleneck or all-wide NTK MLP trained by full-batch GD on sin(3 u^T x)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["bottleneck_acceleration"] = "bottleneck_acceleration"
    net: Literal["bottleneck", "wide"] = "bottleneck"
    width: int = Field(256, ge=1, description="n, the wide layers' width")
    bottleneck: int = Field(4, ge=1, description="d, the bottleneck width")
    seed: int = Field(0, ge=0)
    d_in: int = Field(16, ge=1)
    n_train: int = Field(256, ge=2, description="N training points")
    frequency: float = Field(3.0, gt=0, description="y = sin(frequency * u^T x)")
    lr: float = Field(1.0, gt=0, description="GD step on the loss (1/2N) sum (F - y)^2")
    steps: int = Field(2000, ge=1)
    mse_target: float = Field(1e-3, gt=0, description="train MSE (1/N) sum (F - y)^2 to reach")
    n_kernel: int = Field(64, ge=2, description="training points for the reported eNTK change")
    kernel_chunk: int = Field(
        32, ge=1, description="examples per eNTK Jacobian block (peak ~ chunk x largest weight)"
    )
    log_points: int = Field(30, ge=2, description="log-spaced steps for per-layer movement")
    power_iters: int = Field(30, ge=1, description="for lambda_max(Theta_0)")
    dtype: Literal["float32", "float64"] = "float32"
    device: str = "cpu"

    @model_validator(mode="after")
    def _kernel_points_fit(self) -> BottleneckRunConfig:
        if self.n_kernel > self.n_train:
            raise ValueError(
                f"n_kernel must be <= n_train (got n_kernel={self.n_kernel}, "
                f"n_train={self.n_train})"
            )
        return self


class BottleneckPreset(BaseModel):
    """A preset: the base run, the widths n, the bottleneck widths d, the seeds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base: BottleneckRunConfig
    widths: list[int] = Field(min_length=2)
    bottlenecks: list[int] = Field(default_factory=lambda: [4], min_length=1)
    seeds: int = Field(1, ge=1)


def make_data(config: BottleneckRunConfig, dtype=torch.float32) -> tuple[torch.Tensor, ...]:
    """``x`` ``[N, d_in]`` ~ N(0, I), ``y`` ``[N]`` = sin(f u^T x), ``u`` ``[d_in]`` unit."""
    g = torch.Generator().manual_seed(config.seed)
    u = torch.randn(config.d_in, generator=g, dtype=torch.float64)
    u = u / u.norm()
    x = torch.randn(config.n_train, config.d_in, generator=g, dtype=torch.float64)
    y = torch.sin(config.frequency * (x @ u))
    return x.to(dtype), y.to(dtype), u


def make_net(config: BottleneckRunConfig, dtype=torch.float32) -> MLP:
    """The run's net (weights from a stream separate from the data's)."""
    g = torch.Generator().manual_seed(10_007 + config.seed)
    common = dict(parametrization="ntk", activation="relu", generator=g, dtype=dtype)
    if config.net == "bottleneck":
        return MLP(
            config.d_in,
            config.width,
            1,
            depth=2,
            bottleneck=config.bottleneck,
            bottleneck_after=1,
            **common,
        )
    return MLP(config.d_in, config.width, 1, depth=3, **common)


def ntk_lambda_max(model: MLP, x: torch.Tensor, iters: int, seed: int = 0) -> torch.Tensor:
    """Top eigenvalue of the eNTK Gram ``Theta = J J^T`` ``[N, N]`` by power iteration.

    Each iteration is one VJP (``J^T v``) and one JVP (``J w``); Theta is never formed.
    """
    params = {k: p.detach() for k, p in model.named_parameters()}

    def f(p):
        return functional_call(model, p, (x,))[:, 0]

    _, pullback = torch.func.vjp(f, params)
    v = torch.randn(x.shape[0], generator=torch.Generator().manual_seed(seed), dtype=x.dtype)
    v = v.to(x.device) / v.norm()
    value = torch.zeros((), dtype=x.dtype)
    for _ in range(iters):
        w = pullback(v)[0]
        tv = torch.func.jvp(f, (params,), (w,))[1]
        value = v @ tv
        v = tv / tv.norm()
    return value


def _kernel(model: MLP, x: torch.Tensor, chunk: int) -> torch.Tensor:
    fn, params = model_function(model)
    return empirical_ntk(fn, params, x, mode="full", chunk_size=chunk)[:, :, 0, 0]


def run_bottleneck(
    config: BottleneckRunConfig, run_dir: Path, progress: bool = False, device: str | None = None
) -> None:
    """Train one net and log the instruments of the module docstring.

    ``device`` (``cpu``/``cuda``, from ``dynascope study run --device``) overrides
    ``config.device``; ``None`` keeps it.
    """
    del progress
    dev = torch.device(device or config.device)
    dtype = getattr(torch, config.dtype)
    with one_intra_op_thread(), RunStore(run_dir) as store:
        store.truncate_after(-1)
        store.write_config(config.model_dump(mode="json"))
        store.set_status(0, "running")
        status, step = _train(config, dev, dtype, store)
        store.set_status(step, status)


def _train(config: BottleneckRunConfig, dev, dtype, store: RunStore) -> tuple[str, int]:
    x, y, _ = make_data(config, dtype)
    x, y = x.to(dev), y.to(dev)
    model = make_net(config, dtype).to(dev)
    xk = x[: config.n_kernel]
    with torch.no_grad():
        pre0 = [a.clone() for a in model.preactivations(x)[:-1]]
    lam = ntk_lambda_max(model, x, config.power_iters, config.seed)
    K0 = _kernel(model, xk, config.kernel_chunk)
    store.log(
        0,
        {
            "stability.lambda_max": lam,
            "stability.eta_lambda_over_N": config.lr * lam / config.n_train,
            "coord.l1.init": torch.stack([a.abs().mean() for a in pre0]),
        },
    )
    opt = torch.optim.SGD(model.parameters(), lr=config.lr)
    schedule = LogSchedule(config.steps, config.log_points)
    for step in range(config.steps + 1):
        out = model(x)[:, 0]
        mse = (out - y).square().mean()
        if not torch.isfinite(mse):
            store.event(step, "diverged", "train MSE not finite")
            return "diverged", step
        values = {"train.mse": mse.detach()}
        if schedule.due(step):
            with torch.no_grad():
                pre = model.preactivations(x)[:-1]
                values["movement.layers"] = torch.stack(
                    [(a - b).norm() / b.norm() for a, b in zip(pre, pre0)]
                )
        store.log(step, values)
        if step == config.steps:
            break
        opt.zero_grad(set_to_none=True)
        (0.5 * mse).backward()
        opt.step()
    with torch.no_grad():
        pre = model.preactivations(x)[:-1]
        final = {
            "movement": (pre[1] - pre0[1]).norm() / pre0[1].norm(),
            "coord.l1.final": torch.stack([a.abs().mean() for a in pre]),
            "ntk.relative_change": ntk_relative_change(_kernel(model, xk, config.kernel_chunk), K0),
        }
        if config.net == "bottleneck":
            final["latent.spectrum"] = latent_covariance_spectrum(pre[1].double())
    store.log(config.steps, final)
    return "finished", config.steps


# -- presets ----------------------------------------------------------------------------------
def smoke() -> BottleneckPreset:
    """S16 smoke: n in {32, 64}, N = 32, 50 steps (seconds)."""
    base = BottleneckRunConfig(n_train=32, steps=50, n_kernel=16, log_points=10, power_iters=10)
    return BottleneckPreset(base=base, widths=[32, 64])


def fast() -> BottleneckPreset:
    """n in {128, 256, 512}, 1 seed, 2,000 steps (S16: n = 4096 is past the CPU budget)."""
    return BottleneckPreset(base=BottleneckRunConfig(), widths=[128, 256, 512])


def paper() -> BottleneckPreset:
    """GPU: n in {256, 1024, 4096, 16384}, d in {1, 2, 4, 8}, 3 seeds.

    At n = 16384 a hidden weight has 268M entries; eNTK blocks of 4 examples keep the
    Jacobian block near 4.3 GB (float32).
    """
    return BottleneckPreset(
        base=BottleneckRunConfig(device="cuda", kernel_chunk=4),
        widths=[256, 1024, 4096, 16384],
        bottlenecks=[1, 2, 4, 8],
        seeds=3,
    )


def build_runs(preset: BottleneckPreset, seed: int = 0) -> list[RunSpec]:
    """Per seed and width: one all-wide run and one bottleneck run per d."""
    specs = []
    for k in range(preset.seeds):
        for n in preset.widths:
            cfg = preset.base.model_copy(
                update={"net": "wide", "width": n, "seed": preset.base.seed + seed + k}
            )
            specs.append(RunSpec(f"wide_n{n}_seed{k}", cfg, run_bottleneck))
            for d in preset.bottlenecks:
                cfg = preset.base.model_copy(
                    update={
                        "net": "bottleneck",
                        "width": n,
                        "bottleneck": d,
                        "seed": preset.base.seed + seed + k,
                    }
                )
                specs.append(RunSpec(f"bottleneck_d{d}_n{n}_seed{k}", cfg, run_bottleneck))
    return specs


# -- analysis ---------------------------------------------------------------------------------
def _row(name: str, run: Run) -> dict:
    cfg = BottleneckRunConfig.model_validate(run.config)
    try:
        mse = run.scalar("train.mse")
    except KeyError:
        mse = None
    reached = _first_at_or_below(mse, cfg.mse_target)
    finished = run.status == "finished"
    try:
        l1 = [run.tensors(f"coord.l1.{w}")[1][-1] for w in ("init", "final")]
        coord = " | ".join(f"{a:.3g}→{b:.3g}" for a, b in zip(*l1))
    except KeyError:
        coord = ""
    return {
        "run": name,
        "net": cfg.net,
        "n": cfg.width,
        "d": cfg.bottleneck if cfg.net == "bottleneck" else None,
        "seed": cfg.seed,
        "status": run.status,
        "steps_to_target": reached,
        # all-wide: never reaching the target (or diverging) counts as the whole budget, a lower
        # bound; bottleneck: only a finished run that reached it counts (else inf, b1 fails)
        "steps_for_ratio": (reached if reached is not None else float(cfg.steps))
        if cfg.net == "wide"
        else (float(reached) if finished and reached is not None else math.inf),
        f"steps to {REPORTED_TARGET:g} (reported)": _first_at_or_below(mse, REPORTED_TARGET),
        "final mse": last_or_nan(run, "train.mse"),
        "movement": last_or_nan(run, "movement") if finished else math.nan,
        "ntk change": last_or_nan(run, "ntk.relative_change"),
        "(lr/N) λ_max(Θ0)": last_or_nan(run, "stability.eta_lambda_over_N"),
        "mean |preact| per layer, init→final": coord,
    }


def _first_at_or_below(mse, target: float) -> int | None:
    """First step whose train MSE is <= ``target`` (``None``: never, or nothing logged)."""
    if mse is None:
        return None
    hit = mse.index[mse.values <= target]
    return int(hit[0]) if len(hit) else None


def _by_width(rows: list[dict], net: str) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for r in rows:
        if r["net"] == net and (net == "wide" or r["d"] == VERDICT_D):
            out.setdefault(r["n"], []).append(r)
    return out


def _slope(ns: list[int], values: list[float]) -> float:
    if len(ns) < 2 or any(not (v > 0) for v in values):
        return math.nan
    return float(np.polyfit(np.log(ns), np.log(values), 1)[0])


def verdicts_from_rows(rows: list[dict]) -> list[Verdict]:
    """b1-b3 from the measured rows (see the module docstring)."""
    wide, bott = _by_width(rows, "wide"), _by_width(rows, "bottleneck")
    widths = sorted(set(wide) & set(bott))
    ratios, notes = [], []
    for n in widths:
        s_w = float(np.median([r["steps_for_ratio"] for r in wide[n]]))
        s_b = float(np.median([r["steps_for_ratio"] for r in bott[n]]))
        ratios.append(s_b / s_w if s_w > 0 else math.inf)
        w_hit = all(r["steps_to_target"] is not None for r in wide[n])
        final_b = np.median([r["final mse"] for r in bott[n]])
        final_w = np.median([r["final mse"] for r in wide[n]])
        states = {r["status"] for r in wide[n] + bott[n]} - {"finished"}
        notes.append(
            f"n={n}: bottleneck {s_b:g}, all-wide {s_w:g}{'' if w_hit else ' (never)'}, "
            f"final MSE {final_b:.3g} vs {final_w:.3g}"
            + (f" [runs {', '.join(sorted(str(x) for x in states))}]" if states else "")
        )
    b1 = max(ratios) if ratios else math.nan
    move_b = [float(np.mean([r["movement"] for r in bott[n]])) for n in widths]
    move_w = [float(np.mean([r["movement"] for r in wide[n]])) for n in widths]
    spread = max(move_b) / min(move_b) if move_b and min(move_b) > 0 else math.nan
    floor_ok = bool(move_b) and all(m >= B2_FLOOR for m in move_b)
    slope = _slope(widths, move_w)
    listed_b = ", ".join(f"n={n}: {m:.3g}" for n, m in zip(widths, move_b))
    listed_w = ", ".join(f"n={n}: {m:.3g}" for n, m in zip(widths, move_w))
    return [
        Verdict(
            f"b1: at every width the bottleneck net reaches train MSE <= 1e-3 in at most half "
            f"the steps of the all-wide net (d={VERDICT_D})",
            "max over n of steps(bottleneck) / steps(all-wide); never = the step budget (wide) "
            "or inf (bottleneck)",
            b1,
            B1_RATIO,
            bool(b1 <= B1_RATIO),
            "measured <= threshold; steps to 1e-3: " + "; ".join(notes),
        ),
        Verdict(
            "b2: the bottleneck codes move by Θ(1) at every width",
            "max over n / min over n of ||Z_T - Z_0||_F / ||Z_0||_F",
            spread,
            B2_SPREAD,
            bool(spread <= B2_SPREAD and floor_ok),
            f"measured <= threshold and every value >= {B2_FLOOR:g}; {listed_b}",
        ),
        Verdict(
            "b3: the all-wide net's middle-layer features freeze as width^-1/2",
            "least-squares slope of log ||H_T - H_0||_F / ||H_0||_F vs log n",
            slope,
            B3_SLOPE,
            bool(slope <= B3_SLOPE),
            f"measured <= threshold (theory -0.5); {listed_w}",
        ),
    ]


def analyze(runs: dict[str, Run], figures: Path) -> Analysis:
    """Verdicts b1-b3 from the stored runs; loss curves and movement-vs-width figures."""
    rows = [_row(name, run) for name, run in sorted(runs.items())]
    rows.sort(key=lambda r: (r["net"], r["d"] or 0, r["n"], r["seed"]))
    verdicts = verdicts_from_rows(rows)
    unstable = [r["run"] for r in rows if r["(lr/N) λ_max(Θ0)"] >= 2]
    if unstable:
        verdicts = [
            Verdict(
                v.claim,
                v.metric,
                v.measured,
                v.threshold,
                v.passed,
                v.detail + f"; (lr/N) λ_max(Θ0) >= 2 in {unstable}",
            )
            for v in verdicts
        ]
    return Analysis(verdicts, _figures(rows, runs, figures), {"runs": rows})


def _figures(rows: list[dict], runs: dict[str, Run], figures: Path) -> list[Path]:
    widths = sorted({r["n"] for r in rows})
    colours = {n: f"C{i}" for i, n in enumerate(widths)}
    fig, (ax, ax2) = new_figure(2, title="training under full-batch GD, and the learnt codes")
    for r in rows:
        if r["seed"] != rows[0]["seed"] or (r["net"] == "bottleneck" and r["d"] != VERDICT_D):
            continue
        run = runs[r["run"]]
        try:
            mse = run.scalar("train.mse")
        except KeyError:
            continue
        ls = "-" if r["net"] == "bottleneck" else "--"
        name = f"bottleneck d={r['d']}" if r["net"] == "bottleneck" else "all-wide"
        ax.semilogy(
            mse.index + 1, mse.values, ls, color=colours[r["n"]], label=f"{name}, n={r['n']}"
        )
        if r["net"] == "bottleneck":
            try:
                spectrum = run.tensors("latent.spectrum")[1][-1]
            except KeyError:
                continue
            i = np.arange(1, len(spectrum) + 1)
            ax2.semilogy(
                i, np.maximum(spectrum, 1e-12), "o-", color=colours[r["n"]], label=f"n={r['n']}"
            )
    ax.axhline(1e-3, color="k", ls=":", lw=1, label="target 1e-3")
    ax.set_xscale("log")
    ax.set(xlabel="step + 1", ylabel="train MSE (1/N) Σ (F − y)²", title="training MSE (lr 1.0)")
    ax.legend(fontsize=7, ncol=2, loc="center left")
    ax2.set(
        xlabel="index i",
        ylabel="λ_i / λ_1 of cov(Z)",
        title=f"bottleneck codes Z at the end (d={VERDICT_D})",
    )
    ax2.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax2.legend(fontsize=7)
    paths = [save_figure(fig, figures / "training_curves.png")]

    fig, (ax1, ax2) = new_figure(2, title="feature movement and kernel change vs width")
    for net, key, ax, label in (
        ("bottleneck", "movement", ax1, "bottleneck codes Z"),
        ("wide", "movement", ax1, "all-wide middle layer H"),
        ("bottleneck", "ntk change", ax2, "bottleneck net"),
        ("wide", "ntk change", ax2, "all-wide net"),
    ):
        by = _by_width(rows, net)
        ns = sorted(by)
        vals = [float(np.mean([r[key] for r in by[n]])) for n in ns]
        ax.loglog(ns, vals, "o-" if net == "bottleneck" else "s--", label=label)
        if net == "wide" and ns and vals[0] > 0:
            guide = vals[0] * (np.array(ns) / ns[0]) ** -0.5
            ax.loglog(ns, guide, color="grey", ls=":", label="∝ width^-1/2")
    ax1.set(xlabel="width n", ylabel="‖A_T − A_0‖_F / ‖A_0‖_F", title="preactivation movement")
    ax2.set(xlabel="width n", ylabel="‖Θ_T − Θ_0‖_F / ‖Θ_0‖_F", title="relative eNTK change")
    for ax in (ax1, ax2):
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticks(widths, [str(n) for n in widths])
        ax.legend(fontsize=7)
    paths.append(save_figure(fig, figures / "movement_vs_width.png"))
    return paths


STUDY = Study(
    name="bottleneck-acceleration",
    claim=CLAIM,
    source=SOURCE,
    presets={"smoke": smoke, "fast": fast, "paper": paper},
    build_runs=build_runs,
    analyze=analyze,
)
