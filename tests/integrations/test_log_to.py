"""``--log-to tensorboard|mlflow|wandb``: every run and a study's verdict, read back from the real
libraries' own files (TensorBoard's EventAccumulator, an MLflow SQLite store, W&B's offline
transaction log).

Oracles: the run stores the values were forwarded from (``load_run``: exact for MLflow and W&B,
which keep doubles; rel 1e-6 for TensorBoard, which keeps float32) and ``verdict.json``.
"""

from __future__ import annotations

import glob
import json
import math
import sys
from pathlib import Path

import pytest
from helpers import TINY, assert_one_line_error, invoke

from dynascope.keys import metric_path
from dynascope.store import load_run

STUDY = "modular-teacher-student"  # the cheapest smoke study: 6 runs of 2 arms, ~5 s of CPU


@pytest.fixture
def tiny_config(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    return path


def tensorboard_scalars(log_dir: Path) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


def stored_scalars(run) -> dict[str, dict[int, float]]:
    return {metric_path(key): run.scalar(key).to_dict() for key in run.scalars["key"].unique()}


def assert_tensorboard_holds(log_dir: Path, run) -> None:
    written, stored = tensorboard_scalars(log_dir), stored_scalars(run)
    assert set(written) == set(stored)
    for tag, values in stored.items():
        assert written[tag] == pytest.approx(values, rel=1e-6, nan_ok=True), tag  # float32


# -- bad input: one line, exit 2, nothing written ------------------------------------------------
@pytest.mark.parametrize("command", ["run", "study"])
def test_an_unknown_logger_exits_2_and_writes_nothing(command, tiny_config, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = (
        ["run", tiny_config] if command == "run" else ["study", "run", STUDY, "--preset", "smoke"]
    )
    result = invoke(*args, "--log-to", "tensorboard", "--log-to", "foo")
    assert_one_line_error(
        result, r"^error: --log-to must be one of tensorboard, mlflow, wandb \(got 'foo'\)$"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.yaml"]


@pytest.mark.parametrize("target", ["mlflow", "wandb", "tensorboard"])
def test_a_logger_not_installed_names_its_extra_and_writes_nothing(
    target, tiny_config, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, target, None)  # import raises ImportError
    for args in (["run", tiny_config], ["study", "run", STUDY, "--preset", "smoke"]):
        result = invoke(*args, "--log-to", target)
        assert_one_line_error(
            result,
            rf"^error: --log-to {target} needs {target}: pip install 'dynascope\[{target}\]'$",
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.yaml"]


def test_a_bad_wandb_mode_exits_2(tiny_config, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "sometimes")
    result = invoke("run", tiny_config, "--log-to", "wandb")
    assert_one_line_error(result, r"WANDB_MODE must be one of offline, online, disabled")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.yaml"]


@pytest.mark.parametrize(
    ("name", "arm"),
    [
        ("coord_mup_adam_w32_s1", "coord_mup_adam_w32"),
        ("L2_orth_s0.5_seed0", "L2_orth_s0.5"),
        ("s0_offset", "offset"),
        ("kernel_seed12", "kernel"),
        ("pair_mlp_32_p0", "pair_mlp_32_p0"),  # no seed token: the name itself
        ("s3", "s3"),
    ],
)
def test_arm_is_the_run_name_without_its_seed_token(name, arm):
    from dynascope.integrations.log_to import arm_of

    assert arm_of(name) == arm


# -- one run: TensorBoard; W&B from a hand-built store -------------------------------------------
def test_run_logs_to_tensorboard(tiny_config, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    result = invoke("run", tiny_config, "--out", out, "--no-progress", "--log-to", "tensorboard")
    assert result.exit_code == 0, result.output
    assert f"logged {out} to TensorBoard {out / 'tensorboard'}" in result.stdout
    run = load_run(out)
    assert_tensorboard_holds(out / "tensorboard", run)
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    assert set(events.Tags()["tensors"]) == {"config/text_summary", "status/text_summary"}


def hand_built_run(run_dir: Path) -> None:
    """Three steps of two keys (one NaN), a config and the status ``diverged``."""
    from dynascope.store import RunStore

    with RunStore(run_dir) as store:
        store.write_config({"seed": 1, "model": {"d_model": 12}})
        store.log(0, {"train.loss": 2.5, "L0.H1.qk.effective_rank": 3.0})
        store.log(1, {"train.loss": 1.25})
        store.log(2, {"train.loss": float("nan"), "L0.H1.qk.effective_rank": 2.0})
        store.set_status(2, "diverged")


@pytest.mark.slow  # W&B's service: ~5 s
def test_wandb_groups_runs_by_study_and_arm_and_puts_the_verdict_in_a_summary_run(
    tmp_path, monkeypatch, wandb_records, wandb_history
):
    from dynascope.integrations.log_to import RunLogger

    monkeypatch.delenv("WANDB_MODE", raising=False)  # offline by default
    monkeypatch.setenv("WANDB_PROJECT", "log-to-tests")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wb"))
    (tmp_path / "wb").mkdir()
    out = tmp_path / "study"
    hand_built_run(out / "runs" / "toy_s1")
    verdict = {"status": "held", "claims": [
        {"claim": "c1: it holds", "status": "held", "measured": 0.75, "interval": [0.5, 1.0],
         "threshold": 0.25, "direction": ">="},
        {"claim": "c2: unmeasured", "status": "inconclusive", "measured": None, "interval": None,
         "threshold": 1.0, "direction": "<=", "reason": "no runs"},
    ]}  # fmt: skip
    with RunLogger(["wandb"], out, study="toy", preset="smoke", seed=0, config={"n": 3}) as log:
        log.log_run(out / "runs" / "toy_s1")
        log.log_verdict(verdict)
    logged = {}
    for path in glob.glob(str(tmp_path / "wb" / "wandb" / "offline-run-*" / "run-*.wandb")):
        records = wandb_records(path)
        (info,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
        logged[info.job_type] = records, info
    assert sorted(logged) == ["toy", "verdict"]  # the run's arm, and the summary run

    records, info = logged["toy"]
    assert (info.project, info.run_group, info.display_name) == ("log-to-tests", "toy", "toy_s1")
    assert list(info.tags) == ["smoke"]
    config = {item.key: json.loads(item.value_json) for item in info.config.update}
    assert (config["seed"], config["model"]) == (1, {"d_model": 12})
    history = wandb_history(records)
    assert {s: h["train/loss"] for s, h in history.items()} == pytest.approx(
        {0: 2.5, 1: 1.25, 2: math.nan}, nan_ok=True
    )
    rank = metric_path("L0.H1.qk.effective_rank")
    assert {s: h[rank] for s, h in history.items() if rank in h} == {0: 3.0, 2: 2.0}
    (ended,) = [r for r in records if r.WhichOneof("record_type") == "exit"]
    assert ended.exit.exit_code == 1  # diverged

    records, info = logged["verdict"]
    assert info.run_group == "toy" and info.display_name == "study verdict"
    assert {i.key: json.loads(i.value_json) for i in info.config.update}["n"] == 3
    summary = {
        i.key: json.loads(i.value_json)
        for r in records
        if r.WhichOneof("record_type") == "summary"
        for i in r.summary.update
    }
    assert summary["verdict.status"] == "held"
    assert summary["verdict/c1/measured"] == 0.75 and summary["verdict/c1/held"] == 1
    assert (summary["verdict/c1/interval_low"], summary["verdict/c1/interval_high"]) == (0.5, 1.0)
    assert summary["verdict.c1.status"] == "held" and summary["verdict.c1.claim"] == "c1: it holds"
    assert summary["verdict.c1.direction"] == ">= 0.25"
    assert (summary["verdict.c2.status"], summary["verdict.c2.reason"]) == (
        "inconclusive",
        "no runs",
    )
    assert "verdict/c2/measured" not in summary and summary["verdict/c2/held"] == 0


# -- a study: MLflow and TensorBoard -------------------------------------------------------------
@pytest.mark.slow
def test_study_run_leaves_every_run_and_the_verdict_in_mlflow_and_tensorboard(
    tmp_path, monkeypatch, mlflow_uri
):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    out = tmp_path / "study"
    result = invoke("study", "run", STUDY, "--preset", "smoke", "--out", out, "--no-progress",
                    "--log-to", "mlflow", "--log-to", "tensorboard")  # fmt: skip
    assert result.exit_code == 0, result.output
    verdict = json.loads((out / "verdict.json").read_text())
    names = [row["name"] for row in verdict["runs"]]
    assert f"logged {len(names)} runs and the verdict to MLflow {mlflow_uri}" in result.stdout

    client = MlflowClient(tracking_uri=mlflow_uri)
    experiment = client.get_experiment_by_name(STUDY)
    logged = client.search_runs([experiment.experiment_id], max_results=100)
    (parent,) = [r for r in logged if r.info.run_name == "study"]
    children = {r.info.run_name: r for r in logged if r.info.run_name != "study"}
    assert sorted(children) == sorted(names)
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["study"] == STUDY and parent.data.tags["preset"] == "smoke"
    assert parent.data.params["seeds"] == "3"  # the preset config
    assert parent.data.tags["verdict.status"] == verdict["status"]
    for claim in verdict["claims"]:
        cid = claim["claim"].split(":")[0]
        assert parent.data.tags[f"verdict.{cid}.status"] == claim["status"]
        assert parent.data.metrics[f"verdict/{cid}/measured"] == claim["measured"]
        assert parent.data.metrics[f"verdict/{cid}/threshold"] == claim["threshold"]
        assert parent.data.metrics[f"verdict/{cid}/held"] == float(claim["status"] == "held")

    for name, child in children.items():
        run = load_run(out / "runs" / name)
        tags = child.data.tags
        assert tags["mlflow.parentRunId"] == parent.info.run_id
        assert (tags["study"], tags["preset"], tags["status"]) == (STUDY, "smoke", run.status)
        assert tags["seed"] == str(run.config["seed"]) and name.startswith(tags["arm"])
        assert child.data.params["seed"] == str(run.config["seed"])
        assert child.info.status == "FINISHED"
        for tag, values in stored_scalars(run).items():
            history = client.get_metric_history(child.info.run_id, tag)
            assert {m.step: m.value for m in history} == pytest.approx(values, nan_ok=True), tag
        assert_tensorboard_holds(out / "tensorboard" / name, run)
    arms = {child.data.tags["arm"] for child in children.values()}
    assert len(arms) == 2  # two supports, three seeds each

    summary = tensorboard_scalars(out / "tensorboard" / "verdict")
    for claim in verdict["claims"]:
        cid = claim["claim"].split(":")[0]
        assert summary[f"verdict/{cid}/measured"] == {0: pytest.approx(claim["measured"], rel=1e-6)}


@pytest.mark.slow  # MLflow's client: a few seconds
def test_mlflow_statuses_an_unfinished_study_and_a_single_run(tmp_path, monkeypatch, mlflow_uri):
    from mlflow.tracking import MlflowClient

    from dynascope.integrations.log_to import RunLogger

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    hand_built_run(tmp_path / "stopped" / "runs" / "toy_seed1")
    with (
        pytest.raises(KeyboardInterrupt),
        RunLogger(["mlflow"], tmp_path / "stopped", study="toy") as log,
    ):
        log.log_run(tmp_path / "stopped" / "runs" / "toy_seed1")
        raise KeyboardInterrupt  # the study stops before its verdict
    client = MlflowClient(tracking_uri=mlflow_uri)
    logged = client.search_runs([client.get_experiment_by_name("toy").experiment_id])
    by_name = {r.info.run_name: r for r in logged}
    assert by_name["stopped"].info.status == "KILLED"  # the parent: no verdict
    child = by_name["toy_seed1"]
    assert child.info.status == "FAILED" and child.data.tags["status"] == "diverged"
    assert child.data.tags["mlflow.parentRunId"] == by_name["stopped"].info.run_id
    assert (child.data.tags["arm"], child.data.tags["seed"]) == ("toy", "1")
    assert child.data.params == {"seed": "1", "model.d_model": "12"}
    loss = client.get_metric_history(child.info.run_id, "train/loss")
    assert {m.step: m.value for m in loss} == pytest.approx(
        {0: 2.5, 1: 1.25, 2: math.nan}, nan_ok=True
    )

    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "log-to-single")
    hand_built_run(tmp_path / "single")
    with RunLogger(["mlflow"], tmp_path / "single") as log:  # `dynascope run`: no parent
        log.log_run(tmp_path / "single")
    (single,) = client.search_runs([client.get_experiment_by_name("log-to-single").experiment_id])
    assert single.info.run_name == "single" and "mlflow.parentRunId" not in single.data.tags
    assert not {"study", "arm", "preset"} & set(single.data.tags)
