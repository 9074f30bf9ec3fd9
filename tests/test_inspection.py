"""``dynascope.inspect`` and ``dynascope inspect``: one row per layer and head, plain floats.

Oracles, all float64:
- the instruments called directly on the same model (``attention_views``,
  ``qk_singular_values``, ``effective_rank``, ``stable_rank``, ``rank_at``, ``capture_patterns``,
  ``attention_entropy``): the table must hold exactly their values (tolerance 1e-12 relative:
  the same computation);
- dense products: nuclear and spectral norms of ``W_Q[h] @ W_K[h].T`` and ``W_V[h] @ W_O[h]``
  from ``torch.linalg.svdvals`` of the formed ``d_model x d_model`` matrix in float64 (2e-6
  relative: the instruments work in the weights' dtype, float32 here; measured 1.2e-7);
- entropy by hand, ``-sum p log p`` of the model's own patterns (HF ``output_attentions``,
  TransformerLens ``run_with_cache``), averaged over batch and query positions (1e-6
  absolute: HF's eager softmax runs in float32).
Models: a tiny random GPT-2 and a tiny Llama (GQA) written with ``save_pretrained`` and read
back by path (offline), a tiny ``HookedTransformer``, a dynascope run's checkpoints.
"""

import math
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pandas as pd
import pytest
import torch
from torch.testing import assert_close
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
from typer.testing import CliRunner

import dynascope as ds
from dynascope.cli import app
from dynascope.inspection import load_checkpoints
from dynascope.probes import (
    attention_entropy,
    effective_rank,
    ov_singular_values,
    qk_singular_values,
    rank_at,
    stable_rank,
)

BATCH, POS, D_VOCAB = 2, 7, 11
SAME = dict(rtol=1e-12, atol=0)
DENSE = dict(rtol=2e-6, atol=1e-12)
SPECTRAL = ["effective_rank", "stable_rank", "numerical_rank", "nuclear_norm", "spectral_norm"]


def randomize(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # zero-initialised biases would hide mistakes
        for p in model.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model.eval()


def gpt2():
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2, n_embd=15, n_head=3, vocab_size=D_VOCAB, n_positions=POS,
        bos_token_id=0, eos_token_id=1, attn_implementation="eager",
    )  # fmt: skip
    return randomize(GPT2LMHeadModel(config))


def llama():
    torch.manual_seed(0)
    config = LlamaConfig(
        num_hidden_layers=2, hidden_size=20, num_attention_heads=4, num_key_value_heads=2,
        head_dim=6, intermediate_size=13, vocab_size=D_VOCAB, max_position_embeddings=POS,
        attn_implementation="eager",
    )  # fmt: skip
    return randomize(LlamaForCausalLM(config))


def hooked_transformer():
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(
        n_layers=2, d_model=12, n_ctx=POS, d_head=5, n_heads=3, d_vocab=D_VOCAB, act_fn="gelu",
        normalization_type="LN", seed=0,
    )  # fmt: skip
    with warnings.catch_warnings():  # 3.x warns that 4.0 drops HookedTransformer
        warnings.simplefilter("ignore", DeprecationWarning)
        return randomize(HookedTransformer(cfg))


def tokens(seed=1):
    return torch.randint(0, D_VOCAB, (BATCH, POS), generator=torch.Generator().manual_seed(seed))


