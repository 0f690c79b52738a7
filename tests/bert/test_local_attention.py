"""Local (sliding-window) attention without a (T, T) mask (issue 50): on every attention path the local layers' kernel
gets no tensor of T x T elements, and the model's outputs and gradients equal those of a dense reference (a (T, T)
band mask built here from transformers' ``sliding_window_bidirectional_overlay`` at ``ModernBertConfig(
local_attention=W).sliding_window``, run by the eager kernel). The CUDA kernels (FlashAttention's varlen kernel with
its window) are faked on the CPU by a reference written here, which records what it is given."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import transformers
from _helpers import assert_same_gradients, attention_kernel, swap_attention_kernel
from _tiny import micro_modern_kwargs
from transformers.masking_utils import sliding_window_bidirectional_overlay

from modeling import SesameBertConfig, SesameBertForMaskedLM
from modeling.bert import attention_sesame_bert, modeling_sesame_bert
from modeling.bert.attention_sesame_bert import (
    eager_attention_forward,
    local_blocks,
    local_eager_attention,
    local_sdpa_attention,
    token_groups,
)

WINDOW = 8  # local_attention: a token sees the tokens at most 4 positions away
LENGTH = 200  # 13 query blocks of 16 tokens: a (T, T) tensor is larger than every block structure
MODERN = micro_modern_kwargs(
    local_attention=WINDOW,
    max_position_embeddings=256,
    num_hidden_layers=3,
    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
)


@pytest.fixture(autouse=True)
def _seed_and_threads(seeded_single_thread):
    """Every test here: seed 0, one torch thread (tests/conftest.py)."""


def reference_band(length: int, window: int) -> torch.Tensor:
    """(T, T) bool: ModernBERT's window as transformers defines it (``ModernBertConfig.sliding_window`` =
    ``local_attention // 2``, the bidirectional overlay ``|q - kv| <= sliding_window``)."""
    half = transformers.ModernBertConfig(local_attention=window).sliding_window
    overlay = sliding_window_bidirectional_overlay(half)
    q, kv = torch.arange(length)[:, None], torch.arange(length)[None, :]
    return overlay(0, 0, q, kv)


def reference_mask(length, window, documents=None, keep=None) -> torch.Tensor:
    """(B|1, 1, T, T) bool: the band, within each document, between real tokens; a padding query attends to
    itself only."""
    allowed = reference_band(length, window)[None, None]
    if documents is not None:
        allowed = allowed & (documents[:, None, :, None] == documents[:, None, None, :])
    if keep is not None:
        itself = torch.eye(length, dtype=torch.bool)[None, None]
        allowed = (allowed & keep[:, None, :, None] & keep[:, None, None, :]) | (itself & ~keep[:, None, :, None])
    return allowed


def _batch(packed: bool, pad: int = 30, rows: int = 2, seed: int = 0):
    """``rows`` rows of :data:`LENGTH` random ids; the last row ends in ``pad`` padding tokens; ``packed``: position
    ids of documents of 1-70 tokens. Returns (batch, documents or None, keep)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, MODERN["vocab_size"], (rows, LENGTH), generator=g)
    attention_mask = torch.ones_like(ids)
    attention_mask[-1, LENGTH - pad :] = 0
    batch = dict(input_ids=ids, attention_mask=attention_mask)
    documents = None
    if packed:
        position_ids = torch.zeros_like(ids)
        for r in range(rows):
            t = 0
            while t < LENGTH:
                n = min(int(torch.randint(1, 71, (1,), generator=g)), LENGTH - t)
                position_ids[r, t : t + n] = torch.arange(n)
                t += n
        batch["position_ids"] = position_ids
        documents = attention_sesame_bert.document_ids(position_ids)
    return batch, documents, attention_mask.bool()


def _tensors(value):
    """Every tensor in a kernel's mask argument (a tensor, a dataclass of tensors, a BlockMask)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if hasattr(value, "as_tuple"):  # BlockMask
        return [t for t in value.as_tuple(flatten=True) if isinstance(t, torch.Tensor)]
    if hasattr(value, "__dataclass_fields__"):
        return [t for name in value.__dataclass_fields__ for t in _tensors(getattr(value, name))]
    return []


