"""The README's snippets (and those of docs/instruments.md) run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import dynascope as ds

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
INSTRUMENTS = ROOT / "docs" / "instruments.md"


def _block_after(heading: str, path: Path = README, index: int = 0) -> str:
    text = path.read_text()
    section = text[text.index(heading) :]
    return re.findall(r"```python\n(.*?)```", section, re.S)[index]


def test_instruments_snippet_runs_and_commits_every_due_step(tmp_path, monkeypatch):
    code = _block_after("# Instruments in your own loop", INSTRUMENTS)
    code = code.replace("10_000", "20").replace("10_001", "21")
    step_code = "loss = model(x).square().mean(); opt.zero_grad(); loss.backward(); opt.step()"
    code = code.replace("...", step_code, 1)
    assert code.count("...") == 0
    model = ds.nn.Transformer(n_layers=2, d_model=12, n_heads=3, d_vocab=11, d_out=11, n_ctx=7)
    namespace = {
        "model": model,
        "x": ds.tasks.AssociativeRecall(n_keys=6, n_values=5, n_pairs=3).batch(
            "train", 4, torch.Generator().manual_seed(0)
        )["x"],
        "opt": torch.optim.SGD(model.parameters(), lr=0.01),
    }
    monkeypatch.chdir(tmp_path)
    exec(compile(code, str(README), "exec"), namespace)
    run = ds.load_run(tmp_path / "runs" / "mine")
    logged = sorted(run.scalar("qk.mean.effective_rank").index)
    assert logged == sorted(ds.LogSchedule(20, 30).steps)
    assert logged[0] == 0 and logged[-1] == 20


def test_capture_snippet_runs_on_a_tiny_gpt2():
    import transformers

    code = _block_after("**Models the instruments read.**", INSTRUMENTS)
    config = transformers.GPT2Config(
        vocab_size=11, n_positions=7, n_embd=12, n_layer=2, n_head=3, bos_token_id=0, eos_token_id=0
    )
    code = code.replace(
        'transformers.GPT2LMHeadModel.from_pretrained("gpt2")',
        "transformers.GPT2LMHeadModel(config)",
    )
    namespace = {
        "ds": ds,
        "torch": torch,
        "transformers": transformers,
        "config": config,
        "input_ids": torch.randint(0, 11, (2, 7), generator=torch.Generator().manual_seed(0)),
    }
    exec(compile(code, str(README), "exec"), namespace)
    p = namespace["p"]
    assert p.shape == (2, 3, 7, 7)
    entropy = ds.probes.attention_entropy(p, torch.ones(7, 7, dtype=torch.bool).tril())
    assert entropy.shape == (2, 3, 7) and bool((entropy[..., 0] == 0).all())  # one key: 0 nats


def test_probe_table_names_real_probes_and_keys(tmp_path):
    """Every probe in the instruments table is registered, and its example keys are logged."""
    text = INSTRUMENTS.read_text()
    table = text[text.index("**Probes**") : text.index("`ds.probes.detect_slingshots")]
    rows = [r for r in table.splitlines() if r.startswith("| `")]
    names = [n for r in rows for n in re.findall(r"`([a-z_]+)`", r.split("|")[1])]
    keys = [k for r in rows for k in re.findall(r"`([^`]+)`", r.split("|")[2])]
    assert sorted(names) == sorted(ds.probes.PROBES)
    config = ds.config.validate_config(
        {
            "model": {"n_layers": 2, "d_model": 12, "n_heads": 3, "d_mlp": 8},
            "task": {"name": "associative_recall", "n_keys": 6, "n_values": 5, "n_pairs": 3},
            "train": {"steps": 2, "batch_size": 4, "eval_every": 2},
            "monitor": {"probes": names, "schedule": "every", "every": 1},
        }
    )
    ds.train.Trainer(config, tmp_path / "r").run()
    run = ds.load_run(tmp_path / "r")
    logged = set(run.scalars["key"])
    for key in keys:
        if key.endswith("singular_values"):
            run.tensors(key)  # raises KeyError if absent
        else:
            assert key in logged, key


def test_sharpness_snippet_runs_as_written_and_sits_at_the_edge_of_stability(tmp_path, monkeypatch):
    code = _block_after("## Sharpness at the edge of stability", INSTRUMENTS)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, str(README), "exec"), {})
    run = ds.load_run(tmp_path / "runs" / "eos")
    sharpness = run.scalar("sharpness.lambda_max")
    assert sorted(sharpness.index) == list(range(0, 1001, 100))
    assert set(run.scalar("sharpness.two_over_lr")) == {2.0}
    # after 200 steps λ_max sits near 2/η = 2 (measured 2.03-2.17; CPU rounding may move it)
    late = sharpness[sharpness.index >= 200]
    assert ((late > 0.85 * 2.0) & (late < 1.25 * 2.0)).all(), late.to_dict()


def test_results_snippet_runs_with_mlflow_wandb_and_pandas(tmp_path, monkeypatch):
    import wandb
    from mlflow.tracking import MlflowClient

    code = _block_after("## Results in MLflow, W&B, TensorBoard and pandas", INSTRUMENTS)
    model = ds.nn.Transformer(n_layers=2, d_model=12, n_heads=3, d_vocab=11, d_out=11, n_ctx=7)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    namespace = {"ds": ds, "model": model}
    exec(compile(code, str(README), "exec"), namespace)
    wandb.teardown()
    erank = namespace["erank"]
    assert erank.shape == (2, 3)  # layers x heads
    assert erank.loc[1, 2] == ds.load_run("runs/mine").last("L1.H2.qk.effective_rank")
    assert set(namespace["runs"]["run"]) == {"mine"}
    (experiment,) = [
        e for e in MlflowClient("sqlite:///mlflow.db").search_experiments() if e.name == "dynascope"
    ]
    (logged,) = MlflowClient("sqlite:///mlflow.db").search_runs([experiment.experiment_id])
    assert logged.data.metrics["attn/L1/H2/qk_effective_rank"] == erank.loc[1, 2]
    assert len(list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))) == 1


def test_engine_snippet_trains_a_seed_ensemble(tmp_path, monkeypatch, capsys):
    code = _block_after("## Train on the engine")
    monkeypatch.chdir(tmp_path)
    exec(compile(code, str(README), "exec"), {})
    assert capsys.readouterr().out.strip() == str(["finished"] * 4)
    losses = [ds.load_run(tmp_path / f"runs/ens/seed{k}").scalar("train.loss") for k in range(4)]
    assert all(len(s) == 10 and s.iloc[-1] < s.iloc[0] for s in losses)
    assert len({float(s.iloc[-1]) for s in losses}) == 4  # four seeds, four runs


# -- the README's five common tasks ----------------------------------------------------------------
def test_readme_is_short():
    assert len(README.read_text()) <= 12_000


def test_task1_reproduce_a_finding_runs(tmp_path, monkeypatch, capsys):
    code = _block_after("**1. Reproduce a finding.**")
    monkeypatch.chdir(tmp_path)
    exec(compile(code, str(README), "exec"), {})
    lines = capsys.readouterr().out.strip().splitlines()
    claims = ds.studies.get("mup-coordinate-check").reanalyze(tmp_path / "runs/mup-smoke").claims
    assert len(lines) == len(claims) >= 2
    assert all(line.split()[0] in ("held", "not", "inconclusive") for line in lines)


def test_task2_inspect_snippet_runs(capsys):
    code = _block_after("**2. Analyse a model in one call.**")
    exec(compile(code, str(README), "exec"), {})
    out = capsys.readouterr().out
    assert "qk_effective_rank" in out and "attention_entropy" in out


def test_task3_monitor_snippet_logs_on_the_schedule(tmp_path, monkeypatch):
    code = _block_after("**3. Instrument your own training loop.**")
    monkeypatch.chdir(tmp_path)
    exec(compile(code, str(README), "exec"), {})
    run = ds.load_run(tmp_path / "runs" / "mine")
    assert sorted(run.scalar("qk.mean.effective_rank").index) == sorted(
        ds.LogSchedule(200, 20).steps
    )
    sharp, edge = run.scalar("sharpness.lambda_max"), run.scalar("sharpness.two_over_lr")
    assert len(sharp) == len(ds.LogSchedule(200, 20).steps) and (sharp > 0).all()
    assert edge.iloc[0] == pytest.approx(2 / 1e-3)


def test_task4_hf_callback_snippet_runs(tmp_path, monkeypatch):
    import transformers

    code = _block_after("**4. Use the Hugging Face or Lightning callbacks.**")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=11, n_positions=7, n_embd=12, n_layer=2, n_head=3)
    model = transformers.GPT2LMHeadModel(config)
    ids = torch.randint(0, 11, (8, 7), generator=torch.Generator().manual_seed(1))
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"), max_steps=4, per_device_train_batch_size=2,
        report_to="none", save_strategy="no", use_cpu=True, disable_tqdm=True, logging_steps=2,
    )  # fmt: skip
    monkeypatch.chdir(tmp_path)
    with ds.RunStore(tmp_path / "hf-run") as store:
        monitor = ds.Monitor(model, [ds.probes.QKSpectrum()], ds.EveryN(2), store)
        namespace = {
            "transformers": transformers, "model": model, "args": args, "monitor": monitor,
            "data": [{"input_ids": row, "labels": row} for row in ids],
        }  # fmt: skip
        exec(compile(code, str(README), "exec"), namespace)
    run = ds.load_run(tmp_path / "hf-run")
    assert run.status == "finished"
    assert sorted(run.scalar("qk.mean.effective_rank").index) == [0, 2, 4]


@pytest.mark.filterwarnings("ignore:.*(does not have many workers|Consider setting).*")
@pytest.mark.filterwarnings("ignore:.*GPU available but not used.*")
@pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")
def test_task4_lightning_callback_snippet_runs(tmp_path, monkeypatch):
    import lightning
    import lightning.pytorch as pl

    code = _block_after("**4. Use the Hugging Face or Lightning callbacks.**", index=1)

    class Regression(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh())

        def training_step(self, batch, batch_idx):
            return self.model(batch[0]).square().mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    module = Regression()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 3)), 2)
    monkeypatch.chdir(tmp_path)
    code = code.replace(
        "lightning.Trainer(",
        "lightning.Trainer(logger=False, enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False, ",
    )
    with ds.RunStore(tmp_path / "pl-run") as store:
        monitor = ds.Monitor(module.model, [ds.probes.ParameterNorms()], ds.EveryN(50), store)
        namespace = {"lightning": lightning, "module": module, "loader": loader, "monitor": monitor}
        exec(compile(code, str(README), "exec"), namespace)
    run = ds.load_run(tmp_path / "pl-run")
    assert run.status == "finished"
    assert sorted(run.scalar("norm.total").index) == [0, 50, 100]


def test_task5_pandas_snippet_reads_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(_block_after("**3. Instrument your own training loop.**"), "t3", "exec"), {})
    namespace: dict = {}
    exec(compile(_block_after("**5. Read results into pandas.**"), str(README), "exec"), namespace)
    erank, runs = namespace["erank"], namespace["runs"]
    assert erank.shape == (len(ds.LogSchedule(200, 20).steps), 2 * 4)  # steps x (layer, head)
    assert {"run", "step", "key", "value", "layer", "head_index", "metric"} <= set(runs.columns)
    assert "head" not in runs.columns  # DataFrame.head stays the method
    assert "mine" in set(runs["run"])
