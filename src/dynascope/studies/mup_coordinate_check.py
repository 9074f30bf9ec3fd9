"""Study ``mup-coordinate-check`` (SYSTEMS.md S9): under muP activations stay Θ(1) with width.

Source: G. Yang, E. Littwin, "Tensor Programs IVb: Adaptive Optimization in the Infinite-Width
Limit", arXiv 2308.01814; practical reference microsoft/mup 1.0.0 (``MuAdam``, ``MuReadout``,
``coord_check.py``).

Finding: the kernel-vs-feature-learning dichotomy holds for Adam too. Under muP (Adam: hidden
matrices' learning rate ÷ m, readout ``x @ W / m``) each layer's activations and their updates
stay Θ(1) as the width grows; under the standard parametrization (SP, one Adam learning rate)
they grow roughly ∝ width after the first update; under NTK scaling features freeze.

System (S09 "Study MLP"; our choices for S09's open details, exposed in :class:`CoordRunConfig`):

- Data: scikit-learn's 8×8 digits as 64 features (``Digits(patch_size=8)``), each pixel
  standardised over the training split (constant pixels left at 0); one fixed batch of
  ``batch_size`` training images (drawn with ``data_seed``) reused at every step; mean
  cross-entropy.
- Model: :class:`dynascope.nn.mlp.MLP` 64 → w → w → 10, ReLU, no biases, ``x @ W``; SP init
  ``N(0, 1/fan_in)``; muP: same init for W1, W2, readout zero-initialised with forward
  ``h @ W3 / m`` (m = w / 64); NTK: ``N(0, 1)`` weights times ``1/sqrt(fan_in)``. Learning
  rates per parameter from :func:`dynascope.nn.parametrization.parameter_groups` (SP: one
  rate; muP Adam: W2 ÷ m; NTK Adam / SignSGD: every rate × m^-½).
- Coordinate check (:func:`dynascope.probes.coordcheck.coord_check`): seeds 0..nseeds-1, t = 1
  at init, t = 3 after two Adam steps; modules W1, relu1, W2, relu2 (pre- and
  post-activations) and logits; statistic ``l1 = mean |x|``.
- c3 (reported, not gated): 64 → w → 10 (one hidden layer), SignSGD (``sign(grad)`` steps)
  with NTK (all learning rates ∝ m^-½) and with muP, 10 updates at base lr 1e-2; the relative
  change of the hidden preactivation ``||h_t − h_1|| / ||h_1||`` at the last step vs width.

Verdicts (the verdict contract, :func:`dynascope.studies.verdict.judge`; thresholds are S09's
proposals, frozen before the first fast run and never tuned; the measured values are reported
whatever they are). Each claim is measured once per seed s (the coordinate check's model seeds
``seed + 0 .. seed + nseeds - 1``; one seed's activations at every width), aggregated by the
default rule (the mean over seeds passes and at least 2/3 of the seeds pass):

- c1: SP + Adam, per seed ``l1(logits, t=3, w_max) / l1(logits, t=3, w_min) >= 4``
  (w_max/w_min = 32 in ``fast``; growth ∝ width would give ≈ 32). Control: the same ratio in
  the muP + Adam run, which must not grow (muP's readout keeps the logits Θ(1)).
- c2: muP + Adam, per seed ``max_w l1 / min_w l1 <= 1.5``, worst over every gated module and
  t ∈ {2, 3}. Control: the same worst spread in the SP + Adam run, which must exceed 1.5
  (SP's logits grow with width). (At t = 1 the zero-initialised logits are 0.)
- Precondition of both: the widths span w_max / w_min >= 8 (a Θ(width) growth then shows as
  >= 8x, twice c1's threshold, so "grows" and "flat" are separable) and at least
  one update was taken (t = 2 exists). The smoke preset meets it with widths {32, 256}.

Until issue 18 these verdicts were judged on the seed means (one number per claim); the
per-seed form above was fixed, thresholds unchanged, before any per-seed value was computed.

The ``paper`` preset adds widths 2^7..2^13 with 5 seeds, SGD and AdamW coordinate checks, an
Adam-ε scaling ablation (``eps_scaling = "width"``: hidden matrices' ε ÷ m) and learning-rate
transfer (final training loss vs Adam lr for every width, SP and muP; the best lr should not
move with width under muP). The transformer coordinate check of S09's paper preset is not built.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor

from dynascope.nn.mlp import MLP
from dynascope.nn.parametrization import parameter_groups
from dynascope.probes.coordcheck import CoordRecord, coord_check, coord_summary, plot_coord_check
from dynascope.report import new_figure, save_figure
from dynascope.store import Run, RunStore
from dynascope.studies.base import Analysis, RunSpec, Study, Verdict, one_intra_op_thread
from dynascope.studies.verdict import Control, Precondition, judge
from dynascope.tasks import Digits

__all__ = ["STUDY", "CoordRunConfig", "MupCoordCheckPreset", "run_coord_check", "run_lr_transfer"]

CLAIM = (
    "Under muP, each layer's activations stay Θ(1) as the width grows when training with Adam; "
    "under the standard parametrization the logits grow roughly ∝ width."
)
SOURCE = (
    "Yang & Littwin, 'Tensor Programs IVb: Adaptive Optimization in the Infinite-Width Limit', "
    "arXiv 2308.01814; microsoft/mup"
)

# Frozen thresholds (S09's proposals; see the module docstring).
C1_SP_GROWTH = 4.0
C2_MUP_SPREAD = 1.5
GATED_MODULES = ("W1", "relu1", "W2", "relu2", "logits")
C2_STEPS = (2, 3)
MIN_WIDTH_SPAN = 8.0  # precondition: w_max / w_min (see the module docstring)

OptimizerName = Literal["adam", "adamw", "sgd", "signsgd"]


class CoordRunConfig(BaseModel):
    """One coordinate check (or learning-rate sweep) over widths for one parametrization."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["coord", "lr_transfer"] = "coord"
    parametrization: Literal["standard", "ntk", "mup"]
    optimizer: OptimizerName = "adam"
    widths: list[int] = Field(min_length=2, description="hidden widths, ascending")
    base_width: int = Field(64, ge=1, description="muP/NTK base width w0 (m = w / w0)")
    depth: int = Field(2, ge=1, description="hidden layers")
    nseeds: int = Field(3, ge=1)
    nsteps: int = Field(3, ge=1, description="forward passes; nsteps - 1 updates")
    batch_size: int = Field(128, ge=1)
    lr: float = Field(1e-2, gt=0, description="learning rate at the base width")
    eps_scaling: Literal["none", "width"] = "none"
    readout_init: Literal["zero", "default"] = "zero"
    lrs: list[float] = Field(default_factory=list, description="lr_transfer: the lr grid")
    train_steps: int = Field(0, ge=0, description="lr_transfer: minibatch steps per (w, lr)")
    seed: int = Field(0, ge=0, description="added to every model seed")
    data_seed: int = Field(0, ge=0)


