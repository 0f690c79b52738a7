"""Pretraining data: corpus → documents → tokens (``datasets.map``) → packed blocks.

* :func:`load_raw_datasets`: local ``.txt``/``.txt.gz`` files (one document per blank-line-separated block,
  ``load_dataset("text", sample_by="paragraph")``), a hub dataset (``--dataset_name``), or the corpus bundled in
  ``pretrain/corpus/``; a ``train`` and a ``validation`` split.
* :func:`tokenize_bert` / :func:`tokenize_elmo`: batched, cached ``map`` (``--preprocessing_num_workers``).
  BERT-like: per document its WordPiece ids, a **word-start flag** per token (from the fast tokenizer's
  ``word_ids``, so whole-word masking still knows the words after packing) and the token offsets where its
  lines (paragraphs, the NSP segments) end. ELMo-style: per document its word ids and word strings (the
  characters of out-of-vocabulary words reach the char-CNN), each line wrapped in ``<S>`` ... ``</S>``.
* :func:`pack_blocks` (MLM and BiLM): the documents of a map batch are concatenated (BERT: separated by
  ``[SEP]``) and cut into blocks of exactly ``max_seq_length`` (BERT: ``[CLS]`` + ``max_seq_length - 1``
  tokens); no token is dropped, only the last block of each map batch (``--packing_batch_size`` documents) can
  be shorter, so practically no compute is spent on padding.
* :func:`make_nsp_pairs`: BERT's sentence-pair blocks (Devlin et al. 2019, sec. 3.1 task 2, and Google's
  ``create_pretraining_data.py``): ``[CLS] A [SEP] B [SEP]`` filled up to ``max_seq_length`` from consecutive
  segments, B the actual continuation of A (IsNext, label 0) or, with probability 0.5, a span of a random other
  document (NotNext, label 1; the unused segments are put back). Truncation removes tokens from the front of A
  or the back of B only, so an IsNext A+B stays a contiguous span of its document.
"""

from __future__ import annotations

import functools
import logging
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from core.errors import InputError

CORPUS_DIR = Path(__file__).resolve().parent / "corpus"
DEFAULT_TRAIN_FILES = [str(CORPUS_DIR / "train.txt.gz")]
DEFAULT_VALIDATION_FILE = str(CORPUS_DIR / "validation.txt.gz")

logger = logging.getLogger("pretrain")


# -- raw text ------------------------------------------------------------------------------------------------
def load_raw_datasets(
    train_files: list[str] | None,
    validation_file: str | None,
    dataset_name: str | None = None,
    dataset_config_name: str | None = None,
    text_column_name: str = "text",
    validation_split_percentage: int = 5,
    sample_by: str = "paragraph",
    cache_dir: str | None = None,
    streaming: bool = False,
):
    """A ``DatasetDict`` with ``train`` and ``validation`` splits of raw text in the column ``text``.

    Args:
        train_files: ``.txt``/``.txt.gz`` files; ``None`` (and no ``dataset_name``): the bundled corpus.
        validation_file: a file; ``None``: the bundled validation file for the bundled corpus, else the last
            ``validation_split_percentage`` % of the training documents.
        dataset_name / dataset_config_name: a hub dataset (``load_dataset(name, config)``) instead of files.
        text_column_name: the text column of a hub dataset.
        sample_by: ``paragraph`` (one example per blank-line-separated document, the corpus format) or ``line``.
        streaming: return an ``IterableDatasetDict`` read lazily (``load_dataset(..., streaming=True)``: a hub
            dataset is not downloaded whole); without a validation split/file, the first
            :data:`STREAMING_VALIDATION_DOCUMENTS` documents are held out (a stream has no length to take a share of),
            or, from a stream of no more documents than that, ``validation_split_percentage`` % of them (at least
            one; :func:`stream_held_out`).

    Raises:
        InputError: a file is missing/empty/not text (see ``tokenizer.corpus.check_text_files``), the dataset
            has no ``text_column_name`` column, a split is empty, or a stream without a validation split has fewer
            than two documents.
    """
    if not 0 < validation_split_percentage < 100:
        raise InputError(f"--validation_split_percentage {validation_split_percentage}: expected 1..99")
    if streaming:
        return _load_stream(
            train_files,
            validation_file,
            dataset_name,
            dataset_config_name,
            text_column_name,
            sample_by,
            validation_split_percentage,
        )
    if dataset_name:
        return _load_hub_dataset(
            dataset_name, dataset_config_name, text_column_name, validation_split_percentage, cache_dir
        )
    return _load_text_files(train_files, validation_file, validation_split_percentage, sample_by, cache_dir)


