"""Span QA: windows cover every answer (property test), labels map back to the answer text, post-processing
picks the expected spans on hand-made logits (across windows, null answer at given thresholds)."""

from __future__ import annotations

import json
import random

import datasets
import numpy as np
import pytest
from transformers import BertTokenizer

from core.errors import InputError
from finetune.qa import (
    NO_VALID_SPAN_ODDS,
    answer_token_span,
    check_window_arguments,
    postprocess_qa_predictions,
    prepare_train_features,
    prepare_validation_features,
    write_predictions,
)

WORDS = [
    "the",
    "cat",
    "sat",
    "on",
    "mat",
    "river",
    "bank",
    "city",
    "north",
    "king",
    "ship",
    "sailed",
    "year",
    "new",
    "york",
    "paris",
    "france",
    "gold",
    "red",
    "blue",
    "whale",
    "in",
    "of",
    "was",
    "who",
    "what",
    "when",
]
# Words split into several WordPiece tokens ("unbelievable" -> un ##believ ##able) and punctuation.
PIECES = {"unbelievable": ["un", "##believ", "##able"], "cats": ["cat", "##s"], "kings": ["king", "##s"]}
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


@pytest.fixture(scope="module")
def tokenizer():
    """A BERT WordPiece fast tokenizer over a tiny vocabulary written here."""
    vocab = SPECIALS + WORDS + sorted({p for pieces in PIECES.values() for p in pieces} - set(WORDS)) + [",", ".", "?"]
    return BertTokenizer(vocab={token: i for i, token in enumerate(vocab)})


def random_example(rng: random.Random, qid: str, max_answer_words: int = 5) -> dict:
    vocabulary = WORDS + list(PIECES)
    words = [rng.choice(vocabulary) for _ in range(rng.randint(3, 120))]
    for i in range(len(words)):
        if rng.random() < 0.1:
            words[i] += rng.choice([",", "."])
    a = rng.randrange(len(words))
    b = min(len(words), a + rng.randint(1, max_answer_words))
    context = " ".join(words)
    start = len(" ".join(words[:a])) + (1 if a else 0)
    text = " ".join(words[a:b])
    assert context[start : start + len(text)] == text
    question = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))) + "?"
    return {"id": qid, "question": question, "context": context, "answers": {"text": [text], "answer_start": [start]}}


def as_batch(examples: list[dict]) -> dict[str, list]:
    return {key: [ex[key] for ex in examples] for key in examples[0]}


@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_windows_cover_every_answer(tokenizer, padding_side):
    """Property: an answer of at most doc_stride + 1 tokens lies whole in some window, and every window
    labelled with a span maps back (through its offsets) to exactly the answer text."""
    tokenizer.padding_side = padding_side
    try:
        rng = random.Random(1234)
        examples = [random_example(rng, f"q{i}") for i in range(150)]
        max_seq_length, doc_stride, max_query_length = 40, 10, 8
        feats = prepare_train_features(as_batch(examples), tokenizer, max_seq_length, doc_stride, max_query_length)
        val = prepare_validation_features(as_batch(examples), tokenizer, max_seq_length, doc_stride, max_query_length)
        assert val["input_ids"] == feats["input_ids"]  # same windows
        covered = set()
        for i, ids in enumerate(feats["input_ids"]):
            assert len(ids) <= max_seq_length
            cls = ids.index(tokenizer.cls_token_id)
            assert cls == 0  # BERT's [CLS] leads in both orders
            ex = examples[[e["id"] for e in examples].index(val["example_id"][i])]
            s, e = feats["start_positions"][i], feats["end_positions"][i]
            offsets = val["offset_mapping"][i]
            if s == cls:
                assert e == cls
                # The window really does not contain the whole answer.
                start = ex["answers"]["answer_start"][0]
                end = start + len(ex["answers"]["text"][0])
                inside = [o for o in offsets if o is not None]
                assert not (inside[0][0] <= start and inside[-1][1] >= end)
                continue
            assert offsets[s] is not None and offsets[e] is not None
            assert ex["context"][offsets[s][0] : offsets[e][1]] == ex["answers"]["text"][0]
            covered.add(ex["id"])
        assert covered == {ex["id"] for ex in examples}
        # Several windows per long context, and the question part is capped at max_query_length tokens.
        assert len(feats["input_ids"]) > 2 * len(examples)
        for i in range(len(feats["input_ids"])):
            seq = val["offset_mapping"][i]
            context_tokens = sum(o is not None for o in seq)
            assert context_tokens >= 1
            assert len(feats["input_ids"][i]) - context_tokens - 3 <= max_query_length
    finally:
        tokenizer.padding_side = "right"


