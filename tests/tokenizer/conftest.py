"""Fixtures of the tokenizer tests: small corpora written into tmp folders, and a trained WordPiece tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest
from _helpers import write_text

SENTENCES = [
    "After a long debate on the budget, the Senate adjourned until Monday.",
    "It rained all afternoon, and the city streets were wet and empty.",
    "Her sister spoke with Elizabeth about the ball as they walked to the house.",
    "The sailors shouted when the whale rose from the sea, and they lowered the boats.",
    "No law respecting an establishment of religion shall be made by Congress.",
    "Near the river bank the lazy dog slept while a quick brown fox jumped over it.",
    "The President delivered his annual message to the Congress in December.",
    "Our commerce with foreign nations has grown, and the revenue exceeded expectations.",
    "She didn't know whether the letter had arrived before the storm.",
    '"Nothing," said the captain, "is more certain than the tide."',
    "The café on the corner served coffee, tea and bread to the travellers.",
    "Agriculture, manufactures and navigation deserve the attention of the legislature.",
    "The treaty was ratified by the states after a year of negotiation.",
    "He adjourned the meeting; nobody objected to the proposal.",
    "Is the ship safe? Yes! The crew (all 1803 of them) sailed north-west: wind & rain.",
    "Naïve travellers asked the sailors about the ship and the sea.",
]


def write_lines(path: Path, lines: list[str]) -> Path:
    """Write ``lines`` (one paragraph each) as UTF-8 text, gzip-compressed when the name ends in ``.gz``."""
    return write_text(path, "\n".join(lines) + "\n")


def corpus_lines(repeat: int = 8) -> list[str]:
    """The sentences, each repeated, in a shuffled-looking fixed order, with blank lines between blocks."""
    lines = []
    for r in range(repeat):
        lines += [SENTENCES[(r * 5 + i) % len(SENTENCES)] for i in range(len(SENTENCES))] + [""]
    return lines


@pytest.fixture(name="write_lines")
def write_lines_fixture():
    """:func:`write_lines` (test modules cannot import conftest under --import-mode=importlib)."""
    return write_lines


@pytest.fixture(name="corpus_lines")
def corpus_lines_fixture():
    """:func:`corpus_lines`."""
    return corpus_lines


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory) -> Path:
    """A plain-text corpus of the sentences above (~1.1k words)."""
    return write_lines(tmp_path_factory.mktemp("corpus") / "corpus.txt", corpus_lines())


@pytest.fixture(scope="module")
def trained(tmp_path_factory, corpus_file):
    """``(tokenizer, folder)``: an uncased WordPiece tokenizer, vocab_size 200, trained on ``corpus_file``
    and saved in ``folder``."""
    from tokenizer.wordpiece import train_wordpiece_tokenizer

    out = tmp_path_factory.mktemp("tok") / "uncased"
    return train_wordpiece_tokenizer([corpus_file], vocab_size=200, output_dir=out), out


@pytest.fixture(scope="module")
def trained_dir(trained) -> Path:
    """The folder of ``trained``."""
    return trained[1]


@pytest.fixture(scope="module")
def tok(trained_dir):
    """The tokenizer of ``trained_dir`` loaded with ``AutoTokenizer``."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(trained_dir)
