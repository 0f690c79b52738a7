"""The GLUE task table: inputs, labels, metrics, the official GLUE-directory layout, submission files.

One :class:`GlueTask` per task of the GLUE benchmark (Wang et al., 2019, "GLUE: A Multi-Task Benchmark and
Analysis Platform for Natural Language Understanding"), looked up by name with :func:`get_task`:

* ``hub_*``: how the task appears in the hub dataset ``nyu-mll/glue`` (config, input columns, split names).
  ``label_names`` are in the hub's class-id order (``mnli``: entailment / neutral / contradiction, ...), so a
  model fine-tuned here has the same ``id2label`` as one fine-tuned on the hub data.
* ``files``: the official GLUE directory written by GLUE's ``download_glue_data.py`` (``CoLA/train.tsv``
  without header, ``MNLI/dev_matched.tsv``, ...), one :class:`GlueFile` per split, all read as unquoted TSV.
* ``submission``: the file name of each test split in a GLUE leaderboard submission (``CoLA.tsv``,
  ``MNLI-m.tsv``, ``AX.tsv``, ...) and how a prediction is written (class id, label name, or a score).
* ``metric_config``: the configuration of the shipped ``glue`` metric module (``finetune/metrics/glue``),
  which combines accuracy / F1 / Matthews correlation / Pearson / Spearman as GLUE does.

Pure data, no heavy imports: the fine-tuning script, the data loader and the tests all read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from core.errors import InputError

# Column names of the files written by GLUE's download script (used by several tasks below).
_COLA_COLUMNS = ("source", "label", "label_notes", "sentence")
_MNLI_TEXT = ("sentence1", "sentence2")


@dataclass(frozen=True)
class GlueFile:
    """One split of a task in the official GLUE directory (``--glue_dir``).

    Attributes:
        path: file path relative to the GLUE directory, e.g. ``"CoLA/train.tsv"``.
        sentence1: column of the first (or only) text.
        sentence2: column of the second text of a pair task, ``None`` for single-sentence tasks.
        label: label column, ``None`` for test files (GLUE test labels are not public).
        index: id column written back in the submission file (test files), ``None`` = row number.
        column_names: the column names for a file without a header row (CoLA train/dev), ``None`` when the
            first row is the header.
        optional: the split is loaded only when the file exists (e.g. the diagnostic set ``AX``).
    """

    path: str
    sentence1: str
    sentence2: str | None
    label: str | None
    index: str | None = None
    column_names: tuple[str, ...] | None = None
    optional: bool = False


@dataclass(frozen=True)
class GlueTask:
    """A GLUE task: inputs, labels, metric, file layout and submission format.

    Attributes:
        name: the ``--task_name`` (lower case, as the hub config: ``"sst2"``, ``"stsb"``, ...).
        hub_sentence1_key / hub_sentence2_key: input columns in ``nyu-mll/glue`` (``None``: single sentence).
        label_names: class names in class-id order (hub order); empty for the regression task STS-B.
        metric_config: configuration name of the shipped ``glue`` metric module.
        main_metric: the metric the GLUE leaderboard ranks by (first of the task's metrics).
        files: split name -> :class:`GlueFile` of the official GLUE directory.
        hub_splits: split name here -> (split name in ``nyu-mll/glue``, hub config when not the task's, else "").
        submission: test split name -> file name in a GLUE submission (``"MNLI-m.tsv"``).
        submission_format: how a prediction is written in the submission file: ``"id"`` (class id, e.g. CoLA
            ``0``/``1``), ``"name"`` (label name, e.g. MNLI ``entailment``) or ``"score"`` (STS-B, a float
            clipped to [0, 5] written with 3 decimals).
    """

    name: str
    hub_sentence1_key: str
    hub_sentence2_key: str | None
    label_names: tuple[str, ...]
    metric_config: str
    main_metric: str
    files: dict[str, GlueFile]
    submission: dict[str, str]
    submission_format: str
    hub_splits: dict[str, tuple[str, str]] = field(
        default_factory=lambda: {"train": ("train", ""), "validation": ("validation", ""), "test": ("test", "")}
    )

    @property
    def is_regression(self) -> bool:
        """True for STS-B (a similarity score in [0, 5]), False for classification tasks."""
        return not self.label_names

    @property
    def num_labels(self) -> int:
        """Size of the classification head: the number of classes, 1 for regression."""
        return len(self.label_names) or 1

    @property
    def is_pair(self) -> bool:
        """True for sentence-pair tasks."""
        return self.hub_sentence2_key is not None

    @property
    def test_splits(self) -> list[str]:
        """Unlabelled test splits (each gives one submission file)."""
        return [s for s in self.files if s.startswith("test")]

    def format_prediction(self, prediction: float | int) -> str:
        """Format one prediction for the GLUE submission file (class id, label name or score)."""
        if self.submission_format == "score":
            return f"{min(max(float(prediction), 0.0), 5.0):.3f}"
        if self.submission_format == "name":
            return self.label_names[int(prediction)]
        return str(int(prediction))


def _standard_files(dir_name: str, s1: str, s2: str | None, label: str) -> dict[str, GlueFile]:
    """train/dev with a header and a label column, test with an ``index`` column and no label."""
    return {
        "train": GlueFile(f"{dir_name}/train.tsv", s1, s2, label),
        "validation": GlueFile(f"{dir_name}/dev.tsv", s1, s2, label),
        "test": GlueFile(f"{dir_name}/test.tsv", s1, s2, None, index="index"),
    }


def _hub(**splits: str) -> dict[str, tuple[str, str]]:
    return {ours: (hub.split(":")[0], hub.split(":")[1] if ":" in hub else "") for ours, hub in splits.items()}


def _task(
    name: str, keys: tuple, labels: tuple, metric: str, fmt: str, files: dict | tuple, submission=None, **hub
) -> GlueTask:
    """One row of the table. The name is also the metric configuration; ``files``: a dict, or the arguments of
    :func:`_standard_files`; ``submission`` defaults to ``{"test": "<directory of the test file>.tsv"}``;
    ``hub``: the :func:`_hub` splits when not the default."""
    files = _standard_files(*files) if isinstance(files, tuple) else files
    submission = submission or {"test": files["test"].path.split("/")[0] + ".tsv"}
    extra = {"hub_splits": _hub(**hub)} if hub else {}
    return GlueTask(name, *keys, labels, name, metric, files, submission, fmt, **extra)


_PAIR = ("sentence1", "sentence2")
_ENTAIL = ("entailment", "not_entailment")
_MNLI_LABELS = ("entailment", "neutral", "contradiction")
_MNLI_FILES = {
    "train": GlueFile("MNLI/train.tsv", *_MNLI_TEXT, "gold_label"),
    "validation_matched": GlueFile("MNLI/dev_matched.tsv", *_MNLI_TEXT, "gold_label"),
    "validation_mismatched": GlueFile("MNLI/dev_mismatched.tsv", *_MNLI_TEXT, "gold_label"),
    "test_matched": GlueFile("MNLI/test_matched.tsv", *_MNLI_TEXT, None, index="index"),
    "test_mismatched": GlueFile("MNLI/test_mismatched.tsv", *_MNLI_TEXT, None, index="index"),
    # The diagnostic set (AX) is predicted with the MNLI model and submitted as AX.tsv.
    "test_ax": GlueFile("diagnostic/diagnostic.tsv", *_MNLI_TEXT, None, index="index", optional=True),
}
_MNLI_SUBMISSION = {"test_matched": "MNLI-m.tsv", "test_mismatched": "MNLI-mm.tsv", "test_ax": "AX.tsv"}
_MNLI_HUB = {s: s for s in _MNLI_FILES} | {"test_ax": "test:ax"}
_COLA_FILES = {
    "train": GlueFile("CoLA/train.tsv", "sentence", None, "label", column_names=_COLA_COLUMNS),
    "validation": GlueFile("CoLA/dev.tsv", "sentence", None, "label", column_names=_COLA_COLUMNS),
    "test": GlueFile("CoLA/test.tsv", "sentence", None, None, index="index"),
}
_QQP_FILES = {
    "train": GlueFile("QQP/train.tsv", "question1", "question2", "is_duplicate"),
    "validation": GlueFile("QQP/dev.tsv", "question1", "question2", "is_duplicate"),
    "test": GlueFile("QQP/test.tsv", "question1", "question2", None, index="id"),
}

GLUE_TASKS: dict[str, GlueTask] = {
    t.name: t
    for t in (
        _task("cola", ("sentence", None), ("unacceptable", "acceptable"), "matthews_correlation", "id", _COLA_FILES),
        _task(
            "sst2", ("sentence", None), ("negative", "positive"), "accuracy", "id", ("SST-2", "sentence", None, "label")
        ),
        _task(
            "mrpc", _PAIR, ("not_equivalent", "equivalent"), "f1", "id", ("MRPC", "#1 String", "#2 String", "Quality")
        ),
        _task("qqp", ("question1", "question2"), ("not_duplicate", "duplicate"), "f1", "id", _QQP_FILES),
        _task("stsb", _PAIR, (), "pearson", "score", ("STS-B", *_PAIR, "score")),
        _task(
            "mnli",
            ("premise", "hypothesis"),
            _MNLI_LABELS,
            "accuracy",
            "name",
            _MNLI_FILES,
            _MNLI_SUBMISSION,
            **_MNLI_HUB,
        ),
        _task("qnli", ("question", "sentence"), _ENTAIL, "accuracy", "name", ("QNLI", "question", "sentence", "label")),
        _task("rte", _PAIR, _ENTAIL, "accuracy", "name", ("RTE", *_PAIR, "label")),
        # WNLI files use 1 = entailment, as the hub's class ids.
        _task("wnli", _PAIR, ("not_entailment", "entailment"), "accuracy", "id", ("WNLI", *_PAIR, "label")),
    )
}

#: Valid ``--task_name`` values, in the GLUE paper's order.
TASK_NAMES: tuple[str, ...] = tuple(GLUE_TASKS)


def get_task(name: str) -> GlueTask:
    """Look up a GLUE task by name (case-insensitive; ``"sst-2"``/``"sts-b"`` spellings accepted).

    Raises:
        InputError: for an unknown name, listing the valid ones.
    """
    key = name.lower().replace("-", "")
    if key not in GLUE_TASKS:
        raise InputError(f"--task_name {name!r}: unknown GLUE task; expected one of {', '.join(TASK_NAMES)}")
    return GLUE_TASKS[key]
