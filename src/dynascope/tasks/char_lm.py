"""Byte-level language modelling on local text: predict the next byte.

"Char" means byte: text is read as raw bytes (UTF-8 for ``text=``), so a non-ASCII character
spans several positions and every file is usable whatever its encoding.

Glossary:
    d_vocab     ``= d_out = 256``, one token per byte value.
    n_ctx       positions per sequence; a window of ``n_ctx + 1`` bytes gives x and y.
    root        the folder (or file) the corpus was read from; ``None`` for inline ``text``.
    rel         a file's path relative to root, POSIX form (``"json/decoder.py"``).

Encoding (one sequence)::

    w = corpus[start : start + n_ctx + 1]     # contiguous bytes of one split
    x = w[:-1]                                # [n_ctx] int64 in 0..255
    y = w[1:]                                 # [n_ctx] int64, next byte at every position

``start`` is uniform over all valid offsets of the split (drawn with ``torch.randint``; one
draw per batch). Within a split, files are concatenated in sorted order of ``rel`` with
nothing in between, so a window may span a file boundary.

Corpus (read once, in ``__init__``, stored as uint8 tensors):
    * ``text=...``: the UTF-8 bytes of the string.
    * ``path=`` a file: its bytes.
    * ``path=`` a folder: every file below it (recursive) whose suffix is one of
      ``.py .txt .md .rst``, sorted by ``rel``.
    * neither: the running Python's standard-library ``.py`` sources
      (``sysconfig.get_paths()["stdlib"]``, recursive, sorted; ``site-packages``,
      ``dist-packages`` and ``__pycache__`` folders skipped). About 30 MB for CPython 3.11,
      read in well under a second from a warm disk cache.
    ``max_bytes`` caps the total: files are taken in sorted order and the last one is cut.

Split (stable across machines, depends only on ``rel`` and ``val_fraction``): a file goes to
validation iff ``int.from_bytes(sha1(rel).digest()[:8], "big") % 10_000 <
val_fraction * 10_000``. If that leaves either split empty (a single file, inline ``text``,
or a few files that all hash to one side), the concatenated bytes are split instead at
``floor((1 - val_fraction) * n_bytes)``: train is the head, validation the tail.
``split_mode`` records which rule applied (``"file"`` or ``"bytes"``).

Loss: cross-entropy over all positions, in nats per byte (divide by ln 2 for bits per byte).
Metric ``accuracy``: fraction of positions whose argmax is the next byte.
"""

from __future__ import annotations

import hashlib
import math
import os
import sysconfig
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from .base import Split, Task, _check_int

FOLDER_SUFFIXES: tuple[str, ...] = (".py", ".txt", ".md", ".rst")
STDLIB_SUFFIXES: tuple[str, ...] = (".py",)
_SKIPPED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})


def _is_val(rel: str, val_fraction: float) -> bool:
    """The file-level split rule: sha1 of the POSIX relative path, first 8 bytes, mod 10_000."""
    h = int.from_bytes(hashlib.sha1(rel.encode("utf-8")).digest()[:8], "big")
    return h % 10_000 < val_fraction * 10_000


def _list_files(root: Path, suffixes: tuple[str, ...]) -> list[tuple[str, Path]]:
    """``(rel, path)`` of files below ``root`` with one of ``suffixes``, sorted by ``rel``.

    Uses ``os.walk`` (pruning skipped folders before descending) rather than ``Path.rglob``,
    which would walk all of ``site-packages`` first.
    """
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _SKIPPED_DIRS]
        for name in filenames:
            if name.endswith(suffixes):
                path = Path(dirpath, name)
                found.append((path.relative_to(root).as_posix(), path))
    return sorted(found)


def check_corpus_path(path: str | os.PathLike[str]) -> None:
    """Check that a ``path=`` corpus exists and holds text, without reading it.

    Args:
        path: a file, or a folder searched recursively for ``FOLDER_SUFFIXES``.
    Raises:
        ValueError: one line, without a field prefix: the path does not exist, is neither a
            file nor a folder, is an empty file, or is a folder with no non-empty text file.
    """
    root = Path(path)
    if root.is_file():
        if root.stat().st_size == 0:
            raise ValueError(f"no text found in '{root}' (an empty file)")
    elif root.is_dir():
        if not any(file.stat().st_size > 0 for _, file in _list_files(root, FOLDER_SUFFIXES)):
            raise ValueError(
                f"no text found in '{root}' (no non-empty file with suffix "
                f"{' '.join(FOLDER_SUFFIXES)} below it)"
            )
    elif root.exists():
        raise ValueError(f"not a regular file or folder: '{root}'")
    else:
        raise ValueError(f"no such file or directory: '{root}'")


