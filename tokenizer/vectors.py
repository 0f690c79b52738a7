"""fastText subword word vectors for a word tokenizer (``python -m tokenizer vectors``), trained with gensim.

No GloVe or fastText vectors can be downloaded where this project runs, so the classic baselines
(:mod:`modeling.baselines`) get their word vectors from the pretraining corpus: gensim's ``FastText``
(Bojanowski et al. 2017, "Enriching Word Vectors with Subword Information"; CBOW or skip-gram with character
n-grams hashed into ``bucket`` rows) over the corpus split into words exactly as the ELMo-style word tokenizer
splits them, then one vector for every word of that tokenizer's vocabulary (words the corpus never had
``min_count`` times get the mean of their n-gram vectors, fastText's out-of-vocabulary vector).

Output folder (``--output_dir``, written atomically):

* the word tokenizer (``save_pretrained``), so that the folder also loads with ``AutoTokenizer``;
* ``word_vectors.safetensors`` -- ``vectors (V, d)`` float32, the fastText vector of each tokenizer word
  (gensim's ``wv[word]``; 0 for ``<pad>``, ``<S>``, ``</S>``, ``<UNK>``); ``vectors_vocab (V, d)``, the
  word-only rows (gensim's ``vectors_vocab``; for words outside gensim's vocabulary their n-gram mean) and
  ``vectors_ngrams (bucket, d)``, the n-gram rows -- what a ``fasttext`` baseline is initialised from;
* ``word_vectors.json`` -- the training settings (``vector_size``, ``min_n``, ``max_n``, ``bucket``, ...), the
  corpus files with their sizes, and the coverage (tokenizer words in gensim's vocabulary).

Deterministic: one worker thread and a fixed ``seed`` give the same vectors on the same machine (gensim's
documented condition); ``PYTHONHASHSEED`` is not involved (gensim hashes with its own FNV).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from core.errors import InputError
from core.files import atomic_output_dir
from modeling.baselines.vectors import VECTORS_CONFIG, VECTORS_FILE  # files written next to the tokenizer

from .corpus import check_text_files, iter_text_lines


def train_word_vectors(
    files: list[str | os.PathLike],
    tokenizer_name: str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    vector_size: int = 100,
    epochs: int = 5,
    min_count: int = 5,
    window: int = 5,
    min_n: int = 3,
    max_n: int = 6,
    bucket: int = 100_000,
    sg: bool = False,
    seed: int = 42,
) -> dict:
    """Train fastText vectors on ``files`` and save them for the words of the tokenizer ``tokenizer_name``.

    Args:
        files: corpus files (``.txt`` / ``.txt.gz``, one paragraph or sentence per line).
        tokenizer_name: a folder with the ELMo-style word tokenizer (``python -m tokenizer train --model_type elmo``).
        output_dir: the folder to write (see the module docstring).
        vector_size: dimension d. epochs: passes over the corpus. min_count: gensim's vocabulary threshold.
        window: context window. min_n, max_n: character n-gram lengths. bucket: n-gram hash buckets.
        sg: skip-gram instead of CBOW. seed: gensim's seed (with one worker: deterministic).

    Returns:
        The ``word_vectors.json`` content.

    Raises:
        InputError: a bad corpus file, a tokenizer folder that is not an ELMo-style word tokenizer, or a
            setting out of range.
    """
    import numpy as np
    from safetensors.numpy import save_file

    settings = _settings_record(vector_size, epochs, min_count, window, min_n, max_n, bucket, sg, seed)
    _check_settings(settings)
    paths = check_text_files(files)
    tok = _load_word_tokenizer(tokenizer_name)
    model, n_words = _train_fasttext(paths, tok, settings)
    wv, words = model.wv, tok.ids_to_tokens
    vectors, vocab_rows, known = _tokenizer_rows(wv, tok, vector_size)
    info = {
        **settings,
        "train_files": [{"path": str(p), "bytes": p.stat().st_size} for p in paths],
        "corpus_words": n_words,
        "gensim_vocab_size": len(wv.key_to_index),
        "tokenizer_vocab_size": len(words),
        "tokenizer_words_in_gensim_vocab": known,
        "lowercase": bool(tok.lowercase),
    }
    with atomic_output_dir(output_dir) as out:
        tok.save_pretrained(str(out))
        save_file(
            {
                "vectors": vectors,
                "vectors_vocab": vocab_rows,
                "vectors_ngrams": np.ascontiguousarray(wv.vectors_ngrams, dtype=np.float32),
            },
            str(out / VECTORS_FILE),
            metadata={"format": "sesame-lm word vectors"},
        )
        (out / VECTORS_CONFIG).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return info


def _settings_record(
    vector_size: int, epochs: int, min_count: int, window: int, min_n: int, max_n: int, bucket: int, sg: bool, seed: int
) -> dict:
    """The training settings as ``word_vectors.json`` records them and gensim's ``FastText`` takes them (``workers``
    is always 1)."""
    return {
        "vector_size": vector_size,
        "epochs": epochs,
        "min_count": min_count,
        "window": window,
        "min_n": min_n,
        "max_n": max_n,
        "bucket": bucket,
        "sg": bool(sg),
        "seed": seed,
        "workers": 1,
    }


def _check_settings(settings: dict) -> None:
    """Check the training settings of :func:`train_word_vectors` (:func:`_settings_record`; all integers).

    Raises:
        InputError: a setting below 1, or ``max_n`` below ``min_n``.
    """
    for name in ("vector_size", "epochs", "min_count", "window", "min_n", "bucket"):
        if settings[name] < 1:
            raise InputError(f"--{name} {settings[name]}: expected an integer >= 1")
    if settings["max_n"] < settings["min_n"]:
        raise InputError(f"--max_n {settings['max_n']}: expected >= --min_n {settings['min_n']}")


def _load_word_tokenizer(tokenizer_name: str | os.PathLike):
    """Load the ELMo-style word tokenizer (a ``SesameElmoTokenizer``) from the folder ``tokenizer_name``.

    Raises:
        InputError: the folder does not hold such a tokenizer.
    """
    from modeling.elmo.tokenization_elmo import SesameElmoTokenizer

    try:
        return SesameElmoTokenizer.from_pretrained(str(tokenizer_name))
    except (OSError, ValueError, TypeError) as err:
        raise InputError(
            f"--tokenizer_name {tokenizer_name}: not an ELMo-style word tokenizer ({err}); expected a folder "
            "written by python -m tokenizer train --model_type elmo"
        ) from None


def _train_fasttext(paths, tok, settings: dict):
    """Train gensim's ``FastText`` with ``settings`` (:func:`_settings_record`: one worker thread) on the corpus
    ``paths`` split into ``tok``'s words, written to a temporary file first.

    Returns:
        ``(model, n_words)``: the trained ``FastText`` model and the number of words of the corpus.

    Raises:
        InputError: the files hold no word, or no word occurs ``min_count`` times.
    """
    from gensim.models import FastText

    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "words.txt"  # one line per input line, words as the tokenizer splits them
        n_words = _write_word_corpus(paths, tok, corpus)
        model = FastText(**{**settings, "sg": int(settings["sg"])})
        model.build_vocab(corpus_file=str(corpus))
        if not model.wv.key_to_index:
            raise InputError(
                f"--min_count {settings['min_count']}: no word of the corpus occurs that often; expected a lower value"
            )
        model.train(
            corpus_file=str(corpus),
            total_examples=model.corpus_count,
            total_words=model.corpus_total_words,
            epochs=settings["epochs"],
        )
    return model, n_words


def _write_word_corpus(paths, tok, corpus: Path) -> int:
    """Write ``paths``' lines as the tokenizer's words (space-separated, one line per input line) to ``corpus``;
    returns the number of words.

    Raises:
        InputError: the files hold no word.
    """
    n_words = 0
    with open(corpus, "w", encoding="utf-8") as f:
        for line in iter_text_lines(paths):
            words = tok._tokenize(line)
            if words:
                n_words += len(words)
                f.write(" ".join(words) + "\n")
    if n_words == 0:
        raise InputError(f"--train_file {', '.join(map(str, paths))}: no words; expected text")
    return n_words


def _tokenizer_rows(wv, tok, vector_size: int):
    """The rows of every tokenizer word (zeros for the special tokens): ``vectors`` (V, D) float32, gensim's
    ``wv[word]``; ``vectors_vocab`` (V, D) float32, the word's own fastText row (its n-gram vector when gensim did not
    keep the word); and the number of words gensim kept."""
    import numpy as np

    words = tok.ids_to_tokens
    specials = {tok.pad_token, tok.bos_token, tok.eos_token, tok.unk_token}
    vectors = np.zeros((len(words), vector_size), dtype=np.float32)
    vocab_rows = np.zeros((len(words), vector_size), dtype=np.float32)
    known = 0
    for i, word in enumerate(words):
        if word in specials:
            continue
        vectors[i] = wv.get_vector(word)
        if word in wv.key_to_index:
            vocab_rows[i] = wv.vectors_vocab[wv.key_to_index[word]]
            known += 1
        else:  # gensim's OOV vector is the n-gram mean; as a word row it gives the same fastText vector
            vocab_rows[i] = vectors[i]
    return vectors, vocab_rows, known
