"""SesameBert: a compact BERT-like Transformer encoder and its heads (MLM, MLM + NSP, classification, QA, tagging).

Architecture: BERT (Devlin et al. 2019, "BERT: Pre-training of Deep Bidirectional Transformers") with the
component choices of Cramming (Geiping & Goldstein 2023, ``crammed_bert.py``) picked by config strings through
the small tables below: activation, normalisation (LayerNorm / RMSNorm), its position (post-LN as BERT or pre-LN),
position embeddings (learned or sinusoidal), pooling for classification (cls / mean / max / attention); and the
modern encoder's (ModernBERT, EuroBERT): rotary embeddings, GLU feed-forward layers, bias switches, local
(sliding-window) attention, grouped-query attention, their head layouts (``configuration_sesame_bert``). Rotary
embeddings, sliding-window masks, the eager kernel and the dense document masks live in ``attention_sesame_bert``.

Self-attention goes through transformers' attention interface: ``config._attn_implementation`` picks the kernel
from ``ALL_ATTENTION_FUNCTIONS`` ("eager", "sdpa" (the default), "flex_attention", "flash_attention_2" where
installed, or a function registered with ``AttentionInterface.register``), and the mask is built for that kernel by
``transformers.masking_utils.create_bidirectional_mask`` (boolean for SDPA, additive for eager, a ``BlockMask`` for
flex). ``from_pretrained(..., attn_implementation=...)``, ``from_config(..., attn_implementation=...)`` and
``model.set_attn_implementation(...)`` switch it as for transformers' ``BertModel``. ``output_attentions=True`` returns
the softmax probabilities of the eager kernel (with "sdpa" those layers run the eager kernel, as SDPA cannot return
them). ``position_ids`` that restart at 0 inside a row mark packed documents: attention then stays within each
document (see :class:`SesameBertModel`). Dropout is active only in training.

Shapes: B = batch, T = sequence length (tokens), H = hidden_size, A = num_attention_heads, V = vocab_size.

This file is copied next to the weights by ``save_pretrained`` (``auto_map`` + remote code): it imports only torch,
transformers and, relatively, ``configuration_sesame_bert``.
"""

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface, PreTrainedModel
from transformers import initialization as init
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, create_bidirectional_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutputWithPooling,
    MaskedLMOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.pytorch_utils import apply_chunking_to_forward
from transformers.utils import ModelOutput
from transformers.utils.generic import can_return_tuple
from transformers.utils.output_capturing import capture_outputs

from .attention_sesame_bert import (  # noqa: F401  (DocumentSequences ... document_sequences: this module's names too)
    ATTENTION_PATHS,
    PACKED_SEQUENCE_KEYS,
    DocumentSequences,
    MaskInputs,
    SinusoidalPositionEmbedding,
    apply_rotary,
    document_block_mask,
    document_dense_mask,
    document_ids,
    document_mask_function,
    document_sequences,
    eager_attention_forward,
    flash_varlen_kwargs,
    local_attention_kernel,
    local_block_mask,
    packed_documents_kernel,
    repeat_kv,
    rotary_embeddings,
    sinusoidal_table,
    sliding_window_mask,
)
from .configuration_sesame_bert import GLU_ACTS, LAYOUTS, SesameBertConfig
from .loss_sesame_bert import linear_cross_entropy

#: The project's attention paths (:data:`ATTENTION_PATHS`): each kernel registered with transformers'
#: ``AttentionInterface`` and its mask builder with ``AttentionMaskInterface``, under the path's own name (the model
#: picks one per layer type once per forward, :meth:`SesameBertModel._attention`, and the path builds its metadata).
for _name, (_kernel, _mask) in ATTENTION_PATHS.items():
    AttentionInterface.register(_name, _kernel)
    AttentionMaskInterface.register(_name, _mask)
KERNELS = {name: kernel for name, (kernel, _) in ATTENTION_PATHS.items()}
#: :func:`packed_documents_kernel`'s answers -> the registered kernels of the full-attention layers
FULL_KERNELS = {"document_flex": "sesame_document_flex", "document_varlen": "sesame_document_varlen"}

IGNORE_INDEX = -100  # label of positions that are not predicted (MLM) / not scored (tagging)


# ---- component tables (config string -> constructor) ----------------------------------------------------------
ACTIVATIONS = {
    "gelu": nn.GELU,  # exact (erf) GELU, as BERT
    "gelu_new": lambda: nn.GELU(approximate="tanh"),
    "gelu_pytorch_tanh": lambda: nn.GELU(approximate="tanh"),
    "relu": nn.ReLU,
    "silu": nn.SiLU,
    "swish": nn.SiLU,
    "tanh": nn.Tanh,
}


class GatedLinearUnit(nn.Module):
    """GLU variants (Shazeer 2020, "GLU Variants Improve Transformer", eq. 5-6): ``act(a) * b`` with ``[a; b] = x``
    split in halves on the last axis, (..., 2I) -> (..., I); GEGLU with GELU, SwiGLU with SiLU."""

    def __init__(self, act: nn.Module):
        super().__init__()
        self.act = act

    def forward(self, x):
        a, b = x.chunk(2, dim=-1)
        return self.act(a) * b


ACTIVATIONS.update({name: lambda gate=gate: GatedLinearUnit(ACTIVATIONS[gate]()) for name, gate in GLU_ACTS.items()})
NORMS = {  # (width, eps, bias) -> module
    "layernorm": lambda w, eps, bias: nn.LayerNorm(w, eps=eps, bias=bias),
    "rmsnorm": lambda w, eps, bias: nn.RMSNorm(w, eps=eps),
}
POSITION_EMBEDDINGS = {  # (config, width) -> module
    "learned": lambda c, w: nn.Embedding(c.max_position_embeddings, w),
    "absolute": lambda c, w: nn.Embedding(c.max_position_embeddings, w),  # old BertConfig name
    "sinusoidal": lambda c, w: SinusoidalPositionEmbedding(c.max_position_embeddings, w),
    "rope": lambda c, w: None,  # rotary: applied to the queries and keys of every layer
}