def load_corpus(corpus, cache_dir: str | None = None, streaming: bool = False):
    """:func:`load_raw_datasets` of the corpus flags (``pretrain`` / ``pretrain.prepare``: ``corpus`` is a
    ``pretrain.arguments.CorpusArguments``)."""
    return load_raw_datasets(
        corpus.train_file,
        corpus.validation_file,
        corpus.dataset_name,
        corpus.dataset_config_name,
        corpus.text_column_name,
        corpus.validation_split_percentage,
        corpus.sample_by,
        cache_dir=cache_dir,
        streaming=streaming,
    )


def _load_hub_dataset(dataset_name, dataset_config_name, text_column_name, validation_split_percentage, cache_dir):
    """:func:`load_raw_datasets` of a hub dataset: its text column as ``text``, a validation split made when
    missing."""
    from datasets import DatasetDict, load_dataset

    try:
        raw = load_dataset(dataset_name, dataset_config_name, cache_dir=cache_dir)
    except Exception as err:  # noqa: BLE001 - any failure to load is a refusal of the name
        raise InputError(f"--dataset_name {dataset_name}: could not be loaded ({type(err).__name__}: {err})") from err
    if "train" not in raw:
        raise InputError(f"--dataset_name {dataset_name}: no 'train' split (found {', '.join(raw)})")
    if text_column_name not in raw["train"].column_names:
        raise InputError(
            f"--text_column_name {text_column_name}: not a column of {dataset_name} (columns: "
            f"{', '.join(raw['train'].column_names)})"
        )
    raw = DatasetDict(
        {
            k: v.select_columns([text_column_name]).rename_column(text_column_name, "text")
            if text_column_name != "text"
            else v.select_columns(["text"])
            for k, v in raw.items()
        }
    )
    if "validation" not in raw:
        raw = _split_validation(raw["train"], validation_split_percentage)
    return DatasetDict({"train": raw["train"], "validation": raw["validation"]})


def _load_text_files(train_files, validation_file, validation_split_percentage, sample_by, cache_dir):
    """:func:`load_raw_datasets` of ``.txt`` / ``.txt.gz`` files (the bundled corpus without any): non-empty
    documents (or lines), a validation split made when no validation file is given."""
    from datasets import load_dataset

    from tokenizer.corpus import check_text_files

    if sample_by not in ("paragraph", "line"):
        raise InputError(f"--sample_by {sample_by!r}: expected 'paragraph' (documents) or 'line'")
    bundled = not train_files
    train_files = [str(p) for p in check_text_files(train_files or DEFAULT_TRAIN_FILES, "--train_file")]
    if validation_file is None and bundled:
        validation_file = DEFAULT_VALIDATION_FILE
    data_files: dict[str, Any] = {"train": train_files}
    if validation_file is not None:
        data_files["validation"] = [str(p) for p in check_text_files([validation_file], "--validation_file")]
    try:
        raw = load_dataset("text", data_files=data_files, sample_by=sample_by, cache_dir=cache_dir)
    except Exception as err:  # noqa: BLE001 - find the file and line that are not UTF-8 or not gzip, else re-raise
        from tokenizer.corpus import iter_text_lines

        for split, files in data_files.items():  # only on this error path: a streaming pass names the file
            for _ in iter_text_lines(files, arg_name="--train_file" if split == "train" else "--validation_file"):
                pass
        cause = err
        while cause is not None and not isinstance(cause, UnicodeDecodeError):
            cause = cause.__cause__ or cause.__context__
        if cause is None:
            raise
        raise InputError(
            f"--train_file / --validation_file: not valid UTF-8 text ({cause.reason} at byte {cause.start}); "
            "expected UTF-8 .txt / .txt.gz files"
        ) from None
    raw = raw.filter(lambda b: [bool(t.strip()) for t in b["text"]], batched=True)
    if "validation" not in raw:
        raw = _split_validation(raw["train"], validation_split_percentage)
    for name, what in (("train", "--train_file"), ("validation", "--validation_file")):
        if len(raw[name]) == 0:
            raise InputError(f"{what}: no text in the {name} split; expected at least one non-empty document")
    return raw


