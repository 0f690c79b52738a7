"""The BERT-like encoder (SesameBert). Filled in by the BERT-like issue."""

from transformers import PretrainedConfig

PRESETS: dict[str, tuple[type[PretrainedConfig], dict]] = {}
__all__: list[str] = []
