"""Hugging Face BERT -> SesameBert: numerical parity with transformers' own BERT, training-step parity, the CLI."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from transformers import BertForPreTraining, BertModel

from core.errors import run_cli
from modeling import SesameBertForPreTraining, SesameBertModel
from modeling.bert.convert import convert, main
from modeling.bert.sources import bert


def _max_diff(a, b):
    return (a - b).abs().max().item()


def test_random_bert_for_pretraining_parity(hf_bert_dir, tmp_path, make_batch):
    """Converted random BertForPreTraining: hidden states <= 1e-5, MLM / NSP logits <= 1e-4 (fp32, eval, padding)."""
    report = convert(hf_bert_dir, tmp_path / "out")
    assert report["architecture"] == "BertForPreTraining" and report["initialized"] == []
    hf = BertForPreTraining.from_pretrained(hf_bert_dir, attn_implementation="eager").eval()
    ours = SesameBertForPreTraining.from_pretrained(tmp_path / "out").eval()
    batch = make_batch(hf.config.vocab_size)
    with torch.no_grad():
        ref = hf(**batch, output_hidden_states=True, output_attentions=True)
        new = ours(**batch, output_hidden_states=True, output_attentions=True)
        fast = ours(**batch)  # the scaled_dot_product_attention path
    real = batch["attention_mask"].bool()
    for r, n in zip(ref.hidden_states, new.hidden_states):
        assert _max_diff(r[real], n[real]) <= 1e-5
    assert _max_diff(ref.prediction_logits[real], fast.prediction_logits[real]) <= 1e-4
    assert _max_diff(ref.seq_relationship_logits, fast.seq_relationship_logits) <= 1e-4
    for r, n in zip(ref.attentions, new.attentions):
        assert _max_diff(r, n) <= 1e-6
    print(
        "random BertForPreTraining parity, max abs diff:",
        {
            "last_hidden_state": _max_diff(ref.hidden_states[-1][real], new.hidden_states[-1][real]),
            "prediction_logits": _max_diff(ref.prediction_logits[real], fast.prediction_logits[real]),
            "seq_relationship_logits": _max_diff(ref.seq_relationship_logits, fast.seq_relationship_logits),
        },
    )
    assert _max_diff(new.prediction_logits, fast.prediction_logits) <= 1e-5


def test_training_step_parity(hf_bert_dir, tmp_path, make_batch):
    """One training step (MLM + NSP, sparse prediction on our side): loss and every gradient within 1e-5 relative."""
    convert(hf_bert_dir, tmp_path / "out")
    no_dropout = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    hf = BertForPreTraining.from_pretrained(hf_bert_dir, **no_dropout).train()
    ours = SesameBertForPreTraining.from_pretrained(tmp_path / "out", **no_dropout).train()
    assert ours.config.sparse_prediction
    batch = make_batch(hf.config.vocab_size, seed=1)
    g = torch.Generator().manual_seed(2)
    chosen = (torch.rand(batch["input_ids"].shape, generator=g) < 0.3) & batch["attention_mask"].bool()
    chosen[0, 1] = True
    labels = torch.where(chosen, batch["input_ids"], torch.full_like(batch["input_ids"], -100))
    inputs = dict(batch, input_ids=batch["input_ids"].masked_fill(chosen, 4))  # [MASK]
    nsp = torch.tensor([0, 1, 0])

    ref = hf(**inputs, labels=labels, next_sentence_label=nsp)
    new = ours(**inputs, labels=labels, next_sentence_label=nsp)
    assert new.prediction_logits.shape == (int(chosen.sum()), hf.config.vocab_size)  # sparse logits
    assert abs(new.loss.item() - ref.loss.item()) / ref.loss.item() <= 1e-5
    ref.loss.backward()
    new.loss.backward()

    params = dict(hf.named_parameters(remove_duplicate=False))  # tied names included, as in the state dict
    hf_grads = {k: params[k].grad for k in hf.state_dict() if k in params}
    expected = bert.SOURCE.sesame_state(hf_grads, "BertForPreTraining")
    got = dict(ours.named_parameters())
    assert set(got) <= set(expected)
    worst = 0.0
    for name, param in got.items():
        scale = expected[name].abs().max().item()
        assert scale > 0, name
        worst = max(worst, _max_diff(param.grad, expected[name]) / scale)
        assert _max_diff(param.grad, expected[name]) / scale <= 1e-5, name
    print(
        f"training step: loss {new.loss.item():.6f} vs {ref.loss.item():.6f} "
        f"(rel {abs(new.loss.item() - ref.loss.item()) / ref.loss.item():.2e}); max relative grad diff {worst:.2e}"
    )


def _sentences_for_minilm(sentences):
    """The test's own sentences, or the first 64 of a GLUE TSV named by SESAME_PARITY_TSV (manual check)."""
    path = os.environ.get("SESAME_PARITY_TSV")
    if not path:
        return sentences
    lines = Path(path).read_text(encoding="utf-8").splitlines()[1:65]
    return [line.split("\t")[0] for line in lines]


