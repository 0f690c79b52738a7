"""SesameElmo with static shapes (issue 20): torch.export (static and dynamic batch/length), ONNX through
``python -m modeling.export`` checked with onnxruntime on padded batches, the graph-capture schedule against eager
mode, the step-by-step recurrence against PyTorch's LSTM/GRU kernels, pairs and single sentences mixed in one batch,
and gradient checkpointing over the LSTM layers."""

from __future__ import annotations

import json

import pytest
import torch
from _helpers import assert_rows_classified_alone
from _tiny import micro_elmo_kwargs
from torch import nn

from core.errors import run_cli
from modeling.elmo import (
    SPEC,
    SesameElmoConfig,
    SesameElmoForBidirectionalLM,
    SesameElmoForQuestionAnswering,
    SesameElmoForSequenceClassification,
    SesameElmoForTokenClassification,
    SesameElmoModel,
    lstm_elmo,
)
from modeling.elmo.lstm_elmo import recurrence
from modeling.export import TOLERANCE, main

#: tiny, no dropout; the classifier as fine-tuning builds it by default (frozen BiLM, ScalarMix, task BiLSTM)
TINY = micro_elmo_kwargs(60, cnn_filters=[[1, 4], [2, 8]], num_labels=3)
#: for the exports whose point is not the stacking: torch.export traces each LSTM direction of each layer (seconds
#: apiece); test_torch_export_static_and_dynamic[SesameElmoModel-...] and the classifier's ONNX export keep 2 layers
ONE_LAYER = dict(num_layers=1)


def _config(**overrides) -> SesameElmoConfig:
    return SesameElmoConfig(**{**TINY, **overrides})


def _batch(batch: int, length: int, seed: int, pairs: bool = True) -> dict:
    """modeling.export's sample (row 0 a single sentence, the others pairs, the last row padded); ``pairs=False``:
    every row a single sentence."""
    sample = SPEC.export_sample(_config(), batch, length, torch.Generator().manual_seed(seed))
    if not pairs:
        sample["token_type_ids"].zero_()
    return sample


def _scale_mix(model) -> None:
    """ScalarMix away from its initial equal weights, so that a wrong layer would show."""
    with torch.no_grad():
        model.scalar_mix.scalar_parameters.copy_(torch.tensor([0.5, -1.0, 1.5])[: model.config.num_layers + 1])
        model.scalar_mix.gamma.fill_(1.7)


_AXES = {0: torch.export.Dim("batch"), 1: torch.export.Dim("sequence")}  # one batch and one sequence symbol for all
DIMS = dict(char_ids=_AXES, attention_mask=_AXES, token_type_ids=_AXES)


@pytest.mark.parametrize(
    "cls,field,overrides",
    [
        pytest.param(SesameElmoModel, "last_hidden_state", {}, id="SesameElmoModel-last_hidden_state"),
        pytest.param(
            SesameElmoForSequenceClassification, "logits", ONE_LAYER, id="SesameElmoForSequenceClassification-logits"
        ),
    ],
)
def test_torch_export_static_and_dynamic(cls, field, overrides):
    """Exported on a (2, 8) batch; the dynamic program runs other shapes, pairs and single sentences alike (on main:
    GuardOnDataDependentSymNode at the mask check, the pair/single choice, the pair width, torch.unique). The base
    model with its 2 BiLM layers (the second reads the first, with the residual); the classifier with one."""
    model = cls(_config(**overrides)).eval()
    if hasattr(model, "scalar_mix"):
        _scale_mix(model)
    example = _batch(2, 8, seed=0)
    torch._dynamo.reset()  # dynamo caches the LSTMs' scan bodies: one traced for static shapes would pin these
    dynamic = torch.export.export(model, (), example, dynamic_shapes=DIMS)
    static = torch.export.export(model, (), example)
    with torch.no_grad():
        same_shape = _batch(2, 8, seed=5)
        torch.testing.assert_close(static.module()(**same_shape)[field], model(**same_shape)[field], rtol=0, atol=1e-5)
        for pairs in (True, False):
            other = _batch(5, 11, seed=1, pairs=pairs)
            torch.testing.assert_close(dynamic.module()(**other)[field], model(**other)[field], rtol=0, atol=1e-5)