#: Documents held out for validation from the head of a stream that has no validation split.
STREAMING_VALIDATION_DOCUMENTS = 200


def stream_held_out(stream, percentage: int, source: str) -> int:
    """How many documents to hold out for validation from the head of ``stream`` (a ``datasets.IterableDataset`` of
    non-empty documents without a validation split): :data:`STREAMING_VALIDATION_DOCUMENTS`, or, when the stream
    holds no more than that (counted by reading its first documents), ``percentage`` % of them, at least one, as
    a file that is not streamed (else every document would be held out and training would get none).

    Raises:
        InputError: ``source`` (the flag and value) gives fewer than two documents.
    """
    count = sum(1 for _ in stream.take(STREAMING_VALIDATION_DOCUMENTS + 1))
    if count > STREAMING_VALIDATION_DOCUMENTS:
        return STREAMING_VALIDATION_DOCUMENTS
    if count < 2:
        raise InputError(
            f"--streaming: {source} holds {count} document(s), too few to hold one out for validation; expected "
            "--validation_file or at least two documents (separated by a blank line)"
        )
    held = max(1, count * percentage // 100)
    logger.info(
        "--streaming: %s holds %d documents, no more than the %d a stream holds out: %d (%d%%) held out for validation",
        source,
        count,
        STREAMING_VALIDATION_DOCUMENTS,
        held,
        percentage,
    )
    return held


def _load_stream(train_files, validation_file, dataset_name, config_name, text_column_name, sample_by, percentage=5):
    """The streaming branch of :func:`load_raw_datasets` (``IterableDatasetDict`` with ``train``/``validation``;
    ``percentage``: ``validation_split_percentage``)."""
    from datasets import IterableDatasetDict, load_dataset

    from tokenizer.corpus import check_text_files

    try:
        if dataset_name:
            raw = load_dataset(dataset_name, config_name, streaming=True)
        else:
            files = {"train": [str(p) for p in check_text_files(train_files or DEFAULT_TRAIN_FILES, "--train_file")]}
            if validation_file:
                files["validation"] = [str(p) for p in check_text_files([validation_file], "--validation_file")]
            raw = load_dataset("text", data_files=files, sample_by=sample_by, streaming=True)
    except InputError:
        raise
    except Exception as err:  # noqa: BLE001 - any failure to open the stream is a refusal of the name
        raise InputError(f"--dataset_name {dataset_name}: could not be streamed ({type(err).__name__}: {err})") from err
    if "train" not in raw:
        raise InputError(f"--dataset_name {dataset_name}: no 'train' split (found {', '.join(raw)})")
    columns = raw["train"].column_names
    if columns is not None and text_column_name not in columns:
        raise InputError(
            f"--text_column_name {text_column_name}: not a column of {dataset_name} (columns: {', '.join(columns)})"
        )
    raw = IterableDatasetDict({k: v.select_columns([text_column_name]) for k, v in raw.items()})
    if text_column_name != "text":
        raw = IterableDatasetDict({k: v.rename_column(text_column_name, "text") for k, v in raw.items()})
    raw = raw.filter(lambda b: [bool(t and t.strip()) for t in b["text"]], batched=True)
    if "validation" not in raw:
        source = f"--dataset_name {dataset_name}" if dataset_name else f"--train_file {' '.join(files['train'])}"
        held = stream_held_out(raw["train"], percentage, source)
        raw = IterableDatasetDict({"train": raw["train"].skip(held), "validation": raw["train"].take(held)})
    return IterableDatasetDict({"train": raw["train"], "validation": raw["validation"]})


def _split_validation(train, percentage: int):
    """The last ``percentage`` % of the documents as the validation split, with fingerprints derived from the
    source's (``train_test_split`` otherwise draws random ones, and every run and rank would tokenize the corpus
    again into new cache files)."""
    import hashlib

    from datasets import DatasetDict

    key = f"{train._fingerprint}-holdout-{percentage}"
    fp = {name: hashlib.sha256(f"{key}-{name}".encode()).hexdigest()[:16] for name in ("train", "test")}
    split = train.train_test_split(
        test_size=percentage / 100, shuffle=False, train_new_fingerprint=fp["train"], test_new_fingerprint=fp["test"]
    )
    return DatasetDict({"train": split["train"], "validation": split["test"]})


def _is_stream(ds) -> bool:
    from datasets import IterableDataset, IterableDatasetDict

    return isinstance(ds, (IterableDataset, IterableDatasetDict))


def _columns(dsd) -> list[str]:
    """Column names of the ``train`` split; for a stream whose features are unknown after a ``map``, the keys of
    its first example."""
    names = dsd["train"].column_names
    if names is None:
        names = list(next(iter(dsd["train"])).keys())
    return list(names)


def _map(dsd, fn, key: str, desc: str, num_proc: int | None, overwrite_cache: bool, **kwargs):
    """``dsd.map(fn, batched=True, **kwargs)`` replacing the input columns, for a ``DatasetDict`` (cached in
    ``num_proc`` processes, progress ``desc``) or a streaming ``IterableDatasetDict`` (applied lazily while
    iterating: the cache, process and progress options do not apply).

    ``key`` names everything the output depends on besides the input (e.g. the tokenizer's content hash and the
    block length); each split's new fingerprint is then derived from its input fingerprint and ``key``, so that
    another run with the same data and settings finds the result in the cache. (``datasets`` would otherwise hash
    the function's closure, in which a tokenizer differs by the folder it was loaded from.)"""
    kwargs.update(batched=True, remove_columns=_columns(dsd))
    if _is_stream(dsd):
        return dsd.map(fn, **kwargs)
    import hashlib

    from datasets import DatasetDict

    kwargs.update(num_proc=num_proc, load_from_cache_file=not overwrite_cache, desc=desc)
    return DatasetDict(
        {
            split: ds.map(
                fn, new_fingerprint=hashlib.sha256(f"{ds._fingerprint}|{key}".encode()).hexdigest()[:16], **kwargs
            )
            for split, ds in dsd.items()
        }
    )


def tokenizer_hash(tokenizer) -> str:
    """SHA-256 of what decides a tokenizer's ids: its class, case handling and (token, id) pairs."""
    import hashlib
    import json

    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: (kv[1], kv[0]))
    desc = {
        "class": type(tokenizer).__name__,
        "lowercase": getattr(tokenizer, "do_lower_case", getattr(tokenizer, "lowercase", None)),
        "vocab": vocab,
    }
    return hashlib.sha256(json.dumps(desc, ensure_ascii=False).encode("utf-8")).hexdigest()


