"""Compute budgets in optimizer steps: a token budget by arithmetic, a time budget by timing the loop's step.

:func:`steps_for_tokens` and :func:`steps_for_time` (from :mod:`training.plan`) convert a budget into optimizer steps.
:func:`time_optimizer_steps` measures the seconds of one optimizer step of a model as the loop takes it (the same
micro-batches, accumulation, autocast, clipping and AdamW), on a *copy* of the model and with a sequential loader of
its own, and leaves everything of the run as it found it: the model, the run's data loader and every random number
generator (torch on the CPU and on CUDA, Python's, NumPy's). A run that converts its budget this way is therefore the
very run that ``--max_train_steps N`` gives, for the N chosen (the commands log that flag).
"""

from __future__ import annotations

import contextlib
import copy
import gc
import random
import time
from collections.abc import Callable
from itertools import islice
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from core.errors import InputError
from training.config import TrainingConfig
from training.optim import optimizer_from_config

#: The clock of :func:`time_optimizer_steps` (seconds; tests replace it with a fake one).
clock: Callable[[], float] = time.perf_counter


@contextlib.contextmanager
def preserved_rng_states():
    """Restore every random number generator a run draws from (torch CPU and CUDA, Python, NumPy) on exit."""
    states = (
        torch.get_rng_state(),
        torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        random.getstate(),
        np.random.get_state(),
    )
    try:
        yield
    finally:
        torch.set_rng_state(states[0])
        if states[1] is not None:
            torch.cuda.set_rng_state_all(states[1])
        random.setstate(states[2])
        np.random.set_state(states[3])


def time_optimizer_steps(
    accelerator,
    model: torch.nn.Module,
    dataloader: DataLoader,
    config: TrainingConfig,
    *,
    steps: int = 10,
    warmup: int = 2,
    loss_fn: Callable | None = None,
    weight_fn: Callable | None = None,
    batch_fn: Callable | None = None,
) -> float:
    """Mean seconds of an optimizer step after ``warmup`` untimed ones (``steps`` in all), measured on a copy.

    Each step takes ``config.gradient_accumulation_steps`` micro-batches of ``dataloader``'s dataset and collator
    (read in order by a loader of its own with the run's workers, prefetch and pinned memory, copied to the device
    without waiting as the run's are; re-read from the start when it ends; with workers, the steps until they have
    handed over the batches they collated ahead (:func:`workers_fill_steps`) are added to ``warmup`` and ``steps``,
    so the timed steps wait for the workers as the run's do), runs forward and backward under
    ``accelerator.autocast()`` with the loop's item-weighted loss, clips to ``config.max_grad_norm`` and steps an
    AdamW built as the loop builds it; a step is timed from fetching its batches to the end of the update (the
    device synchronised), as the loop times its steps. With several processes every process measures its own copy
    (no gradient all-reduce) and the mean over processes is returned, so all of them convert a budget alike.
    ``config.torch_compile`` compiles the copy (its compilation falls into the warmup steps).

    Args:
        accelerator: the run's ``Accelerator`` (device, autocast, processes); nothing is registered with it.
        model: the model before ``accelerator.prepare``; left untouched.
        dataloader: the run's training loader (its dataset, batch size and collator are used; it is not iterated).
        config: the loop's settings (accumulation, optimizer, clipping, gradient checkpointing, compile).
        steps / warmup: optimizer steps run / not timed.
        loss_fn / weight_fn / batch_fn: as :class:`training.loop.Trainer` (defaults: ``model(**batch).loss``, the
            labels that are not -100, the batches as they are; ``batch_fn`` is called with step 1).

    Raises:
        InputError: ``steps <= warmup``, or a loader that gives no batch.
    """
    from training.accelerator import enable_gradient_checkpointing
    from training.data import default_loss_fn, default_weight_fn

    if steps <= warmup or warmup < 0:
        raise InputError(f"time budget probe: {steps} steps with {warmup} not timed; expected more steps than that")
    loss_fn, weight_fn = loss_fn or default_loss_fn, weight_fn or default_weight_fn
    device = accelerator.device
    probe = DataLoader(  # the run's loader as it runs: its workers (and their prefetch) and pinned memory
        dataloader.dataset,
        batch_size=dataloader.batch_size,
        collate_fn=dataloader.collate_fn,
        num_workers=dataloader.num_workers,
        prefetch_factor=dataloader.prefetch_factor,
        pin_memory=dataloader.pin_memory,
        generator=torch.Generator(),
    )
    warmup += workers_fill_steps(probe, config.gradient_accumulation_steps)
    steps += workers_fill_steps(probe, config.gradient_accumulation_steps)
    with preserved_rng_states():
        twin = copy.deepcopy(model).to(device).train()
        if config.gradient_checkpointing:
            enable_gradient_checkpointing(twin)
        optimizer = optimizer_from_config(twin, config)
        forward = torch.compile(twin) if config.torch_compile else twin
        batches = iter(probe)
        timed: list[float] = []
        for step in range(steps):
            started = clock() if step >= warmup else 0.0
            group, batches = _next_group(probe, batches, config.gradient_accumulation_steps)
            if batch_fn is not None:
                group = [batch_fn(b, 1) for b in group]
            _probe_step(accelerator, forward, twin, optimizer, group, config, loss_fn, weight_fn, probe.pin_memory)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if step >= warmup:
                timed.append(clock() - started)
        del twin, forward, optimizer, batches
        gc.collect()
    mean = torch.tensor(sum(timed) / len(timed), dtype=torch.float64, device=device)
    if accelerator.num_processes > 1:
        mean = accelerator.reduce(mean, reduction="mean")
    return float(mean)


