"""Runs on the engine: a run config, a module-level ``build(config, streams) -> Parts``, and
:func:`run_members` to train one run or an ensemble of runs with it. The one door into the
engine for a study's runs, ``dynascope run`` and ``dynascope resume``.

A run config is an :class:`EngineRunConfig` (a seed and a :class:`~dynascope.train.Loop`; a
study's runs subclass it) or a registry :class:`~dynascope.config.RunConfig` (its seed, and
the loop of :func:`~dynascope.train.registry.loop_of`), built by
:func:`~dynascope.train.registry.build_registry`. A study's run then reads in one screen::

    class FcnRun(EngineRunConfig):          # seed and loop come from the base
        width: int = 64
        lr: float = 1e-3

    def build_fcn(config: FcnRun, streams: SeedStreams) -> Parts:
        x, y = digits_subset(streams.generator("subset"))
        model = FCN(64, config.width, 10)
        return Parts(model=model, data={"x": x, "y": y}, loss=cross_entropy_loss,
                     optimizer=lambda m: torch.optim.Adam(m.parameters(), lr=config.lr))

    run_members(build_fcn, FcnRun(seed=0, loop=Loop(steps=100)), "runs/fcn")

Every run directory gets ``runner.json`` naming ``build`` and the config class beside its
``config.yaml``, so :func:`resume_run` (``dynascope resume RUN_DIR``) continues any run alone
(an ensemble member's checkpoint is in a lone run's format) and :func:`load_run_config`
(``dynascope run RUN_DIR/config.yaml``) trains it again.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from dynascope.config import ConfigError, RunConfig, load_config

from .engine import Engine, Loop, Member, Parts, TrainResult
from .registry import build_registry, loop_of
from .seeding import SeedStreams

__all__ = [
    "RUNNER_FILE",
    "Build",
    "EngineRunConfig",
    "load_run_config",
    "resume_run",
    "run_members",
]

RUNNER_FILE = "runner.json"

Build = Callable[[Any, SeedStreams], Parts]


class EngineRunConfig(BaseModel):
    """Base of a study's run config on the engine: the member seed and the engine's loop."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = Field(0, ge=0, description="the run seed (its streams: dynascope.train.seeding)")
    loop: Loop


def _loop(config: BaseModel) -> Loop:
    return loop_of(config) if isinstance(config, RunConfig) else config.loop  # type: ignore[attr-defined]


def _with_device(config: BaseModel, device: str) -> BaseModel:
    if isinstance(config, RunConfig):
        return config.model_copy(update={"device": device})
    loop = config.loop.model_copy(update={"device": device})  # type: ignore[attr-defined]
    return config.model_copy(update={"loop": loop})


def run_members(
    build: Build,
    configs: BaseModel | Sequence[BaseModel],
    run_dirs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    device: str | None = None,
    resume: bool = False,
    progress: bool = False,
    bf16: bool = False,
) -> TrainResult | list[TrainResult]:
    """Train one run, or the members of an ensemble, on the engine.

    The engine is built (and every input checked) before anything is written; then each run
    directory gets ``runner.json`` (on the writing rank only under ``torchrun``).

    Args:
        build: ``build(config, streams) -> Parts``, module-level (named in ``runner.json``).
        configs: one run config (:class:`EngineRunConfig` or
            :class:`~dynascope.config.RunConfig`), or one per member (one loop for all).
        run_dirs: the run directory, or one per member.
        device: ``cpu`` or ``cuda`` overrides the configs' device; ``None`` keeps it.
        resume: continue from the last checkpoint common to every member.
        progress: show a progress bar.
        bf16: the loss under bf16 autocast (CUDA only).
    Returns:
        The :class:`~dynascope.train.TrainResult` (a list for lists).
    Raises:
        dynascope.config.ConfigError: members whose loops differ, or what
            :class:`~dynascope.train.Engine` raises.
        dynascope.store.RunLockedError: another live process writes to a run directory.
    """
    lone = isinstance(configs, BaseModel)
    configs = [configs] if lone else list(configs)  # type: ignore[list-item]
    dirs = [Path(run_dirs)] if lone else [Path(d) for d in run_dirs]  # type: ignore[arg-type]
    if device is not None:
        configs = [_with_device(c, device) for c in configs]
    loop = _loop(configs[0])
    if any(_loop(c) != loop for c in configs):
        raise ConfigError("loop: the members of an ensemble must share one loop")
    members = [
        Member(d, c.seed, c.model_dump(mode="json"), name=d.name)  # type: ignore[attr-defined]
        for c, d in zip(configs, dirs, strict=True)
    ]
    pending = iter(configs)  # the engine builds its members in order

    def build_member(streams: SeedStreams) -> Parts:
        return build(next(pending), streams)

    engine = Engine(members, build_member, loop, progress=progress, bf16=bf16, name=dirs[0].name)
    if engine.dist.is_writer:
        for config, run_dir in zip(configs, dirs, strict=True):
            _write_runner(run_dir, build, type(config))
    results = engine.run(resume=resume)
    return results[0] if lone else results


def _qualified(obj: Any) -> str:
    return f"{obj.__module__}:{obj.__qualname__}"


def _write_runner(run_dir: Path, build: Build, config_class: type) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"build": _qualified(build), "config": _qualified(config_class)}, indent=2)
    tmp = run_dir / (RUNNER_FILE + ".tmp")
    tmp.write_text(text)
    tmp.replace(run_dir / RUNNER_FILE)


def _load(name: str) -> Any:
    module, _, qualname = name.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def load_run_config(
    path: str | os.PathLike[str], overrides: list[str] | None = None
) -> tuple[Build, BaseModel]:
    """A run config file and the build that trains it: ``(build, config)``.

    The build and the config class are those ``runner.json`` beside the file names; a file
    without one (a config written by hand, or a run directory from before ``runner.json``) is a
    registry :class:`~dynascope.config.RunConfig`, built by
    :func:`~dynascope.train.registry.build_registry`.

    Args:
        path: a YAML run config (``RUN_DIR/config.yaml``).
        overrides: dotted ``KEY=VALUE`` overrides (:func:`dynascope.config.apply_overrides`).
    Raises:
        dynascope.config.ConfigError: the file is missing or invalid, or ``runner.json`` names
            something that cannot be imported.
    """
    path = Path(path)
    runner = path.parent / RUNNER_FILE
    if not runner.is_file():
        return build_registry, load_config(path, overrides)
    try:
        info = json.loads(runner.read_text())
        build, config_class = _load(info["build"]), _load(info["config"])
    except (OSError, ValueError, KeyError, TypeError, ImportError, AttributeError) as err:
        raise ConfigError(
            f"{RUNNER_FILE}: {str(runner)!r} names no importable build and config class "
            f"({type(err).__name__}: {str(err).splitlines()[0][:120]})"
        ) from None
    return build, load_config(path, overrides, config_class=config_class)


def resume_run(
    run_dir: str | os.PathLike[str], *, device: str | None = None, progress: bool = False
) -> TrainResult:
    """Continue any run directory alone from its last checkpoint (:func:`load_run_config`).

    Raises:
        dynascope.config.ConfigError: ``config.yaml`` is missing or invalid, or
            ``runner.json`` names something that cannot be imported.
    """
    run_dir = Path(run_dir)
    build, config = load_run_config(run_dir / "config.yaml")
    return run_members(build, config, run_dir, device=device, resume=True, progress=progress)