class MupCoordCheckPreset(BaseModel):
    """A preset: the gated Adam checks, c3's SignSGD checks, extras (paper only)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sp: CoordRunConfig
    mup: CoordRunConfig
    c3: list[CoordRunConfig]
    extras: list[CoordRunConfig] = Field(default_factory=list)


# -- data and model -----------------------------------------------------------------------------
def _digits(device: torch.device) -> tuple[Tensor, Tensor]:
    """Training split of digits as ``[n, 64]`` standardised floats and ``[n]`` labels."""
    task = Digits(patch_size=8)
    whole = task.batch("train", task.split_size("train"), torch.Generator())  # in split order
    x, y = whole["x"].reshape(-1, 64).float(), whole["y"]
    mean, std = x.mean(0), x.std(0)
    x = torch.where(std > 0, (x - mean) / std.clamp_min(1e-12), torch.zeros_like(x))
    return x.to(device), y.to(device)


def _model(cfg: CoordRunConfig, width: int, device: torch.device) -> MLP:
    return MLP(
        64,
        width,
        10,
        depth=cfg.depth,
        parametrization=cfg.parametrization,
        base_width=cfg.base_width,
        readout_init=cfg.readout_init,
    ).to(device)


def _forward(model: MLP, x: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """Output and named activations W1, relu1, ..., logits of an :class:`MLP`."""
    z = model.preactivations(x)
    acts: dict[str, Tensor] = {}
    for i, zi in enumerate(z[:-1]):
        acts[f"W{i + 1}"] = zi
        acts[f"relu{i + 1}"] = F.relu(zi)
    acts["logits"] = z[-1]
    return z[-1], acts


class _SignSGD(torch.optim.Optimizer):
    """``θ ← θ − lr · sign(∂L/∂θ)`` per parameter group (Adam's first step, ε → 0)."""

    def __init__(self, params, lr: float) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN001, ANN201 - torch's signature
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad.sign(), alpha=-group["lr"])


