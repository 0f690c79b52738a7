"""Atomic writes of output folders and files, and the output-folder rule of every command.

Every command writes its outputs so that a failure (a bad input found late, a full disk, a kill) leaves nothing
half-written: :func:`atomic_output_dir` for folders, :func:`write_text_atomic` for single files.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Union

from core.errors import InputError, first_line

PathLike = Union[str, "os.PathLike[str]"]

#: A run's bookkeeping in its output folder (:mod:`training.ownership`): not outputs of a run.
BOOKKEEPING_FILES = (".sesame-run.lock", ".sesame-run.json")

#: Messages of storage errors raised as other exceptions than ``OSError`` (safetensors, tokenizers: Rust I/O errors
#: as text), and the reason they give.
_STORAGE_MESSAGES = (
    ("No space left on device", "disk full"),
    ("os error 28", "disk full"),
    ("StorageFull", "disk full"),
    ("Disk quota exceeded", "disk quota exceeded"),
    ("os error 122", "disk quota exceeded"),
    ("Read-only file system", "read-only file system"),
    ("os error 30", "read-only file system"),
    ("Permission denied", "permission denied"),
    ("os error 13", "permission denied"),
)
#: ``OSError`` numbers of a failed write (not of a bad input file, e.g. a corrupt .gz read while writing).
_STORAGE_ERRNOS = frozenset(
    {
        errno.ENOSPC,
        errno.EDQUOT,
        errno.EROFS,
        errno.EACCES,
        errno.EPERM,
        errno.EIO,
        errno.EFBIG,
        errno.EMFILE,
        errno.ENFILE,
        errno.ENAMETOOLONG,
        errno.EXDEV,
    }
)
#: Free bytes below which a filesystem counts as full (torch.save's serializer reports a short write without errno).
_NEARLY_FULL_BYTES = 1 << 20


def pid_alive(pid: int) -> bool:
    """Whether a process with this id runs on this host (``os.kill(pid, 0)``; a process of another user counts)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def file_sha256(path: PathLike, chunk: int = 1 << 20) -> str:
    """SHA-256 hex digest of a file, read in 1 MiB chunks."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def read_json(path: PathLike, what: str, expected: str):
    """The JSON value in the UTF-8 file ``path``.

    Raises:
        InputError: unreadable or not JSON: ``<path>: cannot read <what> (<error>); expected <expected>``.
    """
    import json

    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise InputError(f"{path}: cannot read {what} ({err}); expected {expected}") from None


def _free_bytes(path: Path) -> int | None:
    probe = Path(path)
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    try:
        stat = os.statvfs(probe)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def storage_failure(err: BaseException, where: PathLike) -> str | None:
    """Why a write into ``where`` failed when ``err`` is a storage error, else None (a bug, which keeps its traceback).

    Storage errors: an ``OSError`` of a write (disk full, quota, permission, read-only filesystem, I/O error; not,
    e.g., a corrupt input file's ``BadGzipFile``), the Rust I/O errors that
    safetensors and tokenizers raise as plain exceptions (``SafetensorError: ... No space left on device (os error
    28)``), and torch.save's serializer error (``[enforce fail at inline_container.cc] ... unexpected pos``) when the
    filesystem of ``where`` is (nearly) full. Exceptions chained to ``err`` are looked at too.

    Returns:
        ``"disk full"``, ``"permission denied"``, an ``OSError``'s ``strerror``, ..., or None.
    """
    seen, todo = set(), [err]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _STORAGE_ERRNOS:
            return "disk full" if e.errno == errno.ENOSPC else (e.strerror or type(e).__name__)
        text = str(e)
        for needle, reason in _STORAGE_MESSAGES:
            if needle in text:
                return reason
        if isinstance(e, RuntimeError) and ("inline_container" in text or "PytorchStreamWriter" in text):
            free = _free_bytes(Path(where))
            if free is not None and free < _NEARLY_FULL_BYTES:
                return "disk full"
        todo += [e.__cause__, e.__context__]
    return None


def _tmp_prefix(name: str) -> str:
    """Prefix of the temporary folders of :func:`atomic_output_dir` for ``name``: host and process id in it, so that
    the folders of a killed process can be recognised (:func:`remove_dead_temporaries`)."""
    return f".{name}.tmp-{socket.gethostname()}-{os.getpid()}-"


def remove_dead_temporaries(output_dir: PathLike) -> list[Path]:
    """Remove the temporary folders next to ``output_dir`` that :func:`atomic_output_dir` made in processes of this
    host that no longer run (a killed run's half-written outputs). Returns the removed paths."""
    out = Path(output_dir)
    host = socket.gethostname()
    removed = []
    for path in out.absolute().parent.glob(f".{out.name}.tmp-{host}-*"):
        pid = path.name[len(f".{out.name}.tmp-{host}-") :].split("-", 1)[0]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


@contextlib.contextmanager
def atomic_output_dir(
    output_dir: PathLike, arg_name: str = "--output_dir", stale: Sequence[str] = ()
) -> Iterator[Path]:
    """Write an output folder atomically: yield a fresh temporary folder next to ``output_dir``, and move
    its contents into ``output_dir`` only when the ``with`` block succeeds.

    If ``output_dir`` does not exist, the temporary folder is renamed to it (one atomic rename). If it
    exists, each entry of the temporary folder replaces the entry of the same name there (each an atomic rename),
    then the entries that match ``stale`` and that the new outputs do not hold are removed; every other entry is
    kept: a command never deletes what it did not write. If the block raises, the temporary folder is removed and
    ``output_dir`` is left as it was (not created if it did not exist).

    Args:
        output_dir: the folder to write; its parent folders are created if needed.
        arg_name: the command-line argument it came from, used in error messages.
        stale: ``fnmatch`` patterns of the entries this command writes in some run or another (e.g. a model folder's
            weights, shards and tokenizer files); an earlier run's entries of these names that this run does not
            write are removed, so that the folder never mixes two runs' files.

    Yields:
        The temporary folder (a ``Path`` in the same parent as ``output_dir``) to write into.

    Temporary folders of killed processes (on this host) next to ``output_dir`` are removed first
    (:func:`remove_dead_temporaries`).

    Raises:
        InputError: ``output_dir`` (or one of its parents) is an existing file, or its parent cannot be created,
            or writing into the temporary folder failed with a storage error (:func:`storage_failure`: disk full,
            quota, permission, also as raised by safetensors / tokenizers / torch.save); then the temporary folder
            is removed and ``output_dir`` is unchanged.
    """
    out = Path(output_dir)
    if out.exists() and not out.is_dir():
        raise InputError(f"{arg_name} {out}: is an existing file; expected a directory (new or existing)")
    parent = out.absolute().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as err:
        raise InputError(f"{arg_name} {out}: a parent is an existing file; expected a directory path") from err
    except OSError as err:
        raise InputError(f"{arg_name} {out}: cannot create its parent folder ({err.strerror})") from err
    remove_dead_temporaries(out)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=_tmp_prefix(out.name), dir=parent))
    except OSError as err:
        raise InputError(
            f"{arg_name} {out}: cannot create a folder in {parent} ({err.strerror}); expected a writable location"
        ) from err
    try:
        try:
            yield tmp
        except InputError:
            raise
        except Exception as err:  # disk full, quota, permission: report it, leave output_dir as it was
            reason = storage_failure(err, tmp)
            if reason is None:
                raise
            raise InputError(
                f"{arg_name} {out}: could not write the outputs ({reason}: {first_line(err)}); {out} was "
                "left as it was; expected a writable folder with free space"
            ) from err
        share_like_umask(tmp)  # mkdtemp makes 0700, safetensors' save_file 0600: give the usual modes
        if not out.exists():
            os.replace(tmp, out)
        else:
            written = {entry.name for entry in tmp.iterdir()}
            for entry in sorted(tmp.iterdir()):
                target = out / entry.name
                if target.is_dir() and not target.is_symlink():
                    shutil.rmtree(target)
                os.replace(entry, target)
            for entry in sorted(out.iterdir()):
                if entry.name not in written and any(fnmatch.fnmatchcase(entry.name, p) for p in stale):
                    if entry.is_dir() and not entry.is_symlink():
                        shutil.rmtree(entry)
                    else:
                        entry.unlink()
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def file_mode(executable: bool = False) -> int:
    """The permission bits a new file gets under the current umask, as ``open()`` gives them: ``0o666 & ~umask``
    (``0o777 & ~umask`` for an executable), e.g. 0o644 under umask 022."""
    return (0o777 if executable else 0o666) & ~_umask()


