"""Fixtures of the baseline tests: tiny configs and a word tokenizer trained on ``tiny_corpus``."""

from __future__ import annotations

from pathlib import Path

import pytest


def tiny_baseline_config(encoder_type: str = "cbow", **overrides):
    """A SesameBaselineConfig small enough for a CPU test."""
    from modeling.baselines import SesameBaselineConfig

    encoders = dict(ngram_buckets=97, cnn_num_filters=4, rnn_hidden_size=6, rnn_num_layers=2, treelstm_hidden_size=5)
    kwargs = dict(vocab_size=60, embedding_dim=8, encoder_type=encoder_type, **encoders, classifier_hidden_size=0)
    return SesameBaselineConfig(**{**kwargs, "num_labels": 3, **overrides})


@pytest.fixture
def tiny():
    return tiny_baseline_config


@pytest.fixture
def make_glue_dir():
    """``make_glue_dir(root)``: a miniature GLUE folder (``tests/finetune/conftest.py``'s), returned as its path."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "_finetune_conftest", Path(__file__).parents[1] / "finetune" / "conftest.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_glue_dir


@pytest.fixture
def word_tokenizer(tiny_corpus: Path, tmp_path: Path):
    from tokenizer.elmo_training import train_elmo_tokenizer

    return train_elmo_tokenizer([tiny_corpus], vocab_size=60, output_dir=tmp_path / "wordtok", lowercase=True)


@pytest.fixture(autouse=True)
def _seed_and_threads(seeded_single_thread):
    """Every test here: seed 0, one torch thread (tests/conftest.py)."""
