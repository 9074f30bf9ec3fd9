"""InContextLinearRegression: tokens and targets checked against a naive oracle."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dynascope.tasks import InContextLinearRegression


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_sizes() -> None:
    task = InContextLinearRegression(d_x=3, n_points=6)
    assert (task.d_in, task.n_ctx, task.d_out, task.input_kind) == (4, 7, 1, "vectors")
    assert task.d_vocab is None


def test_noiseless_labels_are_one_linear_map_per_sequence() -> None:
    task = InContextLinearRegression(d_x=3, n_points=6, noise_std=0.0, w_std=2.0)
    batch = task.batch("train", 5, gen(0))
    x, y = batch["x"].double(), batch["y"].double()
    for b in range(5):
        inputs, labels = x[b, :-1, :3], x[b, :-1, 3]
        # 6 points in 3 dims determine w: least squares recovers it exactly (noise-free).
        w = torch.linalg.lstsq(inputs, labels[:, None]).solution[:, 0]
        torch.testing.assert_close(inputs @ w, labels, atol=1e-5, rtol=0)
        torch.testing.assert_close(x[b, -1, :3] @ w, y[b], atol=1e-5, rtol=0)
        assert float(x[b, -1, 3]) == 0.0, "query label slot is zero"


def test_matches_oracle_that_replays_the_documented_draw_order() -> None:
    task = InContextLinearRegression(d_x=2, n_points=4, noise_std=0.5, w_std=1.5)
    batch = task.batch("train", 3, gen(7))
    g = gen(7)
    w = torch.randn(3, 2, generator=g) * 1.5
    inputs = torch.randn(3, 5, 2, generator=g)
    noise = torch.randn(3, 5, generator=g) * 0.5
    for b in range(3):
        for i in range(5):
            label = sum(float(w[b, j]) * float(inputs[b, i, j]) for j in range(2))
            label += float(noise[b, i])
            torch.testing.assert_close(batch["x"][b, i, :2], inputs[b, i])
            if i < 4:
                torch.testing.assert_close(float(batch["x"][b, i, 2]), label, atol=1e-5, rtol=0)
            else:
                torch.testing.assert_close(float(batch["y"][b]), label, atol=1e-5, rtol=0)


def test_noise_std_changes_only_labels() -> None:
    clean = InContextLinearRegression(d_x=2, n_points=4).batch("train", 3, gen(1))
    noisy = InContextLinearRegression(d_x=2, n_points=4, noise_std=1.0).batch("train", 3, gen(1))
    torch.testing.assert_close(clean["x"][..., :2], noisy["x"][..., :2])
    assert not torch.equal(clean["y"], noisy["y"])


def test_loss_is_mse_at_query() -> None:
    task = InContextLinearRegression(d_x=2, n_points=3)
    batch = task.batch("train", 4, gen(0))
    output = torch.randn(4, task.n_ctx, 1, generator=gen(1))
    expected = ((output[:, -1, 0] - batch["y"]) ** 2).mean()
    torch.testing.assert_close(task.loss(output, batch), expected)
    torch.testing.assert_close(task.metrics(output, batch)["mse"], expected)


def test_follows_default_dtype() -> None:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        batch = InContextLinearRegression().batch("train", 2, gen(0))
    finally:
        torch.set_default_dtype(previous)
    assert batch["x"].dtype == batch["y"].dtype == torch.float64


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"d_x": 0}, r"d_x must be an int >= 1 \(got d_x=0\)"),
        ({"n_points": 0}, r"n_points must be an int >= 1 \(got n_points=0\)"),
        ({"noise_std": -0.1}, r"noise_std must be a finite number >= 0 \(got noise_std=-0.1\)"),
        (
            {"noise_std": float("nan")},
            r"noise_std must be a finite number >= 0 \(got noise_std=nan\)",
        ),
        ({"w_std": 0.0}, r"w_std must be a finite number > 0 \(got w_std=0.0\)"),
        ({"w_std": float("inf")}, r"w_std must be a finite number > 0 \(got w_std=inf\)"),
    ],
)
def test_bad_arguments_raise(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        InContextLinearRegression(**kwargs)


@settings(max_examples=25, deadline=None)
@given(d_x=st.integers(1, 5), n_points=st.integers(1, 8), seed=st.integers(0, 2**31))
def test_any_valid_arguments_give_valid_batches(d_x, n_points, seed) -> None:
    task = InContextLinearRegression(d_x=d_x, n_points=n_points)
    batch = task.batch("train", 2, gen(seed))
    assert batch["x"].shape == (2, n_points + 1, d_x + 1)
    assert batch["y"].shape == (2,)
    assert (batch["x"][:, -1, -1] == 0).all()
    assert torch.isfinite(batch["x"]).all()