def _head_act(config: SesameBertConfig, name: str | None) -> nn.Module:
    """The activation ``name`` of a ``HeadLayout`` (``LAYOUTS[head_layout].heads``)."""
    hidden = GLU_ACTS.get(config.hidden_act, config.hidden_act)
    return ACTIVATIONS[{None: config.classifier_activation, "hidden_act": hidden}.get(name, name)]()


def _norm(config: SesameBertConfig, width: int | None = None) -> nn.Module:
    width = config.hidden_size if width is None else width
    return NORMS[config.norm_type](width, config.layer_norm_eps, config.norm_bias)


def _keep_mask(attention_mask: torch.Tensor | None, shape: torch.Size, device) -> torch.Tensor:
    """(B, T) bool: True for real tokens (``attention_mask == 1``), all True when no mask is given."""
    if attention_mask is None:
        return torch.ones(shape, dtype=torch.bool, device=device)
    return attention_mask.bool()


# ---- pooling table: (pooler, hidden (B, T, H), keep (B, T) bool) -> (B, H) --------------------------------------
def _pool_cls(pooler, h, keep):
    return h[:, 0]


def _pool_mean(pooler, h, keep):
    keep = keep.unsqueeze(-1).to(h.dtype)
    return (h * keep).sum(1) / keep.sum(1).clamp(min=1.0)


def _pool_max(pooler, h, keep):
    return h.masked_fill(~keep.unsqueeze(-1), torch.finfo(h.dtype).min).amax(1)


def _pool_attention(pooler, h, keep):
    scores = pooler.attention(h).squeeze(-1)  # (B, T): w^T h_i; bf16/fp16 under autocast although h is fp32
    # the minimum of the scores' own dtype: float32's minimum overflows a bf16/fp16 tensor (masked_fill raises)
    alpha = scores.masked_fill(~keep, torch.finfo(scores.dtype).min).softmax(-1)
    return torch.einsum("bt,bth->bh", alpha.to(h.dtype), h)


POOLINGS = {"cls": _pool_cls, "mean": _pool_mean, "max": _pool_max, "attention": _pool_attention}


# ---- modules ------------------------------------------------------------------------------------------------------
class SesameBertEmbeddings(nn.Module):
    """Word + position + segment embeddings, then norm and dropout: ``-> (B, T, E)``, E = ``config.embedding_width``
    (the hidden size H unless ``embedding_size`` is set)."""

    def __init__(self, config: SesameBertConfig):
        super().__init__()
        width = config.embedding_width
        self.word_embeddings = nn.Embedding(config.vocab_size, width, padding_idx=config.pad_token_id)
        self.position_embeddings = POSITION_EMBEDDINGS[config.position_embedding_type](config, width)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, width) if config.type_vocab_size else None
        self.norm = _norm(config, width) if config.embedding_norm else nn.Identity()
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids=None, token_type_ids=None, position_ids=None, inputs_embeds=None):
        embeddings = self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        batch, length = embeddings.shape[:2]
        if position_ids is None:
            position_ids = torch.arange(length, device=embeddings.device).unsqueeze(0)
        if token_type_ids is None:
            token_type_ids = torch.zeros(batch, length, dtype=torch.long, device=embeddings.device)
        if self.token_type_embeddings is not None:
            embeddings = embeddings + self.token_type_embeddings(token_type_ids)
        if self.position_embeddings is not None:
            embeddings = embeddings + self.position_embeddings(position_ids)
        return self.dropout(self.norm(embeddings))


class SesameBertSelfAttention(nn.Module):
    """Multi-head self-attention with a fused QKV projection (Vaswani et al. 2017, eq. 1 and sec. 3.2.2).

    The projections are ``qkv`` (H -> 3H; rows: all heads' queries, then keys, then values) and ``out`` (H -> H); these
    are the module names that peft's ``target_modules`` name. The attention itself is the kernel
    ``ALL_ATTENTION_FUNCTIONS[config._attn_implementation]`` (:func:`eager_attention_forward` for "eager").

    ``forward(hidden_states (B, T, H), attention_mask, output_attentions=False, **kwargs)``
    ``-> (out (B, T, H), probabilities (B, A, T, T) or None)``: ``attention_mask`` is what
    ``create_bidirectional_mask`` built for the implementation (or ``None``); ``kwargs`` go to the kernel (e.g. the
    flash varlen ``cu_seq_lens_q`` ...). The kernel is ``kwargs["attention_kernel"]``, a name registered with
    transformers' ``AttentionInterface`` that :class:`SesameBertModel` chose once per forward for the layer's type
    (e.g. ``"sesame_document_flex"``, ``"sesame_local_sdpa"``, :data:`KERNELS`), with the mask metadata that kernel
    takes; without it, ``config._attn_implementation``. With ``output_attentions`` an "sdpa" layer runs the eager
    kernel; other kernels return what they return (``None`` for flex and flash: transformers then warns).

    Modern options: with ``num_key_value_heads`` K < A, ``qkv`` gives A queries and K keys and values (H -> (A + 2K) D,
    grouped-query attention; each key/value head is repeated for its A / K query heads before the kernel); with
    ``position_embeddings`` ``(cos, sin)`` the queries and keys are rotated (RoPE); a ``"sliding_attention"`` layer
    (``attention_type``) passes ``sliding_window = local_attention // 2 + 1`` to the kernel (transformers' flash
    wrapper reads it, as for ModernBERT; the project's local kernels get the window with their metadata).
    """

    is_causal = False  # read by transformers' sdpa / flash kernels: an encoder attends both ways

    def __init__(self, config: SesameBertConfig, attention_type: str = "full_attention"):
        super().__init__()
        self.config = config
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.key_value_heads
        self.head_dim = config.attention_head_dim
        self.scaling = self.head_dim**-0.5
        width, bias = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim, config.attention_bias
        self.qkv = nn.Linear(config.hidden_size, width, bias=bias)
        self.out = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=bias)
        self.dropout_p = config.attention_probs_dropout_prob
        self.sliding_window = config.local_attention // 2 + 1 if attention_type == "sliding_attention" else None

    def forward(self, hidden_states, attention_mask=None, output_attentions=False, position_embeddings=None, **kwargs):
        batch, length = hidden_states.shape[:2]
        qkv = self.qkv(hidden_states).view(batch, length, -1, self.head_dim).transpose(1, 2)
        q, k, v = qkv.split((self.num_heads, self.num_kv_heads, self.num_kv_heads), dim=1)
        if position_embeddings is not None:
            q, k = apply_rotary(q, k, *position_embeddings)
        groups = self.num_heads // self.num_kv_heads
        k, v = repeat_kv(k, groups), repeat_kv(v, groups)
        if self.sliding_window is not None:
            kwargs["sliding_window"] = self.sliding_window
        implementation = kwargs.pop("attention_kernel", None) or self.config._attn_implementation
        if output_attentions and implementation == "sdpa":
            implementation = "eager"
        attention: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
        context, probs = attention(
            self,
            q,
            k,
            v,
            attention_mask,
            dropout=self.dropout_p if self.training else 0.0,
            scaling=self.scaling,
            output_attentions=output_attentions,
            **kwargs,
        )
        return self.out(context.reshape(batch, length, -1)), probs


