"""Fixtures of the pretrain tests: tiny corpora and a tiny WordPiece tokenizer, all written in tmp paths."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from _helpers import write_corpus

WORDS = (
    "the senate adjourned after a long debate on budget it rained in afternoon and streets of city were wet "
    "elizabeth walked to house spoke with her sister about ball whale rose from sea sailors shouted lowered boats "
    "congress shall make no law respecting an establishment religion quick brown fox jumps over lazy dog near river "
    "bank unbelievable extraordinary representatives constitutional"
).split()


def random_documents(
    n_docs: int, seed: int = 0, lines: tuple[int, int] = (2, 6), words: tuple[int, int] = (4, 30)
) -> list[list[str]]:
    rng = random.Random(seed)
    return [
        [" ".join(rng.choice(WORDS) for _ in range(rng.randint(*words))) + "." for _ in range(rng.randint(*lines))]
        for _ in range(n_docs)
    ]


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    write_corpus(root / "train.txt", random_documents(60, seed=1))
    write_corpus(root / "valid.txt.gz", random_documents(6, seed=2))
    return root


@pytest.fixture(scope="session")
def bert_tokenizer(corpus_dir, tmp_path_factory):
    from tokenizer.wordpiece import train_wordpiece_tokenizer

    return train_wordpiece_tokenizer(
        [corpus_dir / "train.txt"], 200, tmp_path_factory.mktemp("tok") / "wp", min_frequency=1
    )


@pytest.fixture(scope="session")
def corpus_tools():
    """The helpers above (test modules cannot import conftest reliably under importlib mode)."""
    import types

    return types.SimpleNamespace(write_corpus=write_corpus, random_documents=random_documents)


@pytest.fixture
def hub_url():
    """The URL of the project's Hub-compatible test server (tests/hub/hub_server.py) on 127.0.0.1, with one write
    token ``hf_alice_write_0123456789`` for user alice; stopped after the test."""
    from _launch import load_module

    path = Path(__file__).resolve().parents[1] / "hub" / "hub_server.py"
    server = (
        load_module(path, "sesame_tests_hub_server_for_pretrain")
        .HubServer({"hf_alice_write_0123456789": ("alice", "write")})
        .start()
    )
    try:
        yield server.url
    finally:
        server.stop()
