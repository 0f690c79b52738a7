"""The BERT-like encoder (SesameBert): config, models, heads, presets, Auto registration.

Importing this package registers every class with the transformers Auto classes (``AUTO_CLASSES``) in-process and
marks them for ``auto_map`` (:func:`modeling._auto.register_family`): a saved directory carries the model code and
loads with ``trust_remote_code=True`` in a process without this package.

Replaced-token detection (ELECTRA, ``modeling_sesame_bert_rtd``): ``AutoModelForPreTraining`` of a
``SesameBertRTDConfig`` (``model_type`` ``"sesame-bert-rtd"``) is ``SesameBertForReplacedTokenDetection``, the
generator + discriminator pretraining model; it saves a SesameBert discriminator folder with the generator in
``generator/``.

``python -m modeling.bert.convert --source DIR|REPO --output_dir D`` converts a Hugging Face BERT, ModernBERT or
EuroBERT checkpoint (one module a source in ``sources/``).
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
from .configuration_sesame_bert import LAYOUTS, SesameBertConfig, SesameBertRTDConfig
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


def _preset(layout: str, layers: int, hidden: int, heads: int, intermediate: int, **sizes) -> tuple:
    """A preset: the reference layout ``LAYOUTS[layout]`` (:attr:`ReferenceLayout.config`) with these sizes."""
    return SesameBertConfig, dict(
        LAYOUTS[layout].config,
        num_hidden_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        intermediate_size=intermediate,
        **sizes,
    )


#: The compact BERT sizes of Turc et al. 2019 ("Well-Read Students Learn Better"), intermediate size 4H,
#: vocab_size 30522 (pretrain overrides it with the tokenizer's).
PRESETS: dict[str, tuple[type[PretrainedConfig], dict]] = {
    "bert-tiny": _preset("bert", 2, 128, 2, 4 * 128),
    "bert-mini": _preset("bert", 4, 256, 4, 4 * 256),
    "bert-small": _preset("bert", 4, 512, 8, 4 * 512),
    "bert-base": _preset("bert", 12, 768, 12, 4 * 768),
}
#: ModernBERT-class presets (``LAYOUTS["modernbert"]``, Warner et al. 2024): ``modernbert-base`` has ModernBERT-base's
#: sizes (22 layers, H 768, 12 heads, GeGLU intermediate 1152, a local attention window of 128 tokens); ``-mini`` and
#: ``-tiny`` keep its ratios (intermediate 1.5H) at bert-mini's and bert-tiny's widths, with a 64-token window so that
#: local attention acts on 128-token blocks. With :data:`PRESETS` in the BERT model spec (``SPEC.presets``, what
#: ``--config_name`` accepts).
MODERN_PRESETS: dict[str, tuple[type[PretrainedConfig], dict]] = {
    "modernbert-tiny": _preset("modernbert", 3, 128, 2, 192, local_attention=64),
    "modernbert-mini": _preset("modernbert", 6, 256, 4, 384, local_attention=64),
    "modernbert-base": _preset("modernbert", 22, 768, 12, 1152, local_attention=128),
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
    presets={**PRESETS, **MODERN_PRESETS},
    main_input="input_ids",
    export_inputs=("input_ids", "attention_mask", "token_type_ids"),
    export_sample=_bert_sample,
    tokenizer_trainer="tokenizer.wordpiece:train_wordpiece_tokenizer",
    finetune_recipe=dict(learning_rate=1e-4, weight_decay=0.01),
)

__all__ = ["SesameBertConfig", "SesameBertRTDConfig", *modeling_sesame_bert.__all__, *modeling_sesame_bert_rtd.__all__]
