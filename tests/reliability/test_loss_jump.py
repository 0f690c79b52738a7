"""The held-out loss spike of issue 32 item 4: bert-mini on 2 MB of news jumped from 7.12 to 15.76 for one step
(the update of step 121; the next one undid it). Such a jump is now warned about, naming the values and steps;
gradual changes are not."""

from __future__ import annotations

import logging

from training.progress import LOSS_JUMP_NATS, loss_jump


def _history(*losses):
    return [{"step": 15 * i, "eval_loss": v} for i, v in enumerate(losses)]


def test_a_jump_above_the_lowest_loss_so_far_is_named_with_both_values():
    # the measured curve: 7.115 after step 120, 15.76 after step 121
    warning = loss_jump(
        [{"step": 105, "eval_loss": 7.121}, {"step": 120, "eval_loss": 7.115}, {"step": 121, "eval_loss": 15.76}]
    )
    assert warning.startswith(
        "step 121: held-out eval_loss 15.76 jumped 8.64 nats above its lowest so far (7.115 at step 120)"
    )
    assert loss_jump(_history(9.9, 7.7, 7.2, 7.1, 7.1 + LOSS_JUMP_NATS - 0.01)) is None  # below the threshold
    assert loss_jump(_history(9.9, 7.7, 7.2, 7.2 + LOSS_JUMP_NATS + 0.01)) is not None
    assert loss_jump(_history(9.9, 8.0, 7.0, 6.5)) is None and loss_jump(_history(3.0)) is None
    assert loss_jump(_history(1.0, float("nan"), 4.0)) is not None  # non-finite points are left out
    assert loss_jump(_history(9.9, 7.0, 15.0, 7.1)) is None  # recovered: only the last point is judged


def test_the_loop_warns_at_the_evaluation_after_the_jump_only(toy_run, tmp_path, caplog):
    losses = iter([1.0, 0.9, 0.8, 5.0, 0.8])

    def eval_fn(trainer):
        return {"eval_loss": next(losses)}

    with caplog.at_level(logging.WARNING, logger="training.loop"):
        toy_run(tmp_path / "out", 8, ckpt_steps=None, eval_steps=2, trainer_kwargs={"eval_fn": eval_fn})
    warnings = [r.getMessage() for r in caplog.records if "jumped" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("step 6: held-out eval_loss 5 jumped 4.2 nats"), warnings
