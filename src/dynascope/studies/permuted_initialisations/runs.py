"""permuted-initialisations runs on the engine: ``n_nets`` nets of one architecture trained side
by side as one module (:class:`NetGroup`), matched, interpolated and averaged by a probe.

Glossary:
    net i:      ``NetGroup.nets[i]``; all nets are built from the run's ``init`` stream one
                after another and draw their own batches from its ``data`` stream; the loss is
                the sum of the nets' cross-entropies, so each net's gradient is its own
                (AdamW and SGD are elementwise: the nets train exactly as if alone).
    init:       the nets' weights at step 0, kept by :class:`MatchingProbe` (checkpointed).
    T:          a step at which net 1 is matched to net 0 (``match_steps`` and the last step).
    methods:    ``vanilla`` (net 1 as trained), ``activation`` (activation matching),
                ``weight`` (weight matching), ``random`` (a uniformly random permutation: the
                negative control, from the run's ``control`` stream).
    init_avg:   ``½(θ_0(0) + π θ_1(0))`` for the method's permutation π (found at the end).
    barrier:    :func:`dynascope.probes.loss_barrier` along ``θ(α) = α θ_0 + (1 − α) π θ_1``.

Notes page: docs/studies/permuted-initialisations.md.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import Tensor, nn

from dynascope.monitor import EveryN
from dynascope.nn.cnn import SimpleCNN, parse_cnn_arch
from dynascope.nn.permutation_nets import KaimingMLP
from dynascope.probes import permutation as perm
from dynascope.tasks import Digits
from dynascope.train import EngineRunConfig, Parts, SeedStreams

__all__ = ["MatchingProbe", "NetGroup", "PermutedInitRun", "build_permuted_inits"]

METHODS = ("vanilla", "activation", "weight", "random")


class PermutedInitRun(EngineRunConfig):
    """One run: ``n_nets`` nets of one architecture, trained, matched, averaged, measured."""

    group: Literal["pairs", "width", "nway", "cnn"] = "pairs"
    model: Literal["mlp", "cnn"] = "mlp"
    hidden: list[int] = Field(default_factory=lambda: [1024], min_length=1)
    arch: str = Field("32-32-avg-64-64", description="CNN layer string (model='cnn')")
    use_bias: bool = False
    n_nets: int = Field(2, ge=2, le=64)
    n_train: int = Field(1297, ge=20, le=1787)
    split_seed: int = Field(0, ge=0)
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
    def _check(self) -> PermutedInitRun:
        if self.model == "cnn":
            parse_cnn_arch(self.arch)
        if any(w < 1 for w in self.hidden):
            raise ValueError(f"hidden widths must be >= 1 (got hidden={self.hidden})")
        bad = [t for t in self.match_steps if not 0 <= t <= self.loop.steps]
        if bad:
            raise ValueError(
                f"match_steps must lie in [0, loop.steps={self.loop.steps}] (got {bad})"
            )
        return self

    @property
    def label(self) -> str:
        """``MLP 64-1024-10`` or ``CNN 32-32-avg-64-64``."""
        if self.model == "cnn":
            return f"CNN {self.arch}"
        return "MLP " + "-".join(map(str, [64, *self.hidden, 10]))

    @property
    def shape(self) -> tuple[int, ...]:
        """The input shape of one image: ``(-1, 64)`` (MLP) or ``(-1, 1, 8, 8)`` (CNN)."""
        return (-1, 1, 8, 8) if self.model == "cnn" else (-1, 64)


class NetGroup(nn.Module):
    """``n`` independent nets trained as one module: ``forward(x [n, batch, ...]) -> [n, batch,
    10]`` (net i reads ``x[i]``)."""

    def __init__(self, nets: list[nn.Module]) -> None:
        super().__init__()
        self.nets = nn.ModuleList(nets)

    def forward(self, x: Tensor) -> Tensor:
        return torch.stack([net(xi) for net, xi in zip(self.nets, x.unbind(0), strict=True)])


def _group_loss(model: NetGroup, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
    """Sum over nets of the mean cross-entropy (nats); each net's own as ``net{i}.loss``."""
    logits = model(batch["x"])
    losses = torch.stack(
        [F.cross_entropy(out, y) for out, y in zip(logits.unbind(0), batch["y"].unbind(0))]
    )
    return losses.sum(), {f"net{i}.loss": loss for i, loss in enumerate(losses.unbind(0))}


def _optimizer(config: PermutedInitRun, model: nn.Module) -> torch.optim.Optimizer:
    if config.optimizer == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    return torch.optim.SGD(
        model.parameters(), lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay
    )


