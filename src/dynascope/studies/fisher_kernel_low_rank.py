"""Study ``fisher-kernel-low-rank`` (SYSTEMS.md S14): the Neural Fisher Kernel of a trained
classifier is close to low-rank, and a matrix-free randomized SVD recovers its top directions.

Source: R. Zhang, S. Zhai, E. Littwin, J. Susskind, "Learning Representation from Neural Fisher
Kernel with Low-rank Approximation", ICLR 2022, arXiv 2202.01944. Randomized SVD: Halko,
Martinsson & Tropp (2011), arXiv 0909.4061.

System (S14 "CPU system"). ``load_digits`` (pixels / 16), fixed split 1,297 train / 500 test
(:class:`dynascope.tasks.Digits` with ``patch_size=8``, ``split_seed``); an
:class:`dynascope.nn.FCN` 64-64-64-10, ReLU, ``nn.Linear`` default init (8,970 parameters),
trained with Adam (lr 1e-3, batch 128, 2,000 steps; a fast-preset run measured ~5 s of
training on one thread, so the step count is S14's ~2k). Then, in float64 on the trained
weights, the scored set S = the first N = 500 training images (the split's fixed random order):

- score (S14's default, the JEM reading): ``s(x) = logsumexp_y f(x)_y``; centred by the mean
  score gradient over S; diagonal Fisher ``D_j = mean_S U_j^2 + 1e-8 * mean(.)``;
  ``Phi = C J D^{-1/2}`` (:mod:`dynascope.probes.fisher`). Options: ``score="conditional"``
  (``log p(y|x)`` with y sampled from ``p(.|x)``, so no labels leak into the test embedding),
  ``center``, ``fisher="identity"`` (D = I), ``damping``.
- exact path (oracle): ``Phi`` by chunked ``vmap(grad)``, ``K = Phi Phi^T`` ``[N, N]``, ``eigh``.
- randomized path: k = 32, oversampling 10, 2 power iterations, JVPs/VJPs only.
- linear probe: multinomial logistic regression (L2, C = 1, scikit-learn ``lbfgs``) fit on S,
  scored on the 500 test images, on the standardised (statistics of S) 32-d NFK embedding (test
  points embedded by k JVPs, :func:`dynascope.probes.fisher.nfk_transform`) vs on the
  standardised 64-d penultimate activations.

Verdicts (S14's proposals, frozen before the first fast run; reported as measured):

- f1 low rank: ``sum_{i<=k} lambda_i(K) / tr K >= 0.9`` (exact eigenvalues). Verdict metric.
- f2 fidelity: mean cosine of the principal angles between the exact and randomized top-k left
  singular subspaces ``>= 0.99``.
- f3 usefulness: probe accuracy(NFK-k) ``>=`` probe accuracy(penultimate) ``- 0.02``.

The verdicts read the runs with k = 32 when there are any (``paper`` sweeps k), else every run
(``smoke``, k = 4); with several runs the worst value is the measured one.

Measured on the fast preset (seed 0, 2026-12-01; 10 s CPU): test accuracy 0.972; f1 = 0.830
(fails: the spectrum decays slowly past i ~ 10, see ``eigenvalue_decay.png``); f2 = 0.986
(fails: the first 24 cosines are >= 0.99, the last fall to 0.87 where lambda_32 / lambda_42 is
only ~1.4); f3: 0.974 (NFK-32) vs 0.968 (penultimate), holds. One-off check, not gated: with 6
power iterations instead of S14's 2 the mean cosine is 0.9997, so the shortfall is the
recipe's convergence on a flat spectrum, not the operator.

``model="cnn"`` (``paper`` only) swaps in :class:`dynascope.nn.cnn.SimpleCNN` (bias-free 3x3
convolutions, Kaiming normal init; penultimate = the pooled channels). Not built (S14
``paper`` items, left for a later issue): the VAE (ELBO score) and GAN (discriminator energy)
models, and the 10-labels-per-class semi-supervised probe.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch.func import functional_call

from dynascope.nn.cnn import SimpleCNN
from dynascope.nn.fcn import FCN
from dynascope.probes.fisher import (
    conditional_score,
    diagonal_fisher,
    jem_score,
    mean_score_gradient,
    nfk_embedding,
    nfk_features,
    nfk_transform,
    principal_angle_cosines,
)
from dynascope.report import new_figure, save_figure
from dynascope.store import Run, RunStore
from dynascope.studies.base import Analysis, RunSpec, Study, Verdict, one_intra_op_thread
from dynascope.tasks.digits import Digits

__all__ = ["FisherKernelPreset", "FisherKernelRunConfig", "STUDY", "analyze", "run_fisher_kernel"]

CLAIM = (
    "The Neural Fisher Kernel of a trained classifier is close to low-rank: its top 32 "
    "directions, computed matrix-free by randomized SVD, match the exact ones and give "
    "embeddings as good for linear probing as the penultimate layer."
)
SOURCE = (
    "Zhang, Zhai, Littwin, Susskind, 'Learning Representation from Neural Fisher Kernel with "
    "Low-rank Approximation', ICLR 2022, arXiv 2202.01944"
)

# Frozen thresholds (S14's proposals; see the module docstring).
F1_ENERGY = 0.9
F2_COSINE = 0.99
F3_MARGIN = 0.02
VERDICT_K = 32


class FisherKernelRunConfig(BaseModel):
    """One run: train the classifier, then the exact and randomized NFK and the probes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["fisher_kernel"] = "fisher_kernel"
    seed: int = Field(0, ge=0, description="model init, batches, sketch")
    split_seed: int = Field(0, ge=0)
    n_train: int = Field(1297, ge=2, le=1796, description="training split; the rest is test")
    model: Literal["mlp", "cnn"] = "mlp"
    hidden: list[int] = Field(default_factory=lambda: [64, 64], min_length=1)
    cnn_arch: str = Field("32-32-avg-64-64", description="SimpleCNN layers (model='cnn')")
    lr: float = Field(1e-3, gt=0, description="Adam learning rate")
    batch_size: int = Field(128, ge=1)
    steps: int = Field(2000, ge=0)
    log_every: int = Field(50, ge=1)
    n_scored: int = Field(500, ge=2, description="N, scored training points (S)")
    k: int = Field(32, ge=1, description="embedding rank")
    oversampling: int = Field(10, ge=0)
    power_iters: int = Field(2, ge=0)
    score: Literal["energy", "conditional"] = "energy"
    center: bool = True
    fisher: Literal["diagonal", "identity"] = "diagonal"
    damping: float = Field(1e-8, ge=0, description="relative damping of the diagonal Fisher")
    probe_C: float = Field(1.0, gt=0, description="inverse L2 strength of the linear probe")
    chunk_size: int = Field(100, ge=1, description="examples per vmap/JVP/VJP sweep")
    device: str = "cpu"

    @model_validator(mode="after")
    def _scored_fit(self) -> FisherKernelRunConfig:
        if self.n_scored > self.n_train:
            raise ValueError(
                f"n_scored must be <= n_train (got n_scored={self.n_scored}, "
                f"n_train={self.n_train})"
            )
        if self.k > self.n_scored:
            raise ValueError(f"k must be <= n_scored (got k={self.k}, n_scored={self.n_scored})")
        return self


