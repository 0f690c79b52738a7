"""What the MLM step benches share: the transformers BERT they compare with, a fixed random MLM batch and the device
synchronisation around a timed step."""

from __future__ import annotations

import torch


def reference_bert_config(
    vocab_size: int, width: int, layers: int, heads: int, ffn: int, seq_len: int, dropout: float, **extra
):
    """transformers' ``BertConfig`` of the benches' reference model: ``layers`` layers ``width`` wide with ``heads``
    heads and a feed-forward of ``ffn``, over ``vocab_size`` words, positions for ``max(512, seq_len)`` tokens,
    ``dropout`` on the hidden states and the attention probabilities; ``extra`` added."""
    from transformers import BertConfig

    shape = dict(hidden_size=width, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=ffn)
    drop = dict(hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    return BertConfig(vocab_size=vocab_size, **shape, max_position_embeddings=max(512, seq_len), **drop, **extra)


def make_batch(
    batch_size: int, seq_len: int, vocab_size: int, mlm_probability: float, device, mask_id: int = 103
) -> dict[str, torch.Tensor]:
    """A full (unpadded) MLM batch, the same for every call: ``input_ids`` (B, S) long with ``mask_id`` at the
    chosen positions (each with probability ``mlm_probability``), ``token_type_ids`` (B, S) zeros and ``labels``
    (B, S) long, the original id at the chosen positions and -100 elsewhere, on ``device``. No ``attention_mask``,
    as ``pretrain``'s collator sends full packed blocks: both models then take SDPA's unmasked (flash) path."""
    g = torch.Generator().manual_seed(1)
    input_ids = torch.randint(1000, vocab_size, (batch_size, seq_len), generator=g)
    chosen = torch.rand(input_ids.shape, generator=g) < mlm_probability
    labels = torch.where(chosen, input_ids, torch.full_like(input_ids, -100))
    batch = dict(
        input_ids=input_ids.masked_fill(chosen, mask_id), token_type_ids=torch.zeros_like(input_ids), labels=labels
    )
    return {k: v.to(device) for k, v in batch.items()}


def sync(device) -> None:
    """Wait for the GPU's queue (a no-op on the CPU), so that a wall-clock interval covers the work."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
