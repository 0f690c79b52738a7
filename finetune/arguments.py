"""Typed command-line arguments shared by the fine-tuning scripts (``finetune.glue``, ``finetune.squad``)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from training.arguments import arg, with_defaults
from training.config import TrainingConfig


@dataclasses.dataclass(frozen=True)
class FinetuneModelArguments:
    """The backbone to fine-tune and where its code may come from."""

    _argument_group_name: ClassVar[str] = "model"

    model_name_or_path: str = arg(help="model directory or hub repo (SesameBert, SesameElmo, or a transformers model)")
    tokenizer_name: str | None = arg(None, "tokenizer path or repo (default: the model's)")
    revision: str | None = arg(
        None, "revision (branch, tag or commit id) of the hub repos given by the model arguments"
    )
    unfreeze_backbone: bool = arg(
        False, "SesameElmo: fine-tune the BiLM too (default: frozen, ScalarMix + head trained)"
    )
    trust_remote_code: bool = arg(False, "allow model code from the model repository")

    def hub_kwargs(self) -> dict:
        """``revision`` and ``trust_remote_code`` for ``from_pretrained``."""
        return {"revision": self.revision, "trust_remote_code": self.trust_remote_code}


def finetune_training_arguments(name: str, **defaults) -> type:
    """The loop's flags with a fine-tuning script's defaults (``--output_dir`` checked by the script)."""
    return with_defaults(TrainingConfig, {"output_dir": None, **defaults}, name=name)


__all__ = ["FinetuneModelArguments", "finetune_training_arguments"]
