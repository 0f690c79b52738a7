"""Compute budgets (issue 22, item 4): ``--max_train_tokens`` and ``--time_budget`` become ``--max_train_steps`` once,
by hand-checked arithmetic and a faked clock; the run they give is the run of that ``--max_train_steps`` (the probe
disturbs nothing), the same command twice gives the same weights, and a resumed run keeps its steps."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch
from _launch import corpus_args

from core.errors import InputError, run_cli
from pretrain.cli import main, parse
from training import budget as budgets
from training.plan import steps_for_time, steps_for_tokens


def _args(corpus_dir, tok, out, *extra):
    return corpus_args(corpus_dir, out, "--logging_steps", "1", "--learning_rate", "2e-3", *extra, tokenizer=tok)


@pytest.fixture
def tok(bert_tokenizer, tmp_path):
    path = tmp_path / "tok"
    bert_tokenizer.save_pretrained(path)
    return path


class FakeClock:
    """A clock that advances ``step`` seconds at every reading (the probe reads it twice per optimizer step)."""

    def __init__(self, step: float):
        self.now, self.step, self.calls = 1000.0, step, 0

    def __call__(self) -> float:
        self.calls += 1
        self.now += self.step
        return self.now


def _budget_line(caplog) -> str:
    return next(r.getMessage() for r in caplog.records if r.getMessage().startswith("budget: "))


def test_token_budget_to_steps_by_hand(corpus_dir, tok, tmp_path, fresh_state, caplog):
    assert steps_for_tokens(1000, 256) == 4  # 3 steps are 768 tokens: one more
    assert steps_for_tokens(1024, 256) == 4 and steps_for_tokens(1025, 256) == 5
    assert steps_for_time(1.0, 0.5) == 120 and steps_for_time(0.001, 7.0) == 1
    with pytest.raises(InputError, match="--max_train_tokens 0"):
        steps_for_tokens(0, 256)
    # a run: 8 blocks x 32 tokens x 2 accumulation = 512 tokens per optimizer step; 1,100 tokens -> 3 steps
    out = tmp_path / "tokens"
    with caplog.at_level(logging.INFO, logger="pretrain"):
        assert (
            run_cli(
                main, _args(corpus_dir, tok, out, "--max_train_tokens", "1100", "--gradient_accumulation_steps", "2")
            )
            == 0
        )
    line = _budget_line(caplog)
    assert "--max_train_tokens 1100 / 512 tokens per optimizer step = 3 optimizer steps" in line, line
    assert "--max_train_steps 3 instead of --max_train_tokens" in line
    assert json.loads((out / "all_results.json").read_text())["global_step"] == 3
    config = json.loads((out / "run_config.json").read_text())
    assert config["max_train_steps"] == 3 and config["max_train_tokens"] == 1100


def test_budget_conflicts_are_refused():
    for argv, message in (
        (["--time_budget", "1", "--max_train_steps", "5"], "--time_budget: conflicts with --max_train_steps"),
        (["--max_train_tokens", "9", "--time_budget", "1"], "--max_train_tokens: conflicts with --time_budget"),
        (["--max_train_tokens", "9", "--num_train_epochs", "2"], "conflicts with --num_train_epochs"),
        (["--max_train_tokens", "0"], "--max_train_tokens 0: expected an integer >= 1"),
        (["--time_budget", "-2"], "--time_budget -2.0: expected a positive number"),
    ):
        with pytest.raises(InputError, match=message):
            parse(argv)
    demo = parse(["--time_budget", "3"]).training
    assert demo.max_train_steps is None and demo.eval_steps == 100, "a budget replaces the demo's 300 steps"


def test_the_probe_times_loop_steps_and_disturbs_nothing():
    """time_optimizer_steps: G micro-batches per step, the faked clock's seconds, and the model, the global RNG
    and the loader's generator as they were."""
    from accelerate import Accelerator
    from torch.utils.data import DataLoader

    from training.config import TrainingConfig

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 1))

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = model

        def forward(self, x, labels):
            return type("Out", (), {"loss": ((self.net(x).squeeze(-1) - labels) ** 2).mean()})()

    wrapped, collated = Wrapped(), []

    def collate(rows):
        collated.append(len(rows))
        return {"x": torch.stack([r[0] for r in rows]), "labels": torch.stack([r[1] for r in rows])}

    data = list(zip(torch.randn(20, 4), torch.randn(20)))
    loader = DataLoader(data, batch_size=4, collate_fn=collate, generator=torch.Generator().manual_seed(1))
    config = TrainingConfig(output_dir="unused", gradient_accumulation_steps=2, learning_rate=0.1)
    before = {k: v.clone() for k, v in wrapped.state_dict().items()}
    rng, gen = torch.get_rng_state(), loader.generator.get_state()
    clock = FakeClock(0.25)
    original, budgets.clock = budgets.clock, clock
    try:
        seconds = budgets.time_optimizer_steps(Accelerator(cpu=True), wrapped, loader, config, steps=5, warmup=1)
    finally:
        budgets.clock = original
    assert seconds == pytest.approx(0.25) and clock.calls == 2 * 4, "two readings per timed step (4 of 5)"
    # 5 batches of 4 per pass: steps 1-2 take 2 each, step 3 the last one alone (an epoch's end, as in the loop),
    # steps 4-5 two each from the start again
    assert collated == [4] * 9
    assert all(torch.equal(v, before[k]) for k, v in wrapped.state_dict().items())
    assert torch.equal(torch.get_rng_state(), rng) and torch.equal(loader.generator.get_state(), gen)
    with pytest.raises(InputError, match="expected more steps"):
        budgets.time_optimizer_steps(Accelerator(cpu=True), wrapped, loader, config, steps=2, warmup=2)


