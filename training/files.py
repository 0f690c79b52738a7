"""Atomic writes of output folders and files, and the output-folder rule of every command.

Every command writes its outputs so that a failure (a bad input found late, a full disk, a kill) leaves nothing
half-written: :func:`atomic_output_dir` for folders, :func:`write_text_atomic` for single files.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Union

from training.errors import InputError

PathLike = Union[str, "os.PathLike[str]"]


@contextlib.contextmanager
def atomic_output_dir(output_dir: PathLike, arg_name: str = "--output_dir") -> Iterator[Path]:
    """Write an output folder atomically: yield a fresh temporary folder next to ``output_dir``, and move
    its contents into ``output_dir`` only when the ``with`` block succeeds.

    If ``output_dir`` does not exist, the temporary folder is renamed to it (one atomic rename). If it
    exists, each entry of the temporary folder replaces the entry of the same name there (other entries
    are kept). If the block raises, the temporary folder is removed and ``output_dir`` is left as it was
    (not created if it did not exist).

    Args:
        output_dir: the folder to write; its parent folders are created if needed.
        arg_name: the command-line argument it came from, used in error messages.

    Yields:
        The temporary folder (a ``Path`` in the same parent as ``output_dir``) to write into.

    Raises:
        InputError: ``output_dir`` (or one of its parents) is an existing file, or its parent cannot be created,
            or writing into the temporary folder failed with an ``OSError`` (e.g. disk full; then the temporary
            folder is removed and ``output_dir`` is unchanged).
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
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=parent))
    except OSError as err:
        raise InputError(f"{arg_name} {out}: cannot create a folder in {parent} ({err.strerror}); expected a writable "
                         "location") from err
    try:
        try:
            yield tmp
        except OSError as err:  # disk full, quota, permission: report it, leave output_dir as it was
            reason = "disk full" if err.errno == errno.ENOSPC else (err.strerror or str(err))
            raise InputError(f"{arg_name} {out}: could not write the outputs ({reason}: {err}); {out} was left as it "
                             "was; expected a writable folder with free space") from err
        if not out.exists():
            os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700; give the usual mode
            os.replace(tmp, out)
        else:
            for entry in sorted(tmp.iterdir()):
                target = out / entry.name
                if target.is_dir() and not target.is_symlink():
                    shutil.rmtree(target)
                os.replace(entry, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text_atomic(path: PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file in the same folder and an atomic rename, so
    that ``path`` is either the old file or the complete new one."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def check_output_dir_reuse(output_dir: PathLike, overwrite: bool, resuming: bool) -> None:
    """A non-empty ``--output_dir`` is an earlier run's: refuse it unless resuming or ``--overwrite_output_dir``
    (transformers' Trainer rule), so that nothing of that run (its tokenizer, checkpoints) is reused silently.

    Raises:
        InputError: ``output_dir`` exists, is not empty, and neither flag is given.
    """
    out = Path(output_dir)
    if resuming or overwrite or not out.is_dir() or not any(out.iterdir()):
        return
    raise InputError(f"--output_dir {out}: exists and is not empty (an earlier run?); expected a new or empty folder, "
                     "--resume_from_checkpoint latest to continue that run, or --overwrite_output_dir to replace it")


__all__ = ["atomic_output_dir", "check_output_dir_reuse", "write_text_atomic"]
