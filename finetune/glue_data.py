"""GLUE-style data for sequence classification: the official GLUE directory, custom files, or the hub.

:func:`load_glue_data` returns a ``datasets.DatasetDict`` with the same columns whatever the source:

=============  ======================================================================================
``sentence1``  string, the first (or only) text
``sentence2``  string, the second text (pair tasks only)
``label``      ``ClassLabel`` class id (names in the task's order; ``-1`` on unlabelled test splits), or
               ``float32`` for regression (STS-B score; ``-1.0`` on test splits)
``idx``        int64, the example id written back in GLUE submission files (the file's index column for
               test files, else the row number)
=============  ======================================================================================

Sources:

* ``glue_dir``: the directory written by GLUE's ``download_glue_data.py`` (layout in :mod:`finetune.tasks`):
  TSVs read unquoted (``quoting=csv.QUOTE_NONE``, a ``"`` is literal text, as in MRPC / STS-B), empty cells
  kept as ``""``, a UTF-8 byte-order mark skipped (MRPC), CoLA train/dev without header row, MNLI
  ``dev_matched`` / ``dev_mismatched`` / ``test_*`` and the diagnostic set (``test_ax``) when present.
* ``train_file`` / ``validation_file`` / ``test_file``: ``.csv``, ``.tsv`` (unquoted, as GLUE), ``.json``
  (a list of records, ``{"data": [...]}``, or JSON lines) or ``.jsonl``, optionally ``.gz``; columns named by
  ``sentence1_key`` / ``sentence2_key`` / ``label_key``. Label names come from the GLUE task when one is given,
  else from ``label_names``, else the sorted distinct training labels; numeric non-integer labels mean
  regression.
* the hub dataset ``nyu-mll/glue`` (network or the local ``datasets`` cache).

Every refused input raises :class:`core.errors.InputError` before any training starts: unknown task,
missing columns (named, with the columns found), labels outside the label set (a few shown, with the file),
an empty split, string labels for a regression task, an undecodable or malformed file.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
import os
import sys
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import datasets

from core.errors import InputError
from finetune.tasks import GlueFile, GlueTask, get_task
from training.pretrained import hub_offline

#: File formats accepted for ``--train_file`` / ``--validation_file`` / ``--test_file``.
FILE_FORMATS = ("csv", "tsv", "json", "jsonl")

#: Columns taken as the example id of a custom file when present (first found).
_INDEX_COLUMNS = ("idx", "index", "id")

#: Default text columns of a custom file, tried in order when no ``sentence*_key`` is given.
_DEFAULT_TEXT_COLUMNS = (
    ("sentence1", "sentence2"),
    ("premise", "hypothesis"),
    ("question", "sentence"),
    ("sentence", None),
    ("text", None),
)

_MAX_SHOWN = 5

csv.field_size_limit(min(sys.maxsize, 2**31 - 1))  # long passages in one cell


# ----------------------------------------------------------------------------------------------------------
# Reading files into columns of raw values
# ----------------------------------------------------------------------------------------------------------


def file_format(path: str | os.PathLike) -> str:
    """The format of a data file from its extension (``.gz`` ignored): csv, tsv, json or jsonl.

    Raises:
        InputError: for another extension.
    """
    name = Path(path).name.lower()
    if name.endswith(".gz"):
        name = name[:-3]
    ext = name.rsplit(".", 1)[-1] if "." in name else ""
    if ext not in FILE_FORMATS:
        raise InputError(
            f"{path}: unsupported file extension {('.' + ext) if ext else '(none)'}; expected one of "
            f"{', '.join('.' + f for f in FILE_FORMATS)} (optionally .gz)"
        )
    return ext


def read_table(path: str | os.PathLike, column_names: Sequence[str] | None = None) -> dict[str, list[Any]]:
    """Read a csv / tsv / json / jsonl file into columns of raw values (text cells stay strings).

    TSV files are read unquoted (``csv.QUOTE_NONE``), as the GLUE files need; CSV files with standard quoting;
    in both, empty cells stay ``""`` (no NaN conversion) and a UTF-8 byte-order mark is skipped.

    Args:
        path: the file (``.gz`` compressed or not).
        column_names: names for a delimited file without header row (CoLA train/dev); ``None``: header row.

    Returns:
        column name -> list of values, all columns of equal length.

    Raises:
        InputError: missing, undecodable (not UTF-8) or malformed file (ragged rows, bad JSON), no columns.
    """
    path = Path(path)
    fmt = file_format(path)
    if not path.is_file():
        raise InputError(f"{path}: file not found; expected an existing csv, tsv, json or jsonl file")
    try:
        if fmt in ("csv", "tsv"):
            return _read_delimited(path, fmt, column_names)
        return _read_json(path, fmt)
    except UnicodeDecodeError as err:
        gzip_error = _gzip_error(path)  # a corrupt deflate stream yields garbage bytes before its zlib error
        if gzip_error is not None:
            raise InputError(
                f"{path}: corrupt gzip data ({gzip_error}); expected a complete, intact .gz file"
            ) from None
        raise InputError(
            f"{path}: not valid UTF-8 text ({err.reason} at byte {err.start}); expected a UTF-8 {fmt} file"
        ) from None
    except (OSError, EOFError, zlib.error) as err:  # e.g. a truncated, corrupt or fake .gz
        if path.name.lower().endswith(".gz") and not isinstance(err, FileNotFoundError | PermissionError):
            raise InputError(
                f"{path}: corrupt gzip data ({type(err).__name__}: {err}); expected a complete, intact .gz file"
            ) from None
        raise InputError(
            f"{path}: cannot read the file ({err}); expected a readable {fmt} file (a complete .gz when compressed)"
        ) from None


def _gzip_error(path: Path) -> str | None:
    """The error of decompressing ``path`` whole when it is a ``.gz`` file that is corrupt, else None."""
    if not path.name.lower().endswith(".gz"):
        return None
    try:
        with gzip.open(path, "rb") as f:
            while f.read(1 << 20):
                pass
    except (OSError, EOFError, zlib.error) as err:
        return f"{type(err).__name__}: {err}"
    return None


def _open_text(path: Path):
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    return opener(path, "rt", encoding="utf-8-sig", newline="")


def _read_delimited(path: Path, fmt: str, column_names: Sequence[str] | None) -> dict[str, list[Any]]:
    quoting = csv.QUOTE_NONE if fmt == "tsv" else csv.QUOTE_MINIMAL
    with _open_text(path) as f:
        reader = csv.reader(f, delimiter="\t" if fmt == "tsv" else ",", quoting=quoting, strict=fmt == "csv")
        try:
            rows = [(reader.line_num, row) for row in reader if row]
        except csv.Error as err:
            raise InputError(f"{path}: malformed {fmt} file near line {reader.line_num}: {err}") from None
    if column_names is None:
        if not rows:
            raise InputError(f"{path}: the file is empty; expected a {fmt} file with a header row")
        header = rows.pop(0)[1]
    else:
        header = list(column_names)
    bad = [(line, len(row)) for line, row in rows if len(row) != len(header)]
    if bad:
        shown = ", ".join(f"line {line} has {n}" for line, n in bad[:_MAX_SHOWN])
        hint = " (GLUE .tsv files are unquoted: a '\"' is text, a tab always separates fields)" if fmt == "tsv" else ""
        raise InputError(
            f"{path}: malformed {fmt} file: {len(bad)} line(s) without the {len(header)} fields of the "
            f"columns {header}: {shown}{hint}"
        )
    return {name: [row[i] for _, row in rows] for i, name in enumerate(header)}


def _read_json(path: Path, fmt: str) -> dict[str, list[Any]]:
    with _open_text(path) as f:
        text = f.read()
    records: Any
    if fmt == "json":
        try:
            records = json.loads(text)
        except json.JSONDecodeError:
            records = None  # maybe JSON lines with a .json name
        if isinstance(records, dict) and isinstance(records.get("data"), list):
            records = records["data"]
    else:
        records = None
    if records is None:
        records = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise InputError(
                    f"{path}: malformed JSON on line {number}: {err.msg} (column {err.colno}); "
                    f"expected one JSON object per line, or one JSON list of objects"
                ) from None
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise InputError(f"{path}: expected a list of JSON objects (one per example), or JSON lines")
    columns: dict[str, list[Any]] = {}
    for record in records:
        for key in record:
            columns.setdefault(str(key), [])
    for key, values in columns.items():
        values.extend(record.get(key) for record in records)
    return columns


# ----------------------------------------------------------------------------------------------------------
# Normalising raw columns to sentence1 / sentence2 / label / idx
# ----------------------------------------------------------------------------------------------------------


def _label_key(value: Any) -> str:
    """A raw label as the string it is looked up by (``1``, ``1.0`` and ``"1"`` are all ``"1"``)."""
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


def _as_float(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _shown(values: list[tuple[int, Any]]) -> str:
    return ", ".join(f"{v!r} (row {row})" for row, v in values[:_MAX_SHOWN])


def check_labels_present(values: Sequence[Any], where: str) -> None:
    """Refuse empty label cells and records without the label key (``None``): they are not a class named ``''``.

    Raises:
        InputError: naming ``where`` (file and column), how many rows lack a label and a few of them (0-based).
    """
    missing = [row for row, value in enumerate(values) if _label_key(value) == ""]
    if missing:
        shown = ", ".join(f"row {row}" for row in missing[:_MAX_SHOWN])
        raise InputError(
            f"{where}: {len(missing)} example(s) without a label (an empty cell, or a JSON record without "
            f"the key): {shown}; expected a label in every row (test files may leave the column out)"
        )


def encode_labels(
    values: Sequence[Any], label_names: Sequence[str], where: str, allow_class_ids: bool = False
) -> list[int]:
    """Class ids of raw labels: a label name (``1``, ``1.0`` and ``"1"`` all name the label ``"1"``), or, with
    ``allow_class_ids`` (a GLUE task, whose official files write class ids, e.g. SST-2's ``0`` / ``1`` for
    negative / positive), an integer class id in ``range(len(label_names))``.

    A custom task's labels are names only: with the label set ``["0", "2"]`` a ``"1"`` is refused, not taken as
    class id 1 (which is ``"2"``).

    Raises:
        InputError: naming ``where`` (file and column), the offending values (a few, with rows) and the label set.
    """
    to_id = {name: i for i, name in enumerate(label_names)}
    ids, bad = [], []
    for row, value in enumerate(values):
        key = _label_key(value)
        if key in to_id:
            ids.append(to_id[key])
        elif allow_class_ids and key.isdigit() and int(key) < len(label_names):
            ids.append(int(key))
        else:
            bad.append((row, value))
    if bad:
        expected = (
            f"label names or class ids 0..{len(label_names) - 1}" if allow_class_ids else "one of the label names"
        )
        raise InputError(
            f"{where}: {len(bad)} label(s) outside the label set {list(label_names)}: {_shown(bad)}; "
            f"expected {expected}"
        )
    return ids


def encode_scores(values: Sequence[Any], where: str, task: str) -> list[float]:
    """Float regression targets of raw labels.

    Raises:
        InputError: for values that are not numbers (e.g. class names given to a regression task).
    """
    scores, bad = [], []
    for row, value in enumerate(values):
        number = _as_float(value)
        if number is None:
            bad.append((row, value))
        scores.append(number)
    if bad:
        raise InputError(
            f"{where}: {task} is a regression task and needs numeric labels, but {len(bad)} label(s) "
            f"are not numbers: {_shown(bad)}"
        )
    return scores


def infer_label_scheme(values: Sequence[Any]) -> tuple[list[str], bool]:
    """Label names (sorted distinct values; numerically when all are integers) and whether it is regression.

    Labels are taken as regression scores when every value is a number and at least one is not an integer.
    """
    numbers = [_as_float(v) for v in values]
    if values and all(n is not None for n in numbers) and any(not n.is_integer() for n in numbers):
        return [], True
    names = sorted({_label_key(v) for v in values})
    if names and all(n.lstrip("-").isdigit() for n in names):
        names.sort(key=int)
    return names, False


def _features(pair: bool, label_names: Sequence[str], regression: bool) -> datasets.Features:
    features = {"sentence1": datasets.Value("string")}
    if pair:
        features["sentence2"] = datasets.Value("string")
    features["label"] = datasets.Value("float32") if regression else datasets.ClassLabel(names=list(label_names))
    features["idx"] = datasets.Value("int64")
    return datasets.Features(features)


def _require_columns(columns: dict[str, list[Any]], needed: dict[str, str | None], where: str) -> None:
    missing = [f"{col!r} ({role})" for role, col in needed.items() if col is not None and col not in columns]
    if missing:
        raise InputError(
            f"{where}: missing column(s) {', '.join(missing)}; columns found: {list(columns)}"
            f"; expected the columns named by --sentence1_key / --sentence2_key / --label_key"
        )


def normalize_split(
    columns: dict[str, list[Any]],
    where: str,
    spec: GlueFile,
    label_names: Sequence[str],
    regression: bool,
    task: str,
    allow_class_ids: bool = False,
) -> datasets.Dataset:
    """One split in the common columns (``sentence1``, [``sentence2``], ``label``, ``idx``).

    Args:
        columns: raw columns (from :func:`read_table`).
        where: what to name in error messages (the file path and split).
        spec: the source columns (``sentence1`` / ``sentence2`` / ``label`` / ``index``; its ``path`` is not read);
            ``label=None`` for unlabelled test data (labels -1), ``index=None`` for row numbers as ``idx``.
        label_names: class names (classification).
        regression: float labels instead of class ids.
        task: task name for messages.
        allow_class_ids: integer class ids are labels too (GLUE tasks; see :func:`encode_labels`).

    Raises:
        InputError: missing columns, empty split, labels outside the set, non-numeric regression labels.
    """
    sentence1, sentence2, label, index = spec.sentence1, spec.sentence2, spec.label, spec.index
    _require_columns(columns, {"sentence1_key": sentence1, "sentence2_key": sentence2, "label_key": label}, where)
    n_rows = len(next(iter(columns.values()), []))
    if n_rows == 0:
        raise InputError(f"{where}: no examples (empty split); columns found: {list(columns)}")
    data: dict[str, list[Any]] = {"sentence1": ["" if v is None else str(v) for v in columns[sentence1]]}
    if sentence2 is not None:
        data["sentence2"] = ["" if v is None else str(v) for v in columns[sentence2]]
    if label is not None:
        check_labels_present(columns[label], f"{where}, column {label!r}")
    if label is None:
        data["label"] = [-1.0 if regression else -1] * n_rows
    elif regression:
        data["label"] = encode_scores(columns[label], f"{where}, column {label!r}", task)
    else:
        data["label"] = encode_labels(columns[label], label_names, f"{where}, column {label!r}", allow_class_ids)
    ids = None
    if index is not None and index in columns:
        keys = [_label_key(v) for v in columns[index]]
        if all(k.lstrip("-").isdigit() for k in keys):
            ids = [int(k) for k in keys]
    data["idx"] = ids if ids is not None else list(range(n_rows))
    return datasets.Dataset.from_dict(data, features=_features(sentence2 is not None, label_names, regression))


# ----------------------------------------------------------------------------------------------------------
# The three sources
# ----------------------------------------------------------------------------------------------------------


def load_glue_dir(glue_dir: str | os.PathLike, task: GlueTask) -> datasets.DatasetDict:
    """Load a task from the official GLUE directory (``<glue_dir>/SST-2/train.tsv``, ...).

    Returns:
        A ``DatasetDict`` with the task's splits found (``train``, ``validation`` or MNLI's
        ``validation_matched`` / ``validation_mismatched``, ``test*``); optional splits (``test_ax``) only when
        their file exists.

    Raises:
        InputError: no file of the task in ``glue_dir``, or any bad file (see :func:`normalize_split`).
    """
    root = Path(glue_dir)
    if not root.is_dir():
        raise InputError(f"--glue_dir {root}: not a directory; expected the GLUE data folder (e.g. glue_data/)")
    splits = {}
    for split, spec in task.files.items():
        path = root / spec.path
        if not path.is_file():
            if spec.optional or split.startswith("test"):
                continue
            expected = ", ".join(str(root / f.path) for f in task.files.values() if not f.optional)
            raise InputError(
                f"--glue_dir {root}: missing {path} for task {task.name} (split {split}); expected the "
                f"official GLUE layout: {expected}"
            )
        table = read_table(path, spec.column_names)
        splits[split] = normalize_split(
            table, f"{path} ({split})", spec, task.label_names, task.is_regression, task.name, allow_class_ids=True
        )
    return datasets.DatasetDict(splits)


def _pick_text_columns(columns: dict[str, list[Any]], task: GlueTask | None, where: str) -> tuple[str, str | None]:
    candidates = list(_DEFAULT_TEXT_COLUMNS)
    if task is not None:
        candidates.insert(0, (task.hub_sentence1_key, task.hub_sentence2_key))
    for s1, s2 in candidates:
        if task is not None and task.is_pair and s2 is None:
            continue
        if s1 in columns and (s2 is None or s2 in columns):
            return s1, s2
    raise InputError(
        f"{where}: cannot tell the text column(s); columns found: {list(columns)}; name them with "
        f"--sentence1_key (and --sentence2_key for sentence pairs)"
    )


def load_custom_files(
    train_file: str | os.PathLike | None = None,
    validation_file: str | os.PathLike | None = None,
    test_file: str | os.PathLike | None = None,
    *,
    task: GlueTask | None = None,
    sentence1_key: str | None = None,
    sentence2_key: str | None = None,
    label_key: str = "label",
    label_names: Sequence[str] | None = None,
    is_regression: bool | None = None,
) -> datasets.DatasetDict:
    """Load ``train`` / ``validation`` / ``test`` splits from csv, tsv, json or jsonl files.

    Args:
        train_file / validation_file / test_file: the files (any may be ``None``; at least one given). A test
            file may lack the label column (labels -1).
        task: a GLUE task giving label names, regression and default text columns; ``None`` for a custom task.
        sentence1_key / sentence2_key: text columns; default: the task's hub columns, else the first of
            ``sentence1``/``sentence2``, ``premise``/``hypothesis``, ``question``/``sentence``, ``sentence``,
            ``text`` found.
        label_key: the label column.
        label_names: class names in class-id order (custom task); default: the sorted distinct labels of the
            training file (or of the first file given).
        is_regression: force regression (``True``) or classification (``False``); default: the task's, or
            inferred from the labels (all numeric, some not integers).

    Raises:
        InputError: see :func:`normalize_split`, plus no file given.
    """
    files = {s: f for s, f in (("train", train_file), ("validation", validation_file), ("test", test_file)) if f}
    if not files:
        raise InputError(
            "no data given: pass --train_file / --validation_file (/ --test_file), --glue_dir, or a "
            "GLUE --task_name to load from the hub"
        )
    tables = {split: read_table(path) for split, path in files.items()}
    for split, table in tables.items():
        if not table or not next(iter(table.values())):
            raise InputError(f"{files[split]} ({split}): no examples (empty split); columns found: {list(table)}")
    first_split = next(iter(files))
    if sentence1_key is None:
        sentence1_key, default_s2 = _pick_text_columns(tables[first_split], task, f"{files[first_split]}")
        sentence2_key = sentence2_key if sentence2_key is not None else default_s2
    if task is not None:
        names, regression = list(task.label_names), task.is_regression
    else:
        labelled = [s for s in files if label_key in tables[s]]
        source = "train" if "train" in labelled else (labelled[0] if labelled else None)
        values = tables[source][label_key] if source else []
        if source is not None and source != "test":
            check_labels_present(values, f"{files[source]} ({source}), column {label_key!r}")
        if label_names is not None:
            names, regression = list(label_names), False
        elif is_regression:
            names, regression = [], True
        else:
            names, regression = infer_label_scheme(values)
            if is_regression is False and regression:
                names, regression = sorted({_label_key(v) for v in values}), False
        if not regression and not names:
            where = files[source] if source else ", ".join(str(f) for f in files.values())
            raise InputError(
                f"{where}: no labels to learn from (column {label_key!r}); columns found: "
                f"{list(tables[source or first_split])}"
            )
    name = task.name if task is not None else "custom task"
    splits = {}
    for split, path in files.items():
        has_label = split != "test" or (
            label_key in tables[split] and any(_label_key(v) != "" for v in tables[split][label_key])
        )
        index = next((c for c in _INDEX_COLUMNS if c in tables[split]), None)
        spec = GlueFile(str(path), sentence1_key, sentence2_key, label_key if has_label else None, index)
        splits[split] = normalize_split(
            tables[split], f"{path} ({split})", spec, names, regression, name, allow_class_ids=task is not None
        )
    return datasets.DatasetDict(splits)


def load_glue_hub(task: GlueTask, cache_dir: str | None = None) -> datasets.DatasetDict:
    """Load a task from the hub dataset ``nyu-mll/glue`` (or the local ``datasets`` cache when offline).

    Raises:
        InputError: when the dataset can be neither downloaded nor found in the cache (e.g. offline), saying to
            pass ``--glue_dir`` or ``--train_file``.
    """
    by_config: dict[str, list[tuple[str, str]]] = {}
    for ours, (hub_split, config) in task.hub_splits.items():
        by_config.setdefault(config or task.name, []).append((ours, hub_split))
    splits = {}
    for config, pairs in by_config.items():
        try:
            loaded = datasets.load_dataset("nyu-mll/glue", config, cache_dir=cache_dir)
        except Exception as err:  # noqa: BLE001 - connection / cache errors of many kinds
            if config != task.name:  # optional extra (the diagnostic set)
                continue
            mode = (
                "offline (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE set) and not in the local cache"
                if hub_offline()
                else f"unreachable ({type(err).__name__}: {err})"
            )
            raise InputError(
                f"--task_name {task.name}: the hub dataset nyu-mll/glue ({config}) is {mode}; pass "
                f"--glue_dir DIR (the official GLUE files) or --train_file/--validation_file"
            ) from None
        for ours, hub_split in pairs:
            ds = loaded[hub_split]
            rename = {task.hub_sentence1_key: "sentence1"}
            if task.hub_sentence2_key:
                rename[task.hub_sentence2_key] = "sentence2"
            ds = ds.rename_columns(rename).select_columns([*rename.values(), "label", "idx"])
            splits[ours] = ds.cast(_features(task.is_pair, task.label_names, task.is_regression))
    return datasets.DatasetDict(splits)


def load_glue_data(
    task_name: str | None = None,
    *,
    glue_dir: str | os.PathLike | None = None,
    train_file: str | os.PathLike | None = None,
    validation_file: str | os.PathLike | None = None,
    test_file: str | os.PathLike | None = None,
    sentence1_key: str | None = None,
    sentence2_key: str | None = None,
    label_key: str = "label",
    label_names: Sequence[str] | None = None,
    is_regression: bool | None = None,
    cache_dir: str | None = None,
) -> datasets.DatasetDict:
    """Load a GLUE task or a custom classification / regression task (see the module docstring).

    Source: ``glue_dir`` if given, else the files if any is given (the other keywords as
    :func:`load_custom_files`'s), else the hub (needs ``task_name``).

    Returns:
        ``DatasetDict`` of splits with columns ``sentence1``, [``sentence2``], ``label``, ``idx``. Label names:
        ``ds["train"].features["label"].names`` (absent for regression: the feature is ``float32``).

    Raises:
        InputError: unknown task (valid ones listed), no source, or any bad file.
    """
    task = get_task(task_name) if task_name else None
    if glue_dir is not None:
        if task is None:
            raise InputError("--glue_dir needs --task_name (one of the GLUE tasks)")
        return load_glue_dir(glue_dir, task)
    if train_file or validation_file or test_file:
        return load_custom_files(
            train_file,
            validation_file,
            test_file,
            task=task,
            sentence1_key=sentence1_key,
            sentence2_key=sentence2_key,
            label_key=label_key,
            label_names=label_names,
            is_regression=is_regression,
        )
    if task is None:
        raise InputError(
            "no data given: pass --task_name (GLUE, from the hub or --glue_dir) or "
            "--train_file/--validation_file for a custom task"
        )
    return load_glue_hub(task, cache_dir=cache_dir)


def label_names_of(dataset: datasets.Dataset | datasets.DatasetDict) -> list[str]:
    """Class names of a loaded split (or of the first split of a ``DatasetDict``); ``[]`` for regression."""
    if isinstance(dataset, datasets.DatasetDict):
        dataset = next(iter(dataset.values()))
    feature = dataset.features["label"]
    return list(feature.names) if isinstance(feature, datasets.ClassLabel) else []


def write_submission(
    output_dir: str | os.PathLike, task: GlueTask, split: str, idx: Sequence[int], predictions: Sequence[float]
) -> Path:
    """Write the GLUE submission file of one test split (``CoLA.tsv``, ``MNLI-m.tsv``, ...) atomically.

    The file has a header ``index\\tprediction`` and one line per example; predictions are class ids for
    CoLA / SST-2 / MRPC / QQP / WNLI, label names for MNLI / AX / QNLI / RTE, scores in [0, 5] for STS-B
    (:meth:`finetune.tasks.GlueTask.format_prediction`).

    Returns:
        The path written.
    """
    if split not in task.submission:
        raise InputError(
            f"task {task.name} has no GLUE submission file for split {split!r}; "
            f"expected one of {sorted(task.submission)}"
        )
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    target = out / task.submission[split]
    lines = ["index\tprediction"] + [f"{int(i)}\t{task.format_prediction(p)}" for i, p in zip(idx, predictions)]
    from core.files import write_text_atomic

    return write_text_atomic(target, "\n".join(lines) + "\n")