# -- tokenisation --------------------------------------------------------------------------------------------
def tokenize_bert(raw, tokenizer, num_proc: int | None = None, overwrite_cache: bool = False):
    """Tokenise documents with a fast WordPiece tokenizer (``datasets.map``, batched, cached).

    Output columns per document: ``input_ids`` (list[int], no special tokens), ``word_start`` (list[int] 0/1,
    1 where a token begins a word of the pre-tokenizer), ``line_ends`` (list[int], token offset after each
    line: the NSP segments).
    """
    if not getattr(tokenizer, "is_fast", False):
        raise InputError("--tokenizer_name: a fast tokenizer is needed (word ids for whole-word masking)")

    def tokenize(batch):
        out = {"input_ids": [], "word_start": [], "line_ends": []}
        for text in batch["text"]:
            lines = [ln for ln in text.split("\n") if ln.strip()]
            enc = (
                tokenizer(
                    lines,
                    add_special_tokens=False,
                    return_attention_mask=False,
                    return_token_type_ids=False,
                    verbose=False,
                )
                if lines
                else None
            )
            ids, starts, ends = [], [], []
            for i in range(len(lines)):
                line_ids = enc["input_ids"][i]
                words = enc.word_ids(i)
                prev = None
                for w in words:
                    starts.append(1 if w is None or w != prev else 0)
                    prev = w
                ids.extend(line_ids)
                if line_ids:
                    ends.append(len(ids))
            out["input_ids"].append(ids)
            out["word_start"].append(starts)
            out["line_ends"].append(ends)
        return out

    return _map(
        raw,
        tokenize,
        f"tokenize_bert-v1|{tokenizer_hash(tokenizer)}",
        "tokenising (WordPiece)",
        num_proc,
        overwrite_cache,
    )


