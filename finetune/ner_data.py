"""Token-classification data for ``finetune.ner``: CoNLL files, tag schemes, sub-token alignment and windows.

* :func:`read_conll`: a CoNLL file -- one token per line, columns separated by a tab or by spaces, the tag in the
  *last* column (so CoNLL-2003's ``token POS chunk NER`` lines work), ``-DOCSTART-`` lines skipped, a sentence break
  at every empty or whitespace-only line (WNUT-17's training file ends sentences with a lone tab), CRLF line ends
  accepted. Every refusal names the file and the line.
* Tag schemes (Ramshaw & Marcus 1995; Tjong Kim Sang & Veenstra 1999): ``IOB1`` (an ``I-`` tag may start an entity;
  ``B-`` only between two adjacent entities of one type, as the original CoNLL-2003 files), ``IOB2`` (every entity
  starts with ``B-``), ``BIOES`` (also ``E-`` ends and ``S-`` single-token entities). :func:`detect_scheme` finds it
  in the training file, :func:`check_scheme` refuses a tag sequence that the scheme forbids.
* :func:`align_windows`: words -> the model's sub-tokens, the label of each word on its first sub-token (the
  others ``-100``, or with ``label_all_tokens`` the word's label with ``B-`` turned into ``I-``, as transformers'
  ``run_ner.py``), sentences longer than ``max_seq_length`` split into overlapping windows, each word scored in
  exactly one of them (the one where it has the most context on both sides, as SQuAD's ``doc_stride`` windows
  choose the answer's window).

Pure Python apart from the tokenizer passed in; no ``datasets`` needed.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Sequence
from pathlib import Path

from core.errors import InputError

#: Label id of sub-tokens that are not scored (ignored by the cross-entropy, as transformers' heads).
IGNORE_INDEX = -100
#: The tag schemes read and checked.
SCHEMES = ("IOB1", "IOB2", "BIOES")
DOCSTART = "-DOCSTART-"
_TAG = re.compile(r"^(?:O|([BIES])-(\S+))$")


@dataclasses.dataclass(frozen=True)
class Sentence:
    """One sentence of a CoNLL file.

    Attributes:
        words: the tokens (first column).
        tags: the tags (last column), or None for an unlabelled file.
        lines: the 1-based line number of each token, for messages.
    """

    words: tuple[str, ...]
    tags: tuple[str, ...] | None
    lines: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class ConllFile:
    """A read CoNLL file.

    Attributes:
        path: the file.
        sentences: its sentences in file order.
        lines: its lines without line ends, for writing predictions in the same layout.
        token_lines: for every line, the ``(sentence, word)`` it holds, or None (break, ``-DOCSTART-``).
        labelled: whether the lines carry a tag column.
    """

    path: str
    sentences: list[Sentence]
    lines: list[str]
    token_lines: list[tuple[int, int] | None]
    labelled: bool

    @property
    def tags(self) -> list[list[str]]:
        """The tag sequences (``[]`` per sentence for an unlabelled file)."""
        return [list(s.tags or ()) for s in self.sentences]


def _columns(line: str) -> list[str]:
    """A token line's columns: tab-separated when it has a tab (a token may then hold spaces), else whitespace."""
    return line.split("\t") if "\t" in line else line.split()


def read_conll(path: str | os.PathLike, flag: str, allow_unlabelled: bool = False) -> ConllFile:
    """Read a CoNLL file (see the module docstring).

    Args:
        path: the file (UTF-8; a BOM is skipped; ``\\r\\n`` or ``\\n`` line ends).
        flag: the command-line flag that named it (``--train_file``), for messages.
        allow_unlabelled: accept a file whose token lines all have one column (words only: a test file to tag).

    Returns:
        The :class:`ConllFile`.

    Raises:
        InputError: no such file, not UTF-8, an empty file, a file of only ``-DOCSTART-`` lines, a token line with one
            column in a labelled file (or with a tag column in an unlabelled one), a tag that is neither ``O`` nor
            ``B-``/``I-``/``E-``/``S-`` + type, a token or tag column that is empty -- naming the file and line.
    """
    where = f"{flag} {path}"
    try:
        text = Path(path).read_bytes().decode("utf-8-sig")
    except FileNotFoundError:
        raise InputError(f"{where}: no such file; expected a CoNLL file (token and tag columns)") from None
    except UnicodeDecodeError as err:
        raise InputError(f"{where}: not UTF-8 text ({err.reason} at byte {err.start}); expected UTF-8") from None
    except OSError as err:
        raise InputError(f"{where}: cannot be read ({err.strerror})") from None
    return _parse(text.splitlines(), where, allow_unlabelled, str(path))


