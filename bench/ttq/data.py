"""The shared data: the tokenizer, the prepared datasets, the reference's ``group_texts`` blocks and the fixed
masked held-out set (items 1 and 2 of the package docstring)."""

from __future__ import annotations

import hashlib
import itertools
import json
import sys
from pathlib import Path

import numpy as np

from .common import Job, cached, file_sha256, log, run_jobs
from .recipes import data_variant, variant_flags

HELDOUT_FILE, HELDOUT_INFO = "heldout.safetensors", "heldout.json"


def prepare_command(args, tok: Path, length: int, *flags: str) -> list[str]:
    """The ``python -m pretrain.prepare`` command of ``args.train_file`` (and ``args.validation_file``) tokenized by
    ``tok`` into blocks of ``length`` tokens, then ``flags``; it ends with ``--output_dir``, whose folder the caller
    adds."""
    files = ["--train_file", *args.train_file, "--validation_file", args.validation_file]
    blocks = ["--tokenizer_name", str(tok), "--max_seq_length", str(length)]
    return [sys.executable, "-m", "pretrain.prepare", *files, *blocks, *flags, "--output_dir"]


def tokenizer_command(model_type: str, files: list[str], vocab_size: int, folder: Path) -> list[str]:
    """The ``python -m tokenizer train`` command (this interpreter) that trains ``model_type``'s tokenizer on the text
    ``files`` with ``vocab_size`` entries into ``folder``; an argv list."""
    return [
        sys.executable,
        "-m",
        "tokenizer",
        "train",
        "--model_type",
        model_type,
        "--train_file",
        *files,
        "--vocab_size",
        str(vocab_size),
        "--output_dir",
        str(folder),
    ]


def prepare_shared_data(args, out: Path) -> dict:
    """Tokenizer, prepared datasets (one per :func:`data_variant` of the recipes) and reference blocks in ``out``
    (cached); returns their paths and the sources."""
    sources = {
        "train": [(str(Path(f).resolve()), file_sha256(f)) for f in args.train_file],
        "validation": (str(Path(args.validation_file).resolve()), file_sha256(args.validation_file)),
    }
    workers = args.preprocessing_num_workers
    tok_stamp = {"train": sources["train"], "vocab_size": args.vocab_size}
    tok = cached(
        out / "tokenizer",
        tok_stamp,
        lambda d: run_jobs(
            [
                Job(
                    "tokenizer",
                    tokenizer_command("bert", args.train_file, args.vocab_size, d),
                    out / "logs" / "tokenizer.log",
                    tokenizer_env(workers),
                )
            ],
            1,
        ),
    )
    tok_sha = file_sha256(tok / "tokenizer.json")
    prep_stamp = {**sources, "tokenizer": tok_sha, "max_seq_length": args.max_seq_length}
    variants = {}
    # pretrain.prepare packs per map batch: its processes' shards move a few batch edges, so the blocks depend on N
    workers_flags = ["--preprocessing_num_workers", str(workers)] if workers > 1 else []
    for name in sorted({"prepared", *(data_variant(f) for f in args.recipe_table.values())}):
        extra = variant_flags(name)
        command = prepare_command(args, tok, args.max_seq_length, *extra, *workers_flags)
        folder = cached(
            out / name,
            {**prep_stamp, "flags": extra + workers_flags},
            lambda d, command=command, name=name: run_jobs(
                [Job("prepare", [*command, str(d)], out / "logs" / f"{name}.log")], 1
            ),
        )
        variants[name] = {
            "path": folder,
            "manifest": json.loads((folder / "manifest.json").read_text(encoding="utf-8")),
        }
    ref_blocks = cached(
        out / "reference_blocks",
        prep_stamp,
        lambda d: build_reference_blocks(args.train_file, tok, args.max_seq_length, d, workers),
    )
    return {
        "tokenizer": tok,
        "tokenizer_sha256": tok_sha,
        "prepared": variants["prepared"]["path"],
        "manifest": variants["prepared"]["manifest"],
        "variants": variants,
        "reference_blocks": ref_blocks,
        "sources": sources,
    }


def tokenizer_env(workers: int) -> dict[str, str]:
    """Environment of the ``python -m tokenizer train`` child: the Rust trainer's threads (``RAYON_NUM_THREADS``) =
    ``workers``, its parallelism on when ``workers`` > 1 (the bench turns it off for itself)."""
    return {"TOKENIZERS_PARALLELISM": "true" if workers > 1 else "false", "RAYON_NUM_THREADS": str(workers)}


def load_documents(files: list[str], num_proc: int | None = None):
    """The documents of text files (blank-line separated; ``datasets``' text loader with ``sample_by="paragraph"``,
    stripped, empty ones dropped) as a ``datasets.Dataset`` with a ``text`` column, in file order (``num_proc``
    processes for the strip and the filter: the same rows in the same order)."""
    from datasets import load_dataset

    num_proc = num_proc if num_proc and num_proc > 1 else None
    ds = load_dataset("text", data_files={"train": list(files)}, sample_by="paragraph")["train"]
    ds = ds.map(lambda b: {"text": [t.strip() for t in b["text"]]}, batched=True, num_proc=num_proc)
    return ds.filter(lambda b: [bool(t) for t in b["text"]], batched=True, num_proc=num_proc)


def group_texts(batch: dict[str, list[list[int]]], block_size: int) -> dict[str, list[list[int]]]:
    """run_mlm's ``group_texts``: concatenate every column of a map batch and cut it into ``block_size`` pieces,
    dropping the remainder (kept whole when the batch holds less than one block)."""
    joined = {k: list(itertools.chain.from_iterable(v)) for k, v in batch.items()}
    total = len(next(iter(joined.values())))
    if total >= block_size:
        total = total // block_size * block_size
    return {k: [v[i : i + block_size] for i in range(0, total, block_size)] for k, v in joined.items()}