class SesameBertLayer(GradientCheckpointingLayer):
    """One Transformer layer; post-LN ``x = Norm(x + F(x))`` (BERT) or pre-LN ``x = x + F(Norm(x))``.

    ``forward(hidden_states (B, T, H), attention_mask=..., **kwargs) -> (B, T, H)``; ``kwargs`` go to the attention.
    The feed-forward sub-layer runs in chunks of ``config.chunk_size_feed_forward`` positions when that is > 0
    (transformers' ``apply_chunking_to_forward``: the same values with less peak memory; T must be a multiple of it).
    """

    def __init__(self, config: SesameBertConfig, layer_idx: int = 0):
        super().__init__()
        self.pre_norm = config.norm_position == "pre"
        self.chunk_size_feed_forward = config.chunk_size_feed_forward
        self.attention_type = config.attention_types()[layer_idx]
        self.attn = SesameBertSelfAttention(config, self.attention_type)
        identity = self.pre_norm and layer_idx == 0 and not config.first_layer_attention_norm
        self.norm1 = nn.Identity() if identity else _norm(config)
        gates = 2 if config.hidden_act in GLU_ACTS else 1  # a GLU's fc1 gives the activated half and the gate
        self.ffn = nn.Sequential(
            OrderedDict(
                fc1=nn.Linear(config.hidden_size, gates * config.intermediate_size, bias=config.mlp_bias),
                act=ACTIVATIONS[config.hidden_act](),
                fc2=nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias),
            )
        )
        self.norm2 = _norm(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states, attention_mask=None, **kwargs):
        x = hidden_states
        if self.pre_norm:
            attn, _ = self.attn(self.norm1(x), attention_mask, **kwargs)
            x = x + self.dropout(attn)
        else:
            attn, _ = self.attn(x, attention_mask, **kwargs)
            x = self.norm1(x + self.dropout(attn))
        return apply_chunking_to_forward(self.feed_forward, self.chunk_size_feed_forward, 1, x)

    def feed_forward(self, x):
        """The feed-forward sub-layer with its residual and (post-LN) norm, position-wise: (B, T', H) -> (B, T', H)."""
        if self.pre_norm:
            return x + self.dropout(self.ffn(self.norm2(x)))
        return self.norm2(x + self.dropout(self.ffn(x)))


class SesameBertEncoder(nn.Module):
    """The stack of layers (plus a final norm for pre-LN).

    ``forward(hidden_states (B, T, H), attention_mask, **kwargs) -> (B, T, H)``.

    Per-layer outputs and attention probabilities are captured by transformers' output-capture hooks
    (``_can_record_outputs``), not collected here.
    """

    def __init__(self, config: SesameBertConfig):
        super().__init__()
        self.layer = nn.ModuleList([SesameBertLayer(config, i) for i in range(config.num_hidden_layers)])
        self.final_norm = _norm(config) if config.norm_position == "pre" else nn.Identity()

    def forward(self, hidden_states, attention_mask=None, position_embeddings=None, kernels=None, **kwargs):
        """``attention_mask``: a dict layer type -> the mask metadata of its kernel; ``position_embeddings``: a dict
        layer type -> rotary ``(cos, sin)`` (:func:`rotary_embeddings`), or ``None``; ``kernels``: a dict layer type
        -> the name of its kernel in transformers' ``AttentionInterface`` (:meth:`SesameBertModel._attention`), or
        ``None`` (``config._attn_implementation``)."""
        for layer in self.layer:
            kind = layer.attention_type
            extra = {"attention_kernel": kernels[kind]} if kernels else {}
            rotary = (position_embeddings or {}).get(kind)
            if rotary:
                extra["position_embeddings"] = rotary
            hidden_states = layer(hidden_states, (attention_mask or {}).get(kind), **extra, **kwargs)
        return self.final_norm(hidden_states)


class SesameBertPredictionHeadTransform(nn.Module):
    """The prediction head transform ``norm(act(dense(x)))`` on every position: (..., H) -> (..., H), in the dtype of
    ``x`` (autocast's under autocast). The tagging and QA heads run it on every token before their classifier where
    the layout has one (``HeadLayout.prediction_head``: ModernBERT's ``head``, Warner et al. 2024); the pooler runs
    it on its summary. ``dense`` H -> H (bias: ``classifier_bias``), ``act`` and ``norm`` from
    ``LAYOUTS[head_layout].heads`` (``pooler_activation``, ``pooler_norm``: without it the identity).
    """

    def __init__(self, config: SesameBertConfig):
        super().__init__()
        heads = LAYOUTS[config.head_layout].heads
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=config.classifier_bias)
        self.act = _head_act(config, heads.pooler_activation)
        self.norm = _norm(config) if heads.pooler_norm else nn.Identity()

    def forward(self, x):
        return self.norm(self.act(self.dense(x)))


class SesameBertPooler(SesameBertPredictionHeadTransform):
    """Sequence summary for NSP and classification: the prediction head transform of ``pool(h)``, ``pool`` from
    :data:`POOLINGS` (``classifier_pooling``); with ``"late"`` (EuroBERT's) the mean of the transform of every token.

    ``forward(h (B, T, H) float, keep (B, T) bool) -> (B, H)`` in the dtype of ``h``. With ``classifier_pooling="cls"``
    and the ``"bert"`` layout this is BERT's pooler, ``tanh(W h_[CLS] + b)`` (Devlin et al. 2019, sec. 3). Its
    parameters are the transform's (``dense``, ``norm``) and, with ``"attention"`` pooling, ``attention`` (w of
    alpha = softmax(w^T h_i)).
    """

    def __init__(self, config: SesameBertConfig):
        super().__init__(config)
        self.pooling = config.classifier_pooling
        if self.pooling == "attention":
            self.attention = nn.Linear(config.hidden_size, 1, bias=False)

    def forward(self, h, keep):
        if self.pooling == "late":
            return _pool_mean(self, super().forward(h), keep)
        return super().forward(POOLINGS[self.pooling](self, h, keep))


