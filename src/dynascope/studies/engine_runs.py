"""A study's runs on the engine: a run config with a seed and a :class:`~dynascope.train.Loop`,
a module-level ``build(config, streams) -> Parts``, and :func:`run_members` to train one run or
an ensemble of runs (the specs of one ``group``) with it.

A study runner then reads in one screen::

    class FcnRun(EngineRunConfig):          # seed and loop come from the base
        width: int = 64
        lr: float = 1e-3

    def build_fcn(config: FcnRun, streams: SeedStreams) -> Parts:
        x, y = digits_subset(streams.generator("subset"))
        model = FCN(64, config.width, 10)
        return Parts(model=model, data={"x": x, "y": y}, loss=cross_entropy_loss,
                     optimizer=lambda m: torch.optim.Adam(m.parameters(), lr=config.lr))

    def build_runs(preset, seed):
        return [RunSpec(f"fcn_s{s}", FcnRun(seed=seed + s, loop=preset.loop),
                        runner=engine_runner(build_fcn), group="fcn")
                for s in range(preset.seeds)]

Each run directory also gets ``runner.json`` naming ``build`` and the config class, so
``dynascope resume RUN_DIR`` can continue any run of any study alone (an ensemble member's
checkpoint is in a lone run's format).
"""

from __future__ import annotations

import functools
import importlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from dynascope.config import ConfigError
from dynascope.train import Engine, Loop, Member, Parts, SeedStreams, TrainResult

__all__ = ["RUNNER_FILE", "EngineRunConfig", "engine_runner", "resume_run", "run_members"]

RUNNER_FILE = "runner.json"

Build = Callable[[Any, SeedStreams], Parts]


class EngineRunConfig(BaseModel):
    """Base of a study's run config on the engine: the member seed and the engine's loop."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = Field(0, ge=0, description="the run seed (its streams: dynascope.train.seeding)")
    loop: Loop


@functools.cache
def engine_runner(build: Build) -> Callable[..., list[TrainResult] | TrainResult]:
    """The picklable runner of ``build`` (a module-level function) for a :class:`RunSpec`.

    One object per ``build`` (cached), so the specs of a group compare equal runners.
    """
    return functools.partial(run_members, build)


def run_members(
    build: Build,
    configs: EngineRunConfig | Sequence[EngineRunConfig],
    run_dirs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    progress: bool = False,
    device: str | None = None,
    resume: bool = False,
) -> TrainResult | list[TrainResult]:
    """Train one run, or the members of an ensemble, on the engine.

    Args:
        build: ``build(config, streams) -> Parts``, module-level (named in ``runner.json``).
        configs: one run config, or one per member (equal ``loop`` for all).
        run_dirs: the run directory, or one per member.
        progress: show a progress bar.
        device: ``cpu`` or ``cuda`` overrides ``loop.device``; ``None`` keeps it.
        resume: continue from the last checkpoint common to every member.
    Returns:
        The :class:`~dynascope.train.TrainResult` (a list for lists).
    Raises:
        dynascope.config.ConfigError: members whose loops differ, or what
            :class:`~dynascope.train.Engine` raises.
    """
    lone = isinstance(configs, BaseModel)
    configs = [configs] if lone else list(configs)
    dirs = [Path(run_dirs)] if lone else [Path(d) for d in run_dirs]  # type: ignore[arg-type]
    if device is not None:
        configs = [
            c.model_copy(update={"loop": c.loop.model_copy(update={"device": device})})
            for c in configs
        ]
    loop = configs[0].loop
    if any(c.loop != loop for c in configs):
        raise ConfigError("loop: the members of an ensemble must share one loop")
    members = [
        Member(d, c.seed, c.model_dump(mode="json"), name=d.name)
        for c, d in zip(configs, dirs, strict=True)
    ]
    for config, run_dir in zip(configs, dirs, strict=True):
        _write_runner(run_dir, build, type(config))
    pending = iter(configs)  # the engine builds its members in order

    def build_member(streams: SeedStreams) -> Parts:
        return build(next(pending), streams)

    results = Engine(members, build_member, loop, progress=progress, name=dirs[0].name).run(
        resume=resume
    )
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


def resume_run(run_dir: str | os.PathLike[str], *, progress: bool = False) -> TrainResult:
    """Continue a study's run (one with ``runner.json``) alone from its last checkpoint.

    Raises:
        dynascope.config.ConfigError: ``runner.json`` or ``config.yaml`` is missing or names
            something that cannot be imported or validated.
    """
    import yaml

    run_dir = Path(run_dir)
    try:
        info = json.loads((run_dir / RUNNER_FILE).read_text())
        build, config_class = _load(info["build"]), _load(info["config"])
        config = config_class.model_validate(yaml.safe_load((run_dir / "config.yaml").read_text()))
    except (OSError, ValueError, KeyError, ImportError, AttributeError) as err:
        raise ConfigError(
            f"RUN_DIR: {str(run_dir)!r} cannot be resumed ({type(err).__name__}: "
            f"{str(err).splitlines()[0][:120]})"
        ) from None
    return run_members(build, config, run_dir, progress=progress, resume=True)
