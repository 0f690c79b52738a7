"""The loop's checkpointer (:class:`Checkpointer`, held by :class:`training.loop.Trainer`): write a checkpoint and
rotate the old ones, find and check the checkpoint to resume from and load it, load the best model at the end.
The files and their manifest are :mod:`training.checkpoint_files`'s; the resume checks are
:func:`check_resume_geometry`, :func:`check_resume_model`, :func:`check_resume_settings` and :func:`check_pickles`.
What it guarantees:

* **Checkpoints.** Every ``checkpointing_steps`` optimizer steps (a fraction below 1: of the run) and at the end,
  ``<output_dir>/checkpoints/step_N/`` written atomically with a size + SHA-256 manifest
  (:mod:`training.checkpoint_files`), the last ``checkpoints_total_limit`` kept; the learning-rate schedule is stored as
  JSON in ``trainer_state.json`` (nothing is unpickled on resume). ``latest`` skips damaged checkpoints; a failed
  save (disk full) raises :class:`training.checkpoint_files.CheckpointWriteError` and leaves the previous checkpoints
  intact.
* **Exact resume.** ``resume_from_checkpoint`` (``latest`` or a path; with a ``run_id``, ``latest`` and the
  rotation consider only that run's checkpoints) restores weights, optimizer, schedule, every process's RNG
  states, the log and evaluation histories and the position in the data (it refuses another global batch, number
  of steps, training data by content, optimizer settings, or a model config that differs in any architecture field
  -- dropout too, unless ``allow_dropout_change``; a changed ``max_grad_norm`` is warned about): the epoch is set on
  the sampler and collator, and
  the micro-batches already consumed are skipped with ``accelerator.skip_first_batches`` (without collating
  them), so the run continues with the very batches and dropout masks of an uninterrupted run. For that the
  training data must be ordered by a sampler seeded from (seed, epoch) (e.g.
  :class:`training.data.EpochShuffleSampler`), the DataLoader must have its own ``generator`` and the collator
  must draw its random numbers from its own seeded generators, never from the global RNG (which belongs to
  dropout).
"""

from __future__ import annotations

import json
import logging
import os
import pickle
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

from core.errors import InputError, first_line
from training import checkpoint_files as ckpt
from training.config import TrainingConfig, best_metric_name
from training.data import data_change
from training.state import TrainerState

#: the loop's logger: these lines are the loop's, and keep its name in the log
logger = logging.getLogger("training.loop")

#: The optimizer settings a new phase (``--continue_from_checkpoint``) must share with the checkpoint: those its
#: optimizer state depends on (the schedule is the phase's own).
PHASE_SETTINGS = (
    "learning_rate",
    "weight_decay",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "optim",
    "decoupled_weight_decay",
)

#: The model config fields a new phase may change (a context-extension phase: ModernBERT raises the global rotary
#: base from 10,000 to 160,000 when it extends the context from 1,024 to 8,192 tokens; the base of its local layers
#: stays); ``max_position_embeddings`` only with rotary positions (a learned table's shape depends on it). Everything
#: else is refused. (Nested fields by their dotted names, as :func:`check_resume_model` compares them.)
PHASE_MODEL_CHANGES = ("rope_parameters.full_attention.rope_theta", "max_position_embeddings")

#: The data settings (:func:`training.data.fingerprint_sources` entries) a new phase may change: the block length.
PHASE_DATA_CHANGES = ("max_seq_length",)


