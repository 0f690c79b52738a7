"""The ELMo-style BiLM (SesameElmo): char-CNN + separate forward/backward LSTM stacks, ScalarMix, heads.

Importing this package registers ``SesameElmoConfig`` (model_type ``"sesame-elmo"``), its models (``AUTO_CLASSES``;
AutoModelForPreTraining -> :class:`SesameElmoForBidirectionalLM`) and :class:`SesameElmoTokenizer` with the Auto
classes, marked for ``auto_map`` (remote code, :func:`modeling._auto.register_family`).

Presets (``PRESETS``, for ``pretrain --config_name``):

* ``elmo-small`` -- CPU-sized: 16-dim character embeddings, CNN filters
  [[1,32],[2,32],[3,64],[4,128]] (256), 2 highway layers, projection 128, 2 LSTM layers of 512 cells
  projected to 128, adaptive softmax (Grave et al. 2017; cut-offs V/20, V/4) for training -- on the ELMo
  recipe benchmark (10 CPU minutes) it took 2.5x the steps of the full softmax and reached held-out perplexity 289
  against 403 (``bench/bench_elmo_recipe.py``; evaluation is always the exact full-softmax perplexity);
  2,688,992 parameters without the softmax (2,680,800 without the redundant ``bias_hh``).
* ``elmo-original`` -- Peters et al. (2018): CNN [[1,32],[2,32],[3,64],[4,128],[5,256],[6,512],[7,1024]]
  (2048), 2 highway layers, projection 512, 2 layers of LSTM 4096 projected to 512, sampled softmax with
  8192 negatives. 93,600,864 parameters without the softmax counted as bilm-tf does (one LSTM bias vector);
  ``nn.LSTM`` keeps a second, redundant bias per layer and direction (+65,536), so PyTorch reports
  93,666,400. Clipping (bilm-tf: 3 / 3) is off for speed; set ``cell_clip=3.0, proj_clip=3.0`` to match it.

``vocab_size`` must be set to the tokenizer's size (``len(tokenizer)``) when the model is built.
"""

import torch
from transformers import (
    AutoModel,
    AutoModelForPreTraining,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    PretrainedConfig,
)

from .._auto import register_family
from ..spec import ModelSpec
from .configuration_elmo import ELMO_CNN_FILTERS, SesameElmoConfig
from .modeling_elmo import (
    ScalarMix,
    SesameElmoForBidirectionalLM,
    SesameElmoForQuestionAnswering,
    SesameElmoForSequenceClassification,
    SesameElmoForTokenClassification,
    SesameElmoModel,
    SesameElmoPreTrainedModel,
)
from .tokenization_elmo import MAX_CHARS_PER_TOKEN, SesameElmoTokenizer

#: The config defaults are bilm-tf's sizes (the module docstring gives both presets in full).
PRESETS: dict[str, tuple[type[PretrainedConfig], dict]] = {
    "elmo-small": (
        SesameElmoConfig,
        dict(cnn_filters=[[1, 32], [2, 32], [3, 64], [4, 128]], projection_dim=128, cell_size=512, softmax="adaptive"),
    ),
    "elmo-original": (SesameElmoConfig, dict(softmax="sampled")),
}

#: Auto class -> SesameElmo class (registered in-process and marked for ``auto_map``).
AUTO_CLASSES = {
    AutoModel: SesameElmoModel,
    AutoModelForPreTraining: SesameElmoForBidirectionalLM,
    AutoModelForSequenceClassification: SesameElmoForSequenceClassification,
    AutoModelForQuestionAnswering: SesameElmoForQuestionAnswering,
    AutoModelForTokenClassification: SesameElmoForTokenClassification,
}

register_family(SesameElmoConfig, AUTO_CLASSES, SesameElmoTokenizer)


def _elmo_sample(config, batch: int, length: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Rows as the ELMo-style tokenizer writes them (``modeling/elmo/tokenization_elmo.py``): random words of 1-8 bytes
    as ELMo character ids (begin of word 259, byte + 1, end of word 260, padding characters 261), ``<S>`` / ``</S>``
    around each sentence; every row but the first a pair ``<S> a </S> <S> b </S>`` (token types 0 / 1), the first a
    single sentence; the last row padded (masked tokens: all 0)."""
    width = getattr(config, "max_characters_per_token", MAX_CHARS_PER_TOKEN)  # a baseline's: the word tokenizer's
    char_ids = torch.full((batch, length, width), 261, dtype=torch.long)
    char_ids[:, :, 0] = 259
    n_bytes = torch.randint(1, 9, (batch, length), generator=generator)
    chars = torch.randint(98, 123, (batch, length, width), generator=generator)  # bytes of a-z, + 1
    at = torch.arange(width)
    char_ids = torch.where((at >= 1) & (at <= n_bytes.unsqueeze(-1)), chars, char_ids)
    char_ids = torch.where(at == n_bytes.unsqueeze(-1) + 1, torch.tensor(260), char_ids)
    attention_mask = torch.ones(batch, length, dtype=torch.long)
    attention_mask[-1, length // 2 + 1 :] = 0  # the last row is padded
    token_type_ids = torch.zeros_like(attention_mask)
    for row in range(batch):
        n = int(attention_mask[row].sum())
        bounds = [(0, n)] if row == 0 else [(0, n // 2), (n // 2, n)]
        for segment, (start, end) in enumerate(bounds):
            token_type_ids[row, start:end] = segment
            for position, marker in ((start, 257), (end - 1, 258)):  # <S> and </S>: [bow, marker, eow, pad ...]
                char_ids[row, position, 1:] = 261
                char_ids[row, position, 1:3] = torch.tensor([marker, 260])
    char_ids = char_ids * attention_mask.unsqueeze(-1)
    return dict(char_ids=char_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)


SPEC = ModelSpec(
    name="elmo",
    model_type=SesameElmoConfig.model_type,
    description="ELMo-style character-CNN + BiLSTM bidirectional language model",
    presets=PRESETS,
    main_input="char_ids",
    export_inputs=("char_ids", "attention_mask", "token_type_ids"),
    export_sample=_elmo_sample,
    tokenizer_trainer="tokenizer.elmo_training:train_elmo_tokenizer",
    # the frozen BiLM's rate (ScalarMix + head trained): the ELMo recipe benchmark's fine-tunes
    finetune_recipe=dict(learning_rate=3e-3, weight_decay=0.0),
    frozen_backbone=True,
)

__all__ = [
    "SesameElmoConfig",
    "SesameElmoModel",
    "SesameElmoPreTrainedModel",
    "SesameElmoForBidirectionalLM",
    "SesameElmoForSequenceClassification",
    "SesameElmoForQuestionAnswering",
    "SesameElmoForTokenClassification",
    "ScalarMix",
    "SesameElmoTokenizer",
]
