"""Study ``permuted-initialisations`` (SYSTEMS.md S7): permuted random inits perform above chance.

Source: F. Benzing, S. Schug, R. Meier, J. von Oswald, Y. Akram, N. Zucchet, L. Aitchison,
A. Steger, "Random initialisations performing above chance and how to find them", OPT 2022
(NeurIPS workshop), arXiv 2209.07509; reference code freedbee/permuted_initialisations.

Finding: two nets trained from different seeds become (nearly) linearly connected once the
hidden units of one are permuted to match the other (activation matching). Applied to their
*untrained* initialisations, the same permutation makes the average of the two random inits
classify clearly above chance; the unpermuted average stays at chance. CNNs keep a barrier.

System (each run trains ``n_nets`` nets of one architecture and measures everything; ``analyze``
reads only the stores):

- Data: :class:`dynascope.tasks.Digits` (``patch_size=8``), stratified split 1,297 train / 500
  test (``split_seed`` 0), pixels / 16, no centring. MLPs read the 64-vector, CNNs the 1×8×8
  image (the same numbers reshaped). Accuracies, NLLs and barriers are on the 500 test images.
- Tempered NLL (S7 open detail): the inverse temperature is tuned per evaluated net on the
  test images themselves (``temperature_on="test"``, the reference code's choice). S7's
  proposal, a 20% slice of the training split (``"train_slice"``, ``tune_fraction``), was
  measured once on the fast grid and rejected: the trained nets fit their training images
  almost perfectly, so the tuned inverse temperature of an end point reached 40 and
  the "tempered" NLL barriers of the 64-512-512-10 pairs came out at 2.2-3.5 nats, larger than
  the untempered ones (0.04-0.8 nats). Not gated either way.
- Models: :class:`dynascope.nn.KaimingMLP` (ReLU, bias-free, N(0, 2/fan_in) everywhere) and
  :class:`dynascope.nn.SimpleCNN` (bias-free conv3×3 + ReLU, 2×2 average pools, global
  average pool, linear readout).
- Training: AdamW (lr 1e-3, weight decay 0.01: PyTorch defaults), batch 100 drawn without
  replacement per step, ``n_updates`` = 130 (10 digit epochs; S7's knob). Net i of a run draws
  its init and its batches from seed ``seed * n_nets + i`` (so the fast n-way run's nets 0-5
  are the 64-1024-10 pairs' nets, and its first pair repeats pair 0's numbers).
- Matching: activation matching (:func:`dynascope.probes.permutation.activation_matching`,
  uncentred cosine, all training images) of nets 1..n-1 to net 0 at each step T in
  ``match_steps`` and at the end; weight matching (Git Re-Basin coordinate descent, random
  visit order from the run seed) of net 1 to net 0 at the end, for comparison. ``center=True``
  matches on Pearson correlations instead (S7 open detail; off, as the reference code). No
  BatchNorm (the instruments reject it), so S7's before/after-BN question does not arise.
  Units dead on every training image cannot be told apart by activations; the self-check
  table shows a recovered fraction of at least 1 − dead fraction.
- Measured: test accuracy / NLL / tempered NLL along θ(α) = α θ_0 + (1 − α) θ_1 (11 points)
  for the trained nets unpermuted (``vanilla``), activation-matched and weight-matched, and
  their barriers (NLL, tempered NLL, error); the accuracy of the average of the two inits
  unpermuted, permuted with π_T (each T) and with the weight-matching π; the n-way averages
  of permuted inits (``nway`` runs); self-checks on net 0: a random permutation changes no
  output, matching net 0 to its permuted copy recovers the permutation, the barrier of net 0
  with itself.
- Transformers (issue 20; reported, not gated): per seed pair two recall transformers trained
  by the engine, matched by ``match_transformers``, NLL/error barriers before and after
  (:mod:`dynascope.studies._transformer_barrier`, docs/permutations.md).

Verdicts (per gated architecture, the ``pairs`` group: MLP 64-1024-10 and 64-512-512-10; means
over the seed pairs; chance = 0.10):

- p1: accuracy of the average of the permuted inits (π from the trained nets, activation
  matching) ≥ 0.30.
- p2: accuracy of the unpermuted init average ≤ 0.20.
- p3: trained nets: mean accuracy at α = 0.5 permuted ≥ vanilla, and mean NLL barrier
  permuted ≤ vanilla. Measured: vanilla − permuted NLL barrier (nats), threshold 0.

Calibration: the thresholds are S7's proposals (0.30, 0.20, and the orderings of p3). They were
frozen before the first fast run and not changed after it; S7 allowed one calibration from
measured runs, which was not used. Width sweep, accuracy vs T, n-way averages, weight matching
and the CNN are reported, not gated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, model_validator

from dynascope.nn.cnn import SimpleCNN, parse_cnn_arch
from dynascope.nn.permutation_nets import KaimingMLP
from dynascope.probes import permutation as perm
from dynascope.store import RunStore
from dynascope.studies._permuted_initialisations_analysis import analyze
from dynascope.studies._transformer_barrier import TransformerBarrierConfig, run_transformer_barrier
from dynascope.studies.base import RunSpec, Study, one_intra_op_thread
from dynascope.tasks import Digits

__all__ = [
    "STUDY",
    "PermutedInitRunConfig",
    "PermutedInitialisationsPreset",
    "build_runs",
    "run_permuted_inits",
]

CLAIM = (
    "Permuting one net's hidden units to match another's (activation matching after training) "
    "and applying that permutation to the random initialisations makes the average of the two "
    "inits classify above chance, while the unpermuted average stays at chance; the permuted "
    "trained nets have a lower loss barrier."
)
SOURCE = (
    "Benzing, Schug, Meier, von Oswald, Akram, Zucchet, Aitchison, Steger, 'Random "
    "initialisations performing above chance and how to find them', OPT 2022, arXiv 2209.07509"
)


class PermutedInitRunConfig(BaseModel):
    """One run: ``n_nets`` nets of one architecture, trained, matched, averaged, measured."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    group: Literal["pairs", "width", "nway", "cnn"] = "pairs"
    model: Literal["mlp", "cnn"] = "mlp"
    hidden: list[int] = Field(default_factory=lambda: [1024], min_length=1)
    arch: str = Field("32-32-avg-64-64", description="CNN layer string (model='cnn')")
    use_bias: bool = False
    n_nets: int = Field(2, ge=2, le=64)
    seed: int = Field(0, ge=0)
    n_train: int = Field(1297, ge=20, le=1787)
    split_seed: int = Field(0, ge=0)
    n_updates: int = Field(130, ge=1, description="optimizer steps per net")
    batch_size: int = Field(100, ge=1)
    optimizer: Literal["adamw", "sgd"] = "adamw"
    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    momentum: float = Field(0.9, ge=0, lt=1, description="SGD only")
    match_steps: list[int] = Field(default_factory=list, description="extra T (end is added)")
    n_match: int | None = Field(None, ge=1, description="matching images (None: all train)")
    center: bool = Field(False, description="Pearson instead of uncentred cosine")
    temperature_on: Literal["test", "train_slice"] = "test"
    tune_fraction: float = Field(0.2, gt=0, lt=1, description="train_slice: fraction of train")
    n_alphas: int = Field(11, ge=3)
    weight_matching: bool = True

    @model_validator(mode="after")
    def _check(self) -> PermutedInitRunConfig:
        if self.model == "cnn":
            parse_cnn_arch(self.arch)
        if any(w < 1 for w in self.hidden):
            raise ValueError(f"hidden widths must be >= 1 (got hidden={self.hidden})")
        bad = [t for t in self.match_steps if not 0 <= t <= self.n_updates]
        if bad:
            raise ValueError(f"match_steps must lie in [0, n_updates={self.n_updates}] (got {bad})")
        return self

    @property
    def label(self) -> str:
        """``MLP 64-1024-10`` or ``CNN 32-32-avg-64-64``."""
        if self.model == "cnn":
            return f"CNN {self.arch}"
        return "MLP " + "-".join(map(str, [64, *self.hidden, 10]))


