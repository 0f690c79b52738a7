"""``pretrain --push_to_hub`` against the project's Hub-compatible test server (tests/hub/hub_server.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _launch import QUIET, corpus_args, hub_env

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "hf_alice_write_0123456789"  # the hub_url fixture's (conftest)

pytestmark = pytest.mark.slow


def test_pretrain_pushes_the_model_without_checkpoints(hub_url, corpus_dir, tmp_path):
    env = hub_env(hub_url, tmp_path / "hf", **QUIET)
    out = tmp_path / "run"
    push = ["--push_to_hub", "--hub_model_id", "alice/tiny-mlm", "--hub_token", TOKEN]
    cmd = [
        sys.executable,
        "-m",
        "pretrain",
        *corpus_args(corpus_dir, out, *"--vocab_size 300 --max_train_steps 3".split(), *push),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    check = (
        "import json; from huggingface_hub import HfApi; "
        f"print(json.dumps(sorted(HfApi(token='{TOKEN}').list_repo_files('alice/tiny-mlm'))))"
    )
    listed = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr[-2000:]
    files = json.loads(listed.stdout.strip().splitlines()[-1])
    assert {"config.json", "model.safetensors", "tokenizer.json", "all_results.json", "README.md"} <= set(files)
    assert not [f for f in files if f.startswith("checkpoints/") or f.endswith((".pkl", ".bin"))]