class SesameBertMLMHead(nn.Module):
    """BERT's MLM head: ``decoder(Norm(act(dense(h))))``; the decoder weight is tied to the word embeddings.

    ``forward(h (..., H)) -> logits (..., V)``. With ``embedding_size`` E != H the dense layer maps H -> E and the
    decoder E -> V (ELECTRA's generator head).
    """

    def __init__(self, config: SesameBertConfig):
        super().__init__()
        width = config.embedding_width
        heads = LAYOUTS[config.head_layout].heads
        act, transform = heads.transform_activation, heads.mlm_transform
        self.dense = nn.Linear(config.hidden_size, width, bias=config.classifier_bias) if transform else nn.Identity()
        self.act = _head_act(config, act) if transform else nn.Identity()
        self.norm = _norm(config, width) if transform else nn.Identity()
        self.decoder = nn.Linear(width, config.vocab_size, bias=config.decoder_bias)

    def forward(self, h, decode: bool = True):
        """(..., H) -> logits (..., V); with ``decode=False`` the states the decoder scores, (..., E) ``Norm(act(
        dense(h)))`` (for :func:`.loss_sesame_bert.linear_cross_entropy`; one method, so that regional compilation of
        the head covers both)."""
        states = self.norm(self.act(self.dense(h)))
        return self.decoder(states) if decode else states


@dataclass
class SesameBertForPreTrainingOutput(ModelOutput):
    """Output of :class:`SesameBertForPreTraining` (as transformers' ``BertForPreTrainingOutput``, plus the parts).

    Args:
        loss: scalar, ``mlm_loss + nsp_loss`` over the labels given (either may be absent).
        prediction_logits: MLM scores, (B, T, V); in training with sparse prediction only the rows of the
            predicted positions, (N, V) in row-major (batch, position) order, N = ``(labels != -100).sum()``.
        seq_relationship_logits: NSP scores, (B, 2): index 0 = B is the continuation of A (IsNext), 1 = random.
        mlm_loss: mean NLL (nats) over the predicted tokens; ``exp`` of the token-weighted mean is the perplexity.
        nsp_loss: mean NLL over the batch of the NSP labels.
        hidden_states, attentions: as in transformers (``output_hidden_states`` / ``output_attentions``).
    """

    loss: torch.Tensor | None = None
    prediction_logits: torch.Tensor | None = None
    seq_relationship_logits: torch.Tensor | None = None
    mlm_loss: torch.Tensor | None = None
    nsp_loss: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


# ---- models -------------------------------------------------------------------------------------------------------
AUTO_MAP = {
    "AutoConfig": "configuration_sesame_bert.SesameBertConfig",
    "AutoModel": "modeling_sesame_bert.SesameBertModel",
    "AutoModelForMaskedLM": "modeling_sesame_bert.SesameBertForMaskedLM",
    "AutoModelForPreTraining": "modeling_sesame_bert.SesameBertForPreTraining",
    "AutoModelForSequenceClassification": "modeling_sesame_bert.SesameBertForSequenceClassification",
    "AutoModelForQuestionAnswering": "modeling_sesame_bert.SesameBertForQuestionAnswering",
    "AutoModelForTokenClassification": "modeling_sesame_bert.SesameBertForTokenClassification",
}


class SesameBertPreTrainedModel(PreTrainedModel):
    """Base class: BERT initialisation, gradient checkpointing, and ``save_pretrained`` with the full ``auto_map``."""

    config_class = SesameBertConfig
    base_model_prefix = "bert"
    supports_gradient_checkpointing = True
    # The attention kernels of transformers' attention interface, as BertModel (see SesameBertSelfAttention).
    _supports_sdpa = True
    _supports_flex_attn = True
    _supports_flash_attn = True
    _supports_attention_backend = True
    # transformers' output capture: hidden_states = the embeddings then every layer's output (the last one replaced
    # by last_hidden_state, i.e. after the pre-LN final norm); attentions = index 1 of every attention's output.
    _can_record_outputs = {"hidden_states": SesameBertLayer, "attentions": SesameBertSelfAttention}
    # The losses are means over the micro-batch and take no num_items_in_batch: transformers' Trainer must keep
    # dividing them by the accumulation steps (it stops doing so for models that accept loss kwargs).
    accepts_loss_kwargs = False
    _no_split_modules = ["SesameBertEmbeddings", "SesameBertLayer"]

    @torch.no_grad()
    def _init_weights(self, module):
        """BERT init: linear / embedding weights ~ N(0, initializer_range), biases 0, norms weight 1 / bias 0,
        the padding row 0 (transformers' default), and the fixed sinusoidal table recomputed."""
        super()._init_weights(module)
        if isinstance(module, SinusoidalPositionEmbedding):
            init.copy_(module.table, sinusoidal_table(*module.table.shape, dtype=module.table.dtype))

    def compile_regions(self, **compile_kwargs) -> list[str]:
        """Regional compilation, as ModernBERT's ``reference_compile``: ``torch.compile`` of every layer's
        feed-forward network (``ffn``), every norm and the MLM prediction head (``cls``), module by module and in place
        (``nn.Module.compile``: parameter names and the state dict unchanged; attention stays eager, its kernel chosen
        per forward). A module inside one already compiled is left to it. Meant for CUDA (``--regional_compile``);
        not measured yet against eager and whole-model compilation.

        Args:
            compile_kwargs: for ``torch.compile`` (default ``dynamic=True``: the sparse head's rows change every batch).

        Returns:
            The names of the compiled modules, in ``named_modules`` order.
        """
        compile_kwargs.setdefault("dynamic", True)
        compiled: list[str] = []
        for name, module in self.named_modules():
            if any(name.startswith(f"{done}.") for done in compiled):
                continue
            if isinstance(module, (SesameBertMLMHead, nn.LayerNorm, nn.RMSNorm)) or name.endswith(".ffn"):
                module.compile(**compile_kwargs)
                compiled.append(name)
        return compiled

    def save_pretrained(self, save_directory, *args, **kwargs):
        """As ``PreTrainedModel.save_pretrained``; when the class is registered for an Auto class (importing
        ``modeling`` does it), ``config.json`` gets the ``auto_map`` of every SesameBert class, so that each
        Auto class loads the directory with ``trust_remote_code=True`` without this package."""
        if self._auto_class is not None:
            self.config.auto_map = {**AUTO_MAP, **(getattr(self.config, "auto_map", None) or {})}
        return super().save_pretrained(save_directory, *args, **kwargs)


