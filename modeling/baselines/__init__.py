"""The classic baselines (SesameBaseline): CBoW, fastText, Kim-CNN, (bi)LSTM/GRU and Tree-LSTM sentence encoders.

Importing this package registers ``SesameBaselineConfig`` (model_type ``"sesame-baseline"``), its models
(``AUTO_CLASSES``) and the ELMo-style word tokenizer with the Auto classes, marked for ``auto_map`` (remote code,
:func:`modeling._auto.register_family`).

Presets (``PRESETS``) are the encoders of the baseline table (``python -m finetune.baselines``): ``baseline-cbow``,
``baseline-fasttext``, ``baseline-cnn`` (Kim 2014, non-static), ``baseline-rnn`` (the GLUE paper's 2-layer BiLSTM
with max pooling) and ``baseline-treelstm`` (latent trees). ``vocab_size`` must be set to the tokenizer's size.
Word vectors: ``python -m tokenizer vectors`` trains fastText vectors (gensim) for a word tokenizer;
:func:`load_word_vectors` copies them into a model.
"""

import sys

import torch
from transformers import (
    AutoModel,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    PretrainedConfig,
)

from .._auto import register_family
from ..elmo import SPEC as ELMO_SPEC
from ..elmo import configuration_elmo, lstm_elmo, modeling_elmo
from ..elmo.tokenization_elmo import BOS_CHAR, EOS_CHAR, SesameElmoTokenizer
from ..spec import ModelSpec

# modeling_baseline.py imports the ELMo family's modules as its siblings (``from .modeling_elmo import ...``), so that
# ``save_pretrained`` copies them into every baseline folder and remote code finds them there (ELMo features,
# ``elmo_config``). In this folder they are links to ``modeling/elmo``'s files; here, before that import, the sibling
# names are bound to the ELMo family's modules themselves: one module, one class identity, in the package.
for _module in (configuration_elmo, lstm_elmo, modeling_elmo):
    sys.modules.setdefault(f"{__name__}.{_module.__name__.rsplit('.', 1)[-1]}", _module)
from .configuration_baseline import ENCODER_TYPES, SesameBaselineConfig  # noqa: E402 (after the binding above)
from .encoders_baseline import BinaryTreeLSTMCell, parse_binary_tree  # noqa: E402
from .modeling_baseline import (  # noqa: E402
    SesameBaselineForSequenceClassification,
    SesameBaselineForTokenClassification,
    SesameBaselineModel,
    SesameBaselinePreTrainedModel,
    ngram_bucket_ids,
)
from .vectors import load_word_vectors  # noqa: E402

#: Only what differs from the config defaults, which are the papers' settings: Kim's widths 3/4/5 x 100 maps, the GLUE
#: baseline's 2-layer BiLSTM (256 per direction, max pooling), a Tree-LSTM of 150.
_MLP = dict(classifier_hidden_size=256, classifier_dropout=0.2)  # one hidden layer
PRESETS: dict[str, tuple[type[PretrainedConfig], dict]] = {
    "baseline-cbow": (SesameBaselineConfig, dict(encoder_type="cbow", **_MLP)),
    "baseline-fasttext": (SesameBaselineConfig, dict(encoder_type="fasttext")),
    "baseline-cnn": (SesameBaselineConfig, dict(encoder_type="cnn", classifier_dropout=0.5)),
    "baseline-rnn": (SesameBaselineConfig, dict(encoder_type="rnn", **_MLP)),
    "baseline-treelstm": (SesameBaselineConfig, dict(encoder_type="treelstm", tree_source="auto", **_MLP)),
}

#: Auto class -> SesameBaseline class (registered in-process and marked for ``auto_map``).
AUTO_CLASSES = {
    AutoModel: SesameBaselineModel,
    AutoModelForSequenceClassification: SesameBaselineForSequenceClassification,
    AutoModelForTokenClassification: SesameBaselineForTokenClassification,
}

register_family(SesameBaselineConfig, AUTO_CLASSES, SesameElmoTokenizer)


def _baseline_sample(config, batch: int, length: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """The ELMo family's sample (the word tokenizer's ``char_ids``, ``attention_mask``, ``token_type_ids``) and its word
    ids: ``<S>`` / ``</S>`` where their characters are, random words of the vocabulary between, ``<pad>`` at padding."""
    sample = ELMO_SPEC.export_sample(config, batch, length, generator)
    words = torch.randint(min(4, config.vocab_size - 1), config.vocab_size, (batch, length), generator=generator)
    marker = sample["char_ids"][..., 1]
    words = torch.where(marker == EOS_CHAR, config.eos_token_id, words)
    words = torch.where(marker == BOS_CHAR, config.bos_token_id, words)
    return dict(input_ids=words.masked_fill(sample["attention_mask"] == 0, config.pad_token_id), **sample)


def _export_refusal(config) -> str | None:
    """fastText hashes its n-grams in Python, the latent Tree-LSTM composes ``length - 1`` times: no dynamic graph."""
    if config.encoder_type in ("fasttext", "treelstm"):
        return f"encoder_type {config.encoder_type!r} does not export (only cbow, cnn and rnn baselines do)"


#: Not in ``modeling.SPECS`` (not pretrained; the ELMo family's word tokenizer); recipes by encoder: finetune.baselines.
SPEC = ModelSpec(
    name="baselines",
    model_type=SesameBaselineConfig.model_type,
    description="classic sentence-encoder baseline",
    presets=PRESETS,
    main_input=SesameBaselinePreTrainedModel.main_input_name,
    export_inputs=("input_ids", *ELMO_SPEC.export_inputs),  # the word ids, then the ELMo family's
    export_sample=_baseline_sample,
    tokenizer_trainer=ELMO_SPEC.tokenizer_trainer,
    finetune_recipe={},
    export_refusal=_export_refusal,
)

__all__ = [
    "ENCODER_TYPES",
    "SesameBaselineConfig",
    "SesameBaselineModel",
    "SesameBaselinePreTrainedModel",
    "SesameBaselineForSequenceClassification",
    "SesameBaselineForTokenClassification",
    "BinaryTreeLSTMCell",
    "load_word_vectors",
    "ngram_bucket_ids",
    "parse_binary_tree",
]
