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

import argparse
import logging
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Sampler

from finetune.tasks import TASK_NAMES, GlueTask, get_task
from training.errors import InputError, add_debug_argument, check_local_path, first_line, run_cli
from training.run import epoch_seed

logger = logging.getLogger("finetune.glue")


class LengthGroupedSampler(Sampler[int]):
    """Training order in which consecutive ``batch_size`` examples have similar lengths (less padding).

    A random permutation (depending only on ``(seed, epoch)``, like :class:`training.loop.EpochShuffleSampler`,
    so that a resumed run sees the same order) is cut into mega-batches of ``mega_batch_factor`` batches, and
    each mega-batch is sorted by decreasing length; the mega-batch holding the longest example goes first, so
    that running out of memory happens at the first step (the scheme of transformers' ``LengthGroupedSampler``).
    """

    def __init__(self, lengths: Sequence[int], batch_size: int, seed: int, mega_batch_factor: int = 50):
        self.lengths, self.batch_size, self.seed, self.factor, self.epoch = list(lengths), batch_size, seed, mega_batch_factor, 0

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


def build_parser() -> argparse.ArgumentParser:
    from finetune.arguments import HelpFormatter, add_model_arguments
    from training.hub import add_hub_arguments
    from training.loop import add_training_arguments

    parser = argparse.ArgumentParser(
        prog="accelerate launch -m finetune.glue",
        description="Fine-tune a sequence classifier (any Auto-loadable backbone) on a GLUE task or custom files.",
        formatter_class=HelpFormatter,
    )
    m = add_model_arguments(parser, head="head", config_name=True)
    m.add_argument("--ignore_mismatched_sizes", action="store_true", help="replace a pretrained classification head whose labels differ from the task's")
    d = parser.add_argument_group("data")
    d.add_argument("--task_name", default=None, help=f"GLUE task: {', '.join(TASK_NAMES)} (omit for a custom task)")
    d.add_argument("--glue_dir", default=None, help="the official GLUE data folder (SST-2/train.tsv, CoLA/train.tsv, ...)")
    d.add_argument("--train_file", default=None, help="csv, tsv, json or jsonl training file (custom task, or a GLUE task from files)")
    d.add_argument("--validation_file", default=None, help="validation file, same format")
    d.add_argument("--test_file", default=None, help="test file (labels optional), predicted with --do_predict")
    d.add_argument("--sentence1_key", default=None, help="column of the first text (default: the task's / sentence1 / premise / sentence / text)")
    d.add_argument("--sentence2_key", default=None, help="column of the second text of pairs")
    d.add_argument("--label_key", default="label", help="label column of custom files")
    d.add_argument("--max_seq_length", type=int, default=128, help="longer inputs are truncated (tokens)")
    d.add_argument("--pad_to_max_length", action="store_true", help="pad every batch to --max_seq_length (default: dynamic padding)")
    d.add_argument("--no_group_by_length", dest="group_by_length", action="store_false", help="shuffle without grouping batches by length")
    d.add_argument("--max_train_samples", type=int, default=None, help="use only the first N training examples")
    d.add_argument("--max_eval_samples", type=int, default=None, help="use only the first N examples of each evaluation split")
    r = parser.add_argument_group("what to run (default: train, then evaluate when there is validation data)")
    r.add_argument("--do_train", action="store_true", help="fine-tune --model_name_or_path on the training split")
    r.add_argument("--do_eval", action="store_true", help="evaluate on the validation split(s) (alone: evaluate --model_name_or_path as it is)")
    r.add_argument("--do_predict", action="store_true", help="write predictions for the test split(s) (GLUE submission files; predictions_test.tsv for --test_file)")
    add_training_arguments(parser, output_dir=None, learning_rate=2e-5, num_train_epochs=3.0, per_device_train_batch_size=32,
                           per_device_eval_batch_size=64, project_name="sesame-lm-glue")
    add_hub_arguments(parser)
    add_debug_argument(parser)
    return parser


