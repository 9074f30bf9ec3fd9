"""K models of one architecture trained as one: stacked parameters, a vectorized loss, one
elementwise optimizer, per-member clipping, learning-rate scales, Adam's ε and freezing.

Glossary:
    K:        number of members.
    stack:    ``{name: Tensor[K, *shape]}``, the members' parameters (leaf tensors).
    member k: slice ``[k]`` of every stacked tensor; its own module (``models[k]``) is brought
              up to date from the stack by :meth:`Stack.unstack` when probes, evaluation or a
              checkpoint read it.

Why K separate runs and one stacked run agree: every optimizer used here (SGD with momentum,
Adam, AdamW, with or without decoupled decay) updates each element from that element's own
gradient and state, so one step on the stack equals K steps on the slices. The loss is
vectorized with ``torch.func.vmap`` over ``torch.func.functional_call``; member k's gradient
depends only on member k's parameters and batch. What differs is rounding: batched matrix
products may sum in another order (float64 agreement is ~1e-15 per step).

Batched layers: vmap dispatches every op of the loss through its batching rules, which for
a small model costs more than the arithmetic. A model made of dense layers therefore runs its
forward on the stack directly as batched matrix products (``torch.baddbmm`` on
``[K, d_in, d_out]`` weights and ``[K, 1, d_out]`` biases): a model with a
``forward_members(params, x)`` method (:class:`~dynascope.nn.fcn.FCN`), or an
``nn.Sequential`` of ``nn.Linear`` and elementwise activations. The loss (the user's
function) then runs once per member, without vmap: with member k's slices of the stack put in
the model's parameters (so anything the loss reads from the model is member k's, and its
gradients reach the stack) and with the model's call on member k's ``batch["x"]`` answered by
member k's slice of the batched output. Any other call runs the model's forward on member k's
parameters, so the path changes where the forward is computed, not what the loss means. A loss
that never calls the model on ``batch["x"]`` itself (it reshapes it first, say) is vectorized
with vmap instead, from its first step on.

Adam: :class:`StackedAdam` is Adam (and AdamW) written for the stack, with ε a ``[K]``
vector (one per member; a sweep over ε is one ensemble) and otherwise torch's update, so that
member k equals a lone ``torch.optim.Adam(eps=eps_k)`` run.

References:
    PyTorch, "Model ensembling" (torch.func.stack_module_state, functional_call, vmap).
    Kingma & Ba (2015), "Adam: A Method for Stochastic Optimization", arXiv 1412.6980,
    Algorithm 1 (in the form of ``torch.optim.Adam``: ε added to the bias-corrected
    ``sqrt(v_t)``); Loshchilov & Hutter (2019), arXiv 1711.05101 (decoupled weight decay).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, stack_module_state, vmap

from dynascope.config import ConfigError

from ._stacked_adam import StackedAdam as StackedAdam

__all__ = ["Stack", "StackedAdam", "members_forward"]


class _LossCall(nn.Module):
    """``forward(batch) = loss_fn(model, batch)``, so functional_call reparametrizes the
    model for whatever methods the loss calls on it (``model(x)``, ``model.encode(x)``...)."""

    def __init__(self, model: nn.Module, loss_fn: Callable) -> None:
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, batch: Mapping[str, Tensor]) -> Any:
        return self.loss_fn(self.model, batch)


MembersForward = Callable[[Mapping[str, Tensor], Tensor], Tensor]
_ELEMENTWISE = (nn.ReLU, nn.Tanh, nn.GELU, nn.Sigmoid, nn.SiLU, nn.Identity)


def members_forward(model: nn.Module) -> MembersForward | None:
    """The model's forward on stacked parameters, ``f(params, x[K, batch, ...]) -> [K, batch,
    ...]``, if it has one: its own ``forward_members`` method, or batched ``nn.Linear`` layers
    for an ``nn.Sequential`` of ``nn.Linear`` and elementwise activations; else ``None``."""
    own = getattr(model, "forward_members", None)
    if callable(own):
        return own
    if not isinstance(model, nn.Sequential) or not any(isinstance(m, nn.Linear) for m in model):
        return None
    if not all(isinstance(m, (nn.Linear, *_ELEMENTWISE)) for m in model):
        return None

    def forward(params: Mapping[str, Tensor], x: Tensor) -> Tensor:
        h = x  # [K, batch, d_in]
        for name, layer in model.named_children():
            if not isinstance(layer, nn.Linear):
                h = layer(h)  # elementwise
                continue
            weight = params[f"{name}.weight"].transpose(1, 2)  # [K, out, in] -> [K, in, out]
            bias = params.get(f"{name}.bias")
            h = torch.bmm(h, weight) if bias is None else torch.baddbmm(bias[:, None], h, weight)
        return h

    return forward


_Slot = tuple[nn.Module, str, str, str]  # (module, "_parameters"/"_buffers", leaf, stack name)


def _tensor_slots(model: nn.Module) -> list[_Slot]:
    """Where each parameter and buffer of ``model`` sits, tied aliases included, with the name
    of its stacked tensor (``stack_module_state`` keeps one name per tied tensor)."""
    canonical = {id(t): n for n, t in [*model.named_parameters(), *model.named_buffers()]}
    slots = []
    for kind, named in (
        ("_parameters", model.named_parameters(remove_duplicate=False)),
        ("_buffers", model.named_buffers(remove_duplicate=False)),
    ):
        for name, t in named:
            prefix, _, leaf = name.rpartition(".")
            slots.append((model.get_submodule(prefix), kind, leaf, canonical[id(t)]))
    return slots


@contextlib.contextmanager
def _member_tensors(
    slots: Sequence[_Slot], slices: Mapping[str, Sequence[Tensor]], k: int
) -> Iterator[None]:
    """Inside, the model's parameters and buffers are member ``k``'s slices of the stack (so
    gradients reach the stack); the module's own tensors are put back on exit."""
    own = [getattr(module, kind)[leaf] for module, kind, leaf, _ in slots]
    for module, kind, leaf, name in slots:
        getattr(module, kind)[leaf] = slices[name][k]
    try:
        yield
    finally:
        for (module, kind, leaf, _), tensor in zip(slots, own, strict=True):
            getattr(module, kind)[leaf] = tensor


