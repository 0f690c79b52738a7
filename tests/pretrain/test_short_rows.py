"""Mixing lengths within a phase (issue 52 item 4): ``--short_seq_length L --short_seq_probability P`` cuts a share
of the training batches into rows of L tokens (:class:`pretrain.collators.ShortRows`)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from _launch import checkpoint_args, corpus_args

from core.errors import InputError, run_cli
from pretrain.cli import main, parse
from pretrain.collators import MLMCollator, RTDCollator, ShortRows


def _blocks(tokenizer, n=4, length=32, short_last=0):
    """``n`` packed blocks of ``length`` tokens (two documents each, ``position_ids`` restarting), the last one
    ``short_last`` tokens shorter (padding)."""
    g = torch.Generator().manual_seed(5)
    examples = []
    for i in range(n):
        size = length - (short_last if i == n - 1 else 0)
        ids = torch.randint(5, len(tokenizer), (size,), generator=g).tolist()
        cut = size // 3
        ids[0], ids[cut - 1], ids[cut], ids[size - 1] = (tokenizer.cls_token_id, tokenizer.sep_token_id) * 2
        positions = [*range(cut), *range(size - cut)]
        examples.append({"input_ids": ids, "word_start": [1] * size, "position_ids": positions, "index": 10 + i})
    return examples


def test_a_cut_batch_is_the_same_batch_in_shorter_rows(bert_tokenizer):
    """Probability 1: every tensor of the wrapped collator's batch, reshaped (B, T) -> (B T / L, L), nothing else
    (the same masks, labels and positions); probability 0: the batch unchanged. RTD's sampling numbers too."""
    examples = _blocks(bert_tokenizer)
    for inner in (MLMCollator(bert_tokenizer, 0.3, seed=3), RTDCollator(MLMCollator(bert_tokenizer, 0.3, seed=3))):
        plain = inner(examples)
        cut = ShortRows(inner, 8, 1.0, seed=3)(examples)
        assert set(cut) == set(plain) and "attention_mask" not in cut
        for key, value in plain.items():
            assert cut[key].shape == (16, 8), key
            assert torch.equal(cut[key], value.reshape(16, 8)), key
        kept = ShortRows(inner, 8, 0.0, seed=3)(examples)
        assert all(torch.equal(kept[k], plain[k]) for k in plain) and kept.keys() == plain.keys()


def test_rows_of_padding_only_are_dropped(bert_tokenizer):
    """A last block 20 tokens short: of its four rows of 8, the last two are padding only and go; the row that is
    half padding keeps its attention_mask (and the mask stays); without a padded row left, no mask."""
    collator = MLMCollator(bert_tokenizer, 0.3, seed=3)
    examples = _blocks(bert_tokenizer, short_last=20)
    plain = collator(examples)
    cut = ShortRows(collator, 8, 1.0, seed=3)(examples)
    assert cut["input_ids"].shape == (14, 8)
    assert torch.equal(cut["input_ids"], plain["input_ids"].reshape(16, 8)[:14])
    assert cut["attention_mask"][:13].all() and cut["attention_mask"][13].tolist() == [1] * 4 + [0] * 4
    full = ShortRows(collator, 4, 1.0, seed=3)(_blocks(bert_tokenizer, short_last=24))
    assert "attention_mask" not in full and full["input_ids"].shape == (26, 4)


def test_which_batches_are_cut_is_a_seeded_draw_per_batch(bert_tokenizer):
    """The share of cut batches follows the probability (400 batches, within 4 binomial standard deviations); the
    same examples in the same epoch are cut alike (a resume, another worker), another epoch draws anew."""
    collator = MLMCollator(bert_tokenizer, 0.3, seed=3)
    short = ShortRows(collator, 8, 0.3, seed=11)
    batches = [[{"index": i * 4 + j} for j in range(4)] for i in range(400)]
    draws = [short.cut(b) for b in batches]
    assert abs(sum(draws) - 120) < 4 * (400 * 0.3 * 0.7) ** 0.5
    assert draws == [ShortRows(collator, 8, 0.3, seed=11).cut(b) for b in batches]
    short.set_epoch(1)
    assert [short.cut(b) for b in batches] != draws
    assert collator.epoch == 1  # passed on: new masks every epoch


