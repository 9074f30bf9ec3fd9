"""Configs for runs (pydantic v2, ``extra="forbid"``, frozen) and the registry of names -> classes.

A run config in YAML::

    name: recall-wd0.1
    seed: 0
    model: {name: transformer, n_layers: 2, d_model: 32, n_heads: 2, d_mlp: 0, use_ln: false}
    task: {name: associative_recall, n_keys: 16, n_values: 16, n_pairs: 8}
    optimizer: {name: adamw, lr: 0.003, weight_decay: {attention: 0.1, matrices: 0.01}}
    train: {steps: 3000, batch_size: 128, eval_every: 500}
    monitor: {probes: [qk_spectrum, ov_spectrum], schedule: log, points: 30}

Every input is validated before anything is written. Errors are :class:`ConfigError` with one
line naming the field, the value and what is allowed (:func:`format_validation_error`); a
boolean where a number belongs (``steps: true``) is an error, not 1. Dotted
overrides (``--set model.n_heads=4``) are applied to the raw mapping and go through the same
validation. YAML is only ever read with ``yaml.safe_load``, after a check that refuses
repeated keys.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import torch
import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from torch import nn

from dynascope import optim
from dynascope.probes import PROBES
from dynascope.tasks import (
    AssociativeRecall,
    CharLM,
    Digits,
    InContextLinearRegression,
    ModularArithmetic,
    Task,
)
from dynascope.tasks.char_lm import check_corpus_path

__all__ = [
    "AssociativeRecallConfig",
    "CharLMConfig",
    "DigitsConfig",
    "FCNConfig",
    "MODEL_CONFIGS",
    "ModularArithmeticConfig",
    "TASKS",
    "ConfigError",
    "LinearRegressionConfig",
    "MonitorConfig",
    "OptimizerConfig",
    "RunConfig",
    "TrainConfig",
    "TransformerConfig",
    "ViTConfig",
    "WeightDecayConfig",
    "apply_overrides",
    "build_model",
    "build_optimizer",
    "build_task",
    "format_validation_error",
    "load_config",
    "validate_config",
]


class ConfigError(ValueError):
    """Invalid configuration or CLI input; the message is one line (CLI exit code 2)."""


def _not_bool(value: Any) -> Any:
    # pydantic's lax mode reads `steps: true` as 1 and `lr: true` as 1.0: a typo, not a size.
    if isinstance(value, bool):
        raise ValueError(f"expected a number, not a boolean (got {value!r})")
    return value


_Int = Annotated[int, BeforeValidator(_not_bool)]
_Float = Annotated[float, BeforeValidator(_not_bool)]


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# -- models ---------------------------------------------------------------------------------
class _AttentionModelConfig(_Config):
    """Fields every attention model shares (a model config adds its ``name`` and own fields)."""

    name: str
    n_layers: _Int = Field(2, ge=1, description="number of blocks")
    d_model: _Int = Field(32, ge=1, description="residual stream width")
    n_heads: _Int = Field(2, ge=1, description="attention heads per layer")
    d_head: _Int | None = Field(None, ge=1, description="head width; default d_model // n_heads")
    d_mlp: _Int = Field(0, ge=0, description="MLP hidden width; 0 = attention-only")
    sigma_reparam: bool = Field(
        False, description="σReparam every linear map (dynascope.nn.reparam); LN-free: use_ln=false"
    )
    sigma_reparam_scope: Literal["per_matrix", "per_head"] = Field(
        "per_matrix", description="one σ per W_Q/W_K/W_V/W_O, or one per head"
    )
    sigma_reparam_gamma_init: Literal["sigma0", "one"] = Field(
        "sigma0", description="γ₀ = σ(W₀) (Ŵ = W at init) or 1"
    )

    @model_validator(mode="after")
    def _heads_divide(self) -> _AttentionModelConfig:
        if self.d_head is None and self.d_model % self.n_heads != 0:
            raise ValueError(
                f"n_heads must divide d_model (got d_model={self.d_model}, n_heads={self.n_heads})"
            )
        return self


class TransformerConfig(_AttentionModelConfig):
    """:class:`dynascope.nn.Transformer`; d_vocab / d_in, n_ctx and d_out come from the task."""

    name: Literal["transformer"] = "transformer"
    positional: Literal["learned", "none"] = "learned"
    attention: Literal["softmax", "linear"] = "softmax"
    is_causal: bool = True
    use_bias: bool = False
    use_ln: bool = True


class ViTConfig(_AttentionModelConfig):
    """:class:`dynascope.nn.ViT` for patch tasks (``digits``); d_in, n_patches, d_out: the task."""

    name: Literal["vit"] = "vit"
    d_mlp: _Int = Field(64, ge=0, description="MLP hidden width; 0 = attention-only")
    pooling: Literal["cls", "mean"] = "cls"
    use_bias: bool = True
    use_ln: bool = True


class FCNConfig(_Config):
    """:class:`dynascope.nn.fcn.FCN` for vector tasks with pooled outputs (``digits``); the input
    width (``n_ctx * d_in``, patches flattened) and ``d_out`` come from the task."""

    name: Literal["fcn"] = "fcn"
    hidden: list[Annotated[_Int, Field(ge=1)]] = Field(
        default_factory=lambda: [256, 256], description="hidden widths; [] = linear classifier"
    )
    activation: Literal["relu", "gelu", "tanh"] = "relu"


# -- the model registry: name -> config class (add a line here and a builder in build_model) --
MODEL_CONFIGS: dict[str, type[BaseModel]] = {
    "transformer": TransformerConfig,
    "vit": ViTConfig,
    "fcn": FCNConfig,
}
ModelConfig = (
    Annotated[
        Union[tuple(MODEL_CONFIGS.values())],  # noqa: UP007
        Field(discriminator="name"),
    ]
    if len(MODEL_CONFIGS) > 1
    else TransformerConfig
)


# -- tasks ----------------------------------------------------------------------------------
class AssociativeRecallConfig(_Config):
    """:class:`dynascope.tasks.AssociativeRecall`."""

    name: Literal["associative_recall"] = "associative_recall"
    n_keys: _Int = Field(16, ge=1)
    n_values: _Int = Field(16, ge=1)
    n_pairs: _Int = Field(8, ge=1)

    @model_validator(mode="after")
    def _pairs_fit(self) -> AssociativeRecallConfig:
        if self.n_pairs > self.n_keys:
            raise ValueError(
                f"n_pairs must be <= n_keys (got n_pairs={self.n_pairs}, n_keys={self.n_keys})"
            )
        return self


class LinearRegressionConfig(_Config):
    """:class:`dynascope.tasks.InContextLinearRegression`."""

    name: Literal["linear_regression"] = "linear_regression"
    d_x: _Int = Field(4, ge=1)
    n_points: _Int = Field(16, ge=1)
    noise_std: _Float = Field(0.0, ge=0)
    w_std: _Float = Field(1.0, gt=0)


class CharLMConfig(_Config):
    """:class:`dynascope.tasks.CharLM` (bytes); default corpus: the Python stdlib's sources."""

    name: Literal["char_lm"] = "char_lm"
    path: str | None = Field(
        None, min_length=1, description="text file or folder; None = Python stdlib"
    )
    text: str | None = Field(None, min_length=1, description="inline text instead of a path")
    n_ctx: _Int = Field(64, ge=1)
    val_fraction: _Float = Field(0.1, gt=0, lt=1)
    max_bytes: _Int | None = Field(None, ge=1)

    @field_validator("path")
    @classmethod
    def _path_holds_text(cls, path: str | None) -> str | None:
        if path is not None:
            check_corpus_path(path)  # its one-line ValueError names the path and the problem
        return path

    @model_validator(mode="after")
    def _path_or_text(self) -> CharLMConfig:
        if self.path is not None and self.text is not None:
            raise ValueError("path and text are exclusive (got both; give one)")
        return self


