"""One run of ``modular-teacher-student``: its config, the meta-training loop and the evaluation.

Glossary (as :mod:`dynascope.tasks.modular_teacher`): M teacher modules, M_hat = code_factor·M
student code width, z / z_hat teacher / inferred codes ``[tasks, M]`` / ``[tasks, M_hat]``.

Per outer step: draw ``meta_batch`` training codes; infer each task's code with
``inner_steps`` batched Adam steps from one shared initial code ``z_hat_0`` (S5's "constant"
init: one N(0, I) draw made with the student's initialisation); then one AdamW step on
``0.5·mean((student(x, z_hat) − teacher(x, z))²)`` over fresh ``batch`` inputs per task,
z_hat detached (first order) unless ``second_order``. Learning rate: cosine from ``outer_lr``
to ``cosine_alpha·outer_lr`` over ``outer_steps`` (optax ``cosine_decay_schedule``).

Inner-loop inputs: ``inner_fresh_x=True`` draws fresh ``inner_batch`` inputs every inner step
(the reference); ``False`` draws them once per outer step (a support set per task; the fast
preset, whose inner loop then costs one teacher pass instead of ``inner_steps``).

Stored (RunStore): scalars ``outer.loss`` (mean over each ``log_every`` window), ``lr``; at the
last step, for key in ``train`` and ``eval_{h/M:.3f}`` (h = 1..M): scalars ``{key}.loss``,
``{key}.relative_loss`` (``Σ‖ŷ − y‖² / Σ‖y‖²`` over the key's tasks and inputs), tensors
``{key}.z`` and ``{key}.z_hat``; tensors ``theta`` ``[M, n_input, n_hidden]`` and (hypernetwork
students) ``theta_hat`` ``[M_hat, n_input, n_hidden_hat]`` of the first generated layer; a final
checkpoint with the student's ``state_dict`` and ``code_0`` (for re-evaluation).

Seeds: teacher weights from ``seed``, student weights and ``z_hat_0`` from ``seed + 1``,
training data from ``seed + 2``, evaluation data from ``seed + 3``: two runs with the same seed
and different task sets share the teacher, the student's initialisation and the eval tasks.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator
from torch import Tensor

from dynascope.nn.inner_loop import fit_codes
from dynascope.nn.multitask_hypernet import MonolithicMLP, MultitaskHypernet
from dynascope.store import RunStore
from dynascope.studies.base import one_intra_op_thread
from dynascope.tasks.modular_teacher import TASK_SETS, ModularTeacher

__all__ = ["ModularStudentConfig", "evaluate", "infer_codes", "run_modular_student"]


class ModularStudentConfig(BaseModel):
    """One teacher-student run (defaults: S5's reference configuration)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["modular_teacher_student"] = "modular_teacher_student"
    task_set: str = Field("one_hots+ring", description="a key of tasks.modular_teacher.TASK_SETS")
    seed: int = Field(0, ge=0)
    n_input: int = Field(16, ge=1)
    n_hidden: int = Field(16, ge=1, description="teacher hidden width")
    n_output: int = Field(4, ge=1)
    n_modules: int = Field(6, ge=1, description="teacher modules M")
    n_hidden_layers: int = Field(1, ge=1)
    student: Literal["hypernet", "monolithic"] = "hypernet"
    hidden_factor: float = Field(2.0, gt=0, description="student hidden width / teacher's")
    code_factor: float = Field(2.0, gt=0, description="student code width M_hat / M")
    code_init: Literal["constant", "normal"] = "constant"
    inner_steps: int = Field(300, ge=0)
    inner_lr: float = Field(3e-3, gt=0)
    inner_batch: int = Field(256, ge=1, description="inputs per task in the inner loop")
    inner_fresh_x: bool = True
    second_order: bool = False
    outer_steps: int = Field(60_000, ge=1)
    outer_lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    cosine_alpha: float = Field(1e-3, ge=0, le=1)
    meta_batch: int = Field(64, ge=1)
    batch: int = Field(256, ge=1, description="inputs per task in the outer loss")
    eval_tasks: int = Field(512, ge=2)
    eval_batch: int = Field(1024, ge=1)
    log_every: int = Field(100, ge=1)

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


def make_student(cfg: ModularStudentConfig, generator: torch.Generator) -> torch.nn.Module:
    """The student network (hypernetwork or monolithic), initialised from ``generator``."""
    cls = MultitaskHypernet if cfg.student == "hypernet" else MonolithicMLP
    return cls(
        cfg.n_input,
        cfg.n_hidden_hat,
        cfg.n_output,
        cfg.n_modules_hat,
        cfg.n_hidden_layers,
        generator=generator,
    )


def infer_codes(
    student: torch.nn.Module,
    teacher: ModularTeacher,
    z: Tensor,
    code_0: Tensor,
    generator: torch.Generator,
    *,
    steps: int,
    lr: float,
    batch: int,
    fresh_x: bool,
    second_order: bool = False,
) -> Tensor:
    """Fit the student's codes ``[tasks, M_hat]`` to the teacher tasks ``z`` ``[tasks, M]``.

    Hypernetwork students use their hand-written code gradient in first order, all others
    autograd (:func:`dynascope.nn.inner_loop.fit_codes`).
    """
    n = z.shape[0]
    fixed = None if fresh_x else _inputs(teacher, z, batch, generator)

    def data(step: int) -> tuple[Tensor, Tensor]:
        return fixed if fixed is not None else _inputs(teacher, z, batch, generator)

    if isinstance(student, MultitaskHypernet) and not second_order:
        return fit_codes(
            None,
            code_0,
            n,
            steps=steps,
            lr=lr,
            grad_fn=lambda code, step: student.code_gradient(*data(step), code)[1],
        )

    def loss_fn(code: Tensor, step: int) -> Tensor:
        x, y = data(step)
        return 0.5 * (student(x, code) - y).square().mean((1, 2))

    return fit_codes(loss_fn, code_0, n, steps=steps, lr=lr, second_order=second_order)


def _inputs(
    teacher: ModularTeacher, z: Tensor, batch: int, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    x = teacher.sample_x(z.shape[0], batch, generator)
    return x, teacher(x, z)


def _cosine_lr(cfg: ModularStudentConfig, step: int) -> float:
    decay = 0.5 * (1 + math.cos(math.pi * min(step, cfg.outer_steps) / cfg.outer_steps))
    return cfg.outer_lr * ((1 - cfg.cosine_alpha) * decay + cfg.cosine_alpha)


def evaluate(
    student: torch.nn.Module,
    teacher: ModularTeacher,
    cfg: ModularStudentConfig,
    code_0: Tensor,
    generator: torch.Generator,
) -> dict[str, Tensor | float]:
    """Infer codes of ``eval_tasks`` tasks per key and measure the student's loss on them.

    Returns the values logged at the last step (see the module docstring).
    """
    out: dict[str, Tensor | float] = {}
    for key in teacher.keys:
        z = teacher.sample_codes(key, cfg.eval_tasks, generator)
        start = code_0
        if cfg.code_init == "normal":
            start = torch.randn(z.shape[0], code_0.shape[-1], generator=generator, device=z.device)
        z_hat = infer_codes(
            student,
            teacher,
            z,
            start,
            generator,
            steps=cfg.inner_steps,
            lr=cfg.inner_lr,
            batch=cfg.inner_batch,
            fresh_x=cfg.inner_fresh_x,
        )
        x, y = _inputs(teacher, z, cfg.eval_batch, generator)
        with torch.no_grad():
            err = student(x, z_hat) - y
        out[f"{key}.loss"] = float(0.5 * err.square().mean())
        out[f"{key}.relative_loss"] = float(err.square().sum() / y.square().sum())
        out[f"{key}.z"] = z.cpu()
        out[f"{key}.z_hat"] = z_hat.cpu()
    out["theta"] = teacher.network.modules_of(0).detach().cpu()
    if isinstance(student, MultitaskHypernet):
        out["theta_hat"] = student.modules_of(0).detach().cpu()
    return out


def run_modular_student(
    config: ModularStudentConfig,
    run_dir: Path,
    progress: bool = False,
    device: str = "cpu",
) -> None:
    """Meta-train a student on the teacher's training tasks, then evaluate (module docstring).

    A non-finite outer loss stops the run with status ``diverged``.
    """
    del progress
    cfg = config
    dev = torch.device(device)
    with one_intra_op_thread(), RunStore(run_dir) as store:
        store.truncate_after(-1)  # a re-run replaces the directory's rows
        store.write_config(cfg.model_dump(mode="json"))
        store.set_status(0, "running")
        teacher = ModularTeacher(
            cfg.task_set,
            n_input=cfg.n_input,
            n_hidden=cfg.n_hidden,
            n_output=cfg.n_output,
            n_modules=cfg.n_modules,
            n_hidden_layers=cfg.n_hidden_layers,
            teacher_seed=cfg.seed,
            device=dev,
        )
        g_student = torch.Generator().manual_seed(cfg.seed + 1)
        student = make_student(cfg, g_student).to(dev)
        code_0 = torch.randn(cfg.n_modules_hat, generator=g_student).to(dev)
        g = torch.Generator(device=dev).manual_seed(cfg.seed + 2)
        opt = torch.optim.AdamW(
            student.parameters(), lr=cfg.outer_lr, weight_decay=cfg.weight_decay
        )
        window = []
        for step in range(1, cfg.outer_steps + 1):
            z = teacher.sample_codes("train", cfg.meta_batch, g)
            start = code_0
            if cfg.code_init == "normal":
                start = torch.randn(cfg.meta_batch, cfg.n_modules_hat, generator=g, device=dev)
            z_hat = infer_codes(
                student,
                teacher,
                z,
                start,
                g,
                steps=cfg.inner_steps,
                lr=cfg.inner_lr,
                batch=cfg.inner_batch,
                fresh_x=cfg.inner_fresh_x,
                second_order=cfg.second_order,
            )
            x, y = _inputs(teacher, z, cfg.batch, g)
            loss = 0.5 * (student(x, z_hat) - y).square().mean()
            for group in opt.param_groups:
                group["lr"] = _cosine_lr(cfg, step - 1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            window.append(loss.detach())
            if step % cfg.log_every == 0 or step == cfg.outer_steps:
                mean = torch.stack(window).mean()
                store.log(step, {"outer.loss": mean, "lr": _cosine_lr(cfg, step - 1)})
                window = []
                if not torch.isfinite(mean):
                    store.set_status(step, "diverged")
                    return
        g_eval = torch.Generator(device=dev).manual_seed(cfg.seed + 3)
        store.log(cfg.outer_steps, evaluate(student, teacher, cfg, code_0, g_eval))
        state = {k: v.cpu() for k, v in student.state_dict().items()}
        store.save_checkpoint(cfg.outer_steps, {"student": state, "code_0": code_0.cpu()})
        store.set_status(cfg.outer_steps, "finished")
