"""Extractive span QA (SQuAD v1.1 / v2.0): sliding-window features, span labels, n-best post-processing.

Pre-processing (BERT, Devlin et al., 2019, Sec. 4.2-4.3; the sliding window of the original ``run_squad.py``)
with a *fast* tokenizer's character offsets:

* each example becomes ``[CLS] question [SEP] context [SEP]`` (context first when the tokenizer pads on the
  left; ``<S> question </S> <S> context </S>`` with the word-level ELMo tokenizer, which has offsets but no
  overflowing windows: its windows are cut here over the context's tokens, with the same stride); questions longer than
  ``max_query_length`` tokens are cut to that length; only the context is
  truncated (``"only_second"``), and a long context overflows into several windows ("features") that start
  ``max_seq_length - question - specials - doc_stride`` context tokens apart, so consecutive windows share
  ``doc_stride`` tokens;
* training labels: the token positions of the first gold answer's first and last character
  (``start_positions`` / ``end_positions``); a window that does not contain the whole answer, and every
  window of an unanswerable (v2) question, is labelled with the [CLS] position ("null answer");
* validation features keep ``example_id`` and ``offset_mapping`` (character span of each token in the
  context, ``None`` for question and special tokens) so that spans can be mapped back to the context text.

Post-processing (:func:`postprocess_qa_predictions`) is model- and tokenizer-agnostic: it works from start /
end logits (numpy) and, per feature, ``example_id`` and ``offset_mapping`` -- whatever produced them (a
WordPiece tokenizer's offsets, or a word-level tokenizer's word spans for the ELMo-style QA head). For each
example it gathers all its windows, takes the ``n_best_size`` best start and end positions of each window,
keeps valid spans (both ends inside the context, end >= start, at most ``max_answer_length`` tokens), scores a
span by start + end logit, and maps it back to the context text. SQuAD v2.0: the null score is
``start_logit[CLS] + end_logit[CLS]``, the minimum over the example's windows; the answer is ``""`` when
``null score - best span score > null_score_diff_threshold`` (Devlin et al., 2019, Sec. 4.3), and that
difference is the example's "null odds" (``null_odds.json``, read by the v2.0 evaluation as no-answer scores).
"""

from __future__ import annotations

import collections
import functools
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from core.errors import InputError

#: A no-answer score larger than any real logit difference, for examples without a single valid span.
NO_VALID_SPAN_ODDS = 1e9


def check_window_arguments(tokenizer: Any, max_seq_length: int, doc_stride: int, max_query_length: int) -> None:
    """Check that the window arguments leave room for the context and a smaller stride.

    Raises:
        InputError: when ``max_query_length`` + special tokens leave no context tokens in ``max_seq_length``, or
            ``doc_stride`` is not smaller than the context room of a window with a full-length question.
    """
    if not getattr(tokenizer, "is_fast", False):
        try:
            probe = tokenizer("a", "b", return_offsets_mapping=True, return_token_type_ids=True)
        except (NotImplementedError, TypeError, ValueError):
            probe = {}
        if "offset_mapping" not in probe or "token_type_ids" not in probe:
            raise InputError(
                f"tokenizer {type(tokenizer).__name__}: span QA needs character offsets "
                f"(offset_mapping) and token_type_ids; load a fast tokenizer (AutoTokenizer, use_fast=True)"
            )
    specials = tokenizer.num_special_tokens_to_add(pair=True)
    room = max_seq_length - max_query_length - specials
    if max_query_length < 1 or room < 1:
        raise InputError(
            f"--max_seq_length {max_seq_length} leaves no room for the context after a question of "
            f"--max_query_length {max_query_length} tokens and {specials} special tokens"
        )
    if not 0 <= doc_stride < room:
        raise InputError(
            f"--doc_stride {doc_stride}: must be at least 0 and smaller than the context tokens of a "
            f"window ({room} = --max_seq_length {max_seq_length} - --max_query_length "
            f"{max_query_length} - {specials} special tokens)"
        )


