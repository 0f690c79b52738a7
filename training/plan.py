"""The run plan: every count a training run follows, decided once before the loop exists (:func:`make_plan`).

A :class:`RunPlan` is a pure function of the loop settings, the size of the training data, the number of processes,
the block length and a compute budget already converted into steps. The commands build it, log it and hand it to the
run driver; the loop (:class:`training.loop.Trainer`), the trackers, ``run_config.json`` and the model card read it.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from typing import Any

from core.errors import InputError
from training.config import TrainingConfig
from training.threads import chosen as chosen_threads

#: The evaluation cap of :func:`make_plan` (``cap_eval``): all evaluations of the run together cover at most this
#: share of the examples it trains on, one evaluation at most :data:`MAX_EVAL_TOKENS` tokens, and never fewer than
#: :data:`MIN_EVAL_EXAMPLES` examples (or all there are).
EVAL_SHARE, MAX_EVAL_TOKENS, MIN_EVAL_EXAMPLES = 0.10, 1_000_000, 128


def resolve_interval(value: float | None, max_train_steps: int) -> int | None:
    """Steps between two periodic actions (evaluation, checkpoint): ``value`` as given when >= 1, a fraction of
    ``max_train_steps`` (rounded up, at least 1) when below 1 (as transformers' ``TrainingArguments``), None when
    not set."""
    if not value:
        return None
    if value < 1:  # exact decimal arithmetic: 0.1 x 30 steps is 3, not 3.0000000000000004
        return max(1, math.ceil(Fraction(repr(float(value))) * max_train_steps))
    return int(value)


def steps_for_tokens(max_train_tokens: int, tokens_per_step: int) -> int:
    """Optimizer steps that train at least ``max_train_tokens`` tokens: ``ceil(max_train_tokens / tokens_per_step)``.

    Args:
        max_train_tokens: the budget in tokens (block positions, padding included), >= 1.
        tokens_per_step: tokens of one optimizer step (global batch x block length), >= 1.

    Raises:
        InputError: a budget or step size below 1.
    """
    if max_train_tokens < 1:
        raise InputError(f"--max_train_tokens {max_train_tokens}: expected an integer >= 1")
    if tokens_per_step < 1:
        raise InputError(f"tokens per optimizer step {tokens_per_step}: expected at least 1")
    return -(-max_train_tokens // tokens_per_step)


def steps_for_time(minutes: float, seconds_per_step: float) -> int:
    """Optimizer steps that fit in ``minutes``: ``max(1, floor(60 * minutes / seconds_per_step))``.

    Raises:
        InputError: a budget that is not a positive finite number, or a step time that is not positive.
    """
    if not (minutes > 0 and math.isfinite(minutes)):
        raise InputError(f"--time_budget {minutes}: expected a positive number of minutes")
    if not seconds_per_step > 0:
        raise InputError(f"measured {seconds_per_step} seconds per optimizer step: expected a positive time")
    return max(1, math.floor(60.0 * minutes / seconds_per_step))


def _interval(steps: int | None) -> str:
    """``every N steps`` for a periodic action, ``at the end`` for one done only when training ends."""
    return f"every {steps} steps" if steps else "at the end"


@dataclasses.dataclass(frozen=True)
class BatchWarmup:
    """Batch-size warmup by tokens (``--batch_size_warmup_tokens``): the global batch grows from one micro-batch per
    process to the full ``gradient_accumulation_steps`` (G) of them, through gradient accumulation, as ModernBERT's
    batch-size warmup (Warner et al. 2024, sec. 2.2.1) and Megatron-LM's ``--rampup-batch-size`` grow it.

    An optimizer step that starts after ``t`` tokens (block positions of every process, padding included) takes
    ``k(t) = min(G, 1 + floor((G - 1) * t / tokens))`` micro-batches per process: 1 at the start, G from ``tokens``
    on, linear in the tokens in between. ``t`` counts the planned tokens (``tokens_per_micro_batch`` per micro-batch
    of every process), so ``k`` is a pure function of the step number: a resumed run takes the very same steps.
    The loss of a step stays the mean over all its predicted items (:mod:`training.loop`).

    Attributes:
        tokens: warmup tokens (>= 1). ``tokens_per_micro_batch``: processes x per-device batch x block length.
        accumulation: G, the micro-batches per process of a full step (>= 2).
        segments: ``((k, steps), ...)`` for k = 1 .. G - 1: the warmup's steps of k micro-batches, in order.
    """

    tokens: int
    tokens_per_micro_batch: int
    accumulation: int
    segments: tuple[tuple[int, int], ...]

    @classmethod
    def make(cls, tokens: int, tokens_per_micro_batch: int, accumulation: int) -> BatchWarmup:
        """The warmup of ``tokens`` tokens for micro-batches of ``tokens_per_micro_batch`` and G = ``accumulation``.

        Raises:
            InputError: ``tokens < 1``, or G = 1 (the batch grows through accumulation: nothing to grow).
        """
        if tokens < 1:
            raise InputError(f"--batch_size_warmup_tokens {tokens}: expected an integer >= 1")
        if accumulation < 2:
            raise InputError(
                f"--batch_size_warmup_tokens {tokens}: the batch grows through gradient accumulation, and "
                f"--gradient_accumulation_steps is {accumulation}; expected --gradient_accumulation_steps >= 2 (the "
                "full batch; the warmup starts from one micro-batch per process)"
            )
        G, u = accumulation, tokens_per_micro_batch
        seen, segments = 0, []
        for k in range(1, G):
            threshold = -(-k * tokens // (G - 1))  # the first t with k(t) > k
            steps = max(0, -(-(threshold - seen) // (k * u)))
            seen += steps * k * u
            segments.append((k, steps))
        return cls(tokens, u, G, tuple(segments))

    @property
    def steps(self) -> int:
        """Optimizer steps of the warmup (those with fewer than G micro-batches)."""
        return sum(n for _, n in self.segments)

    def micro_batches(self, step: int) -> int:
        """Micro-batches per process of optimizer step ``step`` (1-based)."""
        for k, n in self.segments:
            if step <= n:
                return k
            step -= n
        return self.accumulation

    def micro_batches_in(self, steps: int) -> int:
        """Micro-batches per process of the first ``steps`` optimizer steps."""
        total = 0
        for k, n in self.segments:
            if steps <= n:
                return total + steps * k
            total, steps = total + n * k, steps - n
        return total + steps * self.accumulation

    def steps_for(self, micro_batches: int) -> int:
        """Optimizer steps that take at least ``micro_batches`` micro-batches per process."""
        steps = 0
        for k, n in self.segments:
            if micro_batches <= n * k:
                return steps + -(-micro_batches // k)
            steps, micro_batches = steps + n, micro_batches - n * k
        return steps + -(-micro_batches // self.accumulation)


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """The counts of one training run (see :func:`make_plan`).

    Attributes (in optimizer steps unless named otherwise; None: a stream, or never):
        max_train_steps, steps_per_epoch, num_warmup_steps: the run, one pass over the data, the warmup.
        eval_steps, checkpointing_steps: between two evaluations, two checkpoints (None: at the end only).
        batches_per_process: micro-batches per process and epoch, as accelerate shards the data.
        num_processes, per_device_train_batch_size, gradient_accumulation_steps: the factors of the global batch.
        tokens_per_step: block positions per step (fixed-length blocks); seconds_per_step: a time budget's probe.
        eval_examples: examples one evaluation covers (None: all of them).
        batch_warmup: the batch-size warmup (None: every step takes ``gradient_accumulation_steps`` micro-batches).
    """

    max_train_steps: int
    steps_per_epoch: int | None
    num_warmup_steps: int
    eval_steps: int | None
    checkpointing_steps: int | None
    batches_per_process: int | None
    num_processes: int
    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    tokens_per_step: int | None = None
    seconds_per_step: float | None = None
    eval_examples: int | None = None
    batch_warmup: BatchWarmup | None = None

    def micro_batches(self, step: int) -> int:
        """Micro-batches per process of optimizer step ``step`` (1-based): ``gradient_accumulation_steps``, fewer
        during a batch-size warmup (:class:`BatchWarmup`)."""
        if self.batch_warmup is None:
            return self.gradient_accumulation_steps
        return self.batch_warmup.micro_batches(step)

    def micro_batches_in(self, steps: int) -> int:
        """Micro-batches per process of the first ``steps`` optimizer steps (epoch ends not counted)."""
        if self.batch_warmup is None:
            return steps * self.gradient_accumulation_steps
        return self.batch_warmup.micro_batches_in(steps)

    @property
    def total_tokens(self) -> int | None:
        """Block positions the run trains on (fixed-length blocks; None otherwise)."""
        if self.tokens_per_step is None:
            return None
        return self.tokens_per_step * self.micro_batches_in(self.max_train_steps) // self.gradient_accumulation_steps

    @property
    def global_batch_size(self) -> int:
        """Examples per optimizer step: per-device batch x processes x accumulation steps."""
        return self.per_device_train_batch_size * self.num_processes * self.gradient_accumulation_steps

    @property
    def epochs(self) -> float | None:
        """Passes over the training data the run makes (None: a stream)."""
        if self.batch_warmup is not None and self.batches_per_process:
            return self.micro_batches_in(self.max_train_steps) / self.batches_per_process
        return self.max_train_steps / self.steps_per_epoch if self.steps_per_epoch else None

    @property
    def evaluations(self) -> int:
        """Evaluations the run makes: at step 0, every ``eval_steps`` steps before the last, and at the end."""
        return 2 + (self.max_train_steps - 1) // self.eval_steps if self.eval_steps else 1

    def summary(self, data: str, learning_rate: float, source: str) -> str:
        """The plan's log line around ``data``, the command's phrase for what it trains on: the steps, the learning
        rate and its ``source``, for fixed-length blocks also the global batch, tokens, warmup and intervals, and the
        CPU threads per process once the accelerator chose them (:mod:`training.threads`)."""
        threads = f"; {choice.describe()}" if (choice := chosen_threads()) else ""
        rate, steps = f"learning rate {learning_rate:g} ({source})", self.max_train_steps
        if self.tokens_per_step is None:
            return f"{data}; {steps} optimizer steps; {rate}{threads}"
        ramp = ""
        if (warm := self.batch_warmup) is not None:
            start = self.num_processes * self.per_device_train_batch_size
            ramp = (
                f"; batch-size warmup over the first {warm.tokens:.4g} tokens: {start} -> {self.global_batch_size} "
                f"sequences per step (1 -> {warm.accumulation} accumulation, linear in tokens) in {warm.steps} steps"
            )
        return (
            f"run plan: {steps} optimizer steps = {data}; global batch {self.global_batch_size} sequences = "
            f"{self.tokens_per_step} tokens ({self.num_processes} processes x {self.per_device_train_batch_size} per "
            f"device x {self.gradient_accumulation_steps} accumulation){ramp}, {self.total_tokens:.4g} tokens in "
            f"all; warmup {self.num_warmup_steps} steps; {rate}; evaluation {_interval(self.eval_steps)}, checkpoints "
            f"{_interval(self.checkpointing_steps)}{threads}"
        )

    def settings(self) -> dict[str, Any]:
        """The resolved settings recorded with the run (trackers, ``run_config.json``, the card): the steps, the
        warmup and the intervals in optimizer steps (None: never), and a time budget's probed seconds per step."""
        seconds = {} if self.seconds_per_step is None else {"time_budget_seconds_per_step": self.seconds_per_step}
        ramp = {} if self.batch_warmup is None else {"batch_size_warmup_steps": self.batch_warmup.steps}
        return {
            "max_train_steps": self.max_train_steps,
            **seconds,
            **ramp,
            "num_warmup_steps": self.num_warmup_steps,
            "eval_steps": self.eval_steps,
            "checkpointing_steps": self.checkpointing_steps,
        }


def _planned_steps(config, max_train_steps, max_train_tokens, tokens_per_step, time_budget, warm) -> int | None:
    """The optimizer steps of a token budget (``max_train_tokens``), else of ``max_train_steps`` (given, or a time
    budget's: ``time_budget``, its full steps) or ``config.max_train_steps``; None: count the epochs. With a
    batch-size warmup (``warm``) a token or time budget's steps count the warmup's smaller steps."""
    if max_train_tokens is not None:
        steps = steps_for_tokens(max_train_tokens, tokens_per_step)
        return (
            steps if warm is None else warm.steps_for(steps_for_tokens(max_train_tokens, warm.tokens_per_micro_batch))
        )
    if warm is not None and time_budget:
        # a time budget's full steps: as many micro-batches (each about 1/G of a full step's time), fewer steps
        return warm.steps_for(time_budget * config.gradient_accumulation_steps)
    return max_train_steps or config.max_train_steps


def make_plan(
    config: TrainingConfig,
    *,
    train_examples: int | None,
    num_processes: int,
    max_seq_length: int | None = None,
    max_train_tokens: int | None = None,
    max_train_steps: int | None = None,
    seconds_per_step: float | None = None,
    per_device_train_batch_size: int | None = None,
    num_epoch_batches: int | None = None,
    cap_eval: bool = False,
) -> RunPlan:
    """The plan of a run of ``config`` on ``train_examples`` examples (None: a stream) over ``num_processes``.

    Steps: ``max_train_tokens`` converted (:func:`steps_for_tokens`, needs ``max_seq_length``), else
    ``max_train_steps`` (a time budget converted into steps), else ``config.max_train_steps``, else
    ``num_train_epochs`` passes (rounded up, at least 1 step); warmup ``num_warmup_steps``, else ``warmup_ratio`` of
    the steps (rounded up); intervals by :func:`resolve_interval`. With ``config.batch_size_warmup_tokens`` (needs
    ``max_seq_length``) the steps of a token budget, of epochs or of a time budget (``seconds_per_step`` given: its
    ``max_train_steps`` are full steps) count the warmup's smaller steps (:class:`BatchWarmup`): they take the same
    tokens (the same time) as the warmup-free run.

    Args:
        max_seq_length: tokens per block, for ``tokens_per_step`` (None: examples of varying length).
        max_train_tokens: a token budget (``--max_train_tokens``).
        max_train_steps: a time budget's steps (``--time_budget``).
        seconds_per_step: recorded in the plan (a ``--time_budget`` probe).
        per_device_train_batch_size: the loader's batch size when it differs from ``config``'s.
        num_epoch_batches: micro-batches per process and epoch when known from a prepared loader (else counted
            as accelerate shards: the last batch kept, every process given as many batches).
        cap_eval: cap the examples of one evaluation (``eval_examples``; needs ``max_seq_length``): all evaluations
            together cover at most :data:`EVAL_SHARE` of the training examples of the planned steps, one at most
            :data:`MAX_EVAL_TOKENS` tokens, never fewer than :data:`MIN_EVAL_EXAMPLES` (False: evaluate all).

    Raises:
        InputError: no batch at all, a stream without ``max_train_steps``, a batch-size warmup without
            ``max_seq_length`` or without accumulation.
    """
    batch = per_device_train_batch_size or config.per_device_train_batch_size
    if num_epoch_batches is None and train_examples is not None:
        num_epoch_batches = math.ceil(math.ceil(train_examples / batch) / num_processes)
    if num_epoch_batches == 0:
        raise InputError("the training data gives no batch on this process; expected more examples than processes")
    accumulation = config.gradient_accumulation_steps
    tokens_per_step = None if max_seq_length is None else batch * accumulation * num_processes * max_seq_length
    warm = _batch_warmup(config, max_seq_length, batch * num_processes, accumulation)
    time_budget = max_train_steps if seconds_per_step is not None else None
    steps = _planned_steps(config, max_train_steps, max_train_tokens, tokens_per_step, time_budget, warm)
    if num_epoch_batches is None and steps is None:  # a stream: no length until it ends
        raise InputError(
            "--max_train_steps: not given, but a streamed dataset has no length to count epochs "
            "in; expected --max_train_steps with --streaming"
        )
    per_epoch = None if num_epoch_batches is None else math.ceil(num_epoch_batches / accumulation)
    if steps is None and warm is not None:
        steps = max(1, warm.steps_for(math.ceil(config.num_train_epochs * num_epoch_batches)))
    if steps is None:
        steps = max(1, math.ceil(config.num_train_epochs * per_epoch))
    warmup = config.num_warmup_steps
    plan = RunPlan(
        max_train_steps=steps,
        steps_per_epoch=per_epoch,
        num_warmup_steps=math.ceil(config.warmup_ratio * steps) if warmup is None else warmup,
        eval_steps=resolve_interval(config.eval_steps, steps),
        checkpointing_steps=resolve_interval(config.checkpointing_steps, steps),
        batches_per_process=num_epoch_batches,
        num_processes=num_processes,
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=accumulation,
        tokens_per_step=tokens_per_step,
        seconds_per_step=seconds_per_step,
        batch_warmup=warm,
    )
    return _with_eval_cap(plan, max_seq_length) if cap_eval else plan


def _batch_warmup(config: TrainingConfig, max_seq_length: int | None, rows: int, accumulation: int):
    """The :class:`BatchWarmup` of ``config.batch_size_warmup_tokens`` (None without it) for micro-batches of ``rows``
    blocks of ``max_seq_length`` tokens over all processes.

    Raises:
        InputError: a warmup for examples of varying length (``max_seq_length`` None).
    """
    if getattr(config, "batch_size_warmup_tokens", None) is None:
        return None
    if max_seq_length is None:
        raise InputError(
            f"--batch_size_warmup_tokens {config.batch_size_warmup_tokens}: counts the tokens of fixed-length "
            "blocks, and this run's examples vary in length; expected it with pretrain only"
        )
    return BatchWarmup.make(config.batch_size_warmup_tokens, rows * max_seq_length, accumulation)


def _with_eval_cap(plan: RunPlan, max_seq_length: int) -> RunPlan:
    """``plan`` with ``eval_examples``: all evaluations together cover at most :data:`EVAL_SHARE` of the training
    examples of the planned steps (a batch-size warmup's smaller steps included), one at most
    :data:`MAX_EVAL_TOKENS` tokens, never fewer than :data:`MIN_EVAL_EXAMPLES`."""
    steps = plan.max_train_steps
    if plan.batch_warmup is None:
        by_compute = int(EVAL_SHARE * steps * plan.global_batch_size / plan.evaluations)
    else:
        rows = plan.per_device_train_batch_size * plan.num_processes
        by_compute = int(EVAL_SHARE * plan.micro_batches_in(steps) * rows / plan.evaluations)
    cap = max(MIN_EVAL_EXAMPLES, min(by_compute, MAX_EVAL_TOKENS // max_seq_length))
    return dataclasses.replace(plan, eval_examples=cap)


__all__ = [
    "BatchWarmup",
    "EVAL_SHARE",
    "MAX_EVAL_TOKENS",
    "MIN_EVAL_EXAMPLES",
    "RunPlan",
    "make_plan",
    "resolve_interval",
    "steps_for_tokens",
]
