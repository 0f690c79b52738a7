"""Packed documents on CUDA (``python -m pytest -m gpu``; skipped without a GPU): SDPA takes FlexAttention on a
``BlockMask`` (no dense per-batch mask) and each document still gets the hidden states of its own forward pass; the
backward matches SDPA's dense-mask path; bf16 autocast and ``torch.compile`` of the whole model work on it. With
attention dropout in training SDPA runs on the unpadded documents (a nested jagged tensor, its varlen kernels): the
same loss and gradients as the dense mask without dropout, eager and compiled, and no dropout draw that depends on
another document."""

from __future__ import annotations

import copy

import pytest
import torch
from _helpers import assert_documents_alone, assert_same_gradients
from precision.conftest import BERT_TINY  # tests/ is on sys.path (pyproject's pythonpath)
from torch.nn.attention.flex_attention import BlockMask

from modeling import SesameBertConfig, SesameBertForMaskedLM, SesameBertModel
from modeling.bert import modeling_sesame_bert as msb

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
#: The tiny BERT with heads of 32 dimensions: FlexAttention's CUDA kernels need at least 16 (the CPU tests' 8 fail).
CUDA_TINY = dict(BERT_TINY, hidden_size=64, num_attention_heads=2, intermediate_size=128)


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


def _recording(monkeypatch, kernel: str = "sesame_document_flex"):
    """Record the mask every call of ``kernel`` (``"sesame_document_flex"`` or ``"sesame_document_varlen"``, as
    registered with transformers' ``AttentionInterface``) gets."""
    from _helpers import attention_kernel, swap_attention_kernel

    seen, original = [], attention_kernel(kernel)
    swap_attention_kernel(
        monkeypatch,
        kernel,
        lambda m, q, k, v, mask, **kw: (seen.append(mask), original(m, q, k, v, mask, **kw))[1],
    )
    return seen


def test_packed_documents_on_cuda_take_flex_and_equal_separate_passes(monkeypatch, no_tf32):
    torch.manual_seed(0)
    model = SesameBertModel(SesameBertConfig(**CUDA_TINY, **NO_DROPOUT)).cuda().eval()
    batch, splits = _packed(model.config.vocab_size)
    batch = {k: v.cuda() for k, v in batch.items()}
    seen = _recording(monkeypatch)
    with torch.no_grad():
        packed = model(**batch).last_hidden_state
        assert len(seen) == model.config.num_hidden_layers and all(isinstance(m, BlockMask) for m in seen)
        assert_documents_alone(model, batch["input_ids"], packed, splits, atol=1e-4)


def test_flex_under_bf16_autocast_and_torch_compile(monkeypatch):
    """bf16 autocast, eager model and compiled model (the flex call traced into the model's graph): the packed
    hidden states agree with the dense SDPA path within bf16 rounding; a second batch shape compiles without error."""
    torch.manual_seed(0)
    model = SesameBertModel(SesameBertConfig(**CUDA_TINY, **NO_DROPOUT)).cuda().eval()
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


def test_attention_dropout_in_training_takes_the_varlen_path(monkeypatch):
    """The default config (attention dropout 0.1) in training under bf16 autocast: every layer runs SDPA on the
    unpadded documents; the loss is finite and every parameter gets a gradient."""
    model = SesameBertForMaskedLM(SesameBertConfig(**CUDA_TINY)).cuda().train()
    batch, _ = _packed(model.config.vocab_size)
    batch = {k: v.cuda() for k, v in batch.items()}
    flex, varlen = _recording(monkeypatch), _recording(monkeypatch, "sesame_document_varlen")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(**batch, labels=batch["input_ids"]).loss
    loss.backward()
    assert not flex and len(varlen) == model.config.num_hidden_layers
    assert all(isinstance(m, msb.DocumentSequences) for m in varlen)
    assert torch.isfinite(loss) and all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize(
    "path, autocast, compiled",
    [("document_flex", False, False), ("document_varlen", False, False), ("document_varlen", True, False)]
    + [("document_varlen", True, True)],
)
def test_document_paths_backward_matches_the_dense_sdpa_mask(monkeypatch, no_tf32, path, autocast, compiled):
    """Training without attention dropout on each CUDA path, forced (varlen: float32 runs SDPA's memory-efficient
    kernel, bf16 its flash kernel), eager and ``torch.compile``-d: the loss and gradients equal SDPA's dense-mask
    path (float32: elementwise; bf16 autocast: within 2% of each gradient's norm)."""
    torch.manual_seed(0)
    model = SesameBertForMaskedLM(SesameBertConfig(**CUDA_TINY, **NO_DROPOUT)).cuda().train()
    dense_model = copy.deepcopy(model)
    batch, _ = _packed(model.config.vocab_size)
    batch = {k: v.cuda() for k, v in batch.items()}
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    labels[:, 1::2] = -100
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        with monkeypatch.context() as m:
            m.setattr(msb, "packed_documents_kernel", lambda config, *args: config._attn_implementation)
            dense = dense_model(**batch, labels=labels).loss
        seen = _recording(monkeypatch, f"sesame_{path}")
        monkeypatch.setattr(msb, "packed_documents_kernel", lambda *args: path)
        loss = (torch.compile(model) if compiled else model)(**batch, labels=labels).loss
    dense.backward()
    loss.backward()
    assert seen, f"the {path} path ran"
    assert_same_gradients(model, dense_model, loss, dense, autocast)


