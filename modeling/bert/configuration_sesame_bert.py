"""Configuration of the BERT-like encoder (SesameBert).

This file is copied next to the weights by ``save_pretrained`` (``auto_map`` + remote code), so it may
import only the standard library, torch, transformers / huggingface_hub, and sibling files relatively.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal

from huggingface_hub.dataclasses import strict
from transformers import PretrainedConfig

#: The names accepted by the string-valued fields (the tables live in ``modeling_sesame_bert.py``).
HIDDEN_ACTS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish", "tanh")
#: Gated linear units (Shazeer 2020, "GLU Variants Improve Transformer", eq. 5-6): name -> the activation of the gate.
GLU_ACTS = {"geglu": "gelu", "swiglu": "silu"}
#: The attention of a layer (``layer_types``): every token (global), or the tokens within ``local_attention / 2``.
LAYER_TYPES = ("full_attention", "sliding_attention")
#: The rotary base of a rotary config that names none (RoFormer's, Su et al. 2021).
DEFAULT_ROPE_THETA = 10000.0
CHOICES = {
    "position_embedding_type": ("learned", "sinusoidal", "absolute", "rope"),
    "norm_position": ("post", "pre"),
    "norm_type": ("layernorm", "rmsnorm"),
    "classifier_pooling": ("cls", "mean", "max", "attention", "late"),
    "hidden_act": (*HIDDEN_ACTS, *GLU_ACTS),
    "classifier_activation": HIDDEN_ACTS,
    # "head_layout": the names of LAYOUTS (below)
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
        type_vocab_size (int): number of segment (token type) ids; 2 for sentence pairs / NSP; 0: no segment
            embeddings (``token_type_ids`` are ignored; ModernBERT, EuroBERT).
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
            (alpha = softmax_i(w^T h_i) over non-padding tokens, pooled = sum_i alpha_i h_i), or ``"late"`` (EuroBERT's:
            the dense layer and its activation run on every token, then the mean over non-padding tokens; as the
            classifier is affine, its logits are EuroBERT's mean of per-token logits).
        sparse_prediction (bool): in training mode with MLM labels, run the MLM head (transform + decoder) only at
            the positions whose label is not -100 (Cramming, Geiping & Goldstein 2023; academic-budget-bert). The
            loss is unchanged; ``logits`` then holds only those rows. Eval mode always returns full logits.
        embedding_size (int | None): width E of the embeddings (word, position, segment and their norm) when it
            differs from ``hidden_size``; a linear ``embeddings_project`` (E -> H) then follows them and the MLM
            head maps back (H -> E) before its decoder, as ``ElectraConfig.embedding_size`` (Clark et al. 2020):
            a narrow ELECTRA generator shares the discriminator's wider embeddings this way. ``None``: E = H.

    The modern encoder (ModernBERT, Warner et al. 2024, "Smarter, Better, Faster, Longer"; EuroBERT, Boizard et al.
    2025; names as transformers' ``ModernBertConfig`` / ``EuroBertConfig``). Every default keeps the BERT layout:

        position_embedding_type ``"rope"``: rotary position embeddings (Su et al. 2021, "RoFormer", eq. 34) on the
            queries and keys of every layer, no position table; positions restart per packed document.
        rope_parameters (dict | None): the rotary embeddings of each layer type, transformers 5's shape:
            ``{"full_attention": {"rope_type": "default", "rope_theta": 160000.0}, "sliding_attention": {...}}``;
            ``rope_theta`` is the base of the frequencies theta_i = rope_theta^(-2i/D) (RoFormer eq. 15; ModernBERT:
            160,000 global, 10,000 local). A rotary config has a ``"full_attention"`` entry and one for each layer
            type it uses (a missing one takes ``"full_attention"``'s; ``None`` gives every one base 10,000); only
            ``"default"`` (unscaled) rotary embeddings. ``None`` without rotary positions (set to it). Configs of
            earlier versions (transformers 4's names) load: ``rope_theta`` (full attention) and ``local_rope_theta``
            (sliding attention; ``None``: ``rope_theta``).
        hidden_act ``"geglu"`` / ``"swiglu"``: a gated feed-forward layer (Shazeer 2020, eq. 5-6):
            ``fc2(act(a) * b)`` with ``[a; b] = fc1(x)``, so ``fc1`` gives 2 x ``intermediate_size`` (as both
            references); the gate's activation is GELU / SiLU (:data:`GLU_ACTS`).
        attention_bias (bool): biases of the attention's ``qkv`` and ``out`` projections.
        mlp_bias (bool): biases of the feed-forward layer's ``fc1`` and ``fc2``.
        norm_bias (bool): the bias (beta) of every LayerNorm (RMSNorm has none).
        decoder_bias (bool): the bias of the MLM decoder (the output projection onto the vocabulary).
        classifier_bias (bool): the bias of the dense layer of the heads (MLM transform, pooler / prediction head).
        layer_types (list[str] | None): per layer ``"full_attention"`` or ``"sliding_attention"`` (local attention
            within a window of ``local_attention`` tokens). ``None``: every layer is global. The argument
            ``global_attn_every_n_layers=n`` (transformers 4's name, as ``ModernBertConfig`` still takes it) gives
            layer i ``"full_attention"`` when i % n == 0, else ``"sliding_attention"`` (ModernBERT: 3).
        local_attention (int): the window of ``"sliding_attention"`` layers in tokens, ModernBERT's meaning: a token
            attends to the tokens at most ``local_attention // 2`` positions away (either side); even, at most
            ``max_position_embeddings``.
        num_key_value_heads (int | None): heads of the keys and values (grouped-query attention, Ainslie et al. 2023,
            "GQA"): each serves ``num_attention_heads / num_key_value_heads`` query heads. ``None``: one per query
            head (multi-head attention).
        head_dim (int | None): width D of every head; ``None``: ``hidden_size // num_attention_heads``.
        embedding_norm (bool): the norm after the embeddings (BERT, ModernBERT); False: none (EuroBERT, Llama).
        first_layer_attention_norm (bool): with pre-LN, the norm before the attention of layer 0; False: the identity
            (ModernBERT: the embedding norm already normalised its input).
        head_layout (str): the heads on top of the encoder: ``"bert"`` (the MLM transform uses ``hidden_act``, the
            pooler is ``tanh(dense(pool(h)))``, tagging and QA read the hidden states), ``"modernbert"`` (a prediction
            head ``norm(act(dense(x)))`` with ``classifier_activation`` in the MLM head, after pooling, and before the
            tagging and QA classifiers), ``"eurobert"`` (the MLM decoder reads the hidden states, the pooler is
            ``act(dense(pool(h)))``, tagging and QA read the hidden states).
        classifier_activation (str): the activation of the ``"modernbert"`` / ``"eurobert"`` heads (one of
            ``HIDDEN_ACTS``).
    """

    model_type = "sesame-bert"
    #: the keys of a ``rope_parameters`` nested by layer type (what transformers' rotary helpers read)
    _rope_type_labels = LAYER_TYPES

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
    position_embedding_type: Literal["learned", "sinusoidal", "absolute", "rope"] = "learned"
    norm_position: Literal["post", "pre"] = "post"
    norm_type: Literal["layernorm", "rmsnorm"] = "layernorm"
    classifier_pooling: Literal["cls", "mean", "max", "attention", "late"] = "cls"
    sparse_prediction: bool = True
    embedding_size: int | None = None
    rope_parameters: dict | None = None
    attention_bias: bool = True
    mlp_bias: bool = True
    norm_bias: bool = True
    decoder_bias: bool = True
    classifier_bias: bool = True
    layer_types: list[str] | None = None
    local_attention: int = 128
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    embedding_norm: bool = True
    first_layer_attention_norm: bool = True
    head_layout: Literal["bert", "modernbert", "eurobert"] = "bert"
    classifier_activation: str = "gelu"

    @property
    def attention_head_dim(self) -> int:
        """D: ``head_dim``, or ``hidden_size // num_attention_heads`` when it is ``None``."""
        return self.hidden_size // self.num_attention_heads if self.head_dim is None else self.head_dim

    @property
    def key_value_heads(self) -> int:
        """The heads of keys and values: ``num_key_value_heads``, or ``num_attention_heads`` when it is ``None``."""
        return self.num_attention_heads if self.num_key_value_heads is None else self.num_key_value_heads

    def __post_init__(self, **kwargs):
        """``layer_types`` from ``global_attn_every_n_layers`` (not stored; ``ValueError`` when it is not a positive
        integer or comes with ``layer_types``), then ``PreTrainedConfig``'s (:meth:`convert_rope_params_to_dict`)."""
        every = kwargs.pop("global_attn_every_n_layers", None)
        if every is not None:
            if isinstance(every, bool) or not isinstance(every, int) or every < 1:
                raise ValueError(f"global_attn_every_n_layers={every!r}; expected a positive integer or None")
            if self.layer_types is not None:
                raise ValueError("layer_types and global_attn_every_n_layers are both set; expected one of them")
            self.layer_types = [LAYER_TYPES[bool(i % every)] for i in range(self.num_hidden_layers)]
        super().__post_init__(**kwargs)

    def convert_rope_params_to_dict(self, **kwargs) -> dict:
        """``rope_parameters`` as the class docstring says (``PreTrainedConfig.__post_init__`` calls it with its other
        keyword arguments and keeps those returned): entries copied, ``rope_type`` ``"default"`` when missing.

        Raises:
            ValueError: ``rope_theta`` / ``local_rope_theta`` not a finite base > 1, or disagreeing with
                ``rope_parameters``.
        """
        theta, local = kwargs.pop("rope_theta", None), kwargs.pop("local_rope_theta", None)
        for name, value in (("rope_theta", theta), ("local_rope_theta", local)):
            if value is not None and not _is_base(value):
                raise ValueError(f"{name}={value!r}; expected a finite rotary base > 1")
        if self.position_embedding_type != "rope":
            self.rope_parameters = None
            return kwargs
        given, named = self.rope_parameters, (theta, local) != (None, None)
        full = DEFAULT_ROPE_THETA if theta is None else theta
        old = {"full_attention": full, "sliding_attention": full if local is None else local}
        used = [t for t in LAYER_TYPES if t == "full_attention" or t in self.attention_types()]
        given = {t: {"rope_theta": old[t]} for t in used} if given is None else given
        if not (isinstance(given, dict) and isinstance(given.get("full_attention"), dict)):
            return kwargs  # refused by validate_architecture
        types = dict.fromkeys([*used, *given])
        self.rope_parameters = {t: {"rope_type": "default", **(given.get(t) or given["full_attention"])} for t in types}
        if named and any(self.rope_parameters[t].get("rope_theta") != old[t] for t in used):
            raise ValueError(
                f"rope_parameters={given!r} disagrees with rope_theta={theta!r}, local_rope_theta={local!r} "
                "(transformers 4's names); expected rope_parameters alone"
            )
        return kwargs

    def attention_types(self) -> list[str]:
        """The attention of every layer, ``"full_attention"`` or ``"sliding_attention"``: ``layer_types``, or every
        layer global when it is ``None``."""
        return list(self.layer_types) if self.layer_types is not None else [LAYER_TYPES[0]] * self.num_hidden_layers

    @property
    def embedding_width(self) -> int:
        """E: ``embedding_size``, or ``hidden_size`` when it is ``None``."""
        return self.hidden_size if self.embedding_size is None else self.embedding_size

    def validate_architecture(self):
        """Check every numeric field (finite, sign, range), the shape, the dropout probabilities and the
        string-valued choices (``@strict`` validator); raises ``ValueError`` naming the first field off it."""
        for field in (
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "vocab_size",
            "max_position_embeddings",
        ):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{field}={value!r}; expected a positive integer")
        if (
            isinstance(self.type_vocab_size, bool)
            or not isinstance(self.type_vocab_size, int)
            or self.type_vocab_size < 0
        ):
            raise ValueError(f"type_vocab_size={self.type_vocab_size!r}; expected an integer >= 0 (0: no segment ids)")
        for field, what in (("initializer_range", "standard deviation"), ("layer_norm_eps", "epsilon")):
            value = getattr(self, field)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not (math.isfinite(value) and value > 0)
            ):
                raise ValueError(f"{field}={value!r}; expected a positive finite {what}")
        pad = self.pad_token_id
        if pad is not None and (isinstance(pad, bool) or not isinstance(pad, int) or not 0 <= pad < self.vocab_size):
            raise ValueError(f"pad_token_id={pad!r}; expected a token id in [0, vocab_size {self.vocab_size}) or None")
        for field in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"):
            value = getattr(self, field)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1
            ):
                raise ValueError(f"{field}={value!r}; expected a probability in [0, 1)")
        if self.head_dim is None and self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be a multiple of num_attention_heads "
                f"({self.num_attention_heads})"
            )
        for field, choices in CHOICES.items():
            if getattr(self, field) not in choices:
                raise ValueError(f"{field}={getattr(self, field)!r}; expected one of {', '.join(choices)}")
        if self.position_embedding_type == "sinusoidal" and self.embedding_width % 2:
            raise ValueError(f"sinusoidal position embeddings need an even embedding width, got {self.embedding_width}")
        if self.embedding_size is not None and self.embedding_size < 1:
            raise ValueError(f"embedding_size={self.embedding_size}; expected a positive integer or None")
        self._validate_modern()

    def _validate_modern(self):
        """The checks of the modern-encoder fields (rotary, GQA, local attention); raises ``ValueError``."""
        for field in ("num_key_value_heads", "head_dim"):
            value = getattr(self, field)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{field}={value!r}; expected a positive integer or None")
        if self.num_attention_heads % self.key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of num_key_value_heads "
                f"({self.key_value_heads})"
            )
        if self.position_embedding_type == "rope" and self.attention_head_dim % 2:
            raise ValueError(f"rotary position embeddings need an even head dimension, got {self.attention_head_dim}")
        if self.head_layout == "eurobert" and self.embedding_width != self.hidden_size:
            raise ValueError(
                f"head_layout='eurobert' puts the MLM decoder on the hidden states (width {self.hidden_size}); "
                f"expected no embedding_size (got {self.embedding_size})"
            )
        types = self.attention_types()
        if len(types) != self.num_hidden_layers or any(t not in LAYER_TYPES for t in types):
            raise ValueError(
                f"layer_types={self.layer_types!r}; expected {self.num_hidden_layers} entries, each one of "
                f"{', '.join(LAYER_TYPES)}"
            )
        self._validate_rope(types)
        if "sliding_attention" in types and not (
            isinstance(self.local_attention, int)
            and 2 <= self.local_attention <= self.max_position_embeddings
            and self.local_attention % 2 == 0
        ):
            raise ValueError(
                f"local_attention={self.local_attention!r}; expected an even window of tokens between 2 and "
                f"max_position_embeddings ({self.max_position_embeddings})"
            )

    def _validate_rope(self, types: list[str]):
        """``rope_parameters``: ``None`` without rotary positions; else an entry for ``"full_attention"`` and each
        layer type of ``types``, each ``{"rope_type": "default", "rope_theta": base}`` with a finite base > 1."""
        rope, kind = self.rope_parameters, self.position_embedding_type
        if kind != "rope" or rope is None:
            if rope is not None or kind == "rope":
                raise ValueError(f"rope_parameters={rope!r} with position_embedding_type={kind!r}; expected None")
            return
        need = [t for t in LAYER_TYPES if t == "full_attention" or t in types]
        entry = '{"rope_type": "default", "rope_theta": a finite base > 1}'
        if not isinstance(rope, dict) or not set(need) <= set(rope) <= set(LAYER_TYPES):
            raise ValueError(f"rope_parameters={rope!r}; expected an entry {entry} for each of {', '.join(need)}")
        for layer_type, p in rope.items():
            if not (isinstance(p, dict) and set(p) == {"rope_type", "rope_theta"} and p["rope_type"] == "default") or (
                not _is_base(p["rope_theta"])
            ):
                raise ValueError(f"rope_parameters[{layer_type!r}]={p!r}; expected {entry}")


