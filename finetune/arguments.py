"""Typed command-line arguments shared by the fine-tuning scripts (``finetune.glue``, ``finetune.squad``)."""

from __future__ import annotations

import dataclasses
import os
from typing import ClassVar

from core.arguments import arg, with_defaults
from core.errors import InputError
from training.config import TrainingConfig


@dataclasses.dataclass(frozen=True)
class FinetuneModelArguments:
    """The backbone to fine-tune and where its code may come from."""

    _argument_group_name: ClassVar[str] = "model"

    model_name_or_path: str = arg(help="model directory or hub repo (SesameBert, SesameElmo, or a transformers model)")
    tokenizer_name: str | None = arg(None, "tokenizer path or repo (default: the model's)")
    revision: str | None = arg(
        None, "revision (branch, tag or commit id) of the hub repos given by the model arguments"
    )
    unfreeze_backbone: bool = arg(
        False, "SesameElmo: fine-tune the BiLM too (default: frozen, ScalarMix + head trained)"
    )
    trust_remote_code: bool = arg(False, "allow model code from the model repository")

    def hub_kwargs(self) -> dict:
        """``revision`` and ``trust_remote_code`` for ``from_pretrained``."""
        return {"revision": self.revision, "trust_remote_code": self.trust_remote_code}

    def _from(self, load, name: str, failure: str):
        """``load`` of ``--<name>`` if given (``--config_name``: ``finetune.glue`` only), else of the model.

        Raises:
            InputError: it cannot be loaded (the message of :func:`training.pretrained.load_pretrained`).
        """
        import modeling  # noqa: F401  (registers the sesame-lm Auto classes)
        from training.pretrained import load_pretrained

        given = getattr(self, name, None)
        source, flag = (given, f"--{name}") if given else (self.model_name_or_path, "--model_name_or_path")
        expected = "a model folder written by save_pretrained or a hub repo id"
        return load_pretrained(load, source, flag, expected, failure=failure, **self.hub_kwargs())

    def load_config(self):
        """The backbone's ``PretrainedConfig`` (of ``--config_name`` or the model); raises ``InputError``."""
        from transformers import AutoConfig

        return self._from(AutoConfig.from_pretrained, "config_name", "cannot load the config")

    def load_head(self, auto_class, config, logger, ignore_mismatched_sizes: bool = False):
        """The model with a task head: ``auto_class.from_pretrained`` (e.g. ``AutoModelForTokenClassification``) of
        ``--model_name_or_path`` with ``config`` (the task's labels set), transformers' load report sent to
        ``logger``.

        Raises:
            InputError: the weights cannot be loaded (the message of :func:`training.pretrained.load_pretrained`).
        """
        from core.logs import from_pretrained_quietly
        from training.pretrained import load_pretrained

        return load_pretrained(
            from_pretrained_quietly(auto_class.from_pretrained, logger),
            self.model_name_or_path,
            "--model_name_or_path",
            "a model folder with model.safetensors (save_pretrained) or a hub repo id",
            failure="cannot load the weights",
            config=config,
            ignore_mismatched_sizes=ignore_mismatched_sizes,
            **self.hub_kwargs(),
        )

    def load_tokenizer(self):
        """The tokenizer of ``--tokenizer_name`` or the model; raises ``InputError``."""
        from transformers import AutoTokenizer

        return self._from(AutoTokenizer.from_pretrained, "tokenizer_name", "cannot load the tokenizer")


def finetune_training_arguments(script: str, epochs: float, train_batch: int, eval_batch: int) -> type:
    """``<Script>TrainingArguments``: the loop's flags with a fine-tuning script's defaults (epochs, batch sizes per
    device; ``--output_dir`` checked by the script; ``--learning_rate`` resolved later by
    :func:`resolve_training`, its help from :func:`learning_rate_help`)."""
    defaults = dict(output_dir=None, learning_rate=None, num_train_epochs=epochs)
    defaults.update(per_device_train_batch_size=train_batch, per_device_eval_batch_size=eval_batch)
    help = dict(learning_rate=learning_rate_help(script))
    return with_defaults(TrainingConfig, defaults, help=help, name=f"{script.title()}TrainingArguments")


