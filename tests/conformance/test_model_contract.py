"""The Hugging Face model contract, checked for every head of every family that has rows in :data:`ROWS`.

A row names a model class, a tiny config factory, a padded batch, its labels, the main output field, and the parts of
the contract the class does not meet (yet), each with the reason (the test then skips with that reason). Adding a
family (the ELMo-style heads, more baselines) means adding rows; the checks stay the same:

save/load round trips, ``return_dict=False`` tuples, ``output_hidden_states`` / ``output_attentions`` (shapes,
gradients, transformers' output capture), ``inputs_embeds``, resizing the token embeddings, tied weights through
save/load, ``attn_implementation`` switching, low-precision loading, gradient checkpointing through transformers'
enable / disable calls (and its ``GradientCheckpointingLayer`` convention), ``torch.export`` and determinism.
Everything is tiny and runs in seconds on a CPU. ``test_transformers_common.py`` runs transformers' own common model
tests on the SesameBert and SesameElmo heads (with a transformers source tree).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import torch
from _tiny import eurobert_layout, micro_elmo_kwargs, modern_layout, tiny_bert_kwargs
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

import modeling
from modeling.baselines import SesameBaselineConfig, SesameBaselineForSequenceClassification, SesameBaselineModel

#: the parts of the contract (the keys of Row.unsupported)
ASPECTS = (
    "save_load",
    "return_tuple",
    "hidden_states",
    "attentions",
    "capture",
    "inputs_embeds",
    "resize",
    "tied",
    "attn_implementation",
    "dtype",
    "gradient_checkpointing",
    "checkpointing_layers",
    "export",
    "determinism",
)


@dataclass(frozen=True)
class Row:
    """One head of one family.

    Attributes:
        model_class: the ``PreTrainedModel`` class.
        config: ``(**overrides) -> config``, tiny (a few thousand parameters), no dropout.
        batch: ``() -> inputs``, a padded batch (padding in some rows).
        labels: ``inputs -> label kwargs`` for a training loss (``{}``: the test sums ``output``).
        output: the main output field (compared by the round-trip checks).
        num_layers: the number of hidden states minus 1 / of attention layers.
        dtype_overrides: config overrides for the low-precision check (the options whose buffers must follow).
        export_overrides: config overrides for the ``torch.export`` check (the ELMo-style rows: one BiLM layer, each
            traced LSTM direction costs seconds; tests/elmo/test_elmo_export.py exports the stacked layers).
        unsupported: aspect -> reason, for the aspects the class does not meet (skipped with the reason).
        hidden_widths: ``model -> [width of hidden state i]``; default ``config.hidden_size`` for every one.
    """

    model_class: type
    config: Callable
    batch: Callable[[], dict]
    labels: Callable[[dict], dict]
    output: str
    num_layers: int = 0
    dtype_overrides: dict = field(default_factory=dict)
    export_overrides: dict = field(default_factory=dict)
    unsupported: dict[str, str] = field(default_factory=dict)
    hidden_widths: Callable | None = None

    def make(self, **overrides):
        torch.manual_seed(0)
        return self.model_class(self.config(**overrides)).eval()

    def check(self, aspect: str) -> None:
        assert aspect in ASPECTS, aspect
        if aspect in self.unsupported:
            pytest.skip(f"{self.model_class.__name__}: {self.unsupported[aspect]}")


# ---- the SesameBert family ----------------------------------------------------------------------------------------
BERT_TINY = tiny_bert_kwargs(40, 32, width=16, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=3)


def bert_config(**overrides):
    return modeling.SesameBertConfig(**{**BERT_TINY, **overrides})


def bert_batch() -> dict:
    """(3, 10): rows 1 and 2 padded, two segments."""
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(5, BERT_TINY["vocab_size"], (3, 10), generator=g)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 7:] = 0
    attention_mask[2, 4:] = 0
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[:, 5:] = 1
    return dict(
        input_ids=input_ids * attention_mask,
        attention_mask=attention_mask,
        token_type_ids=token_type_ids * attention_mask,
    )


def _class_labels(b):
    """Class labels of the 3-row batches (3 classes)."""
    return dict(labels=torch.tensor([0, 2, 1]))


def _mlm_labels(b):
    return b["input_ids"].masked_fill((torch.arange(10) % 3 != 0) | (b["attention_mask"] == 0), -100)


def _bert_row(cls, output, labels, **kwargs):
    return Row(
        cls,
        bert_config,
        bert_batch,
        labels,
        output,
        num_layers=BERT_TINY["num_hidden_layers"],
        dtype_overrides=dict(position_embedding_type="sinusoidal"),
        **kwargs,
    )


BERT_ROWS = {
    "bert-model": _bert_row(modeling.SesameBertModel, "last_hidden_state", lambda b: {}),
    "bert-mlm": _bert_row(modeling.SesameBertForMaskedLM, "logits", lambda b: dict(labels=_mlm_labels(b))),
    "bert-pretraining": _bert_row(
        modeling.SesameBertForPreTraining,
        "prediction_logits",
        lambda b: dict(labels=_mlm_labels(b), next_sentence_label=torch.tensor([0, 1, 0])),
    ),
    "bert-classification": _bert_row(modeling.SesameBertForSequenceClassification, "logits", _class_labels),
    "bert-qa": _bert_row(
        modeling.SesameBertForQuestionAnswering,
        "start_logits",
        lambda b: dict(start_positions=torch.tensor([1, 2, 3]), end_positions=torch.tensor([2, 5, 3])),
    ),
    "bert-tagging": _bert_row(
        modeling.SesameBertForTokenClassification,
        "logits",
        lambda b: dict(labels=(b["input_ids"] % 3).masked_fill(b["attention_mask"] == 0, -100)),
    ),
}


# ---- SesameBert in the ModernBERT and EuroBERT layouts (issue 50) ---------------------------------------------------
#: ModernBERT's layout (rotary positions with a global and a local base, GeGLU, pre-norm without biases, its head) with
#: a 4-token window, so that the 10-token batch has local layers that see part of it; layers 0 and 3 global.
MODERN_TINY = dict(
    modern_layout(local_attention=4, global_attn_every_n_layers=3),
    **tiny_bert_kwargs(40, 32, width=16, layers=4, num_labels=3),
    pad_token_id=0,
)
#: EuroBERT's layout: the Llama block (pre-norm RMSNorm, SwiGLU, rotary positions), grouped-query attention with a
#: head_dim of its own, no embedding norm, a final norm, its heads (mean pooling).
EURO_TINY = dict(
    tiny_bert_kwargs(40, 32, width=16, layers=2, num_labels=3),
    **eurobert_layout(num_attention_heads=4, num_key_value_heads=2, head_dim=8, hidden_act="swiglu"),
    classifier_pooling="mean",
    pad_token_id=0,
)


def _layout_row(layout: dict, cls, output, labels, **kwargs):
    return Row(
        cls,
        lambda **overrides: modeling.SesameBertConfig(**{**layout, **overrides}),
        lambda: {k: v for k, v in bert_batch().items() if k != "token_type_ids"},  # no segment embeddings
        labels,
        output,
        num_layers=layout["num_hidden_layers"],
        **kwargs,
    )


def _layout_rows(name: str, layout: dict) -> dict:
    heads = {
        "model": (modeling.SesameBertModel, "last_hidden_state", lambda b: {}),
        "mlm": (modeling.SesameBertForMaskedLM, "logits", lambda b: dict(labels=_mlm_labels(b))),
        "classification": (modeling.SesameBertForSequenceClassification, "logits", _class_labels),
        "tagging": (
            modeling.SesameBertForTokenClassification,
            "logits",
            lambda b: dict(labels=(b["input_ids"] % 3).masked_fill(b["attention_mask"] == 0, -100)),
        ),
    }
    return {f"{name}-{head}": _layout_row(layout, *spec) for head, spec in heads.items()}


MODERN_ROWS = {**_layout_rows("modernbert", MODERN_TINY), **_layout_rows("eurobert", EURO_TINY)}


# ---- the classic baselines ---------------------------------------------------------------------------------------
def baseline_config(**overrides):
    return SesameBaselineConfig(
        **{
            **dict(
                vocab_size=40,
                embedding_dim=8,
                encoder_type="rnn",
                rnn_hidden_size=6,
                rnn_num_layers=1,
                classifier_hidden_size=0,
                num_labels=3,
            ),
            **overrides,
        }
    )


def baseline_batch() -> dict:
    return {k: v for k, v in bert_batch().items() if k != "token_type_ids"}  # single sentences


_BASELINE_UNSUPPORTED = {
    "attentions": "no attention",
    "capture": "the hidden states (word vectors, encoder states) are put back at the input positions from the packed "
    "sentences, not recorded from layer modules by transformers' capture hooks (output_hidden_states=True/"
    "False is honoured)",
    "tied": "no output embeddings",
    "attn_implementation": "no attention",
    "checkpointing_layers": "one encoder, recomputed as a whole through the model's own gradient_checkpointing flag "
    "(transformers' enable / disable set it), no repeated layer modules",
}


def _baseline_widths(model):
    """The rnn encoder's hidden states: the word vectors (E), then its token states (directions x H)."""
    return [model.config.embedding_dim, model.base_model.encoder.output_size]


