"""``python -m pretrain.prepare``: tokenize and pack a pretraining corpus once, for many runs and nodes.

    python -m pretrain.prepare --train_file a.txt.gz b.txt --validation_file v.txt [--model_type bert|elmo] [--nsp]
        [--tokenizer_name T | --vocab_size N] --max_seq_length 128 --output_dir P
    accelerate launch pretrain --prepared_dataset P ...      # every process memory-maps P; no tokenization

``P`` holds the blocks as ``datasets`` folders (``save_to_disk``: ``P/train``, ``P/validation``, Arrow shards of at
most ``--max_shard_size``), the tokenizer (``P/tokenizer``) and ``P/manifest.json``: the objective, the tokenizer's
hash and size, ``max_seq_length``, whether the blocks carry document boundaries (``document_boundaries``: a
``position_ids`` column, ``--document_masking``; manifests written before the key existed have none), the source
files with their sizes and SHA-256, block and token counts, the size and SHA-256 of every file of the splits
(``files``), and the library versions. ``pretrain --prepared_dataset`` refuses a manifest that does not fit the run
(another objective, tokenizer, sequence length or ``--document_masking``) and a damaged folder: every file's size is
checked at each load, its content (SHA-256) on first use and with ``--verify_prepared`` (:func:`verify_prepared`).

Memory stays bounded as the corpus grows: the tokenizer trainer reads the files as a stream, and ``datasets``
tokenizes and packs batch by batch into Arrow files on disk (intermediate files live in ``P``'s temporary folder and
are removed; nothing is left in the ``datasets`` cache). The folder appears only when complete. With ``--streaming``
a hub dataset is read as a stream (``load_dataset(..., streaming=True)``), never downloaded whole, and its blocks
are written as they come (it needs ``--tokenizer_name``; without a validation split the first
``pretrain.data.STREAMING_VALIDATION_DOCUMENTS`` documents are held out).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from core.arguments import arg, parse_arguments
from core.errors import InputError
from core.files import file_sha256
from pretrain.arguments import (
    DOCUMENT_BOUNDARIES_KEY,
    CorpusArguments,
    ModelArguments,
    ObjectiveArguments,
    PretrainArguments,
    resolve_inputs,
)
from pretrain.objectives import OBJECTIVES

logger = logging.getLogger("pretrain.prepare")

MANIFEST = "manifest.json"
FORMAT = "sesame-lm prepared pretraining dataset"
VERSION = 1


@dataclasses.dataclass(frozen=True)
class PrepareArguments:
    """Where and how ``pretrain.prepare`` writes the prepared dataset."""

    _argument_group_name: ClassVar[str] = "output"

    output_dir: str = arg(help="the prepared dataset folder to write")
    overwrite_output_dir: bool = arg(False, "replace an existing non-empty --output_dir")
    max_shard_size: str = arg("256MB", "largest Arrow shard of each split (datasets' save_to_disk)")
    seed: int = arg(42, "seed of the NSP pairing (--nsp)")


#: The argument dataclasses of ``pretrain.prepare``, in ``--help`` order.
ARGUMENTS = (ModelArguments, CorpusArguments, ObjectiveArguments, PrepareArguments)


def _sources(files) -> list[dict]:
    return [
        {"path": str(Path(f).resolve()), "bytes": Path(f).stat().st_size, "sha256": file_sha256(f)} for f in files or []
    ]


def _generate(stream):
    yield from stream


def prepare(
    model: ModelArguments, corpus: CorpusArguments, objective_args: ObjectiveArguments, output: PrepareArguments
) -> dict:
    """Write the prepared dataset to ``output.output_dir`` (see the module docstring); returns the manifest.

    Raises:
        InputError: bad input (files, tokenizer, sizes) or an existing non-empty ``--output_dir`` without
            ``--overwrite_output_dir``.
    """
    from core.files import atomic_output_dir, check_output_dir_reuse
    from pretrain import data
    from pretrain.build import get_tokenizer

    demo = corpus.demo
    objective, model, corpus = resolve_inputs(model, objective_args, corpus, demo)
    check_output_dir_reuse(output.output_dir, output.overwrite_output_dir, resuming=False, can_resume=False)
    out = Path(output.output_dir)
    with atomic_output_dir(out) as tmp:
        tokenizer = get_tokenizer(model, objective.family, corpus, tmp)
        if model.tokenizer_name or model.model_name_or_path:
            tokenizer.save_pretrained(str(tmp / "tokenizer"))
        cache = tmp / ".cache"
        raw = data.load_corpus(corpus, cache_dir=str(cache), streaming=corpus.streaming)
        tokenized = objective.family.tokenize(raw, tokenizer, corpus.preprocessing_num_workers, True)
        blocks = objective.to_blocks(tokenized, tokenizer, corpus, output.seed)
        if corpus.streaming:  # read the stream once, writing Arrow batch by batch (no full download first)
            blocks = _materialise_stream(blocks, cache)
        counts, tokens = _save_splits(blocks, tmp, output.max_shard_size)
        del raw, tokenized, blocks
        shutil.rmtree(cache, ignore_errors=True)
        shards = shard_manifest(tmp)
        manifest = _manifest(objective, corpus, output, demo, tokenizer, counts, tokens, shards)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    logger.info(
        "wrote %s: %d training and %d validation blocks of <= %d tokens (%d training tokens)",
        out,
        counts["train"],
        counts["validation"],
        corpus.max_seq_length,
        tokens["train"],
    )
    return manifest


def _manifest(
    objective,
    corpus: CorpusArguments,
    output: PrepareArguments,
    demo: bool,
    tokenizer,
    counts: dict,
    tokens: dict,
    shards,
) -> dict:
    """The ``manifest.json`` content of a prepared dataset: the objective, the tokenizer's hash and size, the
    corpus settings, the source files (size and SHA-256), the block and token counts, the split files
    (``shards``) and the library versions."""
    from pretrain import data
    from pretrain.build import tokenizer_hash

    train_files = corpus.train_file or ([] if corpus.dataset_name else data.DEFAULT_TRAIN_FILES)
    valid_files = (
        [corpus.validation_file] if corpus.validation_file else ([data.DEFAULT_VALIDATION_FILE] if demo else [])
    )
    return {
        "format": FORMAT,
        "version": VERSION,
        "objective": objective.name,
        "model_type": objective.family.name,
        "tokenizer_hash": tokenizer_hash(tokenizer),
        "tokenizer_size": len(tokenizer),
        "max_seq_length": corpus.max_seq_length,
        "sample_by": corpus.sample_by,
        "packing_batch_size": corpus.packing_batch_size,
        "validation_split_percentage": (
            None if valid_files or corpus.dataset_name else corpus.validation_split_percentage
        ),
        "nsp_seed": output.seed if objective.nsp else None,
        "streamed": bool(corpus.streaming),
        DOCUMENT_BOUNDARIES_KEY: bool(corpus.document_masking),
        "sources": {
            "train": _sources(train_files),
            "validation": _sources(valid_files),
            "dataset_name": corpus.dataset_name,
            "dataset_config_name": corpus.dataset_config_name,
        },
        "blocks": counts,
        "tokens": tokens,
        "files": shards,
        "versions": _library_versions(),
    }


def _materialise_stream(blocks, cache: Path):
    """Read the streamed ``train`` and ``validation`` blocks (``IterableDataset`` objects) once into Arrow datasets
    cached under ``cache``, batch by batch; returns them as a ``DatasetDict``."""
    from datasets import Dataset, DatasetDict

    return DatasetDict(
        {
            split: Dataset.from_generator(_generate, gen_kwargs={"stream": blocks[split]}, cache_dir=str(cache))
            for split in ("train", "validation")
        }
    )


def _save_splits(blocks, tmp: Path, max_shard_size) -> tuple[dict[str, int], dict[str, int]]:
    """Save the ``train`` and ``validation`` blocks to ``tmp/train`` and ``tmp/validation`` (Arrow shards of at most
    ``max_shard_size``).

    Returns:
        ``(counts, tokens)``: split -> number of blocks, split -> number of tokens.

    Raises:
        InputError: a split has no block.
    """
    from pretrain import data

    counts, tokens = {}, {}
    for split in ("train", "validation"):
        if len(blocks[split]) == 0:
            raise InputError(
                f"--{'train' if split == 'train' else 'validation'}_file: no {split} block after "
                "tokenisation; expected more text"
            )
        blocks[split].save_to_disk(str(tmp / split), max_shard_size=max_shard_size)
        counts[split] = len(blocks[split])
        tokens[split] = data.count_tokens(blocks[split])
    return counts, tokens


def _library_versions() -> dict[str, str]:
    """The versions of ``datasets``, ``tokenizers`` and ``transformers`` recorded in the manifest."""
    import datasets
    import tokenizers
    import transformers

    return {module.__name__: module.__version__ for module in (datasets, tokenizers, transformers)}


#: Files of a prepared folder whose content was verified, with their size and mtime then (hash-on-first-use).
VERIFIED = ".verified.json"


def shard_manifest(root: str | os.PathLike) -> dict[str, dict]:
    """``{"train/data-00000-of-00001.arrow": {"bytes": size, "sha256": hex}, ...}`` of every file of the
    ``train`` and ``validation`` folders under ``root``."""
    root = Path(root)
    return {
        f.relative_to(root).as_posix(): {"bytes": f.stat().st_size, "sha256": file_sha256(f)}
        for split in ("train", "validation")
        for f in sorted((root / split).rglob("*"))
        if f.is_file()
    }


def verify_prepared(path: str | os.PathLike, manifest: Mapping[str, Any], content: bool = False) -> None:
    """Check the files of a prepared folder against its manifest (``files``): every size, and the SHA-256 of the
    files not verified before (or of all with ``content``), before anything memory-maps them (a changed Arrow
    shard can crash the reader or train on garbage). Verified files are recorded in :data:`VERIFIED` with their
    size and mtime (when the folder is writable) and not hashed again while unchanged. A manifest without
    ``files`` (an older ``prepare``) is only warned about.

    Raises:
        InputError: a file missing, of another size, or with another SHA-256 than the manifest says.
    """
    path = Path(path)
    files = manifest.get("files")
    if not isinstance(files, dict):
        logger.warning(
            "--prepared_dataset %s: its manifest has no shard hashes (an older `pretrain.prepare`): its "
            "files cannot be verified; prepare it again to have them checked",
            path,
        )
        return
    for rel, meta in files.items():
        f = path / rel
        size = f.stat().st_size if f.is_file() else None
        if size != meta["bytes"]:
            what = (
                "missing" if size is None else f"{size} bytes, the manifest says {meta['bytes']} (truncated or changed)"
            )
            raise InputError(
                f"--prepared_dataset {path}: {rel} {what}; expected the folder as `python -m "
                "pretrain.prepare` wrote it (prepare it again)"
            )
    try:
        verified = json.loads((path / VERIFIED).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        verified = {}
    stamps = {rel: [(path / rel).stat().st_size, (path / rel).stat().st_mtime_ns] for rel in files}
    for rel, meta in files.items():
        if not content and verified.get(rel) == stamps[rel]:
            continue
        if file_sha256(path / rel) != meta["sha256"]:
            raise InputError(
                f"--prepared_dataset {path}: {rel} does not match its SHA-256 in the manifest (changed or "
                "corrupted); expected the folder as `python -m pretrain.prepare` wrote it (prepare it "
                "again)"
            )
    if stamps != verified:
        from core.files import write_text_atomic

        with contextlib.suppress(OSError):  # a read-only folder: hashed again next time
            write_text_atomic(path / VERIFIED, json.dumps(stamps) + "\n")


def read_manifest(path: str | os.PathLike) -> dict:
    """The manifest of a prepared dataset folder.

    Raises:
        InputError: no such folder, no readable manifest, or not a prepared dataset of this format version.
    """
    p = Path(path)
    f = p / MANIFEST
    if not f.is_file():
        raise InputError(
            f"--prepared_dataset {p}: no {MANIFEST}; expected a folder written by `python -m pretrain.prepare`"
        )
    try:
        manifest = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise InputError(
            f"--prepared_dataset {p}: {MANIFEST} is not readable JSON ({err}); expected a folder written by `python "
            "-m pretrain.prepare`"
        ) from err
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise InputError(
            f"--prepared_dataset {p}: format {manifest.get('format')!r} version {manifest.get('version')!r}; "
            f"expected {FORMAT!r} version {VERSION}"
        )
    return manifest


def check_manifest(plan: PretrainArguments, manifest: Mapping[str, Any]) -> None:
    """Refuse a ``--prepared_dataset`` that does not fit the run: given with other data arguments, prepared for
    another objective or block length. (The tokenizer is checked by hash in :func:`pretrain.build.get_tokenizer`.)

    Raises:
        InputError: naming the flag, what the folder holds and what the run asks for.
    """
    path, corpus = Path(plan.data.prepared_dataset), plan.corpus
    if corpus.train_file or corpus.dataset_name or corpus.validation_file:
        raise InputError(
            f"--prepared_dataset {path}: given with --train_file/--validation_file/--dataset_name; expected "
            "one source of data (the prepared folder already holds the tokenized text)"
        )
    objective = plan.objective
    prepared_for = OBJECTIVES.get(manifest["objective"])
    if manifest["objective"] != objective.name and (
        prepared_for is None or prepared_for.to_blocks is not objective.to_blocks
    ):  # rtd trains on the mlm blocks
        nsp = " --nsp" if plan.objective_args.nsp else ""
        raise InputError(
            f"--prepared_dataset {path}: prepared for the {manifest['objective']} objective; this run trains "
            f"{objective.name} (--model_type {objective.family.name}{nsp}); expected a dataset prepared "
            "with the same --model_type/--nsp (or an --objective with the same blocks)"
        )
    if corpus.max_seq_length != manifest["max_seq_length"]:
        raise InputError(
            f"--max_seq_length {corpus.max_seq_length}: --prepared_dataset {path} holds blocks of "
            f"{manifest['max_seq_length']} tokens; expected {manifest['max_seq_length']} (or leave it out)"
        )
    prepared_with = bool(manifest.get(DOCUMENT_BOUNDARIES_KEY, False))
    if bool(corpus.document_masking) != prepared_with:
        held = "carry document boundaries" if prepared_with else "carry no document boundaries (no position_ids)"
        raise InputError(
            f"--document_masking {str(bool(corpus.document_masking)).lower()}: the blocks of "
            f"--prepared_dataset {path} {held}; expected --document_masking "
            f"{str(prepared_with).lower()} (or leave it out), or prepare the data again with "
            f"`python -m pretrain.prepare ... --document_masking {str(not prepared_with).lower()}`"
        )


def load_prepared(path: str | os.PathLike, verify: bool = False) -> dict:
    """Memory-map the splits of a prepared dataset (``load_from_disk``), checked against its manifest: the files'
    sizes and hashes first (:func:`verify_prepared`; every hash with ``verify``), then the block counts.

    Returns:
        ``{"train": Dataset, "validation": Dataset, "manifest": dict}``.

    Raises:
        InputError: a damaged folder (a file truncated or changed, an unreadable split, block counts that differ from
            the manifest).
    """
    from datasets import load_from_disk

    path = Path(path)
    manifest = read_manifest(path)
    verify_prepared(path, manifest, content=verify)
    splits = {}
    for split in ("train", "validation"):
        try:
            splits[split] = load_from_disk(str(path / split))
        except Exception as err:  # noqa: BLE001 - any failure means a damaged folder
            raise InputError(
                f"--prepared_dataset {path}: the {split} split cannot be read ({type(err).__name__}: {err}); "
                "expected the folder as `python -m pretrain.prepare` wrote it"
            ) from err
        if len(splits[split]) != manifest["blocks"][split]:
            raise InputError(
                f"--prepared_dataset {path}: {len(splits[split])} {split} blocks but the manifest says "
                f"{manifest['blocks'][split]}; expected an intact folder (prepare it again)"
            )
    return {**splits, "manifest": manifest}


def main(argv: Sequence[str] | None = None) -> int:
    from core.logs import setup_logging

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    model, corpus, objective, output = parse_arguments(
        ARGUMENTS,
        argv,
        prog="python -m pretrain.prepare",
        description="Tokenize and pack a corpus once into a folder that `pretrain --prepared_dataset` memory-maps.",
    )
    setup_logging()
    prepare(model, corpus, objective, output)
    return 0


if __name__ == "__main__":
    import sys

    from core.errors import run_cli

    sys.exit(run_cli(main))