class Checkpointer:
    """``<output_dir>/checkpoints/step_N`` of one run (what it guarantees: this module's docstring).

    Args:
        accelerator: the prepared run's ``Accelerator`` (its ``save_state`` / ``load_state`` write and read the
            model, optimizer and RNG states).
        config: the loop's settings (``output_dir``, ``checkpoints_total_limit``, ``resume_from_checkpoint``,
            ``ignore_checkpoint_integrity``, ``load_best_model_at_end``).
        model: the model, whose config class reads a checkpoint's record (:func:`recorded_architecture`).
    """

    def __init__(self, accelerator, config: TrainingConfig, model=None):
        self.accelerator, self.config, self.model = accelerator, config, model
        self.checkpoints_dir = os.path.join(config.output_dir, "checkpoints")

    def save(self, state: TrainerState, scheduler) -> str:
        """Write ``checkpoints/step_<state.global_step>`` with ``state`` and the schedule's state (as JSON) and
        rotate the old ones (all processes must call it); with ``load_best_model_at_end`` the best step's
        checkpoint is kept by the rotation. Returns the checkpoint's path.

        Raises:
            training.checkpoint_files.CheckpointWriteError: the write failed (e.g. disk full); earlier checkpoints
                intact.
        """
        saved = dict(state.state_dict(), lr_scheduler=scheduler.state_dict())
        best = state.best_step
        protect = [best] if self.config.load_best_model_at_end and best is not None else []
        path = ckpt.save_checkpoint(
            self.accelerator,
            self.checkpoints_dir,
            state.global_step,
            saved,
            self.config.checkpoints_total_limit,
            protect=protect,
            run_id=state.run_id,
        )
        return str(path)

    def resume(self, state: TrainerState, scheduler, per_device_train_batch_size: int) -> str | None:
        """Resume from ``resume_from_checkpoint`` (``latest`` or a path; None: nothing to do): check it against
        the run (:func:`check_resume_geometry`, :func:`check_resume_model`, :func:`check_pickles`,
        :func:`check_resume_settings`), load the
        weights, optimizer, RNG states and schedule, and restore ``state`` with the position in the epoch counted
        in examples. Returns the checkpoint's path, or None when there is none to resume from.

        Raises:
            InputError: the checkpoint does not fit the run, holds pickled objects, or cannot be read.
        """
        cfg, acc = self.config, self.accelerator
        path = ckpt.resolve_checkpoint(
            cfg.resume_from_checkpoint, self.checkpoints_dir, state.run_id, cfg.ignore_checkpoint_integrity
        )
        if path is None:
            return None
        saved = ckpt.read_state(path)
        current = {
            "num_processes": acc.num_processes,
            "gradient_accumulation_steps": cfg.gradient_accumulation_steps,
            "per_device_train_batch_size": per_device_train_batch_size,
            "max_train_steps": state.max_train_steps,
            "num_train_examples": state.num_train_examples,
        }
        check_resume_geometry(path, saved, current)
        recorded = recorded_architecture(self.model, saved.get("model_config"))
        check_resume_model(path, recorded, state.model_config, cfg.allow_dropout_change, warn=acc.is_main_process)
        check_pickles(path, acc.process_index)
        _load(acc, path, saved, scheduler)
        # after the load: another model is named first, not its default lr
        check_resume_settings(path, saved, state, warn=acc.is_main_process)
        state.load_resumed(saved)
        state.batches_in_epoch = _batches_in_epoch(saved, per_device_train_batch_size, acc.num_processes)
        if acc.is_main_process:
            logger.info(
                "resumed from %s at step %d (epoch %d, %d micro-batches in)",
                path,
                state.global_step,
                state.epoch,
                state.batches_in_epoch,
            )
        return str(path)

    def start_phase(self, state: TrainerState, scheduler, per_device_train_batch_size: int) -> str | None:
        """Start a new phase from ``continue_from_checkpoint`` (None: nothing to do): the weights, optimizer state
        and RNG states of that checkpoint of an earlier run, and its position in the data (epoch, micro-batches in,
        counted in examples as on resume); this run's own steps (from 0), schedule and histories. The
        optimizer's learning rate is set to this run's schedule at its step 0. So a decay phase of M steps from the
        step-N checkpoint of a constant-after-warmup run takes the very steps, batches and learning rates of steps N
        + 1 .. N + M of one warmup-stable-decay run.

        A context-extension phase may change the block length (the same text cut into longer blocks: the position
        becomes the same share of the epoch, :func:`_batches_at_share`; the global batch in sequences may change with
        it, e.g. to keep the tokens per step) and the model's global rotary base and positions
        (:func:`phase_model_changes`); nothing else of the model or the data.

        Raises:
            InputError: a damaged checkpoint, another global batch or training set, another model config than
                :func:`phase_model_changes` allows (:func:`check_resume_model`), other training data, other
                optimizer settings (learning rate, weight decay, betas, epsilon, ``--optim``), or one that does not
                fit the model/optimizer.
        """
        spec, acc, flag = self.config.continue_from_checkpoint, self.accelerator, "--continue_from_checkpoint"
        if not spec:
            return None
        path = ckpt.check_checkpoint_path(spec, flag)
        damaged, incomplete = ckpt.checkpoint_problems(path)
        if damaged or incomplete:
            raise InputError(f"{flag} {spec}: damaged checkpoint ({damaged or incomplete}); expected an intact one")
        saved = ckpt.read_state(path)
        lengths = phase_data_changes(saved.get("data_fingerprint"), state.data_fingerprint)
        if lengths:  # another block length: the same text cut into other blocks; compared as the checkpoint's
            saved = dict(saved, data_fingerprint=state.data_fingerprint)
        current = {
            "num_processes": acc.num_processes,
            "gradient_accumulation_steps": self.config.gradient_accumulation_steps,
            "per_device_train_batch_size": per_device_train_batch_size,
            "max_train_steps": saved.get("max_train_steps"),  # a phase has its own steps
            "num_train_examples": state.num_train_examples,
        }
        if lengths:  # other blocks: their number and the sequences per step are the phase's own
            geometry = ("num_processes", "gradient_accumulation_steps", "per_device_train_batch_size")
            current.update({k: saved.get(k, current[k]) for k in geometry})
            current["num_train_examples"] = saved.get("num_train_examples")
        check_resume_geometry(path, saved, current, flag)
        recorded = recorded_architecture(self.model, saved.get("model_config"))
        check_resume_model(
            path,
            recorded,
            state.model_config,
            self.config.allow_dropout_change,
            acc.is_main_process,
            flag,
            phase_changes=phase_model_changes(recorded, state.model_config),
        )
        check_pickles(path, acc.process_index)
        _load(acc, path, {k: v for k, v in saved.items() if k != "lr_scheduler"}, scheduler)
        for group, lr in zip(scheduler.optimizer.param_groups, scheduler.get_last_lr()):
            group["lr"] = lr  # the loaded optimizer holds the earlier run's last rate
        check_resume_settings(path, saved, state, warn=acc.is_main_process, keys=PHASE_SETTINGS, flag=flag)
        state.epoch = int(saved.get("epoch", 0))
        if lengths:
            state.batches_in_epoch = _batches_at_share(saved, state, per_device_train_batch_size, acc.num_processes)
        else:
            state.batches_in_epoch = _batches_in_epoch(saved, per_device_train_batch_size, acc.num_processes)
        if acc.is_main_process:
            logger.info(
                "a new phase from %s (step %s of the run that wrote it; epoch %d, %d micro-batches in): its weights, "
                "optimizer and random states, then %d steps of this run's schedule",
                path,
                saved.get("global_step"),
                state.epoch,
                state.batches_in_epoch,
                state.max_train_steps,
            )
        return str(path)

    def load_best(self, state: TrainerState, last_metrics: dict[str, float]) -> dict[str, float]:
        """With ``load_best_model_at_end``: load the best step's checkpoint (model, optimizer, RNG states) when it
        is not the last step and return the metrics recorded at that step; else return ``last_metrics``. (Side
        products of ``eval_fn``, e.g. saved predictions, are the last evaluation's: run ``eval_fn`` again for
        the best model's.)

        Raises:
            InputError: the best checkpoint is damaged.
        """
        best = state.best_step
        if not self.config.load_best_model_at_end or best is None or best == state.global_step:
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
                state.best_metric,
            )
        record = next(e for e in reversed(state.eval_history) if e["step"] == best)
        return {k: v for k, v in record.items() if k != "step"}


