"""SesameBert models: sparse MLM, heads and their losses, pooling, masks, init, checkpointing, Auto classes."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
import transformers
from transformers import AutoConfig, AutoModelForMaskedLM, AutoModelForTokenClassification

import modeling
from modeling import (
    SesameBertConfig,
    SesameBertForMaskedLM,
    SesameBertForPreTraining,
    SesameBertForQuestionAnswering,
    SesameBertForSequenceClassification,
    SesameBertForTokenClassification,
    SesameBertModel,
)

NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _labels(input_ids, attention_mask, p, seed):
    g = torch.Generator().manual_seed(seed)
    chosen = (torch.rand(input_ids.shape, generator=g) < p) & attention_mask.bool()
    chosen.view(-1)[0] = True
    return torch.where(chosen, input_ids, torch.full_like(input_ids, -100))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sparse_mlm_loss_equals_dense(tiny_kwargs, make_batch, seed):
    torch.manual_seed(seed)
    config = SesameBertConfig(**tiny_kwargs, **NO_DROPOUT)
    model = SesameBertForMaskedLM(config).train()
    batch = make_batch(config.vocab_size, seed=seed)
    labels = _labels(batch["input_ids"], batch["attention_mask"], 0.15 * (seed + 1), seed)
    sparse = model(**batch, labels=labels)
    model.config.sparse_prediction = False
    dense = model(**batch, labels=labels)
    n = int((labels != -100).sum())
    assert sparse.logits.shape == (n, config.vocab_size)
    assert dense.logits.shape == (*labels.shape, config.vocab_size)
    assert abs(sparse.loss.item() - dense.loss.item()) <= 1e-6
    torch.testing.assert_close(sparse.logits, dense.logits[labels != -100], rtol=0, atol=1e-5)
    # the loss is the mean NLL over the predicted tokens, computed by hand from the dense logits
    logp = dense.logits.log_softmax(-1)[labels != -100]
    nll = -logp.gather(1, labels[labels != -100][:, None]).mean()
    assert abs(nll.item() - dense.loss.item()) <= 1e-6


def test_eval_and_fill_mask_return_full_logits(tiny_kwargs, make_batch):
    model = SesameBertForPreTraining(SesameBertConfig(**tiny_kwargs)).eval()
    batch = make_batch(model.config.vocab_size)
    labels = _labels(batch["input_ids"], batch["attention_mask"], 0.2, 0)
    shape = (*batch["input_ids"].shape, model.config.vocab_size)
    assert model(**batch).prediction_logits.shape == shape
    out = model(**batch, labels=labels, next_sentence_label=torch.tensor([0, 1, 1]))
    assert out.prediction_logits.shape == shape
    assert out.seq_relationship_logits.shape == (3, 2)
    torch.testing.assert_close(out.loss, out.mlm_loss + out.nsp_loss)
    expected_nsp = F.cross_entropy(out.seq_relationship_logits, torch.tensor([0, 1, 1]))
    torch.testing.assert_close(out.nsp_loss, expected_nsp)


def test_padding_does_not_change_real_tokens(tiny_kwargs):
    """Extra padding leaves every real token's output unchanged, for post-LN and pre-LN, learned and sinusoidal."""
    for extra in (dict(), dict(norm_position="pre", position_embedding_type="sinusoidal", norm_type="rmsnorm")):
        torch.manual_seed(0)
        model = SesameBertModel(SesameBertConfig(**tiny_kwargs, **extra, classifier_pooling="mean")).eval()
        ids = torch.randint(5, model.config.vocab_size, (1, 7))
        padded = torch.cat([ids, torch.zeros(1, 5, dtype=torch.long)], 1)
        mask = torch.cat([torch.ones(1, 7), torch.zeros(1, 5)], 1).long()
        with torch.no_grad():
            a = model(ids)
            b = model(padded, attention_mask=mask)
            c = model(padded, attention_mask=mask, output_attentions=True)
        torch.testing.assert_close(a.last_hidden_state, b.last_hidden_state[:, :7], rtol=0, atol=1e-5)
        torch.testing.assert_close(a.pooler_output, b.pooler_output, rtol=0, atol=1e-5)
        torch.testing.assert_close(b.last_hidden_state, c.last_hidden_state, rtol=0, atol=1e-5)
        assert c.attentions[0][..., 7:].abs().max() == 0  # no attention to padding


