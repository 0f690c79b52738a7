"""The baselines as transformers models (issue 20), for every encoder: hidden states (what they are, where, in the
graph), ``return_dict=False``, ``inputs_embeds``, gradient checkpointing, ``torch.export`` with static shapes (no
``int(lengths.max())``), pairs and single sentences mixed in one batch."""

from __future__ import annotations

import json

import pytest
import torch
from _helpers import assert_rows_classified_alone

from core.errors import run_cli
from modeling.baselines import SPEC, SesameBaselineForSequenceClassification, SesameBaselineModel, modeling_baseline
from modeling.baselines.modeling_baseline import pack_words
from modeling.export import TOLERANCE, main

ENCODERS = ["cbow", "fasttext", "cnn", "rnn", "treelstm"]


def _pairs():
    """A (3, 12) tokenizer-like batch of word ids with ``<S>`` = 1 and ``</S>`` = 2 around each sentence: row 0 a
    single sentence of 4 words, rows 1 and 2 pairs (3 + 2 and 1 + 4 words), rows 0 and 1 padded; char ids of random
    bytes."""
    g = torch.Generator().manual_seed(0)
    ids = torch.zeros(3, 12, dtype=torch.long)
    types = torch.zeros_like(ids)
    for row, lengths in enumerate([(4,), (3, 2), (1, 4)]):
        position = 0
        for segment, n in enumerate(lengths):
            sentence = [1, *torch.randint(4, 60, (n,), generator=g).tolist(), 2]
            ids[row, position : position + n + 2] = torch.tensor(sentence)
            types[row, position : position + n + 2] = segment
            position += n + 2
    mask = (ids != 0).long()
    chars = torch.randint(1, 257, (3, 12, 50), generator=g) * mask.unsqueeze(-1)
    return dict(input_ids=ids, char_ids=chars, attention_mask=mask, token_type_ids=types)


def _single():
    return {k: v for k, v in _pairs().items() if k != "token_type_ids"}


def _words(batch):
    return batch["input_ids"] > 2


@pytest.mark.parametrize("encoder_type", ENCODERS)
def test_hidden_states_are_the_word_vectors_then_the_encoder_states_at_the_input_positions(tiny, encoder_type):
    """hidden_states[0]: the word vectors (here the embedding rows of the words), 0 at <S>, </S>, padding; then the
    RNN's / Tree-LSTM's token states; last_hidden_state is the last of them; every one is in the graph of pooler_output
    (on main: no hidden_states, last_hidden_state packed to the left)."""
    model = SesameBaselineModel(tiny(encoder_type))
    batch, words = _single(), _words(_single())
    out = model(**batch, output_hidden_states=True)
    expected_count = 2 if encoder_type in ("rnn", "treelstm") else 1
    assert len(out.hidden_states) == expected_count and out.last_hidden_state is out.hidden_states[-1]
    for h in out.hidden_states:
        assert h.shape[:2] == (3, 12) and (h[~words] == 0).all() and (h[words].abs().sum(-1) > 0).all()
    if encoder_type != "fasttext":  # fastText's vectors mix in the n-grams (tested in test_encoders)
        embedding = model.embeddings.word_embeddings.weight
        torch.testing.assert_close(out.hidden_states[0][words], embedding[batch["input_ids"][words]], rtol=0, atol=0)
    grads = torch.autograd.grad(out.pooler_output.sum(), out.hidden_states)
    assert all(g[words].abs().sum() > 0 for g in grads)
    # the config default, and return_dict=False: the same fields as a tuple
    model.config.output_hidden_states = True
    plain = model.eval()(**batch, return_dict=False)
    fields = model(**batch)
    assert len(plain) == 3 and torch.equal(plain[0], fields.last_hidden_state)
    assert torch.equal(plain[1], fields.pooler_output) and all(map(torch.equal, plain[2], fields.hidden_states))


