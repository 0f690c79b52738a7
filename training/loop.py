"""The one accelerate training loop that pretraining and fine-tuning share.

Usage (a script builds the model, datasets and collators; the loop does the rest)::

    from training.loop import TrainingConfig, Trainer, add_training_arguments, make_accelerator, finish

    parser = argparse.ArgumentParser(); add_training_arguments(parser)
    args = parser.parse_args()
    config = TrainingConfig.from_args(args)
    accelerator = make_accelerator(config, mixed_precision=args.mixed_precision)
    trainer = Trainer(accelerator, model, train_dataloader, config, eval_fn=my_eval)  # prepares everything
    result = trainer.train()          # dict: train_loss, train_runtime_s, ... and the last eval metrics
    model = trainer.unwrapped_model   # save it with save_pretrained on the main process
    finish(accelerator, trainer)      # end trackers, free memory, destroy the process group

What the loop guarantees:

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
* **Clipping and non-finite values.** ``accelerator.clip_grad_norm_`` with ``max_grad_norm`` (the norm is always
  computed and logged). An optimizer step whose loss (on any process) or gradient norm is NaN/inf is not applied:
  weights, Adam moments and Adam's step count stay as they were; the step, its batches and the learning-rate
  schedule still count. ``skip_nonfinite_steps`` N tolerates N such steps (a warning each); one more stops every
  process with :class:`NonFiniteLossError` naming the step and its micro-batches, before any later checkpoint is
  written (the last one is left as it was). With an fp16 GradScaler, inf gradients are the scaler's to skip.
* **Host reads.** The step's statistics (loss sum, item count, tokens, non-finite flag, gradient norm, stop flag)
  are one packed tensor on the device, all-reduced once per step; the host reads the pending steps' tensors back
  in one copy only at logging, evaluation and checkpoint steps and at the end. That needs an optimizer that skips
  a non-finite update on the device: torch's fused AdamW (the default, :func:`training.optim.create_optimizer`)
  takes a ``found_inf`` tensor. With another optimizer, an fp16 GradScaler or DeepSpeed every step is read, to
  decide on the host. The batches reach the GPU from pinned memory with ``non_blocking`` copies, and the models
  read nothing back in ``forward`` (``tests/training/test_host_reads.py``).
* **Checkpoints.** Every ``checkpointing_steps`` optimizer steps and at the end, ``<output_dir>/checkpoints/
  step_N/`` written atomically with a size + SHA-256 manifest (:mod:`training.checkpoint`), the last
  ``checkpoints_total_limit`` kept; the learning-rate schedule is stored as JSON in ``trainer_state.json``
  (nothing is unpickled on resume). ``latest`` skips damaged checkpoints; a failed save (disk full) raises
  :class:`training.checkpoint.CheckpointWriteError` and leaves the previous checkpoints intact.
* **Exact resume.** ``resume_from_checkpoint`` (``latest`` or a path) restores weights, optimizer, schedule,
  every process's RNG states and the position in the data: the epoch is set on the sampler and collator, and
  the micro-batches already consumed are skipped with ``accelerator.skip_first_batches`` (without collating
  them), so the run continues with the very batches and dropout masks of an uninterrupted run. For that the
  training data must be ordered by a sampler seeded from (seed, epoch) (e.g. :class:`EpochShuffleSampler`),
  the DataLoader must have its own ``generator`` and the collator must draw its random numbers from its own
  seeded generators, never from the global RNG (which belongs to dropout).
* **Stopping on request.** :meth:`Trainer.request_stop` (e.g. from a SIGTERM handler) makes every process
  finish the current optimizer step (with several processes: the steps up to the next logging step, where all
  processes read the combined flag), write its checkpoint and raise :class:`TrainingStopped`;
  :mod:`training.signals` calls it on SIGTERM / SIGINT.
* **Logging.** One tqdm bar on the local main process; every ``logging_steps`` the loss (mean per predicted
  item over the interval, all processes), learning rate, gradient norm, tokens/s and samples/s (all processes)
  go to the trackers (``--report_to``, :mod:`training.trackers`) and to the log history.
* **Best model and early stopping.** Each evaluation after step 0 updates ``best_metric`` / ``best_step`` of
  ``metric_for_best_model`` (default ``eval_loss``; lower is better for losses and perplexities, as transformers'
  ``Trainer``) and counts the evaluations without improvement; all of it is in ``trainer_state.json``, so a
  resumed run keeps it. ``load_best_model_at_end`` writes a checkpoint at every evaluation, keeps the best one
  out of the rotation and loads it at the end (the result then holds its metrics); ``early_stopping_patience``
  N ends training after N evaluations in a row without improvement. The result has ``best_step``,
  ``best_metric`` and ``stopped_early``.
* **Evaluation.** ``eval_fn(trainer) -> dict`` every ``eval_steps`` and at the end, on all processes; use
  :func:`evaluate_sums` (exact sums across processes, e.g. perplexity) or :func:`gather_predictions`
  (``gather_for_metrics``, e.g. classification metrics).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from itertools import islice
from typing import Any

import torch
from torch.utils.data import DataLoader, Sampler

from training import checkpoint as ckpt
from training.errors import InputError, first_line
from training.optim import OPTIMIZERS, SCHEDULERS, create_optimizer, create_scheduler
from training.run import epoch_seed
from training.trackers import log_with, prepare_environment, sanitize_config

logger = logging.getLogger(__name__)


class NonFiniteLossError(RuntimeError):
    """The loss or the gradient norm became NaN or infinite (more often than ``skip_nonfinite_steps``); the update
    of that step was not applied and training stopped."""


class TrainingStopped(RuntimeError):
    """Training stopped on request (:meth:`Trainer.request_stop`, e.g. from a SIGTERM handler) after writing a
    checkpoint; the message says how to resume."""

    def __init__(self, message: str, checkpoint: str):
        super().__init__(message)
        self.checkpoint = checkpoint


@dataclasses.dataclass
class TrainingConfig:
    """Settings of the shared loop (the ``--`` arguments of :func:`add_training_arguments`)."""

    output_dir: str
    """Run folder: checkpoints in ``checkpoints/``, TensorBoard runs in ``runs/``, wandb runs in ``wandb/``."""
    learning_rate: float = 5e-4
    """Peak learning rate of AdamW."""
    weight_decay: float = 0.01
    """Decoupled weight decay, not applied to biases and normalisation weights."""
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    optim: str = "adamw_torch_fused"
    """AdamW implementation, named as transformers' ``--optim``: ``adamw_torch_fused`` (torch's fused kernel where
    the device has it, CPU and CUDA; non-finite steps are then skipped on the device and the loop reads its
    statistics only at logging steps) or ``adamw_torch`` (foreach; the loop reads every step)."""
    lr_scheduler_type: str = "linear"
    """One of linear, cosine, constant, constant_with_warmup, warmup_stable_decay."""
    num_warmup_steps: int | None = None
    """Optimizer steps of linear warmup; overrides ``warmup_ratio`` when given."""
    warmup_ratio: float = 0.0
    """Warmup as a fraction of ``max_train_steps`` (rounded up), used when ``num_warmup_steps`` is not given."""
    num_decay_steps: int | None = None
    """warmup_stable_decay: optimizer steps of the final decay (default 10% of the run)."""
    max_train_steps: int | None = None
    """Optimizer steps of the run; overrides ``num_train_epochs``."""
    num_train_epochs: float = 1.0
    """Passes over the training data when ``max_train_steps`` is not given."""
    gradient_accumulation_steps: int = 1
    """Micro-batches per process per optimizer step."""
    max_grad_norm: float | None = 1.0
    """Clip the global gradient L2 norm to this (None or 0: no clipping, the norm is still logged)."""
    checkpointing_steps: int | None = None
    """Write a checkpoint every N optimizer steps (one is always written at the end)."""
    checkpoints_total_limit: int | None = 2
    """Keep only the last K checkpoints (None or 0: keep all)."""
    resume_from_checkpoint: str | None = None
    """``latest`` or a checkpoint folder."""
    logging_steps: int = 10
    """Log train loss, lr, grad norm and throughput every N optimizer steps."""
    eval_steps: int | None = None
    """Evaluate every N optimizer steps (and always at the end)."""
    report_to: str = "none"
    """Trackers: none, tensorboard, wandb or all."""
    project_name: str = "sesame-lm"
    """Tracker project (TensorBoard sub-folder, wandb project)."""
    seed: int = 42
    """Seed of model initialisation, data order, masking and dropout."""
    skip_nonfinite_steps: int = 0
    """Tolerate this many optimizer steps with a non-finite loss / gradient norm over the run: each takes no update
    (the step, its batches and the schedule still count; a warning names the step and batches); one more stops
    training."""
    torch_compile: bool = False
    """Compile the prepared model with ``torch.compile`` (default inductor backend); checkpoints, the unwrapped
    model and ``save_pretrained`` are those of the eager model (same parameter names)."""
    metric_for_best_model: str | None = None
    """Evaluation metric that picks the best model and drives early stopping (``eval_`` prefix optional; default
    ``eval_loss``; the fine-tuning scripts default to the task's main metric)."""
    greater_is_better: bool | None = None
    """Whether a larger ``metric_for_best_model`` is better; default: False for names containing ``loss`` or
    ``perplexity``, else True (as transformers' ``Trainer``)."""
    load_best_model_at_end: bool = False
    """Write a checkpoint at every evaluation, never rotate the best one away, and end with the best weights."""
    early_stopping_patience: int | None = None
    """Stop after this many evaluations in a row without improvement of ``metric_for_best_model``."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (``model.gradient_checkpointing_enable()``): less memory,
    about one more forward pass of compute."""

    def __post_init__(self) -> None:
        if self.gradient_accumulation_steps < 1:
            raise InputError(f"--gradient_accumulation_steps {self.gradient_accumulation_steps}: expected an integer >= 1")
        if not (self.learning_rate > 0 and math.isfinite(self.learning_rate)):
            raise InputError(f"--learning_rate {self.learning_rate}: expected a positive finite number")
        if self.max_train_steps is not None and self.max_train_steps < 1:
            raise InputError(f"--max_train_steps {self.max_train_steps}: expected an integer >= 1")
        if self.num_warmup_steps is not None and self.num_warmup_steps < 0:
            raise InputError(f"--num_warmup_steps {self.num_warmup_steps}: expected an integer >= 0")
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise InputError(f"--warmup_ratio {self.warmup_ratio}: expected a number in [0, 1)")
        if self.max_train_steps is None and not self.num_train_epochs > 0:
            raise InputError(f"--num_train_epochs {self.num_train_epochs}: expected a number > 0")
        if self.max_grad_norm is not None and self.max_grad_norm < 0:
            raise InputError(f"--max_grad_norm {self.max_grad_norm}: expected a number >= 0")
        if self.checkpointing_steps is not None and self.checkpointing_steps < 1:
            raise InputError(f"--checkpointing_steps {self.checkpointing_steps}: expected an integer >= 1")
        if self.optim not in OPTIMIZERS:
            raise InputError(f"--optim {self.optim!r}: expected one of {', '.join(OPTIMIZERS)}")
        if self.skip_nonfinite_steps < 0:
            raise InputError(f"--skip_nonfinite_steps {self.skip_nonfinite_steps}: expected an integer >= 0")
        if self.logging_steps < 1:
            raise InputError(f"--logging_steps {self.logging_steps}: expected an integer >= 1")
        if self.eval_steps is not None and self.eval_steps < 1:
            raise InputError(f"--eval_steps {self.eval_steps}: expected an integer >= 1")
        if self.lr_scheduler_type not in SCHEDULERS:
            raise InputError(f"--lr_scheduler_type {self.lr_scheduler_type!r}: expected one of {', '.join(SCHEDULERS)}")
        if self.early_stopping_patience is not None and self.early_stopping_patience < 1:
            raise InputError(f"--early_stopping_patience {self.early_stopping_patience}: expected an integer >= 1")
        if self.early_stopping_patience and not self.eval_steps:
            raise InputError(f"--early_stopping_patience {self.early_stopping_patience}: needs --eval_steps N (evaluations "
                             "during training to compare)")
        if self.metric_for_best_model is not None and not self.metric_for_best_model.strip():
            raise InputError("--metric_for_best_model '': expected a metric name such as eval_loss or eval_accuracy")
        log_with(self.report_to)  # validates
        if self.output_dir:
            ckpt.check_output_dir(self.output_dir)
        if self.resume_from_checkpoint not in (None, "", "latest"):
            ckpt.check_checkpoint_path(self.resume_from_checkpoint)

    @classmethod
    def from_args(cls, args: argparse.Namespace, **overrides: Any) -> "TrainingConfig":
        """Build from parsed arguments (fields missing in ``args`` keep their defaults)."""
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in vars(args).items() if k in names}
        values.update(overrides)
        return cls(**values)


