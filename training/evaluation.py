"""Evaluation helpers of the training loop: exact sums over a dataset (perplexity) and gathered predictions.

Both run on every process with the *prepared* model (DDP, FSDP, ...) in eval mode and restore its training mode.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader


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
    loader = DataLoader(torch.utils.data.Subset(dataset, indices), batch_size=batch_size, shuffle=False,
                        collate_fn=collate_fn)
    was_training = model.training
    model.eval()
    sums = torch.zeros(len(keys), dtype=torch.float64, device=accelerator.device)
    with torch.no_grad(), accelerator.autocast():
        batches = iter(loader)
        first = None
        for _ in range(num_batches):
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


__all__ = ["evaluate_sums", "gather_predictions"]
