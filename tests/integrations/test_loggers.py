"""Results where users already log them: the HF and Lightning callbacks record the trainer's
loss, learning rate and run status, and forward probe values to the trainer's own loggers; the
MLflow and W&B sinks write what they are given, read back from the real libraries' files.

Oracles: the trainer's own log history (HF ``state.log_history``), the optimizer's learning
rate, and the values the RunStore beside each logger received (same record, so equal to float32
rounding where a logger stores float32).
"""

from __future__ import annotations

import glob

import pytest
import torch
from torch import nn

import dynascope as ds
from dynascope.keys import metric_path
from dynascope.probes import ParameterNorms, QKSpectrum


def _tiny_gpt2():
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=11, n_positions=7, n_embd=12, n_layer=2, n_head=3, n_inner=20
    )
    model = transformers.GPT2LMHeadModel(config)
    ids = torch.randint(0, 11, (8, 7), generator=torch.Generator().manual_seed(1))
    return model, [{"input_ids": row, "labels": row} for row in ids]


# -- Hugging Face --------------------------------------------------------------------------------
def test_hf_callback_records_loss_lr_status_and_reaches_report_to(tmp_path, monkeypatch, capsys):
    import transformers
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from dynascope.integrations.huggingface import MonitorCallback

    model, data = _tiny_gpt2()
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=6, per_device_train_batch_size=2,
        learning_rate=0.1, report_to=["tensorboard"], logging_steps=2, save_strategy="no", use_cpu=True, disable_tqdm=True,
    )  # fmt: skip
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
    with ds.RunStore(tmp_path / "run") as store:
        monitor = ds.Monitor(model, [ParameterNorms(), QKSpectrum()], ds.EveryN(3), store)
        trainer.add_callback(MonitorCallback(monitor, trainer=trainer))
        trainer.train()
    run = ds.load_run(tmp_path / "run")
    assert run.status == "finished"
    # the trainer's own loss and learning rate, at its logging steps, as it logged them
    own = {row["step"]: row for row in trainer.state.log_history if "loss" in row}
    assert sorted(own) == [2, 4, 6]  # forwarding probe values did not cancel the trainer's logs
    loss, lr = run.scalar("train.loss"), run.scalar("train.lr")
    assert loss.to_dict() == {s: own[s]["loss"] for s in own}
    assert lr.to_dict() == {s: own[s]["learning_rate"] for s in own}
    # probe values at steps 0, 3, 6 reached report_to (TensorBoard) under grouped names
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    qk_key = "L1.H2.qk.effective_rank"
    for key in ("norm.total", qk_key):
        tag = "train/" + metric_path(key)  # HF's TensorBoard callback prefixes train/
        assert tag in tags, (tag, sorted(tags)[:10])
        written = {e.step: e.value for e in events.Scalars(tag)}
        stored = run.scalar(key).to_dict()
        assert sorted(written) == [0, 3, 6]
        assert written == pytest.approx(stored, rel=1e-6)  # float32 in TensorBoard
    assert "train/attn/L1/H2/qk_effective_rank" in tags
    assert not any("singular_values" in t for t in tags)  # spectra stay in the store
    # the console (PrinterCallback, as disable_tqdm=True) shows the trainer's logs, no probes
    printed = capsys.readouterr().out
    assert "'loss'" in printed and "attn/" not in printed and "norm/" not in printed


def test_trainer_metrics_maps_names_and_drops_timings():
    from dynascope.integrations.huggingface import trainer_metrics

    logs = {"loss": 1.5, "learning_rate": 0.1, "grad_norm": 2.0, "epoch": 0.5,
            "eval_loss": 1.2, "eval_accuracy": 0.75, "eval_runtime": 3.0,
            "eval_samples_per_second": 9.0, "train_runtime": 4.0, "attn/L0/H0/qk_x": 3.0}  # fmt: skip
    assert trainer_metrics(logs) == {
        "train.loss": 1.5, "train.lr": 0.1, "train.grad_norm": 2.0, "val.loss": 1.2,
        "val.accuracy": 0.75,
    }  # fmt: skip


# -- Lightning -----------------------------------------------------------------------------------
_LIGHTNING_NOISE = [
    pytest.mark.filterwarnings("ignore:.*(does not have many workers|Consider setting).*"),
    pytest.mark.filterwarnings("ignore:.*GPU available but not used.*"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning"),
]


def _regression_module(fail_at: int | None = None):
    import lightning.pytorch as pl

    class Regression(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2))
            self.losses: dict[int, float] = {}

        def training_step(self, batch, batch_idx):
            if fail_at is not None and self.global_step == fail_at:
                raise RuntimeError("planted failure")
            x, y = batch
            loss = (self.model(x) - y).square().mean()
            self.losses[self.global_step + 1] = float(loss.detach())  # the update it makes
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    x, y = torch.randn(12, 3), torch.randn(12, 2)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=2)
    return Regression(), loader