def _optimizer(cfg: CoordRunConfig, model: MLP, device: torch.device, lr: float | None = None):
    state = torch.random.get_rng_state()  # the base model only supplies shapes: leave the RNG
    base = _model(cfg, cfg.base_width, device)
    torch.random.set_rng_state(state)
    kind = "sgd" if cfg.optimizer == "sgd" else "adam"
    groups = parameter_groups(
        model, base, lr=lr or cfg.lr, parametrization=cfg.parametrization, optimizer=kind
    )
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(groups)
    if cfg.optimizer == "signsgd":
        return _SignSGD(groups, lr=lr or cfg.lr)
    for group in groups:
        group["eps"] = 1e-8
        if cfg.eps_scaling == "width" and group["role"] == "hidden":
            group["eps"] = 1e-8 / group["width_mult"]
    return (torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam)(groups)


# -- runners ------------------------------------------------------------------------------------
def run_coord_check(
    config: CoordRunConfig, run_dir: Path, progress: bool = False, device: str = "cpu"
) -> None:
    """Coordinate-check every width; log ``l1.<module>`` and ``rel.<module>`` per step t.

    Logged: ``widths`` ``[n_widths]`` at step 0; at each t, tensors ``[nseeds, n_widths]``
    ``l1.<module>`` (mean |x|) and ``rel.<module>`` (relative change since t = 1).
    """
    del progress
    dev = torch.device(device)
    with one_intra_op_thread(), RunStore(run_dir) as store:
        store.truncate_after(-1)
        store.write_config(config.model_dump(mode="json"))
        store.set_status(0, "running")
        x, y = _digits(dev)
        index = torch.randperm(len(y), generator=torch.Generator().manual_seed(config.data_seed))
        batch = (x[index[: config.batch_size]], y[index[: config.batch_size]])
        records = coord_check(
            lambda w: _model(config, w, dev),
            config.widths,
            batch,
            loss_fn=F.cross_entropy,
            make_optimizer=lambda model, w: _optimizer(config, model, dev),
            nsteps=config.nsteps,
            nseeds=config.nseeds,
            forward=_forward,
            seed_offset=config.seed,
        )
        store.log(0, {"widths": torch.tensor(config.widths, dtype=torch.float64)})
        col = {w: j for j, w in enumerate(config.widths)}
        for stat, prefix in (("l1", "l1"), ("rel_change", "rel")):
            tables: dict[tuple[str, int], np.ndarray] = {}
            for r in records:
                table = tables.setdefault(
                    (r.module, r.t), np.full((config.nseeds, len(config.widths)), np.nan)
                )
                table[r.seed - config.seed, col[r.width]] = getattr(r, stat)
            for (module, t), table in tables.items():
                store.log(t, {f"{prefix}.{module}": torch.from_numpy(table)})
        store.set_status(config.nsteps, "finished")