def _baseline_row(cls, output, labels, batch=baseline_batch):
    unsupported = dict(_BASELINE_UNSUPPORTED)
    return Row(
        cls,
        baseline_config,
        batch,
        labels,
        output,
        num_layers=1,
        unsupported=unsupported,
        hidden_widths=_baseline_widths,
    )


BASELINE_ROWS = {
    "baseline-model": _baseline_row(SesameBaselineModel, "pooler_output", lambda b: {}),
    "baseline-classification": _baseline_row(SesameBaselineForSequenceClassification, "logits", _class_labels),
    "baseline-classification-pair": _baseline_row(
        SesameBaselineForSequenceClassification, "logits", _class_labels, batch=bert_batch
    ),
}

# ---- the ELMo-style family --------------------------------------------------------------------------------------
ELMO_TINY = micro_elmo_kwargs(40, num_labels=3, freeze_backbone=False)


def elmo_config(**overrides):
    return modeling.SesameElmoConfig(**{**ELMO_TINY, **overrides})


def elmo_pair_batch() -> dict:
    """bert_batch's layout (3, 10) with ELMo character ids (random words, all 0 at padding) and word ids: rows 0 and 1
    are pairs, row 2 (4 tokens, all of type 0) a single sentence."""
    b = bert_batch()
    g = torch.Generator().manual_seed(1)
    words = torch.randint(98, 123, (3, 10, 3), generator=g)  # three letters (byte + 1) per word
    char_ids = torch.full((3, 10, 50), 261)
    char_ids[..., 0], char_ids[..., 1:4], char_ids[..., 4] = 259, words, 260
    return dict(b, char_ids=char_ids * b["attention_mask"].unsqueeze(-1))


