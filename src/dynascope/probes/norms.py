"""Norms of parameters, gradients and updates, per parameter group and per layer; the last layer.

Under weight decay ``lambda`` parameter norms shrink; with balanced factors (S01) the factor norms
set the nuclear norm of their product; the slingshot (S13) is read off the last layer's norm.

Glossary:

    theta        a parameter tensor; ``||.||`` is the Frobenius norm (all entries), in float64.
    group        a named set of parameter names. Its norm is ``sqrt(sum_{theta in g} ||theta||^2)``,
                 the norm of the group's entries concatenated.
    role group   ``attention`` / ``matrices`` / ``vectors``, exactly as
                 :func:`dynascope.optim.parameter_roles` assigns them (trainable parameters only).
    layer group  :func:`layer_groups`: ``blocks.{i}.*`` -> ``L{i}``; any other parameter -> the
                 module that owns it (``ln_final``), or its own name when the model itself owns
                 it (``W_E``, ``W_pos``, ``W_U``, ``b_U`` of :class:`dynascope.nn.Transformer`).
    Delta theta  ``theta_t - theta_prev``, ``theta_prev`` the snapshot taken at the previous call
                 of the same :class:`UpdateNorms` probe (with an every-step schedule: the update of
                 one optimizer step).
    W_last       the last (readout) layer's weight, found by :func:`last_layer_name`.

Pure functions: :func:`frobenius_norms`, :func:`group_norms`, :func:`difference_norms`,
:func:`role_groups`, :func:`layer_groups`, :func:`last_layer_name`. Thin probes:
:class:`ParameterNorms` (``parameter_norms``), :class:`ParameterGroupNorms`
(``parameter_group_norms``), :class:`GradientNorms` (``gradient_norms``), :class:`UpdateNorms`
(``update_norms``), :class:`LastLayerNorm` (``last_layer_norm``).

When the probes run: the :class:`~dynascope.train.Trainer` calls ``monitor.step(t)`` after
``backward``, gradient clipping and ``optimizer.step()``, and only clears gradients
(``zero_grad(set_to_none=True)``) at the start of step ``t + 1``. So at step ``t`` the parameters
are ``theta_t`` and ``.grad`` holds the (clipped) gradient that produced the update to
``theta_t``; at step 0 (initialisation) there are no gradients yet.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping

import torch
from torch import Tensor, nn

from dynascope.probes.base import Probe, ProbeContext, register_probe

from ._param_groups import LAYER_PATTERN as LAYER_PATTERN
from ._param_groups import last_layer_name as last_layer_name
from ._param_groups import layer_groups as layer_groups
from ._param_groups import role_groups as role_groups

__all__ = [
    "GradientNorms",
    "LastLayerNorm",
    "ParameterGroupNorms",
    "ParameterNorms",
    "UpdateNorms",
    "difference_norms",
    "frobenius_norms",
    "group_norms",
    "last_layer_name",
    "layer_groups",
    "role_groups",
]


# -- pure functions ---------------------------------------------------------------------------
def _items(
    named_tensors: Mapping[str, Tensor] | Iterable[tuple[str, Tensor]],
) -> Iterable[tuple[str, Tensor]]:
    return named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors


def _norm(tensor: Tensor) -> Tensor:
    tensor = tensor.detach()
    if tensor.is_sparse:  # e.g. the gradient of nn.Embedding(sparse=True)
        tensor = tensor.coalesce().values()
    return torch.linalg.vector_norm(tensor, dtype=torch.float64)


def frobenius_norms(
    named_tensors: Mapping[str, Tensor] | Iterable[tuple[str, Tensor]],
) -> dict[str, Tensor]:
    """Frobenius norm ``sqrt(sum_i x_i^2)`` of each tensor (all entries, any shape).

    Args:
        named_tensors: a mapping name -> tensor, or ``(name, tensor)`` pairs such as
            ``model.named_parameters()``. Sparse tensors are measured on their stored values.
    Returns:
        name -> 0-dim float64 tensor on the tensor's own device, in the tensor's unit. An empty
        tensor has norm 0.
    Raises:
        ValueError: if a name appears twice.
    """
    norms: dict[str, Tensor] = {}
    for name, tensor in _items(named_tensors):
        if name in norms:
            raise ValueError(f"named_tensors must have distinct names (got {name!r} twice)")
        norms[name] = _norm(tensor)
    return norms


def _combine(norms: Mapping[str, Tensor], groups: Mapping[str, Iterable[str]]) -> dict[str, Tensor]:
    """Group norms from the members' norms; members missing from ``norms`` are skipped."""
    out: dict[str, Tensor] = {}
    for group, names in groups.items():
        members = [norms[name] for name in names if name in norms]
        if members:
            device = members[0].device  # scalars only: one small gather per group
            out[group] = torch.linalg.vector_norm(torch.stack([m.to(device) for m in members]))
    return out