def _tokenize_documents(batch: dict, tokenizer) -> dict:
    """One map batch of :func:`build_reference_blocks`: the documents with the special tokens and their mask."""
    return tokenizer(batch["text"], return_special_tokens_mask=True)


def build_reference_blocks(
    files: list[str], tokenizer_dir: Path, block_size: int, folder: Path, num_proc: int | None = None
) -> None:
    """The reference's training blocks (run_mlm without ``--line_by_line``): documents tokenized with the special
    tokens and ``special_tokens_mask`` (``num_proc`` processes: a document's tokens do not depend on its batch),
    grouped by :func:`group_texts` per map batch of 1,000 in one process (processes would move the batch edges, and
    with them the dropped remainders); ``save_to_disk``. The blocks are the same for every ``num_proc``."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    # "sequence length is longer than the specified maximum": documents, not inputs (this logger only: transformers'
    # global verbosity stays, so that a process that goes on loading models still hears of missing weights)
    hf_logging.get_logger("transformers.tokenization_utils_base").setLevel(hf_logging.ERROR)
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    num_proc = num_proc if num_proc and num_proc > 1 else None
    docs = load_documents(files, num_proc)
    enc = docs.map(
        _tokenize_documents,
        batched=True,
        remove_columns=["text"],
        fn_kwargs={"tokenizer": tok},
        num_proc=num_proc,
    )
    enc.map(group_texts, batched=True, batch_size=1000, fn_kwargs={"block_size": block_size}).save_to_disk(str(folder))


def heldout_blocks(documents: list[str], tokenizer, max_len: int) -> list[list[int]]:
    """Every document cut into chunks of ``max_len - 2`` tokens (the last one shorter), each as
    ``[CLS] chunk [SEP]``: lists of token ids, document order; no block spans two documents."""
    blocks = []
    width = max_len - 2
    for ids in tokenizer(list(documents), add_special_tokens=False)["input_ids"]:
        for i in range(0, len(ids), width):
            blocks.append([tokenizer.cls_token_id, *ids[i : i + width], tokenizer.sep_token_id])
    return blocks


def mask_heldout(blocks: list[list[int]], tokenizer, seed: int, mlm_probability: float = 0.15) -> dict:
    """Mask ``blocks`` once with transformers' ``DataCollatorForLanguageModeling`` (``seed``: its own generator),
    one block per call, in order.

    Returns:
        ``{"input_ids": (N,) int64, "labels": (N,) int64 (-100 where not masked), "lengths": (n_blocks,) int64}``:
        the blocks concatenated (N tokens).
    """
    import torch
    from transformers import DataCollatorForLanguageModeling

    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=mlm_probability, seed=seed)
    ids, labels = [], []
    for block in blocks:
        special = tokenizer.get_special_tokens_mask(block, already_has_special_tokens=True)
        batch = collator([{"input_ids": block, "special_tokens_mask": special}])
        ids.append(batch["input_ids"][0])
        labels.append(batch["labels"][0])
    return {
        "input_ids": torch.cat(ids).long(),
        "labels": torch.cat(labels).long(),
        "lengths": torch.tensor([len(b) for b in blocks], dtype=torch.long),
    }


def heldout_sha256(heldout: dict) -> str:
    """SHA-256 of ``input_ids``, ``labels`` and ``lengths`` as little-endian int64, in that order."""
    h = hashlib.sha256()
    for key in ("input_ids", "labels", "lengths"):
        h.update(np.ascontiguousarray(heldout[key].numpy().astype("<i8")).tobytes())
    return h.hexdigest()


def build_heldout(args, out: Path, data: dict) -> tuple[dict, dict]:
    """The fixed held-out set in ``out`` (reused when built with the same tokenizer, file and settings)."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    settings = {
        "validation": data["sources"]["validation"],
        "tokenizer": data["tokenizer_sha256"],
        "max_seq_length": args.max_seq_length,
        "seed": args.heldout_seed,
        "mlm_probability": 0.15,
        "mask_replace_prob": 0.8,
        "random_replace_prob": 0.1,
        "max_blocks": args.max_heldout_blocks,
    }
    settings = json.loads(json.dumps(settings))  # tuples as lists, as read back
    info_path = out / HELDOUT_INFO
    if info_path.is_file() and (out / HELDOUT_FILE).is_file():
        info = json.loads(info_path.read_text(encoding="utf-8"))
        heldout = load_file(str(out / HELDOUT_FILE))
        if info.get("settings") == settings and heldout_sha256(heldout) == info.get("sha256"):
            log(f"reusing {out / HELDOUT_FILE}")
            return heldout, info
    # "sequence length is longer than the specified maximum": documents, not inputs (this logger only: transformers'
    # global verbosity stays, so that a process that goes on loading models still hears of missing weights)
    hf_logging.get_logger("transformers.tokenization_utils_base").setLevel(hf_logging.ERROR)
    tok = AutoTokenizer.from_pretrained(str(data["tokenizer"]))
    blocks = heldout_blocks(list(load_documents([args.validation_file])["text"]), tok, args.max_seq_length)
    heldout = mask_heldout(blocks[: args.max_heldout_blocks], tok, args.heldout_seed)
    save_file(heldout, str(out / HELDOUT_FILE))
    info = {
        "settings": settings,
        "sha256": heldout_sha256(heldout),
        "blocks": len(heldout["lengths"]),
        "tokens": int(heldout["lengths"].sum()),
        "masked": int((heldout["labels"] != -100).sum()),
    }
    info_path.write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
    return heldout, info
