"""The accelerator set-up of the shared loop (:class:`training.loop.Trainer`): :func:`make_accelerator` (trackers,
project folder, gloo on the loopback interface, CPU when no accelerator device is present) and
:func:`enable_gradient_checkpointing`, and :func:`finish` at the end of a run."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch

from core.errors import InputError
from training.config import TrainingConfig
from training.optim import optimizer_from_config
from training.trackers import log_with, prepare_environment


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
    (default ``config.mixed_precision``) overrides. The process's CPU threads are set by
    :func:`training.threads.configure_cpu_threads` (a launcher's ``OMP_NUM_THREADS=1`` default replaced).
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
    from training.threads import configure_cpu_threads

    configure_cpu_threads()  # the CPUs this process may use over the local processes, unless the user chose
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


def prepare(accelerator, config: TrainingConfig, model: torch.nn.Module, optimizer, train_dataloader):
    """The model, optimizer and training DataLoader prepared by ``accelerator`` for the loop: the optimizer
    defaults to :func:`training.optim.optimizer_from_config`; gradient checkpointing is enabled first
    (``gradient_checkpointing``) and ``torch.compile`` applied after ``accelerator.prepare`` (``torch_compile``:
    accelerate saves and loads the eager model it holds; ``regional_compile``: :func:`compile_regions`, in place).

    Returns:
        ``(model, optimizer, train_dataloader)`` as prepared.

    Raises:
        InputError: ``gradient_checkpointing`` with a model that has none; ``regional_compile`` with a model without
            ``compile_regions``.
    """
    if optimizer is None:
        optimizer = optimizer_from_config(model, config)
    if config.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)
    if config.torch_compile:  # after prepare: accelerate saves/loads the eager (prepared) model it holds
        model = torch.compile(model)
    if config.regional_compile:
        compile_regions(accelerator.unwrap_model(model))
    return model, optimizer, train_dataloader


def compile_regions(model: torch.nn.Module) -> list[str]:
    """``--regional_compile``: the model's own regional compilation (``model.compile_regions()``, in place).

    Returns:
        The names of the compiled modules.

    Raises:
        InputError: the model has no ``compile_regions``.
    """
    if not hasattr(model, "compile_regions"):
        raise InputError(
            f"--regional_compile: {type(model).__name__} has no compile_regions; expected a SesameBert model, or "
            "use --torch_compile"
        )
    return model.compile_regions()


def as_device_scalar(value, device) -> torch.Tensor:
    """A count (int or 0-d tensor) as a float64 0-d tensor on ``device``, without a host sync; a 1-d tensor of
    counts (one per loss term) keeps its shape."""
    if isinstance(value, torch.Tensor):
        value = value.detach().to(device=device, dtype=torch.float64)
        return value if value.dim() == 1 else value.reshape(())
    return torch.full((), float(value), dtype=torch.float64, device=device)  # a fill, no copy


def reduce_sum(accelerator, t: torch.Tensor) -> torch.Tensor:
    """``t`` summed over processes (identity with one process)."""
    if accelerator.num_processes > 1:
        t = accelerator.reduce(t, reduction="sum")
    return t


def inner_optimizer(optimizer) -> torch.optim.Optimizer:
    """The torch optimizer inside accelerate's wrapper."""
    return getattr(optimizer, "optimizer", optimizer)


def device_skip_supported(accelerator, optimizer) -> bool:
    """True when a non-finite step can be skipped on the device, so that statistics need no per-step read.

    That is the case for torch optimizers that take a ``found_inf`` tensor (``_step_supports_amp_scaling``:
    the fused Adam/AdamW/SGD kernels, which leave weights, moments and the step count unchanged where it is
    non-zero), without an fp16 ``GradScaler`` (which sets ``found_inf`` itself) and outside DeepSpeed.
    """
    inner = inner_optimizer(optimizer)
    return (
        bool(getattr(inner, "_step_supports_amp_scaling", False))
        and getattr(accelerator, "scaler", None) is None
        and type(optimizer).__name__ != "DeepSpeedOptimizerWrapper"
    )


def replica_difference(accelerator, model: torch.nn.Module) -> float:
    """Largest difference between processes of the per-tensor parameter sums of ``model`` (0.0 when every process
    holds the same weights, as data parallelism requires; always 0.0 with one process; NaN with sharded
    parameters: FSDP, DeepSpeed, Megatron-LM)."""
    acc = accelerator
    if acc.distributed_type.name in ("FSDP", "DEEPSPEED", "MEGATRON_LM"):
        return float("nan")  # sharded parameters: not replicas
    sums = torch.stack([p.detach().double().sum() for p in model.parameters()]).to(acc.device)
    if acc.num_processes == 1:
        return 0.0
    gathered = acc.gather(sums[None]).reshape(acc.num_processes, -1)
    return float((gathered - gathered[0]).abs().max())


#: While true (:func:`keep_process_group`), :func:`finish` leaves the process group for the next run in the process.
_KEEP_PROCESS_GROUP = [False]


@contextlib.contextmanager
def keep_process_group() -> Iterator[None]:
    """Several runs in one process (``pretrain --recipe``'s phases): :func:`finish` keeps the process group for the
    next run (made again, a second rendezvous on torchrun's store would read the first one's stale addresses) and it is
    destroyed when the block ends."""
    _KEEP_PROCESS_GROUP[0] = True
    try:
        yield
    finally:
        _KEEP_PROCESS_GROUP[0] = False
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def finish(accelerator, *holders: Any) -> None:
    """Clean shutdown: end trackers, drop references held by the accelerator, destroy the process group (unless
    inside :func:`keep_process_group`).

    Call after saving; delete your own references to the model/optimizer first (``holders`` such as the
    :class:`training.loop.Trainer` have theirs cleared). Destroying the process group avoids gloo's abort at exit.
    """
    accelerator.wait_for_everyone()
    for holder in holders:
        for name in ("model", "optimizer", "scheduler", "train_dataloader"):
            if hasattr(holder, name):
                setattr(holder, name, None)
    if _KEEP_PROCESS_GROUP[0]:  # accelerator.end_training() without its destroy_process_group()
        for tracker in accelerator.trackers:
            tracker.finish()
    else:
        accelerator.end_training()
    accelerator.free_memory()
    if torch.distributed.is_available() and torch.distributed.is_initialized() and not _KEEP_PROCESS_GROUP[0]:
        torch.distributed.destroy_process_group()


__all__ = [
    "as_device_scalar",
    "device_skip_supported",
    "enable_gradient_checkpointing",
    "finish",
    "inner_optimizer",
    "keep_process_group",
    "make_accelerator",
    "prepare",
    "reduce_sum",
    "replica_difference",
]
