"""The ELMo-style BiLM (SesameElmo). Filled in by the ELMo-style issue."""

from transformers import PretrainedConfig

PRESETS: dict[str, tuple[type[PretrainedConfig], dict]] = {}
__all__: list[str] = []