@pytest.mark.parametrize("encoder_type", ["cbow", "cnn", "rnn", "treelstm"])
@pytest.mark.parametrize("autocast", [False, True])
def test_inputs_embeds_give_the_outputs_of_input_ids(tiny, encoder_type, autocast):
    """The word vectors as inputs_embeds, <S> / </S> masked out (the model cannot see them without word ids): the same
    outputs, single sentences and pairs, in float32 and under bf16 autocast (on main: refused, input_ids required)."""
    model = SesameBaselineForSequenceClassification(tiny(encoder_type)).eval()
    for batch in (_single(), _pairs()):
        embeds = model.get_input_embeddings()(batch["input_ids"])
        by_embeds = {k: v for k, v in batch.items() if k not in ("input_ids", "char_ids")}
        by_embeds["attention_mask"] = _words(batch).long()
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            expected = model(**batch, output_hidden_states=True)
            got = model(**by_embeds, inputs_embeds=embeds, output_hidden_states=True)
        torch.testing.assert_close(got.logits, expected.logits, rtol=0, atol=0)
        for a, b in zip(got.hidden_states, expected.hidden_states):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_inputs_embeds_are_refused_where_the_encoder_needs_more(tiny):
    embeds = torch.zeros(1, 3, 8)
    for config in (tiny("fasttext"), tiny("cnn", embedding_mode="multichannel")):
        with pytest.raises(ValueError, match="inputs_embeds"):
            SesameBaselineModel(config)(inputs_embeds=embeds, attention_mask=torch.ones(1, 3))
    with pytest.raises(ValueError, match="exactly one of input_ids"):
        SesameBaselineModel(tiny("cbow"))(input_ids=torch.ones(1, 3, dtype=torch.long), inputs_embeds=embeds)


@pytest.mark.parametrize("encoder_type", ENCODERS)
def test_mixed_batch_classifies_each_row_as_what_it_is(tiny, encoder_type):
    """A single sentence in a batch of pairs gets the logits it gets alone (on main: the pair classifier with an empty
    second sentence)."""
    model = SesameBaselineForSequenceClassification(tiny(encoder_type, classifier_hidden_size=5)).eval()
    assert_rows_classified_alone(model, _pairs())


@pytest.mark.parametrize("encoder_type", ENCODERS)
def test_gradient_checkpointing_gives_the_same_gradients(tiny, encoder_type, monkeypatch):
    """Training mode with dropout (and the Tree-LSTM's Gumbel noise): the same gradients with the encoder recomputed in
    the backward pass (on main: refused, supports_gradient_checkpointing=False)."""
    model = SesameBaselineForSequenceClassification(
        tiny(encoder_type, embedding_dropout=0.3, rnn_dropout=0.3, classifier_dropout=0.2)
    ).train()
    encoder = type(model.baseline.encoder)
    calls = []
    for step in ("states", "pool"):
        original = getattr(encoder, step)
        monkeypatch.setattr(encoder, step, lambda self, *a, _f=original: calls.append(1) or _f(self, *a))

    def gradients():
        model.zero_grad()
        calls.clear()
        torch.manual_seed(3)
        model(**_pairs(), labels=torch.tensor([0, 2, 1])).loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, len(calls)

    plain, plain_calls = gradients()
    model.gradient_checkpointing_enable()
    checkpointed, checkpointed_calls = gradients()
    assert plain_calls == 2 and checkpointed_calls > plain_calls  # recomputed (states that are the inputs need not be)
    assert plain.keys() == checkpointed.keys() and plain
    for name in plain:
        torch.testing.assert_close(checkpointed[name], plain[name], rtol=0, atol=1e-6, msg=name)


def test_pack_words_is_static():
    """Hand-computed: the words of each row in order, packed to the left, as wide as the input (or ``max_len``)."""
    select = torch.tensor([[False, True, True, False, False], [True, False, True, True, True], [False] * 5])
    index, mask = pack_words(select)
    assert index.tolist() == [[1, 2, 0, 0, 0], [0, 2, 3, 4, 0], [0, 0, 0, 0, 0]]
    assert mask.tolist() == [[1, 1, 0, 0, 0], [1, 1, 1, 1, 0], [0] * 5]
    index, mask = pack_words(select, 3)
    assert index.tolist() == [[1, 2, 0], [0, 2, 3], [0, 0, 0]] and mask.shape == (3, 3)


_AXES = {0: torch.export.Dim("batch"), 1: torch.export.Dim("sequence")}


@pytest.mark.parametrize(
    "encoder_type,options",
    [
        ("cbow", {}),
        ("cnn", {}),
        ("rnn", {}),
        ("rnn", dict(rnn_type="gru", rnn_bidirectional=False, rnn_num_layers=1)),
    ],
    ids=["cbow", "cnn", "bilstm-2-layers", "gru"],
)
def test_torch_export_with_dynamic_batch_and_length(tiny, encoder_type, options):
    """The classifier (pairs and single sentences) exported with a dynamic batch and length: the graph runs other
    shapes as eager mode does (on main: pack_words's int(lengths.max()) and packed sequences stop the export). The
    GRU with one layer: each traced scan costs seconds, and the BiLSTM exports the stacking."""
    model = SesameBaselineForSequenceClassification(tiny(encoder_type, **options)).eval()
    example = {k: v[1:] for k, v in _pairs().items()}  # (2, 12)
    torch._dynamo.reset()  # dynamo caches the RNN's scan bodies: one traced for static shapes would pin these
    exported = torch.export.export(model, (), example, dynamic_shapes={k: _AXES for k in example})
    batch = _pairs()
    batch = {k: torch.cat([v, v.flip(0)])[:, :11] for k, v in batch.items()}  # (6, 11): another shape
    with torch.no_grad():
        torch.testing.assert_close(exported.module()(**batch).logits, model(**batch).logits, rtol=0, atol=1e-5)


