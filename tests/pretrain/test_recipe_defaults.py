"""The default pretraining recipe on the user's data (issue 22, item 3): what ``pretrain`` fills in where a flag is not
given, the learning-rate rule by width and norm position (hand-computed values), and the run plan's warning for too
few tokens per parameter."""

from __future__ import annotations

import logging

import pytest

from modeling import get_preset_config
from pretrain.cli import parse
from pretrain.objectives import FAMILIES
from pretrain.run_plan import MIN_TOKENS_PER_PARAMETER, warn_few_tokens


@pytest.mark.parametrize(
    "argv,mlm_probability,schedule",
    [
        (["--train_file", "x.txt"], 0.3, "warmup_stable_decay_1sqrt"),  # mlm on user data: the measured recipe
        (["--train_file", "x.txt", "--objective", "mlm+nsp"], 0.15, "linear"),  # BERT's
        (["--train_file", "x.txt", "--model_type", "elmo"], None, "warmup_stable_decay_1sqrt"),  # BiLM: measured
        ([], 0.15, "linear"),  # the demo job keeps its settings
        (["--train_file", "x.txt", "--mlm_probability", "0.2", "--lr_scheduler_type", "cosine"], 0.2, "cosine"),
    ],
)
def test_defaults_by_objective_and_given_flags_win(argv, mlm_probability, schedule):
    plan = parse(argv)
    assert plan.masking.mlm_probability == mlm_probability
    assert plan.training.lr_scheduler_type == schedule


@pytest.mark.parametrize(
    "preset,overrides,expected",
    [
        ("bert-tiny", {}, 2e-3),  # H=128: the measured rate
        ("bert-mini", {}, 1e-3),  # 2e-3 * 128 / 256
        ("bert-small", {}, 5e-4),  # 2e-3 * 128 / 512
        ("bert-base", {}, 3.3e-4),  # 2e-3 * 128 / 768 = 3.33e-4, two significant digits
        ("bert-base", {"hidden_size": 4096, "num_attention_heads": 16}, 1e-4),  # 6.25e-5 -> BERT's floor
        ("bert-tiny", {"norm_position": "pre"}, 2e-3),  # pre-LN at H=128: 2e-3 * 128 / 128 (measured)
        ("modernbert-tiny", {}, 2e-3),  # H=128
        ("modernbert-mini", {}, 1e-3),  # H=256: 2e-3 * 128 / 256 = 1e-3
        ("modernbert-base", {}, 1e-3),  # H=768: 3.3e-4 -> Cramming's floor
    ],
)
def test_learning_rate_rule(preset, overrides, expected):
    config = get_preset_config(preset, **overrides)
    rate, source = FAMILIES["bert"].learning_rate(config)
    assert rate == pytest.approx(expected, rel=1e-12)
    assert source


def test_learning_rate_resolved_into_the_plan():
    plan = parse(["--train_file", "x.txt", "--config_name", "bert-mini"])
    resolved = plan.with_model_config(get_preset_config("bert-mini"))
    assert resolved.training.learning_rate == pytest.approx(1e-3)
    assert "hidden size 256" in resolved.learning_rate_source
    given = parse(["--train_file", "x.txt", "--learning_rate", "5e-5"]).with_model_config(
        get_preset_config("bert-mini")
    )
    assert given.training.learning_rate == 5e-5 and given.learning_rate_source == "--learning_rate"


def test_too_few_tokens_warns_with_numbers(caplog):
    caplog.set_level(logging.WARNING, logger="pretrain")
    n_params = 1_511_360  # bert-tiny with an 8k vocabulary
    assert warn_few_tokens(1_228_800, n_params)  # the demo's 300 steps x 4096 tokens: 0.81 per parameter
    assert "1.23e+06 training tokens for 1.51e+06 parameters (0.81 tokens per parameter" in caplog.text
    caplog.clear()
    assert not warn_few_tokens(int(MIN_TOKENS_PER_PARAMETER * n_params), n_params)
    assert not warn_few_tokens(3_000_000, n_params)
    assert caplog.text == ""


def test_elmo_defaults_follow_the_elmo_recipe_benchmark():
    """The BiLM's measured recipe (issue 22, item 5): lr 2e-3 for any config, and elmo-small trains with the adaptive
    softmax; elmo-original keeps bilm-tf's sampled softmax."""
    rate, source = FAMILIES["elmo"].learning_rate(get_preset_config("elmo-small", vocab_size=100))
    assert rate == 2e-3 and "measured" in source
    assert get_preset_config("elmo-small", vocab_size=100).softmax == "adaptive"
    assert get_preset_config("elmo-original", vocab_size=100).softmax == "sampled"
    plan = parse(["--train_file", "x.txt", "--model_type", "elmo"])
    assert plan.with_model_config(get_preset_config("elmo-small", vocab_size=100)).training.learning_rate == 2e-3


