"""Samplers and dataloaders of the training loop, fit for exact resume.

The data order of a run depends only on ``(seed, epoch)`` (:func:`epoch_seed`), never on the global RNG (which
belongs to dropout): a resumed run sets the epoch on the sampler and skips the micro-batches already consumed, and
sees the very batches of an uninterrupted run. A resume also checks that the data is the same by content
(:func:`fingerprint_sources`, :func:`data_change`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler

from core.errors import InputError


def fingerprint_sources(files: Sequence[str | os.PathLike] = (), **settings: Any) -> list[dict[str, Any]]:
    """What a run's training data is made of, recorded in checkpoints and compared on resume
    (:func:`data_change`): per file its name, size in bytes and SHA-256 (read in 1 MiB chunks, about 1 s per GB),
    then one entry per setting that shapes the training examples (a tokenizer's hash, the block length, a hub
    dataset's name and ``datasets`` fingerprint, ...). Settings whose value is None are left out.

    Returns:
        ``[{"name": file name, "bytes": int, "sha256": hex}, ..., {"name": setting, "value": str}, ...]``.
    """
    entries: list[dict[str, Any]] = []
    for f in files:
        h = hashlib.sha256()
        with open(f, "rb") as stream:
            while block := stream.read(1 << 20):
                h.update(block)
        entries.append({"name": Path(f).name, "bytes": Path(f).stat().st_size, "sha256": h.hexdigest()})
    entries += [{"name": k, "value": str(v)} for k, v in settings.items() if v is not None]
    return entries


def data_change(saved: Sequence[Mapping[str, Any]] | None, current: Sequence[Mapping[str, Any]] | None) -> str | None:
    """What differs between two :func:`fingerprint_sources` results (one phrase), or None when they agree or either
    is missing (a checkpoint of an older version, a run without a fingerprint). Files are compared by position and
    content (a renamed or moved file with the same bytes is the same data)."""
    if not saved or not current:
        return None

    def show(entry: Mapping[str, Any]) -> str:
        if "sha256" in entry:
            return f"{entry['name']} ({entry['bytes']} bytes, SHA-256 {entry['sha256'][:12]})"
        return f"{entry['name']} {entry['value']}"

    def key(entry: Mapping[str, Any]):
        return ("file", entry["bytes"], entry["sha256"]) if "sha256" in entry else (entry["name"], entry["value"])

    for old, new in zip(saved, current):
        if key(old) != key(new):
            return f"{show(old)} -> {show(new)}"
    if len(saved) != len(current):
        return f"{len(saved)} sources -> {len(current)} sources"
    return None


def epoch_seed(seed: int, epoch: int) -> int:
    """A 32-bit seed for the data order of ``epoch`` (``numpy.random.SeedSequence([seed, epoch])``): the same on
    every process and after a resume, independent of the global RNG."""
    return int(np.random.SeedSequence([int(seed), int(epoch)]).generate_state(1)[0])


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


class LengthGroupedSampler(Sampler[int]):
    """Training order in which consecutive ``batch_size`` examples have similar lengths (less padding).

    A random permutation (depending only on ``(seed, epoch)``, like :class:`EpochShuffleSampler`, so that a
    resumed run sees the same order) is cut into mega-batches of ``mega_batch_factor`` batches, and each
    mega-batch is sorted by decreasing length; the mega-batch holding the longest example goes first, so that
    running out of memory happens at the first step (the scheme of transformers' ``LengthGroupedSampler``).
    """

    def __init__(self, lengths: Sequence[int], batch_size: int, seed: int, mega_batch_factor: int = 50):
        self.lengths, self.batch_size, self.seed = list(lengths), batch_size, seed
        self.factor, self.epoch = mega_batch_factor, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self):
        g = torch.Generator().manual_seed(epoch_seed(self.seed, self.epoch))
        order = torch.randperm(len(self.lengths), generator=g).tolist()
        size = self.batch_size * self.factor
        megas = [sorted(order[i : i + size], key=lambda j: -self.lengths[j]) for i in range(0, len(order), size)]
        longest = max(range(len(megas)), key=lambda m: self.lengths[megas[m][0]])
        megas[0], megas[longest] = megas[longest], megas[0]
        return iter([i for mega in megas for i in mega])


#: Most DataLoader workers that ``--dataloader_num_workers auto`` starts on CUDA.
AUTO_WORKERS = 4


def resolve_num_workers(value: str | int, device_type: str, stream: bool = False) -> int:
    """``--dataloader_num_workers`` as a number of worker processes.

    ``auto``: ``min(AUTO_WORKERS, CPU cores available / processes on this machine (LOCAL_WORLD_SIZE))``, at least 1,
    on CUDA, where collation and masking in the main process would stall the GPU, and 0 elsewhere (on the CPU the
    workers compete with the step for the cores) and for a stream (``stream``: a stream is read in order by one
    process). A number is taken as given.
    The batches do not depend on the workers: the sampler runs in the main process and the collators draw from
    per-example generators (:mod:`pretrain.collators`).

    Raises:
        InputError: not ``auto`` nor an integer >= 0.
    """
    if str(value).strip().lower() == "auto":
        if device_type != "cuda" or stream:
            return 0
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
        return max(1, min(AUTO_WORKERS, cores // local))
    try:
        workers = int(str(value))
    except ValueError:
        workers = -1
    if workers < 0:
        raise InputError(f"--dataloader_num_workers {value}: expected auto or an integer >= 0")
    return workers


def make_train_dataloader(
    dataset,
    batch_size: int,
    collate_fn: Callable,
    seed: int,
    shuffle: bool = True,
    num_workers: int = 0,
    sampler: Sampler | None = None,
) -> DataLoader:
    """A training DataLoader fit for exact resume: ``sampler`` (default :class:`EpochShuffleSampler`; another one
    must order the examples by ``(seed, epoch)`` through its ``set_epoch``), its own ``generator``, and pinned
    memory on CUDA. With ``num_workers`` > 0 the workers collate ahead of the step (``prefetch_factor`` 2 batches
    each); they are started for every epoch, not persistent, so that they get the collator of that epoch
    (``set_epoch`` happens in the main process before the epoch's iterator is made).

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


def make_stream_dataloader(
    dataset: torch.utils.data.IterableDataset, batch_size: int, collate_fn: Callable, num_workers: int = 0
) -> DataLoader:
    """A training DataLoader over a stream (a torch ``IterableDataset``, e.g. :class:`pretrain.data.StreamedBlocks`).

    The stream is read in order (no shuffling); prepared by accelerate, the main process reads it and dispatches the
    batches to the other processes (``dispatch_batches``). A resumed run replays the stream up to its saved position.

    Raises:
        InputError: ``batch_size < 1``.
    """
    if batch_size < 1:
        raise InputError(f"--per_device_train_batch_size {batch_size}: expected an integer >= 1")
    return DataLoader(
        dataset,
        batch_size=batch_size,
        collate_fn=collate_fn,
        num_workers=num_workers,
        pin_memory=torch.cuda.is_available(),
    )


def length_of(obj) -> int | None:
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


__all__ = [
    "default_loss_fn",
    "default_tokens_fn",
    "default_weight_fn",
    "EpochShuffleSampler",
    "LengthGroupedSampler",
    "data_change",
    "epoch_seed",
    "fingerprint_sources",
    "length_of",
    "make_stream_dataloader",
    "make_train_dataloader",
    "resolve_num_workers",
]
