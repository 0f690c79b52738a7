"""The hub unreachable at the final push: the model stays saved locally, the run ends with one ``error:`` line (exit
2) that gives the command to push it later, and that command pushes it."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from _launch import ROOT, pretrain_command
from reliability.conftest import hub_client_env

TOKEN = "hf_alice_write_push_later_0123"

pytestmark = pytest.mark.slow


def test_hub_unreachable_at_the_final_push_keeps_the_model_and_says_how_to_push_it(assets, tmp_path, hub_server):
    server = hub_server({TOKEN: ("alice", "write")})
    out = tmp_path / "run"
    cmd = [*pretrain_command(1), "--train_file", str(assets / "train.txt"), "--output_dir", str(out)]
    cmd += ["--tokenizer_name", str(assets / "wordpiece"), "--config_name", "bert-tiny", "--max_seq_length", "32"]
    cmd += "--per_device_train_batch_size 4 --max_train_steps 100 --checkpointing_steps 2".split()
    cmd += ["--push_to_hub", "--hub_model_id", "alice/later"]
    env = {**hub_client_env(server.url, tmp_path / "hf"), "HF_TOKEN": TOKEN}
    run = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while not (out / "checkpoints" / "step_2").exists():  # the hub was reached at the start; now it goes away
            assert run.poll() is None and time.time() < deadline
            time.sleep(0.01)
        server.stop()  # ~0.1 s; the run's 98 more steps and 49 checkpoints take seconds
        _, err = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert run.returncode == 2 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert f"the model is saved in {out}" in lines[0] and "python -m training.hub push" in lines[0], lines[0]
    assert (out / "model.safetensors").is_file() and (out / "README.md").is_file()
    later = lines[0].split("`")[1]  # the command in the message
    assert later.startswith("python -m training.hub push"), later
    server = hub_server({TOKEN: ("alice", "write")})
    push = subprocess.run(
        [sys.executable, *later.split()[1:]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**hub_client_env(server.url, tmp_path / "hf"), "HF_TOKEN": TOKEN},
    )
    assert push.returncode == 0, push.stderr[-2000:]
    files = set(server.state.repos["alice/later"].commits[server.state.repos["alice/later"].branches["main"]].files)
    assert {"model.safetensors", "README.md", "config.json"} <= files