class DigitsConfig(_Config):
    """:class:`dynascope.tasks.Digits`: 8×8 digits as patches (scikit-learn's bundled data)."""

    name: Literal["digits"] = "digits"
    patch_size: Literal[1, 2, 4, 8] = Field(4, description="patch side; 8 = the whole image")
    n_train: _Int = Field(1437, ge=1, le=1796, description="training images; the rest validate")
    split_seed: _Int = Field(0, ge=0, description="seed of the train/validation permutation")


class ModularArithmeticConfig(_Config):
    """:class:`dynascope.tasks.ModularArithmetic`: ``a op b = c (mod p)``, Power et al. split."""

    name: Literal["modular_arithmetic"] = "modular_arithmetic"
    p: _Int = Field(97, ge=2, description="modulus (prime for op '/')")
    op: Literal["+", "-", "*", "/"] = "+"
    train_fraction: _Float = Field(0.5, gt=0, lt=1, description="share of equations to train on")
    split_seed: _Int = Field(0, ge=0, description="numpy RandomState seed of the shuffle")

    @model_validator(mode="after")
    def _division_needs_a_prime(self) -> ModularArithmeticConfig:
        if self.op == "/" and any(self.p % k == 0 for k in range(2, int(self.p**0.5) + 1)):
            raise ValueError(f"op '/' needs a prime p (got p={self.p})")
        return self