class SesameBertModel(SesameBertPreTrainedModel):
    """The bare encoder. ``forward`` returns ``BaseModelOutputWithPooling``:

    ``last_hidden_state`` (B, T, H) float; ``pooler_output`` (B, H) (``None`` without pooling layer);
    ``hidden_states`` (L + 1 tensors (B, T, H): embeddings, then each layer; the last one is ``last_hidden_state``,
    i.e. after the final norm with pre-LN) and ``attentions`` (L tensors (B, A, T, T), the eager kernel's
    probabilities; empty for flex / flash) when asked for (``output_hidden_states`` / ``output_attentions``, keyword
    arguments, default the config's; captured by transformers' output hooks). ``return_dict=False`` gives the
    tuple of the fields that are not ``None``.

    Inputs: ``input_ids`` (B, T) long, or ``inputs_embeds`` (B, T, E) (E = ``config.embedding_width``, H unless
    ``embedding_size`` is set; then ``embeddings_project`` maps the embeddings E -> H); ``attention_mask`` (B, T)
    1 = token, 0 = padding; ``token_type_ids`` (B, T) segment ids (default 0); ``position_ids`` (B|1, T) long
    (default 0..T-1). Other keyword arguments go to the attention kernel.

    **Masks.** Without ``attention_mask`` and ``position_ids`` no mask reaches attention (the fast path: SDPA may take
    its unmasked flash kernel; packed pretraining blocks leave the mask out, :class:`pretrain.collators.MLMCollator`
    does). A given ``attention_mask`` is always used, all ones or not: nothing in ``forward`` reads tensor values to
    decide (no host synchronisation, and ``torch.export`` / ``torch.compile(fullgraph=True)`` trace one graph; the
    varlen paths of packed documents below are the exception).

    **Packed documents.** ``position_ids`` that restart at 0 at the first token of every document of a packed row (e.g.
    ``[0 1 2 3 0 1 2 0 1]`` for documents of 4, 3 and 2 tokens; a document starts where ``position_ids[t] !=
    position_ids[t-1] + 1``) make every token attend only to the tokens of its own document (and not to padding, when
    ``attention_mask`` is also given); the position embeddings use them, so positions restart per document too. Each
    document is then encoded exactly as if it were alone in its row. The mask is :func:`document_dense_mask` for eager /
    SDPA (block-diagonal, boolean), ``create_bidirectional_mask`` with :func:`document_mask_function` for flex (a
    ``BlockMask``); flash_attention_* runs the varlen kernel on :func:`flash_varlen_kwargs` instead. On CUDA, "sdpa"
    with packed documents runs FlexAttention on :func:`document_block_mask` instead of a dense (B, 1, T, T) mask
    whenever no attention dropout is in effect, and varlen kernels on the unpadded documents
    (:func:`document_varlen_attention`: FlashAttention's in bf16 / fp16) in training with attention dropout
    (:func:`packed_documents_kernel`). The varlen paths take the sequences from the batch's
    :data:`PACKED_SEQUENCE_KEYS` (``pretrain``'s collator computes them on the host, in its workers); without them
    they compute them, which reads the device once per forward. Other implementations need a mask function
    registered with transformers' ``AttentionMaskInterface`` (``ValueError`` otherwise). The model adds no special
    tokens: where ``[CLS]`` and ``[SEP]`` go is the data pipeline's choice. A ``[CLS]`` sees only its own document,
    so the ``cls`` pooler of a packed row (and NSP) summarises its first document only; ``mean`` / ``max`` /
    ``attention`` pooling span every document of the row. A ``[SEP]`` whose position continues the document before it
    belongs to that document.

    **Local layers** (``"sliding_attention"``, a token attends to the tokens at most ``local_attention // 2``
    positions away) never get a (T, T) mask: on the CPU "sdpa" and "eager" run in blocks of queries against the keys
    within the window (:func:`local_sdpa_attention`, :func:`local_eager_attention`); on CUDA "sdpa" runs
    FlashAttention's varlen kernel with its window (:func:`local_varlen_attention`; the blocks in float32), or
    FlexAttention on a sliding + document ``BlockMask`` (:func:`local_block_mask`) for packed documents without
    attention dropout; "flex_attention" gets that ``BlockMask``; flash_attention_* the window as ``sliding_window``
    (:func:`local_attention_kernel`). Padding tokens attend to themselves only there.
    """

    def __init__(self, config: SesameBertConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = SesameBertEmbeddings(config)
        # embeddings of another width E (config.embedding_size, as ELECTRA's generator): a projection E -> H
        self.embeddings_project = None
        if config.embedding_width != config.hidden_size:
            self.embeddings_project = nn.Linear(config.embedding_width, config.hidden_size)
        self.encoder = SesameBertEncoder(config)
        self.pooler = SesameBertPooler(config) if add_pooling_layer else None
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.embeddings.word_embeddings = value

    @capture_outputs
    def forward(
        self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, inputs_embeds=None, **kwargs
    ):
        """See the class docstring. Raises ``ValueError`` unless exactly one of ``input_ids`` / ``inputs_embeds`` is
        given, and for ``position_ids`` with an attention implementation that has no mask function."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids (B, T) or inputs_embeds (B, T, E)")
        kwargs.pop("output_hidden_states", None)  # captured by the hooks of capture_outputs
        output_attentions = kwargs.pop("output_attentions", None)
        output_attentions = self.config.output_attentions if output_attentions is None else output_attentions
        x = self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds)
        if self.embeddings_project is not None:
            x = self.embeddings_project(x)
        masks, kernels = self._attention(x, attention_mask, position_ids, kwargs, output_attentions)
        positions = torch.arange(x.shape[1], device=x.device)[None] if position_ids is None else position_ids
        rotary = rotary_embeddings(self.config, positions, x.dtype)
        last = self.encoder(
            x, masks, position_embeddings=rotary, kernels=kernels, output_attentions=output_attentions, **kwargs
        )
        pooled = None
        if self.pooler is not None:
            pooled = self.pooler(last, _keep_mask(attention_mask, last.shape[:2], last.device))
        return BaseModelOutputWithPooling(last_hidden_state=last, pooler_output=pooled)

    def _attention(self, embeddings, attention_mask, position_ids, kernel_kwargs: dict, output_attentions=False):
        """The attention of every layer type, chosen once per forward: ``(masks, kernels)``, two dicts layer type ->
        the mask metadata its kernel takes, and the kernel's name in transformers' ``AttentionInterface``.

        Full-attention layers run ``config._attn_implementation`` ("eager" for "sdpa" asked for the probabilities;
        for packed documents :func:`packed_documents_kernel`'s answer, its CUDA paths as ``"sesame_document_flex"``
        / ``"sesame_document_varlen"``); ``"sliding_attention"`` layers the kernel of :func:`local_attention_kernel`.
        The project's paths (:data:`ATTENTION_PATHS`) build their own metadata: their builder registered under the
        same name with transformers' ``AttentionMaskInterface``, on the batch's :class:`MaskInputs`; transformers'
        implementations get theirs from :meth:`_attention_mask` / :meth:`_window_mask`. The batch's
        :data:`PACKED_SEQUENCE_KEYS` (the collator's, computed on the host) are taken out of ``kernel_kwargs`` and used
        by the varlen paths instead of reading the sequences from the device; for flash_attention_* with packed
        documents the varlen arguments are added to ``kernel_kwargs``."""
        given = {key: kernel_kwargs.pop(key) for key in PACKED_SEQUENCE_KEYS if key in kernel_kwargs}
        choice = self.config._attn_implementation
        documents = None
        if position_ids is not None:
            documents = document_ids(position_ids.expand(embeddings.shape[0], -1))
            choice = packed_documents_kernel(self.config, embeddings.device, self.training, output_attentions)
        if output_attentions and choice == "sdpa":
            choice = "eager"
        keep = None if attention_mask is None else attention_mask.bool()
        kernels = {"full_attention": FULL_KERNELS.get(choice, choice)}
        if "sliding_attention" in self.config.attention_types():
            kernels["sliding_attention"] = local_attention_kernel(choice, embeddings.device)
        inputs = MaskInputs(self.config, tuple(embeddings.shape[:2]), embeddings.device, documents, keep, given)
        masks = {}
        for kind, name in kernels.items():
            if name in ATTENTION_PATHS:  # the path's own builder, through transformers' mask interface
                batch, length = inputs.shape
                masks[kind] = ALL_MASK_ATTENTION_FUNCTIONS[name](
                    batch, length, length, attention_mask=attention_mask, inputs=inputs, layer_type=kind
                )
            elif kind == "full_attention":
                masks[kind] = self._attention_mask(embeddings, attention_mask, documents, keep, choice)
            else:
                masks[kind] = self._window_mask(name, embeddings, attention_mask, inputs, masks)
        if choice.startswith("flash_attention") and documents is not None:
            kernel_kwargs.update(given or flash_varlen_kwargs(documents, keep))
        return masks, kernels

    def _window_mask(self, kernel, embeddings, attention_mask, inputs: MaskInputs, masks):
        """The mask of the ``"sliding_attention"`` layers for a ``kernel`` of transformers' (the project's paths
        build their own, :data:`ATTENTION_PATHS`): the full layers' for flash_attention_* (the window goes to the
        kernel), a ``BlockMask`` of :func:`local_block_mask` for "flex_attention" (no (T, T) tensor), and
        :func:`sliding_window_mask` for an implementation registered by the user."""
        if kernel.startswith("flash_attention"):
            return masks["full_attention"]
        if kernel == "flex_attention":
            return local_block_mask(inputs.groups.expand(inputs.shape[0], -1), self.config.local_attention)
        return sliding_window_mask(self.config, embeddings, attention_mask, inputs.documents)

    def _attention_mask(self, embeddings, attention_mask, documents, keep, choice: str):
        """The mask of the full-attention layers for ``choice``, an implementation of transformers' (the kernel
        chosen by :meth:`_attention`; the project's paths build their own, :data:`ATTENTION_PATHS`): the padding
        mask of ``create_bidirectional_mask`` without packed documents; with them ``None`` for flash (the varlen
        arguments go to the kernel), the dense :func:`document_dense_mask` for "sdpa" and "eager", and
        ``create_bidirectional_mask`` with :func:`document_mask_function` for the others."""
        if documents is None:
            if attention_mask is None:
                return None
            return create_bidirectional_mask(self.config, embeddings, attention_mask, allow_is_bidirectional_skip=False)
        if choice.startswith("flash_attention"):
            return None
        if choice in ("sdpa", "eager"):
            return document_dense_mask(documents, keep)
        if choice not in ALL_MASK_ATTENTION_FUNCTIONS:  # a mask function registered for it
            raise ValueError(
                f"position_ids (packed documents) need a mask function for attn_implementation={choice!r}: "
                "register one with transformers.AttentionMaskInterface.register, or leave position_ids out"
            )
        return create_bidirectional_mask(
            self.config, embeddings, attention_mask, and_mask_function=document_mask_function(documents, keep)
        )


def _extras(outputs) -> dict:
    """The encoder's optional ``hidden_states`` / ``attentions``, passed on by every head."""
    return dict(hidden_states=outputs.hidden_states, attentions=outputs.attentions)


