"""Attention parts of SesameBert that do not depend on the model classes: position encodings (sinusoidal table,
rotary embeddings), the eager kernel, grouped-query attention, local (sliding-window) attention without a (T, T)
mask (blocked kernels, FlashAttention's window, a sliding ``BlockMask``; :func:`local_attention_kernel`), and
packed documents: their masks and the CUDA kernels that run them (FlexAttention on a ``BlockMask``, the varlen
kernels on unpadded documents, :func:`packed_documents_kernel`).

Shapes: B = batch, T = sequence length (tokens), A = query heads, K = key/value heads, D = head dimension.

This file is copied next to the weights by ``save_pretrained`` with ``modeling_sesame_bert.py`` (``auto_map`` +
remote code): it imports only torch, transformers and, relatively, ``configuration_sesame_bert``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, flex_attention
from transformers.masking_utils import and_masks, create_bidirectional_mask

from .configuration_sesame_bert import SesameBertConfig


# ---- position encodings --------------------------------------------------------------------------------------------
def sinusoidal_table(num_positions: int, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Fixed position encodings of Vaswani et al. 2017 (sec. 3.5): a (num_positions, dim) tensor of ``dtype``.

    ``p[i, 2j] = sin(i / 10000^(2j/dim))`` and ``p[i, 2j+1] = cos(i / 10000^(2j/dim))``; ``dim`` must be even.
    Computed in float64 and rounded once to ``dtype`` (default: ``torch.get_default_dtype()``, which
    ``from_pretrained(dtype=...)`` / ``from_config(dtype=...)`` set while they build the model).
    """
    position = torch.arange(num_positions, dtype=torch.float64)[:, None]
    inv_freq = torch.pow(10000.0, -torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    table = torch.zeros(num_positions, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq)
    return table.to(torch.get_default_dtype() if dtype is None else dtype)


class SinusoidalPositionEmbedding(nn.Module):
    """Fixed sinusoidal position embedding: ``forward(position_ids (B|1, T) long) -> (B|1, T, dim)``.

    The table is a non-persistent floating buffer (not saved, not trained), recomputed at initialisation in the
    buffer's own dtype; it follows the model's dtype (``from_pretrained(dtype=...)``, ``from_config(dtype=...)``,
    ``.to(dtype)``, ``.half()``), so the embedding sum stays in the weights' dtype.
    """

    def __init__(self, num_positions: int, dim: int):
        super().__init__()
        self.register_buffer("table", sinusoidal_table(num_positions, dim), persistent=False)

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(position_ids, self.table)


def rotary_cos_sin(
    position_ids: torch.Tensor, dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """The cosines and sines of rotary position embeddings (RoPE; Su et al. 2021, "RoFormer: Enhanced Transformer
    with Rotary Position Embedding", eq. 15 and 34) in the half-split layout of GPT-NeoX / Llama / ModernBERT: the
    frequency theta_i = ``theta`` ^ (-2i / ``dim``) pairs dimension i with i + dim/2.

    Computed in float32 from the positions on every call (no buffer: nothing to save, initialise or move); rounded
    once to ``dtype``.

    Args:
        position_ids: (B|1, T) integer positions (restarting per packed document).
        dim: the head dimension D (even).
        theta: the rotary base (the ``rope_theta`` of the layer type's ``rope_parameters``).
        dtype: the dtype of the queries and keys.

    Returns:
        ``(cos, sin)``, each (B|1, T, D) of ``dtype``.
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float, device=position_ids.device) / dim))
    freqs = position_ids[..., None].float() * inv_freq
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotary_embeddings(config: SesameBertConfig, position_ids: torch.Tensor, dtype: torch.dtype) -> dict:
    """The rotary ``(cos, sin)`` of every layer type of ``config``, each with its base (``rope_parameters[type]
    ["rope_theta"]``), or ``{}`` unless ``position_embedding_type`` is ``"rope"``.

    Args:
        config: the model's config.
        position_ids: (B|1, T) integer positions.
        dtype: the dtype of the queries and keys.
    """
    if config.position_embedding_type != "rope":
        return {}
    theta, dim = {kind: p["rope_theta"] for kind, p in config.rope_parameters.items()}, config.attention_head_dim
    return {kind: rotary_cos_sin(position_ids, dim, theta[kind], dtype) for kind in set(config.attention_types())}


def apply_rotary(
    query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate queries and keys by their positions (RoPE, Su et al. 2021, eq. 34): ``x * cos + rotate_half(x) * sin``
    with ``rotate_half([x1; x2]) = [-x2; x1]``, for float32 inputs computed as transformers' ModernBERT does.

    Float32 queries and keys are rotated half by half into one output (:class:`_Rotary`: ``x1 c1 - x2 s1``,
    ``x2 c2 + x1 s2``, with its own backward): the same bits as transformers' ModernBERT, forward and backward, in
    0.72x the time of ``roll(x, D/2) * [-sin1; sin2]`` (CPU, one thread, B2 A4 T1024 D64), which the other dtypes
    keep.

    Queries and keys in bfloat16 / float16 (under autocast) are rotated in their own dtype instead, with the cosines
    and sines rounded to it: ``addcmul(x * cos, roll(x), signed)``, no float32 copy of x and no cast back (two
    roundings per element instead of one: a relative error of 2.4e-3 against float64 where the float32 round trip
    has 1.7e-3, bf16 B2 A4 T1024 D64; bf16's epsilon is 7.8e-3); forward + backward of the rotation in 0.77-0.84x
    the time of the round trip on the CPU (one thread, bf16 B2 A4 T1024 D64, 2 runs of 28 interleaved repeats,
    medians). Float32 is unchanged (bit-identical to transformers' ModernBERT).

    Args:
        query: (B, A, T, D); key: (B, K, T, D); cos, sin: (B|1, T, D) from :func:`rotary_cos_sin`.

    Returns:
        The rotated ``(query, key)``, shapes and dtypes as given.
    """
    half = sin.shape[-1] // 2
    if query.dtype in (torch.bfloat16, torch.float16):
        cos, sin = cos.unsqueeze(1).to(query.dtype), sin.unsqueeze(1).to(query.dtype)
        signed = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
        return tuple(torch.addcmul(x * cos, x.roll(half, -1), signed) for x in (query, key))
    cos, sin = cos.unsqueeze(1).float(), sin.unsqueeze(1).float()
    if query.dtype == key.dtype == torch.float32:
        return _Rotary.apply(query, cos, sin), _Rotary.apply(key, cos, sin)
    signed = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)

    def rotate(x):
        x = x.float()
        return x * cos + x.roll(half, -1) * signed

    return rotate(query).to(query.dtype), rotate(key).to(key.dtype)


class _Rotary(torch.autograd.Function):
    """The float32 rotation on the two halves of x, written into one output: ``y1 = x1 c1 - x2 s1``, ``y2 = x2 c2 +
    x1 s2`` (``x * cos + rotate_half(x) * sin``, each product rounded once as there: the same bits as transformers'
    ModernBERT); backward ``dx1 = g1 c1 + g2 s2``, ``dx2 = g2 c2 - g1 s1`` (the rotation's transpose), the same bits
    as autograd's. Three passes over x each way instead of four, no roll (a concatenation on the CPU) and no saved
    copy: forward + backward of q and k in 0.72x the time of the roll form (CPU, one thread, B2 A4 T1024 D64,
    30 interleaved repeats, medians)."""

    @staticmethod
    def forward(ctx, x, cos, sin):
        half = x.shape[-1] // 2
        ctx.save_for_backward(cos, sin)
        return _Rotary.rotate(x, cos, sin, half, 1.0)

    @staticmethod
    def rotate(x, cos, sin, half: int, sign: float):
        """``sign`` 1: the rotation; -1: its transpose (the backward)."""
        x1, x2 = x[..., :half], x[..., half:]
        (c1, c2), (s1, s2) = (cos[..., :half], cos[..., half:]), (sin[..., :half], sin[..., half:])
        out = torch.empty(torch.broadcast_shapes(x.shape, cos.shape), dtype=x.dtype, device=x.device)
        y1, y2 = out[..., :half], out[..., half:]
        torch.mul(x1, c1, out=y1)
        torch.mul(x2, c2, out=y2)
        if sign > 0:
            y1.sub_(x2 * s1)
            y2.add_(x1 * s2)
        else:
            y1.add_(x2 * s2)
            y2.sub_(x1 * s1)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        return _Rotary.rotate(grad, cos, sin, grad.shape[-1] // 2, -1.0), None, None


def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """Grouped-query attention (Ainslie et al. 2023, "GQA"): every key/value head serves ``groups`` consecutive query
    heads. (B, K, T, D) -> (B, K * groups, T, D); returned as it is when ``groups`` is 1."""
    if groups == 1:
        return x
    batch, heads, length, dim = x.shape
    return x[:, :, None].expand(batch, heads, groups, length, dim).reshape(batch, heads * groups, length, dim)


# ---- the eager kernel ----------------------------------------------------------------------------------------------
def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention written out (Vaswani et al. 2017, eq. 1), transformers' "eager" signature.

    ``softmax(q k^T * scaling + mask) v`` with dropout on the probabilities (``dropout`` > 0 only in training).

    Args:
        module: the calling attention module (its ``training`` flag switches dropout).
        query, key, value: (B, A, T, D) float.
        attention_mask: ``None`` (attend everywhere), an additive float mask broadcastable to (B, A, T, T) (0 = attend,
            the dtype's minimum = masked; transformers' ``eager_mask``) or a boolean one (True = attend;
            ``sdpa_mask``), so that this kernel also serves "sdpa" layers asked for ``output_attentions``.
        scaling: multiplier of the scores, ``D ** -0.5``.
        dropout: dropout probability on the attention probabilities.

    Returns:
        ``(context (B, T, A, D), probabilities (B, A, T, T))``; the probabilities before dropout, in the scores' dtype
        (float32 under autocast when the mask is float32, as the mask addition promotes them).
    """
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
        else:
            scores = scores + attention_mask
    weights = scores.softmax(-1)
    context = torch.matmul(F.dropout(weights, dropout, module.training), value)
    return context.transpose(1, 2), weights


# ---- packed documents ---------------------------------------------------------------------------------------------
def document_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """The packed document of every token, from position ids that restart at 0 per document.

    A document starts where ``position_ids[b, t] != position_ids[b, t - 1] + 1`` (and at ``t = 0``): transformers'
    packed-sequence convention (``DataCollatorWithFlattening``, ``masking_utils.find_packed_sequence_indices``), here
    without that function's data-dependent shortcut, so no host synchronisation and nothing for export to guard on.

    Args:
        position_ids: (B, T) integer positions.

    Returns:
        (B, T) long: 0 for the first document of each row, then 1, 2, ... (e.g. positions ``[0 1 2 0 1 0]`` give
        ``[0 0 0 1 1 2]``).
    """
    return (torch.diff(position_ids, prepend=position_ids[:, :1] - 1, dim=-1) != 1).cumsum(-1)


def document_mask_function(documents: torch.Tensor, keep: torch.Tensor | None = None) -> Callable:
    """A ``masking_utils`` mask function (``(batch_idx, head_idx, q_idx, kv_idx) -> bool``, True = may attend) that
    keeps attention within a document: ``documents[b, q] == documents[b, kv]``.

    Args:
        documents: (B, T) long document ids (:func:`document_ids`).
        keep: (B, T) bool, False at padding, or ``None``. A padding query may attend to every key, so that no row of the
            mask is empty (the padding *keys* are masked by ``create_bidirectional_mask`` itself); padding outputs are
            meaningless either way, and an empty row would make some kernels return NaN there.
    """

    def same_document(batch_idx, head_idx, q_idx, kv_idx):
        same = documents[batch_idx, q_idx] == documents[batch_idx, kv_idx]
        return same if keep is None else same | ~keep[batch_idx, q_idx]

    return same_document


def document_dense_mask(documents: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
    """The boolean (B, 1, T, T) mask of packed documents for SDPA and the eager kernel (True = may attend): query
    ``q`` attends to key ``kv`` of its own document that is not padding; a padding query attends to every real key.
    The mask ``create_bidirectional_mask`` builds with :func:`document_mask_function`, by broadcasting (a few
    element-wise ops, no ``vmap``: about 0.1 ms of host time instead of ~15 ms at B256 T128,
    ``bench/bench_host_side.py``).

    Args:
        documents: (B, T) long document ids (:func:`document_ids`).
        keep: (B, T) bool, False at padding, or ``None``.
    """
    allowed = documents[:, None, :, None] == documents[:, None, None, :]
    if keep is not None:
        allowed = (allowed | ~keep[:, None, :, None]) & keep[:, None, None, :]
    return allowed


# ---- local (sliding-window) attention ------------------------------------------------------------------------------
def sliding_window_band(length: int, window: int, device=None) -> torch.Tensor:
    """The (T, T) boolean band of local attention, ModernBERT's meaning of the window: query ``q`` may attend to key
    ``kv`` when ``|q - kv| <= window // 2`` (``window`` tokens in all, half on each side; transformers'
    ``sliding_window_bidirectional_overlay`` with ``config.sliding_window = local_attention // 2``)."""
    position = torch.arange(length, device=device)
    return (position[:, None] - position[None, :]).abs() <= window // 2


def token_groups(documents: torch.Tensor | None, keep: torch.Tensor | None, shape, device=None) -> torch.Tensor:
    """The groups attention stays within for local layers: (B|1, T) long ids that rise by 0 or 1 per token, equal for
    two tokens of one packed document (``documents``) and different for every padding token (``keep`` False), which
    is a group of its own (it attends to itself only: its output is meaningless either way, and no row is empty).

    Args:
        documents: (B, T) long document ids (:func:`document_ids`), or ``None`` (one document per row).
        keep: (B, T) bool, False at padding, or ``None``.
        shape: (B, T), used when both are ``None`` (then a (1, T) tensor of zeros is returned).
        device: the device of that tensor.
    """
    ids = documents if documents is not None else torch.zeros(1, shape[1], dtype=torch.long, device=device)
    if keep is None:
        return ids
    ids = ids.expand(keep.shape[0], -1)
    padding = ~keep
    # a new group at every document start, at every padding token and at the token after one
    starts = (torch.diff(ids, prepend=ids[:, :1] - 1, dim=-1) != 0) | padding | F.pad(padding[:, :-1], (1, 0))
    return starts.cumsum(-1)


@dataclass(frozen=True)
class LocalBlocks:
    """Blocked local attention (the CPU path of ``"sliding_attention"`` layers): the T queries in blocks of
    ``block`` tokens, each against the ``3 * block`` keys from one block before it to one block after it
    (``block >= window // 2``, or one block covering every key), and the small mask of those pairs. Memory and
    work grow linearly in T: B x T x 3 ``block`` mask elements instead of T x T. Built by :func:`local_blocks`.

    The key windows are overlapping views of one copy of the keys (every row's keys one after the other, padded to
    whole blocks, with one block of padding before the first row and after the last), so that a window can reach into
    the neighbouring row; ``allowed`` is False there.

    Args:
        allowed: (B * n, 1, block, 3 * block) bool, True = may attend; n = ceil(T / block), row-major (row b's
            block i at b * n + i).
        block: query block size (tokens).
        window: ``local_attention`` (a token attends to the tokens at most ``window // 2`` positions away).
    """

    allowed: torch.Tensor
    block: int
    window: int
    _additive: dict = field(default_factory=dict, repr=False, compare=False)

    def additive_mask(self, dtype: torch.dtype) -> torch.Tensor:
        """``allowed`` as SDPA's additive mask: (B * n, 1, block, 3 * block) ``dtype``, 0 where allowed and -inf
        elsewhere (what SDPA would make of the booleans on every call and keep for its backward), made once per dtype
        and shared by the local layers of a forward."""
        if dtype not in self._additive:
            mask = torch.zeros(self.allowed.shape, dtype=dtype, device=self.allowed.device)
            self._additive[dtype] = mask.masked_fill_(~self.allowed, float("-inf"))
        return self._additive[dtype]


def local_blocks(groups: torch.Tensor, window: int, min_block: int = 16, batch_size: int | None = None) -> LocalBlocks:
    """The :class:`LocalBlocks` of a batch: query ``q`` may attend to key ``kv`` when ``|q - kv| <= window // 2``
    (ModernBERT's window, :func:`sliding_window_band`) and both are of one group (:func:`token_groups`) of one row.

    Args:
        groups: (B|1, T) long group ids (:func:`token_groups`).
        window: ``config.local_attention`` (even).
        min_block: the smallest query block (tokens): blocks of ``max(window // 2, min_block)`` tokens (at most T).
        batch_size: B, the rows of the batch the blocks are for (default: ``groups``' rows); ``groups`` of one row
            are shared by every row.

    Returns:
        The blocks; the queries past T (the last block's tail) attend to the out-of-range keys of their row near them
        (an id of -1), so that no row is empty; their outputs are dropped.

    Raises:
        ValueError: ``groups`` has neither 1 nor ``batch_size`` rows.
    """
    rows = groups.shape[0] if batch_size is None else batch_size
    if groups.shape[0] not in (1, rows):
        raise ValueError(f"local_blocks: groups has {groups.shape[0]} rows, expected 1 or batch_size={rows}")
    length, half = groups.shape[-1], window // 2
    block = min(max(half, min_block), length)
    n = -(-length // block)
    device = groups.device
    offsets = torch.arange(3 * block, device=device) - block - torch.arange(block, device=device)[:, None]
    band = offsets.abs() <= half  # (block, 3 block): key s of a window against query t of its block
    # every row's ids padded to whole blocks (-1), one after the other, one block of -1 before and after; the row of
    # each slot (-1 in the outer padding), so that a window reaching into the next row attends to nothing there
    ids = F.pad(groups.expand(rows, -1), (0, n * block - length), value=-1).reshape(-1)
    row = torch.arange(rows, device=device).repeat_interleave(n * block)
    ids, row = F.pad(ids, (block, block), value=-1), F.pad(row, (block, block), value=-1)
    key_ids, key_rows = ids.unfold(0, 3 * block, block), row.unfold(0, 3 * block, block)  # (B n, 3 block) views
    query_ids = ids[block:-block].view(-1, block, 1)
    query_rows = row[block:-block].view(-1, block, 1)
    allowed = band & (query_ids == key_ids[:, None, :]) & (query_rows == key_rows[:, None, :])
    return LocalBlocks(allowed[:, None], block, window)


class _KeyWindows(torch.autograd.Function):
    """(B, A, T, D) keys -> (B * n, A, 3 * b, D) key windows, n = ceil(T / b): window ``r * n + i`` holds row r's
    padded key blocks i - 1, i and i + 1 (:class:`LocalBlocks`). Forward: one copy of the keys, (A, (B * n + 2) * b,
    D), whose overlapping strided view is the windows (SDPA reads them in place and saves that view for its
    backward, so a local layer keeps one copy of its keys and values, as a global one does). Backward: each window
    third added back onto its block (one strided copy and two strided adds), instead of ``as_strided``'s or
    ``unfold``'s generic scatter."""

    @staticmethod
    def forward(ctx, keys, block: int, n: int):
        batch, heads, length, dim = keys.shape
        span = batch * n * block
        flat = keys.new_empty(heads, span + 2 * block, dim)
        flat[:, :block].zero_()
        flat[:, block + span :].zero_()
        rows = flat[:, block : block + span].view(heads, batch, n * block, dim)
        rows[:, :, length:].zero_()
        rows[:, :, :length].copy_(keys.transpose(0, 1))
        ctx.shape = (batch, heads, length, n, block, dim)
        return flat.as_strided((batch * n, heads, 3 * block, dim), (block * dim, flat.stride(0), dim, 1))

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        batch, heads, length, n, block, dim = ctx.shape
        span = batch * n * block
        flat = grad.new_empty(heads, span + 2 * block, dim)
        flat[:, :block].zero_()
        flat[:, block + span :].zero_()
        for j in (1, 0, 2):  # the middle third covers every real slot: copied, then the others added
            third = grad[:, :, j * block : (j + 1) * block].transpose(0, 1)  # (A, B n, b, D)
            target = flat[:, j * block : j * block + span].view(heads, batch * n, block, dim)
            if j == 1:
                target.copy_(third)
            else:
                target.add_(third)
        rows = flat[:, block : block + span].view(heads, batch, n * block, dim)[:, :, :length]
        return rows.transpose(0, 1), None, None


def _to_blocks(query, key, value, blocks: LocalBlocks):
    """(B, A, T, D) queries, keys, values -> (B * n, A, block, D) query blocks, (B * n, A, 3 block, D) key and value
    windows (strided views of one copy of the keys and of the values, :class:`_KeyWindows`: nothing of T x T), the
    (B * n, 1, block, 3 block) mask, and the function that maps the blocked context (B * n, A, block, D) back to
    (B, T, A, D). Four dimensions, so that SDPA can take its fused kernel (on the CPU the flash kernel, which takes a
    mask).

    Raises:
        ValueError: the blocks were built for another batch size or length."""
    batch, heads, length, dim = query.shape
    block = blocks.block
    n = -(-length // block)
    if blocks.allowed.shape[0] != batch * n:
        raise ValueError(
            f"LocalBlocks of {blocks.allowed.shape[0]} blocks for a batch of {batch} rows x {n} blocks of {block} "
            f"tokens (T={length}): build them with local_blocks(groups, window, batch_size={batch})"
        )
    padded = F.pad(query, (0, 0, 0, n * block - length))
    queries = padded.view(batch, heads, n, block, dim).transpose(1, 2).reshape(batch * n, heads, block, dim)

    def unblock(context):
        context = context.view(batch, n, heads, block, dim).transpose(2, 3).reshape(batch, n * block, heads, dim)
        return context[:, :length]

    keys, values = _KeyWindows.apply(key, block, n), _KeyWindows.apply(value, block, n)
    return queries, keys, values, blocks.allowed, unblock


def local_sdpa_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: LocalBlocks,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Local (sliding-window) attention in blocks (:class:`LocalBlocks`), through
    ``F.scaled_dot_product_attention`` on the query blocks and their key windows, in transformers' kernel signature:
    the same result as SDPA on the dense (T, T) band mask, with memory linear in T. Registered with transformers'
    ``AttentionInterface`` as ``"sesame_local_sdpa"``.

    Args:
        query, key, value: (B, A, T, D) float, one dtype.
        attention_mask: the blocks (:func:`local_blocks`).
        scaling: multiplier of the scores, ``D ** -0.5``.
        dropout: dropout probability on the attention probabilities.

    Returns:
        ``(context (B, T, A, D), None)``.
    """
    q, k, v, _, unblock = _to_blocks(query, key, value, attention_mask)
    mask = attention_mask.additive_mask(q.dtype)
    return unblock(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scaling)), None


def local_eager_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: LocalBlocks,
    scaling: float,
    dropout: float = 0.0,
    output_attentions: bool = False,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`eager_attention_forward` in blocks (:class:`LocalBlocks`): the scores of each query block against its
    key window only, written out (Vaswani et al. 2017, eq. 1). Registered as ``"sesame_local_eager"``.

    Args:
        query, key, value: (B, A, T, D) float; attention_mask: the blocks; scaling: ``D ** -0.5``; dropout: on the
            probabilities (in training).
        output_attentions: also return the probabilities (after dropout), scattered into a (B, A, T, T) tensor (zero
            outside the window), from which the context is then computed, so that they are in the graph (their
            gradients, as transformers' eager attention); what the caller asked for: without it no (T, T) tensor is
            made.

    Returns:
        ``(context (B, T, A, D), probabilities (B, A, T, T) or None)``.
    """
    q, k, v, mask, unblock = _to_blocks(query, key, value, attention_mask)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scaling
    weights = scores.masked_fill(~mask, torch.finfo(scores.dtype).min).softmax(-1)  # (B * n, A, block, 3 block)
    if not output_attentions:
        return unblock(torch.matmul(F.dropout(weights, dropout, module.training), v)), None
    batch, heads, length = query.shape[:3]
    block = attention_mask.block
    n = weights.shape[0] // batch
    dense = weights.new_zeros(batch, heads, n * block, (n + 2) * block)
    width = dense.shape[-1]
    # query block i's window starts at column i * block of the key axis padded by one block on each side
    strided = dense.as_strided((batch, n, heads, block, 3 * block), (dense.stride(0), block * width + block,
                               dense.stride(1), width, 1))  # fmt: skip
    strided.copy_(weights.view(batch, n, heads, block, 3 * block))
    # the context from the (T, T) probabilities returned, as eager attention computes it: they are in the graph
    probs = F.dropout(dense[:, :, :length, block : block + length], dropout, module.training)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs


def local_block_mask(groups: torch.Tensor, window: int, block: int = 128) -> BlockMask:
    """The FlexAttention ``BlockMask`` of local attention within groups (:func:`token_groups`: packed documents,
    padding tokens each on their own): query ``q`` attends to key ``kv`` of its group with ``|q - kv| <= window //
    2``. Built from block ranges as :func:`document_block_mask` (no dense mask, no ``vmap``, no host
    synchronisation): a (query block, key block) pair is visited when the group ranges of the two blocks overlap and
    its nearest tokens are within the window; it is full when both blocks are complete, within one group, and its
    farthest tokens are within the window too.

    Args:
        groups: (B, T) long group ids; window: ``config.local_attention``; block: the kernel's block size (tokens).

    Returns:
        A BlockMask for (B, 1, T, T).
    """
    batch, length = groups.shape
    half = window // 2

    def mask_mod(batch_idx, head_idx, q_idx, kv_idx):
        return (groups[batch_idx, q_idx] == groups[batch_idx, kv_idx]) & ((q_idx - kv_idx).abs() <= half)

    n = -(-length // block)
    ranges = F.pad(groups, (0, n * block - length), value=-1).view(batch, n, block)  # the tail: id -1
    first, last = ranges[..., 0], ranges.amax(-1)  # (B, n)
    index = torch.arange(n, device=groups.device)
    apart = (index[:, None] - index[None, :]).abs()  # (q, kv) blocks apart
    near = (apart - 1).clamp(min=0) * block + (apart > 0).long() <= half  # the nearest tokens within the window
    far = (apart + 1) * block - 1 <= half  # the farthest ones too
    visit = (first[:, :, None] <= last[:, None, :]) & (first[:, None, :] <= last[:, :, None]) & near
    whole = (first == last) & (index < length // block)
    full = whole[:, :, None] & whole[:, None, :] & (first[:, :, None] == first[:, None, :]) & far
    partial = visit & ~full

    def ordered(blocks):  # (B, q, kv) bool -> counts (B, 1, q) int32, indices (B, 1, q, kv) int32 (visited first)
        order = torch.argsort(blocks.to(torch.int8), dim=-1, descending=True, stable=True)
        return blocks.sum(-1, dtype=torch.int32)[:, None], order.to(torch.int32)[:, None]

    return BlockMask.from_kv_blocks(
        *ordered(partial), *ordered(full), BLOCK_SIZE=block, mask_mod=mask_mod, seq_lengths=(length, length)
    )


def sliding_window_mask(
    config: SesameBertConfig,
    embeddings: torch.Tensor,
    attention_mask: torch.Tensor | None,
    documents: torch.Tensor | None,
) -> torch.Tensor | BlockMask | None:
    """The window mask of ``"sliding_attention"`` layers for an attention implementation registered by the user (with
    ``AttentionMaskInterface``): ``create_bidirectional_mask`` with the window (``|q - kv| <= local_attention //
    2``) and the documents as ``and_mask_function``, in whatever form that implementation's mask function builds
    (a dense (T, T) one for "sdpa"-like functions: the project's own paths never come here). A padding query
    attends to every real key, so that no row is empty.

    Args:
        config: the model's config; embeddings: (B, T, H); attention_mask: (B, T) 1 = token, or ``None``;
        documents: (B, T) long document ids, or ``None``.
    """
    half = config.local_attention // 2
    keep = None if attention_mask is None else attention_mask.bool()
    functions: list[Callable] = [lambda b, h, q, kv: (q - kv).abs() <= half]
    if documents is not None:
        functions.append(lambda b, h, q, kv: documents[b, q] == documents[b, kv])
    window = and_masks(*functions)
    if keep is not None:
        inner = window

        def window(b, h, q, kv):  # noqa: F811  (a padding query attends to every real key)
            return inner(b, h, q, kv) | ~keep[b, q]

    return create_bidirectional_mask(
        config, embeddings, attention_mask, and_mask_function=window, allow_is_bidirectional_skip=False
    )


# ---- packed documents on CUDA: FlexAttention, the varlen kernels ----------------------------------------------------
_compiled_flex_attention: Callable | None = None  # torch.compile(flex_attention), built once per process


def document_flex_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: BlockMask,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """FlexAttention (torch.nn.attention.flex_attention; Dong et al. 2024, "Flex Attention: A Programming Model for
    Generating Optimized Attention Kernels") with the :class:`~torch.nn.attention.flex_attention.BlockMask` of packed
    documents (:func:`document_block_mask`), in transformers' kernel signature. SDPA layers run it for packed
    documents on CUDA when no attention dropout is in effect (:func:`packed_documents_kernel`): no dense (B, 1, T, T)
    mask is built, and the fused kernel skips the blocks of other documents.

    On CUDA the kernel is ``torch.compile(flex_attention)``, compiled once per process (and per new shape) and
    reused by every layer and step; inside an already compiled model (``--torch_compile``) flex_attention is traced
    into that graph. Elsewhere the unfused reference implementation runs (CPU: tests only).

    Args:
        query, key, value: (B, A, T, D) float, one dtype.
        attention_mask: a BlockMask for (B, 1 or A, T, T).
        scaling: multiplier of the scores, ``D ** -0.5``.
        dropout: must be 0 (flex has no dropout on the probabilities).

    Returns:
        ``(context (B, T, A, D), None)``.

    Raises:
        ValueError: ``dropout > 0``.
    """
    global _compiled_flex_attention
    if dropout > 0:
        raise ValueError(f"document_flex_attention: dropout {dropout} on the attention probabilities; expected 0")
    kernel = flex_attention
    if query.device.type == "cuda" and not torch.compiler.is_compiling():
        if _compiled_flex_attention is None:
            _compiled_flex_attention = torch.compile(flex_attention, dynamic=False)
        kernel = _compiled_flex_attention
    context = kernel(query, key, value, block_mask=attention_mask, scale=scaling)
    return context.transpose(1, 2), None


#: The packed-sequence arguments of transformers' flash varlen kernels (``DataCollatorWithFlattening(
#: return_flash_attn_kwargs=True)``; :func:`flash_varlen_kwargs`): given with a batch, the model uses them as they are.
PACKED_SEQUENCE_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


@dataclass(frozen=True)
class DocumentSequences:
    """The packed documents of a batch as the sequences of its flattened (B * T) tokens, for
    :func:`document_varlen_attention` (built by :func:`document_sequences`, or from the collator's
    :data:`PACKED_SEQUENCE_KEYS`).

    Args:
        cu_seqlens: (S + 1,) int32, the start of every sequence in the flattened tokens, then B * T (FlashAttention's
            ``cu_seqlens``).
        max_length: the longest sequence (tokens).
    """

    cu_seqlens: torch.Tensor
    max_length: int


def document_sequences(
    documents: torch.Tensor, keep: torch.Tensor | None = None, given: dict | None = None
) -> DocumentSequences:
    """Every document of every row as one sequence of the flattened (B * T) tokens, padding apart from the real
    tokens: the sequences of :func:`flash_varlen_kwargs`, as a :class:`DocumentSequences`. With ``given`` (the
    batch's :data:`PACKED_SEQUENCE_KEYS`, computed on the host by the collator) they are taken as they are and
    nothing is read from the device; otherwise this waits for the device once (two reads in a row: the number of
    sequences, then the longest, both shapes of the kernel's inputs).

    Args:
        documents: (B, T) long document ids (:func:`document_ids`).
        keep: (B, T) bool, False at padding, or ``None``.
        given: ``{"cu_seq_lens_q": (S + 1,) int32, "max_length_q": int, ...}`` or ``None``.
    """
    varlen = given if given else flash_varlen_kwargs(documents, keep)
    return DocumentSequences(varlen["cu_seq_lens_q"], int(varlen["max_length_q"]))


def document_varlen_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: DocumentSequences,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Attention within each packed document, on the unpadded documents, in transformers' kernel signature; no
    (B, 1, T, T) mask is built and no score across documents is computed. SDPA layers run it for packed documents
    on CUDA while attention dropout is in effect (:func:`packed_documents_kernel`), where FlexAttention, which has
    no dropout, cannot serve.

    - CUDA, float16 / bfloat16: FlashAttention-2's varlen kernel (Dao 2023, "FlashAttention-2: Faster Attention with
      Better Parallelism and Work Partitioning"; ``torch.ops.aten._flash_attention_forward`` with ``cu_seqlens``),
      called directly on (B * T, A, D) views of the projections (no copy), with dropout on the probabilities.
    - Otherwise (float32, the CPU): ``F.scaled_dot_product_attention`` on a nested tensor of jagged layout
      (``torch.nested.nested_tensor_from_jagged``), one sequence per document (on CUDA its memory-efficient varlen
      kernel, elsewhere the math kernel).

    Args:
        query, key, value: (B, A, T, D) float, one dtype.
        attention_mask: the sequences of the flattened tokens (:func:`document_sequences`).
        scaling: multiplier of the scores, ``D ** -0.5``.
        dropout: dropout probability on the attention probabilities.

    Returns:
        ``(context (B, T, A, D), None)``.

    Raises:
        RuntimeError: from the kernel, when none of SDPA's enabled kernels takes jagged inputs of this dtype and head
            size (e.g. the math kernel disabled with ``torch.nn.attention.sdpa_kernel`` and flash and
            memory-efficient refusing them), or when the flash kernel refuses the head size (> 256).
    """
    batch, heads, length, dim = query.shape
    sequences = attention_mask
    if flash_varlen_runs(query):
        return flash_varlen_attention(query, key, value, sequences, dropout, scaling), None

    offsets = sequences.cu_seqlens.long()  # nested tensors index with int64

    def jagged(x):  # (B, A, T, D) -> nested (S, A, j, D)
        flat = x.transpose(1, 2).reshape(batch * length, heads, dim).contiguous()  # the math kernel needs it
        return torch.nested.nested_tensor_from_jagged(
            flat, offsets, min_seqlen=1, max_seqlen=sequences.max_length
        ).transpose(1, 2)

    context = F.scaled_dot_product_attention(
        jagged(query), jagged(key), jagged(value), dropout_p=dropout, scale=scaling
    )
    return context.transpose(1, 2).values().view(batch, length, heads, dim), None


def flash_varlen_runs(query: torch.Tensor) -> bool:
    """Whether :func:`flash_varlen_attention` serves ``query`` (B, A, T, D): CUDA, float16 or bfloat16."""
    return query.is_cuda and query.dtype in (torch.float16, torch.bfloat16)


def flash_varlen_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    sequences: DocumentSequences,
    dropout: float,
    scaling: float,
    window: int | None = None,
) -> torch.Tensor:
    """FlashAttention-2's varlen kernel (Dao 2023; ``torch.ops.aten._flash_attention_forward`` with ``cu_seqlens``)
    on (B * T, A, D) views of the projections (no copy): attention within each sequence of the flattened tokens,
    with dropout on the probabilities and, with ``window``, local attention (``window_size_left = window_size_right
    = window // 2``: a token attends to the tokens at most ``window // 2`` positions away, ModernBERT's window).

    Args:
        query, key, value: (B, A, T, D), CUDA, float16 / bfloat16 (:func:`flash_varlen_runs`).
        sequences: the sequences of the flattened tokens (:class:`DocumentSequences`).
        dropout: dropout probability on the attention probabilities; scaling: ``D ** -0.5``.
        window: ``config.local_attention``, or ``None`` (global attention within each sequence).

    Returns:
        The context (B, T, A, D).
    """
    batch, heads, length, dim = query.shape

    def tokens(x):  # (B, A, T, D) -> (B * T, A, D): a view of the projection's output
        return x.transpose(1, 2).reshape(batch * length, heads, dim)

    cu, longest = sequences.cu_seqlens, sequences.max_length
    side = None if window is None else window // 2
    context = torch.ops.aten._flash_attention_forward(
        tokens(query),
        tokens(key),
        tokens(value),
        cu,
        cu,
        longest,
        longest,
        dropout,
        False,
        False,
        scale=scaling,
        window_size_left=side,
        window_size_right=side,
    )[0]
    return context.view(batch, length, heads, dim)


@dataclass(frozen=True)
class LocalSequences:
    """The metadata of :func:`local_varlen_attention`: the sequences of the flattened tokens for the flash kernel and
    the :class:`LocalBlocks` of the same batch for the other dtypes and devices.

    Args:
        sequences: the packed documents (and padding runs) as sequences (:func:`document_sequences`).
        blocks: the blocks of :func:`local_blocks`, whose ``window`` the flash kernel gets too.
    """

    sequences: DocumentSequences
    blocks: LocalBlocks


def local_varlen_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: LocalSequences,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Local (sliding-window) attention of "sdpa" layers on CUDA (:func:`local_attention_kernel`), in transformers'
    kernel signature: in float16 / bfloat16 FlashAttention's varlen kernel with its window
    (:func:`flash_varlen_attention`; unpadded documents, dropout on the probabilities), otherwise
    :func:`local_sdpa_attention` on the blocks. No (T, T) mask either way. Registered as ``"sesame_local_varlen"``.

    Args:
        query, key, value: (B, A, T, D) float, one dtype; attention_mask: :class:`LocalSequences`;
        scaling: ``D ** -0.5``; dropout: on the probabilities.

    Returns:
        ``(context (B, T, A, D), None)``.
    """
    blocks = attention_mask.blocks
    if flash_varlen_runs(query):
        context = flash_varlen_attention(query, key, value, attention_mask.sequences, dropout, scaling, blocks.window)
        return context, None
    return local_sdpa_attention(module, query, key, value, blocks, scaling, dropout)


def packed_documents_kernel(config, device: torch.device, training: bool, output_attentions: bool = False) -> str:
    """The kernel that runs packed documents (``position_ids`` given) for ``config._attn_implementation``. Neither
    builds a dense per-batch mask: "sdpa" on CUDA becomes

    - ``"document_flex"`` (:func:`document_flex_attention` on :func:`document_block_mask`) when no attention dropout
      is in effect (evaluation, or ``attention_probs_dropout_prob`` 0);
    - ``"document_varlen"`` (:func:`document_varlen_attention` on :func:`document_sequences`: SDPA's varlen kernels
      on unpadded documents) in training with attention dropout, which flex does not have.

    Asked for the probabilities (``output_attentions``) SDPA runs the eager kernel, on the dense mask. Every other
    case (the CPU, another implementation) is returned as it is."""
    implementation = config._attn_implementation
    if implementation != "sdpa" or device.type != "cuda" or output_attentions:
        return implementation
    if training and config.attention_probs_dropout_prob > 0:
        return "document_varlen"
    return "document_flex"


def local_attention_kernel(full: str, device: torch.device) -> str:
    """The kernel of the ``"sliding_attention"`` layers, given ``full``, the kernel chosen for the full-attention
    layers (``config._attn_implementation``, :func:`packed_documents_kernel`'s answer for packed documents, "eager"
    for "sdpa" asked for the probabilities). None of them gets a (T, T) mask:

    - "sdpa": ``"sesame_local_sdpa"`` (:func:`local_sdpa_attention`, blocks) on the CPU, ``"sesame_local_varlen"``
      (:func:`local_varlen_attention`, FlashAttention with its window) on CUDA; "document_varlen": the latter;
    - "eager": ``"sesame_local_eager"`` (:func:`local_eager_attention`, blocks);
    - "document_flex": ``"sesame_document_flex"`` and "flex_attention": itself, on :func:`local_block_mask`;
    - flash_attention_*: itself, with the window as ``sliding_window`` (transformers' flash wrapper makes it the
      kernel's ``window_size``) and the full layers' padding mask or varlen arguments;
    - any other (registered by the user): itself, on :func:`sliding_window_mask`.
    """
    if full == "document_varlen" or (full == "sdpa" and device.type == "cuda"):
        return "sesame_local_varlen"
    if full == "sdpa":
        return "sesame_local_sdpa"
    return {"eager": "sesame_local_eager", "document_flex": "sesame_document_flex"}.get(full, full)


def document_block_mask(documents: torch.Tensor, keep: torch.Tensor | None = None, block: int = 128) -> BlockMask:
    """The FlexAttention ``BlockMask`` of packed documents: a real query attends to the real keys of its document, as
    with :func:`document_dense_mask`; a padding token is a document of its own (a padding query attends to itself
    only: its output is meaningless either way, and the row is not empty). The kernel evaluates the mask from one
    (B, T) tensor of document ids on the fly (so that inductor's CPU template compiles it too); the block structure
    is computed from those ids directly (no dense mask, no ``vmap``, no host synchronisation).

    A (query block, key block) pair of ``block`` x ``block`` tokens is visited when the ranges of document ids of the
    two blocks overlap (the ids rise by 0 or 1 per token, so overlapping ranges share a document): a superset of the
    blocks with an allowed pair, so the mask is exact. A visited pair is *full* (the kernel skips the mask function
    there) when both blocks are complete and lie within one and the same document; the others are partial. At
    T <= ``block`` there is one block per row, full when the row is a single unpadded document of ``block`` tokens.

    Args:
        documents: (B, T) long document ids (:func:`document_ids`).
        keep: (B, T) bool, False at padding, or ``None``.
        block: the kernel's block size (tokens).

    Returns:
        A BlockMask for (B, 1, T, T).
    """
    batch, length = documents.shape
    if keep is not None:  # every padding token starts a document of its own
        starts = torch.diff(documents, prepend=documents[:, :1] - 1, dim=-1) != 0
        documents = (starts | ~keep).cumsum(-1)

    def mask_mod(batch_idx, head_idx, q_idx, kv_idx):
        return documents[batch_idx, q_idx] == documents[batch_idx, kv_idx]

    n = -(-length // block)
    ranges = F.pad(documents, (0, n * block - length), value=-1).view(batch, n, block)  # the tail: id -1
    first, last = ranges[..., 0], ranges.amax(-1)  # (B, n): first and last document id of each block
    visit = (first[:, :, None] <= last[:, None, :]) & (first[:, None, :] <= last[:, :, None])  # (B, q, kv)
    whole = (first == last) & (torch.arange(n, device=documents.device) < length // block)  # one document, no tail
    full = whole[:, :, None] & whole[:, None, :] & (first[:, :, None] == first[:, None, :])
    partial = visit & ~full

    def ordered(blocks):  # (B, q, kv) bool -> counts (B, 1, q) int32, indices (B, 1, q, kv) int32 (visited first)
        order = torch.argsort(blocks.to(torch.int8), dim=-1, descending=True, stable=True)
        return blocks.sum(-1, dtype=torch.int32)[:, None], order.to(torch.int32)[:, None]

    return BlockMask.from_kv_blocks(
        *ordered(partial), *ordered(full), BLOCK_SIZE=block, mask_mod=mask_mod, seq_lengths=(length, length)
    )


def flash_varlen_kwargs(documents: torch.Tensor, keep: torch.Tensor | None = None) -> dict:
    """FlashAttention's varlen arguments for packed documents: every document (and every run of padding) of every
    row becomes one sequence of the flattened (B * T) batch, so attention stays within it.

    Args:
        documents: (B, T) long document ids (:func:`document_ids`).
        keep: (B, T) bool, False at padding, or ``None``.

    Returns:
        ``cu_seq_lens_q`` / ``cu_seq_lens_k``: (S + 1,) int32 cumulative sequence starts over the flattened tokens;
        ``max_length_q`` / ``max_length_k``: int, the longest sequence. Reads the device (``nonzero``, ``max``): the
        varlen kernels need these on the host.
    """
    starts = torch.ones_like(documents, dtype=torch.bool)
    starts[:, 1:] = documents[:, 1:] != documents[:, :-1]
    if keep is not None:
        starts[:, 1:] |= keep[:, 1:] != keep[:, :-1]
    first = starts.reshape(-1).nonzero().squeeze(1)
    cu = torch.cat([first, first.new_full((1,), starts.numel())]).to(torch.int32)
    longest = int((cu[1:] - cu[:-1]).max())
    return dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=longest, max_length_k=longest)


# ---- the mask metadata of the project's attention paths ------------------------------------------------------------
@dataclass
class MaskInputs:
    """What the mask builders of the project's attention paths (:data:`MASK_BUILDERS`) read from a batch: built once
    per forward by ``SesameBertModel``; the metadata two paths share (the varlen sequences, the local layers' groups)
    is computed on first use and kept, so that a forward computes it at most once.

    Args:
        config: the model's config (``local_attention``).
        shape: (B, T) of the batch.
        device: the batch's device.
        documents: (B, T) long document ids (:func:`document_ids`), or ``None`` (no packed documents).
        keep: (B, T) bool, False at padding, or ``None``.
        given: the batch's :data:`PACKED_SEQUENCE_KEYS` (computed on the host by the collator), or ``{}``.
    """

    config: SesameBertConfig
    shape: tuple[int, int]
    device: torch.device
    documents: torch.Tensor | None = None
    keep: torch.Tensor | None = None
    given: dict | None = None

    @cached_property
    def sequences(self) -> DocumentSequences:
        """The sequences of the flattened (B * T) tokens for the varlen kernels: every row when there are no packed
        documents and no padding (no device read), else :func:`document_sequences` (the documents and padding runs;
        from ``given`` when the collator sent them, else one device read)."""
        batch, length = self.shape
        if self.documents is None and self.keep is None:
            starts = torch.arange(0, batch * length + 1, length, dtype=torch.int32, device=self.device)
            return DocumentSequences(starts, length)
        documents = self.documents
        if documents is None:
            documents = torch.zeros(batch, length, dtype=torch.long, device=self.device)
        return document_sequences(documents, self.keep, self.given)

    @cached_property
    def groups(self) -> torch.Tensor:
        """The (B|1, T) groups the local layers attend within (:func:`token_groups`)."""
        return token_groups(self.documents, self.keep, self.shape, self.device)


def _document_flex_mask(batch_size: int, q_length: int, kv_length: int, *args, inputs: MaskInputs, **kwargs):
    """The ``BlockMask`` of ``"sesame_document_flex"``: :func:`document_block_mask` for full-attention layers,
    :func:`local_block_mask` for ``layer_type="sliding_attention"``."""
    if kwargs.get("layer_type") == "sliding_attention":
        return local_block_mask(inputs.groups.expand(batch_size, -1), inputs.config.local_attention)
    return document_block_mask(inputs.documents, inputs.keep)


def _document_varlen_mask(batch_size: int, q_length: int, kv_length: int, *args, inputs: MaskInputs, **kwargs):
    """The :class:`DocumentSequences` of ``"sesame_document_varlen"``."""
    return inputs.sequences


def _local_blocks_mask(batch_size: int, q_length: int, kv_length: int, *args, inputs: MaskInputs, **kwargs):
    """The :class:`LocalBlocks` of ``"sesame_local_sdpa"`` and ``"sesame_local_eager"``."""
    return local_blocks(inputs.groups, inputs.config.local_attention, batch_size=batch_size)


def _local_varlen_mask(batch_size: int, q_length: int, kv_length: int, *args, inputs: MaskInputs, **kwargs):
    """The :class:`LocalSequences` of ``"sesame_local_varlen"``: the sequences and the blocks (for other dtypes)."""
    blocks = local_blocks(inputs.groups, inputs.config.local_attention, batch_size=batch_size)
    return LocalSequences(inputs.sequences, blocks)


#: The project's attention paths: name -> (the kernel, its mask builder). The model registers each kernel with
#: transformers' ``AttentionInterface`` and each builder with its ``AttentionMaskInterface`` under the path's name (the
#: public ``register`` of both). A builder takes the mask interface's arguments (``batch_size``, ``q_length``,
#: ``kv_length``, ...) and, keyword-only, ``inputs`` (:class:`MaskInputs`) and ``layer_type``; it returns the metadata
#: its kernel takes (never a (T, T) tensor).
ATTENTION_PATHS: dict[str, tuple[Callable, Callable]] = {
    "sesame_document_flex": (document_flex_attention, _document_flex_mask),
    "sesame_document_varlen": (document_varlen_attention, _document_varlen_mask),
    "sesame_local_sdpa": (local_sdpa_attention, _local_blocks_mask),
    "sesame_local_eager": (local_eager_attention, _local_blocks_mask),
    "sesame_local_varlen": (local_varlen_attention, _local_varlen_mask),
}


__all__ = [
    "ATTENTION_PATHS",
    "MaskInputs",
    "PACKED_SEQUENCE_KEYS",
    "DocumentSequences",
    "SinusoidalPositionEmbedding",
    "apply_rotary",
    "document_block_mask",
    "document_dense_mask",
    "document_flex_attention",
    "document_ids",
    "document_mask_function",
    "document_sequences",
    "document_varlen_attention",
    "eager_attention_forward",
    "flash_varlen_kwargs",
    "packed_documents_kernel",
    "repeat_kv",
    "rotary_cos_sin",
    "rotary_embeddings",
    "sinusoidal_table",
    "sliding_window_band",
    "sliding_window_mask",
    "LocalBlocks",
    "LocalSequences",
    "flash_varlen_attention",
    "flash_varlen_runs",
    "local_attention_kernel",
    "local_block_mask",
    "local_blocks",
    "local_eager_attention",
    "local_sdpa_attention",
    "local_varlen_attention",
    "token_groups",
]
