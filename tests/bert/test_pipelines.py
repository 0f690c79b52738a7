"""transformers.pipeline with SesameBert models: fill-mask, text-classification, question-answering (where
transformers still has it), token-classification, feature-extraction; each answer checked against the model."""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers import pipeline

from modeling import (
    SesameBertConfig,
    SesameBertForMaskedLM,
    SesameBertForQuestionAnswering,
    SesameBertForSequenceClassification,
    SesameBertForTokenClassification,
    SesameBertModel,
)


def _encode(tokenizer, model, *texts):
    """``tokenizer(*texts)`` as tensors on the model's device: a pipeline moves the model to the accelerator
    (``cuda:0`` where there is one), so the reference forward pass must feed its inputs there too."""
    return tokenizer(*texts, return_tensors="pt").to(model.device)


def test_fill_mask(tiny_kwargs, tokenizer):
    torch.manual_seed(0)
    model = SesameBertForMaskedLM(SesameBertConfig(**tiny_kwargs)).eval()
    fill = pipeline("fill-mask", model=model, tokenizer=tokenizer, top_k=3)
    text = "the cat [MASK] on the mat ."
    answers = fill(text)
    enc = _encode(tokenizer, model, text)
    with torch.no_grad():
        logits = model(**enc).logits[0, (enc["input_ids"][0] == tokenizer.mask_token_id).nonzero()[0, 0]]
    top = logits.softmax(-1).topk(3)
    assert [a["token"] for a in answers] == top.indices.tolist()
    assert all(abs(a["score"] - s) < 1e-5 for a, s in zip(answers, top.values.tolist()))


def _labelled(cls, tiny_kwargs: dict, labels: list[str]):
    """A tiny SesameBert ``cls`` (initialised after seed 0, in eval mode) whose head predicts ``labels``, ids in their
    order."""
    torch.manual_seed(0)
    ids = dict(enumerate(labels))
    return cls(
        SesameBertConfig(**tiny_kwargs, num_labels=len(labels), id2label=ids, label2id={v: k for k, v in ids.items()})
    ).eval()


def test_text_classification_pairs(tiny_kwargs, tokenizer, pairs):
    model = _labelled(SesameBertForSequenceClassification, tiny_kwargs, ["entailment", "neutral", "contradiction"])
    classify = pipeline("text-classification", model=model, tokenizer=tokenizer, top_k=None)
    for a, b in pairs:
        scores = {d["label"]: d["score"] for d in classify({"text": a, "text_pair": b})}
        enc = _encode(tokenizer, model, a, b)
        assert enc["token_type_ids"].max() == 1  # a real pair reaches the model
        with torch.no_grad():
            probs = model(**enc).logits.softmax(-1)[0]
        for i, label in model.config.id2label.items():
            assert abs(scores[label] - probs[i].item()) < 1e-5


def test_question_answering(tiny_kwargs, tokenizer):
    """The extractive QA pipeline; transformers 5 removed the task (REMOVED_TASKS), so this runs only where it exists.
    Span QA itself is checked in test_model.py (loss) and by the SQuAD fine-tuning tests."""
    torch.manual_seed(0)
    model = SesameBertForQuestionAnswering(SesameBertConfig(**tiny_kwargs)).eval()
    try:
        qa = pipeline("question-answering", model=model, tokenizer=tokenizer)
    except KeyError as err:
        if "removed" not in str(err):
            raise
        pytest.skip(f"transformers {transformers.__version__} has no question-answering pipeline: {err}")
    context = "he lives in paris . paris is the capital of france ."
    answer = qa(question="where does he live ?", context=context)
    assert set(answer) == {"score", "start", "end", "answer"}
    assert answer["answer"] == context[answer["start"] : answer["end"]] and answer["answer"]
    assert 0.0 <= answer["score"] <= 1.0


def test_token_classification(tiny_kwargs, tokenizer):
    model = _labelled(SesameBertForTokenClassification, tiny_kwargs, ["O", "B-LOC", "I-LOC"])
    tag = pipeline("token-classification", model=model, tokenizer=tokenizer, ignore_labels=[])
    text = "he lives in paris"
    entities = tag(text)
    enc = _encode(tokenizer, model, text)
    with torch.no_grad():
        probs = model(**enc).logits.softmax(-1)[0, 1:-1]  # without [CLS] / [SEP]
    assert [e["word"] for e in entities] == text.split()
    for e, p in zip(entities, probs):
        assert e["entity"] == model.config.id2label[int(p.argmax())] and abs(e["score"] - p.max().item()) < 1e-5


def test_feature_extraction(tiny_kwargs, tokenizer, sentences):
    torch.manual_seed(0)
    model = SesameBertModel(SesameBertConfig(**tiny_kwargs)).eval()
    extract = pipeline("feature-extraction", model=model, tokenizer=tokenizer)
    for text in sentences[:3]:
        features = torch.tensor(extract(text))
        with torch.no_grad():
            expected = model(**_encode(tokenizer, model, text)).last_hidden_state.cpu()
        torch.testing.assert_close(features, expected, rtol=0, atol=1e-6)
