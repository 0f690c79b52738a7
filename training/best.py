"""Best model and early stopping: which evaluation was best, and when to stop for lack of improvement.

Each evaluation after step 0 updates ``best_metric`` / ``best_step`` of ``metric_for_best_model`` (default
``eval_loss``; lower is better for losses and perplexities, as transformers' ``Trainer``) and counts the evaluations
without improvement, all in the run's :class:`training.state.TrainerState` (so a resumed run keeps it).
``early_stopping_patience`` N ends training after N evaluations in a row without improvement.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from core.errors import InputError
from training.config import TrainingConfig, best_metric_name, greater_is_better
from training.state import TrainerState


def update_best(state: TrainerState, config: TrainingConfig, metrics: Mapping[str, float], step: int) -> None:
    """Record the evaluation ``metrics`` of optimizer step ``step`` in the best-model bookkeeping of ``state``.

    The evaluation before the first step is no candidate (there is no checkpoint of it); a non-finite value never
    improves.

    Raises:
        InputError: ``metric_for_best_model`` is not among ``metrics`` while it matters (with
            ``load_best_model_at_end``, ``early_stopping_patience`` or an explicit ``metric_for_best_model``).
    """
    name = best_metric_name(config)
    if name not in metrics:
        if config.load_best_model_at_end or config.early_stopping_patience or config.metric_for_best_model:
            raise InputError(
                f"--metric_for_best_model {config.metric_for_best_model or name}: not among the "
                f"evaluation metrics {sorted(metrics)}; expected one of them"
            )
        return
    if step == 0:
        return
    value, best = metrics[name], state.best_metric
    better = greater_is_better(config)
    if math.isfinite(value) and (best is None or (value > best if better else value < best)):
        state.best_metric, state.best_step, state.evals_without_improvement = value, step, 0
    else:
        state.evals_without_improvement += 1


def should_stop_early(state: TrainerState, config: TrainingConfig) -> bool:
    """True once ``early_stopping_patience`` evaluations in a row brought no improvement."""
    patience = config.early_stopping_patience
    return bool(patience) and state.evals_without_improvement >= patience


__all__ = ["should_stop_early", "update_best"]
