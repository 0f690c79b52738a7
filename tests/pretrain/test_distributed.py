"""Distributed types as users start them, in subprocesses on 2 CPU processes (gloo): FSDP follows DDP, evaluation
with an odd number of validation blocks neither hangs nor miscounts, 2 "machines" x 1 process on localhost equal
1 machine x 2 processes, and a run resumed in another split of the same global batch continues where it stopped.

The uninterrupted runs that several tests compare against (1 process, and DDP with 2) are made once per module and
objective (:class:`_Runs`; under pytest-xdist the module runs on one worker: ``WORKER_GROUPS`` in tests/conftest.py)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _launch import ROOT, asset_args, run_pretrain_here, write_tiny_corpus
from _launch import pretrain_command as _command
from _launch import subprocess_env as _env

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

FSDP_CPU = ROOT / "configs" / "fsdp-cpu.yaml"


def _run(cmd: list[str], timeout: int = 300) -> None:
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    return write_tiny_corpus(tmp_path_factory.mktemp("dist"))


class _Runs:
    """The uninterrupted 20-step runs of an objective, each made on first use: ``one`` (1 process x 8 blocks, every
    checkpoint kept; in the test process) and ``ddp`` (2 processes x 4 blocks)."""

    def __init__(self, shared: Path, root: Path):
        self.shared, self.root, self.made = shared, root, set()

    def one(self, objective: str) -> Path:
        out = self.root / f"one-{objective}"
        if out not in self.made:
            extra = ("--per_device_train_batch_size", "8", "--checkpoints_total_limit", "0", "--objective", objective)
            run_pretrain_here(_args(self.shared, out, *extra))
            self.made.add(out)
        return out

    def ddp(self, objective: str) -> Path:
        out = self.root / f"ddp-{objective}"
        if out not in self.made:
            _run(_command(2) + _args(self.shared, out, "--objective", objective))
            self.made.add(out)
        return out


@pytest.fixture(scope="module")
def runs(shared, tmp_path_factory) -> _Runs:
    return _Runs(shared, tmp_path_factory.mktemp("runs"))


def _args(shared: Path, out: Path, *extra: str) -> list[str]:
    schedule = "--max_train_steps 20 --logging_steps 1 --eval_steps 10 --checkpointing_steps 10 --learning_rate 2e-3"
    return asset_args(
        shared,
        out,
        *schedule.split(),
        "--num_warmup_steps",
        "2",
        "--max_eval_samples",
        "7",
        *extra,
        config=shared / "bert-nodrop",
    )


def _log(out: Path) -> list[dict]:
    return json.loads((out / "trainer_log.json").read_text())


def _weights(out: Path, objective: str) -> dict[str, torch.Tensor]:
    """The saved weights of a run (rtd: the discriminator's and, prefixed, the generator's)."""
    from safetensors.torch import load_file

    weights = load_file(out / "model.safetensors")
    if objective == "rtd":
        weights.update({f"generator.{k}": v for k, v in load_file(out / "generator" / "model.safetensors").items()})
    return weights


@pytest.mark.parametrize("objective", ["mlm", "rtd"])
def test_fsdp_follows_ddp_and_odd_validation_counts_every_block_once(shared, runs, tmp_path, objective):
    one, ddp, fsdp = runs.one(objective), runs.ddp(objective), tmp_path / "fsdp"
    _run(
        [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(FSDP_CPU), "pretrain"]
        + _args(shared, fsdp, "--objective", objective),
        timeout=600,
    )
    loss_one, loss_ddp, loss_fsdp = ([r["train_loss"] for r in _log(d)] for d in (one, ddp, fsdp))
    assert len(loss_ddp) == len(loss_fsdp) == 20
    assert loss_fsdp == pytest.approx(loss_ddp, rel=1e-5)
    # 2 processes x 4 = 1 process x 8 blocks, up to the epoch's last, partial global batch (154 blocks: 19 full
    # batches), which accelerate's even_batches fills up differently for each split
    assert loss_ddp[:19] == pytest.approx(loss_one[:19], rel=1e-5)
    # 7 validation blocks over 2 processes (4 + 3): every block counted once, as with one process
    hist = {
        name: json.loads((d / "eval_history.json").read_text())
        for name, d in zip(("one", "ddp", "fsdp"), (one, ddp, fsdp))
    }
    assert (
        [h["eval_tokens"] for h in hist["ddp"]]
        == [h["eval_tokens"] for h in hist["one"]]
        == [h["eval_tokens"] for h in hist["fsdp"]]
    )
    assert hist["fsdp"][-1]["eval_loss"] == pytest.approx(hist["ddp"][-1]["eval_loss"], rel=1e-5)
    from transformers import AutoModelForMaskedLM

    import modeling  # noqa: F401

    if objective == "mlm":  # FSDP saved a loadable model
        a = AutoModelForMaskedLM.from_pretrained(ddp).state_dict()
        b = AutoModelForMaskedLM.from_pretrained(fsdp).state_dict()
    else:  # the discriminator and generator/ files, each complete
        a, b = _weights(ddp, objective), _weights(fsdp, objective)
        assert a.keys() == b.keys() and any(k.startswith("generator.") for k in a)
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-4, atol=1e-5)


def test_two_machines_with_one_process_each_equal_one_machine_with_two(runs, shared, tmp_path):
    single, multi = runs.ddp("mlm"), tmp_path / "multi"
    port = _free_port()
    launches = []
    for rank in (0, 1):
        cmd = [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--multi_gpu",
            "--num_machines",
            "2",
            "--num_processes",
            "2",
            "--machine_rank",
            str(rank),
            "--main_process_ip",
            "127.0.0.1",
            "--main_process_port",
            str(port),
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
            "pretrain",
        ] + _args(shared, multi, "--objective", "mlm")
        launches.append(
            subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        )
    try:
        errors = [p.communicate(timeout=300)[1] for p in launches]
    finally:
        for p in launches:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in launches] == [0, 0], [e[-2000:] for e in errors]
    assert [r["train_loss"] for r in _log(multi)] == [r["train_loss"] for r in _log(single)]
    from safetensors.torch import load_file

    a, b = load_file(single / "model.safetensors"), load_file(multi / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("objective", ["mlm", "rtd"])
def test_one_process_checkpoint_resumed_by_two_processes_continues_the_run(shared, runs, tmp_path, objective):
    # 154 training blocks: 19 full global batches of 8. The last, partial batch of an epoch (step 20) is filled up
    # differently by each split (accelerate's even_batches), so the comparison stays inside the epoch: 19 steps.
    full, resumed = runs.one(objective), tmp_path / "resumed"
    resumed.mkdir()
    shutil.copytree(full / "checkpoints" / "step_10", resumed / "checkpoints" / "step_10")
    steps = ["--checkpoints_total_limit", "0", "--objective", objective, "--resume_from_checkpoint", "latest"]
    _run(_command(2) + _args(shared, resumed, *steps))  # 2 processes x 4 blocks
    log_full, log_resumed = _log(full), _log(resumed)
    assert [r["step"] for r in log_resumed] == list(range(1, 21))  # steps 1-10 from the checkpoint
    assert log_resumed[:10] == log_full[:10]
    assert [r["train_loss"] for r in log_resumed[10:19]] == pytest.approx(
        [r["train_loss"] for r in log_full[10:19]], rel=1e-5
    )


def test_finetune_under_fsdp_saves_the_full_model_like_ddp(shared, tmp_path):
    """finetune.glue under FSDP saves the full model, equal to the DDP run's. (It saves through
    accelerator.get_state_dict; with FSDP2 and transformers 5 save_pretrained also gathers the DTensors itself, so
    this test passes without that call too.)"""
    import random

    from transformers import AutoTokenizer

    import modeling

    model_dir = tmp_path / "bert"
    tok = AutoTokenizer.from_pretrained(shared / "wordpiece")
    config = modeling.SesameBertConfig.from_pretrained(shared / "bert-nodrop", vocab_size=len(tok))
    torch.manual_seed(0)
    modeling.SesameBertForMaskedLM(config).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    rng = random.Random(0)
    words = (shared / "train.txt").read_text().split()
    for split, n in (("train", 64), ("dev", 9)):
        rows = [(" ".join(rng.choice(words) for _ in range(8)), rng.choice(["good", "bad"])) for _ in range(n)]
        (tmp_path / f"{split}.tsv").write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in rows))
    outs = {}
    for name, launch in (
        ("ddp", ["--config_file", str(ROOT / "configs" / "cpu-2proc.yaml")]),
        ("fsdp", ["--config_file", str(FSDP_CPU)]),
    ):
        outs[name] = tmp_path / name
        _run(
            [
                sys.executable,
                "-m",
                "accelerate.commands.launch",
                *launch,
                "-m",
                "finetune.glue",
                "--model_name_or_path",
                str(model_dir),
                "--train_file",
                str(tmp_path / "train.tsv"),
                "--validation_file",
                str(tmp_path / "dev.tsv"),
                "--max_seq_length",
                "32",
                "--per_device_train_batch_size",
                "4",
                "--max_train_steps",
                "6",
                "--learning_rate",
                "1e-3",
                "--output_dir",
                str(outs[name]),
            ],
            timeout=600,
        )
    from transformers import AutoModelForSequenceClassification

    a = AutoModelForSequenceClassification.from_pretrained(outs["ddp"]).state_dict()
    b = AutoModelForSequenceClassification.from_pretrained(outs["fsdp"]).state_dict()
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-4, atol=1e-5)
    ra, rb = (json.loads((d / "all_results.json").read_text()) for d in (outs["ddp"], outs["fsdp"]))
    assert rb["eval_accuracy"] == ra["eval_accuracy"]
