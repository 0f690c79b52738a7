"""SQuAD v1.1 metric module: exact match and F1 after the official answer normalisation.

Shipped with sesame-lm and loaded by path, offline: ``finetune.metrics.load_metric("squad")``. Inputs in the
format of the hub's ``squad`` module; the scoring itself is :mod:`finetune.metrics.squad_scoring` (official
normalisation: lower case, no punctuation, no articles, single spaces; max over gold answers; x 100).
"""

import evaluate

from finetune.metrics.squad_scoring import metric_info, squad_v1_scores

_CITATION = """\
@inproceedings{rajpurkar2016squad,
  title={{SQuAD}: 100,000+ Questions for Machine Comprehension of Text},
  author={Rajpurkar, Pranav and Zhang, Jian and Lopyrev, Konstantin and Liang, Percy},
  booktitle={EMNLP},
  year={2016}
}
"""

_DESCRIPTION = "SQuAD v1.1 exact match and token F1 (official normalisation), in [0, 100]."

_KWARGS_DESCRIPTION = """
Args:
    predictions: list of {"id": str, "prediction_text": str}.
    references: list of {"id": str, "answers": {"text": [str, ...], "answer_start": [int, ...]}}.
Returns:
    {"exact_match": float in [0, 100], "f1": float in [0, 100]} over the questions of `references`
    (a question without prediction scores 0).
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Squad(evaluate.Metric):
    """SQuAD v1.1 exact match and F1."""

    def _info(self):
        return metric_info(_DESCRIPTION, _CITATION, _KWARGS_DESCRIPTION, version_2=False)

    def _compute(self, predictions, references):
        preds = {p["id"]: p["prediction_text"] for p in predictions}
        golds = {r["id"]: list(r["answers"]["text"]) for r in references}
        return squad_v1_scores(preds, golds)