def _batches_at_share(saved: Mapping[str, Any], state: TrainerState, per_device_train_batch_size: int, P: int) -> int:
    """The micro-batches per process of a new phase with another block length (its training set re-cut into
    ``state.num_train_examples`` blocks) that cover the share of the epoch the checkpoint had consumed: ``floor(e x
    N' / N / (b' x P'))`` for ``e`` examples consumed of the checkpoint's ``N`` (a stream, ``N`` unknown: 0, the
    stream is read from its start)."""
    n_saved, n_now = saved.get("num_train_examples"), state.num_train_examples
    if not n_saved or not n_now:
        return 0
    consumed = int(saved.get("batches_in_epoch", 0)) * int(saved.get("per_device_train_batch_size", 1))
    consumed *= int(saved.get("num_processes", 1))
    return consumed * int(n_now) // (int(n_saved) * per_device_train_batch_size * P)


def phase_data_changes(
    saved: list[Mapping[str, Any]] | None, current: list[Mapping[str, Any]] | None
) -> dict[str, tuple[str, str]]:
    """The :data:`PHASE_DATA_CHANGES` settings that differ between a checkpoint's data fingerprint and this run's,
    as ``{name: (saved value, current value)}``, when they are the only difference ({} otherwise: the usual data
    check then names what changed)."""
    if not saved or not current or len(saved) != len(current):
        return {}
    changes = {}
    for old, new in zip(saved, current):
        if old == new:
            continue
        if old.get("name") != new.get("name") or old.get("name") not in PHASE_DATA_CHANGES:
            return {}
        changes[old["name"]] = (old.get("value"), new.get("value"))
    return changes