def expected_table(model, x):
    """The instruments called directly, and the dense / by-hand oracles, per (layer, head)."""
    views = ds.attention_views(model)
    with torch.no_grad():
        s = {"qk": qk_singular_values(views).double(), "ov": ov_singular_values(views).double()}
        with ds.capture_patterns(model) as patterns:
            model(x)
    rows = []
    for layer, view in enumerate(views):
        for head in range(view.n_heads):
            row = {"layer": layer, "module": view.name, "head_index": head}
            for prefix, values in s.items():
                v = values[layer, head]
                row[f"{prefix}_effective_rank"] = float(effective_rank(v))
                row[f"{prefix}_stable_rank"] = float(stable_rank(v))
                row[f"{prefix}_numerical_rank"] = float(rank_at(v, rel_tol=1e-3))
            p = patterns[view.name].double()
            row["attention_entropy"] = float(attention_entropy(p)[:, head].mean())
            W_Q, W_K = view.W_Q[head].double(), view.W_K[head].double()
            W_V, W_O = view.W_V[head].double(), view.W_O[head].double()
            for prefix, product in (("qk", W_Q @ W_K.T), ("ov", W_V @ W_O)):
                dense = torch.linalg.svdvals(product.detach())
                row[f"{prefix}_nuclear_norm"] = float(dense.sum())
                row[f"{prefix}_spectral_norm"] = float(dense.max())
            rows.append(row)
    return pd.DataFrame(rows)


def assert_matches(table: pd.DataFrame, expected: pd.DataFrame):
    assert list(table["layer"]) == list(expected["layer"])
    assert list(table["head_index"]) == list(expected["head_index"])
    assert list(table["module"]) == list(expected["module"])
    for column in expected.columns.drop(["layer", "module", "head_index"]):
        tol = DENSE if column.endswith("_norm") else SAME
        assert_close(
            torch.tensor(table[column].to_numpy()), torch.tensor(expected[column].to_numpy()), **tol
        )


def entropy_by_hand(patterns: list[torch.Tensor]) -> torch.Tensor:
    """``[n_layers * n_heads]``: -sum p log p over keys, mean over batch and queries."""
    out = []
    for p in patterns:
        p = p.double()
        h = -(torch.where(p > 0, p * p.log(), torch.zeros_like(p))).sum(-1)  # [b, heads, q]
        out.append(h.mean(dim=(0, 2)))
    return torch.cat(out)


@pytest.mark.parametrize("build", [gpt2, llama], ids=["gpt2", "llama"])
def test_saved_hf_checkpoint_by_path_matches_the_instruments(build, tmp_path: Path):
    model = build()
    model.save_pretrained(tmp_path / "ckpt")
    x = tokens()
    table = ds.inspect(tmp_path / "ckpt", x)  # loaded offline from the directory
    ((_, loaded),) = load_checkpoints(tmp_path / "ckpt")
    assert_matches(table, expected_table(loaded, x))
    eager = (
        type(model)
        .from_pretrained(tmp_path / "ckpt", local_files_only=True, attn_implementation="eager")
        .eval()
    )
    with torch.no_grad():
        own = eager(x, output_attentions=True).attentions
    assert_close(
        torch.tensor(table["attention_entropy"].to_numpy()),
        entropy_by_hand(list(own)),
        rtol=0,
        atol=1e-6,
    )
    n_heads = model.config.num_attention_heads
    assert len(table) == 2 * n_heads
    assert all(isinstance(v, float) for v in table["qk_effective_rank"])


def test_hooked_transformer_matches_the_instruments_and_its_own_cache():
    pytest.importorskip("transformer_lens")
    model = hooked_transformer()
    x = tokens()
    table = ds.inspect(model, x)
    assert_matches(table, expected_table(model, x))
    _, cache = model.run_with_cache(x)
    assert_close(
        torch.tensor(table["attention_entropy"].to_numpy()),
        entropy_by_hand([cache["pattern", layer] for layer in range(2)]),
        **SAME,
    )
    assert list(table["module"].unique()) == ["blocks.0.attn", "blocks.1.attn"]


def test_columns_no_inputs_and_model_mode_untouched():
    model = gpt2().train()
    table = ds.inspect(model)
    columns = ["layer", "module", "head_index", "d_head"]
    for prefix in ("qk", "ov"):
        columns += [f"{prefix}_{m}" for m in SPECTRAL]
    columns += ["W_Q_norm", "W_K_norm", "W_V_norm", "W_O_norm"]
    assert list(table.columns) == columns  # no attention_entropy without inputs
    assert model.training
    ds.inspect(model, tokens())
    assert model.training
    view = ds.attention_views(model)[1]
    layer1 = table[table["layer"] == 1]
    assert set(layer1["W_O_norm"]) == {float(torch.linalg.vector_norm(view.W_O.detach().double()))}


