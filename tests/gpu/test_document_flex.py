"""Packed documents on CUDA (``python -m pytest -m gpu``; skipped without a GPU): SDPA takes FlexAttention on a
``BlockMask`` (no dense per-batch mask) and each document still gets the hidden states of its own forward pass; the
backward matches SDPA's dense-mask path; bf16 autocast and ``torch.compile`` of the whole model work on it; attention
dropout in training keeps the dense SDPA mask."""

from __future__ import annotations

import copy

import pytest
import torch
from _helpers import assert_documents_alone
from precision.conftest import BERT_TINY  # tests/ is on sys.path (pyproject's pythonpath)

from modeling import SesameBertConfig, SesameBertForMaskedLM, SesameBertModel
from modeling.bert import modeling_sesame_bert as msb

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _packed(vocab_size: int, rows: int = 4, length: int = 64, seed: int = 0):
    """``rows`` packed rows of random documents (lengths 1..length/2) and their splits; the last row ends in 5
    padding tokens (position ids 0, attention mask 0)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab_size, (rows, length), generator=g)
    position_ids = torch.zeros_like(ids)
    attention_mask = torch.ones_like(ids)
    splits = []
    for r in range(rows):
        real = length - (5 if r == rows - 1 else 0)
        lengths, used = [], 0
        while used < real:
            n = min(int(torch.randint(1, length // 2, (1,), generator=g)), real - used)
            lengths.append(n)
            used += n
        position_ids[r, :real] = torch.cat([torch.arange(n) for n in lengths])
        attention_mask[r, real:] = 0
        splits.append(lengths)
    return dict(input_ids=ids, attention_mask=attention_mask, position_ids=position_ids), splits


def _recording(monkeypatch):
    """Record the mask every :func:`document_flex_attention` call gets."""
    seen, flex = [], msb.document_flex_attention
    monkeypatch.setattr(
        msb,
        "document_flex_attention",
        lambda m, q, k, v, mask, **kw: (seen.append(mask), flex(m, q, k, v, mask, **kw))[1],
    )
    return seen


def test_packed_documents_on_cuda_take_flex_and_equal_separate_passes(monkeypatch, no_tf32):
    torch.manual_seed(0)
    model = SesameBertModel(SesameBertConfig(**BERT_TINY, **NO_DROPOUT)).cuda().eval()
    batch, splits = _packed(model.config.vocab_size)
    batch = {k: v.cuda() for k, v in batch.items()}
    seen = _recording(monkeypatch)
    with torch.no_grad():
        packed = model(**batch).last_hidden_state
        assert len(seen) == model.config.num_hidden_layers and all(isinstance(m, msb.BlockMask) for m in seen)
        assert_documents_alone(model, batch["input_ids"], packed, splits, atol=1e-4)


def test_flex_backward_matches_the_dense_sdpa_mask(monkeypatch, no_tf32):
    """Training without attention dropout: the flex path's loss and gradients equal SDPA's dense-mask path."""
    torch.manual_seed(0)
    flex_model = SesameBertForMaskedLM(SesameBertConfig(**BERT_TINY, **NO_DROPOUT)).cuda().train()
    dense_model = copy.deepcopy(flex_model)
    batch, _ = _packed(flex_model.config.vocab_size)
    batch = {k: v.cuda() for k, v in batch.items()}
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    labels[:, 1::2] = -100
    seen = _recording(monkeypatch)
    flex_model(**batch, labels=labels).loss.backward()
    assert seen, "the flex path ran"
    monkeypatch.setattr(msb, "packed_documents_kernel", lambda config, *args: config._attn_implementation)
    dense_model(**batch, labels=labels).loss.backward()
    for (name, a), b in zip(flex_model.named_parameters(), dense_model.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_flex_under_bf16_autocast_and_torch_compile(monkeypatch):
    """bf16 autocast, eager model and compiled model (the flex call traced into the model's graph): the packed
    hidden states agree with the dense SDPA path within bf16 rounding; a second batch shape compiles without error."""
    torch.manual_seed(0)
    model = SesameBertModel(SesameBertConfig(**BERT_TINY, **NO_DROPOUT)).cuda().eval()
    compiled = torch.compile(model)
    for rows in (4, 3):
        batch, _ = _packed(model.config.vocab_size, rows=rows)
        batch = {k: v.cuda() for k, v in batch.items()}
        keep = batch["attention_mask"].bool()
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            flex = model(**batch).last_hidden_state.float()
            flex_compiled = compiled(**batch).last_hidden_state.float()
            with monkeypatch.context() as m:
                m.setattr(msb, "packed_documents_kernel", lambda config, *args: config._attn_implementation)
                dense = model(**batch).last_hidden_state.float()
        torch.testing.assert_close(flex[keep], dense[keep], rtol=0, atol=5e-2)
        torch.testing.assert_close(flex_compiled[keep], dense[keep], rtol=0, atol=5e-2)


def test_attention_dropout_in_training_keeps_the_dense_mask(monkeypatch):
    model = SesameBertForMaskedLM(SesameBertConfig(**BERT_TINY)).cuda().train()  # attention dropout 0.1
    batch, _ = _packed(model.config.vocab_size)
    batch = {k: v.cuda() for k, v in batch.items()}
    seen = _recording(monkeypatch)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(**batch, labels=batch["input_ids"]).loss
    loss.backward()
    assert not seen and torch.isfinite(loss)