def test_unanswerable_and_outside_windows_get_cls(tokenizer):
    context = " ".join(["the river bank"] * 20) + " paris"
    examples = [
        {"id": "v2", "question": "what?", "context": context, "answers": {"text": [], "answer_start": []}},
        {
            "id": "end",
            "question": "what city?",
            "context": context,
            "answers": {"text": ["paris"], "answer_start": [context.index("paris")]},
        },
    ]
    feats = prepare_train_features(as_batch(examples), tokenizer, 24, 6, 8)
    val = prepare_validation_features(as_batch(examples), tokenizer, 24, 6, 8)
    labels = list(zip(val["example_id"], feats["start_positions"], feats["end_positions"]))
    assert all(s == e == 0 for qid, s, e in labels if qid == "v2")
    end = [(s, e) for qid, s, e in labels if qid == "end"]
    assert end[:-1] == [(0, 0)] * (len(end) - 1) and end[-1][0] > 0  # only the last window holds "paris"
    assert val["cls_index"] == [0] * len(val["example_id"])


def test_long_question_truncated_or_refused(tokenizer):
    question = " ".join(["who"] * 30) + "?"
    example = {
        "id": "long-q",
        "question": question,
        "context": "the cat sat on the mat",
        "answers": {"text": ["mat"], "answer_start": [19]},
    }
    feats = prepare_validation_features(as_batch([example]), tokenizer, 24, 4, 8)
    question_tokens = [o for o in feats["offset_mapping"][0]].count(None) - 3
    assert question_tokens == 8
    with pytest.raises(InputError, match=r"question id 'long-q': the question takes 12 tokens.*--max_seq_length 16"):
        prepare_train_features(as_batch([example]), tokenizer, 16, 4, 12)
    with pytest.raises(InputError, match="--doc_stride 128"):
        check_window_arguments(tokenizer, 128, 128, 64)
    with pytest.raises(InputError, match="no room for the context"):
        check_window_arguments(tokenizer, 64, 8, 62)
    check_window_arguments(tokenizer, 384, 128, 64)


def test_answer_token_span_edges():
    offsets = [(0, 0), (0, 3), (4, 7), (7, 8), (9, 14), (0, 0)]  # [CLS] the cat . whale [SEP]
    assert answer_token_span(offsets, 1, 4, 4, 8) == (2, 3)
    assert answer_token_span(offsets, 1, 4, 9, 14) == (4, 4)  # the last context token
    assert answer_token_span(offsets, 1, 4, 3, 7) == (2, 2)  # a leading space is skipped
    assert answer_token_span(offsets, 1, 3, 9, 14) is None  # window ends before the answer
    assert answer_token_span(offsets, 2, 4, 0, 3) is None  # window starts after it


# ------------------------------------------------------------------------------------------ post-processing

CONTEXT = "Paris is the capital of France and the largest city."
#           0    5  8   12      20 23     30  34  38      46  50


def _feature(qid: str, token_chars: list[tuple[int, int] | None], cls_index: int = 0) -> dict:
    return {"example_id": qid, "offset_mapping": token_chars, "cls_index": cls_index}


def _logits(n: int, peaks: dict[int, float], base: float = 0.0) -> np.ndarray:
    row = np.full(n, base)
    for i, v in peaks.items():
        row[i] = v
    return row


# Window 1: [CLS] q q [SEP] Paris is the capital [SEP]; window 2: [CLS] q q [SEP] capital of France [SEP]
W1 = [None, None, None, None, (0, 5), (6, 8), (9, 12), (13, 20), None]
W2 = [None, None, None, None, (13, 20), (21, 23), (24, 30), None, None]