def run_lr_transfer(
    config: CoordRunConfig, run_dir: Path, progress: bool = False, device: str = "cpu"
) -> None:
    """Train every (width, lr) for ``train_steps`` minibatch steps; log the final train loss.

    Logged at step 0: ``widths``, ``lrs`` and ``final_loss`` ``[n_widths, n_lrs]`` (mean
    cross-entropy over the training split after training; NaN where it diverged).
    """
    del progress
    dev = torch.device(device)
    with one_intra_op_thread(), RunStore(run_dir) as store:
        store.truncate_after(-1)
        store.write_config(config.model_dump(mode="json"))
        store.set_status(0, "running")
        x, y = _digits(dev)
        losses = torch.full((len(config.widths), len(config.lrs)), float("nan"))
        for i, width in enumerate(config.widths):
            for j, lr in enumerate(config.lrs):
                torch.manual_seed(config.seed)
                model = _model(config, width, dev)
                opt = _optimizer(config, model, dev, lr=lr)
                gen = torch.Generator().manual_seed(config.data_seed)
                for _ in range(config.train_steps):
                    idx = torch.randint(len(y), (config.batch_size,), generator=gen).to(dev)
                    opt.zero_grad(set_to_none=True)
                    F.cross_entropy(model(x[idx]), y[idx]).backward()
                    opt.step()
                with torch.no_grad():
                    loss = float(F.cross_entropy(model(x), y))
                losses[i, j] = loss if math.isfinite(loss) else float("nan")
        store.log(
            0,
            {
                "widths": torch.tensor(config.widths, dtype=torch.float64),
                "lrs": torch.tensor(config.lrs, dtype=torch.float64),
                "final_loss": losses,
            },
        )
        store.set_status(config.train_steps, "finished")


# -- presets ------------------------------------------------------------------------------------
def _pair(**common) -> tuple[CoordRunConfig, CoordRunConfig]:
    return (
        CoordRunConfig(parametrization="standard", **common),
        CoordRunConfig(parametrization="mup", **common),
    )


def _c3(widths: list[int], nseeds: int, batch_size: int, nsteps: int) -> list[CoordRunConfig]:
    common = dict(
        optimizer="signsgd",
        widths=widths,
        depth=1,
        nseeds=nseeds,
        nsteps=nsteps,
        batch_size=batch_size,
        lr=1e-2,
    )
    return [
        CoordRunConfig(parametrization="ntk", **common),
        CoordRunConfig(parametrization="mup", **common),
    ]


def smoke() -> MupCoordCheckPreset:
    """Seconds: widths {32, 256} (the 8x span the verdicts presuppose), 3 seeds, batch 16."""
    sp, mup = _pair(widths=[32, 256], nseeds=3, nsteps=3, batch_size=16)
    return MupCoordCheckPreset(sp=sp, mup=mup, c3=_c3([32, 256], 3, 16, 3))


def fast() -> MupCoordCheckPreset:
    """S09's fast preset: widths 64..2048, 3 seeds, 3 steps, Adam lr 1e-2, batch 128."""
    widths = [64, 128, 256, 512, 1024, 2048]
    sp, mup = _pair(widths=widths, nseeds=3, nsteps=3, batch_size=128)
    return MupCoordCheckPreset(sp=sp, mup=mup, c3=_c3(widths, 3, 128, 11))


def paper() -> MupCoordCheckPreset:
    """Widths 2^7..2^13, 5 seeds; SGD/AdamW checks, ε scaling, learning-rate transfer."""
    widths = [2**k for k in range(7, 14)]
    common = dict(widths=widths, nseeds=5, nsteps=3, batch_size=128)
    sp, mup = _pair(**common)
    extras = [
        *_pair(**{**common, "optimizer": "sgd", "lr": 0.1}),
        *_pair(**{**common, "optimizer": "adamw"}),
        CoordRunConfig(parametrization="mup", eps_scaling="width", **common),
    ]
    lrs = [10.0**k for k in np.arange(-4.0, -0.49, 0.5)]
    for parametrization in ("standard", "mup"):
        extras.append(
            CoordRunConfig(
                kind="lr_transfer",
                parametrization=parametrization,
                widths=[64, 128, 256, 512, 1024, 2048],
                lrs=[float(lr) for lr in lrs],
                train_steps=500,
                batch_size=64,
            )
        )
    return MupCoordCheckPreset(sp=sp, mup=mup, c3=_c3(widths, 5, 128, 11), extras=extras)


