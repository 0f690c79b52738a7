"""The unigram plateau (training.unigram): the loss of word frequencies alone, by hand; ``pretrain`` logs it in the
plan, writes it to ``all_results.json`` and warns when a run ends on it (issue 32: a model on the plateau fine-tunes
to the majority class)."""

from __future__ import annotations

import gzip
import json
import logging
import math

import numpy as np
import pytest
from datasets import Dataset

from core.errors import run_cli
from pretrain.cli import main
from training.unigram import (
    PLATEAU_MARGIN,
    heldout_unigram_loss,
    log_unigram_bias,
    plateau_message,
    token_counts,
    unigram_loss,
)


class _Tok:
    """What :func:`heldout_unigram_loss` reads of a tokenizer."""

    all_special_ids = [0, 1]

    def __len__(self):
        return 6


def test_unigram_loss_by_hand():
    # ids 0, 1 special; training counts of ids 2..5: 3, 1, 0, 0 -> add-one: 4, 2, 1, 1 out of 8
    counts = token_counts([[0, 2, 2, 3, 1], [0, 2, 1]], vocab_size=6, special_ids=[0, 1])
    assert counts.tolist() == [0, 0, 3, 1, 0, 0]
    loss = unigram_loss(counts, [2, 3, 4, -100], special_ids=[0, 1])
    # -(ln 4/8 + ln 2/8 + ln 1/8) / 3 = (ln 2 + ln 4 + ln 8) / 3 = 2 ln 2
    assert loss == pytest.approx(2 * math.log(2), abs=1e-12)
    with pytest.raises(ValueError, match="no label to score"):
        unigram_loss(counts, [-100, -100], special_ids=[0, 1])


def test_heldout_unigram_loss_by_hand_and_sampled():
    train = Dataset.from_dict({"input_ids": [[0, 2, 2, 3, 1], [0, 2, 1, 1, 1]]})
    valid = Dataset.from_dict({"input_ids": [[0, 2, 3, 4, 1]]})  # non-special 2, 3, 4: as by hand above
    assert heldout_unigram_loss(train, valid, _Tok()) == pytest.approx(2 * math.log(2), abs=1e-12)
    # a cap of 5 tokens counts one block of 5: the first and the last of the evenly spaced picks is the first
    one = heldout_unigram_loss(train, valid, _Tok(), max_tokens=5)
    only_first = unigram_loss(token_counts([[0, 2, 2, 3, 1]], 6, [0, 1]), [2, 3, 4], [0, 1])
    assert one == pytest.approx(only_first, abs=1e-12) and one != pytest.approx(2 * math.log(2))
    assert heldout_unigram_loss(train, Dataset.from_dict({"input_ids": [[0, 1]]}), _Tok()) is None


def test_plateau_message_margin():
    assert plateau_message(7.0 - PLATEAU_MARGIN - 1e-6, 7.0) is None
    for loss in (7.0 - PLATEAU_MARGIN, 7.0, 7.5):
        message = plateau_message(loss, 7.0)
        assert f"held-out loss {loss:.3f} against 7.000" in message and "majority class" in message


def _tokens(tokenizer, path) -> np.ndarray:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        lines = [line for line in f.read().splitlines() if line.strip()]
    return np.concatenate([tokenizer(line, add_special_tokens=False)["input_ids"] for line in lines])


def test_pretrain_logs_records_and_warns_on_the_plateau(corpus_dir, bert_tokenizer, tmp_path, fresh_state, caplog):
    """Random words have no context to learn: a 3-step run ends on the plateau and says so; ``all_results.json``
    holds the unigram loss, equal to one computed here from the tokenised files."""
    tok, out = tmp_path / "tok", tmp_path / "run"
    bert_tokenizer.save_pretrained(tok)
    argv = ["--train_file", str(corpus_dir / "train.txt"), "--validation_file", str(corpus_dir / "valid.txt.gz")]
    argv += ["--tokenizer_name", str(tok), "--config_name", "bert-tiny", "--max_seq_length", "32"]
    argv += ["--per_device_train_batch_size", "8", "--max_train_steps", "3", "--output_dir", str(out)]
    with caplog.at_level(logging.INFO):
        assert run_cli(main, argv) == 0
    special = bert_tokenizer.all_special_ids
    counts = token_counts([_tokens(bert_tokenizer, corpus_dir / "train.txt")], len(bert_tokenizer), special)
    expected = unigram_loss(counts, _tokens(bert_tokenizer, corpus_dir / "valid.txt.gz"), special)
    results = json.loads((out / "all_results.json").read_text())
    assert results["unigram_loss"] == pytest.approx(expected, rel=1e-9)
    assert f"unigram plateau: held-out loss {expected:.3f}" in caplog.text
    assert "the model has not left the unigram plateau" in caplog.text
    assert results["eval_loss"] > expected - PLATEAU_MARGIN
    # issue 43: the last line says to train on, not to fine-tune a model on the plateau
    last = [r.getMessage() for r in caplog.records][-1]
    assert last.startswith("next: train it longer before fine-tuning") and "finetune.glue" not in last, last