def _parse(lines: list[str], where: str, allow_unlabelled: bool, path: str) -> ConllFile:
    """The :class:`ConllFile` of a file's ``lines`` (see :func:`read_conll`); ``where`` names it in messages."""
    if not any(line.strip() for line in lines):
        raise InputError(f"{where} line 1: the file is empty; expected CoNLL lines (token and tag columns)")
    sentences: list[Sentence] = []
    token_lines: list[tuple[int, int] | None] = []
    words: list[str] = []
    tags: list[str] = []
    numbers: list[int] = []
    labelled: bool | None = None
    docstarts: list[int] = []

    def close() -> None:
        if words:
            sentences.append(Sentence(tuple(words), tuple(tags) if labelled else None, tuple(numbers)))
            words.clear(), tags.clear(), numbers.clear()

    for number, line in enumerate(lines, 1):
        if not line.strip():
            close()
            token_lines.append(None)
            continue
        columns = _columns(line)
        if columns[0].strip() == DOCSTART:
            close()
            docstarts.append(number)
            token_lines.append(None)
            continue
        if labelled is None:
            labelled = len(columns) > 1 or not allow_unlabelled
        if labelled and len(columns) < 2:
            raise InputError(
                f"{where} line {number}: {line.strip()!r} has one column; expected a token and a tag column "
                "(tab or space separated, the tag last)"
            )
        if not labelled and len(columns) > 1:
            raise InputError(
                f"{where} line {number}: {line.strip()!r} has {len(columns)} columns, but the file's first token "
                "line has one; expected the same layout on every line"
            )
        word, tag = columns[0].strip(), columns[-1].strip() if labelled else None
        if not word or (labelled and not tag):
            raise InputError(f"{where} line {number}: {line!r} has an empty token or tag column; expected both")
        if tag is not None and not _TAG.match(tag):
            raise InputError(
                f"{where} line {number}: tag {tag!r} is not a named-entity tag; expected O or B-, I-, E-, S- "
                "followed by the entity type (the tag is the last column)"
            )
        token_lines.append((len(sentences), len(words)))
        words.append(word)
        numbers.append(number)
        if tag is not None:
            tags.append(tag)
    close()
    if not sentences:
        raise InputError(
            f"{where} line {docstarts[0]}: the file holds only -DOCSTART- lines, no sentence; expected token lines"
        )
    return ConllFile(path, sentences, lines, token_lines, bool(labelled))


def conll_from_dataset(split, name: str) -> ConllFile:
    """A ``datasets`` split with ``tokens`` (lists of words) and ``ner_tags`` (``ClassLabel`` ids as the hub's NER
    sets have them, or tag strings) as a :class:`ConllFile`: its CoNLL rendering (``token<TAB>tag`` lines, an empty
    line after each sentence), which refusals name by line and ``predictions.conll`` follows.

    Args:
        split: the ``datasets.Dataset``.
        name: how messages name it (``"wnut_17[validation]"``, after ``--dataset_name``).

    Raises:
        InputError: no ``tokens`` / ``ner_tags`` column, a sentence whose tag count differs from its token count, a
            token with whitespace (the rendering could not be read back), a tag that is not a named-entity tag, an
            empty split.
    """
    where = f"--dataset_name {name}"
    missing = [c for c in ("tokens", "ner_tags") if c not in split.column_names]
    if missing:
        raise InputError(
            f"{where}: no {' / '.join(missing)} column (found {split.column_names}); expected tokens and ner_tags"
        )
    feature = split.features["ner_tags"]
    names = getattr(getattr(feature, "feature", None), "names", None)  # Sequence(ClassLabel)
    lines: list[str] = []
    for i, (words, tags) in enumerate(zip(split["tokens"], split["ner_tags"])):
        tags = [names[t] if names else str(t) for t in tags]
        if len(words) != len(tags):
            raise InputError(
                f"{where} example {i}: {len(words)} tokens but {len(tags)} tags; expected one tag per token"
            )
        for word, tag in zip(words, tags):
            if not word or any(c.isspace() for c in word):
                raise InputError(f"{where} example {i}: token {word!r} is empty or holds whitespace; expected words")
            lines.append(f"{word}\t{tag}")
        lines.append("")
    return _parse(lines, where, allow_unlabelled=False, path=name)


def _split(tag: str) -> tuple[str, str | None]:
    """``"B-PER"`` -> ``("B", "PER")``, ``"O"`` -> ``("O", None)``."""
    return (tag[0], tag[2:]) if tag != "O" else ("O", None)


