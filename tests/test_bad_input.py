"""Bad input, table-driven: every malformed config or CLI input exits 2 with one line, writes nothing.

Each case runs the ``dynascope`` command in a fresh ``tmp_path`` (also the working directory,
so a default ``runs/...`` output would show up there) and checks: exit code 2, nothing on
stdout, exactly one stderr line ``error: ...`` matching the case's regex (the field, the value
and what is allowed), no ``--out`` directory, and nothing new under ``tmp_path`` beyond the
files the case wrote itself. Cases aimed at a finished run check that it is left unchanged.

Placeholders in a case's arguments: ``<cfg>`` the case's config file, ``<out>`` the output
directory (must not appear), ``<tmp>`` the case's ``tmp_path``, ``<run>`` a finished tiny run.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dynascope import studies
from dynascope.cli import app

# Small, pairwise-distinct sizes: 6 keys, 5 values, 3 pairs; d_model 12 over 3 heads (d_head 4).
TINY = """\
name: tiny
task: {name: associative_recall, n_keys: 6, n_values: 5, n_pairs: 3}
model: {name: transformer, d_model: 12, n_heads: 3, d_mlp: 0}
train: {steps: 6, batch_size: 4, eval_every: 3, checkpoint_every: 3}
monitor: {probes: [qk_spectrum], schedule: every, every: 2}
"""
STUDY = "weight-decay-low-rank"
RUN = ("run", "<cfg>", "--out", "<out>", "--no-progress")

runner = CliRunner()


def case(
    id: str,
    args: tuple[str, ...],
    pattern: str,
    *,
    config: str | bytes | None = TINY,
    files: dict[str, bytes | None] | None = None,
):
    """One table row; ``files`` maps names under tmp_path to bytes (a file) or None (a folder)."""
    return pytest.param(args, pattern, config, files or {}, id=id)


def set_(id: str, override: str, pattern: str, **kwargs):
    """A ``dynascope run TINY --set OVERRIDE`` row."""
    return case(id, (*RUN, "--set", override), pattern, **kwargs)


def conf(id: str, text: str | bytes, pattern: str, **kwargs):
    """A ``dynascope run CONFIG`` row with the config file's whole text."""
    return case(id, RUN, pattern, config=text, **kwargs)


ALLOWED_TASKS = (
    r"\(allowed: associative_recall, linear_regression, char_lm, digits, modular_arithmetic\)"
)

