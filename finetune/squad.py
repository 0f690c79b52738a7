"""``accelerate launch -m finetune.squad``: extractive span QA (SQuAD v1.1 / v2.0) on any Auto-loadable backbone.

Thin by design, as :mod:`finetune.glue`: the data (:mod:`finetune.squad_data`: checked SQuAD JSON, or the hub's
``rajpurkar/squad`` / ``rajpurkar/squad_v2``), the sliding-window features and the n-best post-processing
(:mod:`finetune.qa`), the Auto-loaded head (``AutoModelForQuestionAnswering``: SesameBert end to end,
SesameElmo frozen + ScalarMix unless ``--unfreeze_backbone``, or any transformers model as a baseline), the
shipped metric modules (``squad`` / ``squad_v2``, :mod:`finetune.metrics`) and the shared loop
(:mod:`training.loop`).

Examples::

    accelerate launch -m finetune.squad --model_name_or_path outputs/minilm-sesame \\
        --train_file train-v1.1.json --validation_file dev-v1.1.json --output_dir outputs/squad
    python -m finetune.squad --model_name_or_path M --train_file a.json.gz b.json.gz --validation_file dev.json.gz \\
        --version_2_with_negative --max_seq_length 256 --doc_stride 64 --output_dir outputs/squad2

Word-level backbones (the ELMo-style tokenizer: word offsets, no overflowing windows) go through the same
code: :mod:`finetune.qa` cuts their windows over the context's words and maps word spans back to the context's
characters, so predictions are context substrings for every backbone.

Outputs in ``--output_dir``: the fine-tuned model and tokenizer (``save_pretrained``; loadable by
``AutoModelForQuestionAnswering`` / ``AutoTokenizer``, and by ``pipeline("question-answering")`` in transformers
versions that still have that pipeline -- transformers 5 removed it), ``predictions.json`` (``{question id:
answer}``, the official format; ``""`` = no answer), ``nbest_predictions.json``, ``null_odds.json`` (v2: null
score - best span score per question, the no-answer scores of the official v2.0 evaluation),
``all_results.json`` (``eval_exact_match``, ``eval_f1``; v2 adds ``eval_HasAns_*``, ``eval_NoAns_*``,
``eval_best_f1``, ``eval_best_f1_thresh``, ...; ``train_loss``, ``train_runtime_s``,
``train_samples_per_second``; ``best_step`` / ``best_metric``), ``eval_history.json``, ``trainer_log.json`` and
``curves.png``.

What runs: ``--do_train``, ``--do_eval``, ``--do_predict`` as in the Hugging Face examples (none of them = train,
then evaluate when there is validation data). ``--do_predict --test_file F`` answers F's questions (``answers``
optional) into ``predictions.json`` (v2: ``""`` when the null odds exceed ``--null_score_diff_threshold``), and
the evaluation's prediction files are then written as ``eval_predictions.json`` etc.

Bad input (malformed JSON, missing keys, an ``answer_start`` that does not point at the answer, an empty
context, a question leaving no room in the window, inconsistent arguments) is refused with one ``error:`` line
naming the file / question id, before the model is loaded and before anything is written.
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and not __package__:  # run as a script path: import the project, not finetune/*
    from pathlib import Path as _Path

    sys.path[0] = str(_Path(__file__).resolve().parent.parent)

import dataclasses
import functools
import logging
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

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
from training.driver import RunModes
from training.hub import HubArguments

logger = logging.getLogger("finetune.squad")

#: Columns of the evaluation features used by the post-processing only (not model inputs).
POSTPROCESS_COLUMNS = ("example_id", "offset_mapping", "cls_index")


@dataclasses.dataclass(frozen=True)
class SquadDataArguments:
    """The questions, their contexts and the windows the model sees."""

    _argument_group_name: ClassVar[str] = "data"

    dataset_name: str | None = arg(
        None, "hub dataset: squad, squad_v2 or owner/name in the same format (needs the network or the local cache)"
    )
    train_file: list[str] | None = arg(
        None,
        "SQuAD-format .json / .json.gz training file(s); several are concatenated (question ids must be unique)",
        nargs="+",
    )
    validation_file: list[str] | None = arg(None, "SQuAD-format .json / .json.gz evaluation file(s)", nargs="+")
    test_file: list[str] | None = arg(
        None, "SQuAD-format file(s) of questions to answer with --do_predict ('answers' optional)", nargs="+"
    )
    version_2_with_negative: bool = arg(
        False, "SQuAD v2.0: unanswerable questions allowed; predict '' when the null score wins"
    )
    skip_misaligned_answers: bool = arg(
        False, "drop (and count) answers whose answer_start does not point at their text instead of refusing the file"
    )
    max_seq_length: int = arg(384, "tokens per window, question and special tokens included")
    doc_stride: int = arg(128, "tokens shared by consecutive windows of a long context")
    max_query_length: int = arg(64, "questions are cut to this many tokens")
    pad_to_max_length: bool = arg(False, "pad every window to --max_seq_length (default: dynamic padding)")
    max_train_samples: int | None = arg(None, "use only the first N training questions")
    max_eval_samples: int | None = arg(None, "use only the first N evaluation questions")
    max_predict_samples: int | None = arg(None, "use only the first N questions of --test_file")


@dataclasses.dataclass(frozen=True)
class PostProcessingArguments:
    """From window logits to answers (n-best spans, the v2 null score)."""

    _argument_group_name: ClassVar[str] = "post-processing"

    n_best_size: int = arg(20, "best start and end positions tried per window, answers kept per question")
    max_answer_length: int = arg(30, "longest answer in tokens")
    null_score_diff_threshold: float = arg(0.0, "v2: predict '' when null score - best span score exceeds it")


SquadModelArguments = with_defaults(
    FinetuneModelArguments,
    name="SquadModelArguments",
    help=dict(unfreeze_backbone="SesameElmo: fine-tune the BiLM too (default: frozen, ScalarMix + QA head trained)"),
)
SquadRunModes = with_defaults(
    RunModes,
    name="SquadRunModes",
    help=dict(
        do_predict=(
            "answer the questions of --test_file: predictions.json (+ nbest_predictions.json, v2: null_odds.json)"
        )
    ),
)
SquadTrainingArguments = finetune_training_arguments("squad", 2.0, 12, 32)
#: The argument dataclasses of ``finetune.squad``, in ``--help`` order.
ARGUMENTS = (
    SquadModelArguments,
    SquadDataArguments,
    SquadRunModes,
    PostProcessingArguments,
    SquadTrainingArguments,
    HubArguments,
)


PROG = "accelerate launch -m finetune.squad"
DESCRIPTION = "Fine-tune an extractive QA head (any Auto-loadable backbone) on SQuAD v1.1 / v2.0-format data."


#: ``build_parser()``: the ``HfArgumentParser`` of ``finetune.squad`` (for ``--help`` and tests).
build_parser = functools.partial(parser_of, ARGUMENTS, prog=PROG, description=DESCRIPTION)


def check_arguments(data: SquadDataArguments, modes: RunModes, post: PostProcessingArguments, training) -> None:
    """Refuse inconsistent arguments before anything is loaded (``modes`` resolved).

    Raises:
        InputError: naming the flags and what is expected.
    """
    if not training.output_dir:
        raise InputError(
            "--output_dir: required (the fine-tuned model, predictions.json and all_results.json go there)"
        )
    if os.path.exists(training.output_dir) and not os.path.isdir(training.output_dir):
        raise InputError(
            f"--output_dir {training.output_dir}: is an existing file; expected a directory (new or existing)"
        )
    if data.dataset_name and (data.train_file or data.validation_file):
        raise InputError("--dataset_name and --train_file/--validation_file: give one data source, not both")
    if not data.dataset_name and not (data.train_file or data.validation_file or data.test_file):
        raise InputError(
            "no data given: pass --train_file/--validation_file/--test_file (SQuAD-format .json/.json.gz) "
            "or --dataset_name squad|squad_v2"
        )
    if modes.do_predict and not data.test_file:
        raise InputError("--do_predict needs --test_file (SQuAD-format questions; 'answers' optional)")
    if data.test_file and not modes.do_predict:
        raise InputError("--test_file is read only with --do_predict; add --do_predict")
    if modes.do_train and not (data.train_file or data.dataset_name):
        raise InputError(
            "training needs --train_file (or --dataset_name); pass --do_eval alone to only evaluate a fine-tuned model"
        )
    if modes.do_eval and not (data.validation_file or data.dataset_name):
        raise InputError("--do_eval needs --validation_file (or --dataset_name)")
    for name, value in (
        ("max_seq_length", data.max_seq_length),
        ("max_query_length", data.max_query_length),
        ("n_best_size", post.n_best_size),
        ("max_answer_length", post.max_answer_length),
    ):
        if value < 1:
            raise InputError(f"--{name} {value}: expected an integer >= 1")
    if data.doc_stride < 0:
        raise InputError(f"--doc_stride {data.doc_stride}: expected an integer >= 0")
    for name in ("max_train_samples", "max_eval_samples", "max_predict_samples"):
        if getattr(data, name) is not None and getattr(data, name) < 1:
            raise InputError(f"--{name} {getattr(data, name)}: expected an integer >= 1")
    if not math.isfinite(post.null_score_diff_threshold):
        raise InputError(f"--null_score_diff_threshold {post.null_score_diff_threshold}: expected a finite number")


def load_examples(data: SquadDataArguments, modes: RunModes):
    """The ``train`` / ``validation`` / ``test`` examples (flat SQuAD format), checked, cut to ``--max_*_samples``.

    Several files of a split are concatenated; a question id present in two files is refused. Test questions
    (``--do_predict``) may come without ``answers``.

    Returns:
        ``{"train": Dataset, "validation": Dataset, "test": Dataset}`` (only the splits needed).

    Raises:
        InputError: bad files (naming the question id), the hub unreachable, a missing split, an id repeated
            across files.
    """
    import datasets

    from finetune.squad_data import load_squad_data, load_squad_file

    wanted = [
        s for s, on in (("train", modes.do_train), ("validation", modes.do_eval), ("test", modes.do_predict)) if on
    ]
    out = {}
    if data.dataset_name:
        loaded, _ = load_squad_data(
            dataset_name=data.dataset_name, version_2_with_negative=data.version_2_with_negative
        )
        for split in [s for s in wanted if s != "test"]:
            if split not in loaded:
                raise InputError(f"--dataset_name {data.dataset_name}: has no {split!r} split (found {sorted(loaded)})")
            out[split] = loaded[split]
    for split in wanted:
        if data.dataset_name and split != "test":
            continue
        files = {"train": data.train_file, "validation": data.validation_file, "test": data.test_file}[split]
        parts, seen = [], {}
        for path in files:
            ds, report = load_squad_file(
                path,
                version_2_with_negative=data.version_2_with_negative,
                skip_misaligned_answers=data.skip_misaligned_answers,
                require_answers=split != "test",
            )
            for qid in ds["id"]:
                if qid in seen:
                    raise InputError(
                        f"{path}: question id {qid!r} is also in {seen[qid]}; ids must be unique across the {split} "
                        "files"
                    )
                seen[qid] = path
            if report.misaligned_answers:
                logger.warning(
                    "%s: skipped %d misaligned answer(s), dropped %d question(s)",
                    path,
                    report.misaligned_answers,
                    len(report.dropped_questions),
                )
            parts.append(ds)
        out[split] = parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
    for split, limit in (
        ("train", data.max_train_samples),
        ("validation", data.max_eval_samples),
        ("test", data.max_predict_samples),
    ):
        if split in out and limit is not None and limit < len(out[split]):
            out[split] = out[split].select(range(limit))
    if "validation" in out and not data.version_2_with_negative:
        unanswerable = sum(1 for a in out["validation"]["answers"] if not a["text"])
        if unanswerable:
            raise InputError(
                f"the validation data has {unanswerable} unanswerable question(s); pass --version_2_with_negative"
            )
    return out


def load_tokenizer(model_args: FinetuneModelArguments, data: SquadDataArguments):
    """The backbone's config and tokenizer, checked for span QA (offsets, token types) and the window arguments.

    Raises:
        InputError: a config or tokenizer that cannot be loaded; windows that leave no room for the context.
    """
    from finetune.qa import check_window_arguments
    from training.pretrained import check_model_fits

    source = model_args.model_name_or_path
    config, tokenizer = model_args.load_config(), model_args.load_tokenizer()
    check_model_fits(config, tokenizer, data.max_seq_length, f"--tokenizer_name {model_args.tokenizer_name or source}")
    check_window_arguments(tokenizer, data.max_seq_length, data.doc_stride, data.max_query_length)
    return config, tokenizer


def load_model(model_args: FinetuneModelArguments, pretrained_config):
    """``AutoModelForQuestionAnswering`` (a backbone with a frozen-backbone option, SesameElmo: ``freeze_backbone``
    from ``--unfreeze_backbone``).

    Raises:
        InputError: no weights, or no question-answering head for the model type.
    """
    from transformers import AutoConfig, AutoModelForQuestionAnswering

    from training.pretrained import load_pretrained

    hub = model_args.hub_kwargs()
    overrides: dict[str, Any] = {}
    if hasattr(pretrained_config, "freeze_backbone"):
        overrides["freeze_backbone"] = not model_args.unfreeze_backbone
    config = AutoConfig.from_pretrained(model_args.model_name_or_path, **hub, **overrides)
    from core.logs import from_pretrained_quietly
    from training.unigram import backbone_plateau_message

    plateau = backbone_plateau_message(model_args.model_name_or_path)
    if plateau:
        logger.warning("%s", plateau)
    return load_pretrained(
        from_pretrained_quietly(AutoModelForQuestionAnswering.from_pretrained, logger),
        model_args.model_name_or_path,
        "--model_name_or_path",
        f"a model type with a question-answering head (got {config.model_type!r}) and its weights (save_pretrained)",
        failure="cannot load a question-answering model",
        config=config,
        **hub,
    )


def tokenize(examples: dict, tokenizer, data: SquadDataArguments, accelerator) -> dict:
    """Training features (``start_positions`` / ``end_positions``) and evaluation features (with
    ``example_id``, ``offset_mapping``, ``cls_index``), one row per window (``datasets.map``)."""
    from finetune.qa import prepare_train_features, prepare_validation_features

    kwargs = dict(
        tokenizer=tokenizer,
        max_seq_length=data.max_seq_length,
        doc_stride=data.doc_stride,
        max_query_length=data.max_query_length,
        pad_to_max_length=data.pad_to_max_length,
    )
    features = {}
    with accelerator.main_process_first():
        for split, fn in (
            ("train", prepare_train_features),
            ("validation", prepare_validation_features),
            ("test", prepare_validation_features),
        ):
            if split in examples:
                ds = examples[split]
                features[split] = ds.map(
                    fn, batched=True, remove_columns=ds.column_names, fn_kwargs=kwargs, desc=f"windows of {split}"
                )
    return features


def make_predict_fn(accelerator, data: SquadDataArguments, post: PostProcessingArguments, examples, features, loader):
    """``predict_fn(model) -> (best, predictions, nbest, null_odds)``: logits of every window (gathered across
    processes with ``gather_for_metrics``, so every question once), then the n-best post-processing.

    ``best`` is each question's best span text; ``predictions`` the answers to write (v2: ``""`` where the null
    odds exceed ``--null_score_diff_threshold``); ``null_odds`` is None for v1.
    """
    from finetune.qa import postprocess_qa_predictions
    from training.evaluation import gather_predictions

    width = -(-data.max_seq_length // 8) * 8  # >= any batch's length, also when padded to a multiple of 8
    columns = features.select_columns(list(POSTPROCESS_COLUMNS))

    def step(model, batch):
        with accelerator.autocast():
            out = model(**batch)
        pad = width - out.start_logits.shape[1]  # same width on every batch and process, for gather and cat
        start = torch.nn.functional.pad(out.start_logits.float(), (0, pad), value=-1e4)
        end = torch.nn.functional.pad(out.end_logits.float(), (0, pad), value=-1e4)
        return {"start_logits": start, "end_logits": end}

    def predict_fn(model):
        logits = gather_predictions(accelerator, model, loader, step)
        # v2: the best span and the null odds once (threshold +inf), then the threshold applied here, so that the
        # metric sees the best span text with its null odds and can search the best threshold (best_f1_thresh).
        best, nbest, odds = postprocess_qa_predictions(
            examples,
            columns,
            logits["start_logits"].numpy(),
            logits["end_logits"].numpy(),
            n_best_size=post.n_best_size,
            max_answer_length=post.max_answer_length,
            version_2_with_negative=data.version_2_with_negative,
            null_score_diff_threshold=math.inf,
        )
        if not data.version_2_with_negative:
            return best, best, nbest, None
        predictions = {q: "" if odds[q] > post.null_score_diff_threshold else text for q, text in best.items()}
        return best, predictions, nbest, odds

    return predict_fn


def make_eval_fn(
    accelerator, data: SquadDataArguments, post: PostProcessingArguments, examples, features, loader, metric
):
    """``eval_fn(prepared model)``: :func:`make_predict_fn`'s predictions scored by the metric. Keeps the last
    predictions in ``eval_fn.last`` as ``(predictions, nbest, null_odds)``."""
    predict_fn = make_predict_fn(accelerator, data, post, examples, features, loader)

    def eval_fn(model) -> dict[str, float]:
        t0 = time.perf_counter()
        best, predictions, nbest, odds = predict_fn(model)
        if data.version_2_with_negative:
            preds = [{"id": q, "prediction_text": t, "no_answer_probability": odds[q]} for q, t in best.items()]
            scores = metric.compute(
                predictions=preds, references=references, no_answer_threshold=post.null_score_diff_threshold
            )
            scores["exact_match"] = scores["exact"]
        else:
            scores = metric.compute(
                predictions=[{"id": q, "prediction_text": t} for q, t in best.items()], references=references
            )
        eval_fn.last = (predictions, nbest, odds)
        metrics = {f"eval_{k}": float(v) for k, v in scores.items()}
        metrics["eval_samples"] = float(len(examples))
        metrics["eval_runtime_s"] = time.perf_counter() - t0
        return metrics

    references = [
        {"id": q, "answers": {"text": list(a["text"]), "answer_start": list(a["answer_start"])}}
        for q, a in zip(examples["id"], examples["answers"])
    ]
    eval_fn.last = None
    return eval_fn


def main(argv: Sequence[str] | None = None) -> int:
    model_args, data, parsed_modes, post, training, hub = parse_arguments(
        ARGUMENTS, argv, prog=PROG, description=DESCRIPTION
    )
    modes = parsed_modes.resolve(has_validation=bool(data.validation_file or data.dataset_name))
    check_arguments(data, modes, post, training)
    start_command(model_args, training, data.train_file, data.validation_file, logger)
    # Everything the user gave is checked (data, tokenizer, windows, hub) before the model is loaded.
    examples = load_examples(data, modes)
    pretrained_config, tokenizer = load_tokenizer(model_args, data)
    settings = (model_args, data, modes, post)
    run, lr_source = finetune_run("squad", pretrained_config, "eval_f1", modes, training, hub, *settings)
    with run:
        accelerator = run.start()
        features = tokenize(examples, tokenizer, data, accelerator)
        return run.execute(  # the model loaded into the parts alone: the driver frees it when done with it
            squad_parts(
                accelerator,
                load_model(model_args, pretrained_config),
                *(tokenizer, examples, features, data, post, run.training, modes, lr_source),
            )
        )


def squad_parts(
    accelerator,
    model,
    tokenizer,
    examples: dict,
    features: dict,
    data: SquadDataArguments,
    post: PostProcessingArguments,
    training,
    modes: RunModes,
    learning_rate_source: str = "--learning_rate",
):
    """The :class:`training.driver.RunParts` of a span-QA run: the training loader over windows, the evaluation
    (n-best post-processing, the official metric), the test predictions and files; for training, the run plan
    (logged on the main process with the questions, windows and evaluation questions, and the learning rate's
    source) and the data fingerprint."""
    from transformers import DataCollatorWithPadding

    from finetune.metrics import load_metric
    from finetune.qa import write_predictions
    from training.data import make_train_dataloader
    from training.driver import RunParts

    collator = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8 if accelerator.mixed_precision != "no" else None)

    def loader_of(split: str):  # in order (no shuffling): predictions are matched back to their features
        inputs = features[split].remove_columns(list(POSTPROCESS_COLUMNS))
        batch = training.per_device_eval_batch_size
        return accelerator.prepare(torch.utils.data.DataLoader(inputs, batch_size=batch, collate_fn=collator))

    eval_fn = predict_fn = None
    if modes.do_eval:
        metric = load_metric("squad_v2" if data.version_2_with_negative else "squad", keep_in_memory=True)
        eval_fn = make_eval_fn(
            accelerator, data, post, examples["validation"], features["validation"], loader_of("validation"), metric
        )
    if modes.do_predict:
        predict_fn = make_predict_fn(accelerator, data, post, examples["test"], features["test"], loader_of("test"))

    def write_outputs(folder: Path, test_predictions) -> None:
        if eval_fn is not None and eval_fn.last is not None:
            preds, nbest, odds = eval_fn.last
            write_predictions(folder, preds, nbest, odds, prefix="eval" if test_predictions is not None else None)
        if test_predictions is not None:
            write_predictions(folder, *test_predictions)

    train_loader = extra = next_step = plan = fingerprint = None
    if modes.do_train:
        train_loader = make_train_dataloader(
            features["train"], training.per_device_train_batch_size, collator, training.seed
        )
        extra = {"train_samples": len(examples["train"]), "train_features": len(features["train"])}
        next_step = (
            f"answer questions with it: python -m finetune.squad --model_name_or_path {training.output_dir} "
            f"--test_file QUESTIONS.json --do_predict --output_dir {training.output_dir}-predict"
        )
        fingerprint = _training_fingerprint(data, examples["train"])
        described = (
            f"{len(examples['train'])} training questions -> {len(features['train'])} windows; evaluation on "
            f"{len(examples['validation']) if modes.do_eval else 'no'} questions"
        )
        plan = logged_plan(accelerator, training, len(features["train"]), described, learning_rate_source, logger)

    return RunParts(
        next_step=next_step,
        model=model,
        tokenizer=tokenizer,
        train_dataloader=train_loader,
        evaluate=eval_fn,
        predict=(lambda model: predict_fn(model)[1:]) if predict_fn else None,
        write_outputs=write_outputs,
        extra_results=extra or {},
        result_keys=("train_samples", "train_features"),
        reevaluate_best=True,
        plan=plan,
        data_fingerprint=fingerprint,
    )


def _training_fingerprint(data: SquadDataArguments, train_examples) -> list[dict]:
    """The training data's fingerprint (:func:`training.data.fingerprint_sources`): the ``--train_file`` files (or the
    hub dataset's own fingerprint) and the windowing settings that decide the training windows."""
    from training.data import fingerprint_sources

    return fingerprint_sources(
        data.train_file or [],
        dataset=None if data.train_file else train_examples._fingerprint,
        max_seq_length=data.max_seq_length,
        doc_stride=data.doc_stride,
        max_query_length=data.max_query_length,
        max_train_samples=data.max_train_samples,
    )


if __name__ == "__main__":
    sys.exit(run_cli(main))