def detect_scheme(files: Sequence[ConllFile]) -> str:
    """The tag scheme of labelled files: ``BIOES`` when an ``E-`` or ``S-`` tag occurs; ``IOB2`` when some ``B-``
    starts an entity after ``O``, another type or the sentence start (IOB1 uses ``B-`` only after the same type);
    ``IOB1`` when an ``I-`` tag starts an entity and no ``B-`` does; else ``IOB2``."""
    sequences = [sentence.tags or () for file in files for sentence in file.sentences]
    if any(tag[:2] in ("E-", "S-") for tags in sequences for tag in tags):
        return "BIOES"
    iob1_hint = False
    for tags in sequences:
        previous = None
        for tag in tags:
            prefix, kind = _split(tag)
            starts = previous is None or previous[1] != kind
            if prefix == "B" and starts:
                return "IOB2"
            if prefix == "I" and starts:
                iob1_hint = True
            previous = (prefix, kind)
    return "IOB1" if iob1_hint else "IOB2"


def check_scheme(file: ConllFile, scheme: str, flag: str) -> None:
    """Refuse the first tag of ``file`` that ``scheme`` forbids.

    IOB2: ``I-X`` only after ``B-X`` / ``I-X``. IOB1: ``B-X`` only after ``I-X`` / ``B-X``; no ``E-``/``S-``.
    BIOES: ``I-X`` / ``E-X`` only after ``B-X`` / ``I-X``; after ``B-X`` / ``I-X`` only ``I-X`` / ``E-X``.

    Raises:
        InputError: naming the file, the line, the tag and what the scheme expects there.
    """
    if scheme not in SCHEMES:
        raise InputError(f"--tag_scheme {scheme}: expected one of {', '.join(SCHEMES)}")
    for sentence in file.sentences:
        previous: tuple[str, str | None] = ("O", None)
        for tag, number in zip(sentence.tags or (), sentence.lines):
            prefix, kind = _split(tag)
            inside = previous[0] in "BI" and previous[1] == kind  # continues the open entity of this type
            problem = None
            if scheme != "BIOES" and prefix in "ES":
                problem = f"{scheme} has no {prefix}- tags"
            elif scheme == "IOB2" and prefix == "I" and not inside:
                problem = f"IOB2 starts every entity with B-; I-{kind} must follow B-{kind} or I-{kind}"
            elif scheme == "IOB1" and prefix == "B" and not inside:
                problem = f"IOB1 uses B-{kind} only right after an entity of the same type (I-{kind} or B-{kind})"
            elif scheme == "BIOES":
                if prefix in "IE" and not inside:
                    problem = f"BIOES: {prefix}-{kind} must follow B-{kind} or I-{kind}"
                elif previous[0] in "BI" and not (prefix in "IE" and inside):
                    problem = f"BIOES: after {previous[0]}-{previous[1]} expected I-{previous[1]} or E-{previous[1]}"
            if problem:
                raise InputError(f"{flag} {file.path} line {number}: tag {tag!r}: {problem}")
            previous = (prefix, kind)
        if scheme == "BIOES" and previous[0] in "BI":
            raise InputError(
                f"{flag} {file.path} line {sentence.lines[-1]}: the sentence ends inside {previous[0]}-{previous[1]}; "
                f"BIOES expects E-{previous[1]} to end it"
            )


def check_known_tags(file: ConllFile, label_names: Sequence[str], flag: str, source: str) -> None:
    """Refuse a tag of ``file`` that is not in ``label_names`` (the model could never predict it).

    Raises:
        InputError: naming the file, the line, the tag and the known tags (from ``source``).
    """
    known = set(label_names)
    for sentence in file.sentences:
        for tag, number in zip(sentence.tags or (), sentence.lines):
            if tag not in known:
                raise InputError(
                    f"{flag} {file.path} line {number}: tag {tag!r} is not among the {len(known)} tags of {source} "
                    f"({', '.join(sorted(known))}); expected one of them"
                )


@dataclasses.dataclass(frozen=True)
class Window:
    """One model input cut from a sentence.

    Attributes:
        sentence: the sentence's index.
        start, end: the words ``[start, end)`` it holds.
        scored: the words ``[first, last)`` scored in this window (each word of a sentence is scored in exactly one).
    """

    sentence: int
    start: int
    end: int
    scored: tuple[int, int]


