"""Tokenizer training for sesame-lm.

* :func:`train_wordpiece_tokenizer` -- a BERT WordPiece tokenizer (BERT normalizer and pre-tokenizer,
  ``##`` continuation pieces, ``[PAD] [UNK] [CLS] [SEP] [MASK]``, ``[CLS] A [SEP] B [SEP]`` with
  token_type_ids) trained with the ``tokenizers`` library and saved as a Hugging Face fast tokenizer.
* :mod:`tokenizer.elmo_training` -- the word vocabulary of the ELMo-style models; the word + character
  tokenizer itself lives beside its model, in :mod:`modeling.elmo.tokenization_elmo`.
* :mod:`tokenizer.corpus` -- streaming reading of ``.txt`` / ``.txt.gz`` corpora, shared with ``pretrain``
  (output folders are written atomically with :func:`core.files.atomic_output_dir`).

Command line: ``python -m tokenizer train --model_type {bert,elmo} --train_file F [F ...] --vocab_size N
--output_dir D``. Importing this package is light: ``tokenizers`` / ``transformers`` are imported only
when a trainer is first used.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from tokenizer.corpus import check_text_files, iter_text_batches, iter_text_lines

if TYPE_CHECKING:
    from tokenizer.wordpiece import train_wordpiece_tokenizer

__all__ = [
    "check_text_files",
    "iter_text_batches",
    "iter_text_lines",
    "train_tokenizer",
    "train_wordpiece_tokenizer",
]


def train_tokenizer(spec, files, vocab_size: int, output_dir, max_seq_length: int = 0, **options):
    """Train and save the tokenizer of ``spec`` (a :class:`modeling.spec.ModelSpec`; ``python -m tokenizer train`` and
    ``pretrain``), passing the ``options`` its trainer takes and a ``model_max_length`` of max(512,
    ``max_seq_length``). Returns the tokenizer; raises as the trainer."""
    from modeling.spec import resolve

    trainer = resolve(spec.tokenizer_trainer)
    options = {**options, "model_max_length": max(max_seq_length, 512)}
    known = inspect.signature(trainer).parameters
    return trainer(files, vocab_size, output_dir, **{k: v for k, v in options.items() if k in known})


def __getattr__(name: str) -> Any:
    if name == "train_wordpiece_tokenizer":
        from tokenizer.wordpiece import train_wordpiece_tokenizer

        return train_wordpiece_tokenizer
    raise AttributeError(f"module 'tokenizer' has no attribute {name!r}")