class OptimizerChoice(BaseModel):
    """An optimizer setting for the CNN runs (S7: AdamW 1e-3; SGD lr 0.01 and 0.03)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    optimizer: Literal["adamw", "sgd"] = "adamw"
    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(0.01, ge=0)


class PermutedInitialisationsPreset(BaseModel):
    """A preset: shared run settings and the grid of architectures."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base: PermutedInitRunConfig
    pair_hidden: list[list[int]] = Field(min_length=1, description="gated MLP architectures")
    n_pairs: int = Field(3, ge=1)
    widths: list[int] = Field(default_factory=list, description="width sweep (1 pair each)")
    width_depths: list[int] = Field(default_factory=lambda: [1])
    nway_hidden: list[int] | None = None
    nway_nets: int = Field(10, ge=3)
    cnn_archs: list[str] = Field(default_factory=list)
    cnn_optimizers: list[OptimizerChoice] = Field(default_factory=lambda: [OptimizerChoice()])
    cnn_pairs: int = Field(1, ge=1)
    transformer_pairs: int = Field(0, ge=0, description="recall transformers: barrier runs")
    transformer: TransformerBarrierConfig = Field(default_factory=TransformerBarrierConfig)


# -- the runner -------------------------------------------------------------------------------
def _build(config: PermutedInitRunConfig, generator: torch.Generator) -> torch.nn.Module:
    if config.model == "cnn":
        return SimpleCNN(config.arch, use_bias=config.use_bias, generator=generator)
    return KaimingMLP(64, config.hidden, 10, use_bias=config.use_bias, generator=generator)


