"""A run owns its output folder: a run id, a lock, and the clean-up of what killed runs left behind.

Every training run (``pretrain``, ``finetune.glue``, ``finetune.squad``; ``finetune.baselines`` through its
``finetune.glue`` children) claims its ``--output_dir`` before it writes anything there
(:func:`claim_output_dir`, called by :meth:`training.driver.Run.start` on the main process):

* **Lock** ``<output_dir>/.sesame-run.lock``: an exclusive ``fcntl.flock`` held by the main process for the
  whole run, the file naming its process id, host and start time. A second run into the same folder is refused
  with one line naming that process. The kernel drops the lock when its process ends, however it ends
  (SIGKILL, a crash), so a stale lock file of a dead process is taken over with a warning; a lock file that
  names a live process of this host is refused even where the filesystem does not share ``flock`` locks. Only
  the main process of a multi-process run takes the lock; the nodes of a multi-node run share one folder and one
  lock (across machines ``flock`` works where the shared filesystem supports it, e.g. NFSv4 or Lustre with flock).
* **Run id** ``<output_dir>/.sesame-run.json`` (``run_id``, ``created``, ``host``, ``pid``): a new id for a new
  run, the folder's id when resuming (``--resume_from_checkpoint``). Each checkpoint records it in its
  ``trainer_state.json``; rotation, ``latest`` and resume only consider checkpoints of the folder's run
  (:func:`training.checkpoint_files.checkpoint_dirs`), so a folder never mixes two runs' checkpoints unnoticed.
* **A folder of another run** is refused unless resuming it or ``--overwrite_output_dir``
  (:func:`core.files.check_output_dir_reuse`); with ``--overwrite_output_dir`` the old run's checkpoints are
  deleted before anything is written, so that the new run's checkpoints can never be rotated away by older ones.
* **Temporary folders of killed runs** (``checkpoints/.tmp-*``, the ``.<name>.tmp-*`` folders of atomic writes
  next to the output folder and inside it, ``.hub-staging``) are removed at the next start, under the lock.

The hidden files are never pushed to a hub (``training.hub`` ignores ``.*``) and do not make a folder
"non-empty" for :func:`core.files.check_output_dir_reuse`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import fcntl
import json
import logging
import os
import shutil
import socket
import uuid
from pathlib import Path

from core.errors import InputError
from core.files import BOOKKEEPING_FILES, pid_alive

logger = logging.getLogger(__name__)

LOCK_FILE, RUN_FILE = BOOKKEEPING_FILES

#: Locks this process holds, by lock-file path: a run that ended without releasing (an exception between
#: :meth:`training.driver.Run.start` and its end, in-process) is released by the next claim of the same folder.
_HELD: dict[str, Ownership] = {}


def read_run_id(output_dir: str | os.PathLike) -> str | None:
    """The run id recorded in ``output_dir`` (:data:`RUN_FILE`), or None."""
    try:
        record = json.loads((Path(output_dir) / RUN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    run_id = record.get("run_id") if isinstance(record, dict) else None
    return str(run_id) if run_id else None


def _holder(lock_path: Path) -> dict:
    try:
        return json.loads(lock_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _describe(holder: dict) -> str:
    if not holder:
        return "an unknown process"
    return f"process {holder.get('pid')} on {holder.get('host')}, started {holder.get('started')}"


@dataclasses.dataclass
class Ownership:
    """A claimed output folder (see the module docstring): the run id, and the lock until :meth:`release`."""

    output_dir: Path
    run_id: str
    created_dir: bool = False
    fd: int | None = None

    def release(self) -> None:
        """Drop the lock and remove the lock file; a run that wrote nothing (no checkpoint, no output) also removes
        its run record, and the folder when the run created it and it is empty. Idempotent."""
        lock = self.output_dir / LOCK_FILE
        if self.fd is not None:
            with contextlib.suppress(OSError):
                if _same_file(self.fd, lock):
                    lock.unlink()
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None
        _HELD.pop(str(lock), None)
        with contextlib.suppress(OSError):
            if [p.name for p in self.output_dir.iterdir()] == [RUN_FILE]:
                (self.output_dir / RUN_FILE).unlink()
            if self.created_dir and not any(self.output_dir.iterdir()):
                self.output_dir.rmdir()


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _lock(out: Path, arg_name: str) -> int:
    """Take the folder's lock (see the module docstring); returns its file descriptor.

    Raises:
        InputError: another live process holds it.
    """
    lock = out / LOCK_FILE
    previous = _HELD.get(str(lock))
    if previous is not None:  # this process's own run that ended without releasing (in-process use)
        previous.release()
    for _ in range(10):  # the holder may remove the file between our open and our lock: then lock the new one
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            os.close(fd)
            if err.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise InputError(
                    f"{arg_name} {out}: cannot lock {lock} ({err.strerror}); expected a folder on a "
                    "filesystem with file locks"
                ) from err
            raise InputError(
                f"{arg_name} {out}: another run is writing to it ({_describe(_holder(lock))}; lock file "
                f"{lock}); expected a folder no other run uses: wait for that run to end or choose "
                "another --output_dir"
            ) from None
        if _same_file(fd, lock):
            break
        os.close(fd)
    else:
        raise InputError(
            f"{arg_name} {out}: could not take the lock {lock} (it keeps being replaced); expected a "
            "folder no other run uses"
        )
    holder, host = _holder(lock), socket.gethostname()
    pid = int(holder.get("pid") or 0)
    if holder and pid != os.getpid():
        if holder.get("host") == host and pid_alive(pid):
            os.close(fd)
            raise InputError(
                f"{arg_name} {out}: another run is writing to it ({_describe(holder)}, still running; "
                f"lock file {lock}); expected a folder no other run uses: wait for that run to end or "
                "choose another --output_dir"
            )
        why = "no longer running" if holder.get("host") == host else "its lock is not held"
        logger.warning("%s %s: taking over the lock of an earlier run (%s: %s)", arg_name, out, _describe(holder), why)
    record = {
        "pid": os.getpid(),
        "host": host,
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
    return fd


def remove_stale_temporaries(output_dir: str | os.PathLike) -> list[Path]:
    """Remove what killed runs left in and next to ``output_dir``: ``checkpoints/.tmp-*``, ``.hub-staging``, and the
    temporary folders of atomic writes (``.<name>.tmp-*``) inside it and next to it. Call it only while holding the
    folder's lock. Returns the removed paths."""
    from training.hub import STAGING_DIR

    out = Path(output_dir)
    candidates = [*out.glob("checkpoints/.tmp-*"), *out.glob(".*.tmp-*"), *out.parent.glob(f".{out.name}.tmp-*")]
    if (out / STAGING_DIR).exists():
        candidates.append(out / STAGING_DIR)
    removed = []
    for path in candidates:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                path.unlink()
        removed.append(path)
    if removed:
        logger.warning(
            "removed %d temporary folder(s) left by an earlier run that was killed: %s",
            len(removed),
            ", ".join(str(p) for p in removed),
        )
    return removed


