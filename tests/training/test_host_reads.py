"""The shared loop reads nothing back from the device between logging steps (issue 13, item 8).

On the CPU every tensor is a host tensor, so the check is on the calls that would read a device tensor back
(``item``, ``tolist``, ``bool``, ``float``, ``int``, ``numpy``, ``cpu``), recorded with the optimizer step they
happen in and the code that makes them; the data pipeline (collator, sampler, DataLoader), which works on host
tensors by design, is left out. On a GPU, ``torch.cuda.set_sync_debug_mode("error")`` makes any synchronisation
outside the loop's reads an error (``gpu`` marker).
"""

from __future__ import annotations

import collections
import os
import sys

import pytest
import torch
from torch.overrides import TorchFunctionMode

from training.accelerator import make_accelerator
from training.config import TrainingConfig
from training.data import make_train_dataloader
from training.loop import Trainer
from training.optim import create_optimizer

READS = {
    torch.Tensor.item,
    torch.Tensor.tolist,
    torch.Tensor.__bool__,
    torch.Tensor.__float__,
    torch.Tensor.__int__,
    torch.Tensor.__index__,
    torch.Tensor.numpy,
    torch.Tensor.cpu,
}
HOST_DATA = (
    os.path.join("pretrain", "collators.py"),
    os.path.join("torch", "utils", "data"),
    os.path.join("accelerate", "data_loader.py"),
)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class HostReads(TorchFunctionMode):
    """Records ``(optimizer step, file, function)`` of every read of a tensor's value by the host, outside the
    data pipeline and the epoch's sampler."""

    def __init__(self, trainer):
        super().__init__()
        self.trainer, self.reads = trainer, collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in READS:
            frame = sys._getframe(1)
            while (
                frame is not None
                and os.sep + "torch" + os.sep in frame.f_code.co_filename
                and os.path.join("torch", "utils", "data") not in frame.f_code.co_filename
            ):
                frame = frame.f_back
            where = os.path.relpath(frame.f_code.co_filename, ROOT)
            if not any(part in where for part in HOST_DATA) and frame.f_code.co_name != "__iter__":
                self.reads[(self.trainer.state.global_step, where, frame.f_code.co_name)] += 1
        return func(*args, **(kwargs or {}))


class _Tokenizer:
    """What MLMCollator reads of a WordPiece tokenizer."""

    vocab_size, pad_token_id, unk_token_id, cls_token_id, sep_token_id, mask_token_id = 200, 0, 1, 2, 3, 4
    all_special_ids = [0, 1, 2, 3, 4]

    def __len__(self):
        return self.vocab_size


def _mlm_trainer(tmp_path, fused=None, logging_steps=5, steps=10, sparse_prediction=True):
    """bert-tiny MLM on 48 full packed blocks of 16 tokens, batch 4, the pretrain collator."""
    from accelerate.state import AcceleratorState, GradientState
    from datasets import Dataset

    import modeling
    from pretrain.collators import MLMCollator
    from pretrain.data import IndexedDataset

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 200, (48, 16), generator=g)
    ids[:, 0] = 2
    data = IndexedDataset(Dataset.from_dict({"input_ids": ids.tolist(), "word_start": torch.ones_like(ids).tolist()}))
    config = TrainingConfig(
        output_dir=str(tmp_path),
        learning_rate=1e-3,
        max_train_steps=steps,
        num_warmup_steps=1,
        logging_steps=logging_steps,
        seed=0,
    )
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    acc = make_accelerator(config)
    torch.manual_seed(0)
    model = modeling.SesameBertForMaskedLM(
        modeling.get_preset_config("bert-tiny", vocab_size=200, sparse_prediction=sparse_prediction)
    )
    kwargs = {} if fused is None else {"optimizer": create_optimizer(model, 1e-3, fused=fused)}
    loader = make_train_dataloader(data, 4, MLMCollator(_Tokenizer(), seed=0), seed=0)
    return Trainer(acc, model, loader, config, **kwargs)