def _train(config, index, task, shape, device, store):
    """Train net ``index``; return its model (trained) and params at step 0 and each kept T."""
    generator = torch.Generator().manual_seed(config.seed * config.n_nets + index)
    model = _build(config, generator).to(device)
    if config.optimizer == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    else:
        opt = torch.optim.SGD(
            model.parameters(),
            lr=config.lr,
            momentum=config.momentum,
            weight_decay=config.weight_decay,
        )
    kept = set(config.match_steps) | {0, config.n_updates}
    snapshots = {
        0: [(w.clone(), b if b is None else b.clone()) for w, b in perm.layer_params(model)]
    }
    for step in range(1, config.n_updates + 1):
        batch = task.batch("train", config.batch_size, generator)
        loss = F.cross_entropy(model(batch["x"].reshape(shape).to(device)), batch["y"].to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        store.log(step, {f"net{index}.train.loss": loss.detach()})
        if not torch.isfinite(loss):
            return None, snapshots
        if step in kept:
            snapshots[step] = [
                (w.clone(), b if b is None else b.clone()) for w, b in perm.layer_params(model)
            ]
    return model, snapshots


def run_permuted_inits(
    config: PermutedInitRunConfig, run_dir: Path, progress: bool = False, device: str = "cpu"
) -> None:
    """Train, match, interpolate and average (module docstring); write the run's store.

    One intra-op thread (restored afterwards): matrices here are at most 2048 wide and on a
    busy 2-core machine a second thread only adds hand-offs.
    """
    del progress
    with one_intra_op_thread():
        _run(config, Path(run_dir), torch.device(device))


def _run(config: PermutedInitRunConfig, run_dir: Path, device: torch.device) -> None:
    task = Digits(patch_size=8, n_train=config.n_train, split_seed=config.split_seed, stratify=True)
    shape = (-1, 1, 8, 8) if config.model == "cnn" else (-1, 64)
    full = torch.Generator()
    train = task.batch("train", task.split_size("train"), full)
    test = task.batch("val", task.split_size("val"), full)
    x_train, y_train = train["x"].reshape(shape).to(device), train["y"].to(device)
    x_test, y_test = test["x"].reshape(shape).to(device), test["y"].to(device)
    n_tune = max(1, round(config.tune_fraction * len(y_train)))
    tune = (x_train[:n_tune], y_train[:n_tune]) if config.temperature_on == "train_slice" else None
    x_match = x_train if config.n_match is None else x_train[: config.n_match]
    end = config.n_updates
    steps = sorted(set(config.match_steps) | {end})

    def score(model):
        return perm.evaluate(model, x_test, y_test, tune=tune, batch_size=500)

    with RunStore(run_dir) as store:
        store.truncate_after(-1)  # a re-run replaces the directory's rows
        store.write_config(config.model_dump(mode="json"))
        store.set_status(0, "running")
        models, snaps = [], []
        for i in range(config.n_nets):
            model, snapshots = _train(config, i, task, shape, device, store)
            if model is None:
                store.event(end, "diverged", f"net {i}: training loss not finite")
                store.set_status(end, "diverged")
                return
            models.append(model)
            snaps.append(snapshots)
            for key, value in score(model).items():
                store.log(end, {f"net{i}.test.{key}": value})
            store.log(
                0,
                {f"net{i}.init.accuracy": score(perm.load_params(model, snapshots[0]))["accuracy"]},
            )

        _self_checks(models[0], x_train, x_test, y_test, tune, store, end, config.seed)
        # permutations of net 1 (and further nets) to net 0, from the nets at each T
        act = {}
        for t in steps:
            a_t = perm.load_params(models[0], snaps[0][t])
            b_t = perm.load_params(models[1], snaps[1][t])
            act[t] = perm.activation_matching(a_t, b_t, x_match, center=config.center)
        methods = {"vanilla": None, "activation": act[end]}
        if config.weight_matching:
            gen = torch.Generator().manual_seed(config.seed)
            methods["weight"] = perm.weight_matching(snaps[0][end], snaps[1][end], generator=gen)
            agree = torch.cat([a == w for a, w in zip(act[end], methods["weight"])])
            store.log(end, {"match.agreement": agree.double().mean()})

        alphas = [i / (config.n_alphas - 1) for i in range(config.n_alphas)]
        store.log(end, {"path.alphas": torch.tensor(alphas)})
        mid = min(range(len(alphas)), key=lambda i: abs(alphas[i] - 0.5))
        init_a = snaps[0][0]
        for name, perms in methods.items():
            net_b = (
                models[1] if perms is None else perm.apply_permutation(models[1], perms, x_match)
            )
            path = perm.interpolate(models[0], net_b, x_test, y_test, alphas, tune=tune)
            init_b = snaps[1][0] if perms is None else perm.permute_params(snaps[1][0], perms)
            avg = score(perm.load_params(models[0], perm.average_params([init_a, init_b])))
            store.log(
                end,
                {
                    f"path.{name}.accuracy": path.accuracy,
                    f"path.{name}.loss": path.loss,
                    f"path.{name}.loss_tempered": path.loss_tempered,
                    f"barrier.{name}.loss": path.barrier,
                    f"barrier.{name}.loss_tempered": path.tempered_barrier,
                    f"barrier.{name}.error": path.error_barrier,
                    f"midpoint.{name}.accuracy": path.accuracy[mid],
                    f"init_avg.{name}.accuracy": avg["accuracy"],
                    f"init_avg.{name}.loss": avg["loss"],
                },
            )
            if name != "weight":  # the path between the two inits (accuracy only)
                a0 = perm.load_params(models[0], init_a)
                b0 = perm.load_params(models[0], init_b)
                init_path = perm.interpolate(a0, b0, x_test, y_test, alphas, tune=tune)
                store.log(end, {f"init_path.{name}.accuracy": init_path.accuracy})
        for t in steps:  # accuracy of the permuted-init average vs the step T of the matching
            init_b = perm.permute_params(snaps[1][0], act[t])
            avg = score(perm.load_params(models[0], perm.average_params([init_a, init_b])))
            store.log(t, {"init_avg.activation_at_T.accuracy": avg["accuracy"]})
        if config.n_nets > 2:
            _nway(config, models, snaps, x_match, score, store)
        store.set_status(end, "finished")


def _nway(config, models, snaps, x_match, score, store) -> None:
    """Averages of the first m inits, m = 2..n_nets, unpermuted and permuted (π from the end)."""
    end = config.n_updates
    inits_perm = [snaps[0][0]]
    for i in range(1, config.n_nets):
        perms = perm.activation_matching(models[0], models[i], x_match, center=config.center)
        inits_perm.append(perm.permute_params(snaps[i][0], perms))
    rows = {"vanilla": [], "activation": []}
    for m in range(2, config.n_nets + 1):
        for name, inits in (("vanilla", [s[0] for s in snaps[:m]]), ("activation", inits_perm[:m])):
            net = perm.load_params(models[0], perm.average_params(inits))
            rows[name].append(score(net)["accuracy"])
    store.log(end, {"nway.m": torch.arange(2, config.n_nets + 1).double()})
    for name, values in rows.items():
        store.log(end, {f"nway.{name}.accuracy": torch.stack(values)})


def _self_checks(model, x_train, x_test, y_test, tune, store, end, seed) -> None:
    """S7's oracles on the trained net 0, logged: permutation invariance, self-matching,
    self-barrier (reported in the study's table; the unit tests hold them exactly)."""
    gen = torch.Generator().manual_seed(seed)
    params = perm.layer_params(model)
    perms = [torch.randperm(d, generator=gen) for d in perm.hidden_widths(params)]
    permuted = perm.apply_permutation(model, perms, x_train)
    with torch.no_grad():
        diff = (model(x_test) - permuted(x_test)).abs().max()
    truth = [perm.invert_permutation(p) for p in perms]
    found = {
        "activation": perm.activation_matching(model, permuted, x_train),
        "weight": perm.weight_matching(params, perm.layer_params(permuted), generator=gen),
    }
    acts = perm.hidden_activations(model, x_train)
    dead = torch.cat([(a.abs().amax(0) == 0) for a in acts]).double().mean()
    values = {"check.permuted_max_abs_diff": diff, "check.dead_units": dead}
    for name, result in found.items():
        hits = torch.cat([r == t for r, t in zip(result, truth)]).double().mean()
        values[f"check.self_match.{name}"] = hits
    path = perm.interpolate(model, model, x_test, y_test, (0.0, 0.5, 1.0), tune=tune)
    values["check.self_barrier"] = path.barrier
    store.log(end, values)


# -- presets ----------------------------------------------------------------------------------
def smoke() -> PermutedInitialisationsPreset:
    """Plumbing only (seconds): width 32, 200 training images, 1 epoch (2 updates)."""
    base = PermutedInitRunConfig(hidden=[32], n_train=200, n_updates=2, match_steps=[1])
    return PermutedInitialisationsPreset(
        base=base,
        pair_hidden=[[32]],
        n_pairs=1,
        widths=[16],
        nway_hidden=[32],
        nway_nets=3,
        cnn_archs=["4-avg-8"],
    )


def fast() -> PermutedInitialisationsPreset:
    """S7's fast grid (≤ 3 min on 2 CPU cores): see the module docstring."""
    return PermutedInitialisationsPreset(
        base=PermutedInitRunConfig(match_steps=[10, 50, 100]),
        pair_hidden=[[1024], [512, 512]],
        n_pairs=3,
        widths=[32, 128, 512, 2048],
        nway_hidden=[1024],
        nway_nets=10,
        cnn_archs=["32-32-avg-64-64"],
        transformer_pairs=3,
    )


def paper() -> PermutedInitialisationsPreset:
    """S7's paper grid on digits (GPU): widths 32-8192 at depths 1/2/4, both CNN families with
    k in {32..256}, AdamW and SGD (lr 0.01, 0.03), 10-way averages, 3,000 updates (the paper's
    5 epochs of 60k images)."""
    base = PermutedInitRunConfig(n_updates=3000, match_steps=[10, 50, 100, 500])
    cnns = [f"{k}-{k}-avg-{2 * k}-{2 * k}" for k in (32, 64, 128, 256)]
    cnns += [f"{k}-avg-{2 * k}-avg-{4 * k}" for k in (32, 64, 128, 256)]
    return PermutedInitialisationsPreset(
        base=base,
        pair_hidden=[[1024], [512, 512], [2048, 2048]],
        n_pairs=3,
        widths=[32, 128, 512, 2048, 8192],
        width_depths=[1, 2, 4],
        nway_hidden=[2048, 2048],
        nway_nets=10,
        cnn_archs=cnns,
        cnn_optimizers=[
            OptimizerChoice(),
            OptimizerChoice(optimizer="sgd", lr=0.01, weight_decay=1e-4),
            OptimizerChoice(optimizer="sgd", lr=0.03, weight_decay=1e-4),
        ],
        transformer_pairs=3,
    )


def _hidden_tag(hidden: list[int]) -> str:
    return "x".join(map(str, hidden))


def build_runs(preset: PermutedInitialisationsPreset, seed: int = 0) -> list[RunSpec]:
    """Gated MLP pairs, the width sweep, the n-way run and the CNN runs (one spec each)."""
    base = preset.base
    s0 = base.seed + seed
    specs = []

    def add(name: str, **update) -> None:
        config = PermutedInitRunConfig.model_validate({**base.model_dump(), **update})
        specs.append(RunSpec(name, config, run_permuted_inits))

    for hidden in preset.pair_hidden:
        for k in range(preset.n_pairs):
            add(f"pair_mlp_{_hidden_tag(hidden)}_p{k}", group="pairs", hidden=hidden, seed=s0 + k)
    for depth in preset.width_depths:
        for width in preset.widths:
            add(
                f"width_mlp_{width}_d{depth}",
                group="width",
                hidden=[width] * depth,
                seed=s0,
                match_steps=[],
            )
    if preset.nway_hidden:
        tag = _hidden_tag(preset.nway_hidden)
        add(
            f"nway_mlp_{tag}",
            group="nway",
            hidden=preset.nway_hidden,
            n_nets=preset.nway_nets,
            seed=s0,
            match_steps=[],
            weight_matching=False,
        )
    for arch in preset.cnn_archs:
        for choice in preset.cnn_optimizers:
            for k in range(preset.cnn_pairs):
                add(
                    f"cnn_{arch}_{choice.optimizer}{choice.lr:g}_p{k}",
                    group="cnn",
                    model="cnn",
                    arch=arch,
                    seed=s0 + k,
                    match_steps=[],
                    **choice.model_dump(),
                )
    for k in range(preset.transformer_pairs):  # issue 20: barrier of matched transformers
        config = preset.transformer.model_copy(update={"seed": s0 + k})
        specs.append(RunSpec(f"transformer_recall_p{k}", config, run_transformer_barrier))
    return specs


STUDY = Study(
    name="permuted-initialisations",
    claim=CLAIM,
    source=SOURCE,
    presets={"smoke": smoke, "fast": fast, "paper": paper},
    build_runs=build_runs,
    analyze=analyze,
)
