"""A canonical id order for trained vocabularies, so that the same corpus always gives the same ids.

The ``tokenizers`` trainers break ties between equally frequent pieces (WordPiece merges, WordLevel words) and
order the initial alphabet in hash-map order, which differs between processes (huggingface/tokenizers#1794): two
trainings on the same corpus then hold the same pieces under different ids, and every model trained on them
differs. :func:`canonical_token_order` re-numbers a trained vocabulary by a total order that depends on the
corpus alone: the special tokens first (in their given order), then every other token by decreasing count in
the corpus (as the trained tokenizer itself segments it), ties broken by the token string (Unicode code point
order). Frequent tokens keep low ids, which the log-uniform sampler of the ELMo-style sampled softmax and the
adaptive softmax's clusters expect (Jozefowicz et al. 2016; Grave et al. 2017).

WordPiece and WordLevel segmentation do not depend on ids (greedy longest match / whole-word look-up), so the
re-numbered tokenizer segments every text exactly as the trained one; only the ids change. The counting pass
reads the corpus once more, streaming (memory bounded by one batch of lines plus one count per token).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

import numpy as np

from tokenizer.corpus import iter_text_batches


def count_token_ids(
    backend, files: Iterable[str | os.PathLike], vocab_size: int, batch_size: int = 1000, arg_name: str = "--train_file"
) -> np.ndarray:
    """How often the ``tokenizers.Tokenizer`` ``backend`` produces each id on the corpus ``files``.

    Returns:
        int64 array of shape ``(vocab_size,)``: the count of each id (special tokens are not added).

    Raises:
        InputError: a corpus file cannot be read as UTF-8 text (see :func:`tokenizer.corpus.iter_text_lines`).
    """
    counts = np.zeros(vocab_size, dtype=np.int64)
    for lines in iter_text_batches(files, batch_size=batch_size, arg_name=arg_name):
        ids = [e.ids for e in backend.encode_batch(lines, add_special_tokens=False)]
        flat = np.fromiter((i for seq in ids for i in seq), dtype=np.int64)
        if flat.size:
            counts += np.bincount(flat, minlength=vocab_size)[:vocab_size]
    return counts


def canonical_token_order(vocab: dict[str, int], counts: np.ndarray, special_tokens: Sequence[str]) -> list[str]:
    """Tokens in canonical id order: ``special_tokens`` first, then by (decreasing count, token string).

    Args:
        vocab: token -> id of the trained vocabulary.
        counts: the count of each id on the corpus (:func:`count_token_ids`), indexed by the ids of ``vocab``.
        special_tokens: tokens that keep ids ``0 .. len(special_tokens) - 1`` in this order.

    Returns:
        The tokens; the new id of a token is its position.
    """
    specials = list(special_tokens)
    rest = [t for t in vocab if t not in set(specials)]
    rest.sort(key=lambda t: (-int(counts[vocab[t]]), t))
    return specials + rest
