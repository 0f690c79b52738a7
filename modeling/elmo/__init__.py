"""The ELMo-style BiLM (SesameElmo): char-CNN + separate forward/backward LSTM stacks, ScalarMix, heads.

Importing this package registers ``SesameElmoConfig`` (model_type ``"sesame-elmo"``) and its models with the
Auto classes (AutoConfig, AutoModel, AutoModelForPreTraining -> :class:`SesameElmoForBidirectionalLM`,
AutoModelForSequenceClassification, AutoModelForQuestionAnswering, AutoModelForTokenClassification) and
:class:`SesameElmoTokenizer` with AutoTokenizer, and marks the classes for ``auto_map`` so that
``save_pretrained`` writes remote code (``trust_remote_code=True``).

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

from transformers import (
    AutoModel,
    AutoModelForPreTraining,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    PretrainedConfig,
)

from .._auto import register_family
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
from .tokenization_elmo import SesameElmoTokenizer

PRESETS: dict[str, tuple[type[PretrainedConfig], dict]] = {
    "elmo-small": (
        SesameElmoConfig,
        dict(
            char_embedding_dim=16,
            cnn_filters=[[1, 32], [2, 32], [3, 64], [4, 128]],
            num_highway_layers=2,
            projection_dim=128,
            cell_size=512,
            num_layers=2,
            dropout=0.1,
            softmax="adaptive",
        ),
    ),
    "elmo-original": (
        SesameElmoConfig,
        dict(
            char_embedding_dim=16,
            cnn_filters=ELMO_CNN_FILTERS,
            num_highway_layers=2,
            projection_dim=512,
            cell_size=4096,
            num_layers=2,
            dropout=0.1,
            softmax="sampled",
            num_sampled=8192,
        ),
    ),
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
