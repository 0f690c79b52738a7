"""``--streaming`` on a small file without ``--validation_file`` (issue 49, item 7): a stream holds out its first 200
documents for validation, which left a file of 200 documents or fewer no training document (a ``StopIteration``
traceback); such a file now holds out ``--validation_split_percentage`` % of its documents (at least one) and trains,
and a file of one document is refused with one line."""

from __future__ import annotations

import json
import logging

import pytest
from _launch import corpus_args

from core.errors import InputError, run_cli
from pretrain.cli import main


def _stream(n: int):
    from datasets import IterableDataset

    return IterableDataset.from_generator(lambda: ({"text": f"document {i}"} for i in range(n)))


@pytest.mark.parametrize("n, held", [(2, 1), (40, 2), (200, 10), (201, 200), (1000, 200)])
def test_a_stream_holds_out_200_documents_or_a_share_of_a_short_one(n, held):
    from pretrain.data import STREAMING_VALIDATION_DOCUMENTS, stream_held_out

    assert STREAMING_VALIDATION_DOCUMENTS == 200
    assert stream_held_out(_stream(n), 5, "--train_file t.txt") == held
    assert n - held >= 1  # training keeps at least one document


@pytest.mark.parametrize("n", [0, 1])
def test_a_stream_of_fewer_than_two_documents_is_refused(n):
    from pretrain.data import stream_held_out

    refusal = rf"--streaming: --train_file t.txt holds {n} document\(s\).*--validation_file"
    with pytest.raises(InputError, match=refusal):
        stream_held_out(_stream(n), 5, "--train_file t.txt")


def _argv(corpus_dir, tok, out) -> list[str]:
    """:func:`_launch.corpus_args` of a 2-step streamed run, without its ``--validation_file``."""
    argv = corpus_args(corpus_dir, out, "--streaming", "--max_train_steps", "2", tokenizer=tok)
    at = argv.index("--validation_file")
    return argv[:at] + argv[at + 2 :]


def test_streaming_a_file_of_60_documents_without_a_validation_file_trains(
    corpus_dir, bert_tokenizer, tmp_path, fresh_state, caplog, capsys
):
    tok = tmp_path / "tok"
    bert_tokenizer.save_pretrained(tok)
    documents = (corpus_dir / "train.txt").read_text().strip().split("\n\n")
    assert len(documents) <= 200
    with caplog.at_level(logging.INFO):
        assert run_cli(main, _argv(corpus_dir, tok, tmp_path / "out")) == 0
    assert any(f"holds {len(documents)} documents" in r.getMessage() for r in caplog.records)
    results = json.loads((tmp_path / "out" / "all_results.json").read_text())
    assert results["global_step"] == 2 and results["eval_tokens"] > 0, results

    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "train.txt").write_text(documents[0] + "\n")
    capsys.readouterr()
    assert run_cli(main, _argv(tmp_path / "one", tok, tmp_path / "out-one")) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "holds 1 document(s), too few" in lines[0], lines
