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

import argparse
import json
import logging
import math
import os
import time
from collections.abc import Sequence
from typing import Any

import torch

from training.errors import InputError, add_debug_argument, first_line, run_cli

logger = logging.getLogger("finetune.squad")

#: Columns of the evaluation features used by the post-processing only (not model inputs).
POSTPROCESS_COLUMNS = ("example_id", "offset_mapping", "cls_index")

#: all_results.json keys besides the ``eval_*`` metrics.
_RESULT_KEYS = ("train_loss", "train_runtime_s", "train_samples_per_second", "train_tokens_per_second",
                "global_step", "epoch", "train_samples", "train_features", "best_step", "best_metric", "stopped_early")


def build_parser() -> argparse.ArgumentParser:
    from finetune.arguments import HelpFormatter, add_model_arguments
    from training.hub import add_hub_arguments
    from training.loop import add_training_arguments

    parser = argparse.ArgumentParser(
        prog="accelerate launch -m finetune.squad",
        description="Fine-tune an extractive QA head (any Auto-loadable backbone) on SQuAD v1.1 / v2.0-format data.",
        formatter_class=HelpFormatter,
    )
    add_model_arguments(parser, head="QA head")
    d = parser.add_argument_group("data")
    d.add_argument("--dataset_name", default=None, help="hub dataset: squad, squad_v2 or owner/name in the same format (needs the network or the local cache)")
    d.add_argument("--train_file", nargs="+", default=None, help="SQuAD-format .json / .json.gz training file(s); several are concatenated (question ids must be unique)")
    d.add_argument("--validation_file", nargs="+", default=None, help="SQuAD-format .json / .json.gz evaluation file(s)")
    d.add_argument("--test_file", nargs="+", default=None, help="SQuAD-format file(s) of questions to answer with --do_predict ('answers' optional)")
    d.add_argument("--version_2_with_negative", action="store_true", help="SQuAD v2.0: unanswerable questions allowed; predict '' when the null score wins")
    d.add_argument("--skip_misaligned_answers", action="store_true", help="drop (and count) answers whose answer_start does not point at their text instead of refusing the file")
    d.add_argument("--max_seq_length", type=int, default=384, help="tokens per window, question and special tokens included")
    d.add_argument("--doc_stride", type=int, default=128, help="tokens shared by consecutive windows of a long context")
    d.add_argument("--max_query_length", type=int, default=64, help="questions are cut to this many tokens")
    d.add_argument("--pad_to_max_length", action="store_true", help="pad every window to --max_seq_length (default: dynamic padding)")
    d.add_argument("--max_train_samples", type=int, default=None, help="use only the first N training questions")
    d.add_argument("--max_eval_samples", type=int, default=None, help="use only the first N evaluation questions")
    d.add_argument("--max_predict_samples", type=int, default=None, help="use only the first N questions of --test_file")
    r = parser.add_argument_group("what to run (default: train, then evaluate when there is validation data)")
    r.add_argument("--do_train", action="store_true", help="fine-tune --model_name_or_path on the training data")
    r.add_argument("--do_eval", action="store_true", help="evaluate on the validation data (alone: evaluate --model_name_or_path as it is)")
    r.add_argument("--do_predict", action="store_true", help="answer the questions of --test_file: predictions.json (+ nbest_predictions.json, v2: null_odds.json)")
    p = parser.add_argument_group("post-processing")
    p.add_argument("--n_best_size", type=int, default=20, help="best start and end positions tried per window, answers kept per question")
    p.add_argument("--max_answer_length", type=int, default=30, help="longest answer in tokens")
    p.add_argument("--null_score_diff_threshold", type=float, default=0.0, help="v2: predict '' when null score - best span score exceeds it")
    add_training_arguments(parser, output_dir=None, learning_rate=3e-5, num_train_epochs=2.0, per_device_train_batch_size=12,
                           per_device_eval_batch_size=32, project_name="sesame-lm-squad")
    add_hub_arguments(parser)
    add_debug_argument(parser)
    return parser


