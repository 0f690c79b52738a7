"""The training state: what a checkpoint's ``trainer_state.json`` records, as one dataclass.

:class:`TrainerState` holds the position in the run (optimizer step, epoch, micro-batches consumed in the epoch),
the running loss sums, the run geometry a resume is checked against, the evaluation history and the best-model
bookkeeping, the run id and what a resume is compared with (the training data's fingerprint, the optimizer
settings, the model's architecture), and the log history. :meth:`TrainerState.state_dict` gives the JSON keys of
``trainer_state.json`` (keys are only ever added: a checkpoint of an older version lacks the newer ones),
:meth:`TrainerState.load_resumed` takes them back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

#: ``trainer_state.json`` keys restored on resume (the geometry keys are checked instead, the position in the
#: epoch is converted from examples).
RESUMED_KEYS = (
    "global_step",
    "epoch",
    "loss_sum",
    "weight_sum",
    "eval_history",
    "nonfinite_skipped",
    "best_metric",
    "best_step",
    "evals_without_improvement",
    "log_history",
    "eval_pending",
)


@dataclasses.dataclass
class TrainerState:
    """The loop's state (see the module docstring); field order = key order of ``trainer_state.json``."""

    global_step: int = 0
    """Optimizer steps taken (skipped non-finite steps included)."""
    epoch: int = 0
    """Epochs completed (the current epoch's index)."""
    batches_in_epoch: int = 0
    """Micro-batches per process consumed in the current epoch."""
    loss_sum: float = 0.0
    """Sum over the run of loss x items (finite steps only), for the run's mean training loss."""
    weight_sum: float = 0.0
    """Items (predicted tokens, examples) the loss sum counts."""
    max_train_steps: int = 0
    num_processes: int = 1
    gradient_accumulation_steps: int = 1
    per_device_train_batch_size: int = 1
    num_train_examples: int | None = None
    """Training set size (None: a stream)."""
    eval_history: list[dict[str, float]] = dataclasses.field(default_factory=list)
    """``{"step": N, metric: value, ...}`` per evaluation."""
    nonfinite_skipped: int = 0
    """Optimizer steps skipped for a NaN/inf loss or gradient norm."""
    best_metric: float | None = None
    best_step: int | None = None
    evals_without_improvement: int = 0
    run_id: str | None = None
    """The run that wrote the checkpoint (:mod:`training.ownership`); None outside a claimed output folder."""
    data_fingerprint: list[dict[str, Any]] | None = None
    """What the training data is made of (:func:`training.data.fingerprint_sources`), compared on resume."""
    optimizer_settings: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The optimizer and schedule settings (learning rate, betas, ...), compared on resume."""
    model_config: dict[str, Any] | None = None
    """The model's architecture (:func:`training.checkpointer.model_architecture`), compared on resume; None: a
    model without a ``config``."""
    log_history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """``{"step": N, "train_loss": ..., ...}`` per logging step (``trainer_log.json``), kept across resumes."""
    eval_pending: bool = False
    """The evaluation of ``global_step`` was interrupted by a stop request: a resume runs it first."""

    def state_dict(self) -> dict[str, Any]:
        """The ``trainer_state.json`` content (a deep copy)."""
        return dataclasses.asdict(self)

    def load_resumed(self, saved: Mapping[str, Any]) -> None:
        """Take the :data:`RESUMED_KEYS` present in a checkpoint's ``saved`` state."""
        for key in RESUMED_KEYS:
            if key in saved:
                setattr(self, key, saved[key])

    def consume(self, micro_batches: int, per_epoch_batches: int | None) -> bool:
        """Count ``micro_batches`` of the current epoch as consumed; True when that ends the epoch (the state then
        points at the start of the next one). ``per_epoch_batches`` is None for a stream (its end is found when it
        gives no more batches)."""
        self.batches_in_epoch += micro_batches
        if per_epoch_batches is not None and self.batches_in_epoch >= per_epoch_batches:
            self.next_epoch()
            return True
        return False

    def next_epoch(self) -> None:
        """Point at the start of the next epoch."""
        self.epoch += 1
        self.batches_in_epoch = 0

    def epoch_position(self, per_epoch_batches: int | None) -> float:
        """Epochs done, with the fraction of the current one (whole epochs only for a stream)."""
        if not per_epoch_batches:
            return float(self.epoch)
        return self.epoch + self.batches_in_epoch / per_epoch_batches


__all__ = ["RESUMED_KEYS", "TrainerState"]
