"""Optimizer and learning-rate schedule of the shared training loop.

* :func:`create_optimizer`: AdamW (Loshchilov & Hutter, 2019, "Decoupled Weight Decay Regularization") or
  StableAdamW (Wortsman et al. 2023, "Stable and low-precision training for large-scale vision-language models",
  alg. 2: AdamW with Adafactor's update clipping, the learning rate of each tensor divided by max(1, RMS(g^2 /
  v)); torch-optimi's implementation, as transformers' ``--optim stable_adamw`` and ModernBERT use it) with weight
  decay on every weight matrix and embedding, none on biases (LSTM biases included) and normalisation weights (as
  BERT's ``AdamWeightDecayOptimizer`` excludes ``bias`` / ``LayerNorm``). The weight decay is torch's (each step
  multiplies the weights by ``1 - lr_t * weight_decay``) or, with ``decoupled_weight_decay``, independent of the
  learning rate's size: ``1 - (lr_t / peak lr) * weight_decay`` (Composer's ``DecoupledAdamW``, optimi's
  ``decouple_lr``; Loshchilov & Hutter's own eq. of AdamW with the schedule multiplier eta_t).
* :func:`create_scheduler`: a schedule from :func:`transformers.get_scheduler` counted in **optimizer steps**.
  The shared loop steps it itself, exactly once per optimizer step, so ``num_training_steps`` is the number of
  optimizer updates whatever ``gradient_accumulation_steps`` and the number of processes are (the schedule is
  deliberately *not* passed to ``accelerator.prepare``: accelerate's ``AcceleratedScheduler`` steps the wrapped
  scheduler once per process, the pitfall of accelerate#662).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from core.errors import InputError

#: ``--lr_scheduler_type`` values and the transformers schedule each maps to.
SCHEDULERS = {
    "linear": "linear",
    "cosine": "cosine",
    "constant": "constant",
    "constant_with_warmup": "constant_with_warmup",
    "warmup_stable_decay": "warmup_stable_decay",
    "warmup_stable_decay_1sqrt": "warmup_stable_decay",
    "decay_1sqrt": "warmup_stable_decay",
}

#: Warmup-stable-decay schedules: ``--lr_scheduler_type`` -> (decay shape of ``transformers.get_wsd_schedule``,
#: default decay steps in percent of the run). ``1-sqrt``: lr factor 1 - sqrt(t / decay steps) over the last 20%
#: (Hägele et al. 2024, "Scaling Laws and Compute-Optimal Training Beyond Fixed Training Durations", sec. 3: a
#: 1-sqrt cooldown over 20% of the run matches or beats a cosine schedule of the same length). ``decay_1sqrt``: the
#: 1-sqrt decay over the whole run after its warmup (a decay phase, ModernBERT's learning-rate-decay phase).
WSD_DECAY = {
    "warmup_stable_decay": ("cosine", 10),
    "warmup_stable_decay_1sqrt": ("1-sqrt", 20),
    "decay_1sqrt": ("1-sqrt", 100),
}

#: Module types whose parameters are never decayed (normalisation layers).
_NORM_TYPES: tuple[type[nn.Module], ...] = (nn.LayerNorm, nn.GroupNorm, nn.BatchNorm1d, nn.BatchNorm2d)
if hasattr(nn, "RMSNorm"):
    _NORM_TYPES = (*_NORM_TYPES, nn.RMSNorm)


def no_decay_parameter_names(model: nn.Module) -> set[str]:
    """Names of the parameters that get no weight decay: biases and the weights of normalisation layers.

    A parameter is a bias when its own name contains ``bias`` (``bias``, ``*_bias``, and ``nn.LSTM`` / ``nn.GRU``'s
    ``bias_ih_l0``, ``bias_hh_l0``, ``bias_ih_l0_reverse``, ...). A module counts as a normalisation layer if it is
    one of torch's norm layers or its class name contains ``Norm`` (custom LayerNorm/RMSNorm implementations).
    """
    names: set[str] = set()
    for module_name, module in model.named_modules():
        is_norm = isinstance(module, _NORM_TYPES) or "norm" in type(module).__name__.lower()
        for param_name, _ in module.named_parameters(recurse=False):
            full = f"{module_name}.{param_name}" if module_name else param_name
            if is_norm or "bias" in param_name:
                names.add(full)
    return names


OPTIMIZERS: dict[str, bool | None] = {"adamw_torch_fused": None, "adamw_torch": False, "stable_adamw": None}
"""``--optim`` names (transformers' ``TrainingArguments.optim``) -> ``fused`` of :func:`create_optimizer`
(None: the fused kernel wherever torch has it for the parameters; ``stable_adamw``: torch-optimi's StableAdamW,
which has no fused kernel: its own Triton kernel on a GPU where Triton runs, else its for-loop)."""

#: The ``--optim`` name of torch-optimi's StableAdamW.
STABLE_ADAMW = "stable_adamw"


def create_optimizer(
    model: nn.Module,
    learning_rate: float,
    weight_decay: float = 0.01,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    fused: bool | None = None,
    *,
    stable: bool = False,
    decoupled_weight_decay: bool = False,
) -> torch.optim.Optimizer:
    """AdamW (or StableAdamW) over the trainable parameters of ``model``, two groups: decayed and not decayed.

    Args:
        model: the (unwrapped) model.
        learning_rate: peak learning rate (> 0).
        weight_decay: weight decay for weight matrices and embeddings (>= 0); biases and normalisation weights
            (see :func:`no_decay_parameter_names`) get 0.
        betas, eps: Adam's moment coefficients and denominator epsilon.
        fused: AdamW only: use torch's fused AdamW kernel (one kernel for all parameters; the same update up to
            rounding). Default: wherever torch has it for the parameters (CPU and CUDA floating-point tensors),
            else the default (foreach) implementation. The fused kernel takes a ``found_inf`` tensor, with which the
            loop skips a non-finite step on the device instead of reading every step's statistics back
            (:mod:`training.loop`); on the CPU it is also ~6x faster than foreach on 4M float32 parameters.
        stable: torch-optimi's ``StableAdamW`` instead of AdamW (Wortsman et al. 2023, alg. 2; the step of each
            tensor uses the learning rate divided by max(1, RMS(g^2 / max(v, eps^2))), with bias-corrected betas).
            It has no ``found_inf``: the loop reads every step's statistics to skip a non-finite one.
        decoupled_weight_decay: each step multiplies the decayed weights by ``1 - (lr_t / learning_rate) *
            weight_decay`` (lr-independent: Composer's ``DecoupledAdamW``, optimi's ``decouple_lr`` with ``max_lr =
            learning_rate``) instead of ``1 - lr_t * weight_decay``. AdamW gets it as the group weight decay
            ``weight_decay / learning_rate`` (torch's update ``1 - lr_t * wd'`` is then the same formula, up to
            the rounding of the quotient).

    Raises:
        InputError: ``learning_rate <= 0``, ``weight_decay < 0`` or ``model`` has no trainable parameter.
        ImportError: ``stable`` without torch-optimi installed (a dependency of sesame-lm).
    """
    if not learning_rate > 0 or not math.isfinite(learning_rate):
        raise InputError(f"--learning_rate {learning_rate}: expected a positive finite number")
    if not weight_decay >= 0:
        raise InputError(f"--weight_decay {weight_decay}: expected a number >= 0")
    no_decay = no_decay_parameter_names(model)
    decay_params, other_params = [], []
    seen: set[int] = set()
    for name, param in model.named_parameters():
        if not param.requires_grad or id(param) in seen:  # tied weights appear once
            continue
        seen.add(id(param))
        (other_params if name in no_decay else decay_params).append(param)
    if not decay_params and not other_params:
        raise InputError("the model has no trainable parameter")
    if stable:
        from optimi import StableAdamW

        groups = [{"params": decay_params, "weight_decay": weight_decay}, {"params": other_params, "weight_decay": 0.0}]
        groups = [g for g in groups if g["params"]]
        return StableAdamW(
            groups,
            lr=learning_rate,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            decouple_lr=decoupled_weight_decay,
            max_lr=learning_rate if decoupled_weight_decay else None,
        )
    decay = weight_decay / learning_rate if decoupled_weight_decay else weight_decay
    groups = [
        {"params": decay_params, "weight_decay": decay},
        {"params": other_params, "weight_decay": 0.0},
    ]
    groups = [g for g in groups if g["params"]]
    if fused is None:
        try:
            return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, eps=eps, fused=True)
        except RuntimeError:  # a device or dtype without the fused kernel
            fused = False
    return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, eps=eps, fused=fused or None)


def optimizer_from_config(model: nn.Module, config) -> torch.optim.Optimizer:
    """:func:`create_optimizer` with a run's settings: ``config`` (a :class:`training.config.TrainingConfig` or any
    object with ``learning_rate``, ``weight_decay``, ``adam_beta1``, ``adam_beta2``, ``adam_epsilon``, ``optim``, a
    key of :data:`OPTIMIZERS`, and optionally ``decoupled_weight_decay``). The loop and the time-budget probe build
    their optimizers with it, so that the probe times the very update the run makes.

    Raises:
        InputError: as :func:`create_optimizer`.
    """
    return create_optimizer(
        model,
        config.learning_rate,
        config.weight_decay,
        (config.adam_beta1, config.adam_beta2),
        config.adam_epsilon,
        fused=OPTIMIZERS[config.optim],
        stable=config.optim == STABLE_ADAMW,
        decoupled_weight_decay=bool(getattr(config, "decoupled_weight_decay", False)),
    )


def create_scheduler(
    name: str,
    optimizer: torch.optim.Optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    num_decay_steps: int | None = None,
) -> torch.optim.lr_scheduler.LambdaLR:
    """The learning-rate schedule ``name``, counted in optimizer steps.

    Args:
        name: a key of :data:`SCHEDULERS` (``linear``: linear warmup then linear decay to 0; ``cosine``: linear
            warmup then half-cosine to 0; ``constant_with_warmup``; ``constant``; ``warmup_stable_decay``:
            linear warmup, constant, then cosine decay to 0 over ``num_decay_steps``;
            ``warmup_stable_decay_1sqrt``: the same with the decay 1 - sqrt(progress), :data:`WSD_DECAY`;
            ``decay_1sqrt``: that decay over all the steps after warmup, a decay phase).
        num_warmup_steps: optimizer steps of linear warmup from 0 to the peak learning rate.
        num_training_steps: optimizer steps of the whole run (the loop's ``max_train_steps``).
        num_decay_steps: warmup-stable-decay schedules only; default 10% (cosine) / 20% (1-sqrt) of
            ``num_training_steps`` (at least 1, at most the steps after warmup: a run of warmup only has no decay).

    Raises:
        InputError: unknown ``name``; negative or inconsistent step counts.
    """
    if name not in SCHEDULERS:
        raise InputError(f"--lr_scheduler_type {name!r}: expected one of {', '.join(SCHEDULERS)}")
    if num_warmup_steps < 0:
        raise InputError(f"--num_warmup_steps {num_warmup_steps}: expected an integer >= 0")
    if num_training_steps < 1:
        raise InputError(f"number of training steps {num_training_steps}: expected at least 1")
    from transformers import get_scheduler

    kwargs = {}
    if name in WSD_DECAY:
        shape, percent = WSD_DECAY[name]
        if num_decay_steps is None:  # the default share, within what warmup leaves (a very short run: no decay)
            decay = min(max(1, num_training_steps * percent // 100), max(0, num_training_steps - num_warmup_steps))
        else:
            decay = num_decay_steps
        if decay < 0 or num_warmup_steps + decay > num_training_steps:
            raise InputError(
                f"--num_decay_steps {decay} with --num_warmup_steps {num_warmup_steps}: warmup + decay must not "
                f"exceed the {num_training_steps} training steps"
            )
        kwargs = {"num_decay_steps": decay, "decay_type": shape}
    return get_scheduler(
        SCHEDULERS[name],
        optimizer,
        num_warmup_steps=num_warmup_steps,
        num_training_steps=num_training_steps,
        scheduler_specific_kwargs=kwargs,
    )
