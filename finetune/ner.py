"""``python -m finetune.ner``: fine-tune a token classifier (named-entity recognition) on CoNLL files.

Thin by design, as :mod:`finetune.glue`: the data (:mod:`finetune.ner_data`: CoNLL reading, tag schemes, windows),
one preprocessing step (words -> sub-tokens, each word's label on its first sub-token, long sentences in overlapping
windows), the Auto-loaded head (``AutoModelForTokenClassification``: SesameBert end to end, SesameElmo frozen +
ScalarMix + task BiLSTM unless ``--unfreeze_backbone``, or any transformers model), the metric (entity-level micro
precision / recall / F1 with seqeval, conlleval's chunking; token accuracy; a per-type table) and the shared loop
(:mod:`training.loop`). Argument names follow transformers' ``run_ner.py``.

Example::

    python -m finetune.ner --model_name_or_path outputs/minilm-sesame --train_file wnut17/train.conll \\
        --validation_file wnut17/dev.conll --output_dir outputs/wnut17

Outputs in ``--output_dir``: the fine-tuned model and tokenizer (``id2label`` = the training file's tags),
``all_results.json`` (``eval_f1``, ``eval_precision``, ``eval_recall``, ``eval_accuracy``, ``eval_loss``; with a
labelled ``--test_file`` and ``--do_predict`` also ``test_f1``, ``test_precision``, ``test_recall``,
``test_accuracy``), ``entity_scores.md`` (precision / recall / F1 / support per entity type of each evaluated
split), ``eval_history.json``, ``trainer_log.json``, ``curves.png``, and with ``--do_predict``
``predictions.conll``: the test file's lines as they were, each token line with the predicted tag appended.

What runs: ``--do_train``, ``--do_eval``, ``--do_predict`` as in the Hugging Face examples; none of them = train,
then evaluate. Without ``--do_train`` the model is used as it is: its ``id2label`` is the tag set.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch

from core.arguments import arg, parse_arguments, with_defaults
from core.arguments import build_parser as parser_of
from core.errors import InputError, first_line, run_cli
from finetune.arguments import (
    FinetuneModelArguments,
    finetune_run,
    finetune_training_arguments,
    logged_plan,
    start_command,
)
from finetune.ner_data import SCHEMES, ConllFile
from training.driver import RunModes
from training.hub import HubArguments

logger = logging.getLogger("finetune.ner")


@dataclasses.dataclass(frozen=True)
class NerDataArguments:
    """The CoNLL files and how they are cut into model inputs."""

    _argument_group_name: ClassVar[str] = "data"

    train_file: str | None = arg(None, "CoNLL training file: token and tag columns (tab or space separated, tag last)")
    validation_file: str | None = arg(None, "CoNLL validation file, same layout")
    test_file: str | None = arg(None, "CoNLL test file (tags optional), tagged with --do_predict")
    dataset_name: str | None = arg(
        None, "instead of files: a datasets dataset with tokens / ner_tags (a save_to_disk folder or a hub name)"
    )
    dataset_config_name: str | None = arg(None, "its configuration (hub datasets)")
    tag_scheme: str = arg(
        "auto",
        "IOB1, IOB2 or BIOES (auto: found in the training file; every file is checked against it)",
        choices=("auto", *SCHEMES),
    )
    label_all_tokens: bool = arg(
        False, "label every sub-token of a word (B- becomes I- after the first), as run_ner.py; default: first only"
    )
    max_seq_length: int = arg(128, "longest model input in tokens; longer sentences are cut into overlapping windows")
    doc_stride: int | None = arg(
        None, "overlap of consecutive windows of a long sentence, in sub-tokens (default: --max_seq_length / 4)"
    )
    max_train_samples: int | None = arg(None, "use only the first N training sentences")
    max_eval_samples: int | None = arg(None, "use only the first N sentences of the validation file")


NerRunModes = with_defaults(
    RunModes,
    name="NerRunModes",
    help=dict(
        do_train="fine-tune --model_name_or_path on --train_file",
        do_eval="evaluate on --validation_file (alone: evaluate --model_name_or_path as it is)",
        do_predict="tag --test_file and write predictions.conll (test_* scores when it has tags)",
    ),
)
NerTrainingArguments = finetune_training_arguments("ner", 3.0, 32, 64)
#: The argument dataclasses of ``finetune.ner``, in ``--help`` order.
ARGUMENTS = (FinetuneModelArguments, NerDataArguments, NerRunModes, NerTrainingArguments, HubArguments)

PROG = "python -m finetune.ner"
DESCRIPTION = "Fine-tune a token classifier (named-entity recognition) on CoNLL files; entity-level F1 with seqeval."

#: ``build_parser()``: the ``HfArgumentParser`` of ``finetune.ner`` (for ``--help`` and tests).
build_parser = functools.partial(parser_of, ARGUMENTS, prog=PROG, description=DESCRIPTION)


@dataclasses.dataclass(frozen=True)
class NerData:
    """The read files of a run (None where not given / not used), the tag scheme and the label names."""

    train: ConllFile | None
    validation: ConllFile | None
    test: ConllFile | None
    scheme: str
    label_names: list[str]


def check_arguments(data: NerDataArguments, modes: RunModes, training) -> None:
    """Refuse inconsistent arguments before anything is read.

    Raises:
        InputError: naming the flags and what is expected.
    """
    if not training.output_dir:
        raise InputError("--output_dir: required (the fine-tuned model and all_results.json go there)")
    files = data.train_file or data.validation_file or data.test_file
    if data.dataset_name and files:
        raise InputError(
            "--dataset_name and --train_file/--validation_file/--test_file: give one data source, not both"
        )
    if modes.do_train and not (data.train_file or data.dataset_name):
        raise InputError("--do_train needs --train_file (a CoNLL file) or --dataset_name")
    if modes.do_eval and not (data.validation_file or data.dataset_name):
        raise InputError("--do_eval needs --validation_file (a CoNLL file) or --dataset_name")
    if modes.do_predict and not (data.test_file or data.dataset_name):
        raise InputError("--do_predict needs --test_file (a CoNLL file) or --dataset_name")
    for name in ("max_seq_length", "max_train_samples", "max_eval_samples"):
        if getattr(data, name) is not None and getattr(data, name) < 1:
            raise InputError(f"--{name} {getattr(data, name)}: expected an integer >= 1")
    if data.doc_stride is not None and not 0 <= data.doc_stride < data.max_seq_length:
        raise InputError(f"--doc_stride {data.doc_stride}: expected 0 <= it < --max_seq_length {data.max_seq_length}")


def fine_tuned_tags(model_args: FinetuneModelArguments) -> list[str]:
    """The tags of a fine-tuned token classifier (its ``id2label``), for evaluating / predicting without training.

    Raises:
        InputError: the model has no named labels (not fine-tuned for tagging).
    """
    config = model_args.load_config()
    names = [config.id2label[i] for i in sorted(config.id2label or {})]
    if not names or all(str(n).startswith("LABEL_") for n in names):
        raise InputError(
            f"--model_name_or_path {model_args.model_name_or_path}: has no named tags (id2label); expected a model "
            "fine-tuned by finetune.ner, or pass --do_train with --train_file"
        )
    return names


def load_data(model_args, data: NerDataArguments, modes: RunModes) -> NerData:
    """Read and check every file the run uses (see :mod:`finetune.ner_data`): the training file fixes the tag scheme
    and the label set; validation and test tags must be among the labels (the model's ``id2label`` when not
    training), every file must follow the scheme.

    Raises:
        InputError: naming the file and line.
    """
    from finetune.ner_data import check_known_tags, check_scheme, conll_from_dataset, detect_scheme, read_conll

    if data.dataset_name:
        splits = load_dataset_splits(data.dataset_name, data.dataset_config_name)
        wanted = {"train": modes.do_train, "validation": modes.do_eval, "test": modes.do_predict}
        for split, needed in wanted.items():
            if needed and split not in splits:
                raise InputError(f"--dataset_name {data.dataset_name}: no {split} split (found {sorted(splits)})")
        train, validation, test = (
            conll_from_dataset(splits[s], f"{data.dataset_name}[{s}]") if wanted[s] else None
            for s in ("train", "validation", "test")
        )
    else:
        train = read_conll(data.train_file, "--train_file") if modes.do_train else None
        validation = read_conll(data.validation_file, "--validation_file") if modes.do_eval else None
        test = read_conll(data.test_file, "--test_file", allow_unlabelled=True) if modes.do_predict else None
    flags = ("--dataset_name",) * 3 if data.dataset_name else ("--train_file", "--validation_file", "--test_file")
    labelled = [(f, flag) for f, flag in zip((train, validation, test), flags) if f and f.labelled]
    if train is not None:
        label_names = sorted({t for s in train.sentences for t in s.tags})
        source = f"--train_file {train.path}"
    else:
        label_names = fine_tuned_tags(model_args)
        source = f"--model_name_or_path {model_args.model_name_or_path}"
    scheme = data.tag_scheme
    if scheme == "auto":
        scheme = detect_scheme([train] if train is not None else [f for f, _ in labelled])
    for file, flag in labelled:
        check_scheme(file, scheme, flag)
        if file is not train:
            check_known_tags(file, label_names, flag, source)
    return NerData(train, validation, test, scheme, label_names)


def load_dataset_splits(name: str, config: str | None):
    """The splits of ``--dataset_name``: a ``save_to_disk`` folder (``datasets.load_from_disk``) or a hub dataset.

    Raises:
        InputError: it cannot be loaded (offline and not cached, no such dataset), naming it.
    """
    import datasets

    try:
        if Path(name).is_dir():
            return datasets.load_from_disk(name)
        return datasets.load_dataset(name, config)
    except Exception as err:  # noqa: BLE001 - connection, cache and format errors of many kinds
        raise InputError(
            f"--dataset_name {name}: cannot be loaded ({type(err).__name__}: {first_line(err)}); "
            "expected a save_to_disk folder or a reachable hub dataset with tokens / ner_tags, or pass CoNLL files"
        ) from None


def load_model_and_tokenizer(model_args: FinetuneModelArguments, label_names: list[str], training_run: bool):
    """The tokenizer and an ``AutoModelForTokenClassification`` with the tags as its labels.

    A training run gets a new head named by the training file's tags (``--ignore_mismatched_sizes`` is implied: a
    checkpoint's old tagging head is replaced); an evaluation uses the model's head as it is.

    Raises:
        InputError: a config, tokenizer or weights that cannot be loaded.
    """
    from transformers import AutoConfig, AutoModelForTokenClassification

    source, hub = model_args.model_name_or_path, model_args.hub_kwargs()
    pretrained, tokenizer = model_args.load_config(), model_args.load_tokenizer()
    overrides: dict[str, Any] = {}
    if training_run:
        overrides = {
            "num_labels": len(label_names),
            "id2label": dict(enumerate(label_names)),
            "label2id": {n: i for i, n in enumerate(label_names)},
            "finetuning_task": "ner",
        }
    if hasattr(pretrained, "freeze_backbone"):  # SesameElmo: frozen BiLM unless --unfreeze_backbone
        overrides["freeze_backbone"] = not model_args.unfreeze_backbone
    config = AutoConfig.from_pretrained(source, **hub, **overrides)
    model = model_args.load_head(AutoModelForTokenClassification, config, logger, ignore_mismatched_sizes=training_run)
    return tokenizer, model


def entity_scores(gold: list[list[str]], predicted: list[list[str]]) -> tuple[dict[str, float], dict[str, dict]]:
    """Entity-level micro precision, recall and F1 (seqeval's default mode: conlleval's chunks, which reads IOB1,
    IOB2 and BIOES) and token accuracy, and the per-type report.

    Args:
        gold, predicted: tag sequences per sentence, the same lengths.

    Returns:
        ``({"precision", "recall", "f1", "accuracy"}, {type: {"precision", "recall", "f1-score", "support"}})``.
    """
    from seqeval.metrics import accuracy_score, classification_report, f1_score, precision_score, recall_score

    scores = {
        "precision": float(precision_score(gold, predicted, zero_division=0)),
        "recall": float(recall_score(gold, predicted, zero_division=0)),
        "f1": float(f1_score(gold, predicted, zero_division=0)),
        "accuracy": float(accuracy_score(gold, predicted)),
    }
    report = classification_report(gold, predicted, output_dict=True, zero_division=0)
    types = {k: v for k, v in report.items() if not k.endswith(" avg")}
    return scores, types


def scores_table(per_split: dict[str, dict[str, dict]]) -> str:
    """``entity_scores.md``: per split, a markdown table of precision / recall / F1 (x 100) and support by type."""
    out = []
    for split, types in per_split.items():
        out += [f"## {split}", "", "| type | precision | recall | F1 | support |", "|---|---:|---:|---:|---:|"]
        for name, row in sorted(types.items()):
            out.append(
                f"| {name} | {100 * row['precision']:.2f} | {100 * row['recall']:.2f} | {100 * row['f1-score']:.2f} "
                f"| {int(row['support'])} |"
            )
        out.append("")
    return "\n".join(out)


class _Split:
    """One file cut into model inputs: the features (a list-backed torch dataset), windows and first sub-tokens."""

    def __init__(self, file: ConllFile, tokenizer, label2id, data: NerDataArguments, limit: int | None, labelled: bool):
        from finetune.ner_data import align_windows

        self.file = file
        self.sentences = file.sentences[:limit] if limit else file.sentences
        self.features, self.windows, self.firsts = align_windows(
            tokenizer,
            self.sentences,
            label2id if labelled else None,
            data.max_seq_length,
            data.max_seq_length // 4 if data.doc_stride is None else data.doc_stride,
            data.label_all_tokens,
        )

    def __len__(self) -> int:
        return len(self.features)

    def __getitem__(self, i: int) -> dict:
        return self.features[i]


def make_collator(tokenizer, pad_to_multiple_of: int | None):
    """Pad a list of features: the tokenizer's own ``pad`` for its inputs (SesameElmo's ``char_ids`` included),
    ``labels`` with -100 to the same length."""

    def collate(features: list[dict]) -> dict:
        labels = [f["labels"] for f in features] if "labels" in features[0] else None
        inputs = [{k: v for k, v in f.items() if k != "labels"} for f in features]
        batch = tokenizer.pad(inputs, padding=True, pad_to_multiple_of=pad_to_multiple_of, return_tensors="pt")
        if labels is not None:
            width = batch["input_ids"].shape[1]
            batch["labels"] = torch.tensor([row + [-100] * (width - len(row)) for row in labels], dtype=torch.long)
        return dict(batch)

    return collate


def main(argv: Sequence[str] | None = None) -> int:
    model_args, data_args, parsed_modes, training, hub = parse_arguments(
        ARGUMENTS, argv, prog=PROG, description=DESCRIPTION
    )
    modes = parsed_modes.resolve(has_validation=bool(data_args.validation_file or data_args.dataset_name))
    check_arguments(data_args, modes, training)
    start_command(model_args, training, data_args.train_file, data_args.validation_file, logger)
    data = load_data(model_args, data_args, modes)  # every file checked before the model is loaded
    backbone = model_args.load_config()
    run, lr_source = finetune_run("ner", backbone, "eval_f1", modes, training, hub, model_args, data_args, modes)
    with run:
        accelerator = run.start()
        tokenizer, model = load_model_and_tokenizer(model_args, data.label_names, modes.do_train)
        label2id = {n: int(i) for n, i in model.config.label2id.items()}
        splits = {}
        with accelerator.main_process_first():
            if data.train is not None:
                splits["train"] = _Split(data.train, tokenizer, label2id, data_args, data_args.max_train_samples, True)
            if data.validation is not None:
                splits["eval"] = _Split(
                    data.validation, tokenizer, label2id, data_args, data_args.max_eval_samples, True
                )
            if data.test is not None:
                splits["test"] = _Split(data.test, tokenizer, label2id, data_args, None, data.test.labelled)
        return run.execute(
            ner_parts(accelerator, model, tokenizer, data, splits, data_args, run.training, modes, lr_source)
        )


def _training_inputs(accelerator, data: NerData, train, collate, data_args, training, lr_source):
    """(training loader, logged run plan, data fingerprint) of a NER run's training split ``train``."""
    import hashlib

    from training.data import fingerprint_sources, make_train_dataloader

    train_loader = make_train_dataloader(train, training.per_device_train_batch_size, collate, training.seed)
    fingerprint = fingerprint_sources(
        [data_args.train_file] if data_args.train_file else [],
        dataset_lines_sha256=None
        if data_args.train_file
        else hashlib.sha256("\n".join(train.file.lines).encode("utf-8")).hexdigest(),
        labels=data.label_names,
        max_seq_length=data_args.max_seq_length,
        doc_stride=data_args.doc_stride,
        label_all_tokens=data_args.label_all_tokens,
        max_train_samples=data_args.max_train_samples,
    )
    described = (
        f"NER ({data.scheme}, {len(data.label_names)} tags): {len(train.sentences)} training sentences in "
        f"{len(train)} windows, evaluation on {data.validation.path if data.validation else 'nothing'}"
    )
    plan = logged_plan(accelerator, training, len(train), described, lr_source, logger)
    return train_loader, plan, fingerprint


