"""Evaluation helpers of the training loop: exact sums over a dataset (perplexity) and gathered predictions.

Both run on every process with the *prepared* model (DDP, FSDP, ...) in eval mode and restore its training mode.
Inside :func:`stop_when` (the loop's evaluations during training) they check a stop request between batches and
raise :class:`EvaluationInterrupted` once every process has seen it (the flag is combined across processes at each
batch, so all processes leave at the same batch).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader


class EvaluationInterrupted(Exception):
    """A stop request arrived during an evaluation (see :func:`stop_when`); the evaluation was abandoned."""


#: ``(predicate, accelerator)`` of the innermost :func:`stop_when` block, or None.
_stop_check: tuple[Callable[[], bool], Any] | None = None


@contextlib.contextmanager
def stop_when(predicate: Callable[[], bool], accelerator) -> Iterator[None]:
    """Within the block, :func:`evaluate_sums` and :func:`gather_predictions` call ``predicate()`` between batches on
    every process (with several processes the flags are summed with one small all-reduce per batch) and raise
    :class:`EvaluationInterrupted` when it is true on any process."""
    global _stop_check
    previous, _stop_check = _stop_check, (predicate, accelerator)
    try:
        yield
    finally:
        _stop_check = previous


def _check_stop() -> None:
    """Raise :class:`EvaluationInterrupted` when the stop predicate of :func:`stop_when` holds on any process."""
    if _stop_check is None:
        return
    predicate, accelerator = _stop_check
    stop = bool(predicate())
    if accelerator.num_processes > 1:
        flag = torch.tensor([float(stop)], device=accelerator.device)
        stop = bool(accelerator.reduce(flag, reduction="sum").item() > 0)
    if stop:
        raise EvaluationInterrupted("stop requested during the evaluation")


@contextlib.contextmanager
def _training_mode_restored(model: torch.nn.Module, was_training: bool) -> Iterator[None]:
    try:
        yield
    finally:
        model.train(was_training)


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

    Raises:
        EvaluationInterrupted: a stop request inside :func:`stop_when` (checked before each batch).
    """
    from accelerate.utils import send_to_device

    n, P, rank = len(dataset), accelerator.num_processes, accelerator.process_index
    bounds = [(r * n // P, (r + 1) * n // P) for r in range(P)]
    lo, hi = bounds[rank]
    num_batches = max(math.ceil((b - a) / batch_size) for a, b in bounds)
    indices = list(range(lo, hi)) or ([0] if n else [])
    loader = DataLoader(
        torch.utils.data.Subset(dataset, indices), batch_size=batch_size, shuffle=False, collate_fn=collate_fn
    )
    was_training = model.training
    model.eval()
    sums = torch.zeros(len(keys), dtype=torch.float64, device=accelerator.device)
    with torch.no_grad(), accelerator.autocast(), _training_mode_restored(model, was_training):
        batches = iter(loader)
        first = None
        for _ in range(num_batches):
            _check_stop()
            batch = next(batches, None)
            real = batch is not None and hi > lo
            if batch is None:
                batch = first if first is not None else next(iter(loader))
            first = batch if first is None else first
            batch = send_to_device(batch, accelerator.device)
            out = step_fn(model, batch)
            stats = torch.stack([torch.as_tensor(out[k], device=accelerator.device).double() for k in keys])
            sums += stats if real else torch.zeros_like(stats)  # a padding batch: counted as nothing
    if P > 1:
        sums = accelerator.reduce(sums, reduction="sum")
    return {k: float(v) for k, v in zip(keys, sums.tolist())}


def gather_predictions(accelerator, model, dataloader, predict_fn: Callable) -> dict[str, torch.Tensor]:
    """Per-example outputs over a prepared evaluation dataloader, gathered with ``gather_for_metrics``.

    ``predict_fn(model, batch) -> dict[str, Tensor]`` returns tensors whose first dimension is the batch;
    accelerate's duplicated padding examples on the last batch are dropped by ``gather_for_metrics``.

    Returns:
        ``{name: tensor of all examples in dataset order}`` on every process.

    Raises:
        EvaluationInterrupted: a stop request inside :func:`stop_when` (checked before each batch).
    """
    was_training = model.training
    model.eval()
    parts: dict[str, list[torch.Tensor]] = {}
    with torch.no_grad(), _training_mode_restored(model, was_training):
        for batch in dataloader:
            _check_stop()
            out = accelerator.gather_for_metrics(dict(predict_fn(model, batch)))
            for k, v in out.items():
                parts.setdefault(k, []).append(v.cpu())
    return {k: torch.cat(v) for k, v in parts.items()}


__all__ = ["EvaluationInterrupted", "evaluate_sums", "gather_predictions", "stop_when"]
