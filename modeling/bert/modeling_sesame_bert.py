"""SesameBert: a compact BERT-like Transformer encoder and its heads (MLM, MLM + NSP, classification, QA, tagging).

Architecture: BERT (Devlin et al. 2019, "BERT: Pre-training of Deep Bidirectional Transformers") with the
component choices of Cramming (Geiping & Goldstein 2023, ``crammed_bert.py``) picked by config strings through
the small tables below: activation, normalisation (LayerNorm / RMSNorm), its position (post-LN as BERT or pre-LN),
position embeddings (learned or sinusoidal), pooling for classification (cls / mean / max / attention).

Self-attention runs through ``torch.nn.functional.scaled_dot_product_attention`` (flash / memory-efficient kernels
on GPUs); ``output_attentions=True`` (and attention dropout on CPU, where it is faster) takes an explicit softmax
path that also returns the probabilities. Padding is
an additive mask (0 for tokens, the dtype's minimum for padding) on the keys. Dropout is active only in training.

Shapes: B = batch, T = sequence length (tokens), H = hidden_size, A = num_attention_heads, V = vocab_size.

This file is copied next to the weights by ``save_pretrained`` (``auto_map`` + remote code): it imports only torch,
transformers and, relatively, ``configuration_sesame_bert``.
"""

import math
from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutputWithPooling,
    MaskedLMOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from transformers.utils import ModelOutput

from .configuration_sesame_bert import SesameBertConfig

IGNORE_INDEX = -100  # label of positions that are not predicted (MLM) / not scored (tagging)


