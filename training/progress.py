"""The loop's progress arithmetic (:class:`training.loop.Trainer`): the time still needed to finish a run
(:func:`remaining_events`, :func:`estimate_finish`, :class:`TimeEstimate`), durations as text
(:func:`format_duration`), the held-out loss jump warning (:func:`loss_jump`) and what a session measured
(:class:`Session`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from training.stats import Interval


def is_terminal(stream) -> bool:
    """Whether ``stream`` is an interactive terminal (a progress bar can redraw its line there)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def format_duration(seconds: float) -> str:
    """``seconds`` as ``1h 02m 03s`` / ``2m 03s`` / ``3.4s``."""
    if not math.isfinite(seconds):
        return "unknown"
    if seconds < 60:
        return f"{seconds:.1f}s"
    m, sec = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}h {m:02d}m {sec:02d}s" if h else f"{m}m {sec:02d}s"


#: A held-out loss this many nats above the lowest one so far counts as a jump (:func:`loss_jump`).
LOSS_JUMP_NATS = 2.0


def loss_jump(history: Sequence[Mapping[str, Any]], key: str = "eval_loss") -> str | None:
    """A warning when the last evaluation's ``key`` jumped :data:`LOSS_JUMP_NATS` or more above the lowest value
    before it, else None.

    Such a jump can come from a single bad update: bert-mini on 2 MB of news (150 steps, lr 1e-3,
    warmup_stable_decay_1sqrt) had held-out loss 7.12 after step 120, 15.76 after step 121 and 7.22 after step 122
    (the next update, gradient norm 34, clipped, undid it), reproduced by resuming from step 120 with an
    evaluation every step. A point of the curve at such a step says little about the run.

    Args:
        history: ``[{"step": N, key: value, ...}, ...]`` (the loop's ``eval_history``), oldest first.

    Returns:
        The warning text, naming both values and the steps.
    """
    points = [(h["step"], h[key]) for h in history if isinstance(h.get(key), (int, float)) and math.isfinite(h[key])]
    if len(points) < 2:
        return None
    step, last = points[-1]
    best_step, best = min(points[:-1], key=lambda p: p[1])
    if last - best < LOSS_JUMP_NATS:
        return None
    return (
        f"step {step}: held-out {key} {last:.4g} jumped {last - best:.3g} nats above its lowest so far ({best:.4g} "
        f"at step {best_step}): one bad update can do this and the next steps usually undo it (watch the next "
        "evaluation); if it stays, lower --learning_rate or --max_grad_norm"
    )


def remaining_events(step: int, max_train_steps: int, every: int | None, final: bool = True) -> int:
    """How many of a periodic event (an evaluation, a checkpoint) fall after optimizer step ``step``: the
    multiples of ``every`` in ``(step, max_train_steps)`` (none when ``every`` is None/0), plus the one at the end
    when ``final``."""
    periodic = (max_train_steps - 1) // every - step // every if every else 0
    return max(periodic, 0) + (1 if final and step < max_train_steps else 0)


def estimate_finish(
    per_step: float,
    step: int,
    max_train_steps: int,
    evaluations: int,
    checkpoints: int,
    eval_seconds: Sequence[float] = (),
    checkpoint_seconds: Sequence[float] = (),
) -> tuple[float, str, bool]:
    """The time to finish a run after optimizer step ``step``: the training steps left at ``per_step`` seconds,
    plus the ``evaluations`` and ``checkpoints`` still due at the mean time each took so far.

    Args:
        per_step: seconds per optimizer step (training only).
        evaluations / checkpoints: how many are still due (:func:`remaining_events`).
        eval_seconds / checkpoint_seconds: the durations measured so far (seconds); an event kind not measured
            yet cannot be counted and is named as left out.

    Returns:
        ``(seconds, breakdown, complete)``: the estimate (seconds), its parts as text (``"training 7m 35s + 10
        evaluations x 41.0s + 10 checkpoints (not timed yet, not included)"``), and whether it counts everything due.
    """
    training = per_step * max(max_train_steps - step, 0)
    total, parts, complete = training, [f"training {format_duration(training)}"], True
    for count, seconds, name in (
        (evaluations, eval_seconds, "evaluation"),
        (checkpoints, checkpoint_seconds, "checkpoint"),
    ):
        if not count:
            continue
        label = f"{count} {name}{'s' if count > 1 else ''}"
        if seconds:
            mean = sum(seconds) / len(seconds)
            total += count * mean
            parts.append(f"{label} x {format_duration(mean)}")
        else:
            complete = False
            parts.append(f"{label} (not timed yet, not included)")
    return total, " + ".join(parts), complete


