"""Issue 33 item 2: one ``ModelSpec`` per model family (``modeling/<family>/__init__.py``) is the single source the
commands read -- presets, tokenizer trainer, export inputs, model-card name, fine-tuning recipe -- checked as
properties of the spec table, not as copies of its values."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from _tiny import tiny_bert_kwargs, tiny_elmo_kwargs
from transformers import AutoModel

import modeling
from modeling import ALL_SPECS, PRESETS, SPECS, spec_for

TINY = {
    "bert": lambda: tiny_bert_kwargs(50, 32),
    "elmo": lambda: tiny_elmo_kwargs(50),
    "baselines": lambda: dict(vocab_size=50, embedding_dim=8, ngram_buckets=97, cnn_num_filters=4, rnn_hidden_size=6),
}


def test_every_family_preset_belongs_to_exactly_one_spec():
    owners = {name: [s.name for s in ALL_SPECS.values() if name in s.presets] for name in PRESETS}
    for name, (config_class, _) in PRESETS.items():
        assert owners[name] == [spec_for(config_class.model_type).name], name
    for spec in ALL_SPECS.values():
        assert spec_for(spec.model_type) is spec and ALL_SPECS[spec.name] is spec
        assert {modeling.get_preset_config(p).model_type for p in spec.presets} == {spec.model_type}
    # the baselines: every family's spec, not one that pretrain and the tokenizer command train
    assert ALL_SPECS == {**SPECS, "baselines": modeling.baselines.SPEC} and spec_for(None) is spec_for("bert") is None


@pytest.mark.parametrize("name", sorted(ALL_SPECS))
def test_export_sample_is_a_padded_batch_of_the_spec_inputs_that_the_model_reads(name):
    spec = ALL_SPECS[name]
    config = spec.presets[next(iter(spec.presets))][0](**TINY[name]())
    batch = spec.export_sample(config, 3, 7, torch.Generator().manual_seed(0))
    assert tuple(batch) == spec.export_inputs and spec.main_input in batch
    assert all(t.dtype == torch.int64 and t.shape[:2] == (3, 7) for t in batch.values())
    mask = batch["attention_mask"]
    assert mask[:-1].all() and not mask[-1].all()  # only the last row is padded
    model = AutoModel.from_config(config).eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        hidden = model(**batch).last_hidden_state
    assert hidden.shape[:2] == (3, 7) and torch.isfinite(hidden.float()).all()


def test_the_baselines_spec_is_the_family_its_sample_read_by_every_encoder():
    """modeling.baselines' spec: the ELMo word tokenizer's trainer and inputs, word ids with <S> / </S> where the
    character ids have them; every preset's classifier reads the sample (pairs and a single sentence)."""
    from modeling.baselines import SPEC, SesameBaselineForSequenceClassification

    assert SPEC.model_type == "sesame-baseline" and SPEC.presets is modeling.baselines.PRESETS
    assert SPEC.tokenizer_trainer == SPECS["elmo"].tokenizer_trainer and not SPEC.frozen_backbone
    for preset in SPEC.presets:
        config = modeling.get_preset_config(preset, **TINY["baselines"](), treelstm_hidden_size=5, num_labels=2)
        batch = SPEC.export_sample(config, 3, 9, torch.Generator().manual_seed(1))
        ids, markers = batch["input_ids"], batch["char_ids"][..., 1]
        assert torch.equal(ids == 1, markers == 257) and torch.equal(ids == 2, markers == 258)  # <S>, </S>
        assert torch.equal(ids == 0, batch["attention_mask"] == 0) and batch["token_type_ids"].any()
        with torch.no_grad():
            logits = SesameBaselineForSequenceClassification(config).eval()(**batch).logits
        assert logits.shape == (3, 2) and torch.isfinite(logits).all(), preset


def test_the_tokenizer_command_and_trainer_read_the_spec(tiny_corpus, tmp_path):
    from tokenizer import train_tokenizer
    from tokenizer.__main__ import build_parser

    choices = next(
        a for a in build_parser()._subparsers._group_actions[0].choices["train"]._actions if a.dest == "model_type"
    )
    assert list(choices.choices) == list(SPECS)
    # options the trainer does not take are left out (the word trainer has no model_max_length / show_progress)
    words = train_tokenizer(SPECS["elmo"], [tiny_corpus], 60, tmp_path / "w", 600, show_progress=True)
    pieces = train_tokenizer(SPECS["bert"], [tiny_corpus], 60, tmp_path / "p", 600, show_progress=False)
    assert type(words).__name__ == "SesameElmoTokenizer" and pieces.model_max_length == 600
    assert train_tokenizer(SPECS["bert"], [tiny_corpus], 60, tmp_path / "q", 128).model_max_length == 512
    other = dataclasses.replace(SPECS["bert"], tokenizer_trainer=SPECS["elmo"].tokenizer_trainer)
    assert type(train_tokenizer(other, [tiny_corpus], 60, tmp_path / "o")).__name__ == "SesameElmoTokenizer"


def test_pretrain_families_help_card_and_finetuning_read_the_spec(tmp_path):
    from finetune.arguments import card_family, default_learning_rate
    from finetune.baselines import RECIPES, recipe_for
    from pretrain.arguments import ModelArguments
    from pretrain.objectives import FAMILIES, OBJECTIVES
    from training.model_card import render_model_card

    assert {f.name: f.spec for f in FAMILIES.values()} == SPECS
    assert {o.family.name for o in OBJECTIVES.values()} == set(SPECS)
    config_help = next(f for f in dataclasses.fields(ModelArguments) if f.name == "config_name").metadata["help"]
    assert f"preset ({', '.join(p for s in SPECS.values() for p in s.presets)})" in config_help
    for spec in ALL_SPECS.values():
        config = modeling.get_preset_config(next(iter(spec.presets)))
        card = render_model_card(model_type=spec.model_type, **card_family(config))
        assert f"{spec.description} (`model_type: {spec.model_type}`)" in card
        rate = default_learning_rate(config, "glue")[0]
        assert not spec.frozen_backbone or rate == spec.finetune_recipe["learning_rate"]
        folder = tmp_path / spec.name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"model_type": spec.model_type}))
        assert recipe_for(str(folder)) == (spec.model_type, {**RECIPES["default"], **spec.finetune_recipe})
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    assert recipe_for(str(tmp_path / "other")) == ("default", RECIPES["default"])
    # a saved baseline: its encoder's recipe of the table
    modeling.get_preset_config("baseline-cnn").save_pretrained(tmp_path / "cnn")
    assert recipe_for(str(tmp_path / "cnn")) == ("cnn", RECIPES["cnn"])
