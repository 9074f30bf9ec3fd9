"""Which parameters form a group, and which is the last layer: role groups, layer groups and
the readout weight of a model, for the norms in :mod:`dynascope.probes.norms` (glossary there,
which re-exports them).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from torch import nn

from dynascope.optim.groups import parameter_roles

LAYER_PATTERN = r"^blocks\.(\d+)\."
"""Default :func:`layer_groups` pattern: ``blocks.{i}.`` of :class:`dynascope.nn.Transformer`."""


def role_groups(model: nn.Module) -> dict[str, list[str]]:
    """Parameter names per role, as :func:`dynascope.optim.parameter_roles` assigns them.

    Args:
        model: any module. Attention matrices are found through :mod:`dynascope.adapters`.
    Returns:
        ``{"attention": [...], "matrices": [...], "vectors": [...]}``, only the non-empty roles, in
        that order. Frozen parameters (``requires_grad=False``) have no role and are in no group.
    """
    groups: dict[str, list[str]] = {"attention": [], "matrices": [], "vectors": []}
    for name, _, role in parameter_roles(model):
        groups[role].append(name)
    return {role: names for role, names in groups.items() if names}


def layer_groups(
    names: Iterable[str], *, layer_pattern: str = LAYER_PATTERN
) -> dict[str, list[str]]:
    """Parameter names per layer.

    Rule: a name matching ``layer_pattern`` (searched with :func:`re.search`; its first capture
    group is the layer index ``i``) goes to ``L{i}``; any other name goes to its owning module's
    path (the name without its last dotted component: ``ln_final.weight`` -> ``ln_final``,
    ``0.weight`` -> ``0``) or, for a parameter the model owns directly, to its own name
    (``W_U`` -> ``W_U``). For :class:`dynascope.nn.Transformer` the default gives ``L0 ... L{n-1}``,
    ``W_E`` (or ``W_in``), ``W_pos``, ``ln_final``, ``W_U``, ``b_U``. For Hugging Face GPT-2 pass
    ``layer_pattern=r"^transformer\\.h\\.(\\d+)\\."``.

    Args:
        names: parameter names, e.g. ``(n for n, _ in model.named_parameters())``.
        layer_pattern: regular expression with one capture group (the layer index).
    Returns:
        group name -> member names, groups in order of first appearance.
    Raises:
        ValueError: if ``layer_pattern`` is not a valid regular expression with a capture group.
    """
    try:
        pattern = re.compile(layer_pattern)
    except re.error as err:
        raise ValueError(f"layer_pattern is not a valid regular expression ({err})") from None
    if pattern.groups < 1:
        raise ValueError(
            f"layer_pattern needs a capture group for the index (got {layer_pattern!r})"
        )
    groups: dict[str, list[str]] = {}
    for name in names:
        match = pattern.search(name)
        if match is not None:
            group = f"L{match.group(1)}"
        else:
            group = name.rpartition(".")[0] or name
        groups.setdefault(group, []).append(name)
    return groups


def last_layer_name(model: nn.Module, parameter: str | None = None) -> str:
    """Name of the last (readout) layer's weight, the ``W_last`` whose norm S13 follows.

    Rule, first that applies:

    1. ``parameter``, when given (it must be a parameter of ``model``);
    2. the last parameter named ``W_U`` or ``*.W_U``: the unembedding of
       :class:`dynascope.nn.Transformer` (TransformerLens naming);
    3. the ``weight`` of the last :class:`torch.nn.Linear` (subclasses included) in registration
       order (``model.modules()``), not forward order; a weight shared with an earlier module
       (tied embeddings) is named where it was first registered;
    4. the last 2-D parameter in ``model.named_parameters()`` order.

    The bias is never included (S13: ``N_t = ||W_last||_F``, bias excluded). When the readout is
    not last in registration order, pass its name.

    Args:
        model: the model.
        parameter: the readout weight's name in ``model.named_parameters()``, or ``None``.
    Returns:
        The parameter name.
    Raises:
        ValueError: if ``parameter`` is not a parameter of ``model``, or none is given and the
            model has neither ``W_U``, an ``nn.Linear`` nor a 2-D parameter.
    """
    named = dict(model.named_parameters())
    if parameter is not None:
        if parameter not in named:
            shown = ", ".join(list(named)[-5:])
            raise ValueError(
                f"parameter: {parameter!r} is not a parameter of the model (its last ones: {shown})"
            )
        return parameter
    unembeddings = [n for n in named if n == "W_U" or n.endswith(".W_U")]
    if unembeddings:
        return unembeddings[-1]
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if linears:
        weight = linears[-1].weight
        return next(n for n, p in named.items() if p is weight)
    matrices = [n for n, p in named.items() if p.ndim == 2]
    if matrices:
        return matrices[-1]
    raise ValueError(
        "parameter: the model has no W_U, nn.Linear or 2-D parameter; pass the readout's name"
    )
