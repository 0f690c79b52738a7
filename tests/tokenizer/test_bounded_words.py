"""Issue 43: WordPiece training is bounded by BERT's max_input_chars_per_word -- a word longer than that never reaches
the trainer (whose merges cost time quadratic in a word's length: 3 MB of one letter took over a minute), a corpus
with no shorter word is refused after one pass, and long passes print plain progress lines."""

from __future__ import annotations

import gzip
import time

import pytest

import tokenizer.wordpiece as wordpiece
from core.errors import InputError
from tokenizer.wordpiece import MAX_INPUT_CHARS_PER_WORD, SPECIAL_TOKENS, train_wordpiece_tokenizer

#: One word of 1 MiB (the corpus reader's longest piece): unbounded, the trainer spent over 20 s on it.
LONG_WORD = "a" * (1 << 20)


def test_a_megabyte_word_is_left_out_and_the_rest_trains_in_seconds(tmp_path):
    corpus = tmp_path / "mixed.txt.gz"
    with gzip.open(corpus, "wt", encoding="utf-8") as f:
        f.write("hello world, hello there\n" + LONG_WORD + "\n" + "b" * (MAX_INPUT_CHARS_PER_WORD + 1) + "\n")
        f.write("c" * MAX_INPUT_CHARS_PER_WORD + "\n")  # at the bound: counted
    start = time.perf_counter()
    tok = train_wordpiece_tokenizer(corpus, vocab_size=60, min_frequency=1)
    assert time.perf_counter() - start < 20
    vocab = tok.get_vocab()
    assert {"hello", "world", "c"} <= set(vocab)
    assert "a" not in vocab and "b" not in vocab  # nothing learnt from words beyond the bound
    # encoding agrees: a word beyond the bound is one [UNK], one at the bound is pieces
    assert tok.tokenize("b" * (MAX_INPUT_CHARS_PER_WORD + 1)) == ["[UNK]"]
    assert "[UNK]" not in tok.tokenize("c" * MAX_INPUT_CHARS_PER_WORD)


def test_a_corpus_of_one_long_word_is_refused_after_one_pass(tmp_path, monkeypatch):
    corpus = tmp_path / "one_word.txt.gz"
    with gzip.open(corpus, "wt", encoding="utf-8") as f:
        f.write(LONG_WORD * 3 + "\n")  # read in three 1 MiB pieces
    passes = []
    real = wordpiece._with_progress_lines
    monkeypatch.setattr(wordpiece, "_with_progress_lines", lambda b, name, **k: passes.append(name) or real(b, name))
    start = time.perf_counter()
    with pytest.raises(InputError) as err:
        train_wordpiece_tokenizer(corpus, vocab_size=100, output_dir=tmp_path / "tok")
    assert time.perf_counter() - start < 20
    assert str(err.value).startswith(f"--train_file {corpus}: no word of at most {MAX_INPUT_CHARS_PER_WORD} characters")
    assert "expected text of words" in str(err.value)
    assert passes == ["alphabet"] and not (tmp_path / "tok").exists()


def test_the_cli_refuses_it_with_one_line_and_exit_2(tmp_path, capsys):
    from core.errors import run_cli
    from tokenizer.__main__ import main

    corpus = tmp_path / "one_word.txt.gz"
    with gzip.open(corpus, "wt", encoding="utf-8") as f:
        f.write("x" * 5000 + "\n")
    out = tmp_path / "tok"
    argv = [
        "train",
        "--model_type",
        "bert",
        "--train_file",
        str(corpus),
        "--vocab_size",
        "100",
        "--output_dir",
        str(out),
    ]
    assert run_cli(main, argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --train_file {corpus}: no word of at most 100 characters"), err
    assert err.count("\n") == 1 and not out.exists()


def test_a_long_pass_prints_plain_progress_lines(tmp_path, monkeypatch, capsys):
    corpus = tmp_path / "small.txt"
    corpus.write_text("the quick brown fox\njumps over the lazy dog\n" * 50)
    monkeypatch.setattr(wordpiece, "PROGRESS_EVERY_S", 0.0)
    tok = train_wordpiece_tokenizer(corpus, vocab_size=80, batch_size=10)
    assert len(tok) > len(SPECIAL_TOKENS)
    err = capsys.readouterr().err
    assert "tokenizer training, alphabet pass:" in err and "tokenizer training, vocabulary pass:" in err
    assert "MB of text read in" in err and "\r" not in err