def group_norms(
    named_tensors: Mapping[str, Tensor] | Iterable[tuple[str, Tensor]],
    groups: Mapping[str, Iterable[str]],
) -> dict[str, Tensor]:
    """Norm of each group of tensors: ``||g|| = sqrt(sum_{x in g} ||x||_F^2)``.

    That is the Frobenius norm of the group's entries concatenated into one vector.

    Args:
        named_tensors: name -> tensor (a mapping or ``(name, tensor)`` pairs), e.g.
            ``model.named_parameters()`` or the gradients of those that have one.
        groups: group name -> member names (e.g. :func:`role_groups`, :func:`layer_groups`). A
            member missing from ``named_tensors`` contributes nothing (a parameter without a
            gradient); a group none of whose members is present is left out of the result. Groups
            may overlap.
    Returns:
        group name -> 0-dim float64 tensor, in the tensors' unit, on the device of the group's
        first present member, in the order of ``groups``.
    Raises:
        ValueError: if a name appears twice in ``named_tensors``.
    """
    return _combine(frobenius_norms(named_tensors), groups)


def difference_norms(
    current: Mapping[str, Tensor] | Iterable[tuple[str, Tensor]],
    previous: Mapping[str, Tensor],
) -> dict[str, Tensor]:
    """``||x - x_prev||_F`` per name present in both with the same shape (the update norm).

    The difference is taken in float64, so rounding in ``x - x_prev`` does not hide small updates
    of float32/bf16 parameters.

    Args:
        current: name -> tensor now (e.g. ``model.named_parameters()``).
        previous: name -> tensor at an earlier time, same device as the current tensor.
    Returns:
        name -> 0-dim float64 tensor on the tensor's device; names only in one of the two, or
        whose shape changed, are left out.
    Raises:
        ValueError: if a name appears twice in ``current``.
    """
    out: dict[str, Tensor] = {}
    for name, tensor in _items(current):
        if name in out:
            raise ValueError(f"current must have distinct names (got {name!r} twice)")
        before = previous.get(name)
        if before is None or before.shape != tensor.shape:
            continue
        delta = tensor.detach().double() - before.detach().double()
        out[name] = torch.linalg.vector_norm(delta)
    return out


# -- probes -----------------------------------------------------------------------------------
def _to_floats(values: dict[str, Tensor]) -> dict[str, float]:
    """One host transfer for many scalar tensors (gathered on the first one's device)."""
    if not values:
        return {}
    device = next(iter(values.values())).device
    floats = torch.stack([v.to(device) for v in values.values()]).tolist()
    return dict(zip(values, floats, strict=True))


def _model_groups(model: nn.Module, layer_pattern: str) -> list[tuple[str, dict[str, list[str]]]]:
    """The probes' groups with their key infix: roles (``role.``) and layers (no infix)."""
    names = (n for n, _ in model.named_parameters())
    return [("role.", role_groups(model)), ("", layer_groups(names, layer_pattern=layer_pattern))]


def _grouped(
    prefix: str, norms: Mapping[str, Tensor], groups: list[tuple[str, dict[str, list[str]]]]
) -> dict[str, Tensor]:
    """``{prefix}.total``, ``{prefix}.role.{role}``, ``{prefix}.{layer}`` from per-name norms."""
    if not norms:
        return {}
    out = {f"{prefix}.total": _combine(norms, {"total": list(norms)})["total"]}
    for infix, named_groups in groups:
        for group, value in _combine(norms, named_groups).items():
            key = f"{prefix}.{infix}{group}"
            if key in out:
                raise ValueError(f"layer group {group!r} collides with the key {key!r}")
            out[key] = value
    return out