def test_best_valid_span_in_one_window():
    features = [_feature("a", W1)]
    # The best-scoring pairs are invalid: start in the question (2 + 5 = 17), end before start (6 + 5 = 13).
    start = _logits(9, {2: 9.0, 6: 5.0, 7: 4.0, 4: 1.5})
    end = _logits(9, {1: 9.0, 6: 3.2, 5: 8.0, 7: 2.0})
    preds, nbest, odds = postprocess_qa_predictions([{"id": "a", "context": CONTEXT}], features, [start], [end])
    # Valid pairs: (4,5)=9.5 "Paris is", (6,6)=8.2 "the", (5,5)=8 "is", (6,7)=7 "the capital", ...
    assert preds == {"a": "Paris is"} and odds == {}
    assert [c["text"] for c in nbest["a"][:4]] == ["Paris is", "the", "is", "the capital"]
    assert [c["start_logit"] + c["end_logit"] for c in nbest["a"][:4]] == pytest.approx([9.5, 8.2, 8.0, 7.0])
    assert sum(c["probability"] for c in nbest["a"]) == pytest.approx(1.0)
    preds, nbest, _ = postprocess_qa_predictions(
        [{"id": "a", "context": CONTEXT}], features, [start], [end], max_answer_length=1, n_best_size=3
    )
    # Only the 3 best starts (2, 6, 7) and ends (1, 5, 6) are paired: one valid one-token span remains.
    assert preds == {"a": "the"} and [c["text"] for c in nbest["a"]] == ["the"]


def test_answer_found_in_second_window():
    examples = [{"id": "b", "context": CONTEXT}, {"id": "c", "context": CONTEXT}]
    features = [_feature("b", W1), _feature("b", W2), _feature("c", W1)]
    start = np.stack([_logits(9, {4: 2.0}), _logits(9, {6: 6.0}), _logits(9, {7: 3.0})])
    end = np.stack([_logits(9, {4: 2.0}), _logits(9, {6: 5.0}), _logits(9, {7: 3.0})])
    preds, nbest, _ = postprocess_qa_predictions(examples, features, start, end, n_best_size=2)
    assert preds == {"b": "France", "c": "capital"}
    assert nbest["b"][0]["offsets"] == [24, 30] and len(nbest["b"]) == 2


def test_null_answer_and_threshold_v2():
    examples = [{"id": "d", "context": CONTEXT}]
    features = [_feature("d", W1), _feature("d", W2)]
    # Null scores: window 1: 3 + 1 = 4, window 2: 0.5 + 0.5 = 1 -> min = 1. Best span: "France" 0.2 + 0.3 = 0.5
    # (window 2, token 6); null odds = 1 - 0.5 = 0.5.
    start = np.stack([_logits(9, {0: 3.0}, base=-5.0), _logits(9, {0: 0.5, 6: 0.2}, base=-5.0)])
    end = np.stack([_logits(9, {0: 1.0}, base=-5.0), _logits(9, {0: 0.5, 6: 0.3}, base=-5.0)])
    for threshold, expected in ((0.0, ""), (0.49, ""), (0.5, "France"), (2.0, "France")):
        preds, nbest, odds = postprocess_qa_predictions(
            examples, features, start, end, version_2_with_negative=True, null_score_diff_threshold=threshold
        )
        assert preds == {"d": expected}
        assert odds == {"d": pytest.approx(0.5)}
    assert nbest["d"][0]["text"] == "" and nbest["d"][0]["start_logit"] == 0.5  # null from the min window
    assert nbest["d"][1]["text"] == "France"
    # No valid span at all (every logit peak outside the context): "" with the sentinel odds.
    features = [_feature("d", [None] * 9)]
    preds, nbest, odds = postprocess_qa_predictions(
        examples, features, [start[0]], [end[0]], version_2_with_negative=True
    )
    assert preds == {"d": ""} and odds == {"d": NO_VALID_SPAN_ODDS} and [c["text"] for c in nbest["d"]] == [""]


def test_gold_positions_round_trip_through_postprocessing(tokenizer):
    """Logits peaked at the training labels give back exactly the gold answers (tokenizer -> offsets -> text)."""
    rng = random.Random(7)
    examples = [random_example(rng, f"r{i}") for i in range(40)]
    batch = as_batch(examples)
    feats = prepare_train_features(batch, tokenizer, 48, 12, 10)
    val = prepare_validation_features(batch, tokenizer, 48, 12, 10, pad_to_max_length=True)
    n = len(val["example_id"])
    start, end = np.zeros((n, 48)), np.zeros((n, 48))
    for i in range(n):
        start[i, feats["start_positions"][i]] += 10.0
        end[i, feats["end_positions"][i]] += 10.0
    features = [{"example_id": val["example_id"][i], "offset_mapping": val["offset_mapping"][i]} for i in range(n)]
    preds, _, _ = postprocess_qa_predictions(examples, features, start, end)
    assert preds == {ex["id"]: ex["answers"]["text"][0] for ex in examples}
    # The same from datasets.Dataset columns (as after datasets.map), with the cls_index column.
    preds_ds, _, _ = postprocess_qa_predictions(
        datasets.Dataset.from_list(examples), datasets.Dataset.from_dict(val), start, end
    )
    assert preds_ds == preds


