"""The training loop's settings: :class:`TrainingConfig`, the one declaration of the loop's command-line flags.

The same frozen dataclass is the loop's configuration and, parsed with :func:`core.arguments.parse_arguments`,
the ``training loop`` group of every training command (names and meanings of transformers' ``TrainingArguments``
and the Hugging Face example scripts). A command that needs other defaults derives a subclass with
:func:`core.arguments.with_defaults`; fields it defaults to ``None`` are resolved later (e.g. pretraining's
learning rate by model family) into a plain :class:`TrainingConfig`, whose construction checks every value.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Literal

from core.arguments import arg
from core.errors import InputError
from training.optim import OPTIMIZERS, SCHEDULERS


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
    """Settings of the shared loop (the ``training loop`` flags of every training command).

    Raises:
        InputError: on construction, a value out of range (naming the flag and what was expected), an
            unwritable ``output_dir`` or a ``resume_from_checkpoint`` folder that is not a checkpoint.
    """

    _argument_group_name: ClassVar[str] = "training loop"
    #: Fields whose ``None`` means "resolved later" by the command (see :func:`core.arguments.with_defaults`).
    _resolved_later: ClassVar[frozenset[str]] = frozenset()

    output_dir: str = arg(help="run folder (model, checkpoints/, runs/, wandb/, all_results.json)")
    overwrite_output_dir: bool = arg(
        False, "replace the run in a non-empty --output_dir (its checkpoints are deleted first)"
    )
    per_device_train_batch_size: int = arg(32, "micro-batch size per process")
    per_device_eval_batch_size: int = arg(64, "evaluation batch size per process")
    gradient_accumulation_steps: int = arg(1, "micro-batches per process per optimizer step")
    batch_size_warmup_tokens: int | None = arg(
        None,
        "pretrain: batch-size warmup over the first N tokens: the global batch grows linearly in tokens from one "
        "micro-batch per process to the full --gradient_accumulation_steps (ModernBERT's batch-size warmup)",
    )
    learning_rate: float = arg(5e-4, "peak learning rate")
    weight_decay: float = arg(0.01, "AdamW weight decay, not on biases/norms")
    adam_beta1: float = arg(0.9, "AdamW beta1")
    adam_beta2: float = arg(0.999, "AdamW beta2")
    adam_epsilon: float = arg(1e-8, "AdamW epsilon")
    optim: str = arg(
        "adamw_torch_fused",
        "optimizer: torch's AdamW, fused kernel (where the device has it) or foreach; stable_adamw: torch-optimi's "
        "StableAdamW (AdamW with per-tensor update clipping, ModernBERT's)",
        choices=list(OPTIMIZERS),
    )
    decoupled_weight_decay: bool = arg(
        False,
        "weight decay independent of the learning rate's size: each step multiplies the weights by 1 - (lr_t / peak "
        "lr) x --weight_decay (Composer's DecoupledAdamW, optimi's decouple_lr; ModernBERT: 1e-5), not 1 - lr_t x "
        "--weight_decay",
    )
    lr_scheduler_type: str = arg("linear", "learning-rate schedule", choices=list(SCHEDULERS))
    num_warmup_steps: int | None = arg(None, "optimizer steps of linear warmup (overrides --warmup_ratio)")
    warmup_ratio: float = arg(
        0.0, "warmup as a fraction of the run's optimizer steps, when --num_warmup_steps is not given"
    )
    num_decay_steps: int | None = arg(
        None, "warmup_stable_decay(_1sqrt): steps of the final decay (default: 10%% / 20%% of the run)"
    )
    max_train_steps: int | None = arg(None, "optimizer steps of the run (overrides --num_train_epochs)")
    num_train_epochs: float = arg(1.0, "passes over the training data, unless --max_train_steps is given")
    max_grad_norm: float | None = arg(1.0, "gradient clipping norm, 0 = none")
    checkpointing_steps: float | None = arg(
        None, "checkpoint every N optimizer steps, or every fraction of the run when below 1 (always one at the end)"
    )
    checkpoints_total_limit: int | None = arg(2, "keep the last K checkpoints, 0 = all")
    resume_from_checkpoint: str | None = arg(
        None, "'latest' (newest in <output_dir>/checkpoints) or a checkpoint folder"
    )
    continue_from_checkpoint: str | None = arg(
        None,
        "start a new phase from a checkpoint of an earlier run (e.g. a decay phase after a stable one): its weights, "
        "optimizer state, random states and position in the training data, with this run's steps and schedule "
        "(e.g. --lr_scheduler_type warmup_stable_decay_1sqrt --num_warmup_steps 0 --num_decay_steps M "
        "--max_train_steps M); the same data, global batch and optimizer settings, except that a context-extension "
        "phase may cut the data into longer blocks (--max_seq_length), with another global batch and rotary base",
    )
    ignore_checkpoint_integrity: bool = arg(
        False,
        "resume from a checkpoint without its file manifest or RNG state "
        "files (a warning instead of a refusal; the run does not continue bitwise)",
    )
    allow_dropout_change: bool = arg(
        False,
        "resume although the model config's dropout probabilities differ from the checkpoint's (a warning; the run "
        "continues with the new ones); any other model config change is refused on resume",
    )
    logging_steps: int = arg(10, "log every N optimizer steps")
    eval_steps: float | None = arg(
        None, "evaluate every N optimizer steps, or every fraction of the run when below 1 (and at the end)"
    )
    report_to: str = arg(
        "none",
        "trackers, a comma list of tensorboard, wandb (or all, none): tensorboard writes "
        "<output_dir>/runs/, wandb <output_dir>/wandb/ (offline without credentials)",
    )
    seed: int = arg(42, "random seed")
    skip_nonfinite_steps: int = arg(
        0, "skip up to N optimizer steps with a NaN/inf loss or gradient norm (warning each) before stopping"
    )
    mixed_precision: Literal["no", "fp16", "bf16"] | None = arg(
        None, "override the accelerate config's mixed precision"
    )
    torch_compile: bool = arg(
        False, "compile the model with torch.compile (faster steps on a GPU after a compilation of a minute or so)"
    )
    regional_compile: bool = arg(
        False,
        "compile the feed-forward layers, norms and MLM head module by module (ModernBERT's reference_compile; "
        "models with compile_regions, e.g. SesameBert) instead of the whole model; meant for CUDA. Off by default: "
        "not yet measured against eager and --torch_compile (no GPU where it was written; on the CPU inductor "
        "compiles for minutes)",
    )
    metric_for_best_model: str | None = arg(
        None,
        "evaluation metric that picks the best model and drives early "
        "stopping (default: the task's main metric; pretrain: eval_loss)",
    )
    greater_is_better: bool | None = arg(
        None,
        "whether a larger --metric_for_best_model is better (default: false for losses and perplexities, else true)",
    )
    load_best_model_at_end: bool = arg(
        False, "checkpoint at every evaluation, keep the best checkpoint, end with its weights"
    )
    early_stopping_patience: int | None = arg(
        None, "stop after N evaluations without improvement of --metric_for_best_model (needs --eval_steps)"
    )
    gradient_checkpointing: bool = arg(
        False, "recompute activations in the backward pass (less memory, slower); models that support it"
    )
    project_name: str = dataclasses.field(default="sesame-lm", init=False)
    """Tracker project (TensorBoard sub-folder, wandb project)."""

    def __post_init__(self) -> None:
        for name, low in (
            ("gradient_accumulation_steps", 1),
            ("batch_size_warmup_tokens", 1),
            ("max_train_steps", 1),
            ("num_warmup_steps", 0),
            ("skip_nonfinite_steps", 0),
            ("logging_steps", 1),
            ("per_device_train_batch_size", 1),
            ("per_device_eval_batch_size", 1),
        ):
            value = getattr(self, name)
            if value is not None and value < low:
                raise InputError(f"--{name} {value}: expected an integer >= {low}")
        if self.regional_compile and self.torch_compile:
            raise InputError("--regional_compile with --torch_compile: expected one of them (both compile the model)")
        if self._is_set("learning_rate") and not (self.learning_rate > 0 and math.isfinite(self.learning_rate)):
            raise InputError(f"--learning_rate {self.learning_rate}: expected a positive finite number")
        if self._is_set("warmup_ratio") and not 0.0 <= self.warmup_ratio < 1.0:
            raise InputError(f"--warmup_ratio {self.warmup_ratio}: expected a number in [0, 1)")
        if self.max_train_steps is None and self._is_set("num_train_epochs") and not self.num_train_epochs > 0:
            raise InputError(f"--num_train_epochs {self.num_train_epochs}: expected a number > 0")
        if self.max_grad_norm is not None and self.max_grad_norm < 0:
            raise InputError(f"--max_grad_norm {self.max_grad_norm}: expected a number >= 0")
        for name in ("checkpointing_steps", "eval_steps"):
            value = getattr(self, name)
            if value is not None and not (0 < value < 1 or (value >= 1 and float(value).is_integer())):
                raise InputError(
                    f"--{name} {value}: expected an integer >= 1 (steps) or a fraction of the run in (0, 1)"
                )
        if self.optim not in OPTIMIZERS:
            raise InputError(f"--optim {self.optim!r}: expected one of {', '.join(OPTIMIZERS)}")
        if self._is_set("lr_scheduler_type") and self.lr_scheduler_type not in SCHEDULERS:
            raise InputError(f"--lr_scheduler_type {self.lr_scheduler_type!r}: expected one of {', '.join(SCHEDULERS)}")
        if self.early_stopping_patience is not None and self.early_stopping_patience < 1:
            raise InputError(f"--early_stopping_patience {self.early_stopping_patience}: expected an integer >= 1")
        if self.early_stopping_patience and not self.eval_steps and "eval_steps" not in self._resolved_later:
            raise InputError(
                f"--early_stopping_patience {self.early_stopping_patience}: needs --eval_steps N "
                "(evaluations during training to compare)"
            )
        if self.metric_for_best_model is not None and not self.metric_for_best_model.strip():
            raise InputError("--metric_for_best_model '': expected a metric name such as eval_loss or eval_accuracy")
        from training.checkpoint_files import check_checkpoint_path, check_output_dir
        from training.trackers import log_with

        log_with(self.report_to)  # validates
        if self.output_dir:
            check_output_dir(self.output_dir)
        if self.resume_from_checkpoint not in (None, "", "latest"):
            check_checkpoint_path(self.resume_from_checkpoint)
        if self.continue_from_checkpoint:
            check_checkpoint_path(self.continue_from_checkpoint, "--continue_from_checkpoint")

    def _is_set(self, name: str) -> bool:
        return getattr(self, name) is not None or name not in self._resolved_later

    def resolved(self, **values: Any) -> TrainingConfig:
        """A plain :class:`TrainingConfig` with this one's values and ``values`` (every check runs again)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(TrainingConfig) if f.init}
        return TrainingConfig(**{**fields, **values})


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


def optimizer_settings(config: TrainingConfig, num_warmup_steps: int) -> dict[str, Any]:
    """The settings a checkpoint's optimizer state and schedule carry (compared on resume,
    :func:`training.checkpointer.check_resume_settings`), with the resolved warmup (optimizer steps);
    ``max_grad_norm`` is applied by the loop as given."""
    return {
        "learning_rate": config.learning_rate,
        "weight_decay": config.weight_decay,
        "adam_beta1": config.adam_beta1,
        "adam_beta2": config.adam_beta2,
        "adam_epsilon": config.adam_epsilon,
        "optim": config.optim,
        "decoupled_weight_decay": config.decoupled_weight_decay,
        "lr_scheduler_type": config.lr_scheduler_type,
        "num_warmup_steps": num_warmup_steps,
        "num_decay_steps": config.num_decay_steps,
        "batch_size_warmup_tokens": config.batch_size_warmup_tokens,
        "max_grad_norm": config.max_grad_norm,
    }


__all__ = [
    "optimizer_settings",
    "TrainingConfig",
    "best_metric_name",
    "greater_is_better",
]