def test_hand_built_ranks():
    # one layer, identity-like heads: W_Q = W_K = [I_2; 0] gives W_QK = diag(1, 1, 0, 0):
    # effective, stable and numerical rank 2, nuclear norm 2, spectral norm 1
    from dynascope.nn.attention import MultiHeadAttention

    attention = MultiHeadAttention(d_model=4, n_heads=1, d_head=2)
    with torch.no_grad():
        for W in (attention.W_Q, attention.W_K, attention.W_V):
            W.zero_()
            W[0, :2, :2] = torch.eye(2)
        attention.W_O.zero_()
        attention.W_O[0, :2, :2] = 3 * torch.eye(2)
    row = ds.inspect(attention).iloc[0]
    assert row["qk_effective_rank"] == pytest.approx(2, rel=1e-12)
    assert row["qk_stable_rank"] == pytest.approx(2, rel=1e-12)
    assert row["qk_numerical_rank"] == 2
    assert row["qk_nuclear_norm"] == pytest.approx(2, rel=1e-12)
    assert row["qk_spectral_norm"] == pytest.approx(1, rel=1e-12)
    assert row["ov_nuclear_norm"] == pytest.approx(6, rel=1e-12)  # W_OV = 3 diag(1, 1, 0, 0)
    assert row["W_O_norm"] == pytest.approx(3 * math.sqrt(2), rel=1e-12)


def test_series_of_hf_checkpoints_in_step_order(tmp_path: Path):
    for step, seed in ((10, 1), (2, 0)):  # written out of order; "10" sorts before "2" as text
        model = gpt2()
        randomize(model, seed)
        model.save_pretrained(tmp_path / f"checkpoint-{step}")
    table = ds.inspect(tmp_path, tokens())
    assert list(table.columns[:2]) == ["step", "layer"]
    assert list(table["step"].unique()) == [2, 10]
    ((_, second),) = load_checkpoints(tmp_path / "checkpoint-10")
    block = table[table["step"] == 10].drop(columns="step").reset_index(drop=True)
    assert_matches(block, expected_table(second, tokens()))


def test_bad_paths_are_one_line_errors(tmp_path: Path):
    with pytest.raises(ValueError, match=r"^PATH: no such file or directory: '.*nope'$"):
        ds.inspect(tmp_path / "nope")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match=r"^PATH: '.*notes.txt' is not a checkpoint \(allowed"):
        ds.inspect(tmp_path / "notes.txt")
    with pytest.raises(ValueError, match=r"^PATH: '.*' holds no checkpoint"):
        ds.inspect(tmp_path)
    torch.save({"w": torch.zeros(2)}, tmp_path / "model.pt")
    with pytest.raises(ValueError, match=r"is a \.pt file without a dynascope config\.yaml"):
        ds.inspect(tmp_path / "model.pt")
    with pytest.raises(ValueError, match=r"^rel_tol must be >= 0 \(got -1"):
        ds.inspect(gpt2(), rel_tol=-1.0)


# -- dynascope checkpoints and the command ---------------------------------------------------
TINY = """\
name: tiny
task: {name: associative_recall, n_keys: 6, n_values: 5, n_pairs: 3}
model: {name: transformer, d_model: 12, n_heads: 3, d_mlp: 0}
train: {steps: 6, batch_size: 4, eval_every: 3, checkpoint_every: 3, keep_checkpoints: 5}
"""
runner = CliRunner()


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    (tmp_path / "tiny.yaml").write_text(TINY)
    result = runner.invoke(
        app, ["run", str(tmp_path / "tiny.yaml"), "--out", str(tmp_path / "run"), "--no-progress"]
    )
    assert result.exit_code == 0, result.output
    return tmp_path / "run"