def tokenize_elmo(raw, tokenizer, num_proc: int | None = None, overwrite_cache: bool = False):
    """Split documents into words for the ELMo-style BiLM (``datasets.map``, batched, cached).

    Output columns per document: ``input_ids`` (word ids, every line wrapped in ``<S>`` ... ``</S>``) and
    ``words`` (the word strings, ``<S>``/``</S>`` included), from which the collator builds ``char_ids``.
    """
    vocab = tokenizer.get_vocab()
    unk = tokenizer.unk_token_id
    bos, eos = tokenizer.bos_token, tokenizer.eos_token

    def tokenize(batch):
        out = {"input_ids": [], "words": []}
        for text in batch["text"]:
            words: list[str] = []
            for line in text.split("\n"):
                if line.strip():
                    split = [w for w, _ in tokenizer.split_words(line)]
                    if split:
                        words.append(bos)
                        words.extend(split)
                        words.append(eos)
            out["words"].append(words)
            out["input_ids"].append([vocab.get(w, unk) for w in words])
        return out

    return _map(
        raw, tokenize, f"tokenize_elmo-v1|{tokenizer_hash(tokenizer)}", "tokenising (words)", num_proc, overwrite_cache
    )


# -- packing -------------------------------------------------------------------------------------------------
def pack_blocks(
    tokenized,
    max_seq_length: int,
    cls_token_id: int | None,
    sep_token_id: int | None,
    batch_size: int = 1000,
    num_proc: int | None = None,
    overwrite_cache: bool = False,
    document_positions: bool = False,
):
    """Concatenate documents and cut them into blocks of ``max_seq_length`` tokens (``datasets.map``).

    With ``cls_token_id``/``sep_token_id`` (BERT-like) documents are separated by ``[SEP]`` and each block is
    ``[CLS]`` + ``max_seq_length - 1`` tokens; without (ELMo-style) the ``<S>``/``</S>``-wrapped lines are
    concatenated as they are. Every token lands in exactly one block; only the last block of each map batch
    may be shorter. Per-token columns other than ``input_ids`` (``word_start``, ``words``) are packed alongside;
    ``word_start`` is forced to 1 at a block's first body token (a word cut by a block edge starts anew).

    ``document_positions`` (BERT-like only): the blocks keep the documents apart (see :func:`pack_documents`) and
    carry a ``position_ids`` column that restarts at 0 at every document start, for attention within a document.

    Raises:
        InputError: ``max_seq_length`` below 2 (below 3 with ``document_positions``), or ``document_positions``
            without ``[CLS]``/``[SEP]`` ids.
    """
    if max_seq_length < 2:
        raise InputError(f"--max_seq_length {max_seq_length}: expected at least 2")
    if document_positions:
        return pack_documents(
            tokenized, max_seq_length, cls_token_id, sep_token_id, batch_size, num_proc, overwrite_cache
        )
    columns = [c for c in _columns(tokenized) if c not in ("line_ends",)]
    per_token = [c for c in columns if c != "input_ids"]
    bert = cls_token_id is not None
    body = max_seq_length - 1 if bert else max_seq_length

    def pack(batch):
        stream: dict[str, list] = {c: [] for c in columns}
        for i in range(len(batch["input_ids"])):
            ids = batch["input_ids"][i]
            if not ids:
                continue
            stream["input_ids"].extend(ids)
            for c in per_token:
                stream[c].extend(batch[c][i])
            if bert:
                stream["input_ids"].append(sep_token_id)
                for c in per_token:
                    stream[c].append(1 if c == "word_start" else "[SEP]")
        out: dict[str, list] = {c: [] for c in columns}
        n = len(stream["input_ids"])
        for start in range(0, n, body):
            for c in columns:
                chunk = stream[c][start : start + body]
                if c == "word_start":
                    chunk = [1] + chunk[1:]
                if bert:
                    chunk = [cls_token_id if c == "input_ids" else 1 if c == "word_start" else "[CLS]"] + chunk
                out[c].append(chunk)
        return out

    return _map(
        tokenized,
        pack,
        f"pack_blocks-v1|{max_seq_length}|{cls_token_id}|{sep_token_id}|{batch_size}|{columns}",
        f"packing into blocks of {max_seq_length}",
        num_proc,
        overwrite_cache,
        batch_size=batch_size,
    )


