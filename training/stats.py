"""Step statistics of the training loop: kept on the device, read back by the host in one copy at sync points.

Each optimizer step leaves one row ``[loss x items, items, tokens, non-finite flag, gradient norm, stop flag,
token slots, model FLOPs]``
(float64, on the accelerator's device, already summed over processes). The rows wait in
:attr:`StepStatistics.pending` until a sync point (a logging, evaluation or checkpoint step, the last step, or every
step when the optimizer cannot skip a non-finite update on the device); :meth:`StepStatistics.read` then copies them
to the host at once, adds them to the logging interval and the run's sums, and counts or refuses non-finite steps.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable

import torch

from core.errors import NonFiniteLossError
from training.state import TrainerState

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class Interval:
    """Sums over the steps since the last logging step (host floats)."""

    loss: float = 0.0
    """Loss x items of the finite steps."""
    weight: float = 0.0
    """Items of the finite steps."""
    tokens: float = 0.0
    samples: float = 0.0
    slots: float = 0.0
    """Token slots (rows x length) of the batches: ``tokens / slots`` is the packing efficiency."""
    flops: float = 0.0
    """Model FLOPs of the steps (:class:`training.mfu.FlopCounter`)."""
    time: float = 0.0
    """Seconds spent in the steps (and their reads), evaluation and checkpoints excluded."""
    steps: int = 0
    grad_norm: float = math.nan
    """Gradient norm of the last step read."""
    stop: float = 0.0
    """Largest stop flag read (> 0: some process asked to stop)."""

    @property
    def mean_loss(self) -> float:
        """Mean loss per item over the interval."""
        return self.loss / max(self.weight, 1e-12)


@dataclasses.dataclass
class PendingStep:
    """One step's statistics, still on the device."""

    step: int
    where: str
    """Epoch and micro-batches of the step, for messages."""
    samples: int
    row: torch.Tensor
    """``(8,)`` float64: loss x items, items, tokens, non-finite flag (0/1), gradient norm, stop flag, token slots,
    model FLOPs (all but the items, flag and norm summed over processes)."""


class StepStatistics:
    """The pending rows of :class:`PendingStep` and the current logging :class:`Interval` of a run.

    Args:
        state: the run's state (its ``loss_sum``, ``weight_sum`` and ``nonfinite_skipped`` are updated).
        skip_nonfinite_steps: non-finite steps tolerated over the run (a warning each).
    """

    def __init__(self, state: TrainerState, skip_nonfinite_steps: int):
        self.state, self.skip_nonfinite_steps = state, skip_nonfinite_steps
        self.pending: list[PendingStep] = []
        self.interval = Interval()

    def add(self, step: int, where: str, samples: int, row: torch.Tensor) -> None:
        """Queue one step's statistics (no host read)."""
        self.pending.append(PendingStep(step, where, samples, row))

    def next_interval(self) -> Interval:
        """Start a new logging interval; returns the finished one."""
        finished, self.interval = self.interval, Interval()
        return finished

    def read(self, last_checkpoint: str | None = None, before_error: Callable[[], None] | None = None) -> bool:
        """Read the pending steps' statistics to the host in one copy, add them to :attr:`interval` and the run's
        sums, and empty the queue. A non-finite step's update was not applied: it is counted against
        ``skip_nonfinite_steps`` (a warning) or stops the run.

        Args:
            last_checkpoint: named in the error message (the last good checkpoint).
            before_error: called before :class:`NonFiniteLossError` is raised (e.g. to close a progress bar).

        Returns:
            True when the last pending step was non-finite (and skipped).

        Raises:
            NonFiniteLossError: more non-finite steps than ``skip_nonfinite_steps``.
        """
        if not self.pending:
            return False
        rows = torch.stack([p.row for p in self.pending]).tolist()  # the one host read
        steps, last_bad = self.pending, False
        self.pending = []
        interval, state = self.interval, self.state
        for pending, (loss, weight, tokens, bad, norm, stop, slots, flops) in zip(steps, rows):
            interval.tokens += tokens
            interval.slots += slots
            interval.flops += flops
            interval.samples += pending.samples
            interval.grad_norm = norm
            interval.stop = max(interval.stop, stop)
            last_bad = bad > 0
            if not last_bad:
                interval.loss += loss
                interval.weight += weight
                state.loss_sum += loss
                state.weight_sum += weight
                continue
            step_loss = loss / max(weight, 1e-12)
            if state.nonfinite_skipped < self.skip_nonfinite_steps:
                state.nonfinite_skipped += 1
                logger.warning(
                    "non-finite loss (%s) or gradient norm (%s) at optimizer step %d (%s): update skipped, its "
                    "batches consumed (%d of --skip_nonfinite_steps %d)",
                    step_loss,
                    norm,
                    pending.step,
                    pending.where,
                    state.nonfinite_skipped,
                    self.skip_nonfinite_steps,
                )
                continue
            if before_error is not None:
                before_error()
            kept = (
                f"the last good checkpoint is {last_checkpoint}" if last_checkpoint else "no checkpoint was written yet"
            )
            tolerance = (
                f" after {state.nonfinite_skipped} skipped step(s) (--skip_nonfinite_steps {self.skip_nonfinite_steps})"
                if self.skip_nonfinite_steps
                else ""
            )
            found = (
                f" (found at step {steps[-1].step}, where the statistics were read)"
                if steps[-1].step != pending.step
                else ""
            )
            raise NonFiniteLossError(
                f"non-finite loss ({step_loss}) or gradient norm ({norm}) at optimizer step {pending.step} "
                f"({pending.where}){tolerance}{found}; its update was not applied and training stopped, {kept}; try a "
                "lower --learning_rate or --max_grad_norm, --skip_nonfinite_steps N, or check the data of that step"
            )
        return last_bad


__all__ = ["Interval", "PendingStep", "StepStatistics"]