def test_dynascope_checkpoints_file_and_run_directory(run_dir: Path):
    from dynascope.config import build_model, build_task, load_config

    steps = sorted(int(p.stem.split("_")[1]) for p in (run_dir / "checkpoints").glob("*.pt"))
    assert steps == [0, 1, 2, 3, 4, 6]  # every 3 steps, and the history: 0 and powers of 2
    config = load_config(run_dir / "config.yaml")
    model = build_model(config.model, build_task(config.task))
    model.load_state_dict(torch.load(run_dir / "checkpoints" / "step_6.pt")["model"])
    x = torch.randint(0, model.d_vocab, (BATCH, 5), generator=torch.Generator().manual_seed(0))
    one = ds.inspect(run_dir / "checkpoints" / "step_6.pt", x)
    assert_matches(one, expected_table(model.eval(), x))
    series = ds.inspect(run_dir, x)
    assert list(series["step"].unique()) == [0, 1, 2, 3, 4, 6]
    last = series[series["step"] == 6].drop(columns="step").reset_index(drop=True)
    pd.testing.assert_frame_equal(last, one)


def test_study_run_directory_is_read_with_its_own_build(tmp_path: Path):
    """A run whose runner.json names a study's build and config class (config.yaml is no
    registry config): the model comes from that build, each checkpoint loaded into it."""
    from dynascope.studies.compositional_icl_bottleneck.runs import (
        CompositionalRunConfig,
        build_compositional,
    )
    from dynascope.train import Loop, SeedStreams, run_members

    config = CompositionalRunConfig(
        loop=Loop(steps=4, log_every=2, eval_every=4, checkpoint_every=2),
        model="vanilla", d_model=8, n_heads=2, n_layers=2, n_context=4, batch_size=4,
        eval_sequences=8,
    )  # fmt: skip
    run_dir = tmp_path / "run"
    run_members(build_compositional, config, run_dir)
    result = runner.invoke(app, ["inspect", str(run_dir)])
    assert result.exit_code == 0, result.output
    rows = re.findall(r"^│\s*(\d+)\s*│\s*(\d+)\s*│", result.stdout, re.MULTILINE)
    expected_rows = [(str(step), str(layer)) for step in (0, 1, 2, 4) for layer in (0, 1)]
    assert rows == expected_rows, result.stdout  # step, layer: the history and the last
    model = build_compositional(config, SeedStreams(config.seed)).model
    model.load_state_dict(torch.load(run_dir / "checkpoints" / "step_4.pt")["model"])
    expected = ds.inspect(model.eval())
    series = ds.inspect(run_dir)
    assert list(series["step"].unique()) == [0, 1, 2, 4]
    last = series[series["step"] == 4].drop(columns="step").reset_index(drop=True)
    assert list(last["layer"]) == [0, 0, 1, 1] and list(last["head_index"]) == [0, 1, 0, 1]
    assert set(last["d_head"]) == {4}
    pd.testing.assert_frame_equal(last, expected)


