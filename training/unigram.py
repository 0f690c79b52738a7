"""The unigram plateau of masked-LM pretraining: the held-out loss of predicting every masked token from the training
token frequencies alone, the level a model must get below before its encoder carries anything about its input.

Why ``pretrain`` checks it: a model that ends on the plateau has learned to give the unigram distribution whatever
the input, and its encoder's output carries no information for a task. Measured on bert-mini pretrained 150 steps on
2 MB of news (held-out loss 7.09): a logistic-regression probe on its last layer scores 0.509 on SST-2 (the majority
class; its embedding layer 0.628, a random initialisation's last layer 0.635), and fine-tuning it stays at the
majority class at learning rates 1e-4 to 1e-3 where a random initialisation reaches 0.616.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

#: A model whose held-out MLM loss is not at least this many nats below the unigram loss "has not left the plateau".
#: bert-tiny on the time-to-quality benchmark was 0.33 nats below it after one token per parameter.
PLATEAU_MARGIN = 0.1

#: Training tokens counted for the frequencies (evenly spaced blocks): enough for a stable estimate, cheap on a big
#: corpus.
MAX_COUNTED_TOKENS = 5_000_000


def token_counts(blocks: Iterable[Sequence[int]], vocab_size: int, special_ids: Iterable[int]) -> np.ndarray:
    """Counts ``(V,)`` int64 of every non-special token id in ``blocks`` (sequences of ids; ids >= ``vocab_size``
    are dropped); special ids count 0."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for ids in blocks:
        counts += np.bincount(np.asarray(ids, dtype=np.int64), minlength=vocab_size)[:vocab_size]
    counts[list(special_ids)] = 0
    return counts


def unigram_loss(counts, labels, special_ids: Iterable[int], alpha: float = 1.0) -> float:
    """Mean cross-entropy (nats) of predicting each label from the unigram distribution of ``counts``.

    p(t) = (counts[t] + alpha) / sum over non-special t' of (counts[t'] + alpha) (add-alpha smoothing); special ids
    get no mass. ``labels``: token ids, -100 ignored.

    Raises:
        ValueError: no label to score.
    """
    smoothed = np.asarray(counts, dtype=np.float64) + alpha
    smoothed[list(special_ids)] = 0.0
    logp = np.log(np.where(smoothed > 0, smoothed, 1.0) / smoothed.sum())
    labels = np.asarray(labels, dtype=np.int64).reshape(-1)
    labels = labels[labels != -100]
    if labels.size == 0:
        raise ValueError("unigram_loss: no label to score (every label is -100)")
    return float(-logp[labels].mean())