def test_sinusoidal_table_and_not_saved(tiny_kwargs, tmp_path):
    model = SesameBertModel(SesameBertConfig(**tiny_kwargs, position_embedding_type="sinusoidal")).eval()
    table = model.embeddings.position_embeddings.table
    h = model.config.hidden_size
    for i, j in [(0, 0), (3, 1), (17, 5), (63, 15)]:
        assert table[i, 2 * j].item() == pytest.approx(math.sin(i / 10000 ** (2 * j / h)), abs=1e-6)
        assert table[i, 2 * j + 1].item() == pytest.approx(math.cos(i / 10000 ** (2 * j / h)), abs=1e-6)
    assert not any("position_embeddings" in k for k in model.state_dict())
    assert not any("position_embeddings" in n for n, _ in model.named_parameters())
    model.save_pretrained(tmp_path / "m")  # the table is rebuilt on loading (from_pretrained starts on meta)
    loaded = SesameBertModel.from_pretrained(tmp_path / "m").eval()
    assert torch.equal(loaded.embeddings.position_embeddings.table, table)
    ids = torch.randint(5, model.config.vocab_size, (2, 9))
    with torch.no_grad():
        assert torch.equal(loaded(ids).last_hidden_state, model(ids).last_hidden_state)


def test_pooling_modes_by_hand(tiny_kwargs, make_batch):
    batch = make_batch(tiny_kwargs["vocab_size"])
    keep = batch["attention_mask"].bool()
    for pooling in ("cls", "mean", "max", "attention"):
        torch.manual_seed(0)
        model = SesameBertModel(SesameBertConfig(**tiny_kwargs, classifier_pooling=pooling)).eval()
        with torch.no_grad():
            out = model(**batch)
            h, pooler = out.last_hidden_state, model.pooler
            rows = []
            for b in range(h.shape[0]):
                hb = h[b, keep[b]]  # real tokens only
                if pooling == "cls":
                    rows.append(hb[0])
                elif pooling == "mean":
                    rows.append(hb.mean(0))
                elif pooling == "max":
                    rows.append(hb.max(0).values)
                else:
                    alpha = torch.softmax(hb @ pooler.attention.weight[0], 0)
                    rows.append((alpha[:, None] * hb).sum(0))
            expected = torch.tanh(pooler.dense(torch.stack(rows)))
        torch.testing.assert_close(out.pooler_output, expected, rtol=0, atol=1e-5)


#: The head parameters of each layout (state-dict keys outside the encoder's trunk) as checkpoints have had them since
#: the ModernBERT / EuroBERT heads came (issue 41): the pooler's under ``bert.pooler.``, the tagging / QA prediction
#: head's under ``head.``. The pooler / prediction-head split (issue 53) kept them: checkpoints load with none missing.
HEAD_KEYS = {
    "bert": {
        "seq": "bert.pooler.dense.weight bert.pooler.dense.bias classifier.weight classifier.bias",
        "qa": "qa_outputs.weight qa_outputs.bias",
        "tag": "classifier.weight classifier.bias",
    },
    "modernbert": {
        "seq": "bert.pooler.dense.weight bert.pooler.dense.bias bert.pooler.norm.weight bert.pooler.norm.bias "
        "classifier.weight classifier.bias",
        "qa": "head.dense.weight head.dense.bias head.norm.weight head.norm.bias qa_outputs.weight qa_outputs.bias",
        "tag": "head.dense.weight head.dense.bias head.norm.weight head.norm.bias classifier.weight classifier.bias",
    },
    "eurobert": {
        "seq": "bert.pooler.dense.weight bert.pooler.dense.bias classifier.weight classifier.bias",
        "qa": "qa_outputs.weight qa_outputs.bias",
        "tag": "classifier.weight classifier.bias",
    },
}
HEAD_CLASSES = {
    "seq": SesameBertForSequenceClassification,
    "qa": SesameBertForQuestionAnswering,
    "tag": SesameBertForTokenClassification,
}
#: Each layout with its reference pooling (BERT's [CLS], ModernBERT's mean, EuroBERT's late mean).
LAYOUT_POOLING = {"bert": "cls", "modernbert": "mean", "eurobert": "late"}


def _layout_config(tiny_kwargs, layout: str, **extra) -> SesameBertConfig:
    fixed = modeling.bert.LAYOUTS[layout].fixed
    return SesameBertConfig(**{**tiny_kwargs, **NO_DROPOUT, **fixed, "num_labels": 3, **extra})