def test_a_batch_that_is_not_per_token_is_refused(bert_tokenizer):
    nsp = ShortRows(lambda examples: {"input_ids": torch.zeros(2, 8), "next_sentence_label": torch.zeros(2)}, 4, 1, 0)
    with pytest.raises(ValueError, match="next_sentence_label is not per token"):
        nsp([{"index": 0}])
    with pytest.raises(ValueError, match="short rows of 3 tokens: blocks of 8 tokens"):
        ShortRows(lambda examples: {"input_ids": torch.zeros(2, 8)}, 3, 1, 0)([{"index": 0}])


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--short_seq_length", "16"], "expected both \\(mixing lengths\\) or neither"),
        (["--short_seq_length", "24", "--short_seq_probability", "0.5"], "--short_seq_length 24: blocks of 64 tokens"),
        (["--short_seq_length", "64", "--short_seq_probability", "0.5"], "expected a divisor below it"),
        (["--short_seq_length", "16", "--short_seq_probability", "1.5"], "expected a number in \\[0, 1\\]"),
        (["--short_seq_length", "0", "--short_seq_probability", "0.5"], "expected a number of tokens >= 1"),
        (["--nsp", "--short_seq_length", "16", "--short_seq_probability", "0.5"], "mlm\\+nsp objective's examples"),
    ],
)
def test_bad_short_rows_are_refused_with_one_line(corpus_dir, tmp_path, flags, message):
    with pytest.raises(InputError, match=message):
        parse(corpus_args(corpus_dir, tmp_path / "o", "--max_seq_length", "64", *flags))


def test_a_context_extension_phase_with_short_rows_resumes_bitwise(
    corpus_dir, bert_tokenizer, tmp_path, fresh_state, monkeypatch, caplog
):
    """modernbert-tiny, 2 steps at 32 tokens, then a context-extension phase at 64 tokens (global base 160,000) with
    half of its batches in rows of 32: the model sees both shapes (8 x 32 and 4 x 64), the plan line says so, and the
    phase resumed from its step-2 checkpoint ends with bitwise the uninterrupted phase's weights and losses."""
    from modeling.bert import SesameBertForMaskedLM

    shapes = []
    forward = SesameBertForMaskedLM.forward

    def spy(self, input_ids=None, *args, **kwargs):
        if self.training:
            shapes.append(tuple(input_ids.shape))
        return forward(self, input_ids, *args, **kwargs)

    monkeypatch.setattr(SesameBertForMaskedLM, "forward", spy)
    bert_tokenizer.save_pretrained(tmp_path / "tok")
    common = ["--tokenizer_name", str(tmp_path / "tok"), "--learning_rate", "2e-3", "--num_warmup_steps", "1"]
    stable, modern = tmp_path / "stable", {"config": "modernbert-tiny"}
    assert run_cli(main, corpus_args(corpus_dir, stable, *common, *checkpoint_args(2, 2), **modern)) == 0
    phase = ["--continue_from_checkpoint", str(stable / "checkpoints" / "step_2"), "--max_seq_length", "64"]
    phase += ["--rope_theta", "160000", "--per_device_train_batch_size", "4"]
    phase += ["--short_seq_length", "32", "--short_seq_probability", "0.5", *checkpoint_args(6, 2)]
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    shapes.clear()
    with caplog.at_level("INFO"):
        assert run_cli(main, corpus_args(corpus_dir, full, *common, *phase, **modern)) == 0
    assert "50% of the batches in rows of 32 tokens (blocks of 64 cut" in caplog.text
    assert set(shapes) == {(8, 32), (4, 64)}, "the check can fail: 6 draws at 0.5 gave one shape only"
    resumed.mkdir()
    shutil.copytree(full / "checkpoints" / "step_2", resumed / "checkpoints" / "step_2")
    again = corpus_args(corpus_dir, resumed, *common, *phase, "--resume_from_checkpoint", "latest", **modern)
    assert run_cli(main, again) == 0
    assert (resumed / "model.safetensors").read_bytes() == (full / "model.safetensors").read_bytes()
    logs = [json.loads((d / "trainer_log.json").read_text()) for d in (full, resumed)]
    assert [r["train_loss"] for r in logs[1]] == [r["train_loss"] for r in logs[0]]
