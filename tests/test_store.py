"""RunStore: round trip, replace-on-duplicate, truncation, checkpoints, safe loading."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
import torch

from dynascope.store import RunPeek, RunStore, load_run, peek_run


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
    store = RunStore(tmp_path, flush_every=10_000, flush_seconds=None)
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
    with pytest.raises(FileNotFoundError, match="no such directory: '.*nothing'"):
        load_run(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        load_run(tmp_path / "empty")


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


def test_scalars_carry_parsed_layer_head_and_metric(tmp_path):
    import pandas as pd

    with RunStore(tmp_path) as store:
        store.log(
            0, {"L0.H3.qk.effective_rank": 2.0, "L1.attn.mean.entropy": 0.5, "train.loss": 1.0}
        )
    scalars = load_run(tmp_path).scalars
    assert list(scalars.columns) == ["step", "key", "value", "layer", "head_index", "metric"]
    rows = scalars.set_index("key")
    assert rows.loc["L0.H3.qk.effective_rank", ["layer", "head_index", "metric"]].tolist() == [
        0,
        3,
        "qk.effective_rank",
    ]
    assert rows.loc["L1.attn.mean.entropy", "layer"] == 1
    assert rows.loc["L1.attn.mean.entropy", "head_index"] is pd.NA
    assert (
        rows.loc["train.loss", "layer"] is pd.NA
        and rows.loc["train.loss", "metric"] == "train.loss"
    )
    assert str(scalars["layer"].dtype) == "Int64" and str(scalars["head_index"].dtype) == "Int64"


def test_empty_run_has_the_parsed_columns(tmp_path):
    RunStore(tmp_path).close()
    scalars = load_run(tmp_path).scalars
    assert list(scalars.columns) == ["step", "key", "value", "layer", "head_index", "metric"]
    assert scalars.empty


def test_load_study_has_every_run_with_its_flattened_config(tmp_path):
    import json

    from dynascope import load_study

    study = tmp_path / "study"
    configs = {
        "lr-0.1": {"optimizer": {"lr": 0.1, "betas": [0.9, 0.99]}, "seed": 0},
        "lr-0.3": {"optimizer": {"lr": 0.3, "betas": [0.9, 0.99]}, "seed": 1, "step": 7},
    }
    for name, config in configs.items():
        with RunStore(study / "runs" / name) as store:
            store.write_config(config)
            store.set_status(0, "running")
            store.log(0, {"L0.H1.qk.effective_rank": config["optimizer"]["lr"]})
            store.log(2, {"train.loss": 2 * config["optimizer"]["lr"]})
            store.set_status(2, "finished")
    with RunStore(study / "runs" / "no-config") as store:  # its config is in the manifest
        store.log(0, {"train.loss": 5.0})
    (study / "study.json").write_text(json.dumps({"runs": {"no-config": {"seed": 9}}}))
    (study / "runs" / "not-a-run").mkdir()

    frame = load_study(study)
    assert list(frame.columns[:8]) == [
        "run",
        "status",
        "step",
        "key",
        "value",
        "layer",
        "head_index",
        "metric",
    ]
    assert sorted(frame["run"].unique()) == ["lr-0.1", "lr-0.3", "no-config"]
    first = frame[(frame["run"] == "lr-0.3") & (frame["key"] == "L0.H1.qk.effective_rank")].iloc[0]
    assert first["value"] == 0.3 and first["layer"] == 0 and first["head_index"] == 1
    assert first["optimizer.lr"] == 0.3 and first["optimizer.betas"] == (0.9, 0.99)
    assert first["config.step"] == 7 and first["status"] == "finished"  # 'step' is a column
    loss = frame[frame["key"] == "train.loss"].set_index("run")
    assert loss["seed"].to_dict() == {"lr-0.1": 0, "lr-0.3": 1, "no-config": 9}
    assert loss.loc["no-config", "status"] is None and pd_isna(
        loss.loc["no-config", "optimizer.lr"]
    )
    # a directory of runs without runs/ works the same
    assert len(load_study(study / "runs")) == len(frame)


def pd_isna(value):
    import pandas as pd

    return bool(pd.isna(value))


def test_load_study_keeps_a_run_that_logged_only_tensors(tmp_path):
    import torch

    from dynascope import load_study

    with RunStore(tmp_path / "scalars") as store:
        store.log(3, {"train.loss": 1.5})
    with RunStore(tmp_path / "tensors") as store:
        store.write_config({"seed": 4})
        store.log(3, {"L0.H0.qk.singular_values": torch.ones(3)})
        store.set_status(3, "finished")
    frame = load_study(tmp_path).set_index("run")
    assert list(frame.index) == ["scalars", "tensors"]
    row = frame.loc["tensors"]
    assert row["status"] == "finished" and row["seed"] == 4
    assert pd_isna(row["step"]) and pd_isna(row["key"]) and pd_isna(row["value"])
    assert frame.loc["scalars", "step"] == 3 and frame.loc["scalars", "value"] == 1.5


def test_load_study_without_runs_raises(tmp_path):
    from dynascope import load_study

    with pytest.raises(FileNotFoundError, match="no run directories"):
        load_study(tmp_path)


def test_a_store_without_tables_is_not_a_run(tmp_path):
    """metrics.sqlite created but its schema never written (a writer stopped in between)."""
    import sqlite3
    from contextlib import closing

    (tmp_path / "r").mkdir()
    with closing(sqlite3.connect(tmp_path / "r" / "metrics.sqlite")) as db:
        db.execute("PRAGMA journal_mode=WAL")
    with pytest.raises(FileNotFoundError, match="not a run yet"):
        load_run(tmp_path / "r")
    with RunStore(tmp_path / "r") as store:  # a writer can still open it and write the schema
        store.log(1, {"a": 2.0})
    assert load_run(tmp_path / "r").last("a") == 2.0


def test_a_store_whose_schema_fails_leaves_no_file(tmp_path, monkeypatch):
    """Stopped while creating (here: the schema raises), the store removes the file it made,
    so no later reader meets a database without tables; an existing file is left alone."""
    import dynascope.store as store_module

    monkeypatch.setattr(store_module, "_SCHEMA", "CREATE TABLE broken (")
    with pytest.raises(Exception, match="incomplete input|syntax error"):
        RunStore(tmp_path / "r")
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == []
    monkeypatch.undo()
    with RunStore(tmp_path / "s") as store:
        store.log(0, {"a": 1.0})
    monkeypatch.setattr(store_module, "_SCHEMA", "CREATE TABLE broken (")
    with pytest.raises(Exception, match="incomplete input|syntax error"):
        RunStore(tmp_path / "s")
    monkeypatch.undo()
    assert load_run(tmp_path / "s").last("a") == 1.0


def test_rows_are_committed_once_flush_seconds_have_passed(tmp_path):
    store = RunStore(tmp_path, flush_every=10_000, flush_seconds=0.0)
    store.log(1, {"a": 1.0})  # no flush() and far from flush_every: committed by time
    assert load_run(tmp_path).last("a") == 1.0
    store.close()


def test_peek_run_reads_status_last_step_and_loss(tmp_path):
    assert peek_run(tmp_path / "none") is None
    with RunStore(tmp_path / "run") as store:
        assert peek_run(tmp_path / "run") == RunPeek(None, None, None)
        store.set_status(0, "running")
        store.log(3, {"train.loss": 0.5, "other": 9.0})
        store.log(5, {"other": 1.0})
        store.flush()
        assert peek_run(tmp_path / "run") == RunPeek("running", 5, 0.5)
        store.log(6, {"train.loss": float("nan")})
        store.set_status(7, "diverged")  # an event row later than any scalar
    peek = peek_run(tmp_path / "run")
    assert (peek.status, peek.step) == ("diverged", 7) and math.isnan(peek.loss)
