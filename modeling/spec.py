"""One :class:`ModelSpec` per model family (``SPEC`` in ``modeling/<family>/__init__.py``; :data:`modeling.ALL_SPECS`,
the pretrained ones :data:`modeling.SPECS`), as torchtitan's ``ModelSpec``: what pretraining, the tokenizer command,
export, the model card and fine-tuning read of a family instead of testing its name. The tokenizer trainer (a higher
layer) is named ``"module:function"`` (:func:`resolve`)."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from typing import Any


def resolve(path: str) -> Callable[..., Any]:
    """The function ``path`` names (``"module:function"``), its module imported now."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """A model family: its ``--model_type`` ``name``, config ``model_type``, ``description`` (model card), ``presets``
    (``--config_name``), ``main_input`` (the per-token tokenizer output lengths are counted on), ``export_inputs``
    and ``export_sample`` (``(config, batch, length, generator) -> {input: int64 tensor}``, last row padded),
    ``export_refusal`` (``config ->`` why it does not export, or ``None``), ``tokenizer_trainer`` (``"module:function"``
    of ``(files, vocab_size, output_dir, **options)``) and ``finetune_recipe`` (``finetune.glue`` settings of the
    baselines table over its default recipe; its ``learning_rate`` is the default when ``frozen_backbone``: fine-tuned
    with the backbone frozen)."""

    name: str
    model_type: str
    description: str
    presets: Mapping[str, tuple[type, dict]]
    main_input: str
    export_inputs: tuple[str, ...]
    export_sample: Callable[..., dict]
    tokenizer_trainer: str
    finetune_recipe: Mapping[str, Any]
    frozen_backbone: bool = False
    export_refusal: Callable[[Any], str | None] = lambda config: None
