"""A small span-QA sample for a first ``finetune.squad`` run, made offline from the bundled public-domain corpus.

Usage::

    python -m finetune.qa_sample --output_dir data/qa-sample [--train_questions 2000] [--eval_questions 200]

writes ``train.json`` and ``dev.json`` (SQuAD v1.1 layout) into ``--output_dir``. Each question is a sentence of a
paragraph of ``pretrain/corpus/train.txt.gz`` with one word (a name, a capitalised word or a number) replaced by
"what"; the answer is that word in the paragraph. Training and evaluation questions come from different paragraphs.
Cloze questions are easier than SQuAD's: the sample checks that the pipeline learns, it is not a benchmark.
Deterministic for the same ``--seed``.
"""

from __future__ import annotations

import dataclasses
import gzip
import importlib.util
import random
import re
import sys
from pathlib import Path
from typing import Any

from core.arguments import arg, parse_arguments
from core.errors import InputError, run_cli

#: Paragraph lengths (characters) used as contexts: long enough for several sentences, short enough for one window.
CONTEXT_CHARS = (300, 1200)
_SENTENCE = re.compile(r"[^.!?]+[.!?]")
_ANSWER = re.compile(r"\b(?:[A-Z][a-z]{2,}|\d+)\b")


def bundled_corpus() -> Path:
    """``pretrain/corpus/train.txt.gz`` of the installed package (found without importing ``pretrain``)."""
    spec = importlib.util.find_spec("pretrain")
    if spec is None or not spec.submodule_search_locations:
        raise InputError("the bundled corpus: the pretrain package is not installed; expected `pip install -e .`")
    return Path(list(spec.submodule_search_locations)[0]) / "corpus" / "train.txt.gz"


def cloze_question(context: str, rng: random.Random) -> dict[str, Any] | None:
    """One question on ``context``: a sentence (8 words or more, not the first) with one name, capitalised word or
    number replaced by "what"; the answer is that word, with its character offset in ``context``. None when the
    paragraph has no such sentence."""
    candidates = []
    for sentence in _SENTENCE.finditer(context):
        text = sentence.group(0)
        if len(text.split()) < 8:
            continue
        for word in _ANSWER.finditer(text):
            if word.start() > 0 and text[: word.start()].strip():  # not the sentence's first word
                candidates.append((sentence, word))
    if not candidates:
        return None
    sentence, word = rng.choice(candidates)
    text = sentence.group(0).strip()
    answer = word.group(0)
    question = (sentence.group(0)[: word.start()] + "what" + sentence.group(0)[word.end() :]).strip()
    question = question.rstrip(".!?") + "?"
    start = sentence.start() + word.start()
    assert context[start : start + len(answer)] == answer and text
    return {"question": question, "answers": {"text": [answer], "answer_start": [start]}}


def make_sample(corpus: Path, train_questions: int, eval_questions: int, seed: int = 0) -> dict[str, list[dict]]:
    """``{"train": [...], "dev": [...]}``: flat SQuAD examples (``id``, ``title``, ``context``, ``question``,
    ``answers``), one question per paragraph, training and evaluation paragraphs disjoint.

    Raises:
        InputError: the corpus has too few usable paragraphs for the numbers asked.
    """
    with gzip.open(corpus, "rt", encoding="utf-8") as f:
        paragraphs = [line.strip() for line in f if CONTEXT_CHARS[0] <= len(line.strip()) <= CONTEXT_CHARS[1]]
    rng = random.Random(seed)
    rng.shuffle(paragraphs)
    examples: list[dict] = []
    wanted = train_questions + eval_questions
    for context in paragraphs:
        qa = cloze_question(context, rng)
        if qa is not None:
            n = len(examples)
            examples.append({"id": f"sample-{n}", "title": f"paragraph {n}", "context": context, **qa})
        if len(examples) == wanted:
            break
    if len(examples) < wanted:
        raise InputError(
            f"--train_questions {train_questions} --eval_questions {eval_questions}: {corpus} has {len(examples)} "
            "usable paragraphs; expected fewer questions"
        )
    return {"train": examples[:train_questions], "dev": examples[train_questions:]}


@dataclasses.dataclass(frozen=True)
class SampleArguments:
    """``python -m finetune.qa_sample``: the output folder, the question counts and the seed."""

    output_dir: str = arg(help="folder for train.json and dev.json")
    train_questions: int = arg(2000, "training questions (default: 2000)")
    eval_questions: int = arg(200, "evaluation questions (default: 200)")
    seed: int = arg(0, "paragraph and word choice (default: 0)")


def main(argv=None) -> int:
    description = __doc__.split("\n\n")[0]
    (args,) = parse_arguments([SampleArguments], argv, prog="python -m finetune.qa_sample", description=description)
    if args.train_questions < 1 or args.eval_questions < 1:
        raise InputError("--train_questions / --eval_questions: expected at least 1 each")
    from finetune.squad_data import write_squad_json

    sample = make_sample(bundled_corpus(), args.train_questions, args.eval_questions, args.seed)
    out = Path(args.output_dir)
    for split, examples in sample.items():
        write_squad_json(examples, out / f"{split}.json", version="1.1")
    print(
        f"wrote {out}/train.json ({len(sample['train'])} questions) and {out}/dev.json ({len(sample['dev'])}); "
        f"next: python -m finetune.squad --model_name_or_path MODEL --train_file {out}/train.json "
        f"--validation_file {out}/dev.json --output_dir outputs/squad-sample"
    )
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
