"""Evaluation cost fits the run: without ``--max_eval_samples`` a run on the user's data evaluates at most about
10% of the blocks it trains on over all its evaluations (at least 128 blocks, at most 1M tokens per evaluation),
and the run plan line says how many of how many validation blocks it chose."""

from __future__ import annotations

import json
import logging
import random
import types

from _launch import WORDS

from core.errors import run_cli


def _plan(tmp_path, *extra: str):
    from pretrain.cli import parse

    (tmp_path / "t.txt").write_text("the senate adjourned.\n")
    return parse(["--train_file", str(tmp_path / "t.txt"), "--output_dir", str(tmp_path / "o"), *extra])


def default_eval_blocks(plan, train_blocks: int, num_processes: int) -> int | None:
    """The run plan's evaluation cap, as ``pretrain`` makes the plan (no time budget: no model or loader needed)."""
    from pretrain.run_plan import make_run_plan

    accelerator = types.SimpleNamespace(num_processes=num_processes, is_main_process=True)
    return make_run_plan(plan, None, None, {}, train_blocks, accelerator).eval_examples


def _sized(tmp_path, length: str, eval_steps: str, *extra: str):
    """:func:`_plan` of batches of 16 sequences of ``length`` tokens, evaluated every ``eval_steps``; ``extra``
    first."""
    sizes = ["--per_device_train_batch_size", "16", "--max_seq_length", length, "--eval_steps", eval_steps]
    return _plan(tmp_path, *extra, *sizes)


def test_default_evaluation_set_is_capped_by_the_planned_training(tmp_path):
    short = _sized(tmp_path, "32", "0.1", "--model_type", "elmo", "--max_train_steps", "20")
    assert default_eval_blocks(short, 100_000, 1) == 128  # 10% of 320 trained blocks over 11 evaluations: the floor
    long = _sized(tmp_path, "32", "50000", "--max_train_steps", "100000")
    assert default_eval_blocks(long, 10**7, 1) == 1_000_000 // 32  # the token cap of one evaluation
    medium = _sized(tmp_path, "128", "250", "--max_train_steps", "1000")
    assert default_eval_blocks(medium, 10**6, 2) == int(0.1 * 1000 * 16 * 2 / 5)  # 5 evaluations, 2 processes
    budget = _sized(tmp_path, "32", "0.1", "--max_train_tokens", "10240")  # 20 steps of 512 tokens, as `short`
    assert default_eval_blocks(budget, 100_000, 1) == 128
    given = _plan(tmp_path, "--max_train_steps", "20", "--max_eval_samples", "7")
    assert default_eval_blocks(given, 1000, 1) is None  # the user's choice stands


def test_the_run_plan_line_says_how_many_validation_blocks_it_chose(assets, tmp_path, caplog, fresh_state):
    from pretrain.cli import main

    rng = random.Random(0)
    valid = tmp_path / "valid.txt"
    valid.write_text("\n\n".join(" ".join(rng.choice(WORDS) for _ in range(12)) + "." for _ in range(400)) + "\n")
    out = tmp_path / "out"
    caplog.set_level(logging.INFO)
    assert (
        run_cli(
            main,
            [
                "--train_file",
                str(assets / "train.txt"),
                "--validation_file",
                str(valid),
                "--tokenizer_name",
                str(assets / "wordpiece"),
                "--config_name",
                "bert-tiny",
                "--max_seq_length",
                "16",
                "--per_device_train_batch_size",
                "4",
                "--max_train_steps",
                "2",
                "--output_dir",
                str(out),
            ],
        )
        == 0
    )
    plan = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("run plan:"))
    assert "128 of " in plan and "validation blocks" in plan and "--max_eval_samples" in plan, plan
    available = int(plan.split("128 of ")[1].split()[0])
    assert available > 128
    results = json.loads((out / "all_results.json").read_text())
    assert results["eval_tokens"] <= 128 * 16