def _tagging_step(accelerator, width: int):
    """The evaluation step of a NER run for :func:`training.evaluation.gather_predictions`: per batch the (B, width)
    long predicted tag ids (-1 past the batch's length, so that batches of different lengths gather), and with labels
    the (B,) float32 sum of the token losses and the (B,) long count of scored tokens."""

    def step(model, batch):
        labels = batch.pop("labels", None)
        with accelerator.autocast():
            logits = model(**batch).logits.float()
        predicted = torch.full((logits.shape[0], width), -1, dtype=torch.long, device=logits.device)
        predicted[:, : logits.shape[1]] = logits.argmax(-1)
        out = {"predicted": predicted}
        if labels is not None:
            loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels, reduction="none")
            out["loss_sum"] = loss.sum(1)
            out["scored"] = (labels != -100).sum(1)
        return out

    return step


def ner_parts(accelerator, model, tokenizer, data: NerData, splits: dict, data_args, training, modes, lr_source):
    """The :class:`training.driver.RunParts` of a NER run: the training loader, the evaluation of the validation file
    (``eval_*`` scores, the per-type table), the tagging of the test file (``test_*`` scores when tagged) and the
    files ``entity_scores.md`` and ``predictions.conll``."""
    from finetune.ner_data import write_predictions_conll
    from training.driver import RunParts

    collate = make_collator(tokenizer, 8 if accelerator.mixed_precision != "no" else None)
    id2label = {int(i): n for i, n in model.config.id2label.items()}
    outside = next((i for i, n in id2label.items() if n == "O"), 0)
    width = -(-data_args.max_seq_length // 8) * 8  # the longest padded window (padding to a multiple of 8)
    tables: dict[str, dict] = {}
    loaders = {
        name: accelerator.prepare(
            torch.utils.data.DataLoader(
                split, collate_fn=collate, shuffle=False, batch_size=training.per_device_eval_batch_size
            )
        )
        for name, split in splits.items()
        if name != "train"
    }

    def tag_split(model, name: str) -> tuple[list[list[str]], float | None]:
        """Predicted tags per sentence of a split, and its mean loss over the scored words (None: untagged)."""
        from finetune.ner_data import word_predictions
        from training.evaluation import gather_predictions

        out = gather_predictions(accelerator, model, loaders[name], _tagging_step(accelerator, width))
        split = splits[name]
        ids = word_predictions(split.sentences, split.windows, split.firsts, out["predicted"].tolist(), outside)
        tags = [[id2label[i] for i in row] for row in ids]
        loss = float(out["loss_sum"].sum() / out["scored"].sum().clamp(min=1)) if "loss_sum" in out else None
        return tags, loss

    def score(name: str, prefix: str, tags, loss) -> dict[str, float]:
        gold = [list(s.tags) for s in splits[name].sentences]
        scores, types = entity_scores(gold, tags)
        tables[f"{prefix} ({splits[name].file.path})"] = types
        return {f"{prefix}_loss": loss, **{f"{prefix}_{k}": v for k, v in scores.items()}}

    def evaluate(model) -> dict[str, float]:
        tags, loss = tag_split(model, "eval")
        return score("eval", "eval", tags, loss)

    def predict(model):
        tags, loss = tag_split(model, "test")
        return {"tags": tags, "scores": score("test", "test", tags, loss) if data.test.labelled else {}}

    def write_outputs(folder: Path, predictions) -> None:
        if predictions is not None:
            write_predictions_conll(folder / "predictions.conll", splits["test"].file, predictions["tags"])
        if tables:
            (folder / "entity_scores.md").write_text(scores_table(tables) + "\n", encoding="utf-8")

    train_loader = plan = fingerprint = None
    if modes.do_train:
        train_loader, plan, fingerprint = _training_inputs(
            accelerator, data, splits["train"], collate, data_args, training, lr_source
        )
    return RunParts(
        model=model,
        tokenizer=tokenizer,
        train_dataloader=train_loader,
        evaluate=evaluate if "eval" in splits else None,
        predict=predict if "test" in splits else None,
        prediction_results=lambda predictions: predictions["scores"],
        write_outputs=write_outputs,
        plan=plan,
        data_fingerprint=fingerprint,
        reevaluate_best=True,
        next_step=(
            f"tag a file with it: python -m finetune.ner --model_name_or_path {training.output_dir} --do_predict "
            f"--test_file TEST.conll --output_dir {training.output_dir}-test"
            if modes.do_train and "test" not in splits
            else None
        ),
    )


if __name__ == "__main__":
    sys.exit(run_cli(main))