def _pack_documents_batch(
    batch: dict[str, list], columns: list[str], max_seq_length: int, cls_token_id: int, sep_token_id: int
) -> dict[str, list]:
    """One ``datasets.map`` batch of :func:`pack_documents`: its documents (``input_ids`` lists, and ``word_start``
    when among ``columns``) packed into blocks of ``max_seq_length`` tokens with ``position_ids``."""
    has_starts = "word_start" in columns
    L = max_seq_length
    out: dict[str, list] = {c: [] for c in (*columns, "position_ids")}
    ids, starts, positions = [], [], []

    def flush():
        out["input_ids"].append(ids[:])
        out["position_ids"].append(positions[:])
        if has_starts:
            out["word_start"].append(starts[:])
        ids.clear(), starts.clear(), positions.clear()

    for i, doc in enumerate(batch["input_ids"]):
        if not doc:
            continue
        doc_ids = doc + [sep_token_id]
        doc_starts = (batch["word_start"][i] + [1]) if has_starts else None
        k = 0
        while k < len(doc_ids) and not (k and k == len(doc_ids) - 1):  # never a piece of [SEP] alone
            room = L - len(ids)
            take = min(room - 1, len(doc_ids) - k)  # [CLS] + take tokens of the document
            ids.append(cls_token_id)
            ids.extend(doc_ids[k : k + take])
            positions.extend(range(take + 1))
            if has_starts:
                starts.append(1)
                starts.extend([1, *doc_starts[k + 1 : k + take]] if take else [])
            k += take
            if len(ids) >= L - 1:  # full, or one slot left after [SEP]: a lone [CLS] fills it
                if len(ids) == L - 1:
                    ids.append(cls_token_id)
                    positions.append(0)
                    if has_starts:
                        starts.append(1)
                flush()
    if ids:
        flush()
    return out


def pack_documents(
    tokenized,
    max_seq_length: int,
    cls_token_id: int,
    sep_token_id: int,
    batch_size: int = 1000,
    num_proc: int | None = None,
    overwrite_cache: bool = False,
):
    """Document-aware packing (``datasets.map``): blocks of ``max_seq_length`` tokens whose documents stay apart.

    The convention: every document is ``[CLS] tokens [SEP]``, and every piece of a document in a block starts with
    ``[CLS]`` at position 0 -- a document cut by a block edge goes on in the next block after a new ``[CLS]``, as a
    document of its own. So each piece is encoded exactly like a fine-tuning input ``[CLS] text [SEP]`` (position 0
    is always ``[CLS]``; the ``[SEP]`` ends a piece only where its document ends, and is left out where the
    document's last token fills the block: no piece is ``[CLS] [SEP]`` alone). A block with one free slot left after
    a document's ``[SEP]`` ends with a lone ``[CLS]`` (a one-token document with nothing to predict), so that every
    block but the last of each map batch is exactly ``max_seq_length`` tokens: no padding.

    Output columns: those of :func:`pack_blocks` (``input_ids``, ``word_start`` when present: 1 at every ``[CLS]`` /
    ``[SEP]`` and at a piece's first token) plus ``position_ids`` (list[int]): 0 at each ``[CLS]``, counting up to
    the end of its piece -- the packed-sequence convention of :class:`modeling.bert.SesameBertModel` (a document
    starts where ``position_ids[t] != position_ids[t-1] + 1``).

    Raises:
        InputError: ``max_seq_length`` below 3 (``[CLS]``, one token, ``[SEP]``), or no ``[CLS]``/``[SEP]`` ids.
    """
    if cls_token_id is None or sep_token_id is None:
        raise InputError("--document_masking: packing with document boundaries needs a tokenizer with [CLS] and [SEP]")
    if max_seq_length < 3:
        raise InputError(f"--max_seq_length {max_seq_length}: expected at least 3 with document masking")
    columns = [c for c in _columns(tokenized) if c not in ("line_ends", "position_ids")]
    pack = functools.partial(
        _pack_documents_batch,
        columns=columns,
        max_seq_length=max_seq_length,
        cls_token_id=cls_token_id,
        sep_token_id=sep_token_id,
    )

    return _map(
        tokenized,
        pack,
        f"pack_documents-v1|{max_seq_length}|{cls_token_id}|{sep_token_id}|{batch_size}|{columns}",
        f"packing documents into blocks of {max_seq_length}",
        num_proc,
        overwrite_cache,
        batch_size=batch_size,
    )