def _net(config: PermutedInitRun, generator: torch.Generator) -> nn.Module:
    if config.model == "cnn":
        return SimpleCNN(config.arch, use_bias=config.use_bias, generator=generator)
    return KaimingMLP(64, config.hidden, 10, use_bias=config.use_bias, generator=generator)


def build_permuted_inits(config: PermutedInitRun, streams: SeedStreams) -> Parts:
    """``n_nets`` nets on digits (AdamW or SGD, batch ``batch_size`` per net and step); the
    :class:`MatchingProbe` at step 0, at each ``match_steps`` T and at the end."""
    task = Digits(patch_size=8, n_train=config.n_train, split_seed=config.split_seed, stratify=True)
    init = streams.generator("init")
    model = NetGroup([_net(config, init) for _ in range(config.n_nets)])

    def data(generator: torch.Generator) -> dict[str, Tensor]:
        batches = [task.batch("train", config.batch_size, generator) for _ in model.nets]
        return {
            "x": torch.stack([b["x"].reshape(config.shape) for b in batches]),
            "y": torch.stack([b["y"] for b in batches]),
        }

    probe = MatchingProbe(config, task, streams)
    end = config.loop.steps
    return Parts(
        model=model,
        data=data,
        loss=_group_loss,
        optimizer=lambda m: _optimizer(config, m),
        probes=[(probe, EveryN(end, also=config.match_steps))],
    )


class MatchingProbe:
    """The study's measurements on a :class:`NetGroup` (module glossary).

    Step 0: keeps the inits, logs ``net{i}.init.accuracy``. Each T: matches net 1 to net 0 by
    activations at T and logs ``init_avg.activation_at_T.accuracy`` (the permuted-init average
    under that π). The end: trained accuracies, the paths and barriers of every method, the
    init averages, the n-way averages and the self-checks (:func:`measure_trained`).
    """

    def __init__(self, config: PermutedInitRun, task: Digits, streams: SeedStreams) -> None:
        self.config = config
        self.streams = streams
        order = streams.generator("split_order")
        train = task.batch("train", task.split_size("train"), order)
        test = task.batch("val", task.split_size("val"), order)
        self.x_train = train["x"].reshape(config.shape)
        self.y_train = train["y"]
        self.x_test, self.y_test = test["x"].reshape(config.shape), test["y"]
        n_tune = max(1, round(config.tune_fraction * len(self.y_train)))
        self.tune = (
            (self.x_train[:n_tune], self.y_train[:n_tune])
            if config.temperature_on == "train_slice"
            else None
        )
        self.x_match = self.x_train if config.n_match is None else self.x_train[: config.n_match]
        self.inits: list[perm.LayerParams] = []

    def _cast(self, like: Tensor) -> None:
        """The data on the nets' device and in their dtype (``loop.device``, ``loop.dtype``)."""
        self.x_train, self.x_test, self.x_match = (
            t.to(like) for t in (self.x_train, self.x_test, self.x_match)
        )
        self.y_train, self.y_test = (t.to(like.device) for t in (self.y_train, self.y_test))
        if self.tune is not None:
            self.tune = (self.tune[0].to(like), self.tune[1].to(like.device))

    def state_dict(self) -> dict[str, Any]:
        return {"inits": self.inits}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inits = [[(w, b) for w, b in params] for params in state["inits"]]

    def score(self, net: nn.Module) -> dict[str, Tensor]:
        """Test loss, accuracy and tempered loss of one net."""
        return perm.evaluate(net, self.x_test, self.y_test, tune=self.tune, batch_size=500)

    def average_accuracy(self, like: nn.Module, params: list[perm.LayerParams]) -> Tensor:
        """Test accuracy of the net holding the average of ``params``."""
        return self.score(perm.load_params(like, perm.average_params(params)))["accuracy"]

    def __call__(self, model: NetGroup, ctx: Any) -> dict[str, Tensor]:
        nets = list(model.nets)
        self._cast(next(nets[0].parameters()))
        x = self.x_match
        values: dict[str, Tensor] = {}
        if ctx.step == 0:
            self.inits = [
                [(w.clone(), None if b is None else b.clone()) for w, b in perm.layer_params(net)]
                for net in nets
            ]
            for i, net in enumerate(nets):
                values[f"net{i}.init.accuracy"] = self.score(net)["accuracy"]
        if ctx.step in self.config.match_steps or ctx.step == self.config.loop.steps:
            found = perm.activation_matching(nets[0], nets[1], x, center=self.config.center)
            init_b = perm.permute_params(self.inits[1], found)
            avg = self.average_accuracy(nets[0], [self.inits[0], init_b])
            values["init_avg.activation_at_T.accuracy"] = avg
        if ctx.step == self.config.loop.steps:
            values.update(measure_trained(self, nets))
        return values