def add_training_arguments(parser: argparse.ArgumentParser, **defaults: Any) -> None:
    """Add the shared loop's arguments (Hugging Face example-script names) to ``parser``.

    ``defaults`` overrides default values, e.g. ``learning_rate=2e-5`` for fine-tuning. Help texts carry no
    default of their own: use :class:`training.run.HelpFormatter`, which appends the real one once (and none
    for a ``None`` default, whose help then says what applies).
    """
    d = {f.name: f.default for f in dataclasses.fields(TrainingConfig) if f.default is not dataclasses.MISSING}
    d.update({"per_device_train_batch_size": 32, "per_device_eval_batch_size": 64, "mixed_precision": None})
    d.update(defaults)
    g = parser.add_argument_group("training loop")
    g.add_argument("--output_dir", default=d.get("output_dir"), help="run folder (model, checkpoints/, runs/, wandb/, all_results.json)")
    g.add_argument("--overwrite_output_dir", action="store_true", help="allow a non-empty --output_dir (its checkpoints are ignored unless resuming)")
    g.add_argument("--per_device_train_batch_size", type=int, default=d["per_device_train_batch_size"], help="micro-batch size per process")
    g.add_argument("--per_device_eval_batch_size", type=int, default=d["per_device_eval_batch_size"], help="evaluation batch size per process")
    g.add_argument("--gradient_accumulation_steps", type=int, default=d["gradient_accumulation_steps"], help="micro-batches per process per optimizer step")
    g.add_argument("--learning_rate", type=float, default=d["learning_rate"], help=d.get("learning_rate_help", "peak learning rate"))
    g.add_argument("--weight_decay", type=float, default=d["weight_decay"], help="AdamW weight decay, not on biases/norms")
    g.add_argument("--adam_beta1", type=float, default=d["adam_beta1"], help="AdamW beta1")
    g.add_argument("--adam_beta2", type=float, default=d["adam_beta2"], help="AdamW beta2")
    g.add_argument("--adam_epsilon", type=float, default=d["adam_epsilon"], help="AdamW epsilon")
    g.add_argument("--optim", default=d["optim"], choices=list(OPTIMIZERS), help="AdamW implementation: the fused kernel (where the device has it) or foreach")
    g.add_argument("--lr_scheduler_type", default=d["lr_scheduler_type"], choices=list(SCHEDULERS), help="learning-rate schedule")
    g.add_argument("--num_warmup_steps", type=int, default=d["num_warmup_steps"], help="optimizer steps of linear warmup (overrides --warmup_ratio)")
    g.add_argument("--warmup_ratio", type=float, default=d["warmup_ratio"], help="warmup as a fraction of the run's optimizer steps, when --num_warmup_steps is not given")
    g.add_argument("--num_decay_steps", type=int, default=d["num_decay_steps"], help="warmup_stable_decay: steps of the final decay (default: 10%% of the run)")
    g.add_argument("--max_train_steps", type=int, default=d["max_train_steps"], help="optimizer steps of the run (overrides --num_train_epochs)")
    g.add_argument("--num_train_epochs", type=float, default=d["num_train_epochs"], help="passes over the training data, unless --max_train_steps is given")
    g.add_argument("--max_grad_norm", type=float, default=d["max_grad_norm"], help="gradient clipping norm, 0 = none")
    g.add_argument("--checkpointing_steps", type=int, default=d["checkpointing_steps"], help="checkpoint every N optimizer steps (always one at the end)")
    g.add_argument("--checkpoints_total_limit", type=int, default=d["checkpoints_total_limit"], help="keep the last K checkpoints, 0 = all")
    g.add_argument("--resume_from_checkpoint", default=d["resume_from_checkpoint"], help="'latest' (newest in <output_dir>/checkpoints) or a checkpoint folder")
    g.add_argument("--logging_steps", type=int, default=d["logging_steps"], help="log every N optimizer steps")
    g.add_argument("--eval_steps", type=int, default=d["eval_steps"], help="evaluate every N optimizer steps (and at the end)")
    g.add_argument("--report_to", default=d["report_to"], help="trackers, a comma list of tensorboard, wandb (or all, none): tensorboard writes <output_dir>/runs/, wandb <output_dir>/wandb/ (offline without credentials)")
    g.add_argument("--seed", type=int, default=d["seed"], help="random seed")
    g.add_argument("--skip_nonfinite_steps", type=int, default=d["skip_nonfinite_steps"], help="skip up to N optimizer steps with a NaN/inf loss or gradient norm (warning each) before stopping")
    g.add_argument("--mixed_precision", default=d["mixed_precision"], choices=["no", "fp16", "bf16"], help="override the accelerate config's mixed precision")
    g.add_argument("--torch_compile", action="store_true", default=d["torch_compile"], help="compile the model with torch.compile (faster steps on a GPU after a compilation of a minute or so)")
    g.add_argument("--metric_for_best_model", default=d["metric_for_best_model"], help="evaluation metric that picks the best model and drives early stopping (default: the task's main metric; pretrain: eval_loss)")
    g.add_argument("--greater_is_better", default=d["greater_is_better"], type=_parse_bool, help="whether a larger --metric_for_best_model is better (default: false for losses and perplexities, else true)")
    g.add_argument("--load_best_model_at_end", action="store_true", default=d["load_best_model_at_end"], help="checkpoint at every evaluation, keep the best checkpoint, end with its weights")
    g.add_argument("--early_stopping_patience", type=int, default=d["early_stopping_patience"], help="stop after N evaluations without improvement of --metric_for_best_model (needs --eval_steps)")
    g.add_argument("--gradient_checkpointing", action="store_true", default=d["gradient_checkpointing"], help="recompute activations in the backward pass (less memory, slower); models that support it")


