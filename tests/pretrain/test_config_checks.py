"""A user's model config, checked before anything is built (issue 49, item 7): every numeric SesameBertConfig field is
validated (finite, sign, range), an unknown field in a config file gets one warning line naming it, a
``--max_seq_length`` beyond the model's positions is refused before a tokenizer is trained, and a refusal line leads
with its reason and stays short."""

from __future__ import annotations

import json
import logging
import math

import pytest
from _launch import corpus_args as _run_args

from core.errors import run_cli
from pretrain.cli import main

#: (field, value, the words the refusal names): each used to give a traceback, NaN losses or be accepted
BAD_VALUES = [
    ("initializer_range", -0.02, "initializer_range=-0.02; expected a positive finite standard deviation"),
    ("initializer_range", math.nan, "initializer_range=nan"),
    ("type_vocab_size", -1, "type_vocab_size=-1; expected an integer >= 0"),
    ("layer_norm_eps", -1.0, "layer_norm_eps=-1.0; expected a positive finite epsilon"),
    ("layer_norm_eps", 0.0, "layer_norm_eps=0.0"),
    ("rope_theta", math.inf, "rope_theta=inf; expected a finite rotary base > 1"),
    ("local_rope_theta", math.nan, "local_rope_theta=nan"),
    ("max_position_embeddings", 0, "max_position_embeddings=0; expected a positive integer"),
    ("pad_token_id", -1, "pad_token_id=-1; expected a token id in [0, vocab_size"),
    ("pad_token_id", 30522, "pad_token_id=30522"),
    ("hidden_size", True, "hidden_size=True; expected a positive integer"),
    ("hidden_dropout_prob", math.nan, "hidden_dropout_prob=nan; expected a probability"),
]


@pytest.mark.parametrize("field, value, message", BAD_VALUES, ids=[f"{f}={v}" for f, v, _ in BAD_VALUES])
def test_every_numeric_field_is_validated(field, value, message):
    from huggingface_hub.errors import StrictDataclassClassValidationError

    from modeling.bert.configuration_sesame_bert import SesameBertConfig

    with pytest.raises((StrictDataclassClassValidationError, ValueError)) as info:  # old names: read before
        SesameBertConfig(**{field: value})
    assert message in str(info.value.__cause__ or info.value), info.value


@pytest.mark.parametrize("value, ok", [(50.0, True), (0.0, False), (math.inf, False), (-1.0, False)])
def test_rtd_discriminator_weight_is_validated(value, ok):
    from huggingface_hub.errors import StrictDataclassClassValidationError

    from modeling.bert.configuration_sesame_bert import SesameBertRTDConfig

    if ok:
        assert SesameBertRTDConfig(discriminator_weight=value).discriminator_weight == value
    else:
        with pytest.raises(StrictDataclassClassValidationError, match="discriminator_weight"):
            SesameBertRTDConfig(discriminator_weight=value)


def _config_file(tmp_path, name: str = "bert-tiny", **fields):
    import modeling

    path = tmp_path / "config.json"
    path.write_text(json.dumps({**modeling.get_preset_config(name).to_dict(), **fields}))
    return path


def _errors(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize(
    "field, value", [("initializer_range", -0.02), ("type_vocab_size", -1), ("layer_norm_eps", -1), ("rope_theta", 1)]
)
def test_a_refused_config_file_is_one_short_line_that_leads_with_the_reason(
    corpus_dir, bert_tokenizer, tmp_path, fresh_state, capsys, field, value
):
    tok, out = tmp_path / "tok", tmp_path / "out"
    bert_tokenizer.save_pretrained(tok)
    config = _config_file(tmp_path, **{field: value})
    assert run_cli(main, _run_args(corpus_dir, out, "--tokenizer_name", str(tok), config=str(config))) == 2
    lines = _errors(capsys)
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"error: --config_name {config}: {field}={value}"), lines[0]
    assert "preset" not in lines[0] and len(lines[0]) - len(str(config)) <= 120, lines[0]
    assert not out.exists() or not any(out.iterdir())