def _line_segments(ends: list[int], piece: int) -> list[tuple[int, int]]:
    """``(start, end)`` token ranges of a document's lines (``ends``: each line's end offset), a line longer than
    ``piece`` tokens cut into pieces of ``piece``."""
    segs, start = [], 0
    for end in ends:
        for s in range(start, end, piece):
            segs.append((s, min(s + piece, end)))
        start = end
    return segs


def _nsp_pair(
    chunk: list[tuple[int, int]],
    d: int,
    docs: list[list[int]],
    segs_all: list[list[tuple[int, int]]],
    rng: random.Random,
    max_tokens: int,
    random_next_probability: float,
) -> tuple[list[int], int, list[int], int, int] | None:
    """One NSP example from ``chunk``, consecutive segments of document ``d``, after BERT's
    ``create_pretraining_data.py`` (Devlin et al. 2019): A is the chunk's first ``k`` segments (a random ``k``; a
    one-segment chunk is split at a random token); B the rest (IsNext, label 0) or, with probability
    ``random_next_probability``, a span of another document (NotNext, label 1), and the segments after A go back to
    the caller. The pair is cut to ``max_tokens`` by dropping tokens from the longer side: the front of A, the back of
    B (BERT's ``truncate_seq_pair`` picks the side at random).

    Returns ``(a, d_b, b, label, put_back)`` -- token ranges ``a`` in ``docs[d]`` and ``b`` in ``docs[d_b]``, and how
    many segments of ``chunk`` to put back -- or None for a chunk of fewer than 2 tokens. Draws from ``rng`` in a
    fixed order (the pairs are deterministic for a seed)."""
    lo, hi = chunk[0][0], chunk[-1][1]
    if hi - lo < 2:
        return None
    is_random = rng.random() < random_next_probability and len(docs) > 1
    if len(chunk) > 1:
        k = rng.randint(1, len(chunk) - 1)
        split = chunk[k][0]
    else:
        k, split = 1, rng.randint(lo + 1, hi - 1)
    a, put_back = [lo, split], 0
    others = [j for j in range(len(docs)) if j != d and segs_all[j]] if is_random else []
    if others:
        o = rng.choice(others)
        s0 = segs_all[o][rng.randrange(len(segs_all[o]))][0]
        want = max(1, max_tokens - (a[1] - a[0]))
        b, d_b, label = [s0, min(s0 + want, len(docs[o]))], o, 1
        if len(chunk) > 1:
            put_back = len(chunk) - k
    else:
        b, d_b, label = [split, hi], d, 0
    while (a[1] - a[0]) + (b[1] - b[0]) > max_tokens:
        if a[1] - a[0] > b[1] - b[0]:
            a[0] += 1  # front of A
        else:
            b[1] -= 1  # back of B
    return a, d_b, b, label, put_back


