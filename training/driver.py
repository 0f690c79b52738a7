"""The run driver: the skeleton that ``pretrain``, ``finetune.glue`` and ``finetune.squad`` share, written once.

A command parses its typed arguments, resolves them, and hands the driver what differs (:class:`RunParts`: the
model and tokenizer, the training data, an evaluation and a prediction function, extra output files); the driver
does the rest, in this order::

    with Run(training, hub, settings, do_train=..., card_task="fill-mask") as run:   # releases the folder at the end
        accelerator = run.start()          # hub flags and token checked, the output folder claimed (training runs:
                                           # lock, run id, stale temporaries removed), accelerator, logging
        parts = RunParts(model=..., tokenizer=..., train_dataloader=..., evaluate=...)   # built by the command
        return run.execute(parts)          # train (SIGTERM/SIGINT: checkpoint, 143/130) or evaluate, predict,
                                           # save atomically, finish, push; returns the exit status

Also here: the run files (``all_results.json``, ``eval_history.json``, ``trainer_log.json``, ``curves.png``) and the
run-mode rule of ``--do_train`` / ``--do_eval`` / ``--do_predict``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

from core.arguments import arg
from core.errors import InputError, first_line
from core.files import atomic_output_dir, write_text_atomic
from core.logs import setup_logging
from training.config import TrainingConfig
from training.hub import HubArguments, HubPusher, every_save_hook, validate_hub_arguments
from training.plan import RunPlan

logger = logging.getLogger(__name__)

#: ``all_results.json`` keys of every training run (besides the ``eval_*`` metrics and a command's own keys).
RESULT_KEYS = (
    "train_loss",
    "train_runtime_s",
    "train_samples_per_second",
    "train_tokens_per_second",
    "train_packing_efficiency",
    "train_mfu",
    "global_step",
    "epoch",
    "best_step",
    "best_metric",
    "stopped_early",
)


@dataclasses.dataclass(frozen=True)
class RunModes:
    """``--do_train``, ``--do_eval``, ``--do_predict`` as in the Hugging Face example scripts; see :meth:`resolve`."""

    _argument_group_name: ClassVar[str] = "what to run (default: train, then evaluate when there is validation data)"

    do_train: bool = arg(False, "fine-tune --model_name_or_path on the training data")
    do_eval: bool = arg(False, "evaluate on the validation data (alone: evaluate --model_name_or_path as it is)")
    do_predict: bool = arg(False, "predict the test data (--test_file, or the test split of the task)")

    @property
    def explicit(self) -> bool:
        """True when any of the three flags was given."""
        return self.do_train or self.do_eval or self.do_predict

    def resolve(self, has_validation: bool) -> RunModes:
        """The modes that run: with none of the flags, train and then evaluate when there is validation data;
        otherwise exactly what is given (``--do_eval`` / ``--do_predict`` without ``--do_train`` use the model as
        it is)."""
        if self.explicit:
            return self
        return RunModes(do_train=True, do_eval=has_validation, do_predict=False)


def write_run_files(
    folder: str | os.PathLike, result: Mapping[str, Any], results: Mapping[str, Any], name: str
) -> None:
    """The run files of a finished run, written into ``folder`` (a command's temporary output folder):
    ``all_results.json`` (``results``) and, for a training run (``result`` from :meth:`training.loop.Trainer.train`,
    with ``log_history``), ``eval_history.json``, ``trainer_log.json`` and ``curves.png`` titled ``name``
    (:func:`training.plot.write_curves`)."""
    folder = Path(folder)

    def dump(file: str, obj) -> None:
        (folder / file).write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")

    dump("all_results.json", dict(results))
    if "log_history" in result:
        from training.plot import write_curves

        dump("eval_history.json", result.get("eval_history", []))
        dump("trainer_log.json", result["log_history"])
        write_curves(dict(result, name=name), folder / "curves.png")


def flat_results(result: Mapping[str, Any], keys: tuple[str, ...] = ()) -> dict[str, Any]:
    """The ``all_results.json`` content: :data:`RESULT_KEYS`, then ``keys``, then every ``eval_*`` and ``test_*``
    metric of ``result`` (histories left out)."""
    flat = {k: result[k] for k in (*RESULT_KEYS, *keys) if k in result}
    flat.update({k: v for k, v in result.items() if k.startswith(("eval_", "test_")) and k != "eval_history"})
    return flat


@dataclasses.dataclass(frozen=True)
class RunParts:
    """What a command supplies to :meth:`Run.execute`, complete when built (frozen).

    Attributes:
        model: not yet prepared; trained in place, or evaluated as it is.
        tokenizer: saved with the model.
        train_dataloader: for a training run (:func:`training.data.make_train_dataloader`).
        evaluate: ``(prepared model) -> {eval_* metric: value}`` on all processes.
        predict: ``(prepared model) -> predictions`` on all processes, after training / evaluation.
        prediction_results: ``(predictions) -> {test_* metric: value}``: scores of the predictions (a labelled test
            split), added to the result and ``all_results.json``.
        write_outputs: ``(temporary output folder, predictions) -> None`` on the main process: extra files.
        loop_kwargs: more :class:`training.loop.Trainer` arguments (``weight_fn``, ``loss_fn``, ...).
        plan: the run plan of a training run (:func:`training.plan.make_plan`, built and logged by the command).
        extra_results: values added to the training result (and ``all_results.json`` when in ``result_keys``).
        result_keys: the command's own ``all_results.json`` keys besides :data:`RESULT_KEYS` and ``eval_*``.
        reevaluate_best: run ``evaluate`` again after training when the best model was loaded at the end (for
            the side products of the evaluation, e.g. prediction files).
        data_fingerprint: what the training data is made of (:func:`training.data.fingerprint_sources`); a resume
            with other data is refused.
        next_step: the command a user would run next on these outputs (logged last, after ``next: ``), or None.
        check_result: ``(result) -> next step or None`` on the main process after the outputs are saved, before the
            final lines: warnings about what the run produced (``pretrain``: a model still on the unigram plateau),
            and the command to run next instead of ``next_step`` (None: ``next_step``).
    """

    model: Any
    tokenizer: Any
    train_dataloader: Any = None
    evaluate: Callable[[Any], dict[str, float]] | None = None
    predict: Callable[[Any], Any] | None = None
    prediction_results: Callable[[Any], dict[str, float]] | None = None
    write_outputs: Callable[[Path, Any], None] | None = None
    loop_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    plan: RunPlan | None = None
    extra_results: dict[str, Any] = dataclasses.field(default_factory=dict)
    result_keys: tuple[str, ...] = ()
    reevaluate_best: bool = False
    data_fingerprint: list[dict[str, Any]] | None = None
    next_step: str | None = None
    check_result: Callable[[Mapping[str, Any]], str | None] | None = None


#: Result keys that are counts or bookkeeping, not metrics, left out of the final line.
_NOT_METRICS = ("eval_tokens", "eval_samples", "eval_history", "eval_runtime_s")


def final_lines(output_dir: str | os.PathLike, result: Mapping[str, Any], written, next_step=None) -> list[str]:
    """The last lines of a command, for a user to act on: where the outputs are, the metrics (perplexity first,
    then the ``eval_*`` metrics; counts such as ``eval_tokens`` left out), the files written, and the next command.

    Args:
        output_dir: the output folder.
        result: the run's result (``perplexity``, ``eval_*``, ...).
        written: names of the entries written into ``output_dir``.
        next_step: the command to run next, or None.

    Returns:
        ``["wrote D: perplexity 702.4, eval_loss 6.554; files: ...", "next: ..."]`` (no metric: ``"no evaluation"``).
    """
    metrics = {
        k: v
        for k, v in result.items()
        if (k == "perplexity" or k.startswith(("eval_", "test_")))
        and k not in _NOT_METRICS
        and isinstance(v, (int, float))
        and not isinstance(v, bool)
    }
    shown = ", ".join(f"{k} {v:.4g}" for k, v in sorted(metrics.items(), key=lambda kv: kv[0] != "perplexity"))
    lines = [f"wrote {output_dir}: {shown or 'no evaluation'}; files: {', '.join(sorted(written)) or 'none'}"]
    if next_step:
        lines.append(f"next: {next_step}")
    return lines


def _push_command(run: Run, pusher: HubPusher) -> str:
    """The command that pushes a run's saved output folder later (:func:`training.hub.main`)."""
    revision = f" --hub_revision {pusher.revision}" if pusher.revision else ""
    return f"python -m training.hub push {run.output_dir} --hub_model_id {pusher.repo_id}{revision}"


class Run:
    """One run of a training command (see the module docstring).

    Args:
        training: the resolved loop settings.
        hub: the hub flags; a training run checks them and the token here, in seconds, not after hours.
        settings: the run's flat settings (:func:`core.arguments.run_config`), for trackers and the model card; a
            training run's ``hub_model_id`` resolved here, its plan's settings added by :meth:`execute`.
        do_train: train (else evaluate / predict with the model as it is; nothing is pushed).
        card_task: the pipeline task of the model card (``fill-mask``, ``text-classification``, ...).
        card_overrides: more :func:`training.model_card.card_for_run` arguments.
        write_card: write the model card (``README.md``) into the output folder (else only into the push).
        commit_message: of the final push (default ``"Upload model (step N)"``).

    Used as a context manager (``with Run(...) as run:``), it releases the output folder it claimed
    (:mod:`training.ownership`) when the block ends, however it ends.

    Raises:
        InputError: bad hub flags or token (training runs).
    """

    def __init__(
        self,
        training: TrainingConfig,
        hub: HubArguments,
        settings: Mapping[str, Any],
        *,
        do_train: bool = True,
        card_task: str = "fill-mask",
        card_overrides: Mapping[str, Any] | None = None,
        write_card: bool = False,
        commit_message: str | None = None,
    ):
        if do_train:
            hub = validate_hub_arguments(hub, training.output_dir)
            settings = {**settings, "hub_model_id": hub.hub_model_id}
        self.training, self.hub, self.settings, self.do_train = training, hub, dict(settings), do_train
        self.card_task, self.card_overrides = card_task, dict(card_overrides or {})
        self.write_card, self.commit_message = write_card, commit_message
        self.accelerator = None
        self.ownership = None
        self.run_id: str | None = None
        self.pushed = False
        self.written: list[str] = []  # the entries the last save wrote into the output folder

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def release(self) -> None:
        """Release the output folder claimed by :meth:`start` (idempotent)."""
        if self.ownership is not None:
            self.ownership.release()
            self.ownership = None

    @property
    def output_dir(self) -> str:
        return self.training.output_dir

    def start(self):
        """Create the accelerator, set up logging and, for a training run, claim the output folder
        (:func:`training.ownership.claim_output_dir` on the main process: lock, run id, stale temporary folders
        removed, an earlier run's checkpoints deleted with ``--overwrite_output_dir``) and, under a launcher,
        ask for SIGTERM when the launcher dies (:func:`training.signals.stop_with_launcher`). Returns the
        accelerator.

        Raises:
            InputError: another run holds the output folder; the folder holds another
                run and neither ``--resume_from_checkpoint`` nor ``--overwrite_output_dir`` is given.
        """
        from training.accelerator import make_accelerator
        from training.ownership import claim_output_dir, read_run_id
        from training.signals import stop_with_launcher

        if self.do_train:
            stop_with_launcher()
        self.accelerator = make_accelerator(self.training)
        setup_logging(self.accelerator.is_main_process)
        if self.do_train:
            if self.accelerator.is_main_process:
                self.ownership = claim_output_dir(
                    self.output_dir,
                    overwrite=self.training.overwrite_output_dir,
                    resuming=bool(self.training.resume_from_checkpoint),
                )
            self.accelerator.wait_for_everyone()
            self.run_id = self.ownership.run_id if self.ownership is not None else read_run_id(self.output_dir)
        return self.accelerator

    def card(self, folder: str | os.PathLike, settings: Mapping[str, Any]) -> str:
        """The model card of the model saved in ``folder``, trained with ``settings``."""
        from training.model_card import card_for_run

        return card_for_run(folder, settings, task=self.card_task, **self.card_overrides)

    def execute(self, parts: RunParts) -> int:
        """Train (or evaluate), predict, save the outputs atomically, finish, push. Returns the exit status:
        0, or 143 / 130 after SIGTERM / SIGINT (checkpoint written), 1 after a non-finite loss."""
        from training.accelerator import finish
        from training.loop import Trainer
        from training.signals import signals_deferred, train_until_stopped

        acc = self.accelerator
        pusher = HubPusher.from_arguments(self.hub) if self.do_train else None
        trainer, settings = None, self.settings
        if self.do_train:
            settings = {**settings, **parts.plan.settings()}  # trackers, run_config.json and the card: the plan
            evaluate = parts.evaluate
            on_save = every_save_hook(
                pusher, self.output_dir, parts.tokenizer, lambda folder: self.card(folder, settings)
            )
            trainer = Trainer(
                acc,
                parts.model,
                parts.train_dataloader,
                self.training,
                run_config=settings,
                eval_fn=(lambda trainer: evaluate(trainer.eager_model)) if evaluate else None,
                on_save=on_save,
                run_id=self.run_id,
                data_fingerprint=parts.data_fingerprint,
                plan=parts.plan,
                **parts.loop_kwargs,
            )
            parts = dataclasses.replace(parts, model=None, train_dataloader=None)  # the trainer holds them
            result, status = train_until_stopped(trainer, lambda: finish(acc, trainer))  # SIGTERM/SIGINT: 143/130
            if result is None:
                return status
            result.update(parts.extra_results)
            if parts.reevaluate_best and evaluate and result.get("best_step") not in (None, result["global_step"]):
                evaluate(trainer.eager_model)  # the side products (prediction files) of the best model, loaded last
            prepared, model = trainer.eager_model, trainer.unwrapped_model  # eager: the module's own keys
        else:
            prepared, model = acc.prepare(parts.model), None
            parts = dataclasses.replace(parts, model=None)
            result = parts.evaluate(prepared) if parts.evaluate else {}
        predictions = parts.predict(prepared) if parts.predict else None
        if predictions is not None and parts.prediction_results is not None:
            result = {**result, **parts.prediction_results(predictions)}
        with signals_deferred("saving the outputs") as stopper:  # a signal now must not cut the save short
            state_dict = acc.get_state_dict(prepared) if model is not None else None  # all processes (FSDP gathers)
            if acc.is_main_process:
                self.save(
                    model,
                    parts.tokenizer,
                    result,
                    flat_results(result, parts.result_keys),
                    settings,
                    state_dict,
                    lambda folder: parts.write_outputs(folder, predictions) if parts.write_outputs else None,
                )
                next_step = (parts.check_result(result) if parts.check_result else None) or parts.next_step
                for line in final_lines(self.output_dir, result, self.written, next_step):
                    logger.info("%s", line)
            del prepared, model, state_dict
            finish(acc, *([trainer] if trainer else []))
            if pusher is not None and acc.is_main_process and stopper.signum is None:
                # after the process group is gone: no rank waits on it
                self.push(pusher, result.get("global_step"), settings)
        if stopper.signum is not None:
            pushed = ""
            if pusher is not None:
                pushed = (
                    " and pushed" if self.pushed else f"; not pushed: push them with `{_push_command(self, pusher)}`"
                )
            print(
                f"error: {signal.Signals(stopper.signum).name} received while saving: the outputs in "
                f"{self.output_dir} are complete{pushed}",
                file=sys.stderr,
                flush=True,
            )
            return stopper.exit_code
        return 0

    def push(self, pusher: HubPusher, step: int | None, settings: Mapping[str, Any]) -> None:
        """The final push of the saved output folder (its model card: ``README.md`` there, or made from ``settings``).

        Raises:
            InputError: the push failed (hub unreachable, refused, interrupted): the message says that the model
                is saved locally and gives the command that pushes it later (the card is written into the folder
                for it).
        """
        out = Path(self.output_dir)
        card = (out / "README.md").read_text(encoding="utf-8") if self.write_card else self.card(out, settings)
        try:
            url = pusher.push(out, step=step, model_card=card, commit_message=self.commit_message)
        except Exception as err:  # noqa: BLE001  (network, hub, refusal: the model is safe on disk either way)
            if not (out / "README.md").exists():
                with contextlib.suppress(OSError):
                    write_text_atomic(out / "README.md", card)
            raise InputError(
                f"--push_to_hub: the model is saved in {out}, but the push to {pusher.repo_id!r} failed "
                f"({type(err).__name__}: {first_line(err)}); expected a reachable hub: push it later with "
                f"`{_push_command(self, pusher)}` (token from HF_TOKEN or `hf auth login`)"
            ) from err
        self.pushed = True
        logger.info("pushed %s to %s", out, url)

    def save(
        self,
        model,
        tokenizer,
        result: Mapping[str, Any],
        results: Mapping[str, Any],
        settings: Mapping[str, Any],
        state_dict=None,
        write_outputs: Callable[[Path], None] | None = None,
    ) -> None:
        """Into the output folder, atomically (a temporary folder moved in at the end): when trained (``model``
        given) the model + tokenizer (``save_pretrained``; ``state_dict`` from ``accelerator.get_state_dict``,
        the full weights under FSDP), the command's extra files, the run files (:func:`write_run_files`) and,
        ``run_config.json`` (``settings``, resolved; no secrets) and, with ``write_card``, the model card (a
        card that fails only logs a warning: the model is never lost over it)."""
        with atomic_output_dir(self.output_dir) as tmp:
            if model is not None:
                model.save_pretrained(tmp, state_dict=state_dict)
                tokenizer.save_pretrained(tmp)
            if write_outputs is not None:
                write_outputs(tmp)
            write_run_files(tmp, result, results, Path(self.output_dir).name)
            (tmp / "run_config.json").write_text(json.dumps(settings, indent=2, default=str) + "\n", encoding="utf-8")
            if self.write_card and model is not None:
                try:
                    (tmp / "README.md").write_text(self.card(tmp, settings), encoding="utf-8")
                except (ImportError, InputError) as err:
                    logger.warning("no model card written: %s", err)
            self.written = sorted(p.name + ("/" if p.is_dir() else "") for p in tmp.iterdir())


__all__ = [
    "RESULT_KEYS",
    "Run",
    "RunModes",
    "RunParts",
    "final_lines",
    "flat_results",
    "write_run_files",
]