def _record(monkeypatch, name: str) -> list:
    """Wrap the registered kernel ``name``: record (query shape, mask tensors' shapes, kwargs) of its local-layer
    calls."""
    kernel, calls = attention_kernel(name), []

    def recording(module, query, key, value, attention_mask, **kwargs):
        if module.sliding_window is not None:
            shapes = [tuple(t.shape) for t in _tensors(attention_mask)]
            calls.append((tuple(query.shape), shapes, {k: v for k, v in kwargs.items() if not torch.is_tensor(v)}))
        return kernel(module, query, key, value, attention_mask, **kwargs)

    swap_attention_kernel(monkeypatch, name, recording)
    return calls


def _dense_reference(monkeypatch, name: str, documents, keep):
    """Replace the local layers' kernel ``name`` by the eager kernel on :func:`reference_mask` (full layers keep
    theirs)."""
    kernel = attention_kernel(name)

    def dense(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        if module.sliding_window is None:
            return kernel(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
        mask = reference_mask(query.shape[2], module.config.local_attention, documents, keep)
        context, _ = eager_attention_forward(module, query, key, value, mask, scaling, dropout)
        return context, None

    swap_attention_kernel(monkeypatch, name, dense)


def fake_flash_forward(calls: list):
    """A CPU stand-in of ``torch.ops.aten._flash_attention_forward`` (FlashAttention-2's varlen kernel): attention
    within each sequence of ``cu_seq_q``, keys within ``[i - window_size_left, i + window_size_right]`` (None: all),
    written with SDPA per sequence; differentiable. Records its arguments in ``calls``."""

    def kernel(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p, is_causal, debug, *, scale=None, **kwargs):
        left, right = kwargs.get("window_size_left"), kwargs.get("window_size_right")
        calls.append(dict(shape=tuple(q.shape), cu=cu_q.tolist(), max=max_q, window=(left, right), dropout=dropout_p))
        assert torch.equal(cu_q, cu_k) and max_q == max_k and not is_causal
        outputs = []
        for start, end in zip(cu_q[:-1].tolist(), cu_q[1:].tolist()):
            position = torch.arange(end - start)
            distance = position[:, None] - position[None, :]  # q - kv
            allowed = torch.ones(end - start, end - start, dtype=torch.bool)
            if left is not None:
                allowed = (distance <= left) & (-distance <= right)
            q_, k_, v_ = (x[start:end].transpose(0, 1) for x in (q, k, v))
            outputs.append(F.scaled_dot_product_attention(q_, k_, v_, attn_mask=allowed, scale=scale).transpose(0, 1))
        return torch.cat(outputs), None, None, None, None

    return kernel


#: path -> (config._attn_implementation, packed_documents_kernel's answer (None: not forced), the local kernel)
PATHS = {
    "eager": ("eager", None, "sesame_local_eager"),
    "sdpa": ("sdpa", None, "sesame_local_sdpa"),
    "document_varlen": ("sdpa", "document_varlen", "sesame_local_varlen"),  # the CPU fallback: blocks
    "document_varlen-flash": ("sdpa", "document_varlen", "sesame_local_varlen"),  # the flash kernel, faked
    "sdpa-cuda-flash": ("sdpa", None, "sesame_local_varlen"),  # unpacked sdpa on CUDA: flash with its window
}


def _model(implementation):
    torch.manual_seed(0)
    model = SesameBertForMaskedLM(SesameBertConfig(**MODERN))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.set_attn_implementation(implementation)
    return model


def _force(monkeypatch, path: str, flash_calls: list):
    implementation, packed_kernel, local = PATHS[path]
    if packed_kernel:
        monkeypatch.setattr(modeling_sesame_bert, "packed_documents_kernel", lambda *args: packed_kernel)
    if path.endswith("-flash"):
        monkeypatch.setattr(attention_sesame_bert, "flash_varlen_runs", lambda query: True)
        monkeypatch.setattr(torch.ops.aten, "_flash_attention_forward", fake_flash_forward(flash_calls))
    if path == "sdpa-cuda-flash":
        monkeypatch.setattr(modeling_sesame_bert, "local_attention_kernel", lambda full, device: local)


@pytest.mark.parametrize("autocast", [False, True])
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("path", list(PATHS))
def test_local_layers_get_no_square_tensor_and_match_the_dense_reference(path, packed, autocast, monkeypatch):
    """A training step (masked LM loss, backward) with padding, with and without packed documents: every local layer
    ran the path's kernel on metadata of fewer than T x T elements, and the loss and every gradient equal the dense
    reference's (float32: 1e-5; bf16 autocast: within 2% of each gradient's norm)."""
    implementation, packed_kernel, local = PATHS[path]
    if packed_kernel and not packed:
        pytest.skip("the document paths are taken for packed documents only")
    flash_calls = []
    _force(monkeypatch, path, flash_calls)
    batch, documents, keep = _batch(packed)
    labels = torch.where(torch.rand(batch["input_ids"].shape) < 0.3, batch["input_ids"], -100)
    labels[~keep] = -100

    def step(model):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(**batch, labels=labels).loss
        loss.backward()
        return loss.detach()

    model, reference = _model(implementation), _model(implementation)
    calls = _record(monkeypatch, local)
    loss = step(model)
    layers = MODERN["layer_types"].count("sliding_attention")
    assert len(calls) == layers
    for query_shape, mask_shapes, _ in calls:
        assert query_shape == (2, 4, LENGTH, 8)
        assert mask_shapes and all(torch.Size(s).numel() < LENGTH * LENGTH for s in mask_shapes), mask_shapes
    if path.endswith("-flash"):  # the kernel got the window (ModernBERT's: local_attention // 2 either side)
        local_calls = [c for c in flash_calls if c["window"] != (None, None)]
        assert len(local_calls) == layers and all(c["window"] == (WINDOW // 2, WINDOW // 2) for c in local_calls)
        assert all(c["shape"] == (2 * LENGTH, 4, 8) for c in flash_calls)  # unpadded tokens, no mask
    _dense_reference(monkeypatch, local, documents, keep)
    assert_same_gradients(model, reference, loss, step(reference), low_precision=autocast)


@pytest.mark.parametrize("length", [5, 31, 32, 100, 257])
@pytest.mark.parametrize("window", [2, 8, 64, 128])
def test_blocked_kernels_equal_the_dense_band(length, window):
    """:func:`local_sdpa_attention` and :func:`local_eager_attention` on :func:`local_blocks` against SDPA on the
    dense reference mask, with packed documents and padding, for lengths shorter, equal to and longer than a block
    and windows wider than the sequence: outputs and input gradients within 1e-5 (float32); the eager kernel's
    probabilities, scattered to (B, A, T, T) when asked for, equal the dense softmax."""
    g = torch.Generator().manual_seed(length + window)
    q, k, v = (torch.randn(2, 3, length, 8, generator=g, requires_grad=True) for _ in range(3))
    documents = (torch.rand(2, length, generator=g) < 0.1).cumsum(-1)
    keep = torch.ones(2, length, dtype=torch.bool)
    keep[1, length - length // 4 :] = False
    blocks = local_blocks(token_groups(documents, keep, (2, length)), window)
    module = torch.nn.Module().eval()
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=reference_mask(length, window, documents, keep))
    grads = torch.autograd.grad(expected.square().sum(), (q, k, v))
    for kernel in (local_sdpa_attention, local_eager_attention):
        context, _ = kernel(module, q, k, v, blocks, scaling=8**-0.5)
        torch.testing.assert_close(context.transpose(1, 2), expected, rtol=0, atol=1e-5)
        for got, want in zip(torch.autograd.grad(context.square().sum(), (q, k, v)), grads):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    _, probabilities = local_eager_attention(module, q, k, v, blocks, scaling=8**-0.5, output_attentions=True)
    scores = (q @ k.transpose(-1, -2)) * 8**-0.5
    dense = scores.masked_fill(~reference_mask(length, window, documents, keep), float("-inf")).softmax(-1)
    torch.testing.assert_close(probabilities, dense, rtol=0, atol=1e-6)


def _saved_bytes(function) -> int:
    """Bytes of the distinct storages autograd saves for the backward of ``function()`` (parameters aside)."""
    storages = {}

    def pack(tensor):
        storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        function()
    return sum(storages.values())


def test_local_layer_saves_no_more_than_a_global_one():
    """The key and value windows are strided views of one copy of the keys and values (not three copies each), so
    that what a local layer keeps for its backward is within the padding (two blocks and the last block's tail) of
    what global SDPA keeps for the same queries, keys and values, plus the window mask (SDPA's additive float mask,
    made once and shared by the local layers of a forward: the same storage in two calls); the three copies kept 1.9
    times as much here, and SDPA's conversion of the booleans a float mask per call."""
    q, k, v = (torch.randn(2, 4, 256, 16, requires_grad=True) for _ in range(3))
    blocks = local_blocks(torch.zeros(2, 256, dtype=torch.long), 64)  # blocks of 32: n = 8 per row
    local = _saved_bytes(lambda: local_sdpa_attention(None, q, k, v, blocks, scaling=0.25))
    full = _saved_bytes(lambda: F.scaled_dot_product_attention(q, k, v, scale=0.25))
    padding = 18 / 16  # keys and values: (2 rows x 8 blocks + 2) blocks of 32 for 2 x 256 tokens
    assert local <= full * padding + blocks.allowed.numel() * 4, (local, full)
    twice = _saved_bytes(lambda: [local_sdpa_attention(None, q, k, v, blocks, scaling=0.25) for _ in range(2)])
    assert twice == 2 * local - blocks.allowed.numel() * 4  # the mask once


def test_key_windows_gradient_and_rows():
    """:class:`_KeyWindows`: window ``r * n + i`` is row r's keys from block i - 1 to block i + 1, zero outside the
    row's (padded) keys where no neighbouring row is, the neighbouring row's keys where one is (the mask hides them);
    its backward passes ``gradcheck`` (float64)."""
    block, length = 4, 10  # n = 3 blocks per row, the last one 2 tokens short
    keys = torch.randn(2, 3, length, 5, dtype=torch.float64, requires_grad=True)
    windows = attention_sesame_bert._KeyWindows.apply(keys, block, 3)
    assert windows.shape == (6, 3, 12, 5)
    padded = F.pad(keys.detach(), (0, 0, 0, 2))  # (2, 3, 12, 5): each row to whole blocks
    flat = F.pad(padded.transpose(0, 1).reshape(3, 24, 5), (0, 0, block, block))  # rows one after the other
    for r in range(2):
        for i in range(3):
            start = (r * 3 + i) * block
            torch.testing.assert_close(windows[r * 3 + i].detach(), flat[:, start : start + 3 * block], rtol=0, atol=0)
    assert torch.count_nonzero(windows[0, :, :block]) == 0  # before the first row: zeros
    torch.testing.assert_close(windows[3, :, :block].detach(), padded[0, :, 8:])  # row 1's block 0 sees row 0's tail
    assert torch.autograd.gradcheck(lambda x: attention_sesame_bert._KeyWindows.apply(x, block, 3), (keys,))


def test_local_blocks_are_per_row_and_refuse_another_batch():
    """Blocks for B rows of shared groups (one row of ids) keep each query within its own row (a window that reaches
    into the neighbouring row allows nothing there), equal per block to the reference band; blocks built for one
    batch size are refused, with one line naming ``batch_size``, by a batch of another."""
    length, window = 32, 8  # blocks of 16, n = 2: row 1's first window starts in row 0's last block
    blocks = local_blocks(torch.zeros(1, length, dtype=torch.long), window, batch_size=3)
    assert blocks.allowed.shape == (6, 1, 16, 48)
    band = F.pad(reference_band(length, window), (16, 16))  # (T, T + 2 blocks): a window is 48 of its columns
    for m in range(6):
        i = m % 2
        torch.testing.assert_close(blocks.allowed[m, 0], band[16 * i : 16 * i + 16, 16 * i : 16 * i + 48])
    q = torch.randn(2, 1, length, 4)
    with pytest.raises(ValueError, match="batch_size=2"):
        local_sdpa_attention(None, q, q, q, blocks, scaling=0.5)
    with pytest.raises(ValueError, match="groups has 2 rows"):
        local_blocks(torch.zeros(2, length, dtype=torch.long), window, batch_size=3)


def test_flex_local_block_mask_is_the_reference_mask_and_runs(monkeypatch):
    """FlexAttention's local BlockMask (built from block ranges): its mask function gives the reference mask, the
    visited blocks cover every allowed pair, the full blocks hold allowed pairs only; a forward of the model on the
    FlexAttention document path (forced on the CPU: flex's unfused forward) equals the dense reference."""
    batch, documents, keep = _batch(packed=True)
    groups = token_groups(documents, keep, documents.shape)
    block, n = 16, -(-LENGTH // 16)
    q, kv = torch.arange(LENGTH)[:, None], torch.arange(LENGTH)[None, :]
    b = torch.arange(2)[:, None, None]
    for window in (WINDOW, 64):  # 64: blocks next to each other within the window (full blocks)
        mask = attention_sesame_bert.local_block_mask(groups, window, block=block)
        expected = reference_mask(LENGTH, window, documents, keep)[:, 0]
        torch.testing.assert_close(mask.mask_mod(b, 0, q, kv), expected, rtol=0, atol=0)
        dense_blocks = mask.to_dense()[:, 0].bool()  # (B, q blocks, kv blocks): visited (partial or full)
        padded = F.pad(expected, (0, n * block - LENGTH, 0, n * block - LENGTH)).view(2, n, block, n, block)
        assert not (padded.any(-1).any(-2) & ~dense_blocks).any()  # every block with an allowed pair is visited
        full_mask = torch.zeros(2, n, n, dtype=torch.bool)
        counts, indices = mask.full_kv_num_blocks[:, 0], mask.full_kv_indices[:, 0]
        for row in range(2):
            for i in range(n):
                full_mask[row, i, indices[row, i, : counts[row, i]].long()] = True
        assert padded.all(-1).all(-2)[full_mask].all()  # full blocks: every pair allowed
        assert (window == WINDOW) == (not full_mask.any())  # the check can fail

    model, reference = _model("sdpa").eval(), _model("sdpa").eval()
    monkeypatch.setattr(modeling_sesame_bert, "packed_documents_kernel", lambda *args: "document_flex")
    calls = _record(monkeypatch, "sesame_document_flex")
    with torch.no_grad():
        got = model(**batch).logits
        assert len(calls) == 2 and all(torch.Size(s).numel() < LENGTH * LENGTH for _, s, _ in calls for s in s)
        _dense_reference(monkeypatch, "sesame_document_flex", documents, keep)
        torch.testing.assert_close(got[keep], reference(**batch).logits[keep], rtol=0, atol=1e-5)


def test_each_path_builds_its_metadata_through_the_mask_interface(monkeypatch):
    """Every project path is registered with transformers' ``AttentionMaskInterface`` (a new instance, the public
    mapping, sees it) under its kernel's name, and the model takes the path's metadata from there: a builder registered
    over it with the public ``register`` is what the kernel then gets (and the original, registered back, restores the
    outputs bit for bit). Packed documents on the varlen path compute the shared sequences once per forward."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    masks = AttentionMaskInterface()
    for name, (kernel, builder) in attention_sesame_bert.ATTENTION_PATHS.items():
        assert masks[name] is builder and AttentionInterface()[name] is kernel
    batch, documents, keep = _batch(packed=True)
    model = _model("sdpa").eval()
    with torch.no_grad():
        expected = model(**batch).logits
    original = masks["sesame_local_sdpa"]
    seen = []

    def spy(*args, inputs, layer_type, **kwargs):
        seen.append((layer_type, inputs.shape, inputs.documents is not None))
        return original(*args, inputs=inputs, layer_type=layer_type, **kwargs)

    AttentionMaskInterface.register("sesame_local_sdpa", spy)
    try:
        with torch.no_grad():
            got = model(**batch).logits
    finally:
        AttentionMaskInterface.register("sesame_local_sdpa", original)
    assert seen == [("sliding_attention", (2, LENGTH), True)]  # once per forward, not once per layer
    assert torch.equal(got, expected)
    # both varlen paths (full and local layers) share one computation of the sequences
    calls = []
    sequences = attention_sesame_bert.document_sequences

    def counting(*args, **kwargs):
        calls.append(1)
        return sequences(*args, **kwargs)

    monkeypatch.setattr(attention_sesame_bert, "document_sequences", counting)
    monkeypatch.setattr(modeling_sesame_bert, "packed_documents_kernel", lambda *args: "document_varlen")
    with torch.no_grad():
        model(**batch)
    assert len(calls) == 1


def test_no_private_transformers_mapping_in_the_model():
    """The attention and mask interfaces are used through their public API only (issue 50, item 2)."""
    for module in (attention_sesame_bert, modeling_sesame_bert):
        source = open(module.__file__).read()
        assert "_global_mapping" not in source and "_local_mapping" not in source
