"""Runs of ``fisher-kernel-low-rank`` (S14): the classifier trained on the engine and the NFK
measured by a probe at step 0 (untrained: a diagnostic) and at the end; the ablation arm trains
on shuffled labels (notes:
docs/studies/fisher-kernel-low-rank.md)."""

from __future__ import annotations

import copy
from typing import Literal

import numpy as np
import torch
from pydantic import Field, model_validator
from torch.func import functional_call

from dynascope.monitor import EveryN
from dynascope.nn.cnn import SimpleCNN
from dynascope.nn.fcn import FCN
from dynascope.probes.fisher import (
    conditional_score,
    diagonal_fisher,
    fisher_scores,
    jem_score,
    mean_score_gradient,
    nfk_embedding,
    nfk_features,
    nfk_transform,
    principal_angle_cosines,
)
from dynascope.tasks.base import draw_from_split
from dynascope.tasks.digits import Digits
from dynascope.train import EngineRunConfig, Parts, SeedStreams

__all__ = ["FEW_EXAMPLES", "FisherKernelRun", "build_fisher", "measure_nfk", "probe_accuracy"]

FEW_EXAMPLES = 10  # diagnostic: a parameter whose score is non-zero on <= 10 scored examples


class FisherKernelRun(EngineRunConfig):
    """One run: train the classifier (Adam), then the exact and randomized NFK and the probes."""

    split_seed: int = Field(0, ge=0)
    n_train: int = Field(1297, ge=2, le=1796, description="training split; the rest is test")
    model: Literal["mlp", "cnn"] = "mlp"
    hidden: list[int] = Field(default_factory=lambda: [64, 64], min_length=1)
    cnn_arch: str = Field("32-32-avg-64-64", description="SimpleCNN layers (model='cnn')")
    lr: float = Field(1e-3, gt=0, description="Adam learning rate")
    batch_size: int = Field(128, ge=1)
    n_scored: int = Field(500, ge=2, description="N, scored training points (S)")
    k: int = Field(32, ge=1, description="embedding rank")
    oversampling: int = Field(10, ge=0)
    power_iters: int = Field(2, ge=0)
    score: Literal["energy", "conditional"] = "energy"
    center: bool = True
    fisher: Literal["diagonal", "identity"] = "diagonal"
    fisher_points: Literal["train", "scored"] = Field(
        "train", description="points the Fisher expectation (and centring) is estimated on"
    )
    damping: float = Field(1e-8, ge=0, description="relative damping of the diagonal Fisher")
    probe_C: float = Field(1.0, gt=0, description="inverse L2 strength of the linear probe")
    chunk_size: int = Field(100, ge=1, description="examples per vmap/JVP/VJP sweep")
    shuffle_labels: bool = Field(
        False,
        description="train on the training split's labels permuted once (stream 'labels'): the "
        "ablation arm; the NFK probes still read the true labels",
    )

    @model_validator(mode="after")
    def _scored_fit(self) -> FisherKernelRun:
        if self.n_scored > self.n_train:
            raise ValueError(
                f"n_scored must be <= n_train (got n_scored={self.n_scored}, "
                f"n_train={self.n_train})"
            )
        if self.k > self.n_scored:
            raise ValueError(f"k must be <= n_scored (got k={self.k}, n_scored={self.n_scored})")
        return self