@dataclasses.dataclass
class Session:
    """What this session (since the start or the resume) measured: training seconds, tokens, samples, token slots
    and model FLOPs (evaluation and checkpoints excluded), and its start time."""

    started: float = 0.0
    seconds: float = 0.0
    tokens: float = 0.0
    samples: float = 0.0
    slots: float = 0.0
    flops: float = 0.0

    def add(self, interval: Interval) -> None:
        """Count a finished logging interval (:class:`training.stats.Interval`) into the session."""
        self.seconds += interval.time
        self.tokens += interval.tokens
        self.samples += interval.samples
        self.slots += interval.slots
        self.flops += interval.flops


#: Optimizer steps at the start of each session (a run or a resume) left out of the estimate's rate: the first steps
#: carry one-off work (lazy initialisation, the optimizer's state, memory allocation, compilation) that made the
#: first estimate of short runs 1.5-5x too long when counted (as the ``--time_budget`` probe leaves them out).
ESTIMATE_WARMUP_STEPS = 2


@dataclasses.dataclass
class TimeEstimate:
    """The estimated time to finish a run, logged once at the first logging step after a step beyond the
    :data:`ESTIMATE_WARMUP_STEPS` warm-up steps (whose time the rate leaves out), and again once every event kind due
    has been timed.

    Attributes:
        max_train_steps: optimizer steps of the run.
        eval_steps / checkpointing_steps: the intervals in optimizer steps (None: never).
        evaluates: the run has an evaluation function (one more evaluation at the end).
        best_checkpoints: ``load_best_model_at_end``: a checkpoint at every evaluation too.
        eval_seconds / checkpoint_seconds: durations (seconds) of this session's evaluations and checkpoint writes.
        logged: the first estimate was logged (this call of ``train``).
        complete: the last estimate counted every event due (see :func:`estimate_finish`).
        per_step: seconds per optimizer step (training only) measured after the warm-up steps.
        steps_seen: optimizer steps of this session so far.
        measured_seconds / measured_steps: the training seconds and steps of this session after the warm-up steps
            (the rate is their ratio).
    """

    max_train_steps: int
    eval_steps: int | None
    checkpointing_steps: int | None
    evaluates: bool
    best_checkpoints: bool
    eval_seconds: list[float] = dataclasses.field(default_factory=list)
    checkpoint_seconds: list[float] = dataclasses.field(default_factory=list)
    logged: bool = False
    complete: bool = True
    per_step: float = 0.0
    steps_seen: int = 0
    measured_seconds: float = 0.0
    measured_steps: int = 0

    def start(self) -> None:
        """A new call of ``train``: nothing logged yet, a new warm-up (the measured event durations are kept)."""
        self.logged, self.complete, self.per_step = False, True, 0.0
        self.steps_seen, self.measured_seconds, self.measured_steps = 0, 0.0, 0

    def add_step(self, seconds: float) -> None:
        """Count one optimizer step that took ``seconds`` (host time); the warm-up steps are not measured."""
        self.steps_seen += 1
        if self.steps_seen > ESTIMATE_WARMUP_STEPS:
            self.measured_seconds += seconds
            self.measured_steps += 1

    def add_wait(self, seconds: float) -> None:
        """Count ``seconds`` spent waiting for the device's queued steps (a statistics read) after the warm-up."""
        if self.steps_seen > ESTIMATE_WARMUP_STEPS:
            self.measured_seconds += seconds

    def rate(self) -> float | None:
        """Seconds per optimizer step after the warm-up steps; None before a step beyond them has been timed."""
        return self.measured_seconds / self.measured_steps if self.measured_steps else None

    def incomplete(self, step: int) -> bool:
        """True when an estimate was logged without every event kind timed and the run is not over after ``step``:
        log it again once one more is timed."""
        return self.logged and not self.complete and step < self.max_train_steps

    def message(self, step: int, rate: str = "") -> str:
        """The log line of the estimated time to finish after optimizer ``step`` (training, evaluations and
        checkpoints still due, ``rate``: the measured speed, put first); records whether it could count every event
        (:attr:`complete`)."""
        max_steps, eval_steps = self.max_train_steps, self.eval_steps
        evaluations = remaining_events(step, max_steps, eval_steps, final=self.evaluates) if self.evaluates else 0
        checkpoints = remaining_events(step, max_steps, self.checkpointing_steps)
        if self.best_checkpoints and eval_steps:
            checkpoints += remaining_events(step, max_steps, eval_steps, final=False)
        seconds, breakdown, self.complete = estimate_finish(
            self.per_step, step, max_steps, evaluations, checkpoints, self.eval_seconds, self.checkpoint_seconds
        )
        return (
            f"step {step}/{max_steps}: {f'{rate}; ' if rate else ''}estimated time to finish: "
            f"{format_duration(seconds)} ({breakdown})"
        )


__all__ = [
    "ESTIMATE_WARMUP_STEPS",
    "LOSS_JUMP_NATS",
    "Session",
    "TimeEstimate",
    "estimate_finish",
    "format_duration",
    "is_terminal",
    "loss_jump",
    "remaining_events",
]