def check_args(args: argparse.Namespace) -> None:
    """Refuse inconsistent arguments before anything is loaded; fills ``args.do_train`` / ``args.do_eval``."""
    if not args.output_dir:
        raise InputError("--output_dir: required (the fine-tuned model, predictions.json and all_results.json go there)")
    if os.path.exists(args.output_dir) and not os.path.isdir(args.output_dir):
        raise InputError(f"--output_dir {args.output_dir}: is an existing file; expected a directory (new or existing)")
    if args.dataset_name and (args.train_file or args.validation_file):
        raise InputError("--dataset_name and --train_file/--validation_file: give one data source, not both")
    if not args.dataset_name and not (args.train_file or args.validation_file or args.test_file):
        raise InputError("no data given: pass --train_file/--validation_file/--test_file (SQuAD-format .json/.json.gz) or --dataset_name squad|squad_v2")
    if not args.do_train and not args.do_eval and not args.do_predict:
        args.do_train = True
        args.do_eval = bool(args.validation_file or args.dataset_name)
    if args.do_predict and not args.test_file:
        raise InputError("--do_predict needs --test_file (SQuAD-format questions; 'answers' optional)")
    if args.test_file and not args.do_predict:
        raise InputError("--test_file is read only with --do_predict; add --do_predict")
    if args.do_train and not (args.train_file or args.dataset_name):
        raise InputError("training needs --train_file (or --dataset_name); pass --do_eval alone to only evaluate a fine-tuned model")
    if args.do_eval and not (args.validation_file or args.dataset_name):
        raise InputError("--do_eval needs --validation_file (or --dataset_name)")
    for name in ("max_seq_length", "max_query_length", "per_device_train_batch_size", "per_device_eval_batch_size",
                 "n_best_size", "max_answer_length"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name} {getattr(args, name)}: expected an integer >= 1")
    if args.doc_stride < 0:
        raise InputError(f"--doc_stride {args.doc_stride}: expected an integer >= 0")
    for name in ("max_train_samples", "max_eval_samples", "max_predict_samples"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise InputError(f"--{name} {getattr(args, name)}: expected an integer >= 1")
    if not math.isfinite(args.null_score_diff_threshold):
        raise InputError(f"--null_score_diff_threshold {args.null_score_diff_threshold}: expected a finite number")


def load_examples(args: argparse.Namespace):
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

    wanted = [s for s, on in (("train", args.do_train), ("validation", args.do_eval), ("test", args.do_predict)) if on]
    out = {}
    if args.dataset_name:
        loaded, _ = load_squad_data(dataset_name=args.dataset_name, version_2_with_negative=args.version_2_with_negative)
        for split in [s for s in wanted if s != "test"]:
            if split not in loaded:
                raise InputError(f"--dataset_name {args.dataset_name}: has no {split!r} split (found {sorted(loaded)})")
            out[split] = loaded[split]
    for split in wanted:
        if args.dataset_name and split != "test":
            continue
        files = {"train": args.train_file, "validation": args.validation_file, "test": args.test_file}[split]
        parts, seen = [], {}
        for path in files:
            ds, report = load_squad_file(path, version_2_with_negative=args.version_2_with_negative,
                                         skip_misaligned_answers=args.skip_misaligned_answers,
                                         require_answers=split != "test")
            for qid in ds["id"]:
                if qid in seen:
                    raise InputError(f"{path}: question id {qid!r} is also in {seen[qid]}; ids must be unique across the {split} files")
                seen[qid] = path
            if report.misaligned_answers:
                logger.warning("%s: skipped %d misaligned answer(s), dropped %d question(s)", path,
                               report.misaligned_answers, len(report.dropped_questions))
            parts.append(ds)
        out[split] = parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
    for split, limit in (("train", args.max_train_samples), ("validation", args.max_eval_samples), ("test", args.max_predict_samples)):
        if split in out and limit is not None and limit < len(out[split]):
            out[split] = out[split].select(range(limit))
    if "validation" in out and not args.version_2_with_negative:
        unanswerable = sum(1 for a in out["validation"]["answers"] if not a["text"])
        if unanswerable:
            raise InputError(f"the validation data has {unanswerable} unanswerable question(s); pass --version_2_with_negative")
    return out


def load_tokenizer(args: argparse.Namespace):
    """The backbone's tokenizer, checked for span QA (offsets, token types) and the window arguments."""
    from transformers import AutoConfig, AutoTokenizer

    import modeling  # noqa: F401  (registers the sesame-lm Auto classes)
    from finetune.qa import check_window_arguments

    source = args.model_name_or_path
    try:
        config = AutoConfig.from_pretrained(source, revision=args.revision, trust_remote_code=args.trust_remote_code)
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_name or source, revision=args.revision,
                                                  trust_remote_code=args.trust_remote_code)
    except (OSError, ValueError) as err:
        raise InputError(f"--model_name_or_path {source}: cannot load the config / tokenizer ({type(err).__name__}: "
                         f"{first_line(err)})") from None
    from training.run import check_model_fits

    check_model_fits(config, tokenizer, args.max_seq_length, f"--tokenizer_name {args.tokenizer_name or source}")
    check_window_arguments(tokenizer, args.max_seq_length, args.doc_stride, args.max_query_length)
    return config, tokenizer


