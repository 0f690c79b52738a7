"""What a resume checks (issue 23): the training data by content (not only its block count), the optimizer settings
(a changed learning rate is refused, naming it; a changed --max_grad_norm is warned about), a checkpoint without its
manifest or RNG state (refused unless --ignore_checkpoint_integrity), and a pickle that weights_only blocks (one
line, nothing executed)."""

from __future__ import annotations

import json
import logging
import pickle
import shutil
from pathlib import Path

import pytest
from _launch import asset_args

from core.errors import run_cli


def _reset():
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def _pre(train: Path, assets: Path, out: Path, *extra: str) -> list[str]:
    schedule = "--max_train_steps 4 --checkpointing_steps 2 --checkpoints_total_limit 0 --learning_rate 2e-3"
    return asset_args(assets, out, *schedule.split(), *extra, train=train)


@pytest.fixture
def finished(assets, tmp_path, fresh_state):
    """``(train file, output folder)`` of a finished 4-step run with checkpoints at steps 2 and 4."""
    from pretrain.cli import main

    train = tmp_path / "train.txt"
    shutil.copy(assets / "train.txt", train)
    out = tmp_path / "out"
    assert run_cli(main, _pre(train, assets, out)) == 0
    _reset()
    return train, out


def _error_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]


def test_resume_after_the_training_text_changed_with_the_same_block_count_is_refused(assets, finished, capsys):
    from pretrain.cli import main

    train, out = finished
    docs = train.read_text().split("\n\n")
    train.write_text("\n\n".join(reversed(docs)))  # the same tokens in another order: the same number of blocks
    capsys.readouterr()
    assert run_cli(main, _pre(train, assets, out, "--resume_from_checkpoint", "latest")) == 2
    lines = _error_lines(capsys)
    assert len(lines) == 1 and "the training data changed since the checkpoint" in lines[0], lines
    assert "train.txt" in lines[0] and "SHA-256" in lines[0]


def test_resume_with_another_learning_rate_is_refused_naming_it_and_another_max_grad_norm_is_warned(
    assets, finished, capsys, caplog
):
    from pretrain.cli import main

    train, out = finished
    capsys.readouterr()
    assert run_cli(main, _pre(train, assets, out, "--learning_rate", "1e-3", "--resume_from_checkpoint", "latest")) == 2
    lines = _error_lines(capsys)
    assert len(lines) == 1 and "learning_rate 0.002 -> 0.001" in lines[0], lines
    _reset()
    with caplog.at_level(logging.WARNING):
        assert (
            run_cli(main, _pre(train, assets, out, "--max_grad_norm", "0.5", "--resume_from_checkpoint", "latest")) == 0
        )
    assert any(
        "--max_grad_norm 0.5 differs from the checkpoint's 1.0: the run continues with 0.5" in r.getMessage()
        for r in caplog.records
    )


@pytest.mark.parametrize("damage", ["manifest", "rng", "both"])
def test_a_checkpoint_without_manifest_or_rng_state_is_refused_unless_ignore_checkpoint_integrity(
    assets, finished, capsys, caplog, damage
):
    from pretrain.cli import main

    train, out = finished
    for step in (2, 4):
        ckpt = out / "checkpoints" / f"step_{step}"
        state = json.loads((ckpt / "trainer_state.json").read_text())
        if damage in ("manifest", "both"):
            del state["files"]
        if damage in ("rng", "both"):
            (ckpt / "random_states_0.pkl").unlink()
            state.get("files", {}).pop("random_states_0.pkl", None)
        (ckpt / "trainer_state.json").write_text(json.dumps(state))
    capsys.readouterr()
    assert run_cli(main, _pre(train, assets, out, "--resume_from_checkpoint", "latest")) == 2
    lines = _error_lines(capsys)
    assert len(lines) == 1 and "--ignore_checkpoint_integrity" in lines[0], lines
    assert ("random_states_0.pkl" if damage != "manifest" else "no file manifest") in lines[0]
    _reset()
    with caplog.at_level(logging.WARNING):
        assert (
            run_cli(
                main, _pre(train, assets, out, "--resume_from_checkpoint", "latest", "--ignore_checkpoint_integrity")
            )
            == 0
        )
    assert any("will not continue bitwise" in r.getMessage() for r in caplog.records)


class _Payload:
    """Unpickling this runs ``marker.touch()``-like code: what weights_only must block."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.mark.parametrize("name", ["optimizer.bin", "random_states_0.pkl"])
def test_a_checkpoint_whose_pickle_is_blocked_is_refused_with_one_line_and_nothing_runs(
    assets, finished, tmp_path, capsys, name
):
    from pretrain.cli import main
    from training.checkpoint_files import file_manifest

    train, out = finished
    marker = tmp_path / "payload-ran"
    for step in (2, 4):  # an attacker who rewrote the file and its manifest entry
        ckpt = out / "checkpoints" / f"step_{step}"
        (ckpt / name).write_bytes(pickle.dumps({"state": _Payload(marker)}))
        state = json.loads((ckpt / "trainer_state.json").read_text())
        state["files"] = file_manifest(ckpt)
        (ckpt / "trainer_state.json").write_text(json.dumps(state))
    capsys.readouterr()
    assert run_cli(main, _pre(train, assets, out, "--resume_from_checkpoint", "latest")) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "weights_only" in lines[0] and "Traceback" not in err, err[-2000:]
    assert not marker.exists()