def test_mlm_training_reads_the_device_only_at_logging_steps(tmp_path, fresh_state):
    """10 steps, logging every 5: one packed read at steps 5 and 10 (the loop's), nothing in between -- also not
    in the model's forward (packed blocks come without an attention mask, so it tests none)."""
    trainer = _mlm_trainer(tmp_path)
    assert trainer._device_skip_supported(), "the default AdamW is the fused one"
    with HostReads(trainer) as mode:
        result = trainer.train()
    per_step = {(s, f, fn): n for (s, f, fn), n in mode.reads.items() if s < 10}
    assert per_step == {(5, os.path.join("training", "stats.py"), "read"): 1}, per_step
    assert [r["step"] for r in result["log_history"]] == [5, 10]
    assert all(torch.isfinite(torch.tensor(r["train_loss"])) for r in result["log_history"])


def test_an_optimizer_without_device_skip_reads_every_step(tmp_path, fresh_state):
    """The foreach AdamW cannot skip a non-finite update on the device: the loop reads each step's statistics
    before its update (the same logged numbers, up to the optimizers' rounding)."""
    trainer = _mlm_trainer(tmp_path / "foreach", fused=False)
    assert not trainer._device_skip_supported()
    with HostReads(trainer) as mode:
        foreach = trainer.train()
    steps = sorted(s for (s, f, fn) in mode.reads if fn == "read")
    assert steps == list(range(10)), steps  # read during step s+1, before its update (global_step is still s)
    fused = _mlm_trainer(tmp_path / "fused", fused=True).train()
    assert foreach["log_history"][0]["train_loss"] == pytest.approx(fused["log_history"][0]["train_loss"], rel=1e-4)
    assert foreach["train_loss"] == pytest.approx(fused["train_loss"], rel=1e-3)


def test_packed_blocks_come_without_an_attention_mask_and_padded_ones_with_it():
    """The MLM collator leaves the all-ones mask out (so the model tests nothing on the device) and keeps it when
    a block is shorter; the model's loss is the same with and without an all-ones mask."""
    import modeling
    from pretrain.collators import MLMCollator

    collator = MLMCollator(_Tokenizer(), seed=0)
    full = collator([{"input_ids": [2, 7, 8, 9, 3], "word_start": [1] * 5, "index": i} for i in range(2)])
    padded = collator(
        [
            {"input_ids": [2, 7, 8, 9, 3], "word_start": [1] * 5, "index": 0},
            {"input_ids": [2, 7, 3], "word_start": [1] * 3, "index": 1},
        ]
    )
    assert "attention_mask" not in full and padded["attention_mask"].tolist() == [[1] * 5, [1, 1, 1, 0, 0]]
    torch.manual_seed(0)
    model = modeling.SesameBertForMaskedLM(modeling.get_preset_config("bert-tiny", vocab_size=200)).eval()
    with torch.no_grad():
        without = model(**full).loss
        with_ones = model(**full, attention_mask=torch.ones_like(full["input_ids"])).loss
    torch.testing.assert_close(without, with_ones)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_no_cuda_synchronisation_between_logging_steps(tmp_path, fresh_state):
    """On CUDA, any synchronising call outside the loop's reads (and the final checkpoint) raises. Dense MLM
    prediction: the sparse head's ``nonzero`` is the model's own synchronisation, not the loop's."""
    trainer = _mlm_trainer(tmp_path, logging_steps=5, steps=10, sparse_prediction=False)
    read, save = trainer.stats.read, trainer.save_checkpoint

    def unguarded(fn):
        def call(*args, **kwargs):
            torch.cuda.set_sync_debug_mode(0)
            try:
                return fn(*args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode("error")

        return call

    trainer.stats.read, trainer.save_checkpoint = unguarded(read), unguarded(save)
    torch.cuda.set_sync_debug_mode("error")
    try:
        result = trainer.train()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert result["global_step"] == 10