def test_torch_export_of_the_latent_tree_lstm_with_static_shapes(tiny):
    """The latent Tree-LSTM composes T - 1 times: it exports for the example's shape (its loop length is the width)."""
    model = SesameBaselineModel(tiny("treelstm")).eval()
    batch = _single()
    exported = torch.export.export(model, (), batch)
    other = {k: v.flip(0) for k, v in batch.items()}
    with torch.no_grad():
        torch.testing.assert_close(
            exported.module()(**other).pooler_output, model(**other).pooler_output, rtol=0, atol=1e-6
        )


def test_graph_capture_schedule_equals_eager_mode(tiny, monkeypatch):
    """Eager mode cuts the packed sentences to the longest one; under graph capture they are as wide as the input:
    the same outputs."""
    model = SesameBaselineForSequenceClassification(tiny("treelstm")).eval()
    with torch.no_grad():
        eager = model(**_pairs(), output_hidden_states=True)
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
        assert modeling_baseline.sentence_width(_words(_pairs())) == 12
        captured = model(**_pairs(), output_hidden_states=True)
    torch.testing.assert_close(captured.logits, eager.logits, rtol=0, atol=1e-6)
    for a, b in zip(captured.hidden_states, eager.hidden_states):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


# a bag of words and the RNN's scan loops (the CNN, plain Conv1d layers on the same path, left out for time); the RNN
# is a one-layer BiLSTM (each traced scan costs seconds; test_torch_export_with_dynamic_batch_and_length exports two
# stacked layers) and still takes ~20 s on 2 busy cores: marked slow
@pytest.mark.parametrize("encoder_type", ["cbow", pytest.param("rnn", marks=pytest.mark.slow)])
def test_onnx_export_command_matches_pytorch_on_padded_batches(tiny, tmp_path, capsys, encoder_type):
    """``python -m modeling.export`` on a saved classifier, its inputs those of the family's spec: onnxruntime equals
    PyTorch within 1e-4 on padded batches of other shapes, pairs and single sentences (on main: refused, no spec)."""
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (pip install -e '.[test]')")
    pytest.importorskip("onnxscript", reason="the dynamo ONNX exporter needs onnxscript")
    SesameBaselineForSequenceClassification(
        tiny(encoder_type, classifier_hidden_size=5, rnn_num_layers=1)
    ).save_pretrained(tmp_path / "m")
    out = tmp_path / "model.onnx"
    assert run_cli(main, ["--model_name_or_path", str(tmp_path / "m"), "--output", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["inputs"] == list(SPEC.export_inputs) and report["outputs"] == ["logits"]
    assert max(report["max_abs_diff"].values()) <= TOLERANCE
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    model = SesameBaselineForSequenceClassification.from_pretrained(tmp_path / "m").eval()
    for batch in (_pairs(), dict(_single(), token_type_ids=torch.zeros(3, 12, dtype=torch.long))):
        (got,) = session.run(["logits"], {k: batch[k].numpy() for k in SPEC.export_inputs})
        with torch.no_grad():
            torch.testing.assert_close(torch.from_numpy(got), model(**batch).logits, rtol=0, atol=TOLERANCE)


def test_onnx_export_command_refuses_fasttext_and_the_tree_lstm(tiny, tmp_path, capsys):
    """One ``error:`` line each, before any export: fastText hashes its n-grams in Python, the latent Tree-LSTM composes
    ``length - 1`` times (on main: every baseline refused, no spec)."""
    for encoder_type in ("fasttext", "treelstm"):
        SesameBaselineModel(tiny(encoder_type)).save_pretrained(tmp_path / encoder_type)
        capsys.readouterr()
        code = run_cli(
            main, ["--model_name_or_path", str(tmp_path / encoder_type), "--output", str(tmp_path / "x.onnx")]
        )
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and f"encoder_type {encoder_type!r} does not export" in err[0], err
    assert not (tmp_path / "x.onnx").exists()
