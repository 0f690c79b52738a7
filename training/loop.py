"""The one accelerate training loop that pretraining and fine-tuning share: :class:`Trainer`.

Usage (a command builds the model, datasets and collators; the loop does the rest; :mod:`training.driver` wraps
this for the commands)::

    from training.accelerator import finish, make_accelerator
    from training.loop import Trainer

    accelerator = make_accelerator(config)                # config: training.config.TrainingConfig
    trainer = Trainer(accelerator, model, train_dataloader, config, eval_fn=my_eval)  # prepares everything
    result = trainer.train()          # dict: train_loss, train_runtime_s, ... and the last eval metrics
    model = trainer.unwrapped_model   # save it with save_pretrained on the main process
    finish(accelerator, trainer)      # end trackers, free memory, destroy the process group

The loop is in parts: settings (:mod:`training.config`), samplers and dataloaders (:mod:`training.data`), the
state a checkpoint records (:mod:`training.state`), the device-side step statistics and their one host read
(:mod:`training.stats`), best model and early stopping (:mod:`training.best`), evaluation helpers
(:mod:`training.evaluation`) and checkpoints (:mod:`training.checkpoint_files`). What it guarantees:

* **Optimizer steps.** One optimizer step consumes ``gradient_accumulation_steps`` (G) micro-batches per
  process (fewer at the end of an epoch, and during a batch-size warmup: the plan's
  :meth:`training.plan.RunPlan.micro_batches`, a function of the step number). The learning-rate schedule is
  stepped by the loop exactly once per optimizer step (skipped when a mixed-precision step is skipped), so after N
  optimizer steps the schedule has taken N steps for any G and any number of processes P (see
  :mod:`training.optim`; accelerate#662).
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
  process with :class:`core.errors.NonFiniteLossError` naming the step and its micro-batches, before any later
  checkpoint is written (the last one is left as it was). With an fp16 GradScaler, inf gradients are the
  scaler's to skip.
* **Host reads.** The step's statistics are one packed tensor on the device, all-reduced once per step; the host
  reads the pending steps' tensors back in one copy only at logging, evaluation and checkpoint steps and at the
  end (:mod:`training.stats`). That needs an optimizer that skips a non-finite update on the device: torch's fused
  AdamW (the default, :func:`training.optim.create_optimizer`) takes a ``found_inf`` tensor. With another
  optimizer, an fp16 GradScaler or DeepSpeed every step is read, to decide on the host. The batches reach the GPU
  from pinned memory with ``non_blocking`` copies, and the models read nothing back in ``forward``
  (``tests/training/test_host_reads.py``).
* **Checkpoints and exact resume** (:mod:`training.checkpointer`). Every ``checkpointing_steps`` optimizer steps
  (a fraction below 1: of the run) and at the end, ``<output_dir>/checkpoints/step_N/``; ``resume_from_checkpoint``
  continues with the very batches and dropout masks of an uninterrupted run (what it needs: see there).
  ``continue_from_checkpoint`` starts a new phase (its own steps and schedule) from another run's checkpoint with
  the same continuity (:meth:`training.checkpointer.Checkpointer.start_phase`): no evaluation at its step 0 (the
  earlier run's last evaluation is that point, and an evaluation draws a DataLoader seed from the global RNG).
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
import os
import sys
import time
from collections.abc import Callable, Mapping
from itertools import islice
from typing import Any

import torch
from torch.utils.data import DataLoader

from core.errors import InputError, TrainingStopped
from training.accelerator import (
    as_device_scalar,
    device_skip_supported,
    inner_optimizer,
    prepare,
    reduce_sum,
    replica_difference,
)
from training.best import should_stop_early, update_best
from training.checkpointer import Checkpointer, model_architecture
from training.config import TrainingConfig, best_metric_name, optimizer_settings
from training.data import default_loss_fn, default_tokens_fn, default_weight_fn, length_of
from training.evaluation import EvaluationInterrupted, stop_when
from training.mfu import FlopCounter, peak_flops, token_slots
from training.optim import create_scheduler
from training.plan import RunPlan, make_plan
from training.progress import ESTIMATE_WARMUP_STEPS, Session, TimeEstimate, is_terminal, loss_jump
from training.state import TrainerState
from training.stats import StepStatistics
from training.trackers import sanitize_config

logger = logging.getLogger(__name__)


#: Seconds between the plain progress lines logged instead of a progress bar when stderr is not a terminal.
PROGRESS_LOG_SECONDS = 30.0


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
        plan: the run's counts (:func:`training.plan.make_plan`, from the command); default: the plan of
            ``config`` on the prepared loader.
        batch_fn: ``(batch, step) -> batch``, applied to each micro-batch of optimizer step ``step`` (1-based) before
            ``weight_fn`` and ``loss_fn`` (e.g. a masking-rate schedule); a pure function of its arguments keeps a
            resume exact.
        log_fn: ``step -> {name: value}``, more values logged at each logging step (e.g. the masking rate).

    Raises:
        InputError: the training data gives no batch; a ``plan`` of another number of batches than the loader's.
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
        plan: RunPlan | None = None,
        batch_fn: Callable[[dict, int], dict] | None = None,
        log_fn: Callable[[int], Mapping[str, float]] | None = None,
    ):
        self.accelerator, self.config, self.on_save = accelerator, config, on_save
        self.batch_fn, self.log_fn = batch_fn, log_fn
        self.loss_fn, self.weight_fn, self.tokens_fn, self.eval_fn = loss_fn, weight_fn, tokens_fn, eval_fn
        self.collator = train_dataloader.collate_fn
        self.per_device_train_batch_size = int(train_dataloader.batch_size or 1)
        self.num_train_examples = length_of(train_dataloader.dataset)  # None: a stream (torch IterableDataset)
        self.model, self.optimizer, self.train_dataloader = prepare(
            accelerator, config, model, optimizer, train_dataloader
        )
        self.plan = plan = self._loader_plan(plan, config, accelerator.num_processes)
        #: the time to finish, with the durations of this session's evaluations and checkpoint writes
        self._estimate = TimeEstimate(
            plan.max_train_steps,
            plan.eval_steps,
            plan.checkpointing_steps,
            evaluates=eval_fn is not None,
            best_checkpoints=config.load_best_model_at_end,
        )
        self.scheduler = create_scheduler(
            config.lr_scheduler_type,
            self.optimizer,
            plan.num_warmup_steps,
            plan.max_train_steps,
            config.num_decay_steps,
        )
        # the schedule's state goes into trainer_state.json (JSON), not a pickled custom_checkpoint_0.pkl
        self.state = TrainerState(
            max_train_steps=plan.max_train_steps,
            num_processes=accelerator.num_processes,
            gradient_accumulation_steps=config.gradient_accumulation_steps,
            per_device_train_batch_size=self.per_device_train_batch_size,
            num_train_examples=self.num_train_examples,
            run_id=run_id,
            data_fingerprint=data_fingerprint,
            optimizer_settings=optimizer_settings(config, plan.num_warmup_steps),
            model_config=model_architecture(model),
        )
        self.stats = StepStatistics(self.state, config.skip_nonfinite_steps)
        self.run_config = {
            **(run_config if run_config is not None else dataclasses.asdict(config)),
            **plan.settings(),
        }
        self.stop_requested = False
        self.last_checkpoint: str | None = None
        self.checkpointer = Checkpointer(accelerator, config, model)
        self.checkpoints_dir = self.checkpointer.checkpoints_dir
        #: telemetry (:mod:`training.mfu`): the model FLOPs of a micro-batch; the device's peak (None: unknown)
        self._flops = FlopCounter(self.unwrapped_model)
        self.peak_flops = peak_flops(accelerator.device, accelerator.mixed_precision)

    def _loader_plan(self, plan: RunPlan | None, config: TrainingConfig, num_processes: int) -> RunPlan:
        """``plan``, checked to count the prepared training loader's batches, or (``None``: a loop used on its own)
        the plan of that loader (:func:`training.plan.make_plan`).

        Raises:
            InputError: a plan of another number of batches per process and epoch than the loader gives.
        """
        batches = length_of(self.train_dataloader)
        if plan is None:
            return make_plan(
                config,
                train_examples=self.num_train_examples,
                num_processes=num_processes,
                per_device_train_batch_size=self.per_device_train_batch_size,
                num_epoch_batches=batches,
            )
        if plan.batches_per_process != batches:
            raise InputError(
                f"the run plan counts {plan.batches_per_process} batches per process and epoch, the prepared "
                f"training loader gives {batches}; expected the plan of this loader"
            )
        return plan

    @property
    def log_history(self) -> list[dict[str, Any]]:
        """``{"step": N, "train_loss": ..., ...}`` per logging step of the whole run (resumed parts included)."""
        return self.state.log_history

    @property
    def unwrapped_model(self) -> torch.nn.Module:
        return self.accelerator.unwrap_model(self.model, keep_torch_compile=False)

    @property
    def eager_model(self) -> torch.nn.Module:
        """The prepared model without ``torch.compile``'s wrapper (``--torch_compile``; DDP / FSDP wrappers kept):
        ``accelerator.get_state_dict`` of it has the module's own keys (the compiled wrapper's start with
        ``_orig_mod.``, which ``from_pretrained`` would not find), and evaluation runs it, so that the compiled graph
        keeps the one (static) shape of the training batches."""
        from accelerate.utils import is_compiled_module

        return self.model._orig_mod if is_compiled_module(self.model) else self.model

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
            while self.state.global_step < self.plan.max_train_steps and not self._stopping_early:
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
        elif (
            self.eval_fn is not None and self.plan.eval_steps and self.state.global_step == 0 and not self._phase_start
        ):
            self.evaluate()  # the starting point of the validation curve (a new phase's: the earlier run's last)
        # A progress bar redraws its line with carriage returns: in a file (not a terminal) log lines would be glued
        # onto it, so there the progress goes into plain log lines instead (:meth:`_log_progress`).
        self._bar_in_terminal = is_terminal(sys.stderr)
        self._progress_logged_at = time.perf_counter()
        self._bar = tqdm(
            total=self.plan.max_train_steps,
            initial=self.state.global_step,
            disable=not acc.is_local_main_process or not self._bar_in_terminal,
            desc="train",
            dynamic_ncols=True,
        )
        self._batches = None  # the iterator over the current epoch's micro-batches
        self._estimate.start()
        self._stopping_early = should_stop_early(self.state, cfg)  # a resumed run that had already stopped early
        self._device_skip = self._device_skip_supported()
        self._session = Session(started=time.perf_counter())

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
        group = list(islice(self._batches, self.plan.micro_batches(self.state.global_step + 1)))
        if not group:
            if self.plan.batches_per_process is None:
                self.state.next_epoch()
            self._batches = None
            return None
        return group

    def _optimizer_step(self, group: list) -> None:
        """Forward and backward over ``group``, clipping, then the update (or its skip on a non-finite step) and the
        schedule step; the step's statistics are queued on the device."""
        acc = self.accelerator
        if self.batch_fn is not None:
            group = [self.batch_fn(b, self.state.global_step + 1) for b in group]
        loss_sum, nonfinite, total_weight, tokens, samples, slots, flops = self._forward_backward(group)
        max_norm = self.config.max_grad_norm if self.config.max_grad_norm else float("inf")
        grad_norm = acc.clip_grad_norm_(self.model.parameters(), max_norm)
        measured = grad_norm is not None  # DeepSpeed clips inside its engine and returns None
        stop = torch.full_like(loss_sum, float(self.stop_requested))
        local = torch.stack([loss_sum, nonfinite, tokens, stop, torch.full_like(loss_sum, float(slots)), flops])
        reduced = reduce_sum(acc, local)  # one all-reduce per step, on the device
        nan = torch.full((), float("nan"), dtype=torch.float64, device=acc.device)
        norm = grad_norm.detach().double().reshape(()).to(acc.device) if measured else nan
        bad = (reduced[1] > 0) | ~torch.isfinite(reduced[0])
        if measured and getattr(acc, "scaler", None) is None:  # an fp16 GradScaler skips inf gradients itself
            bad = bad | ~torch.isfinite(norm)
        step, first = self.state.global_step + 1, self.state.batches_in_epoch + 1
        where = f"epoch {self.state.epoch}, micro-batches {first}-{first + len(group) - 1} of the epoch"
        row = [reduced[0], total_weight, reduced[2], bad.double(), norm, reduced[3], reduced[4], reduced[5]]
        self.stats.add(step, where, samples, torch.stack(row))
        if self._device_skip:  # the fused kernel leaves weights, moments and step count as they are when bad
            inner = inner_optimizer(self.optimizer)
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
        elapsed = time.perf_counter() - self._step_started
        self.stats.interval.time += elapsed
        self.stats.interval.steps += 1
        self._estimate.add_step(elapsed)
        self.state.global_step = step
        if self.state.consume(len(group), self.plan.batches_per_process):
            self._batches = None
        self._bar.update(1)

    def _forward_backward(self, group: list) -> tuple[torch.Tensor, ...]:
        """Back-propagate ``loss_i * count_i * P / total_count`` for each micro-batch (inside ``no_sync`` but the
        last), so that the gradient is that of the mean over all items of the step. Returns the 0-d device
        tensors (loss x items, non-finite flag, total items over processes, tokens), the samples and token slots
        (ints, host-side: :func:`training.mfu.token_slots`) and the model FLOPs (0-d device tensor,
        :class:`training.mfu.FlopCounter`) of this process."""
        acc = self.accelerator
        weights = [as_device_scalar(self.weight_fn(b), acc.device) for b in group]  # 0-d, or (K,) for K loss terms
        counts = [as_device_scalar(self.tokens_fn(b), acc.device) for b in group]
        tokens = sum(counts)
        flops = sum(self._flops(b, count) for b, count in zip(group, counts))
        slots = sum(token_slots(b) for b in group)
        samples = sum(int(next(v for v in b.values() if isinstance(v, torch.Tensor)).shape[0]) for b in group)
        total_weight = reduce_sum(acc, torch.stack(weights).sum(0))
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
        return loss_sum, nonfinite, total_weight[0] if terms else total_weight, tokens, samples, slots, flops

    def _on_step_end(self) -> None:
        """After an optimizer step: read the statistics at a sync point, then log, evaluate, checkpoint, stop
        early, or stop on request (:class:`TrainingStopped`), as due."""
        cfg, step = self.config, self.state.global_step
        last = step == self.plan.max_train_steps
        logging_step = step % cfg.logging_steps == 0 or last
        evaluated = bool(self.plan.eval_steps) and step % self.plan.eval_steps == 0 and not last
        periodic = bool(self.plan.checkpointing_steps) and step % self.plan.checkpointing_steps == 0 and not last
        if logging_step or evaluated or periodic or (self.accelerator.num_processes == 1 and self.stop_requested):
            started = time.perf_counter()
            self._read()
            waited = time.perf_counter() - started
            self.stats.interval.time += waited
            self._estimate.add_wait(waited)
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
            "epoch": self.state.epoch_position(self.plan.batches_per_process),
            "train_seconds": self._session.seconds,
            "train_tokens": self._session.tokens,
        }
        telemetry = self._telemetry(interval.tokens, interval.slots, interval.flops, interval.time)
        record.update({k: v for k, v in telemetry.items() if v is not None})  # (trackers take numbers only)
        if self.log_fn is not None:
            record.update(self.log_fn(step))
        self.accelerator.log(record, step=step)
        self.state.log_history.append({"step": step, **record})
        per_step = self._estimate.rate()  # (None until a step after the warm-up steps is timed)
        if (
            not self._estimate.logged
            and per_step
            and self.accelerator.is_main_process
            and step < self.plan.max_train_steps
        ):
            self._estimate.logged, self._estimate.per_step = True, per_step
            rate = (
                f"{per_step:.3g} s per optimizer step (the first {ESTIMATE_WARMUP_STEPS} warm-up steps left out), "
                f"{record['tokens_per_second']:.0f} tokens/s"
            )
            logger.info("%s", self._estimate.message(step, rate))
        self._bar.set_postfix(loss=f"{record['train_loss']:.4f}", lr=f"{lr:.2e}", refresh=False)
        self._log_progress(step, record)

    def _log_progress(self, step: int, record: Mapping[str, Any]) -> None:
        """Where there is no progress bar (output to a file): a plain progress line at most every
        :data:`PROGRESS_LOG_SECONDS` seconds, and at the last step."""
        if self._bar_in_terminal or not self.accelerator.is_local_main_process:
            return
        now = time.perf_counter()
        if now - self._progress_logged_at < PROGRESS_LOG_SECONDS and step < self.plan.max_train_steps:
            return
        self._progress_logged_at = now
        telemetry = ""
        if record.get("packing_efficiency") is not None:
            telemetry += f", packing efficiency {record['packing_efficiency']:.3f}"
        if record.get("mfu") is not None:
            telemetry += f", MFU {record['mfu']:.3f}"
        logger.info(
            "step %d/%d: train_loss %.4f, learning rate %.2e, %.0f tokens/s%s",
            step,
            self.plan.max_train_steps,
            record["train_loss"],
            record["learning_rate"],
            record["tokens_per_second"],
            telemetry,
        )

    def _telemetry(self, tokens: float, slots: float, flops: float, seconds: float) -> dict[str, float | None]:
        """``packing_efficiency`` (real ``tokens`` / token ``slots``) and ``mfu`` (model ``flops`` / (``seconds`` x
        processes x peak FLOP/s), :mod:`training.mfu`) of a logging interval or the session; ``None`` where unknown
        (no slots counted; no peak for this device)."""
        packing = tokens / slots if slots else None
        mfu = None
        if self.peak_flops and seconds > 0:
            mfu = flops / (seconds * self.accelerator.num_processes * self.peak_flops)
        return {"packing_efficiency": packing, "mfu": mfu}

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
        metrics = self.checkpointer.load_best(self.state, metrics)
        session = self._session
        result: dict[str, Any] = {
            "train_loss": self.state.loss_sum / max(self.state.weight_sum, 1e-12),
            "train_runtime_s": time.perf_counter() - session.started,
            "train_tokens_per_second": session.tokens / max(session.seconds, 1e-9),
            "train_samples_per_second": session.samples / max(session.seconds, 1e-9),
            **{
                f"train_{k}": v
                for k, v in self._telemetry(session.tokens, session.slots, session.flops, session.seconds).items()
            },
            "global_step": self.state.global_step,
            "epoch": self.state.epoch_position(self.plan.batches_per_process),
        }
        result.update(metrics)
        if self.state.best_step is not None:
            result.update(best_step=self.state.best_step, best_metric=self.state.best_metric)
        result["stopped_early"] = self._stopping_early
        result["replica_max_abs_diff"] = replica_difference(self.accelerator, self.unwrapped_model)
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

    def _device_skip_supported(self) -> bool:
        """:func:`training.accelerator.device_skip_supported` for this run's optimizer."""
        return device_skip_supported(self.accelerator, self.optimizer)

    # -- checkpoints, resume, stop -----------------------------------------------------------------------
    def save_checkpoint(self) -> str:
        """Write ``checkpoints/step_<global_step>`` (all processes must call it; :meth:`Checkpointer.save`); with
        ``load_best_model_at_end`` the best step's checkpoint is kept by the rotation. Returns its path."""
        started = time.perf_counter()
        path = self.checkpointer.save(self.state, self.scheduler)
        self._estimate.checkpoint_seconds.append(time.perf_counter() - started)
        step = self.state.global_step
        if self._estimate.incomplete(step) and self.accelerator.is_main_process:
            logger.info("%s", self._estimate.message(step, "updated estimate with the checkpoint timed"))
        self.last_checkpoint = path
        return path

    def _resume(self) -> None:
        """Resume from ``resume_from_checkpoint`` when given (:meth:`Checkpointer.resume`); else start a new phase
        from ``continue_from_checkpoint`` when given (:meth:`Checkpointer.start_phase`)."""
        self._phase_start = False
        path = self.checkpointer.resume(self.state, self.scheduler, self.per_device_train_batch_size)
        if path is None and self.config.continue_from_checkpoint:
            self.checkpointer.start_phase(self.state, self.scheduler, self.per_device_train_batch_size)
            self._phase_start = True
        elif path is not None:
            self.last_checkpoint = path

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
            self._estimate.eval_seconds.append(time.perf_counter() - started)
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


__all__ = ["Trainer"]
