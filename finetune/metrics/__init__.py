"""Metric modules shipped with sesame-lm, loadable offline by path with ``evaluate.load``.

The hub's metric modules (``evaluate.load("glue", "sst2")``) need the network; these are
``evaluate.Metric`` subclasses in folders laid out like the hub's (``<name>/<name>.py``), loaded from the
installed package by :func:`load_metric`:

========== ============================================================================================
``glue``   per GLUE task (configuration = task name): accuracy, F1, Matthews correlation, Pearson, Spearman
``accuracy`` accuracy and macro F1 of class ids (custom classification tasks)
``squad``  SQuAD v1.1 exact match and F1 (official normalisation), 0-100
``squad_v2`` SQuAD v2.0: + HasAns/NoAns breakdown, best exact/F1 and their no-answer thresholds
========== ============================================================================================

The SQuAD scoring functions themselves are in :mod:`finetune.metrics.squad_scoring`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.errors import InputError

#: Folder holding the metric modules (works from an installed package as from a checkout).
METRICS_DIR = Path(__file__).resolve().parent

#: Names of the shipped metric modules.
METRIC_NAMES: tuple[str, ...] = ("glue", "accuracy", "squad", "squad_v2")


def metric_path(name: str) -> Path:
    """Path of the script of the shipped metric module ``name`` (``.../finetune/metrics/<name>/<name>.py``).

    Raises:
        InputError: for a name that is not a shipped module (lists the valid ones).
    """
    path = METRICS_DIR / name / f"{name}.py"
    if name not in METRIC_NAMES or not path.is_file():
        raise InputError(f"metric {name!r}: not a metric module shipped with sesame-lm; expected one of {METRIC_NAMES}")
    return path


def load_metric(name: str, config_name: str | None = None, **kwargs: Any):
    """Load a shipped metric module with ``evaluate.load`` from its local path (no network access).

    Args:
        name: ``"glue"``, ``"accuracy"``, ``"squad"`` or ``"squad_v2"``.
        config_name: the configuration, e.g. the GLUE task (``"mrpc"``) for ``"glue"``.
        **kwargs: passed to ``evaluate.load`` (``experiment_id``, ``num_process``, ``process_id``, ...).

    Returns:
        An ``evaluate.EvaluationModule``; ``.compute(predictions=..., references=...)`` gives a dict of scores.

    Raises:
        InputError: for an unknown metric name, or a configuration the module does not have.
    """
    import evaluate  # heavy; only when a metric is needed

    path = metric_path(name)
    try:
        return evaluate.load(str(path), config_name, **kwargs)
    except KeyError as err:  # the glue module refuses unknown configurations with a KeyError
        raise InputError(f"metric {name!r}: {err.args[0] if err.args else err}") from None
