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
        ("bert-tiny", {"norm_position": "pre"}, 1e-3),  # pre-LN: Cramming
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