def test_postprocess_rejects_mismatched_inputs():
    with pytest.raises(ValueError, match="2 features but 1 start"):
        postprocess_qa_predictions(
            [{"id": "a", "context": "x"}], [_feature("a", W1)] * 2, [np.zeros(9)], [np.zeros(9)] * 2
        )
    with pytest.raises(ValueError, match="unknown example ids"):
        postprocess_qa_predictions([{"id": "a", "context": "x"}], [_feature("z", W1)], [np.zeros(9)], [np.zeros(9)])


def test_write_predictions(tmp_path):
    out = tmp_path / "eval"
    paths = write_predictions(out, {"a": "Paris", "b": ""}, {"a": [{"text": "Paris"}]}, {"a": -1.5, "b": 2.0})
    assert json.loads(paths["predictions"].read_text()) == {"a": "Paris", "b": ""}
    assert json.loads(paths["null_odds"].read_text()) == {"a": -1.5, "b": 2.0}
    assert sorted(p.name for p in out.iterdir()) == ["nbest_predictions.json", "null_odds.json", "predictions.json"]
    paths = write_predictions(out, {"a": "x"}, prefix="eval_new_wiki")
    assert paths["predictions"].name == "eval_new_wiki_predictions.json" and set(paths) == {"predictions"}


@pytest.fixture(scope="module")
def elmo_tokenizer(tmp_path_factory):
    """The word + character ELMo tokenizer (offsets, no overflowing windows), trained on the test's words."""
    from tokenizer.elmo_training import train_elmo_tokenizer

    root = tmp_path_factory.mktemp("elmo-tok")
    corpus = root / "corpus.txt"
    corpus.write_text("\n\n".join(" ".join(WORDS[i:] + list(PIECES) + [",", ".", "?"]) for i in range(5)) + "\n")
    return train_elmo_tokenizer([corpus], vocab_size=100, output_dir=root / "tok")


def test_word_level_tokenizer_windows_cover_answers_and_round_trip(elmo_tokenizer):
    """The same properties with a tokenizer without overflowing tokens: windows are cut over its tokens."""
    check_window_arguments(elmo_tokenizer, 40, 10, 8)
    rng = random.Random(99)
    examples = [random_example(rng, f"e{i}") for i in range(60)]
    batch = as_batch(examples)
    feats = prepare_train_features(batch, elmo_tokenizer, 40, 10, 8)
    val = prepare_validation_features(batch, elmo_tokenizer, 40, 10, 8)
    assert "char_ids" in feats and len(feats["input_ids"]) == len(val["example_id"]) > 2 * len(examples)
    covered = set()
    for i, ids in enumerate(feats["input_ids"]):
        assert len(ids) <= 40
        offsets, s, e = val["offset_mapping"][i], feats["start_positions"][i], feats["end_positions"][i]
        ex = next(x for x in examples if x["id"] == val["example_id"][i])
        # Context tokens: those of type 1 except the context's <S> and </S> markers.
        types = feats["token_type_ids"][i]
        assert all(t == 1 for t, o in zip(types, offsets) if o is not None)
        assert sum(o is not None for o in offsets) == sum(types) - 2
        if s == 0:
            continue
        assert ex["context"][offsets[s][0] : offsets[e][1]] == ex["answers"]["text"][0]
        covered.add(ex["id"])
    assert covered == {ex["id"] for ex in examples}
    n = len(val["example_id"])
    width = max(len(ids) for ids in feats["input_ids"])
    start, end = np.zeros((n, width)), np.zeros((n, width))
    for i in range(n):
        start[i, feats["start_positions"][i]] += 10.0
        end[i, feats["end_positions"][i]] += 10.0
    preds, _, _ = postprocess_qa_predictions(
        examples,
        [{"example_id": val["example_id"][i], "offset_mapping": val["offset_mapping"][i]} for i in range(n)],
        start,
        end,
    )
    assert preds == {ex["id"]: ex["answers"]["text"][0] for ex in examples}
