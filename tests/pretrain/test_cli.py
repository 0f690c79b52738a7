"""``pretrain`` end to end in-process on tiny corpora: outputs, Auto/pipeline loading, NSP, ELMo, trackers,
refused input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _launch import corpus_args

from core.errors import run_cli
from pretrain.cli import build_parser, main, parse
from pretrain.objectives import OBJECTIVES


def _args(corpus_dir: Path, out: Path, *extra: str) -> list[str]:
    schedule = "--vocab_size 300 --max_train_steps 6 --eval_steps 3 --num_warmup_steps 1"
    return corpus_args(corpus_dir, out, *schedule.split(), *extra, config=None)


def test_default_job_settings():
    plan = parse([])
    assert plan.family.name == "bert" and plan.model.config_name == "bert-tiny" and plan.model.vocab_size == 8000
    assert plan.training.output_dir == str(Path("outputs") / "pretrain-bert") and plan.corpus.train_file is None
    assert plan.corpus.max_seq_length == 128
    assert plan.training.max_train_steps == OBJECTIVES["mlm"].family.demo_defaults["max_train_steps"]
    assert "outputs/pretrain-bert" in build_parser().format_help().replace("\n", " ").replace("  ", " ")


def test_bert_mlm_end_to_end(corpus_dir, tmp_path, fresh_state):
    from transformers import AutoModelForMaskedLM, AutoTokenizer, pipeline

    import modeling  # noqa: F401

    out = tmp_path / "bert"
    # BERT's zero output bias: the random-word corpus has nothing to learn past the unigram plateau, and the
    # default (unigram) bias starts there, so only a model that starts above it shows the loss falling
    zeros = ("--output_bias_init", "zeros")
    assert (
        run_cli(
            main,
            _args(corpus_dir, out, "--config_name", "bert-tiny", "--whole_word_mask", *zeros, "--logging_steps", "1"),
        )
        == 0
    )
    results = json.loads((out / "all_results.json").read_text())
    for (
        key
    ) in "train_loss eval_loss perplexity train_runtime_s train_tokens_per_second train_samples_per_second".split():
        assert isinstance(results[key], float), key
    assert results["perplexity"] == pytest.approx(2.718281828 ** results["eval_loss"], rel=1e-9)
    # telemetry (training.mfu): full packed blocks but the last, shorter one; no peak FLOP/s known for the CPU
    assert 0.9 < results["train_packing_efficiency"] <= 1.0 and results["train_mfu"] is None
    history = json.loads((out / "eval_history.json").read_text())
    assert [h["step"] for h in history] == [0, 3, 6] and history[-1]["perplexity"] < history[1]["perplexity"] < history[
        0
    ]["perplexity"]
    log = json.loads((out / "trainer_log.json").read_text())
    assert len(log) == 6 and all(
        {"train_loss", "learning_rate", "grad_norm", "tokens_per_second", "packing_efficiency"} <= set(r) for r in log
    )
    model = AutoModelForMaskedLM.from_pretrained(out)
    assert type(model).__name__ == "SesameBertForMaskedLM" and model.config.vocab_size == len(
        AutoTokenizer.from_pretrained(out)
    )
    fill = pipeline("fill-mask", model=str(out), tokenizer=str(out))
    predictions = fill("the senate [MASK] after a long debate.")
    assert len(predictions) == 5 and all("token_str" in p for p in predictions)
    # with data, checkpoints follow the evaluation interval (here --eval_steps 3)
    assert sorted(s.name for s in (out / "checkpoints").iterdir()) == ["step_3", "step_6"]


def test_bert_nsp_end_to_end(corpus_dir, tmp_path, fresh_state):
    out = tmp_path / "nsp"
    assert run_cli(main, _args(corpus_dir, out, "--config_name", "bert-tiny", "--nsp", "--max_seq_length", "48")) == 0
    results = json.loads((out / "all_results.json").read_text())
    assert 0.0 <= results["eval_nsp_accuracy"] <= 1.0
    assert json.loads((out / "config.json").read_text())["architectures"] == ["SesameBertForPreTraining"]


def test_elmo_end_to_end(corpus_dir, tmp_path, fresh_state):
    import modeling

    config_dir = tmp_path / "elmo-config"
    modeling.get_preset_config(
        "elmo-small", cnn_filters=[[1, 8], [2, 8], [3, 16]], projection_dim=16, cell_size=32, num_layers=1
    ).save_pretrained(config_dir)
    out = tmp_path / "elmo"
    assert run_cli(main, _args(corpus_dir, out, "--model_type", "elmo", "--config_name", str(config_dir))) == 0
    results = json.loads((out / "all_results.json").read_text())
    assert results["forward_perplexity"] > 1 and results["backward_perplexity"] > 1
    history = json.loads((out / "eval_history.json").read_text())
    assert history[-1]["perplexity"] < history[0]["perplexity"]
    from transformers import AutoModelForPreTraining, AutoTokenizer

    assert type(AutoModelForPreTraining.from_pretrained(out)).__name__ == "SesameElmoForBidirectionalLM"
    assert AutoTokenizer.from_pretrained(out)("a b")["char_ids"]


def test_tensorboard_run_has_loss_and_lr(corpus_dir, tmp_path, fresh_state):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "tb"
    assert (
        run_cli(
            main,
            _args(corpus_dir, out, "--config_name", "bert-tiny", "--report_to", "tensorboard", "--logging_steps", "2"),
        )
        == 0
    )
    runs = list((out / "runs").rglob("events.out.tfevents.*"))
    assert runs
    acc = EventAccumulator(str(runs[0].parent)).Reload()
    tags = acc.Tags()["scalars"]
    assert {"train_loss", "learning_rate", "grad_norm", "perplexity"} <= set(tags)
    assert [e.step for e in acc.Scalars("train_loss")] == [2, 4, 6]


@pytest.mark.slow
def test_wandb_offline_run_has_loss_and_lr(corpus_dir, tmp_path, fresh_state, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc credentials
    out = tmp_path / "wb"
    assert (
        run_cli(
            main, _args(corpus_dir, out, "--config_name", "bert-tiny", "--report_to", "wandb", "--logging_steps", "2")
        )
        == 0
    )
    runs = list((out / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1, "one offline run under <output_dir>/wandb"
    # wandb 0.31 ships no reader for its record files; the history records carry the metric names as text
    records = runs[0].read_bytes()
    for key in (b"train_loss", b"learning_rate", b"grad_norm", b"perplexity"):
        assert key in records, key


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--model_type", "elmo", "--nsp"], "--nsp"),
        (["--config_name", "bert-tiny", "--max_seq_length", "1000"], "max_position_embeddings"),
        (["--config_name", "bert-giant"], "--config_name bert-giant"),
        (["--config_name", "bert-tiny", "--mlm_probability", "1.5"], "--mlm_probability"),
        (["--config_name", "bert-tiny", "--learning_rate", "-1"], "--learning_rate"),
    ],
)
def test_refused_input(corpus_dir, tmp_path, fresh_state, capsys, extra, message):
    out = tmp_path / "bad"
    assert run_cli(main, _args(corpus_dir, out, *extra)) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1 and message in lines[0]
    assert not (out / "all_results.json").exists() and not (out / "model.safetensors").exists()


def test_missing_train_file_is_refused(tmp_path, fresh_state, capsys):
    assert run_cli(main, ["--train_file", str(tmp_path / "nope.txt"), "--output_dir", str(tmp_path / "o")]) == 2
    assert "nope.txt" in capsys.readouterr().err