def check_args(args: argparse.Namespace) -> GlueTask | None:
    """Refuse inconsistent arguments before anything is loaded; returns the GLUE task (None = custom).

    Fills ``args.do_train`` / ``args.do_eval``: with none of ``--do_train`` / ``--do_eval`` / ``--do_predict``
    given, train and then evaluate (when there is validation data); otherwise exactly what is given runs, as in
    the Hugging Face examples (``--do_eval`` / ``--do_predict`` without ``--do_train`` use the model as it is).
    """
    task = get_task(args.task_name) if args.task_name else None
    if not args.output_dir:
        raise InputError("--output_dir: required (the fine-tuned model and all_results.json go there)")
    if args.glue_dir and (args.train_file or args.validation_file or args.test_file):
        raise InputError("--glue_dir and --train_file/--validation_file/--test_file: give one data source, not both")
    if not args.do_train and not args.do_eval and not args.do_predict:
        args.do_train = args.do_eval = True
    if task is None and not (args.train_file or args.validation_file or args.test_file):
        raise InputError("a custom task needs --train_file (and --validation_file / --test_file); or give a GLUE --task_name")
    if args.do_train and task is None and not args.train_file:
        raise InputError("training a custom task needs --train_file; pass --do_eval / --do_predict alone to use a "
                         "fine-tuned --model_name_or_path as it is")
    if args.do_predict and not args.do_train and not args.do_eval and task is None and not args.test_file:
        raise InputError("--do_predict needs --test_file for a custom task")
    for name in ("max_seq_length", "per_device_train_batch_size", "per_device_eval_batch_size"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name} {getattr(args, name)}: expected an integer >= 1")
    for name in ("max_train_samples", "max_eval_samples"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise InputError(f"--{name} {getattr(args, name)}: expected an integer >= 1")
    return task


def _is_default_label(name: str) -> bool:
    return re.fullmatch(r"LABEL_\d+", str(name)) is not None


def label_mapping(pretrained_config, label_names: list[str], args) -> dict[int, int] | None:
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
    if args.ignore_mismatched_sizes:
        logger.warning("the pretrained head predicts %s, the task has %s: training a new head", names, label_names)
        return None
    raise InputError(f"--model_name_or_path {args.model_name_or_path}: its classification head predicts {names}, but the "
                     f"task has the labels {label_names}; pass --ignore_mismatched_sizes to train a new head")


def load_model_and_tokenizer(args, label_names: list[str], regression: bool, task_name: str | None):
    """The tokenizer and an ``AutoModelForSequenceClassification`` with the task's labels in its config.

    Returns:
        (tokenizer, model, {task id: model id} or None).
    """
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    import modeling  # noqa: F401  (registers the sesame-lm Auto classes)

    source = args.model_name_or_path
    hub = {"revision": args.revision, "trust_remote_code": args.trust_remote_code}
    for arg in ("model_name_or_path", "config_name", "tokenizer_name"):
        if getattr(args, arg):
            check_local_path(getattr(args, arg), f"--{arg}", "a folder written by save_pretrained or a hub repo id")
    try:
        pretrained = AutoConfig.from_pretrained(args.config_name or source, **hub)
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_name or source, **hub)
    except (OSError, ValueError) as err:
        what = " / ".join(f"--{n} {getattr(args, n)}" for n in ("model_name_or_path", "config_name", "tokenizer_name")
                          if getattr(args, n)) + (f" (--revision {args.revision})" if args.revision else "")
        raise InputError(f"{what}: cannot load the config / tokenizer ({type(err).__name__}: "
                         f"{first_line(err)}); expected a model folder written by save_pretrained or a hub repo id") from None
    mapping = None if regression else label_mapping(pretrained, label_names, args)
    overrides: dict[str, Any] = {"num_labels": 1 if regression else len(label_names),
                                 "problem_type": "regression" if regression else "single_label_classification",
                                 "finetuning_task": task_name}
    if mapping is None and not regression:
        overrides["id2label"] = dict(enumerate(label_names))
        overrides["label2id"] = {n: i for i, n in enumerate(label_names)}
    if hasattr(pretrained, "freeze_backbone"):  # a config with that field (SesameElmo) takes --unfreeze_backbone
        overrides["freeze_backbone"] = not args.unfreeze_backbone
    config = AutoConfig.from_pretrained(args.config_name or source, **hub, **overrides)
    try:
        model = AutoModelForSequenceClassification.from_pretrained(
            source, config=config, ignore_mismatched_sizes=args.ignore_mismatched_sizes, **hub
        )
    except OSError as err:  # no weights file (or an unreadable one)
        raise InputError(f"--model_name_or_path {source}: cannot load the weights ({type(err).__name__}: "
                         f"{first_line(err)}); expected a model folder with model.safetensors "
                         "(save_pretrained) or a hub repo id") from None
    from training.run import check_model_fits

    check_model_fits(model.config, tokenizer, args.max_seq_length,
                     f"--tokenizer_name {args.tokenizer_name or args.model_name_or_path}")
    return tokenizer, model, mapping


