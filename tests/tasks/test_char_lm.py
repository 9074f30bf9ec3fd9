"""CharLM: corpus reading, the file-hash split, windows, errors, and the default corpus."""

import hashlib
import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dynascope.tasks import CharLM


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def is_val_oracle(rel: str, val_fraction: float) -> bool:
    digest = hashlib.sha1(rel.encode()).digest()
    return int.from_bytes(digest[:8], "big") % 10_000 < val_fraction * 10_000


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """40 small files in nested folders, plus files that must be ignored."""
    for i in range(40):
        folder = tmp_path / f"pkg{i % 3}" / ("sub" if i % 2 else "")
        folder.mkdir(parents=True, exist_ok=True)
        suffix = [".py", ".txt", ".md", ".rst"][i % 4]
        (folder / f"file{i:02d}{suffix}").write_text(f"# file {i}\n" + f"line {i} ü\n" * 10)
    (tmp_path / "image.png").write_bytes(b"\x89PNG ignored")
    (tmp_path / "pkg0" / "empty.py").write_text("")
    return tmp_path


def expected_split(root: Path, val_fraction: float) -> tuple[bytes, bytes, list[str], list[str]]:
    files = sorted(
        (p.relative_to(root).as_posix(), p.read_bytes())
        for p in root.rglob("*")
        if p.suffix in {".py", ".txt", ".md", ".rst"} and p.stat().st_size > 0
    )
    train = [(r, b) for r, b in files if not is_val_oracle(r, val_fraction)]
    val = [(r, b) for r, b in files if is_val_oracle(r, val_fraction)]
    return (
        b"".join(b for _, b in train),
        b"".join(b for _, b in val),
        [r for r, _ in train],
        [r for r, _ in val],
    )


def test_folder_split_by_file_hash_matches_oracle(corpus: Path) -> None:
    task = CharLM(path=str(corpus), n_ctx=8, val_fraction=0.2)
    train, val, train_files, val_files = expected_split(corpus, 0.2)
    assert task.split_mode == "file"
    assert list(task.train_files) == train_files and list(task.val_files) == val_files
    assert train_files and val_files and not set(train_files) & set(val_files)
    assert bytes(task.train_data.tolist()) == train
    assert bytes(task.val_data.tolist()) == val
    assert task.train_data.dtype == torch.uint8
    assert "image.png" not in train_files + val_files


def test_split_is_stable_when_files_move_together(corpus: Path, tmp_path_factory) -> None:
    # The split depends on paths relative to the root only, not on where the root lives.
    copy = tmp_path_factory.mktemp("elsewhere") / "corpus"
    for p in sorted(corpus.rglob("*")):
        if p.is_file():
            (copy / p.relative_to(corpus)).parent.mkdir(parents=True, exist_ok=True)
            (copy / p.relative_to(corpus)).write_bytes(p.read_bytes())
    a, b = CharLM(path=corpus, n_ctx=8), CharLM(path=copy, n_ctx=8)
    assert a.val_files == b.val_files and a.train_files == b.train_files
    torch.testing.assert_close(a.val_data, b.val_data, rtol=0, atol=0)


def test_windows_are_contiguous_text_of_the_split(corpus: Path) -> None:
    task = CharLM(path=corpus, n_ctx=9, val_fraction=0.2)
    for split, data in (("train", task.train_data), ("val", task.val_data)):
        batch = task.batch(split, 6, gen(0))
        x, y = batch["x"], batch["y"]
        assert x.shape == y.shape == (6, 9) and x.dtype == y.dtype == torch.long
        torch.testing.assert_close(x[:, 1:], y[:, :-1])
        text = bytes(data.tolist())
        for row_x, row_y in zip(x.tolist(), y.tolist(), strict=True):
            assert bytes(row_x + row_y[-1:]) in text


def test_windows_reach_both_ends_of_the_split() -> None:
    task = CharLM(text="abcdefghij", n_ctx=2, val_fraction=0.3)  # train "abcdefg"
    x = task.batch("train", 500, gen(0))["x"]
    firsts = set(bytes(row).decode() for row in x.tolist())
    assert firsts == {"ab", "bc", "cd", "de", "ef"}


def test_inline_text_splits_bytes_at_one_minus_val_fraction() -> None:
    text = "héllo wörld, " * 10  # non-ASCII: bytes, not characters
    task = CharLM(text=text, n_ctx=4, val_fraction=0.25)
    data = text.encode("utf-8")
    cut = math.floor(0.75 * len(data))
    assert task.split_mode == "bytes" and task.root is None
    assert bytes(task.train_data.tolist()) == data[:cut]
    assert bytes(task.val_data.tolist()) == data[cut:]
    assert task.train_files == task.val_files == ()