def _mlm(model: SesameBertPreTrainedModel, sequence_output, labels, skip_logits: bool = False):
    """Run the MLM head ``model.cls``; return (logits, loss).

    loss = mean over the predicted positions (label != -100) of -log p(label) (nats), computed in float32;
    ``None`` without labels. Sparse (training with labels and ``config.sparse_prediction``): the head runs only at
    the predicted positions, logits (N, V) in row-major (batch, position) order; otherwise (B, T, V). The two losses
    are equal. ``skip_logits`` with labels: the head's transform runs at the predicted positions only (in training
    and evaluation) and the decoder with the loss in one step (:func:`.loss_sesame_bert.linear_cross_entropy`), logits
    ``None``. A batch without any predicted position (e.g. a packed ``[CLS] [SEP]`` block) gives a loss
    of 0 with zero gradients (sum over no token / max(N, 1)) -- transformers' BertForMaskedLM gives NaN (0 / 0),
    which the training loop's token weight 0 cannot cancel (NaN * 0 = NaN).
    """
    head = model.cls
    if labels is None:
        return head(sequence_output), None
    flat = labels.reshape(-1)
    if skip_logits or (model.training and model.config.sparse_prediction):
        index = (flat != IGNORE_INDEX).nonzero().squeeze(1)
        states = sequence_output.reshape(-1, sequence_output.size(-1)).index_select(0, index)
        targets = flat.index_select(0, index)
        if skip_logits:
            decoder = head.decoder
            nll = linear_cross_entropy(head(states, decode=False), decoder.weight, decoder.bias, targets)
            return None, nll / max(index.numel(), 1)
        logits = head(states)
        nll = F.cross_entropy(logits.float(), targets, reduction="sum")
        return logits, nll / max(index.numel(), 1)
    logits = head(sequence_output)
    flat_logits = logits.reshape(-1, logits.size(-1)).float()
    nll = F.cross_entropy(flat_logits, flat, ignore_index=IGNORE_INDEX, reduction="sum")
    return logits, nll / (flat != IGNORE_INDEX).sum().clamp(min=1)