def sinusoidal_table(num_positions: int, dim: int) -> torch.Tensor:
    """Fixed position encodings of Vaswani et al. 2017 (sec. 3.5), float32 of shape (num_positions, dim).

    ``p[i, 2j] = sin(i / 10000^(2j/dim))`` and ``p[i, 2j+1] = cos(i / 10000^(2j/dim))``; ``dim`` must be even.
    """
    position = torch.arange(num_positions, dtype=torch.float64)[:, None]
    inv_freq = torch.pow(10000.0, -torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    table = torch.zeros(num_positions, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq)
    return table.float()


class SinusoidalPositionEmbedding(nn.Module):
    """Fixed sinusoidal position embedding: ``forward(position_ids (B|1, T) long) -> (B|1, T, dim)``.

    The table is a non-persistent buffer (not saved, not trained), recomputed at initialisation.
    """

    def __init__(self, num_positions: int, dim: int):
        super().__init__()
        self.register_buffer("table", sinusoidal_table(num_positions, dim), persistent=False)

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(position_ids, self.table)


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
NORMS = {"layernorm": nn.LayerNorm, "rmsnorm": nn.RMSNorm}
POSITION_EMBEDDINGS = {
    "learned": lambda c: nn.Embedding(c.max_position_embeddings, c.hidden_size),
    "absolute": lambda c: nn.Embedding(c.max_position_embeddings, c.hidden_size),  # old BertConfig name
    "sinusoidal": lambda c: SinusoidalPositionEmbedding(c.max_position_embeddings, c.hidden_size),
}


def _norm(config: SesameBertConfig) -> nn.Module:
    return NORMS[config.norm_type](config.hidden_size, eps=config.layer_norm_eps)


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
    """Word + position + segment embeddings, then norm and dropout: ``-> (B, T, H)``."""

    def __init__(self, config: SesameBertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = POSITION_EMBEDDINGS[config.position_embedding_type](config)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.norm = _norm(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids=None, token_type_ids=None, position_ids=None, inputs_embeds=None):
        embeddings = self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        batch, length = embeddings.shape[:2]
        if position_ids is None:
            position_ids = torch.arange(length, device=embeddings.device).unsqueeze(0)
        if token_type_ids is None:
            token_type_ids = torch.zeros(batch, length, dtype=torch.long, device=embeddings.device)
        embeddings = embeddings + self.token_type_embeddings(token_type_ids) + self.position_embeddings(position_ids)
        return self.dropout(self.norm(embeddings))


class SesameBertSelfAttention(nn.Module):
    """Multi-head self-attention with a fused QKV projection (Vaswani et al. 2017, eq. 1).

    ``forward(x (B, T, H), mask (B, 1, 1, T) additive float or None, output_attentions)``
    ``-> (out (B, T, H), probs (B, A, T, T) or None)``.
    """

    def __init__(self, config: SesameBertConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.out = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_p = config.attention_probs_dropout_prob

    def forward(self, x, mask=None, output_attentions=False):
        batch, length, hidden = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        p = self.dropout_p if self.training else 0.0
        probs = None
        # Explicit path for output_attentions, and for attention dropout on CPU, where SDPA falls back to a math
        # kernel that is ~1.4x slower than these few lines (GPUs keep SDPA: its kernels do dropout themselves).
        if output_attentions or (p > 0 and x.device.type == "cpu"):
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
            if mask is not None:
                scores = scores + mask
            weights = scores.softmax(-1)
            context = torch.matmul(F.dropout(weights, p, self.training), v)
            if output_attentions:
                probs = weights
        else:
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        return self.out(context.transpose(1, 2).reshape(batch, length, hidden)), probs


class SesameBertLayer(GradientCheckpointingLayer):
    """One Transformer layer; post-LN ``x = Norm(x + F(x))`` (BERT) or pre-LN ``x = x + F(Norm(x))``.

    ``forward(x (B, T, H), mask=..., output_attentions=...) -> (x (B, T, H), probs or None)``.
    """

    def __init__(self, config: SesameBertConfig):
        super().__init__()
        self.pre_norm = config.norm_position == "pre"
        self.attn = SesameBertSelfAttention(config)
        self.norm1 = _norm(config)
        self.ffn = nn.Sequential(
            OrderedDict(
                fc1=nn.Linear(config.hidden_size, config.intermediate_size),
                act=ACTIVATIONS[config.hidden_act](),
                fc2=nn.Linear(config.intermediate_size, config.hidden_size),
            )
        )
        self.norm2 = _norm(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, x, mask=None, output_attentions=False):
        if self.pre_norm:
            attn, probs = self.attn(self.norm1(x), mask, output_attentions)
            x = x + self.dropout(attn)
            return x + self.dropout(self.ffn(self.norm2(x))), probs
        attn, probs = self.attn(x, mask, output_attentions)
        x = self.norm1(x + self.dropout(attn))
        return self.norm2(x + self.dropout(self.ffn(x))), probs


class SesameBertEncoder(nn.Module):
    """The stack of layers (plus a final norm for pre-LN); returns (last (B, T, H), hidden_states, attentions)."""

    def __init__(self, config: SesameBertConfig):
        super().__init__()
        self.layer = nn.ModuleList([SesameBertLayer(config) for _ in range(config.num_hidden_layers)])
        self.final_norm = _norm(config) if config.norm_position == "pre" else nn.Identity()

    def forward(self, x, mask=None, output_attentions=False, output_hidden_states=False):
        hidden_states, attentions = ([x] if output_hidden_states else None), ([] if output_attentions else None)
        for layer in self.layer:
            x, probs = layer(x, mask=mask, output_attentions=output_attentions)
            if output_hidden_states:
                hidden_states.append(x)
            if output_attentions:
                attentions.append(probs)
        x = self.final_norm(x)
        if output_hidden_states:
            hidden_states[-1] = x  # the last entry is always last_hidden_state (after the pre-LN final norm)
        hidden_states = tuple(hidden_states) if output_hidden_states else None
        return x, hidden_states, (tuple(attentions) if output_attentions else None)


class SesameBertPooler(nn.Module):
    """Sequence summary for NSP and classification: ``tanh(W pool(h) + b)`` with ``pool`` from :data:`POOLINGS`.

    ``forward(h (B, T, H), keep (B, T) bool) -> (B, H)``. With ``classifier_pooling="cls"`` this is BERT's pooler.
    """

    def __init__(self, config: SesameBertConfig):
        super().__init__()
        self.pooling = config.classifier_pooling
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        if self.pooling == "attention":
            self.attention = nn.Linear(config.hidden_size, 1, bias=False)  # w of alpha = softmax(w^T h_i)

    def forward(self, h, keep):
        return torch.tanh(self.dense(POOLINGS[self.pooling](self, h, keep)))


class SesameBertMLMHead(nn.Module):
    """BERT's MLM head: ``decoder(Norm(act(dense(h))))``; the decoder weight is tied to the word embeddings.

    ``forward(h (..., H)) -> logits (..., V)``.
    """

    def __init__(self, config: SesameBertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = ACTIVATIONS[config.hidden_act]()
        self.norm = _norm(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)

    def forward(self, h):
        return self.decoder(self.norm(self.act(self.dense(h))))


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
    # Attention always runs through scaled_dot_product_attention (explicit softmax for output_attentions=True), so
    # attn_implementation="sdpa" / "eager" are accepted and do not change the computation.
    _supports_sdpa = True
    _no_split_modules = ["SesameBertEmbeddings", "SesameBertLayer"]

    @torch.no_grad()
    def _init_weights(self, module):
        """BERT init: linear / embedding weights ~ N(0, initializer_range), biases 0, norms weight 1 / bias 0,
        the padding row 0 (transformers' default), and the fixed sinusoidal table recomputed."""
        super()._init_weights(module)
        if isinstance(module, SinusoidalPositionEmbedding):
            init.copy_(module.table, sinusoidal_table(*module.table.shape))

    def save_pretrained(self, save_directory, *args, **kwargs):
        """As ``PreTrainedModel.save_pretrained``; when the class is registered for an Auto class (importing
        ``modeling`` does it), ``config.json`` gets the ``auto_map`` of every SesameBert class, so that each
        Auto class loads the directory with ``trust_remote_code=True`` without this package."""
        if self._auto_class is not None:
            self.config.auto_map = {**AUTO_MAP, **(getattr(self.config, "auto_map", None) or {})}
        return super().save_pretrained(save_directory, *args, **kwargs)

    def _finish(self, output, return_dict):
        """``output`` as is, or as a tuple when ``return_dict`` (default ``config.return_dict``) is False."""
        return output if (self.config.return_dict if return_dict is None else return_dict) else output.to_tuple()

    def _flags(self, output_attentions, output_hidden_states):
        """The two output flags, defaulting to the config's."""
        c = self.config
        return (
            c.output_attentions if output_attentions is None else output_attentions,
            c.output_hidden_states if output_hidden_states is None else output_hidden_states,
        )


class SesameBertModel(SesameBertPreTrainedModel):
    """The bare encoder. ``forward`` returns ``BaseModelOutputWithPooling``:

    ``last_hidden_state`` (B, T, H) float; ``pooler_output`` (B, H) (``None`` without pooling layer);
    ``hidden_states`` (L + 1 tensors (B, T, H): embeddings, then each layer; the last one is ``last_hidden_state``,
    i.e. after the final norm with pre-LN) and ``attentions``
    (L tensors (B, A, T, T)) when asked for.

    Inputs: ``input_ids`` (B, T) long, or ``inputs_embeds`` (B, T, H); ``attention_mask`` (B, T) 1 = token,
    0 = padding; ``token_type_ids`` (B, T) segment ids (default 0); ``position_ids`` (B|1, T) (default 0..T-1).

    Without ``attention_mask`` (or with one of all ones on the CPU) no mask reaches attention, so that
    ``scaled_dot_product_attention`` may take its fastest kernel (flash on a GPU). A mask on a GPU is used as
    given, all ones or not: testing it would read it back to the host, a synchronisation on every forward.
    Padding-free batches (packed pretraining blocks) should leave it out (:class:`pretrain.collators.MLMCollator`
    does).
    """

    def __init__(self, config: SesameBertConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = SesameBertEmbeddings(config)
        self.encoder = SesameBertEncoder(config)
        self.pooler = SesameBertPooler(config) if add_pooling_layer else None
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.embeddings.word_embeddings = value

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
    ):
        output_attentions, output_hidden_states = self._flags(output_attentions, output_hidden_states)
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids (B, T) or inputs_embeds (B, T, H)")
        x = self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds)
        mask = None
        if attention_mask is not None and (attention_mask.device.type != "cpu" or not bool(attention_mask.all())):
            # additive key mask (B, 1, 1, T): 0 for tokens, the dtype's minimum for padding
            mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        last, hidden_states, attentions = self.encoder(x, mask, output_attentions, output_hidden_states)
        pooled = None
        if self.pooler is not None:
            pooled = self.pooler(last, _keep_mask(attention_mask, last.shape[:2], last.device))
        out = BaseModelOutputWithPooling(
            last_hidden_state=last, pooler_output=pooled, hidden_states=hidden_states, attentions=attentions
        )
        return self._finish(out, return_dict)


def _extras(outputs) -> dict:
    """The encoder's optional ``hidden_states`` / ``attentions``, passed on by every head."""
    return dict(hidden_states=outputs.hidden_states, attentions=outputs.attentions)


def _mlm(head: SesameBertMLMHead, sparse: bool, sequence_output, labels):
    """Run the MLM head; return (logits, loss).

    loss = mean over the predicted positions (label != -100) of -log p(label) (nats), computed in float32;
    ``None`` without labels. With ``sparse`` (training with labels) the head runs only at the predicted positions
    and the logits are (N, V) for those positions in row-major (batch, position) order; otherwise (B, T, V). The
    two losses are equal. A batch without any predicted position (e.g. a packed ``[CLS] [SEP]`` block) gives a loss
    of 0 with zero gradients (sum over no token / max(N, 1)) -- transformers' BertForMaskedLM gives NaN (0 / 0),
    which the training loop's token weight 0 cannot cancel (NaN * 0 = NaN).
    """
    if labels is None:
        return head(sequence_output), None
    flat = labels.reshape(-1)
    if sparse:
        index = (flat != IGNORE_INDEX).nonzero().squeeze(1)
        logits = head(sequence_output.reshape(-1, sequence_output.size(-1)).index_select(0, index))
        nll = F.cross_entropy(logits.float(), flat.index_select(0, index), reduction="sum")
        return logits, nll / max(index.numel(), 1)
    logits = head(sequence_output)
    flat_logits = logits.reshape(-1, logits.size(-1)).float()
    nll = F.cross_entropy(flat_logits, flat, ignore_index=IGNORE_INDEX, reduction="sum")
    return logits, nll / (flat != IGNORE_INDEX).sum().clamp(min=1)


class SesameBertForMaskedLM(SesameBertPreTrainedModel):
    """Encoder + MLM head (Devlin et al. 2019, sec. 3.1, task 1), decoder tied to the input embeddings.

    ``forward(..., labels (B, T) long, -100 = not predicted) -> MaskedLMOutput``:
    ``loss`` = mean NLL (nats) over the predicted tokens (multiply by ``(labels != -100).sum()`` and sum across
    processes / batches for an exact corpus perplexity); ``logits`` = (B, T, V), or, in training mode with labels
    and ``config.sparse_prediction``, only the (N, V) rows of the predicted positions in row-major order
    (``logits[i]`` scores ``labels[labels != -100][i]``). ``labels=None`` (fill-mask) always gives (B, T, V).
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

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, inputs_embeds=None,
                labels=None, output_attentions=None, output_hidden_states=None, return_dict=None):
        outputs = self.bert(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                            output_attentions, output_hidden_states, return_dict=True)
        sparse = self.training and self.config.sparse_prediction
        logits, loss = _mlm(self.cls, sparse, outputs.last_hidden_state, labels)
        out = MaskedLMOutput(loss=loss, logits=logits, **_extras(outputs))
        return self._finish(out, return_dict)


class SesameBertForPreTraining(SesameBertPreTrainedModel):
    """Encoder + MLM head + NSP head (Devlin et al. 2019, sec. 3.1, tasks 1 and 2).

    ``forward(..., labels (B, T) MLM labels with -100 = not predicted, next_sentence_label (B,) 0 = IsNext,
    1 = NotNext) -> SesameBertForPreTrainingOutput`` (``loss`` = MLM loss + NSP loss for the labels given;
    ``prediction_logits`` is sparse as in :class:`SesameBertForMaskedLM`).

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

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, inputs_embeds=None,
                labels=None, next_sentence_label=None, output_attentions=None, output_hidden_states=None,
                return_dict=None):
        outputs = self.bert(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                            output_attentions, output_hidden_states, return_dict=True)
        sparse = self.training and self.config.sparse_prediction
        logits, mlm_loss = _mlm(self.cls, sparse, outputs.last_hidden_state, labels)
        nsp_logits = self.nsp(outputs.pooler_output)
        nsp_loss = None
        if next_sentence_label is not None:
            nsp_loss = F.cross_entropy(nsp_logits.float(), next_sentence_label.reshape(-1))
        losses = [x for x in (mlm_loss, nsp_loss) if x is not None]
        out = SesameBertForPreTrainingOutput(
            loss=sum(losses) if losses else None,
            prediction_logits=logits,
            seq_relationship_logits=nsp_logits,
            mlm_loss=mlm_loss,
            nsp_loss=nsp_loss,
            **_extras(outputs),
        )
        return self._finish(out, return_dict)


def _add_classifier(model, config):
    """Give ``model`` ``num_labels``, the classifier dropout and the linear ``classifier`` (H -> num_labels)."""
    model.num_labels = config.num_labels
    p = config.hidden_dropout_prob if config.classifier_dropout is None else config.classifier_dropout
    model.dropout = nn.Dropout(p)
    model.classifier = nn.Linear(config.hidden_size, config.num_labels)


class SesameBertForSequenceClassification(SesameBertPreTrainedModel):
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

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, inputs_embeds=None,
                labels=None, output_attentions=None, output_hidden_states=None, return_dict=None):
        outputs = self.bert(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                            output_attentions, output_hidden_states, return_dict=True)
        logits = self.classifier(self.dropout(outputs.pooler_output))
        loss = None
        if labels is not None:  # transformers' problem-type loss on float32 logits; labels float unless class ids
            ids = labels.dtype in (torch.long, torch.int) and self.config.problem_type != "multi_label_classification"
            loss = self.loss_function(labels=labels if ids else labels.float(), pooled_logits=logits.float(),
                                      config=self.config)
        out = SequenceClassifierOutput(loss=loss, logits=logits, **_extras(outputs))
        return self._finish(out, return_dict)


class SesameBertForQuestionAnswering(SesameBertPreTrainedModel):
    """Encoder + linear span head (SQuAD; Devlin et al. 2019, sec. 4.2).

    ``forward(..., start_positions (B,), end_positions (B,)) -> QuestionAnsweringModelOutput`` with
    ``start_logits`` / ``end_logits`` (B, T); loss = (CE(start) + CE(end)) / 2, positions outside [0, T) ignored.
    """

    def __init__(self, config: SesameBertConfig):
        super().__init__(config)
        self.bert = SesameBertModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, inputs_embeds=None,
                start_positions=None, end_positions=None, output_attentions=None, output_hidden_states=None,
                return_dict=None):
        outputs = self.bert(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                            output_attentions, output_hidden_states, return_dict=True)
        start_logits, end_logits = self.qa_outputs(outputs.last_hidden_state).unbind(-1)
        loss = None
        if start_positions is not None and end_positions is not None:
            length = start_logits.size(1)  # positions outside the sequence are ignored, as transformers does
            start = start_positions.reshape(-1).clamp(0, length)
            end = end_positions.reshape(-1).clamp(0, length)
            loss = (
                F.cross_entropy(start_logits.float(), start, ignore_index=length)
                + F.cross_entropy(end_logits.float(), end, ignore_index=length)
            ) / 2
        out = QuestionAnsweringModelOutput(
            loss=loss, start_logits=start_logits.contiguous(), end_logits=end_logits.contiguous(), **_extras(outputs)
        )
        return self._finish(out, return_dict)


class SesameBertForTokenClassification(SesameBertPreTrainedModel):
    """Encoder + dropout + linear tagger (NER / POS).

    ``forward(..., labels (B, T) long, -100 = ignored) -> TokenClassifierOutput`` with ``logits``
    (B, T, num_labels); loss = mean cross-entropy over the scored tokens.
    """

    def __init__(self, config: SesameBertConfig):
        super().__init__(config)
        self.bert = SesameBertModel(config, add_pooling_layer=False)
        _add_classifier(self, config)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, inputs_embeds=None,
                labels=None, output_attentions=None, output_hidden_states=None, return_dict=None):
        outputs = self.bert(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                            output_attentions, output_hidden_states, return_dict=True)
        logits = self.classifier(self.dropout(outputs.last_hidden_state))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.float().view(-1, self.num_labels), labels.view(-1), ignore_index=IGNORE_INDEX)
        out = TokenClassifierOutput(loss=loss, logits=logits, **_extras(outputs))
        return self._finish(out, return_dict)


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
