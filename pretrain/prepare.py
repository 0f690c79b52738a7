"""``python -m pretrain.prepare``: tokenize and pack a pretraining corpus once, for many runs and nodes.

    python -m pretrain.prepare --train_file a.txt.gz b.txt --validation_file v.txt [--model_type bert|elmo] [--nsp]
        [--tokenizer_name T | --vocab_size N] --max_seq_length 128 --output_dir P
    accelerate launch pretrain --prepared_dataset P ...      # every process memory-maps P; no tokenization

``P`` holds the blocks as ``datasets`` folders (``save_to_disk``: ``P/train``, ``P/validation``, Arrow shards of at
most ``--max_shard_size``), the tokenizer (``P/tokenizer``) and ``P/manifest.json``: the objective, the tokenizer's
hash and size, ``max_seq_length``, the source files with their sizes and SHA-256, block and token counts, and the
library versions. ``pretrain --prepared_dataset`` refuses a manifest that does not fit the run (another objective,
tokenizer or sequence length).

Memory stays bounded as the corpus grows: the tokenizer trainer reads the files as a stream, and ``datasets``
tokenizes and packs batch by batch into Arrow files on disk (intermediate files live in ``P``'s temporary folder and
are removed; nothing is left in the ``datasets`` cache). The folder appears only when complete. With ``--streaming``
a hub dataset is read as a stream (``load_dataset(..., streaming=True)``), never downloaded whole, and its blocks
are written as they come (it needs ``--tokenizer_name``; without a validation split the first
``pretrain.data.STREAMING_VALIDATION_DOCUMENTS`` documents are held out).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import types
from collections.abc import Sequence
from pathlib import Path

from training.errors import InputError, add_debug_argument

logger = logging.getLogger("pretrain.prepare")

MANIFEST = "manifest.json"
FORMAT = "sesame-lm prepared pretraining dataset"
VERSION = 1


def build_parser() -> argparse.ArgumentParser:
    from pretrain.cli import add_data_arguments, add_model_arguments, add_objective_arguments
    from training.run import HelpFormatter

    parser = argparse.ArgumentParser(prog="python -m pretrain.prepare", formatter_class=HelpFormatter,
                                     description="Tokenize and pack a corpus once into a folder that `pretrain --prepared_dataset` memory-maps.")
    add_model_arguments(parser)
    add_data_arguments(parser)
    add_objective_arguments(parser)
    g = parser.add_argument_group("output")
    g.add_argument("--output_dir", required=True, help="the prepared dataset folder to write")
    g.add_argument("--overwrite_output_dir", action="store_true", help="replace an existing non-empty --output_dir")
    g.add_argument("--max_shard_size", default="256MB", help="largest Arrow shard of each split (datasets' save_to_disk)")
    g.add_argument("--seed", type=int, default=42, help="seed of the NSP pairing (--nsp)")
    add_debug_argument(parser)
    for action in parser._actions:  # arguments of training runs only
        if action.dest in ("prepared_dataset", "max_train_samples", "max_eval_samples", "dataloader_num_workers",
                           "mlm_probability", "mask_replace_prob", "random_replace_prob", "whole_word_mask"):
            action.help = argparse.SUPPRESS
    return parser


def file_sha256(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """SHA-256 hex digest of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _sources(files) -> list[dict]:
    return [{"path": str(Path(f).resolve()), "bytes": Path(f).stat().st_size, "sha256": file_sha256(f)} for f in files or []]


def _generate(stream):
    yield from stream


class _OneProcess:
    """The little of an ``Accelerator`` that :func:`pretrain.cli.get_tokenizer` uses, for a single process."""

    is_main_process = True

    def wait_for_everyone(self) -> None:
        pass