def elmo_batch() -> dict:
    return {k: v for k, v in elmo_pair_batch().items() if k != "token_type_ids"}  # single sentences


_ELMO_UNSUPPORTED = {
    "attentions": "no attention layers (a BiLSTM)",
    "attn_implementation": "no attention layers (a BiLSTM)",
    "capture": "the hidden states are [forward; backward] pairs of two LSTM stacks stepped together, not the outputs "
    "of one layer module that transformers' capture hooks record (output_hidden_states=True/False is "
    "honoured)",
    "resize": "character input: the input embeddings are a character CNN, no token matrix to resize",
    "tied": "no tied weights (the BiLM softmax is not tied to the character CNN)",
}


def _elmo_row(cls, output, labels, batch=elmo_batch, **unsupported):
    return Row(
        cls,
        elmo_config,
        batch,
        labels,
        output,
        num_layers=ELMO_TINY["num_layers"],
        export_overrides=dict(num_layers=1),
        unsupported={**_ELMO_UNSUPPORTED, **unsupported},
    )


ELMO_ROWS = {
    "elmo-model": _elmo_row(modeling.SesameElmoModel, "last_hidden_state", lambda b: {}),
    "elmo-bilm": _elmo_row(modeling.SesameElmoForBidirectionalLM, "loss", lambda b: {}),
    "elmo-classification": _elmo_row(modeling.SesameElmoForSequenceClassification, "logits", _class_labels),
    "elmo-classification-pair": _elmo_row(
        modeling.SesameElmoForSequenceClassification,
        "logits",
        _class_labels,
        batch=elmo_pair_batch,
    ),
    "elmo-qa": _elmo_row(
        modeling.SesameElmoForQuestionAnswering,
        "start_logits",
        lambda b: dict(start_positions=torch.tensor([6, 5, 0]), end_positions=torch.tensor([7, 6, 0])),
        batch=elmo_pair_batch,
    ),
    "elmo-tagging": _elmo_row(
        modeling.SesameElmoForTokenClassification,
        "logits",
        lambda b: dict(labels=(b["input_ids"] % 3).masked_fill(b["attention_mask"] == 0, -100)),
    ),
}