def check_output_is_not_the_model(model_name_or_path: str, output_dir: str | None) -> None:
    """Refuse an ``--output_dir`` that is the ``--model_name_or_path`` folder (``--overwrite_output_dir`` would
    replace the model being fine-tuned with the result, its pretrained weights lost).

    Raises:
        InputError: both name the same existing folder.
    """
    if output_dir and os.path.isdir(model_name_or_path) and os.path.isdir(output_dir):
        if os.path.samefile(model_name_or_path, output_dir):
            raise InputError(
                f"--output_dir {output_dir}: is the --model_name_or_path folder; expected another folder (the "
                "fine-tuned model would replace the model it starts from)"
            )


def warn_if_same_file(train_file, validation_file, logger) -> bool:
    """Warn when the training and the validation file are the same file: the evaluation then measures
    memorisation, not generalisation. Returns whether it warned."""

    def files(value) -> list[str]:
        values = [value] if isinstance(value, (str, os.PathLike)) else list(value or [])
        return [str(v) for v in values if os.path.isfile(v)]

    for valid in files(validation_file):
        if any(os.path.samefile(f, valid) for f in files(train_file)):
            logger.warning(
                "--validation_file %s: is also a --train_file: the evaluation measures how well the model "
                "remembers its training examples, not how it does on new ones; expected a held-out file",
                valid,
            )
            return True
    return False


#: ``hidden_size`` from which a BERT-like backbone gets BERT's own fine-tuning rates (BERT-base is 768 wide).
BERT_BASE_WIDTH = 768
#: Peak learning rate of BERT-base-sized backbones by script: BERT's (Devlin et al. 2019: GLUE 2e-5..5e-5, SQuAD
#: 3e-5).
#: NER: 5e-5, the default of transformers' ``run_ner.py``.
BERT_BASE_RATES = {"glue": 2e-5, "squad": 3e-5, "ner": 5e-5}
#: Peak learning rate of narrower BERT-like backbones (bert-tiny .. bert-small, MiniLM-L6-H384): 1e-4, as Turc et
#: al. 2019 found for small BERTs and as this project's fine-tunes use (docs/results.md: SST-2 at 2e-5
#: stayed at the majority class, 0.509, on a bert-mini pretrained by the own-data command of docs/pretraining.md).
SMALL_MODEL_RATE = 1e-4


def default_learning_rate(config, script: str, unfreeze_backbone: bool = False) -> tuple[float, str]:
    """The peak fine-tuning learning rate for a backbone's ``config`` when ``--learning_rate`` is not given, and where
    it comes from (logged in the run plan).

    Args:
        config: the backbone's ``PretrainedConfig`` (``model_type``, ``hidden_size``).
        script: ``"glue"``, ``"squad"`` or ``"ner"``.
        unfreeze_backbone: ``--unfreeze_backbone`` (SesameElmo: the BiLM is trained too).

    Returns:
        ``(rate, source)``: e.g. ``(1e-4, "hidden size 256 < 768: 1e-4, small-BERT fine-tuning ...")``.
    """
    if script not in BERT_BASE_RATES:
        raise ValueError(f"script {script!r}: expected one of {sorted(BERT_BASE_RATES)}")
    from modeling import spec_for

    model_type = getattr(config, "model_type", "")
    if (spec := spec_for(model_type)) and spec.frozen_backbone and not unfreeze_backbone:
        rate = spec.finetune_recipe["learning_rate"]
        return rate, f"{spec.name} with a frozen backbone: {rate:g}, its fine-tuning recipe (modeling.{spec.name})"
    width = getattr(config, "hidden_size", None)
    if isinstance(width, int) and width >= BERT_BASE_WIDTH:
        rate = BERT_BASE_RATES[script]
        return rate, f"hidden size {width} >= {BERT_BASE_WIDTH}: {rate:g}, BERT's {script.upper()} fine-tuning rate"
    what = f"hidden size {width} < {BERT_BASE_WIDTH}" if isinstance(width, int) else f"model type {model_type!r}"
    return SMALL_MODEL_RATE, f"{what}: 1e-4, small-model fine-tuning (Turc et al. 2019)"


def card_family(config) -> dict:
    """Model-card arguments of a backbone's ``config``: how the card names its family (its spec's description)."""
    from modeling import spec_for

    spec = spec_for(getattr(config, "model_type", None))
    return {"family": spec.description} if spec else {}


#: The model card's pipeline task of each fine-tuning script.
CARD_TASKS = {"glue": "text-classification", "squad": "question-answering", "ner": "token-classification"}


