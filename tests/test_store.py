"""RunStore: round trip, replace-on-duplicate, truncation, checkpoints, safe loading."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from dynascope.store import RunStore, load_run


def test_scalars_tensors_events_round_trip(tmp_path):
    with RunStore(tmp_path / "r") as store:
        store.write_config({"name": "x", "seed": 3})
        store.set_status(0, "running")
        store.log(0, {"loss": 1.5, "acc": torch.tensor(0.25), "s": torch.arange(6.0).reshape(2, 3)})
        store.log(5, {"loss": 0.5, "s": torch.ones(2, 3)})
        store.event(5, "note", "hello")
        store.set_status(5, "finished")
    run = load_run(tmp_path / "r")
    assert run.config == {"name": "x", "seed": 3}
    assert run.status == "finished"
    assert run.scalar("loss").to_dict() == {0: 1.5, 5: 0.5}
    assert run.last("acc") == 0.25
    steps, values = run.tensors("s")
    np.testing.assert_array_equal(steps, [0, 5])
    np.testing.assert_array_equal(values, np.stack([np.arange(6.0).reshape(2, 3), np.ones((2, 3))]))
    assert values.dtype == np.float32
    assert list(run.events["kind"]) == ["status", "note", "status"]


def test_float64_tensor_keeps_dtype(tmp_path):
    with RunStore(tmp_path) as store:
        store.log(1, {"t": torch.tensor([1.0, 1e-300], dtype=torch.float64)})
    _, values = load_run(tmp_path).tensors("t")
    assert values.dtype == np.float64 and values[0, 1] == 1e-300


def test_same_step_and_key_replaces_row(tmp_path):
    with RunStore(tmp_path) as store:
        store.log(3, {"a": 1.0})
        store.flush()
        store.log(3, {"a": 2.0})
    run = load_run(tmp_path)
    assert len(run.scalars) == 1 and run.last("a") == 2.0


def test_unflushed_rows_are_not_visible_until_commit(tmp_path):
    store = RunStore(tmp_path, flush_every=10_000)
    store.log(1, {"a": 1.0})
    assert load_run(tmp_path).scalars.empty
    store.flush()
    assert load_run(tmp_path).last("a") == 1.0
    store.close()


def test_truncate_after_drops_later_rows(tmp_path):
    with RunStore(tmp_path) as store:
        for step in range(6):
            store.log(step, {"a": float(step), "v": torch.zeros(2)})
        store.event(4, "note")
        store.truncate_after(2)
    run = load_run(tmp_path)
    assert sorted(run.scalar("a").index) == [0, 1, 2]
    assert list(run.tensors("v")[0]) == [0, 1, 2]
    assert run.events.empty


def test_nan_scalar_is_stored_as_null_and_read_as_nan(tmp_path):
    with RunStore(tmp_path) as store:
        store.log(0, {"a": float("nan")})
    assert np.isnan(load_run(tmp_path).last("a"))


def test_missing_key_and_missing_run_raise(tmp_path):
    with RunStore(tmp_path / "r") as store:
        store.log(0, {"a": 1.0})
    run = load_run(tmp_path / "r")
    with pytest.raises(KeyError, match="no scalar 'b'"):
        run.last("b")
    with pytest.raises(KeyError, match="no tensor 'b'"):
        run.tensors("b")
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        load_run(tmp_path / "nothing")


def test_checkpoints_are_listed_in_step_order_and_load_safely(tmp_path):
    with RunStore(tmp_path) as store:
        store.save_checkpoint(10, {"w": torch.ones(2), "step": 10})
        store.save_checkpoint(2, {"w": torch.zeros(2), "step": 2})
        assert [s for s, _ in store.checkpoints()] == [2, 10]
        state = store.load_checkpoint(store.checkpoints()[-1][1])
        torch.testing.assert_close(state["w"], torch.ones(2))


class _Evil:
    def __reduce__(self):
        return (print, ("pwned",))


def test_checkpoint_with_pickled_callable_is_refused(tmp_path):
    path = tmp_path / "checkpoints" / "step_1.pt"
    path.parent.mkdir()
    torch.save({"x": _Evil()}, path, pickle_module=pickle)
    with RunStore(tmp_path) as store, pytest.raises(ValueError, match="was refused"):
        store.load_checkpoint(path)


def test_unknown_status_raises(tmp_path):
    with RunStore(tmp_path) as store, pytest.raises(ValueError, match="status must be one of"):
        store.set_status(0, "exploded")
