"""Initialise a baseline's embeddings from word vectors written by ``python -m tokenizer vectors``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

#: Files that ``python -m tokenizer vectors`` (:mod:`tokenizer.vectors`) writes next to the tokenizer.
VECTORS_FILE, VECTORS_CONFIG = "word_vectors.safetensors", "word_vectors.json"


def load_word_vectors(model, path: str | os.PathLike, vocab: list[str] | None = None) -> dict:
    """Copy the vectors of the folder ``path`` into the embeddings of a SesameBaseline model, in place.

    cbow / cnn / rnn / treelstm: the word embedding (and the static channel of a multichannel CNN) get
    ``vectors`` (each word's fastText vector). fasttext: the word embedding gets ``vectors_vocab`` and the
    n-gram embedding ``vectors_ngrams``, so that the model's word vectors equal gensim's ``wv[word]``.

    Args:
        model: a :class:`~modeling.baselines.SesameBaselineModel` or a head holding one (``.baseline``).
        path: the folder (``word_vectors.safetensors``, ``word_vectors.json``, ``vocab.txt``).
        vocab: the model's tokenizer vocabulary (id order); when given it must equal the folder's.

    Returns:
        The folder's ``word_vectors.json`` settings.

    Raises:
        ValueError: the folder's vocabulary, vector size, n-gram lengths or buckets differ from the model's.
        FileNotFoundError: the folder lacks the vectors files.
    """
    from safetensors.torch import load_file

    folder = Path(path)
    info = json.loads((folder / VECTORS_CONFIG).read_text(encoding="utf-8"))
    tensors = load_file(str(folder / VECTORS_FILE))
    base = getattr(model, "baseline", model)
    config, emb = base.config, base.embeddings
    with open(folder / "vocab.txt", encoding="utf-8") as f:  # as the tokenizer reads it (not str.splitlines: \x1c..)
        words = [line.rstrip("\n") for line in f]
    if vocab is not None and list(vocab) != words:
        raise ValueError(
            f"{folder}: its vocabulary ({len(words)} words) differs from the model's tokenizer "
            f"({len(vocab)}); expected vectors trained for the same word tokenizer"
        )
    if tensors["vectors"].shape != (config.vocab_size, config.embedding_dim):
        raise ValueError(
            f"{folder}: vectors of shape {tuple(tensors['vectors'].shape)}; the model expects "
            f"(vocab_size, embedding_dim) = ({config.vocab_size}, {config.embedding_dim})"
        )
    with torch.no_grad():
        if config.encoder_type == "fasttext":
            if (info["min_n"], info["max_n"], info["bucket"]) != (
                config.ngram_min_n,
                config.ngram_max_n,
                config.ngram_buckets,
            ):
                raise ValueError(
                    f"{folder}: n-grams {info['min_n']}..{info['max_n']} in {info['bucket']} buckets; the model "
                    f"has {config.ngram_min_n}..{config.ngram_max_n} in {config.ngram_buckets}"
                )
            emb.word_embeddings.weight.copy_(tensors["vectors_vocab"])
            emb.ngram_embeddings.weight.copy_(tensors["vectors_ngrams"])
        else:
            emb.word_embeddings.weight.copy_(tensors["vectors"])
            if emb.static_embeddings is not None:
                emb.static_embeddings.weight.copy_(tensors["vectors"])
    return info
