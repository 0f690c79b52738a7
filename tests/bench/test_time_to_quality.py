"""bench/bench_time_to_quality.py (the ttq package): the fixed held-out masks, the reference run (transformers
only), the unigram plateau, the curve arithmetic and the ratios, against hand-computed values. bench/ is not a
package: the ttq package is imported from it, as the script imports it."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _helpers import run_reference_in_process

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "bench_time_to_quality.py"
sys.path.insert(0, str(SCRIPT.parent))  # bench/: the ttq package

import ttq.cli  # noqa: E402
import ttq.common  # noqa: E402
import ttq.data  # noqa: E402
import ttq.downstream  # noqa: E402
import ttq.phases  # noqa: E402
import ttq.plan  # noqa: E402
import ttq.recipes  # noqa: E402
import ttq.reference  # noqa: E402
import ttq.report  # noqa: E402
import ttq.runs  # noqa: E402
import ttq.scoring  # noqa: E402

#: The data flags of the bench drivers' command lines (files not read by the tests that use them).
BASE_ARGS = ["--train_file", "a.txt", "--validation_file", "v.txt", "--glue_dir", "g"]

WORDS_A = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
WORDS_B = ["red", "green", "blue", "cyan", "magenta", "yellow", "black", "white"]


@pytest.fixture(scope="module")
def tokenizer():
    """A WordPiece tokenizer over a hand-written vocabulary: [PAD] [UNK] [CLS] [SEP] [MASK] = ids 0-4, then words."""
    from transformers import BertTokenizerFast

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS_A, *WORDS_B]
    tok = BertTokenizerFast(vocab={t: i for i, t in enumerate(vocab)})
    assert tok.convert_tokens_to_ids(["[CLS]", "alpha", "white"]) == [2, 5, len(vocab) - 1]
    return tok


def _documents(n_words: int = 300) -> list[str]:
    """Two documents of disjoint vocabularies (A words, then B words), ``n_words`` words each."""
    return [
        " ".join(WORDS_A[(i * 3) % 8] for i in range(n_words)),
        " ".join(WORDS_B[(i * 5) % 8] for i in range(n_words)),
    ]


def test_heldout_blocks_one_document_each(tokenizer):
    blocks = ttq.data.heldout_blocks(_documents(300), tokenizer, max_len=32)
    ids_a = set(tokenizer.convert_tokens_to_ids(WORDS_A))
    ids_b = set(tokenizer.convert_tokens_to_ids(WORDS_B))
    assert len(blocks) == 2 * math.ceil(300 / 30)  # 30 content tokens per block, per document
    for block in blocks:
        assert len(block) <= 32 and block[0] == tokenizer.cls_token_id and block[-1] == tokenizer.sep_token_id
        inner = set(block[1:-1])
        assert inner <= ids_a or inner <= ids_b  # never two documents in one block


def test_heldout_masks_fixed_and_bert_like(tokenizer):
    blocks = ttq.data.heldout_blocks(_documents(1500), tokenizer, max_len=64)
    first = ttq.data.mask_heldout(blocks, tokenizer, seed=7)
    again = ttq.data.mask_heldout(blocks, tokenizer, seed=7)
    other = ttq.data.mask_heldout(blocks, tokenizer, seed=8)
    for key in ("input_ids", "labels", "lengths"):
        assert torch.equal(first[key], again[key])  # the same positions and the same replacement tokens
    assert ttq.data.heldout_sha256(first) == ttq.data.heldout_sha256(again) != ttq.data.heldout_sha256(other)
    original = torch.tensor([t for b in blocks for t in b])
    special = torch.isin(original, torch.tensor(tokenizer.all_special_ids))
    masked = first["labels"] != -100
    assert not (masked & special).any()  # [CLS]/[SEP] are never predicted
    assert torch.equal(first["labels"][masked], original[masked])
    assert torch.equal(first["input_ids"][~masked], original[~masked])
    assert first["lengths"].tolist() == [len(b) for b in blocks]
    share = masked.sum().item() / (~special).sum().item()
    assert 0.13 < share < 0.17  # 15% of ~3,000 non-special tokens
    as_mask = (first["input_ids"][masked] == tokenizer.mask_token_id).float().mean().item()
    kept = (first["input_ids"][masked] == original[masked]).float().mean().item()
    assert 0.74 < as_mask < 0.86 and 0.05 < kept < 0.16  # 80% [MASK]; 10% kept (+ random draws of the same id)


class _Recorder(torch.nn.Module):
    """An MLM stand-in with constant logits (uniform over V) that records every input it is given."""

    def __init__(self, vocab_size: int):
        super().__init__()
        self.vocab_size, self.seen = vocab_size, []
        self.dummy = torch.nn.Parameter(torch.zeros(()))

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        from types import SimpleNamespace

        self.seen.append((input_ids.clone(), attention_mask.clone(), token_type_ids.clone()))
        return SimpleNamespace(logits=torch.zeros(*input_ids.shape, self.vocab_size) + self.dummy)


def test_every_model_scored_on_the_same_inputs(tokenizer):
    heldout = ttq.data.mask_heldout(ttq.data.heldout_blocks(_documents(200), tokenizer, max_len=40), tokenizer, seed=3)
    a, b = _Recorder(len(tokenizer)), _Recorder(2 * len(tokenizer))
    loss_a, loss_b = ttq.scoring.heldout_loss(a, heldout), ttq.scoring.heldout_loss(b, heldout)
    # uniform logits over V: the cross-entropy of every masked token is ln V
    assert loss_a == pytest.approx(math.log(len(tokenizer)), rel=1e-6)  # float32 logits
    assert loss_b == pytest.approx(math.log(2 * len(tokenizer)), rel=1e-6)
    assert len(a.seen) == len(b.seen) > 0
    for (ids_a, mask_a, types_a), (ids_b, _, _) in zip(a.seen, b.seen):
        assert torch.equal(ids_a, ids_b) and bool(mask_a.all()) and not types_a.any()
    fed = torch.cat([ids.flatten() for ids, _, _ in a.seen])
    assert sorted(fed.tolist()) == sorted(heldout["input_ids"].tolist())  # every held-out token, once


def test_heldout_loss_refuses_sparse_logits(tokenizer):
    heldout = ttq.data.mask_heldout(ttq.data.heldout_blocks(_documents(50), tokenizer, max_len=40), tokenizer, seed=3)

    class Sparse(_Recorder):
        def forward(self, input_ids, attention_mask=None, token_type_ids=None):
            from types import SimpleNamespace

            return SimpleNamespace(logits=torch.zeros(5, self.vocab_size))

    with pytest.raises(ttq.common.BenchError, match="full"):
        ttq.scoring.heldout_loss(Sparse(len(tokenizer)), heldout)


def test_group_texts_as_run_mlm():
    batch = {"input_ids": [[1, 2, 3], [4, 5], [6, 7, 8, 9]], "special_tokens_mask": [[1, 0, 1], [0, 0], [1, 0, 0, 1]]}
    out = ttq.data.group_texts(batch, 4)
    assert out["input_ids"] == [[1, 2, 3, 4], [5, 6, 7, 8]]  # concatenated, cut, the remainder (9) dropped
    assert out["special_tokens_mask"] == [[1, 0, 1, 0], [0, 1, 0, 0]]
    # less than a block: kept
    assert ttq.data.group_texts({"input_ids": [[1, 2], [3]]}, 4) == {"input_ids": [[1, 2, 3]]}


REF = [
    {"seconds": 10.0, "tokens": 100.0, "step": 1, "eval_loss": 8.0},
    {"seconds": 20.0, "tokens": 200.0, "step": 2, "eval_loss": 7.0},
]
OURS = [
    {"seconds": 5.0, "tokens": 150.0, "step": 1, "eval_loss": 7.5},
    {"seconds": 10.0, "tokens": 300.0, "step": 2, "eval_loss": 6.5},
    {"seconds": 15.0, "tokens": 450.0, "step": 3, "eval_loss": 6.0},
]


def test_quality_per_token_by_hand():
    r = ttq.scoring.quality_per_token(OURS, REF, unigram=9.0)
    # T = min(450, 200) = 200 tokens; ours there: 7.5 - (50 / 150) * 1.0 = 7.1667; reference: 7.0
    assert r["tokens_compared"] == 200.0
    assert r["loss_at_tokens"]["ours"] == pytest.approx(7.5 - 1 / 3)
    assert r["quality_per_token"] == pytest.approx((9.0 - (7.5 - 1 / 3)) / (9.0 - 7.0))
    # the reference on the plateau
    assert ttq.scoring.quality_per_token(OURS, REF, unigram=7.0)["quality_per_token"] is None


def test_time_to_quality_by_hand():
    r = ttq.scoring.time_to_quality(OURS, REF)
    # target 7.0 is crossed halfway between 5 s (7.5) and 10 s (6.5): 7.5 s; reference 20 s -> 20 / 7.5
    assert r["target_loss"] == 7.0 and r["seconds_to_target"] == pytest.approx(7.5)
    assert r["time_to_quality"] == pytest.approx(20.0 / 7.5) and not r["reached_by_first_point"]
    slow = [dict(p, eval_loss=p["eval_loss"] + 1.0) for p in OURS]  # 8.5, 7.5, 7.0 -> reached at the last point
    assert ttq.scoring.time_to_quality(slow, REF)["seconds_to_target"] == pytest.approx(15.0)
    never = [dict(p, eval_loss=p["eval_loss"] + 2.0) for p in OURS]
    assert ttq.scoring.time_to_quality(never, REF)["time_to_quality"] is None
    early = ttq.scoring.time_to_quality([dict(p, eval_loss=6.9) for p in OURS], REF)
    assert early["reached_by_first_point"] and early["seconds_to_target"] == 5.0


def test_tokens_to_quality_by_hand():
    r = ttq.scoring.tokens_to_quality(OURS, REF)
    # target 7.0 is crossed halfway between 150 tokens (7.5) and 300 (6.5): 225; reference 200 tokens -> 200 / 225
    assert r["tokens_to_target"] == pytest.approx(225.0) and r["reference_tokens"] == 200.0
    assert r["tokens_to_quality"] == pytest.approx(200.0 / 225.0) and not r["tokens_reached_by_first_point"]
    never = [dict(p, eval_loss=p["eval_loss"] + 2.0) for p in OURS]
    assert ttq.scoring.tokens_to_quality(never, REF)["tokens_to_quality"] is None
    early = ttq.scoring.tokens_to_quality([dict(p, eval_loss=6.9) for p in OURS], REF)
    assert early["tokens_reached_by_first_point"] and early["tokens_to_target"] == 150.0


def test_times_from_trainer_log_by_hand():
    # 70 blocks, 32 per step: steps 1, 2 full, step 3 has the epoch's last 6 blocks, step 4 starts epoch 2
    assert [ttq.scoring.steps_samples(s, 70, 32) for s in (1, 2, 3, 4, 6)] == [32, 32, 6, 32, 6]
    log = [
        {"step": 2, "samples_per_second": 16.0, "tokens_per_second": 2048.0},  # 64 blocks in 4 s
        {"step": 4, "samples_per_second": 19.0, "tokens_per_second": 2432.0},
    ]  # 6 + 32 blocks in 2 s
    times = ttq.scoring.times_from_trainer_log(log, n_blocks=70, per_step=32)
    assert times[2] == {"seconds": 4.0, "tokens": 4.0 * 2048.0}
    assert times[4]["seconds"] == pytest.approx(6.0) and times[4]["tokens"] == pytest.approx(4 * 2048 + 2 * 2432)


def test_times_from_trainer_log_take_the_loops_own_totals():
    """A batch-size warmup (pretrain --batch_size_warmup_tokens): step 1 holds 8 blocks of 128 tokens, step 2 holds
    32, so the blocks per step of the recipe (32) would count 4,096 tokens too many at step 1; the loop's cumulative
    train_seconds / train_tokens are taken as they are, and every record must have them."""
    log = [
        {"step": 1, "samples_per_second": 8.0, "tokens_per_second": 1024.0, "train_seconds": 1.0, "train_tokens": 1024},
        {
            "step": 2,
            "samples_per_second": 16.0,
            "tokens_per_second": 2048.0,
            "train_seconds": 3.0,
            "train_tokens": 5120,
        },
    ]
    times = ttq.scoring.times_from_trainer_log(log, n_blocks=1000, per_step=32)
    assert times == {1: {"seconds": 1.0, "tokens": 1024}, 2: {"seconds": 3.0, "tokens": 5120}}
    older = ttq.scoring.times_from_trainer_log(
        [{k: v for k, v in r.items() if k != "train_tokens"} for r in log], 1000, 32
    )
    assert older[1] == {"seconds": 4.0, "tokens": 4096.0}, "the estimate of earlier logs: 32 blocks at step 1"


def test_prepared_dataset_variants_follow_the_recipe_flags():
    assert ttq.recipes.data_variant([]) == "prepared" and ttq.recipes.variant_flags("prepared") == []
    assert ttq.recipes.data_variant(["--document_masking", "false", "--learning_rate", "1e-3"]) == "prepared-nodoc"
    assert ttq.recipes.variant_flags("prepared-nodoc") == ["--document_masking", "false"]
    assert ttq.recipes.data_variant(["--objective=rtd", "--document_masking=False"]) == "prepared-rtd-nodoc"
    assert ttq.recipes.variant_flags("prepared-rtd-nodoc") == ["--objective", "rtd", "--document_masking", "false"]
    assert ttq.recipes.data_variant(["--document_masking", "true"]) == "prepared"


def test_recipes_and_flags():
    # argv: no quotes
    table = ttq.recipes.select_recipes(["sesame-default"], ["wd0=--weight_decay 0 --learning_rate=2e-3"])
    assert table == {"sesame-default": [], "wd0": ["--weight_decay", "0", "--learning_rate=2e-3"]}
    assert ttq.common.flag_value(table["wd0"], "--learning_rate") == "2e-3"
    with pytest.raises(ValueError, match="set by the bench"):
        ttq.recipes.select_recipes([], ["x=--max_train_steps 5"])
    with pytest.raises(ValueError, match="unknown"):
        ttq.recipes.select_recipes(["nope"], [])
    assert ttq.runs.save_steps(10, 4) == [3, 6, 9, 10]


ISSUE_52 = ("sesame-modern-stable-adamw", "sesame-modern-mask30to15", "sesame-modern-bsw", "sesame-modern-8x4")


def test_issue_52_recipes_are_sesame_modern_with_one_change_each(tmp_path, capsys):
    """The item-5 recipes (issue 52) resolve through pretrain's own parser into sesame-modern plus one change each
    (StableAdamW + decoupled weight decay; masking 30% -> 15%; a batch-size warmup, and its control with the same
    micro-batches: 8 x 4 = the bench's default 32 blocks per step), and --plan_only lists them by name."""
    from pretrain.cli import parse

    base = [
        "--train_file",
        str(tmp_path / "t.txt"),
        "--output_dir",
        str(tmp_path / "o"),
        "--per_device_train_batch_size",
    ]
    plans = {
        n: parse([*base, "32", *f]) for n, f in ttq.recipes.select_recipes(["sesame-modern", *ISSUE_52], []).items()
    }
    modern = plans.pop("sesame-modern")

    def changed(plan):
        return {
            k: v
            for part in ("training", "masking")
            for k, v in vars(getattr(plan, part)).items()
            if getattr(getattr(modern, part), k) != v
        }

    assert changed(plans["sesame-modern-stable-adamw"]) == {
        "optim": "stable_adamw",
        "decoupled_weight_decay": True,
        "weight_decay": 1e-5,
    }
    assert changed(plans["sesame-modern-mask30to15"]) == {"mlm_probability_end": 0.15}
    assert modern.masking.mlm_probability == 0.3
    control = {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 4}
    assert changed(plans["sesame-modern-8x4"]) == control
    assert changed(plans["sesame-modern-bsw"]) == {**control, "batch_size_warmup_tokens": 100000}
    argv = ["--train_file", "t.txt", "--validation_file", "v.txt", "--glue_dir", str(tmp_path)]
    argv += ["--output_dir", str(tmp_path / "b"), "--budget_minutes", "10"]
    plan = ttq.cli.parse_args([*argv, "--recipes", "sesame-modern", *ISSUE_52, "--plan_only"])
    ttq.plan.print_plan(plan, "h100")
    assert f"5 recipe(s) (sesame-modern, {', '.join(ISSUE_52)})" in capsys.readouterr().out


def test_shapes_are_the_presets():
    import modeling

    for name, shape in ttq.common.SHAPES.items():
        config = modeling.get_preset_config(name)
        assert {k: getattr(config, k) for k in shape} == shape


def test_reference_is_transformers_only(tokenizer, tmp_path):
    """The reference child process: transformers' BertForMaskedLM and DataCollatorForLanguageModeling, with every
    project package import refused in it; steps timed, tokens counted, weights saved at the save steps."""
    from datasets import Dataset

    enc = tokenizer(_documents(200), return_special_tokens_mask=True)
    blocks = Dataset.from_dict({k: list(v) for k, v in enc.items()}).map(
        ttq.data.group_texts, batched=True, fn_kwargs={"block_size": 16}
    )
    blocks.save_to_disk(str(tmp_path / "blocks"))
    tokenizer.save_pretrained(str(tmp_path / "tok"))
    probe = (
        "import importlib.util, sys; spec = importlib.util.spec_from_file_location('b', sys.argv[1]); "
        "m = importlib.util.module_from_spec(spec); sys.modules['b'] = m; spec.loader.exec_module(m); "
        "from ttq.reference import block_project_imports, reference_main\n"
        "block_project_imports()\ntry:\n    import training\nexcept ImportError:\n    print('blocked')\n"
        "reference_main(sys.argv[2:])"
    )
    cmd = [
        sys.executable,
        "-c",
        probe,
        str(SCRIPT),
        "--blocks",
        str(tmp_path / "blocks"),
        "--tokenizer",
        str(tmp_path / "tok"),
        "--model_shape",
        "bert-tiny",
        "--learning_rate",
        "1e-3",
        "--max_train_steps",
        "3",
        "--batch_size",
        "4",
        "--save_steps",
        "2",
        "3",
        "--threads",
        "1",
        "--output_dir",
        str(tmp_path / "ref"),
        "--start_file",
        str(SCRIPT),
    ]  # exists: no wait
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "blocked" in proc.stdout
    result = json.loads((tmp_path / "ref" / ttq.reference.REFERENCE_LOG).read_text())
    assert result["model_class"] == "transformers.models.bert.modeling_bert.BertForMaskedLM"
    assert result["collator_class"] == "transformers.data.data_collator.DataCollatorForLanguageModeling"
    assert result["attn_implementation"] == "sdpa" and result["project_modules_loaded"] == []
    assert result["waited_for_start_s"] < 1.0
    steps = result["steps"]
    assert [s["step"] for s in steps] == [1, 2, 3] and [s["tokens"] for s in steps] == [64, 128, 192]
    assert 0 < steps[0]["seconds"] < steps[1]["seconds"] < steps[2]["seconds"]
    assert sorted(p.name for p in (tmp_path / "ref" / "checkpoints").iterdir()) == ["step_2", "step_3"]
    from transformers import AutoModelForMaskedLM, BertForMaskedLM

    assert type(AutoModelForMaskedLM.from_pretrained(str(tmp_path / "ref"))) is BertForMaskedLM


def test_what_pretraining_buys_by_hand(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(
        json.dumps(
            {
                "runs": [
                    {"task": "sst2", "backbone": "cbow", "metric": "accuracy", "value": 0.80},
                    {"task": "sst2", "backbone": "rnn", "metric": "accuracy", "value": 0.82},
                    {
                        "task": "sst2",
                        "backbone": "bert-tiny-1500",
                        "metric": "accuracy",
                        "value": 0.90,
                    },  # not a classic row
                    {
                        "task": "stsb",
                        "backbone": "cbow",
                        "metric": "spearmanr",
                        "value": 0.9,
                    },  # another metric: ignored
                    {"task": "stsb", "backbone": "cnn", "metric": "pearson", "error": "failed"},
                ]
            }
        )
    )
    baselines = ttq.downstream.read_baselines(str(path), ["sst2", "stsb"])
    assert baselines == {"sst2": {"cbow": 0.80, "rnn": 0.82, "bert-tiny-1500": 0.90}}
    runs = {
        "reference": {"kind": "reference", "downstream": {"sst2": 0.75, "stsb": 0.30}},
        "ours": {"kind": "recipe", "downstream": {"sst2": 0.85, "stsb": None}},
        "random-sesame": {"kind": "random-init", "downstream": {"sst2": 0.70, "stsb": 0.10}},
        "random-bert": {"kind": "random-init", "final_eval_loss": 9.0},
    }  # scored, not fine-tuned
    buys = ttq.downstream.pretraining_buys(runs, baselines)
    assert set(buys) == {"reference", "ours"}
    ours, ref = buys["ours"]["sst2"], buys["reference"]["stsb"]
    assert ours["vs_random_init"] == pytest.approx(0.15) and ours["random_init"] == "random-sesame"
    assert ours["best_classic"] == "rnn" and ours["vs_best_classic"] == pytest.approx(0.03)
    assert buys["ours"]["stsb"]["vs_random_init"] is None
    # random-bert was not fine-tuned: the reference is compared with random-sesame; no classic STS-B row
    assert ref["random_init"] == "random-sesame" and ref["vs_random_init"] == pytest.approx(0.20)
    assert ref["best_classic"] is None and ref["vs_best_classic"] is None


def test_pairs_schedules_and_token_budget(tmp_path):
    args = ttq.cli.parse_args(
        [
            *BASE_ARGS,
            "--output_dir",
            str(tmp_path),
            "--budget_tokens",
            "100000",
            "--repeats",
            "2",
            "--recipes",
            "sesame-default",
            "--recipe_flags",
            "big=--per_device_train_batch_size 16 --gradient_accumulation_steps 4",
        ]
    )
    pairs = ttq.runs.plan_pairs(args, tmp_path)
    assert [(ref.name, ours.name, ours.seed) for ref, ours in pairs] == [
        ("reference-r0@sesame-default", "sesame-default-r0", 42),
        ("reference-r0@big", "big-r0", 42),
        ("reference-r1@sesame-default", "sesame-default-r1", 43),
        ("reference-r1@big", "big-r1", 43),
    ]
    assert all(
        ref.seed == ours.seed and ref.paired_with == ours.name and ref.recipe == ours.recipe for ref, ours in pairs
    )
    assert [len(g) for g in ttq.runs.groups_for("paired", pairs)] == [2, 2, 2, 2]
    # sequential: one run at a time, one reference copy per repeat (alone, a copy is the same run as the others)
    assert [[r.name for r in g] for g in ttq.runs.groups_for("sequential", pairs)] == [
        ["reference-r0@sesame-default"],
        ["sesame-default-r0"],
        ["big-r0"],
        ["reference-r1@sesame-default"],
        ["sesame-default-r1"],
        ["big-r1"],
    ]
    # shared (a recipe search): per repeat the first pair, then the other recipes without reference copies
    assert [[r.name for r in g] for g in ttq.runs.groups_for("shared", pairs)] == [
        ["reference-r0@sesame-default", "sesame-default-r0"],
        ["big-r0"],
        ["reference-r1@sesame-default", "sesame-default-r1"],
        ["big-r1"],
    ]
    copies = {
        "reference-r0@sesame-default": {"paired_with": "sesame-default-r0", "final_eval_loss": 6.0},
        "reference-r1@sesame-default": {"paired_with": "sesame-default-r1", "final_eval_loss": 6.1},
    }
    ttq.runs.shared_copies(pairs, copies)
    assert copies["reference-r1@big"] == {"paired_with": "sesame-default-r1 (shared)", "final_eval_loss": 6.1}
    with pytest.raises(SystemExit):
        ttq.cli.parse_args(
            [
                *BASE_ARGS,
                "--output_dir",
                str(tmp_path),
                "--budget_minutes",
                "1",
                "--schedule",
                "shared",
            ]
        )
    ref_steps, steps = ttq.phases.budget_steps(args, pairs)
    # 100,000 tokens: 32 x 128 = 4,096 tokens per step -> 25 steps; 16 x 4 blocks = 8,192 tokens -> 13 steps
    assert (ref_steps, steps) == (25, {"sesame-default": 25, "big": 13})
    assert all(r.budget_s is None for pair in pairs for r in pair)
    # a wall-clock budget: no steps here, every run sizes its schedule in its process from its budget_s
    minutes = ttq.cli.parse_args([*BASE_ARGS, "--output_dir", str(tmp_path), "--budget_minutes", "1.5"], cuda=False)
    timed = ttq.runs.plan_pairs(minutes, tmp_path)
    assert ttq.phases.budget_steps(minutes, timed) == (None, {"sesame-default": None, "sesame-before-22": None})
    assert {r.budget_s for pair in timed for r in pair} == {90.0}


def _rtd_model(seed: int):
    import modeling

    torch.manual_seed(seed)
    config = modeling.SesameBertRTDConfig(
        vocab_size=21,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=32,
    )
    return modeling.SesameBertForReplacedTokenDetection(config).eval()


def test_rtd_runs_are_scored_by_their_generator_also_from_checkpoints(tmp_path):
    """An RTD run folder (discriminator + generator/) is scored by its generator; a checkpoint (accelerate's
    ``save_state`` of the whole RTD model, shared tensors written once) gives the generator of that step."""
    from accelerate import Accelerator

    folder, later = tmp_path / "run", _rtd_model(1)
    _rtd_model(0).save_pretrained(folder)
    assert ttq.scoring.scored_by_generator(folder) and not ttq.scoring.scored_by_generator(folder / "generator")
    acc = Accelerator(cpu=True)
    acc.prepare(later)
    acc.save_state(str(tmp_path / "ckpt"))
    ids = torch.randint(5, 21, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        final = ttq.scoring.load_scored_mlm(folder).eval()(ids).logits
        step = ttq.scoring.load_scored_mlm(folder, tmp_path / "ckpt" / "model.safetensors").eval()(ids).logits
        assert torch.equal(final, _rtd_model(0).generator(ids).logits)
        assert torch.equal(step, later.generator(ids).logits) and not torch.equal(step, final)
    assert type(ttq.scoring.load_scored_mlm(folder)).__name__ == "SesameBertForMaskedLM"


def test_rtd_rows_have_no_mlm_ratios_but_join_the_table_and_the_plot(tmp_path, capsys):
    args = ttq.cli.parse_args(
        [
            *BASE_ARGS,
            "--output_dir",
            str(tmp_path),
            "--budget_tokens",
            "8192",
            "--recipes",
            "sesame-lr1e-3",
            "rtd",
            "--tasks",
            "sst2",
        ]
    )
    assert args.recipe_table["rtd"] == ["--objective", "rtd", "--learning_rate", "1e-3"]
    curve = [
        {"seconds": 1.0, "tokens": 4096, "step": 1, "eval_loss": 7.0},
        {"seconds": 2.0, "tokens": 8192, "step": 2, "eval_loss": 6.5},
    ]
    ref = {
        "name": "ref",
        "repeat": 0,
        "seed": 42,
        "paired_with": "x",
        "heldout_model": "model",
        "curve": curve,
        "final_eval_loss": 6.5,
        "tokens": 8192,
        "seconds": 2.0,
        "steps": 2,
        "tokens_per_second": 4096,
        "learning_rate": 1e-3,
    }
    ours = {**ref, "curve": [dict(p, eval_loss=p["eval_loss"] - 0.1) for p in curve], "final_eval_loss": 6.4}
    rtd = {**ours, "heldout_model": "generator"}
    ratios = {
        "sesame-lr1e-3": ttq.scoring.ratios_for([(ref, ours)], 7.5),
        "rtd": ttq.scoring.ratios_for([(ref, rtd)], 7.5),
    }
    assert ratios["sesame-lr1e-3"]["quality_per_token"] == pytest.approx((7.5 - 6.4) / (7.5 - 6.5))
    assert ratios["rtd"]["quality_per_token"] is None and ratios["rtd"]["time_to_quality"] is None
    assert "generator" in ratios["rtd"]["not_applicable"]
    runs = {
        "reference": ttq.runs.summarize("reference", [], [ref]),
        "sesame-lr1e-3": ttq.runs.summarize("recipe", [], [ours]),
        "rtd": {**ttq.runs.summarize("recipe", ["--objective", "rtd"], [rtd]), "downstream": {"sst2": 0.7}},
        "random-sesame": {"kind": "random-init", "flags": [], "final_eval_loss": 9.0},
    }
    assert runs["rtd"]["heldout_model"] == "generator"
    manifest = {"tokenizer_size": 21, "blocks": {"train": 10}, "tokens": {"train": 1280}}
    data = {
        "manifest": manifest,
        "prepared": tmp_path / "prepared",
        "variants": {name: {"path": tmp_path / name, "manifest": manifest} for name in ("prepared", "prepared-rtd")},
    }
    results = {
        "command": ["bench"],
        "protocol": ttq.report.protocol(
            args, data, 1e-3, {"reference": 2, "sesame-lr1e-3": 2, "rtd": 2}, ttq.report.budget_protocol(args, {}), 1.0
        ),
        "heldout_sha256": "0" * 64,
        "heldout": {"blocks": 2, "tokens": 64, "masked": 9, "seed": 1},
        "unigram_loss": 7.5,
        "ratios": {
            "default_recipe": "sesame-lr1e-3",
            "quality_per_token": 1.1,
            "time_to_quality": None,
            "by_recipe": ratios,
        },
        "runs": runs,
        "pretraining_buys": {},
        "baselines": {},
        "sweep": {},
        "timings": {},
    }
    ttq.report.write_outputs(results, tmp_path)
    table = (tmp_path / "results.md").read_text()
    assert "| rtd | n/a |" in table and "6.4000 (generator)" in table
    assert (tmp_path / "results.png").stat().st_size > 0
    ttq.report.print_ratios(results)
    printed = capsys.readouterr().out
    assert "rtd: no quality per token / time to quality" in printed and "(generator)" in printed


# -- issue 30 item 5: the bench sized for a GPU --------------------------------------------------------------------
def test_device_defaults_cuda_and_cpu(tmp_path):
    """CUDA: sequential, bf16 for the reference and for our recipes (a recipe's own --mixed_precision wins); CPU:
    paired, the reference in float32 and no --mixed_precision added; a given flag beats the device default."""
    argv = [*BASE_ARGS, "--output_dir", str(tmp_path), "--budget_tokens", "8192", "--recipes", "sesame-default"]
    argv += ["--recipe_flags", "own-fp32=--mixed_precision no"]
    gpu, cpu = ttq.cli.parse_args(argv, cuda=True), ttq.cli.parse_args(argv, cuda=False)
    assert (gpu.schedule, gpu.reference_mixed_precision, gpu.mixed_precision) == ("sequential", "bf16", "bf16")
    assert (cpu.schedule, cpu.reference_mixed_precision, cpu.mixed_precision) == ("paired", "no", None)
    given = ttq.cli.parse_args([*argv, "--schedule", "paired", "--reference_mixed_precision", "no"], cuda=True)
    assert (given.schedule, given.reference_mixed_precision) == ("paired", "no")
    assert 1 <= cpu.preprocessing_num_workers <= ttq.cli.MAX_DEFAULT_WORKERS
    data = {"variants": {"prepared": {"path": tmp_path / "prepared"}}, "reference_blocks": "b", "tokenizer": "t"}
    pairs = ttq.runs.plan_pairs(gpu, tmp_path)
    ref_cmd = ttq.runs.run_command(pairs[0][0], gpu, data, 10, 2)
    assert ttq.common.flag_value(ref_cmd, "--mixed_precision") == "bf16"
    assert ttq.common.flag_value(ref_cmd, "--heldout") == str(tmp_path / ttq.data.HELDOUT_FILE)
    default_cmd = ttq.runs.run_command(pairs[0][1], gpu, data, 10, 2)
    own_cmd = ttq.runs.run_command(pairs[1][1], gpu, data, 10, 2)
    assert ttq.common.flag_value(default_cmd, "--mixed_precision") == "bf16"
    assert ttq.common.flag_value(own_cmd, "--mixed_precision") == "no"  # the recipe's flag comes later: it wins
    assert "--mixed_precision" not in ttq.runs.run_command(pairs[0][1], cpu, data, 10, 2)
    assert ttq.common.flag_value(ttq.runs.run_command(pairs[0][0], cpu, data, 10, 2), "--mixed_precision") == "no"
    with pytest.raises(SystemExit):
        ttq.cli.parse_args([*argv, "--preprocessing_num_workers", "0"], cuda=False)


def test_tokenizer_env_threads():
    assert ttq.data.tokenizer_env(8) == {"TOKENIZERS_PARALLELISM": "true", "RAYON_NUM_THREADS": "8"}
    assert ttq.data.tokenizer_env(1)["TOKENIZERS_PARALLELISM"] == "false"


def test_tokenizer_command_of_both_benches():
    """The tokenizer trainer's command that both benches run (the time-to-quality bench for BERT, the ELMo bench for
    its word vocabulary), against the argv written out by hand."""
    got = ttq.data.tokenizer_command("elmo", ["a.txt", "b.txt.gz"], 500, Path("out") / "tok")
    expected = [sys.executable, "-m", "tokenizer", "train", "--model_type", "elmo"]
    expected += ["--train_file", "a.txt", "b.txt.gz", "--vocab_size", "500", "--output_dir", str(Path("out") / "tok")]
    assert got == expected


def test_reference_blocks_the_same_for_every_worker_count(tokenizer, tmp_path):
    """Tokenizing in processes does not change the reference's blocks: group_texts still sees the same map batches
    of 1,000 documents (the remainders it drops are the same)."""
    from datasets import load_from_disk

    words = WORDS_A + WORDS_B
    docs = [" ".join(words[(i * 7 + j) % 16] for j in range(3 + i % 11)) for i in range(2300)]
    (tmp_path / "a.txt").write_text("\n\n".join(docs[:1200]) + "\n")
    (tmp_path / "b.txt").write_text("\n\n".join(docs[1200:]) + "\n")
    tokenizer.save_pretrained(str(tmp_path / "tok"))
    files = [str(tmp_path / "a.txt"), str(tmp_path / "b.txt")]
    for n in (1, 3):
        ttq.data.build_reference_blocks(files, tmp_path / "tok", 16, tmp_path / f"blocks{n}", n)
    one, three = load_from_disk(str(tmp_path / "blocks1")), load_from_disk(str(tmp_path / "blocks3"))
    assert one["input_ids"] == three["input_ids"] and one["special_tokens_mask"] == three["special_tokens_mask"]
    # by hand: per batch of 1,000 documents, [CLS] doc [SEP] concatenated, cut into 16, the remainder dropped
    lengths = [len(d.split()) + 2 for d in docs]
    expected = sum(sum(lengths[i : i + 1000]) // 16 for i in range(0, len(docs), 1000))
    assert len(one) == expected and all(len(b) == 16 for b in one["input_ids"])


@pytest.mark.parametrize("precision", ["no", "bf16"])
def test_reference_scores_in_process_as_its_checkpoints_score(tokenizer, tmp_path, precision):
    """The reference scores its live model at its save steps (no checkpoint written or loaded): the same number as
    the old path (save_pretrained, then heldout_loss of the model built from the checkpoint), and the same
    training trajectory as a run that does not score; training under bf16 autocast too (scores stay float32)."""
    from datasets import Dataset
    from safetensors.torch import save_file

    enc = tokenizer(_documents(200), return_special_tokens_mask=True)
    blocks = Dataset.from_dict({k: list(v) for k, v in enc.items()}).map(
        ttq.data.group_texts, batched=True, fn_kwargs={"block_size": 16}
    )
    blocks.save_to_disk(str(tmp_path / "blocks"))
    tokenizer.save_pretrained(str(tmp_path / "tok"))
    heldout = ttq.data.mask_heldout(ttq.data.heldout_blocks(_documents(120), tokenizer, max_len=24), tokenizer, seed=5)
    save_file(heldout, str(tmp_path / "heldout.safetensors"))
    common = ["--blocks", str(tmp_path / "blocks"), "--tokenizer", str(tmp_path / "tok"), "--model_shape"]
    common += ["bert-tiny", "--learning_rate", "3e-3", "--max_train_steps", "4", "--batch_size", "4"]
    common += ["--mixed_precision", precision, "--save_steps", "2", "4"]
    scored = run_reference_in_process(
        [*common, "--heldout", str(tmp_path / "heldout.safetensors"), "--save_checkpoints", "--output_dir"]
        + [str(tmp_path / "scored")]
    )
    plain = run_reference_in_process([*common, "--output_dir", str(tmp_path / "plain")])
    assert plain["scores"] == {} and sorted(scored["scores"]) == ["2", "4"]
    for step in (2, 4):  # the old path: the saved checkpoint, built again and scored (on the CPU)
        old = ttq.scoring.heldout_loss(
            ttq.scoring.load_mlm(tmp_path / "scored" / "checkpoints" / f"step_{step}"), heldout
        )
        assert scored["scores"][str(step)] == pytest.approx(old, rel=1e-5)
        if not torch.cuda.is_available():  # the same device and weights: the same number, bit for bit
            assert scored["scores"][str(step)] == old
    assert scored["scores"]["2"] != scored["scores"]["4"]
    if not torch.cuda.is_available():  # deterministic on the CPU: scoring changes nothing of the training
        assert [s["loss"] for s in scored["steps"]] == [s["loss"] for s in plain["steps"]]
        for step in (2, 4):
            old = ttq.scoring.heldout_loss(
                ttq.scoring.load_mlm(tmp_path / "plain" / "checkpoints" / f"step_{step}"), heldout
            )
            assert scored["scores"][str(step)] == old
    again = run_reference_in_process(
        [*common, "--heldout", str(tmp_path / "heldout.safetensors"), "--output_dir", str(tmp_path / "nockpt")]
    )
    assert sorted(again["scores"]) == ["2", "4"] and not (tmp_path / "nockpt" / "checkpoints").exists()
    # the bench reads the logged curve: no checkpoint needed
    run = ttq.runs.Run("reference", "reference", tmp_path / "nockpt", 42, lr=3e-3)
    args = argparse.Namespace(keep_checkpoints=False)
    curve = ttq.runs.score_run(run, args, {}, heldout)
    assert [p["step"] for p in curve] == [2, 4] and [p["eval_loss"] for p in curve] == [
        again["scores"]["2"],
        again["scores"]["4"],
    ]
    assert [p["tokens"] for p in curve] == [128, 256]


def _tiny_sesame(seed: int):
    import modeling

    torch.manual_seed(seed)
    config = modeling.get_preset_config(
        "bert-tiny", vocab_size=21, pad_token_id=0, hidden_size=32, intermediate_size=64
    )
    return modeling.SesameBertForMaskedLM(config)


def test_checkpoint_scorer_equals_building_each_checkpoint(tokenizer, tmp_path):
    """One model per run, each checkpoint's weights loaded into it (on the scoring device): the same held-out loss
    as building the model from each checkpoint (the old path), for an MLM run and an RTD run (its generator)."""
    from accelerate import Accelerator

    heldout = ttq.data.mask_heldout(ttq.data.heldout_blocks(_documents(150), tokenizer, max_len=24), tokenizer, seed=9)
    folder = tmp_path / "run"
    _tiny_sesame(0).save_pretrained(folder)
    for step, seed in ((1, 1), (2, 2)):
        acc = Accelerator(cpu=True)
        acc.prepare(_tiny_sesame(seed))
        acc.save_state(str(folder / "checkpoints" / f"step_{step}"))
    scorer = ttq.scoring.CheckpointScorer(folder)
    assert scorer.device == ttq.scoring.scoring_device()
    losses = []
    for step in (1, 2, 1):
        weights = folder / "checkpoints" / f"step_{step}" / "model.safetensors"
        old = ttq.scoring.heldout_loss(ttq.scoring.load_scored_mlm(folder, weights).to(scorer.device), heldout)
        new = scorer.score(weights, heldout)
        assert new == pytest.approx(old, rel=1e-6) and (scorer.device.type != "cpu" or new == old)
        losses.append(new)
    assert losses[0] == losses[2] != losses[1]  # each checkpoint's own weights, whatever was loaded before
    # an RTD run: the generator's part of each checkpoint
    rtd = tmp_path / "rtd"
    _rtd_model(0).save_pretrained(rtd)
    acc = Accelerator(cpu=True)
    acc.prepare(_rtd_model(3))
    acc.save_state(str(rtd / "ckpt"))
    weights = rtd / "ckpt" / "model.safetensors"
    # the tokenizer's 21 ids: the RTD vocabulary
    old = ttq.scoring.heldout_loss(ttq.scoring.load_scored_mlm(rtd, weights), heldout)
    assert ttq.scoring.CheckpointScorer(rtd, torch.device("cpu")).score(weights, heldout) == old
    # weights of another model are refused with the file named
    other = tmp_path / "other"
    _tiny_sesame(0).save_pretrained(other)
    with pytest.raises(ttq.common.BenchError, match="do not fit"):
        ttq.scoring.CheckpointScorer(rtd, torch.device("cpu")).load(other / "model.safetensors")
    wider = tmp_path / "wider"
    import modeling

    torch.manual_seed(0)
    config = modeling.get_preset_config(
        "bert-tiny", vocab_size=21, pad_token_id=0, hidden_size=64, intermediate_size=64
    )
    modeling.SesameBertForMaskedLM(config).save_pretrained(wider)
    with pytest.raises(ttq.common.BenchError, match="do not fit"):
        ttq.scoring.CheckpointScorer(folder, torch.device("cpu")).load(wider / "model.safetensors")


def test_plan_arithmetic_by_hand(tmp_path):
    """--plan_only: every phase from the cost model by hand (a made-up model with round numbers)."""
    costs = {
        "machine": {"cuda": True, "cores": 4},
        "measured": {
            "reference_step_s": 0.1,
            "recipe_step_s": 0.2,
            "at": {"model_shape": "bert-base", "batch_size": 256, "max_seq_length": 128},
            "data_one_worker_s": 100.0,
        },
        "assumed": {
            "data_parallel_share": 0.8,
            "worker_efficiency": 0.5,
            "prepare_share": 0.25,
            "process_start_s": {"reference": 10.0, "recipe": 20.0, "finetune": 5.0},
            "checkpoint_save_s": 1.0,
            "score_s": 2.0,
            "checkpoint_load_s": 0.5,
            "finetune_step_s": 0.1,
            "finetune_eval_s": 3.0,
            "random_inits_s": 7.0,
            "finetune_parallel_efficiency": 1.0,
        },
    }
    argv = [*BASE_ARGS, "--output_dir", str(tmp_path), "--model_shape", "bert-base", "--batch_size", "256"]
    argv += ["--budget_minutes", "1", "--reference_lrs", "1e-4", "2e-4", "--recipes", "sesame-default"]
    argv += ["--recipe_flags", "nodoc=--document_masking false", "--tasks", "stsb", "--seeds", "1"]
    argv += ["--max_train_samples", "320", "--curve_points", "4", "--preprocessing_num_workers", "3"]
    args = ttq.cli.parse_args(argv, cuda=True)
    got = {p["phase"]: p["seconds"] for p in ttq.plan.plan_phases(args, costs, {"stsb": 5749})}
    # data: 100 s x (1 + 0.25 for the nodoc variant) x (0.2 + 0.8 / (1 + 2 x 0.5))
    assert got["data"] == pytest.approx(100 * 1.25 * (0.2 + 0.8 / 2))
    # no probe phase: every run sizes its schedule in its process (the reference 10 probe steps x 0.1 s, ours
    # pretrain's 10 x 0.2 s)
    assert "probes" not in got
    # sweep: two runs one at a time, each 10 s start + 1 s probe + 0.25 x 60 s + one score
    assert got["sweep"] == pytest.approx(2 * (10 + 1 + 15 + 2))
    # pretraining: one reference run (10 + 1 + 60 + 4 scores) + 2 x (20 + 2 + 60 + 4 saves + 4 x (load + score))
    assert got["pretraining"] == pytest.approx(79 + 2 * (86 + 10))
    assert got["scoring"] == 7.0
    # fine-tuning: one worker start-up (5 s) + 4 models (reference, 2 recipes, random-sesame) x (10 steps x 3 epochs
    # x 0.1 + 3) / 2 workers
    assert got["finetuning"] == pytest.approx(5 + 4 * (3 + 3) / 2)
    paired = ttq.cli.parse_args([*argv, "--schedule", "paired"], cuda=True)
    got = {p["phase"]: p["seconds"] for p in ttq.plan.plan_phases(paired, costs, {"stsb": 5749})}
    assert got["sweep"] == pytest.approx(28)
    assert got["pretraining"] == pytest.approx(2 * (86 + 10))  # each pair: its longer run, then ours scored
    by_tokens = list(argv)
    at = by_tokens.index("--budget_minutes")
    by_tokens[at : at + 2] = ["--budget_tokens", "327680"]
    tokens = ttq.cli.parse_args(by_tokens, cuda=True)
    got = {p["phase"]: p["seconds"] for p in ttq.plan.plan_phases(tokens, costs, {"stsb": 5749})}
    # a token budget: 327,680 / (256 x 128) = 10 steps, no probe: sweep 2 x (10 + 0.25 x 1 s + 2)
    assert got["sweep"] == pytest.approx(2 * (10 + 0.25 + 2))


def _readme_gpu_protocol() -> list[str]:
    """The GPU protocol command of the time-to-quality section (``docs/benchmarks.md``), as argv (after the script)."""
    import re
    import shlex

    text = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    found = re.search(r"GPU protocol.*?```bash\n(.*?)```", text, flags=re.S)
    assert found, "docs/benchmarks.md: no GPU protocol command"
    argv = shlex.split(found.group(1).replace("\\\n", " "), comments=True)
    assert argv[:2] == ["python", "bench/bench_time_to_quality.py"]
    return argv[2:]


def test_readme_gpu_protocol_plans_within_nine_minutes(capsys):
    """The GPU protocol of docs/benchmarks.md: bert-base, a sweep of two learning rates, SST-2 and STS-B with one seed,
    CUDA defaults; its plan under the H100 cost model (issue 30: measured step times, data phase) is <= 9 minutes."""
    argv = _readme_gpu_protocol()
    args = ttq.cli.parse_args(argv, cuda=True)
    assert args.model_shape == "bert-base" and len(args.reference_lrs) == 2
    assert sorted(args.tasks) == ["sst2", "stsb"] and args.seeds == 1
    assert (args.schedule, args.reference_mixed_precision, args.mixed_precision) == ("sequential", "bf16", "bf16")
    plan = ttq.cli.parse_args([*argv, "--plan_only"])
    assert plan.preprocessing_num_workers == 16  # the planned machine's cores, not this one's
    total = ttq.plan.print_plan(plan, "h100")
    printed = capsys.readouterr().out
    assert total <= 9 * 60 and f"{total:.0f} s" in printed
    for phase in ("data", "sweep", "pretraining", "finetuning"):
        assert phase in printed
    assert ttq.cli.main([*argv, "--plan_only"]) == 0  # runs nothing


def test_run_jobs_reports_a_job_done_while_the_others_run(tmp_path):
    """on_done(job) comes as soon as a job ends, while a slower one still runs (our run is scored beside its
    reference copy's last steps), and not for a failed job."""
    fast = ttq.common.Job("fast", [sys.executable, "-c", "pass"], tmp_path / "fast.log")
    slow = ttq.common.Job("slow", [sys.executable, "-c", "import time; time.sleep(4)"], tmp_path / "slow.log")
    seen = []
    ttq.common.run_jobs([fast, slow], parallel=2, on_done=lambda job: seen.append((job.name, slow.returncode)))
    assert seen == [("fast", None), ("slow", 0)]
    bad = ttq.common.Job("bad", [sys.executable, "-c", "raise SystemExit(3)"], tmp_path / "bad.log")
    seen.clear()
    ttq.common.run_jobs([bad], parallel=1, check=False, on_done=lambda job: seen.append(job.name))
    assert seen == [] and bad.returncode == 3


def test_titles_name_the_modern_preset_when_both_sides_train_it():
    assert ttq.report.size_label({"model_shape": "bert-tiny"}) == "bert-tiny"
    assert ttq.report.size_label({"model_shape": "bert-tiny", "reference_model": "bert"}) == "bert-tiny"
    modern = {"model_shape": "bert-tiny", "reference_model": "modernbert"}
    assert ttq.report.size_label(modern) == "modernbert-tiny (bert-tiny width)"
