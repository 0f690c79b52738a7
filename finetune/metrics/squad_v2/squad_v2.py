"""SQuAD v2.0 metric module: EM/F1 with unanswerable questions, HasAns/NoAns breakdown, best thresholds.

Shipped with sesame-lm and loaded by path, offline: ``finetune.metrics.load_metric("squad_v2")``. Inputs in
the format of the hub's ``squad_v2`` module; the scoring is :func:`finetune.metrics.squad_scoring.squad_v2_scores`,
which follows the official v2.0 evaluation script (a question without gold answers is unanswerable; a
prediction whose ``no_answer_probability`` exceeds ``no_answer_threshold`` counts as no answer;
``best_exact``/``best_f1`` at the best threshold on the no-answer scores). The no-answer scores may be
probabilities or the null odds of the QA post-processing (``null_odds.json``).
"""

import evaluate

from finetune.metrics.squad_scoring import metric_info, squad_v2_scores

_CITATION = """\
@inproceedings{rajpurkar2018know,
  title={Know What You Don't Know: Unanswerable Questions for {SQuAD}},
  author={Rajpurkar, Pranav and Jia, Robin and Liang, Percy},
  booktitle={ACL},
  year={2018}
}
"""

_DESCRIPTION = "SQuAD v2.0 exact match and F1 with unanswerable questions (official v2.0 evaluation)."

_KWARGS_DESCRIPTION = """
Args:
    predictions: list of {"id": str, "prediction_text": str ("" = no answer), "no_answer_probability": float}.
    references: list of {"id": str, "answers": {"text": [str, ...], "answer_start": [int, ...]}}
        (empty `text` = unanswerable).
    no_answer_threshold: float, default 1.0 (as the official script): a no-answer score above it means "".
Returns:
    exact, f1 (in [0, 100]), total; HasAns_exact, HasAns_f1, HasAns_total and NoAns_exact, NoAns_f1,
    NoAns_total when present; best_exact, best_exact_thresh, best_f1, best_f1_thresh.
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class SquadV2(evaluate.Metric):
    """SQuAD v2.0 scores."""

    def _info(self):
        return metric_info(_DESCRIPTION, _CITATION, _KWARGS_DESCRIPTION, version_2=True)

    def _compute(self, predictions, references, no_answer_threshold=1.0):
        preds = {p["id"]: p["prediction_text"] for p in predictions}
        na_scores = {p["id"]: p["no_answer_probability"] for p in predictions}
        golds = {r["id"]: list(r["answers"]["text"]) for r in references}
        return squad_v2_scores(preds, golds, na_scores, no_answer_threshold)
