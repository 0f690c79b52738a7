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
    """Factories: ``toy.model()``, ``toy.data(n)``, ``toy.collate``, ``toy.accelerator(config)``."""
    from accelerate.state import AcceleratorState, GradientState

    def accelerator(config):
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
        from training.accelerator import make_accelerator

        return make_accelerator(config)

    def model(seed: int = 0, p_drop: float = 0.2):
        torch.manual_seed(seed)
        return ToyRegressor(p_drop)

    yield types.SimpleNamespace(model=model, data=ToyData, collate=collate, accelerator=accelerator)
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