def measure_trained(probe: MatchingProbe, nets: list[nn.Module]) -> dict[str, Tensor]:
    """Everything measured on the trained nets (module glossary); keys as the store's."""
    config, inits, x_match = probe.config, probe.inits, probe.x_match
    values: dict[str, Tensor] = {}
    for i, net in enumerate(nets):
        for key, value in probe.score(net).items():
            values[f"net{i}.test.{key}"] = value
    values.update(self_checks(probe, nets[0]))
    act = perm.activation_matching(nets[0], nets[1], x_match, center=config.center)
    control = probe.streams.generator("control")
    widths = perm.hidden_widths(perm.layer_params(nets[1]))
    methods = {
        "vanilla": None,
        "activation": act,
        "random": [torch.randperm(d, generator=control) for d in widths],
    }
    if config.weight_matching:
        gen = probe.streams.generator("weight_matching")
        params = [perm.layer_params(net) for net in nets[:2]]
        methods["weight"] = perm.weight_matching(*params, generator=gen)
        agree = torch.cat([a == w for a, w in zip(act, methods["weight"], strict=True)])
        values["match.agreement"] = agree.double().mean()
    alphas = [i / (config.n_alphas - 1) for i in range(config.n_alphas)]
    values["path.alphas"] = torch.tensor(alphas)
    mid = min(range(len(alphas)), key=lambda i: abs(alphas[i] - 0.5))
    for name, perms in methods.items():
        net_b = nets[1] if perms is None else perm.apply_permutation(nets[1], perms, x_match)
        path = perm.interpolate(nets[0], net_b, probe.x_test, probe.y_test, alphas, tune=probe.tune)
        init_b = inits[1] if perms is None else perm.permute_params(inits[1], perms)
        avg = probe.score(perm.load_params(nets[0], perm.average_params([inits[0], init_b])))
        values.update(
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
            }
        )
        if name in ("vanilla", "activation"):  # the path between the two inits (accuracy)
            a0, b0 = (perm.load_params(nets[0], p) for p in (inits[0], init_b))
            init_path = perm.interpolate(
                a0, b0, probe.x_test, probe.y_test, alphas, tune=probe.tune
            )
            values[f"init_path.{name}.accuracy"] = init_path.accuracy
    if len(nets) > 2:
        values.update(nway(probe, nets))
    return values


def nway(probe: MatchingProbe, nets: list[nn.Module]) -> dict[str, Tensor]:
    """Averages of the first m inits, m = 2..n, unpermuted and permuted (π from the end)."""
    inits = probe.inits
    inits_perm = [inits[0]]
    for i in range(1, len(nets)):
        center = probe.config.center
        found = perm.activation_matching(nets[0], nets[i], probe.x_match, center=center)
        inits_perm.append(perm.permute_params(inits[i], found))
    rows: dict[str, list[Tensor]] = {"vanilla": [], "activation": []}
    for m in range(2, len(nets) + 1):
        for name, chosen in (("vanilla", inits[:m]), ("activation", inits_perm[:m])):
            rows[name].append(probe.average_accuracy(nets[0], list(chosen)))
    values = {"nway.m": torch.arange(2, len(nets) + 1).double()}
    for name, accs in rows.items():
        values[f"nway.{name}.accuracy"] = torch.stack(accs)
    return values


def self_checks(probe: MatchingProbe, net: nn.Module) -> dict[str, Tensor]:
    """S7's oracles on the trained net 0: a random permutation changes no output, matching net 0
    to its permuted copy recovers the permutation, the barrier of net 0 with itself."""
    gen = probe.streams.generator("check")
    params = perm.layer_params(net)
    perms = [torch.randperm(d, generator=gen) for d in perm.hidden_widths(params)]
    permuted = perm.apply_permutation(net, perms, probe.x_train)
    with torch.no_grad():
        diff = (net(probe.x_test) - permuted(probe.x_test)).abs().max()
    truth = [perm.invert_permutation(p) for p in perms]
    found = {
        "activation": perm.activation_matching(net, permuted, probe.x_train),
        "weight": perm.weight_matching(params, perm.layer_params(permuted), generator=gen),
    }
    dead = torch.cat([(a.abs().amax(0) == 0) for a in perm.hidden_activations(net, probe.x_train)])
    values = {"check.permuted_max_abs_diff": diff, "check.dead_units": dead.double().mean()}
    for name, result in found.items():
        hits = torch.cat([r == t for r, t in zip(result, truth, strict=True)]).double().mean()
        values[f"check.self_match.{name}"] = hits
    path = perm.interpolate(net, net, probe.x_test, probe.y_test, (0.0, 0.5, 1.0), tune=probe.tune)
    values["check.self_barrier"] = path.barrier
    return values
