"""``dynascope show``, ``report`` and ``inspect``: look at a run, a study or a model."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from ._common import (
    console,
    db_errors,
    fail,
    print_line,
    print_table,
    print_verdicts,
    refuse_unusable_dir,
    smoke_note,
)

_FINAL_STATUSES = ("finished", "diverged", "interrupted", "failed")


def show(
    run_dir: Annotated[Path, typer.Argument(help="run or study directory")],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="keep the table live until the run ends")
    ] = False,
    interval: Annotated[float, typer.Option(help="seconds between reads, with --follow")] = 2.0,
    timeout: Annotated[
        float | None, typer.Option(help="stop following after this many seconds")
    ] = None,
) -> None:
    """Summary of a run (status, last scalars) or of a study (each run's state, step, ETA).

    With --follow, the table is re-read every --interval seconds until the run's status is
    final (finished, diverged, interrupted) or the study ends, --timeout passes, or Ctrl-C.
    """
    import time

    from rich.live import Live

    from dynascope.store import STUDY_FILE

    if interval <= 0:
        fail(f"--interval: must be > 0 (got {interval})")
    if (run_dir / STUDY_FILE).is_file():
        from ._study_view import show_study

        show_study(run_dir, follow, interval, timeout)
        return
    r = _read_run(run_dir)
    if not follow:
        console.print(_run_table(r))
        return
    deadline = None if timeout is None else time.monotonic() + timeout
    with contextlib.suppress(KeyboardInterrupt), Live(_run_table(r), console=console) as live:
        while r.status not in _FINAL_STATUSES:
            if deadline is not None and time.monotonic() + interval > deadline:
                break
            time.sleep(interval)
            r = _read_run(run_dir)
            live.update(_run_table(r))


def _read_run(run_dir: Path):
    from dynascope.store import METRICS_FILE, load_run

    try:
        return load_run(run_dir)
    except FileNotFoundError as err:
        fail(f"RUN_DIR: {err}")
    except db_errors() as err:
        fail(f"RUN_DIR: {str(run_dir)!r}: {METRICS_FILE} is not readable ({err})")


def _run_table(r) -> Table:
    last_step = "" if r.scalars.empty else f", step {int(r.scalars['step'].max())}"
    table = Table(title=f"{r.name}: {r.status or 'running'}{last_step}")
    table.add_column("key")
    table.add_column("step", justify="right")
    table.add_column("value", justify="right")
    if not r.scalars.empty:
        last = r.scalars.groupby("key").tail(1).sort_values("key")
        for key, step, value in zip(last["key"], last["step"], last["value"]):
            if key.startswith("L") and ".H" in key:  # per-head rows: see `dynascope report`
                continue
            table.add_row(key, str(step), f"{value:.6g}")
    return table


def report(directory: Annotated[Path, typer.Argument(help="run or study directory")]) -> None:
    """Draw figures and write report.html for a run directory, or re-analyze a study directory."""
    from dynascope.report.run import report_run
    from dynascope.store import METRICS_FILE, VERDICT_FILE

    if (directory / VERDICT_FILE).is_file():
        _report_study(directory)
        return
    if not (directory / METRICS_FILE).is_file():
        fail(f"DIR: {str(directory)!r} is neither a run directory nor a study directory")
    try:
        path = report_run(directory)
    except db_errors() as err:
        fail(f"DIR: {str(directory)!r}: {METRICS_FILE} is not readable ({err})")
    print_line(f"wrote {path}")


def _report_study(directory: Path) -> None:
    from dynascope import studies
    from dynascope.store import VERDICT_FILE, read_json

    info = read_json(directory / VERDICT_FILE)
    try:
        study = studies.get(info["study"])
    except ValueError as err:
        fail(f"DIR: {err}")
    outcome = study.reanalyze(directory, run_reports=True)
    print_verdicts(outcome)
    smoke_note(outcome.preset)


def inspect(
    path: Annotated[
        Path,
        typer.Argument(
            help="Hugging Face checkpoint directory, .pt checkpoint, run directory, or a "
            "directory of checkpoints"
        ),
    ],
    text: Annotated[
        Path | None,
        typer.Option(help="text file, tokenized with the checkpoint's own tokenizer (offline)"),
    ] = None,
    tokens: Annotated[
        int | None, typer.Option(help="N random token ids (seed 0) as the input instead")
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(help="write inspect.csv, layers.csv, figures/ and inspect.html here"),
    ] = None,
    esd: Annotated[
        bool, typer.Option(help="fit the heavy tail of every weight matrix's ESD (per layer)")
    ] = True,
) -> None:
    """Analyse a model's attention heads and the ESD tail of every weight matrix.

    Per head: W_QK/W_OV ranks and norms, attention entropy. Per weight matrix: the ESD's
    power-law tail (alpha, KS distance).

    A model without attention layers (an MLP) gets one line saying so, then the ESD table;
    exit 0.
    """
    from dynascope.inspection import has_attention, inspect_layers, load_checkpoints
    from dynascope.inspection import inspect as inspect_model

    if text is not None and tokens is not None:
        fail("--text, --tokens: give one of them, not both")
    if tokens is not None and tokens < 1:
        fail(f"--tokens: must be >= 1 (got {tokens})")
    if text is not None and not text.is_file():
        fail(f"--text: no such file: {str(text)!r}")
    if out is not None:
        refuse_unusable_dir(out)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # no "Loading weights" bars
    try:
        checkpoints = load_checkpoints(path)
        heads = has_attention(checkpoints[-1][1])
        x = _inspect_inputs(path, checkpoints[-1][1], text, tokens) if heads else None
        frames, layer_frames = [], []
        for step, model in checkpoints:
            frame = inspect_model(model, x) if heads else None
            layer_frame = inspect_layers(model) if esd else None
            for table in (frame, layer_frame):
                if step is not None and table is not None:
                    table.insert(0, "step", step)
            frames.append(frame)
            layer_frames.append(layer_frame)
    except ValueError as err:
        fail(str(err))
    import pandas as pd

    frame = pd.concat(frames, ignore_index=True) if heads else None
    layers = pd.concat(layer_frames, ignore_index=True) if esd else None
    if frame is not None:
        _print_inspect_summary(frame, path)
    else:
        _print_no_attention(checkpoints[-1][1], path, esd)
    if layers is not None:
        _print_esd_table(layers, path)
    if out is not None:
        from dynascope.report.inspect import write_inspect_report
        from dynascope.store import FIGURES_DIR

        if frame is None and layers is None:
            return  # nothing to write
        csv, page, _ = write_inspect_report(frame, out, f"dynascope inspect: {path}", layers)
        written = [csv, out / "layers.csv" if layers is not None else None, page]
        figures = [f"{out / FIGURES_DIR}/"] if frame is not None else []
        print_line(f"wrote {', '.join([*(str(p) for p in written if p), *figures])}")


def _print_no_attention(model, path: Path, esd: bool) -> None:
    """The one line for a model without attention layers (exit 0: nothing is wrong)."""
    from dynascope.inspection import no_attention_message

    after = "; the ESD of every weight matrix follows" if esd else ""
    print_line(f"{path}: {no_attention_message(model)}{after}", soft_wrap=True)


def _inspect_inputs(path: Path, model, text: Path | None, tokens: int | None):
    """Token ids ``[1, pos]`` for ``dynascope inspect``, or ``None`` without --text/--tokens."""
    import torch

    from dynascope.inspection import model_limits

    if text is None and tokens is None:
        return None
    d_vocab, n_ctx = model_limits(model)
    if tokens is not None:
        if d_vocab is None:
            fail("--tokens: the model's vocabulary size cannot be read; use the Python API")
        if n_ctx is not None and tokens > n_ctx:
            fail(f"--tokens: must be <= the model's context length {n_ctx} (got {tokens})")
        generator = torch.Generator().manual_seed(0)
        return torch.randint(0, d_vocab, (1, tokens), generator=generator)
    folder = path if path.is_dir() else path.parent
    candidates = [folder, *sorted(p for p in folder.iterdir() if p.is_dir())]
    try:
        from transformers import AutoTokenizer
    except ImportError:
        fail("--text: needs transformers (pip install 'dynascope[hf]') and a saved tokenizer")
    for candidate in candidates:
        try:
            tokenizer = AutoTokenizer.from_pretrained(candidate, local_files_only=True)
            break
        except (OSError, ValueError, TypeError):
            continue
    else:
        fail(f"--text: no tokenizer saved in {str(folder)!r}; use --tokens N")
    ids = tokenizer(text.read_text(encoding="utf-8"), return_tensors="pt")["input_ids"]
    if ids.shape[1] == 0:
        fail(f"--text: {str(text)!r} holds no tokens")
    return ids[:, :n_ctx] if n_ctx is not None else ids


def _print_inspect_summary(frame, path: Path) -> None:
    from dynascope.keys import HEAD_COLUMN

    keys = [c for c in ("step", "layer") if c in frame.columns]
    columns = [
        c
        for c in ("qk_effective_rank", "ov_effective_rank", "qk_spectral_norm", "attention_entropy")
        if c in frame.columns
    ]
    means = frame.groupby(keys)[columns].mean().reset_index()
    table = Table(title=f"{path}: mean over heads ({frame[HEAD_COLUMN].nunique()} per layer)")
    for column in keys + columns:
        table.add_column(column, justify="right")
    for row in means.itertuples(index=False):
        table.add_row(
            *(str(int(v)) if k in keys else f"{v:.4g}" for k, v in zip(keys + columns, row))
        )
    print_table(table)


def _print_esd_table(layers, path: Path) -> None:
    """Per weight matrix: the ESD tail fit (the last checkpoint's, for a series)."""
    last = layers[layers["step"] == layers["step"].max()] if "step" in layers.columns else layers
    step = f", step {int(last['step'].iloc[0])}" if "step" in layers.columns else ""
    table = Table(title=f"{path}: ESD tail per weight matrix{step} (power law, Clauset et al.)")
    columns = ["name", "shape", "alpha", "ks_distance", "n_tail"]
    has_reason = bool(last["reason"].astype(bool).any())
    for column in columns + (["reason"] if has_reason else []):
        table.add_column(column, justify="left" if column in ("name", "reason") else "right")
    for row in last.itertuples(index=False):
        cells = [row.name, "x".join(map(str, row.shape)), f"{row.alpha:.3g}"]
        cells += [f"{row.ks_distance:.3g}", str(row.n_tail)]
        table.add_row(*cells, *([row.reason] if has_reason else []))
    print_table(table)