def tokenize_splits(raw, tokenizer, args, mapping: dict[int, int] | None, accelerator):
    """Tokenize every split (``datasets.map``); labelled splits get ``labels`` in the model's class ids."""
    pair = "sentence2" in raw[next(iter(raw))].column_names
    regression = raw[next(iter(raw))].features["label"].dtype in ("float32", "float64")

    def preprocess(batch, labelled: bool):
        texts = (batch["sentence1"], batch["sentence2"]) if pair else (batch["sentence1"],)
        encoded = tokenizer(*texts, truncation=True, max_length=args.max_seq_length,
                            padding="max_length" if args.pad_to_max_length else False)
        if labelled:
            encoded["labels"] = [float(v) for v in batch["label"]] if regression else \
                [mapping[v] if mapping else v for v in batch["label"]]
        return encoded

    out = {}
    with accelerator.main_process_first():
        for split, ds in raw.items():
            limit = args.max_train_samples if split == "train" else args.max_eval_samples
            if limit is not None and limit < len(ds):
                ds = ds.select(range(limit))
            labelled = not split.startswith("test") or -1 not in set(ds["label"][:100])
            out[split] = (ds, ds.map(preprocess, batched=True, remove_columns=ds.column_names,
                                     fn_kwargs={"labelled": labelled}, desc=f"tokenize {split}"))
    return out


def metric_for(task: GlueTask | None, regression: bool):
    """The shipped metric module of the task: ``glue/<task>``, or accuracy / ``glue/stsb`` for custom tasks."""
    from finetune.metrics import load_metric

    if task is not None:
        return load_metric("glue", task.metric_config, keep_in_memory=True)
    return load_metric("glue", "stsb", keep_in_memory=True) if regression else load_metric("accuracy", keep_in_memory=True)


