"""Save -> load round trips: in-process Auto classes, and remote code in a process without sesame-lm."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
from _launch import run_remote_code_script

from modeling.elmo import SesameElmoForBidirectionalLM, SesameElmoForSequenceClassification

TEXTS = (["The whale rose from the sea.", "It rained."], ["A dog near the river bank.", "The city was wet."])


def _save(tmp_path, tiny, tokenizer):
    torch.manual_seed(3)
    model = SesameElmoForBidirectionalLM(tiny(vocab_size=len(tokenizer), softmax="adaptive", adaptive_cutoffs=[10, 30]))
    out_dir = tmp_path / "bilm"
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return model.eval(), out_dir


def test_in_process_round_trip(tmp_path, tiny, elmo_tokenizer):
    from transformers import AutoModel, AutoModelForPreTraining, AutoTokenizer

    model, out_dir = _save(tmp_path, tiny, elmo_tokenizer)
    tok = AutoTokenizer.from_pretrained(out_dir)
    loaded = AutoModelForPreTraining.from_pretrained(out_dir).eval()
    assert type(loaded) is SesameElmoForBidirectionalLM
    batch = tok(*TEXTS, padding=True, return_tensors="pt")
    ref, got = model(**batch), loaded(**batch)
    assert torch.equal(ref.loss, got.loss) and torch.equal(ref.forward_num_tokens, got.forward_num_tokens)
    encoder = AutoModel.from_pretrained(out_dir).eval()
    for a, b in zip(
        model.elmo(batch["char_ids"], batch["attention_mask"]).hidden_states, encoder(**batch).hidden_states
    ):
        assert torch.equal(a, b)
    # the model code travels with the folder: the model file, what it imports relatively, and the tokenizer's code
    code = {"configuration_elmo.py", "modeling_elmo.py", "lstm_elmo.py", "tokenization_elmo.py"}
    assert code <= {p.name for p in out_dir.iterdir()}
    auto_map = json.loads((out_dir / "config.json").read_text())["auto_map"]
    assert auto_map["AutoModelForSequenceClassification"] == "modeling_elmo.SesameElmoForSequenceClassification"


_REMOTE = textwrap.dedent(
    """
    import importlib.abc, json, sys
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("modeling", "tokenizer", "training"):
                raise ImportError("blocked: " + name)
    sys.meta_path.insert(0, Block())
    import torch
    from transformers import AutoModelForPreTraining, AutoModelForSequenceClassification, AutoTokenizer
    d, texts = sys.argv[1], json.loads(sys.argv[2])
    tok = AutoTokenizer.from_pretrained(d, trust_remote_code=True)
    lm = AutoModelForPreTraining.from_pretrained(d, trust_remote_code=True).eval()
    cls = AutoModelForSequenceClassification.from_pretrained(d, trust_remote_code=True, num_labels=3)
    assert "modeling" not in sys.modules and "tokenizer" not in sys.modules
    batch = tok(*texts, padding=True, return_tensors="pt")
    out = lm(**batch)
    print(json.dumps({"loss": out.loss.item(), "fwd": out.forward_loss.item(), "ids": batch["input_ids"].tolist(),
                      "chars": batch["char_ids"].sum().item(), "module": type(lm).__module__,
                      "tok_module": type(tok).__module__, "cls": type(cls).__name__,
                      "cls_logits": list(cls.eval()(**batch).logits.shape)}))
    """
)


def test_remote_code_round_trip_without_the_package(tmp_path, tiny, elmo_tokenizer):
    model, out_dir = _save(tmp_path, tiny, elmo_tokenizer)
    batch = elmo_tokenizer(*TEXTS, padding=True, return_tensors="pt")
    ref = model(**batch)
    got = run_remote_code_script(_REMOTE, tmp_path, str(out_dir), json.dumps(TEXTS))
    assert got["module"].startswith("transformers_modules") and got["tok_module"].startswith("transformers_modules")
    assert got["ids"] == batch["input_ids"].tolist() and got["chars"] == batch["char_ids"].sum().item()
    assert abs(got["loss"] - ref.loss.item()) < 1e-5 and abs(got["fwd"] - ref.forward_loss.item()) < 1e-5
    assert got["cls"] == SesameElmoForSequenceClassification.__name__ and got["cls_logits"] == [2, 3]


def test_other_num_labels_reinitialises_both_classifiers(tmp_path, tiny):
    """transformers' ignore_mismatched_sizes on the sentence head, which has two num_labels classifiers (pairs and
    single sentences): refused without it; with it both are re-initialised at the new size and every other parameter
    is the saved one (the part of transformers' test_can_load_ignoring_mismatched_shapes that applies, see
    tests/conformance/test_transformers_common.py)."""
    torch.manual_seed(0)
    model = SesameElmoForSequenceClassification(tiny(num_labels=3, freeze_backbone=False))
    model.save_pretrained(tmp_path / "m")
    with pytest.raises(RuntimeError):
        SesameElmoForSequenceClassification.from_pretrained(tmp_path / "m", num_labels=5)
    loaded = SesameElmoForSequenceClassification.from_pretrained(
        tmp_path / "m", num_labels=5, ignore_mismatched_sizes=True
    )
    saved = dict(model.named_parameters())
    last = {f"{head}.{len(getattr(model, head)) - 1}" for head in ("classifier", "pair_classifier")}
    for name, param in loaded.named_parameters():
        if name.rsplit(".", 1)[0] in last:
            assert param.shape[0] == 5 and saved[name].shape[0] == 3, name
        else:
            assert torch.equal(param, saved[name]), name
    chars = torch.randint(1, 262, (2, 4, 50))
    assert loaded(char_ids=chars).logits.shape == (2, 5)