def _images(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Digits ``[batch, 1, 64]`` as the model's input: ``[batch, 64]`` or ``[batch, 1, 8, 8]``."""
    shape = (1, 8, 8) if isinstance(model, SimpleCNN) else (64,)
    return x.reshape(x.shape[0], *shape)


def _score_fn(model: torch.nn.Module, kind: str):
    def score(params, inputs):
        if kind == "energy":
            return jem_score(functional_call(model, params, (inputs,)))
        x, y = inputs
        return conditional_score(functional_call(model, params, (x,)), y)

    return score


def _penultimate(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The readout's input: last hidden layer ``[batch, hidden[-1]]`` or pooled channels."""
    if isinstance(model, SimpleCNN):
        return model.features(x).mean(dim=(-2, -1))
    h = x
    for block in model.blocks:
        h = torch.relu(h @ block.W + block.b)
    return h


def probe_accuracy(train: np.ndarray, y_train, test: np.ndarray, y_test, C: float) -> float:
    """Standardise with the training statistics, fit L2 logistic regression, test accuracy."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    scaler = StandardScaler().fit(train)
    clf = LogisticRegression(C=C, max_iter=5000).fit(scaler.transform(train), y_train)
    return float(clf.score(scaler.transform(test), y_test))


def measure_nfk(config: FisherKernelRun, model: torch.nn.Module, data: dict, seed: int) -> dict:
    """Every S14 instrument on a float64 copy of ``model`` (``data``: train_x/y, test_x/y).

    ``f2.captured_energy`` = sum of the randomized sigma_i^2 / sum of the exact top-k
    eigenvalues (the share of the top-k energy the sketch's subspace holds); ``control.*``:
    the same share for k random orthonormal directions, and the NFK probe fit on shuffled
    labels. Randomness (sketch, sampled labels, shuffles) comes from ``seed`` alone, and no
    wall-clock timing is logged, so a resumed run's rows equal an uninterrupted run's.
    """
    model = copy.deepcopy(model).double().eval()
    dev = next(model.parameters()).device
    xs_all = _images(model, data["train_x"]).to(dev, torch.float64)
    xs, ys = xs_all[: config.n_scored], data["train_y"][: config.n_scored]
    xt, yt = _images(model, data["test_x"]).to(dev, torch.float64), data["test_y"]
    params = {k: v.detach() for k, v in model.named_parameters()}
    g = torch.Generator(device=dev).manual_seed(seed)
    score = _score_fn(model, config.score)
    s_in, t_in, f_in = xs, xt, xs_all if config.fisher_points == "train" else xs
    if config.score == "conditional":  # y ~ p(.|x): no label leaks into the test embedding
        with torch.no_grad():
            draw = lambda x: torch.multinomial(model(x).softmax(-1), 1, generator=g)[:, 0]  # noqa: E731
            f_in = (f_in, draw(f_in))
            s_in, t_in = ((xs, f_in[1][: config.n_scored]) if config.fisher_points == "train"
                          else f_in), (xt, draw(xt))  # fmt: skip
    cs = config.chunk_size
    g_bar = mean_score_gradient(score, params, f_in, chunk_size=cs) if config.center else None
    D = None
    if config.fisher == "diagonal":
        D = diagonal_fisher(score, params, f_in, center=config.center, mean_grad=g_bar,
                            damping=config.damping, chunk_size=cs)  # fmt: skip
    kw = dict(fisher_diag=D, center=config.center, mean_grad=g_bar, chunk_size=cs)
    phi = nfk_features(score, params, s_in, **kw)  # [N, P]
    K = phi @ phi.mT
    del phi
    evals, evecs = torch.linalg.eigh(K)
    evals, evecs = evals.flip(0), evecs.flip(1)
    # f1 diagnostics (reported, not gated): how many scored examples each parameter's score
    # is non-zero on, and the same top-k fraction without the Fisher whitening (D = I)
    J = fisher_scores(score, params, s_in, center=False, chunk_size=cs)  # [N, P], raw
    n_on = (J != 0).sum(0)
    share_few = float(((n_on >= 1) & (n_on <= FEW_EXAMPLES)).double().mean())
    U = J - g_bar if config.center else J
    evals_id = torch.linalg.eigvalsh(U @ U.mT).flip(0)
    del J, U
    emb = nfk_embedding(score, params, s_in, config.k, oversampling=config.oversampling,
                        power_iters=config.power_iters, generator=g, **kw)  # fmt: skip
    k = config.k
    top = evals[:k].sum()
    Q = torch.linalg.qr(torch.randn(len(evals), k, generator=g, dtype=K.dtype, device=dev))[0]
    nfk_test = nfk_transform(emb, score, params, t_in, chunk_size=cs)
    again = nfk_transform(emb, score, params, s_in, chunk_size=cs)
    with torch.no_grad():
        pen_s, pen_t = _penultimate(model, xs), _penultimate(model, xt)
    e_s, e_t = emb.embedding.cpu().numpy(), nfk_test.cpu().numpy()
    shuffled = ys.numpy()[torch.randperm(len(ys), generator=torch.Generator().manual_seed(seed))]
    C = config.probe_C
    return {
        "nfk.eigenvalues": evals, "nfk.randomized_sq_sv": emb.singular_values.square(),
        "nfk.cosines": principal_angle_cosines(evecs[:, :k], emb.left),
        "f1.energy_fraction": top / evals.sum(),
        "f2.captured_energy": emb.singular_values.square().sum() / top,
        "control.random_energy": torch.trace(Q.mT @ K @ Q) / top,
        "probe.nfk.accuracy": probe_accuracy(e_s, ys.numpy(), e_t, yt.numpy(), C),
        "probe.nfk_shuffled.accuracy": probe_accuracy(e_s, shuffled, e_t, yt.numpy(), C),
        "probe.penultimate.accuracy": probe_accuracy(pen_s.cpu().numpy(), ys.numpy(),
                                                     pen_t.cpu().numpy(), yt.numpy(), C),
        "test.accuracy": (model(xt).argmax(-1).cpu() == yt).double().mean(),
        "nystrom.max_error": (again - emb.embedding).abs().max() / emb.embedding.abs().max(),
        "fisher.share_rare": float((D < 1e-3 * D.mean()).double().mean()) if D is not None else 0.0,
        "fisher.share_few_examples": share_few,
        "f1.energy_fraction_identity": evals_id[: config.k].sum() / evals_id.sum(),
        "n_params": float(sum(p.numel() for p in params.values())),
    }  # fmt: skip


def _loss(task: Digits):
    def loss(model: torch.nn.Module, batch: dict) -> torch.Tensor:
        return task.loss(model(_images(model, batch["x"])), batch)

    return loss


def build_fisher(config: FisherKernelRun, streams: SeedStreams) -> Parts:
    """The run: the fixed Digits split; weights from the engine's ``init`` stream (global RNG;
    SimpleCNN from stream ``model``); batches from ``data`` (with ``shuffle_labels``, of the
    training split with its labels permuted once from stream ``labels``: the ablation arm of
    f1/f3, arXiv 2202.01944 sec. 3-4); the NFK probe at step 0 (a diagnostic) and at the end,
    both reading the true labels."""
    task = Digits(patch_size=8, n_train=config.n_train, split_seed=config.split_seed)
    g = streams.generator("task")
    train_all = task.batch("train", task.split_size("train"), g)
    test = task.batch("val", task.split_size("val"), g)
    data = {"train_x": train_all["x"], "train_y": train_all["y"], "test_x": test["x"],
            "test_y": test["y"]}  # fmt: skip
    if config.model == "cnn":
        model: torch.nn.Module = SimpleCNN(config.cnn_arch, generator=streams.generator("model"))
    else:
        model = FCN(64, config.hidden, 10)
    seed = streams("measure")

    def nfk(model: torch.nn.Module, ctx: object) -> dict:
        return measure_nfk(config, model, data, seed)

    def batches(gen: torch.Generator) -> dict:
        return task.batch("train", config.batch_size, gen)

    if config.shuffle_labels:  # one fixed permutation of the labels: the ablation arm
        order = torch.randperm(len(data["train_y"]), generator=streams.generator("labels"))
        x_train, y_shuffled = data["train_x"], data["train_y"][order]

        def batches(gen: torch.Generator) -> dict:
            return draw_from_split(x_train, y_shuffled, config.batch_size, gen)

    return Parts(
        model=model,
        data=batches,
        loss=_loss(task),
        optimizer=lambda m: torch.optim.Adam(m.parameters(), lr=config.lr),
        probes=[(nfk, EveryN(config.loop.steps))],
    )
