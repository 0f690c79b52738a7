"""Fixtures of the mixed-precision tests: tiny SesameBert / SesameElmo configs and padded batches (made here)."""

from __future__ import annotations

import pytest
import torch
from bert.conftest import TINY as _BERT_KWARGS  # tests/ is on sys.path (pyproject's pythonpath)
from elmo.conftest import TINY_KWARGS as _ELMO_KWARGS

import modeling  # noqa: F401  (registers the Auto classes)

BERT_TINY = dict(_BERT_KWARGS, vocab_size=60)
ELMO_TINY = dict(_ELMO_KWARGS, vocab_size=60)


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


def _maker(config_class, kwargs: dict):
    """``make(cls, **config overrides)`` -> a model of class ``cls`` with a ``config_class`` of ``kwargs`` and the
    overrides, initialised after seed 0, in training mode."""

    def make(cls, **overrides):
        torch.manual_seed(0)
        return cls(config_class(**{**kwargs, **overrides})).train()

    return make


# Helpers as fixtures, for the test modules of this folder (tests/gpu imports the constants above directly).
@pytest.fixture
def make_bert():
    """``make_bert(cls, **config overrides)`` -> a tiny SesameBert model of class ``cls`` in training mode."""
    from modeling import SesameBertConfig

    return _maker(SesameBertConfig, BERT_TINY)


@pytest.fixture
def make_elmo():
    """``make_elmo(cls, **config overrides)`` -> a tiny SesameElmo model of class ``cls`` in training mode."""
    from modeling.elmo import SesameElmoConfig

    return _maker(SesameElmoConfig, ELMO_TINY)


@pytest.fixture
def batches():
    """``{"bert": bert_batch, "elmo": elmo_batch}``: the batch factories of this folder."""
    return {"bert": bert_batch, "elmo": elmo_batch}