def _transform_by_hand(x, sd: dict, prefix: str, config: SesameBertConfig):
    """``norm(act(dense(x)))`` of the layout's heads from the state dict: BERT tanh, the modern layouts GELU;
    ModernBERT's LayerNorm after it."""
    x = F.linear(x, sd[f"{prefix}dense.weight"], sd[f"{prefix}dense.bias"])
    x = torch.tanh(x) if config.head_layout == "bert" else F.gelu(x)
    if config.head_layout != "modernbert":
        return x
    return F.layer_norm(x, x.shape[-1:], sd[f"{prefix}norm.weight"], sd[f"{prefix}norm.bias"], config.layer_norm_eps)


def _head_logits_by_hand(name: str, h, keep, sd: dict, config: SesameBertConfig):
    """The logits of head ``name`` (:data:`HEAD_CLASSES`) from the hidden states ``h`` (B, T, H) and ``keep``
    (B, T, 1) bool: the pooled vector's for ``"seq"``, every token's (after ModernBERT's prediction head) else."""
    layout = config.head_layout
    if name == "seq":
        x = _transform_by_hand(h, sd, "bert.pooler.", config) if layout == "eurobert" else h  # late: then the mean
        pooled = x[:, 0] if layout == "bert" else (x * keep).sum(1) / keep.sum(1)
        pooled = pooled if layout == "eurobert" else _transform_by_hand(pooled, sd, "bert.pooler.", config)
        return F.linear(pooled, sd["classifier.weight"], sd["classifier.bias"])
    x = _transform_by_hand(h, sd, "head.", config) if layout == "modernbert" else h
    prefix = "qa_outputs" if name == "qa" else "classifier"
    return F.linear(x, sd[f"{prefix}.weight"], sd[f"{prefix}.bias"])


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
@pytest.mark.parametrize("layout", list(LAYOUT_POOLING))
def test_heads_keys_and_outputs_by_hand(tiny_kwargs, make_batch, layout, autocast):
    """The pooler, the tagging / QA prediction head and the classifiers of every layout: their state-dict keys are
    :data:`HEAD_KEYS` and their logits equal :func:`_head_logits_by_hand`'s, computed from the state dict with
    ``torch.nn.functional`` (BERT: tanh of [CLS], no prediction head; ModernBERT: GELU then LayerNorm of the mean, a
    prediction head; EuroBERT: the mean of GELU of every token, no prediction head), also under bf16 autocast."""
    batch = make_batch(tiny_kwargs["vocab_size"])
    batch.pop("token_type_ids", None)  # the modern layouts have no segment embeddings
    keep = batch["attention_mask"].bool()[..., None]
    config = _layout_config(tiny_kwargs, layout, classifier_pooling=LAYOUT_POOLING[layout])
    for name, cls in HEAD_CLASSES.items():
        torch.manual_seed(0)
        model = cls(config).eval()
        sd = model.state_dict()
        assert {k for k in sd if not k.startswith("bert.") or ".pooler." in k} == set(HEAD_KEYS[layout][name].split())
        with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=autocast):
            out = model(**batch)
            expected = _head_logits_by_hand(name, model.bert(**batch).last_hidden_state, keep, sd, config)
        got = torch.stack([out.start_logits, out.end_logits], -1) if name == "qa" else out.logits
        tolerance = dict(rtol=2e-2, atol=2e-2) if autocast else dict(rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got.float(), expected.float(), **tolerance)


def test_tagging_and_qa_checkpoints_with_the_old_prediction_head_attention_load(tiny_kwargs, tmp_path):
    """Before the split (issue 53) the tagging / QA prediction head was a pooler: with ``classifier_pooling=
    "attention"`` it carried an unused ``head.attention.weight``. Such a checkpoint loads with no key missing or
    unexpected and the same outputs."""
    from safetensors.torch import save_file

    config = _layout_config(tiny_kwargs, "modernbert", classifier_pooling="attention")
    ids = torch.randint(5, tiny_kwargs["vocab_size"], (2, 7), generator=torch.Generator().manual_seed(0))
    for cls in (SesameBertForQuestionAnswering, SesameBertForTokenClassification):
        torch.manual_seed(0)
        model = cls(config).eval()
        assert "head.attention.weight" not in model.state_dict()
        model.save_pretrained(tmp_path / cls.__name__)
        old = {**model.state_dict(), "head.attention.weight": torch.randn(1, config.hidden_size)}
        save_file(old, tmp_path / cls.__name__ / "model.safetensors", metadata={"format": "pt"})
        loaded, info = cls.from_pretrained(tmp_path / cls.__name__, output_loading_info=True)
        assert not info["missing_keys"] and not info["unexpected_keys"], info
        with torch.no_grad():
            torch.testing.assert_close(loaded.eval()(ids)[0], model(ids)[0], rtol=0, atol=0)