def _parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r}: expected true or false")


def best_metric_name(config: TrainingConfig) -> str:
    """``metric_for_best_model`` with the ``eval_`` prefix (``accuracy`` -> ``eval_accuracy``); ``eval_loss`` when
    unset."""
    name = config.metric_for_best_model or "eval_loss"
    return name if name.startswith("eval_") else f"eval_{name}"


def greater_is_better(config: TrainingConfig) -> bool:
    """``config.greater_is_better``, else derived from the metric name: losses and perplexities are better lower."""
    if config.greater_is_better is not None:
        return config.greater_is_better
    name = best_metric_name(config)
    return not ("loss" in name or "perplexity" in name)


#: ``trainer_state.json`` keys of the best-model bookkeeping.
_BEST_KEYS = ("best_metric", "best_step", "evals_without_improvement")


def enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    """``model.gradient_checkpointing_enable()`` (non-reentrant checkpoints) for models that support it.

    Raises:
        InputError: the model has no gradient checkpointing (``supports_gradient_checkpointing`` false).
    """
    if not getattr(model, "supports_gradient_checkpointing", False) or not hasattr(model, "gradient_checkpointing_enable"):
        raise InputError(f"--gradient_checkpointing: {type(model).__name__} does not support gradient checkpointing; "
                         "expected a model with supports_gradient_checkpointing (e.g. SesameBert), or drop the flag")
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x name; the old one is deprecated
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def make_accelerator(config: TrainingConfig, mixed_precision: str | None = None):
    """An ``Accelerator`` for the shared loop: trackers from ``report_to``, project folder ``output_dir``.

    ``rng_types=[]``: accelerate must not re-synchronise the global RNG at each epoch (dropout streams are
    per process and restored from checkpoints). ``non_blocking=True``: batches go to the GPU from pinned memory
    (:func:`make_train_dataloader` pins on CUDA) without waiting for the GPU's queue. CPU / multi-process /
    mixed precision come from ``accelerate launch`` (config file or flags); ``mixed_precision`` overrides.
    """
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration, ProjectConfiguration, set_seed

    prepare_environment(config.report_to, config.output_dir)
    project = ProjectConfiguration(project_dir=config.output_dir, logging_dir=os.path.join(config.output_dir, "runs"))
    accelerator = Accelerator(
        cpu=_no_accelerator_device(),
        mixed_precision=mixed_precision,
        log_with=log_with(config.report_to),
        project_config=project,
        rng_types=[],
        gradient_accumulation_steps=1,
        dataloader_config=DataLoaderConfiguration(non_blocking=True),
    )
    set_seed(config.seed)
    return accelerator


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