def test_single_file_falls_back_to_byte_split(tmp_path: Path) -> None:
    file = tmp_path / "notes.bin"  # any suffix is read when the path is a file
    file.write_bytes(bytes(range(256)) * 2)
    task = CharLM(path=file, n_ctx=16, val_fraction=0.5)
    assert task.split_mode == "bytes" and task.train_files == ("notes.bin",)
    assert bytes(task.train_data.tolist()) == bytes(range(256))
    assert bytes(task.val_data.tolist()) == bytes(range(256))


def test_max_bytes_takes_files_in_sorted_order(corpus: Path) -> None:
    full = CharLM(path=corpus, n_ctx=4, val_fraction=0.5)
    capped = CharLM(path=corpus, n_ctx=4, val_fraction=0.5, max_bytes=400)
    assert capped.train_data.numel() + capped.val_data.numel() == 400
    files = sorted(set(full.train_files + full.val_files))
    read = sorted(set(capped.train_files + capped.val_files))
    assert 0 < len(read) < len(files)
    assert read == files[: len(read)]


def test_loss_and_accuracy_cover_every_position() -> None:
    task = CharLM(text="ab" * 30, n_ctx=5)
    batch = task.batch("train", 3, gen(0))
    output = torch.zeros(3, 5, 256)
    torch.testing.assert_close(task.loss(output, batch), torch.tensor(math.log(256.0)))
    output.scatter_(2, batch["y"][..., None], 30.0)
    output[0, 2] = 0.0
    output[0, 2, 0] = 30.0  # one wrong position out of 15
    torch.testing.assert_close(task.metrics(output, batch)["accuracy"], torch.tensor(14 / 15))


def test_default_corpus_is_the_standard_library() -> None:
    task = CharLM()
    assert task.split_mode == "file"
    assert task.train_data.numel() > 1_000_000 and task.val_data.numel() > 100_000
    assert all(rel.endswith(".py") for rel in task.train_files + task.val_files)
    assert not any("site-packages" in rel for rel in task.train_files + task.val_files)
    assert "os.py" in task.train_files + task.val_files
    assert task.batch("val", 2, gen(0))["x"].shape == (2, 64)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_ctx": 0, "text": "abc"}, r"n_ctx must be an int >= 1 \(got n_ctx=0\)"),
        ({"val_fraction": 0.0}, r"val_fraction must be in \(0, 1\) \(got val_fraction=0.0\)"),
        ({"val_fraction": 1}, r"val_fraction must be in \(0, 1\) \(got val_fraction=1\)"),
        ({"max_bytes": 0}, r"max_bytes must be an int >= 1 \(got max_bytes=0\)"),
        ({"text": ""}, r"task.text must be a non-empty str \(got text=''\)"),
        ({"text": "abc", "path": "x"}, r"task.path and task.text are exclusive"),
        (
            {"text": "abcdefghij", "n_ctx": 3},
            r"n_ctx must be < the bytes in each split \(got n_ctx=3, train bytes=9, val bytes=1",
        ),
    ],
)
def test_bad_arguments_raise(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CharLM(**kwargs)


def test_missing_path_and_empty_folder_raise(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(ValueError, match=r"^task.path: no such file or directory: '.*nope'$"):
        CharLM(path=missing)
    (tmp_path / "only.png").write_bytes(b"png")
    with pytest.raises(ValueError, match=r"task.path: no text found in '.*'"):
        CharLM(path=tmp_path)


@settings(max_examples=25, deadline=None)
@given(
    text=st.text(min_size=1, max_size=200),
    n_ctx=st.integers(1, 20),
    val_fraction=st.floats(0.05, 0.95),
)
def test_any_text_either_loads_or_names_n_ctx(text, n_ctx, val_fraction) -> None:
    n = len(text.encode("utf-8"))
    cut = math.floor((1 - val_fraction) * n)
    if min(cut, n - cut) < n_ctx + 1:
        with pytest.raises(ValueError, match=r"n_ctx must be < the bytes in each split"):
            CharLM(text=text, n_ctx=n_ctx, val_fraction=val_fraction)
        return
    task = CharLM(text=text, n_ctx=n_ctx, val_fraction=val_fraction)
    batch = task.batch("val", 2, gen(0))
    assert batch["x"].shape == (2, n_ctx) and int(batch["x"].max()) < 256