def _run_name(cfg: CoordRunConfig) -> str:
    name = f"{cfg.kind}_{cfg.parametrization}_{cfg.optimizer}"
    return name + ("_eps-width" if cfg.eps_scaling == "width" else "")


def build_runs(preset: MupCoordCheckPreset, seed: int = 0) -> list[RunSpec]:
    """The gated SP and muP Adam checks, c3's NTK/muP SignSGD checks, then the extras."""
    specs = []
    for cfg in (preset.sp, preset.mup, *preset.c3, *preset.extras):
        cfg = cfg.model_copy(update={"seed": cfg.seed + seed})
        name = _run_name(cfg) + ("_c3" if cfg.optimizer == "signsgd" else "")
        runner = run_lr_transfer if cfg.kind == "lr_transfer" else run_coord_check
        specs.append(RunSpec(name, cfg, runner))
    return specs


# -- analysis -----------------------------------------------------------------------------------
def load_records(run: Run, stat: str = "l1") -> list[CoordRecord]:
    """Rebuild :class:`CoordRecord` rows from a coordinate-check run's store."""
    cfg = CoordRunConfig.model_validate(run.config)
    widths = run.tensors("widths")[1][0].astype(int)
    prefix = "l1." if stat == "l1" else "rel."
    modules = [f"{kind}{i}" for i in range(1, cfg.depth + 1) for kind in ("W", "relu")]
    records = []
    for key in (prefix + m for m in [*modules, "logits", "output"]):
        steps, values = run.tensors(key)  # [T, nseeds, n_widths]
        for t, table in zip(steps, values):
            for s in range(table.shape[0]):
                for j, w in enumerate(widths):
                    value = float(table[s, j])
                    l1, rel = (value, float("nan")) if stat == "l1" else (float("nan"), value)
                    records.append(
                        CoordRecord(int(w), cfg.seed + s, key[len(prefix) :], int(t), l1, rel)
                    )
    return records


def _summary(run: Run, stat: str = "l1") -> dict[tuple[str, int], dict]:
    return {(r["module"], r["t"]): r for r in coord_summary(load_records(run, stat), stat)}


def _l1_tables(run: Run) -> tuple[list[int], dict[tuple[str, int], np.ndarray]]:
    """The run's seeds and ``{(module, t): l1 [nseeds, n_widths]}`` for the gated modules."""
    cfg = CoordRunConfig.model_validate(run.config)
    tables = {}
    for module in GATED_MODULES:
        steps, values = run.tensors(f"l1.{module}")  # [T, nseeds, n_widths]
        for t, table in zip(steps, values):
            tables[(module, int(t))] = np.asarray(table, dtype=float)
    return [cfg.seed + s for s in range(cfg.nseeds)], tables


def _growth_per_seed(run: Run, t: int) -> dict[int, float]:
    """Per seed: ``l1(logits, t, w_max) / l1(logits, t, w_min)`` (NaN where unmeasurable)."""
    seeds, tables = _l1_tables(run)
    table = tables.get(("logits", t))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = table[:, -1] / table[:, 0] if table is not None else np.full(len(seeds), np.nan)
    return {s: float(r) if np.isfinite(r) else math.nan for s, r in zip(seeds, ratio)}


