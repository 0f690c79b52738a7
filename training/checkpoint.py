"""Atomic training checkpoints: ``<output_dir>/checkpoints/step_N/``.

A checkpoint is ``accelerator.save_state`` output (model weights as safetensors, optimizer, registered objects
such as the learning-rate schedule, and every process's RNG states) plus ``trainer_state.json`` (global step,
epoch, micro-batches consumed in the epoch, running loss sums). It is written into ``.tmp-step_N`` next to its
final place, flushed to disk, and only then renamed to ``step_N``: a run killed while saving leaves at most a
``.tmp-*`` folder, which is never picked as a checkpoint and is removed by the next save. A folder ``step_N``
without ``trainer_state.json`` (written last) is incomplete and skipped by ``latest``.

Integrity: ``trainer_state.json`` records a manifest (``files``: size in bytes and SHA-256 of every other file
of the checkpoint, all processes' files included). :func:`verify_checkpoint` re-checks it;
``--resume_from_checkpoint latest`` skips a damaged checkpoint (a truncated, changed or missing file) with a
warning naming it and the problem, and takes the one before. A save that fails (disk full, permission)
removes its temporary folder and raises :class:`CheckpointWriteError`; the previous checkpoints are untouched.

No pickle: weights are safetensors, the optimizer and RNG files are read by accelerate with
``torch.load(weights_only=True)``, and the learning-rate schedule is stored as JSON in ``trainer_state.json``.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path

from training.errors import InputError

logger = logging.getLogger(__name__)

STATE_FILE = "trainer_state.json"
MANIFEST_KEY = "files"


class CheckpointWriteError(InputError):
    """A checkpoint could not be written (disk full, no permission); the previous checkpoints are intact."""
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
        spec: ``None`` (do not resume), ``"latest"`` (the newest complete and undamaged checkpoint under
            ``checkpoints_dir``; damaged ones are skipped with a warning naming them; ``None`` with a warning
            when there is no checkpoint at all, so a preempted job can be relaunched with the same command),
            or a path to a checkpoint folder.
        checkpoints_dir: ``<output_dir>/checkpoints``.

    Raises:
        InputError: ``spec`` is a path that is not a complete, undamaged checkpoint folder, or ``latest`` finds
            checkpoints but every one is damaged.
    """
    if spec is None or spec == "":
        return None
    if spec == "latest":
        found = checkpoint_dirs(checkpoints_dir)
        if not found:
            logger.warning("--resume_from_checkpoint latest: no checkpoint in %s; starting from scratch", checkpoints_dir)
            return None
        damaged = []
        for _, path in reversed(found):
            problem = verify_checkpoint(path)
            if problem is None:
                return path
            logger.warning("--resume_from_checkpoint latest: skipping damaged checkpoint %s (%s); trying the one before", path, problem)
            damaged.append(f"{path.name}: {problem}")
        raise InputError(
            f"--resume_from_checkpoint latest: every checkpoint in {checkpoints_dir} is damaged ({'; '.join(damaged)}); "
            "expected at least one intact checkpoint (delete the checkpoints folder to start from scratch)"
        )
    path = check_checkpoint_path(spec)
    problem = verify_checkpoint(path)
    if problem is not None:
        raise InputError(f"--resume_from_checkpoint {spec}: damaged checkpoint ({problem}); expected an intact one, e.g. 'latest'")
    return path


def check_checkpoint_path(spec: str) -> Path:
    """Cheap check of a ``--resume_from_checkpoint`` folder (exists, holds ``trainer_state.json``), done before
    any work; :func:`resolve_checkpoint` verifies its files at resume time.

    Raises:
        InputError: no such folder, or not a complete checkpoint.
    """
    path = Path(spec)
    if not path.is_dir():
        raise InputError(f"--resume_from_checkpoint {spec}: no such folder; expected 'latest' or a checkpoint folder")
    if not (path / STATE_FILE).is_file():
        raise InputError(
            f"--resume_from_checkpoint {spec}: not a complete checkpoint (no {STATE_FILE}); expected a folder "
            "written by the training loop, e.g. <output_dir>/checkpoints/step_N"
        )
    return path


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_manifest(root: str | os.PathLike) -> dict[str, dict]:
    """``{relative path: {"bytes": size, "sha256": hex digest}}`` of every file under ``root`` except
    ``trainer_state.json``."""
    root = Path(root)
    manifest = {}
    for dirpath, _, filenames in os.walk(root):
        for name in sorted(filenames):
            full = Path(dirpath) / name
            rel = full.relative_to(root).as_posix()
            if rel != STATE_FILE:
                manifest[rel] = {"bytes": full.stat().st_size, "sha256": _sha256(full)}
    return manifest


