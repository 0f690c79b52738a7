"""Local (sliding-window) layers on CUDA (issue 50): "sdpa" runs FlashAttention's varlen kernel with its window
(bf16; unpacked and packed, with attention dropout) or FlexAttention on the sliding + document BlockMask (packed,
no dropout); no local layer gets a (T, T) tensor, and the loss and gradients equal a dense reference (the eager
kernel on a (T, T) band mask written here, in float32 on the same device). The CPU tests fake these kernels
(tests/bert/test_local_attention.py); these run the real ones."""

from __future__ import annotations

import copy

import pytest
import torch
from _helpers import assert_same_gradients, attention_kernel, swap_attention_kernel
from _tiny import micro_modern_kwargs

from modeling import SesameBertConfig, SesameBertForMaskedLM
from modeling.bert import modeling_sesame_bert as msb
from modeling.bert.attention_sesame_bert import document_ids, eager_attention_forward

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
LENGTH, WINDOW = 256, 32
#: heads of 32 dimensions (FlexAttention's CUDA kernels need at least 16)
CONFIG = micro_modern_kwargs(
    hidden_size=128,
    intermediate_size=96,
    local_attention=WINDOW,
    max_position_embeddings=LENGTH,
    num_hidden_layers=3,
    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
)


def _batch(packed: bool):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, CONFIG["vocab_size"], (2, LENGTH), generator=g)
    attention_mask = torch.ones_like(ids)
    attention_mask[1, -20:] = 0
    batch = dict(input_ids=ids, attention_mask=attention_mask)
    if packed:
        splits = [[100, 90, 66], [120, 116, 20]]  # the last 20 of row 1: padding
        batch["position_ids"] = torch.cat([torch.cat([torch.arange(n) for n in s])[None] for s in splits])
    return {k: v.cuda() for k, v in batch.items()}


def _dense(monkeypatch, name, batch):
    """The local layers' kernel ``name`` replaced by the eager kernel on the dense band (the reference)."""
    kernel = attention_kernel(name)
    keep = batch["attention_mask"].bool()
    documents = document_ids(batch["position_ids"]) if "position_ids" in batch else torch.zeros_like(keep).long()

    def dense(module, q, k, v, mask, scaling, dropout=0.0, **kwargs):
        if module.sliding_window is None:
            return kernel(module, q, k, v, mask, scaling=scaling, dropout=dropout, **kwargs)
        position = torch.arange(q.shape[2], device=q.device)
        band = (position[:, None] - position[None, :]).abs() <= WINDOW // 2
        allowed = band & (documents[:, :, None] == documents[:, None, :]) & keep[:, :, None] & keep[:, None, :]
        allowed = allowed | (torch.eye(q.shape[2], dtype=torch.bool, device=q.device) & ~keep[:, :, None])
        return eager_attention_forward(module, q, k, v, allowed[:, None], scaling, dropout)[0], None

    swap_attention_kernel(monkeypatch, name, dense)


@pytest.mark.parametrize("packed", [False, True])
def test_local_layers_take_flash_with_its_window_and_match_the_dense_band(monkeypatch, no_tf32, packed):
    """bf16 autocast training step: the local layers run FlashAttention's kernel with ``window_size_left = right =
    local_attention // 2`` (counted at the op), and the loss and gradients are within bf16's tolerance of the dense
    reference."""
    torch.manual_seed(0)
    model = SesameBertForMaskedLM(SesameBertConfig(**CONFIG)).cuda().train()
    reference = copy.deepcopy(model)
    batch = _batch(packed)
    if packed:  # the varlen path (as in training with attention dropout)
        monkeypatch.setattr(msb, "packed_documents_kernel", lambda *args: "document_varlen")
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    windows, flash = [], torch.ops.aten._flash_attention_forward

    def counting(*args, **kwargs):
        windows.append((kwargs.get("window_size_left"), kwargs.get("window_size_right")))
        return flash(*args, **kwargs)

    monkeypatch.setattr(torch.ops.aten, "_flash_attention_forward", counting)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(**batch, labels=labels).loss
    loss.backward()
    assert windows.count((WINDOW // 2, WINDOW // 2)) == 2, windows
    _dense(monkeypatch, "sesame_local_varlen", batch)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        reference_loss = reference(**batch, labels=labels).loss
    reference_loss.backward()
    assert_same_gradients(model, reference, loss, reference_loss, low_precision=True)


def test_packed_local_layers_take_flex_on_the_sliding_block_mask(no_tf32, monkeypatch):
    """Packed documents without attention dropout (evaluation): the local layers run FlexAttention on the sliding +
    document BlockMask, and the real tokens' logits equal the dense reference's (float32)."""
    torch.manual_seed(0)
    model = SesameBertForMaskedLM(SesameBertConfig(**CONFIG)).cuda().eval()
    batch = _batch(packed=True)
    keep = batch["attention_mask"].bool()
    kernel, masks = attention_kernel("sesame_document_flex"), []

    def recording(module, q, k, v, mask, **kwargs):
        if module.sliding_window is not None:
            masks.append(mask)
        return kernel(module, q, k, v, mask, **kwargs)

    with torch.no_grad():
        swap_attention_kernel(monkeypatch, "sesame_document_flex", recording)
        got = model(**batch).logits
        assert len(masks) == 2 and all(m.shape[-2:] == (LENGTH, LENGTH) for m in masks)  # BlockMasks, not tensors
        _dense(monkeypatch, "sesame_document_flex", batch)
        expected = model(**batch).logits
    torch.testing.assert_close(got[keep], expected[keep], rtol=1e-4, atol=1e-4)