def _truncate_questions(
    questions: list[str],
    ids: Sequence[Any],
    tokenizer: Any,
    max_seq_length: int,
    doc_stride: int,
    max_query_length: int,
) -> list[str]:
    """Cut questions to ``max_query_length`` tokens (at a token's end character); refuse those leaving no room."""
    specials = tokenizer.num_special_tokens_to_add(pair=True)
    encoded = tokenizer(questions, add_special_tokens=False, return_offsets_mapping=True)
    for i, offsets in enumerate(encoded["offset_mapping"]):
        if len(offsets) > max_query_length:
            questions[i] = questions[i][: offsets[max_query_length - 1][1]]
            length = len(tokenizer(questions[i], add_special_tokens=False)["input_ids"])
        else:
            length = len(offsets)
        if length == 0:
            raise InputError(f"question id {ids[i]!r}: the question has no tokens")
        room = max_seq_length - length - specials
        if room < 1 or doc_stride >= room:
            raise InputError(
                f"question id {ids[i]!r}: the question takes {length} tokens (after truncation to "
                f"--max_query_length {max_query_length}), leaving {max(room, 0)} context tokens per "
                f"window of --max_seq_length {max_seq_length}, not more than --doc_stride {doc_stride}; "
                f"raise --max_seq_length or lower --max_query_length / --doc_stride"
            )
    return questions


def _tokenize_windows(
    examples: Mapping[str, Sequence[Any]],
    tokenizer: Any,
    max_seq_length: int,
    doc_stride: int,
    max_query_length: int,
    pad_to_max_length: bool,
) -> tuple[dict[str, list[Any]], list[int], list[list[tuple[int, int]]], list[list[bool]]]:
    """Tokenize a batch of examples into overflowing windows.

    Returns:
        (model inputs per window, example index per window, character offsets into the *context* per token,
        per token whether it is a context token).
    """
    questions = _truncate_questions(
        [q.strip() for q in examples["question"]],
        examples["id"],
        tokenizer,
        max_seq_length,
        doc_stride,
        max_query_length,
    )
    contexts = list(examples["context"])
    if not getattr(tokenizer, "is_fast", False):
        return _word_windows(questions, contexts, tokenizer, max_seq_length, doc_stride, pad_to_max_length)
    context_first = tokenizer.padding_side == "left"
    first, second = (contexts, questions) if context_first else (questions, contexts)
    encoded = tokenizer(
        first,
        second,
        truncation="only_first" if context_first else "only_second",
        max_length=max_seq_length,
        stride=doc_stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        padding="max_length" if pad_to_max_length else False,
    )
    context_id = 0 if context_first else 1
    is_context = [[s == context_id for s in encoded.sequence_ids(i)] for i in range(len(encoded["input_ids"]))]
    sample_map = encoded.pop("overflow_to_sample_mapping")
    offsets = [[tuple(o) for o in row] for row in encoded.pop("offset_mapping")]
    return dict(encoded), list(sample_map), offsets, is_context


