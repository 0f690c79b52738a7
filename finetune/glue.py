"""``accelerate launch -m finetune.glue``: fine-tune a sequence classifier on a GLUE task or custom files.

Thin by design: the task table (:mod:`finetune.tasks`), the data (:mod:`finetune.glue_data`), one
preprocessing function (tokenize ``sentence1`` [+ ``sentence2``]), the Auto-loaded head
(``AutoModelForSequenceClassification``: SesameBert end to end, SesameElmo frozen + ScalarMix unless
``--unfreeze_backbone``, or any transformers model for a baseline), a metric module (:mod:`finetune.metrics`),
and the shared loop (:mod:`training.loop`).

Examples::

    accelerate launch -m finetune.glue --model_name_or_path outputs/minilm-sesame --task_name sst2 \\
        --glue_dir data/glue --output_dir outputs/sst2
    python -m finetune.glue --model_name_or_path M --train_file train.tsv --validation_file dev.tsv \\
        --sentence1_key premise --sentence2_key hypothesis --output_dir outputs/nli

Outputs in ``--output_dir``: the fine-tuned model and tokenizer (``save_pretrained``, with ``id2label``),
``all_results.json`` (``train_loss``, ``eval_loss``, ``eval_<metric>``; MNLI adds ``eval_matched_*`` and
``eval_mismatched_*``; ``best_step`` / ``best_metric``), ``eval_history.json``, ``trainer_log.json``,
``curves.png``, and with ``--do_predict`` one GLUE submission file per test split (``SST-2.tsv``,
``MNLI-m.tsv``, ...; ``predictions_<split>.tsv`` for custom tasks).

What runs: ``--do_train``, ``--do_eval``, ``--do_predict`` as in the Hugging Face examples; none of them = train,
then evaluate. Without ``--do_train`` the model is used as it is (evaluation gives the metrics of the training
run's final evaluation; only ``all_results.json`` and the prediction files are written).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from core.arguments import arg, parse_arguments, with_defaults
from core.arguments import build_parser as parser_of
from core.errors import InputError, run_cli
from finetune.arguments import (
    FinetuneModelArguments,
    finetune_run,
    finetune_training_arguments,
    logged_plan,
    start_command,
)
from finetune.tasks import TASK_NAMES, GlueTask, get_task
from training.driver import RunModes
from training.hub import HubArguments

logger = logging.getLogger("finetune.glue")


@dataclasses.dataclass(frozen=True)
class GlueModelArguments(FinetuneModelArguments):
    """The backbone, its config and its classification head."""

    config_name: str | None = arg(None, "config path or repo (default: the model's)")
    ignore_mismatched_sizes: bool = arg(
        False, "replace a pretrained classification head whose labels differ from the task's"
    )


@dataclasses.dataclass(frozen=True)
class GlueDataArguments:
    """The task and its data."""

    _argument_group_name: ClassVar[str] = "data"

    task_name: str | None = arg(None, f"GLUE task: {', '.join(TASK_NAMES)} (omit for a custom task)")
    glue_dir: str | None = arg(None, "the official GLUE data folder (SST-2/train.tsv, CoLA/train.tsv, ...)")
    train_file: str | None = arg(None, "csv, tsv, json or jsonl training file (custom task, or a GLUE task from files)")
    validation_file: str | None = arg(None, "validation file, same format")
    test_file: str | None = arg(None, "test file (labels optional), predicted with --do_predict")
    sentence1_key: str | None = arg(
        None, "column of the first text (default: the task's / sentence1 / premise / sentence / text)"
    )
    sentence2_key: str | None = arg(None, "column of the second text of pairs")
    label_key: str = arg("label", "label column of custom files")
    max_seq_length: int = arg(128, "longer inputs are truncated (tokens)")
    pad_to_max_length: bool = arg(False, "pad every batch to --max_seq_length (default: dynamic padding)")
    group_by_length: bool = arg(
        True, "group training batches by length (--no_group_by_length: shuffle without grouping)"
    )
    max_train_samples: int | None = arg(None, "use only the first N training examples")
    max_eval_samples: int | None = arg(None, "use only the first N examples of each evaluation split")


GlueRunModes = with_defaults(
    RunModes,
    name="GlueRunModes",
    help=dict(
        do_train="fine-tune --model_name_or_path on the training split",
        do_eval="evaluate on the validation split(s) (alone: evaluate --model_name_or_path as it is)",
        do_predict=(
            "write predictions for the test split(s) (GLUE submission files; predictions_test.tsv for --test_file)"
        ),
    ),
)
GlueTrainingArguments = finetune_training_arguments("glue", 3.0, 32, 64)
#: The argument dataclasses of ``finetune.glue``, in ``--help`` order.
ARGUMENTS = (GlueModelArguments, GlueDataArguments, GlueRunModes, GlueTrainingArguments, HubArguments)


PROG = "accelerate launch -m finetune.glue"
DESCRIPTION = "Fine-tune a sequence classifier (any Auto-loadable backbone) on a GLUE task or custom files."


#: ``build_parser()``: the ``HfArgumentParser`` of ``finetune.glue`` (for ``--help`` and tests).
build_parser = functools.partial(parser_of, ARGUMENTS, prog=PROG, description=DESCRIPTION)


def check_arguments(data: GlueDataArguments, modes: RunModes, training) -> GlueTask | None:
    """Refuse inconsistent arguments before anything is loaded; returns the GLUE task (None = custom).

    ``modes`` are the resolved run modes (with none of the flags: train, then evaluate what validation data there
    is).

    Raises:
        InputError: naming the flags and what is expected.
    """
    task = get_task(data.task_name) if data.task_name else None
    if not training.output_dir:
        raise InputError("--output_dir: required (the fine-tuned model and all_results.json go there)")
    if data.glue_dir and (data.train_file or data.validation_file or data.test_file):
        raise InputError("--glue_dir and --train_file/--validation_file/--test_file: give one data source, not both")
    if task is None and not (data.train_file or data.validation_file or data.test_file):
        raise InputError(
            "a custom task needs --train_file (and --validation_file / --test_file); or give a GLUE --task_name"
        )
    if modes.do_train and task is None and not data.train_file:
        raise InputError(
            "training a custom task needs --train_file; pass --do_eval / --do_predict alone to use a "
            "fine-tuned --model_name_or_path as it is"
        )
    if modes.do_predict and not modes.do_train and not modes.do_eval and task is None and not data.test_file:
        raise InputError("--do_predict needs --test_file for a custom task")
    for name in ("max_seq_length", "max_train_samples", "max_eval_samples"):
        if getattr(data, name) is not None and getattr(data, name) < 1:
            raise InputError(f"--{name} {getattr(data, name)}: expected an integer >= 1")
    return task


def _is_default_label(name: str) -> bool:
    return re.fullmatch(r"LABEL_\d+", str(name)) is not None


def label_mapping(pretrained_config, label_names: list[str], model: GlueModelArguments) -> dict[int, int] | None:
    """Map task class ids to the pretrained head's, when the checkpoint already has a head with named labels.

    Returns:
        ``{task id: model id}`` when the pretrained head has the task's label names (maybe in another order);
        ``None`` when there is no named pretrained head (a new head gets the task's names).

    Raises:
        InputError: the pretrained head's labels differ from the task's (unless ``--ignore_mismatched_sizes``).
    """
    id2label = getattr(pretrained_config, "id2label", None) or {}
    names = [id2label[i] for i in sorted(id2label)]
    if not label_names or not names or all(_is_default_label(n) for n in names):
        return None
    if sorted(n.lower() for n in names) == sorted(n.lower() for n in label_names):
        to_model = {n.lower(): i for i, n in enumerate(names)}
        return {i: to_model[n.lower()] for i, n in enumerate(label_names)}
    if model.ignore_mismatched_sizes:
        logger.warning("the pretrained head predicts %s, the task has %s: training a new head", names, label_names)
        return None
    raise InputError(
        f"--model_name_or_path {model.model_name_or_path}: its classification head predicts {names}, but the "
        f"task has the labels {label_names}; pass --ignore_mismatched_sizes to train a new head"
    )


def load_model_and_tokenizer(
    model_args: GlueModelArguments, label_names: list[str], regression: bool, task_name: str | None, max_seq_length: int
):
    """The tokenizer and an ``AutoModelForSequenceClassification`` with the task's labels in its config.

    Returns:
        (tokenizer, model, {task id: model id} or None).

    Raises:
        InputError: a config, tokenizer or weights that cannot be loaded; a head with other labels; a tokenizer or
            ``max_seq_length`` the model cannot take.
    """
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from training.pretrained import check_model_fits
    from training.unigram import backbone_plateau_message

    source, hub = model_args.model_name_or_path, model_args.hub_kwargs()
    config_source = model_args.config_name or source
    pretrained, tokenizer = model_args.load_config(), model_args.load_tokenizer()
    mapping = None if regression else label_mapping(pretrained, label_names, model_args)
    overrides: dict[str, Any] = {
        "num_labels": 1 if regression else len(label_names),
        "problem_type": "regression" if regression else "single_label_classification",
        "finetuning_task": task_name,
    }
    if mapping is None and not regression:
        overrides["id2label"] = dict(enumerate(label_names))
        overrides["label2id"] = {n: i for i, n in enumerate(label_names)}
    if hasattr(pretrained, "freeze_backbone"):  # a model with a frozen-backbone option (SesameElmo)
        overrides["freeze_backbone"] = not model_args.unfreeze_backbone
    config = AutoConfig.from_pretrained(config_source, **hub, **overrides)
    model = model_args.load_head(AutoModelForSequenceClassification, config, logger, model_args.ignore_mismatched_sizes)
    check_model_fits(model.config, tokenizer, max_seq_length, f"--tokenizer_name {model_args.tokenizer_name or source}")
    plateau = backbone_plateau_message(source)
    if plateau:
        logger.warning("%s", plateau)
    return tokenizer, model, mapping


def tokenize_splits(raw, tokenizer, data: GlueDataArguments, mapping: dict[int, int] | None, accelerator):
    """Tokenize every split (``datasets.map``); labelled splits get ``labels`` in the model's class ids.

    Returns:
        ``{split: (raw split, tokenized split)}``.
    """
    pair = "sentence2" in raw[next(iter(raw))].column_names
    regression = raw[next(iter(raw))].features["label"].dtype in ("float32", "float64")

    def preprocess(batch, labelled: bool):
        texts = (batch["sentence1"], batch["sentence2"]) if pair else (batch["sentence1"],)
        encoded = tokenizer(
            *texts,
            truncation=True,
            max_length=data.max_seq_length,
            padding="max_length" if data.pad_to_max_length else False,
        )
        if labelled:
            encoded["labels"] = (
                [float(v) for v in batch["label"]]
                if regression
                else [mapping[v] if mapping else v for v in batch["label"]]
            )
        return encoded

    out = {}
    with accelerator.main_process_first():
        for split, ds in raw.items():
            limit = data.max_train_samples if split == "train" else data.max_eval_samples
            if limit is not None and limit < len(ds):
                ds = ds.select(range(limit))
            labelled = not split.startswith("test") or -1 not in set(ds["label"][:100])
            out[split] = (
                ds,
                ds.map(
                    preprocess,
                    batched=True,
                    remove_columns=ds.column_names,
                    fn_kwargs={"labelled": labelled},
                    desc=f"tokenize {split}",
                ),
            )
    return out


def metric_for(task: GlueTask | None, regression: bool):
    """The shipped metric module of the task: ``glue/<task>``, or accuracy / ``glue/stsb`` for custom tasks."""
    from finetune.metrics import load_metric

    if task is not None:
        return load_metric("glue", task.metric_config, keep_in_memory=True)
    return (
        load_metric("glue", "stsb", keep_in_memory=True) if regression else load_metric("accuracy", keep_in_memory=True)
    )


def fine_tuned_label_names(model_args: FinetuneModelArguments) -> list[str] | None:
    """The label names of a fine-tuned classifier's head (``id2label``), or None (regression, unnamed labels, or
    no config yet): used as the label set of custom files when evaluating / predicting without training."""
    from transformers import AutoConfig

    import modeling  # noqa: F401  (registers the sesame-lm Auto classes)

    try:
        config = AutoConfig.from_pretrained(
            getattr(model_args, "config_name", None) or model_args.model_name_or_path, **model_args.hub_kwargs()
        )
    except (OSError, ValueError):
        return None  # load_model_and_tokenizer reports it with the full message
    names = [config.id2label[i] for i in sorted(config.id2label or {})]
    if getattr(config, "problem_type", None) == "regression" or not names or all(_is_default_label(n) for n in names):
        return None
    return names


@dataclasses.dataclass(frozen=True)
class GlueData:
    """The loaded data of a run: raw splits, label names, and the splits to evaluate and predict."""

    raw: Any
    label_names: list[str]
    eval_splits: list[str]
    test_splits: list[str]

    @property
    def regression(self) -> bool:
        return not self.label_names


def load_data(model_args, data: GlueDataArguments, modes: RunModes, explicit: bool) -> GlueData:
    """The task's splits (:func:`finetune.glue_data.load_glue_data`), checked against the run modes.

    Raises:
        InputError: bad files, or a mode without its split (no training split; ``--do_eval`` without validation data;
            ``--do_predict`` without test data).
    """
    from finetune.glue_data import label_names_of, load_glue_data

    known_labels = None if modes.do_train or data.task_name else fine_tuned_label_names(model_args)
    sources = ("glue_dir", "train_file", "validation_file", "test_file", "sentence1_key", "sentence2_key", "label_key")
    raw = load_glue_data(data.task_name, label_names=known_labels, **{k: getattr(data, k) for k in sources})
    if modes.do_train and "train" not in raw:
        raise InputError(f"no training split: found {sorted(raw)}; pass --train_file (or --glue_dir with train.tsv)")
    eval_splits = [s for s in raw if s.startswith("validation")] if modes.do_eval else []
    test_splits = [s for s in raw if s.startswith("test")] if modes.do_predict else []
    if explicit and modes.do_eval and not eval_splits:
        raise InputError(
            f"--do_eval: no validation split (found {sorted(raw)}); pass --validation_file, or --glue_dir "
            "with the dev file"
        )
    if modes.do_predict and not test_splits:
        raise InputError(
            f"--do_predict: no test split (found {sorted(raw)}); pass --test_file, or --glue_dir with the test file"
        )
    return GlueData(raw, label_names_of(raw["train"] if "train" in raw else raw), eval_splits, test_splits)


def main(argv: Sequence[str] | None = None) -> int:
    model_args, data_args, parsed_modes, training, hub = parse_arguments(
        ARGUMENTS, argv, prog=PROG, description=DESCRIPTION
    )
    modes = parsed_modes.resolve(has_validation=True)  # none given: train, then evaluate what validation data there is
    task = check_arguments(data_args, modes, training)
    start_command(model_args, training, data_args.train_file, data_args.validation_file, logger)
    # Everything the user gave is checked before the model is loaded and training starts.
    data = load_data(model_args, data_args, modes, parsed_modes.explicit)
    # the metric of the best model: the task's main metric (the GLUE leaderboard's) unless given
    default = f"eval_{task.main_metric}" if task else ("eval_pearson" if data.regression else "eval_accuracy")
    backbone = model_args.load_config()
    run, lr_source = finetune_run("glue", backbone, default, modes, training, hub, model_args, data_args, modes)
    with run:
        accelerator = run.start()
        tokenizer, model, mapping = load_model_and_tokenizer(
            model_args, data.label_names, data.regression, data_args.task_name, data_args.max_seq_length
        )
        splits = [*(["train"] if modes.do_train else []), *data.eval_splits, *data.test_splits]
        tokenized = tokenize_splits({s: data.raw[s] for s in splits}, tokenizer, data_args, mapping, accelerator)
        return run.execute(
            glue_parts(
                accelerator, model, tokenizer, task, data, tokenized, mapping, data_args, run.training, modes, lr_source
            )
        )


def training_data_fingerprint(data_args: GlueDataArguments, task: GlueTask | None, data: GlueData) -> list[dict]:
    """What the training split is made of, for the resume check (:func:`training.data.fingerprint_sources`): the
    training file by content (``--train_file``, or the task's file in ``--glue_dir``; a hub dataset by its
    ``datasets`` fingerprint), the label set and the settings that shape the examples."""
    from training.data import fingerprint_sources

    if data_args.train_file:
        files = [data_args.train_file]
    elif data_args.glue_dir and task is not None:
        files = [str(Path(data_args.glue_dir) / task.files["train"].path)]
    else:
        files = []
    return fingerprint_sources(
        files,
        dataset=None if files else data.raw["train"]._fingerprint,
        labels=data.label_names or "regression",
        max_seq_length=data_args.max_seq_length,
        max_train_samples=data_args.max_train_samples,
    )


def glue_parts(
    accelerator,
    model,
    tokenizer,
    task: GlueTask | None,
    data: GlueData,
    tokenized: dict,
    mapping,
    data_args: GlueDataArguments,
    training,
    modes: RunModes,
    learning_rate_source: str = "--learning_rate",
):
    """The :class:`training.driver.RunParts` of a GLUE run: the length-grouped training loader, the evaluation of
    every validation split (the task's metric; MNLI's ``matched`` / ``mismatched`` prefixed), the predictions of
    the test splits and their submission files; for training, the run plan (logged on the main process with the
    task, examples, evaluation splits and labels, and the learning rate's source) and the data fingerprint."""
    from training.driver import RunParts
    from training.evaluation import gather_predictions

    collator, loaders = _eval_loaders(
        accelerator, tokenizer, tokenized, [*data.eval_splits, *data.test_splits], training
    )
    metric = metric_for(task, data.regression)
    inverse = {m: t for t, m in mapping.items()} if mapping else None

    label_of = functools.partial(_label_of, inverse=inverse, label_names=data.label_names)

    def predict_split(model, split: str) -> dict[str, torch.Tensor]:
        def step(model, batch):
            labels = batch.pop("labels", None)
            with accelerator.autocast():
                logits = model(**batch).logits.float()
            return {"logits": logits} if labels is None else {"logits": logits, "labels": labels}

        return gather_predictions(accelerator, model, loaders[split], step)

    to_task_ids = functools.partial(_to_task_ids, regression=data.regression, inverse=inverse)

    def evaluate(model) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for n, split in enumerate(data.eval_splits):
            out = predict_split(model, split)
            scores = _split_scores(out, data.regression, inverse, metric, to_task_ids)
            # not at the step-0 evaluation of a training run (no update yet: a fresh head says nothing of the rate)
            if not data.regression and not (modes.do_train and not optimizer_stepped(accelerator)):
                warn_if_one_class(split, out["logits"].argmax(-1), out["labels"], label_of, training.learning_rate)
            suffix = split.split("_", 1)[1] if "_" in split else ""
            for key, value in scores.items():
                if n == 0:
                    metrics[f"eval_{key}"] = value
                if len(data.eval_splits) > 1:
                    metrics[f"eval_{suffix}_{key}"] = value
        return metrics

    def predict(model) -> dict[str, np.ndarray]:
        return {split: to_task_ids(predict_split(model, split)["logits"]) for split in data.test_splits}

    train_loader = plan = fingerprint = None
    if modes.do_train:
        train_loader = train_dataloader(tokenized["train"][1], collator, data_args, training)
        fingerprint = training_data_fingerprint(data_args, task, data)
        described = (
            f"{task.name if task else 'custom task'}: {len(tokenized['train'][1])} training examples, evaluation "
            f"on {data.eval_splits or 'nothing'}, labels {data.label_names or 'regression'}"
        )
        plan = logged_plan(accelerator, training, len(tokenized["train"][1]), described, learning_rate_source, logger)
    return RunParts(
        next_step=glue_next_step(training.output_dir, data_args, modes, bool(data.test_splits)),
        model=model,
        tokenizer=tokenizer,
        train_dataloader=train_loader,
        evaluate=evaluate if data.eval_splits else None,
        predict=predict if data.test_splits else None,
        write_outputs=functools.partial(
            _write_predictions, tokenized=tokenized, task=task, label_names=data.label_names
        ),
        plan=plan,
        data_fingerprint=fingerprint,
    )


def glue_next_step(output_dir: str, data_args: GlueDataArguments, modes: RunModes, predicted: bool) -> str | None:
    """The command to run after a ``finetune.glue`` run on ``output_dir``: predict the test split with the
    fine-tuned model after training, explain a prediction after predicting; None after an evaluation only."""
    if modes.do_train and not predicted:
        source = (
            f"--task_name {data_args.task_name} --glue_dir {data_args.glue_dir}"
            if data_args.glue_dir
            else "--test_file TEST_FILE" + (f" --task_name {data_args.task_name}" if data_args.task_name else "")
        )
        return (
            f"predict with it: python -m finetune.glue --model_name_or_path {output_dir} {source} --do_predict "
            f"--output_dir {output_dir}-test"
        )
    if modes.do_train or modes.do_predict:
        return (
            f"see which words drove a prediction: python -m finetune.explain --model_name_or_path "
            f'{output_dir if modes.do_train else "MODEL"} --text "..." --output_dir {output_dir}-explain'
        )
    return None


def optimizer_stepped(accelerator) -> bool:
    """Whether an optimizer prepared by ``accelerator`` has taken a step (its state, e.g. AdamW's moments, is created
    by the first one): False at the evaluation before training (step 0) and when nothing is trained."""
    return any(len(optimizer.state) > 0 for optimizer in getattr(accelerator, "_optimizers", ()))


def warn_if_one_class(
    split: str, predictions: torch.Tensor, labels: torch.Tensor, label_of, learning_rate: float
) -> bool:
    """Warn when every prediction of an evaluation split is the same class while its labels have several: the
    classifier has learned nothing beyond the label counts (typically a learning rate too low for a small or young
    backbone), and its accuracy is that class's share.

    Args:
        split: the split's name, in the message.
        predictions: ``(N,)`` predicted class ids (model ids).
        labels: ``(N,)`` reference class ids (model ids).
        label_of: ``(model id) -> label name`` (or id), for the message.
        learning_rate: the run's peak learning rate, in the advice.

    Returns:
        Whether it warned.
    """
    if predictions.numel() < 2 or labels.unique().numel() < 2 or predictions.unique().numel() != 1:
        return False
    only = int(predictions[0])
    share = float((labels == only).float().mean())
    counts = torch.bincount(labels.long())
    kind = "the majority class" if only < len(counts) and counts[only] == counts.max() else "a minority class"
    logger.warning(
        "evaluation on %s: every one of the %d predictions is class %s (%s, %.1f%% of the labels): the model has "
        "learned nothing beyond the label counts; try a higher --learning_rate than %g, more training steps or "
        "a longer-pretrained backbone",
        split,
        predictions.numel(),
        label_of(only),
        kind,
        100 * share,
        learning_rate,
    )
    return True


def _split_scores(out: dict[str, torch.Tensor], regression: bool, inverse, metric, to_task_ids) -> dict[str, float]:
    """The loss and the task metric of one evaluation split, from its gathered ``logits`` and ``labels``."""
    logits, labels = out["logits"], out["labels"]
    if regression:
        loss = torch.nn.functional.mse_loss(logits.squeeze(-1), labels.float())
        refs = labels.numpy()
    else:
        loss = torch.nn.functional.cross_entropy(logits, labels.long())
        refs = np.array([inverse[i] for i in labels.tolist()]) if inverse else labels.numpy()
    return {"loss": float(loss), **metric.compute(predictions=to_task_ids(logits), references=refs)}


def _label_of(model_id: int, inverse: dict | None, label_names):
    """The task's label name of the model's label id ``model_id`` (the task id itself without a name for it)."""
    task_id = inverse[model_id] if inverse else model_id
    return label_names[task_id] if label_names and 0 <= task_id < len(label_names) else task_id


def _to_task_ids(logits: torch.Tensor, regression: bool, inverse: dict | None) -> np.ndarray:
    """The task's label ids (float scores for a regression) of float32 ``logits`` (N, num_labels) on the CPU:
    argmax, then the model's ids mapped back to the task's (``inverse``: model id -> task id, None: the same)."""
    if regression:
        return logits.squeeze(-1).numpy()
    ids = logits.argmax(-1).numpy()
    return np.array([inverse[i] for i in ids]) if inverse else ids


def _write_predictions(folder: Path, predictions, tokenized: dict, task: GlueTask | None, label_names) -> None:
    """Write the test splits' predictions: the task's submission file, or a custom predictions file."""
    from finetune.glue_data import write_submission

    for split, preds in (predictions or {}).items():
        idx = tokenized[split][0]["idx"]
        if task is not None and split in task.submission:
            path = write_submission(folder, task, split, idx, preds)
        else:
            path = write_custom_predictions(folder, split, idx, preds, label_names)
        logger.info("wrote %s", path.name)


def _eval_loaders(accelerator, tokenizer, tokenized: dict, splits: list[str], training):
    """The padding collator and the evaluation loaders of a GLUE run.

    Args:
        accelerator: the ``Accelerator`` (its mixed precision decides padding to a multiple of 8; it prepares the
            loaders).
        tokenizer: the tokenizer the collator pads with.
        tokenized: split name -> ``(raw dataset, tokenized dataset)``.
        splits: the validation and test splits to load, in order.
        training: the training arguments (``per_device_eval_batch_size``).

    Returns:
        ``(collator, loaders)``: the ``DataCollatorWithPadding`` and split name -> prepared, unshuffled ``DataLoader``.
    """
    from transformers import DataCollatorWithPadding

    collator = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8 if accelerator.mixed_precision != "no" else None)
    loaders = {
        s: accelerator.prepare(
            torch.utils.data.DataLoader(
                tokenized[s][1], collate_fn=collator, shuffle=False, batch_size=training.per_device_eval_batch_size
            )
        )
        for s in splits
    }
    return collator, loaders