def test_sequence_classification_problem_types(tiny_kwargs, make_batch):
    batch = make_batch(tiny_kwargs["vocab_size"])
    torch.manual_seed(0)
    reg = SesameBertForSequenceClassification(SesameBertConfig(**tiny_kwargs, num_labels=1)).eval()
    target = torch.tensor([0.5, 2.0, -1.0])
    out = reg(**batch, labels=target)
    assert reg.config.problem_type == "regression" and out.logits.shape == (3, 1)
    torch.testing.assert_close(out.loss, ((out.logits[:, 0] - target) ** 2).mean())

    single = SesameBertForSequenceClassification(SesameBertConfig(**tiny_kwargs, num_labels=3)).eval()
    y = torch.tensor([2, 0, 1])
    out = single(**batch, labels=y)
    assert single.config.problem_type == "single_label_classification"
    torch.testing.assert_close(out.loss, -out.logits.log_softmax(-1)[torch.arange(3), y].mean())

    multi = SesameBertForSequenceClassification(SesameBertConfig(**tiny_kwargs, num_labels=3)).eval()
    y = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    out = multi(**batch, labels=y)
    assert multi.config.problem_type == "multi_label_classification"
    p = torch.sigmoid(out.logits)
    torch.testing.assert_close(out.loss, -(y * p.log() + (1 - y) * (1 - p).log()).mean())
    # the logits come from the pooler: classifier(pooler_output) in eval mode
    with torch.no_grad():
        pooled = multi.bert(**batch).pooler_output
    torch.testing.assert_close(out.logits, multi.classifier(pooled))
    assert isinstance(multi(**batch, return_dict=False), tuple)


def test_question_answering_and_token_classification_losses(tiny_kwargs, make_batch):
    batch = make_batch(tiny_kwargs["vocab_size"])
    torch.manual_seed(0)
    qa = SesameBertForQuestionAnswering(SesameBertConfig(**tiny_kwargs)).eval()
    start, end = torch.tensor([1, 3, 50]), torch.tensor([2, 5, 60])  # row 2: outside the sequence -> ignored
    out = qa(**batch, start_positions=start, end_positions=end)
    assert out.start_logits.shape == out.end_logits.shape == (3, 12)
    ls = -out.start_logits.log_softmax(-1)[[0, 1], start[:2]].mean()
    le = -out.end_logits.log_softmax(-1)[[0, 1], end[:2]].mean()
    torch.testing.assert_close(out.loss, (ls + le) / 2)

    tag = SesameBertForTokenClassification(SesameBertConfig(**tiny_kwargs, num_labels=5)).eval()
    labels = torch.randint(0, 5, (3, 12)).masked_fill(batch["attention_mask"] == 0, -100)
    out = tag(**batch, labels=labels)
    assert out.logits.shape == (3, 12, 5)
    keep = labels != -100
    torch.testing.assert_close(out.loss, -out.logits.log_softmax(-1)[keep].gather(1, labels[keep][:, None]).mean())


def test_dropout_only_in_training(tiny_kwargs, make_batch):
    model = SesameBertModel(SesameBertConfig(**tiny_kwargs, hidden_dropout_prob=0.3, attention_probs_dropout_prob=0.3))
    batch = make_batch(model.config.vocab_size)
    model.eval()
    torch.testing.assert_close(model(**batch).last_hidden_state, model(**batch).last_hidden_state, rtol=0, atol=0)
    model.train()
    assert (model(**batch).last_hidden_state - model(**batch).last_hidden_state).abs().max() > 1e-3


def test_bert_initialisation(tiny_kwargs):
    torch.manual_seed(0)
    config = SesameBertConfig(**dict(tiny_kwargs, hidden_size=64, intermediate_size=256), initializer_range=0.05)
    model = SesameBertForPreTraining(config)
    for name, p in model.named_parameters():
        if "norm" in name:
            assert torch.all(p == (1.0 if name.endswith("weight") else 0.0)), name
        elif name.endswith("bias"):
            assert torch.all(p == 0), name
        else:
            rows = p[1:] if name.endswith("word_embeddings.weight") else p  # the [PAD] row is zero
            assert abs(rows.std().item() - 0.05) < 0.01 and abs(rows.mean().item()) < 0.01, name
    assert torch.all(model.bert.embeddings.word_embeddings.weight[config.pad_token_id] == 0)


