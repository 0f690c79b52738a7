"""Non-finite loss: ``--skip_nonfinite_steps N`` skips the update of up to N such optimizer steps (the step and its
batches count, a warning naming the step and micro-batches); one more stops with the step, batches and the last
good checkpoint named. Without the option the first one stops (tests/training/test_loop.py)."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from core.errors import InputError, NonFiniteLossError
from training import checkpoint_files as ckpt
from training.config import TrainingConfig


def _nan_at(calls_with_nan):
    calls = {"n": 0}

    def loss_fn(model, batch):
        calls["n"] += 1
        loss = model(**batch).loss
        return loss * float("nan") if calls["n"] in calls_with_nan else loss

    return loss_fn


def _checkpoint(run_dir, step):
    from safetensors.torch import load_file

    folder = run_dir / "checkpoints" / f"step_{step}"
    return load_file(folder / "model.safetensors"), torch.load(folder / "optimizer.bin", weights_only=True)["state"]


@pytest.mark.parametrize("fused", [True, False], ids=["skipped-on-device", "read-every-step"])
def test_skipped_step_takes_no_update_and_counts_as_a_step(toy_run, tmp_path, caplog, fused):
    """Step 3's loss is NaN: its update is not applied (weights, Adam moments and Adam's step count stay as after
    step 2), the step and its batch count (6 optimizer steps, 6 batches) and the schedule advances. The fused
    AdamW skips it on the device (statistics read at the next sync point); the foreach AdamW reads every step."""
    with caplog.at_level(logging.WARNING, logger="training.loop"):
        trainer, result = toy_run(
            tmp_path / "skip", steps=6, ckpt_steps=1, loss_fn=_nan_at({3}), skip_nonfinite_steps=1, fused=fused
        )
    assert trainer._device_skip_supported() is fused
    assert result["global_step"] == 6
    warnings = [r.getMessage() for r in caplog.records if "update skipped" in r.getMessage()]
    assert len(warnings) == 1 and "optimizer step 3 (epoch 0, micro-batches 3-3 of the epoch)" in warnings[0]
    state = ckpt.read_state(ckpt.checkpoint_dirs(tmp_path / "skip" / "checkpoints")[-1][1])
    assert state["nonfinite_skipped"] == 1 and state["batches_in_epoch"] == 6, "6 steps consumed 6 batches"
    assert trainer.scheduler.last_epoch == 6, "the schedule steps with every optimizer step, skipped ones included"
    (w2, o2), (w3, o3), (w4, o4) = (_checkpoint(tmp_path / "skip", s) for s in (2, 3, 4))
    assert all(torch.equal(w2[k], w3[k]) for k in w2), "no update at step 3"
    assert all(torch.equal(o2[i][k], o3[i][k]) for i in o2 for k in o2[i]), "Adam's moments and step count unchanged"
    assert not all(torch.equal(w3[k], w4[k]) for k in w3), "step 4 updates again"
    assert [int(o[0]["step"]) for o in (o2, o3, o4)] == [2, 2, 3]
    assert all(torch.isfinite(p).all() for p in trainer.unwrapped_model.parameters())
    assert math.isfinite(result["train_loss"])


@pytest.mark.parametrize("fused", [True, False], ids=["skipped-on-device", "read-every-step"])
def test_one_more_than_tolerated_stops(toy_run, tmp_path, fused):
    """NaN at steps 3 and 5 with one tolerated: the run stops naming step 5; the checkpoint of step 6 is never
    written (the statistics are read before every checkpoint), the one of step 4 is the last good one."""
    with pytest.raises(
        NonFiniteLossError,
        match=r"optimizer step 5 \(epoch 0, micro-batches 5-5 of the epoch\) after 1 "
        r"skipped step\(s\) \(--skip_nonfinite_steps 1\)(.*)step_4",
    ) as err:
        toy_run(tmp_path / "stop", steps=8, loss_fn=_nan_at({3, 5}), skip_nonfinite_steps=1, fused=fused)
    assert [s for s, _ in ckpt.checkpoint_dirs(tmp_path / "stop" / "checkpoints")] == [2, 4]
    # the fused path learns of it where it next reads the statistics (the checkpoint step 6), the other at once
    assert ("found at step 6" in str(err.value)) is fused


def test_negative_tolerance_is_refused(tmp_path):
    with pytest.raises(InputError, match="--skip_nonfinite_steps -1: expected an integer >= 0"):
        TrainingConfig(output_dir=str(tmp_path), skip_nonfinite_steps=-1)
