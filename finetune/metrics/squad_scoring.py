"""SQuAD answer scoring: answer normalisation, exact match, token F1, v2 no-answer thresholds.

Follows the official evaluation scripts of SQuAD v1.1 (Rajpurkar et al., 2016) and v2.0 (Rajpurkar, Jia &
Liang, 2018; https://rajpurkar.github.io/SQuAD-explorer/), written anew here:

* an answer is *normalised* by lower-casing, removing ASCII punctuation (``string.punctuation``), removing the
  articles "a", "an", "the" as whole words, and collapsing whitespace;
* **exact match** (EM) is 1 when the normalised prediction equals a normalised gold answer;
* **F1** is the harmonic mean of precision and recall of the bag of normalised tokens shared by prediction and
  gold answer; both scores take the maximum over the gold answers and are averaged over questions, x 100;
* SQuAD v2.0: a question with no (non-empty) gold answer is unanswerable, its only gold answer is ``""``; a
  prediction whose no-answer score exceeds ``no_answer_threshold`` counts as ``""``; the report splits
  ``HasAns_*`` / ``NoAns_*`` and gives ``best_exact`` / ``best_f1``, the scores at the best threshold on the
  no-answer scores, with that threshold (``best_*_thresh``).

The no-answer scores may be probabilities or the null odds written by the QA post-processing
(``score_null - best_span_score``, ``null_odds.json``): the official workflow passes ``null_odds.json`` as the
"na_prob" file and reads ``best_f1_thresh`` back as ``--null_score_diff_threshold``.

Used by the shipped evaluate modules ``finetune/metrics/squad`` and ``finetune/metrics/squad_v2``.
"""

from __future__ import annotations

import collections
import re
import string
from collections.abc import Mapping, Sequence

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def metric_info(description: str, citation: str, inputs: str, version_2: bool):
    """The ``evaluate.MetricInfo`` of the squad / squad_v2 metric modules, with the hub modules' input format:
    predictions ``{"id", "prediction_text"}`` (+ ``"no_answer_probability"`` for v2); references
    ``{"id", "answers": {"text": [...], "answer_start": [...]}}``.
    """
    import datasets
    import evaluate

    prediction = {"id": datasets.Value("string"), "prediction_text": datasets.Value("string")}
    if version_2:
        prediction["no_answer_probability"] = datasets.Value("float64")
    answers = datasets.Sequence({"text": datasets.Value("string"), "answer_start": datasets.Value("int32")})
    features = datasets.Features(
        {"predictions": prediction, "references": {"id": datasets.Value("string"), "answers": answers}}
    )
    return evaluate.MetricInfo(description=description, citation=citation, inputs_description=inputs, features=features)


