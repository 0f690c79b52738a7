"""bench/bench_elmo_recipe.py: recipe flags, configs written from ``PRESET:field=value``, the exact held-out
perplexity, and the comparison with the baseline's curve, against hand-computed values."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from _launch import load_module

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "bench_elmo_recipe.py"


elmo = load_module(SCRIPT, "bench_elmo_recipe")


def _args(tmp_path, *extra):
    return elmo.parse_args(
        [
            "--train_file",
            "a.txt",
            "--validation_file",
            "v.txt",
            "--glue_dir",
            "g",
            "--output_dir",
            str(tmp_path),
            *extra,
        ]
    )


def test_recipes_budgets_and_block_lengths(tmp_path):
    args = _args(tmp_path, "--budget_tokens", "5000", "--recipe_flags", "long=--max_seq_length 64 --learning_rate 3e-3")
    assert list(args.recipe_table) == ["elmo-default", "elmo-new-default", "long"]
    assert elmo.seq_length(args.recipe_table["long"]) == 64 and elmo.seq_length(args.recipe_table["elmo-default"]) == 32
    data = {"prepared": {64: {"path": tmp_path / "prepared-L64"}}}
    cmd = elmo.run_command("long", args.recipe_table["long"], args, data, tmp_path)
    assert cmd[cmd.index("--max_train_tokens") + 1] == "5000" and cmd[cmd.index("--checkpointing_steps") + 1] == "0.2"
    assert cmd[cmd.index("--prepared_dataset") + 1] == str(tmp_path / "prepared-L64")
    with pytest.raises(SystemExit):
        _args(tmp_path, "--budget_tokens", "5", "--recipe_flags", "x=--max_train_steps 3")
    with pytest.raises(SystemExit):
        _args(tmp_path)  # no budget


def test_a_preset_with_fields_becomes_a_config_folder(tmp_path):
    flags = elmo.ttq.recipes.materialize_configs(
        ["--learning_rate", "1e-3", "--config_name", "elmo-small:softmax=adaptive,dropout=0"], tmp_path
    )
    folder = Path(flags[flags.index("--config_name") + 1])
    config = json.loads((folder / "config.json").read_text())
    assert config["softmax"] == "adaptive" and config["dropout"] == 0 and config["projection_dim"] == 128
    assert flags[:2] == ["--learning_rate", "1e-3"]
    plain = ["--config_name", "elmo-small"]
    assert elmo.ttq.recipes.materialize_configs(plain, tmp_path) == ["--config_name", "elmo-small"]


def test_heldout_perplexity_is_the_models_exact_loss(tmp_path):
    """exp of the token-weighted mean of both directions' losses, as the model reports them for each batch."""
    import torch
    from transformers import AutoModelForPreTraining

    import modeling

    torch.manual_seed(0)
    model = AutoModelForPreTraining.from_config(
        modeling.get_preset_config(
            "elmo-small", vocab_size=50, projection_dim=16, cell_size=32, cnn_filters=[[1, 8], [2, 8]]
        )
    ).eval()
    batches = []
    for length in (5, 7):
        ids = torch.randint(3, 50, (2, length))
        batches.append(
            {
                "input_ids": ids,
                "char_ids": torch.randint(1, 200, (2, length, 50)),
                "attention_mask": torch.ones_like(ids),
                "labels": ids,
            }
        )
    nll = count = 0.0
    with torch.no_grad():
        for b in batches:
            out = model(**b)
            nll += float(out.forward_loss) * float(out.forward_num_tokens)
            nll += float(out.backward_loss) * float(out.backward_num_tokens)
            count += float(out.forward_num_tokens + out.backward_num_tokens)
    assert count == 2 * 2 * (4 + 6)  # every row predicts length - 1 tokens in each direction
    assert elmo.heldout_perplexity(model, batches) == pytest.approx(math.exp(nll / count), rel=1e-9)


def test_compare_with_the_baseline_by_hand():
    base = [{"seconds": 10, "tokens": 100, "perplexity": 400.0}, {"seconds": 20, "tokens": 200, "perplexity": 200.0}]
    ours = [{"seconds": 5, "tokens": 100, "perplexity": 300.0}, {"seconds": 15, "tokens": 300, "perplexity": 100.0}]
    r = elmo.compare(ours, base)
    # at 200 tokens: halfway between log 300 and log 100 -> sqrt(300 * 100); at 20 s: our last point (clamped)
    assert r["perplexity_at_baseline_tokens"] == pytest.approx(math.sqrt(300 * 100))
    assert r["perplexity_at_baseline_seconds"] == pytest.approx(100.0)
    # log 200 is crossed between 5 s (log 300) and 15 s (log 100): at 5 + 10 * log(300/200) / log(300/100)
    seconds = 5 + 10 * math.log(1.5) / math.log(3)
    assert r["seconds_to_baseline_perplexity"] == pytest.approx(seconds)
    assert r["time_to_quality"] == pytest.approx(20 / seconds)
    assert elmo.compare(base, ours)["seconds_to_baseline_perplexity"] is None  # never reaches 100