def fine_tuned_label_names(args) -> list[str] | None:
    """The label names of a fine-tuned classifier's head (``id2label``), or None (regression, unnamed labels, or
    no config yet): used as the label set of custom files when evaluating / predicting without training."""
    from transformers import AutoConfig

    import modeling  # noqa: F401  (registers the sesame-lm Auto classes)

    try:
        config = AutoConfig.from_pretrained(args.config_name or args.model_name_or_path, revision=args.revision,
                                            trust_remote_code=args.trust_remote_code)
    except (OSError, ValueError):
        return None  # load_model_and_tokenizer reports it with the full message
    names = [config.id2label[i] for i in sorted(config.id2label or {})]
    if getattr(config, "problem_type", None) == "regression" or not names or all(_is_default_label(n) for n in names):
        return None
    return names


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    explicit = args.do_train or args.do_eval or args.do_predict
    task = check_args(args)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from training.run import run_config, setup_logging

    setup_logging()

    from transformers import DataCollatorWithPadding

    from finetune.glue_data import label_names_of, load_glue_data, write_submission
    from training.hub import HubPusher, every_save_hook, validate_hub_args
    from training.loop import Trainer, TrainingConfig, finish, gather_predictions, make_accelerator, make_train_dataloader

    # Everything the user gave is checked before the model is loaded and training starts.
    known_labels = None if args.do_train or task is not None else fine_tuned_label_names(args)
    raw = load_glue_data(args.task_name, glue_dir=args.glue_dir, train_file=args.train_file,
                         validation_file=args.validation_file, test_file=args.test_file,
                         sentence1_key=args.sentence1_key, sentence2_key=args.sentence2_key, label_key=args.label_key,
                         label_names=known_labels)
    if args.do_train and "train" not in raw:
        raise InputError(f"no training split: found {sorted(raw)}; pass --train_file (or --glue_dir with train.tsv)")
    label_names = label_names_of(raw["train"] if "train" in raw else raw)
    regression = not label_names
    eval_splits = [s for s in raw if s.startswith("validation")] if args.do_eval else []
    test_splits = [s for s in raw if s.startswith("test")] if args.do_predict else []
    if explicit and args.do_eval and not eval_splits:
        raise InputError(f"--do_eval: no validation split (found {sorted(raw)}); pass --validation_file, or --glue_dir with the dev file")
    if args.do_predict and not test_splits:
        raise InputError(f"--do_predict: no test split (found {sorted(raw)}); pass --test_file, or --glue_dir with the test file")
    if args.metric_for_best_model is None:  # the task's main metric (the GLUE leaderboard's)
        args.metric_for_best_model = f"eval_{task.main_metric}" if task else ("eval_pearson" if regression else "eval_accuracy")
    if args.do_train:
        validate_hub_args(args)
    config = TrainingConfig.from_args(args)
    accelerator = make_accelerator(config, mixed_precision=args.mixed_precision)
    setup_logging(accelerator.is_main_process)
    tokenizer, model, mapping = load_model_and_tokenizer(args, label_names, regression, args.task_name)
    splits = [*(["train"] if args.do_train else []), *eval_splits, *test_splits]
    data = tokenize_splits({s: raw[s] for s in splits}, tokenizer, args, mapping, accelerator)
    collator = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8 if accelerator.mixed_precision != "no" else None)
    loaders = {s: accelerator.prepare(torch.utils.data.DataLoader(data[s][1], batch_size=args.per_device_eval_batch_size,
                                                                  collate_fn=collator, shuffle=False))
               for s in [*eval_splits, *test_splits]}
    metric = metric_for(task, regression)
    inverse = {m: t for t, m in mapping.items()} if mapping else None

    def predict(model, split: str) -> dict[str, torch.Tensor]:
        def step(model, batch):
            labels = batch.pop("labels", None)
            with accelerator.autocast():
                logits = model(**batch).logits.float()
            return {"logits": logits} if labels is None else {"logits": logits, "labels": labels}

        return gather_predictions(accelerator, model, loaders[split], step)

    def to_task_ids(logits: torch.Tensor) -> np.ndarray:
        if regression:
            return logits.squeeze(-1).numpy()
        ids = logits.argmax(-1).numpy()
        return np.array([inverse[i] for i in ids]) if inverse else ids

    def evaluate(model) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for n, split in enumerate(eval_splits):
            out = predict(model, split)
            logits, labels = out["logits"], out["labels"]
            if regression:
                loss = torch.nn.functional.mse_loss(logits.squeeze(-1), labels.float())
            else:
                loss = torch.nn.functional.cross_entropy(logits, labels.long())
            refs = labels.numpy() if regression else np.array([inverse[i] for i in labels.tolist()]) if inverse else labels.numpy()
            scores = {"loss": float(loss), **metric.compute(predictions=to_task_ids(logits), references=refs)}
            suffix = split.split("_", 1)[1] if "_" in split else ""
            for key, value in scores.items():
                if n == 0:
                    metrics[f"eval_{key}"] = value
                if len(eval_splits) > 1:
                    metrics[f"eval_{suffix}_{key}"] = value
        return metrics

    trainer = pusher = None
    if args.do_train:
        train_ds = data["train"][1]
        length_key = next(k for k in ("input_ids", "char_ids") if k in train_ds.column_names)
        sampler = (LengthGroupedSampler([len(x) for x in train_ds[length_key]], args.per_device_train_batch_size, args.seed)
                   if args.group_by_length else None)
        train_loader = make_train_dataloader(train_ds, args.per_device_train_batch_size, collator, args.seed, sampler=sampler)
        pusher = HubPusher.from_args(args)
        on_save = every_save_hook(pusher, args, tokenizer, task="text-classification")
        trainer = Trainer(accelerator, model, train_loader, config,
                          eval_fn=(lambda trainer: evaluate(trainer.model)) if eval_splits else None,
                          run_config=run_config(args), on_save=on_save)
        del model
        if accelerator.is_main_process:
            logger.info("%s: %d training examples, evaluation on %s, labels %s; %d optimizer steps",
                        args.task_name or "custom task", len(train_ds), eval_splits or "nothing", label_names or "regression",
                        trainer.max_train_steps)
        from training.signals import train_until_stopped

        result, status = train_until_stopped(trainer, lambda: finish(accelerator, trainer))  # SIGTERM/SIGINT: 143/130
        if result is None:
            return status
        model = trainer.model
    else:
        model = accelerator.prepare(model)
        result = evaluate(model)
    predictions = {split: to_task_ids(predict(model, split)["logits"]) for split in test_splits}
    state_dict = accelerator.get_state_dict(trainer.model) if trainer else None  # all processes: FSDP gathers shards
    if accelerator.is_main_process:
        save_outputs(args, trainer.unwrapped_model if trainer else None, tokenizer, result, eval_splits, state_dict)
        for split, preds in predictions.items():
            idx = data[split][0]["idx"]
            if task is not None and split in task.submission:
                path = write_submission(args.output_dir, task, split, idx, preds)
            else:
                path = write_custom_predictions(args.output_dir, split, idx, preds, label_names)
            logger.info("wrote %s", path)
        logger.info("wrote %s: %s", args.output_dir, {k: round(v, 4) for k, v in result.items() if k.startswith("eval_") and isinstance(v, float)})
    del model, state_dict
    finish(accelerator, *([trainer] if trainer else []))
    if pusher is not None and accelerator.is_main_process:  # after the process group is gone: no rank waits on it
        from training.model_card import card_for_run

        pusher.push(args.output_dir, step=result.get("global_step"),
                    model_card=card_for_run(args.output_dir, args, task="text-classification"))
    return 0