def plan_windows(counts: Sequence[int], budget: int, stride: int, sentence: int = 0) -> list[Window]:
    """Cut a sentence of words with ``counts`` sub-tokens each into windows of at most ``budget`` sub-tokens.

    Each window after the first starts so that it repeats the last words of the one before, up to ``stride``
    sub-tokens of them (at least one word further on, so it always moves). Each word is scored in the window where
    its distance to the nearer edge is largest (ties: the earlier window), so every word gets exactly one
    prediction; a word longer than ``budget`` counts as ``budget`` (its tail is cut; its first sub-token stays).

    Args:
        counts: sub-tokens per word (>= 1 each; 0 is counted as 1: a word the tokenizer drops still gets a slot).
        budget: the sub-tokens a window holds (``max_seq_length`` minus the special tokens), >= 1.
        stride: the overlap between windows in sub-tokens, >= 0.
        sentence: the sentence index stored in the windows.

    Returns:
        The windows in order; one window ``[0, n)`` when the sentence fits.
    """
    counts = [min(max(c, 1), budget) for c in counts]
    n = len(counts)
    spans: list[tuple[int, int]] = []
    start = 0
    while True:
        end, used = start, 0
        while end < n and used + counts[end] <= budget:
            used += counts[end]
            end += 1
        spans.append((start, end))
        if end >= n:
            break
        nxt, overlap = end, 0
        while nxt - 1 > start and overlap + counts[nxt - 1] <= stride:
            nxt -= 1
            overlap += counts[nxt]
        start = max(nxt, start + 1)
    owner = []
    for i in range(n):
        best = max(
            (k for k, (a, b) in enumerate(spans) if a <= i < b),
            key=lambda k: (min(i - spans[k][0], spans[k][1] - 1 - i), -k),
        )
        owner.append(best)
    windows = []
    for k, (a, b) in enumerate(spans):
        mine = [i for i in range(a, b) if owner[i] == k]
        scored = (mine[0], mine[-1] + 1) if mine else (a, a)
        windows.append(Window(sentence, a, b, scored))
    return windows


def subtoken_counts(tokenizer, words: Sequence[str]) -> list[int]:
    """Sub-tokens of each word as the tokenizer splits pre-split words (``is_split_into_words``): from the encoding's
    ``word_ids`` for a fast tokenizer, else from each word encoded alone."""
    if not words:
        return []
    if getattr(tokenizer, "is_fast", False):
        encoding = tokenizer(list(words), is_split_into_words=True, add_special_tokens=False)
        counts = [0] * len(words)
        for w in encoding.word_ids():
            if w is not None:
                counts[w] += 1
        return counts
    return [len(tokenizer([w], is_split_into_words=True, add_special_tokens=False)["input_ids"]) for w in words]


def _first_subtokens(tokenizer, encoding: dict, counts: Sequence[int], row: int | None = None) -> list[int]:
    """The position of each word's first sub-token in one encoded window (``counts`` as encoded, capped)."""
    if getattr(tokenizer, "is_fast", False) and hasattr(encoding, "word_ids"):
        word_ids = encoding.word_ids(row) if row is not None else encoding.word_ids()
        firsts: dict[int, int] = {}
        for pos, w in enumerate(word_ids):
            if w is not None and w not in firsts:
                firsts[w] = pos
        return [firsts.get(i, -1) for i in range(len(counts))]
    special = encoding["special_tokens_mask"] if row is None else encoding["special_tokens_mask"][row]
    content = [pos for pos, s in enumerate(special) if not s]
    firsts, offset = [], 0
    for c in counts:
        firsts.append(content[offset] if offset < len(content) and c > 0 else -1)
        offset += c
    return firsts


