"""tokenizer.corpus: checks, streaming line reading, strict UTF-8, atomic output folders."""

from __future__ import annotations

import gzip
import tracemalloc
from pathlib import Path

import pytest

from core.errors import InputError
from core.files import atomic_output_dir
from tokenizer.corpus import check_text_files, iter_text_batches, iter_text_lines


def _write(path: Path, data: bytes, gz: bool = False) -> Path:
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def test_lines_plain_gz_and_several_files_in_order(tmp_path):
    a = _write(tmp_path / "a.txt", "\ufeffFirst line.\n\n  second  line \r\n\n".encode())
    b = _write(tmp_path / "b.txt.gz", "Third — é.\n\t\nfourth\n".encode(), gz=True)
    assert check_text_files([a, str(b)]) == [a.resolve(), b.resolve()]
    assert list(iter_text_lines([a, b])) == ["First line.", "second  line", "Third — é.", "fourth"]
    assert list(iter_text_lines(a)) == ["First line.", "second  line"]  # one path, not a list
    upper = _write(tmp_path / "C.TXT.GZ", b"shouted\n", gz=True)  # the suffix is matched case-insensitively
    assert check_text_files([upper]) and list(iter_text_lines([upper])) == ["shouted"]


def test_batches_cover_all_lines_in_order(tmp_path):
    lines = [f"line {i}" for i in range(23)]
    f = _write(tmp_path / "c.txt", ("\n".join(lines) + "\n").encode())
    batches = list(iter_text_batches([f], batch_size=5))
    assert [len(b) for b in batches] == [5, 5, 5, 5, 3]
    assert sum(batches, []) == lines


@pytest.mark.parametrize("gz", [False, True])
def test_streaming_memory_does_not_grow_with_file_size(tmp_path, gz):
    """A ~16 MB corpus is read with a bounded amount of Python memory (far below the file size)."""
    line = ("streaming corpus line with some words " * 3).encode() + b"\n"
    n = (16 << 20) // len(line)
    f = _write(tmp_path / ("big.txt.gz" if gz else "big.txt"), line * n, gz=gz)
    lines = iter_text_lines([f])
    tracemalloc.start()
    try:
        count = sum(1 for _ in lines)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == n
    assert peak < 4 << 20, f"peak {peak} bytes while reading a {len(line) * n}-byte corpus"


def test_iterator_is_lazy(tmp_path):
    """Nothing is opened before the first ``next``; a later file is only opened when reached."""
    a = _write(tmp_path / "a.txt", b"one\ntwo\n")
    missing = tmp_path / "later.txt"
    it = iter_text_lines([a, missing])
    assert next(it) == "one"
    assert next(it) == "two"
    with pytest.raises(InputError, match="later.txt"):
        next(it)


def test_undecodable_byte_reports_line_and_offset(tmp_path):
    data = b"good line\nsecond \xe9t\xe9 line\n"
    for gz in (False, True):
        f = _write(tmp_path / ("bad.txt.gz" if gz else "bad.txt"), data, gz=gz)
        assert check_text_files([f])  # the check reads only the start
        with pytest.raises(InputError) as err:
            list(iter_text_lines([f], arg_name="--train_file"))
        msg = str(err.value)
        assert str(f) in msg and "line 2" in msg and "expected UTF-8" in msg
        offset = data.index(b"\xe9")  # 0-based offset of the first bad byte (line 2)
        assert f"byte offset {offset}" in msg and "0xe9" in msg


# mtime=0: the gzip header holds no clock time, so the test ids are the same in every pytest-xdist worker's collection
@pytest.mark.parametrize(
    "name, content, expected",
    [
        ("empty.txt", b"", "empty"),
        ("blank.txt", b" \n\n\t \r\n", "empty"),
        ("empty.txt.gz", gzip.compress(b"", mtime=0), "empty"),
        ("blank.txt.gz", gzip.compress(b"\n \n\n", mtime=0), "empty"),
        ("fake.txt.gz", b"plain text, not gzip\n", "not a gzip"),
        ("packed.txt", gzip.compress(b"hello\n", mtime=0), "not named .gz"),
        ("corpus.txt.bz2", b"BZh91AY", "unsupported compression"),
        ("truncated.txt.gz", gzip.compress(b"hello world\n" * 100, mtime=0)[:30], "corrupt gzip"),
    ],
)
def test_check_refuses_bad_files(tmp_path, name, content, expected):
    f = _write(tmp_path / name, content)
    with pytest.raises(InputError, match=expected) as err:
        check_text_files([f], arg_name="--train_file")
    assert str(f) in str(err.value) and "--train_file" in str(err.value)


def test_check_refuses_missing_directory_and_nothing(tmp_path):
    with pytest.raises(InputError, match="no such file") as err:
        check_text_files([tmp_path / "nope.txt"], arg_name="--validation_file")
    assert "nope.txt" in str(err.value) and "--validation_file" in str(err.value)
    with pytest.raises(InputError, match="is a directory"):
        check_text_files([tmp_path])
    with pytest.raises(InputError, match="no file given"):
        check_text_files([])


def test_atomic_output_dir_new_folder(tmp_path):
    out = tmp_path / "sub" / "out"
    with atomic_output_dir(out) as tmp:
        assert tmp.parent == out.parent and tmp.is_dir() and not out.exists()
        (tmp / "vocab.txt").write_text("x")
    assert (out / "vocab.txt").read_text() == "x"
    assert sorted(p.name for p in out.parent.iterdir()) == ["out"]  # no temporary left


def test_atomic_output_dir_replaces_same_names_and_keeps_others(tmp_path):
    out = tmp_path / "out"
    (out / "old_sub").mkdir(parents=True)
    (out / "keep.txt").write_text("keep")
    (out / "vocab.txt").write_text("old")
    (out / "old_sub" / "stale").write_text("stale")
    with atomic_output_dir(out) as tmp:
        (tmp / "vocab.txt").write_text("new")
        (tmp / "old_sub").mkdir()
        (tmp / "old_sub" / "fresh").write_text("fresh")
    assert (out / "vocab.txt").read_text() == "new" and (out / "keep.txt").read_text() == "keep"
    assert sorted(p.name for p in (out / "old_sub").iterdir()) == ["fresh"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_atomic_output_dir_leaves_nothing_on_error(tmp_path):
    new = tmp_path / "new"
    with pytest.raises(RuntimeError):
        with atomic_output_dir(new) as tmp:
            (tmp / "half.json").write_text("{")
            raise RuntimeError("boom")
    assert not new.exists() and list(tmp_path.iterdir()) == []

    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "vocab.txt").write_text("old")
    with pytest.raises(KeyboardInterrupt):
        with atomic_output_dir(existing) as tmp:
            (tmp / "vocab.txt").write_text("half")
            raise KeyboardInterrupt
    assert (existing / "vocab.txt").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existing"]


def test_atomic_output_dir_refuses_existing_file(tmp_path):
    f = tmp_path / "out"
    f.write_text("I am a file")
    with pytest.raises(InputError, match="existing file") as err:
        with atomic_output_dir(f, arg_name="--output_dir"):
            pytest.fail("must not enter")
    assert str(f) in str(err.value) and "--output_dir" in str(err.value)
    assert f.read_text() == "I am a file"
    with pytest.raises(InputError, match="parent is an existing file"):
        with atomic_output_dir(f / "below"):
            pass