def load_model(args: argparse.Namespace, pretrained_config):
    """``AutoModelForQuestionAnswering`` (SesameElmo: ``freeze_backbone`` from ``--unfreeze_backbone``)."""
    from transformers import AutoConfig, AutoModelForQuestionAnswering

    overrides: dict[str, Any] = {}
    if hasattr(pretrained_config, "freeze_backbone"):  # a config with that field (SesameElmo) takes --unfreeze_backbone
        overrides["freeze_backbone"] = not args.unfreeze_backbone
    config = AutoConfig.from_pretrained(args.model_name_or_path, revision=args.revision,
                                        trust_remote_code=args.trust_remote_code, **overrides)
    try:
        return AutoModelForQuestionAnswering.from_pretrained(args.model_name_or_path, config=config, revision=args.revision,
                                                             trust_remote_code=args.trust_remote_code)
    except ValueError as err:
        raise InputError(f"--model_name_or_path {args.model_name_or_path}: no question-answering head for "
                         f"model type {config.model_type!r} ({first_line(err)})") from None


def tokenize(examples: dict, tokenizer, args: argparse.Namespace, accelerator) -> dict:
    """Training features (``start_positions`` / ``end_positions``) and evaluation features (with
    ``example_id``, ``offset_mapping``, ``cls_index``), one row per window (``datasets.map``)."""
    from finetune.qa import prepare_train_features, prepare_validation_features

    kwargs = dict(tokenizer=tokenizer, max_seq_length=args.max_seq_length, doc_stride=args.doc_stride,
                  max_query_length=args.max_query_length, pad_to_max_length=args.pad_to_max_length)
    features = {}
    with accelerator.main_process_first():
        for split, fn in (("train", prepare_train_features), ("validation", prepare_validation_features),
                          ("test", prepare_validation_features)):
            if split in examples:
                ds = examples[split]
                features[split] = ds.map(fn, batched=True, remove_columns=ds.column_names, fn_kwargs=kwargs,
                                         desc=f"windows of {split}")
    return features


