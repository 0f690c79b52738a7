"""Fixtures of the mixed-precision tests: tiny SesameBert / SesameElmo configs and padded batches (made here)."""

from __future__ import annotations

import pytest
import torch

import modeling  # noqa: F401  (registers the Auto classes)

BERT_TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                 max_position_embeddings=64, vocab_size=60)
ELMO_TINY = dict(vocab_size=60, char_embedding_dim=8, cnn_filters=[[1, 8], [2, 8], [3, 16]], num_highway_layers=2,
                 projection_dim=16, cell_size=32, num_layers=2, dropout=0.0, task_hidden_size=8,
                 classifier_hidden_size=16, classifier_dropout=0.0, num_sampled=16, cnn_pool_filters=4)


def bert_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """The (3, 12) BERT batch of the SesameBert tests: padding in rows 1 and 2, two segments."""
    from bert.conftest import padded_batch  # tests/ is on sys.path (pyproject's pythonpath)

    return padded_batch(BERT_TINY["vocab_size"], seed)


def elmo_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """(3, 7) ELMo batch: random character ids, right padding, word ids, a question/context split per row."""
    g = torch.Generator().manual_seed(seed)
    char_ids = torch.randint(1, 200, (3, 7, 50), generator=g)
    attention_mask = torch.ones(3, 7, dtype=torch.long)
    attention_mask[1, 5:] = 0
    attention_mask[2, 3:] = 0
    char_ids[attention_mask == 0] = 0
    input_ids = torch.randint(3, ELMO_TINY["vocab_size"], (3, 7), generator=g).masked_fill(attention_mask == 0, 0)
    token_type_ids = torch.zeros(3, 7, dtype=torch.long)
    token_type_ids[0, 4:] = 1
    token_type_ids[1, 3:5] = 1
    token_type_ids[2, 2:3] = 1
    return dict(char_ids=char_ids, attention_mask=attention_mask, input_ids=input_ids, token_type_ids=token_type_ids)


@pytest.fixture
def device() -> torch.device:
    """CUDA where there is one (the same tests then check CUDA autocast), else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(autouse=True)
def _seed_and_threads(seeded_single_thread):
    """Every test here: seed 0, one torch thread (tests/conftest.py)."""


# Test modules cannot import this conftest under --import-mode=importlib: they get its helpers as fixtures.
@pytest.fixture
def make_bert():
    """``make_bert(cls, **config overrides)`` -> a tiny SesameBert model of class ``cls`` in training mode."""
    from modeling import SesameBertConfig

    def make(cls, **overrides):
        torch.manual_seed(0)
        return cls(SesameBertConfig(**{**BERT_TINY, **overrides})).train()

    return make


@pytest.fixture
def make_elmo():
    """``make_elmo(cls, **config overrides)`` -> a tiny SesameElmo model of class ``cls`` in training mode."""
    from modeling.elmo import SesameElmoConfig

    def make(cls, **overrides):
        torch.manual_seed(0)
        return cls(SesameElmoConfig(**{**ELMO_TINY, **overrides})).train()

    return make


@pytest.fixture
def batches():
    """``{"bert": bert_batch, "elmo": elmo_batch}``: the batch factories of this folder."""
    return {"bert": bert_batch, "elmo": elmo_batch}
