"""Resuming a study directory: which runs to keep, resume or start, and the tasks that do it
(used by ``Study.run``).

Glossary:
    manifest:  ``STUDY/study.json``: the study's name, preset, seed and every run's config as
               written when the study was last started; it is what a rerun compares against.
    keep:      a run whose status is ``finished`` or ``diverged`` (a divergence is a result).
    resume:    a run left ``running`` (its process was killed) or ``interrupted``: continued
               from its last checkpoint by runners that take ``resume=True``, started over by
               the others.
    start:     a run with no store, or one that ``failed`` (an exception may be transient):
               its directory is cleared and it starts from scratch.
    task:      what an executor runs (:class:`~dynascope.executors.RunTask`): one run, or the
               runs of one ``group`` trained together as an ensemble; an ensemble with a member
               to start starts every member, else one with a member to resume resumes them all.

A study directory never mixes configs: a rerun whose run configs differ from the manifest's
(another preset or seed into the same ``--out``, or a preset changed by an upgrade) is refused
before anything is written, naming the runs; ``fresh=True`` (``--fresh``) starts over. A
directory without a manifest (written before resuming existed) is started over, as it was then.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dynascope.store import STUDY_FILE, RunLockedError, lock_is_free, read_json, stored_run

if TYPE_CHECKING:
    from pydantic import BaseModel

    from dynascope.executors import RunTask

    from .base import RunSpec

__all__ = ["MANIFEST", "plan_runs", "plan_tasks", "write_manifest"]

MANIFEST = STUDY_FILE
_KEEP = ("finished", "diverged")


def _manifest(study: str, preset: str, seed: int, configs: dict[str, Any]) -> dict[str, Any]:
    return {"study": study, "preset": preset, "seed": seed, "runs": configs}


def write_manifest(out: Path, study: str, preset: str, seed: int, configs: dict[str, Any]) -> None:
    """Write ``out/study.json`` atomically."""
    path = out / MANIFEST
    tmp = path.with_name(MANIFEST + ".tmp")
    tmp.write_text(json.dumps(_manifest(study, preset, seed, configs), indent=2))
    tmp.replace(path)


def plan_runs(
    out: Path, study: str, preset: str, seed: int, configs: dict[str, Any], *, fresh: bool
) -> dict[str, str]:
    """Decide ``keep``/``resume``/``start`` for every run (module docstring); clear what starts.

    Args:
        out: the study directory.
        study, preset, seed: what is being run.
        configs: run name -> the run's config as JSON data (``model_dump(mode="json")``).
        fresh: start every run over (deletes ``out/runs``).
    Returns:
        run name -> ``"keep"``, ``"resume"`` or ``"start"``, in the order of ``configs``.
    Raises:
        ValueError: the directory holds runs of other configs (names them) and not ``fresh``.
        RunLockedError: a run to resume or start is being written by another live process.
    """
    runs_dir = out / "runs"
    manifest_path = out / MANIFEST
    previous = None
    if manifest_path.is_file() and not fresh:
        previous = read_json(manifest_path)
    if previous is None and runs_dir.is_dir():
        _refuse_locked(p for p in runs_dir.iterdir() if p.is_dir())
        shutil.rmtree(runs_dir)  # fresh, or written before study.json existed
    if previous is not None:
        _refuse_mixing(out, previous, study, configs)
    plan = {}
    for name in configs:
        run_dir = runs_dir / name
        status = _status(run_dir)
        if status in _KEEP:
            plan[name] = "keep"
        elif status in ("running", "interrupted"):
            plan[name] = "resume"
        else:
            plan[name] = "start"
    _refuse_locked(runs_dir / n for n, action in plan.items() if action != "keep")
    for name, action in plan.items():
        if action == "start" and (runs_dir / name).exists():
            shutil.rmtree(runs_dir / name)
    return plan


def plan_tasks(
    specs: list[RunSpec], plan: dict[str, str], out: Path, device: str | None, progress: bool
) -> tuple[list[RunTask], dict[str, str]]:
    """The tasks that execute the runs ``plan`` does not keep, in the specs' order (module
    docstring: an ensemble at its first member's place).

    Args:
        specs: the study's runs.
        plan: :func:`plan_runs`'s actions.
        out: the study directory (runs go to ``out/runs/NAME``).
        device: every run's device, or ``None`` for each run's own.
        progress: show per-run progress bars.
    Returns:
        ``(tasks, plan)``: the tasks, and the plan with what each task does to its members (a
        kept member of an ensemble that executes is started or resumed with it).
    Raises:
        ValueError: if the members of a group have different builds.
    """
    from dynascope.executors import RunTask

    plan, tasks = dict(plan), []
    for members in _groups(specs):
        spec = members[0]
        actions = {plan[m.name] for m in members}
        if actions == {"keep"}:
            continue
        action = "start" if "start" in actions else "resume"
        plan.update((m.name, action) for m in members)
        kwargs = {"progress": progress, "device": device, "resume": action == "resume"}
        cuda = (device or _device(spec.config)) == "cuda"
        dirs = [(out / "runs" / m.name).resolve() for m in members]
        if spec.group is None:
            tasks.append(RunTask(spec.name, spec.build, spec.config, dirs[0], kwargs, cuda))
        else:
            names = tuple(m.name for m in members)
            configs = [m.config for m in members]
            tasks.append(RunTask(spec.group, spec.build, configs, dirs, kwargs, cuda, names))
    return tasks, plan


def _groups(specs: list[RunSpec]) -> list[list[RunSpec]]:
    """Specs in order, those sharing a ``group`` together (at its first member's place).

    Raises:
        ValueError: if the members of a group have different builds.
    """
    groups: dict[str, list[RunSpec]] = {}
    out: list[list[RunSpec]] = []
    for spec in specs:
        if spec.group is None:
            out.append([spec])
        elif spec.group in groups:
            if spec.build != groups[spec.group][0].build:
                raise ValueError(f"group {spec.group!r}: its runs must share one build")
            groups[spec.group].append(spec)
        else:
            groups[spec.group] = [spec]
            out.append(groups[spec.group])
    return out


def _device(config: BaseModel) -> str:
    """A run config's device: a registry config's own, an engine run config's loop's."""
    loop = getattr(config, "loop", None)
    return getattr(loop if loop is not None else config, "device", "cpu")


def _status(run_dir: Path) -> str | None:
    """The stored run's status; ``None`` if it has no store, or one stopped before its schema
    was written (the run starts, as if absent)."""
    run = stored_run(run_dir)
    return None if run is None else run.status


def _refuse_mixing(
    out: Path, previous: dict[str, Any], study: str, configs: dict[str, Any]
) -> None:
    if previous.get("study") != study:
        raise ValueError(
            f"out: {str(out)!r} holds study {previous.get('study')!r}, not {study!r}; "
            "choose another --out"
        )
    old = previous.get("runs", {})
    runs_dir = out / "runs"
    on_disk = {p.name for p in runs_dir.iterdir() if p.is_dir()} if runs_dir.is_dir() else set()
    stored = {n for n in on_disk if (runs_dir / n / "metrics.sqlite").exists()}
    differ = sorted(n for n in stored if n in configs and _text(old.get(n)) != _text(configs[n]))
    foreign = sorted(n for n in stored if n not in configs)
    if differ or foreign:
        listed = differ + foreign
        names = ", ".join(listed[:3]) + (f" and {len(listed) - 3} more" if len(listed) > 3 else "")
        raise ValueError(
            f"out: {str(out)!r} holds runs made with other configs ({names}: preset "
            f"{previous.get('preset')!r}, seed {previous.get('seed')}); rerun with --fresh to "
            "start over or choose another --out"
        )


def _text(config: Any) -> str:
    """A config as canonical JSON text (so NaN fields compare equal to themselves)."""
    return json.dumps(config, sort_keys=True)


def _refuse_locked(run_dirs) -> None:
    for run_dir in run_dirs:
        if run_dir.is_dir() and not lock_is_free(run_dir):
            raise RunLockedError(
                f"run directory {str(run_dir)!r} is in use by another process; wait for it to "
                "finish"
            )
