"""``pretrain --config_name modernbert-tiny`` (issue 41): a ModernBERT-class SesameBert (rope, GeGLU, local layers in
a window shorter than the blocks, packed documents) trains, a resumed run ends bitwise where the uninterrupted one
does, and the folder loads with the Auto classes."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from _launch import checkpoint_args
from _launch import corpus_args as _run_args

from core.errors import run_cli
from pretrain.cli import main


def test_modernbert_tiny_trains_resumes_bitwise_and_loads(corpus_dir, bert_tokenizer, tmp_path, fresh_state):
    from transformers import AutoModelForMaskedLM

    import modeling  # noqa: F401  (registers the Auto classes)

    tok, preset = tmp_path / "tok", tmp_path / "preset"
    bert_tokenizer.save_pretrained(tok)
    # the preset with a 16-token window, so that on 32-token blocks the local layers do not see whole blocks
    modeling.get_preset_config("modernbert-tiny", local_attention=16).save_pretrained(preset)
    common = ["--tokenizer_name", str(tok), *checkpoint_args(4, 2), "--learning_rate", "2e-3"]
    a, resumed = tmp_path / "a", tmp_path / "resumed"
    assert run_cli(main, _run_args(corpus_dir, a, *common, config=str(preset))) == 0
    config = json.loads((a / "config.json").read_text())
    assert config["position_embedding_type"] == "rope" and config["hidden_act"] == "geglu"
    assert config["local_attention"] == 16 and config["global_attn_every_n_layers"] == 3
    resumed.mkdir()
    shutil.copytree(a / "checkpoints" / "step_2", resumed / "checkpoints" / "step_2")
    argv = _run_args(corpus_dir, resumed, *common, "--resume_from_checkpoint", "latest", config=str(preset))
    assert run_cli(main, argv) == 0
    assert (a / "model.safetensors").read_bytes() == (resumed / "model.safetensors").read_bytes()

    model = AutoModelForMaskedLM.from_pretrained(a).eval()
    assert type(model).__name__ == "SesameBertForMaskedLM"
    batch = bert_tokenizer(["the senate adjourned after a long debate"], return_tensors="pt")
    # the trained folder in transformers' ModernBERT format (python -m modeling.bert.convert --to modernbert)
    from transformers import ModernBertForMaskedLM

    from modeling.bert import convert

    argv = ["--source", str(a), "--to", "modernbert", "--output_dir", str(tmp_path / "modernbert")]
    assert run_cli(convert.main, argv) == 0
    reference = ModernBertForMaskedLM.from_pretrained(tmp_path / "modernbert").eval()
    assert reference.config.cls_token_id == bert_tokenizer.cls_token_id  # from the tokenizer, not ModernBERT's
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"]).logits
        assert logits.isfinite().all()
        assert (reference(input_ids=batch["input_ids"]).logits - logits).abs().max() <= 1e-5


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(local_attention=63), "local_attention=63"),
        (dict(local_attention=16384), "max_position_embeddings (8192)"),
        (dict(num_key_value_heads=3), "multiple of num_key_value_heads"),
        (dict(head_dim=65), "even head dimension"),
        (dict(hidden_act="reglu"), "hidden_act='reglu'"),
    ],
)
def test_bad_modern_configs_are_refused_with_one_line(
    corpus_dir, bert_tokenizer, tmp_path, fresh_state, capsys, fields, message
):
    """``pretrain --config_name DIR`` with a config.json the config's validators refuse: exit 2, one ``error:`` line
    that names the field, nothing written."""
    import modeling

    tok, bad, out = tmp_path / "tok", tmp_path / "bad", tmp_path / "out"
    bert_tokenizer.save_pretrained(tok)
    bad.mkdir()
    settings = modeling.get_preset_config("modernbert-tiny").to_dict()
    (bad / "config.json").write_text(json.dumps({**settings, **fields}))
    assert run_cli(main, _run_args(corpus_dir, out, "--tokenizer_name", str(tok), config=str(bad))) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and message in lines[0] and "--config_name" in lines[0], lines
    assert not (out / "model.safetensors").exists()
