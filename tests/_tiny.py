"""Tiny model settings shared by the test folders (importable as ``_tiny``: ``pyproject.toml`` puts ``tests/`` on
``sys.path``). Each call returns a new dict, so a test may change its copy."""

from __future__ import annotations


def tiny_bert_kwargs(
    vocab_size: int | None, max_position_embeddings: int, width: int = 32, layers: int = 2, **extra
) -> dict:
    """``SesameBertConfig`` / ``BertConfig`` keyword arguments of a BERT ``layers`` deep and ``width`` wide (heads of 8,
    feed-forward twice the width) over ``vocab_size`` words (no ``vocab_size`` where ``None``) and
    ``max_position_embeddings`` positions; ``extra`` added."""
    vocab = {} if vocab_size is None else {"vocab_size": vocab_size}
    return dict(
        **vocab,
        hidden_size=width,
        num_hidden_layers=layers,
        num_attention_heads=width // 8,
        intermediate_size=2 * width,
        max_position_embeddings=max_position_embeddings,
        **extra,
    )


def modern_layout(**overrides) -> dict:
    """The ModernBERT-class fields of the ``modernbert-*`` presets (issue 41: rotary positions with two bases, GeGLU, no
    biases, pre-norm with the embedding norm and layer 0's identity attention norm, local layers, no segment
    embeddings, no dropout, ModernBERT's heads), without their sizes and ``max_position_embeddings``; then
    ``overrides`` (e.g. a window that fits tiny inputs)."""
    from modeling.bert import MODERN_PRESETS

    sizes = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "max_position_embeddings")
    return {**{k: v for k, v in MODERN_PRESETS["modernbert-tiny"][1].items() if k not in sizes}, **overrides}


#: the rotary bases of the micro modern encoder: global 10,000, local 1,000
LOCAL_BASES = {"full_attention": 10_000.0, "sliding_attention": 1000.0}


def micro_modern_kwargs(**overrides) -> dict:
    """A micro modern encoder's config fields (32 wide, 4 query heads on 2 key/value heads, SwiGLU, rotary positions
    with a local base, a 4-token window, pre-norm, no biases, no dropout), for the local-attention and
    packed-document tests; then ``overrides``."""
    sizes = dict(vocab_size=40, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=24)
    bases = {t: {"rope_type": "default", "rope_theta": b} for t, b in LOCAL_BASES.items()}
    rotary = dict(position_embedding_type="rope", rope_parameters=bases, max_position_embeddings=64)
    window = dict(local_attention=4)  # a token sees the tokens at most 2 positions away
    block = dict(hidden_act="swiglu", type_vocab_size=0, norm_position="pre", first_layer_attention_norm=False)
    return sizes | rotary | window | block | NO_BIASES | dict(norm_bias=False) | NO_DROPOUT | overrides


#: Linear layers without biases, and no dropout (the modern layouts' reference values).
NO_BIASES = dict(attention_bias=False, mlp_bias=False)
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def eurobert_layout(**overrides) -> dict:
    """EuroBERT's layout (``LAYOUTS["eurobert"]``: the Llama block with pre-norm RMSNorm and rotary positions, no
    embedding norm, a final norm, its heads) without biases or dropout, for any sizes; then ``overrides``."""
    from modeling.bert.configuration_sesame_bert import LAYOUTS

    return {**LAYOUTS["eurobert"].config, **NO_BIASES, **NO_DROPOUT, **overrides}


def padded_batch(vocab_size: int, shape: tuple[int, int], lengths: dict[int, int], seed: int) -> dict:
    """``input_ids`` (random ids from 5 to ``vocab_size``, seeded by ``seed``) and ``attention_mask`` of ``shape``,
    int64; row ``r`` of ``lengths`` padded (id 0, mask 0) after its ``lengths[r]`` first tokens."""
    import torch

    input_ids = torch.randint(5, vocab_size, shape, generator=torch.Generator().manual_seed(seed))
    attention_mask = torch.ones_like(input_ids)
    for row, length in lengths.items():
        attention_mask[row, length:] = 0
    return dict(input_ids=input_ids * attention_mask, attention_mask=attention_mask)


def tiny_elmo_kwargs(vocab_size: int, **extra) -> dict:
    """``SesameElmoConfig`` keyword arguments of a 2-layer BiLM (cell 32, projection 16, three character filter
    widths, no dropout) with a task BiLSTM and classifier of 16 and a 16-word sampled softmax, over ``vocab_size``
    words; ``extra`` added or overriding."""
    return {
        **dict(
            vocab_size=vocab_size,
            char_embedding_dim=8,
            cnn_filters=[[1, 8], [2, 8], [3, 16]],
            num_highway_layers=1,
            projection_dim=16,
            cell_size=32,
            num_layers=2,
            dropout=0.0,
            task_hidden_size=16,
            classifier_hidden_size=16,
            num_sampled=16,
            cnn_pool_filters=4,
        ),
        **extra,
    }


def micro_bilm_kwargs(**extra) -> dict:
    """``SesameElmoConfig`` keyword arguments of the smallest BiLM the tests build (no ``vocab_size``): 2 layers,
    cell 16, projection 8, character embeddings of 4 through filters of widths 1 and 2 (4 each) and one highway
    layer, no dropout; ``extra`` added or overriding."""
    chars = dict(char_embedding_dim=4, cnn_filters=[[1, 4], [2, 4]], num_highway_layers=1)
    return {**chars, **dict(projection_dim=8, cell_size=16, num_layers=2, dropout=0.0), **extra}


def micro_elmo_kwargs(vocab_size: int, **extra) -> dict:
    """:func:`micro_bilm_kwargs` over ``vocab_size`` words with a task BiLSTM of 4 and a classifier of 8, without
    dropout; ``extra`` added or overriding."""
    task = dict(task_hidden_size=4, classifier_hidden_size=8, classifier_dropout=0.0)
    return {"vocab_size": vocab_size, **micro_bilm_kwargs(), **task, **extra}
