"""Training of a BERT WordPiece tokenizer on a plain-text corpus, saved as a Hugging Face fast tokenizer.

The pipeline is the one of the original BERT (Devlin et al., 2019, "BERT: Pre-training of Deep
Bidirectional Transformers for Language Understanding", section 3 and appendix A; WordPiece from Wu et
al., 2016) as the ``tokenizers`` library implements it:

* normalizer ``BertNormalizer``: clean text (drop control characters, map whitespace to spaces), put
  spaces around CJK ideographs, lowercase and strip accents when ``lowercase`` (the "uncased" model);
* pre-tokenizer ``BertPreTokenizer``: split on whitespace and punctuation; while training, a word longer than
  :data:`MAX_INPUT_CHARS_PER_WORD` characters is dropped before the trainer counts it (BERT's
  ``max_input_chars_per_word``: encoding turns such a word into one ``[UNK]``, so no piece may be learnt from it,
  and the trainer's merges cost time quadratic in a word's length);
* model ``WordPiece`` with the ``##`` continuation prefix, greedy longest-match-first; a word with a
  character outside the vocabulary becomes ``[UNK]``;
* decoder ``WordPiece`` (joins ``##`` pieces and cleans up the spaces before punctuation);
* special tokens ``[PAD] [UNK] [CLS] [SEP] [MASK]`` with ids 0..4;
* post-processor ``[CLS] A [SEP]`` and ``[CLS] A [SEP] B [SEP]`` with token_type_ids 0 for ``[CLS] A [SEP]``
  and 1 for ``B [SEP]``.

The vocabulary is learnt with ``tokenizers.trainers.WordPieceTrainer`` from a streaming iterator over the
files (:func:`tokenizer.corpus.iter_text_batches`), so a corpus larger than memory can be used: the
trainer holds the word counts, not the text. The result is a ``transformers.BertTokenizer`` -- in
transformers v5 the ``tokenizers``-backed (fast) class; ``BertTokenizerFast`` is an alias of it -- which
rebuilds exactly this pipeline from ``vocab`` + ``do_lower_case`` when loaded with
``AutoTokenizer.from_pretrained``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from core.errors import InputError
from core.files import atomic_output_dir
from tokenizer.corpus import check_text_files, iter_text_batches

#: Special tokens in id order: [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4.
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
#: Continuation prefix of word pieces inside a word.
CONTINUING_SUBWORD_PREFIX = "##"
#: Longest word (in characters) the trainer counts, and WordPiece encodes as pieces rather than one ``[UNK]``: the
#: ``max_input_chars_per_word`` of BERT's tokenizer and of ``tokenizers.models.WordPiece``.
MAX_INPUT_CHARS_PER_WORD = 100
#: Seconds between two plain progress lines on stderr while a training pass reads the corpus (none before).
PROGRESS_EVERY_S = 10.0
#: Longest input a BERT-like model of this project takes by default (position embeddings), in tokens.
DEFAULT_MODEL_MAX_LENGTH = 512


def train_wordpiece_tokenizer(
    files: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    vocab_size: int,
    output_dir: str | os.PathLike[str] | None = None,
    lowercase: bool = True,
    min_frequency: int = 2,
    limit_alphabet: int | None = 1000,
    model_max_length: int = DEFAULT_MODEL_MAX_LENGTH,
    show_progress: bool = False,
    batch_size: int = 1000,
):
    """Train a BERT WordPiece tokenizer on ``.txt`` / ``.txt.gz`` files and return it as a fast tokenizer.

    Args:
        files: one or more corpus files (UTF-8, one paragraph or sentence per line; ``.gz`` decompressed
            on the fly), read streaming.
        vocab_size: size of the vocabulary in tokens, special tokens and the character alphabet included.
        output_dir: if given, the tokenizer is saved there with ``save_pretrained`` (``tokenizer.json``,
            ``tokenizer_config.json``) plus the classic BERT ``vocab.txt``, written atomically: nothing is
            written if training fails.
        lowercase: lowercase and strip accents (an "uncased" tokenizer); ``False`` keeps case and accents.
        min_frequency: a merge (a new word piece) must occur at least this many times in the corpus.
        limit_alphabet: keep at most this many distinct characters (the most frequent; the others become
            ``[UNK]``), as BERT's vocabulary builders do; ``None`` keeps every character.
        model_max_length: the longest sequence (in tokens) the tokenizer prepares for, e.g. for
            ``truncation=True``.
        show_progress: show the trainer's progress bar (on stderr); without it, a pass over the corpus that lasts
            longer than :data:`PROGRESS_EVERY_S` seconds prints a plain line on stderr every that many seconds (the
            pass, megabytes of text read, seconds).
        batch_size: lines per batch handed to ``train_from_iterator``.

    Returns:
        A ``transformers.BertTokenizer`` (``is_fast`` is ``True``) with ``len(tokenizer) <= vocab_size``,
        special token ids ``[PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4``, the other ids in the canonical order of
        :mod:`tokenizer.canonical` (by decreasing count on the corpus, ties by string), so that the same corpus
        gives the same ids in every run (``tokenizers`` itself numbers tied pieces in hash-map order).

    Raises:
        InputError: a corpus file is missing, empty, not gzip though named ``.gz``, or not UTF-8 (see
            :mod:`tokenizer.corpus`); ``vocab_size`` leaves no room beyond the special tokens, or is smaller
            than the special tokens plus the corpus alphabet (the message gives the size needed); the corpus holds no
            word of at most :data:`MAX_INPUT_CHARS_PER_WORD` characters (checked after the first pass);
            ``min_frequency < 1``; ``output_dir`` is an existing file.
    """
    _check_arguments(vocab_size, min_frequency, output_dir)
    paths = check_text_files(files, arg_name="--train_file")
    from transformers import BertTokenizer

    vocab = _train_vocabulary(paths, vocab_size, lowercase, min_frequency, limit_alphabet, show_progress, batch_size)
    # BertTokenizer's defaults are the pipeline above: CJK characters split, accents stripped when lower-casing
    tokenizer = BertTokenizer(vocab=vocab, do_lower_case=lowercase, model_max_length=model_max_length)
    if output_dir is not None:
        with atomic_output_dir(output_dir, arg_name="--output_dir") as tmp:
            tokenizer.save_pretrained(tmp)
            # The classic BERT vocabulary file (one token per line, line number = id) for tools that read it.
            id_to_token = sorted(vocab, key=vocab.__getitem__)
            (tmp / "vocab.txt").write_text("".join(t + "\n" for t in id_to_token), encoding="utf-8")
    return tokenizer


def _check_arguments(vocab_size, min_frequency, output_dir) -> None:
    """Refuse a vocabulary without room beyond the special tokens, ``min_frequency < 1``, an ``output_dir`` file."""
    if not isinstance(vocab_size, int) or vocab_size <= len(SPECIAL_TOKENS):
        raise InputError(
            f"--vocab_size {vocab_size}: smaller than needed for the {len(SPECIAL_TOKENS)} special tokens "
            f"{' '.join(SPECIAL_TOKENS)} plus an alphabet; expected an integer > {len(SPECIAL_TOKENS)} "
            f"(typically 8000-32000)"
        )
    if not isinstance(min_frequency, int) or min_frequency < 1:
        raise InputError(f"--min_frequency {min_frequency}: expected an integer >= 1")
    if output_dir is not None and Path(output_dir).exists() and not Path(output_dir).is_dir():
        raise InputError(f"--output_dir {output_dir}: is an existing file; expected a directory (new or existing)")


def _bounded_backend(lowercase: bool):
    """The WordPiece ``tokenizers.Tokenizer`` that training fits: BERT's normalizer (as ``BertTokenizer(do_lower_case=
    lowercase)`` builds it when reloading) and pre-tokenizer, then words longer than BERT's ``max_input_chars_per_word``
    (:data:`MAX_INPUT_CHARS_PER_WORD`) removed: encoding makes each one [UNK], and the trainer would spend minutes on
    one (30 MB of one letter: over 5 minutes, issue 43)."""
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import WordPiece

    backend = Tokenizer(WordPiece(unk_token="[UNK]", continuing_subword_prefix=CONTINUING_SUBWORD_PREFIX))
    backend.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase
    )
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.BertPreTokenizer(),
            pre_tokenizers.Split(Regex(rf"\S{{{MAX_INPUT_CHARS_PER_WORD + 1},}}"), behavior="removed"),
        ]
    )
    backend.decoder = decoders.WordPiece(prefix=CONTINUING_SUBWORD_PREFIX)
    return backend


def _train_vocabulary(
    paths,
    vocab_size: int,
    lowercase: bool,
    min_frequency: int,
    limit_alphabet: int | None,
    show_progress: bool,
    batch_size: int,
) -> dict[str, int]:
    """WordPiece vocabulary ``{piece: id}`` trained on ``paths`` in two passes (for reproducible ties), numbered in
    the canonical order of :mod:`tokenizer.canonical`.

    Raises:
        InputError: ``vocab_size`` smaller than the special tokens plus the corpus alphabet; no word within the bound.
    """
    # Imported here: refused input is reported without loading them, and `import tokenizer` stays light.
    from tokenizers import Tokenizer, pre_tokenizers, trainers
    from tokenizers.models import WordPiece

    from tokenizer.canonical import canonical_token_order, count_token_ids

    backend = _bounded_backend(lowercase)

    def train(vocab: int, specials: list[str], name: str) -> None:
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab,
            min_frequency=min_frequency,
            special_tokens=specials,
            limit_alphabet=limit_alphabet,
            continuing_subword_prefix=CONTINUING_SUBWORD_PREFIX,
            show_progress=show_progress,
        )
        batches = iter_text_batches(paths, batch_size=batch_size, arg_name="--train_file")
        backend.train_from_iterator(batches if show_progress else _with_progress_lines(batches, name), trainer)

    # Reproducibility: the trainer numbers the continuation forms of the alphabet ("##a") in hash-map order as it
    # meets them, and breaks ties between equally frequent merges by those numbers, so two trainings can learn
    # different pieces (huggingface/tokenizers#1794). A first pass (no merges) finds the alphabet; the second
    # registers its continuation forms up front, in sorted order, so every tie is broken the same way.
    train(len(SPECIAL_TOKENS) + 1, list(SPECIAL_TOKENS), "alphabet")
    if len(backend.get_vocab()) <= len(SPECIAL_TOKENS):  # every word was longer than the bound: nothing to learn
        raise InputError(
            f"--train_file {' '.join(map(str, paths))}: no word of at most {MAX_INPUT_CHARS_PER_WORD} characters "
            f"(BERT's max_input_chars_per_word; a longer word encodes as one [UNK]), so no word piece can be learnt; "
            "expected text of words separated by whitespace or punctuation"
        )
    continuation = sorted(
        t
        for t in backend.get_vocab()
        if t.startswith(CONTINUING_SUBWORD_PREFIX) and len(t) > len(CONTINUING_SUBWORD_PREFIX)
    )
    train(vocab_size, list(SPECIAL_TOKENS) + continuation, "vocabulary")

    vocab = backend.get_vocab()
    if len(vocab) > vocab_size:
        raise InputError(
            f"--vocab_size {vocab_size}: too small for this corpus: the {len(SPECIAL_TOKENS)} special tokens and "
            f"the alphabet of {len(vocab) - len(SPECIAL_TOKENS)} characters (with their {CONTINUING_SUBWORD_PREFIX} "
            f"continuation forms) already need {len(vocab)}; expected --vocab_size >= {len(vocab)}"
        )
    # Canonical ids: specials, then by decreasing count on the corpus, ties by string (tokenizer.canonical).
    counter = Tokenizer(
        WordPiece(
            vocab,
            unk_token="[UNK]",
            continuing_subword_prefix=CONTINUING_SUBWORD_PREFIX,
            max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD,
        )
    )
    # As the saved tokenizer encodes (no added tokens): a word beyond the bound counts as one [UNK].
    counter.normalizer, counter.pre_tokenizer = backend.normalizer, pre_tokenizers.BertPreTokenizer()
    counts = count_token_ids(counter, paths, len(vocab), batch_size=batch_size)
    return {t: i for i, t in enumerate(canonical_token_order(vocab, counts, SPECIAL_TOKENS))}


def _with_progress_lines(batches: Iterable[list[str]], name: str, every_s: float | None = None):
    """Yield ``batches`` unchanged; every ``every_s`` seconds (default :data:`PROGRESS_EVERY_S`) print one plain line
    on stderr: the pass ``name``, the megabytes of text (characters / 1e6) read so far and the seconds elapsed."""
    every_s = PROGRESS_EVERY_S if every_s is None else every_s
    start = last = time.monotonic()
    chars = 0
    for batch in batches:
        chars += sum(map(len, batch))
        now = time.monotonic()
        if now - last >= every_s:
            print(
                f"tokenizer training, {name} pass: {chars / 1e6:.1f} MB of text read in {now - start:.0f} s",
                file=sys.stderr,
                flush=True,
            )
            last = now
        yield batch