def _worst_spread_per_seed(run: Run, steps: list[int]) -> tuple[dict[int, float], list[str]]:
    """Per seed: the worst ``max_w l1 / min_w l1`` over the gated modules and ``steps``.

    A module whose l1 is 0 or not finite at some width makes that seed's value NaN. Also
    returns, per seed, where the worst spread sits (``module@t``).
    """
    seeds, tables = _l1_tables(run)
    worst = {s: -math.inf for s in seeds}
    where = {s: "" for s in seeds}
    for module in GATED_MODULES:
        for t in steps:
            table = tables.get((module, t))
            for i, s in enumerate(seeds):
                row = table[i] if table is not None else np.array([np.nan])
                spread = row.max() / row.min() if np.all(np.isfinite(row) & (row > 0)) else np.nan
                if not np.isfinite(spread):
                    worst[s], where[s] = math.nan, f"{module}@t={t} unmeasurable"
                elif spread > worst[s]:
                    worst[s], where[s] = float(spread), f"{module}@t={t}"
    return worst, [f"seed {s}: {where[s]}" for s in seeds]


def _verdicts(sp: Run, mup: Run) -> tuple[list[Verdict], list[dict]]:
    sp_rows, mup_rows = _summary(sp), _summary(mup)
    last_t = max(t for _, t in sp_rows)
    widths = CoordRunConfig.model_validate(sp.config).widths
    span = widths[-1] / widths[0]
    steps = [t for t in C2_STEPS if t <= last_t]
    precondition = Precondition(
        f"the widths span w_max / w_min >= {MIN_WIDTH_SPAN:g} and at least one update was taken",
        met=span >= MIN_WIDTH_SPAN and last_t >= 2,
        measured=span,
    )
    c2_sp, _ = _worst_spread_per_seed(sp, steps)
    c2_mup, where = _worst_spread_per_seed(mup, steps)
    verdicts = [
        judge(
            claim=f"c1: SP + Adam: the logits grow with width after {last_t - 1} update(s)",
            metric=f"per seed l1(logits, t={last_t}, w={widths[-1]}) / "
            f"l1(logits, t={last_t}, w={widths[0]})",
            per_seed=_growth_per_seed(sp, last_t),
            threshold=C1_SP_GROWTH,
            direction=">=",
            precondition=precondition,
            control=Control(
                "muP + Adam, the same logits ratio (muP keeps the logits Θ(1))",
                per_seed=_growth_per_seed(mup, last_t),
            ),
            detail=f"width ratio {span:g}",
        ),
        judge(
            claim="c2: muP + Adam: every layer's mean |activation| stays flat in width",
            metric=f"per seed, max over modules {', '.join(GATED_MODULES)} and t in "
            f"{tuple(steps)} of max_w l1 / min_w l1",
            per_seed=c2_mup,
            threshold=C2_MUP_SPREAD,
            direction="<=",
            precondition=precondition,
            control=Control(
                "SP + Adam, the same worst spread (SP's logits grow with width)", per_seed=c2_sp
            ),
            detail="worst at " + "; ".join(where),
        ),
    ]
    rows = []
    for name, table in (("standard", sp_rows), ("mup", mup_rows)):
        for (module, _t), row in sorted(table.items()):
            if module in GATED_MODULES:
                rows.append({"parametrization": name, **row})
    return verdicts, rows


def _c3_rows(runs: list[Run]) -> list[dict]:
    rows = []
    for run in runs:
        cfg = CoordRunConfig.model_validate(run.config)
        summary = _summary(run, "rel_change")
        last = max(t for _, t in summary)
        row = summary[("W1", last)]
        records = [r for r in load_records(run, "rel_change") if r.module == "W1" and r.t == last]
        by_width = {w: np.mean([r.rel_change for r in records if r.width == w]) for w in cfg.widths}
        rows.append(
            {
                "parametrization": cfg.parametrization,
                "optimizer": cfg.optimizer,
                "updates": last - 1,
                "slope_vs_width": row["slope"],
                "expected_slope": -0.5 if cfg.parametrization == "ntk" else 0.0,
                **{f"rel_change_w{w}": float(v) for w, v in by_width.items()},
            }
        )
    return rows