def make_predict_fn(accelerator, args, examples, features, loader):
    """``predict_fn(model) -> (best, predictions, nbest, null_odds)``: logits of every window (gathered across
    processes with ``gather_for_metrics``, so every question once), then the n-best post-processing.

    ``best`` is each question's best span text; ``predictions`` the answers to write (v2: ``""`` where the null
    odds exceed ``--null_score_diff_threshold``); ``null_odds`` is None for v1.
    """
    from training.loop import gather_predictions

    from finetune.qa import postprocess_qa_predictions

    width = -(-args.max_seq_length // 8) * 8  # >= any batch's length, also when padded to a multiple of 8
    post = features.select_columns(list(POSTPROCESS_COLUMNS))

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
            examples, post, logits["start_logits"].numpy(), logits["end_logits"].numpy(), n_best_size=args.n_best_size,
            max_answer_length=args.max_answer_length, version_2_with_negative=args.version_2_with_negative,
            null_score_diff_threshold=math.inf,
        )
        if not args.version_2_with_negative:
            return best, best, nbest, None
        predictions = {q: "" if odds[q] > args.null_score_diff_threshold else text for q, text in best.items()}
        return best, predictions, nbest, odds

    return predict_fn


def make_eval_fn(accelerator, args, examples, features, loader, metric):
    """``eval_fn(model_or_trainer)``: :func:`make_predict_fn`'s predictions scored by the metric. Keeps the last
    predictions in ``eval_fn.last`` as ``(predictions, nbest, null_odds)``."""
    predict_fn = make_predict_fn(accelerator, args, examples, features, loader)

    def eval_fn(holder) -> dict[str, float]:
        model = holder.model if hasattr(holder, "model") else holder
        t0 = time.perf_counter()
        best, predictions, nbest, odds = predict_fn(model)
        if args.version_2_with_negative:
            preds = [{"id": q, "prediction_text": t, "no_answer_probability": odds[q]} for q, t in best.items()]
            scores = metric.compute(predictions=preds, references=references, no_answer_threshold=args.null_score_diff_threshold)
            scores["exact_match"] = scores["exact"]
        else:
            scores = metric.compute(predictions=[{"id": q, "prediction_text": t} for q, t in best.items()], references=references)
        eval_fn.last = (predictions, nbest, odds)
        metrics = {f"eval_{k}": float(v) for k, v in scores.items()}
        metrics["eval_samples"] = float(len(examples))
        metrics["eval_runtime_s"] = time.perf_counter() - t0
        return metrics

    references = [{"id": q, "answers": {"text": list(a["text"]), "answer_start": list(a["answer_start"])}}
                  for q, a in zip(examples["id"], examples["answers"])]
    eval_fn.last = None
    return eval_fn


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_args(args)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from training.run import run_config, setup_logging

    setup_logging()

    from transformers import DataCollatorWithPadding

    from finetune.metrics import load_metric
    from training.hub import HubPusher, every_save_hook, validate_hub_args
    from training.loop import Trainer, TrainingConfig, finish, make_accelerator, make_train_dataloader

    # Everything the user gave is checked (data, tokenizer, windows, hub) before the model is loaded.
    examples = load_examples(args)
    pretrained_config, tokenizer = load_tokenizer(args)
    if args.do_train:
        validate_hub_args(args)
    if args.metric_for_best_model is None:
        args.metric_for_best_model = "eval_f1"
    config = TrainingConfig.from_args(args)
    accelerator = make_accelerator(config, mixed_precision=args.mixed_precision)
    setup_logging(accelerator.is_main_process)
    features = tokenize(examples, tokenizer, args, accelerator)
    model = load_model(args, pretrained_config)
    collator = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8 if accelerator.mixed_precision != "no" else None)

    def loader_of(split: str):
        inputs = features[split].remove_columns(list(POSTPROCESS_COLUMNS))
        return accelerator.prepare(torch.utils.data.DataLoader(inputs, batch_size=args.per_device_eval_batch_size,
                                                               collate_fn=collator, shuffle=False))

    eval_fn = predict_fn = None
    if args.do_eval:
        metric = load_metric("squad_v2" if args.version_2_with_negative else "squad", keep_in_memory=True)
        eval_fn = make_eval_fn(accelerator, args, examples["validation"], features["validation"], loader_of("validation"), metric)
    if args.do_predict:
        predict_fn = make_predict_fn(accelerator, args, examples["test"], features["test"], loader_of("test"))

    trainer = pusher = None
    if args.do_train:
        train_loader = make_train_dataloader(features["train"], args.per_device_train_batch_size, collator, args.seed)
        pusher = HubPusher.from_args(args)  # validate_hub_args filled --hub_model_id (training runs only push)
        on_save = every_save_hook(pusher, args, tokenizer, task="question-answering")
        trainer = Trainer(accelerator, model, train_loader, config, eval_fn=eval_fn, run_config=run_config(args),
                          on_save=on_save)
        del model
        if accelerator.is_main_process:
            logger.info("%d training questions -> %d windows; evaluation on %s questions; %d optimizer steps",
                        len(examples["train"]), len(features["train"]),
                        len(examples["validation"]) if args.do_eval else "no", trainer.max_train_steps)
        from training.signals import train_until_stopped

        # SIGTERM / SIGINT: finish the step, checkpoint, exit 143 / 130; a non-finite loss: exit 1.
        result, status = train_until_stopped(trainer, lambda: finish(accelerator, trainer))
        if result is None:
            return status
        result["train_samples"] = len(examples["train"])
        result["train_features"] = len(features["train"])
        if eval_fn is not None and result.get("best_step") not in (None, result["global_step"]) and config.load_best_model_at_end:
            eval_fn(trainer)  # the predictions files of the best model, loaded at the end of training
        prepared, model = trainer.model, trainer.unwrapped_model
    else:
        prepared = accelerator.prepare(model)
        result = eval_fn(prepared) if eval_fn else {}
        model = None
    test_predictions = predict_fn(prepared)[1:] if predict_fn else None
    state_dict = accelerator.get_state_dict(prepared) if model is not None else None  # all processes (FSDP)
    if accelerator.is_main_process:
        save_outputs(args, model, tokenizer, result, eval_fn.last if eval_fn else None, test_predictions, state_dict)
        logger.info("wrote %s: %s", args.output_dir,
                    {k: round(v, 4) for k, v in result.items() if k.startswith("eval_") and isinstance(v, float)})
    del prepared, model, state_dict
    accelerator.wait_for_everyone()
    finish(accelerator, *([trainer] if trainer else []))
    if pusher is not None and accelerator.is_main_process:  # after the process group is gone: no rank waits on it
        from training.model_card import card_for_run

        pusher.push(args.output_dir, step=result.get("global_step"),
                    model_card=card_for_run(args.output_dir, args, task="question-answering"))
    return 0