def prepare(args: argparse.Namespace) -> dict:
    """Write the prepared dataset of ``args`` to ``args.output_dir`` (see the module docstring); returns the manifest.

    Raises:
        InputError: bad input (files, tokenizer, sizes) or an existing non-empty ``--output_dir`` without
            ``--overwrite_output_dir``.
    """
    import datasets
    import tokenizers
    import transformers

    from pretrain import data
    from pretrain.cli import apply_defaults, get_tokenizer, is_demo
    from pretrain.objectives import get_objective
    from tokenizer.corpus import atomic_output_dir
    from training.run import check_output_dir_reuse

    objective = get_objective(args)
    args.prepared_dataset = None
    args.num_train_epochs = 1.0
    for name in ("learning_rate", "max_train_steps", "num_warmup_steps", "warmup_ratio", "eval_steps", "weight_decay",
                 "per_device_train_batch_size"):
        setattr(args, name, getattr(args, name, None))
    args.per_device_eval_batch_size = 1
    args.max_train_samples = args.max_eval_samples = None
    demo = is_demo(args)
    apply_defaults(args, objective)
    check_output_dir_reuse(args.output_dir, args.overwrite_output_dir, resuming=False)
    out = Path(args.output_dir)
    with atomic_output_dir(out) as tmp:
        run_args = types.SimpleNamespace(**{**vars(args), "output_dir": str(tmp), "resume_from_checkpoint": None})
        tokenizer = get_tokenizer(run_args, objective, _OneProcess())
        if args.tokenizer_name or args.model_name_or_path:
            tokenizer.save_pretrained(str(tmp / "tokenizer"))
        cache = tmp / ".cache"
        raw = data.load_raw_datasets(args.train_file, args.validation_file, args.dataset_name, args.dataset_config_name,
                                     args.text_column_name, args.validation_split_percentage, args.sample_by,
                                     cache_dir=str(cache), streaming=args.streaming)
        tokenized = objective.tokenize(raw, tokenizer, args.preprocessing_num_workers, True)
        blocks = objective.to_blocks(tokenized, tokenizer, args)
        if args.streaming:  # read the stream once, writing Arrow batch by batch (no full download first)
            from datasets import Dataset, DatasetDict

            blocks = DatasetDict({split: Dataset.from_generator(_generate, gen_kwargs={"stream": blocks[split]},
                                                                cache_dir=str(cache)) for split in ("train", "validation")})
        counts, tokens = {}, {}
        for split in ("train", "validation"):
            if len(blocks[split]) == 0:
                raise InputError(f"--{'train' if split == 'train' else 'validation'}_file: no {split} block after tokenisation; expected more text")
            blocks[split].save_to_disk(str(tmp / split), max_shard_size=args.max_shard_size)
            counts[split] = len(blocks[split])
            tokens[split] = data.count_tokens(blocks[split])
        del raw, tokenized, blocks
        shutil.rmtree(cache, ignore_errors=True)
        from pretrain.cli import tokenizer_hash

        train_files = args.train_file or ([] if args.dataset_name else data.DEFAULT_TRAIN_FILES)
        valid_files = [args.validation_file] if args.validation_file else ([data.DEFAULT_VALIDATION_FILE] if demo else [])
        manifest = {
            "format": FORMAT, "version": VERSION, "objective": objective.name, "model_type": objective.model_type,
            "tokenizer_hash": tokenizer_hash(tokenizer), "tokenizer_size": len(tokenizer),
            "max_seq_length": args.max_seq_length, "sample_by": args.sample_by, "packing_batch_size": args.packing_batch_size,
            "validation_split_percentage": None if valid_files or args.dataset_name else args.validation_split_percentage,
            "nsp_seed": args.seed if objective.name == "mlm+nsp" else None, "streamed": bool(args.streaming),
            "sources": {"train": _sources(train_files), "validation": _sources(valid_files),
                        "dataset_name": args.dataset_name, "dataset_config_name": args.dataset_config_name},
            "blocks": counts, "tokens": tokens,
            "versions": {"datasets": datasets.__version__, "tokenizers": tokenizers.__version__, "transformers": transformers.__version__},
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    logger.info("wrote %s: %d training and %d validation blocks of <= %d tokens (%d training tokens)", out,
                counts["train"], counts["validation"], args.max_seq_length, tokens["train"])
    return manifest


def read_manifest(path: str | os.PathLike) -> dict:
    """The manifest of a prepared dataset folder.

    Raises:
        InputError: no such folder, no readable manifest, or not a prepared dataset of this format version.
    """
    p = Path(path)
    f = p / MANIFEST
    if not f.is_file():
        raise InputError(f"--prepared_dataset {p}: no {MANIFEST}; expected a folder written by `python -m pretrain.prepare`")
    try:
        manifest = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise InputError(f"--prepared_dataset {p}: {MANIFEST} is not readable JSON ({err}); expected a folder written by `python -m pretrain.prepare`") from err
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise InputError(f"--prepared_dataset {p}: format {manifest.get('format')!r} version {manifest.get('version')!r}; expected {FORMAT!r} version {VERSION}")
    return manifest


def load_prepared(args: argparse.Namespace, objective) -> dict:
    """Check ``--prepared_dataset``'s manifest against the run and memory-map its splits (``load_from_disk``).

    Sets ``args.max_seq_length`` from the manifest when not given. The tokenizer is checked in
    :func:`pretrain.cli.get_tokenizer` (by hash).

    Returns:
        ``{"train": Dataset, "validation": Dataset, "manifest": dict}``.

    Raises:
        InputError: data arguments given as well, another objective or sequence length, or a damaged folder.
    """
    from datasets import load_from_disk

    path = Path(args.prepared_dataset)
    if args.train_file or args.dataset_name or args.validation_file:
        raise InputError(f"--prepared_dataset {path}: given with --train_file/--validation_file/--dataset_name; expected one "
                         "source of data (the prepared folder already holds the tokenized text)")
    manifest = read_manifest(path)
    if manifest["objective"] != objective.name:
        raise InputError(f"--prepared_dataset {path}: prepared for the {manifest['objective']} objective; this run trains "
                         f"{objective.name} (--model_type {args.model_type}{' --nsp' if getattr(args, 'nsp', False) else ''}); "
                         "expected a dataset prepared with the same --model_type/--nsp")
    if args.max_seq_length is not None and args.max_seq_length != manifest["max_seq_length"]:
        raise InputError(f"--max_seq_length {args.max_seq_length}: --prepared_dataset {path} holds blocks of "
                         f"{manifest['max_seq_length']} tokens; expected {manifest['max_seq_length']} (or leave it out)")
    args.max_seq_length = manifest["max_seq_length"]
    splits = {}
    for split in ("train", "validation"):
        try:
            splits[split] = load_from_disk(str(path / split))
        except Exception as err:  # noqa: BLE001 - any failure means a damaged folder
            raise InputError(f"--prepared_dataset {path}: the {split} split cannot be read ({type(err).__name__}: {err}); "
                             "expected the folder as `python -m pretrain.prepare` wrote it") from err
        if len(splits[split]) != manifest["blocks"][split]:
            raise InputError(f"--prepared_dataset {path}: {len(splits[split])} {split} blocks but the manifest says "
                             f"{manifest['blocks'][split]}; expected an intact folder (prepare it again)")
    return {**splits, "manifest": manifest}


def main(argv: Sequence[str] | None = None) -> int:
    from training.run import setup_logging

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = build_parser().parse_args(argv)
    setup_logging()
    prepare(args)
    return 0


if __name__ == "__main__":
    import sys

    from training.errors import run_cli

    sys.exit(run_cli(main))
