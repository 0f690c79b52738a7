"""Checkpoint integrity (manifest of sizes + SHA-256, ``latest`` falls back past damaged checkpoints), no
pickle on resume, a failed save (disk full) that leaves the previous checkpoints intact, unwritable output
folders refused before training, and the SIGTERM/SIGINT handler's logic."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import signal

import pytest
import torch

from core.errors import InputError
from training import checkpoint_files as ckpt


def _truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def _flip_byte(path):
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0xFF]))


DAMAGE = {
    "truncated weights": ("model.safetensors", _truncate, "model.safetensors has"),
    "truncated optimizer": ("optimizer.bin", _truncate, "optimizer.bin has"),
    "flipped byte in weights": ("model.safetensors", _flip_byte, "SHA-256"),
    "deleted weights": ("model.safetensors", os.remove, "model.safetensors missing"),
    "deleted RNG states": ("random_states_0.pkl", os.remove, "random_states_0.pkl missing"),
    "unreadable state": (ckpt.STATE_FILE, lambda p: p.write_text("{not json"), "unreadable"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_latest_skips_a_damaged_checkpoint_and_resumes_from_the_one_before(toy_run, tmp_path, caplog, damage):
    out = tmp_path / "run"
    toy_run(out, steps=6)
    from safetensors.torch import load_file

    good = {k: v.clone() for k, v in load_file(out / "checkpoints" / "step_6" / "model.safetensors").items()}
    name, damage_fn, phrase = DAMAGE[damage]
    damage_fn(out / "checkpoints" / "step_6" / name)
    assert ckpt.verify_checkpoint(out / "checkpoints" / "step_4") is None
    with caplog.at_level(logging.WARNING, logger="training.checkpoint_files"):
        assert ckpt.resolve_checkpoint("latest", out / "checkpoints").name == "step_4"
    warning = [r.getMessage() for r in caplog.records if "skipping damaged checkpoint" in r.getMessage()]
    assert len(warning) == 1 and "step_6" in warning[0] and phrase in warning[0]
    # the resumed run starts at step 4 and re-writes step 6 exactly as the uninterrupted run did
    trainer, result = toy_run(out, steps=6, resume="latest")
    assert result["global_step"] == 6
    for k, v in trainer.unwrapped_model.state_dict().items():
        assert torch.equal(v.cpu(), good[k]), k  # the checkpoint is read onto the CPU: compare there
    assert ckpt.verify_checkpoint(out / "checkpoints" / "step_6") is None


def test_every_checkpoint_damaged_or_an_explicit_damaged_one_is_refused(toy_run, tmp_path):
    out = tmp_path / "run"
    toy_run(out, steps=4)
    _truncate(out / "checkpoints" / "step_4" / "model.safetensors")
    with pytest.raises(
        InputError, match=r"--resume_from_checkpoint .*step_4: damaged checkpoint \(model.safetensors has"
    ):
        ckpt.resolve_checkpoint(str(out / "checkpoints" / "step_4"), out / "checkpoints")
    os.remove(out / "checkpoints" / "step_2" / "optimizer.bin")
    with pytest.raises(
        InputError, match=r"every checkpoint .* is damaged \(step_4: .*; step_2: optimizer.bin missing\)"
    ):
        ckpt.resolve_checkpoint("latest", out / "checkpoints")


def test_manifest_covers_every_file_and_the_schedule_is_json_not_pickle(toy_run, tmp_path):
    out = tmp_path / "run"
    toy_run(out, steps=2)
    step = out / "checkpoints" / "step_2"
    state = json.loads((step / ckpt.STATE_FILE).read_text())
    on_disk = sorted(p.name for p in step.iterdir() if p.name != ckpt.STATE_FILE)
    assert sorted(state["files"]) == on_disk
    assert state["files"]["model.safetensors"]["bytes"] == (step / "model.safetensors").stat().st_size
    assert not list(step.glob("custom_checkpoint_*")), "no pickled scheduler"
    assert state["lr_scheduler"]["last_epoch"] == 2


def test_resume_reads_only_with_weights_only(toy_run, tmp_path, monkeypatch):
    out = tmp_path / "run"
    toy_run(out, steps=4)
    shutil.rmtree(out / "checkpoints" / "step_4")  # resume the same run from its step-2 checkpoint
    real_load, calls = torch.load, []

    def checked_load(*args, **kwargs):
        calls.append(kwargs.get("weights_only"))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", checked_load)
    toy_run(out, steps=4, resume="latest")
    assert calls and all(w is True for w in calls), calls


def test_resume_with_a_different_model_config_is_refused(toy_run, tmp_path):
    out = tmp_path / "run"
    toy_run(out, steps=4)
    shutil.rmtree(out / "checkpoints" / "step_4")
    with pytest.raises(
        InputError, match=r"--resume_from_checkpoint .*step_2: does not fit this model.*same model config"
    ):
        toy_run(out, steps=4, resume="latest", hidden=8)


def test_disk_full_at_save_time_keeps_the_previous_checkpoint(toy_run, tmp_path, monkeypatch):
    from accelerate import Accelerator

    out = tmp_path / "run"
    real_save_state = Accelerator.save_state
    saves = {"n": 0}

    def filling_disk(self, output_dir=None, **kwargs):
        saves["n"] += 1
        if saves["n"] < 2:
            return real_save_state(self, output_dir, **kwargs)
        real_save_state(self, output_dir, **kwargs)
        _truncate(os.path.join(output_dir, "model.safetensors"))  # the write that did not fit
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Accelerator, "save_state", filling_disk)
    with pytest.raises(
        ckpt.CheckpointWriteError, match=r"could not write checkpoint .*step_4 \(disk full.*step_2 is intact"
    ):
        toy_run(out, steps=6)
    assert [s for s, _ in ckpt.checkpoint_dirs(out / "checkpoints")] == [2]
    assert ckpt.verify_checkpoint(out / "checkpoints" / "step_2") is None
    assert not list((out / "checkpoints").glob(".tmp-*"))


def test_unwritable_output_dirs_are_refused_before_training(tmp_path, monkeypatch):
    from training.config import TrainingConfig

    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match=r"--output_dir .*file: is an existing file; expected a directory"):
        TrainingConfig(output_dir=str(tmp_path / "file"))
    with pytest.raises(
        InputError, match=r"--output_dir .*file/run: .*file is an existing file; expected a directory path"
    ):
        TrainingConfig(output_dir=str(tmp_path / "file" / "run"))
    TrainingConfig(output_dir=str(tmp_path / "new" / "deeper" / "run"))  # missing parents are created later
    assert not (tmp_path / "new").exists(), "nothing written by the check"
    (tmp_path / "ro").mkdir()
    if os.geteuid() != 0:  # root writes everywhere; elsewhere use a real read-only folder
        os.chmod(tmp_path / "ro", 0o500)
    else:
        real_access = os.access
        monkeypatch.setattr(
            os, "access", lambda p, mode: False if str(p) == str(tmp_path / "ro") else real_access(p, mode)
        )
    try:
        with pytest.raises(InputError, match=r"--output_dir .*ro/run: .*ro is not writable"):
            TrainingConfig(output_dir=str(tmp_path / "ro" / "run"))
    finally:
        os.chmod(tmp_path / "ro", 0o700)


# -- the signal handler -----------------------------------------------------------------------------------
class _FakeTrainer:
    def __init__(self):
        self.stops = 0

    def request_stop(self):
        self.stops += 1


def test_first_signal_requests_a_stop_a_forwarded_repeat_is_ignored_a_second_one_exits(monkeypatch):
    from training import signals

    exits = []
    monkeypatch.setattr(signals.os, "_exit", lambda code: exits.append(code))
    trainer = _FakeTrainer()
    stopper = signals.SignalStopper(trainer)
    assert stopper.exit_code == 1
    stopper(signal.SIGTERM, None)
    assert trainer.stops == 1 and stopper.exit_code == 143 and exits == []
    stopper(signal.SIGTERM, None)  # the launcher forwarding the same signal a moment later
    assert trainer.stops == 1 and exits == []
    stopper.received_at -= signals.REPEAT_WINDOW_S + 0.1
    stopper(signal.SIGTERM, None)  # a real second signal
    assert exits == [143]


def test_sigint_exit_code_and_handlers_restored(monkeypatch):
    from training import signals

    exits = []
    monkeypatch.setattr(signals.os, "_exit", lambda code: exits.append(code))
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    trainer = _FakeTrainer()
    with signals.stop_on_signals(trainer) as stopper:
        assert signal.getsignal(signal.SIGINT) is stopper
        os.kill(os.getpid(), signal.SIGINT)  # delivered to this (main) thread's handler
        assert trainer.stops == 1
        assert stopper.exit_code == 130
        stopper(signal.SIGTERM, None)  # a different signal right after counts as a second request
        assert exits == [143]  # 128 + SIGTERM (15): the second signal exits with its own status
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