def make_nsp_pairs(
    tokenized,
    max_seq_length: int,
    cls_token_id: int,
    sep_token_id: int,
    seed: int,
    batch_size: int = 1000,
    num_proc: int | None = None,
    overwrite_cache: bool = False,
    random_next_probability: float = 0.5,
):
    """Sentence-pair blocks for MLM + NSP (see the module docstring); deterministic for a given ``seed``.

    Output columns: ``input_ids`` = ``[CLS] A [SEP] B [SEP]`` (at most ``max_seq_length``), ``token_type_ids``
    (0 on ``[CLS] A [SEP]``, 1 on ``B [SEP]``), ``word_start``, ``next_sentence_label`` (0 IsNext, 1 NotNext).
    Segments are the documents' lines; a line longer than half a block is split into half-block pieces.
    """
    max_tokens = max_seq_length - 3
    if max_tokens < 2:
        raise InputError(f"--max_seq_length {max_seq_length}: expected at least 5 with --nsp")
    piece = max(1, max_tokens // 2)

    def pairs(batch, indices):
        rng = random.Random(f"{seed}-nsp-{indices[0]}")
        docs = batch["input_ids"]
        starts = batch["word_start"]
        segs_all = [_line_segments(e, piece) for e in batch["line_ends"]]
        out = {"input_ids": [], "token_type_ids": [], "word_start": [], "next_sentence_label": []}

        def emit(d_a, a, d_b, b, label):
            ids = [cls_token_id] + docs[d_a][a[0] : a[1]] + [sep_token_id] + docs[d_b][b[0] : b[1]] + [sep_token_id]
            ws = [1] + [1] + starts[d_a][a[0] + 1 : a[1]] + [1] + [1] + starts[d_b][b[0] + 1 : b[1]] + [1]
            out["input_ids"].append(ids)
            out["word_start"].append(ws)
            out["token_type_ids"].append([0] * (a[1] - a[0] + 2) + [1] * (b[1] - b[0] + 1))
            out["next_sentence_label"].append(label)

        for d, segs in enumerate(segs_all):
            i, chunk = 0, []
            while i < len(segs):
                chunk.append(segs[i])
                if i == len(segs) - 1 or chunk[-1][1] - chunk[0][0] >= max_tokens:
                    pair = _nsp_pair(chunk, d, docs, segs_all, rng, max_tokens, random_next_probability)
                    if pair is not None:
                        a, d_b, b, label, put_back = pair
                        i -= put_back  # segments not used by a random B start the next chunk
                        emit(d, a, d_b, b, label)
                    chunk = []
                i += 1
        return out

    return _map(
        tokenized,
        pairs,
        f"make_nsp_pairs-v1|{max_seq_length}|{cls_token_id}|{sep_token_id}|{seed}|{batch_size}|{random_next_probability}",
        "building NSP sentence pairs",
        num_proc,
        overwrite_cache,
        batch_size=batch_size,
        with_indices=True,
    )


class StreamedBlocks(torch.utils.data.IterableDataset):
    """Training blocks from a ``datasets.IterableDataset`` (a stream: ``--streaming``), each carrying its position in
    the stream as ``index`` (the collators seed their per-example random numbers with it, as with
    :class:`IndexedDataset`). Iterating starts the stream again from its beginning; the loop then skips the batches
    already consumed (``accelerator.skip_first_batches``), so a resumed run continues at its saved position."""

    def __init__(self, stream):
        super().__init__()
        self.stream = stream

    def __iter__(self):
        for index, example in enumerate(self.stream):
            yield {**example, "index": index}


class IndexedDataset(torch.utils.data.Dataset):
    """A ``datasets.Dataset`` as a torch dataset whose examples carry their row ``index`` (the collators seed
    their per-example random numbers with it). Batched reads go through ``__getitems__``."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict:
        return {**self.dataset[int(index)], "index": int(index)}

    def __getitems__(self, indices: list[int]) -> list[dict]:
        indices = [int(i) for i in indices]
        columns = self.dataset[indices]
        names = list(columns)
        return [{**{c: columns[c][j] for c in names}, "index": i} for j, i in enumerate(indices)]


def count_tokens(dataset) -> int:
    """Total number of tokens in the ``input_ids`` column, summed from the Arrow list lengths (nothing is copied
    into Python objects: memory stays flat however large the memory-mapped dataset)."""
    import pyarrow.compute as pc

    column = dataset.data.column("input_ids")
    if dataset._indices is not None:  # a selection (select/shuffle): count its rows only
        return int(sum(len(ids) for batch in dataset.iter(batch_size=10_000) for ids in batch["input_ids"]))
    return int(pc.sum(pc.list_value_length(column)).as_py() or 0)


def seed_for(*keys: int) -> int:
    """A well-mixed 63-bit seed from integer keys (``numpy.random.SeedSequence``)."""
    a, b = np.random.SeedSequence([int(k) & 0xFFFFFFFFFFFFFFFF for k in keys]).generate_state(2)
    return int((int(a) << 31) ^ int(b)) & 0x7FFFFFFFFFFFFFFF


__all__ = [
    "load_corpus",
    "load_raw_datasets",
    "stream_held_out",
    "tokenize_bert",
    "tokenize_elmo",
    "pack_blocks",
    "pack_documents",
    "make_nsp_pairs",
    "IndexedDataset",
    "StreamedBlocks",
    "count_tokens",
    "seed_for",
    "DEFAULT_TRAIN_FILES",
    "DEFAULT_VALIDATION_FILE",
]