def _word_windows(
    questions: list[str],
    contexts: list[str],
    tokenizer: Any,
    max_seq_length: int,
    doc_stride: int,
    pad_to_max_length: bool,
) -> tuple[dict[str, list[Any]], list[int], list[list[tuple[int, int]]], list[list[bool]]]:
    """Windows for a tokenizer without overflowing tokens (e.g. the word-level ELMo tokenizer).

    The context is tokenized alone (with offsets) and cut into spans of at most ``room`` tokens, starting
    ``room - doc_stride`` tokens apart (the last one ends at the context's end), as the fast path does; each
    window's context text is then encoded with the question. The tokenizer must give ``offset_mapping`` and
    ``token_type_ids`` (1 = context).
    """
    specials = tokenizer.num_special_tokens_to_add(pair=True)
    columns: dict[str, list[Any]] = collections.defaultdict(list)
    sample_map: list[int] = []
    all_offsets: list[list[tuple[int, int]]] = []
    all_context: list[list[bool]] = []
    question_lengths = [len(ids) for ids in tokenizer(questions, add_special_tokens=False)["input_ids"]]
    for n, (question, context) in enumerate(zip(questions, contexts)):
        spans = tokenizer(context, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        room = max_seq_length - question_lengths[n] - specials
        step = room - doc_stride
        starts = list(range(0, max(len(spans) - room, 0) + step, step)) if spans else [0]
        for first in starts:
            window = spans[first : first + room]
            begin = window[0][0] if window else 0
            text = context[begin : window[-1][1]] if window else ""
            encoded = tokenizer(
                question,
                text,
                truncation="only_second",
                max_length=max_seq_length,
                return_offsets_mapping=True,
                return_token_type_ids=True,
                padding="max_length" if pad_to_max_length else False,
            )
            offsets = [tuple(o) for o in encoded.pop("offset_mapping")]
            types = encoded["token_type_ids"]
            mask = encoded.get("attention_mask", [1] * len(types))
            flags = [t == 1 and m == 1 and o[1] > o[0] for t, m, o in zip(types, mask, offsets)]
            all_offsets.append([(o[0] + begin, o[1] + begin) if f else o for o, f in zip(offsets, flags)])
            all_context.append(flags)
            sample_map.append(n)
            for key, value in encoded.items():
                columns[key].append(value)
            if first + room >= len(spans):
                break
    return dict(columns), sample_map, all_offsets, all_context


def _cls_index(input_ids: Sequence[int], tokenizer: Any) -> int:
    cls_id = tokenizer.cls_token_id
    return input_ids.index(cls_id) if cls_id is not None and cls_id in input_ids else 0


def _context_span(is_context: Sequence[bool]) -> tuple[int, int]:
    """First and last token index of the context in a window."""
    positions = [i for i, flag in enumerate(is_context) if flag]
    return positions[0], positions[-1]


def answer_token_span(
    offsets: Sequence[tuple[int, int]], context_start: int, context_end: int, start_char: int, end_char: int
) -> tuple[int, int] | None:
    """Token positions of the answer characters ``[start_char, end_char)`` in a window, or ``None``.

    Args:
        offsets: character span of each token of the window.
        context_start / context_end: first and last token index of the context in the window.
        start_char / end_char: the answer's characters in the context (end exclusive).

    Returns:
        ``(start_token, end_token)``: the first context token ending after ``start_char`` and the last one
        starting before ``end_char``; ``None`` when the window does not contain the whole answer.
    """
    if offsets[context_start][0] > start_char or offsets[context_end][1] < end_char:
        return None
    start = next(t for t in range(context_start, context_end + 1) if offsets[t][1] > start_char)
    end = next(t for t in range(context_end, context_start - 1, -1) if offsets[t][0] < end_char)
    return (start, end) if start <= end else None


def prepare_features(
    examples: Mapping[str, Sequence[Any]],
    tokenizer: Any,
    max_seq_length: int = 384,
    doc_stride: int = 128,
    max_query_length: int = 64,
    pad_to_max_length: bool = False,
    *,
    train: bool,
) -> dict[str, list[Any]]:
    """Training or evaluation features of a batch of SQuAD examples (for ``datasets.map(batched=True)``).

    Args:
        examples: columns ``id``, ``question``, ``context``, ``answers`` (``{"text": [...], "answer_start":
            [...]}``; empty = unanswerable; not needed for evaluation) -- the format of :mod:`finetune.squad_data`.
        tokenizer: a fast (offset-mapping) tokenizer.
        max_seq_length: tokens per window, special tokens included.
        doc_stride: tokens shared by consecutive windows of a long context.
        max_query_length: questions are cut to this many tokens.
        pad_to_max_length: pad every window to ``max_seq_length`` (else dynamic padding by the collator).
        train: training features (:data:`prepare_train_features`), else evaluation features
            (:data:`prepare_validation_features`).

    Returns:
        The tokenizer's columns (``input_ids``, ``attention_mask``, [``token_type_ids``]), one row per window,
        plus for training ``start_positions`` / ``end_positions`` (int token indices; the [CLS] index when the
        window does not contain the answer or the question is unanswerable); for evaluation ``example_id`` (the
        example's ``id``), ``offset_mapping`` (``(start_char, end_char)`` of each context token, ``None`` for
        question / special / padding tokens) and ``cls_index`` (position of [CLS], whose logits give the null score).

    Raises:
        InputError: a question that leaves no room for the context (naming its id).
    """
    encoded, sample_map, offset_mapping, is_context = _tokenize_windows(
        examples, tokenizer, max_seq_length, doc_stride, max_query_length, pad_to_max_length
    )
    if not train:
        encoded["example_id"] = [examples["id"][s] for s in sample_map]
        encoded["offset_mapping"] = [
            [o if flag else None for o, flag in zip(offsets, flags)]
            for offsets, flags in zip(offset_mapping, is_context)
        ]
        encoded["cls_index"] = [_cls_index(ids, tokenizer) for ids in encoded["input_ids"]]
        return dict(encoded)
    starts, ends = [], []
    for i, offsets in enumerate(offset_mapping):
        cls = _cls_index(encoded["input_ids"][i], tokenizer)
        answers = examples["answers"][sample_map[i]]
        span = None
        if answers["answer_start"] and any(is_context[i]):
            start_char = answers["answer_start"][0]
            end_char = start_char + len(answers["text"][0])
            context_start, context_end = _context_span(is_context[i])
            span = answer_token_span(offsets, context_start, context_end, start_char, end_char)
        starts.append(span[0] if span else cls)
        ends.append(span[1] if span else cls)
    encoded["start_positions"] = starts
    encoded["end_positions"] = ends
    return dict(encoded)


#: :func:`prepare_features` with ``train=True``: ``start_positions`` / ``end_positions`` per window.
prepare_train_features = functools.partial(prepare_features, train=True)
#: :func:`prepare_features` with ``train=False``: ``example_id``, ``offset_mapping``, ``cls_index`` per window.
prepare_validation_features = functools.partial(prepare_features, train=False)


def _column(rows: Any, key: str, default: Any = None) -> list[Any]:
    """A column of a ``datasets.Dataset`` (read at once) or of a sequence of dicts; ``default`` if absent."""
    if hasattr(rows, "column_names"):
        return list(rows[key]) if key in rows.column_names else [default] * len(rows)
    return [row.get(key, default) if default is not None else row[key] for row in rows]


def _softmax(scores: np.ndarray) -> np.ndarray:
    exp = np.exp(scores - scores.max())
    return exp / exp.sum()


def postprocess_qa_predictions(
    examples: Sequence[Mapping[str, Any]],
    features: Sequence[Mapping[str, Any]],
    start_logits: np.ndarray | Sequence[np.ndarray],
    end_logits: np.ndarray | Sequence[np.ndarray],
    n_best_size: int = 20,
    max_answer_length: int = 30,
    version_2_with_negative: bool = False,
    null_score_diff_threshold: float = 0.0,
) -> tuple[dict[str, str], dict[str, list[dict[str, Any]]], dict[str, float]]:
    """Answer texts from start / end logits of all windows of each example.

    Args:
        examples: rows with ``id`` and ``context`` (a ``datasets.Dataset`` or list of dicts).
        features: one row per window with ``example_id``, ``offset_mapping`` (``(start_char, end_char)`` per
            token, ``None`` outside the context) and optionally ``cls_index`` (default 0).
        start_logits / end_logits: float arrays ``[num_features, seq_len]`` (or one 1-D array per feature),
            in feature order; positions past a feature's ``offset_mapping`` are ignored.
        n_best_size: best start and best end positions tried per window, and answers kept per example.
        max_answer_length: longest answer in tokens (end - start + 1).
        version_2_with_negative: SQuAD v2.0: compare the best span with the null answer.
        null_score_diff_threshold: predict ``""`` when null score - best span score exceeds it.

    Returns:
        ``(predictions, nbest, null_odds)``: ``{id: answer text}`` (``""`` = no answer); ``{id: [{"text",
        "probability", "start_logit", "end_logit", "offsets"}, ...]}`` best first, probabilities a softmax over
        the n-best scores; ``{id: null score - best span score}`` for v2 (empty dict for v1;
        :data:`NO_VALID_SPAN_ODDS` when an example has no valid span).

    Raises:
        ValueError: when the number of features and of logit rows differ, or a feature's example is unknown.
    """
    if len(features) != len(start_logits) or len(features) != len(end_logits):
        raise ValueError(f"{len(features)} features but {len(start_logits)} start / {len(end_logits)} end logit rows")
    feature_ids = _column(features, "example_id")
    feature_offsets = _column(features, "offset_mapping")
    feature_cls = _column(features, "cls_index", default=0)
    windows: dict[str, list[int]] = collections.defaultdict(list)
    for f, qid in enumerate(feature_ids):
        windows[qid].append(f)
    example_ids, contexts = _column(examples, "id"), _column(examples, "context")
    unknown = set(windows) - set(example_ids)
    if unknown:
        raise ValueError(f"features of unknown example ids, e.g. {sorted(unknown)[:3]}")

    predictions: dict[str, str] = {}
    all_nbest: dict[str, list[dict[str, Any]]] = {}
    null_odds: dict[str, float] = {}
    for qid, context in zip(example_ids, contexts):
        candidates: list[dict[str, Any]] = []
        null: dict[str, Any] | None = None
        for f in windows.get(qid, []):
            window_null = _window_candidates(
                np.asarray(start_logits[f], dtype=np.float64),
                np.asarray(end_logits[f], dtype=np.float64),
                feature_offsets[f],
                int(feature_cls[f] or 0),
                n_best_size,
                max_answer_length,
                candidates,
            )
            if null is None or window_null["score"] < null["score"]:
                null = window_null
        candidates.sort(key=lambda c: c["score"], reverse=True)
        all_nbest[qid] = _nbest_entries(candidates, null if version_2_with_negative else None, context, n_best_size)
        best_span = candidates[0] if candidates else None
        best_text = context[best_span["offsets"][0] : best_span["offsets"][1]] if best_span else ""
        if not version_2_with_negative:
            predictions[qid] = best_text
        elif best_span is None or null is None:
            null_odds[qid] = NO_VALID_SPAN_ODDS
            predictions[qid] = ""
        else:
            null_odds[qid] = float(null["score"] - best_span["score"])
            predictions[qid] = "" if null_odds[qid] > null_score_diff_threshold else best_text
    return predictions, all_nbest, null_odds


def _window_candidates(
    starts: np.ndarray,
    ends: np.ndarray,
    offsets,
    cls: int,
    n_best_size: int,
    max_answer_length: int,
    candidates: list[dict[str, Any]],
) -> dict[str, Any]:
    """Add the window's valid spans (the ``n_best_size`` best starts x best ends inside the context, end >= start,
    at most ``max_answer_length`` tokens) to ``candidates``; return its null answer (the ``cls`` position's
    score). ``starts`` / ``ends``: float64 logits of the window's tokens."""
    length = min(len(offsets), len(starts), len(ends))
    best_starts = np.argsort(starts[:length], kind="stable")[::-1][:n_best_size]
    best_ends = np.argsort(ends[:length], kind="stable")[::-1][:n_best_size]
    for s in best_starts:
        if offsets[s] is None:
            continue
        for e in best_ends:
            if offsets[e] is None or e < s or e - s + 1 > max_answer_length:
                continue
            candidates.append(
                {
                    "offsets": (int(offsets[s][0]), int(offsets[e][1])),
                    "score": starts[s] + ends[e],
                    "start_logit": starts[s],
                    "end_logit": ends[e],
                }
            )
    return {"offsets": (0, 0), "score": starts[cls] + ends[cls], "start_logit": starts[cls], "end_logit": ends[cls]}


def _nbest_entries(
    candidates: list[dict[str, Any]], null: dict[str, Any] | None, context: str, n_best_size: int
) -> list[dict[str, Any]]:
    """The n-best answers of an example, best first, with probabilities (a softmax over their scores); with a
    ``null`` answer (v2) it is always among them."""
    nbest = candidates[:n_best_size]
    if null is not None:
        nbest = sorted(nbest + [null], key=lambda c: c["score"], reverse=True)[: max(n_best_size, 1)]
        if not any(c is null for c in nbest):
            nbest[-1] = null  # the null answer is always among the n-best
    texts = ["" if c is null else context[c["offsets"][0] : c["offsets"][1]] for c in nbest]
    probabilities = _softmax(np.array([c["score"] for c in nbest])) if nbest else []
    return [
        {
            "text": t,
            "probability": float(p),
            "start_logit": float(c["start_logit"]),
            "end_logit": float(c["end_logit"]),
            "offsets": list(c["offsets"]),
        }
        for c, t, p in zip(nbest, texts, probabilities)
    ]


def _write_json_atomic(path: Path, data: Any) -> None:
    from core.files import open_atomic

    with open_atomic(path) as f:
        json.dump(data, f, indent=2, ensure_ascii=False)
        f.write("\n")


def write_predictions(
    output_dir: str | os.PathLike,
    predictions: Mapping[str, str],
    nbest: Mapping[str, Any] | None = None,
    null_odds: Mapping[str, float] | None = None,
    prefix: str | None = None,
) -> dict[str, Path]:
    """Write ``predictions.json`` (official format ``{id: answer}``), ``nbest_predictions.json`` and, when
    given (v2), ``null_odds.json`` into ``output_dir``, each file atomically (temporary file, then rename).

    Args:
        prefix: prepended to the file names as ``<prefix>_predictions.json`` (e.g. an eval split name).

    Returns:
        ``{"predictions": path, "nbest": path, "null_odds": path}`` for the files written.
    """
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = (lambda base: f"{prefix}_{base}") if prefix else (lambda base: base)
    written = {"predictions": out / name("predictions.json")}
    _write_json_atomic(written["predictions"], dict(predictions))
    if nbest is not None:
        written["nbest"] = out / name("nbest_predictions.json")
        _write_json_atomic(written["nbest"], dict(nbest))
    if null_odds:
        written["null_odds"] = out / name("null_odds.json")
        _write_json_atomic(written["null_odds"], dict(null_odds))
    return written