@register_probe("parameter_norms")
class ParameterNorms(Probe):
    """Keys ``norm.{param_name}`` (Frobenius norm of each parameter, names as in
    ``model.named_parameters()``) and ``norm.total`` (the norm of all parameters concatenated,
    ``sqrt(sum of squared norms)``; 0 for a model without parameters). Python floats.
    """

    def measure(self, model: nn.Module, ctx: ProbeContext) -> dict[str, Tensor | float]:
        norms = frobenius_norms(model.named_parameters())
        if not norms:
            return {"norm.total": 0.0}
        # The norms are scalars; gather them on one device for a single host transfer.
        device = next(iter(norms.values())).device
        stacked = torch.stack([n.to(device) for n in norms.values()])
        total = torch.linalg.vector_norm(stacked)
        values = torch.cat([stacked, total[None]]).tolist()
        out: dict[str, Tensor | float] = {
            f"norm.{k}": v for k, v in zip(norms, values[:-1], strict=True)
        }
        out["norm.total"] = values[-1]
        return out


class _GroupedNormProbe(Probe):
    """Shared constructor of the per-group probes: the :func:`layer_groups` pattern."""

    def __init__(self, *, layer_pattern: str = LAYER_PATTERN) -> None:
        layer_groups((), layer_pattern=layer_pattern)  # validate now, not at the first step
        self.layer_pattern = layer_pattern


@register_probe("parameter_group_norms")
class ParameterGroupNorms(_GroupedNormProbe):
    """Parameter norms per group: ``param_norm.total`` (all parameters, frozen ones included),
    ``param_norm.role.{attention,matrices,vectors}`` (trainable parameters by
    :func:`role_groups`) and ``param_norm.{layer}`` (:func:`layer_groups`: ``param_norm.L0``,
    ``param_norm.W_U``, ...). Python floats; no keys for a model without parameters.

    Args:
        layer_pattern: see :func:`layer_groups`.
    Raises:
        ValueError: for a bad ``layer_pattern``; at measurement, if a layer group's key collides
            with another key.
    """

    def measure(self, model: nn.Module, ctx: ProbeContext) -> dict[str, Tensor | float]:
        norms = frobenius_norms(model.named_parameters())
        groups = _model_groups(model, self.layer_pattern)
        return _to_floats(_grouped("param_norm", norms, groups))


@register_probe("gradient_norms")
class GradientNorms(_GroupedNormProbe):
    """Gradient norms per group, read from ``.grad`` (never modified): ``grad_norm.total``,
    ``grad_norm.role.{role}``, ``grad_norm.{layer}`` (groups as :class:`ParameterGroupNorms`).

    Under the :class:`~dynascope.train.Trainer` the gradient at step ``t`` is the one the
    optimizer used to reach ``theta_t`` (after clipping, before the optimizer's own transforms
    such as Adam's preconditioner or weight decay). A parameter whose ``.grad`` is ``None``
    contributes nothing; a group without any gradient has no key; at step 0, or whenever no
    parameter has a gradient, the probe returns no keys. Python floats, in loss units per
    parameter unit.

    Args:
        layer_pattern: see :func:`layer_groups`.
    Raises:
        ValueError: as :class:`ParameterGroupNorms`.
    """

    def measure(self, model: nn.Module, ctx: ProbeContext) -> dict[str, Tensor | float]:
        grads = ((n, p.grad) for n, p in model.named_parameters() if p.grad is not None)
        norms = frobenius_norms(grads)
        groups = _model_groups(model, self.layer_pattern)
        return _to_floats(_grouped("grad_norm", norms, groups))