def _is_base(value) -> bool:
    """Whether ``value`` is a rotary base: a finite number > 1."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and value > 1 and math.isfinite(value)


@dataclasses.dataclass(frozen=True, kw_only=True)
class HeadLayout:
    """The heads a reference layout puts on the encoder (``head_layout``; built by ``modeling_sesame_bert``).

    Attributes:
        pooler_activation: the activation of the pooler / prediction head (a name of ``HIDDEN_ACTS``); ``None``:
            ``classifier_activation``.
        transform_activation: the activation of the MLM transform: ``None``: ``classifier_activation``;
            ``"hidden_act"``: ``hidden_act``'s (its gate's for a GLU, :data:`GLU_ACTS`).
        pooler_norm: a norm after the pooler's activation.
        prediction_head: the prediction head (the pooler's dense, activation and norm on every token) before the
            tagging and QA classifiers; False: they read the hidden states.
        mlm_transform: the MLM transform before the decoder; False: the decoder reads the hidden states.
    """

    pooler_activation: str | None = None
    transform_activation: str | None = None
    pooler_norm: bool = False
    prediction_head: bool = False
    mlm_transform: bool = True


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReferenceLayout:
    """One reference architecture as SesameBert config values: BERT (Devlin et al. 2019), ModernBERT (Warner et al.
    2024) or EuroBERT (Boizard et al. 2025). Its ``name`` is the config's ``head_layout``.

    Attributes:
        name: the layout's name (``head_layout``, the ``--to`` format, the transformers ``model_type``).
        fields: the fixed field values: a config with another value has no counterpart in the reference (the
            converters refuse it; in order of the refusal).
        reference: the published model's values of other fields: presets take them; a converter sets those its
            source does not carry (EuroBERT's dropout) and carries the others over.
        heads: its heads (:class:`HeadLayout`).
    """

    name: str
    fields: Mapping[str, object]
    reference: Mapping[str, object]
    heads: HeadLayout

    @property
    def fixed(self) -> dict:
        """The fixed field values, ``head_layout`` first: what a config of this layout has."""
        return {"head_layout": self.name, **self.fields}

    @property
    def config(self) -> dict:
        """The config fields of a preset of this layout, sizes aside: :attr:`fixed` and :attr:`reference`."""
        return {**self.fixed, **self.reference}


def _layout(name: str, fields: dict, heads: HeadLayout, reference: dict | None = None) -> ReferenceLayout:
    fields, reference = MappingProxyType(fields), MappingProxyType(reference or {})
    return ReferenceLayout(name=name, fields=fields, reference=reference, heads=heads)


def _defaults(names: str) -> dict:
    """The config defaults of the fields ``names`` (separated by white space), in that order."""
    return {name: SesameBertConfig.__dataclass_fields__[name].default for name in names.split()}


#: The fixed values both modern layouts share: rotary positions, pre-LN, no segment embeddings, embeddings of width H.
_MODERN = dict(position_embedding_type="rope", norm_position="pre", type_vocab_size=0, embedding_size=None)
#: ``head_layout`` -> its reference layout. BERT's fixed values are the config defaults; its learned / ``"absolute"``
#: positions, one of ``HIDDEN_ACTS`` and segment embeddings are checked apart (``sources.bert``).
#: ModernBERT and EuroBERT also need a GLU activation; ModernBERT one key/value head per query head and the default
#: head width, EuroBERT ``decoder_bias == mlp_bias`` and no sliding-window layers (their converters check these).
LAYOUTS: dict[str, ReferenceLayout] = {
    "bert": _layout(
        "bert",
        _defaults(
            """norm_position norm_type classifier_pooling embedding_size num_key_value_heads head_dim attention_bias
            mlp_bias norm_bias decoder_bias classifier_bias embedding_norm layer_types"""
        ),
        HeadLayout(pooler_activation="tanh", transform_activation="hidden_act"),
    ),
    # pre-LN without biases (the MLM decoder keeps its bias), embedding norm, the identity as layer 0's attention
    # norm, GeGLU, RoPE (global base 160,000, local 10,000), global attention every third layer, 8,192 positions, no
    # segment embeddings, no dropout (transformers' ``ModernBertConfig`` defaults)
    "modernbert": _layout(
        "modernbert",
        dict(_MODERN, norm_type="layernorm", embedding_norm=True, first_layer_attention_norm=False),
        HeadLayout(pooler_norm=True, prediction_head=True),
        reference=dict(
            hidden_act="geglu",
            rope_parameters={
                "full_attention": {"rope_type": "default", "rope_theta": 160_000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            },
            global_attn_every_n_layers=3,  # the argument that gives layer_types (transformers' ModernBertConfig's)
            max_position_embeddings=8192,
            layer_norm_eps=1e-5,
            **dict.fromkeys(("attention_bias", "mlp_bias", "norm_bias", "classifier_bias"), False),
            **dict.fromkeys(("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"), 0.0),
        ),
    ),
    # the Llama block: pre-LN RMSNorm, no embedding norm, RoPE; EuroBERT has no dropout
    "eurobert": _layout(
        "eurobert",
        dict(_MODERN, norm_type="rmsnorm", embedding_norm=False, first_layer_attention_norm=True)
        | dict(classifier_bias=True, classifier_activation="gelu"),  # the dense layer of its heads
        HeadLayout(mlm_transform=False),
        reference=dict(hidden_dropout_prob=0.0, classifier_dropout=0.0),
    ),
}
CHOICES["head_layout"] = tuple(LAYOUTS)


#: The fields :class:`SesameBertRTDConfig` adds to the discriminator's :class:`SesameBertConfig` fields.
RTD_FIELDS = ("generator_size", "discriminator_weight", "embedding_sharing")
#: ``to_dict`` keys that are not SesameBertConfig settings (left out when the two encoders' configs are derived).
_NOT_SETTINGS = (*RTD_FIELDS, "model_type", "architectures", "auto_map", "transformers_version", "_name_or_path")


@strict
class SesameBertRTDConfig(SesameBertConfig):
    r"""Configuration of ELECTRA-style replaced-token detection (RTD) pretraining with SesameBert (Clark et al. 2020,
    "ELECTRA: Pre-training Text Encoders as Discriminators Rather Than Generators"): a small MLM generator and a
    discriminator that tells, for every token, whether the generator replaced it.

    The :class:`SesameBertConfig` fields describe the discriminator (:meth:`discriminator_config`); the generator
    (:meth:`generator_config`) is the same encoder with its width multiplied by ``generator_size``.

    Args:
        generator_size (float): the generator's width as a fraction of the discriminator's, in (0, 1]:
            ``hidden_size``, ``intermediate_size`` and ``num_attention_heads`` are multiplied by it and rounded
            (heads at least 1; the hidden size must stay a multiple of the heads); depth and every other field are
            the discriminator's. ELECTRA (sec. 3.2, Fig. 3; its code's ``generator_hidden_size``): 1/4 for Small
            and Large, 1/3 for Base; generators of 1/4-1/2 the discriminator's size work best.
        discriminator_weight (float): lambda of the combined loss ``L_MLM(generator) + lambda * L_Disc``
            (ELECTRA, sec. 2, the equation after eq. (2)): 50, as ELECTRA (the discriminator's binary loss is
            much smaller than the generator's cross-entropy over the vocabulary).
        embedding_sharing (str): how the two encoders share their embeddings:
            ``"tied"`` (ELECTRA, sec. 3.1): one embedding module (word, position and segment tables, their norm),
            width E = the discriminator's; the generator projects it to its own width (``embedding_size``) and both
            losses train it. ``"gdes"``: gradient-disentangled embedding sharing (DeBERTa-v3, He et al. 2021,
            sec. 3.2): the discriminator's tables are ``stop_gradient(E_G) + E_delta`` with ``E_delta`` starting at
            zero, so the generator's MLM loss alone trains ``E_G`` and the discriminator's loss trains only
            ``E_delta`` (and its own embedding norm). ``"none"``: separate embeddings (the generator's of its own
            width).
    """

    model_type = "sesame-bert-rtd"

    generator_size: float | int = 0.25
    discriminator_weight: float | int = 50.0
    embedding_sharing: Literal["tied", "gdes", "none"] = "tied"

    def validate_architecture(self):
        """Check the discriminator (:class:`SesameBertConfig`) and the generator's shape; raises ``ValueError``."""
        super().validate_architecture()
        if not 0 < self.generator_size <= 1:
            raise ValueError(f"generator_size={self.generator_size}; expected a fraction in (0, 1]")
        if not (math.isfinite(self.discriminator_weight) and self.discriminator_weight > 0):
            raise ValueError(f"discriminator_weight={self.discriminator_weight}; expected a positive finite weight")
        hidden, heads = self._generator_shape()[:2]
        if hidden < 1 or hidden % heads:
            raise ValueError(
                f"generator_size={self.generator_size} gives a generator of hidden_size {hidden} with "
                f"{heads} attention heads; expected a hidden size that is a positive multiple of the "
                "heads"
            )

    def _generator_shape(self) -> tuple[int, int, int]:
        g = self.generator_size
        return (
            round(self.hidden_size * g),
            max(1, round(self.num_attention_heads * g)),
            max(1, round(self.intermediate_size * g)),
        )

    def _settings(self) -> dict:
        return {k: v for k, v in self.to_dict().items() if k not in _NOT_SETTINGS}

    def discriminator_config(self) -> SesameBertConfig:
        """The discriminator's :class:`SesameBertConfig`: this config's settings, with the RTD fields recorded as
        plain attributes (saved in its ``config.json``, so that :meth:`from_discriminator` and
        ``SesameBertForReplacedTokenDetection.from_pretrained`` read back how the pair was trained; the encoder
        ignores them)."""
        return SesameBertConfig(**self._settings(), **{k: getattr(self, k) for k in RTD_FIELDS})

    def generator_config(self) -> SesameBertConfig:
        """The generator's :class:`SesameBertConfig`: the discriminator's, ``generator_size`` times as wide; with
        shared embeddings its ``embedding_size`` is the discriminator's embedding width (as ELECTRA's generator)."""
        hidden, heads, intermediate = self._generator_shape()
        shared = None if self.embedding_sharing == "none" else self.embedding_width
        return SesameBertConfig(
            **{
                **self._settings(),
                "hidden_size": hidden,
                "num_attention_heads": heads,
                "intermediate_size": intermediate,
                "embedding_size": shared if shared != hidden else None,
            }
        )

    @classmethod
    def from_discriminator(cls, config: SesameBertConfig, **fields) -> SesameBertRTDConfig:
        """An RTD config whose discriminator is ``config`` (a :class:`SesameBertConfig`; an RTD config is returned
        as it is when no ``fields`` are given), with the RTD ``fields`` (default: those ``config`` records -- a
        discriminator saved by an RTD model carries them, see :meth:`discriminator_config` -- else ELECTRA's)."""
        if isinstance(config, cls) and not fields:
            return config
        saved = config.to_dict()
        settings = {k: v for k, v in saved.items() if k not in _NOT_SETTINGS}
        recorded = {k: saved[k] for k in RTD_FIELDS if k in saved}
        return cls(**{**settings, **recorded, **fields})


__all__ = ["LAYOUTS", "RTD_FIELDS", "HeadLayout", "ReferenceLayout", "SesameBertConfig", "SesameBertRTDConfig"]
