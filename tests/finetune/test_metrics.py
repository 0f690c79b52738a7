"""The shipped metric modules against hand-computed values, loaded by path with the network blocked."""

from __future__ import annotations

import math
import socket

import pytest

from core.errors import InputError
from finetune.metrics import METRIC_NAMES, load_metric, metric_path
from finetune.metrics.squad_scoring import normalize_answer, squad_v2_scores


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to resolve a host name or open a connection fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args[1:] if len(args) > 1 else args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_every_module_loads_by_path_without_network(no_network, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for name in METRIC_NAMES:
        assert metric_path(name).is_file()
        module = load_metric(name, "cola" if name == "glue" else None)
        assert type(module).__name__.lower().replace("_", "") == name.replace("_", "")
    # A computation runs offline too (evaluate writes its Arrow cache, no hub call).
    assert load_metric("glue", "sst2").compute(predictions=[1, 0], references=[1, 1]) == {"accuracy": 0.5}


def test_unknown_metric_or_glue_config_is_input_error():
    with pytest.raises(InputError, match="expected one of"):
        load_metric("bleu")
    with pytest.raises(InputError, match="unknown configuration 'sst-5'"):
        load_metric("glue", "sst-5")


def test_glue_mrpc_accuracy_and_f1():
    # TP=2 (0, 3), FP=1 (1), FN=1 (4), TN=1 (2): F1 = 2*2 / (2*2 + 1 + 1) = 2/3; accuracy 3/5.
    out = load_metric("glue", "mrpc").compute(predictions=[1, 1, 0, 1, 0], references=[1, 0, 0, 1, 1])
    assert out == pytest.approx({"accuracy": 0.6, "f1": 2 / 3})


def test_glue_cola_matthews_correlation():
    # TP=3, TN=3, FP=1, FN=1: MCC = (3*3 - 1*1) / sqrt(4*4*4*4) = 8/16.
    refs = [1, 1, 1, 0, 0, 0, 1, 0]
    preds = [1, 1, 0, 0, 0, 1, 1, 0]
    assert load_metric("glue", "cola").compute(predictions=preds, references=refs) == pytest.approx(
        {"matthews_correlation": 0.5}
    )
    # Constant predictions carry no information: MCC 0 (not NaN).
    out = load_metric("glue", "cola").compute(predictions=[1] * 8, references=refs)
    assert out["matthews_correlation"] == 0.0


def test_glue_mcc_three_classes_with_ties():
    # Multi-class MCC (Gorodkin's R_K): c = correct, s = samples, p_k / t_k = predicted / true counts.
    refs = [0, 0, 1, 1, 2, 2]
    preds = [0, 1, 1, 1, 2, 0]
    c, s = 4, 6
    p = [2, 3, 1]
    t = [2, 2, 2]
    expected = (c * s - sum(pk * tk for pk, tk in zip(p, t))) / math.sqrt(
        (s * s - sum(pk * pk for pk in p)) * (s * s - sum(tk * tk for tk in t))
    )
    out = load_metric("glue", "cola").compute(predictions=preds, references=refs)
    assert out["matthews_correlation"] == pytest.approx(expected)


def test_glue_stsb_pearson_and_spearman_with_ties():
    # Pearson of x=[1,2,3,4], y=[2,4,5,9]: deviations [-1.5,-.5,.5,1.5] and [-3,-1,0,4]:
    # cov = 4.5+.5+0+6 = 11, var sums 5 and 26 -> r = 11 / sqrt(130).
    out = load_metric("glue", "stsb").compute(predictions=[1.0, 2.0, 3.0, 4.0], references=[2.0, 4.0, 5.0, 9.0])
    assert out["pearson"] == pytest.approx(11 / math.sqrt(130))
    assert out["spearmanr"] == pytest.approx(1.0)  # monotone
    # Ties get average ranks: preds [1,2,2,3] -> ranks [1,2.5,2.5,4]; refs ranks [1,2,3,4]:
    # cov = 2.25+0+0+2.25 = 4.5, var sums 4.5 and 5 -> rho = 4.5 / sqrt(22.5) = 3 / sqrt(10).
    out = load_metric("glue", "stsb").compute(predictions=[1.0, 2.0, 2.0, 3.0], references=[1.0, 2.0, 3.0, 4.0])
    assert out["spearmanr"] == pytest.approx(3 / math.sqrt(10))


def test_glue_accuracy_tasks_and_accuracy_module():
    for task in ("sst2", "mnli", "mnli_mismatched", "qnli", "rte", "wnli", "ax"):
        out = load_metric("glue", task).compute(predictions=[0, 2, 1, 1], references=[0, 1, 1, 1])
        assert out == {"accuracy": 0.75}
    # macro F1 over 3 classes: class 0: P=R=1 -> 1; class 1: P=1 R=2/3 -> 0.8; class 2: P=0 R=0 -> 0.
    out = load_metric("accuracy").compute(predictions=[0, 2, 1, 1], references=[0, 1, 1, 1])
    assert out == pytest.approx({"accuracy": 0.75, "macro_f1": (1 + 0.8 + 0) / 3})


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The Eiffel Tower!", "eiffel tower"),
        ("an apple a day", "apple day"),
        ("  1,000   dollars. ", "1000 dollars"),
        ("Theatre of the Absurd", "theatre of absurd"),  # "the" only as a whole word
        ("A-ha", "aha"),
    ],
)
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


