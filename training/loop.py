"""The one accelerate training loop that pretraining and fine-tuning share: :class:`Trainer`.

Usage (a command builds the model, datasets and collators; the loop does the rest; :mod:`training.driver` wraps
this for the commands)::

    from training.loop import Trainer, make_accelerator, finish

    accelerator = make_accelerator(config)                # config: training.config.TrainingConfig
    trainer = Trainer(accelerator, model, train_dataloader, config, eval_fn=my_eval)  # prepares everything
    result = trainer.train()          # dict: train_loss, train_runtime_s, ... and the last eval metrics
    model = trainer.unwrapped_model   # save it with save_pretrained on the main process
    finish(accelerator, trainer)      # end trackers, free memory, destroy the process group

The loop is in parts: settings (:mod:`training.config`), samplers and dataloaders (:mod:`training.data`), the
state a checkpoint records (:mod:`training.state`), the device-side step statistics and their one host read
(:mod:`training.stats`), best model and early stopping (:mod:`training.best`), evaluation helpers
(:mod:`training.evaluation`) and checkpoints (:mod:`training.checkpoint`). What it guarantees:

* **Optimizer steps.** One optimizer step consumes ``gradient_accumulation_steps`` (G) micro-batches per
  process (fewer at the end of an epoch). The learning-rate schedule is stepped by the loop exactly once per
  optimizer step (skipped when a mixed-precision step is skipped), so after N optimizer steps the schedule has
  taken N steps for any G and any number of processes P (see :mod:`training.optim`; accelerate#662).
* **Exact loss normalisation.** Each micro-batch's loss is the model's mean over its predicted items (tokens
  for MLM/BiLM, examples for classification) and ``weight_fn(batch)`` counts those items. The loop sums the
  counts of the G micro-batches on all P processes (one all-reduce per step) and back-propagates
  ``loss_i * count_i * P / total_count`` inside ``accelerator.no_sync`` for all but the last micro-batch, so the
  gradient is that of the mean over *all* items of the optimizer step, however they are split across
  micro-batches and processes: a 2-process run follows the 1-process run with the same global batch. (This is
  what ``accelerator.accumulate`` does, but with per-item rather than per-micro-batch averaging.)
  **A loss of several terms** with different items (e.g. ELECTRA: the generator's MLM loss over the masked tokens
  plus lambda x the discriminator's loss over all real tokens): ``loss_fn`` returns the K terms, each a mean over
  its own items (a (K,) tensor, any weights such as lambda applied), and ``weight_fn`` their K item counts (a (K,)
  tensor); the loop sums each term's counts over the step (one all-reduce, as above) and back-propagates
  ``sum_k loss_ik * count_ik * P / total_count_k``, so that the gradient is that of ``sum_k`` (term k's mean over
  all its items of the step). The logged loss of such a step is that sum, counted with the weight of the first
  term's items. A scalar loss and count take the single-term path unchanged.
* **Clipping and non-finite values.** ``accelerator.clip_grad_norm_`` with ``max_grad_norm`` (the norm is always
  computed and logged). An optimizer step whose loss (on any process) or gradient norm is NaN/inf is not applied:
  weights, Adam moments and Adam's step count stay as they were; the step, its batches and the learning-rate
  schedule still count. ``skip_nonfinite_steps`` N tolerates N such steps (a warning each); one more stops every
  process with :class:`NonFiniteLossError` naming the step and its micro-batches, before any later checkpoint is
  written (the last one is left as it was). With an fp16 GradScaler, inf gradients are the scaler's to skip.
* **Host reads.** The step's statistics are one packed tensor on the device, all-reduced once per step; the host
  reads the pending steps' tensors back in one copy only at logging, evaluation and checkpoint steps and at the
  end (:mod:`training.stats`). That needs an optimizer that skips a non-finite update on the device: torch's fused
  AdamW (the default, :func:`training.optim.create_optimizer`) takes a ``found_inf`` tensor. With another
  optimizer, an fp16 GradScaler or DeepSpeed every step is read, to decide on the host. The batches reach the GPU
  from pinned memory with ``non_blocking`` copies, and the models read nothing back in ``forward``
  (``tests/training/test_host_reads.py``).
* **Checkpoints.** Every ``checkpointing_steps`` optimizer steps (a fraction below 1: of the run) and at the end,
  ``<output_dir>/checkpoints/step_N/`` written atomically with a size + SHA-256 manifest
  (:mod:`training.checkpoint`), the last ``checkpoints_total_limit`` kept; the learning-rate schedule is stored as
  JSON in ``trainer_state.json`` (nothing is unpickled on resume). ``latest`` skips damaged checkpoints; a failed
  save (disk full) raises :class:`training.checkpoint.CheckpointWriteError` and leaves the previous checkpoints
  intact.
* **Exact resume.** ``resume_from_checkpoint`` (``latest`` or a path; with a ``run_id``, ``latest`` and the
  rotation consider only that run's checkpoints) restores weights, optimizer, schedule, every process's RNG
  states, the log and evaluation histories and the position in the data (it refuses another global batch, number
  of steps, training data by content, or optimizer settings; a changed ``max_grad_norm`` is warned about): the epoch is
  set on the sampler and collator, and
  the micro-batches already consumed are skipped with ``accelerator.skip_first_batches`` (without collating
  them), so the run continues with the very batches and dropout masks of an uninterrupted run. For that the
  training data must be ordered by a sampler seeded from (seed, epoch) (e.g.
  :class:`training.data.EpochShuffleSampler`), the DataLoader must have its own ``generator`` and the collator
  must draw its random numbers from its own seeded generators, never from the global RNG (which belongs to
  dropout).
* **Stopping on request.** :meth:`Trainer.request_stop` (e.g. from a SIGTERM handler) makes every process
  finish the current optimizer step (with several processes: the steps up to the next logging step, where all
  processes read the combined flag), write its checkpoint and raise :class:`TrainingStopped`;
  :mod:`training.signals` calls it on SIGTERM / SIGINT. During an evaluation the request is checked between
  batches (:func:`training.evaluation.stop_when`): the evaluation is abandoned, the checkpoint written, and a
  resume runs that evaluation first.
* **Logging.** One tqdm bar on the local main process; every ``logging_steps`` the loss (mean per predicted
  item over the interval, all processes), learning rate, gradient norm, tokens/s and samples/s (all processes), and
  the training seconds and tokens of this session so far (``train_seconds``, ``train_tokens``: evaluation and
  checkpoints excluded) go to the trackers (``--report_to``, :mod:`training.trackers`) and to the log history. The
  trackers record the
  run's settings with the resolved plan (``max_train_steps``, ``num_warmup_steps``, ``eval_steps``,
  ``checkpointing_steps`` in steps).
* **Best model and early stopping** (:mod:`training.best`). ``load_best_model_at_end`` writes a checkpoint at
  every evaluation, keeps the best one out of the rotation and loads it at the end (the result then holds its
  metrics); ``early_stopping_patience`` N ends training after N evaluations in a row without improvement. The
  result has ``best_step``, ``best_metric`` and ``stopped_early``.
* **Evaluation.** ``eval_fn(trainer) -> dict`` every ``eval_steps`` (a fraction below 1: of the run) and at the
  end, on all processes; use :func:`training.evaluation.evaluate_sums` (exact sums across processes, e.g.
  perplexity) or :func:`training.evaluation.gather_predictions` (``gather_for_metrics``, e.g. classification
  metrics).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import pickle
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from itertools import islice
from typing import Any

import torch
from torch.utils.data import DataLoader

from training import checkpoint as ckpt
from training.best import should_stop_early, update_best
from training.config import TrainingConfig, best_metric_name, planned_steps, resolve_interval
from training.data import data_change, length_of
from training.errors import InputError, NonFiniteLossError, TrainingStopped, first_line
from training.evaluation import EvaluationInterrupted, stop_when
from training.optim import OPTIMIZERS, create_optimizer, create_scheduler
from training.state import TrainerState
from training.stats import Interval, StepStatistics
from training.trackers import log_with, prepare_environment, sanitize_config

logger = logging.getLogger(__name__)


def enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    """``model.gradient_checkpointing_enable()`` (non-reentrant checkpoints) for models that support it.

    Raises:
        InputError: the model has no gradient checkpointing (``supports_gradient_checkpointing`` false).
    """
    if not getattr(model, "supports_gradient_checkpointing", False) or not hasattr(
        model, "gradient_checkpointing_enable"
    ):
        raise InputError(
            f"--gradient_checkpointing: {type(model).__name__} does not support gradient checkpointing; "
            "expected a model with supports_gradient_checkpointing (e.g. SesameBert), or drop the flag"
        )
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x name; the old one is deprecated
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def make_accelerator(config: TrainingConfig, mixed_precision: str | None = None):
    """An ``Accelerator`` for the shared loop: trackers from ``report_to``, project folder ``output_dir``; gloo on the
    loopback interface when every process runs on this machine (:func:`_gloo_on_loopback`).

    ``rng_types=[]``: accelerate must not re-synchronise the global RNG at each epoch (dropout streams are
    per process and restored from checkpoints). ``non_blocking=True``: batches go to the GPU from pinned memory
    (:func:`training.data.make_train_dataloader` pins on CUDA) without waiting for the GPU's queue. CPU /
    multi-process / mixed precision come from ``accelerate launch`` (config file or flags); ``mixed_precision``
    (default ``config.mixed_precision``) overrides.
    """
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration, ProjectConfiguration, set_seed

    prepare_environment(config.report_to, config.output_dir)
    _gloo_on_loopback()
    project = ProjectConfiguration(project_dir=config.output_dir, logging_dir=os.path.join(config.output_dir, "runs"))
    accelerator = Accelerator(
        cpu=_no_accelerator_device(),
        mixed_precision=mixed_precision if mixed_precision is not None else config.mixed_precision,
        log_with=log_with(config.report_to),
        project_config=project,
        rng_types=[],
        gradient_accumulation_steps=1,
        dataloader_config=DataLoaderConfiguration(non_blocking=True),
    )
    set_seed(config.seed)
    return accelerator


def _gloo_on_loopback() -> None:
    """All processes on this machine with a loopback rendezvous (``MASTER_ADDR`` 127.0.0.1, as the single-machine
    configs set it): gloo's sockets listen on the loopback interface only (``GLOO_SOCKET_IFNAME``), not on the
    address the host name resolves to. A ``GLOO_SOCKET_IFNAME`` already set is kept."""
    import socket

    world, local = os.environ.get("WORLD_SIZE"), os.environ.get("LOCAL_WORLD_SIZE")
    if (
        "GLOO_SOCKET_IFNAME" in os.environ
        or not world
        or world != local
        or os.environ.get("MASTER_ADDR") not in ("127.0.0.1", "localhost", "::1")
    ):
        return
    loopback = next((name for _, name in socket.if_nameindex() if name.startswith("lo")), None)
    if loopback is not None:
        os.environ["GLOO_SOCKET_IFNAME"] = loopback


def _no_accelerator_device() -> bool:
    """True when no GPU/XPU/MPS is present: then ``Accelerator(cpu=True)``, so that 2 processes started by the
    torchrun launcher (``configs/cpu-2proc.yaml``) form a gloo process group on the CPU."""
    xpu = getattr(torch, "xpu", None)
    mps = getattr(torch.backends, "mps", None)
    return not (
        torch.cuda.is_available()
        or (xpu is not None and xpu.is_available())
        or (mps is not None and mps.is_available())
    )


def default_loss_fn(model, batch: Mapping[str, Any]) -> torch.Tensor:
    """``model(**batch).loss``: the model's mean loss over its predicted items."""
    return model(**batch).loss


