"""One-call analysis of a model: ``dynascope.inspect(model, x) -> pandas.DataFrame``.

The WeightWatcher-style entry point: one row per layer and head, every number a plain float,
computed by the instruments a Monitor would run (nothing is re-implemented here):

    W_QK = W_Q @ W_K^T, W_OV = W_V @ W_O per head (:func:`dynascope.probes.qk_singular_values`,
        :func:`~dynascope.probes.ov_singular_values`, from the factors), then per product:
    effective_rank   exp(entropy of s / sum s)           :func:`dynascope.probes.effective_rank`
    stable_rank      sum s^2 / max s^2                    :func:`dynascope.probes.stable_rank`
    numerical_rank   #{s_i > rel_tol * max s}             :func:`dynascope.probes.rank_at`
    nuclear_norm     sum s                                :func:`dynascope.probes.nuclear_norm`
    spectral_norm    max s
    attention_entropy  mean over batch and query positions of the per-row entropy (nats) of the
        pattern on ``x`` (:func:`dynascope.capture_patterns`,
        :func:`dynascope.probes.attention_entropy`); only when ``x`` is given
    W_Q_norm ... W_O_norm  per layer: Frobenius norm of all heads' W_Q (W_K, W_V, W_O)
        (:func:`dynascope.probes.norms.frobenius_norms`), repeated on the layer's rows

``dynascope.inspect_layers(model)`` gives the per-matrix table beside it: one row per weight
matrix (attention W_Q, W_K, W_V, W_O and every other matrix), the heavy-tail fit of its ESD
(:func:`dynascope.probes.weight_esd`: alpha, x_min, KS distance, n_tail).

``model`` is a module of any architecture :mod:`dynascope.adapters` reads (dynascope,
``torch.nn.MultiheadAttention``, Hugging Face GPT-2 / Llama-style, TransformerLens
``HookedTransformer``) or a path that :func:`load_checkpoints` reads (a local Hugging Face
checkpoint directory, a dynascope ``.pt`` checkpoint, a run directory, or a directory of
checkpoints: then one block of rows per checkpoint with its ``step``).
"""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from dynascope.adapters import AttentionView, attention_views, capture_patterns
from dynascope.keys import HEAD_COLUMN
from dynascope.probes.attention import attention_entropy
from dynascope.probes.esd import MIN_TAIL, weight_esd
from dynascope.probes.norms import frobenius_norms
from dynascope.probes.spectral import (
    effective_rank,
    nuclear_norm,
    ov_singular_values,
    qk_singular_values,
    rank_at,
    stable_rank,
)

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "NoAttentionError",
    "has_attention",
    "inspect",
    "inspect_layers",
    "load_checkpoints",
    "model_limits",
    "no_attention_message",
]

SPECTRAL_METRICS = (
    "effective_rank",
    "stable_rank",
    "numerical_rank",
    "nuclear_norm",
    "spectral_norm",
)
"""Per product (``qk_``, ``ov_``) columns of :func:`inspect`, in order."""

_STEP = re.compile(r"(\d+)(?!.*\d)")  # the last integer in a name: checkpoint-500, step_500.pt


def _spectral_columns(s: Tensor, prefix: str, rel_tol: float) -> dict[str, Tensor]:
    """Singular values ``[n_layers, n_heads, d_head]`` -> ``{column: [n_layers, n_heads]}``."""
    s = s.detach().double()
    return {
        f"{prefix}_effective_rank": effective_rank(s),
        f"{prefix}_stable_rank": stable_rank(s),
        f"{prefix}_numerical_rank": rank_at(s, rel_tol=rel_tol).double(),
        f"{prefix}_nuclear_norm": nuclear_norm(s),
        f"{prefix}_spectral_norm": s.amax(dim=-1),
    }