# -- the task registry: name -> (config class, task class); add a line to add a task ------------
TASKS: dict[str, tuple[type[BaseModel], type[Task]]] = {
    "associative_recall": (AssociativeRecallConfig, AssociativeRecall),
    "linear_regression": (LinearRegressionConfig, InContextLinearRegression),
    "char_lm": (CharLMConfig, CharLM),
    "digits": (DigitsConfig, Digits),
    "modular_arithmetic": (ModularArithmeticConfig, ModularArithmetic),
}
TaskConfig = Annotated[
    Union[tuple(config for config, _ in TASKS.values())],  # noqa: UP007
    Field(discriminator="name"),
]


# -- optimizer, training, monitoring -----------------------------------------------------------
class WeightDecayConfig(_Config):
    """λ per parameter role (see :mod:`dynascope.optim.groups`)."""

    attention: _Float = Field(0.0, ge=0, description="W_Q, W_K, W_V, W_O")
    matrices: _Float = Field(0.0, ge=0, description="other matrices (MLP, embeddings)")
    vectors: _Float = Field(0.0, ge=0, description="biases and norm gains")


class OptimizerConfig(_Config):
    name: Literal["adamw", "adam", "sgd"] = "adamw"
    lr: _Float = Field(1e-3, gt=0)
    betas: tuple[_Float, _Float] = (0.9, 0.999)
    eps: _Float = Field(1e-8, gt=0)
    momentum: _Float = Field(0.0, ge=0, lt=1)
    weight_decay: WeightDecayConfig = WeightDecayConfig()
    mode: Literal["decoupled", "l2"] = "decoupled"
    grad_clip: _Float | None = Field(None, gt=0, description="max global grad norm")
    warmup_steps: _Int = Field(0, ge=0)
    lr_schedule: Literal["constant", "cosine"] = "constant"

    @field_validator("betas", mode="before")
    @classmethod
    def _two_betas(cls, betas: Any) -> Any:
        if isinstance(betas, list | tuple) and len(betas) != 2:
            raise ValueError(f"expected two numbers [beta1, beta2] (got {list(betas)})")
        return betas

    @field_validator("betas")
    @classmethod
    def _betas_in_range(cls, betas: tuple[float, float]) -> tuple[float, float]:
        if not all(0 <= b < 1 for b in betas):
            raise ValueError(f"betas must lie in [0, 1) (got {list(betas)})")
        return betas


class TrainConfig(_Config):
    steps: _Int = Field(1000, ge=1, le=10**12)
    batch_size: _Int = Field(64, ge=1)
    log_every: _Int = Field(10, ge=1, description="steps between train-loss rows")
    eval_every: _Int = Field(250, ge=1)
    eval_batches: _Int = Field(4, ge=1)
    checkpoint_every: _Int = Field(1000, ge=1)
    keep_checkpoints: _Int = Field(2, ge=1, description="latest checkpoints kept (for resume)")
    checkpoint_history: Literal["log", "none"] = Field(
        "log", description="log: also keep checkpoints at step 0 and every power of two"
    )
    checkpoint_budget_mb: _Float | None = Field(
        1024.0, ge=0, description="MiB the history may take per run directory; None: no limit"
    )
    threads: _Int | None = Field(
        1, ge=1, description="torch intra-op threads (None: torch's default); see dynascope.train"
    )


