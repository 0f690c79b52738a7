"""GLUE metric module: the scores of each GLUE task, as the benchmark reports them.

An ``evaluate.Metric`` shipped with sesame-lm and loaded by path (the hub's ``glue`` module is unreachable
offline)::

    from finetune.metrics import load_metric
    metric = load_metric("glue", "mrpc")          # = evaluate.load(".../finetune/metrics/glue", "mrpc")
    metric.compute(predictions=[0, 1, 1], references=[0, 1, 0])   # {'accuracy': 0.667, 'f1': 0.667}

Per task (Wang et al., 2019, GLUE, Table 1): ``cola`` Matthews correlation; ``sst2``, ``mnli``
(``mnli_matched``, ``mnli_mismatched``, ``ax``), ``qnli``, ``rte``, ``wnli``, ``hans`` accuracy; ``mrpc`` and
``qqp`` accuracy and F1 of the positive class (id 1); ``stsb`` Pearson and Spearman correlation. Scores are
fractions in [0, 1] (correlations in [-1, 1]); computed with scikit-learn and scipy.
"""

import datasets
import evaluate
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

_CITATION = """\
@inproceedings{wang2019glue,
  title={{GLUE}: A Multi-Task Benchmark and Analysis Platform for Natural Language Understanding},
  author={Wang, Alex and Singh, Amanpreet and Michael, Julian and Hill, Felix and Levy, Omer and Bowman, Samuel R.},
  booktitle={International Conference on Learning Representations},
  year={2019}
}
"""

_DESCRIPTION = "Scores of the GLUE benchmark tasks (accuracy, F1, Matthews correlation, Pearson, Spearman)."

_KWARGS_DESCRIPTION = """
Args:
    predictions: predicted class ids (int), or scores (float) for stsb.
    references: gold class ids (int), or gold scores (float) for stsb.
Returns: depending on the configuration (the task):
    cola: {"matthews_correlation"}; sst2, mnli, mnli_matched, mnli_mismatched, ax, qnli, rte, wnli, hans:
    {"accuracy"}; mrpc, qqp: {"accuracy", "f1"}; stsb: {"pearson", "spearmanr"}.
"""

#: Configuration name -> metrics computed.
TASK_METRICS = {
    "cola": ("matthews_correlation",),
    "sst2": ("accuracy",),
    "mnli": ("accuracy",),
    "mnli_matched": ("accuracy",),
    "mnli_mismatched": ("accuracy",),
    "ax": ("accuracy",),
    "qnli": ("accuracy",),
    "rte": ("accuracy",),
    "wnli": ("accuracy",),
    "hans": ("accuracy",),
    "mrpc": ("accuracy", "f1"),
    "qqp": ("accuracy", "f1"),
    "stsb": ("pearson", "spearmanr"),
}

_SCORERS = {
    "accuracy": lambda p, r: float(accuracy_score(r, p)),
    "f1": lambda p, r: float(f1_score(r, p)),
    "matthews_correlation": lambda p, r: float(matthews_corrcoef(r, p)),
    "pearson": lambda p, r: float(pearsonr(p, r)[0]),
    "spearmanr": lambda p, r: float(spearmanr(p, r)[0]),
}


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Glue(evaluate.Metric):
    """The GLUE scores of one task; the configuration name is the task (see ``TASK_METRICS``)."""

    def _info(self):
        if self.config_name not in TASK_METRICS:
            raise KeyError(
                f"glue metric: unknown configuration {self.config_name!r}; expected one of {sorted(TASK_METRICS)}"
            )
        dtype = "float64" if self.config_name == "stsb" else "int64"
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Value(dtype), "references": datasets.Value(dtype)}),
            format="numpy",
        )

    def _compute(self, predictions, references):
        return {name: _SCORERS[name](predictions, references) for name in TASK_METRICS[self.config_name]}
