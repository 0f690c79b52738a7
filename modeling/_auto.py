"""In-process registration of a model family with the transformers Auto classes: one helper for every family.

Each family package (``modeling.bert``, ``modeling.elmo``, ``modeling.baselines``) calls :func:`register_family` once
when it is imported. This file is not remote code: ``save_pretrained`` copies only the files of a family's own folder
(a model file and what it imports relatively from that folder), and the ``auto_map`` of a saved folder comes from the
config and model classes themselves (``register_for_auto_class`` below marks them; the configs' default ``auto_map``
lists every head).
"""

from __future__ import annotations

from transformers import AutoConfig, AutoTokenizer, PretrainedConfig, PreTrainedModel


def register_family(
    config_class: type[PretrainedConfig],
    auto_classes: dict[type, type[PreTrainedModel]],
    tokenizer_class: type | None = None,
) -> None:
    """Register a family's config, models and (slow) tokenizer with the Auto classes, in this process, and mark the
    config and models for ``auto_map`` (``save_pretrained`` then copies their files, for ``trust_remote_code=True``
    without sesame-lm). The tokenizer marks itself (it is saved without its model too). Registering again changes
    nothing (``exist_ok=True``).

    Args:
        config_class: a ``PretrainedConfig`` subclass with a non-empty ``model_type``.
        auto_classes: Auto class (``AutoModel``, ``AutoModelForSequenceClassification``, ...) -> model class whose
            ``config_class`` is ``config_class``.
        tokenizer_class: the family's slow tokenizer class, or ``None`` (a fast tokenizer needs no registration).

    Raises:
        ValueError: from transformers, when a model class's ``config_class`` is not ``config_class``.
    """
    AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
    config_class.register_for_auto_class()
    for auto, model in auto_classes.items():
        auto.register(config_class, model, exist_ok=True)
        model.register_for_auto_class(auto.__name__)
    if tokenizer_class is not None:
        AutoTokenizer.register(config_class, slow_tokenizer_class=tokenizer_class, exist_ok=True)
