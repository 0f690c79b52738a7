"""transformers' ModernBERT (Warner et al. 2024, "Smarter, Better, Faster, Longer", ``model_type`` ``modernbert``) <->
SesameBert of the ``modernbert`` layout: pre-LN LayerNorm (``norm_bias``), an embedding norm, the identity as layer 0's
attention norm, a final norm, GeGLU, RoPE with a global and a local base, ``layer_types`` with ``local_attention``, its
prediction head, no segment embeddings. The fused ``Wqkv`` and ``Wi`` are SesameBert's ``qkv`` and ``fc1`` as they are.
"""

from __future__ import annotations

import sys

from core.errors import InputError

from ..configuration_sesame_bert import GLU_ACTS, HIDDEN_ACTS, LAYER_TYPES, LAYOUTS
from .common import MODERN_FIELDS, ROPE, TOKEN_FIELDS, Source, classes, glu, pairs, refuse, rope_theta

LAYOUT, TITLE = LAYOUTS["modernbert"], "ModernBERT"
#: ModernBertConfig fields carried both ways, transformers name -> SesameBert name.
FIELDS = {
    **MODERN_FIELDS,
    "mlp_dropout": "hidden_dropout_prob",
    "norm_eps": "layer_norm_eps",
    **{n: n for n in "norm_bias decoder_bias classifier_bias classifier_activation local_attention".split()},
    "sparse_prediction": "sparse_prediction",
}
#: Parameter name parts of the encoder, transformers (without ``model.``) -> SesameBert (without ``bert.``).
KEYS = pairs("""
    ^final_norm.                 encoder.final_norm.
    embeddings.tok_embeddings.   embeddings.word_embeddings.
    attn_norm.  norm1.           attn.Wqkv.  attn.qkv.        attn.Wo.  attn.out.
    mlp_norm.   norm2.           mlp.Wi.     ffn.fc1.         mlp.Wo.   ffn.fc2.
    ^layers.                     encoder.layer.
""")
#: Per class, the head parameters' renames (the MLM head is ``head`` + ``decoder``, the pooler ``head``).
HEADS = {
    "ModernBertForMaskedLM": pairs("^head. cls. ^decoder. cls.decoder."),
    "ModernBertForSequenceClassification": pairs("^head. bert.pooler."),
    "ModernBertForQuestionAnswering": pairs("^classifier. qa_outputs."),
}
#: transformers class -> SesameBert class (the same head).
CLASSES = classes(
    "ModernBert", "Model ForMaskedLM ForSequenceClassification ForTokenClassification ForQuestionAnswering"
)
#: ``classifier_pooling``, transformers -> SesameBert; the special tokens are carried when set.
POOLINGS, OPTIONAL = {"cls": "cls", "mean": "mean"}, TOKEN_FIELDS


def sesame_fields(config, where: str) -> dict:
    """The GLU, the classifier's dropout, the two rotary bases and the layer types of a ``ModernBertConfig``.
    Raises :class:`InputError` for a classifier activation or a rotary scaling SesameBert lacks."""
    if config.classifier_activation not in HIDDEN_ACTS:
        raise InputError(
            f"{where}: classifier_activation={config.classifier_activation!r}; expected one of {', '.join(HIDDEN_ACTS)}"
        )
    return dict(
        hidden_act=glu(config.hidden_activation, where),
        classifier_dropout=config.classifier_dropout,
        rope_parameters={
            t: dict(ROPE, rope_theta=rope_theta(config.rope_parameters.get(t), where)) for t in LAYER_TYPES
        },
        layer_types=list(config.layer_types),
    )


def transformers_fields(c) -> dict:
    """A GLU, one key/value head per query head and the default head width (refused otherwise)."""
    heads = dict(key_value_heads=c.num_attention_heads, attention_head_dim=c.hidden_size // c.num_attention_heads)
    refuse(c, "ModernBERT", dict(hidden_act=tuple(GLU_ACTS), **heads))
    return dict(
        hidden_activation=GLU_ACTS[c.hidden_act],
        classifier_dropout=c.classifier_dropout or 0.0,
        layer_types=c.attention_types(),
        rope_parameters={t: dict(c.rope_parameters.get(t, c.rope_parameters["full_attention"])) for t in LAYER_TYPES},
    )


SOURCE = Source.of(sys.modules[__name__])
to_sesame, from_sesame = SOURCE.to_sesame, SOURCE.from_sesame

__all__ = ["CLASSES", "FIELDS", "HEADS", "KEYS", "LAYOUT", "SOURCE", "TITLE", "from_sesame", "to_sesame"]