def align_windows(
    tokenizer,
    sentences: Sequence[Sentence],
    label2id: dict[str, int] | None,
    max_seq_length: int,
    stride: int,
    label_all_tokens: bool = False,
) -> tuple[list[dict], list[Window], list[list[int]]]:
    """Tokenize sentences into model inputs (see the module docstring).

    Args:
        tokenizer: a transformers tokenizer (fast or slow, e.g. SesameElmo's word tokenizer).
        sentences: the sentences (tags needed when ``label2id`` is given).
        label2id: tag -> model label id; None: no ``labels`` (an unlabelled file).
        max_seq_length: the most tokens of one input, special tokens included.
        stride: the overlap of consecutive windows of a long sentence, in sub-tokens.
        label_all_tokens: label every sub-token (``B-X`` -> ``I-X`` after the first when ``I-X`` is a label), not
            only each word's first.

    Returns:
        ``(features, windows, firsts)``: per window the tokenizer's output (lists; ``labels`` with -100 where not
        scored), the :class:`Window`, and for every word of the window the position of its first sub-token (-1 for a
        word the tokenizer drops entirely).

    Raises:
        InputError: ``max_seq_length`` leaves no room for a word after the special tokens.
    """
    budget = max_seq_length - tokenizer.num_special_tokens_to_add(pair=False)
    if budget < 1:
        raise InputError(f"--max_seq_length {max_seq_length}: leaves no room for a word after the special tokens")
    features, windows, firsts = [], [], []
    for index, sentence in enumerate(sentences):
        counts = subtoken_counts(tokenizer, sentence.words)
        for window in plan_windows(counts, budget, stride, index):
            words = list(sentence.words[window.start : window.end])
            encoding = tokenizer(
                words,
                is_split_into_words=True,
                truncation=True,
                max_length=max_seq_length,
                return_special_tokens_mask=True,
            )
            capped = [min(c, budget) for c in counts[window.start : window.end]]
            first = _first_subtokens(tokenizer, encoding, capped)
            feature = {k: list(v) for k, v in encoding.items() if k != "special_tokens_mask"}
            if label2id is not None:
                labels = [IGNORE_INDEX] * len(feature["input_ids"])
                tags = sentence.tags[window.start : window.end]
                for i, (pos, tag) in enumerate(zip(first, tags)):
                    word = window.start + i
                    if pos < 0 or not window.scored[0] <= word < window.scored[1]:
                        continue
                    labels[pos] = label2id[tag]
                    if label_all_tokens:
                        inner = "I-" + tag[2:] if tag.startswith("B-") and "I-" + tag[2:] in label2id else tag
                        for p in range(pos + 1, pos + min(capped[i], len(labels) - pos)):
                            labels[p] = label2id[inner]
                feature["labels"] = labels
            features.append(feature)
            windows.append(window)
            firsts.append(first)
    return features, windows, firsts


def word_predictions(
    sentences: Sequence[Sentence],
    windows: Sequence[Window],
    firsts: Sequence[list[int]],
    token_predictions,
    fallback: int,
) -> list[list[int]]:
    """Put the windows' predictions back on the words: word ``i`` of a sentence takes the prediction at its first
    sub-token in the window that scores it.

    Args:
        sentences, windows, firsts: as returned by :func:`align_windows` (windows in dataset order).
        token_predictions: per window, the predicted label id of every position (a sequence or a 1-D array).
        fallback: the label id of a word with no sub-token in its window (a word the tokenizer drops), e.g. ``O``.

    Returns:
        Per sentence, one label id per word.

    Raises:
        AssertionError: a word scored in no window or in several (a bug of :func:`plan_windows`).
    """
    out: list[list[int | None]] = [[None] * len(s.words) for s in sentences]
    for window, first, predicted in zip(windows, firsts, token_predictions):
        for word in range(*window.scored):
            assert out[window.sentence][word] is None, f"word {word} of sentence {window.sentence} scored twice"
            pos = first[word - window.start]
            out[window.sentence][word] = int(predicted[pos]) if pos >= 0 else fallback
    missing = [(s, w) for s, row in enumerate(out) for w, v in enumerate(row) if v is None]
    assert not missing, f"words scored in no window: {missing[:5]}"
    return out  # type: ignore[return-value]


def write_predictions_conll(path: str | os.PathLike, file: ConllFile, predicted: Sequence[Sequence[str]]) -> Path:
    """Write ``predicted`` tags in ``file``'s layout, atomically: every line as it was (``-DOCSTART-``, sentence
    breaks, all columns), each token line with its predicted tag appended as a last column, separated as the line
    separates its columns (tab or space) -- CoNLL's evaluation layout ``token ... gold predicted`` (``token
    predicted`` for an unlabelled file)."""
    from core.files import write_text_atomic

    rows = []
    for line, where in zip(file.lines, file.token_lines):
        if where is None:
            rows.append(line)
        else:
            sep = "\t" if "\t" in line else " "
            rows.append(line.rstrip(" \t") + sep + predicted[where[0]][where[1]])
    return write_text_atomic(Path(path), "".join(r + "\n" for r in rows))


__all__ = [
    "DOCSTART",
    "IGNORE_INDEX",
    "SCHEMES",
    "ConllFile",
    "Sentence",
    "Window",
    "align_windows",
    "check_known_tags",
    "check_scheme",
    "conll_from_dataset",
    "detect_scheme",
    "plan_windows",
    "read_conll",
    "subtoken_counts",
    "word_predictions",
    "write_predictions_conll",
]