def save_outputs(args, model, tokenizer, result: dict, predictions, test_predictions=None, state_dict=None) -> None:
    """Into ``--output_dir``, atomically (a temporary folder moved in at the end): the model + tokenizer
    (``save_pretrained``), ``eval_history.json``, ``trainer_log.json`` and ``curves.png`` when trained; the
    prediction files (``--do_predict``: the test questions' as ``predictions.json`` ..., the evaluation's then as
    ``eval_predictions.json`` ...; else the evaluation's as ``predictions.json`` ...); ``all_results.json``.
    ``state_dict`` (``accelerator.get_state_dict``: the full weights under FSDP) is saved when given."""
    from finetune.qa import write_predictions
    from tokenizer.corpus import atomic_output_dir
    from training.run import write_run_files

    flat = {k: result[k] for k in _RESULT_KEYS if k in result}
    flat.update({k: v for k, v in result.items() if k.startswith("eval_") and k != "eval_history"})
    with atomic_output_dir(args.output_dir) as tmp:
        if model is not None:
            model.save_pretrained(tmp, state_dict=state_dict)
            tokenizer.save_pretrained(tmp)
        if predictions is not None:
            preds, nbest, odds = predictions
            write_predictions(tmp, preds, nbest, odds, prefix="eval" if test_predictions is not None else None)
        if test_predictions is not None:
            write_predictions(tmp, *test_predictions)
        write_run_files(tmp, result, flat, os.path.basename(os.path.normpath(args.output_dir)))


if __name__ == "__main__":
    sys.exit(run_cli(main))