ROWS = {**BERT_ROWS, **MODERN_ROWS, **BASELINE_ROWS, **ELMO_ROWS}
rows = pytest.mark.parametrize("row", list(ROWS.values()), ids=list(ROWS))


@pytest.fixture(autouse=True)
def _seed_and_threads(seeded_single_thread):
    """Every test here: seed 0, one torch thread (tests/conftest.py)."""


def _tensors(output) -> dict[str, torch.Tensor]:
    """The tensor fields of a ModelOutput (tuples of tensors flattened as ``name.i``)."""
    out = {}
    for name, value in output.items():
        if isinstance(value, torch.Tensor):
            out[name] = value
        elif isinstance(value, tuple):
            out.update({f"{name}.{i}": v for i, v in enumerate(value) if isinstance(v, torch.Tensor)})
    return out


def _assert_equal_outputs(a, b, atol=0.0):
    ta, tb = _tensors(a), _tensors(b)
    assert ta.keys() == tb.keys()
    for name in ta:
        torch.testing.assert_close(ta[name], tb[name], rtol=0, atol=atol, msg=name)


@rows
def test_save_load_round_trip(row, tmp_path):
    row.check("save_load")
    model, batch = row.make(), row.batch()
    model.save_pretrained(tmp_path / "m")
    loaded = row.model_class.from_pretrained(tmp_path / "m").eval()
    assert type(loaded) is row.model_class
    with torch.no_grad():
        _assert_equal_outputs(loaded(**batch, **row.labels(batch)), model(**batch, **row.labels(batch)))


@rows
def test_return_dict_false_gives_the_output_fields_as_a_tuple(row):
    row.check("return_tuple")
    model, batch = row.make(), row.batch()
    with torch.no_grad():
        for flags in ({}, dict(output_hidden_states=True)) if "hidden_states" not in row.unsupported else ({},):
            output = model(**batch, **row.labels(batch), **flags)
            plain = model(**batch, **row.labels(batch), **flags, return_dict=False)
            assert isinstance(plain, tuple) and len(plain) == len(output.to_tuple())
            for got, (name, expected) in zip(plain, output.items()):
                if isinstance(expected, tuple):
                    assert all(torch.equal(g, e) for g, e in zip(got, expected)), name
                else:
                    assert torch.equal(got, expected), name


@rows
def test_hidden_states_shapes_and_gradients(row):
    row.check("hidden_states")
    model, batch = row.make(), row.batch()
    out = model(**batch, output_hidden_states=True)
    b, t = batch[model.main_input_name].shape[:2]
    widths = row.hidden_widths(model) if row.hidden_widths else [model.config.hidden_size] * (row.num_layers + 1)
    assert len(out.hidden_states) == row.num_layers + 1
    assert [h.shape for h in out.hidden_states] == [(b, t, w) for w in widths]
    # in the graph: the output depends on every hidden state, the first one (embeddings) included
    grads = torch.autograd.grad(out[row.output].sum(), out.hidden_states)
    assert all(g is not None and g.abs().sum() > 0 for g in grads)
    if "last_hidden_state" in out:
        assert out.hidden_states[-1] is out.last_hidden_state
    # the config default is honoured too
    model.config.output_hidden_states = True
    assert len(model(**batch).hidden_states) == row.num_layers + 1


@rows
def test_attentions_shapes_and_gradients(row):
    row.check("attentions")
    model, batch = row.make(), row.batch()
    model.set_attn_implementation("eager")
    out = model(**batch, output_attentions=True)
    b, t = batch[model.main_input_name].shape[:2]
    heads = model.config.num_attention_heads
    assert len(out.attentions) == row.num_layers
    keep = batch["attention_mask"].bool()
    for probs in out.attentions:
        assert probs.shape == (b, heads, t, t)
        sums = probs.sum(-1)
        torch.testing.assert_close(sums, torch.ones_like(sums), rtol=0, atol=1e-5)
        # a real token never attends to padding (a padding token's own row is free: local layers give it itself)
        to_padding = keep[:, None, :, None] & ~keep[:, None, None, :]
        assert probs.masked_select(to_padding.expand_as(probs)).abs().max() == 0
    grads = torch.autograd.grad(out[row.output].sum(), out.attentions)
    assert all(g.abs().sum() > 0 for g in grads)


