"""Metric keys: how dynascope names what it measures, parsed into parts and mapped for loggers.

Keys are dotted. A component ``L{l}`` names layer ``l`` and a component ``H{h}`` after it
names head ``h``; the rest, joined with dots, is the metric::

    L0.H3.qk.effective_rank      layer 0, head 3, metric qk.effective_rank
    L1.attn.mean.entropy         layer 1, metric attn.mean.entropy
    qk.mean.effective_rank       metric qk.mean.effective_rank (over layers and heads)
    param_norm.L0                layer 0, metric param_norm
    train.loss, norm.W_U         metric only

Attention families are the keys whose first component is a layer or one of :data:`ATTENTION`
(``qk``, ``ov``: W_QK and W_OV spectra; ``dqk``, ``dov``: their changes; ``attn``: patterns).

:func:`metric_path` maps a key to a ``/``-grouped name for TensorBoard, W&B and MLflow, which
group tags by the part before the first ``/``:

    ====================================  =================================
    key                                   metric_path(key)
    ====================================  =================================
    ``L0.H3.qk.effective_rank``           ``attn/L0/H3/qk_effective_rank``
    ``L1.attn.mean.entropy``              ``attn/L1/attn_mean_entropy``
    ``qk.mean.effective_rank``            ``attn/qk_mean_effective_rank``
    ``train.loss``                        ``train/loss``
    ``norm.blocks.0.attn.W_Q``            ``norm/blocks.0.attn.W_Q``
    ``param_norm.L0``                     ``param_norm/L0``
    ``sharpness``                         ``sharpness``
    ====================================  =================================

In the frames dynascope returns (:func:`dynascope.load_run`'s scalars,
:func:`dynascope.load_study`, :func:`dynascope.inspect`) the head index is the column
:data:`HEAD_COLUMN`, ``head_index`` (TransformerLens's name). Before dynascope 0.2 it was
``head``, which shadowed ``DataFrame.head``; :func:`with_head_index` reads a frame that still
carries ``head`` (an old ``inspect.csv``), with a ``DeprecationWarning``, until 0.3.
"""

from __future__ import annotations

import re
import warnings
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["ATTENTION", "HEAD_COLUMN", "KeyParts", "metric_path", "parse_key", "with_head_index"]

HEAD_COLUMN = "head_index"
"""The column of the head index in dynascope's frames (``head`` before 0.2)."""

ATTENTION = frozenset({"qk", "ov", "dqk", "dov", "attn"})
"""First key components of the attention instruments (grouped under ``attn/``)."""

_LAYER = re.compile(r"L(\d+)")
_HEAD = re.compile(r"H(\d+)")


class KeyParts(NamedTuple):
    """A key split by :func:`parse_key`.

    Attributes:
        layer: the layer index, or ``None``.
        head: the head index (only with a layer), or ``None``.
        metric: the key without its layer and head components.
    """

    layer: int | None
    head: int | None
    metric: str


def parse_key(key: str) -> KeyParts:
    """Split a metric key into layer, head and metric (module docstring).

    The first component ``L{l}`` is the layer; the first ``H{h}`` after it is the head; every
    other component stays in the metric, in order. A parameter name that contains such a
    component (a module registered as ``L1``) is read the same way.

    Args:
        key: a dotted metric key, e.g. ``"L0.H3.qk.effective_rank"``.
    Returns:
        :class:`KeyParts` ``(layer, head, metric)``.
    Raises:
        ValueError: if ``key`` is not a non-empty string.
    """
    if not isinstance(key, str) or not key:
        raise ValueError(f"key must be a non-empty string (got {key!r})")
    layer = head = None
    rest = []
    for part in key.split("."):
        if layer is None and (match := _LAYER.fullmatch(part)):
            layer = int(match.group(1))
        elif layer is not None and head is None and (match := _HEAD.fullmatch(part)):
            head = int(match.group(1))
        else:
            rest.append(part)
    return KeyParts(layer, head, ".".join(rest))


def metric_path(key: str) -> str:
    """A ``/``-grouped name for a metric key, for TensorBoard, W&B and MLflow.

    Attention keys (first component a layer or in :data:`ATTENTION`) become
    ``attn[/L{l}[/H{h}]]/{metric with "." -> "_"}``; any other dotted key becomes ``{first
    component}/{the rest}``; a key without a dot is unchanged. Table in the module docstring.

    Args:
        key: a dotted metric key.
    Returns:
        The grouped name.
    Raises:
        ValueError: if ``key`` is not a non-empty string.
    """
    layer, head, metric = parse_key(key)
    first = key.split(".", 1)[0]
    if _LAYER.fullmatch(first) or first in ATTENTION:
        parts = ["attn"]
        if layer is not None:
            parts.append(f"L{layer}")
        if head is not None:
            parts.append(f"H{head}")
        if metric:
            parts.append(metric.replace(".", "_"))
        return "/".join(parts)
    family, dot, rest = key.partition(".")
    return f"{family}/{rest}" if dot else key


def with_head_index(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with an old ``head`` column renamed :data:`HEAD_COLUMN` (module docstring).

    A frame that has ``head_index``, or neither column, is returned as it is.

    Args:
        frame: a frame of dynascope's columns, from this version or an older one.
    Returns:
        The same frame, or a renamed copy.
    Warns:
        DeprecationWarning: when ``head`` is renamed (it is read until dynascope 0.3).
    """
    if "head" not in frame.columns or HEAD_COLUMN in frame.columns:
        return frame
    warnings.warn(
        "column 'head' is now 'head_index' (dynascope 0.2: 'head' shadowed DataFrame.head); "
        "frames with 'head' are read until dynascope 0.3",
        DeprecationWarning,
        stacklevel=3,
    )
    return frame.rename(columns={"head": HEAD_COLUMN})