@pytest.mark.filterwarnings("ignore:`gradient_checkpointing_enable` is deprecated:FutureWarning")
@pytest.mark.parametrize("method", ["gradient_checkpointing_enable", "activation_checkpointing_enable"])
def test_gradient_checkpointing_gives_the_same_gradients(tiny_kwargs, make_batch, method):
    torch.manual_seed(0)
    model = SesameBertForMaskedLM(SesameBertConfig(**tiny_kwargs, **NO_DROPOUT)).train()
    batch = make_batch(model.config.vocab_size)
    labels = _labels(batch["input_ids"], batch["attention_mask"], 0.3, 0)

    def grads():
        model.zero_grad()
        model(**batch, labels=labels).loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    plain = grads()
    getattr(model, method)()  # transformers 5.23 renamed it; the old name is a deprecated alias
    assert all(layer.gradient_checkpointing for layer in model.bert.encoder.layer)
    calls, layer = [], model.bert.encoder.layer[0]
    checkpoint = layer._gradient_checkpointing_func
    layer._gradient_checkpointing_func = lambda *a, **k: calls.append(1) or checkpoint(*a, **k)
    model.eval()(**batch)
    assert calls == []  # not in eval mode
    model.train()
    checkpointed = grads()
    assert calls == [1]  # the layer went through torch.utils.checkpoint
    for name in plain:
        torch.testing.assert_close(plain[name], checkpointed[name], rtol=1e-5, atol=1e-7)


def test_tied_decoder_and_resize_token_embeddings(tiny_kwargs, make_batch, tmp_path):
    model = SesameBertForMaskedLM(SesameBertConfig(**tiny_kwargs))
    assert model.cls.decoder.weight is model.bert.embeddings.word_embeddings.weight
    old = model.config.vocab_size
    model.resize_token_embeddings(old + 7)
    assert model.config.vocab_size == old + 7
    assert model.cls.decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert model.cls.decoder.weight.shape == (old + 7, model.config.hidden_size)
    assert model.cls.decoder.bias.shape == (old + 7,)
    out = model.eval()(**make_batch(old))
    assert out.logits.shape[-1] == old + 7
    model.save_pretrained(tmp_path / "m")
    loaded = SesameBertForMaskedLM.from_pretrained(tmp_path / "m")
    assert loaded.cls.decoder.weight is loaded.bert.embeddings.word_embeddings.weight
    torch.testing.assert_close(loaded.state_dict()["cls.decoder.bias"], model.state_dict()["cls.decoder.bias"])


def test_auto_classes_in_process(tiny_kwargs, tmp_path):
    config = AutoConfig.for_model("sesame-bert", **tiny_kwargs)
    assert isinstance(config, SesameBertConfig)
    # AutoModel -> SesameBertModel, AutoModelFor<head> -> SesameBertFor<head>
    for head in ["", "ForMaskedLM", "ForPreTraining", "ForSequenceClassification", "ForQuestionAnswering"]:
        auto, cls = getattr(transformers, f"AutoModel{head}"), getattr(modeling, f"SesameBert{head or 'Model'}")
        assert type(auto.from_config(config)) is cls, head
    assert type(AutoModelForTokenClassification.from_config(config)) is SesameBertForTokenClassification
    SesameBertForPreTraining(config).save_pretrained(tmp_path / "pt")
    assert type(AutoModelForMaskedLM.from_pretrained(tmp_path / "pt")) is SesameBertForMaskedLM
    assert set(modeling.bert.__all__) <= set(modeling.__all__)


def test_presets_and_config_validation():
    sizes = {
        name: (kw["num_hidden_layers"], kw["hidden_size"], kw["num_attention_heads"], kw["intermediate_size"])
        for name, (cls, kw) in modeling.bert.PRESETS.items()
    }
    assert sizes == {
        "bert-tiny": (2, 128, 2, 512),
        "bert-mini": (4, 256, 4, 1024),
        "bert-small": (4, 512, 8, 2048),
        "bert-base": (12, 768, 12, 3072),
    }
    assert modeling.get_preset_config("bert-mini", vocab_size=8000).vocab_size == 8000
    for bad, field in [
        (dict(hidden_size=130, num_attention_heads=4), "hidden_size"),
        (dict(norm_position="middle"), "norm_position"),
        (dict(classifier_pooling="first"), "classifier_pooling"),
        (dict(position_embedding_type="rotary"), "position_embedding_type"),
        (dict(hidden_act="gelu_fast_unknown"), "hidden_act"),
    ]:
        with pytest.raises(Exception, match=field):
            SesameBertConfig(**bad)
