"""Replaced-token detection (RTD) with SesameBert: ELECTRA's generator + discriminator pretraining.

ELECTRA (Clark et al. 2020, "ELECTRA: Pre-training Text Encoders as Discriminators Rather Than Generators"): a small
MLM *generator* fills the masked positions of a sequence with tokens sampled from its output distribution, and a
*discriminator* predicts for every token of the resulting sequence whether it is the original token or a
replacement. The loss (ELECTRA, sec. 2, the equation after eq. (2)) is

    L = L_MLM(generator) + lambda * L_Disc(discriminator),

L_MLM the generator's mean cross-entropy over the masked positions, L_Disc the discriminator's mean binary
cross-entropy over *all* real (non-padding) tokens -- special tokens included, as ELECTRA's code -- with lambda =
``config.discriminator_weight`` (50). Sampling is not differentiable: the discriminator's loss sends no gradient to
the generator, except through the embeddings they share (``config.embedding_sharing``; none with DeBERTa-v3's
gradient-disentangled sharing, He et al. 2021).

Classes: :class:`SesameBertDiscriminator` (transformers' ``ElectraForPreTraining``: what a pretraining run saves at
the top of its output folder) and :class:`SesameBertForReplacedTokenDetection` (the pretraining model: a
:class:`SesameBertForMaskedLM` generator, saved in ``generator/``, and the discriminator).

This file is copied next to the weights by ``save_pretrained`` (remote code): it imports only torch, transformers
and, relatively, the other SesameBert files.
"""

import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers.dynamic_module_utils import custom_object_save
from transformers.utils import ModelOutput
from transformers.utils.generic import can_return_tuple

from .configuration_sesame_bert import SesameBertConfig, SesameBertRTDConfig
from .modeling_sesame_bert import (
    AUTO_MAP,
    IGNORE_INDEX,
    PACKED_SEQUENCE_KEYS,
    SesameBertEmbeddings,
    SesameBertForMaskedLM,
    SesameBertHeadModel,
    SesameBertModel,
    SesameBertPreTrainedModel,
    _extras,
    _head_act,
    _norm,
)

#: The generator's folder inside a saved RTD model.
GENERATOR_FOLDER = "generator"


