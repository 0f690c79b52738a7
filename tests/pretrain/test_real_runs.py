"""A user's first real run (issue 13), in-process on tiny corpora: a run plan that follows the data, bitwise
reproducible runs (tokenizer trained by the run included), the tokenizer rules of continued pretraining, the
output-folder rule, resume checks, prepared datasets and deterministic dataset fingerprints."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import shutil
from pathlib import Path

import pytest
from _launch import checkpoint_args, prepare_args
from _launch import corpus_args as _data

from core.errors import run_cli
from pretrain.cli import build_parser, main


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _error_lines(capsys) -> list[str]:
    return [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error: ")]


@pytest.fixture(scope="module")
def tok_dir(bert_tokenizer, tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tok") / "wp"
    bert_tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def nodrop_config(tmp_path_factory) -> Path:
    import modeling

    path = tmp_path_factory.mktemp("cfg") / "bert-nodrop"
    modeling.get_preset_config("bert-tiny", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0).save_pretrained(
        path
    )
    return path


@pytest.mark.parametrize("objective", ["mlm", "rtd"])
def test_same_command_twice_gives_bitwise_identical_tokenizer_and_weights(corpus_dir, tmp_path, fresh_state, objective):
    runs = {}
    weights = ("model.safetensors", "generator/model.safetensors") if objective == "rtd" else ("model.safetensors",)
    for name, seed in (("a", "7"), ("b", "7"), ("other_seed", "8")):
        out = tmp_path / name
        assert (
            run_cli(
                main,
                _data(
                    corpus_dir,
                    out,
                    "--vocab_size",
                    "300",
                    "--max_train_steps",
                    "4",
                    "--seed",
                    seed,
                    "--objective",
                    objective,
                ),
            )
            == 0
        )
        runs[name] = (_sha(out / "tokenizer.json"), "".join(_sha(out / w) for w in weights))
    assert runs["a"] == runs["b"]
    assert runs["other_seed"][0] == runs["a"][0], "the tokenizer depends on the corpus only"
    assert runs["other_seed"][1] != runs["a"][1], "the seed changes the weights (the check can fail)"


def test_canonical_ids_are_count_then_string(corpus_dir, tmp_path):
    from tokenizer.wordpiece import SPECIAL_TOKENS, train_wordpiece_tokenizer

    tok = train_wordpiece_tokenizer([corpus_dir / "train.txt"], 250, min_frequency=1)
    vocab = tok.get_vocab()
    by_id = sorted(vocab, key=vocab.__getitem__)
    assert by_id[: len(SPECIAL_TOKENS)] == list(SPECIAL_TOKENS)
    # recount independently: segment every line of the corpus with the trained tokenizer
    from collections import Counter

    counts = Counter()
    for line in (corpus_dir / "train.txt").read_text().splitlines():
        if line.strip():
            counts.update(tok.convert_ids_to_tokens(tok(line, add_special_tokens=False)["input_ids"]))
    rest = by_id[len(SPECIAL_TOKENS) :]
    assert rest == sorted(rest, key=lambda t: (-counts[t], t))
    assert counts[rest[0]] > 0 and counts[rest[0]] >= counts[rest[-1]]


def test_with_data_and_no_step_flags_the_run_is_one_epoch_and_the_plan_says_so(
    corpus_dir, tmp_path, fresh_state, caplog
):
    out = tmp_path / "epoch"
    with caplog.at_level(logging.INFO, logger="pretrain"):
        assert run_cli(main, _data(corpus_dir, out, "--vocab_size", "300")) == 0
    plan = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("run plan:"))
    m = re.search(
        r"run plan: (\d+) optimizer steps = ([\d.]+) epochs of (\d+) training blocks.*global batch (\d+) "
        r"sequences = (\d+) tokens.*warmup (\d+) steps; learning rate ([\d.e-]+) \(post-LN",
        plan,
    )
    assert m, plan
    steps, epochs, blocks, batch, tokens, warmup, lr = m.groups()
    assert (
        int(steps) == math.ceil(int(blocks) / 8) and float(epochs) == 1.0 and int(batch) == 8 and int(tokens) == 8 * 32
    )
    assert int(warmup) == math.ceil(0.06 * int(steps)) and float(lr) == 2e-3  # post-LN, hidden 128: 2e-3 x 128 / 128
    few = [r.getMessage() for r in caplog.records if "too few for the model" in r.getMessage()]  # 4608 tokens
    assert len(few) == 1 and "tokens per parameter, below 1)" in few[0], few
    results = json.loads((out / "all_results.json").read_text())
    assert results["epoch"] == 1.0 and results["global_step"] == int(steps)
    history = json.loads((out / "eval_history.json").read_text())
    every = math.ceil(int(steps) / 10)
    assert [h["step"] for h in history] == sorted({0, *range(every, int(steps), every), int(steps)})
    assert f"evaluation every {every} steps, checkpoints every {every} steps; " in plan, plan
    assert re.search(r"; \d+ CPU threads? per process \([^)]+\)$", plan), plan  # issue 43: the threads, last


def test_continued_pretraining_keeps_the_model_tokenizer_and_refuses_another(
    corpus_dir, tok_dir, tmp_path, fresh_state, capsys
):
    first, second = tmp_path / "first", tmp_path / "second"
    assert run_cli(main, _data(corpus_dir, first, "--vocab_size", "300", "--max_train_steps", "2")) == 0
    assert run_cli(main, _data(corpus_dir, second, "--model_name_or_path", str(first), "--max_train_steps", "2")) == 0
    assert _sha(second / "tokenizer.json") == _sha(first / "tokenizer.json")
    assert not (second / "tokenizer").exists(), "no tokenizer was trained"
    capsys.readouterr()
    other = tmp_path / "other"
    assert (
        run_cli(
            main,
            _data(
                corpus_dir,
                other,
                "--model_name_or_path",
                str(first),
                "--tokenizer_name",
                tok_dir,
                "--max_train_steps",
                "2",
            ),
        )
        == 2
    )
    lines = _error_lines(capsys)
    assert len(lines) == 1 and "differs from the tokenizer saved with --model_name_or_path" in lines[0]
    assert not other.exists()


def test_non_empty_output_dir_is_refused_unless_overwrite_and_its_tokenizer_is_not_reused(
    corpus_dir, tmp_path, fresh_state, capsys
):
    out = tmp_path / "run"
    assert run_cli(main, _data(corpus_dir, out, "--vocab_size", "300", "--max_train_steps", "2")) == 0
    before = _sha(out / "model.safetensors")
    capsys.readouterr()
    assert run_cli(main, _data(corpus_dir, out, "--vocab_size", "250", "--max_train_steps", "2")) == 2
    lines = _error_lines(capsys)
    assert len(lines) == 1 and "exists and is not empty" in lines[0] and "--overwrite_output_dir" in lines[0]
    assert _sha(out / "model.safetensors") == before
    assert (
        run_cli(main, _data(corpus_dir, out, "--vocab_size", "250", "--max_train_steps", "2", "--overwrite_output_dir"))
        == 0
    )
    from transformers import AutoTokenizer

    assert (
        len(AutoTokenizer.from_pretrained(out)) <= 250 < 300
        or len(AutoTokenizer.from_pretrained(out)) == json.loads((out / "config.json").read_text())["vocab_size"]
    )
    assert json.loads((out / "config.json").read_text())["vocab_size"] <= 250


def test_resume_with_the_same_global_batch_in_another_split_continues_and_other_changes_are_refused(
    corpus_dir, nodrop_config, tok_dir, tmp_path, fresh_state, capsys
):
    import torch
    from safetensors.torch import load_file

    model = ["--tokenizer_name", tok_dir, "--config_name", str(nodrop_config)]
    common = [*model, *checkpoint_args(6, 3), "--learning_rate", "2e-3"]
    full = tmp_path / "full"
    assert run_cli(main, _data(corpus_dir, full, *common)) == 0
    # resume the step-3 checkpoint as 4 blocks x 2 accumulation steps (global batch 8, as before)
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copytree(full / "checkpoints" / "step_3", resumed / "checkpoints" / "step_3")
    split = ["--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2"]
    assert run_cli(main, _data(corpus_dir, resumed, *common, *split, "--resume_from_checkpoint", "latest")) == 0
    log_full, log_resumed = (json.loads((d / "trainer_log.json").read_text()) for d in (full, resumed))
    assert [r["step"] for r in log_resumed] == [1, 2, 3, 4, 5, 6]  # the whole log: the checkpoint keeps steps 1-3
    assert log_resumed[:3] == log_full[:3]
    assert [r["train_loss"] for r in log_resumed[3:]] == pytest.approx(
        [r["train_loss"] for r in log_full[3:]], rel=1e-5
    )
    a, b = load_file(full / "model.safetensors"), load_file(resumed / "model.safetensors")
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-4, atol=1e-5)
    # another global batch is refused with one error line naming it
    capsys.readouterr()
    changed = tmp_path / "changed"
    changed.mkdir()
    shutil.copytree(full / "checkpoints" / "step_3", changed / "checkpoints" / "step_3")
    assert (
        run_cli(
            main,
            _data(
                corpus_dir, changed, *common, "--per_device_train_batch_size", "4", "--resume_from_checkpoint", "latest"
            ),
        )
        == 2
    )
    lines = _error_lines(capsys)
    assert len(lines) == 1 and "global batch 8 (1 processes x 8 per device x 1 accumulation) -> 4" in lines[0]
    assert (
        run_cli(
            main,
            _data(
                corpus_dir,
                changed,
                *model,
                "--max_train_steps",
                "9",
                "--checkpointing_steps",
                "3",
                "--resume_from_checkpoint",
                "latest",
            ),
        )
        == 2
    )
    lines = _error_lines(capsys)
    assert len(lines) == 1 and "max_train_steps 6 -> 9" in lines[0]


def _prepare(args: list[str]) -> int:
    from pretrain.prepare import main as prepare_main

    return run_cli(prepare_main, args)


def test_prepared_dataset_trains_like_the_text_files_without_tokenizing(
    corpus_dir, tok_dir, tmp_path, fresh_state, capsys
):
    from datasets import load_from_disk

    prepared = tmp_path / "prepared"
    assert _prepare(prepare_args(corpus_dir, tok_dir, prepared, "--max_shard_size", "8KB")) == 0
    manifest = json.loads((prepared / "manifest.json").read_text())
    assert manifest["objective"] == "mlm" and manifest["max_seq_length"] == 32
    assert manifest["sources"]["train"][0]["sha256"] == _sha(corpus_dir / "train.txt")
    assert manifest["sources"]["train"][0]["bytes"] == (corpus_dir / "train.txt").stat().st_size
    train = load_from_disk(str(prepared / "train"))
    assert manifest["blocks"]["train"] == len(train) and len(list((prepared / "train").glob("*.arrow"))) > 1
    assert not (prepared / ".cache").exists()
    capsys.readouterr()
    common = [
        "--config_name",
        "bert-tiny",
        "--max_train_steps",
        "4",
        "--logging_steps",
        "1",
        "--per_device_train_batch_size",
        "8",
    ]
    from_text, from_prepared = tmp_path / "text", tmp_path / "prep"
    assert run_cli(main, prepare_args(corpus_dir, tok_dir, from_text, *common)) == 0
    capsys.readouterr()
    assert run_cli(main, ["--prepared_dataset", str(prepared), "--output_dir", str(from_prepared), *common]) == 0
    err = capsys.readouterr().err
    assert "tokenising" not in err and "packing" not in err
    losses = [
        [r["train_loss"] for r in json.loads((d / "trainer_log.json").read_text())] for d in (from_text, from_prepared)
    ]
    assert losses[0] == losses[1]
    assert _sha(from_text / "model.safetensors") == _sha(from_prepared / "model.safetensors")
    card = (from_prepared / "README.md").read_text()
    assert "`train.txt`" in card and "bundled" not in card  # the model card names the prepared sources


def test_prepared_dataset_from_another_tokenizer_length_or_objective_is_refused(
    corpus_dir, tok_dir, tmp_path, fresh_state, capsys
):
    from tokenizer.wordpiece import train_wordpiece_tokenizer

    prepared = tmp_path / "prepared"
    assert _prepare(prepare_args(corpus_dir, tok_dir, prepared)) == 0
    train_wordpiece_tokenizer([corpus_dir / "valid.txt.gz"], 120, tmp_path / "other-tok", min_frequency=1)
    cases = [
        (["--tokenizer_name", str(tmp_path / "other-tok")], "prepared with another tokenizer"),
        (["--max_seq_length", "64"], "--max_seq_length 64: --prepared_dataset"),
        (["--nsp"], "prepared for the mlm objective"),
        (["--train_file", str(corpus_dir / "train.txt")], "one source of data"),
    ]
    for extra, message in cases:
        capsys.readouterr()
        out = tmp_path / f"out{len(extra)}{extra[0]}"
        assert (
            run_cli(
                main, ["--prepared_dataset", str(prepared), "--output_dir", str(out), "--max_train_steps", "1", *extra]
            )
            == 2
        )
        lines = _error_lines(capsys)
        assert len(lines) == 1 and message in lines[0], (extra, lines)
        assert not out.exists()


def test_prepared_shards_are_checked_by_size_always_and_by_hash_on_first_use_or_with_verify_prepared(
    corpus_dir, tok_dir, tmp_path, fresh_state, capsys
):
    from pretrain.prepare import VERIFIED, load_prepared

    prepared = tmp_path / "prepared"
    assert _prepare(prepare_args(corpus_dir, tok_dir, prepared)) == 0
    files = json.loads((prepared / "manifest.json").read_text())["files"]
    shard = next(rel for rel in files if rel.startswith("train/") and rel.endswith(".arrow"))
    assert files[shard] == {"sha256": _sha(prepared / shard), "bytes": (prepared / shard).stat().st_size}
    load_prepared(prepared)  # hashed on first use, recorded
    assert shard in json.loads((prepared / VERIFIED).read_text())
    data = bytearray((prepared / shard).read_bytes())
    stamp = (prepared / shard).stat()
    data[len(data) // 2 : len(data) // 2 + 64] = bytes(64)  # 64 bytes changed, same size (once: a segfault)
    (prepared / shard).write_bytes(bytes(data))
    os.utime(prepared / shard, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))  # as if the change left no trace
    load_prepared(prepared)  # size and stamp unchanged: not hashed again ...
    capsys.readouterr()
    out = tmp_path / "out"
    assert (
        run_cli(
            main,
            [
                "--prepared_dataset",
                str(prepared),
                "--verify_prepared",
                "--output_dir",
                str(out),
                "--max_train_steps",
                "1",
            ],
        )
        == 2
    )  # ... but --verify_prepared hashes every file
    lines = _error_lines(capsys)
    assert len(lines) == 1 and f"{shard} does not match its SHA-256" in lines[0], lines
    (prepared / shard).write_bytes(bytes(data) + b"\0")  # another mtime: hashed again without the flag
    assert run_cli(main, ["--prepared_dataset", str(prepared), "--output_dir", str(out), "--max_train_steps", "1"]) == 2
    lines = _error_lines(capsys)
    assert len(lines) == 1 and f"{shard} {len(data) + 1} bytes, the manifest says {len(data)}" in lines[0], lines
    assert not out.exists()


def test_validation_split_and_tokenized_fingerprints_are_deterministic(corpus_dir, tok_dir):
    from transformers import AutoTokenizer

    from pretrain.data import load_raw_datasets, tokenize_bert

    fps = []
    for copy in range(2):  # the same tokenizer saved in two folders (as two runs' output_dir/tokenizer)
        folder = Path(tok_dir).parent / f"copy{copy}"
        shutil.copytree(tok_dir, folder, dirs_exist_ok=True)
        raw = load_raw_datasets([str(corpus_dir / "train.txt")], None, validation_split_percentage=10)
        tokenized = tokenize_bert(raw, AutoTokenizer.from_pretrained(folder))
        fps.append((raw["train"]._fingerprint, raw["validation"]._fingerprint, tokenized["validation"]._fingerprint))
    assert fps[0] == fps[1]
    assert (
        len(raw["validation"]) == math.ceil(0.1 * (len(raw["train"]) + len(raw["validation"])))
        or len(raw["validation"]) > 0
    )


def test_an_explicit_epoch_count_wins_over_the_demo_steps_even_when_it_is_1():
    from pretrain.cli import parse

    demo = parse([]).training
    assert demo.max_train_steps == 300 and demo.num_train_epochs == 1.0
    one_epoch = parse(["--num_train_epochs", "1"]).training
    assert one_epoch.max_train_steps is None and one_epoch.num_train_epochs == 1.0


def test_help_shows_one_real_default_per_flag_and_report_to_takes_lists():
    text = build_parser().format_help()
    flat = re.sub(r"\s+", " ", text)
    for chunk in re.split(r" (?=--[a-z0-9_]+ )", flat):
        assert chunk.count("default") <= 1, chunk
    assert "(default: None)" not in flat
    assert re.search(
        r"--learning_rate LEARNING_RATE peak learning rate \(default: BERT-like post-LN: 2e-3 x 128 / "
        r"hidden size, at least 1e-4",
        flat,
    )
    args = build_parser().parse_args(["--report_to", "tensorboard,wandb", "--warmup_ratio", "0.1"])
    from training.trackers import log_with

    assert log_with(args.report_to) == ["tensorboard", "wandb"] and args.warmup_ratio == 0.1


def test_streaming_run_resumes_at_its_saved_position_and_wraps_epochs(
    corpus_dir, tok_dir, nodrop_config, tmp_path, fresh_state, capsys
):
    model = ["--tokenizer_name", tok_dir, "--config_name", str(nodrop_config), "--learning_rate", "2e-3"]
    unbounded = [*model, "--streaming", *checkpoint_args(None, 3)]  # no --max_train_steps
    common = [*unbounded, "--max_train_steps", "6"]
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    assert run_cli(main, _data(corpus_dir, full, *common)) == 0
    resumed.mkdir()
    shutil.copytree(full / "checkpoints" / "step_3", resumed / "checkpoints" / "step_3")
    assert run_cli(main, _data(corpus_dir, resumed, *common, "--resume_from_checkpoint", "latest")) == 0
    log_full, log_resumed = (json.loads((d / "trainer_log.json").read_text()) for d in (full, resumed))
    # steps 1-3 from the checkpoint
    assert [r["train_loss"] for r in log_resumed] == [r["train_loss"] for r in log_full]
    assert _sha(resumed / "model.safetensors") == _sha(full / "model.safetensors")
    # the number of blocks in one pass over the text, counted by the map-style pipeline
    from transformers import AutoTokenizer

    from pretrain.data import load_raw_datasets, pack_blocks, tokenize_bert

    tok = AutoTokenizer.from_pretrained(tok_dir)
    blocks = pack_blocks(
        tokenize_bert(load_raw_datasets([str(corpus_dir / "train.txt")], str(corpus_dir / "valid.txt.gz")), tok),
        32,
        tok.cls_token_id,
        tok.sep_token_id,
        document_positions=True,
    )["train"]  # the default
    # a stream longer than the data wraps around: a new epoch starts at the end of the text
    many = tmp_path / "many"
    steps = math.ceil(len(blocks) / 8) + 2
    assert run_cli(main, _data(corpus_dir, many, *unbounded, "--max_train_steps", str(steps))) == 0
    results = json.loads((many / "all_results.json").read_text())
    assert results["global_step"] == steps and results["epoch"] == 1.0
    # without --max_train_steps or a tokenizer, a stream is refused
    capsys.readouterr()
    assert run_cli(main, _data(corpus_dir, tmp_path / "nosteps", *unbounded)) == 2
    lines = _error_lines(capsys)
    assert len(lines) == 1 and "expected --max_train_steps" in lines[0]
    assert run_cli(main, _data(corpus_dir, tmp_path / "notok", "--streaming", "--max_train_steps", "2")) == 2
    lines = _error_lines(capsys)
    assert len(lines) == 1 and "--streaming: no tokenizer given" in lines[0]
