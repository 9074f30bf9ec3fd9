"""modular-teacher-student runs on the engine: one student on one task set and seed per run.

Each step's loss runs the inner loop (task inference) on a support set the batch carries, then
the student's loss on the query inputs (:func:`meta_loss`); the teacher lives in the data
function, so the loss is a pure function of the student and the batch and the seeds of a preset
(both task sets) train as one ensemble. :func:`evaluate` infers codes for fresh tasks of every
key and returns the study's instruments as scalars. Notes: docs/studies/modular-teacher-student.md.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Literal

import torch
from pydantic import Field, field_validator
from torch import Tensor, nn

from dynascope.nn.inner_loop import fit_codes
from dynascope.nn.multitask_hypernet import MonolithicMLP, MultitaskHypernet
from dynascope.probes.module_alignment import code_r2, fit_code_map, module_alignment
from dynascope.tasks.modular_teacher import (
    TASK_SETS,
    ModularTeacher,
    continuous_codes,
    masks_of,
    support_structure,
)
from dynascope.train import EngineRunConfig, Parts, SeedStreams

__all__ = [
    "SPLIT_SET",
    "Student",
    "TeacherStudentRun",
    "build_student",
    "component_masks",
    "evaluate",
    "meta_loss",
]

# The task set whose two components define "cross" and "within" evaluation tasks.
SPLIT_SET = "one_hots+two_triangles"


class TeacherStudentRun(EngineRunConfig):
    """One teacher-student run (defaults: S5's reference sizes and inner loop)."""

    task_set: str = Field("one_hots+ring", description="a key of tasks.modular_teacher.TASK_SETS")
    n_input: int = Field(16, ge=1)
    n_hidden: int = Field(16, ge=1, description="teacher hidden width")
    n_output: int = Field(4, ge=1)
    n_modules: int = Field(6, ge=1, description="teacher modules M")
    n_hidden_layers: int = Field(1, ge=1)
    student: Literal["hypernet", "monolithic"] = "hypernet"
    hidden_factor: float = Field(2.0, gt=0, description="student hidden width / teacher's")
    code_factor: float = Field(2.0, gt=0, description="student code width M_hat / M")
    inner_steps: int = Field(300, ge=0)
    inner_lr: float = Field(3e-3, gt=0)
    inner_batch: int = Field(256, ge=1, description="support inputs per task")
    inner_fresh_x: bool = Field(True, description="fresh support inputs every inner step")
    second_order: bool = False
    outer_lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    meta_batch: int = Field(64, ge=1)
    batch: int = Field(256, ge=1, description="query inputs per task in the outer loss")
    eval_inner_steps: int = Field(300, ge=0, description="inner steps when evaluating")
    eval_inner_lr: float = Field(3e-3, gt=0)
    eval_tasks: int = Field(512, ge=2)
    eval_support: int = Field(256, ge=1, description="support inputs per eval task")
    eval_batch: int = Field(1024, ge=1, description="query inputs per eval task")
    eval_keys: bool = Field(True, description="also evaluate eval_{h/M}, h = 1..M")
    eval_at: tuple[int, ...] = Field((), description="steps of evaluation (): the last step")

    @field_validator("task_set")
    @classmethod
    def _known_task_set(cls, value: str) -> str:
        if value not in TASK_SETS:
            raise ValueError(f"task_set must be one of {sorted(TASK_SETS)} (got {value!r})")
        return value

    @property
    def n_hidden_hat(self) -> int:
        return max(1, round(self.n_hidden * self.hidden_factor))

    @property
    def n_modules_hat(self) -> int:
        return max(1, round(self.n_modules * self.code_factor))


class Student(nn.Module):
    """The student network and its shared initial code ``code_0`` ``[M_hat]`` (a buffer)."""

    def __init__(self, config: TeacherStudentRun, generator: torch.Generator) -> None:
        super().__init__()
        cls = MultitaskHypernet if config.student == "hypernet" else MonolithicMLP
        self.net = cls(
            config.n_input,
            config.n_hidden_hat,
            config.n_output,
            config.n_modules_hat,
            config.n_hidden_layers,
            generator=generator,
        )
        self.register_buffer("code_0", torch.randn(config.n_modules_hat, generator=generator))

    def forward(self, x: Tensor, z_hat: Tensor) -> Tensor:
        return self.net(x, z_hat)


def infer_codes(
    student: Student, x: Tensor, y: Tensor, steps: int, lr: float, second_order: bool = False
) -> Tensor:
    """Codes ``[tasks, M_hat]`` fitted from ``code_0`` by ``steps`` batched Adam steps on the
    support set ``x`` ``[S, tasks, batch, n_input]``, ``y`` ``[S, tasks, batch, n_output]``
    (inner step t uses slice ``t mod S``); hypernetworks use their hand-written gradient."""
    net, n = student.net, x.shape[1]

    def data(step: int) -> tuple[Tensor, Tensor]:
        return x[step % x.shape[0]], y[step % y.shape[0]]

    if isinstance(net, MultitaskHypernet) and not second_order:
        grad = lambda code, step: net.code_gradient(*data(step), code)[1]  # noqa: E731
        return fit_codes(None, student.code_0, n, steps=steps, lr=lr, grad_fn=grad)

    def loss_fn(code: Tensor, step: int) -> Tensor:
        xs, ys = data(step)
        return 0.5 * (net(xs, code) - ys).square().mean((1, 2))

    return fit_codes(loss_fn, student.code_0, n, steps=steps, lr=lr, second_order=second_order)


def meta_loss(
    config: TeacherStudentRun,
) -> Callable[[Student, dict[str, Tensor]], tuple[Tensor, dict]]:
    """``loss(student, batch)``: infer the codes on the support set, then
    ``0.5·mean((student(x, z_hat) − y)²)`` on the query set (z_hat detached unless second
    order); metric ``relative_loss`` ``Σ‖ŷ − y‖² / Σ‖y‖²`` on the query set."""

    def loss(student: Student, batch: dict[str, Tensor]) -> Tensor:
        z_hat = infer_codes(
            student,
            batch["x_support"],
            batch["y_support"],
            config.inner_steps,
            config.inner_lr,
            config.second_order,
        )
        err = student(batch["x"], z_hat) - batch["y"]
        relative = err.detach().square().sum() / batch["y"].square().sum()
        return 0.5 * err.square().mean(), {"relative_loss": relative}

    return loss


def _draw(
    teacher: ModularTeacher, z: Tensor, support: int, support_batch: int, batch: int, g
) -> dict[str, Tensor]:
    """Support sets ``[support, tasks, support_batch, ·]`` and a query set of the tasks ``z``."""
    xs = torch.stack([teacher.sample_x(len(z), support_batch, g) for _ in range(support)])
    x = teacher.sample_x(len(z), batch, g)
    return {
        "x_support": xs,
        "y_support": torch.stack([teacher(x_, z) for x_ in xs]),
        "x": x,
        "y": teacher(x, z),
    }


def component_masks(n_modules: int) -> dict[str, Tensor]:
    """Evaluation masks by how they sit on the components of :data:`SPLIT_SET` (the two
    triangles {0,1,2}, {3,4,5} at M = 6): ``cross``: every mask with modules in both
    components; ``within``: every mask of >= 2 modules inside one component."""
    codes = masks_of(SPLIT_SET, n_modules)
    parts = support_structure(codes / codes.norm(dim=-1, keepdim=True)).components
    comp = {i: k for k, part in enumerate(parts) for i in part}
    cross, within = [], []
    for mask in itertools.product((0.0, 1.0), repeat=n_modules):
        on = [i for i, m in enumerate(mask) if m]
        if len(on) < 2:
            continue
        (cross if len({comp[i] for i in on}) > 1 else within).append(mask)
    return {"cross": torch.tensor(cross), "within": torch.tensor(within)}


def evaluate(
    student: Student, teacher: ModularTeacher, config: TeacherStudentRun, seed: int
) -> dict[str, float]:
    """Instruments on fresh tasks (generator seeded from ``seed`` each call).

    Keys, per task kind ``fit`` (training tasks), ``cross``, ``within``, ``eval_{h/M}``:
    ``{kind}.loss`` (``0.5 mean((ŷ − y)²)``), ``{kind}.relative_loss``
    (``Σ‖ŷ − y‖² / Σ‖y‖²``) and, but for ``fit``, ``{kind}.r2`` (mean over the teacher's
    coordinates of the ridge-decoding R², F fit on the ``fit`` tasks); ``align`` (mean signed
    per-unit module alignment, hypernetwork students only); ``val.loss`` = ``train.loss``.
    """
    g = torch.Generator().manual_seed(seed)
    dev = next(student.parameters()).device
    masks = component_masks(config.n_modules)
    kinds = ["fit", "cross", "within", *(teacher.keys[1:] if config.eval_keys else [])]
    codes: dict[str, tuple[Tensor, Tensor]] = {}
    out: dict[str, float] = {}
    for kind in kinds:
        if kind in masks:
            pick = torch.randint(len(masks[kind]), (config.eval_tasks,), generator=g)
            z = continuous_codes(masks[kind][pick], g)
        else:
            z = teacher.sample_codes("train" if kind == "fit" else kind, config.eval_tasks, g)
        batch = _draw(teacher, z, 1, config.eval_support, config.eval_batch, g)
        batch = {k: v.to(dev) for k, v in batch.items()}
        with torch.enable_grad():  # a monolithic student's inner loop uses autograd
            z_hat = infer_codes(
                student,
                batch["x_support"],
                batch["y_support"],
                config.eval_inner_steps,
                config.eval_inner_lr,
            )
        with torch.no_grad():
            err = student(batch["x"], z_hat) - batch["y"]
        out[f"{kind}.loss"] = float(0.5 * err.square().mean())
        out[f"{kind}.relative_loss"] = float(err.square().sum() / batch["y"].square().sum())
        codes[kind] = (z, z_hat.cpu())
    F = fit_code_map(codes["fit"][1], codes["fit"][0], l2=0.01)
    for kind in kinds[1:]:
        z, z_hat = codes[kind]
        r2 = code_r2(F, z_hat, z)  # NaN for a coordinate constant on these tasks
        r2 = r2[~r2.isnan()]
        out[f"{kind}.r2"] = float(r2.mean()) if len(r2) else math.nan
    if isinstance(student.net, MultitaskHypernet):
        theta = teacher.network.modules_of(0).cpu()
        theta_hat = student.net.modules_of(0).detach().cpu()
        out["align"] = float(module_alignment(theta, theta_hat, F).mean())
    return out


def build_student(config: TeacherStudentRun, streams: SeedStreams) -> Parts:
    """A student on one task set: the teacher from stream ``teacher`` (shared by the task sets
    of one seed), the student and ``code_0`` from ``student``, evaluation tasks from ``eval``."""
    teacher = ModularTeacher(
        config.task_set,
        n_input=config.n_input,
        n_hidden=config.n_hidden,
        n_output=config.n_output,
        n_modules=config.n_modules,
        n_hidden_layers=config.n_hidden_layers,
        teacher_seed=streams("teacher"),
    )
    support = config.inner_steps if config.inner_fresh_x else 1

    def data(g: torch.Generator) -> dict[str, Tensor]:
        z = teacher.sample_codes("train", config.meta_batch, g)
        return _draw(teacher, z, max(1, support), config.inner_batch, config.batch, g)

    def optimizer(model: Student) -> torch.optim.Optimizer:
        return torch.optim.AdamW(
            model.parameters(), lr=config.outer_lr, weight_decay=config.weight_decay
        )

    def instruments(model: Student, ctx: object) -> dict[str, float]:
        return evaluate(model, teacher, config, streams("eval"))

    return Parts(
        model=Student(config, streams.generator("student")),
        data=data,
        loss=meta_loss(config),
        optimizer=optimizer,
        probes=[(instruments, AtSteps(config.eval_at or (config.loop.steps,)))],
    )


class AtSteps:
    """A probe schedule due at the given steps only."""

    def __init__(self, steps: tuple[int, ...]) -> None:
        self.steps = frozenset(steps)

    def due(self, step: int) -> bool:
        return step in self.steps