@contextlib.contextmanager
def _output_given(model: nn.Module, x: Tensor, output: Tensor, used: list[bool]) -> Iterator[None]:
    """Inside, ``model(x)`` returns ``output`` (computed already, batched) and sets
    ``used[0]``; other calls run the model's forward."""
    own = model.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and args[0] is x:
            used[0] = True
            return output
        return own(*args, **kwargs)

    model.forward = forward  # an instance attribute shadows the class's forward
    try:
        yield
    finally:
        del model.forward


def _lr_ratio(optimizer: torch.optim.Optimizer, first: torch.optim.Optimizer) -> float:
    """The member's learning rate over member 0's, the same in every group.

    Raises:
        dynascope.config.ConfigError: if the ratio differs between groups.
    """
    ratios = [g["lr"] / f["lr"] for g, f in zip(optimizer.param_groups, first.param_groups)]
    if any(abs(r - ratios[0]) > 1e-12 * abs(ratios[0]) for r in ratios):
        raise ConfigError("members: a member's learning rates must be one multiple of member 0's")
    return float(ratios[0]) if ratios else 1.0


class Stack:
    """The members' parameters stacked ``[K, ...]`` with one optimizer over them.

    Args:
        models: K modules with equal parameter names and shapes (member k's own module).
        optimizers: K builders ``optimizer(model)``; member 0's groups and hyperparameters are
            used on the stack, and every member's must match them, learning rates aside: a
            member built with ``c`` times member 0's rates (the same ``c`` in every group)
            has its update scaled by ``c`` (a learning-rate sweep as one ensemble).
        lr_scales: K further factors multiplying each member's update.
    Raises:
        dynascope.config.ConfigError: parameter names/shapes or optimizer settings differ.
    """

    def __init__(
        self,
        models: Sequence[nn.Module],
        optimizers: Sequence[Callable[[nn.Module], torch.optim.Optimizer]],
        lr_scales: Sequence[float],
    ) -> None:
        self.models = list(models)
        self.k = len(self.models)
        shapes = [{n: p.shape for n, p in m.named_parameters()} for m in self.models]
        if any(s != shapes[0] for s in shapes):
            raise ConfigError("members: models differ in parameter names or shapes")
        params, buffers = stack_module_state(self.models)
        self.params: dict[str, Tensor] = params
        self.buffers: dict[str, Tensor] = buffers
        built = [fn(m) for fn, m in zip(optimizers, self.models, strict=True)]
        self.optimizer = self._stacked_optimizer(built)
        ratios = [_lr_ratio(o, built[0]) for o in built]  # members built with their own lr
        scales = torch.tensor(
            [r * s for r, s in zip(ratios, lr_scales, strict=True)], dtype=torch.float64
        )
        self.member_scales = scales.tolist()  # each member's rate over the stack's base rate
        self.lr_scales = None if bool((scales == 1).all()) else scales
        self._wrapper: _LossCall | None = None
        self._forward = members_forward(self.models[0])  # batched layers, if the model has them
        self._slots = _tensor_slots(self.models[0])

    def _stacked_optimizer(self, built: list[torch.optim.Optimizer]) -> torch.optim.Optimizer:
        first = built[0]
        adam = type(first) in (torch.optim.Adam, torch.optim.AdamW)
        per_member = ("params", "lr", "eps") if adam else ("params", "lr")
        hyper = [
            [{k: v for k, v in g.items() if k not in per_member} for g in o.param_groups]
            for o in built
        ]
        if any(type(o) is not type(first) or h != hyper[0] for o, h in zip(built, hyper)):
            raise ConfigError(
                "members: optimizers differ in kind or settings (lr, and Adam's eps, aside)"
            )
        names = {id(p): n for n, p in self.models[0].named_parameters()}
        groups = []
        for j, group in enumerate(first.param_groups):
            stacked = {k: v for k, v in group.items() if k != "params"}
            stacked["params"] = [self.params[names[id(p)]] for p in group["params"]]
            if adam:
                stacked["eps"] = tuple(o.param_groups[j]["eps"] for o in built)
            groups.append(stacked)
        if adam:
            for key in ("amsgrad", "maximize"):
                if first.defaults.get(key):
                    raise ConfigError(f"members: Adam's {key}=True is not stacked (got {key}=True)")
            d = first.defaults
            return StackedAdam(
                groups,
                lr=d["lr"],
                betas=d["betas"],
                eps=tuple(o.defaults["eps"] for o in built),
                weight_decay=d["weight_decay"],
                decoupled_weight_decay=bool(d.get("decoupled_weight_decay", False)),
            )
        accepted = inspect.signature(type(first).__init__).parameters
        defaults = {k: v for k, v in first.defaults.items() if k in accepted}
        return type(first)(groups, **defaults)

    # -- the step -------------------------------------------------------------------------------
    def losses(
        self, loss_fn: Callable, batches: Sequence[Mapping[str, Tensor]]
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """Each member's loss on its own batch: ``([K], {key: [K]})``.

        With batched layers (module docstring) the members' outputs on ``batch["x"]`` are
        computed at once and the loss runs per member on them; otherwise the loss is
        vectorized over members with vmap.
        """
        if self._forward is not None and "x" in batches[0]:
            result = self._batched_losses(self._forward, loss_fn, batches)
            if result is not None:
                return result
        if self._wrapper is None or self._wrapper.loss_fn is not loss_fn:
            self._wrapper = _LossCall(self.models[0], loss_fn)
        wrapper = self._wrapper
        batch = {key: torch.stack([b[key] for b in batches]) for key in batches[0]}

        def one(params, buffers, member_batch):
            state = {f"model.{n}": t for n, t in {**params, **buffers}.items()}
            out = functional_call(wrapper, state, (member_batch,))
            loss, metrics = out if isinstance(out, tuple) else (out, {})
            return loss, dict(metrics)

        return vmap(one)(self.params, self.buffers, batch)

    def _batched_losses(
        self, forward: MembersForward, loss_fn: Callable, batches: Sequence[Mapping[str, Tensor]]
    ) -> tuple[Tensor, dict[str, Tensor]] | None:
        """The batched-layers path; ``None`` (and the path off for good) if ``batch["x"]`` is
        not the model's input or the loss never calls the model on it."""
        try:
            outputs = forward(self.params, torch.stack([b["x"] for b in batches]))
        except ValueError:
            self._forward = None
            return None
        model, used = self.models[0], [False]
        slices = {n: t.unbind(0) for n, t in {**self.params, **self.buffers}.items()}
        losses, metrics = [], []
        for k, batch in enumerate(batches):  # member k's slices in the model, its output given
            with _member_tensors(self._slots, slices, k):
                with _output_given(model, batch["x"], outputs[k], used):
                    out = loss_fn(model, batch)
            loss, member_metrics = out if isinstance(out, tuple) else (out, {})
            losses.append(loss)
            metrics.append(member_metrics)
        if not used[0]:  # the loss calls the model on something else: vmap, from this step on
            self._forward = None  # (so a run's every step rounds alike, a resumed one too)
            return None
        stacked = {
            key: torch.stack([torch.as_tensor(m[key]) for m in metrics]) for key in metrics[0]
        }
        return torch.stack(losses), stacked

    def step(self, max_norm: float | None, frozen: Sequence[int]) -> None:
        """Clip per member, step the optimizer, apply LR scales, keep frozen members still."""
        grads = [p.grad for p in self.params.values() if p.grad is not None]
        for i in frozen:  # a diverged member: its gradient may hold NaN, never applied
            for g in grads:
                g[i].zero_()
        if max_norm is not None and grads:
            norms = torch.stack(
                [torch.linalg.vector_norm(g.flatten(1), dim=1) for g in grads], dim=1
            )  # [K, n_params]
            total = torch.linalg.vector_norm(norms, dim=1)  # [K], as clip_grad_norm_
            coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
            for g in grads:
                g.mul_(coef.view(-1, *([1] * (g.dim() - 1))).to(g))
        keep = {}
        if self.lr_scales is not None or frozen:
            keep = {n: p.detach().clone() for n, p in self.params.items()}
        self.optimizer.step()
        if not keep:
            return
        with torch.no_grad():
            for name, p in self.params.items():
                before = keep[name]
                if self.lr_scales is not None:
                    scale = self.lr_scales.to(p).view(-1, *([1] * (p.dim() - 1)))
                    p.copy_(before + scale * (p - before))
                for i in frozen:
                    p[i].copy_(before[i])

    # -- members' own modules -------------------------------------------------------------
    @torch.no_grad()
    def unstack(self) -> None:
        """Copy each member's slice into its own module (before probes, evaluation, saving)."""
        for k, model in enumerate(self.models):
            for name, p in model.named_parameters():
                p.copy_(self.params[name][k])
            for name, b in model.named_buffers():
                if name in self.buffers:
                    b.copy_(self.buffers[name][k])

    @torch.no_grad()
    def restack(self) -> None:
        """Copy each member's own module into the stack (after loading checkpoints)."""
        for k, model in enumerate(self.models):
            for name, p in model.named_parameters():
                self.params[name][k].copy_(p)
            for name, b in model.named_buffers():
                if name in self.buffers:
                    self.buffers[name][k].copy_(b)

    # -- optimizer state per member (a lone run's format) ----------------------------------
    def _shapes(self) -> list[torch.Size]:
        return [p.shape for g in self.optimizer.param_groups for p in g["params"]]

    def member_optimizer_state(self, k: int) -> dict:
        """Member ``k``'s optimizer state, loadable into that member's lone optimizer."""
        full = self.optimizer.state_dict()
        shapes = self._shapes()
        state = {
            i: {
                key: (
                    value[k].clone()
                    if key != "step" and torch.is_tensor(value) and value.shape == shapes[i]
                    else value
                )
                for key, value in entry.items()
            }
            for i, entry in full["state"].items()
        }
        groups = full["param_groups"]
        if isinstance(self.optimizer, StackedAdam):
            groups = self.optimizer.member_param_groups(k)
        return {"state": state, "param_groups": groups}

    def load_member_optimizer_states(self, states: Sequence[dict]) -> None:
        """Stack K member states (:meth:`member_optimizer_state`) into the optimizer."""
        shapes = self._shapes()
        first = states[0]
        state = {}
        for i, entry in first["state"].items():
            state[i] = {}
            for key, value in entry.items():
                if key != "step" and torch.is_tensor(value) and value.shape == shapes[int(i)][1:]:
                    state[i][key] = torch.stack([s["state"][i][key] for s in states])
                else:
                    state[i][key] = value
        own = self.optimizer.state_dict()["param_groups"]  # hyperparameters: the config's
        self.optimizer.load_state_dict({"state": state, "param_groups": own})