def verify_checkpoint(path: str | os.PathLike) -> str | None:
    """``None`` if the checkpoint folder is intact, else what is wrong with it (one short phrase).

    Checks that ``trainer_state.json`` is readable JSON and that every file of its manifest exists with the
    recorded size and SHA-256 (checkpoints written without a manifest are only checked for the state file).
    """
    path = Path(path)
    try:
        state = read_state(path)
    except FileNotFoundError:
        return f"{STATE_FILE} missing"
    except (OSError, ValueError) as err:
        return f"{STATE_FILE} unreadable ({err})"
    manifest = state.get(MANIFEST_KEY)
    if not isinstance(manifest, dict):
        return None
    for rel, meta in manifest.items():
        f = path / rel
        if not f.is_file():
            return f"{rel} missing"
        size = f.stat().st_size
        if size != meta.get("bytes"):
            return f"{rel} has {size} bytes, expected {meta.get('bytes')} (truncated or changed)"
        if meta.get("sha256") and _sha256(f) != meta["sha256"]:
            return f"{rel} does not match its SHA-256 (changed or corrupted)"
    return None


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


def save_checkpoint(
    accelerator, checkpoints_dir: str | os.PathLike, step: int, state: dict, keep_last: int | None, protect: Sequence[int] = ()
) -> Path:
    """Write a checkpoint atomically on every process; return its final path ``checkpoints_dir/step_{step}``.

    Must be called by all processes (``save_state`` writes each process's RNG state). The main process writes
    ``trainer_state.json`` (``state`` plus the file manifest) last, flushes the folder to disk, renames it into
    place and deletes the oldest checkpoints beyond ``keep_last`` (``None`` or 0 keeps all), never those of the
    steps in ``protect`` (the best model's): the last ``keep_last`` checkpoints are kept, plus the protected ones.

    Raises:
        CheckpointWriteError: writing failed (``OSError``: disk full, no permission); the temporary folder is
            removed and the existing checkpoints are left as they were.
    """
    root = Path(checkpoints_dir)
    tmp = root / f".tmp-step_{step}"
    final = root / f"step_{step}"
    try:
        if accelerator.is_main_process:
            root.mkdir(parents=True, exist_ok=True)
            for stale in root.glob(".tmp-*"):
                shutil.rmtree(stale, ignore_errors=True)
            tmp.mkdir()
        accelerator.wait_for_everyone()
        accelerator.save_state(str(tmp))
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            full_state = dict(state)
            full_state[MANIFEST_KEY] = file_manifest(tmp)
            with open(tmp / STATE_FILE, "w", encoding="utf-8") as f:
                json.dump(full_state, f, indent=2)
            _fsync_tree(tmp)
            if final.exists():  # re-saving a step (e.g. after a resume): swap atomically, then drop the old one
                old = root / f".tmp-old-step_{step}"
                os.replace(final, old)
                os.replace(tmp, final)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(tmp, final)
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        reason = "disk full" if err.errno == errno.ENOSPC else (err.strerror or str(err))
        previous = checkpoint_dirs(root)
        kept = f"the previous checkpoint {previous[-1][1]} is intact" if previous else "no earlier checkpoint exists"
        raise CheckpointWriteError(
            f"could not write checkpoint {final} ({reason}: {err}); {kept}; expected a writable --output_dir with "
            "free space (free some and resume with --resume_from_checkpoint latest)"
        ) from err
    if accelerator.is_main_process and keep_last:
        for found_step, path in checkpoint_dirs(root)[:-keep_last]:
            if found_step not in protect:
                shutil.rmtree(path, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def check_output_dir(output_dir: str | os.PathLike, arg_name: str = "--output_dir") -> None:
    """Refuse, before any work, an ``output_dir`` that cannot be written: an existing file, a path through a
    file, or a folder (or nearest existing parent, for a new one) without write permission.

    Missing parent folders are fine (they are created, as ``mkdir -p`` does).

    Raises:
        InputError: naming the path and what was expected.
    """
    out = Path(output_dir)
    if out.exists() and not out.is_dir():
        raise InputError(f"{arg_name} {out}: is an existing file; expected a directory (new or existing)")
    probe = out
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise InputError(f"{arg_name} {out}: {probe} is an existing file; expected a directory path")
    if probe.exists() and not os.access(probe, os.W_OK | os.X_OK):
        raise InputError(f"{arg_name} {out}: {probe} is not writable; expected a folder this user can write to")