class SesameBertHeadModel(SesameBertPreTrainedModel):
    """Base of the SesameBert heads: ``forward(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
    labels, **kwargs)`` runs the encoder ``self.bert`` (inputs as :class:`SesameBertModel`'s) and returns
    ``self._head(outputs, labels, attention_mask)``: the head's logits, its loss (``None`` without labels) and the
    hidden states / attentions, in the subclass's ``ModelOutput``."""

    def _encode(self, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, kwargs):
        """``self.bert(...)`` as ``BaseModelOutputWithPooling``; ``kwargs`` go to the encoder."""
        return self.bert(
            input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, return_dict=True, **kwargs
        )

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs,
    ) -> ModelOutput:
        outputs = self._encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, kwargs)
        return self._head(outputs, labels, attention_mask)


class SesameBertForMaskedLM(SesameBertHeadModel):
    """Encoder + MLM head (Devlin et al. 2019, sec. 3.1, task 1), decoder tied to the input embeddings.

    ``forward(..., labels (B, T) long, -100 = not predicted) -> MaskedLMOutput``:
    ``loss`` = mean NLL (nats) over the predicted tokens (multiply by ``(labels != -100).sum()`` and sum across
    processes / batches for an exact corpus perplexity); ``logits`` = (B, T, V), or, in training mode with labels
    and ``config.sparse_prediction``, only the (N, V) rows of the predicted positions in row-major order
    (``logits[i]`` scores ``labels[labels != -100][i]``). ``labels=None`` (fill-mask) always gives (B, T, V).
    ``skip_logits=True`` with labels (what ``pretrain`` passes; Liger Kernel's name): the loss only, ``logits``
    ``None``, the decoder and the cross-entropy fused in chunks (:func:`.loss_sesame_bert.linear_cross_entropy`:
    no (N, V) logits in the graph, the same loss and gradients up to float rounding).
    """

    _tied_weights_keys = {"cls.decoder.weight": "bert.embeddings.word_embeddings.weight"}

    def __init__(self, config: SesameBertConfig):
        super().__init__(config)
        self.bert = SesameBertModel(config, add_pooling_layer=False)
        self.cls = SesameBertMLMHead(config)
        self.post_init()

    def get_output_embeddings(self):
        return self.cls.decoder

    def set_output_embeddings(self, new_embeddings):
        self.cls.decoder = new_embeddings

    @can_return_tuple
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        labels=None,
        skip_logits: bool = False,
        **kwargs,
    ) -> MaskedLMOutput:
        outputs = self._encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, kwargs)
        logits, loss = _mlm(self, outputs.last_hidden_state, labels, skip_logits)
        return MaskedLMOutput(loss=loss, logits=logits, **_extras(outputs))


class SesameBertForPreTraining(SesameBertHeadModel):
    """Encoder + MLM head + NSP head (Devlin et al. 2019, sec. 3.1, tasks 1 and 2).

    ``forward(..., labels (B, T) MLM labels with -100 = not predicted, next_sentence_label (B,) 0 = IsNext,
    1 = NotNext) -> SesameBertForPreTrainingOutput`` (``loss`` = MLM loss + NSP loss for the labels given;
    ``prediction_logits`` is sparse as in :class:`SesameBertForMaskedLM`, and ``None`` with ``skip_logits=True``).

    The loss is BERT's (and transformers' ``BertForPreTraining``): the mean MLM NLL over the predicted tokens
    plus the mean NSP NLL over the sentence pairs -- NSP is averaged per pair, not per token. (The shared loop
    then weights each micro-batch's loss by its number of predicted MLM tokens, so across the micro-batches of
    one optimizer step the NSP term of a micro-batch counts in proportion to its MLM tokens; with equal-length
    packed blocks these counts are nearly equal and the NSP term stays the per-pair mean.) A micro-batch with
    no predicted MLM token contributes an MLM loss of 0.
    """

    _tied_weights_keys = {"cls.decoder.weight": "bert.embeddings.word_embeddings.weight"}

    def __init__(self, config: SesameBertConfig):
        super().__init__(config)
        self.bert = SesameBertModel(config)
        self.cls = SesameBertMLMHead(config)
        self.nsp = nn.Linear(config.hidden_size, 2)
        self.post_init()

    get_output_embeddings = SesameBertForMaskedLM.get_output_embeddings
    set_output_embeddings = SesameBertForMaskedLM.set_output_embeddings

    @can_return_tuple
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        labels=None,
        next_sentence_label=None,
        skip_logits: bool = False,
        **kwargs,
    ):
        outputs = self._encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, kwargs)
        logits, mlm_loss = _mlm(self, outputs.last_hidden_state, labels, skip_logits)
        nsp_logits = self.nsp(outputs.pooler_output)
        nsp_loss = None
        if next_sentence_label is not None:
            nsp_loss = F.cross_entropy(nsp_logits.float(), next_sentence_label.reshape(-1))
        losses = [x for x in (mlm_loss, nsp_loss) if x is not None]
        return SesameBertForPreTrainingOutput(
            loss=sum(losses) if losses else None,
            prediction_logits=logits,
            seq_relationship_logits=nsp_logits,
            mlm_loss=mlm_loss,
            nsp_loss=nsp_loss,
            **_extras(outputs),
        )


