"""A loss of several terms with their own item counts (issue 21: ELECTRA's generator loss over the masked tokens
plus lambda x the discriminator's loss over the real tokens): the loop normalises each term by its own items over
all micro-batches of the step, computed here by hand."""

from __future__ import annotations

import pytest
import torch
from _helpers import one_step_config
from torch import nn

from training.config import TrainingConfig
from training.data import make_train_dataloader
from training.loop import Trainer

LAMBDA = 3.0


class TwoTerms(nn.Module):
    """pred = x . w; term a = mean over the rows with a = 1 of (pred - 1)^2; term b = LAMBDA x mean over the rows
    with b = 1 of pred^2; ``forward`` returns both, (2,)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.tensor([0.5, -1.0, 2.0]))

    def forward(self, x, a, b):
        pred = x @ self.w
        term_a = ((pred - 1) ** 2 * a).sum() / a.sum().clamp(min=1)
        term_b = LAMBDA * (pred**2 * b).sum() / b.sum().clamp(min=1)
        return torch.stack([term_a, term_b])


class Rows(torch.utils.data.Dataset):
    def __init__(self, n=12):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 3, generator=g)
        self.a = (torch.rand(n, generator=g) < 0.3).float()  # few items of term a, unevenly spread
        self.a[0] = 1.0
        self.b = (torch.rand(n, generator=g) < 0.8).float()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "a": self.a[i], "b": self.b[i]}


def _collate(rows):
    return {k: torch.stack([r[k] for r in rows]) for k in ("x", "a", "b")}


def test_each_term_is_normalised_by_its_own_items_over_the_step(tmp_path, fresh_state):
    data = Rows()
    config = one_step_config(tmp_path / "run", lr=0.1, accumulation=4)
    from training.accelerator import make_accelerator

    acc = make_accelerator(config)
    model = TwoTerms()
    w0 = model.w.detach().clone().double()
    loader = make_train_dataloader(data, 3, _collate, seed=0, shuffle=False)  # 4 micro-batches of 3 rows
    trainer = Trainer(
        acc,
        model,
        loader,
        config,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        loss_fn=lambda m, batch: m(**batch),
        weight_fn=lambda batch: torch.stack([batch["a"].sum(), batch["b"].sum()]),
    )
    result = trainer.train()

    # by hand, in float64 over all 12 rows: the mean of each term over all of its items, plus
    w = w0.clone().requires_grad_(True)
    pred = data.x.double() @ w
    a, b = data.a.double(), data.b.double()
    loss = ((pred - 1) ** 2 * a).sum() / a.sum() + LAMBDA * (pred**2 * b).sum() / b.sum()
    (grad,) = torch.autograd.grad(loss, w)
    torch.testing.assert_close(trainer.unwrapped_model.w.detach().double(), w0 - 0.1 * grad, rtol=1e-6, atol=1e-7)
    assert result["train_loss"] == pytest.approx(float(loss.detach()), rel=1e-6)
    # ... which differs from the mean of each micro-batch's terms (what a per-micro-batch average would give)
    naive = 0.0
    for rows in (slice(j, j + 3) for j in range(0, 12, 3)):
        p, ma, mb = data.x[rows].double() @ w0, a[rows], b[rows]
        term_a = ((p - 1) ** 2 * ma).sum() / ma.sum().clamp(min=1)
        naive += float(term_a + LAMBDA * (p**2 * mb).sum() / mb.sum().clamp(min=1)) / 4
    assert abs(naive - float(loss.detach())) > 1e-2


def test_counts_and_terms_of_different_shapes_are_refused(tmp_path, fresh_state):
    config = TrainingConfig(output_dir=str(tmp_path / "run"), learning_rate=0.1, max_train_steps=1, logging_steps=1)
    from training.accelerator import make_accelerator

    acc = make_accelerator(config)
    model = TwoTerms()
    loader = make_train_dataloader(Rows(), 3, _collate, seed=0)
    trainer = Trainer(
        acc,
        model,
        loader,
        config,
        loss_fn=lambda m, batch: m(**batch).sum(),
        weight_fn=lambda batch: torch.stack([batch["a"].sum(), batch["b"].sum()]),
    )
    with pytest.raises(ValueError, match="one count per loss term"):
        trainer.train()