def test_cli_inspect_tokens_and_out(tmp_path: Path):
    model = gpt2()
    model.save_pretrained(tmp_path / "ckpt")
    out = tmp_path / "report"
    result = runner.invoke(
        app, ["inspect", str(tmp_path / "ckpt"), "--tokens", "5", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert re.search(r"^\s*│?\s*1\s*│", result.stdout, re.MULTILINE), result.stdout  # layer 1 row
    table = pd.read_csv(out / "inspect.csv")
    x = torch.randint(0, D_VOCAB, (1, 5), generator=torch.Generator().manual_seed(0))
    expected = ds.inspect(tmp_path / "ckpt", x)
    assert_close(
        torch.tensor(table["attention_entropy"].to_numpy()),
        torch.tensor(expected["attention_entropy"].to_numpy()),
        rtol=1e-12,
        atol=0,
    )
    page = (out / "inspect.html").read_text()
    assert "data:image/png;base64," in page and "<script" not in page and "http" not in page
    assert (out / "figures" / "heads.png").is_file()


def test_cli_inspect_text_with_the_saved_tokenizer(tmp_path: Path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate("[UNK] the cat sat on a mat".split())}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]").save_pretrained(
        tmp_path / "ckpt"
    )
    gpt2().save_pretrained(tmp_path / "ckpt")
    (tmp_path / "text.txt").write_text("the cat sat on the mat")
    result = runner.invoke(
        app,
        [
            "inspect",
            str(tmp_path / "ckpt"),
            "--text",
            str(tmp_path / "text.txt"),
            "--out",
            str(tmp_path / "o"),
        ],
    )
    assert result.exit_code == 0, result.output
    table = pd.read_csv(tmp_path / "o" / "inspect.csv")
    x = torch.tensor([[1, 2, 3, 4, 1, 6]])
    expected = ds.inspect(tmp_path / "ckpt", x)
    assert_close(
        torch.tensor(table["attention_entropy"].to_numpy()),
        torch.tensor(expected["attention_entropy"].to_numpy()),
        rtol=1e-12,
        atol=0,
    )


@pytest.mark.parametrize(
    "args, pattern",
    [
        (["--tokens", "3", "--text", "t.txt"], r"^error: --text, --tokens: give one of them"),
        (["--tokens", "0"], r"^error: --tokens: must be >= 1 \(got 0\)$"),
        (
            ["--tokens", "99"],
            r"^error: --tokens: must be <= the model's context length 7 \(got 99\)$",
        ),
        (["--text", "missing.txt"], r"^error: --text: no such file: 'missing.txt'$"),
    ],
)
def test_cli_inspect_bad_input(tmp_path: Path, monkeypatch, args, pattern):
    gpt2().save_pretrained(tmp_path / "ckpt")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.txt").write_text("x")
    result = runner.invoke(app, ["inspect", "ckpt", *args])
    assert result.exit_code == 2, result.output
    assert re.search(pattern, result.stderr.splitlines()[-1]), result.stderr  # after HF's bar


def test_the_docs_page_snippet_runs_as_written(capsys):
    text = (Path(__file__).parents[1] / "docs" / "inspect.md").read_text()
    snippet = re.search(r"```python\n(.*?)```", text, re.DOTALL).group(1)
    exec(compile(snippet, "docs/inspect.md", "exec"), {})
    printed = capsys.readouterr().out
    assert "qk_effective_rank" in printed and "attention_entropy" in printed


# -- the per-matrix ESD table (dynascope.inspect_layers, dynascope inspect) ------------------
def test_inspect_layers_is_weight_esd_of_every_matrix(tmp_path: Path):
    """Oracle: ``weight_esd`` on the loaded model (the same computation: exact equality), and
    the model's own parameter list (every matrix of two or more dims, attention's fused
    ``c_attn``/``c_proj`` replaced by W_Q, W_K, W_V, W_O)."""
    from dynascope.probes import weight_esd

    for step, seed in ((10, 1), (2, 0)):
        randomize(gpt2(), seed).save_pretrained(tmp_path / f"checkpoint-{step}")
    one = ds.inspect_layers(tmp_path / "checkpoint-2")
    ((_, loaded),) = load_checkpoints(tmp_path / "checkpoint-2")
    pd.testing.assert_frame_equal(one, weight_esd(loaded))
    matrices = [n for n, p in loaded.named_parameters() if p.ndim >= 2 and ".attn." not in n]
    attention = [f"transformer.h.{i}.attn.{f}" for i in (0, 1) for f in ("W_Q", "W_K", "W_V")]
    attention += [f"transformer.h.{i}.attn.W_O" for i in (0, 1)]
    assert sorted(one["name"]) == sorted(matrices + attention)
    fitted = one[one["reason"] == ""]
    assert len(fitted) >= 12 and (fitted["alpha"] > 1).all()
    assert fitted["ks_distance"].between(0, 1).all()
    series = ds.inspect_layers(tmp_path)
    assert list(series["step"].unique()) == [2, 10]
    last = series[series["step"] == 2].drop(columns="step").reset_index(drop=True)
    pd.testing.assert_frame_equal(last, one)


