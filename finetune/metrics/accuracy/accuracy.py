"""Accuracy metric module (classification with any number of classes), shipped with sesame-lm.

Loaded by path, offline: ``finetune.metrics.load_metric("accuracy")``. Used for custom classification tasks
(``--train_file`` without a GLUE ``--task_name``), e.g. 3-class NLI. Also reports the macro-averaged F1 over
the classes that occur in predictions or references (scikit-learn), a useful companion on unbalanced sets.
"""

import datasets
import evaluate
from sklearn.metrics import accuracy_score, f1_score

_DESCRIPTION = "Accuracy (fraction of predictions equal to the reference) and macro-averaged F1."

_KWARGS_DESCRIPTION = """
Args:
    predictions: predicted class ids (int).
    references: gold class ids (int).
Returns:
    {"accuracy": float in [0, 1], "macro_f1": float in [0, 1]}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Accuracy(evaluate.Metric):
    """Accuracy and macro F1 of class-id predictions."""

    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}),
            format="numpy",
        )

    def _compute(self, predictions, references):
        return {
            "accuracy": float(accuracy_score(references, predictions)),
            "macro_f1": float(f1_score(references, predictions, average="macro")),
        }
