"""Training of the ELMo-style word vocabulary (``python -m tokenizer train --model_type elmo``).

The vocabulary is the ``vocab_size`` most frequent words of the corpus (after the same NFC /
lower-casing and ``BertPreTokenizer`` splitting that :class:`~modeling.elmo.tokenization_elmo.SesameElmoTokenizer`
applies), counted by the ``tokenizers`` library's ``WordLevelTrainer``, plus the four special tokens
``<pad>`` (0), ``<S>`` (1), ``</S>`` (2), ``<UNK>`` (3). Words follow in order of decreasing frequency
(ties broken by the word string, :mod:`tokenizer.canonical`), as bilm-tf's vocabulary files and the log-uniform sampler
of the
sampled softmax expect. Characters need no training: ELMo's character ids are fixed (UTF-8 bytes).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from tokenizers import Tokenizer, models, trainers

from core.errors import InputError
from core.files import atomic_output_dir
from modeling.elmo.tokenization_elmo import (
    SPECIAL_TOKENS,
    UNK_TOKEN,
    SesameElmoTokenizer,
    build_normalizer,
    build_pre_tokenizer,
)

from .corpus import check_text_files, iter_text_lines


def train_elmo_tokenizer(
    files: str | os.PathLike | list[str | os.PathLike],
    vocab_size: int,
    output_dir: str | os.PathLike | None = None,
    lowercase: bool = False,
    min_frequency: int = 1,
) -> SesameElmoTokenizer:
    """Count words in ``files`` and build a :class:`SesameElmoTokenizer` with the most frequent ones.

    Args:
        files: corpus files (``.txt`` / ``.txt.gz``, UTF-8, read as a stream).
        vocab_size: total vocabulary size, the 4 special tokens included (>= 5). Fewer distinct words
            give a smaller vocabulary.
        output_dir: if given, the tokenizer is saved there (``save_pretrained``: ``vocab.txt``,
            ``tokenizer_config.json`` with ``auto_map``, and this tokenizer's code), written atomically.
        lowercase: lower-case the text before counting (and when encoding).
        min_frequency: words seen fewer times are left out (>= 1).

    Returns:
        The tokenizer.

    Raises:
        InputError: a bad file (see :func:`tokenizer.corpus.check_text_files`), ``vocab_size < 5``,
            ``min_frequency < 1``, or a corpus with no word of frequency ``>= min_frequency``.
    """
    if vocab_size < len(SPECIAL_TOKENS) + 1:
        raise InputError(
            f"--vocab_size {vocab_size}: too small; expected at least {len(SPECIAL_TOKENS) + 1} "
            f"(the {len(SPECIAL_TOKENS)} special tokens {SPECIAL_TOKENS} and one word)"
        )
    if min_frequency < 1:
        raise InputError(f"--min_frequency {min_frequency}: expected an integer >= 1")
    paths = check_text_files(files)

    counter = Tokenizer(models.WordLevel(unk_token=UNK_TOKEN))
    counter.normalizer = build_normalizer(lowercase)
    counter.pre_tokenizer = build_pre_tokenizer()
    # Every word is kept here and the vocabulary cut below: the trainer picks among words of equal count at the
    # cut-off, and numbers them, in hash-map order; the canonical order (tokenizer.canonical) decides instead.
    trainer = trainers.WordLevelTrainer(
        vocab_size=2**31 - 1, min_frequency=min_frequency, special_tokens=list(SPECIAL_TOKENS), show_progress=False
    )
    counter.train_from_iterator(iter_text_lines(paths), trainer=trainer)
    vocab = counter.get_vocab()
    from .canonical import canonical_token_order, count_token_ids

    counts = count_token_ids(counter, paths, max(vocab.values()) + 1)
    tokens = canonical_token_order(vocab, counts, SPECIAL_TOKENS)[:vocab_size]
    if len(tokens) <= len(SPECIAL_TOKENS):
        raise InputError(
            f"--train_file {', '.join(map(str, paths))}: no word occurs at least "
            f"{min_frequency} time(s); expected text with words"
        )

    with tempfile.TemporaryDirectory() as tmp:
        vocab_file = Path(tmp) / "vocab.txt"
        vocab_file.write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
        tokenizer = SesameElmoTokenizer(str(vocab_file), lowercase=lowercase)
    if output_dir is not None:
        with atomic_output_dir(output_dir) as tmp_dir:
            tokenizer.save_pretrained(str(tmp_dir))
    return tokenizer
