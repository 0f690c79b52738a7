"""SesameElmo's inputs and outputs follow transformers' conventions: the main input first, ``inputs_embeds`` from
``get_input_embeddings()``, ``hidden_states`` from every head when asked, ``return_dict=False`` tuples, and layer 0 in
the autograd graph."""

from __future__ import annotations

import inspect

import pytest
import torch

from modeling.elmo import (
    SesameElmoForBidirectionalLM,
    SesameElmoForQuestionAnswering,
    SesameElmoForSequenceClassification,
    SesameElmoForTokenClassification,
    SesameElmoModel,
)

CLASSES = [
    SesameElmoModel,
    SesameElmoForBidirectionalLM,
    SesameElmoForSequenceClassification,
    SesameElmoForTokenClassification,
    SesameElmoForQuestionAnswering,
]
HEADS = CLASSES[1:]
SINGLE = ["The whale rose from the sea.", "It rained."]
PAIR = (["The whale rose.", "A dog near the bank"], ["It rained in the city.", "The sailors shouted"])


def _batch(tokenizer, cls):
    """Pairs for the QA head (it needs them), pairs and single sentences for the sequence classifier."""
    if cls is SesameElmoForQuestionAnswering:
        return [tokenizer(*PAIR, padding=True, return_tensors="pt")]
    batches = [tokenizer(SINGLE, padding=True, return_tensors="pt")]
    if cls is SesameElmoForSequenceClassification:
        batches.append(tokenizer(*PAIR, padding=True, return_tensors="pt"))
    return batches


def _model(cls, tiny, tokenizer, **overrides):
    torch.manual_seed(0)
    return cls(tiny(vocab_size=len(tokenizer), num_labels=3, **overrides)).eval()


def _tensors(output) -> dict[str, torch.Tensor]:
    """The tensors of a model output, hidden states flattened (``hidden_states.0``, ...)."""
    out = {}
    for key, value in output.items():
        if isinstance(value, tuple):
            out.update({f"{key}.{i}": v for i, v in enumerate(value)})
        else:
            out[key] = value
    return out


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_forward_takes_the_main_input_first(cls):
    params = list(inspect.signature(cls.forward).parameters)
    assert cls.main_input_name == "char_ids" and params[1] == "char_ids"
    assert {"inputs_embeds", "attention_mask", "return_dict"} <= set(params)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_inputs_embeds_from_get_input_embeddings_give_the_char_ids_outputs(cls, tiny, elmo_tokenizer):
    model = _model(cls, tiny, elmo_tokenizer, freeze_backbone=False)
    embeddings = model.get_input_embeddings()
    assert embeddings is (model if cls is SesameElmoModel else model.elmo).char_encoder
    for batch in _batch(elmo_tokenizer, cls):
        x = embeddings(batch["char_ids"])
        assert x.shape == (*batch["input_ids"].shape, model.config.projection_dim)
        others = {k: v for k, v in batch.items() if k != "char_ids"}
        ref = _tensors(model(**batch, output_hidden_states=True))
        got = _tensors(model(inputs_embeds=x, **others, output_hidden_states=True))
        assert ref.keys() == got.keys() and len(ref) > 1
        for key in ref:
            torch.testing.assert_close(got[key], ref[key], rtol=1e-5, atol=1e-6, msg=key)
        with pytest.raises(ValueError, match="exactly one of char_ids"):
            model(char_ids=batch["char_ids"], inputs_embeds=x, **{k: v for k, v in others.items() if k != "input_ids"})


@pytest.mark.parametrize("cls", HEADS, ids=lambda c: c.__name__)
def test_every_head_returns_the_bilm_layers_when_asked(cls, tiny, elmo_tokenizer):
    model = _model(cls, tiny, elmo_tokenizer)
    n = model.config.num_layers + 1
    for batch in _batch(elmo_tokenizer, cls):
        assert model(**batch).hidden_states is None
        hidden = model(**batch, output_hidden_states=True).hidden_states
        b, t = batch["input_ids"].shape
        assert len(hidden) == n and all(h.shape == (b, t, model.config.hidden_size) for h in hidden)
        if batch["token_type_ids"].any():  # a pair: each token's layers are those of its sentence encoded alone
            for row, sentences in enumerate(zip(*PAIR)):
                start = 0
                for sentence in sentences:
                    alone = elmo_tokenizer(sentence, return_tensors="pt")
                    ref = model.elmo(alone["char_ids"]).hidden_states
                    width = alone["input_ids"].shape[1]
                    for h, r in zip(hidden, ref):
                        torch.testing.assert_close(h[row, start : start + width], r[0], rtol=1e-5, atol=1e-6)
                    start += width
                assert all((h[row, start:] == 0).all() for h in hidden)  # padding
        else:
            for h, r in zip(hidden, model.elmo(batch["char_ids"], batch["attention_mask"]).hidden_states):
                torch.testing.assert_close(h, r)
        model.config.output_hidden_states = True  # the config's default is honoured
        assert len(model(**batch).hidden_states) == n
        model.config.output_hidden_states = False


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_return_dict_false_gives_the_output_tuple(cls, tiny, elmo_tokenizer):
    model = _model(cls, tiny, elmo_tokenizer)
    batch = _batch(elmo_tokenizer, cls)[-1]
    labels = {
        SesameElmoForSequenceClassification: {"labels": torch.tensor([0, 2])},
        SesameElmoForTokenClassification: {"labels": batch["input_ids"] % 3},
        SesameElmoForQuestionAnswering: {
            "start_positions": torch.tensor([5, 6]),
            "end_positions": torch.tensor([6, 7]),
        },
    }.get(cls, {})
    ref = model(**batch, **labels, output_hidden_states=True).to_tuple()
    assert len(ref) >= 3  # a loss or a mask, the logits or the top layer, the hidden states
    got = model(**batch, **labels, output_hidden_states=True, return_dict=False)
    model.config.return_dict = False  # the config's default is honoured
    for out in (got, model(**batch, **labels, output_hidden_states=True)):
        assert isinstance(out, tuple) and len(out) == len(ref)
        for a, b in zip(out, ref):
            if isinstance(b, tuple):
                assert len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))
            else:
                assert torch.equal(a, b)


def test_layer_0_is_in_the_graph(tiny, elmo_tokenizer):
    """``hidden_states[0]`` is the tensor the LSTM stacks read: the gradient of the upper layers reaches it, and the
    gradient of ``inputs_embeds`` is the sum of its two halves (the forward and the backward stack's input)."""
    model = _model(SesameElmoModel, tiny, elmo_tokenizer)
    batch = elmo_tokenizer(SINGLE, padding=True, return_tensors="pt")
    x = model.get_input_embeddings()(batch["char_ids"]).detach().requires_grad_(True)
    out = model(inputs_embeds=x, attention_mask=batch["attention_mask"])
    layer0 = out.hidden_states[0]
    layer0.retain_grad()
    out.last_hidden_state.pow(2).sum().backward()
    assert layer0.grad is not None and layer0.grad.abs().sum() > 0
    p = model.config.projection_dim
    keep = batch["attention_mask"].unsqueeze(-1).float()
    torch.testing.assert_close(x.grad, (layer0.grad[..., :p] + layer0.grad[..., p:]) * keep)