def _add_classifier(model, config):
    """Give ``model`` ``num_labels``, the classifier dropout and the linear ``classifier`` (H -> num_labels)."""
    model.num_labels = config.num_labels
    p = config.hidden_dropout_prob if config.classifier_dropout is None else config.classifier_dropout
    model.dropout = nn.Dropout(p)
    model.classifier = nn.Linear(config.hidden_size, config.num_labels)


#: Checkpoints from before the prediction head was split from the pooler (issue 53) carry the unused ``attention`` of a
#: tagging / QA head with ``classifier_pooling="attention"``: ignored on load.
_POOLER_ONLY_KEYS = [r"^head\.attention\.weight$"]


def _prediction_head(config) -> nn.Module | None:
    """The tagging and QA heads' :class:`SesameBertPredictionHeadTransform` where the layout has one
    (``HeadLayout.prediction_head``: ``"modernbert"``), else ``None`` (the classifier reads the hidden states)."""
    return SesameBertPredictionHeadTransform(config) if LAYOUTS[config.head_layout].heads.prediction_head else None


class SesameBertForSequenceClassification(SesameBertHeadModel):
    """Encoder + pooler + dropout + linear classifier, for single sentences and sentence pairs (GLUE).

    ``forward(..., labels) -> SequenceClassifierOutput`` with ``logits`` (B, num_labels). The loss is transformers'
    ``self.loss_function`` (``loss_utils.ForSequenceClassificationLoss``, chosen by the class name) on float32 logits,
    following ``config.problem_type`` (set on the first call when ``None``): ``"regression"`` (num_labels == 1; MSE on
    float labels (B,)), ``"single_label_classification"`` (cross-entropy on long labels (B,)),
    ``"multi_label_classification"`` (BCE with logits on float labels (B, num_labels)). Labels other than long/int32
    class ids (and any labels of a multi-label problem) are cast to float32 first.
    """

    def __init__(self, config: SesameBertConfig):
        super().__init__(config)
        self.bert = SesameBertModel(config)
        _add_classifier(self, config)
        self.post_init()

    def _head(self, outputs, labels, attention_mask):
        logits = self.classifier(self.dropout(outputs.pooler_output))
        loss = None
        if labels is not None:  # transformers' problem-type loss on float32 logits; labels float unless class ids
            ids = labels.dtype in (torch.long, torch.int) and self.config.problem_type != "multi_label_classification"
            loss = self.loss_function(
                labels=labels if ids else labels.float(), pooled_logits=logits.float(), config=self.config
            )
        return SequenceClassifierOutput(loss=loss, logits=logits, **_extras(outputs))


class SesameBertForQuestionAnswering(SesameBertHeadModel):
    """Encoder + linear span head (SQuAD; Devlin et al. 2019, sec. 4.2).

    ``forward(..., start_positions (B,), end_positions (B,)) -> QuestionAnsweringModelOutput`` with
    ``start_logits`` / ``end_logits`` (B, T); loss = (CE(start) + CE(end)) / 2, positions outside [0, T) ignored.
    """

    _keys_to_ignore_on_load_unexpected = _POOLER_ONLY_KEYS

    def __init__(self, config: SesameBertConfig):
        super().__init__(config)
        self.bert = SesameBertModel(config, add_pooling_layer=False)
        self.head = _prediction_head(config)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        start_positions=None,
        end_positions=None,
        **kwargs,
    ):
        outputs = self._encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, kwargs)
        h = outputs.last_hidden_state
        start_logits, end_logits = self.qa_outputs(h if self.head is None else self.head(h)).unbind(-1)
        loss = None
        if start_positions is not None and end_positions is not None:
            length = start_logits.size(1)  # positions outside the sequence are ignored, as transformers does
            start = start_positions.reshape(-1).clamp(0, length)
            end = end_positions.reshape(-1).clamp(0, length)
            loss = (
                F.cross_entropy(start_logits.float(), start, ignore_index=length)
                + F.cross_entropy(end_logits.float(), end, ignore_index=length)
            ) / 2
        return QuestionAnsweringModelOutput(
            loss=loss, start_logits=start_logits.contiguous(), end_logits=end_logits.contiguous(), **_extras(outputs)
        )


class SesameBertForTokenClassification(SesameBertHeadModel):
    """Encoder + dropout + linear tagger (NER / POS).

    ``forward(..., labels (B, T) long, -100 = ignored) -> TokenClassifierOutput`` with ``logits``
    (B, T, num_labels); loss = mean cross-entropy over the scored tokens.
    """

    _keys_to_ignore_on_load_unexpected = _POOLER_ONLY_KEYS

    def __init__(self, config: SesameBertConfig):
        super().__init__(config)
        self.bert = SesameBertModel(config, add_pooling_layer=False)
        self.head = _prediction_head(config)
        _add_classifier(self, config)
        self.post_init()

    def _head(self, outputs, labels, attention_mask):
        h = outputs.last_hidden_state
        logits = self.classifier(self.dropout(h if self.head is None else self.head(h)))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.float().view(-1, self.num_labels), labels.view(-1), ignore_index=IGNORE_INDEX)
        return TokenClassifierOutput(loss=loss, logits=logits, **_extras(outputs))


__all__ = [
    "SesameBertPreTrainedModel",
    "SesameBertModel",
    "SesameBertForMaskedLM",
    "SesameBertForPreTraining",
    "SesameBertForPreTrainingOutput",
    "SesameBertForSequenceClassification",
    "SesameBertForQuestionAnswering",
    "SesameBertForTokenClassification",
]
