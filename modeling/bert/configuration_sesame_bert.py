"""Configuration of the BERT-like encoder (SesameBert).

This file is copied next to the weights by ``save_pretrained`` (``auto_map`` + remote code), so it may
import only the standard library, torch, transformers / huggingface_hub, and sibling files relatively.
"""

from __future__ import annotations

from typing import Literal

from huggingface_hub.dataclasses import strict
from transformers import PretrainedConfig

#: The names accepted by the string-valued fields (the tables live in ``modeling_sesame_bert.py``).
HIDDEN_ACTS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish", "tanh")
CHOICES = {
    "position_embedding_type": ("learned", "sinusoidal", "absolute"),
    "norm_position": ("post", "pre"),
    "norm_type": ("layernorm", "rmsnorm"),
    "classifier_pooling": ("cls", "mean", "max", "attention"),
    "hidden_act": HIDDEN_ACTS,
}


@strict
class SesameBertConfig(PretrainedConfig):
    r"""Configuration of a SesameBert encoder; field names and defaults follow ``transformers.BertConfig``
    (the defaults give BERT-base, Devlin et al. 2019), plus the Cramming-style choices below.

    Args:
        vocab_size (int): number of WordPiece tokens; rows of the input embedding and of the tied MLM decoder.
        hidden_size (int): width H of the encoder (embedding and residual stream).
        num_hidden_layers (int): number L of Transformer layers.
        num_attention_heads (int): number A of self-attention heads; must divide ``hidden_size``.
        intermediate_size (int): width of the feed-forward layer (4H in BERT).
        hidden_act (str): activation of the feed-forward layer and of the MLM transform, one of
            ``HIDDEN_ACTS``: ``"gelu"`` (exact erf GELU, as BERT), ``"gelu_new"`` / ``"gelu_pytorch_tanh"``
            (tanh approximation), ``"relu"``, ``"silu"`` / ``"swish"``, ``"tanh"``.
        hidden_dropout_prob (float): dropout on embeddings and on each residual branch (training only).
        attention_probs_dropout_prob (float): dropout on the attention probabilities (training only).
        max_position_embeddings (int): longest sequence (tokens) the position embeddings cover.
        type_vocab_size (int): number of segment (token type) ids; 2 for sentence pairs / NSP.
        initializer_range (float): std of the normal initialisation of linear and embedding weights (BERT init:
            N(0, initializer_range), LayerNorm weight 1 / bias 0, all biases 0).
        layer_norm_eps (float): epsilon of every normalisation layer.
        pad_token_id (int | None): id of ``[PAD]``; its embedding row starts at zero and gets no gradient.
        classifier_dropout (float | None): dropout before the classification heads; ``None`` = ``hidden_dropout_prob``.
        tie_word_embeddings (bool): tie the MLM decoder weight to the input word embeddings.
        position_embedding_type (str): ``"learned"`` (BERT: a trained table of ``max_position_embeddings`` rows)
            or ``"sinusoidal"`` (Vaswani et al. 2017, sec. 3.5: p[i, 2j] = sin(i / 10000^(2j/H)),
            p[i, 2j+1] = cos(i / 10000^(2j/H)); fixed, not trained). ``"absolute"`` (the name in old
            ``BertConfig`` files) is accepted as ``"learned"``.
        norm_position (str): ``"post"`` (BERT: x = Norm(x + F(x)), and a norm after the embeddings) or
            ``"pre"`` (x = x + F(Norm(x)), with a final norm after the last layer; Xiong et al. 2020).
        norm_type (str): ``"layernorm"`` or ``"rmsnorm"`` (Zhang & Sennrich 2019), for every norm of the model.
        classifier_pooling (str): how the pooler summarises the sequence into one vector before its dense + tanh
            layer (used by NSP and sequence classification): ``"cls"`` (the first token, as BERT; so converted
            checkpoints' pooler is reused), ``"mean"`` / ``"max"`` (over non-padding tokens), or ``"attention"``
            (alpha = softmax_i(w^T h_i) over non-padding tokens, pooled = sum_i alpha_i h_i).
        sparse_prediction (bool): in training mode with MLM labels, run the MLM head (transform + decoder) only at
            the positions whose label is not -100 (Cramming, Geiping & Goldstein 2023; academic-budget-bert). The
            loss is unchanged; ``logits`` then holds only those rows. Eval mode always returns full logits.
    """

    model_type = "sesame-bert"

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float | int = 0.1
    attention_probs_dropout_prob: float | int = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int | None = 0
    classifier_dropout: float | int | None = None
    tie_word_embeddings: bool = True
    position_embedding_type: Literal["learned", "sinusoidal", "absolute"] = "learned"
    norm_position: Literal["post", "pre"] = "post"
    norm_type: Literal["layernorm", "rmsnorm"] = "layernorm"
    classifier_pooling: Literal["cls", "mean", "max", "attention"] = "cls"
    sparse_prediction: bool = True

    def validate_architecture(self):
        """Check the shape and the string-valued choices (``@strict`` validator); raises ``ValueError``."""
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be a multiple of num_attention_heads "
                f"({self.num_attention_heads})"
            )
        for field, choices in CHOICES.items():
            if getattr(self, field) not in choices:
                raise ValueError(f"{field}={getattr(self, field)!r}; expected one of {', '.join(choices)}")
        if self.position_embedding_type == "sinusoidal" and self.hidden_size % 2:
            raise ValueError(f"sinusoidal position embeddings need an even hidden_size, got {self.hidden_size}")


__all__ = ["SesameBertConfig"]
