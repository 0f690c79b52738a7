"""transformers' EuroBERT (Boizard et al. 2025, "EuroBERT: Scaling Multilingual Encoders for European Languages",
``model_type`` ``eurobert``) <-> SesameBert of the ``eurobert`` layout: the Llama block (pre-LN RMSNorm, SwiGLU, RoPE,
grouped-query attention, ``head_dim``), no embedding norm, a final norm; its heads: the MLM decoder on the hidden
states, ``act(dense(pool(h)))`` for sequence classification (``"bos"`` and ``"mean"`` pooling; ``"late"``:
``classifier_pooling="late"``), a linear tagger. Its separate q, k, v projections are the row blocks of SesameBert's
``attn.qkv`` and its gate, up projections those of ``ffn.fc1`` (the gate first: it goes through the activation).
"""

from __future__ import annotations

import sys

from core.errors import InputError

from ..configuration_sesame_bert import GLU_ACTS, LAYOUTS
from .common import MODERN_FIELDS, ROPE, TOKEN_FIELDS, Source, classes, glu, pairs, refuse, rope_theta

LAYOUT, TITLE = LAYOUTS["eurobert"], "EuroBERT"
#: EuroBertConfig fields carried both ways, transformers name -> SesameBert name.
FIELDS = {**MODERN_FIELDS, "rms_norm_eps": "layer_norm_eps"}
#: Parameter name parts of the encoder, transformers (without ``model.``) -> SesameBert (without ``bert.``).
KEYS = pairs("""
    ^norm.                       encoder.final_norm.
    embed_tokens.                embeddings.word_embeddings.
    input_layernorm.  norm1.     self_attn.o_proj.  attn.out.    post_attention_layernorm.  norm2.
    mlp.down_proj.    ffn.fc2.   mlp.gate_proj.     ffn.fc1.     mlp.up_proj.               ffn.fc1.
    self_attn.q_proj. attn.qkv.  self_attn.k_proj.  attn.qkv.    self_attn.v_proj.          attn.qkv.
    ^layers.                     encoder.layer.
""")
#: Per class, the head parameters' renames (the sequence classifier's dense layer is SesameBert's pooler's).
HEADS = {
    "EuroBertForMaskedLM": pairs("^lm_head. cls.decoder."),
    "EuroBertForSequenceClassification": pairs("^dense. bert.pooler.dense."),
}
#: transformers class -> SesameBert class (the same head; EuroBERT has no QA head).
CLASSES = classes("EuroBert", "Model ForMaskedLM ForSequenceClassification ForTokenClassification")
#: ``classifier_pooling``, transformers -> SesameBert (``"late"``: the pooler on every token, then the mean); the
#: special tokens are carried when set.
POOLINGS, OPTIONAL = {"bos": "cls", "mean": "mean", "late": "late"}, TOKEN_FIELDS


def sesame_fields(config, where: str) -> dict:
    """EuroBERT's dropout (none: the layout's reference values), the GLU, the decoder's bias, the rotary base and the
    grouped-query heads of an ``EuroBertConfig``. Raises :class:`InputError` for a rotary scaling or a non-GLU."""
    return dict(
        **LAYOUT.reference,
        hidden_act=glu(config.hidden_act, where),
        decoder_bias=config.mlp_bias,
        rope_parameters={"full_attention": dict(ROPE, rope_theta=rope_theta(config.rope_parameters, where))},
        num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
    )


def transformers_fields(c) -> dict:
    """A GLU, the decoder's bias as the feed-forward's, no sliding-window layers (refused otherwise)."""
    refuse(c, "EuroBERT", dict(hidden_act=tuple(GLU_ACTS), decoder_bias=c.mlp_bias))
    if "sliding_attention" in c.attention_types():
        raise InputError("a SesameBert config with sliding_attention layers has no EuroBERT counterpart")
    return dict(
        hidden_act=GLU_ACTS[c.hidden_act],
        num_key_value_heads=c.key_value_heads,
        head_dim=c.attention_head_dim,
        rope_parameters=dict(c.rope_parameters["full_attention"]),
    )


SOURCE = Source.of(sys.modules[__name__])
to_sesame, from_sesame = SOURCE.to_sesame, SOURCE.from_sesame

__all__ = ["CLASSES", "FIELDS", "HEADS", "KEYS", "LAYOUT", "SOURCE", "TITLE", "from_sesame", "to_sesame"]
