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

#: ``--model_type`` -> the :class:`modeling.spec.ModelSpec` of a family that ``pretrain`` and ``tokenizer`` train.
SPECS: dict[str, ModelSpec] = {spec.name: spec for spec in (bert.SPEC, elmo.SPEC)}
#: Every family's spec by name: :data:`SPECS` and the baselines (fine-tuned, exported, named on cards; not pretrained).
ALL_SPECS: dict[str, ModelSpec] = {**SPECS, baselines.SPEC.name: baselines.SPEC}
#: Preset name -> (config class, keyword arguments). Each family's spec owns its presets.
PRESETS: dict[str, tuple[type[PretrainedConfig], dict]] = dict(p for s in ALL_SPECS.values() for p in s.presets.items())


def spec_for(model_type: str | None) -> ModelSpec | None:
    """The spec of a config's ``model_type`` (``"sesame-bert"``, ...; in :data:`ALL_SPECS`), or ``None``."""
    return next((spec for spec in ALL_SPECS.values() if spec.model_type == model_type), None)


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


__all__ = ["ALL_SPECS", "PRESETS", "SPECS", "get_preset_config", "spec_for"]
__all__ += [*bert.__all__, *elmo.__all__, *baselines.__all__]