@rows
def test_output_capture_selects_hidden_states(row):
    """transformers' output capture: ``output_hidden_states=[-1]`` keeps only the last hidden state."""
    row.check("capture")
    model, batch = row.make(), row.batch()
    with torch.no_grad():
        full = model(**batch, output_hidden_states=True).hidden_states
        selected = model(**batch, output_hidden_states=[-1]).hidden_states
    assert len(selected) == len(full)
    assert all(h is None for h in selected[:-1])
    assert torch.equal(selected[-1], full[-1])


@rows
def test_inputs_embeds_equal_input_ids(row):
    row.check("inputs_embeds")
    model, batch = row.make(), row.batch()
    main = model.main_input_name  # input_ids, or char_ids (ELMo-style: its embeddings are the character CNN's)
    embeds = model.get_input_embeddings()(batch[main])
    with torch.no_grad():
        by_ids = model(**batch)
        by_embeds = model(**{k: v for k, v in batch.items() if k != main}, inputs_embeds=embeds)
    _assert_equal_outputs(by_embeds, by_ids)


@rows
def test_resize_token_embeddings(row, tmp_path):
    row.check("resize")
    model, batch = row.make(), row.batch()
    old = model.get_input_embeddings().weight.shape[0]
    with torch.no_grad():
        before = model(**batch)[row.output]
    model.resize_token_embeddings(old + 5)
    assert model.get_input_embeddings().weight.shape[0] == old + 5 and model.config.vocab_size == old + 5
    output_embeddings = model.get_output_embeddings()
    if output_embeddings is not None and model.config.tie_word_embeddings:
        assert output_embeddings.weight is model.get_input_embeddings().weight
    with torch.no_grad():
        after = model(**batch)[row.output]
    if output_embeddings is None:  # old ids keep their vectors: the same outputs
        torch.testing.assert_close(after, before, rtol=0, atol=0)
    else:  # the vocabulary axis grew
        assert after.shape[-1] == old + 5
        torch.testing.assert_close(after[..., :old], before, rtol=0, atol=1e-6)
    model.save_pretrained(tmp_path / "m")
    loaded = row.model_class.from_pretrained(tmp_path / "m").eval()
    assert loaded.get_input_embeddings().weight.shape[0] == old + 5
    with torch.no_grad():
        torch.testing.assert_close(loaded(**batch)[row.output], after, rtol=0, atol=0)


@rows
def test_tied_weights_survive_save_and_load(row, tmp_path):
    row.check("tied")
    model = row.make()
    if model.get_output_embeddings() is None:
        pytest.skip(f"{row.model_class.__name__}: no output embeddings")
    from safetensors import safe_open

    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    model.save_pretrained(tmp_path / "m")
    with safe_open(str(tmp_path / "m" / "model.safetensors"), "pt") as f:
        stored = [k for k in f.keys() if f.get_slice(k).get_shape() == list(model.get_input_embeddings().weight.shape)]
    assert len(stored) == 1, stored  # the tied matrix is stored once
    loaded = row.model_class.from_pretrained(tmp_path / "m")
    assert loaded.get_output_embeddings().weight is loaded.get_input_embeddings().weight
    assert torch.equal(loaded.get_input_embeddings().weight, model.get_input_embeddings().weight)
    # untied configs stay untied
    untied = row.make(tie_word_embeddings=False)
    assert untied.get_output_embeddings().weight is not untied.get_input_embeddings().weight


@rows
def test_attn_implementation_switching(row):
    """Every kernel gives the same outputs on the real tokens, and the one set is the one that runs."""
    row.check("attn_implementation")
    model, batch = row.make(), row.batch()
    keep = batch["attention_mask"].bool()
    calls = []

    def counting(module, *args, **kwargs):
        calls.append(type(module).__name__)
        return ALL_ATTENTION_FUNCTIONS["sdpa"](module, *args, **kwargs)

    AttentionInterface.register("conformance_counting", counting)
    AttentionMaskInterface.register("conformance_counting", sdpa_mask)
    outputs = {}
    with torch.no_grad():
        for implementation in ("eager", "sdpa", "conformance_counting"):
            model.set_attn_implementation(implementation)
            assert model.config._attn_implementation == implementation
            out = model(**batch)[row.output]
            outputs[implementation] = out[keep] if out.shape[:2] == keep.shape else out
    assert len(calls) == row.num_layers  # once per layer, only with the registered kernel set
    for implementation in ("sdpa", "conformance_counting"):
        torch.testing.assert_close(outputs[implementation], outputs["eager"], rtol=0, atol=1e-5)