def _refs(golds: dict[str, list[str]]) -> list[dict]:
    return [{"id": q, "answers": {"text": g, "answer_start": [0] * len(g)}} for q, g in golds.items()]


def test_squad_v1_exact_match_and_f1_by_hand():
    golds = {
        "q1": ["The Eiffel Tower", "Eiffel Tower!"],
        "q2": ["an apple a day"],
        "q3": ["Barack Obama", "President Obama"],
        "q4": ["New York City"],
        "q5": ["1,000 dollars"],
    }
    preds = {
        "q1": "eiffel tower",
        "q2": "apple day.",
        "q3": "Obama",
        "q4": "the city of New York",
        "q5": "1000 dollars",
    }
    out = load_metric("squad").compute(
        predictions=[{"id": q, "prediction_text": t} for q, t in preds.items()], references=_refs(golds)
    )
    # q3: P=1, R=1/2 against both golds -> 2/3. q4: pred tokens {city, of, new, york} vs {new, york, city}:
    # P=3/4, R=1 -> 6/7. EM: q1, q2, q5.
    assert out["exact_match"] == pytest.approx(60.0)
    assert out["f1"] == pytest.approx(100 * (1 + 1 + 2 / 3 + 6 / 7 + 1) / 5)


def test_squad_v1_missing_prediction_scores_zero():
    out = load_metric("squad").compute(
        predictions=[{"id": "a", "prediction_text": "x"}], references=_refs({"a": ["x"]})
    )
    assert out == {"exact_match": 100.0, "f1": 100.0}
    from finetune.metrics.squad_scoring import squad_v1_scores

    assert squad_v1_scores({"a": "x"}, {"a": ["x"], "b": ["y"]}) == {"exact_match": 50.0, "f1": 50.0}


V2_GOLDS = {"a": ["Paris"], "b": ["blue whale"], "c": [], "d": [""], "e": ["42"]}
V2_PREDS = {"a": "Paris", "b": "whale", "c": "", "d": "something", "e": ""}
V2_NA = {"a": 0.1, "b": 0.6, "c": 0.9, "d": 0.7, "e": 0.95}


def _v2(threshold=None):
    kwargs = {} if threshold is None else {"no_answer_threshold": threshold}
    return load_metric("squad_v2").compute(
        predictions=[{"id": q, "prediction_text": V2_PREDS[q], "no_answer_probability": V2_NA[q]} for q in V2_PREDS],
        references=_refs(V2_GOLDS),
        **kwargs,
    )


def test_squad_v2_breakdown_by_hand():
    out = _v2()  # default threshold 1.0: no prediction is overridden
    # EM: a=1, b=0, c=1 ("" vs unanswerable), d=0, e=0; F1: b = 2/3 (P=1, R=1/2); "d" has only an empty gold.
    assert out["total"] == 5 and out["HasAns_total"] == 3 and out["NoAns_total"] == 2
    assert out["exact"] == pytest.approx(40.0)
    assert out["f1"] == pytest.approx(100 * (1 + 2 / 3 + 1) / 5)
    assert out["HasAns_exact"] == pytest.approx(100 / 3)
    assert out["HasAns_f1"] == pytest.approx(100 * (1 + 2 / 3) / 3)
    assert out["NoAns_exact"] == out["NoAns_f1"] == pytest.approx(50.0)


def test_squad_v2_best_thresholds_by_hand():
    out = _v2()
    # Threshold below all: every question answered "": 2 right (c, d). Raising it past a (0.1): +1 -> 3;
    # b (0.6): +0 EM / +2/3 F1; d (0.7): -1 (non-empty span on an unanswerable); c, e: +0.
    assert out["best_exact"] == pytest.approx(60.0) and out["best_exact_thresh"] == pytest.approx(0.1)
    assert out["best_f1"] == pytest.approx(100 * (3 + 2 / 3) / 5) and out["best_f1_thresh"] == pytest.approx(0.6)


def test_squad_v2_no_answer_threshold_overrides_predictions():
    out = _v2(threshold=0.5)
    # na > 0.5 for b, d, c, e -> counted as "": b 0, d 1, c 1, e 0; a keeps its span: 1.
    assert out["exact"] == pytest.approx(60.0) and out["f1"] == pytest.approx(60.0)
    # The scoring function agrees with the module, and null odds (any real scale) work as scores.
    direct = squad_v2_scores(V2_PREDS, V2_GOLDS, {q: 10 * v - 5 for q, v in V2_NA.items()}, 0.0)
    assert direct["exact"] == pytest.approx(60.0)
    assert direct["best_f1_thresh"] == pytest.approx(10 * 0.6 - 5)
