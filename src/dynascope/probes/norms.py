"""Parameter norms: the Frobenius norm of every parameter and of all of them together.

Under weight decay ``lambda`` these shrink; with balanced factors (S01) the factor norms set the
nuclear norm of their product. Pure function :func:`frobenius_norms`, thin probe
:class:`ParameterNorms`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import Tensor, nn

from dynascope.probes.base import Probe, ProbeContext, register_probe

__all__ = ["ParameterNorms", "frobenius_norms"]


def frobenius_norms(
    named_tensors: Mapping[str, Tensor] | Iterable[tuple[str, Tensor]],
) -> dict[str, Tensor]:
    """Frobenius norm ``sqrt(sum_i x_i^2)`` of each tensor (all entries, any shape).

    Args:
        named_tensors: a mapping name -> tensor, or ``(name, tensor)`` pairs such as
            ``model.named_parameters()``.
    Returns:
        name -> 0-dim float64 tensor on the tensor's own device, in the tensor's unit. An empty
        tensor has norm 0.
    Raises:
        ValueError: if a name appears twice.
    """
    items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
    norms: dict[str, Tensor] = {}
    for name, tensor in items:
        if name in norms:
            raise ValueError(f"named_tensors must have distinct names (got {name!r} twice)")
        norms[name] = torch.linalg.vector_norm(tensor.detach(), dtype=torch.float64)
    return norms


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
