"""A stop request (SIGTERM / SIGINT) during a long evaluation is seen between evaluation batches: the evaluation
is abandoned, the step's checkpoint is written at once (recording that its evaluation is pending), and the resumed
run evaluates first, then ends as an uninterrupted run does."""

from __future__ import annotations

import pytest
import torch
from reliability.conftest import _collate, _toy_data  # noqa: F401  (the toy data of toy_run)

from core.errors import TrainingStopped


def _eval_fn(batches_seen: list[int], stop_at: tuple[int, int] | None):
    """An evaluation over the toy data (10 batches of 4) that asks for a stop after batch ``stop_at[1]`` of the
    evaluation at step ``stop_at[0]``."""
    from training.evaluation import evaluate_sums

    def step_fn(model, batch):
        trainer = step_fn.trainer
        seen = batches_seen.append(trainer.state.global_step) or sum(
            s == trainer.state.global_step for s in batches_seen
        )
        if stop_at is not None and (trainer.state.global_step, seen) == stop_at:
            trainer.request_stop()
        out = model(batch["x"], labels=batch["labels"])
        return {"sse": out.loss.detach().double() * len(batch["x"]), "count": torch.tensor(float(len(batch["x"])))}

    def evaluate(trainer):
        step_fn.trainer = trainer
        sums = evaluate_sums(trainer.accelerator, trainer.model, _toy_data(), _collate, 4, step_fn, ["sse", "count"])
        return {"eval_loss": sums["sse"] / sums["count"]}

    return evaluate


def test_a_stop_request_during_evaluation_checkpoints_at_once_and_the_resume_evaluates_first(toy_run, tmp_path):
    full_batches: list[int] = []
    _, full = toy_run(
        tmp_path / "full", 6, ckpt_steps=100, eval_steps=3, trainer_kwargs={"eval_fn": _eval_fn(full_batches, None)}
    )
    seen: list[int] = []
    with pytest.raises(TrainingStopped) as stopped:
        toy_run(
            tmp_path / "stopped", 6, ckpt_steps=100, eval_steps=3, trainer_kwargs={"eval_fn": _eval_fn(seen, (3, 2))}
        )
    assert "during the evaluation at optimizer step 3" in str(stopped.value)
    assert seen.count(3) == 2, "the evaluation stopped after the batch that asked, not at its end (10 batches)"
    from training.checkpoint_files import read_state

    assert read_state(tmp_path / "stopped" / "checkpoints" / "step_3")["eval_pending"] is True
    resumed_batches: list[int] = []
    _, resumed = toy_run(
        tmp_path / "stopped",
        6,
        ckpt_steps=100,
        eval_steps=3,
        resume="latest",
        trainer_kwargs={"eval_fn": _eval_fn(resumed_batches, None)},
    )
    assert resumed_batches[:10] == [3] * 10  # the pending evaluation first
    assert resumed["eval_history"] == full["eval_history"]
    assert resumed["train_loss"] == full["train_loss"]