def claim_output_dir(
    output_dir: str | os.PathLike, *, overwrite: bool, resuming: bool, arg_name: str = "--output_dir"
) -> Ownership:
    """Claim ``output_dir`` for a new or resumed run (main process only; see the module docstring): lock it, remove
    stale temporary folders, refuse a folder of another run (unless resuming or ``overwrite``), delete the old
    run's checkpoints when ``overwrite``, and record the run id (a new one, or the folder's when resuming).

    Returns:
        The :class:`Ownership` (release it at the end of the run; the lock also ends with the process).

    Raises:
        InputError: another run holds the folder; the folder holds another run and neither ``resuming`` nor
            ``overwrite`` is set; the folder cannot be created or locked.
    """
    from core.files import check_output_dir_reuse
    from training.checkpoint_files import checkpoint_dirs, read_state

    out = Path(output_dir)
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InputError(f"{arg_name} {out}: cannot be created ({err.strerror}); expected a writable folder") from err
    ownership = Ownership(out, "", created_dir=created)
    ownership.fd = _lock(out, arg_name)
    _HELD[str(out / LOCK_FILE)] = ownership
    try:
        check_output_dir_reuse(out, overwrite, resuming)
        remove_stale_temporaries(out)
        run_id = read_run_id(out) if resuming else None
        if resuming and run_id is None:  # a folder written before run ids: adopt its newest checkpoint's id, if any
            found = checkpoint_dirs(out / "checkpoints")
            run_id = read_state(found[-1][1]).get("run_id") if found else None
        if not resuming and overwrite and (out / "checkpoints").exists():
            logger.warning("%s %s: --overwrite_output_dir: deleting the checkpoints of the earlier run", arg_name, out)
            shutil.rmtree(out / "checkpoints")
        ownership.run_id = run_id or uuid.uuid4().hex
        if run_id is None or read_run_id(out) != run_id:
            from core.files import write_text_atomic

            record = {
                "run_id": ownership.run_id,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            }
            write_text_atomic(out / RUN_FILE, json.dumps(record, indent=2) + "\n")
    except BaseException:
        ownership.release()
        raise
    return ownership


__all__ = ["LOCK_FILE", "RUN_FILE", "Ownership", "claim_output_dir", "read_run_id", "remove_stale_temporaries"]