class FisherKernelPreset(BaseModel):
    """A preset: the base run and the embedding ranks k to sweep (one run each)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base: FisherKernelRunConfig
    ks: list[int] = Field(min_length=1)
    models: list[Literal["mlp", "cnn"]] = Field(default_factory=lambda: ["mlp"], min_length=1)


def _build_model(config: FisherKernelRunConfig) -> FCN | SimpleCNN:
    """FCN 64-hidden-10 (``nn.Linear`` init) or SimpleCNN (Kaiming normal), from ``seed``."""
    if config.model == "cnn":
        return SimpleCNN(config.cnn_arch, generator=torch.Generator().manual_seed(config.seed))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        return FCN(64, config.hidden, 10)


def _images(model: FCN | SimpleCNN, x: torch.Tensor) -> torch.Tensor:
    """Digits ``[batch, 1, 64]`` as the model's input: ``[batch, 64]`` or ``[batch, 1, 8, 8]``."""
    shape = (1, 8, 8) if isinstance(model, SimpleCNN) else (64,)
    return x.reshape(x.shape[0], *shape)


def _score_fn(model: FCN | SimpleCNN, kind: str):
    def score(params, inputs):
        if kind == "energy":
            return jem_score(functional_call(model, params, (inputs,)))
        x, y = inputs
        return conditional_score(functional_call(model, params, (x,)), y)

    return score


