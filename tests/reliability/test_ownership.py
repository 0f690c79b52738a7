"""A run owns its output folder (issue 23): a run id in the folder and in every checkpoint, rotation / ``latest`` /
resume touching only that run's checkpoints, ``--overwrite_output_dir`` deleting the old run's checkpoints first,
glue and squad refusing the folder of another run, a lock against a second concurrent run (a dead holder's lock
taken over with a warning), and the temporary folders of killed runs removed at the next start."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from _launch import asset_args as _pre

from core.errors import run_cli

ROOT = Path(__file__).resolve().parents[2]


def _reset():
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def _steps(out: Path) -> list[int]:
    return sorted(int(p.name.split("_")[1]) for p in (out / "checkpoints").glob("step_*"))


def _error_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]


def test_overwrite_output_dir_deletes_the_old_runs_checkpoints_so_the_new_ones_survive(assets, tmp_path, fresh_state):
    from pretrain.cli import main

    out = tmp_path / "out"
    assert run_cli(main, _pre(assets, out, "--max_train_steps", "6", "--checkpointing_steps", "2")) == 0
    assert _steps(out) == [4, 6]  # the last 2 (--checkpoints_total_limit 2)
    _reset()
    assert (
        run_cli(
            main, _pre(assets, out, "--max_train_steps", "2", "--checkpointing_steps", "1", "--overwrite_output_dir")
        )
        == 0
    )
    assert _steps(out) == [1, 2], "the new run's checkpoints, not the old run's higher steps"
    from training import checkpoint_files as ckpt
    from training.ownership import read_run_id

    run_id = read_run_id(out)
    assert run_id and all(ckpt.read_state(out / "checkpoints" / f"step_{s}")["run_id"] == run_id for s in (1, 2))
    assert ckpt.resolve_checkpoint("latest", out / "checkpoints", run_id).name == "step_2"
    assert not (out / ".sesame-run.lock").exists(), "the lock is released at the end"


def _glue(assets: Path, tmp: Path, out: Path, *extra: str) -> list[str]:
    rows = [("a fine film", "1"), ("a dull film", "0"), ("great acting", "1"), ("boring plot", "0")]
    data = tmp / "sst.csv"
    data.write_text("sentence,label\n" + "".join(f"{s},{y}\n" for s, y in rows))
    return [
        "--model_name_or_path",
        str(assets / "tiny-model"),
        "--train_file",
        str(data),
        "--validation_file",
        str(data),
        "--max_seq_length",
        "32",
        "--per_device_train_batch_size",
        "2",
        "--output_dir",
        str(out),
        *extra,
    ]


def test_glue_refuses_the_folder_of_another_run_unless_overwrite_output_dir(assets, tmp_path, capsys, fresh_state):
    from finetune.glue import main

    out = tmp_path / "out"
    assert run_cli(main, _glue(assets, tmp_path, out, "--max_train_steps", "4", "--checkpointing_steps", "2")) == 0
    assert _steps(out) == [2, 4]
    weights = (out / "model.safetensors").read_bytes()
    capsys.readouterr()
    _reset()
    assert run_cli(main, _glue(assets, tmp_path, out, "--max_train_steps", "1")) == 2
    lines = _error_lines(capsys)
    assert len(lines) == 1 and "exists and is not empty" in lines[0] and "--overwrite_output_dir" in lines[0], lines
    assert (out / "model.safetensors").read_bytes() == weights and _steps(out) == [2, 4]
    _reset()
    assert run_cli(main, _glue(assets, tmp_path, out, "--max_train_steps", "1", "--overwrite_output_dir")) == 0
    assert _steps(out) == [1], "the earlier run's checkpoints were deleted first"


def test_squad_refuses_the_folder_of_another_run(assets, tmp_path, capsys, fresh_state):
    from finetune.squad import main

    doc = {
        "version": "1.1",
        "data": [
            {
                "title": "t",
                "paragraphs": [
                    {
                        "context": "the senate adjourned after a debate.",
                        "qas": [
                            {
                                "id": "q1",
                                "question": "who adjourned?",
                                "answers": [{"text": "senate", "answer_start": 4}],
                            }
                        ],
                    }
                ],
            }
        ],
    }
    data = tmp_path / "train.json"
    data.write_text(json.dumps(doc))
    out = tmp_path / "out"
    argv = ["--model_name_or_path", str(assets / "tiny-model"), "--train_file", str(data), "--output_dir", str(out)]
    argv += "--max_seq_length 48 --max_query_length 16 --doc_stride 16 --per_device_train_batch_size 2".split()
    argv += ["--max_train_steps", "1", "--do_train"]
    assert run_cli(main, argv) == 0
    capsys.readouterr()
    _reset()
    assert run_cli(main, argv) == 2
    lines = _error_lines(capsys)
    assert len(lines) == 1 and "exists and is not empty" in lines[0]
    _reset()
    assert run_cli(main, [*argv, "--overwrite_output_dir"]) == 0


def test_latest_resume_and_rotation_leave_another_runs_checkpoints_alone(toy_run, tmp_path):
    from training import checkpoint_files as ckpt

    toy_run(tmp_path / "b", 8, ckpt_steps=8, trainer_kwargs={"run_id": "run-b"})
    a = tmp_path / "a"
    (a / "checkpoints").mkdir(parents=True)
    shutil.copytree(tmp_path / "b" / "checkpoints" / "step_8", a / "checkpoints" / "step_8")  # another run's, higher
    toy_run(a, 6, ckpt_steps=2, checkpoints_total_limit=1, trainer_kwargs={"run_id": "run-a"})
    assert _steps(a) == [6, 8], "run a keeps its own last checkpoint; run b's is left alone"
    assert ckpt.read_state(a / "checkpoints" / "step_6")["run_id"] == "run-a"
    trainer, result = toy_run(
        a, 6, ckpt_steps=2, resume="latest", checkpoints_total_limit=1, trainer_kwargs={"run_id": "run-a"}
    )
    assert trainer.last_checkpoint.endswith("step_6") and result["global_step"] == 6  # not run b's step_8
    assert _steps(a) == [6, 8]


_HOLD = """
import sys, time
from training.ownership import claim_output_dir
claim_output_dir(sys.argv[1], overwrite=False, resuming=False)
print("locked", flush=True)
time.sleep(600)
"""


def test_a_second_run_is_refused_while_another_holds_the_folder_and_a_dead_runs_lock_is_taken_over(
    assets, tmp_path, capsys, caplog, fresh_state
):
    from pretrain.cli import main

    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(out)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert run_cli(main, _pre(assets, out, "--max_train_steps", "1")) == 2
        lines = _error_lines(capsys)
        assert len(lines) == 1 and "another run is writing to it" in lines[0] and f"process {holder.pid}" in lines[0]
        assert not (out / "model.safetensors").exists() and not (out / "checkpoints").exists()
    finally:
        holder.kill()  # SIGKILL: the lock file stays behind, naming a dead process
        holder.wait()
    assert (out / ".sesame-run.lock").exists()
    _reset()
    with caplog.at_level(logging.WARNING):
        assert run_cli(main, _pre(assets, out, "--max_train_steps", "1")) == 0
    assert any(
        "taking over the lock" in r.getMessage() and "no longer running" in r.getMessage() for r in caplog.records
    )
    assert (out / "model.safetensors").exists()


def test_temporary_folders_of_killed_runs_are_removed_at_the_next_start(assets, tmp_path, fresh_state):
    from pretrain.cli import main

    out = tmp_path / "out"
    assert run_cli(main, _pre(assets, out, "--max_train_steps", "2", "--checkpointing_steps", "1")) == 0
    killed = [
        out / "checkpoints" / ".tmp-step_3",
        tmp_path / ".out.tmp-legacy1234",
        out / ".tokenizer.tmp-x",
        out / ".hub-staging",
    ]
    for folder in killed:  # what a SIGKILL during a checkpoint, the final save, a tokenizer save, a push leaves
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"\0" * 1000)
    _reset()
    assert (
        run_cli(
            main,
            _pre(
                assets,
                out,
                "--max_train_steps",
                "2",
                "--checkpointing_steps",
                "1",
                "--resume_from_checkpoint",
                "latest",
            ),
        )
        == 0
    )
    assert [p for p in killed if p.exists()] == []


def test_atomic_writes_remove_the_temporary_folders_of_dead_processes_only(tmp_path):
    from core.files import atomic_output_dir

    host = socket.gethostname()
    dead = tmp_path / f".tok.tmp-{host}-{2**22 + 12345}-abc"  # beyond the default pid_max: no such process
    alive = tmp_path / f".tok.tmp-{host}-{os.getpid()}-def"  # a concurrent write of a live process
    for folder in (dead, alive):
        folder.mkdir()
    with atomic_output_dir(tmp_path / "tok") as tmp:
        (tmp / "vocab.txt").write_text("[PAD]\n")
    assert not dead.exists() and alive.exists() and (tmp_path / "tok" / "vocab.txt").is_file()


def test_baselines_children_replace_their_cell_with_overwrite_output_dir():
    from finetune.baselines import BaselinesArguments, glue_command

    args = BaselinesArguments(glue_dir="glue", tasks=["sst2"], backbones=["cbow"], output_dir="table")
    cmd = glue_command(
        "sst2",
        "m",
        Path("table/runs/sst2-cbow"),
        {
            "learning_rate": 1e-3,
            "per_device_train_batch_size": 8,
            "weight_decay": 0.0,
            "num_warmup_steps": 0,
            "epochs": {"default": 1},
        },
        args,
        [],
    )
    assert "--overwrite_output_dir" in cmd


@pytest.mark.parametrize("resuming", [False, True])
def test_the_run_id_is_new_for_a_new_run_and_kept_when_resuming(tmp_path, resuming):
    from training.ownership import claim_output_dir, read_run_id

    out = tmp_path / "out"
    first = claim_output_dir(out, overwrite=False, resuming=False)
    (out / "checkpoints").mkdir()
    first.release()
    second = claim_output_dir(out, overwrite=not resuming, resuming=resuming)
    assert (second.run_id == first.run_id) is resuming and read_run_id(out) == second.run_id
    assert (out / "checkpoints").exists() is resuming  # --overwrite_output_dir deleted the old run's checkpoints
    second.release()