class CharLM(Task):
    """Next-byte prediction on a local corpus (default: the Python standard library).

    Args:
        path: a text file or a folder; ``None`` (with ``text=None``) for the stdlib sources.
        text: inline text instead of ``path`` (encoded as UTF-8).
        n_ctx: sequence length, ``>= 1``; each split must hold at least ``n_ctx + 1`` bytes.
        val_fraction: fraction of files (or bytes) held out for validation, in ``(0, 1)``.
        max_bytes: cap on the total bytes read, ``>= 1``, or ``None`` for no cap.
    Attributes:
        train_data, val_data: ``[n_bytes]`` uint8 tensors (CPU) of each split.
        train_files, val_files: ``rel`` of the files in each split; with
            ``split_mode == "bytes"`` both list every file read (empty for ``text``).
        split_mode: ``"file"`` (hash of each file's path) or ``"bytes"`` (fallback).
        root: the folder or file read, or ``None`` for ``text``.
    Raises:
        ValueError: if both ``path`` and ``text`` are given; ``path`` does not exist; no text
            is found; ``n_ctx``, ``val_fraction`` or ``max_bytes`` is out of range; or a split
            holds fewer than ``n_ctx + 1`` bytes.
    """

    input_kind = "tokens"
    d_vocab = 256
    d_out = 256
    d_in = None

    def __init__(
        self,
        *,
        path: str | os.PathLike[str] | None = None,
        text: str | None = None,
        n_ctx: int = 64,
        val_fraction: float = 0.1,
        max_bytes: int | None = None,
    ) -> None:
        _check_int("n_ctx", n_ctx, 1)
        if (
            isinstance(val_fraction, bool)
            or not isinstance(val_fraction, (int, float))
            or not 0 < val_fraction < 1
        ):
            raise ValueError(f"val_fraction must be in (0, 1) (got val_fraction={val_fraction!r})")
        if max_bytes is not None:
            _check_int("max_bytes", max_bytes, 1)
        if path is not None and text is not None:
            raise ValueError("task.path and task.text are exclusive (got both; pass one)")
        self.n_ctx = n_ctx
        self.val_fraction = float(val_fraction)
        self.max_bytes = max_bytes

        files = self._read_corpus(path, text)
        train = [(rel, data) for rel, data in files if not _is_val(rel, self.val_fraction)]
        val = [(rel, data) for rel, data in files if _is_val(rel, self.val_fraction)]
        self.split_mode: Literal["file", "bytes"]
        if text is None and train and val:
            self.split_mode = "file"
            self.train_files = tuple(rel for rel, _ in train)
            self.val_files = tuple(rel for rel, _ in val)
            train_bytes = b"".join(data for _, data in train)
            val_bytes = b"".join(data for _, data in val)
        else:
            self.split_mode = "bytes"
            self.train_files = self.val_files = tuple(rel for rel, _ in files if text is None)
            corpus = b"".join(data for _, data in files)
            cut = math.floor((1 - self.val_fraction) * len(corpus))
            train_bytes, val_bytes = corpus[:cut], corpus[cut:]
        if min(len(train_bytes), len(val_bytes)) < n_ctx + 1:
            raise ValueError(
                f"n_ctx must be < the bytes in each split (got n_ctx={n_ctx}, "
                f"train bytes={len(train_bytes)}, val bytes={len(val_bytes)}, "
                f"split_mode={self.split_mode!r})"
            )
        # bytearray: a writable buffer, so torch.frombuffer copies nothing and warns nothing.
        self.train_data = torch.frombuffer(bytearray(train_bytes), dtype=torch.uint8)
        self.val_data = torch.frombuffer(bytearray(val_bytes), dtype=torch.uint8)

    def _read_corpus(
        self, path: str | os.PathLike[str] | None, text: str | None
    ) -> list[tuple[str, bytes]]:
        """``(rel, bytes)`` per file in sorted order, total capped at ``max_bytes``."""
        if text is not None:
            if not isinstance(text, str) or not text:
                raise ValueError(f"task.text must be a non-empty str (got text={text!r:.40})")
            self.root = None
            data = text.encode("utf-8")
            return [("<text>", data[: self.max_bytes])]
        if path is None:
            root = Path(sysconfig.get_paths()["stdlib"])
            listed = _list_files(root, STDLIB_SUFFIXES)
            suffixes = STDLIB_SUFFIXES
        else:
            try:
                check_corpus_path(path)
            except ValueError as err:
                raise ValueError(f"task.path: {err}") from None
            root = Path(path)
            if root.is_file():
                listed = [(root.name, root)]
            else:
                listed = _list_files(root, FOLDER_SUFFIXES)
            suffixes = FOLDER_SUFFIXES
        self.root = root
        files, total = [], 0
        for rel, file in listed:
            budget = None if self.max_bytes is None else self.max_bytes - total
            if budget is not None and budget <= 0:
                break
            with open(file, "rb") as f:
                data = f.read() if budget is None else f.read(budget)
            if data:
                files.append((rel, data))
                total += len(data)
        if total == 0:
            raise ValueError(
                f"task.path: no text found in '{root}' (no non-empty file; folders are "
                f"searched recursively for suffixes {' '.join(suffixes)})"
            )
        return files

    def batch(self, split: Split, batch_size: int, generator: torch.Generator) -> dict[str, Tensor]:
        """Random windows of the requested split.

        Returns:
            ``x``, ``y``: ``[batch, n_ctx]`` int64 byte values on ``generator.device``;
            ``y[:, t] == x[:, t + 1]`` for ``t < n_ctx - 1``.
        """
        self._check_batch_args(split, batch_size)
        data = self.train_data if split == "train" else self.val_data
        device = generator.device
        starts = torch.randint(
            0, data.numel() - self.n_ctx, (batch_size, 1), generator=generator, device=device
        )  # [batch, 1]
        index = starts + torch.arange(self.n_ctx + 1, device=device)  # [batch, n_ctx + 1]
        windows = data[index.to(data.device)].to(device=device, dtype=torch.long)
        return {"x": windows[:, :-1], "y": windows[:, 1:]}

    def loss(self, output: Tensor, batch: dict[str, Tensor]) -> Tensor:
        """Cross-entropy over all positions, nats per byte.

        Raises:
            ValueError: if ``output`` is not ``[batch, n_ctx, 256]``.
        """
        self._check_output(output, batch)
        return F.cross_entropy(output.reshape(-1, self.d_out), batch["y"].reshape(-1))

    def metrics(self, output: Tensor, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """``{"accuracy": ...}``: fraction of positions whose argmax is the next byte."""
        self._check_output(output, batch)
        hit = output.detach().argmax(dim=-1) == batch["y"]
        return {"accuracy": hit.float().mean()}