def workers_fill_steps(loader: DataLoader, accumulation: int) -> int:
    """Optimizer steps until ``loader``'s workers have handed over the batches they collated ahead before the first
    step (``num_workers x prefetch_factor``; 0 without workers): only after them does a step wait for the workers as
    long as it does for the rest of the run, so a probe leaves them untimed.

    Args:
        loader: a DataLoader; ``accumulation``: micro-batches per optimizer step.
    """
    if not loader.num_workers:
        return 0
    return -(-loader.num_workers * (loader.prefetch_factor or 2) // accumulation)


def _next_group(probe: DataLoader, batches, size: int) -> tuple[list, Any]:
    """The next ``size`` batches of ``probe`` (restarting it when it runs out) and the iterator to go on with.

    Raises:
        InputError: ``probe`` gives no batch at all.
    """
    group = list(islice(batches, size))
    if not group:
        batches = iter(probe)
        group = list(islice(batches, size))
        if not group:
            raise InputError("time budget probe: the training data gives no batch")
    return group, batches


def _probe_step(
    accelerator, forward, model, optimizer, group: list, config: TrainingConfig, loss_fn, weight_fn, pinned=False
):
    """One optimizer step of the probe, weighted as :class:`training.loop.Trainer` weights it: each micro-batch's
    loss times its share of the step's items. ``weight_fn`` gives a count per batch (0-d) or one per loss term ((K,),
    e.g. rtd's masked and real tokens, with ``loss_fn`` giving the (K,) terms); the shares are taken per term.
    Batches from pinned memory (``pinned``) go to the device without waiting, as the run's accelerator sends them."""
    device = accelerator.device
    group = [
        {k: v.to(device, non_blocking=pinned) if isinstance(v, torch.Tensor) else v for k, v in b.items()}
        for b in group
    ]
    weights = [torch.as_tensor(weight_fn(b), dtype=torch.float64, device=device) for b in group]
    total = torch.stack(weights).sum(0).clamp_min(1e-12)
    for batch, weight in zip(group, weights):
        with accelerator.autocast():
            loss = loss_fn(forward, batch)
        (loss * (weight / total).to(loss.dtype)).sum().backward()
    if config.max_grad_norm:
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


__all__ = [
    "clock",
    "preserved_rng_states",
    "time_optimizer_steps",
    "workers_fill_steps",
]
