"""Training telemetry (issue 50, item 5; ``training.mfu``): the model FLOPs of a step against the formula counted by
hand for a tiny ModernBERT-class SesameBert, the device peaks, and the loop's ``packing_efficiency`` / ``mfu`` (log
records, the result) against the real tokens, slots and FLOPs of its batches."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from _tiny import modern_layout

from training.config import TrainingConfig
from training.data import make_train_dataloader
from training.loop import Trainer
from training.mfu import FlopCounter, peak_flops

H, FFN, V, A, WINDOW = 32, 48, 100, 4, 8


def tiny_modern(sparse: bool = True):
    from modeling import SesameBertConfig, SesameBertForMaskedLM

    layout = modern_layout(local_attention=WINDOW, sparse_prediction=sparse)
    config = SesameBertConfig(
        vocab_size=V,
        hidden_size=H,
        num_hidden_layers=3,
        num_attention_heads=A,
        intermediate_size=FFN,
        max_position_embeddings=64,
        **layout,
    )
    torch.manual_seed(0)
    return SesameBertForMaskedLM(config)


# by hand: per layer q, k, v and output H x H (no biases), GeGLU H -> 2 FFN, FFN -> H; norms without bias: layer 0
# has the identity as attention norm (1 norm), layers 1-2 two each, + embedding norm + final norm + the head's norm
# (H each); the head's dense H x H. Not counted: the word embeddings and the decoder (weight and bias: the output
# embeddings' second term).
MATMUL_PARAMS = 3 * (4 * H * H + 2 * FFN * H + FFN * H) + (1 + 2 + 2 + 3) * H + H * H


def test_flops_of_a_step_follow_the_formula():
    model = tiny_modern()
    assert model.config.attention_types() == ["full_attention", "sliding_attention", "sliding_attention"]
    counter = FlopCounter(model)
    assert counter.matmul_params == MATMUL_PARAMS
    labels = torch.full((2, 16), -100)
    labels[0, :5] = 7  # 5 predicted tokens
    batch = {"input_ids": torch.ones(2, 16, dtype=torch.long), "labels": labels}
    real = 29  # e.g. 3 padding slots
    context = 16 + 2 * (WINDOW + 1)  # a global layer sees the row, a local one its band of 9 keys
    expected = 6 * MATMUL_PARAMS * real + 6 * V * H * 5 + 12 * H * real * context
    assert counter(batch, real).item() == expected
    # dense prediction: the decoder on every real token; rows shorter than the window: the row is the context
    dense = FlopCounter(tiny_modern(sparse=False))
    short = {"input_ids": torch.ones(4, 6, dtype=torch.long), "labels": torch.full((4, 6), 3)}
    assert dense(short, 24).item() == 6 * MATMUL_PARAMS * 24 + 6 * V * H * 24 + 12 * H * 24 * 3 * 6


def test_peak_is_unknown_off_the_listed_gpus(monkeypatch):
    assert peak_flops("cpu", "bf16") is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    assert peak_flops("cuda", "bf16") == 989e12 and peak_flops("cuda", "no") == 494.7e12
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 PCIe")
    assert peak_flops("cuda", "fp16") == 756e12
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some Future GPU")
    assert peak_flops("cuda", "bf16") is None


class Blocks(torch.utils.data.Dataset):
    """Rows of 16 ids, row r with 16 - r % 4 real tokens (the rest padding), 4 predicted positions each."""

    def __init__(self, n: int = 8):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        real = 16 - i % 4
        ids = torch.randint(5, V, (16,), generator=torch.Generator().manual_seed(i))
        mask = (torch.arange(16) < real).long()
        labels = torch.full((16,), -100)
        labels[:4] = ids[:4]
        return {"input_ids": ids * mask, "attention_mask": mask, "labels": labels}


@pytest.mark.parametrize("mixed_precision", ["no", "bf16"])
def test_loop_reports_packing_efficiency_and_mfu(toy, tmp_path, monkeypatch, mixed_precision):
    """4 steps of 2 rows (logging every 2): the packing efficiency is the real tokens over the 32 slots of each
    interval; MFU, with a faked peak of 1 GFLOP/s, is the FLOPs of the formula over the seconds the result's
    tokens/s implies; without a peak (the CPU) it is left out of the records and ``None`` in the result."""
    config = TrainingConfig(
        output_dir=str(tmp_path / "run"),
        max_train_steps=4,
        per_device_train_batch_size=2,
        logging_steps=2,
        learning_rate=1e-3,
        mixed_precision=mixed_precision,
    )
    data = Blocks()
    loader = make_train_dataloader(data, 2, seed=0, collate_fn=torch.utils.data.default_collate)
    trainer = Trainer(toy.accelerator(config), tiny_modern(), loader, config)
    assert trainer.peak_flops is None  # the CPU: unknown
    result = trainer.train()
    assert result["train_mfu"] is None
    rows = [data[i] for i in range(len(data))]
    real = [int(r["attention_mask"].sum()) for r in rows]  # 16, 15, 14, 13, 16, ...
    assert result["train_packing_efficiency"] == pytest.approx(sum(real) / (16 * len(rows)))
    for record in result["log_history"]:
        assert "mfu" not in record and 0 < record["packing_efficiency"] < 1

    # the same run with a known peak
    monkeypatch.setattr("training.loop.peak_flops", lambda device, precision: 1e9)
    config = dataclasses.replace(config, output_dir=str(tmp_path / "peak"))
    loader = make_train_dataloader(data, 2, seed=0, collate_fn=torch.utils.data.default_collate)
    trainer = Trainer(toy.accelerator(config), tiny_modern(), loader, config)
    result = trainer.train()
    counter = FlopCounter(tiny_modern())
    flops = sum(counter(torch.utils.data.default_collate([r]), n).item() for r, n in zip(rows, real))
    seconds = sum(real) / result["train_tokens_per_second"]
    assert result["train_mfu"] == pytest.approx(flops / (seconds * 1e9), rel=1e-6)
    assert all(record["mfu"] > 0 for record in result["log_history"])