def _spectra(views: list[AttentionView], rel_tol: float) -> list[dict[str, Tensor]]:
    """Per layer: ``{column: [n_heads]}`` spectral metrics (batched when the shapes agree)."""
    try:
        groups = [views]
        qk, ov = [qk_singular_values(views)], [ov_singular_values(views)]
    except ValueError:  # layers of different shapes: one call per layer
        groups = [[v] for v in views]
        qk = [qk_singular_values(g) for g in groups]
        ov = [ov_singular_values(g) for g in groups]
    layers = []
    for s_qk, s_ov in zip(qk, ov, strict=True):
        columns = {
            **_spectral_columns(s_qk, "qk", rel_tol),
            **_spectral_columns(s_ov, "ov", rel_tol),
        }
        for i in range(s_qk.shape[0]):
            layers.append({k: v[i] for k, v in columns.items()})
    return layers


def _entropies(model: nn.Module, x: Any) -> dict[str, Tensor]:
    """Per attention module name: ``[n_heads]`` mean pattern entropy (nats) on ``x``."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), capture_patterns(model) as patterns:
            model(x)
    finally:
        model.train(was_training)
    return {
        name: attention_entropy(pattern.double()).mean(dim=(0, 2))
        for name, pattern in patterns.items()
    }


class NoAttentionError(ValueError):
    """The model has no attention layer at all, so :func:`inspect` has no head to report.

    Raised instead of the adapters' "no supported attention layer" error when no module's class
    name speaks of attention (``attention``, ``attn``): an MLP, a CNN, a factorization toy.
    ``dynascope inspect`` prints its message as one line and exits 0 (:func:`inspect_layers`
    still reads such a model).
    """


_ATTENTION_NAME = re.compile(r"attention|attn", re.IGNORECASE)


def has_attention(model: nn.Module) -> bool:
    """Whether :func:`inspect` has heads to report on ``model``.

    Returns:
        ``True`` if an adapter reads an attention layer of ``model``; ``False`` if no module of
        it is an attention layer (no class name holds ``attention`` or ``attn``).
    Raises:
        ValueError: the model has attention-like modules that no adapter reads (the message of
            :func:`dynascope.attention_views`: the supported architectures and how to register
            one).
    """
    try:
        attention_views(model)
    except ValueError:
        if any(_ATTENTION_NAME.search(type(m).__name__) for m in model.modules()):
            raise
        return False
    return True


def no_attention_message(model: nn.Module) -> str:
    """One line: ``model`` has no attention layer, and what :func:`inspect` covers."""
    return (
        f"{type(model).__name__} has no attention layer: inspect's per-head table (W_QK/W_OV "
        "ranks and norms, attention entropy) needs one"
    )


def _inspect_model(model: nn.Module, x: Any, rel_tol: float) -> list[dict[str, Any]]:
    if not has_attention(model):
        raise NoAttentionError(
            f"{no_attention_message(model)}; inspect_layers(model) reads every weight matrix"
        )
    with torch.no_grad():
        views = attention_views(model)
        spectra = _spectra(views, rel_tol)
        norms = [
            frobenius_norms({f: getattr(v, f) for f in ("W_Q", "W_K", "W_V", "W_O")}) for v in views
        ]
    entropies = _entropies(model, x) if x is not None else None
    rows = []
    for layer, (view, spectrum, norm) in enumerate(zip(views, spectra, norms, strict=True)):
        if entropies is not None and view.name not in entropies:
            raise ValueError(
                f"x: the forward pass did not run attention layer {view.name!r}; give inputs "
                "that reach every layer"
            )
        for head in range(view.n_heads):
            row: dict[str, Any] = {
                "layer": layer,
                "module": view.name,
                HEAD_COLUMN: head,
                "d_head": view.d_head,
            }
            row.update({k: float(v[head]) for k, v in spectrum.items()})
            if entropies is not None:
                row["attention_entropy"] = float(entropies[view.name][head])
            row.update({f"{k}_norm": float(v) for k, v in norm.items()})
            rows.append(row)
    return rows


def inspect(
    model: nn.Module | str | os.PathLike[str],
    x: Any = None,
    *,
    rel_tol: float = 1e-3,
) -> pd.DataFrame:
    """Analyse every attention head of ``model`` in one call: a DataFrame, one row per head.

    Example::

        import dynascope as ds
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained("path/to/checkpoint", local_files_only=True)
        df = ds.inspect(model, x=token_ids)          # token_ids: [batch, pos] LongTensor
        df.groupby("layer")[["qk_effective_rank", "attention_entropy"]].mean()

    Args:
        model: an ``nn.Module`` with attention layers of a supported architecture
            (:func:`dynascope.adapters.supported_architectures`), or a path read by
            :func:`load_checkpoints` (a series of checkpoints gives one block per step).
        x: optional inputs for one forward pass, ``model(x)`` (token ids ``[batch, pos]`` for
            language models). With ``x``, the ``attention_entropy`` column is added; the model
            runs in eval mode under ``torch.no_grad()`` and its mode is restored.
        rel_tol: relative threshold of ``*_numerical_rank`` (singular values above
            ``rel_tol * max``), ``>= 0``.
    Returns:
        ``pandas.DataFrame`` with columns ``[step,] layer, module, head_index, d_head``, then for
        ``qk`` and ``ov``: ``_effective_rank, _stable_rank, _numerical_rank, _nuclear_norm,
        _spectral_norm``, then ``attention_entropy`` (nats; with ``x``), then ``W_Q_norm,
        W_K_norm, W_V_norm, W_O_norm`` (per layer). Plain floats (no autograd graph); ``layer``
        counts attention layers in module order; ``step`` only for a series of checkpoints.
    Raises:
        NoAttentionError: (a ``ValueError``) if the model has no attention layer at all.
        ValueError: if the model has no supported attention layer, ``rel_tol`` is negative, or
            the forward pass on ``x`` skips an attention layer; the path errors of
            :func:`load_checkpoints`.
    References:
        Roy & Vetterli (2007), EUSIPCO (effective rank); Rudelson & Vershynin (2007), J. ACM
        54(4) (stable rank); Elhage et al. (2021), "A Mathematical Framework for Transformer
        Circuits" (W_QK, W_OV); Zhai et al. (2023), "Stabilizing Transformer Training by
        Preventing Attention Entropy Collapse", arXiv 2303.06296 (attention entropy).
    """
    import pandas as pd

    if not rel_tol >= 0:
        raise ValueError(f"rel_tol must be >= 0 (got {rel_tol})")
    if isinstance(model, nn.Module):
        return pd.DataFrame(_inspect_model(model, x, rel_tol))
    checkpoints = load_checkpoints(model)
    if len(checkpoints) == 1 and checkpoints[0][0] is None:
        return pd.DataFrame(_inspect_model(checkpoints[0][1], x, rel_tol))
    rows = []
    for step, loaded in checkpoints:
        rows += [{"step": step, **row} for row in _inspect_model(loaded, x, rel_tol)]
    return pd.DataFrame(rows)


def inspect_layers(
    model: nn.Module | str | os.PathLike[str], *, min_tail: int = MIN_TAIL
) -> pd.DataFrame:
    """Heavy-tail fit of every weight matrix's ESD: a DataFrame, one row per matrix.

    The per-layer companion of :func:`inspect` (WeightWatcher's table):
    :func:`dynascope.probes.weight_esd` on the model, or on each checkpoint of a path.

    Example::

        layers = ds.inspect_layers("path/to/checkpoint")
        layers[["name", "shape", "alpha", "ks_distance", "n_tail"]]

    Args:
        model: an ``nn.Module`` of any architecture (attention layers that
            :mod:`dynascope.adapters` reads give W_Q, W_K, W_V, W_O; every other parameter
            with two or more dims is one matrix), or a path read by :func:`load_checkpoints`.
        min_tail: fewest eigenvalues in a fitted tail, ``>= 2``.
    Returns:
        ``pandas.DataFrame`` with columns ``[step,]`` then
        :data:`dynascope.probes.esd.ESD_COLUMNS` (``name, shape, n_eigenvalues, rank,
        lambda_max, alpha, alpha_stderr, x_min, ks_distance, n_tail, reason``); ``step`` only
        for a series of checkpoints. ``alpha`` is NaN, with the ``reason``, where no tail can
        be fitted (a zero, tiny or orthogonal matrix).
    Raises:
        ValueError: if a matrix holds NaN or inf (the message names it), ``min_tail < 2``;
            the path errors of :func:`load_checkpoints`.
    References:
        Martin & Mahoney (2021), "Implicit self-regularization in deep neural networks", JMLR
        22(165); Clauset, Shalizi & Newman (2009), SIAM Review 51(4).
    """
    import pandas as pd

    if isinstance(model, nn.Module):
        return weight_esd(model, min_tail=min_tail)
    checkpoints = load_checkpoints(model)
    if len(checkpoints) == 1 and checkpoints[0][0] is None:
        return weight_esd(checkpoints[0][1], min_tail=min_tail)
    frames = [weight_esd(loaded, min_tail=min_tail) for _, loaded in checkpoints]
    for (step, _), frame in zip(checkpoints, frames, strict=True):
        frame.insert(0, "step", step)
    return pd.concat(frames, ignore_index=True)


# -- reading models from disk ---------------------------------------------------------------
def _is_hf_dir(path: Path) -> bool:
    return (path / "config.json").is_file()


def _load_hf(path: Path) -> nn.Module:
    try:
        import transformers
    except ImportError:
        raise ValueError(
            f"PATH: {str(path)!r} is a Hugging Face checkpoint; install transformers "
            "(pip install 'dynascope[hf]')"
        ) from None
    try:
        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
        except ValueError:  # an architecture without a causal-LM head
            model = transformers.AutoModel.from_pretrained(path, local_files_only=True)
    except OSError as err:
        raise ValueError(f"PATH: {str(path)!r}: no loadable weights ({err})") from None
    return model.eval()


def _config_file(path: Path) -> Path:
    for directory in (path.parent, path.parent.parent):
        if (directory / "config.yaml").is_file():
            return directory / "config.yaml"
    raise ValueError(
        f"PATH: {str(path)!r} is a .pt file without a dynascope config.yaml beside it or in "
        "its run directory (RUN/checkpoints/step_N.pt reads RUN/config.yaml)"
    )


def _run_model(config_file: Path) -> nn.Module:
    """The untrained model of a run: ``Parts.model`` of the build its ``runner.json`` names
    (:func:`dynascope.train.load_run_config`; none: a registry config), on the CPU."""
    from dynascope.train import SeedStreams, load_run_config

    build, config = load_run_config(config_file)
    with torch.random.fork_rng(devices=[]):  # the caller's RNG is left as it was
        return build(config, SeedStreams(config.seed)).model  # type: ignore[attr-defined]


def _load_pt(path: Path, built: dict[Path, nn.Module]) -> nn.Module:
    """The model of ``path``'s run with its weights; ``built`` keeps each run's untrained model
    (a build may also draw data sets: one build per run, not one per checkpoint)."""
    config_file = _config_file(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # UnpicklingError for disallowed objects, RuntimeError if not torch
        raise ValueError(f"PATH: {str(path)!r} is not a readable state dict ({err})") from None
    if isinstance(state, dict) and isinstance(state.get("model"), dict):
        state = state["model"]  # a dynascope checkpoint: {"step", "model", "optimizer", ...}
    if config_file not in built:
        built[config_file] = _run_model(config_file)
    model = copy.deepcopy(built[config_file])
    dtypes = {v.dtype for v in state.values() if isinstance(v, Tensor) and v.is_floating_point()}
    if len(dtypes) == 1:  # the run's dtype (the engine casts the model to it)
        model.to(dtypes.pop())
    try:
        model.load_state_dict(state)
    except (RuntimeError, TypeError) as err:
        raise ValueError(
            f"PATH: {str(path)!r} does not fit the model of its config.yaml "
            f"({str(err).splitlines()[0]})"
        ) from None
    return model.eval()


def _step(path: Path) -> int | None:
    match = _STEP.search(path.stem if path.suffix == ".pt" else path.name)
    return None if match is None else int(match.group(1))


def load_checkpoints(path: str | os.PathLike[str]) -> list[tuple[int | None, nn.Module]]:
    """Read the model(s) at ``path``, offline: ``[(step or None, model), ...]`` in step order.

    Accepted:
        - a Hugging Face checkpoint directory (``config.json`` + weights, as ``save_pretrained``
          writes), loaded with ``local_files_only=True``: ``[(None, model)]``;
        - a ``.pt`` file holding a state dict (or a dynascope checkpoint ``{"model": ...}``)
          next to, or one level under, a dynascope ``config.yaml``: ``[(None, model)]``, the
          model that run's build makes (any run: the build its ``runner.json`` names, a
          study's too; none: a registry config; :func:`dynascope.train.load_run_config`);
        - a dynascope run directory (``config.yaml`` + ``checkpoints/step_N.pt``): every
          checkpoint, with its step;
        - a directory of checkpoints (Hugging Face directories or ``.pt`` files whose names end
          in their step: ``checkpoint-500``, ``step_500.pt``): every one, with its step.
    Returns:
        ``(step, model)`` pairs, models in eval mode on the CPU.
    Raises:
        ValueError: if ``path`` does not exist or holds none of the above, a ``.pt`` file has no
            config, a checkpoint name carries no step, or the weights do not load.
        dynascope.config.ConfigError: (a ``ValueError``) the run's config or ``runner.json``
            does not load.
    """
    path = Path(path)
    if not path.exists():
        raise ValueError(f"PATH: no such file or directory: {str(path)!r}")
    if path.is_file():
        if path.suffix != ".pt":
            raise ValueError(
                f"PATH: {str(path)!r} is not a checkpoint (allowed: a Hugging Face checkpoint "
                "directory, a .pt file, a run directory, a directory of checkpoints)"
            )
        return [(None, _load_pt(path, {}))]
    if _is_hf_dir(path):
        return [(None, _load_hf(path))]
    if (path / "config.yaml").is_file() and (path / "checkpoints").is_dir():
        path = path / "checkpoints"
    members = sorted(p for p in path.iterdir() if _is_hf_dir(p) or p.suffix == ".pt")
    if not members:
        raise ValueError(
            f"PATH: {str(path)!r} holds no checkpoint (allowed: a Hugging Face checkpoint "
            "directory, a .pt file, a run directory, a directory of checkpoints)"
        )
    steps = [_step(p) for p in members]
    unnamed = [p.name for p, s in zip(members, steps, strict=True) if s is None]
    if unnamed:
        raise ValueError(
            f"PATH: checkpoint names must end in their step (checkpoint-500, step_500.pt; got "
            f"{', '.join(unnamed)})"
        )
    loaded, built = [], {}  # built: each run's model, built once
    for step, member in sorted(zip(steps, members, strict=True), key=lambda pair: pair[0]):
        loaded.append((step, _load_hf(member) if member.is_dir() else _load_pt(member, built)))
    return loaded


def model_limits(model: nn.Module) -> tuple[int | None, int | None]:
    """``(d_vocab, n_ctx)`` of a language model, ``None`` where it cannot be told.

    Read from the Hugging Face config (``vocab_size``; ``n_positions`` or
    ``max_position_embeddings``), the TransformerLens config (``d_vocab``, ``n_ctx``), or else
    the model's ``d_vocab`` and ``n_ctx`` attributes (:class:`dynascope.nn.Transformer`) or its
    first ``nn.Embedding``.
    """
    config = getattr(model, "config", None) or getattr(model, "cfg", None)
    d_vocab = getattr(config, "vocab_size", None) or getattr(config, "d_vocab", None)
    n_ctx = None
    for field in ("n_positions", "max_position_embeddings", "n_ctx"):
        n_ctx = n_ctx or getattr(config, field, None)
    d_vocab = d_vocab or getattr(model, "d_vocab", None)  # dynascope.nn.Transformer
    if d_vocab is None:
        embedding = next((m for m in model.modules() if isinstance(m, nn.Embedding)), None)
        d_vocab = None if embedding is None else embedding.num_embeddings
    n_ctx = n_ctx or getattr(model, "n_ctx", None)
    valid = isinstance(d_vocab, int) and d_vocab > 0
    return (d_vocab if valid else None), (n_ctx if isinstance(n_ctx, int) else None)
