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

Completeness: a checkpoint without a manifest, or without the RNG file of one of its processes
(``random_states_<i>.pkl``), cannot resume bitwise: it is refused (``latest`` skips it) unless
``ignore_integrity`` (``--ignore_checkpoint_integrity``) is given, which resumes from it with a warning.

Ownership: ``trainer_state.json`` records the ``run_id`` of the run that wrote it (:mod:`training.ownership`).
Given a ``run_id``, listing, ``latest`` and rotation leave checkpoints of other runs alone (checkpoints written
before run ids existed count as the folder's own).

No pickle: weights are safetensors, the optimizer and RNG files are read by accelerate with
``torch.load(weights_only=True)``, and the learning-rate schedule is stored as JSON in ``trainer_state.json``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path

from core.errors import InputError, first_line
from core.files import file_sha256, share_like_umask, storage_failure

logger = logging.getLogger(__name__)

STATE_FILE = "trainer_state.json"
MANIFEST_KEY = "files"
#: accelerate's file of process ``i``'s RNG states in a checkpoint.
RNG_FILE = "random_states_{}.pkl"


class CheckpointWriteError(InputError):
    """A checkpoint could not be written (disk full, no permission); the previous checkpoints are intact."""


_STEP_DIR = re.compile(r"^step_(\d+)$")


def run_id_of(path: str | os.PathLike) -> str | None:
    """The ``run_id`` recorded in a checkpoint's ``trainer_state.json`` (None: none recorded, or unreadable)."""
    try:
        return read_state(path).get("run_id")
    except (OSError, ValueError, AttributeError):
        return None


def checkpoint_dirs(checkpoints_dir: str | os.PathLike, run_id: str | None = None) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``checkpoints_dir`` as ``(step, path)``, oldest first.

    Only folders named ``step_N`` that hold ``trainer_state.json`` count; temporary ``.tmp-*`` folders and
    incomplete folders are left out. With ``run_id``, so are the checkpoints of other runs (a checkpoint that records
    no run id counts as the run's own).
    """
    root = Path(checkpoints_dir)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and child.is_dir() and (child / STATE_FILE).is_file():
            if run_id is not None and run_id_of(child) not in (None, run_id):
                continue
            found.append((int(match.group(1)), child))
    return sorted(found)


def resolve_checkpoint(
    spec: str | None, checkpoints_dir: str | os.PathLike, run_id: str | None = None, ignore_integrity: bool = False
) -> Path | None:
    """The checkpoint folder to resume from.

    Args:
        spec: ``None`` (do not resume), ``"latest"`` (the newest complete and undamaged checkpoint of the run under
            ``checkpoints_dir``; damaged ones are skipped with a warning naming them; ``None`` with a warning
            when there is no checkpoint at all, so a preempted job can be relaunched with the same command),
            or a path to a checkpoint folder.
        checkpoints_dir: ``<output_dir>/checkpoints``.
        run_id: the run whose checkpoints ``latest`` considers (others are skipped with a warning); None: all.
        ignore_integrity: accept a checkpoint without a manifest or RNG files (a warning instead of a refusal;
            a damaged file is still refused).

    Raises:
        InputError: ``spec`` is a path that is not a complete, undamaged checkpoint folder, or ``latest`` finds
            checkpoints but every one is damaged or incomplete.
    """
    if spec is None or spec == "":
        return None
    if spec == "latest":
        if run_id is not None:
            mine = {path for _, path in checkpoint_dirs(checkpoints_dir, run_id)}
            for _, path in checkpoint_dirs(checkpoints_dir):
                if path not in mine:
                    logger.warning(
                        "--resume_from_checkpoint latest: skipping %s, a checkpoint of another run (run id "
                        "%s; this folder's run is %s)",
                        path,
                        run_id_of(path),
                        run_id,
                    )
        found = checkpoint_dirs(checkpoints_dir, run_id)
        if not found:
            logger.warning(
                "--resume_from_checkpoint latest: no checkpoint in %s; starting from scratch", checkpoints_dir
            )
            return None
        damaged = []
        for _, path in reversed(found):
            problem = _problem(path, ignore_integrity)
            if problem is None:
                return path
            logger.warning(
                "--resume_from_checkpoint latest: skipping damaged checkpoint %s (%s); trying the one before",
                path,
                problem,
            )
            damaged.append(f"{path.name}: {problem}")
        raise InputError(
            f"--resume_from_checkpoint latest: every checkpoint in {checkpoints_dir} is damaged "
            f"({'; '.join(damaged)}); "
            "expected at least one intact checkpoint (delete the checkpoints folder to start from scratch; "
            "--ignore_checkpoint_integrity resumes from one without its manifest or RNG files, not bitwise)"
        )
    path = check_checkpoint_path(spec)
    problem = _problem(path, ignore_integrity)
    if problem is not None:
        raise InputError(
            f"--resume_from_checkpoint {spec}: damaged checkpoint ({problem}); expected an intact one, "
            "e.g. 'latest' (--ignore_checkpoint_integrity resumes from one without its manifest or RNG "
            "files, not bitwise)"
        )
    return path


def _problem(path: Path, ignore_integrity: bool) -> str | None:
    """What refuses ``path`` for a resume: damage always, incompleteness unless ``ignore_integrity`` (then a
    warning)."""
    damaged, incomplete = checkpoint_problems(path)
    if damaged is None and incomplete is not None and ignore_integrity:
        logger.warning(
            "--ignore_checkpoint_integrity: resuming from %s although %s: the run will not continue "
            "bitwise as an uninterrupted one",
            path,
            incomplete,
        )
        return None
    return damaged or incomplete


def check_checkpoint_path(spec: str, flag: str = "--resume_from_checkpoint") -> Path:
    """Cheap check of a ``--resume_from_checkpoint`` (or ``flag``) folder (exists, holds ``trainer_state.json``),
    done before any work; :func:`resolve_checkpoint` verifies its files at resume time.

    Raises:
        InputError: no such folder, or not a complete checkpoint.
    """
    path = Path(spec)
    if not path.is_dir():
        latest = "'latest' or " if flag == "--resume_from_checkpoint" else ""
        raise InputError(f"{flag} {spec}: no such folder; expected {latest}a checkpoint folder")
    if not (path / STATE_FILE).is_file():
        raise InputError(
            f"{flag} {spec}: not a complete checkpoint (no {STATE_FILE}); expected a folder "
            "written by the training loop, e.g. <output_dir>/checkpoints/step_N"
        )
    return path


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
                manifest[rel] = {"bytes": full.stat().st_size, "sha256": file_sha256(full)}
    return manifest


def checkpoint_problems(path: str | os.PathLike) -> tuple[str | None, str | None]:
    """``(damage, incompleteness)`` of a checkpoint folder, each None or one short phrase.

    Damage: ``trainer_state.json`` missing or not readable JSON, or a file of its manifest missing or with another
    size or SHA-256. Incompleteness: no manifest (a checkpoint of an older version, or an edited state file), or no
    RNG file for one of the processes that wrote it (:data:`RNG_FILE`): resuming would not be bitwise.
    """
    path = Path(path)
    try:
        state = read_state(path)
    except FileNotFoundError:
        return f"{STATE_FILE} missing", None
    except (OSError, ValueError) as err:
        return f"{STATE_FILE} unreadable ({err})", None
    if not isinstance(state, dict):
        return f"{STATE_FILE} is not a JSON object", None
    manifest = state.get(MANIFEST_KEY)
    if isinstance(manifest, dict):
        for rel, meta in manifest.items():
            f = path / rel
            if not f.is_file():
                return f"{rel} missing", None
            size = f.stat().st_size
            if size != meta.get("bytes"):
                return f"{rel} has {size} bytes, expected {meta.get('bytes')} (truncated or changed)", None
            if meta.get("sha256") and file_sha256(f) != meta["sha256"]:
                return f"{rel} does not match its SHA-256 (changed or corrupted)", None
    missing = [
        RNG_FILE.format(i)
        for i in range(int(state.get("num_processes") or 1))
        if not (path / RNG_FILE.format(i)).is_file()
    ]
    if missing:
        return None, f"no RNG state file {', '.join(missing)} (dropout and sampling would not continue as saved)"
    if not isinstance(manifest, dict):
        return None, f"no file manifest in {STATE_FILE} (its files cannot be verified)"
    return None, None


def verify_checkpoint(path: str | os.PathLike) -> str | None:
    """``None`` if the checkpoint folder is intact and complete, else what is wrong with it (one short phrase; see
    :func:`checkpoint_problems`)."""
    damaged, incomplete = checkpoint_problems(path)
    return damaged or incomplete


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
    accelerator,
    checkpoints_dir: str | os.PathLike,
    step: int,
    state: dict,
    keep_last: int | None,
    protect: Sequence[int] = (),
    run_id: str | None = None,
) -> Path:
    """Write a checkpoint atomically on every process; return its final path ``checkpoints_dir/step_{step}``.

    Must be called by all processes (``save_state`` writes each process's RNG state). The main process writes
    ``trainer_state.json`` (``state`` plus the file manifest) last, flushes the folder to disk, renames it into
    place and deletes the oldest checkpoints of the run ``run_id`` beyond ``keep_last`` (``None`` or 0 keeps all),
    never those of the steps in ``protect`` (the best model's) nor other runs' checkpoints: the last ``keep_last``
    checkpoints of the run are kept, plus the protected ones.

    Raises:
        CheckpointWriteError: writing failed with a storage error (:func:`core.files.storage_failure`: disk full,
            no permission, also as safetensors / torch.save report them); the temporary folder is removed and the
            existing checkpoints are left as they were. Other errors propagate (after the temporary folder is
            removed).
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
            share_like_umask(tmp)  # safetensors writes model.safetensors owner-only (0600): give the umask's modes
            full_state = dict(state)
            full_state[MANIFEST_KEY] = file_manifest(tmp)
            with open(tmp / STATE_FILE, "w", encoding="utf-8") as f:
                json.dump(full_state, f, indent=2)
            _fsync_tree(tmp)
            if final.exists():  # re-saving a step (e.g. after a resume): swap atomically, then drop the old one
                if run_id is not None and run_id_of(final) not in (None, run_id):
                    logger.warning(
                        "replacing %s, a checkpoint of another run (run id %s), by this run's step %d",
                        final,
                        run_id_of(final),
                        step,
                    )
                old = root / f".tmp-old-step_{step}"
                os.replace(final, old)
                os.replace(tmp, final)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(tmp, final)
    except Exception as err:
        reason = storage_failure(err, tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        if reason is None:
            raise
        previous = checkpoint_dirs(root, run_id)
        kept = f"the previous checkpoint {previous[-1][1]} is intact" if previous else "no earlier checkpoint exists"
        raise CheckpointWriteError(
            f"could not write checkpoint {final} ({reason}: {first_line(err)}); {kept}; expected a writable "
            "--output_dir with free space (free some and resume with --resume_from_checkpoint latest)"
        ) from err
    if accelerator.is_main_process and keep_last:
        for found_step, path in checkpoint_dirs(root, run_id)[:-keep_last]:
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
