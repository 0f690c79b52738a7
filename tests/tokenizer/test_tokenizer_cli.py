"""``python -m tokenizer train``: success, and one clear error (exit 2, nothing written) per bad input."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.errors import run_cli
from tokenizer.__main__ import main


def train_args(files, out, vocab_size=200, *extra):
    return ["train", "--model_type", "bert", "--train_file", *map(str, files), "--vocab_size", str(vocab_size),
            "--output_dir", str(out), *extra]  # fmt: skip


def test_cli_trains_and_saves_a_loadable_tokenizer(tmp_path, corpus_file, capsys):
    from transformers import AutoTokenizer

    gz = tmp_path / "more.txt.gz"
    gz.write_bytes(gzip.compress(b"Zeppelins hovered over the harbour.\n" * 20))
    out = tmp_path / "tok"
    assert run_cli(main, train_args([corpus_file, gz], out, 250)) == 0
    summary = capsys.readouterr().out.strip().splitlines()
    assert len(summary) == 1 and "vocab_size 250" in summary[0] and "2 file(s)" in summary[0] and str(out) in summary[0]
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.is_fast and len(tok) == 250 and "zeppelins" in tok.get_vocab()
    assert tok("The Senate adjourned.", "It rained.")["token_type_ids"][-1] == 1


def test_the_command_parses_into_its_typed_arguments():
    """Each subcommand is one frozen dataclass; options not given stay None (the family's trainer decides)."""
    from tokenizer.__main__ import TokenizerTrainingArguments, WordVectorArguments, parse

    command, args = parse(train_args(["a.txt", "b.txt.gz"], "out", 300, "--no-lowercase"))
    assert command == "train" and args == TokenizerTrainingArguments("bert", ["a.txt", "b.txt.gz"], 300, "out", False)
    assert parse(train_args(["a.txt"], "out", 300, "--lowercase"))[1].lowercase is True
    assert parse(train_args(["a.txt"], "out"))[1].min_frequency is None
    command, vectors = parse(["vectors", "--train_file", "c.txt", "--tokenizer_name", "t", "--output_dir", "o", "--sg"])
    assert command == "vectors" and vectors == WordVectorArguments(["c.txt"], "t", "o", sg=True)
    with pytest.raises(SystemExit) as stop:  # a value of the wrong type: argparse's usage error
        parse(train_args(["a.txt"], "out", "many"))
    assert stop.value.code == 2


def test_cli_no_lowercase(tmp_path, corpus_file):
    out = tmp_path / "cased"
    assert run_cli(main, train_args([corpus_file], out, 200, "--no-lowercase", "--min_frequency", "3")) == 0
    assert json.loads((out / "tokenizer_config.json").read_text())["do_lower_case"] is False
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(out).tokenize("The")[0] == "The"


def _listing(folder: Path) -> dict[str, bytes | None]:
    """Every file (with its bytes) and folder (None) below ``folder``, hidden temporaries included."""
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


BAD_UTF8 = b"The Senate adjourned.\nIt rained on the caf\xe9 terrace.\n"
BAD_OFFSET = BAD_UTF8.index(b"\xe9")  # 0-based byte offset of the byte that is not UTF-8 (line 2)


@pytest.mark.parametrize(
    "case, expected",
    [
        ("missing", ["missing.txt", "no such file"]),
        ("empty", ["empty.txt", "file is empty"]),
        ("empty_gz", ["empty.txt.gz", "file is empty"]),
        ("not_gzip", ["fake.txt.gz", "not a gzip file"]),
        ("directory", ["a_dir", "is a directory"]),
        ("undecodable", ["latin1.txt", "line 2", f"byte offset {BAD_OFFSET}", "0xe9", "expected UTF-8"]),
        ("vocab_too_small", ["--vocab_size 4", "special tokens"]),
        ("vocab_below_alphabet", ["--vocab_size 30", "too small for this corpus", "expected --vocab_size >="]),
        ("min_frequency", ["--min_frequency 0", ">= 1"]),
        ("output_is_file", ["--output_dir", "out_file", "existing file"]),
    ],
)
def test_cli_bad_input_one_clear_error_nothing_written(tmp_path, corpus_file, capsys, case, expected):
    work = tmp_path / "work"
    work.mkdir()
    files = [corpus_file]
    out = work / "out"
    vocab_size, extra = 200, []
    if case == "missing":
        files = [corpus_file, work / "missing.txt"]
    elif case == "empty":
        files = [(work / "empty.txt")]
        files[0].write_bytes(b"")
    elif case == "empty_gz":
        files = [work / "empty.txt.gz"]
        files[0].write_bytes(gzip.compress(b"\n\n  \n"))
    elif case == "not_gzip":
        files = [work / "fake.txt.gz"]
        files[0].write_text("plain text\n")
    elif case == "directory":
        files = [work / "a_dir"]
        files[0].mkdir()
    elif case == "undecodable":
        files = [corpus_file, work / "latin1.txt"]
        files[1].write_bytes(BAD_UTF8)
    elif case == "vocab_too_small":
        vocab_size = 4
    elif case == "vocab_below_alphabet":
        vocab_size = 30
    elif case == "min_frequency":
        extra = ["--min_frequency", "0"]
    elif case == "output_is_file":
        out = work / "out_file"
        out.write_text("keep me")
    before = _listing(work)

    assert run_cli(main, train_args(files, out, vocab_size, *extra)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    for part in expected:
        assert part in err, (part, err)
    assert _listing(work) == before  # output_dir not created / untouched, no temporary folder left


def test_failed_run_leaves_an_existing_tokenizer_untouched(tmp_path, corpus_file, capsys):
    out = tmp_path / "tok"
    assert run_cli(main, train_args([corpus_file], out, 150)) == 0
    before = _listing(out)
    bad = tmp_path / "bad.txt"
    bad.write_bytes(BAD_UTF8)
    assert run_cli(main, train_args([corpus_file, bad], out, 200)) == 2
    assert _listing(out) == before and sorted(p.name for p in tmp_path.iterdir()) == ["bad.txt", "tok"]
    assert "bad.txt" in capsys.readouterr().err


def test_module_entry_point_exit_status_and_debug(tmp_path, monkeypatch, capsys):
    """The real command line: exit 2 and one line without ``--debug``; with it the ``InputError`` itself (the
    traceback); without arguments argparse's usage and exit 2. One process starts (the entry point); the other two
    cases go through the same ``run_cli`` in this process."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("SESAME_DEBUG", None)
    args = train_args([tmp_path / "nope.txt"], tmp_path / "out")
    plain = subprocess.run([sys.executable, "-m", "tokenizer", *args], capture_output=True, text=True, env=env)
    assert plain.returncode == 2 and plain.stdout == ""
    assert plain.stderr.strip().splitlines() == [
        f"error: --train_file {tmp_path / 'nope.txt'}: no such file; expected a .txt or .txt.gz file"
    ]
    from core.errors import InputError

    monkeypatch.delenv("SESAME_DEBUG", raising=False)
    with pytest.raises(InputError, match="no such file"):
        run_cli(main, [*args, "--debug"])
    with pytest.raises(SystemExit) as usage:
        run_cli(main, [])
    assert usage.value.code == 2 and "usage:" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_cli_elmo_branch(tmp_path, corpus_file, capsys):
    pytest.importorskip("tokenizer.elmo_training")
    out = tmp_path / "elmo"
    assert run_cli(main, ["train", "--model_type", "elmo", "--train_file", str(corpus_file), "--vocab_size", "50",
                          "--output_dir", str(out)]) == 0  # fmt: skip
    assert "trained elmo tokenizer: vocab_size 50" in capsys.readouterr().out
    assert (out / "tokenizer_config.json").is_file()
