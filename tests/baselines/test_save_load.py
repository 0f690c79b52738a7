"""Save -> load round trips: in-process Auto classes, and remote code in a process without sesame-lm."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
from _launch import run_remote_code_script

from modeling.baselines import SesameBaselineForSequenceClassification, SesameBaselineModel

TEXTS = (["The whale rose from the sea.", "It rained."], ["A dog near the river bank.", "The city was wet."])


def _save(tmp_path, tiny, tokenizer, encoder_type):
    torch.manual_seed(3)
    model = SesameBaselineForSequenceClassification(tiny(encoder_type, vocab_size=len(tokenizer), num_labels=3))
    out_dir = tmp_path / encoder_type
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return model.eval(), out_dir


@pytest.mark.parametrize("encoder_type", ["cbow", "fasttext", "cnn", "rnn", "treelstm"])
def test_in_process_round_trip(tmp_path, tiny, word_tokenizer, encoder_type):
    from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification, AutoTokenizer

    model, out_dir = _save(tmp_path, tiny, word_tokenizer, encoder_type)
    assert AutoConfig.from_pretrained(out_dir).model_type == "sesame-baseline"
    tok = AutoTokenizer.from_pretrained(out_dir)
    loaded = AutoModelForSequenceClassification.from_pretrained(out_dir).eval()
    assert type(loaded) is SesameBaselineForSequenceClassification
    for texts in (TEXTS[:1], TEXTS):
        batch = tok(*texts, padding=True, return_tensors="pt")
        assert torch.equal(model(**batch).logits, loaded(**batch).logits)
    encoder = AutoModel.from_pretrained(out_dir).eval()
    assert type(encoder) is SesameBaselineModel
    batch = tok(TEXTS[0], padding=True, return_tensors="pt")
    assert torch.equal(model.baseline(**batch).pooler_output, encoder(**batch).pooler_output)
    auto_map = json.loads((out_dir / "config.json").read_text())["auto_map"]
    assert auto_map["AutoModelForSequenceClassification"] == "modeling_baseline.SesameBaselineForSequenceClassification"


def test_encoder_folder_loads_into_a_head_with_a_new_classifier(tmp_path, tiny, word_tokenizer):
    """What finetune.baselines writes: a SesameBaselineModel folder; the head keeps its weights, adds a classifier."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    for mode, frozen in (("static", "word_embeddings"), ("multichannel", "static_embeddings")):
        enc = SesameBaselineModel(tiny("cnn", vocab_size=len(word_tokenizer), embedding_mode=mode))
        enc.save_pretrained(tmp_path / mode)
        config = AutoConfig.from_pretrained(tmp_path / mode, num_labels=1, problem_type="regression")
        head = AutoModelForSequenceClassification.from_pretrained(tmp_path / mode, config=config)
        assert torch.equal(head.baseline.embeddings.word_embeddings.weight, enc.embeddings.word_embeddings.weight)
        assert head.classifier[-1].out_features == 1
        batch = word_tokenizer(["The whale rose.", "It rained on the sea."], padding=True, return_tensors="pt")
        head(**batch, labels=torch.tensor([0.5, 1.0])).loss.backward()
        assert getattr(head.baseline.embeddings, frozen).weight.grad is None  # stays fixed after loading
        assert head.baseline.encoder.convs[0].weight.grad is not None


_REMOTE = textwrap.dedent(
    """
    import importlib.abc, json, sys
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("modeling", "tokenizer", "training", "finetune", "pretrain"):
                raise ImportError("blocked: " + name)
    sys.meta_path.insert(0, Block())
    import torch
    from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer
    d, texts = sys.argv[1], json.loads(sys.argv[2])
    tok = AutoTokenizer.from_pretrained(d, trust_remote_code=True)
    clf = AutoModelForSequenceClassification.from_pretrained(d, trust_remote_code=True).eval()
    enc = AutoModel.from_pretrained(d, trust_remote_code=True).eval()
    assert "modeling" not in sys.modules and "tokenizer" not in sys.modules
    batch = tok(*texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = clf(**batch).logits
        single = enc(**tok(texts[0], padding=True, return_tensors="pt")).pooler_output
    print(json.dumps({"logits": logits.tolist(), "single": single.tolist(), "module": type(clf).__module__,
                      "tok_module": type(tok).__module__, "enc": type(enc).__name__}))
    """
)


def test_remote_code_round_trip_without_the_package(tmp_path, tiny, word_tokenizer):
    model, out_dir = _save(tmp_path, tiny, word_tokenizer, "fasttext")
    batch = word_tokenizer(*TEXTS, padding=True, return_tensors="pt")
    single = word_tokenizer(TEXTS[0], padding=True, return_tensors="pt")
    with torch.no_grad():
        ref, ref_single = model(**batch).logits, model.baseline(**single).pooler_output
    got = run_remote_code_script(_REMOTE, tmp_path, str(out_dir), json.dumps(TEXTS))
    assert got["module"].startswith("transformers_modules") and got["tok_module"].startswith("transformers_modules")
    assert got["enc"] == "SesameBaselineModel"
    torch.testing.assert_close(torch.tensor(got["logits"]), ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.tensor(got["single"]), ref_single, rtol=1e-5, atol=1e-6)
