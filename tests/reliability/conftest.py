"""Fixtures of the reliability tests: a toy regressor's training loop and the test hub. (Their corpus, tokenizers and
model configs, ``assets``, are in tests/conftest.py, shared with the launch tests.)"""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch


class ToyRegressor(torch.nn.Module):
    """x (B, 4) -> y (B,); MSE loss; dropout so that the RNG state matters for an exact resume."""

    def __init__(self, hidden: int = 16):
        super().__init__()
        self.hidden = torch.nn.Linear(4, hidden)
        self.drop = torch.nn.Dropout(0.2)
        self.out = torch.nn.Linear(hidden, 1)

    def forward(self, x, labels=None):
        y = self.out(self.drop(torch.tanh(self.hidden(x)))).squeeze(-1)
        return types.SimpleNamespace(loss=None if labels is None else ((y - labels) ** 2).mean(), logits=y)


def _toy_data(n: int = 40):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0])
    return [{"x": x[i], "labels": y[i]} for i in range(n)]


def _collate(examples):
    return {"x": torch.stack([e["x"] for e in examples]), "labels": torch.stack([e["labels"] for e in examples])}


@pytest.fixture
def toy_run():
    """``toy_run(out, steps, ckpt_steps=2, resume=None, hidden=16, loss_fn=None, fused=None, trainer_kwargs=None,
    **config) -> (trainer, result)``: the shared loop on a toy regressor (40 examples, batch 4: 10 steps per epoch),
    all checkpoints kept unless ``checkpoints_total_limit`` is given, more ``Trainer`` arguments in
    ``trainer_kwargs`` (``run_id``, ``eval_fn``, ...), in a fresh accelerate state."""
    from accelerate.state import AcceleratorState, GradientState

    from training.accelerator import make_accelerator
    from training.config import TrainingConfig
    from training.data import make_train_dataloader
    from training.loop import Trainer
    from training.optim import create_optimizer

    def run(
        out, steps, ckpt_steps=2, resume=None, hidden=16, loss_fn=None, fused=None, trainer_kwargs=None, **config_kwargs
    ):
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
        config_kwargs.setdefault("checkpoints_total_limit", 0)
        config = TrainingConfig(
            output_dir=str(out),
            learning_rate=0.05,
            max_train_steps=steps,
            num_warmup_steps=1,
            checkpointing_steps=ckpt_steps,
            resume_from_checkpoint=resume,
            seed=0,
            **config_kwargs,
        )
        acc = make_accelerator(config)
        torch.manual_seed(0)
        kwargs = {"loss_fn": loss_fn} if loss_fn is not None else {}
        kwargs.update(trainer_kwargs or {})
        model = ToyRegressor(hidden)
        if fused is not None:  # True: the fused AdamW (non-finite steps skipped on the device); False: foreach
            kwargs["optimizer"] = create_optimizer(model, config.learning_rate, config.weight_decay, fused=fused)
        trainer = Trainer(acc, model, make_train_dataloader(_toy_data(), 4, _collate, seed=0), config, **kwargs)
        return trainer, trainer.train()

    yield run
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


@pytest.fixture
def hub_server():
    """``hub_server(tokens) -> HubServer``: the project's Hub-compatible test server (tests/hub/hub_server.py) on
    127.0.0.1, started; every server started is stopped after the test."""
    from _launch import load_module

    path = Path(__file__).resolve().parents[1] / "hub" / "hub_server.py"
    module = load_module(path, "sesame_tests_hub_server_for_reliability")
    started = []

    def start(tokens: dict[str, tuple[str, str]]):
        server = module.HubServer(tokens).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def hub_client_env(url: str, home: Path) -> dict[str, str]:
    """The environment of a subprocess that talks to the test hub at ``url`` (no other HF/wandb settings)."""
    from _launch import QUIET, hub_env

    return hub_env(url, home, strip=("HF_", "HUGGING", "WANDB"), **QUIET, WANDB_SILENT="true")