@rows
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_loading(row, tmp_path, dtype):
    row.check("dtype")
    model, batch = row.make(**row.dtype_overrides), row.batch()
    model.save_pretrained(tmp_path / "m")
    loaded = row.model_class.from_pretrained(tmp_path / "m", dtype=dtype).eval()
    floating = {n: t.dtype for n, t in [*loaded.named_parameters(), *loaded.named_buffers()] if t.is_floating_point()}
    assert set(floating.values()) == {dtype}, floating
    with torch.no_grad():
        expected, got = model(**batch)[row.output], loaded(**batch)[row.output]
    assert got.dtype == (torch.float32 if row.output == "loss" else dtype)  # every family computes losses in float32
    # a bf16 value keeps 8 significant bits (rounding alone moves it by up to 2**-8 of itself: -10000 -> -9984)
    torch.testing.assert_close(got.float(), expected, rtol=1e-2, atol=5e-2)


def _checkpointing_modules(model) -> list[torch.nn.Module]:
    """The modules transformers' enable / disable calls switch: those with a ``gradient_checkpointing`` flag."""
    return [m for m in model.modules() if hasattr(m, "gradient_checkpointing")]


@rows
@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_gradient_checkpointing_gives_the_same_gradients(row, reentrant):
    """transformers' ``gradient_checkpointing_enable`` / ``_disable``: switched on, the checkpoint function runs in the
    forward pass and the gradients equal those without it; switched off again, nothing goes through it and the
    gradients are bitwise the plain ones."""
    row.check("gradient_checkpointing")
    model, batch = row.make(), row.batch()
    model.train()

    def grads():
        model.zero_grad()
        out = model(**batch, **row.labels(batch))
        (out.loss if out.get("loss") is not None else out[row.output].sum()).backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    plain = grads()
    assert not model.is_activation_checkpointing
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    assert model.is_activation_checkpointing
    calls = []
    for module in _checkpointing_modules(model):
        checkpoint = module._gradient_checkpointing_func
        module._gradient_checkpointing_func = lambda *a, _c=checkpoint, **k: calls.append(1) or _c(*a, **k)
    checkpointed = grads()
    assert calls  # recomputed in the backward pass
    assert plain.keys() == checkpointed.keys() and plain
    for name in plain:
        torch.testing.assert_close(checkpointed[name], plain[name], rtol=1e-5, atol=1e-7, msg=name)
    model.gradient_checkpointing_disable()
    assert not model.is_activation_checkpointing
    calls.clear()
    again = grads()
    assert calls == [] and all(torch.equal(again[name], plain[name]) for name in plain)


@rows
def test_checkpointing_layers_follow_the_transformers_convention(row):
    """As transformers' ``test_gradient_checkpointing_enable_disable``: the repeated layers are
    ``GradientCheckpointingLayer``s, and ``activation_checkpointing_enable`` / ``_disable`` set the flag of every
    module that has one."""
    row.check("checkpointing_layers")
    model = row.make()
    assert len([m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]) == row.num_layers
    for enable, disable in (
        (model.activation_checkpointing_enable, model.activation_checkpointing_disable),
        (model.gradient_checkpointing_enable, model.gradient_checkpointing_disable),
    ):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # transformers 5.23 renamed them: the old names warn
            enable()
            assert all(m.gradient_checkpointing for m in _checkpointing_modules(model))
            disable()
            assert not any(m.gradient_checkpointing for m in _checkpointing_modules(model))


@rows
def test_torch_export(row):
    row.check("export")
    model, batch = row.make(**row.export_overrides), row.batch()
    exported = torch.export.export(model, (), dict(batch))
    other = {k: v.flip(0).contiguous() for k, v in batch.items()}  # the same shape, other padding per row
    with torch.no_grad():
        torch.testing.assert_close(
            exported.module()(**other)[row.output], model(**other)[row.output], rtol=0, atol=1e-5
        )


@rows
def test_determinism_in_eval_mode(row):
    row.check("determinism")
    dropout = {"hidden_dropout_prob": 0.3} if hasattr(row.config(), "hidden_dropout_prob") else {}
    model, batch = row.make(**dropout), row.batch()
    with torch.no_grad():
        _assert_equal_outputs(model(**batch), model(**batch))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _assert_equal_outputs(model(**batch), model(**batch))