def test_an_unknown_name_leads_with_the_reason_and_lists_the_presets(tmp_path, fresh_state, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert run_cli(main, ["--config_name", "bert-gigantic", "--output_dir", str(tmp_path / "out")]) == 2
    (line,) = _errors(capsys)
    assert line.startswith("error: --config_name bert-gigantic: not a preset, a config file or a loadable hub repo")
    assert "expected a preset (bert-base," in line and len(line) < 300, line


def test_each_unknown_field_of_a_config_file_gets_one_warning(
    corpus_dir, bert_tokenizer, tmp_path, fresh_state, caplog, monkeypatch
):
    import pretrain.build

    def no_tokenizer(*args, **kwargs):
        raise AssertionError("a tokenizer was trained")

    monkeypatch.setattr(pretrain.build, "train_run_tokenizer", no_tokenizer)
    config = _config_file(tmp_path, "modernbert-tiny", local_attenton=16, my_note="x")
    # --max_seq_length beyond the 8192 positions: refused right after the config is read (nothing else runs)
    argv = _run_args(corpus_dir, tmp_path / "out", "--max_seq_length", "9000", config=str(config))
    with caplog.at_level(logging.WARNING):
        assert run_cli(main, argv) == 2
    warned = [r.getMessage() for r in caplog.records if "unknown field" in r.getMessage()]
    assert len(warned) == 2, warned
    assert "local_attenton = 16" in warned[0] and "did you mean local_attention?" in warned[0]
    assert "my_note" in warned[1]


def test_saved_configs_have_no_unknown_fields(tmp_path):
    """No false alarm: every preset's saved config.json, and an RTD discriminator's (which records how the pair was
    trained), are read without a warning."""
    import modeling
    from modeling.bert.configuration_sesame_bert import SesameBertRTDConfig
    from pretrain.build import warn_unknown_fields

    for name in modeling.PRESETS:
        config = modeling.get_preset_config(name)
        config.save_pretrained(tmp_path / name)
        assert warn_unknown_fields(str(tmp_path / name), type(config).from_pretrained(tmp_path / name)) == [], name
    discriminator = SesameBertRTDConfig.from_discriminator(modeling.get_preset_config("bert-tiny"))
    discriminator.discriminator_config().save_pretrained(tmp_path / "discriminator")
    config = modeling.get_preset_config("bert-tiny")
    assert warn_unknown_fields(str(tmp_path / "discriminator" / "config.json"), config) == []


def test_max_seq_length_beyond_the_positions_is_refused_before_a_tokenizer_is_trained(
    corpus_dir, tmp_path, fresh_state, capsys, monkeypatch
):
    import pretrain.build

    trained = []
    monkeypatch.setattr(pretrain.build, "train_run_tokenizer", lambda *a, **k: trained.append(a))
    config = _config_file(tmp_path, max_position_embeddings=64)
    out = tmp_path / "out"
    assert run_cli(main, _run_args(corpus_dir, out, "--max_seq_length", "128", config=str(config))) == 2
    (line,) = _errors(capsys)
    assert "--max_seq_length 128: exceeds the model's max_position_embeddings 64" in line
    assert trained == [] and not (out / "tokenizer").exists()


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("cell_size", -3, "cell_size=-3; expected a positive finite number"),
        ("initializer_range", 0.0, "initializer_range=0.0; expected a positive finite number"),
        ("cell_clip", math.inf, "cell_clip=inf"),
        ("num_highway_layers", -1, "num_highway_layers=-1; expected a finite number >= 0"),
    ],
)
def test_elmo_numeric_fields_are_validated(field, value, message):
    """ELMo's config (and the baselines', which share :func:`check_fields`): a negative ``cell_size`` was a torch
    traceback when the model was built."""
    from modeling.elmo.configuration_elmo import SesameElmoConfig

    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        SesameElmoConfig(**{field: value})
    assert SesameElmoConfig(num_highway_layers=0).num_highway_layers == 0  # zero highway layers is a valid choice


def test_another_familys_config_is_refused_naming_its_model_type(tmp_path, fresh_state, capsys):
    """An ELMo config.json given to the BERT-like family (which otherwise takes any config its Auto class builds) was
    a transformers traceback after the tokenizer had been trained."""
    import modeling

    modeling.get_preset_config("elmo-small").save_pretrained(tmp_path / "elmo")
    argv = ["--config_name", str(tmp_path / "elmo"), "--output_dir", str(tmp_path / "out")]
    assert run_cli(main, argv) == 2
    (line,) = _errors(capsys)
    assert "a sesame-elmo config; expected one for --model_type bert (or --model_type elmo)" in line, line