class MonitorConfig(_Config):
    probes: list[str] = Field(default_factory=lambda: ["qk_spectrum", "ov_spectrum"])
    schedule: Literal["every", "log"] = "log"
    every: _Int = Field(100, ge=1, description="steps between probes (schedule=every)")
    points: _Int = Field(30, ge=1, description="log-spaced probe steps (schedule=log)")

    @field_validator("probes")
    @classmethod
    def _known_probes(cls, probes: list[str]) -> list[str]:
        for i, name in enumerate(probes):
            if name not in PROBES:
                raise ValueError(f"unknown probe {name!r} (allowed: {', '.join(sorted(PROBES))})")
            if name in probes[:i]:
                raise ValueError(f"probe {name!r} listed twice")
        return probes


_NAME_CHARS = re.compile(r"[A-Za-z0-9_.=+-]+")


class RunConfig(_Config):
    """One training run: model, task, optimizer, training loop and monitoring."""

    name: str = Field("run", min_length=1, max_length=100, description="run directory name")
    seed: _Int = Field(0, ge=0, le=2**64 - 1, description="torch.manual_seed takes 64 bits")
    device: Literal["cpu", "cuda"] = "cpu"
    dtype: Literal["float32", "float64"] = "float32"
    model: ModelConfig = TransformerConfig()
    task: TaskConfig = AssociativeRecallConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    train: TrainConfig = TrainConfig()
    monitor: MonitorConfig = MonitorConfig()

    @model_validator(mode="after")
    def _entropy_needs_softmax(self) -> RunConfig:
        if (
            "attention_entropy" in self.monitor.probes
            and getattr(self.model, "attention", "softmax") != "softmax"
        ):
            raise ValueError(
                "monitor.probes: attention_entropy needs softmax attention "
                f"(got model.attention={self.model.attention!r})"
            )
        return self

    @field_validator("model", mode="before")
    @classmethod
    def _model_defaults_to_transformer(cls, model: Any) -> Any:
        # `model: {d_model: 64}` without a name means the default model, as before the registry
        if isinstance(model, dict) and "name" not in model:
            return {"name": "transformer", **model}
        return model

    @field_validator("name")
    @classmethod
    def _safe_name(cls, name: str) -> str:
        # It names a folder (runs/NAME): no separators, no '..', nothing hidden.
        if not _NAME_CHARS.fullmatch(name):
            raise ValueError(f"must use only letters, digits and _ . = + - (got {name!r})")
        if name.startswith("."):
            raise ValueError(f"must not start with '.' (got {name!r})")
        return name


# -- errors, YAML and overrides ---------------------------------------------------------------
_TAG_TO_CONFIG: dict[str, type[BaseModel]] = {
    **MODEL_CONFIGS,
    **{name: config for name, (config, _) in TASKS.items()},
}
_UNION_TAGS = set(_TAG_TO_CONFIG)
_MAPPING_TYPES = {"model_type", "model_attributes_type", "dict_type"}


