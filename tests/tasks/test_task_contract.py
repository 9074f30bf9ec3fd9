"""Every Task subclass honours the contract in dynascope/tasks/base.py."""

import pytest
import torch

from dynascope.tasks import AssociativeRecall, CharLM, Digits, InContextLinearRegression, Task

TEXT = "The quick brown fox jumps over the lazy dog. " * 20


def make_tasks() -> list[Task]:
    return [
        AssociativeRecall(n_keys=7, n_values=5, n_pairs=3),
        InContextLinearRegression(d_x=3, n_points=6, noise_std=0.1),
        CharLM(text=TEXT, n_ctx=11),
        Digits(patch_size=2, n_train=300),
    ]


TASKS = make_tasks()
IDS = [type(t).__name__ for t in TASKS]


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("task", TASKS, ids=IDS)
@pytest.mark.parametrize("split", ["train", "val"])
def test_batch_shapes_and_dtypes(task: Task, split: str) -> None:
    batch = task.batch(split, 2, gen(0))
    x = batch["x"]
    if task.input_kind == "tokens":
        assert task.d_vocab is not None and task.d_in is None
        assert x.shape == (2, task.n_ctx) and x.dtype == torch.long
        assert int(x.min()) >= 0 and int(x.max()) < task.d_vocab
    else:
        assert task.d_in is not None and task.d_vocab is None
        assert x.shape == (2, task.n_ctx, task.d_in)
        assert x.dtype == torch.get_default_dtype()
    assert "y" in batch and batch["y"].shape[0] == 2


@pytest.mark.parametrize("task", TASKS, ids=IDS)
def test_same_seed_same_batch_different_seed_different_batch(task: Task) -> None:
    a, b, c = (task.batch("train", 4, gen(s)) for s in (0, 0, 1))
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)
    assert any(not torch.equal(a[key], c[key]) for key in a)


@pytest.mark.parametrize("task", TASKS, ids=IDS)
def test_loss_and_metrics_are_scalar_tensors_with_gradient(task: Task) -> None:
    batch = task.batch("train", 3, gen(0))
    output = torch.randn(task.output_shape(3), generator=gen(1), requires_grad=True)
    loss = task.loss(output, batch)
    assert loss.shape == () and torch.isfinite(loss)
    loss.backward()
    assert output.grad is not None and torch.isfinite(output.grad).all()
    metrics = task.metrics(output, batch)
    assert metrics and all(isinstance(v, torch.Tensor) and v.shape == () for v in metrics.values())
    assert all(not v.requires_grad for v in metrics.values())


@pytest.mark.parametrize("task", TASKS, ids=IDS)
def test_bad_batch_arguments_raise(task: Task) -> None:
    with pytest.raises(
        ValueError, match=r"split must be one of 'train', 'val' \(got split='test'\)"
    ):
        task.batch("test", 2, gen(0))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"batch_size must be an int >= 1 \(got batch_size=0\)"):
        task.batch("train", 0, gen(0))


@pytest.mark.parametrize("task", TASKS, ids=IDS)
def test_wrong_output_shape_raises(task: Task) -> None:
    batch = task.batch("train", 2, gen(0))
    output = torch.zeros(*task.output_shape(2)[:-1], task.d_out + 1)
    with pytest.raises(ValueError, match=r"output must have shape \[batch, (n_ctx, )?d_out\]"):
        task.loss(output, batch)
    with pytest.raises(ValueError, match=r"got output.shape="):
        task.metrics(output, batch)


def test_task_is_abstract() -> None:
    with pytest.raises(TypeError):
        Task()  # type: ignore[abstract]