def share_like_umask(path: PathLike) -> None:
    """Give ``path`` (a file or a folder, recursively) the permissions the umask gives new files and folders.

    Files written through a temporary file (``tempfile.mkstemp``, safetensors' ``save_file``, which writes
    ``model.safetensors`` through a private temporary file) are owner-only (0600) whatever the umask; folders from
    ``tempfile.mkdtemp`` are 0700. This undoes that: files get :func:`file_mode` (executables keep an execute bit),
    folders ``0o777 & ~umask``. Symbolic links are left alone.
    """
    root = Path(path)
    entries = [root] if not root.is_dir() or root.is_symlink() else [root, *root.rglob("*")]
    for entry in entries:
        if entry.is_symlink():
            continue
        if entry.is_dir():
            os.chmod(entry, file_mode(executable=True))
        elif entry.is_file():
            os.chmod(entry, file_mode(executable=bool(entry.stat().st_mode & 0o100)))


@contextlib.contextmanager
def open_atomic(path: PathLike, mode: str = "w", opener=open, **kwargs) -> Iterator:
    """Open ``path`` for writing through a temporary file in the same folder, renamed onto ``path`` when the
    ``with`` block succeeds, so that ``path`` is either the old file or the complete new one.

    The file gets the permissions of a new file under the umask (:func:`file_mode`, e.g. 0644 under umask 022), not
    ``mkstemp``'s owner-only 0600. If the block raises, the temporary file is removed and ``path`` is unchanged.

    Args:
        path: the file to write; its folder must exist.
        mode: ``"w"``/``"wt"`` (text; ``encoding`` defaults to UTF-8) or ``"wb"``.
        opener: ``open`` or e.g. ``gzip.open``, called as ``opener(tmp_path, mode, **kwargs)``.

    Yields:
        The open file object.
    """
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    if "b" not in mode:
        kwargs.setdefault("encoding", "utf-8")
    try:
        os.chmod(tmp, file_mode())
        with opener(tmp, mode, **kwargs) as f:
            yield f
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_text_atomic(path: PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` through :func:`open_atomic`: ``path`` is either the old file or the
    complete new one, with the permissions the umask gives new files."""
    target = Path(path)
    with open_atomic(target) as f:
        f.write(text)
    return target


def _is_output(entry: Path) -> bool:
    """False for a run's bookkeeping files and temporary folders (``.*.tmp-*``) in an output folder."""
    return entry.name not in BOOKKEEPING_FILES and not (entry.name.startswith(".") and ".tmp-" in entry.name)


def check_output_dir_reuse(output_dir: PathLike, overwrite: bool, resuming: bool, can_resume: bool = True) -> None:
    """A non-empty ``--output_dir`` is an earlier run's: refuse it unless resuming or ``--overwrite_output_dir``
    (transformers' Trainer rule), so that nothing of that run (its tokenizer, checkpoints) is reused silently.

    A folder holding only a run's bookkeeping (:data:`BOOKKEEPING_FILES`) or temporary folders counts as empty.

    ``can_resume`` False (a command without ``--resume_from_checkpoint``, e.g. ``pretrain.prepare``): the message
    does not suggest resuming.

    Raises:
        InputError: ``output_dir`` exists, is not empty, and neither flag is given.
    """
    out = Path(output_dir)
    if resuming or overwrite or not out.is_dir() or not any(_is_output(p) for p in out.iterdir()):
        return
    resume = "--resume_from_checkpoint latest to continue that run, " if can_resume else ""
    raise InputError(
        f"--output_dir {out}: exists and is not empty (an earlier run?); expected a new or empty folder, "
        f"{resume}or --overwrite_output_dir to replace it"
    )


def _within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def check_sources_outside(
    output_dir: PathLike,
    sources: Mapping[str, PathLike | Sequence[PathLike] | None],
    replaced: Sequence[str] | None = None,
    arg_name: str = "--output_dir",
) -> None:
    """Refuse an output folder whose writing would delete or replace what a command reads: no command deletes what
    it did not write.

    Args:
        output_dir: the command's output folder (need not exist).
        sources: the command's inputs by argument name (``{"--source": "m"}``); each a path, a list of paths or
            ``None``. Values that are not existing local paths (hub repo ids) are skipped.
        replaced: ``None`` for a command whose output folder is a whole model folder (``modeling.bert.convert``): a
            source that is the output folder, lies inside it or contains it is refused. Otherwise the entries of
            the output folder that the command deletes or replaces (``["checkpoints", "tokenizer"]``): a source that
            is the output folder or lies inside one of them is refused.

    Raises:
        InputError: one line naming both arguments and paths.
    """
    out = Path(output_dir).expanduser().resolve()
    for name, value in sources.items():
        values = [value] if isinstance(value, (str, os.PathLike)) else list(value or [])
        for source in values:
            path = Path(source).expanduser()
            if not path.exists():
                continue
            path = path.resolve()
            if path == out:
                relation = f"is the {name} folder"
            elif replaced is None and _within(path, out):
                relation = f"contains {name} {source}"
            elif replaced is None and _within(out, path):
                relation = f"lies inside {name} {source}"
            elif replaced is not None and any(_within(path, out / entry) for entry in replaced):
                entry = next(e for e in replaced if _within(path, out / e))
                relation = f"holds {name} {source} in {entry}/, which this command replaces"
            else:
                continue
            raise InputError(
                f"{arg_name} {output_dir}: {relation}; expected an output folder apart from the command's inputs "
                "(writing it would replace or delete them)"
            )


__all__ = [
    "BOOKKEEPING_FILES",
    "atomic_output_dir",
    "check_output_dir_reuse",
    "check_sources_outside",
    "file_mode",
    "file_sha256",
    "open_atomic",
    "pid_alive",
    "read_json",
    "remove_dead_temporaries",
    "share_like_umask",
    "storage_failure",
    "write_text_atomic",
]