def test_torch_export_of_the_bilm_loss():
    """The BiLM head in eval mode (full softmax) exports too: no branch on the number of predicted tokens (one BiLM
    layer: the head is the point)."""
    model = SesameElmoForBidirectionalLM(_config(**ONE_LAYER)).eval()
    batch = {k: v for k, v in _batch(3, 9, seed=0).items() if k != "token_type_ids"}
    batch["input_ids"] = torch.randint(4, 60, (3, 9)) * batch["attention_mask"]
    exported = torch.export.export(model, (), batch)
    other = {k: v.flip(0) for k, v in batch.items()}
    with torch.no_grad():
        torch.testing.assert_close(exported.module()(**other).loss, model(**other).loss, rtol=0, atol=1e-6)
        # no predicted token at all: loss 0, still in the graph
        nothing = model(**batch, labels=torch.full((3, 9), -100))
    assert nothing.loss == 0 and nothing.forward_num_tokens == 0


# ~35 s on 2 cores: the classifier (2 BiLM layers) runs in the fast set, the base model (one, ~12 s) is marked slow
@pytest.mark.parametrize(
    "cls,task,overrides",
    [
        pytest.param(
            SesameElmoForSequenceClassification,
            "sequence-classification",
            {},
            id="SesameElmoForSequenceClassification-sequence-classification",
        ),
        pytest.param(SesameElmoModel, "base", ONE_LAYER, marks=pytest.mark.slow, id="SesameElmoModel-base"),
    ],
)
def test_onnx_export_command_matches_pytorch_on_padded_batches(tmp_path, capsys, cls, task, overrides):
    """``python -m modeling.export`` on a saved frozen-ELMo classifier: inputs char_ids, attention_mask,
    token_type_ids; onnxruntime equals PyTorch within 1e-4 on padded batches of another shape (on main: refused)."""
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (pip install -e '.[test]')")
    pytest.importorskip("onnxscript", reason="the dynamo ONNX exporter needs onnxscript")
    model = cls(_config(**overrides)).eval()
    if hasattr(model, "scalar_mix"):
        _scale_mix(model)
    model.save_pretrained(tmp_path / "m")
    out = tmp_path / "model.onnx"
    assert run_cli(main, ["--model_name_or_path", str(tmp_path / "m"), "--output", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["task"] == task and report["class"] == cls.__name__
    assert report["inputs"] == ["char_ids", "attention_mask", "token_type_ids"]
    assert max(report["max_abs_diff"].values()) <= TOLERANCE
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    for pairs in (True, False):  # an independent check: another shape, pairs and single sentences
        batch = _batch(4, 13, seed=3, pairs=pairs)
        got = session.run(report["outputs"], {k: v.numpy() for k, v in batch.items()})
        with torch.no_grad():
            expected = model(**batch)
        for name, value in zip(report["outputs"], got):
            torch.testing.assert_close(torch.from_numpy(value), expected[name], rtol=0, atol=1e-4)


def _eager_and_captured(monkeypatch, fn):
    """``fn()`` in eager mode, and with the graph-capture schedule (what torch.export / torch.compile trace: every
    token through the character CNN, the pairs at the full width T, the general pair/single path), still eager."""
    eager = fn()
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    captured = fn()
    monkeypatch.undo()
    return eager, captured


@pytest.mark.parametrize(
    "cls", [SesameElmoForSequenceClassification, SesameElmoForQuestionAnswering, SesameElmoForTokenClassification]
)
def test_graph_capture_schedule_equals_eager_mode(monkeypatch, cls):
    """The shortcuts eager mode takes give the same outputs as the static-shape path (pairs: the sentences packed to
    T instead of the longest sentence; the hidden states are in the pair's layout either way), in float32 and under
    bf16 autocast."""
    model = cls(_config(freeze_backbone=False)).eval()
    batch = _batch(4, 12, seed=2)
    batch["char_ids"][1, 3] = batch["char_ids"][2, 4]  # a repeated word (torch.unique's shortcut)
    field = "start_logits" if cls is SesameElmoForQuestionAnswering else "logits"
    for autocast in (False, True):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            eager, captured = _eager_and_captured(monkeypatch, lambda: model(**batch, output_hidden_states=True))
        tol = 2e-2 if autocast else 1e-5
        torch.testing.assert_close(captured[field], eager[field], rtol=0, atol=tol)
        for a, b in zip(captured.hidden_states, eager.hidden_states):
            torch.testing.assert_close(a, b, rtol=0, atol=tol)


def test_mixed_batch_classifies_each_row_as_what_it_is():
    """A single sentence in a batch of pairs gets the logits it gets alone, a pair those of a batch of pairs (on main
    the whole batch took the pair path: the single sentence went through the pair classifier with an empty v)."""
    model = SesameElmoForSequenceClassification(_config()).eval()
    _scale_mix(model)
    assert_rows_classified_alone(model, _batch(3, 10, seed=4))  # row 0 single, rows 1 and 2 pairs


@pytest.mark.parametrize("kind", ["lstm-projection", "lstm", "gru", "bidirectional-reverse"])
def test_recurrence_equals_pytorch_kernels(kind):
    """``recurrence`` (the exported graph's LSTM / GRU) against nn.LSTM / nn.GRU with the same parameters."""
    x = torch.randn(3, 7, 5)
    if kind == "gru":
        rnn = nn.GRU(5, 6, batch_first=True)
    else:
        rnn = nn.LSTM(
            5,
            6,
            batch_first=True,
            proj_size=4 if kind == "lstm-projection" else 0,
            bidirectional=kind == "bidirectional-reverse",
        )
    with torch.no_grad():
        for p in rnn.parameters():  # not the default small init: saturating gates are part of the check
            p.uniform_(-1.0, 1.0)
        expected = rnn(x)[0]
        if kind == "bidirectional-reverse":  # the reverse direction reads the sequence backwards
            got = recurrence(rnn, x.flip(1), reverse=True).flip(1)
            expected = expected[..., 6:]
        else:
            got = recurrence(rnn, x)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "options",
    [{}, dict(fused_cpu_lstm=False), dict(cell_clip=1.0, proj_clip=1.0), dict(cell_type="gru")],
    ids=["fused", "native", "clipped", "gru"],
)
@pytest.mark.parametrize("reentrant", [False, True])
def test_gradient_checkpointing_recomputes_each_layer_with_the_same_gradients(monkeypatch, options, reentrant):
    """BiLM training step with dropout, the mask left- and right-padded: the same gradients with and without
    checkpointing (dropout masks replayed), and each LSTM layer really runs twice (on main: refused,
    supports_gradient_checkpointing=False)."""
    torch.manual_seed(0)
    model = SesameElmoForBidirectionalLM(_config(dropout=0.3, **options)).train()
    batch = {k: v for k, v in _batch(3, 9, seed=0).items() if k != "token_type_ids"}
    batch["attention_mask"][0, :2] = 0  # left padding too
    batch["input_ids"] = torch.randint(4, 60, (3, 9))
    calls = []
    layer = lstm_elmo.RecurrentLayer.forward
    fused = lstm_elmo.BiLSTMProjectionFunction.forward
    monkeypatch.setattr(lstm_elmo.RecurrentLayer, "forward", lambda self, x: calls.append(1) or layer(self, x))
    monkeypatch.setattr(
        lstm_elmo.BiLSTMProjectionFunction, "forward", staticmethod(lambda ctx, *a: calls.append(1) or fused(ctx, *a))
    )

    def gradients():
        model.zero_grad()
        calls.clear()
        torch.manual_seed(1)
        model(**batch).loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, len(calls)

    plain, plain_calls = gradients()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    checkpointed, checkpointed_calls = gradients()
    assert checkpointed_calls == 2 * plain_calls > 0
    assert plain.keys() == checkpointed.keys() and len(plain) == len(list(model.parameters()))
    for name in plain:
        torch.testing.assert_close(checkpointed[name], plain[name], rtol=0, atol=1e-6, msg=name)


#: the ways transformers turns gradient checkpointing on: its deprecated and its current name, its default
#: (non-reentrant) and both ``use_reentrant`` values
ENABLE = {
    "gradient_checkpointing_enable": lambda m: m.gradient_checkpointing_enable(),
    "non-reentrant": lambda m: m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False}),
    "reentrant": lambda m: m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True}),
    "activation_checkpointing_enable": lambda m: m.activation_checkpointing_enable(),
}