def test_fine_tuning_warns_about_a_backbone_on_the_plateau(tmp_path):
    from training.unigram import backbone_plateau_message

    folder = tmp_path / "bert-mini"
    folder.mkdir()
    assert backbone_plateau_message(folder) is None  # no all_results.json
    (folder / "all_results.json").write_text(json.dumps({"eval_loss": 7.089, "unigram_loss": 7.05}))
    message = backbone_plateau_message(folder)
    assert message.startswith(f"{folder} ended its pretraining on the unigram plateau (held-out loss 7.089 against")
    (folder / "all_results.json").write_text(json.dumps({"eval_loss": 6.5, "unigram_loss": 7.05}))
    assert backbone_plateau_message(folder) is None  # 0.55 nats below: off the plateau
    (folder / "all_results.json").write_text(json.dumps({"eval_loss": 0.69, "eval_accuracy": 0.5}))
    assert backbone_plateau_message(folder) is None  # a fine-tuned folder: no unigram loss
    (folder / "all_results.json").write_text("{not json")
    assert backbone_plateau_message(folder) is None
    assert backbone_plateau_message("google-bert/bert-base-uncased") is None  # a hub id


def test_log_unigram_bias_is_the_add_one_distribution():
    counts = token_counts([[0, 2, 2, 3, 1], [0, 2, 1]], vocab_size=6, special_ids=[0, 1])  # 0 0 3 1 0 0
    bias = log_unigram_bias(counts, size=8)
    p = np.exp(bias) / np.exp(bias).sum()
    # add-one over 8 ids (two past the counts): 1 1 4 2 1 1 1 1 out of 12
    assert p == pytest.approx(np.array([1, 1, 4, 2, 1, 1, 1, 1]) / 12, abs=1e-12)
    assert bias[:6].mean() == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="size 5 < 6 counts"):
        log_unigram_bias(counts, size=5)


def _step0_loss(out) -> float:
    history = json.loads((out / "eval_history.json").read_text())
    rows = history if isinstance(history, list) else history["history"]
    return next(r["eval_loss"] for r in rows if r["step"] == 0)


@pytest.mark.parametrize("init", ["unigram", "zeros"])
def test_a_fresh_model_starts_on_the_unigram_plateau(init, corpus_dir, bert_tokenizer, tmp_path, fresh_state):
    """With ``--output_bias_init unigram`` (the default) the untrained model's held-out loss is the unigram loss (the
    random decoder weights add little); with ``zeros`` (BERT's) it starts near ln V, far above."""
    tok, out = tmp_path / "tok", tmp_path / "run"
    bert_tokenizer.save_pretrained(tok)
    argv = ["--train_file", str(corpus_dir / "train.txt"), "--validation_file", str(corpus_dir / "valid.txt.gz")]
    argv += ["--tokenizer_name", str(tok), "--config_name", "bert-tiny", "--max_seq_length", "32", "--seed", "3"]
    argv += ["--per_device_train_batch_size", "8", "--max_train_steps", "1", "--output_dir", str(out)]
    argv += ["--output_bias_init", init, "--mlm_probability", "0.5"]
    assert run_cli(main, argv) == 0
    unigram = json.loads((out / "all_results.json").read_text())["unigram_loss"]
    start = _step0_loss(out)
    if init == "unigram":
        assert start == pytest.approx(unigram, abs=0.15)
    else:
        assert start > unigram + 0.5 and start == pytest.approx(math.log(len(bert_tokenizer)), abs=0.3)


def test_streaming_starts_the_output_bias_from_the_first_streamed_tokens(
    corpus_dir, bert_tokenizer, tmp_path, fresh_state
):
    """Issue 43: with ``--streaming``, ``--output_bias_init unigram`` (the default) used to be ignored without a word
    (BERT's zero bias, no plateau check); now the counts come from the stream's first tokens, so the model starts
    on the plateau and the run records the unigram loss as without streaming."""
    tok, out = tmp_path / "tok", tmp_path / "run"
    bert_tokenizer.save_pretrained(tok)
    argv = ["--train_file", str(corpus_dir / "train.txt"), "--validation_file", str(corpus_dir / "valid.txt.gz")]
    argv += ["--tokenizer_name", str(tok), "--config_name", "bert-tiny", "--max_seq_length", "32", "--seed", "3"]
    argv += ["--per_device_train_batch_size", "8", "--max_train_steps", "1", "--output_dir", str(out)]
    argv += ["--mlm_probability", "0.5", "--streaming"]
    assert run_cli(main, argv) == 0
    unigram = json.loads((out / "all_results.json").read_text())["unigram_loss"]
    assert _step0_loss(out) == pytest.approx(unigram, abs=0.15)


def test_streamed_token_counts_stop_at_the_cap_and_leave_the_stream_at_its_start(bert_tokenizer):
    from datasets import IterableDataset

    from training.unigram import streamed_token_counts

    ids = [i for i in range(len(bert_tokenizer)) if i not in bert_tokenizer.all_special_ids][:2]
    cls, sep = bert_tokenizer.cls_token_id, bert_tokenizer.sep_token_id
    stream = IterableDataset.from_generator(
        lambda: ({"input_ids": [cls, ids[i % 2], ids[i % 2], sep]} for i in range(50))
    )
    counts = streamed_token_counts(stream, bert_tokenizer, max_tokens=8)  # two blocks of 4 tokens
    assert counts[ids[0]] == 2 and counts[ids[1]] == 2 and counts.sum() == 4  # specials not counted
    assert next(iter(stream))["input_ids"][1] == ids[0]
    assert streamed_token_counts(IterableDataset.from_generator(lambda: iter(())), bert_tokenizer) is None
