"""Integrations: the HF and Lightning callbacks step the monitor at 0 and after each update;
the TensorBoard sink writes what it is given, under grouped tags (keys.metric_path).

Oracle: parameter norms recorded at step t equal the norms of the weights a plain hook saw after
the t-th ``optimizer.step()`` (hand-computed with torch.linalg.vector_norm, float64, exact).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import dynascope as ds
from dynascope.probes import ParameterNorms


class _Recorder:
    """A sink that keeps every record in memory."""

    def __init__(self) -> None:
        self.records: dict[int, dict] = {}
        self.flushed = 0

    def log(self, step, values):
        self.records[step] = dict(values)

    def flush(self):
        self.flushed += 1


def _total_norm(model: nn.Module) -> float:
    return math.sqrt(sum(float(p.detach().double().square().sum()) for p in model.parameters()))


# -- Hugging Face ------------------------------------------------------------------------------
def test_hf_callback_steps_the_monitor_after_each_update(tmp_path):
    import transformers

    from dynascope.integrations.huggingface import MonitorCallback

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=11, n_positions=7, n_embd=12, n_layer=2, n_head=3, n_inner=20
    )
    model = transformers.GPT2LMHeadModel(config)
    ids = torch.randint(0, 11, (8, 7), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": row, "labels": row} for row in ids]

    sink = _Recorder()
    monitor = ds.Monitor(model, [ParameterNorms()], ds.EveryN(2), sink)
    norms_after_update: dict[int, float] = {0: _total_norm(model)}

    class _Oracle(transformers.TrainerCallback):
        def on_optimizer_step(self, args, state, control, **kwargs):
            norms_after_update[state.global_step + 1] = _total_norm(model)

    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=6, per_device_train_batch_size=2, learning_rate=0.1,
        report_to="none", save_strategy="no", use_cpu=True, logging_strategy="no",
        disable_tqdm=True,
    )  # fmt: skip
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=data, callbacks=[MonitorCallback(monitor), _Oracle()]
    )
    trainer.train()
    assert sorted(sink.records) == [0, 2, 4, 6]
    for step, record in sink.records.items():
        assert record["norm.total"] == pytest.approx(norms_after_update[step], rel=1e-12)
    assert norms_after_update[6] != norms_after_update[0]  # training moved the weights
    assert sink.flushed == 1


# -- Lightning ---------------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore:.*(does not have many workers|Consider setting).*")
@pytest.mark.filterwarnings("ignore:.*GPU available but not used.*")
@pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")  # lightning vs torch 2.13 pytree
def test_lightning_callback_steps_the_monitor_after_each_update():
    import lightning.pytorch as pl

    from dynascope.integrations.lightning import MonitorCallback

    class Regression(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return (self.model(x) - y).square().mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    module = Regression()
    x, y = torch.randn(12, 3), torch.randn(12, 2)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=2)

    sink = _Recorder()
    seen_batches = []

    class _BatchProbe(ds.probes.Probe):
        def measure(self, model, ctx):
            seen_batches.append(None if ctx.batch is None else ctx.batch["x"].shape)
            return {}

    monitor = ds.Monitor(module.model, [ParameterNorms(), _BatchProbe()], ds.EveryN(1), sink)
    norms_after_update: dict[int, float] = {0: _total_norm(module.model)}

    class _Oracle(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            norms_after_update[trainer.global_step] = _total_norm(module.model)

    trainer = pl.Trainer(
        max_steps=6, accelerator="cpu", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
        callbacks=[MonitorCallback(monitor), _Oracle()],
    )  # fmt: skip
    trainer.fit(module, loader)
    assert sorted(sink.records) == [0, 1, 2, 3, 4, 5, 6]
    for step, record in sink.records.items():
        assert record["norm.total"] == pytest.approx(norms_after_update[step], rel=1e-12)
    assert seen_batches == [None] + [torch.Size([2, 3])] * 6
    assert sink.flushed == 1


# -- TensorBoard -------------------------------------------------------------------------------
def test_tensorboard_sink_writes_scalars_and_histograms(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from dynascope.integrations.tensorboard import TensorBoardSink

    store_dir, tb_dir = tmp_path / "run", tmp_path / "tb"
    with ds.RunStore(store_dir) as store, TensorBoardSink(tb_dir) as tb:
        monitor = ds.Monitor(nn.Linear(3, 2), [ParameterNorms()], ds.EveryN(1), [store, tb])
        monitor.step(0)
        tb.log(1, {"spectrum": torch.tensor([3.0, 2.0, 1.0]), "rank": torch.tensor(2.0)})
    events = EventAccumulator(str(tb_dir))
    events.Reload()
    tags = events.Tags()
    # tags grouped by metric_path: one "norm" section, not a flat tag per key
    assert {"norm/total", "norm/weight", "norm/bias", "rank"} <= set(tags["scalars"])
    assert tags["histograms"] == ["spectrum"]
    (written,) = events.Scalars("norm/total")
    stored = ds.load_run(store_dir).last("norm.total")  # both sinks got the same record
    assert written.step == 0 and written.value == pytest.approx(stored, rel=1e-6)  # float32
    (hist,) = events.Histograms("spectrum")
    assert hist.step == 1 and hist.histogram_value.num == 3 and hist.histogram_value.sum == 6.0


def test_tensorboard_sink_can_keep_the_dotted_keys(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from dynascope.integrations.tensorboard import TensorBoardSink

    with TensorBoardSink(tmp_path, grouped=False) as tb:
        tb.log(0, {"L0.H1.qk.effective_rank": 2.0})
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert events.Tags()["scalars"] == ["L0.H1.qk.effective_rank"]