def _penultimate(model: FCN | SimpleCNN, x: torch.Tensor) -> torch.Tensor:
    """The readout's input: last hidden layer ``[batch, hidden[-1]]`` or pooled channels."""
    if isinstance(model, SimpleCNN):
        return model.features(x).mean(dim=(-2, -1))
    h = x
    for block in model.blocks:
        h = torch.relu(h @ block.W + block.b)
    return h


def _probe_accuracy(train: np.ndarray, y_train, test: np.ndarray, y_test, C: float) -> float:
    """Standardise with the training statistics, fit L2 logistic regression, test accuracy."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    scaler = StandardScaler().fit(train)
    clf = LogisticRegression(C=C, max_iter=5000).fit(scaler.transform(train), y_train)
    return float(clf.score(scaler.transform(test), y_test))


def run_fisher_kernel(
    config: FisherKernelRunConfig, run_dir: Path, progress: bool = False, device: str | None = None
) -> None:
    """Train, then log the NFK spectrum, the randomized embedding and the probe accuracies.

    Logged: ``train.loss`` every ``log_every`` steps; at the last step ``test.accuracy``,
    tensors ``nfk.eigenvalues`` ``[N]`` (exact, descending), ``nfk.randomized_sq_sv`` ``[k]``
    (Sigma_k^2), ``nfk.cosines`` ``[k]``; scalars ``f1.energy_fraction``, ``f2.mean_cosine``,
    ``probe.nfk.accuracy``, ``probe.penultimate.accuracy``, ``nystrom.max_error`` (scored
    points re-embedded by JVPs vs ``U_k Sigma_k``), ``time.exact_s``, ``time.randomized_s``.
    ``device`` (``cpu``/``cuda``, from ``dynascope study run --device``) overrides
    ``config.device``; ``None`` keeps it.
    """
    del progress
    dev = torch.device(device or config.device)
    with one_intra_op_thread(), RunStore(run_dir) as store:
        store.truncate_after(-1)
        store.write_config(config.model_dump(mode="json"))
        store.set_status(0, "running")
        _train_and_measure(config, dev, store)
        store.set_status(config.steps, "finished")


def _train_and_measure(config: FisherKernelRunConfig, dev: torch.device, store: RunStore) -> None:
    task = Digits(patch_size=8, n_train=config.n_train, split_seed=config.split_seed)
    g = torch.Generator().manual_seed(config.seed)
    model = _build_model(config).to(dev)
    train_all = task.batch("train", task.split_size("train"), g)
    test = task.batch("val", task.split_size("val"), g)
    opt = torch.optim.Adam(model.parameters(), lr=config.lr)
    for step in range(config.steps):
        batch = {k: v.to(dev) for k, v in task.batch("train", config.batch_size, g).items()}
        loss = task.loss(model(_images(model, batch["x"])), batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % config.log_every == 0 or step == config.steps - 1:
            store.log(step + 1, {"train.loss": loss.detach()})
    T = config.steps
    model = model.double().eval()
    xs = _images(model, train_all["x"][: config.n_scored]).to(dev, torch.float64)
    ys = train_all["y"][: config.n_scored]
    xt = _images(model, test["x"]).to(dev, torch.float64)
    yt = test["y"]
    params = {k: v.detach() for k, v in model.named_parameters()}
    with torch.no_grad():
        store.log(T, {"test.accuracy": (model(xt).argmax(-1).cpu() == yt).double().mean()})
    score = _score_fn(model, config.score)
    s_in, t_in = xs, xt
    if config.score == "conditional":  # y ~ p(.|x): the embedding of a test point needs no label
        with torch.no_grad():
            gs = torch.Generator(device=dev).manual_seed(config.seed + 1)
            s_in = (xs, torch.multinomial(model(xs).softmax(-1), 1, generator=gs)[:, 0])
            t_in = (xt, torch.multinomial(model(xt).softmax(-1), 1, generator=gs)[:, 0])
    cs = config.chunk_size
    t0 = time.perf_counter()
    g_bar = mean_score_gradient(score, params, s_in, chunk_size=cs) if config.center else None
    D = None
    if config.fisher == "diagonal":
        D = diagonal_fisher(
            score,
            params,
            s_in,
            center=config.center,
            mean_grad=g_bar,
            damping=config.damping,
            chunk_size=cs,
        )
    t_stats = time.perf_counter() - t0
    kw = dict(fisher_diag=D, center=config.center, mean_grad=g_bar, chunk_size=cs)
    t0 = time.perf_counter()
    phi = nfk_features(score, params, s_in, **kw)  # [N, P]
    evals, evecs = torch.linalg.eigh(phi @ phi.mT)
    evals, evecs = evals.flip(0), evecs.flip(1)
    t_exact = time.perf_counter() - t0 + t_stats
    del phi
    t0 = time.perf_counter()
    gen = torch.Generator(device=dev).manual_seed(config.seed)
    emb = nfk_embedding(
        score,
        params,
        s_in,
        config.k,
        oversampling=config.oversampling,
        power_iters=config.power_iters,
        generator=gen,
        **kw,
    )
    t_rand = time.perf_counter() - t0 + t_stats
    k = config.k
    cos = principal_angle_cosines(evecs[:, :k], emb.left)
    energy = evals[:k].sum() / evals.sum()
    again = nfk_transform(emb, score, params, s_in, chunk_size=cs)
    nfk_test = nfk_transform(emb, score, params, t_in, chunk_size=cs)
    with torch.no_grad():
        pen_s, pen_t = _penultimate(model, xs), _penultimate(model, xt)
    acc_nfk = _probe_accuracy(
        emb.embedding.cpu().numpy(), ys.numpy(), nfk_test.cpu().numpy(), yt.numpy(), config.probe_C
    )
    acc_pen = _probe_accuracy(
        pen_s.cpu().numpy(), ys.numpy(), pen_t.cpu().numpy(), yt.numpy(), config.probe_C
    )
    store.log(
        T,
        {
            "nfk.eigenvalues": evals,
            "nfk.randomized_sq_sv": emb.singular_values.square(),
            "nfk.cosines": cos,
            "f1.energy_fraction": energy,
            "f2.mean_cosine": cos.mean(),
            "probe.nfk.accuracy": acc_nfk,
            "probe.penultimate.accuracy": acc_pen,
            "nystrom.max_error": (again - emb.embedding).abs().max() / emb.embedding.abs().max(),
            "time.exact_s": t_exact,
            "time.randomized_s": t_rand,
            "n_params": float(sum(p.numel() for p in params.values())),
        },
    )


# -- presets ----------------------------------------------------------------------------------
def smoke() -> FisherKernelPreset:
    """S14 smoke: MLP 64-16-16-10, N = 50, k = 4, oversampling 4, 50 steps (seconds)."""
    base = FisherKernelRunConfig(
        hidden=[16, 16], steps=50, log_every=10, n_scored=50, k=4, oversampling=4
    )
    return FisherKernelPreset(base=base, ks=[4])


def fast() -> FisherKernelPreset:
    """S14's CPU system: 64-64-64-10, N = 500, k = 32, 2,000 Adam steps (about 10 s CPU)."""
    return FisherKernelPreset(base=FisherKernelRunConfig(), ks=[32])