def test_minilm_real_weights_parity(minilm_dir, tmp_path, sentences):
    """Real MiniLM-L6-H384 weights (BertModel, no MLM/NSP heads): converted model matches transformers."""
    torch.manual_seed(0)
    hf_heads = BertForPreTraining.from_pretrained(minilm_dir).eval()  # heads initialised as convert does (seed 0)
    report = convert(minilm_dir, tmp_path / "minilm", seed=0)
    assert report["architecture"] == "BertModel"
    assert report["initialized"] == ["MLM head", "NSP head"]
    assert json.loads((tmp_path / "minilm" / "config.json").read_text())["auto_map"]["AutoModel"]

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tmp_path / "minilm")
    batch = tok(_sentences_for_minilm(sentences), padding=True, truncation=True, max_length=128, return_tensors="pt")
    hf = BertModel.from_pretrained(minilm_dir).eval()
    base = SesameBertModel.from_pretrained(tmp_path / "minilm").eval()
    ours = SesameBertForPreTraining.from_pretrained(tmp_path / "minilm").eval()
    with torch.no_grad():
        ref, new = hf(**batch), base(**batch)
        ref_heads, new_heads = hf_heads(**batch), ours(**batch)
    real = batch["attention_mask"].bool()
    assert batch["attention_mask"].sum(1).min() < batch["attention_mask"].shape[1]  # there is padding
    diffs = {
        "last_hidden_state": _max_diff(ref.last_hidden_state[real], new.last_hidden_state[real]),
        "pooler_output": _max_diff(ref.pooler_output, new.pooler_output),
        "prediction_logits": _max_diff(ref_heads.prediction_logits[real], new_heads.prediction_logits[real]),
        "seq_relationship_logits": _max_diff(ref_heads.seq_relationship_logits, new_heads.seq_relationship_logits),
    }
    print(f"MiniLM parity on {len(batch['input_ids'])} sentences, max abs diff: {diffs}")  # shown with pytest -s
    assert diffs["last_hidden_state"] <= 1e-5 and diffs["pooler_output"] <= 1e-5
    assert diffs["prediction_logits"] <= 1e-4 and diffs["seq_relationship_logits"] <= 1e-4


def test_bert_for_masked_lm_source_reports_nsp_head(tmp_path, tokenizer):
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=len(tokenizer)
    )
    BertForMaskedLM(config).save_pretrained(tmp_path / "mlm")
    tokenizer.save_pretrained(tmp_path / "mlm")
    report = convert(tmp_path / "mlm", tmp_path / "out")
    assert report["architecture"] == "BertForMaskedLM"
    assert report["initialized"] == ["NSP head", "pooler"]
    assert max(report["max_abs_diff"].values()) <= 1e-5


def test_cli_writes_directory_and_refuses_bad_sources(hf_bert_dir, tmp_path, capsys):
    out = tmp_path / "cli-out"
    assert run_cli(main, ["--source", str(hf_bert_dir), "--output_dir", str(out)]) == 0
    assert {
        "config.json",
        "model.safetensors",
        "modeling_sesame_bert.py",
        "configuration_sesame_bert.py",
        "tokenizer_config.json",
    } <= {p.name for p in out.iterdir()}
    assert json.loads(capsys.readouterr().out)["output_dir"] == str(out)
    # a non-empty output directory is refused unless --overwrite_output_dir
    assert run_cli(main, ["--source", str(hf_bert_dir), "--output_dir", str(out)]) == 2
    assert "--overwrite_output_dir" in capsys.readouterr().err
    assert run_cli(main, ["--source", str(hf_bert_dir), "--output_dir", str(out), "--overwrite_output_dir"]) == 0

    not_bert = tmp_path / "not-bert"
    SesameBertModel(
        SesameBertForPreTraining.config_class(
            hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8, vocab_size=20
        )
    ).save_pretrained(not_bert)
    no_weights = tmp_path / "no-weights"
    no_weights.mkdir()
    (no_weights / "config.json").write_text((hf_bert_dir / "config.json").read_text())
    cases = {
        str(tmp_path / "missing"): "no such directory",
        str(tmp_path): "no config.json",
        str(not_bert): "model_type='sesame-bert'",
        str(no_weights): "no readable weights",
    }
    for source, message in cases.items():
        target = tmp_path / "never"
        assert run_cli(main, ["--source", source, "--output_dir", str(target)]) == 2, source
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err.startswith("error: --source") and message in err, err
        assert not target.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary directories left


def test_a_tokenizer_auto_map_without_its_code_is_dropped(hf_bert_dir, tmp_path):
    """Issue 32: a source whose tokenizer_config.json names remote code (auto_map) is converted with the standard
    tokenizer class; the output must not keep an auto_map pointing at code it does not ship."""
    config_path = hf_bert_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["auto_map"] = {"AutoTokenizer": ["tokenization_custom.CustomTokenizer", None]}
    config_path.write_text(json.dumps(config))
    convert(hf_bert_dir, tmp_path / "out")
    written = json.loads((tmp_path / "out" / "tokenizer_config.json").read_text())
    assert "auto_map" not in written and not (tmp_path / "out" / "tokenization_custom.py").exists()
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(tmp_path / "out")("a b")["input_ids"]
