"""sesame-lm models: the BERT-like encoder (``modeling.bert``) and the ELMo-style BiLM (``modeling.elmo``).

Importing this package registers every configuration, model and tokenizer class with the
transformers Auto classes (``AutoConfig``, ``AutoModel``, ``AutoModelForMaskedLM``, ...), so that
``AutoModel.from_pretrained(path)`` works in-process without ``trust_remote_code``.

Presets (``get_preset_config``) are the model sizes that ``--config_name`` accepts in ``pretrain``.
"""

from __future__ import annotations

from transformers import PretrainedConfig

from . import baselines, bert, elmo
from .baselines import *  # noqa: F401,F403  (re-export the classic baselines: CBoW, fastText, CNN, RNN, Tree-LSTM)
from .bert import *  # noqa: F401,F403  (re-export the BERT-like classes)
from .elmo import *  # noqa: F401,F403  (re-export the ELMo-style classes)
from .spec import ModelSpec

#: Preset name -> (config class, keyword arguments). Each subpackage owns its presets.
PRESETS: dict[str, tuple[type[PretrainedConfig], dict]] = {**bert.SPEC.presets, **elmo.PRESETS, **baselines.PRESETS}
#: ``--model_type`` -> the family's :class:`modeling.spec.ModelSpec`.
SPECS: dict[str, ModelSpec] = {spec.name: spec for spec in (bert.SPEC, elmo.SPEC)}


def spec_for(model_type: str | None) -> ModelSpec | None:
    """The spec of a config's ``model_type`` (``"sesame-bert"``, ...), or ``None`` for another model."""
    return next((spec for spec in SPECS.values() if spec.model_type == model_type), None)


def get_preset_config(name: str, **overrides) -> PretrainedConfig:
    """Return a fresh config for the preset ``name`` (e.g. ``"bert-tiny"``, ``"elmo-small"``).

    Args:
        name: a key of :data:`PRESETS`.
        **overrides: config fields that replace the preset's values (e.g. ``vocab_size=8000``).

    Raises:
        ValueError: ``name`` is not a preset; the message lists the valid names.
    """
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; expected one of: {', '.join(sorted(PRESETS))}")
    config_class, kwargs = PRESETS[name]
    return config_class(**{**kwargs, **overrides})


__all__ = ["PRESETS", "SPECS", "get_preset_config", "spec_for", *bert.__all__, *elmo.__all__, *baselines.__all__]
