"""Refusals for what used to pass silently: a model converted without a tokenizer, an explanation of a
classification head that was never trained, truncated weights in convert and explain, and a tokenizer corpus line
of many megabytes (read in bounded pieces, with a warning)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import torch
from _tiny import tiny_bert_kwargs

from core.errors import run_cli


@pytest.fixture
def bert_source(tmp_path, assets) -> Path:
    """A transformers ``BertForPreTraining`` folder with its WordPiece tokenizer (vocabulary ~120)."""
    from transformers import AutoTokenizer, BertConfig, BertForPreTraining

    tok = AutoTokenizer.from_pretrained(assets / "wordpiece")
    config = BertConfig(**tiny_bert_kwargs(len(tok), 64, width=16, layers=1))
    torch.manual_seed(0)
    path = tmp_path / "hf-bert"
    BertForPreTraining(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _last_error(capsys) -> str:
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_convert_refuses_a_source_without_tokenizer_files_unless_tokenizer_name(bert_source, tmp_path, capsys, assets):
    from modeling.bert.convert import main

    weights_only = tmp_path / "weights-only"
    weights_only.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(bert_source / name, weights_only / name)
    out = tmp_path / "converted"
    assert run_cli(main, ["--source", str(weights_only), "--output_dir", str(out)]) == 2
    err = _last_error(capsys)
    assert err.startswith("error: --source") and "no tokenizer files" in err and "--tokenizer_name" in err, err
    assert not out.exists()
    assert (
        run_cli(
            main,
            ["--source", str(weights_only), "--tokenizer_name", str(assets / "wordpiece"), "--output_dir", str(out)],
        )
        == 0
    )
    from transformers import AutoTokenizer

    assert len(AutoTokenizer.from_pretrained(out)) == len(AutoTokenizer.from_pretrained(assets / "wordpiece"))


def test_convert_refuses_truncated_weights_with_one_line(bert_source, tmp_path, capsys):
    from modeling.bert.convert import main

    weights = bert_source / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    out = tmp_path / "converted"
    assert run_cli(main, ["--source", str(bert_source), "--output_dir", str(out)]) == 2
    err = _last_error(capsys)
    assert err.startswith("error: --source") and "no readable weights" in err and "expected" in err, err
    assert not out.exists()


def test_explain_refuses_a_classification_head_that_was_never_trained(tmp_path, capsys, assets):
    # the saved tiny model of the reliability assets is a sequence classifier: drop its head's weights
    from safetensors.torch import load_file, save_file

    import finetune.explain as ex

    model = tmp_path / "untrained-head"
    shutil.copytree(assets / "tiny-model", model)
    weights = load_file(model / "model.safetensors")
    save_file(
        {k: v for k, v in weights.items() if "classifier" not in k},
        model / "model.safetensors",
        metadata={"format": "pt"},
    )
    out = tmp_path / "explain"
    assert run_cli(ex.main, ["--model_name_or_path", str(model), "--text", "the senate", "--output_dir", str(out)]) == 2
    err = _last_error(capsys)
    assert "classification head is not trained" in err and "classifier" in err, err
    assert not out.exists()
    shutil.copy(assets / "tiny-model" / "model.safetensors", model / "model.safetensors")  # truncated weights
    (model / "model.safetensors").write_bytes((model / "model.safetensors").read_bytes()[:1000])
    assert run_cli(ex.main, ["--model_name_or_path", str(model), "--text", "the senate", "--output_dir", str(out)]) == 2
    err = _last_error(capsys)
    assert err.startswith("error: --model_name_or_path") and "expected" in err, err
    assert not out.exists()


def test_a_very_long_corpus_line_is_read_in_bounded_pieces_cut_at_whitespace(tmp_path, monkeypatch, caplog):
    import tokenizer.corpus as corpus

    monkeypatch.setattr(corpus, "MAX_LINE_BYTES", 64)
    words = [f"w{i:03d}" for i in range(200)]  # 1,000 bytes on one line, then a short line
    (tmp_path / "long.txt").write_text(" ".join(words) + "\nshort line\n")
    caplog.set_level(logging.WARNING)
    pieces = list(corpus.iter_text_lines([tmp_path / "long.txt"]))
    assert pieces[-1] == "short line" and len(pieces) > 10
    assert all(len(p.encode()) <= 64 for p in pieces)
    assert " ".join(pieces[:-1]).split() == words  # cut between words, nothing lost
    assert "longer than 64 bytes" in caplog.text