class EpochShuffleSampler(Sampler[int]):
    """A random permutation of ``range(num_samples)`` that depends only on ``(seed, epoch)``.

    Every process draws the same permutation (accelerate then shards it), the global RNG is not touched, and
    the order of an epoch can be reproduced at resume time by :meth:`set_epoch`.
    """

    def __init__(self, num_samples: int, seed: int, shuffle: bool = True):
        self.num_samples, self.seed, self.shuffle, self.epoch = num_samples, seed, shuffle, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_samples

    def __iter__(self):
        if not self.shuffle:
            return iter(range(self.num_samples))
        g = torch.Generator().manual_seed(epoch_seed(self.seed, self.epoch))
        return iter(torch.randperm(self.num_samples, generator=g).tolist())


def make_train_dataloader(dataset, batch_size: int, collate_fn: Callable, seed: int, shuffle: bool = True,
                          num_workers: int = 0, sampler: Sampler | None = None) -> DataLoader:
    """A training DataLoader fit for exact resume: ``sampler`` (default :class:`EpochShuffleSampler`; another one
    must order the examples by ``(seed, epoch)`` through its ``set_epoch``), its own ``generator``, and pinned
    memory on CUDA.

    Raises:
        InputError: ``batch_size < 1`` or an empty dataset.
    """
    if batch_size < 1:
        raise InputError(f"--per_device_train_batch_size {batch_size}: expected an integer >= 1")
    if len(dataset) == 0:
        raise InputError("the training data is empty after preprocessing; expected at least one example")
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler if sampler is not None else EpochShuffleSampler(len(dataset), seed, shuffle),
        collate_fn=collate_fn,
        num_workers=num_workers,
        generator=torch.Generator().manual_seed(seed),
        drop_last=False,
        pin_memory=torch.cuda.is_available(),  # with the accelerator's non_blocking copies: no wait per batch
    )


def make_stream_dataloader(dataset: torch.utils.data.IterableDataset, batch_size: int, collate_fn: Callable,
                           num_workers: int = 0) -> DataLoader:
    """A training DataLoader over a stream (a torch ``IterableDataset``, e.g. :class:`pretrain.data.StreamedBlocks`).

    The stream is read in order (no shuffling); prepared by accelerate, the main process reads it and dispatches the
    batches to the other processes (``dispatch_batches``). A resumed run replays the stream up to its saved position.

    Raises:
        InputError: ``batch_size < 1``.
    """
    if batch_size < 1:
        raise InputError(f"--per_device_train_batch_size {batch_size}: expected an integer >= 1")
    return DataLoader(dataset, batch_size=batch_size, collate_fn=collate_fn, num_workers=num_workers,
                      pin_memory=torch.cuda.is_available())


def _length(obj) -> int | None:
    """``len(obj)``, or None for an object without a length (an iterable dataset or its DataLoader)."""
    try:
        return len(obj)
    except TypeError:
        return None


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


