"""Fixtures of the training-loop tests: a toy model with dropout and a LayerNorm, and a fresh accelerate state."""

from __future__ import annotations

import types

import pytest
import torch
from torch import nn


class ToyRegressor(nn.Module):
    """x (B, 4) -> y (B,); loss = MSE mean over the batch; dropout so that RNG state matters for resume."""

    def __init__(self, p_drop: float = 0.2):
        super().__init__()
        self.norm = nn.LayerNorm(4)
        self.hidden = nn.Linear(4, 16)
        self.drop = nn.Dropout(p_drop)
        self.out = nn.Linear(16, 1)

    def forward(self, x, labels=None):
        y = self.out(self.drop(torch.tanh(self.hidden(self.norm(x))))).squeeze(-1)
        loss = None if labels is None else ((y - labels) ** 2).mean()
        return types.SimpleNamespace(loss=loss, logits=y)


class ToyData(torch.utils.data.Dataset):
    def __init__(self, n: int = 40, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 4, generator=g)
        self.y = self.x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1 * torch.randn(n, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


def collate(examples):
    return {"x": torch.stack([e["x"] for e in examples]), "labels": torch.stack([e["labels"] for e in examples])}


@pytest.fixture
def toy():
    """Factories: ``toy.model()``, ``toy.data(n)``, ``toy.collate``, ``toy.accelerator(config)``, ``toy.config(dir)``,
    ``toy.trainer(config)``."""
    from accelerate.state import AcceleratorState, GradientState

    def accelerator(config):
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
        from training.accelerator import make_accelerator

        return make_accelerator(config)

    def model(seed: int = 0, p_drop: float = 0.2):
        torch.manual_seed(seed)
        return ToyRegressor(p_drop)

    def config(output_dir, **fields):
        """The toy runs' ``TrainingConfig``: learning rate 0.05, a log record every step, seed 0; then ``fields``."""
        from training.config import TrainingConfig

        return TrainingConfig(
            output_dir=str(output_dir), **{"learning_rate": 0.05, "logging_steps": 1, "seed": 0, **fields}
        )

    def trainer(config, batch_size: int = 4, seed: int = 0, p_drop: float = 0.2, **kwargs):
        """A ``Trainer`` of ``config`` (a fresh accelerator) on ``model(seed, p_drop)`` and 40 toy examples in
        batches of ``batch_size`` shuffled with ``seed``; ``kwargs`` for the Trainer."""
        from training.data import make_train_dataloader
        from training.loop import Trainer

        acc = accelerator(config)
        loader = make_train_dataloader(ToyData(40), batch_size, collate, seed=seed)
        return Trainer(acc, model(seed, p_drop), loader, config, **kwargs)

    yield types.SimpleNamespace(
        model=model, data=ToyData, collate=collate, accelerator=accelerator, config=config, trainer=trainer
    )
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