def paper() -> FisherKernelPreset:
    """GPU: every training point scored, k in {16, 32, 64, 128}, a wider MLP (256-256) and
    the small CNN 32-32-avg-64-64.

    The VAE and GAN models of S14's paper preset are not built yet (module docstring).
    """
    base = FisherKernelRunConfig(
        hidden=[256, 256], steps=10_000, n_scored=1297, chunk_size=256, device="cuda"
    )
    return FisherKernelPreset(base=base, ks=[16, 32, 64, 128], models=["mlp", "cnn"])


def build_runs(preset: FisherKernelPreset, seed: int = 0) -> list[RunSpec]:
    """One run per model and k (each k retrains the same model: same seed)."""
    specs = []
    for model in preset.models:
        for k in preset.ks:
            update = {"model": model, "k": k, "seed": preset.base.seed + seed}
            cfg = preset.base.model_copy(update=update)
            specs.append(RunSpec(f"nfk_{model}_k{k}", cfg, run_fisher_kernel))
    return specs


# -- analysis ---------------------------------------------------------------------------------
def _row(name: str, run: Run) -> dict:
    cfg = FisherKernelRunConfig.model_validate(run.config)
    row = {"run": name, "model": cfg.model, "k": cfg.k, "N": cfg.n_scored, "status": run.status}
    for key in (
        "f1.energy_fraction",
        "f2.mean_cosine",
        "probe.nfk.accuracy",
        "probe.penultimate.accuracy",
        "test.accuracy",
        "nystrom.max_error",
        "time.exact_s",
        "time.randomized_s",
        "n_params",
    ):
        try:
            row[key] = run.last(key)
        except KeyError:
            row[key] = math.nan
    row["probe gap"] = row["probe.nfk.accuracy"] - row["probe.penultimate.accuracy"]
    return row


