"""Preemption, as a scheduler does it: SIGTERM to a running ``pretrain`` at a random step -> the step finishes,
a checkpoint is written, the process exits 143 saying how to resume; the resumed run ends bitwise equal to an
uninterrupted one. With 2 processes (``accelerate launch``, torchrun forwards the signal) every rank stops at
the same step, the checkpoint is consistent and the resume ends bitwise equal too. A second signal exits at once.
The uninterrupted runs are the session's ``reference_runs``."""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path

import pytest
import torch
from _launch import reference_args as _args
from _launch import run_pretrain as _run
from _launch import start_pretrain

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]


def _start_and_signal(processes: int, args: list[str], out: Path, sig: int, delay: float, twice: bool = False):
    """Start the run; once ``step_4`` exists wait ``delay`` s and send ``sig`` (to the process group for the
    launcher, as a scheduler / terminal does; to the process itself with 1 process). Return (rc, stderr)."""
    proc = start_pretrain(processes, args, text=True)
    first = out / "checkpoints" / "step_4"
    deadline = time.time() + 300
    try:
        while not first.exists():
            assert proc.poll() is None, f"the run ended early: {proc.stderr.read()[-2000:]}"
            assert time.time() < deadline
            time.sleep(0.01)
        time.sleep(delay)
        send = (lambda s: os.killpg(proc.pid, s)) if processes > 1 else proc.send_signal
        send(sig)
        if twice:
            time.sleep(3.0)  # past the window in which a repeat counts as the launcher forwarding it
            send(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, err


def _steps(out: Path) -> list[int]:
    return sorted(int(p.name.split("_")[1]) for p in (out / "checkpoints").glob("step_*"))


def test_sigterm_at_a_random_step_then_resume_is_bitwise_equal(assets, reference_runs, tmp_path):
    full, stopped = reference_runs.full(1), tmp_path / "stopped"
    delay = random.Random().uniform(0.0, 0.5)
    rc, err = _start_and_signal(1, _args(assets, stopped), stopped, signal.SIGTERM, delay)
    assert rc == 143, err[-2000:]
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "--resume_from_checkpoint latest" in lines[0], err[-2000:]
    assert not (stopped / "all_results.json").exists()
    last = _steps(stopped)[-1]
    assert 4 <= last < 40 and f"step_{last}" in lines[0]
    state = json.loads((stopped / "checkpoints" / f"step_{last}" / "trainer_state.json").read_text())
    assert state["global_step"] == last
    _run(1, _args(assets, stopped, "--resume_from_checkpoint", "latest"))
    from safetensors.torch import load_file

    a, b = load_file(full / "model.safetensors"), load_file(stopped / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    ra, rb = (json.loads((d / "all_results.json").read_text()) for d in (full, stopped))
    assert ra["train_loss"] == rb["train_loss"] and ra["perplexity"] == rb["perplexity"]


def test_sigint_gives_130(assets, tmp_path):
    out = tmp_path / "int"
    rc, err = _start_and_signal(1, _args(assets, out), out, signal.SIGINT, 0.0)
    assert rc == 130, err[-2000:]
    assert "resume with --resume_from_checkpoint latest" in err


def test_two_processes_stop_at_the_same_step_with_a_consistent_checkpoint(assets, reference_runs, tmp_path):
    out = tmp_path / "two"
    rc, err = _start_and_signal(2, _args(assets, out), out, signal.SIGTERM, random.Random().uniform(0.0, 0.3))
    assert rc != 0, err[-2000:]
    assert "resume with --resume_from_checkpoint latest" in err, err[-3000:]
    last = _steps(out)[-1]
    ckpt = out / "checkpoints" / f"step_{last}"
    from training.checkpoint_files import read_state, verify_checkpoint

    assert read_state(ckpt)["global_step"] == last and read_state(ckpt)["num_processes"] == 2
    assert (ckpt / "random_states_0.pkl").is_file() and (ckpt / "random_states_1.pkl").is_file()
    assert verify_checkpoint(ckpt) is None
    assert not list((out / "checkpoints").glob(".tmp-*"))
    _run(2, _args(assets, out, "--resume_from_checkpoint", "latest"))  # the same run (its schedule is 40 steps long)
    results = json.loads((out / "all_results.json").read_text())
    assert results["global_step"] == 40 and results["replica_max_abs_diff"] == 0.0
    full = reference_runs.full(2)  # and it ends where the uninterrupted run ends, bitwise
    assert (out / "model.safetensors").read_bytes() == (full / "model.safetensors").read_bytes()
    assert results["train_loss"] == json.loads((full / "all_results.json").read_text())["train_loss"]