def default_weight_fn(batch: Mapping[str, Any]) -> int | torch.Tensor:
    """Items the loss averages over: labels != -100 for token-level labels (a 0-d tensor on the batch's device,
    so that no host sync is needed), else the batch size (int)."""
    labels = batch.get("labels")
    if labels is not None and labels.dim() >= 2:
        return (labels != -100).sum()
    first = next(v for v in batch.values() if isinstance(v, torch.Tensor))
    return int(first.shape[0])


def default_tokens_fn(batch: Mapping[str, Any]) -> int | torch.Tensor:
    """Non-padding tokens of a batch (``attention_mask`` sum as a 0-d tensor on the batch's device; else the
    number of elements of ``input_ids``)."""
    if "attention_mask" in batch:
        return batch["attention_mask"].sum()
    return int(batch["input_ids"].numel()) if "input_ids" in batch else 0


#: Seconds between the plain progress lines logged instead of a progress bar when stderr is not a terminal.
PROGRESS_LOG_SECONDS = 30.0


def _is_terminal(stream) -> bool:
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
class _Session:
    """What this session (since the start or the resume) measured: training seconds, tokens and samples
    (evaluation and checkpoints excluded), and its start time."""

    started: float = 0.0
    seconds: float = 0.0
    tokens: float = 0.0
    samples: float = 0.0

    def add(self, interval: Interval) -> None:
        self.seconds += interval.time
        self.tokens += interval.tokens
        self.samples += interval.samples


