"""transformers' BERT (Devlin et al. 2019, "BERT: Pre-training of Deep Bidirectional Transformers", ``model_type``
``bert``) <-> SesameBert of the ``bert`` layout (post-LN, learned positions, segment embeddings, cls pooling).

A source folder is read as ``BertForPreTraining`` whatever it holds (``BertModel``, ``BertForMaskedLM`` or
``BertForPreTraining``; with or without the ``bert.`` prefix, TF-era ``gamma`` / ``beta``): the heads it lacks (the
MLM transform and bias, the NSP classifier, the pooler) are initialised as BERT does and reported. Query, key and value
are the row blocks of SesameBert's ``attn.qkv`` (in that order); ``cls.predictions.bias`` is the decoder's bias.
"""

from __future__ import annotations

import sys

from core.errors import InputError

from ..configuration_sesame_bert import HIDDEN_ACTS, LAYOUTS
from .common import Source, classes, pairs, refuse

LAYOUT, TITLE, PREFIX = LAYOUTS["bert"], "BERT", "bert."
#: BertConfig fields carried both ways (the SesameBert fields have the same names and meanings).
FIELDS = {
    name: name
    for name in """vocab_size hidden_size num_hidden_layers num_attention_heads intermediate_size hidden_act
    hidden_dropout_prob attention_probs_dropout_prob max_position_embeddings type_vocab_size initializer_range
    layer_norm_eps pad_token_id classifier_dropout tie_word_embeddings""".split()
}
#: Parameter name parts of the encoder, transformers -> SesameBert (without ``bert.``).
KEYS = pairs("""
    embeddings.LayerNorm.        embeddings.norm.
    attention.self.query.  attn.qkv.   attention.self.key.  attn.qkv.   attention.self.value.  attn.qkv.
    attention.output.dense.  attn.out.     attention.output.LayerNorm.  norm1.
    intermediate.dense.  ffn.fc1.   output.dense.  ffn.fc2.   output.LayerNorm.  norm2.
""")
#: The MLM and NSP heads' parameter names, transformers -> SesameBert.
PREDICTIONS = pairs("""
    ^cls.predictions.transform.dense.   cls.dense.   ^cls.predictions.transform.LayerNorm.  cls.norm.
    ^cls.predictions.decoder.           cls.decoder.   ^cls.seq_relationship.               nsp.
""")
#: Per class, the head parameters' renames.
HEADS = dict.fromkeys(("BertForPreTraining", "BertForMaskedLM"), PREDICTIONS)
#: ``cls.predictions.bias`` is the MLM decoder's bias (one tensor, two names).
ALIASES = {"cls.predictions.bias": "cls.predictions.decoder.bias"}
#: transformers class -> SesameBert class (the same head).
CLASSES = classes(
    "Bert", "Model ForMaskedLM ForPreTraining ForSequenceClassification ForQuestionAnswering ForTokenClassification"
)
#: A source folder is read as BertForPreTraining; the heads (name prefix -> head) it may lack are initialised as BERT
#: does: ``MAY_LACK`` in transformers' names, ``NEW_HEADS`` in SesameBert's.
LOAD_AS = "BertForPreTraining"
MAY_LACK = {"cls.predictions.": "MLM head", "cls.seq_relationship.": "NSP head", "bert.pooler.": "pooler"}
NEW_HEADS = {"cls.": "MLM head", "nsp.": "NSP head", "bert.pooler.": "pooler"}
#: TF-era names of the norms' parameters in older weight files; the sample it is checked on has segments.
FILE_RENAMES = pairs("LayerNorm.gamma LayerNorm.weight LayerNorm.beta LayerNorm.bias")
INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def sesame_fields(config, where: str) -> dict:
    """Refuse the BERT variants SesameBert does not implement; BERT sets no fields beyond the carried ones."""
    position = getattr(config, "position_embedding_type", "absolute")
    if position not in (None, "absolute"):
        raise InputError(f"{where}: position_embedding_type={position!r}; only 'absolute' BERT can be converted")
    if getattr(config, "is_decoder", False) or getattr(config, "add_cross_attention", False):
        raise InputError(f"{where}: is_decoder / add_cross_attention is set; only BERT encoders can be converted")
    if config.hidden_act not in HIDDEN_ACTS:
        raise InputError(f"{where}: hidden_act={config.hidden_act!r}; expected one of {', '.join(HIDDEN_ACTS)}")
    return {}


def transformers_fields(config) -> dict:
    """Refuse what BERT cannot express beyond the layout: rotary or sinusoidal positions, a GLU, no segments."""
    refuse(config, "BERT", {"position_embedding_type": ("learned", "absolute"), "hidden_act": HIDDEN_ACTS})
    if config.type_vocab_size < 1:
        raise InputError("a SesameBert config with type_vocab_size=0 has no BERT counterpart; expected segments")
    return {}


SOURCE = Source.of(sys.modules[__name__])
to_sesame, from_sesame = SOURCE.to_sesame, SOURCE.from_sesame

__all__ = ["CLASSES", "FIELDS", "HEADS", "KEYS", "LAYOUT", "SOURCE", "TITLE", "from_sesame", "to_sesame"]