def write_custom_predictions(output_dir: str, split: str, idx: Sequence[int], preds: np.ndarray, label_names: list[str]) -> Path:
    """``predictions_<split>.tsv`` (``index\\tprediction``: label names, or scores for regression), atomically."""
    import tempfile

    target = Path(output_dir) / f"predictions_{split}.tsv"
    rows = [f"{int(i)}\t{label_names[int(p)] if label_names else f'{float(p):.6g}'}" for i, p in zip(idx, preds)]
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write("index\tprediction\n" + "".join(r + "\n" for r in rows))
    os.replace(tmp, target)
    return target


#: all_results.json keys besides the ``eval_*`` metrics.
_RESULT_KEYS = ("train_loss", "train_runtime_s", "train_samples_per_second", "train_tokens_per_second", "global_step", "epoch",
                "best_step", "best_metric", "stopped_early")


def save_outputs(args, model, tokenizer, result: dict, eval_splits: list[str], state_dict=None) -> None:
    """Into ``--output_dir``, atomically: ``all_results.json``; when trained (``model`` given) also the model +
    tokenizer (``save_pretrained``, with ``state_dict`` from ``accelerator.get_state_dict`` when given: the full
    weights under FSDP), ``eval_history.json``, ``trainer_log.json`` and ``curves.png``."""
    from tokenizer.corpus import atomic_output_dir
    from training.run import write_run_files

    flat = {k: result[k] for k in _RESULT_KEYS if k in result}
    flat.update({k: v for k, v in result.items() if k.startswith("eval_") and k != "eval_history"})
    with atomic_output_dir(args.output_dir) as tmp:
        if model is not None:
            model.save_pretrained(tmp, state_dict=state_dict)
            tokenizer.save_pretrained(tmp)
        write_run_files(tmp, result, flat, Path(args.output_dir).name)


if __name__ == "__main__":
    sys.exit(run_cli(main))