def test_time_budget_with_a_faked_clock_is_the_run_of_its_steps(
    corpus_dir, tok, tmp_path, fresh_state, caplog, monkeypatch
):
    """0.5 s per probed step and 0.1 minutes -> 12 optimizer steps, logged with --max_train_steps 12 and recorded;
    the same command again gives bitwise the same weights, and so does --max_train_steps 12 without a budget (the
    probe leaves the model, the data and the dropout stream as they were; dropout is on)."""
    monkeypatch.setattr(budgets, "clock", FakeClock(0.5))
    budget = ["--time_budget", "0.1", "--checkpointing_steps", "6", "--checkpoints_total_limit", "0"]
    first, again, by_steps = tmp_path / "first", tmp_path / "again", tmp_path / "steps"
    with caplog.at_level(logging.INFO, logger="pretrain"):
        assert run_cli(main, _args(corpus_dir, tok, first, *budget)) == 0
    line = _budget_line(caplog)
    assert "--time_budget 0.1 minutes / 0.5 s per optimizer step" in line and "= 12 optimizer steps" in line, line
    assert line.endswith("to repeat this run exactly: --max_train_steps 12 instead of --time_budget")
    config = json.loads((first / "run_config.json").read_text())
    assert config["max_train_steps"] == 12 and config["time_budget"] == 0.1
    assert config["time_budget_seconds_per_step"] == pytest.approx(0.5)
    assert json.loads((first / "all_results.json").read_text())["global_step"] == 12
    assert json.loads((first / "checkpoints" / "step_6" / "trainer_state.json").read_text())["max_train_steps"] == 12
    assert run_cli(main, _args(corpus_dir, tok, again, *budget)) == 0
    assert run_cli(main, _args(corpus_dir, tok, by_steps, "--max_train_steps", "12")) == 0
    weights = {d.name: (d / "model.safetensors").read_bytes() for d in (first, again, by_steps)}
    assert weights["first"] == weights["again"] == weights["steps"]
    # resumed with --time_budget (and a clock that would now give 1 step): the recorded 12 steps, no new probe
    slow = FakeClock(60.0)
    monkeypatch.setattr(budgets, "clock", slow)
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copytree(first / "checkpoints" / "step_6", resumed / "checkpoints" / "step_6")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pretrain"):
        assert run_cli(main, _args(corpus_dir, tok, resumed, *budget, "--resume_from_checkpoint", "latest")) == 0
    assert slow.calls == 0, "no probe on resume"
    assert "as converted when the run started" in _budget_line(caplog)
    assert (resumed / "model.safetensors").read_bytes() == weights["first"]
    log_first, log_resumed = (json.loads((d / "trainer_log.json").read_text()) for d in (first, resumed))
    # steps 1-6 from the checkpoint
    assert [r["train_loss"] for r in log_resumed] == [r["train_loss"] for r in log_first]