def train_dataloader(train_ds, collator, data_args: GlueDataArguments, training):
    """The training loader: batches grouped by length (:class:`training.data.LengthGroupedSampler`) unless
    ``--no_group_by_length``, in an order fixed by ``(seed, epoch)``."""
    from modeling import SPECS
    from training.data import LengthGroupedSampler, make_train_dataloader

    length_key = next(s.main_input for s in SPECS.values() if s.main_input in train_ds.column_names)
    sampler = (
        LengthGroupedSampler(
            [len(x) for x in train_ds[length_key]], training.per_device_train_batch_size, training.seed
        )
        if data_args.group_by_length
        else None
    )
    return make_train_dataloader(
        train_ds, training.per_device_train_batch_size, collator, training.seed, sampler=sampler
    )


def write_custom_predictions(
    output_dir: str | os.PathLike, split: str, idx: Sequence[int], preds: np.ndarray, label_names: list[str]
) -> Path:
    """``predictions_<split>.tsv`` (``index\\tprediction``: label names, or scores for regression), atomically."""
    from core.files import write_text_atomic

    rows = [f"{int(i)}\t{label_names[int(p)] if label_names else f'{float(p):.6g}'}" for i, p in zip(idx, preds)]
    return write_text_atomic(
        Path(output_dir) / f"predictions_{split}.tsv", "index\tprediction\n" + "".join(r + "\n" for r in rows)
    )


if __name__ == "__main__":
    sys.exit(run_cli(main))
