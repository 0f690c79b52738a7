"""The BERT-like encoder (SesameBert): config, models, heads, presets, Auto registration.

Importing this package registers every class with the transformers Auto classes (``AUTO_CLASSES``) in-process and
marks them for ``auto_map`` (:func:`modeling._auto.register_family`): a saved directory carries the model code and
loads with ``trust_remote_code=True`` in a process without this package.

Replaced-token detection (ELECTRA, ``modeling_sesame_bert_rtd``): ``AutoModelForPreTraining`` of a
``SesameBertRTDConfig`` (``model_type`` ``"sesame-bert-rtd"``) is ``SesameBertForReplacedTokenDetection``, the
generator + discriminator pretraining model; it saves a SesameBert discriminator folder with the generator in
``generator/``.

``python -m modeling.bert.convert --source DIR|REPO --output_dir D`` converts a Hugging Face BERT checkpoint.
"""

import torch
from transformers import (
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForPreTraining,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    PretrainedConfig,
)

from .._auto import register_family
from ..spec import ModelSpec
from . import modeling_sesame_bert, modeling_sesame_bert_rtd
from .configuration_sesame_bert import SesameBertConfig, SesameBertRTDConfig
from .modeling_sesame_bert import (
    SesameBertForMaskedLM,
    SesameBertForPreTraining,
    SesameBertForPreTrainingOutput,
    SesameBertForQuestionAnswering,
    SesameBertForSequenceClassification,
    SesameBertForTokenClassification,
    SesameBertModel,
    SesameBertPreTrainedModel,
)
from .modeling_sesame_bert_rtd import *  # noqa: F401,F403  (the replaced-token detection classes)
from .modeling_sesame_bert_rtd import SesameBertForReplacedTokenDetection

#: Auto class -> SesameBert class (registered in-process and marked for ``auto_map``).
AUTO_CLASSES = {
    AutoModel: SesameBertModel,
    AutoModelForMaskedLM: SesameBertForMaskedLM,
    AutoModelForPreTraining: SesameBertForPreTraining,
    AutoModelForSequenceClassification: SesameBertForSequenceClassification,
    AutoModelForQuestionAnswering: SesameBertForQuestionAnswering,
    AutoModelForTokenClassification: SesameBertForTokenClassification,
}

#: Auto class -> the replaced-token detection (ELECTRA) pretraining model, for its own config type.
RTD_AUTO_CLASSES = {AutoModelForPreTraining: SesameBertForReplacedTokenDetection}

register_family(SesameBertConfig, AUTO_CLASSES)
register_family(SesameBertRTDConfig, RTD_AUTO_CLASSES)


def _sizes(layers: int, hidden: int, heads: int) -> dict:
    return dict(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads, intermediate_size=4 * hidden)


#: The compact BERT sizes of Turc et al. 2019 ("Well-Read Students Learn Better"), intermediate size 4H,
#: vocab_size 30522 (pretrain overrides it with the tokenizer's).
PRESETS: dict[str, tuple[type[PretrainedConfig], dict]] = {
    "bert-tiny": (SesameBertConfig, _sizes(2, 128, 2)),
    "bert-mini": (SesameBertConfig, _sizes(4, 256, 4)),
    "bert-small": (SesameBertConfig, _sizes(4, 512, 8)),
    "bert-base": (SesameBertConfig, _sizes(12, 768, 12)),
}


def _bert_sample(config, batch: int, length: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    input_ids = torch.randint(min(5, config.vocab_size - 1), config.vocab_size, (batch, length), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[-1, length // 2 :] = 0  # the last row is padded
    input_ids = input_ids.masked_fill(attention_mask == 0, config.pad_token_id or 0)
    token_type_ids = torch.zeros_like(input_ids)
    if config.type_vocab_size > 1:
        token_type_ids[:, length // 2 :] = 1
    token_type_ids = token_type_ids * attention_mask
    return dict(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)


SPEC = ModelSpec(
    name="bert",
    model_type=SesameBertConfig.model_type,
    description="BERT-like Transformer encoder",
    presets=PRESETS,
    main_input="input_ids",
    export_inputs=("input_ids", "attention_mask", "token_type_ids"),
    export_sample=_bert_sample,
    train_tokenizer="tokenizer.wordpiece:train_wordpiece_tokenizer",
    finetune_recipe=dict(learning_rate=1e-4, weight_decay=0.01),
)

__all__ = ["SesameBertConfig", "SesameBertRTDConfig", *modeling_sesame_bert.__all__, *modeling_sesame_bert_rtd.__all__]