def _transfer_rows(runs: list[Run], figures: Path) -> tuple[list[dict], list[Path]]:
    if not runs:
        return [], []
    rows = []
    fig, axes = new_figure(len(runs), title="learning-rate transfer (Adam): final train loss")
    for ax, run in zip(axes, runs):
        cfg = CoordRunConfig.model_validate(run.config)
        widths = run.tensors("widths")[1][0]
        lrs = run.tensors("lrs")[1][0]
        loss = run.tensors("final_loss")[1][0]  # [n_widths, n_lrs]
        for i, w in enumerate(widths):
            ax.plot(lrs, loss[i], "o-", ms=3, label=f"w={int(w)}")
            best = int(np.nanargmin(loss[i])) if np.isfinite(loss[i]).any() else -1
            rows.append(
                {
                    "parametrization": cfg.parametrization,
                    "width": int(w),
                    "best_lr": float(lrs[best]) if best >= 0 else float("nan"),
                    "best_loss": float(loss[i, best]) if best >= 0 else float("nan"),
                }
            )
        ax.set_xscale("log")
        ax.set(xlabel="Adam lr (base width)", ylabel="final train loss (nats)")
        ax.set_title(cfg.parametrization)
        ax.legend(fontsize=7)
    return rows, [save_figure(fig, figures / "lr_transfer.png")]


def analyze(runs: dict[str, Run], figures: Path) -> Analysis:
    """Verdicts c1 (SP grows) and c2 (muP flat); c3 and the extras reported in tables."""
    sp = runs["coord_standard_adam"]
    mup = runs["coord_mup_adam"]
    verdicts, rows = _verdicts(sp, mup)
    paths = []
    for name, run in (("standard", sp), ("mup", mup)):
        fig = plot_coord_check(
            load_records(run),
            modules=GATED_MODULES,
            title=f"coordinate check, {name} + Adam: mean |activation| vs width",
        )
        paths.append(save_figure(fig, figures / f"coord_{name}_adam.png"))
    c3_runs = [run for key, run in sorted(runs.items()) if key.endswith("_c3")]
    c3 = _c3_rows(c3_runs)
    if c3_runs:
        fig, axes = new_figure(1, title="c3: hidden-feature change after training (SignSGD)")
        for run, row in zip(c3_runs, c3):
            widths = CoordRunConfig.model_validate(run.config).widths
            values = [row[f"rel_change_w{w}"] for w in widths]
            axes[0].loglog(
                widths,
                values,
                "o-",
                label=f"{row['parametrization']} (slope {row['slope_vs_width']:.2f})",
            )
        axes[0].set(xlabel="width", ylabel="||h_t − h_1|| / ||h_1||")
        axes[0].legend()
        paths.append(save_figure(fig, figures / "c3_feature_change.png"))
    tables = {"coordinate check summary (Adam, gated modules)": rows}
    tables["c3 (reported, not gated): relative hidden change vs width"] = c3
    extras = []
    for key, run in sorted(runs.items()):
        cfg = CoordRunConfig.model_validate(run.config)
        if key in ("coord_standard_adam", "coord_mup_adam") or key.endswith("_c3"):
            continue
        if cfg.kind == "coord":
            for (module, _t), row in sorted(_summary(run).items()):
                if module in GATED_MODULES:
                    extras.append({"run": key, **row})
    if extras:
        tables["extra coordinate checks (paper)"] = extras
    transfer = [r for r in runs.values() if r.config.get("kind") == "lr_transfer"]
    rows_t, figs_t = _transfer_rows(transfer, figures)
    if rows_t:
        tables["learning-rate transfer: best Adam lr per width"] = rows_t
    return Analysis(verdicts, paths + figs_t, tables)


STUDY = Study(
    name="mup-coordinate-check",
    claim=CLAIM,
    source=SOURCE,
    presets={"smoke": smoke, "fast": fast, "paper": paper},
    build_runs=build_runs,
    analyze=analyze,
)