def training_token_counts(train_blocks, tokenizer, max_tokens: int = MAX_COUNTED_TOKENS) -> np.ndarray | None:
    """Counts ``(len(tokenizer),)`` int64 of the non-special tokens of up to ``max_tokens`` training tokens (evenly
    spaced blocks of ``train_blocks``, a ``datasets.Dataset`` with an ``input_ids`` column); None without blocks."""
    special = set(tokenizer.all_special_ids)
    n = len(train_blocks)
    if n == 0:
        return None
    width = max(1, len(train_blocks[0]["input_ids"]))
    take = min(n, max(1, max_tokens // width))
    sample = (
        train_blocks.select(np.linspace(0, n - 1, take).round().astype(np.int64).tolist()) if take < n else train_blocks
    )
    return sum(token_counts(b["input_ids"], len(tokenizer), special) for b in sample.iter(batch_size=4096))


#: Training tokens counted at most from the start of a stream (``--streaming``; read again by the training loader).
MAX_STREAMED_COUNTED_TOKENS = 1_000_000


def streamed_token_counts(stream, tokenizer, max_tokens: int = MAX_STREAMED_COUNTED_TOKENS) -> np.ndarray | None:
    """Counts ``(len(tokenizer),)`` int64 of the non-special tokens of the first blocks of ``stream`` (an iterable of
    ``{"input_ids": [...]}`` blocks, e.g. a ``datasets.IterableDataset``; read through ``take`` when it has one, so
    the stream itself is not advanced), up to ``max_tokens`` tokens; None when the stream gives no block."""
    special = set(tokenizer.all_special_ids)
    counts, seen = np.zeros(len(tokenizer), dtype=np.int64), 0
    blocks = stream.take(max_tokens) if hasattr(stream, "take") else stream  # at most one block per token
    for block in blocks:
        ids = block["input_ids"]
        counts += token_counts([ids], len(tokenizer), special)
        seen += len(ids)
        if seen >= max_tokens:
            break
    return counts if seen else None


def heldout_unigram_loss(train_blocks, valid_blocks, tokenizer, max_tokens: int = MAX_COUNTED_TOKENS, counts=None):
    """The unigram loss of the held-out blocks' non-special tokens under the training blocks' frequencies.

    Masking picks the predicted tokens uniformly among the non-special ones, so the mean over all of them is the
    expected unigram loss of the masked positions (whole-word masking: close to it).

    Args:
        train_blocks / valid_blocks: ``datasets.Dataset`` with an ``input_ids`` column (packed blocks).
        tokenizer: gives the vocabulary size and the special ids.
        max_tokens: training tokens counted at most (evenly spaced blocks).
        counts: the training counts, when made already (``train_blocks`` is then not read).

    Returns:
        Nats, or None when either side has no non-special token.
    """
    special, vocab = set(tokenizer.all_special_ids), len(tokenizer)
    if counts is None:
        counts = training_token_counts(train_blocks, tokenizer, max_tokens)
    if counts is None or len(valid_blocks) == 0:
        return None
    held = [np.asarray(ids, dtype=np.int64) for b in valid_blocks.iter(batch_size=4096) for ids in b["input_ids"]]
    labels = np.concatenate(held) if held else np.zeros(0, dtype=np.int64)
    labels = labels[~np.isin(labels, list(special)) & (labels < vocab)]
    if counts.sum() == 0 or labels.size == 0:
        return None
    return unigram_loss(counts, labels, special)


def log_unigram_bias(counts, size: int, alpha: float = 1.0) -> np.ndarray:
    """An output-layer bias ``(size,)`` float64 whose softmax is the add-``alpha`` unigram distribution of ``counts``
    over all ``size`` ids: ``log(counts[t] + alpha)`` minus its mean over the ``len(counts)`` ids (softmax ignores
    the shift; centred values stay near 0). Ids with no count (special tokens, whose counts
    :func:`token_counts` zeroes, and ids past ``len(counts)``) get the value of an unseen token, ``log(alpha)``.

    A fresh MLM head with this bias predicts the unigram distribution from its first step, so the encoder does not
    have to collapse its token states onto one vector to get there (the prior initialisation of Lin et al. 2017,
    "Focal Loss for Dense Object Detection", section 4.1; measured on bert-mini: docs/pretraining.md).

    Raises:
        ValueError: ``size`` smaller than ``len(counts)``, or ``alpha`` not > 0.
    """
    counts = np.asarray(counts, dtype=np.float64)
    if size < counts.size or not alpha > 0:
        raise ValueError(f"log_unigram_bias: size {size} < {counts.size} counts, or alpha {alpha} not > 0")
    logp = np.log(counts + alpha)
    bias = np.full(size, np.log(alpha))
    bias[: counts.size] = logp
    return bias - logp.mean()


def plateau_message(eval_loss: float, unigram: float, margin: float = PLATEAU_MARGIN) -> str | None:
    """What to tell the user when a held-out MLM loss ``eval_loss`` (nats) is not ``margin`` below the unigram loss
    ``unigram``; None when it is."""
    if eval_loss < unigram - margin:
        return None
    return (
        f"the model has not left the unigram plateau: held-out loss {eval_loss:.3f} against {unigram:.3f} from the "
        "training word frequencies alone; it predicts the same distribution whatever its input, and its encoder's "
        "output carries almost nothing about the text (fine-tuning it can do worse than a random initialisation, "
        "e.g. the majority class). Train longer (--num_train_epochs, --max_train_tokens, more data) or pick a "
        "smaller --config_name"
    )


@dataclasses.dataclass(frozen=True)
class UnigramPlateau:
    """The unigram plateau of one pretraining run, from plain values: the output bias a fresh model starts from, the
    log lines and the end-of-run message.

    Attributes:
        counts: ``(V,)`` int64, the training tokens per id (special ids 0), counted once (:meth:`count`).
        streamed: the counts are of the first tokens of a stream (``--streaming``).
        heldout_loss: the held-out unigram loss in nats (:meth:`with_heldout`; None: not measured, or no token).
    """

    counts: np.ndarray
    streamed: bool = False
    heldout_loss: float | None = None

    @classmethod
    def count(cls, train_blocks, tokenizer, streamed: bool) -> UnigramPlateau | None:
        """The counts of ``train_blocks`` (a stream: :func:`streamed_token_counts`, else
        :func:`training_token_counts`; the same blocks give the same counts on every process); None without a block."""
        counts = (streamed_token_counts if streamed else training_token_counts)(train_blocks, tokenizer)
        return None if counts is None else cls(counts, streamed)

    def with_heldout(self, valid_blocks, tokenizer) -> UnigramPlateau:
        """A copy with :attr:`heldout_loss` measured on ``valid_blocks`` (:func:`heldout_unigram_loss`)."""
        return dataclasses.replace(
            self, heldout_loss=heldout_unigram_loss(None, valid_blocks, tokenizer, counts=self.counts)
        )

    def output_bias(self, size: int) -> np.ndarray:
        """The output-layer bias ``(size,)`` float64 of the log unigram frequencies (:func:`log_unigram_bias`)."""
        return log_unigram_bias(self.counts, size)

    def bias_line(self) -> str:
        """The log line of a model whose output bias starts at :meth:`output_bias`."""
        source = f"the first {int(self.counts.sum())} streamed" if self.streamed else "the"
        return f"output bias: log unigram frequencies of {source} training tokens (--output_bias_init unigram)"

    def log_line(self) -> str | None:
        """The log line of the plateau a model must get below (None: not measured)."""
        if self.heldout_loss is None:
            return None
        return (
            f"unigram plateau: held-out loss {self.heldout_loss:.3f} from the training word frequencies alone "
            f"(perplexity {math.exp(self.heldout_loss):.4g}); the model's held-out loss must get below it before its "
            "encoder says anything about its input"
        )

    def results(self) -> dict[str, float]:
        """``{"unigram_loss": nats}`` for ``all_results.json`` (empty: not measured)."""
        return {} if self.heldout_loss is None else {"unigram_loss": self.heldout_loss}

    def end_message(self, result) -> str | None:
        """The warning for a run whose result's ``eval_loss`` is still on the plateau (:func:`plateau_message`);
        None when it left it, or without a held-out loss on either side."""
        if self.heldout_loss is None or "eval_loss" not in result:
            return None
        return plateau_message(result["eval_loss"], self.heldout_loss)


def backbone_plateau_message(model_name_or_path: str | os.PathLike) -> str | None:
    """For a fine-tuning script: a warning when a local model folder was pretrained by ``pretrain`` and ended on the
    unigram plateau (its ``all_results.json`` has ``eval_loss`` and ``unigram_loss``, the first not
    :data:`PLATEAU_MARGIN` below the second); None otherwise (a hub id, a folder without those results, a model off
    the plateau, an unreadable file). Also a warning when its pretraining reported its held-out loss over 0 tokens
    (``eval_tokens`` 0: text with nothing to predict, refused since issue 43), whose perplexity 1 means nothing."""
    path = Path(model_name_or_path) / "all_results.json"
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if isinstance(results, dict) and results.get("eval_tokens") == 0:
        return (
            f"{model_name_or_path} reported its pretraining's held-out loss over 0 tokens (eval_tokens 0 in "
            f"{path}: every held-out token was a special token), so its eval_loss {results.get('eval_loss')} and "
            f"perplexity {results.get('perplexity')} say nothing about it; pretrain it again on text with words"
        )
    try:
        eval_loss, unigram = float(results["eval_loss"]), float(results["unigram_loss"])
    except (ValueError, KeyError, TypeError):
        return None
    if plateau_message(eval_loss, unigram) is None:
        return None
    return (
        f"{model_name_or_path} ended its pretraining on the unigram plateau (held-out loss {eval_loss:.3f} against "
        f"{unigram:.3f} from word frequencies alone): its encoder's output carries almost nothing about the text, "
        "and fine-tuning it is likely to end at the majority class (a bert-mini on the plateau did, where a random "
        "initialisation learned); pretrain it longer first"
    )


__all__ = [
    "MAX_COUNTED_TOKENS",
    "backbone_plateau_message",
    "PLATEAU_MARGIN",
    "UnigramPlateau",
    "heldout_unigram_loss",
    "log_unigram_bias",
    "plateau_message",
    "token_counts",
    "training_token_counts",
    "unigram_loss",
]