def finetune_run(script: str, backbone, metric: str, modes, training, hub, *groups):
    """The :class:`training.driver.Run` of the fine-tuning ``script`` (a key of :data:`CARD_TASKS`) and where its
    learning rate comes from, ``(run, source)``.

    ``training`` is resolved first: ``metric`` as ``--metric_for_best_model`` where none was given, and where
    ``--learning_rate`` was not given (``None``) the rate of :func:`default_learning_rate` for the ``backbone`` config
    (source ``"--learning_rate"`` otherwise); ``run.training`` is the resolved one. The run's settings are those of the
    argument ``groups`` (the model arguments first: their ``unfreeze_backbone``), then ``training`` and ``hub``
    (:func:`core.arguments.run_config`); it trains when ``modes.do_train``; its model card names the script's task and
    the backbone's family (:func:`card_family`). Raises ``InputError`` on bad hub flags (``Run``)."""
    from core.arguments import run_config
    from training.driver import Run

    source = "--learning_rate"
    if training.learning_rate is None:
        rate, source = default_learning_rate(backbone, script, groups[0].unfreeze_backbone)
        training = training.resolved(learning_rate=rate)
    training = training.resolved(metric_for_best_model=training.metric_for_best_model or metric)
    settings = run_config(*groups, training, hub)
    card = dict(card_task=CARD_TASKS[script], card_overrides=card_family(backbone))
    return Run(training, hub, settings, do_train=modes.do_train, **card), source


def start_command(model_args: FinetuneModelArguments, training, train_file, validation_file, logger) -> None:
    """What a fine-tuning command does once its arguments are checked: :func:`check_output_is_not_the_model` and, with
    ``--overwrite_output_dir``, no input inside the checkpoints it deletes (:func:`core.files.check_sources_outside`;
    both raise InputError), tokenizers' own threads off, logging set up, :func:`warn_if_same_file`."""
    from core.logs import setup_logging

    check_output_is_not_the_model(model_args.model_name_or_path, training.output_dir)
    if training.output_dir and training.overwrite_output_dir and not training.resume_from_checkpoint:
        from core.files import check_sources_outside

        sources = {"--model_name_or_path": model_args.model_name_or_path, "--train_file": train_file}
        sources["--validation_file"] = validation_file
        check_sources_outside(training.output_dir, sources, replaced=("checkpoints",))  # the run deletes them
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    setup_logging()
    warn_if_same_file(train_file, validation_file, logger)


def learning_rate_help(script: str) -> str:
    """The ``--learning_rate`` help of a fine-tuning script: the rule of :func:`default_learning_rate`."""
    return (
        f"peak learning rate (default by backbone: hidden size >= {BERT_BASE_WIDTH} {BERT_BASE_RATES[script]:g} as "
        f"BERT; narrower BERT-like models 1e-4; a frozen ELMo-style BiLM 3e-3; the run plan says which)"
    )


def logged_plan(accelerator, training, train_examples: int, data: str, learning_rate_source: str, logger):
    """The fine-tuning run's plan, its summary line logged once (on the main process).

    Args:
        accelerator: the run's ``accelerate.Accelerator`` (its number of processes splits the examples).
        training: the resolved ``training.config.TrainingConfig``.
        train_examples: training examples (GLUE) or windows (SQuAD), before the split over processes.
        data: the command's phrase for what it trains on, put in the summary (:meth:`RunPlan.summary`).
        learning_rate_source: where the learning rate came from (the family's recipe, the command line).
        logger: the command's ``logging.Logger``.

    Returns:
        The :class:`training.plan.RunPlan` of :func:`training.plan.make_plan`.

    Raises:
        InputError: from :func:`training.plan.make_plan` (training data that gives no batch on some process).
    """
    from training.plan import make_plan

    plan = make_plan(training, train_examples=train_examples, num_processes=accelerator.num_processes)
    if accelerator.is_main_process:
        logger.info("%s", plan.summary(data, training.learning_rate, learning_rate_source))
    return plan


__all__ = [
    "FinetuneModelArguments",
    "card_family",
    "check_output_is_not_the_model",
    "default_learning_rate",
    "finetune_run",
    "finetune_training_arguments",
    "learning_rate_help",
    "logged_plan",
    "start_command",
    "warn_if_same_file",
]
