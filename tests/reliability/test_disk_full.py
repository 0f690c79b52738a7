"""Disk full while ``pretrain`` writes: at checkpoint time the run stops with one ``error:`` line (exit 2) and
the previous checkpoint stays intact and resumable; at ``save_pretrained`` time ``output_dir`` gets no partial
model and the final checkpoint stays intact. (ENOSPC simulated by a write that stops half-way and raises.)"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from _launch import asset_args

from core.errors import run_cli
from training import checkpoint_files as ckpt


def _args(assets: Path, out: Path, *extra: str) -> list[str]:
    return asset_args(
        assets, out, *"--max_train_steps 4 --checkpointing_steps 2 --checkpoints_total_limit 0".split(), *extra
    )


def _enospc(path):
    with open(path, "wb") as f:
        f.write(b"\0" * 100)  # what fitted before the disk filled up
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


def _error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error:")]


def test_disk_full_at_checkpoint_time(assets, tmp_path, monkeypatch, capsys, fresh_state):
    from accelerate import Accelerator

    from pretrain.cli import main

    real, calls = Accelerator.save_state, {"n": 0}

    def save_state(self, output_dir=None, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            return real(self, output_dir, **kwargs)
        _enospc(Path(output_dir) / "model.safetensors")

    monkeypatch.setattr(Accelerator, "save_state", save_state)
    out = tmp_path / "out"
    assert run_cli(main, _args(assets, out)) == 2
    err = capsys.readouterr().err
    lines = _error_lines(err)
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    assert (
        "could not write checkpoint" in lines[0] and "step_4 (disk full" in lines[0] and "step_2 is intact" in lines[0]
    )
    assert [s for s, _ in ckpt.checkpoint_dirs(out / "checkpoints")] == [2]
    assert ckpt.verify_checkpoint(out / "checkpoints" / "step_2") is None
    assert not list((out / "checkpoints").glob(".tmp-*")) and not (out / "model.safetensors").exists()


def test_disk_full_when_saving_the_model(assets, tmp_path, monkeypatch, capsys, fresh_state):
    import transformers.modeling_utils

    from pretrain.cli import main

    monkeypatch.setattr(
        transformers.modeling_utils, "safe_save_file", lambda sd, filename, metadata=None: _enospc(filename)
    )
    out = tmp_path / "out"
    assert run_cli(main, _args(assets, out)) == 2
    err = capsys.readouterr().err
    lines = _error_lines(err)
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    assert f"--output_dir {out}: could not write the outputs (disk full" in lines[0]
    assert not (out / "model.safetensors").exists() and not (out / "all_results.json").exists()
    assert not list(tmp_path.glob(".out.tmp-*")), "the temporary output folder was removed"
    assert ckpt.resolve_checkpoint("latest", out / "checkpoints").name == "step_4"  # the work is not lost


# -- a real full disk: a small tmpfs (needs the right to mount; skipped with the reason otherwise) -------------------
@pytest.fixture
def small_disk(tmp_path):
    """``small_disk(megabytes) -> Path``: a tmpfs of that size mounted in ``tmp_path`` (unmounted after the test)."""
    import subprocess

    mounted = []

    def mount(megabytes: float) -> Path:
        where = tmp_path / f"disk{len(mounted)}"
        where.mkdir()
        proc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={int(megabytes * 1024)}k", "tmpfs", str(where)],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs here (not root, or no CAP_SYS_ADMIN): {proc.stderr.strip()}")
        mounted.append(where)
        return where

    yield mount
    import subprocess as sp

    for where in mounted:
        sp.run(["umount", "-l", str(where)], check=False)


def _fill(disk: Path) -> None:
    with open(disk / "ballast", "wb") as f:
        with pytest.raises(OSError):
            while True:
                f.write(b"\0" * 65536)
                f.flush()


def test_real_disk_full_errors_of_safetensors_torch_and_tokenizers_are_recognised(small_disk, assets):
    """The libraries raise their own errors (not ``OSError``) on a full disk; each is recognised as "disk full"."""
    import torch
    from safetensors.torch import save_file

    from core.files import storage_failure

    disk = small_disk(1)
    _fill(disk)
    tensors = {"w": torch.zeros(100_000)}
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(assets / "wordpiece" / "tokenizer.json"))
    writers = (
        ("safetensors", lambda p: save_file(tensors, str(p))),
        ("torch.save", lambda p: torch.save(tensors, p)),
        ("tokenizers", lambda p: tokenizer.save(str(p))),
    )
    for name, write in writers:
        with pytest.raises(Exception) as err:
            write(disk / f"{name}.out")
        assert storage_failure(err.value, disk) == "disk full", (name, type(err.value), str(err.value)[:200])


def test_real_disk_full_at_checkpoint_time_gives_one_line_and_leaves_no_temporary_folder(
    small_disk, assets, capsys, fresh_state
):
    from pretrain.cli import main

    out = small_disk(1.5) / "out"  # bert-tiny's checkpoint (weights + Adam moments) needs ~6 MB
    assert run_cli(main, _args(assets, out)) == 2
    err = capsys.readouterr().err
    lines = _error_lines(err)
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    assert "could not write checkpoint" in lines[0] and "disk full" in lines[0], lines[0]
    assert not list((out / "checkpoints").glob(".tmp-*"))