def normalize_answer(text: str) -> str:
    """Official SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gold: str) -> int:
    """1 if the normalised prediction equals the normalised gold answer, else 0."""
    return int(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str) -> float:
    """Token-overlap F1 in [0, 1] between normalised prediction and gold answer.

    When either side normalises to no tokens, the score is 1 if both do and 0 otherwise (SQuAD v2.0 rule;
    this only matters for empty answers).
    """
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)
    shared = sum((collections.Counter(pred_tokens) & collections.Counter(gold_tokens)).values())
    if shared == 0:
        return 0.0
    precision = shared / len(pred_tokens)
    recall = shared / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def best_over_golds(prediction: str, golds: Sequence[str]) -> tuple[int, float]:
    """(EM, F1) of ``prediction``, each the maximum over the gold answers ``golds`` (non-empty list)."""
    return max(exact_match(prediction, g) for g in golds), max(token_f1(prediction, g) for g in golds)


def squad_v1_scores(predictions: Mapping[str, str], references: Mapping[str, Sequence[str]]) -> dict[str, float]:
    """SQuAD v1.1 scores over the questions of ``references``.

    Args:
        predictions: question id -> predicted answer text; a question without prediction scores 0.
        references: question id -> gold answer texts (at least one).

    Returns:
        ``{"exact_match": EM, "f1": F1}``, each in [0, 100].
    """
    em_total = f1_total = 0.0
    for qid, golds in references.items():
        if qid not in predictions:
            continue
        em, f1 = best_over_golds(predictions[qid], list(golds))
        em_total += em
        f1_total += f1
    n = max(len(references), 1)
    return {"exact_match": 100.0 * em_total / n, "f1": 100.0 * f1_total / n}


def _best_threshold(
    predictions: Mapping[str, str],
    scores: Mapping[str, float],
    na_scores: Mapping[str, float],
    has_answer: Mapping[str, bool],
) -> tuple[float, float]:
    """Best total score (x 100 / questions) over no-answer thresholds, and the threshold that gives it.

    Start with the threshold below every no-answer score (every question answered ``""``: each unanswerable
    one is right), then raise it past the questions in increasing no-answer score; each question passed keeps
    its span prediction: + its score if answerable, -1 if unanswerable and the span is non-empty.
    """
    current = best = float(sum(1 for qid in scores if not has_answer[qid]))
    best_thresh = 0.0
    for qid in sorted(na_scores, key=lambda q: na_scores[q]):
        if qid not in scores:
            continue
        if has_answer[qid]:
            current += scores[qid]
        elif predictions[qid]:
            current -= 1
        if current > best:
            best, best_thresh = current, na_scores[qid]
    return 100.0 * best / max(len(scores), 1), best_thresh


def squad_v2_scores(
    predictions: Mapping[str, str],
    references: Mapping[str, Sequence[str]],
    no_answer_scores: Mapping[str, float] | None = None,
    no_answer_threshold: float = 1.0,
) -> dict[str, float]:
    """SQuAD v2.0 scores, as the official v2.0 evaluation script reports them.

    Args:
        predictions: question id -> predicted answer text (``""`` = no answer); a question without prediction
            counts as answered ``""``.
        references: question id -> gold answer texts; none (or only empty ones) = unanswerable.
        no_answer_scores: question id -> no-answer probability or null odds (higher = more likely
            unanswerable); missing ids (or ``None``) count as 0.
        no_answer_threshold: a prediction whose no-answer score is above this counts as ``""``.

    Returns:
        ``exact``, ``f1`` (0-100), ``total``; ``HasAns_exact/f1/total`` and ``NoAns_exact/f1/total`` when such
        questions exist; ``best_exact``, ``best_exact_thresh``, ``best_f1``, ``best_f1_thresh``.
    """
    na_scores = {qid: float((no_answer_scores or {}).get(qid, 0.0)) for qid in references}
    has_answer: dict[str, bool] = {}
    exact_raw: dict[str, float] = {}
    f1_raw: dict[str, float] = {}
    preds: dict[str, str] = {}
    for qid, golds in references.items():
        golds = [g for g in golds if normalize_answer(g)]
        has_answer[qid] = bool(golds)
        preds[qid] = predictions.get(qid, "")
        exact_raw[qid], f1_raw[qid] = best_over_golds(preds[qid], golds or [""])

    def thresholded(raw: Mapping[str, float]) -> dict[str, float]:
        return {qid: float(not has_answer[qid]) if na_scores[qid] > no_answer_threshold else raw[qid] for qid in raw}

    exact, f1 = thresholded(exact_raw), thresholded(f1_raw)

    def summary(qids: list[str], prefix: str) -> dict[str, float]:
        n = len(qids)
        return {
            f"{prefix}exact": 100.0 * sum(exact[q] for q in qids) / max(n, 1),
            f"{prefix}f1": 100.0 * sum(f1[q] for q in qids) / max(n, 1),
            f"{prefix}total": n,
        }

    result = summary(list(references), "")
    has_qids = [q for q in references if has_answer[q]]
    no_qids = [q for q in references if not has_answer[q]]
    if has_qids:
        result.update(summary(has_qids, "HasAns_"))
    if no_qids:
        result.update(summary(no_qids, "NoAns_"))
    result["best_exact"], result["best_exact_thresh"] = _best_threshold(preds, exact_raw, na_scores, has_answer)
    result["best_f1"], result["best_f1_thresh"] = _best_threshold(preds, f1_raw, na_scores, has_answer)
    return result
