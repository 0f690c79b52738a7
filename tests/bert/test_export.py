"""SesameBert export: torch.export (static and dynamic shapes), torch.jit.trace, torch.compile(fullgraph=True), and
ONNX through ``python -m modeling.export`` checked with onnxruntime on padded batches."""

from __future__ import annotations

import json

import pytest
import torch
from _tiny import padded_batch

from core.errors import run_cli
from modeling import (
    SesameBertConfig,
    SesameBertForQuestionAnswering,
    SesameBertForSequenceClassification,
    SesameBertForTokenClassification,
    SesameBertModel,
)
from modeling.export import TOLERANCE, main

NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
HEADS = {
    "base": (SesameBertModel, "last_hidden_state"),
    "sequence-classification": (SesameBertForSequenceClassification, "logits"),
    "question-answering": (SesameBertForQuestionAnswering, "start_logits"),
    "token-classification": (SesameBertForTokenClassification, "logits"),
}


@pytest.fixture(autouse=True)
def _seed_and_threads(seeded_single_thread):
    """Every test here: seed 0, one torch thread (tests/conftest.py)."""


def _model(tiny_kwargs, task):
    cls, field = HEADS[task]
    return cls(SesameBertConfig(**tiny_kwargs, **NO_DROPOUT, num_labels=3)).eval(), field


def _other_padded_batch(vocab_size):
    """A (5, 9) batch: another shape than make_batch's (3, 12), padding in two rows."""
    return dict(
        padded_batch(vocab_size, (5, 9), {1: 6, 4: 2}, seed=7), token_type_ids=torch.zeros(5, 9, dtype=torch.long)
    )


@pytest.mark.parametrize("task", list(HEADS))
def test_torch_export_static_and_dynamic(tiny_kwargs, make_batch, task):
    model, field = _model(tiny_kwargs, task)
    batch = make_batch(tiny_kwargs["vocab_size"])
    other = _other_padded_batch(tiny_kwargs["vocab_size"])
    static = torch.export.export(model, (), dict(batch))
    batch_dim, length_dim = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("length", min=2, max=64)
    shapes = {name: {0: batch_dim, 1: length_dim} for name in batch}
    dynamic = torch.export.export(model, (), dict(batch), dynamic_shapes=shapes)
    with torch.no_grad():
        torch.testing.assert_close(static.module()(**batch)[field], model(**batch)[field], rtol=0, atol=1e-5)
        torch.testing.assert_close(dynamic.module()(**other)[field], model(**other)[field], rtol=0, atol=1e-5)
    # the graph keeps the mask: an example without padding exports the same computation
    unpadded = {k: v[:2, :8].clone() for k, v in batch.items()}  # contiguous: strides would guard
    assert unpadded["attention_mask"].all()
    traced = torch.export.export(model, (), unpadded, dynamic_shapes=shapes)
    with torch.no_grad():
        torch.testing.assert_close(traced.module()(**other)[field], model(**other)[field], rtol=0, atol=1e-5)


def test_torch_export_with_packed_documents(tiny_kwargs):
    model, _ = _model(tiny_kwargs, "base")
    g = torch.Generator().manual_seed(3)
    inputs = dict(
        input_ids=torch.randint(5, tiny_kwargs["vocab_size"], (2, 10), generator=g),
        position_ids=torch.tensor([[0, 1, 2, 3, 0, 1, 2, 0, 1, 2], [0, 1, 2, 3, 4, 5, 0, 1, 2, 3]]),
    )
    length = torch.export.Dim("length", min=2, max=64)
    exported = torch.export.export(model, (), inputs, dynamic_shapes={k: {1: length} for k in inputs})
    other = dict(input_ids=inputs["input_ids"][:, :7].clone(), position_ids=torch.tensor([[0, 1, 0, 1, 2, 0, 1]] * 2))
    with torch.no_grad():
        torch.testing.assert_close(
            exported.module()(**other).last_hidden_state, model(**other).last_hidden_state, rtol=0, atol=1e-5
        )


