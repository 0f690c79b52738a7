"""The estimated time to finish counts the evaluations and checkpoints still due (issue 32 item 3): a run whose
evaluations take longer than its training steps is not promised half its real time; its rate leaves out the first
warm-up steps (issue 49 item 7), which made the first estimate of short runs 1.5-5x too long."""

from __future__ import annotations

import logging
import re
import time

import pytest

from training.progress import estimate_finish, format_duration, remaining_events


@pytest.mark.parametrize("max_steps", [1, 7, 20, 23])
@pytest.mark.parametrize("every", [None, 1, 3, 5, 30])
def test_remaining_events_counts_the_multiples_after_the_step_and_the_final_one(max_steps, every):
    for step in range(max_steps + 1):
        # reference: walk the steps as the loop does (periodic before the last step, one more at the last)
        periodic = sum(1 for s in range(step + 1, max_steps) if every and s % every == 0)
        assert remaining_events(step, max_steps, every, final=False) == periodic
        assert remaining_events(step, max_steps, every) == periodic + (step < max_steps)


def test_estimate_adds_the_mean_evaluation_and_checkpoint_times_or_names_what_it_leaves_out():
    seconds, text, complete = estimate_finish(0.5, 10, 110, 4, 3, [10.0, 14.0], [2.0])
    assert seconds == pytest.approx(0.5 * 100 + 4 * 12.0 + 3 * 2.0) and complete
    assert text == f"training {format_duration(50)} + 4 evaluations x 12.0s + 3 checkpoints x 2.0s"
    seconds, text, complete = estimate_finish(0.5, 10, 110, 1, 3, [10.0], [])
    assert seconds == pytest.approx(60.0) and not complete
    assert text.endswith("1 evaluation x 10.0s + 3 checkpoints (not timed yet, not included)")


def test_the_logged_estimate_counts_slow_evaluations_and_is_updated_once_checkpoints_are_timed(
    toy_run, tmp_path, caplog
):
    pause = 0.25

    def slow_eval(trainer):
        time.sleep(pause)
        return {"eval_loss": 1.0}

    with caplog.at_level(logging.INFO, logger="training.loop"):
        toy_run(
            tmp_path / "out", 20, ckpt_steps=5, eval_steps=5, logging_steps=1, trainer_kwargs={"eval_fn": slow_eval}
        )
    lines = [r.getMessage() for r in caplog.records if "estimated time to finish" in r.getMessage()]
    assert len(lines) == 2, lines
    first, updated = lines
    # after step 1: evaluations at 5, 10, 15 and the end; checkpoints at 5, 10, 15 and the end (none timed yet)
    # (the first estimate waits for a step after the two warm-up steps: step 3)
    assert first.startswith("step 3/20:") and "4 evaluations x" in first
    assert "4 checkpoints (not timed yet, not included)" in first
    assert updated.startswith("step 5/20: updated estimate") and "3 evaluations x" in updated
    assert "3 checkpoints x" in updated and "not included" not in updated
    total = re.search(r"estimated time to finish: ([^(]+) \(", updated).group(1).strip()
    # the three evaluations still due alone take 3 x pause seconds: the estimate counts them
    value = float(total[:-1]) if total.endswith("s") and "m" not in total else 1e9
    assert value >= 3 * pause


def test_the_first_estimate_leaves_out_the_warm_up_steps(toy_run, tmp_path, caplog):
    """Steps 1 and 2 carry one-off work (here 0.3 s each, as lazy initialisation or compilation would); the rate of the
    first estimate, at step 5, is that of steps 3-5 (milliseconds each), so the training still due after step 5 (15
    fast steps) is estimated at well under one warm-up step, not at 15 x (0.6 s / 5)."""
    from training.data import default_loss_fn
    from training.progress import ESTIMATE_WARMUP_STEPS

    calls = {"n": 0}

    def slow_first_steps(model, batch):
        calls["n"] += 1
        if calls["n"] <= ESTIMATE_WARMUP_STEPS:
            time.sleep(0.3)
        return default_loss_fn(model, batch)

    with caplog.at_level(logging.INFO, logger="training.loop"):
        toy_run(tmp_path / "out", 20, ckpt_steps=None, logging_steps=5, loss_fn=slow_first_steps)
    (first,) = [r.getMessage() for r in caplog.records if "estimated time to finish" in r.getMessage()]
    assert first.startswith("step 5/20:") and "warm-up steps left out" in first, first
    per_step = float(re.search(r": ([0-9.e+-]+) s per optimizer step", first).group(1))
    assert per_step < 0.1, first  # counting the warm-up: >= 0.6 s / 5 = 0.12 s
    training = re.search(r"\(training ([^ +)]+)", first).group(1)
    assert training.endswith("s") and "m" not in training and float(training[:-1]) < 1.5, first
