"""Downstream heads on ELMo features: frozen backbone, pairs, pooling kinds, regression, QA, tagging."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from modeling.elmo import (
    SesameElmoForBidirectionalLM,
    SesameElmoForQuestionAnswering,
    SesameElmoForSequenceClassification,
    SesameElmoForTokenClassification,
)


def test_frozen_elmo_only_gamma_s_and_head_get_gradients(tiny, elmo_tokenizer):
    model = SesameElmoForSequenceClassification(tiny(vocab_size=len(elmo_tokenizer), num_labels=3, dropout=0.5))
    model.train()
    batch = elmo_tokenizer(["The whale rose.", "It rained in the city."], padding=True, return_tensors="pt")
    out = model(**batch, labels=torch.tensor([0, 2]))
    out.loss.backward()
    for name, p in model.named_parameters():
        if name.startswith("elmo."):
            assert not p.requires_grad and p.grad is None, name
        else:  # the pair classifier (pairs only) gets a zero gradient, so that DDP sees every parameter used
            assert p.grad is not None, name
            assert (p.grad == 0).all() == name.startswith("pair_classifier."), name
    assert model.scalar_mix.gamma.grad.abs() > 0 and model.scalar_mix.scalar_parameters.grad.abs().sum() > 0
    # the frozen BiLM runs without dropout even in training mode: the features are deterministic
    feats = [model._features(batch["char_ids"], batch["attention_mask"])[0] for _ in range(2)]
    model.feature_dropout.p = 0.0
    feats = [model._features(batch["char_ids"], batch["attention_mask"])[0] for _ in range(2)]
    torch.testing.assert_close(feats[0], feats[1])


def test_fine_tuning_switch_gives_elmo_gradients(tiny, elmo_tokenizer):
    model = SesameElmoForSequenceClassification(
        tiny(vocab_size=len(elmo_tokenizer), num_labels=2, freeze_backbone=False)
    )
    batch = elmo_tokenizer(["The whale rose."], return_tensors="pt")
    model(**batch, labels=torch.tensor([1])).loss.backward()
    assert model.elmo.char_encoder.projection.weight.grad is not None


def test_pair_encodes_each_sentence_alone(tiny, elmo_tokenizer):
    model = SesameElmoForSequenceClassification(tiny(vocab_size=len(elmo_tokenizer), num_labels=2)).eval()
    a, b = ["The whale rose.", "A dog"], ["It rained in the city.", "near the river bank and the sea"]
    pair = elmo_tokenizer(a, b, padding=True, return_tensors="pt")
    logits = model(**pair).logits
    with torch.no_grad():
        us, vs = [], []
        for x, y in zip(a, b):  # reference: each sentence tokenized and encoded on its own
            for text, store in ((x, us), (y, vs)):
                enc = elmo_tokenizer(text, return_tensors="pt")
                feats = model._features(enc["char_ids"], enc["attention_mask"])[0]
                store.append(model._encode(feats, enc["attention_mask"]))
        u, v = torch.cat(us), torch.cat(vs)
        ref = model.pair_classifier(torch.cat([u, v, (u - v).abs(), u * v], dim=-1))
    torch.testing.assert_close(logits, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("pooling", ["max", "mean", "attention", "cnn"])
def test_pooling_kinds_ignore_padding(tiny, elmo_tokenizer, pooling):
    model = SesameElmoForSequenceClassification(
        tiny(vocab_size=len(elmo_tokenizer), num_labels=2, pooling=pooling, task_hidden_size=0)
    ).eval()
    alone = elmo_tokenizer(["The whale rose."], return_tensors="pt")
    batch = elmo_tokenizer(
        ["The whale rose.", "It rained in the afternoon, and the city was wet."], padding=True, return_tensors="pt"
    )
    torch.testing.assert_close(model(**batch).logits[:1], model(**alone).logits, rtol=1e-4, atol=1e-5)


def test_empty_second_sentence_gives_finite_logits(tiny, elmo_tokenizer):
    model = SesameElmoForSequenceClassification(tiny(vocab_size=len(elmo_tokenizer), num_labels=2, pooling="attention"))
    batch = elmo_tokenizer(["The whale rose.", "It rained."], ["A dog.", "The sea."], padding=True, return_tensors="pt")
    batch["token_type_ids"][1] = 0  # second row: a single sentence in a batch of pairs
    assert torch.isfinite(model.eval()(**batch).logits).all()


def test_regression_when_one_label(tiny, elmo_tokenizer):
    model = SesameElmoForSequenceClassification(tiny(vocab_size=len(elmo_tokenizer), num_labels=1)).eval()
    batch = elmo_tokenizer(["The whale rose.", "It rained."], ["A dog.", "The sea."], padding=True, return_tensors="pt")
    target = torch.tensor([0.5, 4.0])
    out = model(**batch, labels=target)
    assert model.config.problem_type == "regression" and out.logits.shape == (2, 1)
    torch.testing.assert_close(out.loss, F.mse_loss(out.logits.squeeze(-1), target))


def test_token_classification_ignores_minus_100(tiny, elmo_tokenizer):
    model = SesameElmoForTokenClassification(tiny(vocab_size=len(elmo_tokenizer), num_labels=4)).eval()
    batch = elmo_tokenizer(["The whale rose.", "It rained in the city."], padding=True, return_tensors="pt")
    labels = torch.randint(0, 4, batch["input_ids"].shape).masked_fill(batch["attention_mask"] == 0, -100)
    out = model(**batch, labels=labels)
    assert out.logits.shape == (*batch["input_ids"].shape, 4)
    keep = labels != -100
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits[keep], labels[keep]))


def test_question_answering_logits_cover_context_only_and_train(tiny, elmo_tokenizer):
    model = SesameElmoForQuestionAnswering(tiny(vocab_size=len(elmo_tokenizer)))
    batch = elmo_tokenizer(
        ["Who rose?", "Where was the dog?"],
        ["The whale rose from the sea.", "A dog near the river bank."],
        padding=True,
        return_tensors="pt",
    )
    context = (batch["token_type_ids"] == 1) & (batch["attention_mask"] == 1)
    start, end = torch.tensor([5, 9]), torch.tensor([5, 11])
    assert bool(context[0, 5] and context[1, 9] and context[1, 11])
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.05)
    losses = []
    for _ in range(60):
        out = model(**batch, start_positions=start, end_positions=end)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        losses.append(out.loss.item())
    model.eval()
    out = model(**batch)
    outside = ~context
    outside[:, 0] = False  # position 0 carries the learned null ("no answer") score
    assert (out.start_logits[outside] == -10000.0).all() and (out.end_logits[outside] == -10000.0).all()
    assert (out.start_logits[context] > -10000.0).all()
    assert losses[-1] < 0.3 * losses[0]
    assert out.start_logits.argmax(-1).tolist() == start.tolist()


def test_heads_load_pretrained_bilm_weights(tiny, tmp_path):
    from transformers import AutoModelForQuestionAnswering, AutoModelForSequenceClassification

    lm = SesameElmoForBidirectionalLM(tiny())
    lm.save_pretrained(tmp_path / "lm")
    for auto in (AutoModelForSequenceClassification, AutoModelForQuestionAnswering):
        head = auto.from_pretrained(tmp_path / "lm")
        for name, p in lm.elmo.state_dict().items():
            assert torch.equal(head.elmo.state_dict()[name], p), name