def test_jit_trace_with_an_unpadded_example_keeps_the_mask(tiny_kwargs, make_batch):
    """Traced with an all-ones mask, the graph still applies the mask of a padded batch."""
    model, _ = _model(tiny_kwargs, "sequence-classification")
    model.config.return_dict = False
    batch = make_batch(tiny_kwargs["vocab_size"])
    ones = dict(batch, attention_mask=torch.ones_like(batch["attention_mask"]))
    with torch.no_grad():
        traced = torch.jit.trace(
            model, (ones["input_ids"], ones["attention_mask"], ones["token_type_ids"]), check_trace=False
        )
        got = traced(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])[0]
        torch.testing.assert_close(got, model(**batch)[0], rtol=0, atol=1e-5)


def test_compile_fullgraph_has_no_graph_break(tiny_kwargs, make_batch):
    """Dynamo traces forward into one graph (backend "eager": the tracing is what is tested, not inductor)."""
    model, _ = _model(tiny_kwargs, "sequence-classification")
    batch = make_batch(tiny_kwargs["vocab_size"])
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    position_ids = torch.tensor([[0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5]] * 3)
    with torch.no_grad():
        for extra in ({}, dict(position_ids=position_ids)):
            torch.testing.assert_close(
                compiled(**batch, **extra).logits, model(**batch, **extra).logits, rtol=0, atol=1e-6
            )


# ~10 s each on 2 cores: the sequence-classification head runs in the fast set, the others are marked slow
@pytest.mark.parametrize(
    "task", [pytest.param(t, marks=[] if t == "sequence-classification" else pytest.mark.slow) for t in HEADS]
)
def test_onnx_export_command_matches_pytorch_on_a_padded_batch(tiny_kwargs, tmp_path, capsys, task):
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (pip install -e '.[test]')")
    pytest.importorskip("onnxscript", reason="the dynamo ONNX exporter needs onnxscript")
    model, field = _model(tiny_kwargs, task)
    model.save_pretrained(tmp_path / "m")
    out = tmp_path / "onnx" / "model.onnx"
    # the task comes from config.json's architectures
    assert run_cli(main, ["--model_name_or_path", str(tmp_path / "m"), "--output", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["task"] == task and report["class"] == type(model).__name__
    assert report["inputs"] == ["input_ids", "attention_mask", "token_type_ids"]
    assert max(report["max_abs_diff"].values()) <= TOLERANCE
    # an independent check here: another padded batch, every output
    batch = _other_padded_batch(tiny_kwargs["vocab_size"])
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    got = dict(zip(report["outputs"], session.run(None, {k: v.numpy() for k, v in batch.items()})))
    assert field in got
    with torch.no_grad():
        expected = model(**batch)
    for name, value in got.items():
        torch.testing.assert_close(torch.from_numpy(value), expected[name], rtol=0, atol=1e-4)


def test_onnx_export_command_refuses_bad_input(tiny_kwargs, tmp_path, capsys):
    from transformers import BertConfig

    other = tmp_path / "other"  # a model without a sesame-lm ModelSpec
    BertConfig(**tiny_kwargs).save_pretrained(other)
    bert = tmp_path / "bert"
    SesameBertModel(SesameBertConfig(**tiny_kwargs)).save_pretrained(bert)
    (tmp_path / "folder.onnx").mkdir()
    capsys.readouterr()
    cases = [
        ([str(tmp_path / "missing")], "no such folder"),
        ([str(tmp_path / "folder.onnx")], "no config.json"),
        (
            [str(other)],
            "model_type 'bert' cannot be exported yet; exportable: sesame-bert, sesame-elmo, sesame-baseline",
        ),
        ([str(bert), "--task", "summarization"], "--task summarization: unknown"),
    ]
    for args, message in cases:
        code = run_cli(main, ["--model_name_or_path", *args, "--output", str(tmp_path / "x.onnx")])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    code = run_cli(main, ["--model_name_or_path", str(bert), "--output", str(tmp_path / "folder.onnx")])
    assert code == 2 and "is a folder" in capsys.readouterr().err
    assert not (tmp_path / "x.onnx").exists()
