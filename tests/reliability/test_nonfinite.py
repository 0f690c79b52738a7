"""Non-finite loss: ``--skip_nonfinite_steps N`` skips up to N such optimizer steps (no update, batches
consumed, a warning naming the step and micro-batches); one more stops with the step, batches and the last
good checkpoint named. Without the option the first one stops (tests/training/test_loop.py)."""

from __future__ import annotations

import logging

import pytest
import torch

from training import checkpoint as ckpt
from training.errors import InputError
from training.loop import NonFiniteLossError, TrainingConfig


def _nan_at(calls_with_nan):
    calls = {"n": 0}

    def loss_fn(model, batch):
        calls["n"] += 1
        loss = model(**batch).loss
        return loss * float("nan") if calls["n"] in calls_with_nan else loss

    return loss_fn


def test_skipped_step_consumes_its_batch_and_takes_no_update(toy_run, tmp_path, caplog):
    _, clean = toy_run(tmp_path / "clean", steps=6)
    with caplog.at_level(logging.WARNING, logger="training.loop"):
        trainer, result = toy_run(tmp_path / "skip", steps=6, loss_fn=_nan_at({3}), skip_nonfinite_steps=1)
    assert result["global_step"] == 6
    warnings = [r.getMessage() for r in caplog.records if "update skipped" in r.getMessage()]
    assert len(warnings) == 1 and "optimizer step 3 (epoch 0, micro-batches 3-3 of the epoch)" in warnings[0]
    state = ckpt.read_state(ckpt.checkpoint_dirs(tmp_path / "skip" / "checkpoints")[-1][1])
    assert state["nonfinite_skipped"] == 1 and state["batches_in_epoch"] == 7, "6 updates consumed 7 batches"
    assert trainer.scheduler.last_epoch == 6, "the schedule steps only with updates"
    assert all(torch.isfinite(p).all() for p in trainer.unwrapped_model.parameters())
    assert result["train_loss"] != clean["train_loss"]  # another batch sequence: a property, not a number


def test_one_more_than_tolerated_stops(toy_run, tmp_path):
    with pytest.raises(NonFiniteLossError, match=r"optimizer step 4 \(epoch 0, micro-batches 5-5 of the epoch\) after 1 "
                                                 r"skipped step\(s\) \(--skip_nonfinite_steps 1\).*step_2"):
        toy_run(tmp_path / "stop", steps=8, loss_fn=_nan_at({3, 5}), skip_nonfinite_steps=1)
    assert [s for s, _ in ckpt.checkpoint_dirs(tmp_path / "stop" / "checkpoints")] == [2]


def test_negative_tolerance_is_refused(tmp_path):
    with pytest.raises(InputError, match="--skip_nonfinite_steps -1: expected an integer >= 0"):
        TrainingConfig(output_dir=str(tmp_path), skip_nonfinite_steps=-1)