@_LIGHTNING_NOISE[0]
@_LIGHTNING_NOISE[1]
@_LIGHTNING_NOISE[2]
def test_lightning_callback_records_loss_lr_status_and_reaches_the_logger(tmp_path):
    import lightning.pytorch as pl
    import pandas as pd
    from lightning.pytorch.loggers import CSVLogger

    from dynascope.integrations.lightning import MonitorCallback

    module, loader = _regression_module()
    logger = CSVLogger(tmp_path / "csv", name="", version="")
    with ds.RunStore(tmp_path / "run") as store:
        monitor = ds.Monitor(module.model, [ParameterNorms()], ds.EveryN(2), store)
        trainer = pl.Trainer(
            max_steps=6, accelerator="cpu", logger=logger, log_every_n_steps=3,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            callbacks=[MonitorCallback(monitor)],
        )  # fmt: skip
        trainer.fit(module, loader)
    run = ds.load_run(tmp_path / "run")
    assert run.status == "finished"
    assert run.scalar("train.loss").to_dict() == {3: module.losses[3], 6: module.losses[6]}
    assert run.scalar("train.lr").to_dict() == {3: 0.1, 6: 0.1}
    metrics = pd.read_csv(tmp_path / "csv" / "metrics.csv")
    written = metrics.dropna(subset=["norm/total"]).set_index("step")["norm/total"].to_dict()
    assert written == pytest.approx(run.scalar("norm.total").to_dict(), rel=1e-12)
    assert sorted(written) == [0, 2, 4, 6]


@_LIGHTNING_NOISE[0]
@_LIGHTNING_NOISE[1]
@_LIGHTNING_NOISE[2]
def test_lightning_callback_marks_a_failed_run(tmp_path):
    import lightning.pytorch as pl

    from dynascope.integrations.lightning import MonitorCallback

    module, loader = _regression_module(fail_at=3)
    with ds.RunStore(tmp_path / "run") as store:
        monitor = ds.Monitor(module.model, [ParameterNorms()], ds.EveryN(1), store)
        trainer = pl.Trainer(
            max_steps=6, accelerator="cpu", logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False,
            callbacks=[MonitorCallback(monitor)],
        )  # fmt: skip
        with pytest.raises(RuntimeError, match="planted failure"):
            trainer.fit(module, loader)
    run = ds.load_run(tmp_path / "run")
    assert run.status == "failed"
    assert sorted(run.scalar("norm.total").index) == [0, 1, 2, 3]


# -- MLflow --------------------------------------------------------------------------------------
def _transformer_record_source(tmp_path, sink):
    torch.manual_seed(0)
    model = ds.nn.Transformer(n_layers=2, d_model=12, n_heads=3, d_vocab=11, d_out=11, n_ctx=7)
    with ds.RunStore(tmp_path / "run") as store:
        monitor = ds.Monitor(model, [ParameterNorms(), QKSpectrum()], ds.EveryN(1), [store, sink])
        for step in range(3):
            with torch.no_grad():
                model.W_U.mul_(1.5)
            monitor.step(step)
    return ds.load_run(tmp_path / "run")


def test_mlflow_sink_writes_grouped_metrics_params_and_status_to_a_local_sqlite_store(
    tmp_path, mlflow_uri
):
    from mlflow.tracking import MlflowClient

    from dynascope.integrations.mlflow import MLflowSink

    uri = mlflow_uri
    config = {"model": {"d_model": 12, "n_heads": 3}, "seed": 0}
    with MLflowSink(uri, experiment="tests", run_name="tiny", config=config) as sink:
        run = _transformer_record_source(tmp_path, sink)
        run_id = sink.run_id
    client = MlflowClient(tracking_uri=uri)
    logged = client.get_run(run_id)
    assert logged.info.status == "FINISHED" and logged.info.run_name == "tiny"
    assert logged.data.params == {"model.d_model": "12", "model.n_heads": "3", "seed": "0"}
    for key in ("norm.W_U", "L1.H2.qk.effective_rank", "qk.mean.stable_rank"):
        history = client.get_metric_history(run_id, metric_path(key))
        assert {m.step: m.value for m in history} == run.scalar(key).to_dict()
    assert not any("singular_values" in name for name in logged.data.metrics)


def test_mlflow_sink_status_maps_to_mlflow_run_states(mlflow_uri):
    from mlflow.tracking import MlflowClient

    from dynascope.integrations.mlflow import MLflowSink

    uri = mlflow_uri
    states = {}
    for status in ("diverged", "interrupted"):
        sink = MLflowSink(uri, run_name=status)
        sink.set_status(0, "running")  # leaves it open
        sink.set_status(5, status)
        sink.close()  # does not overwrite the status
        states[status] = MlflowClient(tracking_uri=uri).get_run(sink.run_id).info.status
    assert states == {"diverged": "FAILED", "interrupted": "KILLED"}


# -- W&B -----------------------------------------------------------------------------------------
def test_wandb_sink_writes_grouped_history_histograms_and_exit_code_offline(
    tmp_path, wandb_records, wandb_history
):
    import wandb

    from dynascope.integrations.wandb import WandbSink

    sink = WandbSink(name="tiny", config={"seed": 0}, dir=tmp_path, settings={"silent": True})
    run = _transformer_record_source(tmp_path, sink)
    sink.set_status(2, "finished")
    wandb.teardown()  # wandb-core writes the run's file as its stream closes: wait for that
    (path,) = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))
    records = wandb_records(path)
    history = wandb_history(records)
    assert sorted(history) == [0, 1, 2]
    for key in ("norm.W_U", "L1.H2.qk.effective_rank"):
        written = {step: items[metric_path(key)] for step, items in history.items()}
        assert written == run.scalar(key).to_dict()
    spectrum = metric_path("qk.singular_values")  # [2 layers, 3 heads, d_head 4]: 24 values
    assert history[2][spectrum + "/_type"] == "histogram"  # a histogram's fields are nested
    assert sum(history[2][spectrum + "/values"]) == 24
    (exit_record,) = [r for r in records if r.WhichOneof("record_type") == "exit"]
    assert exit_record.exit.exit_code == 0
