"""Preemption: SIGTERM / SIGINT during training -> finish the optimizer step, checkpoint, exit non-zero.

A scheduler (SLURM, Kubernetes, a spot-instance reclaim) sends SIGTERM before it kills a job; Ctrl-C sends
SIGINT. Inside :func:`stop_on_signals` the first such signal only calls :meth:`training.loop.Trainer.request_stop`:
the loop finishes the optimizer step in progress, all processes agree on the stop at the same step (the flag
is all-reduced with the step's statistics), every process writes its part of ``checkpoints/step_N`` and
``Trainer.train`` raises :class:`core.errors.TrainingStopped`. The command then exits with
:func:`exit_code` (``128 + signal number``: 143 for SIGTERM, 130 for SIGINT, the shell convention) after one
``error:`` line saying how to resume (``--resume_from_checkpoint latest``).

A second signal exits at once (status ``128 + signal number``, no checkpoint; the previous complete
checkpoint is untouched because checkpoints are renamed into place only when complete). A launcher that
forwards the signal it received to its workers (``torchrun`` does, and a terminal or ``scancel`` also
signals the whole process group) makes each worker see the same signal twice within milliseconds: a repeat
of the same signal within :data:`REPEAT_WINDOW_S` seconds of the first counts as the same request.

Under a launcher, a worker asks the kernel for SIGTERM when its launcher dies (:func:`stop_with_launcher`,
``PR_SET_PDEATHSIG``): accelerate's single-process launcher does not forward signals (it dies of SIGTERM at once),
so a SIGTERM to the launcher alone still reaches the worker, which checkpoints and exits 143 on its own. After
training, :func:`signals_deferred` keeps the first signal from cutting the final save short.
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

    def __init__(self, trainer, finishing: str = "the current optimizer step and writing a checkpoint"):
        self.trainer, self.finishing = trainer, finishing
        self.signum: int | None = None
        self.received_at = 0.0

    def __call__(self, signum, frame) -> None:  # the signal handler
        now = time.monotonic()
        if self.signum is None:
            self.signum, self.received_at = signum, now
            name = signal.Signals(signum).name
            print(
                f"{name} received: finishing {self.finishing} (send it again to exit at once)",
                file=sys.stderr,
                flush=True,
            )
            if self.trainer is not None:
                self.trainer.request_stop()
            return
        if signum == self.signum and now - self.received_at < REPEAT_WINDOW_S:
            return  # the same signal forwarded by the launcher
        print(
            f"{signal.Signals(signum).name} received again: exiting at once without a checkpoint",
            file=sys.stderr,
            flush=True,
        )
        os._exit(128 + int(signum))

    @property
    def exit_code(self) -> int:
        """``128 + signal number`` of the first signal (143 SIGTERM, 130 SIGINT), 1 if none arrived."""
        return 128 + int(self.signum) if self.signum is not None else 1


@contextlib.contextmanager
def stop_on_signals(trainer, finishing: str | None = None) -> Iterator[SignalStopper]:
    """Within the block, SIGTERM / SIGINT request a graceful stop of ``trainer`` (see the module docstring); with
    ``trainer`` None the first signal is only recorded, ``finishing`` (what completes first) in its message.

    The previous handlers are restored on exit. Outside the main thread (where Python cannot install signal
    handlers) nothing is installed.

    Yields:
        The :class:`SignalStopper`; its ``exit_code`` is the status to exit with after
        :class:`core.errors.TrainingStopped`.
    """
    import threading

    stopper = SignalStopper(trainer) if finishing is None else SignalStopper(trainer, finishing)
    if threading.current_thread() is not threading.main_thread():
        yield stopper
        return
    previous = {s: signal.signal(s, stopper) for s in STOP_SIGNALS}
    try:
        yield stopper
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def signals_deferred(finishing: str):
    """Within the block the first SIGTERM / SIGINT is recorded, not acted on (its message says that ``finishing``
    completes first); a second one exits at once. For the final save after training: check ``.signum`` after the
    block and exit with ``.exit_code`` when a signal arrived."""
    return stop_on_signals(None, finishing)


#: ``prctl`` option: the signal the kernel sends this process when its parent dies.
_PR_SET_PDEATHSIG = 1


def launched_by_launcher() -> bool:
    """Whether this process is a worker of ``accelerate launch`` (its launchers set ``ACCELERATE_DYNAMO_BACKEND``)
    or ``torchrun`` (``TORCHELASTIC_RUN_ID``)."""
    return bool(os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get("ACCELERATE_DYNAMO_BACKEND"))


def stop_with_launcher() -> bool:
    """Under a launcher (:func:`launched_by_launcher`, Linux), ask the kernel to send this process SIGTERM when its
    launcher dies (``prctl(PR_SET_PDEATHSIG, SIGTERM)``), so that a SIGTERM to the launcher alone -- which
    accelerate's single-process launcher does not forward: it dies at once -- still stops training with a
    checkpoint. A launcher that already died sends the signal at once. Not done for a process started directly
    (``nohup python -m pretrain &`` must survive its shell).

    Returns:
        True when the request was made.
    """
    if not sys.platform.startswith("linux") or not launched_by_launcher():
        return False
    import ctypes

    parent = os.getppid()
    if parent == 1:
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent:  # the launcher died before the request: nobody will send the signal
        os.kill(os.getpid(), signal.SIGTERM)
    return True


def train_until_stopped(trainer, on_stop: Callable[[], None]) -> tuple[dict | None, int]:
    """``trainer.train()`` under :func:`stop_on_signals`, for a command's ``main``.

    Returns:
        ``(result, 0)`` when training ended; ``(None, status)`` after a requested stop (status 143 / 130 for
        SIGTERM / SIGINT) or a non-finite loss (status 1): then ``on_stop()`` has been called (e.g. to end
        trackers and the process group) and the one-line ``error:`` reason, saying where the last checkpoint
        is and how to resume, has been printed to stderr by the main process (every process stops at the same
        step).
    """
    from core.errors import NonFiniteLossError, TrainingStopped

    with stop_on_signals(trainer) as stopper:
        try:
            return trainer.train(), 0
        except (NonFiniteLossError, TrainingStopped) as err:
            main_process = trainer.accelerator.is_main_process
            on_stop()
            if main_process:  # every process stops at the same step: one error line, not one per process
                print(f"error: {err}", file=sys.stderr, flush=True)
            return None, (stopper.exit_code if isinstance(err, TrainingStopped) else 1)