CASES = [
    # -- the config file itself ------------------------------------------------------------
    case(
        "config missing",
        ("run", "<tmp>/missing.yaml", "--out", "<out>"),
        r"^error: config file: no such file: '.*missing\.yaml'$",
    ),
    case(
        "config is a directory",
        ("run", "<tmp>/conf.d", "--out", "<out>"),
        r"^error: config file: '.*conf\.d' is a directory, not a YAML file$",
        files={"conf.d": None},
    ),
    conf(
        "invalid yaml",
        "model: {d_model: 12\ntrain: [\n",
        r"^error: config file '.*config\.yaml': invalid YAML at line \d+$",
    ),
    conf(
        "yaml tab indentation",
        "model:\n\td_model: 12\n",
        r"^error: config file '.*config\.yaml': invalid YAML at line 2$",
    ),
    conf(
        "yaml duplicate key",
        "train:\n  steps: 5\n  lr: 0.1\n  steps: 50\n",
        r"^error: config file '.*config\.yaml': duplicate key 'steps' at line 4$",
    ),
    conf(
        "not utf-8",
        b"name: caf\xe9\n",
        r"^error: config file '.*config\.yaml': not UTF-8 text$",
    ),
    conf("top level list", "- name: tiny\n", r"^error: config: expected a mapping .*\(got list\)$"),
    conf("top level scalar", "42\n", r"^error: config: expected a mapping .*\(got int\)$"),
    conf("top level string", "tiny\n", r"^error: config: expected a mapping .*\(got str\)$"),
    # -- unknown keys, at every level ------------------------------------------------------
    set_("unknown top key", "modle=3", r"^error: modle: unknown field \(allowed: name, seed, "),
    set_(
        "unknown model key",
        "model.d_modle=3",
        r"^error: model\.d_modle: unknown field \(allowed: name, n_layers, d_model, ",
    ),
    set_(
        "unknown task key",
        "task.n_key=3",
        r"^error: task\.n_key: unknown field \(allowed: name, n_keys, n_values, n_pairs\)$",
    ),
    set_(
        "unknown char_lm key",
        "task={name: char_lm, text: abcdefgh, corpus: x}",
        r"^error: task\.corpus: unknown field \(allowed: name, path, text, n_ctx, ",
    ),
    set_(
        "unknown optimizer key",
        "optimizer.learning_rate=0.1",
        r"^error: optimizer\.learning_rate: unknown field \(allowed: name, lr, betas, ",
    ),
    set_(
        "unknown weight_decay key",
        "optimizer.weight_decay.mlp=0.1",
        r"^error: optimizer\.weight_decay\.mlp: unknown field "
        r"\(allowed: attention, matrices, vectors\)$",
    ),
    set_(
        "unknown train key",
        "train.epochs=3",
        r"^error: train\.epochs: unknown field \(allowed: steps, batch_size, ",
    ),
    set_(
        "unknown monitor key",
        "monitor.probe=[qk_spectrum]",
        r"^error: monitor\.probe: unknown field \(allowed: probes, schedule, every, points\)$",
    ),
    set_(
        "two errors counted",
        "train={steps: 0, batch_size: 0}",
        r"^error: train\.steps: .*greater than or equal to 1 \(got 0\) \(and 1 more\)$",
    ),
    # -- wrong types -----------------------------------------------------------------------
    set_(
        "string for int",
        "train.steps=many",
        r"^error: train\.steps: Input should be a valid integer.* \(got 'many'\)$",
    ),
    set_(
        "float for int",
        "train.batch_size=2.5",
        r"^error: train\.batch_size: .*valid integer.*fractional part \(got 2\.5\)$",
    ),
    set_(
        "bool for int",
        "train.steps=true",
        r"^error: train\.steps: expected a number, not a boolean \(got True\)$",
    ),
    set_(
        "bool for float",
        "optimizer.lr=true",
        r"^error: optimizer\.lr: expected a number, not a boolean \(got True\)$",
    ),
    set_(
        "list for float",
        "optimizer.lr=[0.1]",
        r"^error: optimizer\.lr: Input should be a valid number \(got \[0\.1\]\)$",
    ),
    set_(
        "bool for mapping",
        "model=true",
        r"^error: model: expected a mapping \(got True\)$",
    ),
    set_(
        "number for task mapping",
        "task=3",
        r"^error: task: expected a mapping \(got 3\)$",
    ),
    set_(
        "number for weight_decay mapping",
        "optimizer.weight_decay=0.1",
        r"^error: optimizer\.weight_decay: expected a mapping \(got 0\.1\)$",
    ),
    set_(
        "string for probe list",
        "monitor.probes=qk_spectrum",
        r"^error: monitor\.probes: Input should be a valid list \(got 'qk_spectrum'\)$",
    ),
    set_(
        "int for name",
        "name=5",
        r"^error: name: Input should be a valid string \(got 5\)$",
    ),
    set_(
        "string for bool",
        "model.use_ln=maybe",
        r"^error: model\.use_ln: Input should be a valid boolean.* \(got 'maybe'\)$",
    ),
    set_(
        "one beta",
        "optimizer.betas=[0.9]",
        r"^error: optimizer\.betas: expected two numbers \[beta1, beta2\] \(got \[0\.9\]\)$",
    ),
    # -- out of range ----------------------------------------------------------------------
    set_(
        "negative lr",
        "optimizer.lr=-0.1",
        r"^error: optimizer\.lr: Input should be greater than 0 \(got -0\.1\)$",
    ),
    set_(
        "zero lr",
        "optimizer.lr=0",
        r"^error: optimizer\.lr: Input should be greater than 0 \(got 0\)$",
    ),
    set_("nan lr", "optimizer.lr=.nan", r"^error: optimizer\.lr: .*finite number \(got nan\)$"),
    set_("inf lr", "optimizer.lr=.inf", r"^error: optimizer\.lr: .*finite number \(got inf\)$"),
    set_(
        "negative weight decay",
        "optimizer.weight_decay.attention=-0.1",
        r"^error: optimizer\.weight_decay\.attention: .*greater than or equal to 0 \(got -0\.1\)$",
    ),
    set_(
        "beta2 of 1",
        "optimizer.betas=[0.9, 1.0]",
        r"^error: optimizer\.betas: betas must lie in \[0, 1\) \(got \[0\.9, 1\.0\]\)$",
    ),
    set_(
        "negative beta1",
        "optimizer.betas=[-0.1, 0.99]",
        r"^error: optimizer\.betas: betas must lie in \[0, 1\) \(got \[-0\.1, 0\.99\]\)$",
    ),
    set_(
        "momentum 1",
        "optimizer.momentum=1",
        r"^error: optimizer\.momentum: Input should be less than 1 \(got 1\)$",
    ),
    set_(
        "zero eps",
        "optimizer.eps=0",
        r"^error: optimizer\.eps: Input should be greater than 0 \(got 0\)$",
    ),
    set_(
        "zero grad_clip",
        "optimizer.grad_clip=0",
        r"^error: optimizer\.grad_clip: Input should be greater than 0 \(got 0\)$",
    ),
    set_(
        "negative warmup",
        "optimizer.warmup_steps=-1",
        r"^error: optimizer\.warmup_steps: .*greater than or equal to 0 \(got -1\)$",
    ),
    set_(
        "heads do not divide d_model",
        "model.n_heads=5",
        r"^error: model: n_heads must divide d_model \(got d_model=12, n_heads=5\)$",
    ),
    set_(
        "d_head 0",
        "model.d_head=0",
        r"^error: model\.d_head: .*greater than or equal to 1 \(got 0\)$",
    ),
    set_(
        "n_layers 0",
        "model.n_layers=0",
        r"^error: model\.n_layers: .*greater than or equal to 1 \(got 0\)$",
    ),
    set_(
        "negative d_mlp",
        "model.d_mlp=-4",
        r"^error: model\.d_mlp: .*greater than or equal to 0 \(got -4\)$",
    ),
    set_(
        "batch_size 0",
        "train.batch_size=0",
        r"^error: train\.batch_size: .*greater than or equal to 1 \(got 0\)$",
    ),
    set_(
        "steps 0",
        "train.steps=0",
        r"^error: train\.steps: .*greater than or equal to 1 \(got 0\)$",
    ),
    set_(
        "log_every 0",
        "train.log_every=0",
        r"^error: train\.log_every: .*greater than or equal to 1 \(got 0\)$",
    ),
    set_(
        "eval_every 0",
        "train.eval_every=0",
        r"^error: train\.eval_every: .*greater than or equal to 1 \(got 0\)$",
    ),
    set_(
        "checkpoint_every 0",
        "train.checkpoint_every=0",
        r"^error: train\.checkpoint_every: .*greater than or equal to 1 \(got 0\)$",
    ),
    set_(
        "keep_checkpoints 0",
        "train.keep_checkpoints=0",
        r"^error: train\.keep_checkpoints: .*greater than or equal to 1 \(got 0\)$",
    ),
    set_(
        "monitor every 0",
        "monitor.every=0",
        r"^error: monitor\.every: .*greater than or equal to 1 \(got 0\)$",
    ),
    set_(
        "monitor points 0",
        "monitor={schedule: log, points: 0}",
        r"^error: monitor\.points: .*greater than or equal to 1 \(got 0\)$",
    ),
    set_(
        "n_pairs above n_keys",
        "task.n_pairs=7",
        r"^error: task: n_pairs must be <= n_keys \(got n_pairs=7, n_keys=6\)$",
    ),
    set_(
        "val_fraction 1",
        "task={name: char_lm, text: abcdefgh, val_fraction: 1}",
        r"^error: task\.val_fraction: Input should be less than 1 \(got 1\)$",
    ),
    set_(
        "char_lm n_ctx above corpus",
        "task={name: char_lm, text: abcdefgh, n_ctx: 7}",
        r"^error: n_ctx must be < the bytes in each split \(got n_ctx=7, train bytes=7, "
        r"val bytes=1, split_mode='bytes'\)$",
    ),
    set_(
        "negative seed",
        "seed=-1",
        r"^error: seed: Input should be greater than or equal to 0 \(got -1\)$",
    ),
    set_(
        "seed above 64 bits",
        f"seed={2**64}",
        rf"^error: seed: Input should be less than or equal to {2**64 - 1} \(got {2**64}\)$",
    ),
    # -- unknown names ---------------------------------------------------------------------
    set_(
        "unknown task",
        "task.name=sorting",
        rf"^error: task\.name: unknown task 'sorting' {ALLOWED_TASKS}$",
    ),
    set_(
        "task without name",
        "task={n_keys: 6}",
        rf"^error: task\.name: missing; name a task {ALLOWED_TASKS}$",
    ),
    set_(
        "unknown model",
        "model.name=lstm",
        r"^error: model\.name: unknown model 'lstm' \(allowed: transformer, vit, fcn\)$",
    ),
    set_(
        "unknown optimizer",
        "optimizer.name=lion",
        r"^error: optimizer\.name: Input should be 'adamw', 'adam' or 'sgd' \(got 'lion'\)$",
    ),
    set_(
        "unknown probe",
        "monitor.probes=[qk_spectrum, entropy]",
        r"^error: monitor\.probes: unknown probe 'entropy' \(allowed: .*qk_spectrum.*\)$",
    ),
    set_(
        "duplicate probe",
        "monitor.probes=[qk_spectrum, qk_spectrum]",
        r"^error: monitor\.probes: probe 'qk_spectrum' listed twice$",
    ),
    set_(
        "unknown schedule",
        "monitor.schedule=cosine",
        r"^error: monitor\.schedule: Input should be 'every' or 'log' \(got 'cosine'\)$",
    ),
    set_(
        "unknown lr_schedule",
        "optimizer.lr_schedule=linear",
        r"^error: optimizer\.lr_schedule: .*'constant' or 'cosine' \(got 'linear'\)$",
    ),
    set_(
        "unknown dtype",
        "dtype=float16",
        r"^error: dtype: Input should be 'float32' or 'float64' \(got 'float16'\)$",
    ),
    set_(
        "unknown device",
        "device=tpu",
        r"^error: device: Input should be 'cpu' or 'cuda' \(got 'tpu'\)$",
    ),
    # -- char_lm corpus --------------------------------------------------------------------
    set_(
        "corpus path missing",
        "task={name: char_lm, path: <tmp>/no-such-corpus}",
        r"^error: task\.path: no such file or directory: '.*no-such-corpus'$",
    ),
    set_(
        "corpus path empty string",
        "task={name: char_lm, path: ''}",
        r"^error: task\.path: String should have at least 1 character \(got ''\)$",
    ),
    set_(
        "corpus empty file",
        "task={name: char_lm, path: <tmp>/empty.txt}",
        r"^error: task\.path: no text found in '.*empty\.txt' \(an empty file\)$",
        files={"empty.txt": b""},
    ),
    set_(
        "corpus folder without text",
        "task={name: char_lm, path: <tmp>/corpus}",
        r"^error: task\.path: no text found in '.*corpus' \(no non-empty file with suffix "
        r"\.py \.txt \.md \.rst below it\)$",
        files={"corpus": None, "corpus/data.bin": b"\x00\x01", "corpus/notes.txt": b""},
    ),
    set_(
        "corpus inline empty text",
        "task={name: char_lm, text: ''}",
        r"^error: task\.text: String should have at least 1 character \(got ''\)$",
    ),
    set_(
        "corpus path and text",
        "task={name: char_lm, path: <tmp>/corpus.txt, text: abcdefgh}",
        r"^error: task: path and text are exclusive \(got both; give one\)$",
        files={"corpus.txt": b"abcdefghijkl"},
    ),
    # -- run name --------------------------------------------------------------------------
    set_(
        "name with slash",
        "name=a/b",
        r"^error: name: .*letters, digits and _ \. = \+ - \(got 'a/b'\)$",
    ),
    set_("name dot dot", "name=..", r"^error: name: must not start with '\.' \(got '\.\.'\)$"),
    set_(
        "name hidden",
        "name=.tiny",
        r"^error: name: must not start with '\.' \(got '\.tiny'\)$",
    ),
    set_("name empty", "name=", r"^error: name: String should have at least 1 character"),
    # -- --set itself ----------------------------------------------------------------------
    set_(
        "set without =",
        "model.n_heads",
        r"^error: --set expects KEY=VALUE .*\(got 'model\.n_heads'\)$",
    ),
    set_("set empty key", "=3", r"^error: --set expects KEY=VALUE .*\(got '=3'\)$"),
    set_(
        "set through a number",
        "model.d_model.x=3",
        r"^error: --set model\.d_model\.x: d_model is not a mapping \(got 12\)$",
    ),
    # -- the command line ------------------------------------------------------------------
    case("run without config", ("run",), r"^error: Missing argument '(?i:config)'\.$"),
    case("unknown option", (*RUN, "--bogus"), r"^error: No such option: --bogus"),
    case("unknown command", ("frobnicate",), r"^error: No such command 'frobnicate'\.$"),
    case(
        "study negative seed",
        ("study", "run", STUDY, "--preset", "smoke", "--seed", "-1"),
        r"^error: --seed: must be in \[0, 2\*\*32\) \(got -1\)$",
    ),
    case(
        "study huge seed",
        ("study", "run", STUDY, "--preset", "smoke", "--seed", str(2**64 - 1)),
        r"^error: --seed: must be in \[0, 2\*\*32\) \(got 18446744073709551615\)$",
    ),
    case(
        "unknown study",
        ("study", "run", "nope"),
        rf"^error: unknown study 'nope' \(allowed: {re.escape(', '.join(studies.names()))}\)$",
    ),
    case(
        "unknown preset",
        ("study", "run", STUDY, "--preset", "huge"),
        r"^error: preset must be one of smoke, fast, paper \(got 'huge'\)$",
    ),
    case(
        "study out is a file",
        ("study", "run", STUDY, "--preset", "smoke", "--out", "<tmp>/taken"),
        r"^error: --out: '.*taken' exists and is not a directory$",
        files={"taken": b"x"},
    ),
    case(
        "entropy on linear attention",
        (*RUN, "--set", "model.attention=linear", "--set", "monitor.probes=[attention_entropy]"),
        r"^error: config: monitor\.probes: attention_entropy needs softmax attention "
        r"\(got model\.attention='linear'\)$",
    ),
    case("run out empty", (*RUN, "--out", ""), r"^error: --out: give a directory for the run"),
    set_(
        "steps beyond 1e12",
        "train.steps=100000000000000000000",
        r"^error: train\.steps: Input should be less than or equal to 1000000000000 \(got 1",
    ),
    case(
        "run out below a file",
        (*RUN, "--out", "<tmp>/taken/sub"),
        r"^error: --out: '.*taken/sub' cannot be created: '.*taken' is not a directory$",
        files={"taken": b"x"},
    ),
    case(
        "study out below a file",
        ("study", "run", STUDY, "--preset", "smoke", "--out", "<tmp>/taken/sub"),
        r"^error: --out: '.*taken/sub' cannot be created: '.*taken' is not a directory$",
        files={"taken": b"x"},
    ),
    case(
        "study out is a run",
        ("study", "run", STUDY, "--preset", "smoke", "--out", "<run>"),
        r"^error: --out: '.*' is a run directory; choose a study directory$",
    ),
    case(
        "out is a file",
        ("run", "<cfg>", "--out", "<tmp>/taken", "--no-progress"),
        r"^error: --out: '.*taken' exists and is not a directory$",
        files={"taken": b"x"},
    ),
    case(
        "out holds a run",
        ("run", "<cfg>", "--out", "<run>", "--no-progress"),
        r"^error: --out: '.*' already holds a run \(continue it with `dynascope resume .*` "
        r"or choose another directory\)$",
    ),
    case(
        "resume not a run",
        ("resume", "<tmp>/plain", "--no-progress"),
        r"^error: RUN_DIR: '.*plain' is not a run directory \(no config\.yaml\)$",
        files={"plain": None},
    ),
    case(
        "resume with broken config",
        ("resume", "<tmp>/broken", "--no-progress"),
        r"^error: config file '.*config\.yaml': invalid YAML at line \d+$",
        files={"broken": None, "broken/config.yaml": b"model: {d_model: 12\n"},
    ),
    case(
        "show not a run",
        ("show", "<tmp>/plain"),
        r"^error: RUN_DIR: not a run directory \(no metrics\.sqlite\): '.*plain'$",
        files={"plain": None},
    ),
    case(
        "report not a run",
        ("report", "<tmp>/plain"),
        r"^error: DIR: '.*plain' is neither a run directory nor a study directory$",
        files={"plain": None},
    ),
    case(
        "validate bad config",
        ("config", "validate", "<cfg>", "--set", "model.n_heads=5"),
        r"^error: model: n_heads must divide d_model \(got d_model=12, n_heads=5\)$",
    ),
]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny run, outside every case's tmp_path (cases must leave it unchanged)."""
    root = tmp_path_factory.mktemp("finished")
    config = root / "tiny.yaml"
    config.write_text(TINY)
    out = root / "run"
    result = runner.invoke(app, ["run", str(config), "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    return out


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every path below ``root`` with its size and modification time."""
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")
    }


def assert_one_line_error(result, pattern: str) -> None:
    """Exit 2, nothing on stdout, exactly one stderr line ``error: ...`` matching ``pattern``."""
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert re.search(pattern, lines[0]), lines[0]


@pytest.mark.parametrize(("args", "pattern", "config", "files"), CASES)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(
    args, pattern, config, files, tmp_path: Path, monkeypatch, request
):
    monkeypatch.chdir(tmp_path)  # a default runs/... output would land here
    cfg = tmp_path / "config.yaml"
    if config is not None:
        cfg.write_bytes(config.encode() if isinstance(config, str) else config)
    for name, content in files.items():
        if content is None:
            (tmp_path / name).mkdir()
        else:
            (tmp_path / name).write_bytes(content)
    run_dir = request.getfixturevalue("finished_run") if "<run>" in " ".join(args) else None
    out = tmp_path / "out"
    places = {"<cfg>": cfg, "<out>": out, "<tmp>": tmp_path, "<run>": run_dir}
    argv = []
    for arg in args:
        for key, value in places.items():
            if key in arg:
                arg = arg.replace(key, str(value))
        argv.append(arg)
    before = _snapshot(tmp_path)
    run_before = _snapshot(run_dir) if run_dir is not None else None

    result = runner.invoke(app, argv)

    assert_one_line_error(result, pattern)
    assert not out.exists()
    assert _snapshot(tmp_path) == before
    if run_dir is not None:
        assert _snapshot(run_dir) == run_before


def test_table_is_large_and_ids_distinct():
    ids = [c.id for c in CASES]
    assert len(ids) >= 36
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize(
    "text", ["", "\n", "# nothing but a comment\n"], ids=["empty", "newline", "comment"]
)
def test_empty_config_is_valid(text: str, tmp_path: Path):
    """An empty YAML file is the all-defaults config, not an error."""
    cfg = tmp_path / "empty.yaml"
    cfg.write_text(text)
    result = runner.invoke(app, ["config", "validate", str(cfg)])
    assert result.exit_code == 0, result.output
    assert result.stdout.rstrip().endswith("config is valid")
    assert "name: run" in result.stdout