def phase_model_changes(saved: Mapping[str, Any] | None, current: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The model config fields a new phase from a checkpoint with ``saved`` (:func:`model_architecture`) may change
    to ``current``: :data:`PHASE_MODEL_CHANGES`, without ``max_position_embeddings`` unless both use rotary
    positions."""
    if not saved or not current:
        return ()
    rotary = saved.get("position_embedding_type") == current.get("position_embedding_type") == "rope"
    return tuple(f for f in PHASE_MODEL_CHANGES if rotary or f != "max_position_embeddings")


def _batches_in_epoch(saved: Mapping[str, Any], per_device_train_batch_size: int, num_processes: int) -> int:
    """The micro-batches per process of this run consumed in the checkpoint's epoch (``saved``: its
    ``trainer_state.json``). The position is counted in examples, so that another split of the same global batch
    (processes x per-device batch x accumulation) continues with the very next examples."""
    per_micro_batch = per_device_train_batch_size * num_processes
    saved_micro_batch = int(saved.get("per_device_train_batch_size", per_device_train_batch_size)) * int(
        saved.get("num_processes", num_processes)
    )
    return int(saved.get("batches_in_epoch", 0)) * saved_micro_batch // per_micro_batch


def _load(accelerator, path, saved: Mapping[str, Any], scheduler) -> None:
    """``accelerator.load_state(path)`` and the schedule's state from ``saved``, every failure as one line.

    Raises:
        InputError: pickled objects refused by ``torch.load(weights_only=True)``, a checkpoint that does not fit
            the model/optimizer, or weights that cannot be read (safetensors' ``SafetensorError``).
    """
    try:
        accelerator.load_state(str(path))
        if "lr_scheduler" in saved:
            scheduler.load_state_dict(saved["lr_scheduler"])
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


def check_pickles(path, process_index: int) -> None:
    """Load this process's RNG file (``random_states_<process_index>.pkl`` in ``path``) with ``weights_only``
    first: accelerate would skip a blocked one silently.

    Raises:
        InputError: the file holds objects that ``torch.load(weights_only=True)`` refuses.
    """
    from accelerate.utils import load

    rng = os.path.join(path, ckpt.RNG_FILE.format(process_index))
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


def check_resume_settings(
    path,
    saved: Mapping[str, Any],
    state: TrainerState,
    warn: bool = True,
    keys: tuple[str, ...] | None = None,
    flag: str = "--resume_from_checkpoint",
) -> None:
    """Refuse a resume with other training data (by content) or other optimizer settings than the checkpoint's
    (its optimizer state and schedule would silently keep the old values); warn about another
    ``max_grad_norm`` (applied as given from here on) when ``warn`` (the main process).

    Args:
        saved: the checkpoint's ``trainer_state.json``; ``state``: this run's (its ``data_fingerprint`` and
            ``optimizer_settings``).
        keys: the optimizer settings compared (default: all; a new phase: :data:`PHASE_SETTINGS`, its schedule is
            its own). ``flag``: the flag named in the error.

    Raises:
        InputError: one line naming what changed, the saved and the current value.
    """
    changed = data_change(saved.get("data_fingerprint"), state.data_fingerprint)
    if changed:
        raise InputError(
            f"{flag} {path}: the training data changed since the checkpoint "
            f"({changed}); expected the same files and settings (start a new run for other data)"
        )
    old, new = saved.get("optimizer_settings") or {}, state.optimizer_settings
    differ = [k for k in new if k in old and old[k] != new[k] and k != "max_grad_norm" and (keys is None or k in keys)]
    if differ:
        raise InputError(
            f"{flag} {path}: optimizer settings differ from the checkpoint's "
            f"({'; '.join(f'{k} {old[k]} -> {new[k]}' for k in differ)}): the checkpoint's optimizer state and "
            "schedule would keep its values; expected the same settings (to train on with others, start a new "
            "run from the saved model)"
        )
    if "max_grad_norm" in old and old["max_grad_norm"] != new["max_grad_norm"] and warn:
        logger.warning(
            "--max_grad_norm %s differs from the checkpoint's %s: the run continues with %s",
            new["max_grad_norm"],
            old["max_grad_norm"],
            new["max_grad_norm"],
        )


def check_resume_geometry(
    path, saved: Mapping[str, Any], current: Mapping[str, Any], flag: str = "--resume_from_checkpoint"
) -> None:
    """Refuse a resume that would skip or repeat data or change the schedule: another global batch, another
    number of optimizer steps or another training set size. Another split of the same global batch
    (processes, per-device batch, accumulation) is fine: the position is counted in examples.

    Args:
        saved: the checkpoint's ``trainer_state.json``.
        current: this run's ``num_processes``, ``gradient_accumulation_steps``, ``per_device_train_batch_size``,
            ``max_train_steps`` and ``num_train_examples`` (None: a stream).
        flag: the flag named in the error.

    Raises:
        InputError: one line naming what changed, the saved and the current value.
    """
    P, G, b = (
        current["num_processes"],
        current["gradient_accumulation_steps"],
        current["per_device_train_batch_size"],
    )
    max_train_steps, num_train_examples = current["max_train_steps"], current["num_train_examples"]
    sP = int(saved.get("num_processes", P))
    sG = int(saved.get("gradient_accumulation_steps", G))
    sb = int(saved.get("per_device_train_batch_size", b))
    changes = []
    if sP * sG * sb != P * G * b:
        changes.append(
            f"global batch {sP * sG * sb} ({sP} processes x {sb} per device x {sG} accumulation) -> "
            f"{P * G * b} ({P} x {b} x {G})"
        )
    if saved.get("max_train_steps", max_train_steps) != max_train_steps:
        changes.append(f"max_train_steps {saved.get('max_train_steps')} -> {max_train_steps}")
    if saved.get("num_train_examples", num_train_examples) != num_train_examples:
        changes.append(f"training examples {saved.get('num_train_examples')} -> {num_train_examples}")
    if changes:
        raise InputError(
            f"{flag} {path}: the run changed since the checkpoint ({'; '.join(changes)}); "
            "expected the same global batch, number of steps and training data (another split of the same "
            "global batch over processes, per-device batch and accumulation is fine)"
        )


#: ``PretrainedConfig.to_dict`` keys that do not describe the network a checkpoint's weights belong to: bookkeeping,
#: output switches, the label names (their number is kept as ``num_labels``) and the loss choice that transformers
#: fills in at the first forward (``problem_type``). Keys starting with ``_`` are left out too.
NOT_ARCHITECTURE = frozenset(
    {
        "transformers_version",
        "architectures",
        "auto_map",
        "dtype",
        "torch_dtype",
        "output_hidden_states",
        "output_attentions",
        "return_dict",
        "use_cache",
        "chunk_size_feed_forward",
        "id2label",
        "label2id",
        "problem_type",
        "tokenizer_class",
        "finetuning_task",
        "task_specific_params",
    }
)


def is_dropout_field(name: str) -> bool:
    """Whether a config field is a dropout probability (a name ending in ``dropout`` or ``dropout_prob``): it
    shapes no weight and acts in training only, so ``--allow_dropout_change`` may change it on resume."""
    return name.endswith(("dropout", "dropout_prob"))


def model_architecture(model) -> dict[str, Any] | None:
    """The fields of ``model.config`` (a ``PretrainedConfig``) that define the network, as JSON values (what a
    checkpoint records and a resume compares): ``to_dict()`` without :data:`NOT_ARCHITECTURE` and private keys,
    with ``num_labels``; a config with ``attention_types()`` (SesameBert) records the resolved per-layer
    ``layer_types`` (so ``None``, every layer global, equals the same layers spelt out). None: a model without a
    config.
    """
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        return None
    fields = {k: v for k, v in config.to_dict().items() if k not in NOT_ARCHITECTURE and not k.startswith("_")}
    if "id2label" in config.to_dict():
        fields["num_labels"] = len(config.to_dict()["id2label"] or {})
    if callable(getattr(config, "attention_types", None)):
        fields["layer_types"] = config.attention_types()
    return json.loads(json.dumps(fields, default=str))  # as trainer_state.json gives it back


def recorded_architecture(model, recorded: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A checkpoint's ``recorded`` :func:`model_architecture` as this version records it: that of the config which
    ``model``'s config class builds from it, so a record of an earlier version names its fields as this one does
    (e.g. SesameBert's ``rope_theta`` as ``rope_parameters``); the record as it is when the class refuses it (the
    comparison then names the fields); None when nothing was recorded."""
    config = getattr(model, "config", None)
    if recorded is None or not hasattr(config, "to_dict"):
        return recorded
    try:
        return model_architecture(SimpleNamespace(config=type(config)(**recorded)))
    except Exception:  # noqa: BLE001  (any refusal of the record: compared as it is)
        return dict(recorded)


def _leaves(fields: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``fields`` with each nested mapping's entries under dotted names (``{"a": {"b": 1}}`` -> ``{"a.b": 1}``)."""
    out = {}
    for name, value in fields.items():
        out.update(
            _leaves(value, f"{prefix}{name}.") if isinstance(value, Mapping) and value else {prefix + name: value}
        )
    return out


def _value(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def check_resume_model(
    path,
    saved: Mapping[str, Any] | None,
    current: Mapping[str, Any] | None,
    allow_dropout_change: bool = False,
    warn: bool = True,
    flag: str = "--resume_from_checkpoint",
    phase_changes: tuple[str, ...] = (),
) -> None:
    """Refuse a resume whose model differs from the checkpoint's in any architecture field (the weights would be
    loaded into another network: another attention window, rotary base, activation, norm, layer layout, ...; a
    shape change is named here too, before the weights are read). Dropout probabilities (:func:`is_dropout_field`)
    are refused as well unless ``allow_dropout_change``; then they are warned about (on the main process, ``warn``)
    and the run continues with the new ones.

    Args:
        saved: the checkpoint's ``model_config`` (:func:`model_architecture`); None (a checkpoint of an older
            version, or a model without a config): nothing to compare.
        current: this run's. ``flag``: the flag named in the error.
        phase_changes: fields allowed to differ (a new phase: :func:`phase_model_changes`), e.g. the rotary base of
            a context-extension phase.

    Raises:
        InputError: one line naming each changed field (a nested one by its dotted name, e.g.
            ``rope_parameters.full_attention.rope_theta``), the checkpoint's value and this run's.
    """
    if saved is None or current is None:
        return
    saved, current = _leaves(saved), _leaves(current)
    differ = [k for k in sorted(set(saved) | set(current)) if saved.get(k) != current.get(k) and k not in phase_changes]
    dropout = [k for k in differ if is_dropout_field(k)]
    refused = [k for k in differ if not (allow_dropout_change and k in dropout)]
    if refused:
        changes = "; ".join(f"{k} {_value(saved.get(k))} -> {_value(current.get(k))}" for k in refused[:4])
        more = f" and {len(refused) - 4} more" if len(refused) > 4 else ""
        hint = " (--allow_dropout_change accepts other dropout probabilities)" if set(refused) <= set(dropout) else ""
        if phase_changes:
            hint += f"; a new phase may change only {', '.join(phase_changes)}"
        raise InputError(
            f"{flag} {path}: the model config differs from the checkpoint's ({changes}{more}); "
            f"expected the checkpoint's model config{hint} (start a new run for another model)"
        )
    if dropout and warn:
        logger.warning(
            "--allow_dropout_change: the model's dropout differs from the checkpoint's (%s): the run continues with "
            "the new values (not bitwise an uninterrupted run)",
            "; ".join(f"{k} {_value(saved.get(k))} -> {_value(current.get(k))}" for k in dropout),
        )


__all__ = [
    "NOT_ARCHITECTURE",
    "PHASE_DATA_CHANGES",
    "PHASE_MODEL_CHANGES",
    "PHASE_SETTINGS",
    "Checkpointer",
    "check_pickles",
    "check_resume_geometry",
    "check_resume_model",
    "check_resume_settings",
    "is_dropout_field",
    "model_architecture",
    "recorded_architecture",
    "phase_data_changes",
    "phase_model_changes",
]
