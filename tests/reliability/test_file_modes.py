"""Every file a run writes honours the umask (issue 32 item 1): under umask 022 the model, checkpoints, curves and
results of a pretraining run are readable by others (0644), not owner-only like ``mkstemp``'s and safetensors'
temporary files (0600); the one atomic-write helper gives the umask's mode and follows a tighter umask too."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from _launch import tiny_run_args

from core.errors import run_cli


@pytest.fixture
def umask():
    """``umask(mask)`` sets the process umask for the test; the previous one is restored after it."""
    before = os.umask(0o022)
    yield os.umask
    os.umask(before)


def _modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in root.rglob("*") if p.is_file()}


def test_open_atomic_gives_the_umask_mode_and_leaves_nothing_on_failure(umask, tmp_path):
    from core.files import open_atomic, write_text_atomic

    for mask in (0o022, 0o077, 0o002):
        umask(mask)
        target = tmp_path / f"f{mask:o}.txt"
        write_text_atomic(target, "x")
        # the reference: what a plain open() gives a new file under the same umask
        plain = tmp_path / f"plain{mask:o}.txt"
        plain.write_text("x")
        assert stat.S_IMODE(target.stat().st_mode) == stat.S_IMODE(plain.stat().st_mode) == 0o666 & ~mask
    umask(0o022)
    target = tmp_path / "kept.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with open_atomic(target, "wb") as f:
            f.write(b"new, half")
            raise RuntimeError("cut")
    assert target.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_pretraining_outputs_and_checkpoints_are_readable_by_others(assets, tmp_path, umask, fresh_state):
    from pretrain.cli import main

    out = tmp_path / "out"
    assert run_cli(main, tiny_run_args(assets, out, "--max_train_steps", "4")) == 0
    modes = _modes(out)
    assert "model.safetensors" in modes and any(k.endswith("model.safetensors") and "checkpoints" in k for k in modes)
    assert "curves.png" in modes and "all_results.json" in modes
    private = {name: oct(mode) for name, mode in modes.items() if not mode & stat.S_IROTH}
    assert not private, f"files others cannot read under umask 022: {private}"
    dirs = [p for p in out.rglob("*") if p.is_dir()] + [out]
    assert all(stat.S_IMODE(p.stat().st_mode) & 0o005 == 0o005 for p in dirs)
