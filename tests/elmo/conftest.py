"""Fixtures of the ELMo-style tests: the sentences of ``tiny_corpus``, a tokenizer trained on it, tiny configs."""

from __future__ import annotations

from pathlib import Path

import pytest
from _tiny import tiny_elmo_kwargs


@pytest.fixture
def elmo_sentences(tiny_corpus: Path) -> list[str]:
    """The distinct sentences of the shared ``tiny_corpus`` fixture (6 sentences, ~70 words)."""
    return list(dict.fromkeys(line for line in tiny_corpus.read_text(encoding="utf-8").splitlines() if line))


@pytest.fixture
def elmo_tokenizer(tiny_corpus: Path, tmp_path: Path):
    from tokenizer.elmo_training import train_elmo_tokenizer

    return train_elmo_tokenizer([tiny_corpus], vocab_size=200, output_dir=tmp_path / "tok")


#: The tiny SesameElmo settings of the tests (``vocab_size`` 100): ``_tiny``'s, with two highway layers, a task BiLSTM
#: of 8 and no classifier dropout.
TINY_KWARGS = tiny_elmo_kwargs(100, num_highway_layers=2, task_hidden_size=8, classifier_dropout=0.0)


def tiny_config(vocab_size: int = 100, **overrides):
    """A SesameElmoConfig small enough for a CPU test (a few thousand parameters)."""
    from modeling.elmo import SesameElmoConfig

    return SesameElmoConfig(**{**TINY_KWARGS, "vocab_size": vocab_size, **overrides})


@pytest.fixture
def tiny():
    """The factory :func:`tiny_config` (import from a conftest is unreliable under importlib mode)."""
    return tiny_config


@pytest.fixture(autouse=True)
def _seed_and_threads(seeded_single_thread):
    """Seed, and one intra-op thread (tests/conftest.py): these models are tiny, and on a busy 2-core machine two
    OpenMP threads spin against each other (measured 20x slower steps)."""
