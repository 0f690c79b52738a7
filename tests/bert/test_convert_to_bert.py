"""SesameBert -> transformers BERT (``python -m modeling.bert.convert --to bert``): every head against transformers'
own BERT classes (eager and sdpa, padding), a round trip through both converters, the CLI, a modern config refused."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

import modeling
from core.errors import run_cli
from modeling.bert.convert import main
from modeling.bert.sources import bert

#: SesameBert class -> the transformers BERT class with the same head.
BERT_CLASSES = {ours: theirs for theirs, ours in bert.CLASSES.items()}
TINY = dict(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


@pytest.fixture(autouse=True)
def _seed_and_threads(seeded_single_thread):
    """Every test here: seed 0, one torch thread (tests/conftest.py)."""


def _perturbed(cls_name, **fields):
    config = modeling.SesameBertConfig(**{**TINY, **NO_DROPOUT, "num_labels": 3, **fields})
    model = getattr(modeling, cls_name)(config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.eval()


@pytest.mark.parametrize("cls_name", sorted(BERT_CLASSES))
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_to_bert_computes_the_same_function(cls_name, implementation):
    ours = _perturbed(cls_name)
    theirs = bert.from_sesame(ours)
    assert type(theirs).__name__ == BERT_CLASSES[cls_name]
    ours.set_attn_implementation(implementation)
    theirs.set_attn_implementation(implementation)
    input_ids = torch.randint(5, 60, (3, 12), generator=torch.Generator().manual_seed(1))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 7:] = 0
    attention_mask[2, 3:] = 0
    token_type_ids = (torch.arange(12) >= 6).long().expand(3, -1) * attention_mask
    batch = dict(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
    real = attention_mask.bool()
    with torch.no_grad():
        a, b = ours(**batch, output_hidden_states=True), theirs(**batch, output_hidden_states=True)
    for x, y in zip(a.hidden_states, b.hidden_states, strict=True):
        assert (x[real] - y[real]).abs().max() <= 1e-5
    fields = ("prediction_logits", "seq_relationship_logits", "logits", "start_logits", "end_logits", "pooler_output")
    compared = [f for f in fields if getattr(b, f, None) is not None]
    assert compared
    for field in compared:
        x, y = getattr(a, field), getattr(b, field)
        if x.dim() > 1 and x.shape[:2] == real.shape:
            x, y = x[real], y[real]
        assert (x - y).abs().max() <= 1e-5, field
    if cls_name == "SesameBertForPreTraining":  # and back with the BERT -> SesameBert converter: the same tensors
        back = bert.SOURCE.sesame_state(theirs.state_dict(), "BertForPreTraining")
        assert all(torch.equal(back[k], v) for k, v in ours.state_dict().items())


def test_cli_to_bert_and_back(tmp_path, tokenizer, capsys):
    ours = _perturbed("SesameBertForPreTraining", vocab_size=len(tokenizer))
    ours.save_pretrained(tmp_path / "sesame")
    tokenizer.save_pretrained(tmp_path / "sesame")
    argv = ["--source", str(tmp_path / "sesame"), "--to", "bert", "--output_dir", str(tmp_path / "b")]
    assert run_cli(main, argv) == 0
    assert json.loads(capsys.readouterr().out)["converted_to"] == "BertForPreTraining"
    bert = transformers.BertForPreTraining.from_pretrained(tmp_path / "b")
    assert run_cli(main, ["--source", str(tmp_path / "b"), "--output_dir", str(tmp_path / "again")]) == 0
    again = modeling.SesameBertForPreTraining.from_pretrained(tmp_path / "again")
    assert all(torch.equal(again.state_dict()[k], v) for k, v in ours.state_dict().items())
    assert bert.config.model_type == "bert"

    modern = modeling.SesameBertForMaskedLM(
        modeling.get_preset_config("modernbert-tiny", vocab_size=len(tokenizer), num_hidden_layers=1)
    )
    modern.save_pretrained(tmp_path / "modern")
    tokenizer.save_pretrained(tmp_path / "modern")
    argv = ["--source", str(tmp_path / "modern"), "--to", "bert", "--output_dir", str(tmp_path / "never")]
    assert run_cli(main, argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: ") and "has no BERT counterpart" in err, err
    assert not (tmp_path / "never").exists()
