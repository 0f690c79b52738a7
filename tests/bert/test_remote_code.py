"""save_pretrained -> load in a fresh process that cannot import this project, with trust_remote_code=True."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import torch
from _launch import run_ok
from _tiny import modern_layout

from modeling import SesameBertConfig, SesameBertForPreTraining

REPO = str(Path(__file__).resolve().parents[2])

# Runs in the child: block the project's packages (the editable install exposes them through a meta-path finder
# in site-packages, so removing sys.path entries is not enough), then load through auto_map + remote code.
CHILD = textwrap.dedent(
    """
    import importlib.abc, sys
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {"modeling", "training", "tokenizer", "pretrain", "finetune"}:
                raise ModuleNotFoundError(f"blocked for this test: {name}")
    sys.meta_path.insert(0, Block())
    sys.path = [p for p in sys.path if p not in ("", ".", REPO)]
    try:
        import modeling
        raise SystemExit("modeling is importable")
    except ModuleNotFoundError:
        pass

    import torch
    from transformers import AutoModel, AutoModelForMaskedLM, AutoModelForSequenceClassification, AutoTokenizer
    model_dir, out_file = sys.argv[1], sys.argv[2]
    batch = torch.load(model_dir + "/../batch.pt")
    mlm = AutoModelForMaskedLM.from_pretrained(model_dir, trust_remote_code=True).eval()
    base = AutoModel.from_pretrained(model_dir, trust_remote_code=True).eval()
    clf = AutoModelForSequenceClassification.from_pretrained(model_dir, trust_remote_code=True, num_labels=3)
    tok = AutoTokenizer.from_pretrained(model_dir)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    with torch.no_grad():
        logits = mlm(**batch).logits
        hidden = base(**batch).last_hidden_state
        fused_loss = mlm(**batch, labels=labels, skip_logits=True).loss  # loss_sesame_bert.py travelled too
    torch.save({
        "logits": logits,
        "fused_loss": fused_loss,
        "hidden": hidden,
        "tied": mlm.cls.decoder.weight is mlm.bert.embeddings.word_embeddings.weight,
        "classes": [type(m).__module__ + "." + type(m).__name__ for m in (mlm, base, clf)],
        "tokens": tok("the cat sat")["input_ids"],
        "project_loaded": sorted(m for m in sys.modules if m.split(".")[0] in {"modeling", "training"}),
    }, out_file)
    """
).replace("REPO", repr(REPO))


def _load_in_child(model, tokenizer, make_batch, tmp_path):
    """Save ``model`` and ``tokenizer`` into ``tmp_path/model``, run :data:`CHILD` on them and a batch from
    ``make_batch``; returns what the child saved and the batch."""
    model_dir = tmp_path / "model"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    batch = make_batch(model.config.vocab_size)
    torch.save(batch, tmp_path / "batch.pt")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    env.update(HF_MODULES_CACHE=str(tmp_path / "hf_modules"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    child = tmp_path / "child.py"
    child.write_text(CHILD)
    run_ok([sys.executable, str(child), str(model_dir), str(tmp_path / "out.pt")], tmp_path, env, timeout=120)
    return torch.load(tmp_path / "out.pt"), batch


def test_remote_code_round_trip(tiny_kwargs, tokenizer, make_batch, tmp_path):
    torch.manual_seed(0)
    model = SesameBertForPreTraining(
        SesameBertConfig(**tiny_kwargs, norm_position="pre", classifier_pooling="attention")
    ).eval()
    got, batch = _load_in_child(model, tokenizer, make_batch, tmp_path)
    files = {p.name for p in (tmp_path / "model").iterdir()}
    code = {"modeling_sesame_bert.py", "configuration_sesame_bert.py", "loss_sesame_bert.py"}
    assert code | {"model.safetensors"} <= files
    auto_map = json.loads((tmp_path / "model" / "config.json").read_text())["auto_map"]
    assert auto_map["AutoModelForMaskedLM"] == "modeling_sesame_bert.SesameBertForMaskedLM"
    assert auto_map["AutoConfig"] == "configuration_sesame_bert.SesameBertConfig"

    assert got["project_loaded"] == []
    assert all(c.startswith("transformers_modules.") for c in got["classes"]), got["classes"]
    assert got["tied"] is True
    with torch.no_grad():
        expected = model(**batch)
        hidden = model.bert(**batch).last_hidden_state
    assert torch.equal(got["logits"], expected.prediction_logits)
    assert torch.equal(got["hidden"], hidden)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    with torch.no_grad():
        assert torch.equal(got["fused_loss"], model(**batch, labels=labels, skip_logits=True).mlm_loss)
    assert got["tokens"] == tokenizer("the cat sat")["input_ids"]


def test_remote_code_round_trip_of_a_modern_config(tiny_kwargs, tokenizer, make_batch, tmp_path):
    """A ModernBERT-class SesameBert (rope, GeGLU, local layers, GQA, modernbert heads) loads without the package:
    the attention module (``attention_sesame_bert.py``) travels with the model code."""
    torch.manual_seed(0)
    layout = modern_layout(global_attn_every_n_layers=2, local_attention=4)  # the presets' layout, a tiny window
    modern = dict(tiny_kwargs, num_attention_heads=4, num_key_value_heads=2, **layout)
    model = SesameBertForPreTraining(SesameBertConfig(**modern)).eval()
    got, batch = _load_in_child(model, tokenizer, make_batch, tmp_path)
    assert (tmp_path / "model" / "attention_sesame_bert.py").is_file()
    assert got["project_loaded"] == [] and got["tied"] is True
    with torch.no_grad():
        assert torch.equal(got["logits"], model(**batch).prediction_logits)
        assert torch.equal(got["hidden"], model.bert(**batch).last_hidden_state)