def _worst(values: list[float], lowest: bool = True) -> float:
    if not values or any(math.isnan(v) for v in values):
        return math.nan
    return min(values) if lowest else max(values)


def analyze(runs: dict[str, Run], figures: Path) -> Analysis:
    """Verdicts f1-f3 from the stored runs; eigenvalue-decay and fidelity figures."""
    rows = [_row(name, run) for name, run in sorted(runs.items())]
    rows.sort(key=lambda r: (r["model"], r["k"]))
    gated = [r for r in rows if r["k"] == VERDICT_K] or rows
    ks = sorted({r["k"] for r in gated})
    f1 = _worst([r["f1.energy_fraction"] for r in gated])
    f2 = _worst([r["f2.mean_cosine"] for r in gated])
    f3 = _worst([r["probe gap"] for r in gated])
    acc = "; ".join(
        f"{r['model']} k={r['k']}: NFK {r['probe.nfk.accuracy']:.3f}, penultimate "
        f"{r['probe.penultimate.accuracy']:.3f}"
        for r in gated
    )
    verdicts = [
        Verdict(
            f"f1: the NFK is low-rank: its top k={ks} eigenvalues hold >= {F1_ENERGY:g} of tr K",
            "sum_{i<=k} lambda_i(K) / tr K, exact eigenvalues (worst over gated runs)",
            f1,
            F1_ENERGY,
            bool(f1 >= F1_ENERGY),
            "measured >= threshold",
        ),
        Verdict(
            "f2: the matrix-free randomized SVD recovers the exact top-k left singular subspace",
            "mean cosine of the principal angles, exact vs randomized (worst over gated runs)",
            f2,
            F2_COSINE,
            bool(f2 >= F2_COSINE),
            "measured >= threshold",
        ),
        Verdict(
            "f3: linear probes on the k-d NFK embedding are within 2 points of the penultimate "
            "layer's",
            "probe accuracy(NFK-k) - probe accuracy(penultimate), test split",
            f3,
            -F3_MARGIN,
            bool(f3 >= -F3_MARGIN),
            f"measured >= threshold; {acc}",
        ),
    ]
    return Analysis(
        verdicts, _figures(rows, runs, figures), {"runs: NFK spectrum and probes": rows}
    )


def _tensor(run: Run, key: str) -> np.ndarray | None:
    try:
        return run.tensors(key)[1][-1]
    except KeyError:
        return None