def _short(value: Any, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters so the error stays one readable line."""
    import reprlib  # bounded: a YAML alias bomb must not be expanded into a string

    short = reprlib.Repr()
    short.maxstring = short.maxother = short.maxlong = limit
    text = short.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def format_validation_error(err: ValidationError) -> str:
    """One line for a pydantic error: ``field.path: message (got VALUE)``; counts the rest."""
    errors = err.errors(include_url=False)
    first = errors[0]
    loc = ".".join(str(p) for p in first["loc"] if str(p) not in _UNION_TAGS) or "config"
    msg = first["msg"].removeprefix("Value error, ")
    kind, ctx = first["type"], first.get("ctx", {})
    if kind == "extra_forbidden":
        msg = "unknown field"
        allowed = _allowed_fields(err.title, first["loc"])
        if allowed:
            msg += f" (allowed: {', '.join(allowed)})"
    elif kind in ("union_tag_invalid", "union_tag_not_found"):  # the discriminated task union
        field = str(ctx.get("discriminator", "name")).strip("'")
        loc = f"{loc}.{field}"
        what = "model" if str(first["loc"][0]) == "model" else "task"
        names = MODEL_CONFIGS if what == "model" else TASKS
        allowed = f"(allowed: {', '.join(names)})"
        if kind == "union_tag_invalid":
            msg = f"unknown {what} {ctx['tag']!r} {allowed}"
        else:
            msg = f"missing; name a {what} {allowed}"
    elif kind not in ("value_error", "missing") and "input" in first:
        if kind in _MAPPING_TYPES:
            msg = "expected a mapping"
        msg += f" (got {_short(first['input'])})"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{loc}: {msg}{more}"


def _allowed_fields(title: str, loc: tuple) -> list[str]:
    """Field names of the model that owns the unknown key at ``loc``."""
    model: Any = {"RunConfig": RunConfig}.get(title)
    if model is None:
        return []
    for part in loc[:-1]:
        if str(part) in _UNION_TAGS:
            model = _TAG_TO_CONFIG.get(str(part), model)
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            return []
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            model = annotation
    return list(model.model_fields)


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b.c=VALUE`` overrides to a nested mapping (VALUE parsed by ``yaml.safe_load``).

    Returns a new mapping; ``data`` is not modified.

    Raises:
        ConfigError: for an override without ``=``, an empty key, or a path through a
            non-mapping value.
    """
    import copy

    result = copy.deepcopy(data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects KEY=VALUE with a dotted KEY (got {item!r})")
        try:
            value = yaml.safe_load(raw) if raw.strip() else raw
        except yaml.YAMLError:
            value = raw
        node = result
        parts = key.strip().split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {key}: {part} is not a mapping (got {child!r})")
            node = child
        node[parts[-1]] = value
    return result


def validate_config(
    data: Any, overrides: list[str] | None = None, *, config_class: type[BaseModel] = RunConfig
) -> Any:
    """Validate a raw mapping (after overrides) into a :class:`RunConfig` (or ``config_class``:
    a study's run config, :mod:`dynascope.train.runs`).

    Raises:
        ConfigError: with one line naming the field, the value and what is allowed.
    """
    if not isinstance(data, dict):
        raise ConfigError(
            f"config: expected a mapping at the top level (got {type(data).__name__})"
        )
    data = apply_overrides(data, overrides or [])
    try:
        return config_class.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err)) from None


class _DuplicateKeyError(ValueError):
    """A YAML mapping names the same key twice."""


def _check_unique_keys(text: str) -> None:
    """Refuse a YAML mapping with a repeated key (scalar keys compared by tag and text).

    PyYAML keeps the last value of a repeated key silently; in a config that hides a typo
    (``lr`` set twice, the first one ignored), so it is bad input here. The document is composed
    with the safe loader (nodes only, nothing constructed); a node shared through an alias is
    visited once, so alias bombs stay cheap.

    Raises:
        _DuplicateKeyError: naming the key and its line.
        yaml.YAMLError: if the text is not YAML.
    """
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    stack, seen_nodes = [root] if root is not None else [], set()
    while stack:
        node = stack.pop()
        if id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            keys: set[tuple[str, str]] = set()
            for key_node, value_node in node.value:
                if (
                    isinstance(key_node, yaml.ScalarNode)
                    and key_node.tag != "tag:yaml.org,2002:merge"
                ):
                    key = (key_node.tag, key_node.value)
                    if key in keys:
                        line = key_node.start_mark.line + 1
                        raise _DuplicateKeyError(f"duplicate key {key_node.value!r} at line {line}")
                    keys.add(key)
                stack.extend((key_node, value_node))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)