class Trainer:
    """The shared loop; see the module docstring.

    Args:
        accelerator: from :func:`make_accelerator`.
        model: the model (not yet prepared); trained in place.
        train_dataloader: not yet prepared; see :func:`training.data.make_train_dataloader` for exact resume.
        config: the loop's settings.
        optimizer: default :func:`training.optim.create_optimizer` from ``config``.
        loss_fn: ``(model, batch) -> scalar loss``, the mean over the batch's predicted items; or a (K,) tensor of
            K loss terms, each the mean over its own items (see the module docstring).
        weight_fn: ``batch -> int | 0-d tensor``, the number of items ``loss_fn`` averages over (known before the
            forward); return a tensor on the batch's device to avoid a host sync. With K loss terms: a (K,) tensor,
            the items of each term.
        tokens_fn: ``batch -> int | 0-d tensor``, tokens processed (for tokens/s).
        eval_fn: ``(trainer) -> dict[str, float]``, called on all processes.
        run_config: settings to record with the trackers (default: ``config``'s); the resolved plan is added.
        on_save: ``(trainer, step) -> None``, called on **every** process after each periodic checkpoint
            (``checkpointing_steps``) is complete, not after the final one nor the one written on a stop
            request; the processes then wait for each other. The hook does its main-process work itself
            (e.g. :func:`training.hub.every_save_hook` for ``--hub_strategy every_save``).
        run_id: the run that owns ``output_dir`` (:mod:`training.ownership`): recorded in every checkpoint;
            ``latest``, resume and rotation leave other runs' checkpoints alone. None: every checkpoint counts.
        data_fingerprint: what the training data is made of (:func:`training.data.fingerprint_sources`), recorded
            in checkpoints; a resume with other data is refused.

    Raises:
        InputError: the training data gives no batch.
    """

    def __init__(
        self,
        accelerator,
        model: torch.nn.Module,
        train_dataloader: DataLoader,
        config: TrainingConfig,
        *,
        optimizer: torch.optim.Optimizer | None = None,
        loss_fn: Callable = default_loss_fn,
        weight_fn: Callable = default_weight_fn,
        tokens_fn: Callable = default_tokens_fn,
        eval_fn: Callable | None = None,
        run_config: Mapping[str, Any] | None = None,
        on_save: Callable[[Any, int], None] | None = None,
        run_id: str | None = None,
        data_fingerprint: list[dict[str, Any]] | None = None,
    ):
        self.accelerator, self.config, self.on_save = accelerator, config, on_save
        #: durations (seconds) of this session's evaluations and checkpoint writes, for the time estimate
        self._eval_seconds: list[float] = []
        self._checkpoint_seconds: list[float] = []
        self.loss_fn, self.weight_fn, self.tokens_fn, self.eval_fn = loss_fn, weight_fn, tokens_fn, eval_fn
        if optimizer is None:
            optimizer = create_optimizer(
                model,
                config.learning_rate,
                config.weight_decay,
                (config.adam_beta1, config.adam_beta2),
                config.adam_epsilon,
                fused=OPTIMIZERS[config.optim],
            )
        if config.gradient_checkpointing:
            enable_gradient_checkpointing(model)
        self.collator = train_dataloader.collate_fn
        self.per_device_train_batch_size = int(train_dataloader.batch_size or 1)
        self.num_train_examples = length_of(train_dataloader.dataset)  # None: a stream (torch IterableDataset)
        self.model, self.optimizer, self.train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)
        if config.torch_compile:  # after prepare: accelerate saves/loads the eager (prepared) model it holds
            self.model = torch.compile(self.model)
        self._plan_steps()
        self.scheduler = create_scheduler(
            config.lr_scheduler_type,
            self.optimizer,
            self.num_warmup_steps,
            self.max_train_steps,
            config.num_decay_steps,
        )
        # the schedule's state goes into trainer_state.json (JSON), not a pickled custom_checkpoint_0.pkl
        self.state = TrainerState(
            max_train_steps=self.max_train_steps,
            num_processes=accelerator.num_processes,
            gradient_accumulation_steps=config.gradient_accumulation_steps,
            per_device_train_batch_size=self.per_device_train_batch_size,
            num_train_examples=self.num_train_examples,
            run_id=run_id,
            data_fingerprint=data_fingerprint,
            optimizer_settings=self.optimizer_settings(),
        )
        self.stats = StepStatistics(self.state, config.skip_nonfinite_steps)
        self.run_config = {
            **(run_config if run_config is not None else dataclasses.asdict(config)),
            **self.resolved_settings(),
        }
        self.stop_requested = False
        self.last_checkpoint: str | None = None
        self.checkpoints_dir = os.path.join(config.output_dir, "checkpoints")

    def _plan_steps(self) -> None:
        """Optimizer steps per epoch and of the run, warmup steps, evaluation and checkpoint intervals."""
        config = self.config
        self.num_epoch_batches = length_of(self.train_dataloader)
        if self.num_epoch_batches == 0:
            raise InputError("the training data gives no batch on this process; expected more examples than processes")
        if self.num_epoch_batches is None and config.max_train_steps is None:  # a stream: no length until it ends
            raise InputError(
                "--max_train_steps: not given, but a streamed dataset has no length to count epochs "
                "in; expected --max_train_steps with --streaming"
            )
        self.max_train_steps, self.num_update_steps_per_epoch = planned_steps(config, self.num_epoch_batches)
        if config.num_warmup_steps is not None:
            self.num_warmup_steps = config.num_warmup_steps
        else:
            self.num_warmup_steps = math.ceil(config.warmup_ratio * self.max_train_steps)
        self.eval_steps = resolve_interval(config.eval_steps, self.max_train_steps)
        self.checkpointing_steps = resolve_interval(config.checkpointing_steps, self.max_train_steps)

    # -- the plan ----------------------------------------------------------------------------------------
    @property
    def global_batch_size(self) -> int:
        """Examples per optimizer step: per-device batch x processes x accumulation steps."""
        return (
            self.per_device_train_batch_size * self.accelerator.num_processes * self.config.gradient_accumulation_steps
        )

    def resolved_settings(self) -> dict[str, Any]:
        """The settings the run resolved from the data: ``max_train_steps``, ``num_warmup_steps``, ``eval_steps``
        and ``checkpointing_steps`` (in optimizer steps; None: never)."""
        return {
            "max_train_steps": self.max_train_steps,
            "num_warmup_steps": self.num_warmup_steps,
            "eval_steps": self.eval_steps,
            "checkpointing_steps": self.checkpointing_steps,
        }

    def plan(self) -> dict[str, Any]:
        """The run plan: ``global_batch_size`` (examples per optimizer step), ``max_train_steps``, ``epochs``
        (passes over the training data those steps make), ``num_warmup_steps``, ``steps_per_epoch``,
        ``train_examples`` and the evaluation / checkpoint intervals in steps."""
        steps_per_epoch = self.num_update_steps_per_epoch
        return {
            "global_batch_size": self.global_batch_size,
            "max_train_steps": self.max_train_steps,
            "steps_per_epoch": steps_per_epoch,
            "epochs": self.max_train_steps / steps_per_epoch if steps_per_epoch else None,
            "num_warmup_steps": self.num_warmup_steps,
            "train_examples": self.num_train_examples,
            "num_processes": self.accelerator.num_processes,
            "per_device_train_batch_size": self.per_device_train_batch_size,
            "gradient_accumulation_steps": self.config.gradient_accumulation_steps,
            "eval_steps": self.eval_steps,
            "checkpointing_steps": self.checkpointing_steps,
        }

    def optimizer_settings(self) -> dict[str, Any]:
        """The settings a checkpoint's optimizer state and schedule carry (compared on resume), with the resolved
        warmup; ``max_grad_norm`` is applied by the loop as given."""
        cfg = self.config
        return {
            "learning_rate": cfg.learning_rate,
            "weight_decay": cfg.weight_decay,
            "adam_beta1": cfg.adam_beta1,
            "adam_beta2": cfg.adam_beta2,
            "adam_epsilon": cfg.adam_epsilon,
            "optim": cfg.optim,
            "lr_scheduler_type": cfg.lr_scheduler_type,
            "num_warmup_steps": self.num_warmup_steps,
            "num_decay_steps": cfg.num_decay_steps,
            "max_grad_norm": cfg.max_grad_norm,
        }

    @property
    def log_history(self) -> list[dict[str, Any]]:
        """``{"step": N, "train_loss": ..., ...}`` per logging step of the whole run (resumed parts included)."""
        return self.state.log_history

    @property
    def unwrapped_model(self) -> torch.nn.Module:
        return self.accelerator.unwrap_model(self.model, keep_torch_compile=False)

    # -- training ----------------------------------------------------------------------------------------
    def train(self) -> dict[str, Any]:
        """Train to ``max_train_steps``: each optimizer step takes G micro-batches, updates the weights (or skips a
        non-finite update), then logs, evaluates and checkpoints where due. Returns ``train_loss`` (mean per item
        over the whole run, resumed parts included), ``train_runtime_s``, ``train_tokens_per_second``,
        ``train_samples_per_second`` (this session, evaluation and checkpointing excluded), ``global_step``,
        ``eval_history``, ``log_history`` and the last (or best) evaluation metrics.

        Raises:
            NonFiniteLossError: a NaN/inf loss or gradient norm (no optimizer step is taken with it).
            TrainingStopped: after :meth:`request_stop`, once the checkpoint is written.
        """
        self._begin()
        try:
            while self.state.global_step < self.max_train_steps and not self._stopping_early:
                micro_batches = self._next_micro_batches()
                if micro_batches is None:  # the epoch (or the stream) ended: the next pass starts the next one
                    continue
                self._optimizer_step(micro_batches)
                self._on_step_end()
        except BaseException:
            self._bar.close()  # ends the bar's line: the error line that follows starts its own
            raise
        return self._end()

    def _begin(self) -> None:
        """Output folder, trackers, resume, the evaluation at step 0, the progress bar and the session clock."""
        acc, cfg = self.accelerator, self.config
        self.last_checkpoint = None
        if acc.is_main_process:
            os.makedirs(cfg.output_dir, exist_ok=True)
        if acc.log_with:
            acc.init_trackers(cfg.project_name, config=sanitize_config(self.run_config))
        self._resume()
        from tqdm.auto import tqdm

        if self.eval_fn is not None and self.state.eval_pending:
            # the evaluation a stop request interrupted; its RNG draws (a DataLoader's base seed) are in the
            # checkpoint already, so they are not drawn twice
            with torch.random.fork_rng(devices=[]):
                self.evaluate()
        elif self.eval_fn is not None and self.eval_steps and self.state.global_step == 0:
            self.evaluate()  # the starting point of the validation curve
        # A progress bar redraws its line with carriage returns: in a file (not a terminal) log lines would be glued
        # onto it, so there the progress goes into plain log lines instead (:meth:`_log_progress`).
        self._bar_in_terminal = _is_terminal(sys.stderr)
        self._progress_logged_at = time.perf_counter()
        self._bar = tqdm(
            total=self.max_train_steps,
            initial=self.state.global_step,
            disable=not acc.is_local_main_process or not self._bar_in_terminal,
            desc="train",
            dynamic_ncols=True,
        )
        self._batches = None  # the iterator over the current epoch's micro-batches
        self._eta_logged = False
        self._estimate_complete = True
        self._per_step = 0.0
        self._stopping_early = should_stop_early(self.state, cfg)  # a resumed run that had already stopped early
        self._device_skip = self._device_skip_supported()
        self._session = _Session(started=time.perf_counter())

    def _next_micro_batches(self) -> list | None:
        """The next G micro-batches of this process (fewer at the end of an epoch); None when the epoch or the
        stream has ended (a stream's next pass is then the next epoch)."""
        if self._batches is None:
            self._set_epoch(self.state.epoch)
            loader = self.train_dataloader
            if self.state.batches_in_epoch:
                loader = self.accelerator.skip_first_batches(loader, self.state.batches_in_epoch)
            self._batches = iter(loader)
        self._step_started = time.perf_counter()
        group = list(islice(self._batches, self.config.gradient_accumulation_steps))
        if not group:
            if self.num_epoch_batches is None:
                self.state.next_epoch()
            self._batches = None
            return None
        return group

    def _optimizer_step(self, group: list) -> None:
        """Forward and backward over ``group``, clipping, then the update (or its skip on a non-finite step) and the
        schedule step; the step's statistics are queued on the device."""
        acc = self.accelerator
        loss_sum, nonfinite, total_weight, tokens, samples = self._forward_backward(group)
        max_norm = self.config.max_grad_norm if self.config.max_grad_norm else float("inf")
        grad_norm = acc.clip_grad_norm_(self.model.parameters(), max_norm)
        measured = grad_norm is not None  # DeepSpeed clips inside its engine and returns None
        local = torch.stack([loss_sum, nonfinite, tokens, torch.full_like(loss_sum, float(self.stop_requested))])
        reduced = self._reduce_tensor(local)  # one all-reduce per step, on the device
        nan = torch.full((), float("nan"), dtype=torch.float64, device=acc.device)
        norm = grad_norm.detach().double().reshape(()).to(acc.device) if measured else nan
        bad = (reduced[1] > 0) | ~torch.isfinite(reduced[0])
        if measured and getattr(acc, "scaler", None) is None:  # an fp16 GradScaler skips inf gradients itself
            bad = bad | ~torch.isfinite(norm)
        step, first = self.state.global_step + 1, self.state.batches_in_epoch + 1
        where = f"epoch {self.state.epoch}, micro-batches {first}-{first + len(group) - 1} of the epoch"
        self.stats.add(
            step, where, samples, torch.stack([reduced[0], total_weight, reduced[2], bad.double(), norm, reduced[3]])
        )
        if self._device_skip:  # the fused kernel leaves weights, moments and step count as they are when bad
            inner = self._inner_optimizer()
            inner.found_inf = bad.float()
            try:
                self.optimizer.step()
            finally:
                del inner.found_inf
        elif not self._read():  # read now, to decide on the host
            self.optimizer.step()
        if not acc.optimizer_step_was_skipped:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.stats.interval.time += time.perf_counter() - self._step_started
        self.stats.interval.steps += 1
        self.state.global_step = step
        if self.state.consume(len(group), self.num_epoch_batches):
            self._batches = None
        self._bar.update(1)

    def _forward_backward(self, group: list) -> tuple[torch.Tensor, ...]:
        """Back-propagate ``loss_i * count_i * P / total_count`` for each micro-batch (inside ``no_sync`` but the
        last), so that the gradient is that of the mean over all items of the step. Returns the 0-d device
        tensors (loss x items, non-finite flag, total items over processes, tokens) and the samples (int)."""
        acc = self.accelerator
        weights = [self._as_device_scalar(self.weight_fn(b)) for b in group]  # 0-d, or (K,) for K loss terms
        tokens = sum(self._as_device_scalar(self.tokens_fn(b)) for b in group)
        samples = sum(int(next(v for v in b.values() if isinstance(v, torch.Tensor)).shape[0]) for b in group)
        total_weight = self._reduce_tensor(torch.stack(weights).sum(0))
        scale = acc.num_processes / total_weight.clamp_min(1e-12)
        terms = total_weight.dim() == 1
        if terms:  # term k's loss x items, logged with the first term's items (see the module docstring)
            to_first = total_weight[0] / total_weight.clamp_min(1e-12)
        self.model.train()
        loss_sum = torch.zeros((), dtype=torch.float64, device=acc.device)
        nonfinite = torch.zeros((), dtype=torch.float64, device=acc.device)
        for i, batch in enumerate(group):
            with contextlib.nullcontext() if i == len(group) - 1 else acc.no_sync(self.model):
                loss = self.loss_fn(self.model, batch)
                if loss.shape != weights[i].shape:
                    raise ValueError(
                        f"loss_fn gave a loss of shape {tuple(loss.shape)} but weight_fn counts of shape "
                        f"{tuple(weights[i].shape)}; expected one count per loss term"
                    )
                scaled = loss * (weights[i] * scale).to(loss.dtype)
                acc.backward(scaled.sum() if terms else scaled)
            detached = loss.detach().double()
            if terms:
                nonfinite = torch.maximum(nonfinite, (~torch.isfinite(detached)).any().double())
                loss_sum += (detached * weights[i] * to_first).sum()
            else:
                nonfinite = torch.maximum(nonfinite, (~torch.isfinite(detached)).double())
                loss_sum += detached * weights[i]
        return loss_sum, nonfinite, total_weight[0] if terms else total_weight, tokens, samples

    def _on_step_end(self) -> None:
        """After an optimizer step: read the statistics at a sync point, then log, evaluate, checkpoint, stop
        early, or stop on request (:class:`TrainingStopped`), as due."""
        cfg, step = self.config, self.state.global_step
        last = step == self.max_train_steps
        logging_step = step % cfg.logging_steps == 0 or last
        evaluated = bool(self.eval_steps) and step % self.eval_steps == 0 and not last
        periodic = bool(self.checkpointing_steps) and step % self.checkpointing_steps == 0 and not last
        if logging_step or evaluated or periodic or (self.accelerator.num_processes == 1 and self.stop_requested):
            started = time.perf_counter()
            self._read()
            self.stats.interval.time += time.perf_counter() - started
        stop_now = self.stats.interval.stop > 0 and not last
        if logging_step:
            self._log_interval(step)
        if evaluated:
            self.evaluate()
            self._stopping_early = should_stop_early(self.state, cfg)
        if periodic or (evaluated and cfg.load_best_model_at_end and not self._stopping_early):
            self.save_checkpoint()
            if self.on_save is not None and periodic:
                self.on_save(self, step)
                self.accelerator.wait_for_everyone()
        if self._stopping_early:
            if self.accelerator.is_main_process:
                logger.info(
                    "early stopping at step %d: %d evaluations without improvement of %s (best %.6g at step %s)",
                    step,
                    self.state.evals_without_improvement,
                    best_metric_name(cfg),
                    self.state.best_metric,
                    self.state.best_step,
                )
        elif stop_now:
            self._bar.close()
            path = self.save_checkpoint()
            raise TrainingStopped(
                f"training stopped on request after optimizer step {step}; checkpoint {path} "
                "written; resume with --resume_from_checkpoint latest (same --output_dir "
                f"{cfg.output_dir})",
                path,
            )

    def _log_interval(self, step: int) -> None:
        """Log the finished interval's loss, learning rate, gradient norm and throughput (trackers, log history,
        progress bar; the estimated time to finish once)."""
        interval = self.stats.next_interval()
        self._session.add(interval)
        lr = self.scheduler.get_last_lr()[0]
        record = {
            "train_loss": interval.mean_loss,
            "learning_rate": lr,
            "grad_norm": interval.grad_norm,
            "tokens_per_second": interval.tokens / max(interval.time, 1e-9),
            "samples_per_second": interval.samples / max(interval.time, 1e-9),
            "epoch": self.state.epoch_position(self.num_epoch_batches),
            "train_seconds": self._session.seconds,
            "train_tokens": self._session.tokens,
        }
        self.accelerator.log(record, step=step)
        self.state.log_history.append({"step": step, **record})
        if not self._eta_logged and self.accelerator.is_main_process and step < self.max_train_steps:
            self._eta_logged = True
            self._per_step = interval.time / max(interval.steps, 1)
            rate = f"{self._per_step:.3g} s per optimizer step, {record['tokens_per_second']:.0f} tokens/s"
            self._log_estimate(step, rate)
        self._bar.set_postfix(loss=f"{record['train_loss']:.4f}", lr=f"{lr:.2e}", refresh=False)
        self._log_progress(step, record)

    def _log_progress(self, step: int, record: Mapping[str, Any]) -> None:
        """Where there is no progress bar (output to a file): a plain progress line at most every
        :data:`PROGRESS_LOG_SECONDS` seconds, and at the last step."""
        if self._bar_in_terminal or not self.accelerator.is_local_main_process:
            return
        now = time.perf_counter()
        if now - self._progress_logged_at < PROGRESS_LOG_SECONDS and step < self.max_train_steps:
            return
        self._progress_logged_at = now
        logger.info(
            "step %d/%d: train_loss %.4f, learning rate %.2e, %.0f tokens/s",
            step,
            self.max_train_steps,
            record["train_loss"],
            record["learning_rate"],
            record["tokens_per_second"],
        )

    def _log_estimate(self, step: int, rate: str = "") -> None:
        """Log the estimated time to finish after ``step`` (training, evaluations and checkpoints still due); an
        estimate that could not count every event (none timed yet) is logged again once they are timed."""
        cfg = self.config
        evaluations = remaining_events(step, self.max_train_steps, self.eval_steps, final=self.eval_fn is not None)
        if self.eval_fn is None:
            evaluations = 0
        checkpoints = remaining_events(step, self.max_train_steps, self.checkpointing_steps)
        if cfg.load_best_model_at_end and self.eval_steps:  # a checkpoint at every evaluation too
            checkpoints += remaining_events(step, self.max_train_steps, self.eval_steps, final=False)
        seconds, breakdown, complete = estimate_finish(
            self._per_step,
            step,
            self.max_train_steps,
            evaluations,
            checkpoints,
            self._eval_seconds,
            self._checkpoint_seconds,
        )
        self._estimate_complete = complete
        logger.info(
            "step %d/%d: %sestimated time to finish: %s (%s)",
            step,
            self.max_train_steps,
            f"{rate}; " if rate else "",
            format_duration(seconds),
            breakdown,
        )

    def _end(self) -> dict[str, Any]:
        """The last read, the final evaluation and checkpoint, the best model, and the result."""
        self._read()
        self._session.add(self.stats.interval)
        self._bar.close()
        metrics: dict[str, float] = {}
        history = self.state.eval_history
        if self._stopping_early or (history and history[-1]["step"] == self.state.global_step):
            metrics = {k: v for k, v in history[-1].items() if k != "step"}  # (a resume's pending evaluation)
        elif self.eval_fn is not None:
            metrics = self.evaluate()
        self.save_checkpoint()
        metrics = self._load_best_model(metrics)
        session = self._session
        result: dict[str, Any] = {
            "train_loss": self.state.loss_sum / max(self.state.weight_sum, 1e-12),
            "train_runtime_s": time.perf_counter() - session.started,
            "train_tokens_per_second": session.tokens / max(session.seconds, 1e-9),
            "train_samples_per_second": session.samples / max(session.seconds, 1e-9),
            "global_step": self.state.global_step,
            "epoch": self.state.epoch_position(self.num_epoch_batches),
        }
        result.update(metrics)
        if self.state.best_step is not None:
            result.update(best_step=self.state.best_step, best_metric=self.state.best_metric)
        result["stopped_early"] = self._stopping_early
        result["replica_max_abs_diff"] = self.replica_difference()
        result["eval_history"] = list(self.state.eval_history)
        result["log_history"] = list(self.state.log_history)
        return result

    # -- helpers of the step -----------------------------------------------------------------------------
    def _read(self) -> bool:
        """:meth:`training.stats.StepStatistics.read` of the pending steps (the bar closes before an error)."""
        return self.stats.read(self.last_checkpoint, self._bar.close)

    def _set_epoch(self, epoch: int) -> None:
        self.train_dataloader.set_epoch(epoch)
        if hasattr(self.collator, "set_epoch"):
            self.collator.set_epoch(epoch)

    def _as_device_scalar(self, value) -> torch.Tensor:
        """A count (int or 0-d tensor) as a float64 0-d tensor on the accelerator's device, without a host sync; a
        1-d tensor of counts (one per loss term) keeps its shape."""
        if isinstance(value, torch.Tensor):
            value = value.detach().to(device=self.accelerator.device, dtype=torch.float64)
            return value if value.dim() == 1 else value.reshape(())
        return torch.full((), float(value), dtype=torch.float64, device=self.accelerator.device)  # a fill, no copy

    def _reduce_tensor(self, t: torch.Tensor) -> torch.Tensor:
        """Sum over processes (identity with one process)."""
        if self.accelerator.num_processes > 1:
            t = self.accelerator.reduce(t, reduction="sum")
        return t

    def _inner_optimizer(self) -> torch.optim.Optimizer:
        """The torch optimizer inside accelerate's wrapper."""
        return getattr(self.optimizer, "optimizer", self.optimizer)

    def _device_skip_supported(self) -> bool:
        """True when a non-finite step can be skipped on the device, so that statistics need no per-step read.

        That is the case for torch optimizers that take a ``found_inf`` tensor (``_step_supports_amp_scaling``:
        the fused Adam/AdamW/SGD kernels, which leave weights, moments and the step count unchanged where it is
        non-zero), without an fp16 ``GradScaler`` (which sets ``found_inf`` itself) and outside DeepSpeed.
        """
        inner = self._inner_optimizer()
        return (
            bool(getattr(inner, "_step_supports_amp_scaling", False))
            and getattr(self.accelerator, "scaler", None) is None
            and type(self.optimizer).__name__ != "DeepSpeedOptimizerWrapper"
        )

    # -- checkpoints, resume, stop -----------------------------------------------------------------------
    def save_checkpoint(self) -> str:
        """Write ``checkpoints/step_<global_step>`` (all processes must call it); with ``load_best_model_at_end``
        the best step's checkpoint is kept by the rotation."""
        state = dict(self.state.state_dict(), lr_scheduler=self.scheduler.state_dict())
        best = self.state.best_step
        protect = [best] if self.config.load_best_model_at_end and best is not None else []
        started = time.perf_counter()
        path = ckpt.save_checkpoint(
            self.accelerator,
            self.checkpoints_dir,
            self.state.global_step,
            state,
            self.config.checkpoints_total_limit,
            protect=protect,
            run_id=self.state.run_id,
        )
        self._checkpoint_seconds.append(time.perf_counter() - started)
        step = self.state.global_step
        if (
            self._eta_logged
            and not self._estimate_complete
            and step < self.max_train_steps
            and self.accelerator.is_main_process
        ):
            self._log_estimate(step, "updated estimate with the checkpoint timed")
        self.last_checkpoint = str(path)
        return str(path)

    def _resume(self) -> None:
        cfg = self.config
        path = ckpt.resolve_checkpoint(
            cfg.resume_from_checkpoint, self.checkpoints_dir, self.state.run_id, cfg.ignore_checkpoint_integrity
        )
        if path is None:
            return
        saved = ckpt.read_state(path)
        self._check_resume_geometry(path, saved)
        self._check_pickles(path)
        try:
            self.accelerator.load_state(str(path))
            if "lr_scheduler" in saved:
                self.scheduler.load_state_dict(saved["lr_scheduler"])
        except pickle.UnpicklingError as err:
            raise InputError(
                f"--resume_from_checkpoint {path}: a file holds objects other than tensors and plain "
                f"values, refused by torch.load(weights_only=True) ({first_line(err)[:200]}); expected a "
                "checkpoint written by sesame-lm (it may have been tampered with)"
            ) from err
        except (RuntimeError, KeyError, ValueError) as err:  # shapes/names/param groups that do not fit
            first = first_line(err)[:300]
            raise InputError(
                f"--resume_from_checkpoint {path}: does not fit this model/optimizer ({type(err).__name__}: {first}); "
                "expected a checkpoint written by a run with the same model config"
            ) from err
        except Exception as err:
            # safetensors' SafetensorError (not a RuntimeError): a truncated or damaged weights file that the
            # manifest check did not catch (its manifest rewritten, or --ignore_checkpoint_integrity)
            if type(err).__name__ != "SafetensorError":
                raise
            raise InputError(
                f"--resume_from_checkpoint {path}: its weights cannot be read (SafetensorError: "
                f"{first_line(err)[:300]}); expected an intact checkpoint (resume from an earlier one: "
                "--resume_from_checkpoint PATH)"
            ) from err
        self._check_resume_settings(path, saved)  # after the load: another model is named first, not its default lr
        self.state.load_resumed(saved)
        # the position in the epoch is counted in examples, so that another split of the same global batch
        # (processes x per-device batch x accumulation) continues with the very next examples
        per_micro_batch = self.per_device_train_batch_size * self.accelerator.num_processes
        saved_micro_batch = int(saved.get("per_device_train_batch_size", self.per_device_train_batch_size)) * int(
            saved.get("num_processes", self.accelerator.num_processes)
        )
        self.state.batches_in_epoch = int(saved.get("batches_in_epoch", 0)) * saved_micro_batch // per_micro_batch
        self.last_checkpoint = str(path)
        if self.accelerator.is_main_process:
            logger.info(
                "resumed from %s at step %d (epoch %d, %d micro-batches in)",
                path,
                self.state.global_step,
                self.state.epoch,
                self.state.batches_in_epoch,
            )

    def _check_pickles(self, path) -> None:
        """Load this process's RNG file with ``weights_only`` first: accelerate would skip a blocked one silently.

        Raises:
            InputError: the file holds objects that ``torch.load(weights_only=True)`` refuses.
        """
        from accelerate.utils import load

        rng = os.path.join(path, ckpt.RNG_FILE.format(self.accelerator.process_index))
        if not os.path.isfile(rng):
            return
        try:
            load(rng)
        except pickle.UnpicklingError as err:
            raise InputError(
                f"--resume_from_checkpoint {path}: {os.path.basename(rng)} holds objects other than "
                "tensors and plain values, refused by torch.load(weights_only=True) "
                f"({first_line(err)[:200]}); expected a checkpoint written by sesame-lm (it may have been "
                "tampered with)"
            ) from err

    def _check_resume_settings(self, path, saved: Mapping[str, Any]) -> None:
        """Refuse a resume with other training data (by content) or other optimizer settings than the checkpoint's
        (its optimizer state and schedule would silently keep the old values); warn about another
        ``max_grad_norm`` (applied as given from here on).

        Raises:
            InputError: one line naming what changed, the saved and the current value.
        """
        changed = data_change(saved.get("data_fingerprint"), self.state.data_fingerprint)
        if changed:
            raise InputError(
                f"--resume_from_checkpoint {path}: the training data changed since the checkpoint "
                f"({changed}); expected the same files and settings (start a new run for other data)"
            )
        old, new = saved.get("optimizer_settings") or {}, self.state.optimizer_settings
        differ = [k for k in new if k in old and old[k] != new[k] and k != "max_grad_norm"]
        if differ:
            raise InputError(
                f"--resume_from_checkpoint {path}: optimizer settings differ from the checkpoint's "
                f"({'; '.join(f'{k} {old[k]} -> {new[k]}' for k in differ)}): the checkpoint's optimizer state and "
                "schedule would keep its values; expected the same settings (to train on with others, start a new "
                "run from the saved model)"
            )
        if "max_grad_norm" in old and old["max_grad_norm"] != new["max_grad_norm"] and self.accelerator.is_main_process:
            logger.warning(
                "--max_grad_norm %s differs from the checkpoint's %s: the run continues with %s",
                new["max_grad_norm"],
                old["max_grad_norm"],
                new["max_grad_norm"],
            )

    def _check_resume_geometry(self, path, saved: Mapping[str, Any]) -> None:
        """Refuse a resume that would skip or repeat data or change the schedule: another global batch, another
        number of optimizer steps or another training set size. Another split of the same global batch
        (processes, per-device batch, accumulation) is fine: the position is counted in examples.

        Raises:
            InputError: one line naming what changed, the saved and the current value.
        """
        P, G, b = (
            self.accelerator.num_processes,
            self.config.gradient_accumulation_steps,
            self.per_device_train_batch_size,
        )
        sP = int(saved.get("num_processes", P))
        sG = int(saved.get("gradient_accumulation_steps", G))
        sb = int(saved.get("per_device_train_batch_size", b))
        changes = []
        if sP * sG * sb != P * G * b:
            changes.append(
                f"global batch {sP * sG * sb} ({sP} processes x {sb} per device x {sG} accumulation) -> "
                f"{P * G * b} ({P} x {b} x {G})"
            )
        if saved.get("max_train_steps", self.max_train_steps) != self.max_train_steps:
            changes.append(f"max_train_steps {saved.get('max_train_steps')} -> {self.max_train_steps}")
        if saved.get("num_train_examples", self.num_train_examples) != self.num_train_examples:
            changes.append(f"training examples {saved.get('num_train_examples')} -> {self.num_train_examples}")
        if changes:
            raise InputError(
                f"--resume_from_checkpoint {path}: the run changed since the checkpoint ({'; '.join(changes)}); "
                "expected the same global batch, number of steps and training data (another split of the same "
                "global batch over processes, per-device batch and accumulation is fine)"
            )

    def request_stop(self) -> None:
        """Ask the loop to stop after the current optimizer step (with several processes: at the next logging
        step, where the flag combined across processes is read): every process then writes the checkpoint of
        that step and :meth:`train` raises :class:`TrainingStopped`. Safe to call from a signal handler on any
        process."""
        self.stop_requested = True

    # -- evaluation and the best model -------------------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        """Run ``eval_fn`` (all processes), record and log the metrics, and update the best model's bookkeeping
        (:func:`training.best.update_best`).

        A stop request during the evaluation (checked between batches by :mod:`training.evaluation`) abandons it,
        writes the checkpoint of the step (which records that its evaluation is pending) and raises
        :class:`TrainingStopped`.

        Raises:
            InputError: ``metric_for_best_model`` is not among the metrics (with ``load_best_model_at_end``,
                ``early_stopping_patience`` or an explicit ``metric_for_best_model``).
            TrainingStopped: after a stop request during the evaluation, once the checkpoint is written.
        """
        if self.eval_fn is None:
            return {}
        try:
            started = time.perf_counter()
            with stop_when(lambda: self.stop_requested, self.accelerator):
                metrics = {k: float(v) for k, v in self.eval_fn(self).items()}
            self._eval_seconds.append(time.perf_counter() - started)
        except EvaluationInterrupted:
            self.state.eval_pending = True
            if getattr(self, "_bar", None) is not None:
                self._bar.close()
            path = self.save_checkpoint()
            raise TrainingStopped(
                f"training stopped on request during the evaluation at optimizer step "
                f"{self.state.global_step}; checkpoint {path} written; resume with "
                "--resume_from_checkpoint latest (same --output_dir "
                f"{self.config.output_dir}; the evaluation runs first)",
                path,
            ) from None
        self.state.eval_pending = False
        step = self.state.global_step
        self.state.eval_history.append({"step": step, **metrics})
        self.accelerator.log(metrics, step=step)
        if self.accelerator.is_main_process:
            logger.info("step %d: %s", step, " ".join(f"{k}={v:.4g}" for k, v in metrics.items()))
            jump = loss_jump(self.state.eval_history)
            if jump is not None:
                logger.warning("%s", jump)
        update_best(self.state, self.config, metrics, step)
        return metrics

    def _load_best_model(self, last_metrics: dict[str, float]) -> dict[str, float]:
        """With ``load_best_model_at_end``: load the best step's checkpoint (model, optimizer, RNG states) when it
        is not the last step and return the metrics recorded at that step; else return ``last_metrics``. (Side
        products of ``eval_fn``, e.g. saved predictions, are the last evaluation's: run ``eval_fn`` again for
        the best model's.)"""
        best = self.state.best_step
        if not self.config.load_best_model_at_end or best is None or best == self.state.global_step:
            return last_metrics
        path = os.path.join(self.checkpoints_dir, f"step_{best}")
        problem = ckpt.verify_checkpoint(path)
        if problem is not None:
            raise InputError(
                f"--load_best_model_at_end: the best checkpoint {path} is damaged ({problem}); expected it intact"
            )
        self.accelerator.load_state(path)
        if self.accelerator.is_main_process:
            logger.info(
                "loaded the best model: step %d (%s = %.6g)",
                best,
                best_metric_name(self.config),
                self.state.best_metric,
            )
        record = next(e for e in reversed(self.state.eval_history) if e["step"] == best)
        return {k: v for k, v in record.items() if k != "step"}

    def replica_difference(self) -> float:
        """Largest difference between processes of the per-tensor parameter sums (0.0 when every process holds
        the same weights, as data parallelism requires; always 0.0 with one process)."""
        acc = self.accelerator
        if acc.distributed_type.name in ("FSDP", "DEEPSPEED", "MEGATRON_LM"):
            return float("nan")  # sharded parameters: not replicas
        sums = torch.stack([p.detach().double().sum() for p in self.unwrapped_model.parameters()]).to(acc.device)
        if acc.num_processes == 1:
            return 0.0
        gathered = acc.gather(sums[None]).reshape(acc.num_processes, -1)
        return float((gathered - gathered[0]).abs().max())


def finish(accelerator, *holders: Any) -> None:
    """Clean shutdown: end trackers, drop references held by the accelerator, destroy the process group.

    Call after saving; delete your own references to the model/optimizer first (``holders`` such as the
    :class:`Trainer` have theirs cleared). Destroying the process group avoids gloo's abort at exit.
    """
    accelerator.wait_for_everyone()
    for holder in holders:
        for name in ("model", "optimizer", "scheduler", "train_dataloader"):
            if hasattr(holder, name):
                setattr(holder, name, None)
    accelerator.end_training()
    accelerator.free_memory()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


__all__ = [
    "NonFiniteLossError",
    "Trainer",
    "TrainingStopped",
    "default_loss_fn",
    "default_tokens_fn",
    "default_weight_fn",
    "enable_gradient_checkpointing",
    "finish",
    "estimate_finish",
    "format_duration",
    "loss_jump",
    "remaining_events",
    "make_accelerator",
]