# ---- device-sized defaults (issue 50, item 4) ---------------------------------------------------------------------
@pytest.fixture
def on_device(monkeypatch):
    """``on_device("cpu" | "cuda")``: ``parse`` resolves as on that device (``default_device_type`` faked)."""

    def choose(device_type: str) -> None:
        monkeypatch.setattr("pretrain.arguments.default_device_type", lambda: device_type)

    return choose


def _run(plan) -> tuple:
    return plan.model.config_name, plan.corpus.max_seq_length, plan.training.per_device_train_batch_size


def test_cpu_picks_a_size_that_learns_and_says_why(on_device):
    on_device("cpu")
    plan = parse(["--train_file", "x.txt"])
    assert _run(plan) == ("modernbert-tiny", 128, 32)
    assert plan.device_choice.startswith("modernbert-tiny, the default for your data on the CPU")
    assert "modernbert-base" in plan.device_choice and "--config_name" in plan.device_choice
    # a size the user names is theirs, and nothing is said; the demo job keeps its own settings
    given = parse(["--train_file", "x.txt", "--config_name", "modernbert-base"])
    assert _run(given) == ("modernbert-base", 128, 32) and given.device_choice is None
    assert _run(parse([]))[0] == "bert-tiny" and parse([]).device_choice is None


def test_cuda_takes_modernbert_length_and_32k_tokens_per_step(on_device):
    on_device("cuda")
    plan = parse(["--train_file", "x.txt"])
    assert _run(plan) == ("modernbert-base", 1024, 32)  # 32 x 1,024 = 32,768 tokens per optimizer step
    assert plan.device_choice == (
        "modernbert-base, ModernBERT-base's sizes, the default for your data on a GPU; --max_seq_length 1024, "
        "--per_device_train_batch_size 32: ModernBERT's length and about 32k tokens per optimizer step on a GPU"
    )
    # a modern preset the user names takes them too, but for what the user sets; a BERT preset keeps BERT's
    mini = parse(["--train_file", "x.txt", "--config_name", "modernbert-mini", "--max_seq_length", "512"])
    assert _run(mini) == ("modernbert-mini", 512, 32)
    assert mini.device_choice == (
        "--per_device_train_batch_size 32: ModernBERT's length and about 32k tokens per optimizer step on a GPU"
    )
    assert _run(parse(["--train_file", "x.txt", "--config_name", "bert-base"])) == ("bert-base", 128, 32)
    assert parse(["--train_file", "x.txt", "--config_name", "bert-base"]).device_choice is None
    assert _run(parse([]))[:2] == ("bert-tiny", 128)  # the demo job
    elmo = parse(["--train_file", "x.txt", "--model_type", "elmo"])
    assert _run(elmo) == ("elmo-small", 32, 16) and elmo.device_choice is None


def test_device_type_follows_accelerate_cpu_flag(monkeypatch):
    import torch

    from pretrain.arguments import default_device_type

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    assert default_device_type() == "cuda"
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")  # accelerate launch --cpu
    assert default_device_type() == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("ACCELERATE_USE_CPU")
    assert default_device_type() == "cpu"


def test_plan_and_progress_lines(on_device, corpus_dir, bert_tokenizer, tmp_path, fresh_state, caplog):
    import logging

    from _launch import corpus_args

    from core.errors import run_cli
    from pretrain.cli import main

    on_device("cpu")
    bert_tokenizer.save_pretrained(tmp_path / "tok")
    args = corpus_args(corpus_dir, tmp_path / "out", "--max_train_steps", "2", tokenizer=tmp_path / "tok", config=None)
    with caplog.at_level(logging.INFO, logger="pretrain"), caplog.at_level(logging.INFO, logger="training.loop"):
        assert run_cli(main, args) == 0
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("modernbert-tiny (mlm): "))
    assert line.endswith(
        "parameters (modernbert-tiny, the default for your data on the CPU, a size that learns "
        "within a CPU run (modernbert-base, the GPU default, would take hours and learn little "
        "beyond word frequencies here; --config_name to choose))"
    ), line
    # the progress line (no terminal here) carries the packing efficiency; no MFU without a known peak (the CPU)
    progress = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step 2/2: ")]
    assert progress and ", packing efficiency " in progress[-1] and "MFU" not in progress[-1], progress