def load_config(
    path: str | os.PathLike[str],
    overrides: list[str] | None = None,
    *,
    config_class: type[BaseModel] = RunConfig,
) -> Any:
    """Read a YAML config (safe loader), apply overrides, validate (as :func:`validate_config`).

    Raises:
        ConfigError: missing or unreadable file, YAML syntax error, a key repeated in one
            mapping, or invalid config.
    """
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"config file: {str(path)!r} is a directory, not a YAML file")
    if not path.is_file():
        raise ConfigError(f"config file: no such file: {str(path)!r}")
    try:
        text = path.read_text(encoding="utf-8")
        _check_unique_keys(text)
        data = yaml.safe_load(text)
    except _DuplicateKeyError as err:
        raise ConfigError(f"config file {str(path)!r}: {err}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"config file {str(path)!r}: invalid YAML{where}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {str(path)!r}: not UTF-8 text") from None
    return validate_config(data if data is not None else {}, overrides, config_class=config_class)


# -- registry ---------------------------------------------------------------------------------
def build_task(config: Any) -> Task:
    """Instantiate the task a task config names.

    Raises:
        ConfigError: if the task rejects its arguments (e.g. a corpus with no text).
    """
    kwargs = config.model_dump(exclude={"name"})
    cls = TASKS[config.name][1]
    try:
        return cls(**kwargs)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def build_optimizer(
    config: OptimizerConfig, model: nn.Module
) -> tuple[torch.optim.Optimizer, list[dict]]:
    """The optimizer an optimizer config names, over ``model``'s role groups.

    Returns:
        ``(optimizer, param_groups)`` as :func:`dynascope.optim.build_optimizer`.
    """
    return optim.build_optimizer(
        model,
        name=config.name,
        lr=config.lr,
        weight_decay=config.weight_decay.model_dump(),
        mode=config.mode,
        betas=config.betas,
        eps=config.eps,
        momentum=config.momentum,
    )


def build_model(config: ModelConfig, task: Task) -> nn.Module:
    """Instantiate the model a model config names, sized for ``task``.

    Raises:
        ConfigError: if the model cannot serve the task (e.g. a classifier on a sequence task).
    """
    return _MODEL_BUILDERS[config.name](config, task)


def _build_vit(config: ViTConfig, task: Task) -> nn.Module:
    from dynascope.nn import ViT

    if task.input_kind != "vectors" or task.output_kind != "pooled":
        raise ConfigError(
            "model.name: vit classifies patch inputs (a task with vector inputs and pooled "
            f"outputs, e.g. digits; got task {type(task).__name__})"
        )
    model = ViT(
        n_layers=config.n_layers,
        d_model=config.d_model,
        n_heads=config.n_heads,
        d_head=config.d_head,
        d_mlp=config.d_mlp or None,
        d_in=task.d_in,
        n_patches=task.n_ctx,
        d_out=task.d_out,
        pooling=config.pooling,
        use_bias=config.use_bias,
        use_ln=config.use_ln,
    )
    return _sigma_reparam(config, model)


def _build_transformer(config: TransformerConfig, task: Task) -> nn.Module:
    from dynascope.nn import Transformer

    if task.output_kind != "sequence":
        raise ConfigError(
            "model.name: transformer predicts at every position; task "
            f"{type(task).__name__} wants one output per input (use model.name=vit)"
        )

    model = Transformer(
        n_layers=config.n_layers,
        d_model=config.d_model,
        n_heads=config.n_heads,
        d_head=config.d_head,
        d_mlp=config.d_mlp or None,
        d_vocab=task.d_vocab if task.input_kind == "tokens" else None,
        d_in=task.d_in if task.input_kind == "vectors" else None,
        d_out=task.d_out,
        n_ctx=task.n_ctx,
        positional=config.positional,
        attention=config.attention,
        is_causal=config.is_causal,
        use_bias=config.use_bias,
        use_ln=config.use_ln,
    )
    return _sigma_reparam(config, model)


def _sigma_reparam(config: TransformerConfig | ViTConfig, model: nn.Module) -> nn.Module:
    """σReparam ``model``'s linear maps when ``config.sigma_reparam`` (S12); else ``model``."""
    if not config.sigma_reparam:
        return model
    from dynascope.nn.reparam import convert_to_sigma_reparam

    return convert_to_sigma_reparam(
        model, scope=config.sigma_reparam_scope, gamma_init=config.sigma_reparam_gamma_init
    )


def _build_fcn(config: FCNConfig, task: Task) -> nn.Module:
    from dynascope.nn.fcn import FCN

    if task.input_kind != "vectors" or task.output_kind != "pooled":
        raise ConfigError(
            "model.name: fcn classifies vector inputs (a task with vector inputs and pooled "
            f"outputs, e.g. digits; got task {type(task).__name__})"
        )
    return FCN(task.n_ctx * task.d_in, config.hidden, task.d_out, activation=config.activation)


# name -> builder(config, task); one line per entry of MODEL_CONFIGS
_MODEL_BUILDERS: dict[str, Any] = {
    "transformer": _build_transformer,
    "vit": _build_vit,
    "fcn": _build_fcn,
}
