"""Secrets never leave the process: a ``--hub_token`` is in no file a run writes (output folder, tensorboard and
wandb offline files, the pushed hub repo), in no log line, and in no child's command line."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from _launch import ROOT, pretrain_command
from reliability.conftest import hub_client_env

#: A token the test hub accepts for alice (written into every place a leak would show).
TOKEN = "hf_alice_write_planted_7f3a91c2"


def _files_holding(root: Path, needle: bytes) -> list[str]:
    return sorted(
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file() and not p.is_symlink() and needle in p.read_bytes()
    )


def test_split_secrets_removes_every_spelling_and_returns_the_values():
    from core.arguments import split_secrets

    argv = ["--a", "1", "--hub_token", "t1", "--b", "--hub-token=t2", "--hub_token=t3", "x"]
    kept, found = split_secrets(argv)
    assert kept == ["--a", "1", "--b", "x"] and found == {"hub_token": "t3"}
    assert split_secrets(["--hub_token", "t1"]) == ([], {"hub_token": "t1"})


def test_parsing_removes_the_token_from_sys_argv_before_any_tracker_starts(monkeypatch):
    from core.arguments import parse_arguments
    from training.hub import HubArguments

    monkeypatch.setattr(sys, "argv", ["pretrain", "--hub_token", TOKEN, "--hub_model_id", "alice/x"])
    (hub,) = parse_arguments(
        [HubArguments], ["--hub_token", TOKEN, "--hub_model_id", "alice/x"], prog="p", description="d"
    )
    assert hub.hub_token == TOKEN and TOKEN not in " ".join(sys.argv) and "alice/x" in sys.argv


def test_baselines_hand_the_token_to_children_through_the_environment_only(tmp_path, monkeypatch, caplog):
    import finetune.baselines as baselines
    from finetune import cells

    spec = importlib.util.spec_from_file_location("_finetune_conftest", ROOT / "tests" / "finetune" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    glue = module.make_glue_dir(tmp_path / "glue")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "sesame-bert"}))
    calls = []

    def fake_run(cmd, env, log, cell):
        calls.append((cmd, env or {}))
        return 1, "error: stopped by the test"

    monkeypatch.setattr(cells, "run_command", fake_run)
    out = tmp_path / "table"
    caplog.set_level("INFO")
    assert (
        baselines.main(
            [
                "--glue_dir",
                str(glue),
                "--tasks",
                "sst2",
                "--backbones",
                str(model),
                "--output_dir",
                str(out),
                "--",
                "--max_train_samples",
                "8",
                "--hub_token",
                TOKEN,
            ]
        )
        == 1  # the (stopped) cell failed
    )
    ((cmd, env),) = calls
    assert TOKEN not in " ".join(cmd) and "--max_train_samples" in cmd and env["HF_TOKEN"] == TOKEN
    assert _files_holding(out, TOKEN.encode()) == [] and TOKEN not in caplog.text


@pytest.mark.slow
def test_planted_token_is_in_no_file_of_the_run_the_trackers_or_the_hub_repo(tmp_path, hub_server):
    assets = tmp_path / "assets"
    assets.mkdir()
    (assets / "train.txt").write_text(
        "\n\n".join(f"the whale rose from the sea number {i}.\nsailors shouted." for i in range(60)) + "\n"
    )
    server = hub_server({TOKEN: ("alice", "write")})
    out = tmp_path / "run"
    cmd = [*pretrain_command(1), "--train_file", str(assets / "train.txt"), "--output_dir", str(out)]
    cmd += "--config_name bert-tiny --vocab_size 200 --max_seq_length 32 --per_device_train_batch_size 8".split()
    cmd += "--max_train_steps 3 --checkpointing_steps 2 --report_to all".split()
    cmd += ["--push_to_hub", "--hub_model_id", "alice/planted", "--hub_token", TOKEN]
    proc = subprocess.run(
        cmd, cwd=ROOT, env=hub_client_env(server.url, tmp_path / "hf"), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    repo = server.state.repos["alice/planted"]
    assert list(out.glob("wandb/offline-run-*/run-*.wandb")) and list(out.glob("runs/**/events.out.tfevents.*"))
    assert (out / "checkpoints").is_dir()
    assert TOKEN not in proc.stdout + proc.stderr
    assert _files_holding(tmp_path, TOKEN.encode()) == []  # output folder, wandb, tensorboard, hub cache
    pushed = {path for commit in repo.commits.values() for path in commit.files}
    assert {"model.safetensors", "README.md", "all_results.json"} <= pushed
    for commit in repo.commits.values():
        assert TOKEN not in commit.title + commit.description
        assert not [path for path, blob in commit.files.items() if TOKEN.encode() in blob.data]
