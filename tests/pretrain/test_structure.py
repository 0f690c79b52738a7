"""The structure of ``pretrain`` (issue 19): typed arguments resolved once, intervals as a fraction of the run, and a
new objective that is one table entry."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from _launch import corpus_args

from core.errors import InputError, run_cli
from pretrain.cli import main, parse


def _data_args(corpus_dir, out, *extra: str) -> list[str]:
    return corpus_args(corpus_dir, out, "--vocab_size", "300", "--learning_rate", "1e-3", *extra)


def test_parsed_arguments_are_frozen_and_resolution_makes_new_values(corpus_dir, tmp_path):
    plan = parse(_data_args(corpus_dir, tmp_path / "o", "--max_train_steps", "20"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.training.learning_rate = 1.0
    assert plan.training.eval_steps == 0.1 and plan.training.checkpointing_steps == 0.1  # 10% of the run
    assert plan.training.warmup_ratio == 0.06 and plan.model.vocab_size == 300 and plan.family.name == "bert"
    demo = parse([])
    assert demo.training.eval_steps == 100 and demo.training.checkpointing_steps is None and demo.demo


def test_early_stopping_with_data_and_automatic_intervals_runs(corpus_dir, tmp_path, fresh_state):
    """A run on user data evaluates every 10% of the run without --eval_steps, so --early_stopping_patience is
    accepted (it was refused: the check ran before the intervals were set) and training evaluates 10 times."""
    out = tmp_path / "es"
    assert run_cli(main, _data_args(corpus_dir, out, "--max_train_steps", "20", "--early_stopping_patience", "50")) == 0
    history = json.loads((out / "eval_history.json").read_text())
    assert [h["step"] for h in history] == [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20]


def test_trackers_record_the_resolved_intervals(corpus_dir, tmp_path, fresh_state, monkeypatch):
    """The config given to the trackers holds the intervals in steps (it recorded eval_steps=None), and the plan."""
    from accelerate import Accelerator

    recorded = {}

    def init_trackers(self, project_name, config=None, init_kwargs=None):
        recorded.update(config or {})

    monkeypatch.setattr(Accelerator, "init_trackers", init_trackers)
    out = tmp_path / "tb"
    assert run_cli(main, _data_args(corpus_dir, out, "--max_train_steps", "30", "--report_to", "tensorboard")) == 0
    assert recorded["eval_steps"] == math.ceil(30 / 10) == recorded["checkpointing_steps"]
    assert recorded["max_train_steps"] == 30 and recorded["num_warmup_steps"] == math.ceil(0.06 * 30)
    assert recorded["learning_rate"] == 1e-3 and recorded["objective"] == "mlm" and "hub_token" not in recorded
    saved = json.loads((out / "run_config.json").read_text())
    assert {k: saved[k] for k in ("eval_steps", "checkpointing_steps", "max_train_steps", "learning_rate")} == {
        k: recorded[k] for k in ("eval_steps", "checkpointing_steps", "max_train_steps", "learning_rate")
    }
    log = json.loads((out / "trainer_log.json").read_text())
    assert all(0 < a["train_seconds"] < b["train_seconds"] for a, b in zip(log, log[1:]))
    previous = {"train_seconds": 0.0, "train_tokens": 0.0}
    for record in log:  # each interval's tokens/s is its share of the cumulative tokens and seconds
        delta = (record["train_tokens"] - previous["train_tokens"]) / (
            record["train_seconds"] - previous["train_seconds"]
        )
        assert delta == pytest.approx(record["tokens_per_second"], rel=1e-6)
        assert record["train_tokens"] - previous["train_tokens"] <= 10 * 8 * 32  # 10 steps of at most 8 x 32 tokens
        previous = record


def _every_fourth_token_collators(tokenizer, masking, seed):
    """A toy objective's collators: predict every 4th token (a deterministic pattern, no randomness)."""
    from pretrain.collators import _pad

    def collate(examples):
        ids = _pad([e["input_ids"] for e in examples], tokenizer.pad_token_id)
        predicted = torch.zeros_like(ids, dtype=torch.bool)
        predicted[:, 3::4] = True
        predicted &= ids != tokenizer.pad_token_id
        return {
            "input_ids": torch.where(predicted, tokenizer.mask_token_id, ids),
            "attention_mask": (ids != tokenizer.pad_token_id).long(),
            "labels": torch.where(predicted, ids, -100),
        }

    return collate, collate


def test_a_new_objective_is_one_table_entry(corpus_dir, tmp_path, fresh_state):
    """Register an objective (MLM on every 4th token, with a metric of its own) through the table alone and train
    it by name: the command takes it, uses its collator and metrics, and records it in the model card."""
    from pretrain.objectives import OBJECTIVES, register_objective

    base = OBJECTIVES["mlm"]
    toy = dataclasses.replace(
        base,
        name="toy-mlm",
        collators=_every_fourth_token_collators,
        metrics=lambda sums: {**base.metrics(sums), "eval_predicted_tokens": sums["count"]},
        result_keys=("eval_predicted_tokens",),
    )
    register_objective(toy)
    try:
        out = tmp_path / "toy"
        assert run_cli(main, _data_args(corpus_dir, out, "--objective", "toy-mlm", "--max_train_steps", "4")) == 0
    finally:
        del OBJECTIVES["toy-mlm"]
    from transformers import AutoTokenizer

    from pretrain.data import load_raw_datasets, pack_blocks, tokenize_bert

    tokenizer = AutoTokenizer.from_pretrained(out)
    raw = load_raw_datasets([str(corpus_dir / "train.txt")], str(corpus_dir / "valid.txt.gz"))
    blocks = pack_blocks(
        tokenize_bert(raw, tokenizer), 32, tokenizer.cls_token_id, tokenizer.sep_token_id, 1000, document_positions=True
    )  # the toy copies mlm's entry: document masking on by default
    every_fourth = sum(len(range(3, len(b), 4)) for b in blocks["validation"]["input_ids"])
    results = json.loads((out / "all_results.json").read_text())
    assert results["eval_predicted_tokens"] == results["eval_tokens"] == every_fourth
    assert "toy-mlm" in (out / "README.md").read_text()
    with pytest.raises(InputError, match="--objective 'toy-mlm'"):
        parse(["--objective", "toy-mlm"])  # no longer registered
