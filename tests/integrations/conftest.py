"""Fixtures the logger tests share."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest


def _wandb_records(path):
    """Decode a W&B transaction log (``run-*.wandb``): a 7-byte header (``:W&B``, magic,
    version), then LevelDB-log blocks of 32 KiB whose records carry a 7-byte header (crc32,
    length, type: 1 full, 2 first, 3 middle, 4 last); each payload is a ``Record`` protobuf."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B"
    block, pos, chunks, records = 32768, 7, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        chunks += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(chunks)
            records.append(record)
            chunks = b""
    return records


def _wandb_history(records) -> dict[int, dict]:
    """The history records among ``records``: step -> {name: value} (``_step`` included)."""
    history: dict[int, dict] = {}
    for record in records:
        if record.WhichOneof("record_type") == "history":
            items = {
                i.key or "/".join(i.nested_key): json.loads(i.value_json)
                for i in record.history.item
            }
            history[int(items["_step"])] = items
    return history


@pytest.fixture
def wandb_history():
    """:func:`_wandb_history`."""
    return _wandb_history


@pytest.fixture
def wandb_records():
    """:func:`_wandb_records`: the ``Record`` protobufs of an offline W&B run file."""
    return _wandb_records


@pytest.fixture(scope="session")
def mlflow_uri(tmp_path_factory):
    """One SQLite tracking store for the test session (creating its tables takes ~10 s)."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