class Trainer:
    """The shared loop; see the module docstring.

    Args:
        accelerator: from :func:`make_accelerator`.
        model: the model (not yet prepared); trained in place.
        train_dataloader: not yet prepared; see :func:`make_train_dataloader` for exact resume.
        config: the loop's settings.
        optimizer: default :func:`training.optim.create_optimizer` from ``config``.
        loss_fn: ``(model, batch) -> scalar loss``, the mean over the batch's predicted items.
        weight_fn: ``batch -> int | 0-d tensor``, the number of items ``loss_fn`` averages over (known before the
            forward); return a tensor on the batch's device to avoid a host sync.
        tokens_fn: ``batch -> int | 0-d tensor``, tokens processed (for tokens/s).
        eval_fn: ``(trainer) -> dict[str, float]``, called on all processes.
        run_config: hyper-parameters to record with the trackers.
        on_save: ``(trainer, step) -> None``, called on **every** process after each periodic checkpoint
            (``checkpointing_steps``) is complete, not after the final one nor the one written on a stop
            request; the processes then wait for each other. The hook does its main-process work itself
            (e.g. :func:`training.hub.every_save_hook` for ``--hub_strategy every_save``).

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
    ):
        self.accelerator, self.config = accelerator, config
        self.on_save = on_save
        self.loss_fn, self.weight_fn, self.tokens_fn, self.eval_fn = loss_fn, weight_fn, tokens_fn, eval_fn
        self.run_config = dict(run_config or dataclasses.asdict(config))
        if optimizer is None:
            optimizer = create_optimizer(
                model, config.learning_rate, config.weight_decay, (config.adam_beta1, config.adam_beta2), config.adam_epsilon,
                fused=OPTIMIZERS[config.optim],
            )
        if config.gradient_checkpointing:
            enable_gradient_checkpointing(model)
        self.collator = train_dataloader.collate_fn
        self.per_device_train_batch_size = int(train_dataloader.batch_size or 1)
        self.num_train_examples = _length(train_dataloader.dataset)  # None: a stream (torch IterableDataset)
        self.model, self.optimizer, self.train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)
        if config.torch_compile:  # after prepare: accelerate saves/loads the eager (prepared) model it holds
            self.model = torch.compile(self.model)
        self.num_epoch_batches = _length(self.train_dataloader)
        if self.num_epoch_batches == 0:
            raise InputError("the training data gives no batch on this process; expected more examples than processes")
        G = config.gradient_accumulation_steps
        if self.num_epoch_batches is None:  # a stream: its length is unknown until it ends
            if config.max_train_steps is None:
                raise InputError("--max_train_steps: not given, but a streamed dataset has no length to count epochs in; "
                                 "expected --max_train_steps with --streaming")
            self.num_update_steps_per_epoch = None
        else:
            self.num_update_steps_per_epoch = math.ceil(self.num_epoch_batches / G)
        if config.max_train_steps is None:
            self.max_train_steps = max(1, math.ceil(config.num_train_epochs * self.num_update_steps_per_epoch))
        else:
            self.max_train_steps = config.max_train_steps
        if config.num_warmup_steps is not None:
            self.num_warmup_steps = config.num_warmup_steps
        else:
            self.num_warmup_steps = math.ceil(config.warmup_ratio * self.max_train_steps)
        self.scheduler = create_scheduler(
            config.lr_scheduler_type, self.optimizer, self.num_warmup_steps, self.max_train_steps, config.num_decay_steps
        )
        # the schedule's state goes into trainer_state.json (JSON), not a pickled custom_checkpoint_0.pkl
        self.state: dict[str, Any] = {
            "global_step": 0, "epoch": 0, "batches_in_epoch": 0, "loss_sum": 0.0, "weight_sum": 0.0,
            "max_train_steps": self.max_train_steps, "num_processes": accelerator.num_processes,
            "gradient_accumulation_steps": G, "per_device_train_batch_size": self.per_device_train_batch_size,
            "num_train_examples": self.num_train_examples, "eval_history": [], "nonfinite_skipped": 0,
            "best_metric": None, "best_step": None, "evals_without_improvement": 0,
        }
        self.log_history: list[dict[str, Any]] = []
        self.stop_requested = False
        self.checkpoints_dir = os.path.join(config.output_dir, "checkpoints")

    # -- helpers -----------------------------------------------------------------------------------------
    @property
    def global_batch_size(self) -> int:
        """Examples per optimizer step: per-device batch x processes x accumulation steps."""
        return self.per_device_train_batch_size * self.accelerator.num_processes * self.config.gradient_accumulation_steps

    def plan(self) -> dict[str, Any]:
        """The run plan: ``global_batch_size`` (examples per optimizer step), ``max_train_steps``, ``epochs``
        (passes over the training data those steps make), ``num_warmup_steps``, ``steps_per_epoch`` and
        ``train_examples``."""
        return {
            "global_batch_size": self.global_batch_size, "max_train_steps": self.max_train_steps,
            "steps_per_epoch": self.num_update_steps_per_epoch,
            "epochs": self.max_train_steps / self.num_update_steps_per_epoch if self.num_update_steps_per_epoch else None,
            "num_warmup_steps": self.num_warmup_steps, "train_examples": self.num_train_examples,
            "num_processes": self.accelerator.num_processes,
            "per_device_train_batch_size": self.per_device_train_batch_size,
            "gradient_accumulation_steps": self.config.gradient_accumulation_steps,
        }

    @property
    def unwrapped_model(self) -> torch.nn.Module:
        return self.accelerator.unwrap_model(self.model, keep_torch_compile=False)

    def _set_epoch(self, epoch: int) -> None:
        self.train_dataloader.set_epoch(epoch)
        if hasattr(self.collator, "set_epoch"):
            self.collator.set_epoch(epoch)

    def _epoch_position(self) -> float:
        """Epochs done, with the fraction of the current one (whole epochs only for a stream)."""
        if not self.num_epoch_batches:
            return float(self.state["epoch"])
        return self.state["epoch"] + self.state["batches_in_epoch"] / self.num_epoch_batches

    def _as_device_scalar(self, value) -> torch.Tensor:
        """A count (int or 0-d tensor) as a float64 0-d tensor on the accelerator's device, without a host sync."""
        if isinstance(value, torch.Tensor):
            return value.detach().to(device=self.accelerator.device, dtype=torch.float64).reshape(())
        return torch.full((), float(value), dtype=torch.float64, device=self.accelerator.device)  # a fill, no copy

    def _reduce_tensor(self, t: torch.Tensor) -> torch.Tensor:
        """Sum over processes (identity with one process)."""
        if self.accelerator.num_processes > 1:
            t = self.accelerator.reduce(t, reduction="sum")
        return t

    def save_checkpoint(self) -> str:
        """Write ``checkpoints/step_<global_step>`` (all processes must call it); with ``load_best_model_at_end``
        the best step's checkpoint is kept by the rotation."""
        state = dict(self.state, lr_scheduler=self.scheduler.state_dict())
        protect = [self.state["best_step"]] if self.config.load_best_model_at_end and self.state["best_step"] is not None else []
        path = ckpt.save_checkpoint(
            self.accelerator, self.checkpoints_dir, self.state["global_step"], state, self.config.checkpoints_total_limit,
            protect=protect,
        )
        self.last_checkpoint = str(path)
        return str(path)

    def _resume(self) -> None:
        path = ckpt.resolve_checkpoint(self.config.resume_from_checkpoint, self.checkpoints_dir)
        if path is None:
            return
        saved = ckpt.read_state(path)
        self._check_resume_geometry(path, saved)
        try:
            self.accelerator.load_state(str(path))
            if "lr_scheduler" in saved:
                self.scheduler.load_state_dict(saved["lr_scheduler"])
        except (RuntimeError, KeyError, ValueError) as err:  # shapes/names/param groups that do not fit
            first = first_line(err)[:300]
            raise InputError(
                f"--resume_from_checkpoint {path}: does not fit this model/optimizer ({type(err).__name__}: {first}); "
                "expected a checkpoint written by a run with the same model config"
            ) from err
        self.state.update({k: saved[k] for k in ("global_step", "epoch", "loss_sum", "weight_sum", "eval_history",
                                                 "nonfinite_skipped", *_BEST_KEYS) if k in saved})
        # the position in the epoch is counted in examples, so that another split of the same global batch
        # (processes x per-device batch x accumulation) continues with the very next examples
        per_micro_batch = self.per_device_train_batch_size * self.accelerator.num_processes
        examples = int(saved.get("batches_in_epoch", 0)) * int(saved.get("per_device_train_batch_size", self.per_device_train_batch_size)) * int(saved.get("num_processes", self.accelerator.num_processes))
        self.state["batches_in_epoch"] = examples // per_micro_batch
        self.last_checkpoint = str(path)
        if self.accelerator.is_main_process:
            logger.info("resumed from %s at step %d (epoch %d, %d micro-batches in)", path, self.state["global_step"], self.state["epoch"], self.state["batches_in_epoch"])

    def _check_resume_geometry(self, path, saved: Mapping[str, Any]) -> None:
        """Refuse a resume that would skip or repeat data or change the schedule: another global batch, another
        number of optimizer steps or another training set size. Another split of the same global batch
        (processes, per-device batch, accumulation) is fine: the position is counted in examples.

        Raises:
            InputError: one line naming what changed, the saved and the current value.
        """
        P, G, b = self.accelerator.num_processes, self.config.gradient_accumulation_steps, self.per_device_train_batch_size
        sP = int(saved.get("num_processes", P))
        sG = int(saved.get("gradient_accumulation_steps", G))
        sb = int(saved.get("per_device_train_batch_size", b))
        changes = []
        if sP * sG * sb != P * G * b:
            changes.append(f"global batch {sP * sG * sb} ({sP} processes x {sb} per device x {sG} accumulation) -> "
                           f"{P * G * b} ({P} x {b} x {G})")
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

    def evaluate(self) -> dict[str, float]:
        """Run ``eval_fn`` (all processes), record and log the metrics, and update the best model's bookkeeping
        (``best_metric``, ``best_step``, ``evals_without_improvement`` in :attr:`state`).

        The evaluation before the first step (``eval_steps`` runs one at step 0) is recorded but is no candidate
        for the best model (there is no checkpoint of it).

        Raises:
            InputError: ``metric_for_best_model`` is not among the metrics (with ``load_best_model_at_end``,
                ``early_stopping_patience`` or an explicit ``metric_for_best_model``).
        """
        if self.eval_fn is None:
            return {}
        metrics = {k: float(v) for k, v in self.eval_fn(self).items()}
        step = self.state["global_step"]
        self.state["eval_history"].append({"step": step, **metrics})
        self.accelerator.log(metrics, step=step)
        if self.accelerator.is_main_process:
            logger.info("step %d: %s", step, " ".join(f"{k}={v:.4g}" for k, v in metrics.items()))
        self._update_best(metrics, step)
        return metrics

    def _update_best(self, metrics: Mapping[str, float], step: int) -> None:
        cfg, name = self.config, best_metric_name(self.config)
        if name not in metrics:
            if cfg.load_best_model_at_end or cfg.early_stopping_patience or cfg.metric_for_best_model:
                raise InputError(f"--metric_for_best_model {cfg.metric_for_best_model or name}: not among the evaluation "
                                 f"metrics {sorted(metrics)}; expected one of them")
            return
        if step == 0:
            return
        value, best = metrics[name], self.state["best_metric"]
        better = greater_is_better(cfg)
        if math.isfinite(value) and (best is None or (value > best if better else value < best)):
            self.state.update(best_metric=value, best_step=step, evals_without_improvement=0)
        else:
            self.state["evals_without_improvement"] += 1

    def _should_stop_early(self) -> bool:
        patience = self.config.early_stopping_patience
        return bool(patience) and self.state["evals_without_improvement"] >= patience

    # -- the loop ----------------------------------------------------------------------------------------
    def _consume_batches(self, n: int, per_epoch_batches: int) -> bool:
        """Count ``n`` micro-batches of the current epoch as consumed; True when that ends the epoch (the state
        then points at the start of the next one). ``per_epoch_batches`` is None for a stream (its end is found
        when it gives no more batches)."""
        self.state["batches_in_epoch"] += n
        if per_epoch_batches is not None and self.state["batches_in_epoch"] >= per_epoch_batches:
            self.state["epoch"] += 1
            self.state["batches_in_epoch"] = 0
            return True
        return False

    @staticmethod
    def _new_interval() -> dict[str, float]:
        """Sums over the steps since the last logging step (host floats, filled by :meth:`_read_pending`)."""
        return {"loss": 0.0, "weight": 0.0, "tokens": 0.0, "samples": 0.0, "time": 0.0, "steps": 0,
                "grad_norm": float("nan"), "stop": 0.0}

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
        return (bool(getattr(inner, "_step_supports_amp_scaling", False))
                and getattr(self.accelerator, "scaler", None) is None
                and type(self.optimizer).__name__ != "DeepSpeedOptimizerWrapper")

    def _read_pending(self, pending: list, interval: dict[str, float], bar) -> bool:
        """Read the statistics of the ``pending`` steps to the host in one copy, add them to ``interval`` and the
        run's sums, and empty ``pending``. A non-finite step's update was not applied: it is counted against
        ``skip_nonfinite_steps`` (a warning) or stops the run. Returns True when the last pending step was
        non-finite (and skipped).

        Raises:
            NonFiniteLossError: more non-finite steps than ``skip_nonfinite_steps``.
        """
        if not pending:
            return False
        cfg = self.config
        rows = torch.stack([stats for *_, stats in pending]).tolist()  # the one host read
        steps, last_bad = [(step, where, samples) for step, where, samples, _ in pending], False
        pending.clear()
        for (step, where, samples), (loss, weight, tokens, bad, norm, stop) in zip(steps, rows):
            interval["tokens"] += tokens
            interval["samples"] += samples
            interval["grad_norm"] = norm
            interval["stop"] = max(interval["stop"], stop)
            last_bad = bad > 0
            if not last_bad:
                interval["loss"] += loss
                interval["weight"] += weight
                self.state["loss_sum"] += loss
                self.state["weight_sum"] += weight
                continue
            step_loss = loss / max(weight, 1e-12)
            if self.state["nonfinite_skipped"] < cfg.skip_nonfinite_steps:
                self.state["nonfinite_skipped"] += 1
                logger.warning(
                    "non-finite loss (%s) or gradient norm (%s) at optimizer step %d (%s): update skipped, its "
                    "batches consumed (%d of --skip_nonfinite_steps %d)", step_loss, norm, step, where,
                    self.state["nonfinite_skipped"], cfg.skip_nonfinite_steps)
                continue
            bar.close()
            kept = f"the last good checkpoint is {self.last_checkpoint}" if self.last_checkpoint else "no checkpoint was written yet"
            tolerance = f" after {self.state['nonfinite_skipped']} skipped step(s) (--skip_nonfinite_steps {cfg.skip_nonfinite_steps})" if cfg.skip_nonfinite_steps else ""
            found = f" (found at step {steps[-1][0]}, where the statistics were read)" if steps[-1][0] != step else ""
            raise NonFiniteLossError(
                f"non-finite loss ({step_loss}) or gradient norm ({norm}) at optimizer step {step} ({where}){tolerance}"
                f"{found}; its update was not applied and training stopped, {kept}; try a lower --learning_rate or "
                "--max_grad_norm, --skip_nonfinite_steps N, or check the data of that step"
            )
        return last_bad

    def train(self) -> dict[str, Any]:
        """Train to ``max_train_steps``; return ``train_loss`` (mean per item over the whole run, resumed parts
        included), ``train_runtime_s``, ``train_tokens_per_second``, ``train_samples_per_second`` (this
        session, evaluation and checkpointing excluded), ``global_step``, ``eval_history`` and the last eval
        metrics.

        Raises:
            NonFiniteLossError: a NaN/inf loss or gradient norm (no optimizer step is taken with it).
        """
        acc, cfg, G = self.accelerator, self.config, self.config.gradient_accumulation_steps
        self.last_checkpoint = None
        if acc.is_main_process:
            os.makedirs(cfg.output_dir, exist_ok=True)
        if acc.log_with:
            acc.init_trackers(cfg.project_name, config=sanitize_config(self.run_config))
        self._resume()
        from tqdm.auto import tqdm

        if cfg.eval_steps and self.state["global_step"] == 0 and self.eval_fn is not None:
            self.evaluate()  # the starting point of the validation curve
        bar = tqdm(total=self.max_train_steps, initial=self.state["global_step"], disable=not acc.is_local_main_process, desc="train", dynamic_ncols=True)
        per_epoch_batches = self.num_epoch_batches
        train_time = 0.0
        session_tokens = session_samples = 0.0
        interval = self._new_interval()
        eta_logged = False
        metrics: dict[str, float] = {}
        stopping_early = self._should_stop_early()  # a resumed run that had already stopped early
        t_start = time.perf_counter()
        # Per-step statistics stay on the device until a sync point (a logging, evaluation or checkpoint step, the
        # last step, or every step when the optimizer cannot skip an update on the device): then they are read
        # back in one packed copy. See :meth:`_read_pending`.
        pending: list[tuple[int, str, int, torch.Tensor]] = []
        device_skip = self._device_skip_supported()
        single = acc.num_processes == 1
        while self.state["global_step"] < self.max_train_steps and not stopping_early:
            self._set_epoch(self.state["epoch"])
            loader = self.train_dataloader
            if self.state["batches_in_epoch"]:
                loader = acc.skip_first_batches(loader, self.state["batches_in_epoch"])
            batches = iter(loader)
            while self.state["global_step"] < self.max_train_steps:
                t0 = time.perf_counter()
                group = list(islice(batches, G))
                if not group:
                    if per_epoch_batches is None:  # the stream ended: the next pass is the next epoch
                        self.state["epoch"] += 1
                        self.state["batches_in_epoch"] = 0
                    break
                weights = [self._as_device_scalar(self.weight_fn(b)) for b in group]
                tokens = sum(self._as_device_scalar(self.tokens_fn(b)) for b in group)
                samples = sum(int(next(v for v in b.values() if isinstance(v, torch.Tensor)).shape[0]) for b in group)
                total_weight = self._reduce_tensor(torch.stack(weights).sum())
                scale = acc.num_processes / total_weight.clamp_min(1e-12)
                self.model.train()
                loss_sum = torch.zeros((), dtype=torch.float64, device=acc.device)
                nonfinite = torch.zeros((), dtype=torch.float64, device=acc.device)
                for i, batch in enumerate(group):
                    sync = i == len(group) - 1
                    with contextlib.nullcontext() if sync else acc.no_sync(self.model):
                        loss = self.loss_fn(self.model, batch)
                        acc.backward(loss * (weights[i] * scale).to(loss.dtype))
                    detached = loss.detach().double()
                    nonfinite = torch.maximum(nonfinite, (~torch.isfinite(detached)).double())
                    loss_sum += detached * weights[i]
                max_norm = cfg.max_grad_norm if cfg.max_grad_norm else float("inf")
                grad_norm_t = acc.clip_grad_norm_(self.model.parameters(), max_norm)
                measured = grad_norm_t is not None  # DeepSpeed clips inside its engine and returns None
                local = torch.stack([loss_sum, nonfinite, tokens, torch.full_like(loss_sum, float(self.stop_requested))])
                reduced = self._reduce_tensor(local)  # one all-reduce per step, on the device
                norm = grad_norm_t.detach().double().reshape(()).to(acc.device) if measured else torch.full((), float("nan"), dtype=torch.float64, device=acc.device)
                # an fp16 GradScaler skips steps with inf/NaN gradients itself (and lowers its scale)
                scaler_active = getattr(acc, "scaler", None) is not None
                bad = (reduced[1] > 0) | ~torch.isfinite(reduced[0])
                if measured and not scaler_active:
                    bad = bad | ~torch.isfinite(norm)
                step = self.state["global_step"] + 1
                where = f"epoch {self.state['epoch']}, micro-batches {self.state['batches_in_epoch'] + 1}-{self.state['batches_in_epoch'] + len(group)} of the epoch"
                pending.append((step, where, samples, torch.stack([reduced[0], total_weight, reduced[2], bad.double(), norm, reduced[3]])))
                if device_skip:  # the fused kernel leaves weights, moments and step count as they are when bad
                    inner = self._inner_optimizer()
                    inner.found_inf = bad.float()
                    try:
                        self.optimizer.step()
                    finally:
                        del inner.found_inf
                elif not self._read_pending(pending, interval, bar):  # read now, to decide on the host
                    self.optimizer.step()
                if not acc.optimizer_step_was_skipped:
                    self.scheduler.step()
                self.optimizer.zero_grad(set_to_none=True)
                interval["time"] += time.perf_counter() - t0
                interval["steps"] += 1
                self.state["global_step"] = step
                self._consume_batches(len(group), per_epoch_batches)
                bar.update(1)
                logging_step = step % cfg.logging_steps == 0 or step == self.max_train_steps
                evaluated = bool(cfg.eval_steps) and step % cfg.eval_steps == 0 and step != self.max_train_steps
                periodic = bool(cfg.checkpointing_steps) and step % cfg.checkpointing_steps == 0 and step != self.max_train_steps
                if logging_step or evaluated or periodic or (single and self.stop_requested):
                    t_read = time.perf_counter()
                    self._read_pending(pending, interval, bar)
                    interval["time"] += time.perf_counter() - t_read
                stop_now = interval["stop"] > 0 and step != self.max_train_steps
                if logging_step:
                    train_time += interval["time"]
                    session_tokens += interval["tokens"]
                    session_samples += interval["samples"]
                    lr = self.scheduler.get_last_lr()[0]
                    record = {
                        "train_loss": interval["loss"] / max(interval["weight"], 1e-12),
                        "learning_rate": lr,
                        "grad_norm": interval["grad_norm"],
                        "tokens_per_second": interval["tokens"] / max(interval["time"], 1e-9),
                        "samples_per_second": interval["samples"] / max(interval["time"], 1e-9),
                        "epoch": self._epoch_position(),
                    }
                    acc.log(record, step=step)
                    self.log_history.append({"step": step, **record})
                    if not eta_logged and acc.is_main_process and step < self.max_train_steps:
                        eta_logged = True
                        per_step = interval["time"] / max(interval["steps"], 1)
                        logger.info("step %d/%d: %.3g s per optimizer step, %.0f tokens/s; estimated time to finish: %s "
                                    "(evaluation and checkpoints not included)", step, self.max_train_steps, per_step,
                                    record["tokens_per_second"], format_duration(per_step * (self.max_train_steps - step)))
                    bar.set_postfix(loss=f"{record['train_loss']:.4f}", lr=f"{lr:.2e}", refresh=False)
                    interval = self._new_interval()
                if evaluated:
                    metrics = self.evaluate()
                    stopping_early = self._should_stop_early()
                if periodic or (evaluated and cfg.load_best_model_at_end and not stopping_early):
                    self.save_checkpoint()
                    if self.on_save is not None and periodic:
                        self.on_save(self, step)
                        acc.wait_for_everyone()
                if stopping_early:
                    if acc.is_main_process:
                        logger.info("early stopping at step %d: %d evaluations without improvement of %s (best %.6g at step %s)",
                                    step, self.state["evals_without_improvement"], best_metric_name(cfg),
                                    self.state["best_metric"], self.state["best_step"])
                    break
                if stop_now:
                    bar.close()
                    path = self.save_checkpoint()
                    raise TrainingStopped(
                        f"training stopped on request after optimizer step {step}; checkpoint {path} written; "
                        f"resume with --resume_from_checkpoint latest (same --output_dir {cfg.output_dir})", path
                    )
                if self.state["batches_in_epoch"] == 0:
                    break  # epoch finished
            if stopping_early:
                break
        self._read_pending(pending, interval, bar)
        train_time += interval["time"]
        session_tokens += interval["tokens"]
        session_samples += interval["samples"]
        bar.close()
        if self.eval_fn is not None and not stopping_early:
            metrics = self.evaluate()
        elif stopping_early:
            metrics = {k: v for k, v in self.state["eval_history"][-1].items() if k != "step"}
        self.save_checkpoint()
        metrics = self._load_best_model(metrics)
        result: dict[str, Any] = {
            "train_loss": self.state["loss_sum"] / max(self.state["weight_sum"], 1e-12),
            "train_runtime_s": time.perf_counter() - t_start,
            "train_tokens_per_second": session_tokens / max(train_time, 1e-9),
            "train_samples_per_second": session_samples / max(train_time, 1e-9),
            "global_step": self.state["global_step"],
            "epoch": self._epoch_position(),
        }
        result.update(metrics)
        if self.state["best_step"] is not None:
            result.update(best_step=self.state["best_step"], best_metric=self.state["best_metric"])
        result["stopped_early"] = stopping_early
        result["replica_max_abs_diff"] = self.replica_difference()
        result["eval_history"] = list(self.state["eval_history"])
        result["log_history"] = list(self.log_history)
        return result

    def _load_best_model(self, last_metrics: dict[str, float]) -> dict[str, float]:
        """With ``load_best_model_at_end``: load the best step's checkpoint (model, optimizer, RNG states) when it
        is not the last step and return the metrics recorded at that step; else return ``last_metrics``. (Side
        products of ``eval_fn``, e.g. saved predictions, are the last evaluation's: run ``eval_fn`` again for
        the best model's.)"""
        best = self.state["best_step"]
        if not self.config.load_best_model_at_end or best is None or best == self.state["global_step"]:
            return last_metrics
        path = os.path.join(self.checkpoints_dir, f"step_{best}")
        problem = ckpt.verify_checkpoint(path)
        if problem is not None:
            raise InputError(f"--load_best_model_at_end: the best checkpoint {path} is damaged ({problem}); expected it intact")
        self.accelerator.load_state(path)
        if self.accelerator.is_main_process:
            logger.info("loaded the best model: step %d (%s = %.6g)", best, best_metric_name(self.config), self.state["best_metric"])
        record = next(e for e in reversed(self.state["eval_history"]) if e["step"] == best)
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