def test_varlen_dropout_draws_stay_within_documents():
    """Attention dropout 0.5 in training under bf16 autocast: the same seed gives a document the same hidden states
    whatever the other documents of its row hold, another seed other ones."""
    config = SesameBertConfig(**CUDA_TINY, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.5)
    model = SesameBertModel(config).cuda().train()
    batch, splits = _packed(config.vocab_size)
    batch = {k: v.cuda() for k, v in batch.items()}
    other = dict(batch, input_ids=batch["input_ids"].clone())
    first = splits[0][0]
    other["input_ids"][0, first:] = torch.randint(5, config.vocab_size, other["input_ids"][0, first:].shape).cuda()

    def hidden(inputs, seed):
        torch.manual_seed(seed)
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            return model(**inputs).last_hidden_state.float()

    reference = hidden(batch, 1)
    torch.testing.assert_close(hidden(other, 1)[0, :first], reference[0, :first], rtol=0, atol=0)
    assert (hidden(other, 1)[0, first:] - reference[0, first:]).abs().max() > 1e-2
    assert (hidden(batch, 2) - reference).abs().max() > 1e-2


def _operators():
    """The bench's :class:`OperatorLog` (counts the operators that run, by name), loaded by path."""
    import sys
    from pathlib import Path

    from _launch import load_module

    folder = Path(__file__).resolve().parents[2] / "bench"
    if str(folder) not in sys.path:
        sys.path.append(str(folder))  # the script imports its neighbour _script_env
    return load_module(folder / "bench_document_step.py", "document_step").OperatorLog()


def _collated(vocab_size: int) -> dict:
    """A packed batch with the sequences ``pretrain``'s collator computes on the host, on CUDA."""
    from pretrain.collators import PackedSequences

    batch, _ = _packed(vocab_size)
    collated = PackedSequences(lambda examples: dict(batch))(None)
    return {k: v.cuda() if torch.is_tensor(v) else v for k, v in collated.items()}


def test_bf16_varlen_path_runs_flash_varlen_and_reads_nothing_back():
    """Training with attention dropout under bf16 autocast, the collator's sequences given: every layer runs
    FlashAttention's varlen kernel forward and backward (``aten._flash_attention_forward`` / ``_backward``), not
    SDPA's nested-tensor dispatch, and the forward and backward read nothing back from the device (sync debug mode
    "error" raises on any device-to-host read)."""
    model = SesameBertModel(SesameBertConfig(**CUDA_TINY)).cuda().train()  # attention dropout 0.1
    batch = _collated(model.config.vocab_size)
    with torch.autocast("cuda", dtype=torch.bfloat16):  # first call: allocations, kernel loading
        model(**batch).last_hidden_state.float().square().mean().backward()
    torch.cuda.synchronize()
    operators = _operators()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with operators, torch.autocast("cuda", dtype=torch.bfloat16):
            model(**batch).last_hidden_state.float().square().mean().backward()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    layers = model.config.num_hidden_layers
    assert operators.counts.get("_flash_attention_forward") == layers, operators.counts
    assert operators.counts.get("_flash_attention_backward") == layers, operators.counts
    assert not any("nested" in name or "efficient" in name for name in operators.counts), operators.counts


def test_float32_varlen_path_takes_the_memory_efficient_kernel():
    """float32 (no autocast) on the varlen path: SDPA on nested tensors runs with only its memory-efficient kernel
    enabled (it would raise if that kernel refused the inputs), forward and backward, and the real tokens get the
    dense-mask path's hidden states."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model = SesameBertModel(SesameBertConfig(**CUDA_TINY, **NO_DROPOUT)).cuda().train()
    batch = _collated(model.config.vocab_size)
    keep = batch["attention_mask"].bool()
    with torch.no_grad():
        model.eval()
        with pytest.MonkeyPatch.context() as m:
            m.setattr(msb, "packed_documents_kernel", lambda config, *args: config._attn_implementation)
            dense = model(**batch).last_hidden_state
        model.train()
    with pytest.MonkeyPatch.context() as m, sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
        m.setattr(msb, "packed_documents_kernel", lambda *args: "document_varlen")
        hidden = model(**batch).last_hidden_state
        hidden[keep].square().mean().backward()
    torch.testing.assert_close(hidden[keep], dense[keep], rtol=1e-4, atol=1e-4)


def test_unpacked_bf16_blocks_take_the_flash_kernel():
    """Masking off (full blocks, no mask) in bf16: SDPA's flash kernel alone serves the forward and backward."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model = SesameBertForMaskedLM(SesameBertConfig(**CUDA_TINY)).cuda().train()
    ids = torch.randint(5, model.config.vocab_size, (4, 64), device="cuda")
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]), torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss)
