"""Preemption: SIGTERM / SIGINT during training -> finish the optimizer step, checkpoint, exit non-zero.

A scheduler (SLURM, Kubernetes, a spot-instance reclaim) sends SIGTERM before it kills a job; Ctrl-C sends
SIGINT. Inside :func:`stop_on_signals` the first such signal only calls :meth:`training.loop.Trainer.request_stop`:
the loop finishes the optimizer step in progress, all processes agree on the stop at the same step (the flag
is all-reduced with the step's statistics), every process writes its part of ``checkpoints/step_N`` and
``Trainer.train`` raises :class:`training.loop.TrainingStopped`. The command then exits with
:func:`exit_code` (``128 + signal number``: 143 for SIGTERM, 130 for SIGINT, the shell convention) after one
``error:`` line saying how to resume (``--resume_from_checkpoint latest``).

A second signal exits at once (status ``128 + signal number``, no checkpoint; the previous complete
checkpoint is untouched because checkpoints are renamed into place only when complete). A launcher that
forwards the signal it received to its workers (``torchrun`` does, and a terminal or ``scancel`` also
signals the whole process group) makes each worker see the same signal twice within milliseconds: a repeat
of the same signal within :data:`REPEAT_WINDOW_S` seconds of the first counts as the same request.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator

#: Signals that request a graceful stop.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

#: A repeat of the first signal within this many seconds is the launcher forwarding it, not a second request.
REPEAT_WINDOW_S = 2.0


class SignalStopper:
    """The installed handler's state: which signal arrived first (``signum``), and when."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.signum: int | None = None
        self.received_at = 0.0

    def __call__(self, signum, frame) -> None:  # the signal handler
        now = time.monotonic()
        if self.signum is None:
            self.signum, self.received_at = signum, now
            name = signal.Signals(signum).name
            print(f"{name} received: finishing the current optimizer step and writing a checkpoint "
                  "(send it again to exit at once)", file=sys.stderr, flush=True)
            self.trainer.request_stop()
            return
        if signum == self.signum and now - self.received_at < REPEAT_WINDOW_S:
            return  # the same signal forwarded by the launcher
        print(f"{signal.Signals(signum).name} received again: exiting at once without a checkpoint",
              file=sys.stderr, flush=True)
        os._exit(128 + int(signum))

    @property
    def exit_code(self) -> int:
        """``128 + signal number`` of the first signal (143 SIGTERM, 130 SIGINT), 1 if none arrived."""
        return 128 + int(self.signum) if self.signum is not None else 1


@contextlib.contextmanager
def stop_on_signals(trainer) -> Iterator[SignalStopper]:
    """Within the block, SIGTERM / SIGINT request a graceful stop of ``trainer`` (see the module docstring).

    The previous handlers are restored on exit. Outside the main thread (where Python cannot install signal
    handlers) nothing is installed.

    Yields:
        The :class:`SignalStopper`; its ``exit_code`` is the status to exit with after
        :class:`training.loop.TrainingStopped`.
    """
    import threading

    stopper = SignalStopper(trainer)
    if threading.current_thread() is not threading.main_thread():
        yield stopper
        return
    previous = {s: signal.signal(s, stopper) for s in STOP_SIGNALS}
    try:
        yield stopper
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def train_until_stopped(trainer, on_stop: Callable[[], None]) -> tuple[dict | None, int]:
    """``trainer.train()`` under :func:`stop_on_signals`, for a command's ``main``.

    Returns:
        ``(result, 0)`` when training ended; ``(None, status)`` after a requested stop (status 143 / 130 for
        SIGTERM / SIGINT) or a non-finite loss (status 1): then ``on_stop()`` has been called (e.g. to end
        trackers and the process group) and the one-line ``error:`` reason, saying where the last checkpoint
        is and how to resume, has been printed to stderr.
    """
    from training.errors import NonFiniteLossError, TrainingStopped

    with stop_on_signals(trainer) as stopper:
        try:
            return trainer.train(), 0
        except (NonFiniteLossError, TrainingStopped) as err:
            on_stop()
            print(f"error: {err}", file=sys.stderr, flush=True)
            return None, (stopper.exit_code if isinstance(err, TrainingStopped) else 1)