@pytest.mark.filterwarnings("ignore:`gradient_checkpointing_(en|dis)able` is deprecated:FutureWarning")
@pytest.mark.parametrize("enable", list(ENABLE), ids=list(ENABLE))
@pytest.mark.parametrize("cls", [SesameElmoForBidirectionalLM, SesameElmoForSequenceClassification])
def test_gradient_checkpointing_through_transformers_layers(cls, enable):
    """transformers' convention (issue 43): each BiLM layer is a ``GradientCheckpointingLayer`` that transformers'
    enable / disable calls switch; switched on, each layer goes through the checkpoint function once per forward in
    training mode (never in eval mode) and the float32 gradients equal those without it (dropout on, left and right
    padding); switched off again, the gradients are bitwise those of the plain model (on main: no such layer, the
    model's own flag)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    torch.manual_seed(0)
    model = cls(_config(dropout=0.3, freeze_backbone=False, classifier_dropout=0.2)).train()
    batch = {k: v for k, v in _batch(3, 9, seed=0, pairs=False).items() if k != "token_type_ids"}
    batch["attention_mask"][0, :2] = 0  # left padding too
    labels = dict(input_ids=torch.randint(4, 60, (3, 9))) if cls is SesameElmoForBidirectionalLM else {}
    labels = labels or dict(labels=torch.tensor([0, 2, 1]))
    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    assert len(layers) == model.config.num_layers and not model.is_activation_checkpointing

    def gradients():
        model.zero_grad()
        torch.manual_seed(1)
        model(**batch, **labels).loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    plain = gradients()
    ENABLE[enable](model)
    assert model.is_activation_checkpointing and all(layer.gradient_checkpointing for layer in layers)
    calls = []
    for layer in layers:
        checkpoint = layer._gradient_checkpointing_func
        layer._gradient_checkpointing_func = lambda *a, _c=checkpoint, **k: calls.append(1) or _c(*a, **k)
    with torch.no_grad():
        model.eval()(**batch, **labels)
    assert calls == []  # not in eval mode
    model.train()
    checkpointed = gradients()
    assert len(calls) == len(layers)  # each layer went through torch.utils.checkpoint
    assert plain.keys() == checkpointed.keys() and len(plain) == len(list(model.parameters()))
    for name in plain:
        torch.testing.assert_close(checkpointed[name], plain[name], rtol=1e-6, atol=1e-7, msg=name)
    calls.clear()
    if enable == "activation_checkpointing_enable":
        model.activation_checkpointing_disable()
    else:
        model.gradient_checkpointing_disable()
    assert not model.is_activation_checkpointing and not any(layer.gradient_checkpointing for layer in layers)
    again = gradients()
    assert calls == []
    assert all(torch.equal(again[name], plain[name]) for name in plain)