@register_probe("update_norms")
class UpdateNorms(_GroupedNormProbe):
    """Update norms since this probe's previous call, per group.

    ``Delta theta = theta_now - theta_prev``, where ``theta_prev`` is the snapshot this probe took
    at its previous call (on the same model). With an every-step schedule that is the update of
    one optimizer step; with a sparser schedule it is the net change over the steps in between
    (``update_norm.interval`` says how many). Keys:

    - ``update_norm.total``, ``update_norm.role.{role}``, ``update_norm.{layer}``:
      ``||Delta theta||`` per group (groups as :class:`ParameterGroupNorms`), parameter units;
    - ``update_norm.relative.total``, ``update_norm.relative.role.{role}``,
      ``update_norm.relative.{layer}``: ``||Delta theta||_g / ||theta_prev||_g``, dimensionless;
      ``inf`` when the group was all zeros at the previous call and moved since (a
      zero-initialised bias), ``nan`` when it also did not move;
    - ``update_norm.interval``: ``ctx.step`` now minus at the previous call, in steps.

    The first call (and the first call on a different model) only takes the snapshot and returns
    no keys; so does a fresh probe after a resume. Only trainable parameters
    (``requires_grad=True``) are tracked. The snapshot is a detached clone of each parameter on
    the parameter's own device and dtype (one extra copy of the trainable weights; it never
    aliases the live parameters). Python floats.

    Args:
        layer_pattern: see :func:`layer_groups`.
    Raises:
        ValueError: as :class:`ParameterGroupNorms`.
    """

    def __init__(self, *, layer_pattern: str = LAYER_PATTERN) -> None:
        super().__init__(layer_pattern=layer_pattern)
        self.reset()

    def reset(self) -> None:
        """Forget the snapshot: the next call only takes a new one."""
        self._model: weakref.ref[nn.Module] | None = None
        self._snapshot: dict[str, Tensor] = {}
        self._snapshot_norms: dict[str, Tensor] = {}
        self._snapshot_step = 0
        self._restored = False  # a snapshot from load_state_dict applies to the next model

    def state_dict(self) -> dict:
        """The previous call's snapshot (parameter name -> tensor) and its step."""
        if not self._snapshot:
            return {}
        return {"snapshot": dict(self._snapshot), "snapshot_step": self._snapshot_step}

    def load_state_dict(self, state: dict) -> None:
        """Restore a snapshot saved by :meth:`state_dict`; the next call measures against it."""
        self.reset()
        if state:
            self._snapshot = dict(state["snapshot"])
            self._snapshot_norms = frobenius_norms(self._snapshot)
            self._snapshot_step = int(state["snapshot_step"])
            self._restored = True

    def measure(self, model: nn.Module, ctx: ProbeContext) -> dict[str, Tensor | float]:
        params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        out: dict[str, Tensor] = {}
        if self._restored:  # bind the restored snapshot to this model, on its devices
            self._restored = False
            self._model = weakref.ref(model)
            devices = dict(params)
            self._snapshot = {
                n: t.to(devices[n].device) for n, t in self._snapshot.items() if n in devices
            }
        if self._model is not None and self._model() is model:
            deltas = difference_norms(params, self._snapshot)
            previous = {n: self._snapshot_norms[n] for n in deltas}  # the same members
            groups = _model_groups(model, self.layer_pattern)
            absolute = _grouped("update_norm", deltas, groups)
            before = _grouped("update_norm", previous, groups)
            out.update(absolute)
            for key, value in absolute.items():
                relative = key.replace("update_norm.", "update_norm.relative.", 1)
                out[relative] = value / before[key].to(value.device)
            if out:
                if "update_norm.interval" in out:
                    raise ValueError("layer group 'interval' collides with update_norm.interval")
                device = next(iter(out.values())).device
                interval = float(ctx.step - self._snapshot_step)
                out["update_norm.interval"] = torch.tensor(
                    interval, dtype=torch.float64, device=device
                )
        self._model = weakref.ref(model)
        self._snapshot = {n: p.detach().clone() for n, p in params}
        self._snapshot_norms = frobenius_norms(self._snapshot)
        self._snapshot_step = ctx.step
        return _to_floats(out)


@register_probe("last_layer_norm")
class LastLayerNorm(Probe):
    """Key ``last_layer.norm``: ``N_t = ||W_last||_F`` of the readout weight (bias excluded),
    parameter units, a Python float. ``W_last`` is :func:`last_layer_name` ``(model, parameter)``.

    Args:
        parameter: the readout weight's name, or ``None`` for the rule of
            :func:`last_layer_name` (``W_U``, else the last ``nn.Linear``, else the last 2-D
            parameter).
    Raises:
        ValueError: at measurement, as :func:`last_layer_name`.
    References:
        Thilak et al. (2022), "The Slingshot Mechanism", arXiv 2206.04817 (abstract and Fig. 1:
        the cycles are monitored through the norm of the last layer's weights); SYSTEMS S13.
    """

    def __init__(self, *, parameter: str | None = None) -> None:
        self.parameter = parameter

    def measure(self, model: nn.Module, ctx: ProbeContext) -> dict[str, Tensor | float]:
        name = last_layer_name(model, self.parameter)
        weight = model.get_parameter(name)
        return {"last_layer.norm": float(_norm(weight))}
