"""SQuAD-format question answering data: checked loading, hub loading, and v2-style unanswerable questions.

The official SQuAD JSON (Rajpurkar et al., 2016; v2.0: Rajpurkar, Jia & Liang, 2018) nests
``{"data": [{"title", "paragraphs": [{"context", "qas": [{"id", "question", "answers": [{"text",
"answer_start"}], "is_impossible"?}]}]}]}``. :func:`load_squad_file` flattens it into one example per question,
in the hub format of ``rajpurkar/squad``::

    {"id": str, "title": str, "context": str, "question": str,
     "answers": {"text": [str, ...], "answer_start": [int, ...]}}     # empty lists: unanswerable (v2)

``answer_start`` is a character offset into ``context``. Every example is checked before training starts;
refused input raises :class:`core.errors.InputError` naming the question id: malformed or undecodable JSON,
missing keys, an empty context or question, an ``answer_start`` whose span is not the answer text (or, with
``skip_misaligned_answers=True``, the answer is dropped and counted), an unanswerable question in v1 data,
duplicate ids. Files to predict (``require_answers=False``) may leave ``answers`` out.

:func:`make_unanswerable` builds SQuAD v2-style unanswerable questions from v1 data by pairing questions with
a paragraph of another article (deterministic for a seed); :func:`write_squad_json` writes examples back in the
nested format, e.g. for a ``--validation_file`` with unanswerable questions.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import random
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets

from core.errors import InputError
from training.pretrained import hub_offline

logger = logging.getLogger(__name__)

#: Features of a flat SQuAD example (as the hub's ``rajpurkar/squad``).
SQUAD_FEATURES = datasets.Features(
    {
        "id": datasets.Value("string"),
        "title": datasets.Value("string"),
        "context": datasets.Value("string"),
        "question": datasets.Value("string"),
        "answers": datasets.Sequence({"text": datasets.Value("string"), "answer_start": datasets.Value("int32")}),
    }
)


@dataclass
class SquadFileReport:
    """What :func:`load_squad_file` read and dropped.

    Attributes:
        path: the file.
        articles / paragraphs / questions: counts of what was kept.
        unanswerable: questions kept without an answer (v2).
        misaligned_answers: answers dropped because ``answer_start`` did not point at the answer text.
        dropped_questions: ids of questions dropped because all their answers were misaligned.
    """

    path: str
    articles: int = 0
    paragraphs: int = 0
    questions: int = 0
    unanswerable: int = 0
    misaligned_answers: int = 0
    dropped_questions: list[str] = field(default_factory=list)


def read_squad_json(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Read the ``data`` list of a SQuAD-format ``.json`` or ``.json.gz`` file.

    Raises:
        InputError: missing file, not UTF-8, malformed JSON, or no ``data`` list of articles.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: file not found; expected a SQuAD-format .json or .json.gz file")
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8-sig") as f:
            document = json.load(f)
    except UnicodeDecodeError as err:
        raise InputError(
            f"{path}: not valid UTF-8 ({err.reason} at byte {err.start}); expected a UTF-8 SQuAD-format JSON file"
        ) from None
    except json.JSONDecodeError as err:
        raise InputError(
            f"{path}: malformed JSON: {err.msg} at line {err.lineno} column {err.colno}; expected a SQuAD-format "
            "JSON file"
        ) from None
    except (OSError, EOFError, zlib.error) as err:  # a truncated or corrupt .gz, an unreadable file
        raise InputError(
            f"{path}: cannot read the file ({err}); expected a SQuAD-format .json or .json.gz file"
        ) from None
    if not isinstance(document, dict) or not isinstance(document.get("data"), list):
        found = sorted(document) if isinstance(document, dict) else type(document).__name__
        raise InputError(
            f"{path}: missing key 'data' (a list of articles) at the top level; found {found}; "
            f"expected the SQuAD layout {{'data': [{{'title', 'paragraphs': [{{'context', 'qas'}}]}}]}}"
        )
    return document["data"]


def _require(obj: Any, key: str, kind: type | tuple[type, ...], where: str, path: Path) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        found = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
        raise InputError(f"{path}: {where}: missing key {key!r}; found {found}")
    value = obj[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
        raise InputError(
            f"{path}: {where}: {key!r} is {type(value).__name__} {str(value)[:40]!r}; expected "
            f"{kind.__name__ if isinstance(kind, type) else ' or '.join(k.__name__ for k in kind)}"
        )
    return value


def parse_squad_articles(
    articles: Sequence[Any],
    path: str | os.PathLike,
    *,
    version_2_with_negative: bool = True,
    skip_misaligned_answers: bool = False,
    require_answers: bool = True,
) -> tuple[list[dict[str, Any]], SquadFileReport]:
    """Flatten and check SQuAD articles (see the module docstring for the example format and the checks).

    Args:
        articles: the ``data`` list of a SQuAD file.
        path: the file name for messages.
        version_2_with_negative: allow unanswerable questions (``is_impossible`` or no answers); with ``False``
            such a question is an error (SQuAD v1 training needs an answer per question).
        skip_misaligned_answers: drop (and count) answers whose ``answer_start`` does not point at their text
            instead of refusing the file; a question left with no answer is dropped.
        require_answers: every question needs an ``answers`` list (or ``is_impossible``), as training and
            evaluation do; ``False`` for prediction: questions without ``answers`` are read with empty answers
            (answers that are given are still checked), whatever ``version_2_with_negative`` says.

    Returns:
        (examples, report).

    Raises:
        InputError: naming the question id (or article / paragraph) for each refused input.
    """
    path = Path(path)
    report = SquadFileReport(str(path))
    examples: list[dict[str, Any]] = []
    seen: dict[str, str] = {}
    for a, article in enumerate(articles):
        paragraphs = _require(article, "paragraphs", list, f"article {a}", path)
        title = article.get("title", "") if isinstance(article.get("title", ""), str) else str(article["title"])
        report.articles += 1
        for p, paragraph in enumerate(paragraphs):
            where = f"article {a} ({title!r}) paragraph {p}"
            context = _require(paragraph, "context", str, where, path)
            qas = _require(paragraph, "qas", list, where, path)
            if not context.strip():
                ids = [qa.get("id") for qa in qas if isinstance(qa, dict)][:3]
                raise InputError(f"{path}: {where}: empty context (question ids {ids}); expected the passage text")
            report.paragraphs += 1
            for q, qa in enumerate(qas):
                qid = str(_require(qa, "id", (str, int), f"{where} question {q}", path))
                qwhere = f"question id {qid!r}"
                if qid in seen:
                    raise InputError(f"{path}: duplicate {qwhere} (in {seen[qid]} and {where}); ids must be unique")
                seen[qid] = where
                question = _require(qa, "question", str, qwhere, path)
                if not question.strip():
                    raise InputError(f"{path}: {qwhere}: empty question")
                if qa.get("is_impossible") or (not require_answers and "answers" not in qa):
                    answers = []
                elif "answers" not in qa:
                    raise InputError(
                        f"{path}: {qwhere} has no 'answers'; training and evaluation need them ([{{text, "
                        "answer_start}], or is_impossible: true in v2 data); questions without answers can be "
                        "predicted with --do_predict --test_file"
                    )
                else:
                    answers = _require(qa, "answers", list, qwhere, path)
                texts, starts = [], []
                for answer in answers:
                    text = _require(answer, "text", str, f"{qwhere} answer", path)
                    start = _require(answer, "answer_start", int, f"{qwhere} answer", path)
                    if start < 0 or context[start : start + len(text)] != text or not text:
                        if skip_misaligned_answers:
                            report.misaligned_answers += 1
                            continue
                        found = context[max(start, 0) : max(start, 0) + len(text)]
                        raise InputError(
                            f"{path}: {qwhere}: answer_start {start} does not point at the answer "
                            f"{text!r} in the context (found {found!r}); fix the offset, or pass "
                            f"--skip_misaligned_answers to drop such answers"
                        )
                    texts.append(text)
                    starts.append(start)
                if answers and not texts:  # every answer was misaligned and skipped
                    report.dropped_questions.append(qid)
                    continue
                if not texts:
                    if require_answers and not version_2_with_negative:
                        raise InputError(
                            f"{path}: {qwhere} has no answer (unanswerable); SQuAD v1 needs an answer "
                            f"for every question -- pass --version_2_with_negative for v2 data"
                        )
                    report.unanswerable += 1
                examples.append(
                    {
                        "id": qid,
                        "title": title,
                        "context": context,
                        "question": question,
                        "answers": {"text": texts, "answer_start": starts},
                    }
                )
                report.questions += 1
    if not examples:
        raise InputError(f"{path}: no questions (empty split); expected at least one question")
    if report.misaligned_answers:
        logger.warning(
            "%s: dropped %d misaligned answer(s) (%d question(s) left without answer dropped)",
            path,
            report.misaligned_answers,
            len(report.dropped_questions),
        )
    return examples, report


def load_squad_file(
    path: str | os.PathLike,
    *,
    version_2_with_negative: bool = True,
    skip_misaligned_answers: bool = False,
    require_answers: bool = True,
) -> tuple[datasets.Dataset, SquadFileReport]:
    """Load a SQuAD-format ``.json`` / ``.json.gz`` file into a ``datasets.Dataset`` of flat examples.

    Args / Raises: as :func:`parse_squad_articles` (plus :func:`read_squad_json`'s file errors).

    Returns:
        (dataset with :data:`SQUAD_FEATURES`, report of what was read and dropped).
    """
    examples, report = parse_squad_articles(
        read_squad_json(path),
        path,
        version_2_with_negative=version_2_with_negative,
        skip_misaligned_answers=skip_misaligned_answers,
        require_answers=require_answers,
    )
    return datasets.Dataset.from_list(examples, features=SQUAD_FEATURES), report


def load_squad_data(
    train_file: str | os.PathLike | None = None,
    validation_file: str | os.PathLike | None = None,
    *,
    dataset_name: str | None = None,
    version_2_with_negative: bool = False,
    skip_misaligned_answers: bool = False,
    cache_dir: str | None = None,
) -> tuple[datasets.DatasetDict, dict[str, SquadFileReport]]:
    """Load ``train`` / ``validation`` splits from local SQuAD files, or from the hub.

    Args:
        train_file / validation_file: local SQuAD-format files (``.json`` / ``.json.gz``).
        dataset_name: a hub dataset when no file is given: ``"squad"`` / ``"squad_v2"`` (= ``rajpurkar/...``)
            or any ``owner/name`` in the same format.
        version_2_with_negative: allow unanswerable questions (SQuAD v2).
        skip_misaligned_answers: drop misaligned answers instead of refusing the file.

    Returns:
        (``DatasetDict``, split -> :class:`SquadFileReport` for the local files).

    Raises:
        InputError: bad files (see :func:`parse_squad_articles`), no source, or the hub unreachable.
    """
    files = {s: f for s, f in (("train", train_file), ("validation", validation_file)) if f}
    if files:
        splits, reports = {}, {}
        for split, path in files.items():
            splits[split], reports[split] = load_squad_file(
                path, version_2_with_negative=version_2_with_negative, skip_misaligned_answers=skip_misaligned_answers
            )
        return datasets.DatasetDict(splits), reports
    if not dataset_name:
        raise InputError("no data given: pass --train_file/--validation_file (SQuAD-format JSON) or --dataset_name")
    repo = {"squad": "rajpurkar/squad", "squad_v2": "rajpurkar/squad_v2"}.get(dataset_name, dataset_name)
    try:
        loaded = datasets.load_dataset(repo, cache_dir=cache_dir)
    except Exception as err:  # noqa: BLE001 - connection / cache errors of many kinds
        state = "offline and not in the local cache" if hub_offline() else f"unreachable ({type(err).__name__}: {err})"
        raise InputError(
            f"--dataset_name {dataset_name}: the hub dataset {repo} is {state}; pass local SQuAD-format "
            f"files with --train_file/--validation_file"
        ) from None
    return datasets.DatasetDict({s: loaded[s] for s in ("train", "validation") if s in loaded}), {}


def make_unanswerable(
    examples: Iterable[dict[str, Any]], fraction: float = 0.5, seed: int = 0, id_suffix: str = "-unanswerable"
) -> list[dict[str, Any]]:
    """Add SQuAD v2-style unanswerable questions: questions paired with a paragraph of another article.

    For a random ``fraction`` of the questions (``random.Random(seed)``, so the result is deterministic), a
    copy with id ``<id><id_suffix>`` is added whose context is a paragraph of a *different* title (another
    paragraph of the same title when the data has a single title) that contains none of the question's gold
    answers (case-insensitive), with no answers. The original questions are kept,
    so a model must answer one and abstain on the other.

    Args:
        examples: flat SQuAD examples (:func:`load_squad_file` format).
        fraction: share of questions that get an unanswerable copy, in [0, 1].
        seed: random seed.
        id_suffix: appended to the question id of each copy.

    Returns:
        The examples followed by the unanswerable copies (a question is skipped when no other article has a
        paragraph without its answers).

    Raises:
        InputError: ``fraction`` outside [0, 1] or fewer than two paragraphs to pair across.
    """
    examples = list(examples)
    if not 0.0 <= fraction <= 1.0:
        raise InputError(f"fraction {fraction}: expected a share of questions in [0, 1]")
    unique: dict[str, dict[str, None]] = {}  # title -> its contexts, in order, without repeats
    for ex in examples:
        unique.setdefault(ex["title"], {})[ex["context"]] = None
    contexts = {title: list(ctx) for title, ctx in unique.items()}
    titles = sorted(contexts)
    if sum(len(c) for c in contexts.values()) < 2:
        raise InputError("make_unanswerable needs at least two different paragraphs to pair questions across")
    rng = random.Random(seed)
    chosen = sorted(rng.sample(range(len(examples)), round(fraction * len(examples))))
    extra = []
    for i in chosen:
        ex = examples[i]
        golds = [t.lower() for t in ex["answers"]["text"]]
        for _ in range(20):  # a few tries for a paragraph that does not contain the answer
            title = titles[rng.randrange(len(titles))]
            if title == ex["title"] and len(titles) > 1:
                continue
            context = contexts[title][rng.randrange(len(contexts[title]))]
            if context != ex["context"] and not any(g and g in context.lower() for g in golds):
                break
        else:
            continue
        extra.append(
            {
                "id": f"{ex['id']}{id_suffix}",
                "title": title,
                "context": context,
                "question": ex["question"],
                "answers": {"text": [], "answer_start": []},
            }
        )
    return examples + extra


def write_squad_json(examples: Iterable[dict[str, Any]], path: str | os.PathLike, version: str = "v2.0") -> Path:
    """Write flat examples in the nested SQuAD layout (``.json`` or ``.json.gz``), atomically.

    Questions of the same title and context are grouped into one paragraph; unanswerable questions get
    ``"is_impossible": true`` and ``"answers": []``.

    Returns:
        The path written.
    """
    path = Path(path)
    articles: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for ex in examples:
        paragraphs = articles.setdefault(ex["title"], {})
        qa = {
            "id": ex["id"],
            "question": ex["question"],
            "answers": [
                {"text": t, "answer_start": s} for t, s in zip(ex["answers"]["text"], ex["answers"]["answer_start"])
            ],
        }
        qa["is_impossible"] = not qa["answers"]
        paragraphs.setdefault(ex["context"], []).append(qa)
    document = {
        "version": version,
        "data": [
            {"title": title, "paragraphs": [{"context": c, "qas": qas} for c, qas in paragraphs.items()]}
            for title, paragraphs in articles.items()
        ],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    from core.files import open_atomic

    opener = gzip.open if path.name.lower().endswith(".gz") else open
    with open_atomic(path, "wt", opener=opener) as f:
        json.dump(document, f, ensure_ascii=False)
    return path
