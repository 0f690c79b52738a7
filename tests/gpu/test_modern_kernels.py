"""Which kernel each layer type of a modern config runs on CUDA in bf16 (issue 50): the attention interface's kernels
are wrapped (``AttentionInterface.register``, put back after) to record the kernel's name, the metadata it got, and
whether FlashAttention's op ran (counted at ``aten._flash_attention_forward`` with its window). The design: packed
documents without attention dropout on FlexAttention's BlockMasks (global and local layers); with dropout the varlen
paths on flash (local layers with ``window_size`` = ``local_attention // 2``); unpacked rows' local layers on flash
with the window; never a 4-D mask tensor for a local layer."""

from __future__ import annotations

import pytest
import torch
from _tiny import micro_modern_kwargs
from torch.nn.attention.flex_attention import BlockMask
from transformers import AttentionInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from modeling import SesameBertConfig, SesameBertForMaskedLM
from modeling.bert.attention_sesame_bert import DocumentSequences, LocalSequences

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
LENGTH, WINDOW = 256, 32
NAMES = ("sdpa", "sesame_document_flex", "sesame_document_varlen", "sesame_local_sdpa", "sesame_local_varlen")


def _config(dropout: float) -> SesameBertConfig:
    return SesameBertConfig(
        **micro_modern_kwargs(
            hidden_size=128,  # heads of 32 dimensions (flex's CUDA kernels need at least 16)
            intermediate_size=96,
            local_attention=WINDOW,
            max_position_embeddings=LENGTH,
            num_hidden_layers=3,
            layer_types=["full_attention", "sliding_attention", "sliding_attention"],
            attention_probs_dropout_prob=dropout,
        )
    )


@pytest.fixture
def recorded(monkeypatch):
    """``calls``: layer type -> list of (kernel name, metadata type name); ``windows``: the flash op's windows."""
    calls: dict[str, list] = {}
    windows: list = []
    saved = {name: ALL_ATTENTION_FUNCTIONS[name] for name in NAMES}

    def wrap(name, kernel):
        def recording(module, query, key, value, mask, *args, **kwargs):
            kind = "sliding_attention" if module.sliding_window else "full_attention"
            calls.setdefault(kind, []).append((name, type(mask).__name__ if mask is not None else None, mask))
            return kernel(module, query, key, value, mask, *args, **kwargs)

        return recording

    for name, kernel in saved.items():
        AttentionInterface.register(name, wrap(name, kernel))
    flash = torch.ops.aten._flash_attention_forward

    def counting(*args, **kwargs):
        windows.append((kwargs.get("window_size_left"), kwargs.get("window_size_right")))
        return flash(*args, **kwargs)

    monkeypatch.setattr(torch.ops.aten, "_flash_attention_forward", counting)
    yield calls, windows
    for name, kernel in saved.items():
        AttentionInterface.register(name, kernel)


def _step(dropout: float, packed: bool):
    torch.manual_seed(0)
    model = SesameBertForMaskedLM(_config(dropout)).cuda().train()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, model.config.vocab_size, (2, LENGTH), generator=g)
    batch = dict(input_ids=ids, labels=ids.clone())
    if packed:
        splits = [[100, 90, 66], [120, 116, 20]]
        batch["position_ids"] = torch.cat([torch.cat([torch.arange(n) for n in s])[None] for s in splits])
    batch = {k: v.cuda() for k, v in batch.items()}
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(**batch).loss
    loss.backward()
    assert torch.isfinite(loss)


def test_packed_without_dropout_every_layer_on_flex(recorded):
    calls, windows = recorded
    _step(0.0, packed=True)
    assert [c[:2] for c in calls["full_attention"]] == [("sesame_document_flex", "BlockMask")]
    assert [c[:2] for c in calls["sliding_attention"]] == [("sesame_document_flex", "BlockMask")] * 2
    assert all(isinstance(c[2], BlockMask) for cs in calls.values() for c in cs) and windows == []


def test_packed_with_dropout_on_flash_varlen_with_the_window(recorded):
    calls, windows = recorded
    _step(0.1, packed=True)
    assert [c[:2] for c in calls["full_attention"]] == [("sesame_document_varlen", "DocumentSequences")]
    assert [c[:2] for c in calls["sliding_attention"]] == [("sesame_local_varlen", "LocalSequences")] * 2
    assert isinstance(calls["full_attention"][0][2], DocumentSequences)
    assert windows.count((None, None)) == 1 and windows.count((WINDOW // 2, WINDOW // 2)) == 2


def test_unpacked_local_layers_on_flash_with_the_window(recorded):
    calls, windows = recorded
    _step(0.0, packed=False)
    assert [c[:2] for c in calls["full_attention"]] == [("sdpa", None)]  # no mask: SDPA's own flash kernel
    assert [c[:2] for c in calls["sliding_attention"]] == [("sesame_local_varlen", "LocalSequences")] * 2
    assert all(isinstance(c[2], LocalSequences) for c in calls["sliding_attention"])
    assert windows == [(WINDOW // 2, WINDOW // 2)] * 2