def test_cli_inspect_prints_and_writes_alpha_and_ks_of_every_matrix(tmp_path: Path):
    gpt2().save_pretrained(tmp_path / "ckpt")
    out = tmp_path / "report"
    # a fresh process writing to a pipe, as a user's `dynascope inspect ... | less` does (the
    # table is printed as wide as its names need); in-process, in CI's full run, the names came
    # out folded after other tests of the same worker (order-dependent; cause not found)
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    command = [sys.executable, "-m", "dynascope", "inspect", str(tmp_path / "ckpt")]
    result = subprocess.run([*command, "--out", str(out)], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    expected = ds.inspect_layers(tmp_path / "ckpt")
    for row in expected.itertuples(index=False):  # one printed line per matrix
        line = next(s for s in result.stdout.splitlines() if f" {row.name} " in s)
        cells = [c.strip() for c in line.split("│")[1:-1]]
        assert cells[:5] == [
            row.name,
            "x".join(map(str, row.shape)),
            f"{row.alpha:.3g}",
            f"{row.ks_distance:.3g}",
            str(row.n_tail),
        ], line
    written = pd.read_csv(out / "layers.csv", keep_default_na=False, na_values=[""])
    for column in ("alpha", "x_min", "ks_distance"):
        assert_close(
            torch.tensor(written[column].to_numpy(dtype=float)),
            torch.tensor(expected[column].to_numpy(dtype=float)),
            rtol=1e-12, atol=0, equal_nan=True,
        )  # fmt: skip
    assert "ESD tail (power law)" in (out / "inspect.html").read_text()
    bare = runner.invoke(
        app, ["inspect", str(tmp_path / "ckpt"), "--no-esd", "--out", str(tmp_path / "b")]
    )
    assert bare.exit_code == 0 and "ESD" not in bare.stdout
    assert not (tmp_path / "b" / "layers.csv").exists()


# -- every run directory the project writes (issue 31, part 1) -------------------------------
def _shortened(config, steps: int):
    """A study's run config with fewer steps (a registry config or an engine run config)."""
    if hasattr(config, "loop"):
        return config.model_copy(update={"loop": config.loop.model_copy(update={"steps": steps})})
    return config.model_copy(update={"train": config.train.model_copy(update={"steps": steps})})


@pytest.mark.slow
def test_weight_decay_smoke_runs_and_checkpoints_are_inspected(tmp_path: Path):
    """A run of each arm kind of weight-decay-low-rank's smoke preset, trained as the study
    trains it (the recall arm as a two-member ensemble), cut to 4 steps: every run directory
    and checkpoint exits 0, with per-head rows where the model has attention (the recall and
    LM transformers) and one line where it has none (part a's factor pairs)."""
    from dynascope import studies
    from dynascope.train import run_members

    study = studies.get("weight-decay-low-rank")
    specs = study.build_runs(study.preset("smoke"), 0)
    arms = {"a_toy": 1, "b_recall_wd1": 2, "c_lm_uniform": 1}  # arm: members trained at once
    for arm, members in arms.items():
        chosen = [s for s in specs if s.name.rsplit("_s", 1)[0] == arm][:members]
        configs = [_shortened(s.config, 4) for s in chosen]
        run_members(chosen[0].build, configs, [tmp_path / s.name for s in chosen])
    targets = sorted(tmp_path.iterdir())
    targets += [p for run in targets for p in sorted((run / "checkpoints").glob("*.pt"))]
    assert len(targets) == 4 + 4 * 4  # 4 runs, each with checkpoints at steps 0, 1, 2 and 4
    for target in targets:
        result = runner.invoke(app, ["inspect", str(target), "--no-esd"])
        assert result.exit_code == 0, (target, result.output)
        lines = result.stdout.strip().splitlines()
        if "a_toy" in str(target):
            assert len(lines) == 1 and "FactorPairs has no attention layer" in lines[0], lines
        else:
            assert re.search(r"^│\s*\d+\s*│", result.stdout, re.MULTILINE), result.stdout


def test_an_mlp_study_run_gets_one_line_saying_it_has_no_attention(tmp_path: Path):
    """A slingshot run (an FCN on digits; its config has a field 'optimizer: adam' that a
    registry config would refuse): inspect reads it with its own build, prints one line that
    names the missing attention layer and what inspect covers, and exits 0."""
    from dynascope.inspection import NoAttentionError
    from dynascope.studies.slingshot.runs import FcnRun, build
    from dynascope.train import Loop, run_members

    run_dir = tmp_path / "fcn"
    run_members(build, FcnRun(loop=Loop(steps=2), hidden=(8,), n_train=20), run_dir)
    line = (
        "FCN has no attention layer: inspect's per-head table (W_QK/W_OV ranks and norms, "
        "attention entropy) needs one"
    )
    for target in (run_dir, run_dir / "checkpoints" / "step_1.pt"):
        alone = runner.invoke(app, ["inspect", str(target), "--no-esd"])
        assert alone.exit_code == 0, alone.output
        assert alone.stdout.splitlines() == [f"{target}: {line}"]
    with_esd = runner.invoke(app, ["inspect", str(run_dir)])
    assert with_esd.exit_code == 0, with_esd.output
    first = with_esd.stdout.splitlines()[0]
    assert first == f"{run_dir}: {line}; the ESD of every weight matrix follows"
    assert "W_U" in with_esd.stdout  # the ESD table of the FCN's matrices
    written = runner.invoke(app, ["inspect", str(run_dir), "--out", str(tmp_path / "o")])
    assert written.exit_code == 0, written.output
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["inspect.html", "layers.csv"]
    with pytest.raises(NoAttentionError, match=r"^FCN has no attention layer: .*inspect_layers"):
        ds.inspect(run_dir)


def test_unsupported_attention_is_still_an_error_not_a_missing_layer():
    class MyAttention(torch.nn.Module):  # attention that no adapter reads
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(4, 12)

    from dynascope.inspection import NoAttentionError, has_attention

    model = torch.nn.Sequential(MyAttention())
    with pytest.raises(ValueError, match=r"^no supported attention layer found in Sequential"):
        has_attention(model)
    with pytest.raises(ValueError, match=r"^no supported attention layer") as raised:
        ds.inspect(model)
    assert not isinstance(raised.value, NoAttentionError)
    assert has_attention(gpt2()) and not has_attention(torch.nn.Linear(3, 2))


def test_frames_say_head_index_and_an_old_head_column_is_read_with_a_warning(tmp_path: Path):
    from dynascope.report.inspect import write_inspect_report

    table = ds.inspect(gpt2(), tokens())
    assert "head" not in table.columns and callable(table.head)  # DataFrame.head is the method
    assert list(table["head_index"]) == [0, 1, 2] * 2  # 2 layers of 3 heads
    write_inspect_report(table, tmp_path / "new", "t")
    old = table.rename(columns={"head_index": "head"})  # a frame from dynascope 0.1
    with pytest.warns(DeprecationWarning, match=r"^column 'head' is now 'head_index'"):
        write_inspect_report(old, tmp_path / "old", "t")
    new_csv = (tmp_path / "new" / "inspect.csv").read_text()
    assert (tmp_path / "old" / "inspect.csv").read_text() == new_csv
