"""Command-line arguments shared by the fine-tuning scripts (``finetune.glue``, ``finetune.squad``)."""

from __future__ import annotations

import argparse

from training.run import HelpFormatter  # noqa: F401  (re-exported: one --help format for every command)


def add_model_arguments(parser: argparse.ArgumentParser, *, head: str, config_name: bool = False) -> argparse._ArgumentGroup:
    """Add the ``model`` argument group: ``--model_name_or_path`` (required), [``--config_name``],
    ``--tokenizer_name``, ``--revision``, ``--unfreeze_backbone``, ``--trust_remote_code`` (off by default).

    Args:
        parser: the script's parser.
        head: what the SesameElmo head trains besides the ScalarMix, for ``--unfreeze_backbone``'s help
            (e.g. ``"head"``, ``"QA head"``).
        config_name: also add ``--config_name`` (a config path or hub repo; default: the model's).

    Returns:
        The group, for script-specific model arguments.
    """
    m = parser.add_argument_group("model")
    m.add_argument("--model_name_or_path", required=True,
                   help="model directory or hub repo (SesameBert, SesameElmo, or a transformers model)")
    if config_name:
        m.add_argument("--config_name", default=None, help="config path or repo (default: the model's)")
    m.add_argument("--tokenizer_name", default=None, help="tokenizer path or repo (default: the model's)")
    m.add_argument("--revision", default=None,
                   help="revision (branch, tag or commit id) of the hub repos given by the model arguments")
    m.add_argument("--unfreeze_backbone", action="store_true",
                   help=f"SesameElmo: fine-tune the BiLM too (default: frozen, ScalarMix + {head} trained)")
    m.add_argument("--trust_remote_code", action="store_true", help="allow model code from the model repository")
    return m
