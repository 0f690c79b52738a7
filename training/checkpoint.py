"""Atomic training checkpoints: ``<output_dir>/checkpoints/step_N/``.

A checkpoint is ``accelerator.save_state`` output (model weights as safetensors, optimizer, registered objects
such as the learning-rate schedule, and every process's RNG states) plus ``trainer_state.json`` (global step,
epoch, micro-batches consumed in the epoch, running loss sums). It is written into ``.tmp-step_N`` next to its
final place, flushed to disk, and only then renamed to ``step_N``: a run killed while saving leaves at most a
``.tmp-*`` folder, which is never picked as a checkpoint and is removed by the next save. A folder ``step_N``
without ``trainer_state.json`` (written last) is incomplete and skipped by ``latest``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path

from training.errors import InputError

logger = logging.getLogger(__name__)

STATE_FILE = "trainer_state.json"
_STEP_DIR = re.compile(r"^step_(\d+)$")


def checkpoint_dirs(checkpoints_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``checkpoints_dir`` as ``(step, path)``, oldest first.

    Only folders named ``step_N`` that hold ``trainer_state.json`` count; temporary ``.tmp-*`` folders and
    incomplete folders are left out.
    """
    root = Path(checkpoints_dir)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and child.is_dir() and (child / STATE_FILE).is_file():
            found.append((int(match.group(1)), child))
    return sorted(found)


def resolve_checkpoint(spec: str | None, checkpoints_dir: str | os.PathLike) -> Path | None:
    """The checkpoint folder to resume from.

    Args:
        spec: ``None`` (do not resume), ``"latest"`` (the newest complete checkpoint under ``checkpoints_dir``,
            or ``None`` with a warning when there is none, so a preempted job can be relaunched with the same
            command), or a path to a checkpoint folder.
        checkpoints_dir: ``<output_dir>/checkpoints``.

    Raises:
        InputError: ``spec`` is a path that is not a complete checkpoint folder.
    """
    if spec is None or spec == "":
        return None
    if spec == "latest":
        found = checkpoint_dirs(checkpoints_dir)
        if not found:
            logger.warning("--resume_from_checkpoint latest: no checkpoint in %s; starting from scratch", checkpoints_dir)
            return None
        return found[-1][1]
    path = Path(spec)
    if not path.is_dir():
        raise InputError(f"--resume_from_checkpoint {spec}: no such folder; expected 'latest' or a checkpoint folder")
    if not (path / STATE_FILE).is_file():
        raise InputError(
            f"--resume_from_checkpoint {spec}: not a complete checkpoint (no {STATE_FILE}); expected a folder "
            "written by the training loop, e.g. <output_dir>/checkpoints/step_N"
        )
    return path


def read_state(path: str | os.PathLike) -> dict:
    """The ``trainer_state.json`` of a checkpoint folder."""
    with open(Path(path) / STATE_FILE, encoding="utf-8") as f:
        return json.load(f)


def _fsync_tree(root: Path) -> None:
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def save_checkpoint(accelerator, checkpoints_dir: str | os.PathLike, step: int, state: dict, keep_last: int | None) -> Path:
    """Write a checkpoint atomically on every process; return its final path ``checkpoints_dir/step_{step}``.

    Must be called by all processes (``save_state`` writes each process's RNG state). The main process writes
    ``trainer_state.json`` last, flushes the folder to disk, renames it into place and deletes the oldest
    checkpoints beyond ``keep_last`` (``None`` or 0 keeps all).
    """
    root = Path(checkpoints_dir)
    tmp = root / f".tmp-step_{step}"
    final = root / f"step_{step}"
    if accelerator.is_main_process:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir()
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        with open(tmp / STATE_FILE, "w", encoding="utf-8") as f:
            json.dump(state, f, indent=2)
        _fsync_tree(tmp)
        if final.exists():  # re-saving a step (e.g. after a resume): swap atomically, then drop the old one
            old = root / f".tmp-old-step_{step}"
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        if keep_last:
            for _, path in checkpoint_dirs(root)[:-keep_last]:
                shutil.rmtree(path, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final