def _figures(rows: list[dict], runs: dict[str, Run], figures: Path) -> list[Path]:
    """Eigenvalue decay (one exact curve per model, randomized σ² per run) and fidelity."""
    several = len({r["model"] for r in rows}) > 1

    def tag(r: dict) -> str:
        return f"{r['model']}, k={r['k']}" if several else f"k={r['k']}"

    fig, (ax1, ax2) = new_figure(2, title="NFK eigenvalue decay (exact K = Φ Φᵀ on the scored set)")
    drawn, floor = set(), 1.0
    for r in rows:
        evals = _tensor(runs[r["run"]], "nfk.eigenvalues")
        if evals is None:
            continue
        total = evals.sum()
        if r["model"] not in drawn:  # the exact K does not depend on k
            drawn.add(r["model"])
            i = np.arange(1, len(evals) + 1)
            label = f"exact ({r['model']})" if several else "exact"
            ax1.loglog(i, np.maximum(evals / total, 1e-20), lw=1.5, label=label)
            ax2.semilogx(i, np.cumsum(evals) / total, lw=1.5, label=label)
            positive = evals[evals > 0] / total  # the centred K has a (near-)zero tail
            floor = min(floor, float(np.quantile(positive, 0.05)) / 3)
        sq = _tensor(runs[r["run"]], "nfk.randomized_sq_sv")
        if sq is not None:
            j = np.arange(1, len(sq) + 1)
            ax1.loglog(j, sq / total, "o", ms=3, mfc="none", label=f"randomized σ_i², {tag(r)}")
            ax2.semilogx(j, np.cumsum(sq) / total, "o", ms=3, mfc="none", label=tag(r))
        for ax in (ax1, ax2):
            ax.axvline(r["k"], color="grey", ls=":", lw=1)
    ax2.axhline(F1_ENERGY, color="tab:red", ls="--", lw=1, label=f"f1 threshold {F1_ENERGY:g}")
    ax1.set(xlabel="index i", ylabel="λ_i / tr K", title="normalised eigenvalues")
    ax1.set_ylim(max(1e-12, floor), 1.5)
    ax2.set(
        xlabel="index i",
        ylabel="cumulative Σ λ_j / tr K (j ≤ i)",
        title="cumulative energy",
        ylim=(0, 1.02),
    )
    if drawn:
        ax1.legend(fontsize=7)
    ax2.legend(fontsize=7, loc="lower right")
    paths = [save_figure(fig, figures / "eigenvalue_decay.png")]

    fig, (ax1, ax2, ax3) = new_figure(3, title="training, randomized-SVD fidelity, linear probes")
    for model in sorted({r["model"] for r in rows}):
        first = next(r for r in rows if r["model"] == model)
        loss = runs[first["run"]].scalar("train.loss")
        ax1.semilogy(loss.index, loss.values, label=model)
    ax1.set(xlabel="step", ylabel="cross-entropy (nats)", title="training loss (batch)")
    if several:
        ax1.legend(fontsize=7)
    for r in rows:
        cos = _tensor(runs[r["run"]], "nfk.cosines")
        if cos is not None:
            ax2.plot(np.arange(1, len(cos) + 1), cos, ".-", label=tag(r))
    ax2.axhline(F2_COSINE, color="tab:red", ls="--", lw=1, label=f"f2 threshold {F2_COSINE:g}")
    ax2.set(xlabel="principal angle i", ylabel="cos θ_i", title="exact vs randomized subspace")
    ax2.legend(fontsize=7)
    x = np.arange(len(rows))
    ax3.bar(x - 0.2, [r["probe.nfk.accuracy"] for r in rows], 0.4, label="NFK-k embedding")
    ax3.bar(x + 0.2, [r["probe.penultimate.accuracy"] for r in rows], 0.4, label="penultimate")
    for i, r in enumerate(rows):
        for dx, key in ((-0.2, "probe.nfk.accuracy"), (0.2, "probe.penultimate.accuracy")):
            ax3.text(i + dx, r[key] + 0.01, f"{r[key]:.3f}", ha="center", fontsize=7)
    ax3.set_xticks(x, [tag(r) for r in rows])
    ax3.set(ylabel="test accuracy", title="linear probe (fit on S)", ylim=(0, 1.15))
    ax3.legend(fontsize=7, loc="upper center", ncol=2)
    paths.append(save_figure(fig, figures / "fidelity_and_probes.png"))
    return paths


STUDY = Study(
    name="fisher-kernel-low-rank",
    claim=CLAIM,
    source=SOURCE,
    presets={"smoke": smoke, "fast": fast, "paper": paper},
    build_runs=build_runs,
    analyze=analyze,
)