def format_duration(seconds: float) -> str:
    """``seconds`` as ``1h 02m 03s`` / ``2m 03s`` / ``3.4s``."""
    if not math.isfinite(seconds):
        return "unknown"
    if seconds < 60:
        return f"{seconds:.1f}s"
    m, sec = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}h {m:02d}m {sec:02d}s" if h else f"{m}m {sec:02d}s"


# -- evaluation helpers --------------------------------------------------------------------------------------
def evaluate_sums(
    accelerator,
    model: torch.nn.Module,
    dataset,
    collate_fn: Callable,
    batch_size: int,
    step_fn: Callable[[torch.nn.Module, Mapping[str, Any]], Mapping[str, torch.Tensor]],
    keys: Sequence[str],
) -> dict[str, float]:
    """Sums of per-batch statistics over a whole dataset, exact across processes and distributed types.

    Each process evaluates a disjoint contiguous shard of ``dataset`` (no example twice, none left out) with the
    *prepared* model (DDP, FSDP, ...) in eval mode under ``accelerator.autocast()``. Every process runs the same
    number of forward passes -- under FSDP each forward all-gathers the weights, so a process with one batch more
    would wait forever --: a process whose shard is shorter runs its first batch again (the dataset's first example
    when its shard is empty) and discards its statistics. ``step_fn(model, batch)`` returns sums
    (e.g. ``{"nll_sum": ..., "count": ...}``), added in float64 and summed over processes with one all-reduce.
    Perplexity = ``exp(nll_sum / count)`` is then exact (sums and counts, never means of means).

    Returns:
        ``{key: global sum}`` for every name in ``keys``.
    """
    from accelerate.utils import send_to_device

    n, P, rank = len(dataset), accelerator.num_processes, accelerator.process_index
    bounds = [(r * n // P, (r + 1) * n // P) for r in range(P)]
    lo, hi = bounds[rank]
    num_batches = max(math.ceil((b - a) / batch_size) for a, b in bounds)
    indices = list(range(lo, hi)) or ([0] if n else [])
    loader = DataLoader(torch.utils.data.Subset(dataset, indices), batch_size=batch_size, shuffle=False, collate_fn=collate_fn)
    was_training = model.training
    model.eval()
    sums = torch.zeros(len(keys), dtype=torch.float64, device=accelerator.device)
    with torch.no_grad(), accelerator.autocast():
        batches = iter(loader)
        first = None
        for i in range(num_batches):
            batch = next(batches, None)
            real = batch is not None and hi > lo
            if batch is None:
                batch = first if first is not None else next(iter(loader))
            first = batch if first is None else first
            batch = send_to_device(batch, accelerator.device)
            out = step_fn(model, batch)
            stats = torch.stack([torch.as_tensor(out[k], device=accelerator.device).double() for k in keys])
            sums += stats if real else torch.zeros_like(stats)  # a padding batch: counted as nothing
    model.train(was_training)
    if P > 1:
        sums = accelerator.reduce(sums, reduction="sum")
    return {k: float(v) for k, v in zip(keys, sums.tolist())}


def gather_predictions(accelerator, model, dataloader, predict_fn: Callable) -> dict[str, torch.Tensor]:
    """Per-example outputs over a prepared evaluation dataloader, gathered with ``gather_for_metrics``.

    ``predict_fn(model, batch) -> dict[str, Tensor]`` returns tensors whose first dimension is the batch;
    accelerate's duplicated padding examples on the last batch are dropped by ``gather_for_metrics``.

    Returns:
        ``{name: tensor of all examples in dataset order}`` on every process.
    """
    was_training = model.training
    model.eval()
    parts: dict[str, list[torch.Tensor]] = {}
    with torch.no_grad():
        for batch in dataloader:
            out = accelerator.gather_for_metrics(dict(predict_fn(model, batch)))
            for k, v in out.items():
                parts.setdefault(k, []).append(v.cpu())
    model.train(was_training)
    return {k: torch.cat(v) for k, v in parts.items()}


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