def sample_tokens(logits: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One token per row, drawn from ``softmax(logits)`` by inverse-CDF sampling: the first index whose cumulative
    probability exceeds the row's uniform number (a token of probability 0 is never drawn).

    Args:
        logits: (N, V) float, any dtype (the softmax is computed in float32).
        uniforms: (N,) float in [0, 1).

    Returns:
        (N,) long token ids. Not differentiable (call under ``torch.no_grad`` or on detached logits).
    """
    cdf = logits.float().softmax(-1).cumsum(-1)
    index = torch.searchsorted(cdf, uniforms.to(cdf.dtype).unsqueeze(-1), right=True).squeeze(-1)
    return index.clamp_max(logits.size(-1) - 1)  # a uniform above a rounded-down total of 1 takes the last token


def replaced_token_loss(
    logits: torch.Tensor, labels: torch.Tensor, attention_mask: torch.Tensor | None
) -> torch.Tensor:
    """ELECTRA's discriminator loss: the mean binary cross-entropy (nats, float32) over the real tokens.

    Args:
        logits: (B, T) float, > 0 = "replaced".
        labels: (B, T), 1 = replaced, 0 = original (any numeric dtype).
        attention_mask: (B, T) 1 = real token, 0 = padding; ``None``: every token is real.

    Returns:
        0-d float32: sum over real tokens of ``BCEWithLogits`` / their number (0 when there is none).
    """
    bce = F.binary_cross_entropy_with_logits(logits.float(), labels.float(), reduction="none")
    if attention_mask is None:
        return bce.mean()
    keep = attention_mask.to(bce.dtype)
    return (bce * keep).sum() / keep.sum().clamp(min=1.0)


class SesameBertDiscriminatorHead(nn.Module):
    """ELECTRA's discriminator head (``ElectraDiscriminatorPredictions``): ``dense_prediction(act(dense(h)))``, ``act``
    the config's ``hidden_act`` (for a gated feed-forward layer, ``geglu`` / ``swiglu``, its gate's: GELU / SiLU).

    ``forward(h (B, T, H)) -> logits (B, T)``: the score that each token was replaced (> 0: replaced).
    """

    def __init__(self, config: SesameBertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = _head_act(config, "hidden_act")
        self.dense_prediction = nn.Linear(config.hidden_size, 1)

    def forward(self, h):
        return self.dense_prediction(self.act(self.dense(h))).squeeze(-1)


@dataclass
class SesameBertDiscriminatorOutput(ModelOutput):
    """Output of :class:`SesameBertDiscriminator` (as transformers' ``ElectraForPreTrainingOutput``).

    Args:
        loss: 0-d float32, mean binary cross-entropy over the real tokens (:func:`replaced_token_loss`), with labels.
        logits: (B, T), > 0 = predicted replaced.
        hidden_states, attentions: as in transformers.
    """

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


class SesameBertDiscriminator(SesameBertHeadModel):
    """Encoder + per-token binary head: ELECTRA's discriminator (transformers' ``ElectraForPreTraining``).

    ``forward(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, labels (B, T) 1 = replaced,
    0 = original) -> SesameBertDiscriminatorOutput`` (``logits`` (B, T); ``loss`` with labels).

    Saved as a SesameBert folder (:meth:`save_pretrained`): the encoder under ``bert.`` (``AutoModel``, every SesameBert
    head and ``finetune.glue`` load it), the head under ``discriminator_predictions.`` (no Auto class maps to it).
    """

    def __init__(self, config: SesameBertConfig):
        super().__init__(config)
        self.bert = SesameBertModel(config, add_pooling_layer=False)
        self.discriminator_predictions = SesameBertDiscriminatorHead(config)
        self.post_init()

    def _head(self, outputs, labels, attention_mask):
        logits = self.discriminator_predictions(outputs.last_hidden_state)
        loss = None if labels is None else replaced_token_loss(logits, labels, attention_mask)
        return SesameBertDiscriminatorOutput(loss=loss, logits=logits, **_extras(outputs))

    def save_pretrained(self, save_directory, *args, **kwargs):
        """As ``PreTrainedModel.save_pretrained``, plus the SesameBert ``auto_map`` and code files (this class is no
        Auto class's, so transformers would copy neither)."""
        self.config.auto_map = dict(AUTO_MAP)
        out = super().save_pretrained(save_directory, *args, **kwargs)
        if kwargs.get("is_main_process", True):
            custom_object_save(self.bert, save_directory)  # modeling_sesame_bert.py, configuration_sesame_bert.py
        return out


class DisentangledEmbeddings(nn.Module):
    """The discriminator's embeddings under gradient-disentangled embedding sharing (GDES; DeBERTa-v3, He et al.
    2021, sec. 3.2): every table is ``E_D = stop_gradient(E_G) + E_delta``.

    ``E_G`` are the tables of the generator's :class:`SesameBertEmbeddings` (``shared``; word, learned positions,
    segments), ``E_delta`` this module's ``*_delta`` parameters (same shapes, initialised to zero: the
    discriminator starts from the generator's embeddings). The generator's MLM loss alone trains ``E_G``; the
    discriminator's loss trains ``E_delta`` and this module's own norm. Fixed sinusoidal positions are used as they
    are. ``forward`` has :class:`SesameBertEmbeddings`' signature: ``-> (B, T, E)``.

    ``shared`` is not registered as a submodule here (the generator owns it; a tuple hides it from ``nn.Module``), so
    its parameters appear once in the model.
    """

    def __init__(self, config: SesameBertConfig, shared: SesameBertEmbeddings):
        super().__init__()
        self._shared = (shared,)
        self.word_embeddings_delta = nn.Parameter(torch.zeros_like(shared.word_embeddings.weight))
        self.position_embeddings_delta = None
        if isinstance(shared.position_embeddings, nn.Embedding):
            self.position_embeddings_delta = nn.Parameter(torch.zeros_like(shared.position_embeddings.weight))
        self.token_type_embeddings_delta = nn.Parameter(torch.zeros_like(shared.token_type_embeddings.weight))
        self.norm = _norm(config, shared.word_embeddings.embedding_dim)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def tables(self) -> dict[str, torch.Tensor]:
        """``{name: E_G + E_delta}`` of the tables, by :class:`SesameBertEmbeddings` parameter name (detached):
        the discriminator's embeddings as a plain SesameBert checkpoint holds them."""
        shared = self._shared[0]
        out = {
            "word_embeddings.weight": shared.word_embeddings.weight + self.word_embeddings_delta,
            "token_type_embeddings.weight": shared.token_type_embeddings.weight + self.token_type_embeddings_delta,
        }
        if self.position_embeddings_delta is not None:
            out["position_embeddings.weight"] = shared.position_embeddings.weight + self.position_embeddings_delta
        return {k: v.detach() for k, v in out.items()}

    def forward(self, input_ids=None, token_type_ids=None, position_ids=None, inputs_embeds=None):
        shared = self._shared[0]
        if inputs_embeds is None:
            word = shared.word_embeddings
            inputs_embeds = F.embedding(input_ids, word.weight.detach() + self.word_embeddings_delta, word.padding_idx)
        batch, length = inputs_embeds.shape[:2]
        if position_ids is None:
            position_ids = torch.arange(length, device=inputs_embeds.device).unsqueeze(0)
        if token_type_ids is None:
            token_type_ids = torch.zeros(batch, length, dtype=torch.long, device=inputs_embeds.device)
        if self.position_embeddings_delta is None:
            positions = shared.position_embeddings(position_ids)  # fixed sinusoidal table
        else:
            positions = F.embedding(
                position_ids, shared.position_embeddings.weight.detach() + self.position_embeddings_delta
            )
        segments = F.embedding(
            token_type_ids, shared.token_type_embeddings.weight.detach() + self.token_type_embeddings_delta
        )
        return self.dropout(self.norm(inputs_embeds + segments + positions))


@dataclass
class SesameBertForReplacedTokenDetectionOutput(ModelOutput):
    """Output of :class:`SesameBertForReplacedTokenDetection`.

    Args:
        loss: 0-d float32, ``generator_loss + discriminator_weight * discriminator_loss`` (ELECTRA's combined loss).
        losses: (2,) float32, the two terms of ``loss``: ``[generator_loss, discriminator_weight *
            discriminator_loss]``, each a mean over its own items (masked tokens; real tokens). The training loop
            normalises each term by its own item count across micro-batches and processes.
        generator_loss: 0-d float32, mean cross-entropy (nats) over the masked positions (labels != -100).
        discriminator_loss: 0-d float32, mean binary cross-entropy over the real tokens.
        logits: (B, T) discriminator scores, > 0 = predicted replaced.
        replaced_labels: (B, T) long, 1 where the discriminator's input differs from the original token (a sampled
            token equal to the original counts as original, as in ELECTRA), else 0.
        corrupted_input_ids: (B, T) long, the discriminator's input: the original tokens with the generator's
            samples at the masked positions.
        generator_logits: the generator's MLM logits: (N, V) at the masked positions in row-major order in training
            with sparse prediction, else (B, T, V).
        hidden_states, attentions: the discriminator's, as in transformers.
    """

    loss: torch.Tensor | None = None
    losses: torch.Tensor | None = None
    generator_loss: torch.Tensor | None = None
    discriminator_loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    replaced_labels: torch.Tensor | None = None
    corrupted_input_ids: torch.Tensor | None = None
    generator_logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


class SesameBertForReplacedTokenDetection(SesameBertPreTrainedModel):
    """ELECTRA pretraining (see the module docstring): ``generator`` (:class:`SesameBertForMaskedLM`) and
    ``discriminator`` (:class:`SesameBertDiscriminator`), configured by a :class:`SesameBertRTDConfig`.

    ``forward(input_ids (B, T) long with the masked positions corrupted by the MLM collator, attention_mask,
    token_type_ids, position_ids, labels (B, T) long: the original token at the masked positions, -100 elsewhere,
    sampling_uniforms (B, T) float in [0, 1) or None) -> SesameBertForReplacedTokenDetectionOutput``:

    1. the generator predicts the masked positions (its MLM loss);
    2. at *every* masked position (ELECTRA, sec. 2) a token is drawn from the generator's softmax (no gradient
       flows through the sampling; :func:`sample_tokens` with that position's ``sampling_uniforms`` entry, or with
       ``torch.rand`` from the global RNG when ``None``: a collator's per-example numbers make the sample
       independent of the process split); the discriminator's input is the original sequence with these samples
       at the masked positions -- however the collator corrupted the generator's input ([MASK], random or kept);
    3. the labels are computed against the original tokens: a position is "replaced" only where the sample differs
       from the original token;
    4. the discriminator scores every token; its loss covers every real token (``attention_mask`` 1).

    Raises:
        ValueError: no ``labels`` (RTD needs the masked positions).

    Saved as the discriminator's folder with the generator in ``generator/`` (:meth:`save_pretrained`,
    :meth:`from_pretrained`).
    """

    config_class = SesameBertRTDConfig
    base_model_prefix = "discriminator"
    _no_split_modules = ["SesameBertEmbeddings", "SesameBertLayer", "DisentangledEmbeddings"]

    def __init__(self, config: SesameBertRTDConfig):
        super().__init__(config)
        self.generator = SesameBertForMaskedLM(config.generator_config())  # registered first: it owns shared tables
        self.discriminator = SesameBertDiscriminator(config.discriminator_config())
        if config.embedding_sharing == "tied":
            self.discriminator.bert.embeddings = self.generator.bert.embeddings
        elif config.embedding_sharing == "gdes":
            self.discriminator.bert.embeddings = DisentangledEmbeddings(
                self.discriminator.config, self.generator.bert.embeddings
            )
        self.post_init()

    @torch.no_grad()
    def _init_weights(self, module):
        """SesameBert's init; the GDES deltas start at zero (E_D = E_G at the start) and the norm as a norm."""
        if isinstance(module, DisentangledEmbeddings):
            for delta in module.parameters(recurse=False):  # the *_delta tables (the norm is a submodule)
                delta.zero_()
            return
        super()._init_weights(module)

    def get_input_embeddings(self):
        return self.generator.get_input_embeddings()

    @can_return_tuple
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        labels=None,
        sampling_uniforms=None,
        **kwargs,
    ):
        if labels is None or input_ids is None:
            raise ValueError(
                "replaced-token detection needs input_ids and MLM labels (B, T): the original token at "
                "the masked positions, -100 elsewhere"
            )
        packed = {key: kwargs[key] for key in PACKED_SEQUENCE_KEYS if key in kwargs}  # the collator's sequences
        generated = self.generator(
            input_ids, attention_mask, token_type_ids, position_ids, labels=labels, return_dict=True, **packed
        )
        masked = labels != IGNORE_INDEX
        gen_logits = generated.logits if generated.logits.dim() == 2 else generated.logits[masked]  # (N, V)
        with torch.no_grad():
            uniforms = (
                torch.rand(gen_logits.shape[:1], device=gen_logits.device)
                if sampling_uniforms is None
                else sampling_uniforms[masked]
            )
            sampled = sample_tokens(gen_logits.detach(), uniforms)
            original = torch.where(masked, labels, input_ids)
            corrupted = original.masked_scatter(masked, sampled.to(original.dtype))
            replaced = (corrupted != original).long()
        scored = self.discriminator(
            corrupted, attention_mask, token_type_ids, position_ids, labels=replaced, return_dict=True, **kwargs
        )
        losses = torch.stack([generated.loss.float(), self.config.discriminator_weight * scored.loss.float()])
        return SesameBertForReplacedTokenDetectionOutput(
            loss=losses.sum(),
            losses=losses,
            generator_loss=generated.loss,
            discriminator_loss=scored.loss,
            logits=scored.logits,
            replaced_labels=replaced,
            corrupted_input_ids=corrupted,
            generator_logits=generated.logits,
            hidden_states=scored.hidden_states,
            attentions=scored.attentions,
        )

    # -- the saved layout: the discriminator, and the generator in generator/ --------------------------------------
    def split_state_dict(self, state_dict: dict | None = None) -> tuple[dict, dict]:
        """``(discriminator, generator)`` state dicts, each as its own model saves it, from this model's state dict
        (default ``self.state_dict()``; e.g. ``accelerator.get_state_dict`` under FSDP). Shared tables appear in
        both; with GDES the discriminator's are ``E_G + E_delta``, its ``*_delta`` keys dropped."""
        state_dict = self.state_dict() if state_dict is None else state_dict
        gen = {k[len("generator.") :]: v for k, v in state_dict.items() if k.startswith("generator.")}
        disc = {k[len("discriminator.") :]: v for k, v in state_dict.items() if k.startswith("discriminator.")}
        sharing = self.config.embedding_sharing
        if sharing != "none":
            embeddings = "bert.embeddings."
            for key, value in gen.items():  # the shared tables (and, tied, the shared norm), as saved by the generator
                if key.startswith(embeddings) and (sharing == "tied" or not key.startswith(embeddings + "norm.")):
                    disc[key] = value
            if sharing == "gdes":
                for name in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
                    delta = disc.pop(f"{embeddings}{name}_delta", None)
                    if delta is not None:
                        disc[f"{embeddings}{name}.weight"] = disc[f"{embeddings}{name}.weight"] + delta
        return disc, gen

    def save_pretrained(self, save_directory, *args, state_dict: dict | None = None, **kwargs):
        """Write the discriminator (:class:`SesameBertDiscriminator`) into ``save_directory`` and the generator
        (``AutoModelForMaskedLM``) into ``save_directory/generator``, shared tables in both (:meth:`split_state_dict`);
        ``state_dict``: this model's full state dict (default: its own)."""
        disc_state, gen_state = self.split_state_dict(state_dict)
        save_directory = Path(save_directory)
        discriminator = (
            SesameBertDiscriminator(self.discriminator.config)
            if self.config.embedding_sharing == "gdes"
            else self.discriminator
        )  # GDES: a plain one, whose parameter names the merged tables take
        discriminator.save_pretrained(save_directory, *args, state_dict=disc_state, **kwargs)
        self.generator.save_pretrained(save_directory / GENERATOR_FOLDER, *args, state_dict=gen_state, **kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, config=None, **kwargs):
        """Load a saved RTD model: the layout :meth:`save_pretrained` writes (a local folder with ``generator/``;
        ``config``, a :class:`SesameBertRTDConfig`, gives the RTD fields, else the ones the saved discriminator's
        config records, else ELECTRA's defaults with the generator size from the two widths), or a folder of
        a :class:`SesameBertRTDConfig` model (``PreTrainedModel.from_pretrained``).

        Raises:
            ValueError: the saved generator or discriminator does not fit the config.
        """
        folder = Path(os.fspath(pretrained_model_name_or_path))
        if not (folder / GENERATOR_FOLDER / "config.json").is_file():
            return super().from_pretrained(pretrained_model_name_or_path, *args, config=config, **kwargs)
        kwargs.pop("_from_auto", None)
        kwargs.pop("trust_remote_code", None)
        discriminator = SesameBertDiscriminator.from_pretrained(folder, *args, **kwargs)
        generator = SesameBertForMaskedLM.from_pretrained(folder / GENERATOR_FOLDER, *args, **kwargs)
        fields = (
            {}
            if config is None
            else {k: getattr(config, k) for k in ("generator_size", "discriminator_weight", "embedding_sharing")}
        )
        if not hasattr(discriminator.config, "generator_size"):  # saved before the RTD fields were recorded
            fields.setdefault("generator_size", generator.config.hidden_size / discriminator.config.hidden_size)
        model = cls(SesameBertRTDConfig.from_discriminator(discriminator.config, **fields))
        with torch.no_grad():
            model.generator.load_state_dict(generator.state_dict())
            disc_state = discriminator.state_dict()
            if model.config.embedding_sharing != "none":  # shared tables: the generator's; GDES: the rest is E_delta
                embeddings = model.discriminator.bert.embeddings
                tables = embeddings.tables() if model.config.embedding_sharing == "gdes" else {}
                for name, merged in tables.items():
                    saved = disc_state.pop(f"bert.embeddings.{name}")
                    getattr(embeddings, name.replace(".weight", "_delta")).copy_(saved - merged)
                if model.config.embedding_sharing == "tied":
                    disc_state = {k: v for k, v in disc_state.items() if not k.startswith("bert.embeddings.")}
            missing, unexpected = model.discriminator.load_state_dict(disc_state, strict=False)
            if unexpected or [k for k in missing if not k.startswith("bert.embeddings.")]:
                raise ValueError(
                    f"{folder}: the saved discriminator does not fit (missing {missing}, unexpected {unexpected})"
                )
        return model


__all__ = [
    "DisentangledEmbeddings",
    "SesameBertDiscriminator",
    "SesameBertDiscriminatorHead",
    "SesameBertDiscriminatorOutput",
    "SesameBertForReplacedTokenDetection",
    "SesameBertForReplacedTokenDetectionOutput",
    "replaced_token_loss",
    "sample_tokens",
]
