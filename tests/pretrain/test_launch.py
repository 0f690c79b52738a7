"""``pretrain`` as users start it, in subprocesses: SIGKILL + ``--resume_from_checkpoint latest`` ends bitwise
equal to an uninterrupted run (BERT-like and ELMo-style; 1 and 2 processes), and 2 CPU processes
(``accelerate launch --config_file configs/cpu-2proc.yaml pretrain``) follow the 1-process run with the same
global batch, with identical parameters on both ranks."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch
from _launch import asset_args, reference_args, run_pretrain_here, start_pretrain, write_tiny_corpus
from _launch import run_pretrain as _run

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]


def _run_and_kill(processes: int, args: list[str], out: Path, kill_after_checkpoint: int, timeout: int = 300) -> None:
    """Start the run and SIGKILL its whole process group once ``step_<kill_after_checkpoint>`` exists."""
    proc = start_pretrain(processes, args)
    target = out / "checkpoints" / f"step_{kill_after_checkpoint}"
    deadline = time.time() + timeout
    try:
        while not target.exists():
            assert proc.poll() is None, f"the run ended before it could be killed: {proc.stderr.read()[-2000:]}"
            assert time.time() < deadline
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL
    assert not (out / "all_results.json").exists(), "killed before the end"


def _weights(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(out / "model.safetensors")


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """Tiny corpus, a WordPiece and an ELMo tokenizer, and dropout-free / tiny model configs."""
    import modeling
    from tokenizer.elmo_training import train_elmo_tokenizer

    root = write_tiny_corpus(tmp_path_factory.mktemp("launch"))
    train_elmo_tokenizer([root / "train.txt"], 40, root / "elmo-tok")
    modeling.get_preset_config(
        "elmo-small", cnn_filters=[[1, 8], [2, 8], [3, 16]], projection_dim=16, cell_size=32, num_layers=2, dropout=0.1
    ).save_pretrained(root / "elmo-tiny")
    return root


def _bert_args(shared: Path, out: Path, *extra: str) -> list[str]:
    schedule = "--max_train_steps 12 --checkpointing_steps 3 --checkpoints_total_limit 0 --logging_steps 1"
    return asset_args(
        shared, out, *schedule.split(), *"--learning_rate 2e-3 --num_warmup_steps 2 --whole_word_mask".split(), *extra
    )


@pytest.mark.parametrize("processes", [1, 2])
def test_bert_resume_after_sigkill_is_bitwise_equal(assets, reference_runs, tmp_path, processes):
    """Against the session's uninterrupted ``reference_runs`` (40 steps, a checkpoint every 4)."""
    full, killed = reference_runs.full(processes), tmp_path / "killed"
    _run_and_kill(processes, reference_args(assets, killed), killed, kill_after_checkpoint=8)
    _run(processes, reference_args(assets, killed, "--resume_from_checkpoint", "latest"))
    a, b = _weights(full), _weights(killed)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    ra, rb = (json.loads((d / "all_results.json").read_text()) for d in (full, killed))
    assert ra["train_loss"] == rb["train_loss"] and ra["perplexity"] == rb["perplexity"]
    assert rb["replica_max_abs_diff"] == 0.0


def test_elmo_resume_after_sigkill_is_bitwise_equal(shared, tmp_path):
    def args(out, *extra):
        return [
            "--model_type",
            "elmo",
            "--train_file",
            str(shared / "train.txt"),
            "--validation_file",
            str(shared / "valid.txt"),
            "--tokenizer_name",
            str(shared / "elmo-tok"),
            "--config_name",
            str(shared / "elmo-tiny"),
            "--max_seq_length",
            "16",
            "--per_device_train_batch_size",
            "4",
            "--max_train_steps",
            "10",
            "--checkpointing_steps",
            "2",
            "--checkpoints_total_limit",
            "0",
            "--output_dir",
            str(out),
            *extra,
        ]

    full, killed = tmp_path / "full", tmp_path / "killed"
    _run(1, args(full))
    _run_and_kill(1, args(killed), killed, kill_after_checkpoint=4)
    _run(1, args(killed, "--resume_from_checkpoint", "latest"))
    a, b = _weights(full), _weights(killed)
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_two_processes_with_accumulation_follow_one_process_with_the_same_global_batch(shared, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    common = [
        "--config_name",
        str(shared / "bert-nodrop"),
        "--max_train_steps",
        "8",
        "--checkpointing_steps",
        "100",
        "--lr_scheduler_type",
        "linear",
    ]
    run_pretrain_here(_bert_args(shared, one, "--per_device_train_batch_size", "8", *common))  # in this process
    # same global batch of 8 blocks: 2 processes x 2 blocks x 2 accumulation steps
    _run(
        2, _bert_args(shared, two, "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "2", *common)
    )
    log1, log2 = (json.loads((d / "trainer_log.json").read_text()) for d in (one, two))
    assert [r["step"] for r in log1] == [r["step"] for r in log2] == list(range(1, 9))
    loss1, loss2 = [r["train_loss"] for r in log1], [r["train_loss"] for r in log2]
    assert loss2 == pytest.approx(loss1, rel=1e-5, abs=1e-6)
    assert [r["learning_rate"] for r in log2] == pytest.approx([r["learning_rate"] for r in log1], rel=1e-12)
    # the schedule took exactly one step per optimizer step: linear warmup 2, linear decay to 0 at step 8
    assert [r["learning_rate"] for r in log2] == pytest.approx(
        [2e-3 * min(s / 2, (8 - s) / 6) for s in range(1, 9)], abs=1e-12
    )
    scheduler_state = json.loads((two / "checkpoints" / "step_8" / "trainer_state.json").read_text())["lr_scheduler"]
    assert scheduler_state["last_epoch"] == 8 and scheduler_state["_step_count"] == 9
    r1, r2 = (json.loads((d / "all_results.json").read_text()) for d in (one, two))
    assert r2["replica_max_abs_diff"] == 0.0, "parameters identical on both ranks"
    assert r2["perplexity"] == pytest.approx(r1["perplexity"], rel=1e-4)
    a, b = _weights(one), _weights(two)
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-4, atol=1e-5)
